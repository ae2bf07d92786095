"""A durable cursor of a managed ledger, as Pulsar's ManagedCursorImpl: its mark-delete position and
individually deleted ranges, persisted in a cursor ledger of its own that its znode names (the class
docstring has the whole of it). The managed ledger (clusters/broker/managed_ledger.py) opens, recovers
and trims with its cursors; a cursor reaches its ledger only through the `ml` it was given.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any, Callable

from clusters.bookkeeper.errors import BKError, BKLedgerClosedError, BKLedgerFencedError, BKNoSuchLedgerError
from clusters.broker.ledger_meta import ManagedLedgerError, ManagedLedgerFenced, Position, _cas, ml_path
from clusters.metadata.store import BadVersion, NodeExists, NoNode

log = logging.getLogger(__name__)

# `ml` below is the cursor's ManagedLedger (not imported: it imports this module)
Range = tuple[Position, Position]          # (start, end]: open-closed, as Pulsar prints them


def _pos_json(p: Position | None) -> list[int] | None:
    return None if p is None else [p.ledger_id, p.entry_id]


def _pos_from(raw: Any) -> Position | None:
    return None if not raw else Position(int(raw[0]), int(raw[1]))


def _ranges_json(ranges: list[Range]) -> list[list[int]]:
    return [[a.ledger_id, a.entry_id, b.ledger_id, b.entry_id] for a, b in ranges]


def _ranges_from(raw: Any) -> list[Range]:
    return [(Position(int(r[0]), int(r[1])), Position(int(r[2]), int(r[3]))) for r in raw or []]


class ManagedCursor:
    """A durable subscription's position, persisted as Pulsar's ManagedCursorImpl does.

    State: `mark_delete_position` (every entry at or before it is consumed) plus the individually
    deleted ranges above it, which the subscription provides (`attach`). Each write appends a
    position record `{"mark_delete", "individual_deleted"}` (Pulsar's PositionInfo) to the cursor's
    own ledger, at most `cursor_mark_delete_rate` times a second (later changes are batched into
    the next write), capped at `cursor_max_unacked_ranges` ranges (the rest is redelivered after a
    crash). The cursor znode (Pulsar's ManagedCursorInfo) names that ledger (`cursors_ledger_id`) and
    holds the mark-delete position as of the last ledger switch; with no usable ledger it holds the
    whole position (`cursors_ledger_id` -1, ranges capped at `cursor_max_unacked_ranges_in_zk`).
    The ledger rolls over after `cursor_max_entries_per_ledger` records or
    `cursor_ledger_rollover_s`: a new ledger gets the current record, the znode is CAS-switched to
    it, the old ledger is deleted. Every znode write is a CAS on the version we last saw, so a
    broker whose topic was taken over cannot overwrite the new owner's cursor.

    Recovery on a new owner (`recover`): read the znode, open its ledger with recovery (fencing the
    old owner's writes), take its last record; a missing or empty ledger falls back to the znode's
    position. A CAS of the znode then fences the old owner's metadata writes. The next write
    switches to a new cursor ledger.

    The bug knob `broker.cursor_persist_read_position` (apache/pulsar#18236, fixed by #18237):
    creating a cursor at the latest position, and resetting it to a position, persist the *read*
    position (the next entry to deliver) where the mark-delete position belongs, as Pulsar's
    internalResetCursor did. A clean close writes the right position again; a broker killed before
    the cursor's next write leaves the next owner a cursor that has skipped one unacknowledged entry.
    """

    def __init__(self, ml: Any, name: str, mark_delete: Position | None, version: int = -1):
        self.ml = ml
        self.name = name
        self.mark_delete_position = mark_delete
        self.cursor_ledger_id = -1          # the ledger the znode names (-1: position in the znode)
        self.persisted_mark_delete: Position | None = mark_delete   # as of the last write
        self.writes = 0                     # position records written (ledger or znode)
        self.ledger_switches = 0
        self._version = version
        self._lh: Any = None                # our writable cursor ledger (None: switch at next write)
        self._lh_entries = 0
        self._lh_created = 0.0
        self._ranges: list[Range] = []      # as recovered (until a subscription attaches)
        self._ranges_fn: Callable[[int], list[Range]] | None = None
        self._ranges_suspended = False      # after reset(), until the subscription updates us
        self._on_expire: Callable[[Position], None] | None = None
        self._on_fenced: Callable[[BaseException], None] | None = None
        self._state = "open"                # open | closed | fenced | deleted
        self._gen = 0                       # bumped on every change
        self._persisted_gen = 0
        self._urgent = False
        self._wake = asyncio.Event()
        self._writer: asyncio.Task | None = None
        self._flush_waiters: list[tuple[int, asyncio.Future]] = []
        self._last_write = -math.inf
        self._io = asyncio.Lock()
        self._persist_instead: Position | None = None   # bug knob broker.cursor_persist_read_position

    def __repr__(self) -> str:
        return f"ManagedCursor({self.ml.name}/{self.name}, md={self.mark_delete_position})"

    @property
    def path(self) -> str:
        return f"{ml_path(self.ml.name)}/{self.name}"

    @property
    def deleted(self) -> bool:
        return self._state == "deleted"

    @property
    def state(self) -> str:
        """open, closed, fenced or deleted."""
        return self._state

    @property
    def _interval(self) -> float:
        rate = self.ml.cfg.cursor_mark_delete_rate
        return 1.0 / rate if rate and rate > 0 else 0.0

    # -- what the subscription and the admin API use ------------------------------------
    def attach(self, ranges_fn: Callable[[int], list[Range]] | None = None,
               on_expire: Callable[[Position], None] | None = None,
               on_fenced: Callable[[BaseException], None] | None = None) -> None:
        """The subscription serving this cursor: `ranges_fn(limit)` gives its individually acked
        ranges above the mark-delete position (read at write time), `on_expire(pos)` applies a TTL
        expiry to its in-memory state, `on_fenced(exc)` is told when a write finds the topic taken
        over."""
        self._ranges_fn = ranges_fn
        self._on_expire = on_expire
        self._on_fenced = on_fenced

    def individually_deleted_ranges(self) -> list[Range]:
        """Acknowledged ranges above the mark-delete position, (start, end] as Pulsar prints
        "[(l:e1..l:e2]]": every entry p with start < p <= end is acknowledged."""
        md = self.mark_delete_position
        if self._ranges_suspended:
            return []
        limit = self.ml.cfg.cursor_max_unacked_ranges
        rs = self._ranges_fn(limit) if self._ranges_fn is not None else self._ranges
        out = []
        for a, b in rs[:limit]:
            if md is not None:
                if b <= md:
                    continue
                if a < md:
                    a = md
            out.append((a, b))
        return out

    def update(self, pos: Position | None = None) -> None:
        """Without waiting: move the mark-delete position forward to `pos` (never back) and/or note
        that the individually deleted ranges changed; the write follows, rate-limited."""
        self._ranges_suspended = False
        self._persist_instead = None
        if pos is not None and (self.mark_delete_position is None or pos > self.mark_delete_position):
            old = self.mark_delete_position
            self.mark_delete_position = pos
            if old is None or old.ledger_id != pos.ledger_id:
                self.ml.trim_soon()          # the slowest cursor may have left a ledger
        self._schedule()

    async def mark_delete(self, pos: Position) -> None:
        """Move the position forward (never back); persisted asynchronously (see update)."""
        if self.mark_delete_position is not None and pos <= self.mark_delete_position:
            return
        self.update(pos)

    async def reset(self, pos: Position | None, timeout: float = 10.0) -> None:
        """Seek: the next entry read is `pos` (None = the first entry); written at once, and done
        only once written, as Pulsar's internalResetCursor completes in the callback of its
        mark-delete ("unable to persist readPosition for cursor reset" otherwise). Raises
        ManagedLedgerError when the position is not durable within `timeout`, or cannot be: the
        cursor is fenced (another broker took the topic over and serves the position it recovered,
        so a seek answered here would be lost), closed or deleted. The position holds in memory
        either way."""
        self.mark_delete_position = None if pos is None else Position(pos.ledger_id, pos.entry_id - 1)
        if pos is not None and self.ml.knobs.on("broker.cursor_persist_read_position"):
            self._persist_instead = pos      # the read position, not the mark-delete (apache/pulsar#18236)
        self._ranges = []
        self._ranges_suspended = True   # the subscription's ranges are stale until it updates us
        if self._state != "open":
            raise ManagedLedgerError(f"cursor {self.name}: unable to persist the reset to {pos}: "
                                     f"the cursor is {self._state}")
        self._schedule(urgent=True)
        gen = self._gen
        await self.flush(timeout)
        if self._persisted_gen < gen:
            why = f"the cursor is {self._state}" if self._state != "open" else f"not written within {timeout}s"
            raise ManagedLedgerError(f"cursor {self.name}: unable to persist the reset to {pos}: {why}")

    def expire_to(self, pos: Position) -> None:
        """TTL: everything up to `pos` is expired (consumed)."""
        if self._on_expire is not None:
            self._on_expire(pos)
            return
        self._ranges = [(a, b) for a, b in self._ranges if b > pos]
        self.update(pos)

    # -- writing --------------------------------------------------------------------
    def _schedule(self, urgent: bool = False) -> None:
        if self._state != "open":
            return
        self._gen += 1
        if urgent:
            self._urgent = True
            self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(
                self._write_loop(), name=f"cursor {self.ml.name}/{self.name}")

    async def _write_loop(self) -> None:
        backoff = 0.1
        while self._state == "open" and self._persisted_gen < self._gen:
            wait = self._last_write + self._interval - time.monotonic()
            if wait > 0 and not self._urgent:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except asyncio.TimeoutError:
                    pass
                continue
            self._urgent = False
            gen = self._gen
            md = self.mark_delete_position if self._persist_instead is None else self._persist_instead
            ranges = self.individually_deleted_ranges()
            self._last_write = time.monotonic()
            try:
                async with self._io:
                    if self._state != "open":
                        break
                    await self._persist(md, ranges)
                self._persisted_gen = max(self._persisted_gen, gen)
                self.persisted_mark_delete = md
                self.writes += 1
                backoff = 0.1
                self._wake_flushers()
            except ManagedLedgerFenced as e:
                log.warning("cursor %s/%s: %s", self.ml.name, self.name, e)
                self.ml._fence(e)            # stops every cursor and tells the topic
                self._stop("fenced")
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - ZooKeeper/bookies unreachable: keep it in memory
                log.warning("cursor %s/%s: persisting %s: %s", self.ml.name, self.name, md, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        self._wake_flushers()

    def _wake_flushers(self) -> None:
        keep = []
        for gen, fut in self._flush_waiters:
            if fut.done():
                continue
            if self._persisted_gen >= gen or self._state != "open":
                fut.set_result(None)
            else:
                keep.append((gen, fut))
        self._flush_waiters = keep

    async def flush(self, timeout: float = 10.0) -> None:
        """Write the current position now (no rate limit) and wait for it, at most `timeout`."""
        if self._state != "open" or self._persisted_gen >= self._gen:
            return
        fut = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((self._gen, fut))
        self._urgent = True
        self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            log.warning("cursor %s/%s: position not persisted within %ss", self.ml.name, self.name,
                        timeout)

    def _record(self, md: Position | None, ranges: list[Range]) -> bytes:
        return json.dumps({"mark_delete": _pos_json(md), "individual_deleted": _ranges_json(ranges),
                           "time": time.time()}).encode()

    async def _persist(self, md: Position | None, ranges: list[Range]) -> None:
        """Append the record to the cursor ledger, switching ledgers when needed (hold _io)."""
        record = self._record(md, ranges)
        c = self.ml.cfg
        lh = self._lh
        if lh is not None and self._lh_entries < c.cursor_max_entries_per_ledger \
                and time.monotonic() - self._lh_created < c.cursor_ledger_rollover_s:
            try:
                await lh.add_entry(record)
                self._lh_entries += 1
                return
            except (BKLedgerFencedError, BKLedgerClosedError) as e:
                raise ManagedLedgerFenced(f"cursor {self.name}: ledger {lh.ledger_id} fenced: {e}") from e
            except BKError as e:
                log.warning("cursor %s/%s: writing to ledger %d: %s; switching ledgers", self.ml.name,
                            self.name, lh.ledger_id, e)
        await self._switch_ledger(md, ranges, record)

    async def _switch_ledger(self, md: Position | None, ranges: list[Range], record: bytes) -> None:
        """Pulsar's createNewMetadataLedger + switchToNewLedger: new ledger, the record in it, CAS
        the znode to it, delete the old ledger. With no ledger to be had, the position goes to the
        znode (cursors_ledger_id -1) and the next write tries a ledger again."""
        old_lh, old_id = self._lh, self.cursor_ledger_id
        self._lh = None
        E, Qw, Qa = self.ml.persistence()
        lh = None
        try:
            lh = await self.ml.bk.create_ledger(E, Qw, Qa, custom={
                "managed-ledger": self.ml.name, "cursor": self.name, "broker": self.ml.cfg.name})
            await lh.add_entry(record)
        except (BKError, ValueError) as e:
            log.warning("cursor %s/%s: no cursor ledger (%s); keeping the position in ZooKeeper",
                        self.ml.name, self.name, e)
            if lh is not None:
                self.ml._spawn(self.ml._delete_ledger(lh.ledger_id))
            await self._write_info(-1, md, ranges)
            self.cursor_ledger_id = -1
        else:
            try:
                await self._write_info(lh.ledger_id, md, [])
            except BaseException:
                self.ml._spawn(self.ml._delete_ledger(lh.ledger_id))
                raise
            self._lh, self._lh_entries, self._lh_created = lh, 1, time.monotonic()
            self.cursor_ledger_id = lh.ledger_id
            self.ledger_switches += 1
        if old_id >= 0 and old_id != self.cursor_ledger_id:
            self.ml._spawn(self._drop_ledger(old_lh, old_id))

    async def _drop_ledger(self, lh: Any, ledger_id: int) -> None:
        if lh is not None:
            try:
                await lh.close()
            except Exception:  # noqa: BLE001
                pass
        await self.ml._delete_ledger(ledger_id)

    def _info(self, ledger_id: int, md: Position | None, ranges: list[Range]) -> bytes:
        cap = self.ml.cfg.cursor_max_unacked_ranges_in_zk
        return json.dumps({"cursors_ledger_id": ledger_id, "mark_delete": _pos_json(md),
                           "individual_deleted": _ranges_json(ranges[:cap]) if ledger_id < 0 else [],
                           "last_active": time.time()}).encode()

    async def _write_info(self, ledger_id: int, md: Position | None, ranges: list[Range]) -> None:
        """CAS the cursor znode (ManagedCursorInfo). BadVersion/NoNode: another broker owns it now."""
        self._version = await _cas(self.ml.store, self.path, self._info(ledger_id, md, ranges), self._version,
                                   fenced=f"cursor {self.name} of {self.ml.name} changed by another broker",
                                   failed=f"cursor {self.name}: updating its znode", lost=(BadVersion, NoNode))

    # -- lifecycle ------------------------------------------------------------------
    async def create(self, initial_position: str = "earliest") -> bool:
        """A new cursor: its znode (position, no ledger yet), then its first cursor ledger.
        False when the znode exists already."""
        md = self.mark_delete_position
        if initial_position == "latest" and self.ml.knobs.on("broker.cursor_persist_read_position"):
            md = self.ml.read_position_after(md)     # apache/pulsar#18236: the read position
            log.warning("cursor %s/%s: persisting read position %s as its mark-delete position (bug knob)",
                        self.ml.name, self.name, md)
        try:
            await self.ml.store.create(self.path, self._info(-1, md, []), makepath=True)
        except NodeExists:
            return False
        self._version = 0
        async with self._io:
            await self._switch_ledger(md, [], self._record(md, []))
        self.writes += 1
        self.persisted_mark_delete = md
        return True

    @classmethod
    async def recover(cls, ml: Any, name: str, fence: bool = True) -> "ManagedCursor | None":
        """Load a cursor on a new owner (see the class docstring); None if its znode is gone."""
        path = f"{ml_path(ml.name)}/{name}"
        got = await ml.store.get_or_none(path)
        if got is None:
            return None
        data, version = got
        try:
            info = json.loads(data or b"{}")
        except ValueError:
            info = {}
        md = _pos_from(info.get("mark_delete"))
        ranges = _ranges_from(info.get("individual_deleted"))
        lid = int(info.get("cursors_ledger_id", -1))
        source = "znode"
        if lid >= 0:
            try:
                rh = await ml.bk.open_ledger(lid, recovery=True, fence=fence)
                last = rh.last_entry_id
                if last >= 0:
                    rec = json.loads((await rh.read(last, last))[0])
                    md = _pos_from(rec.get("mark_delete"))
                    ranges = _ranges_from(rec.get("individual_deleted"))
                    source = f"ledger {lid} entry {last}"
                else:
                    log.info("%s: cursor %s: ledger %d is empty; using the znode position",
                             ml.name, name, lid)
            except BKNoSuchLedgerError:
                log.warning("%s: cursor %s: ledger %d is gone; using the znode position", ml.name, name, lid)
                lid = -1
            except (BKError, ValueError) as e:
                raise ManagedLedgerError(f"{ml.name}: recovering cursor {name} from ledger {lid}: {e}") from e
        lc = ml.last_confirmed
        if md is not None and lc is not None and md > lc:
            md = lc                 # never past the end of the log (Pulsar clamps to the last position)
        cur = cls(ml, name, md, version)
        cur.cursor_ledger_id = lid
        cur._ranges = [(a, b) for a, b in ranges if md is None or b > md]
        # CAS the znode now: a write of the previous owner that is still in flight fails with BadVersion
        await cur._write_info(lid, md, cur._ranges)
        log.info("%s: cursor %s recovered from %s: mark-delete %s, %d individually deleted ranges",
                 ml.name, name, source, md, len(cur._ranges))
        return cur

    def _stop(self, state: str) -> None:
        if self._state == "open":
            self._state = state
        self._wake.set()
        self._wake_flushers()

    async def close(self) -> None:
        """Write the last position, close the cursor ledger (the next owner needs no recovery)."""
        if self._state != "open":
            return
        await self.flush(timeout=5.0)
        self._stop("closed")
        w = self._writer
        if w is not None and not w.done():
            try:
                await asyncio.wait_for(asyncio.shield(w), 5.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass
        async with self._io:
            lh, self._lh = self._lh, None
        if lh is not None:
            try:
                await lh.close()
            except Exception as e:  # noqa: BLE001
                log.debug("cursor %s/%s: closing ledger: %s", self.ml.name, self.name, e)

    async def delete(self) -> None:
        """Unsubscribe: the znode, then the cursor ledger."""
        self._stop("deleted")
        self._state = "deleted"
        try:
            await self.ml.store.delete(self.path)
        except NoNode:
            pass
        async with self._io:
            lh, self._lh = self._lh, None
        if self.cursor_ledger_id >= 0:
            await self._drop_ledger(lh, self.cursor_ledger_id)
