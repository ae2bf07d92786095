"""The replication worker (BookKeeper's ReplicationWorker + LedgerFragmentReplicator), one per bookie.

Loop: list the under-replicated ledgers, and for each one whose retry time has come, take its lock
(an ephemeral znode; another worker holding it means skip), then:

  1. read the ledger's metadata; the lost bookies are those of the record that are still not
     registered under /ledgers/available, or that the record names `formatted` (a bookie
     formatted as a new bookie under the same id: registered, but without this ledger's data,
     apache/bookkeeper#4812), and still appear in an ensemble (none: unmark, done);
  2. if the ledger is not closed and its last (open-ended) fragment has a lost bookie, the writer
     may still replace that bookie itself: wait `open_ledger_rereplication_grace_s` from the first
     time this worker saw it so, then open the ledger with recovery (fence + close) and go on
     with it as a closed ledger;
  3. for every fragment with a known end (every fragment of a closed ledger, every fragment but
     the last of an open one) and every lost bookie of its ensemble: choose a live bookie outside
     that ensemble (this worker's own bookie when it can), copy onto it each entry of the fragment
     whose write set holds the lost bookie's index, read from a surviving bookie of the write set,
     with recovery adds that keep the entry's id, LAC, length and checksum; then swap the new
     bookie into the fragment's ensemble with a metadata compare-and-set (re-read and re-check on
     a version conflict; leave it if someone else replaced that bookie already; start over if the
     fragment's entry range changed);
  4. when no fragment holds a lost bookie any more, delete the record (at the version read, so a
     bookie the auditor added meanwhile is not forgotten), and release the lock.

A failed attempt (no spare bookie, no readable copy, a bookie or ZooKeeper error) is logged, noted
in the record (`last_failure`) and retried after a backoff that doubles up to 30 s; a new bookie
registering resets the backoffs.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Awaitable, Callable

from clusters.bookkeeper.admin import BookKeeperAdmin, Fragment, fragments
from clusters.bookkeeper.client import BookKeeper
from clusters.bookkeeper.errors import (BKError, BKLedgerFencedError, BKMetadataVersionError,
                                        BKNoSuchEntryError, BKNoSuchLedgerError,
                                        BKNotEnoughBookiesError, BKReadError, BKRecoveryError,
                                        BKTimeoutError)
from clusters.bookkeeper.metadata import CLOSED, LedgerMetadata
from clusters.bookkeeper.quorum import write_set

from . import stats
from .urmanager import UnderreplicationManager, lock_path

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
REPLICATED = "replicated"
DEFERRED = "deferred"
FAILED = "failed"
LOCKED = "locked"
GONE = "gone"
PARTIAL = "partial"

BeforeSwap = Callable[[LedgerMetadata, Fragment, int, str], Awaitable[None]]


def failure_reason(e: BaseException) -> str:
    if isinstance(e, BKNotEnoughBookiesError):
        return "not_enough_bookies"
    if isinstance(e, BKNoSuchEntryError):
        return "no_copy"
    if isinstance(e, BKMetadataVersionError):
        return "metadata_conflict"
    if isinstance(e, BKRecoveryError):
        return "recovery"
    if isinstance(e, (BKReadError, BKTimeoutError)):
        return "read"
    if isinstance(e, BKLedgerFencedError):
        return "fenced"
    return "error"


class ReplicationWorker:
    def __init__(self, bk: BookKeeper, urm: UnderreplicationManager, worker_id: str, *,
                 grace_s: float = 30.0, backoff_s: float = 1.0):
        self.bk = bk
        self.urm = urm
        self.admin = BookKeeperAdmin(bk)
        self.id = worker_id
        self.grace_s = grace_s
        self.backoff_s = max(0.05, backoff_s)
        self.wake = asyncio.Event()
        self._open_since: dict[int, float] = {}     # ledger -> when first seen open + affected
        self._next_try: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self.before_swap: BeforeSwap | None = None   # test seam: runs after the copy, before the CAS
        self.outcomes: dict[str, int] = {}

    # -- loop ----------------------------------------------------------------------------
    def reset_backoff(self) -> None:
        """A bookie registered: retry failed ledgers now (deferred open ledgers keep their time)."""
        for lid in list(self._failures):
            self._next_try.pop(lid, None)
        self.wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("autorecovery worker %s: %r", self.id, e)
            try:
                await asyncio.wait_for(self.wake.wait(), self.backoff_s)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()

    async def run_once(self) -> dict[int, str]:
        """One pass over the under-replicated ledgers that are due; {ledger: outcome}."""
        ids = await self.urm.list()
        listed = set(ids)
        for d in (self._next_try, self._failures, self._open_since):
            for lid in [k for k in d if k not in listed]:
                del d[lid]
        now = time.monotonic()
        todo = [lid for lid in ids if self._next_try.get(lid, 0.0) <= now]
        random.shuffle(todo)
        out = {}
        for lid in todo:
            try:
                out[lid] = await self.process(lid)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("autorecovery: ledger %d: %r", lid, e)
                self._next_try[lid] = time.monotonic() + self.backoff_s
                out[lid] = FAILED
            self.outcomes[out[lid]] = self.outcomes.get(out[lid], 0) + 1
        return out

    async def _lock(self, lid: int) -> bool:
        if await self.urm.try_lock(lid, self.id):
            return True
        # a lock left by our own session (a release that failed) is still ours
        owner = await self.bk._zk(self.urm.store.owner_session, lock_path(lid))
        return owner is not None and owner == self.urm.store.session_id

    async def process(self, lid: int) -> str:
        """Lock, replicate and unmark one under-replicated ledger."""
        if not await self._lock(lid):
            return LOCKED
        try:
            got = await self.urm.get(lid)
            if got is None:
                return GONE
            listed = set(got[0]["replicas"])
            formatted = set(got[0].get("formatted") or [])
            try:
                outcome, _ = await self.replicate_ledger(lid, listed, formatted)
            except BKNoSuchLedgerError:
                log.info("autorecovery: ledger %d was deleted; unmarking it", lid)
                await self.urm.mark_replicated(lid)
                return GONE
            except BKError as e:
                reason = failure_reason(e)
                stats.FAILURES.inc(1, reason)
                n = self._failures[lid] = self._failures.get(lid, 0) + 1
                delay = min(MAX_BACKOFF_S, self.backoff_s * 2 ** (n - 1))
                self._next_try[lid] = time.monotonic() + delay
                log.warning("autorecovery: ledger %d: replication failed (%s, attempt %d, next "
                            "try in %.1fs): %s", lid, reason, n, delay, e)
                try:
                    await self.urm.record_failure(lid, self.id, f"{reason}: {e}")
                except BKError:
                    pass
                return FAILED
            if outcome == DEFERRED:
                return DEFERRED
            if await self._unmark(lid):
                self._failures.pop(lid, None)
                self._next_try.pop(lid, None)
                stats.LEDGERS_REPLICATED.inc()
                log.info("autorecovery: ledger %d fully replicated; unmarked", lid)
                return REPLICATED
            return PARTIAL
        finally:
            try:
                await self.urm.release(lid)
            except BKError as e:
                log.warning("autorecovery: ledger %d: releasing the lock: %s", lid, e)

    async def _unmark(self, lid: int) -> bool:
        for _ in range(5):
            got = await self.urm.get(lid)
            if got is None:
                return True
            rec, version = got
            md = await self.bk.ledger_metadata(lid)
            live = set(await self.bk.available_bookies()) - set(rec.get("formatted") or [])
            if (set(rec["replicas"]) & md.bookies()) - live:
                return False
            if await self.urm.mark_replicated(lid, version):
                return True
        return False

    # -- one ledger ----------------------------------------------------------------------
    async def replicate_ledger(self, lid: int, listed: set[str] | None = None,
                               formatted: set[str] = frozenset()) -> tuple[str, LedgerMetadata]:
        """Bring every fragment of the ledger with a known end back off the lost bookies
        (`listed` that are not live; default: every bookie of the ledger that is not live;
        `formatted` bookies count as not live).
        Returns (REPLICATED or DEFERRED, metadata now).  Raises BKError on failure."""
        md = await self.bk.ledger_metadata(lid)
        live = set(await self.bk.available_bookies()) - set(formatted)
        lost = ((md.bookies() if listed is None else set(listed)) & md.bookies()) - live
        if not lost:
            self._open_since.pop(lid, None)
            return REPLICATED, md
        deferred_until = None
        if md.state != CLOSED and lost & set(md.current_ensemble):
            since = self._open_since.setdefault(lid, time.monotonic())
            if time.monotonic() - since >= self.grace_s:
                log.info("autorecovery: ledger %d is still %s with lost bookie(s) %s in its last "
                         "ensemble %s after the %.0fs grace period: recovering it (fence + close)",
                         lid, md.state, sorted(lost & set(md.current_ensemble)),
                         md.current_ensemble, self.grace_s)
                rh = await self.bk.open_ledger(lid, recovery=True)
                stats.OPEN_LEDGERS_RECOVERED.inc()
                md = rh.metadata
                self._open_since.pop(lid, None)
                live = set(await self.bk.available_bookies()) - set(formatted)
                lost = (lost & md.bookies()) - live
            else:
                deferred_until = since + self.grace_s
        else:
            self._open_since.pop(lid, None)
        for frag in fragments(md):
            if not frag.closed:
                continue        # the open last fragment: after the grace period
            for index in range(md.ensemble_size):
                if md.ensembles[frag.key][index] in lost:
                    md = await self.replicate_fragment(md, frag.key, index, lost)
        if deferred_until is not None:
            self._next_try[lid] = deferred_until
            log.info("autorecovery: ledger %d is open with lost bookie(s) %s in its last ensemble "
                     "%s: leaving it to the writer for %.1fs more", lid, sorted(lost),
                     md.current_ensemble, deferred_until - time.monotonic())
            return DEFERRED, md
        return REPLICATED, md

    async def replicate_fragment(self, md: LedgerMetadata, key: int, index: int,
                                 lost: set[str]) -> LedgerMetadata:
        """Copy one fragment's entries of the bookie at `index` onto a live bookie outside the
        ensemble and swap it in; returns the metadata after the swap."""
        lid = md.ledger_id
        frag = next(f for f in fragments(md) if f.key == key)
        old = frag.ensemble[index]
        live = set(await self.bk.available_bookies())
        candidates = sorted(live - set(frag.ensemble) - lost)
        if not candidates:
            raise BKNotEnoughBookiesError(
                f"not enough bookies to replace {old} in ledger {lid} fragment {key}: every live "
                f"bookie {sorted(live)} is already in its ensemble {list(frag.ensemble)} (a "
                f"fragment needs {md.ensemble_size} distinct bookies); start another bookie")
        target = self.id if self.id in candidates else random.choice(candidates)
        entries = frag.entries_of(index, md.ensemble_size, md.write_quorum)
        E, Qw = md.ensemble_size, md.write_quorum

        def sources_of(eid: int) -> list[str]:
            return [frag.ensemble[i] for i in write_set(eid, E, Qw)
                    if i != index and frag.ensemble[i] not in lost]
        t0 = time.monotonic()
        n, nbytes = await self.admin.copy_entries(md, entries, sources_of, target)
        stats.ENTRIES_COPIED.inc(n)
        stats.BYTES_COPIED.inc(nbytes)
        if self.before_swap is not None:
            await self.before_swap(md, frag, index, target)
        conflicts = self.admin.metadata_conflicts
        md2, wrote = await self.admin.replace_bookie(md, key, index, old, target,
                                                     (frag.first, frag.last))
        if self.admin.metadata_conflicts > conflicts:
            stats.METADATA_CONFLICTS.inc(self.admin.metadata_conflicts - conflicts)
        if wrote:
            stats.FRAGMENTS_REPLICATED.inc()
            log.info("autorecovery: ledger %d fragment %d (entries %d..%d): copied %d entries "
                     "(%d B) to %s and replaced %s at index %d in %.2fs", lid, key, frag.first,
                     frag.last, n, nbytes, target, old, index, time.monotonic() - t0)
        else:
            log.info("autorecovery: ledger %d fragment %d: %s was already replaced (now %s)",
                     lid, key, old, md2.ensembles.get(key))
        return md2
