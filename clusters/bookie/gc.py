"""Garbage collection of deleted ledgers on a bookie, as BookKeeper's GarbageCollectorThread with its
ScanAndCompareGarbageCollector: every `gcWaitTime` (BookieConfig.gc_wait_time_ms) the bookie lists the
ledgers it stores, then every ledger the metadata store still has, and drops each stored ledger the
metadata no longer names (its entries, its index rows, its state, the fence bit with it).

Deleting a ledger in BookKeeper removes its metadata only; the bookies find out here. (Our client also
sends each bookie of the ledger a best-effort DELETE; this pass is what reclaims a ledger whose DELETE
was lost or sent while the bookie was down, as it is the only path in BookKeeper.)

Safety, as BookKeeper's scan: the bookie's own list is taken before the metadata is listed, so a ledger
created meanwhile (its metadata first, then its first entry here) is never a candidate; nothing is
dropped when the listing fails; and each candidate's metadata is read once more on its own
(verifyMetadataOnGc) before it is dropped. Dropping goes through `Bookie.forget`, which keeps a fenced
ledger's fence (apache/bookkeeper#4462; the bug knob `bookie.write_after_delete_accepted` forgets it).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from clusters.bookkeeper.metadata import ledger_path
from clusters.metrics import REGISTRY

log = logging.getLogger(__name__)

GC_LEDGERS = REGISTRY.counter("bookie_gc_deleted_ledgers_total",
                              "ledgers dropped by garbage collection because their metadata is gone")


class GarbageCollector:
    """The scan-and-compare pass of one bookie, and the loop that runs it every `interval_s`."""

    def __init__(self, bookie: Any, interval_s: float):
        """`bookie`: the server.Bookie it collects for (its storage, store, cfg and forget)."""
        self.bookie = bookie
        self.interval_s = interval_s
        self.passes = 0                   # completed passes
        self.deleted: list[int] = []      # ledgers dropped by this collector, in order
        self._wake = asyncio.Event()

    def trigger(self) -> None:
        """Run a pass now (BookKeeper's forceGC)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.collect()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next pass tries again
                log.warning("bookie %s: garbage collection pass failed: %r", self.bookie.cfg.bookie_id, e)

    async def _metadata_ledgers(self) -> set[int]:
        from clusters.bookkeeper.client import BookKeeper
        bk = BookKeeper(self.bookie.store, name=f"gc-{self.bookie.cfg.bookie_id}")   # metadata reads only
        return set(await bk.list_ledgers())

    async def collect(self) -> list[int]:
        """One pass; returns the ledgers it dropped. Does nothing without a connected metadata store."""
        store = self.bookie.store
        if store is None or not store.connected:
            return []
        local = set(self.bookie.storage.ledgers)        # first: see the module's note
        if not local:
            self.passes += 1
            return []
        listed = await self._metadata_ledgers()
        dropped = []
        for lid in sorted(local - listed):
            if await store.exists(ledger_path(lid)):     # verifyMetadataOnGc
                continue
            if lid not in self.bookie.storage.ledgers:   # deleted meanwhile (a DELETE request)
                continue
            self.bookie.forget(lid, "garbage-collected: its metadata is gone")
            dropped.append(lid)
        if dropped:
            GC_LEDGERS.inc(len(dropped))
            self.deleted.extend(dropped)
            log.info("bookie %s: garbage-collected %d ledger(s) whose metadata is gone: %s",
                     self.bookie.cfg.bookie_id, len(dropped), dropped[:20])
        self.passes += 1
        return dropped
