"""A topic's storage, as Pulsar's ManagedLedger: a chain of BookKeeper ledgers listed in ZooKeeper.

Opening it on a new owner recovers (fences and closes) the previous owner's last ledger before a new
ledger is created and CAS-appended to the list. Ledgers roll over by entry count, size and age (a
timer). Durable cursors (`ManagedCursor`) keep their mark-delete position and individually deleted
ranges in a cursor ledger of their own, which their znode points to, as Pulsar's ManagedCursorImpl.
A housekeeping task expires messages past the namespace's TTL and trims ledgers that every durable
cursor has passed and retention no longer needs (Pulsar's internalTrimLedgers).
"""
from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from clusters.bookkeeper.errors import (BKError, BKLedgerClosedError, BKLedgerFencedError,
                                        BKMetadataVersionError, BKNoSuchEntryError, BKNoSuchLedgerError)
from clusters.broker.ledger_meta import (ML_ROOT, SYSTEM_CURSOR_PREFIX, ManagedLedgerError,  # noqa: F401
                                         ManagedLedgerFenced, Position, _cas, is_system_cursor, ml_name,
                                         ml_path)
from clusters.broker.managed_cursor import (ManagedCursor, Range, _pos_from, _pos_json,  # noqa: F401
                                            _ranges_from, _ranges_json)
from clusters.bugs import Knobs
from clusters.config import BrokerConfig
from clusters.metadata.store import MetadataStore, NodeExists

log = logging.getLogger(__name__)

MB = 1024 * 1024


def namespace_of(name: str) -> str:
    """`public/default/persistent/t` -> `public/default` (the namespace whose policies apply)."""
    parts = name.split("/")
    return "/".join(parts[:2]) if len(parts) >= 3 else ""


def _publish_time(entry: bytes) -> int | None:
    """The publish time (ms) in a stored entry's metadata; None when it cannot be parsed."""
    from clusters.protocol import frames
    try:
        return int(frames.entry_metadata(entry).publish_time)
    except Exception:  # noqa: BLE001 - an unreadable entry never expires by TTL
        return None


@dataclass
class LedgerInfo:
    ledger_id: int
    entries: int | None = None      # None while the ledger is open (its owner is writing it)
    size: int = 0
    timestamp: float = 0.0          # unix seconds: creation, then close time once closed (as Pulsar)

    def to_json(self) -> dict[str, Any]:
        return {"ledger_id": self.ledger_id, "entries": self.entries, "size": self.size,
                "timestamp": self.timestamp}


class EntryCache:
    """Recently added entries by position, so tailing readers skip the bookies: bounded in bytes, in
    count and, as Pulsar's managed-ledger cache (managedLedgerCacheEvictionTimeThresholdMillis), in
    age; an entry older than `max_age_s` is read from the bookies again. Values are opaque (the
    managed ledger caches payloads, the topic payloads with their parsed metadata); `size` is what a
    value counts against `max_bytes`. Eviction goes oldest first, so the positions left are the
    newest, in the order they were added."""

    def __init__(self, max_bytes: int, max_age_s: float = 0.0, max_entries: int | None = None):
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.max_entries = max_entries
        self.bytes = 0
        self._d: collections.OrderedDict[Position, tuple[float, Any, int]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._d)

    def _evict_old(self) -> None:
        if self.max_age_s <= 0 or not self._d:
            return
        cutoff = time.monotonic() - self.max_age_s
        d = self._d
        while d:
            pos, (t, _, size) = next(iter(d.items()))
            if t >= cutoff:
                break
            del d[pos]
            self.bytes -= size

    def put(self, pos: Position, value: Any, size: int | None = None) -> None:
        size = len(value) if size is None else size
        old = self._d.pop(pos, None)
        if old is not None:
            self.bytes -= old[2]
        self._d[pos] = (time.monotonic(), value, size)
        self.bytes += size
        while self._d and (self.bytes > self.max_bytes or
                           (self.max_entries is not None and len(self._d) > self.max_entries)):
            _, (_, _, gone) = self._d.popitem(last=False)
            self.bytes -= gone
        self._evict_old()

    def get(self, pos: Position) -> Any:
        self._evict_old()
        return self.peek(pos)

    def evict_old(self) -> None:
        """Drop what is older than max_age_s now (then peek for a run of lookups)."""
        self._evict_old()

    def peek(self, pos: Position) -> Any:
        """The value at pos without an age check (after evict_old, in a loop over many positions)."""
        hit = self._d.get(pos)
        return hit[1] if hit is not None else None

    def drop_ledger(self, ledger_id: int) -> None:
        for pos in [p for p in self._d if p.ledger_id == ledger_id]:
            self.bytes -= self._d.pop(pos)[2]

    def clear(self) -> None:
        self._d.clear()
        self.bytes = 0


class _Add:
    """One add_entry call: its payload, the caller's future, the ledger it was sent to."""
    __slots__ = ("data", "fut", "lh", "bk_fut")

    def __init__(self, data: bytes, fut: asyncio.Future):
        self.data = data
        self.fut = fut
        self.lh: Any = None
        self.bk_fut: asyncio.Future | None = None


def _fail(op: _Add, exc: ManagedLedgerError) -> None:
    if not op.fut.done():
        op.fut.set_exception(type(exc)(*exc.args))


class _BackingOff(ManagedLedgerError):
    """An add refused at once: the last rollovers failed and the next attempt is not due yet."""


class ManagedLedger:
    """Append-only log of entries for one topic, owned by one broker at a time."""

    def __init__(self, name: str, store: MetadataStore, bk: Any, cfg: BrokerConfig,
                 policies: Any = None):
        self.name = name
        self.store = store
        self.bk = bk
        self.cfg = cfg
        self.knobs = Knobs(cfg.bugs, "managed-ledger")     # bug knobs (clusters/bugs.py)
        self.policies = policies           # a PolicyCache (clusters/broker/policies.py), or None
        self.namespace = namespace_of(name)
        self.ledgers: list[LedgerInfo] = []
        self._version = -1
        self._lh: Any = None               # the open LedgerHandle
        self._lh_created = 0.0
        self._lh_entries = 0               # adds issued to the current ledger
        self._lh_bytes = 0
        self._state = "init"               # open | rolling | failed | fenced | closed
        self._queued: collections.deque[_Add] = collections.deque()     # waiting for a ledger
        self._inflight: collections.deque[_Add] = collections.deque()   # sent, in entry order
        self._closing_lh: Any = None       # the ledger we are closing ourselves
        self._last_confirmed: Position | None = None
        self._waiters: list[asyncio.Future] = []
        self._cache = EntryCache(64 * 1024 * 1024, cfg.cache_eviction_s)
        self.skipped_entries = 0           # entries left out by auto_skip_non_recoverable_data
        self._read_handles: dict[int, Any] = {}
        self._roll_task: asyncio.Task | None = None
        self.cursors: dict[str, ManagedCursor] = {}
        self._meta_lock = asyncio.Lock()   # one ledger-list CAS at a time (rollover, trimming)
        self._trim_lock = asyncio.Lock()
        self._trim_task: asyncio.Task | None = None
        self._trim_again = False
        self._housekeeping_task: asyncio.Task | None = None
        self._age_timer: asyncio.TimerHandle | None = None
        self.deleted_ledgers: collections.deque[int] = collections.deque(maxlen=1000)  # trimmed here
        self.expired: dict[str, Position] = {}     # cursor -> last position expired by TTL

    # -- open: the log-recovery protocol ------------------------------------------
    @classmethod
    async def open(cls, name: str, store: MetadataStore, bk: Any, cfg: BrokerConfig,
                   policies: Any = None) -> "ManagedLedger":
        ml = cls(name, store, bk, cfg, policies)
        if policies is not None and ml.namespace:
            await policies.get(ml.namespace)     # read (and watch) the namespace's policies once
        await ml._initialize()
        return ml

    # -- policies -----------------------------------------------------------------
    def _policies(self) -> Any:
        if self.policies is not None and self.namespace:
            return self.policies.cached(self.namespace)
        return None

    def persistence(self) -> tuple[int, int, int]:
        """E/Qw/Qa for new ledgers: the namespace's persistence policy, else the broker's."""
        p = self._policies()
        if p is not None:
            return p.ensemble, p.write_quorum, p.ack_quorum
        return self.cfg.ensemble, self.cfg.write_quorum, self.cfg.ack_quorum

    def retention(self) -> tuple[int, int, int]:
        """(retention minutes, retention MB, message TTL seconds); -1 is infinite, TTL 0 is none."""
        p = self._policies()
        if p is not None:
            return p.retention_time_minutes, p.retention_size_mb, p.message_ttl_seconds
        c = self.cfg
        return c.default_retention_minutes, c.default_retention_size_mb, c.default_message_ttl_s

    async def _initialize(self) -> None:
        got = await self.store.get_or_none(ml_path(self.name))
        if got is None:
            try:
                await self.store.create(ml_path(self.name), self._encode(), makepath=True)
            except NodeExists:
                pass
            got = await self.store.get(ml_path(self.name))
        data, self._version = got
        self.ledgers = self._decode(data)
        # Recover the previous owner's last ledger: fence it on the bookies and close it, so that
        # owner can get nothing more acknowledged (broker.recovery_fencing=false skips the fencing).
        fence = self.knobs.on("broker.recovery_fencing")
        for info in self.ledgers:
            if info.entries is not None:
                continue
            try:
                rh = await self.bk.open_ledger(info.ledger_id, recovery=True, fence=fence)
            except BKNoSuchLedgerError:
                info.entries = 0
                continue
            except BKError as e:
                raise ManagedLedgerError(f"recovering ledger {info.ledger_id} of {self.name}: {e}") from e
            info.entries = rh.last_entry_id + 1
            info.size = getattr(rh, "length", 0) or 0
            info.timestamp = time.time()
            self._read_handles[info.ledger_id] = rh
            log.info("%s: recovered ledger %d (fence=%s), last entry %d", self.name, info.ledger_id,
                     fence, rh.last_entry_id)
        # Empty ledgers carry nothing; drop them from the list (and from BookKeeper once the new
        # list, without them, is written).
        empty = [i.ledger_id for i in self.ledgers if not i.entries]
        self.ledgers = [i for i in self.ledgers if i.entries]
        for info in reversed(self.ledgers):
            self._last_confirmed = Position(info.ledger_id, info.entries - 1)
            break
        await self._create_ledger()
        for lid in empty:
            self._read_handles.pop(lid, None)
            self._spawn(self._delete_ledger(lid))
        await self._load_cursors(fence)
        self._housekeeping_task = asyncio.get_running_loop().create_task(
            self._housekeeping(), name=f"housekeeping {self.name}")

    async def _create_ledger(self) -> None:
        """Create a ledger, append it to the list with a CAS; BadVersion means we lost the topic."""
        e_, qw, qa = self.persistence()
        try:
            lh = await self.bk.create_ledger(e_, qw, qa,
                                             custom={"managed-ledger": self.name, "broker": self.cfg.name})
        except (BKError, ValueError) as e:
            raise ManagedLedgerError(f"creating a ledger ({e_}/{qw}/{qa}) for {self.name}: {e}") from e
        if self._state in ("closed", "fenced"):      # closed (or fenced) while we were creating it
            await self._abandon(lh)
            raise self._refusal()
        async with self._meta_lock:
            new_list = self.ledgers + [LedgerInfo(lh.ledger_id, None, 0, time.time())]
            try:
                await self._write_list(new_list)
            except ManagedLedgerError:
                await self._abandon(lh)
                raise
            self.ledgers = new_list
        self._lh = lh
        self._lh_created = time.monotonic()
        self._lh_entries = 0
        self._lh_bytes = 0
        if self._state in ("closed", "fenced"):
            return       # closed during the CAS: close() closes this ledger once the rollover is over
        self._state = "open"
        self._arm_age_timer()
        log.info("%s: writing to ledger %d", self.name, lh.ledger_id)

    async def _write_list(self, new_list: list[LedgerInfo]) -> None:
        """CAS the ledger list (hold _meta_lock). BadVersion: another broker changed it (Fenced)."""
        self._version = await _cas(self.store, ml_path(self.name), self._encode(new_list), self._version,
                                   fenced=f"{self.name}: ledger list changed by another broker",
                                   failed=f"{self.name}: updating the ledger list")

    def _spawn(self, coro: Any) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(coro)

    async def _delete_ledger(self, ledger_id: int) -> bool:
        """Delete a ledger from BookKeeper (metadata, then the bookies drop its data); best effort."""
        try:
            await self.bk.delete_ledger(ledger_id)
            return True
        except BKNoSuchLedgerError:
            return True
        except Exception as e:  # noqa: BLE001 - an orphan ledger is a leak, not a correctness issue
            log.warning("%s: deleting ledger %d: %s", self.name, ledger_id, e)
            return False

    # -- rollover by age: a timer, not only on add --------------------------------------
    def _arm_age_timer(self, delay: float | None = None) -> None:
        if self._age_timer is not None:
            self._age_timer.cancel()
            self._age_timer = None
        age = self.cfg.max_ledger_age_s
        if not age or age <= 0 or not math.isfinite(age):
            return
        if delay is None:      # Pulsar adds up to 5% so ledgers of many topics do not roll at once
            delay = age * (1 + random.random() * 0.05)
        self._age_timer = asyncio.get_running_loop().call_later(max(0.01, delay), self._age_check)

    def _age_check(self) -> None:
        self._age_timer = None
        if self._state in ("rolling", "failed") and self.knobs.on("broker.rollover_race_creates_two_ledgers"):
            self._age_check_during_creation()
            return
        if self._state != "open":
            return             # rolling (the next ledger re-arms), failed, closed or fenced
        if self._full() and not self._queued:
            log.info("%s: ledger %d reached its maximum age; rolling over", self.name,
                     self._lh.ledger_id if self._lh is not None else -1)
            self._start_roll()
            if self.knobs.on("broker.rollover_race_creates_two_ledgers"):
                self._arm_age_timer(self.cfg.max_ledger_age_s)   # the check does not wait for its rollover
            return
        # empty (Pulsar rolls only a ledger with entries) or too young: look again later
        left = self._lh_created + self.cfg.max_ledger_age_s - time.monotonic()
        self._arm_age_timer(left if left > 0 else self.cfg.max_ledger_age_s)

    # -- bug knob broker.rollover_race_creates_two_ledgers (apache/pulsar#12221, #14664) ----------------
    # Pulsar's time-based rollover check (rollCurrentLedgerIfFull) ran while a ledger was being created
    # (after an add failure closed the previous one): the closed ledger still counted as the current
    # one and as full by age, so a second ledger was created beside the first. Each creation switches
    # the writes to its ledger as soon as BookKeeper has created it and then updates the ledger list
    # with the list and version it started from; the later update fails (BadVersion), its ledger is
    # dropped from the list, and the adds it acknowledged are in a ledger the list does not name:
    # no consumer reads them.
    def _age_check_during_creation(self) -> None:
        age = self.cfg.max_ledger_age_s
        if self._full() and self._roll_task is not None:
            log.warning("%s: ledger %s reached its maximum age while the next one is being created; creating "
                        "another (bug knob)", self.name, self._lh.ledger_id if self._lh is not None else "-")
            self._spawn(self._create_ledger_beside())
        self._arm_age_timer(age)

    async def _create_ledger_beside(self) -> None:
        e_, qw, qa = self.persistence()
        listed, version = list(self.ledgers), self._version
        try:
            lh = await self.bk.create_ledger(e_, qw, qa,
                                             custom={"managed-ledger": self.name, "broker": self.cfg.name})
        except (BKError, ValueError) as e:
            log.warning("%s: creating a second ledger: %s", self.name, e)
            return
        if self._state in ("closed", "fenced"):
            await self._abandon(lh)
            return
        # the writes go to it at once (Pulsar set currentLedger before updating the list)
        self._lh, self._lh_created, self._lh_entries, self._lh_bytes = lh, time.monotonic(), 0, 0
        self._state = "open"
        self._drain()
        new_list = listed + [LedgerInfo(lh.ledger_id, None, 0, time.time())]
        try:
            self._version = await _cas(self.store, ml_path(self.name), self._encode(new_list), version,
                                       fenced="the ledger list changed meanwhile",
                                       failed="updating the ledger list")
            self.ledgers = new_list
        except ManagedLedgerError as e:
            log.warning("%s: updating the ledger list with ledger %d failed (%s); it is dropped from the list "
                        "while the adds go on to it (bug knob)", self.name, lh.ledger_id, e)

    async def _abandon(self, lh: Any) -> None:
        try:
            await self.bk.delete_ledger(lh.ledger_id)
        except Exception:
            log.debug("deleting abandoned ledger %d", lh.ledger_id, exc_info=True)

    # -- writes -------------------------------------------------------------------
    @property
    def last_confirmed(self) -> Position | None:
        return self._last_confirmed

    @property
    def fenced(self) -> bool:
        return self._state == "fenced"

    @property
    def state(self) -> str:
        """open, rolling, failed (a write failed; new adds wait for a new ledger), fenced, closed..."""
        return self._state

    def _full(self) -> bool:
        """Pulsar's currentLedgerIsFull: a quota (entries, size, age) reached, and the ledger older
        than the minimum rollover time."""
        c = self.cfg
        if self._lh_entries <= 0:
            return False
        age = time.monotonic() - self._lh_created
        quota = (self._lh_entries >= c.max_entries_per_ledger
                 or self._lh_bytes >= c.max_ledger_size_mb * MB
                 or age >= c.max_ledger_age_s)
        return quota and (c.min_ledger_rollover_s <= 0 or age > c.min_ledger_rollover_s)

    def _refusal(self) -> ManagedLedgerError:
        if self._state == "fenced":
            return ManagedLedgerFenced(f"{self.name} is fenced: another broker owns it")
        if self._state == "closed":
            return ManagedLedgerError(f"{self.name} is closed")
        return ManagedLedgerError(f"{self.name}: no ledger to write to ({self._state})")

    async def add_entry(self, data: bytes) -> Position:
        """Append one entry; concurrent calls complete in call order, at increasing positions."""
        if self._state in ("fenced", "closed"):
            raise self._refusal()
        if self._state == "failed" and (refused := self._backing_off()) is not None:
            raise refused
        op = _Add(bytes(data), asyncio.get_running_loop().create_future())
        if self._state == "open" and not self._queued:
            if self._full():
                self._start_roll()
            else:
                self._issue(op)
                return await op.fut
        # a rollover is under way (or the last one failed): wait for the next ledger, in call order
        self._queued.append(op)
        if self._state == "failed":
            self._start_roll()
        return await op.fut

    def _issue(self, op: "_Add") -> None:
        """Send op to the current ledger now: the entry id is fixed synchronously, so entries keep
        the order of add_entry calls, and completions (callbacks on the ledger's futures, which
        complete in entry-id order) keep it too."""
        lh = self._lh
        op.lh = lh
        self._lh_entries += 1
        self._lh_bytes += len(op.data)
        self._inflight.append(op)
        op.bk_fut = lh.add_entry_async(op.data)
        op.bk_fut.add_done_callback(functools.partial(self._add_done, op, lh))

    def _add_done(self, op: "_Add", lh: Any, bk_fut: asyncio.Future) -> None:
        exc = BKError("add cancelled") if bk_fut.cancelled() else bk_fut.exception()
        if op.lh is not lh:
            return                          # already re-queued for the next ledger
        if exc is None:
            self._inflight.remove(op)
            self._create_failures = 0       # a ledger that works: the rollover back-off starts over
            pos = Position(lh.ledger_id, bk_fut.result())
            self._cache.put(pos, op.data)
            if self._last_confirmed is None or pos > self._last_confirmed:
                self._last_confirmed = pos
            self._notify()
            if not op.fut.done():
                op.fut.set_result(pos)
            return
        if self._state in ("closed", "fenced"):
            self._inflight.remove(op)
            op.lh = None
            _fail(op, self._refusal())
            return
        if isinstance(exc, BKLedgerFencedError) or (isinstance(exc, BKLedgerClosedError)
                                                    and lh is not self._closing_lh):
            # fenced on the bookies, or closed by someone else's recovery: another broker owns it
            self._inflight.remove(op)
            op.lh = None
            _fail(op, ManagedLedgerFenced(f"{self.name}: ledger {lh.ledger_id} fenced by another broker"))
            self._fence()
            return
        # The ledger is unusable (not enough bookies, timeouts...). As Pulsar's
        # OpAddEntry.handleAddFailure -> ledgerClosed: close it at its LAC (the un-acknowledged
        # entries are then not part of it) and re-submit the pending adds, in order, on a new
        # ledger; they fail only if that ledger cannot be created.
        log.warning("%s: add to ledger %d failed (%s); rolling over", self.name, lh.ledger_id, exc)
        self._requeue(lh)
        if self._state == "open":
            if lh.last_add_confirmed < 0:
                self._note_broken_rollover()    # it broke before any add to it succeeded
            self._start_roll()

    def _requeue(self, lh: Any) -> None:
        """Move the adds of `lh` that did not succeed to the head of the queue, in order."""
        moved, keep = [], collections.deque()
        for op in self._inflight:
            f = op.bk_fut
            ok = f is not None and f.done() and not f.cancelled() and f.exception() is None
            if op.lh is lh and not ok:
                op.lh = op.bk_fut = None
                if not op.fut.done():
                    moved.append(op)
            else:
                keep.append(op)
        self._inflight = keep
        self._queued.extendleft(reversed(moved))

    # Rollover back-off (no ledger-creation storm while the bookies are down): after a failed
    # rollover (the ledger creation failed, or the new ledger broke before any add to it succeeded)
    # the next one is tried at once, then after 1, 2, 4, 8 and at most 10 s; meanwhile adds fail at
    # once with a retryable error. Pulsar's ManagedLedgerImpl refuses adds for
    # WaitTimeAfterLedgerCreationFailureMs (10 s) after a failed ledger creation likewise.
    ROLLOVER_BACKOFF_MAX_S = 10.0
    _create_failures = 0            # failed rollovers in a row
    _retry_at = 0.0                 # monotonic time of the next attempt

    def _note_broken_rollover(self) -> None:
        self._create_failures += 1
        n = self._create_failures
        delay = 0.0 if n == 1 else min(self.ROLLOVER_BACKOFF_MAX_S, 2.0 ** (n - 2))
        self._retry_at = time.monotonic() + delay

    def _backing_off(self) -> ManagedLedgerError | None:
        wait = self._retry_at - time.monotonic()
        if wait <= 0:
            return None
        return _BackingOff(f"{self.name}: waiting for a new ledger: {self._create_failures} rollovers failed "
                           f"in a row; next attempt in {wait:.1f}s")

    def _start_roll(self) -> None:
        if self._roll_task is None:
            if self._state in ("open", "failed"):
                self._state = "rolling"
            self._roll_task = asyncio.get_running_loop().create_task(self._roll())

    async def _roll(self) -> None:
        """Close the current ledger (recording its entries), create the next, then drain queued adds."""
        try:
            old = self._lh
            if old is not None:
                self._closing_lh = old
                try:
                    await old.close()      # waits for the adds in flight
                except (BKLedgerFencedError, BKLedgerClosedError, BKMetadataVersionError) as e:
                    # someone else's recovery closed it (possibly with entries we were not told of)
                    self._fence(ManagedLedgerFenced(f"{self.name}: ledger {old.ledger_id}: {e}"))
                    return
                except BKError as e:
                    # still OPEN in BookKeeper; the list below records how many entries it has
                    log.warning("%s: closing ledger %d: %s", self.name, old.ledger_id, e)
                self._requeue(old)
                for info in self.ledgers:
                    if info.ledger_id == old.ledger_id:
                        info.entries = old.last_add_confirmed + 1
                        info.size = old.confirmed_length
                        info.timestamp = time.time()
                self._read_handles[old.ledger_id] = old
                self._lh = None
            if self._state in ("closed", "fenced"):
                return
            refused = self._backing_off()
            if refused is not None:
                raise refused
            await self._create_ledger()
            self.trim_soon()          # Pulsar trims consumed ledgers after every rollover
        except ManagedLedgerFenced as e:
            self._fence(e)
            return
        except ManagedLedgerError as e:
            if self._state not in ("closed", "fenced"):
                if not isinstance(e, _BackingOff):
                    self._note_broken_rollover()
                log.warning("%s: rollover failed: %s", self.name, e)
                self._state = "failed"
            self._fail_queued(e)
            return
        finally:
            self._roll_task = None
            if self._state in ("closed", "fenced"):
                self._fail_queued(self._refusal())
        self._drain()

    def _drain(self) -> None:
        while self._queued and self._state == "open":
            if self._full():
                self._start_roll()
                return
            op = self._queued.popleft()
            if not op.fut.done():          # skip adds whose caller gave up
                self._issue(op)

    def _fail_queued(self, exc: ManagedLedgerError) -> None:
        while self._queued:
            _fail(self._queued.popleft(), exc)

    def _fence(self, exc: ManagedLedgerError | None = None) -> None:
        first = self._state != "fenced"
        if first:
            log.warning("%s: fenced; another broker took it over", self.name)
        self._state = "fenced"
        exc = exc or ManagedLedgerFenced(f"{self.name} is fenced")
        self._fail_queued(exc)
        self._stop_background()
        for cur in self.cursors.values():
            cur._stop("fenced")
            # found by a cursor write or by trimming rather than by an add: tell the topic (through
            # its subscriptions) so that it closes and its clients look it up again
            if first and cur._on_fenced is not None:
                asyncio.get_running_loop().call_soon(cur._on_fenced, exc)
        self._notify()

    def _stop_background(self) -> None:
        if self._age_timer is not None:
            self._age_timer.cancel()
            self._age_timer = None
        t = self._housekeeping_task
        if t is not None and not t.done() and t is not asyncio.current_task():
            t.cancel()

    # -- reads --------------------------------------------------------------------
    def first_position(self) -> Position | None:
        for info in self.ledgers:
            if self._entries_of(info) > 0:
                return Position(info.ledger_id, 0)
        return None

    def next_position(self, pos: Position) -> Position:
        return Position(pos.ledger_id, pos.entry_id + 1)

    def read_position_after(self, pos: Position | None) -> Position:
        """Where a reader whose last entry was `pos` (None: none) reads next, as Pulsar's
        getNextValidPosition: the next entry of the log, or the next one of the ledger being written."""
        current = self._lh.ledger_id if self._lh is not None else None
        for info in self.ledgers:
            if pos is not None and info.ledger_id < pos.ledger_id:
                continue
            first = pos.entry_id + 1 if pos is not None and info.ledger_id == pos.ledger_id else 0
            if first < self._entries_of(info) or info.ledger_id == current:
                return Position(info.ledger_id, first)
        return self.next_position(pos) if pos is not None else Position(current if current is not None else -1, 0)

    def previous_position(self, pos: Position) -> Position:
        """The last existing entry before `pos` ((ledger, -1) when there is none in the list)."""
        if pos.entry_id > 0:
            return Position(pos.ledger_id, pos.entry_id - 1)
        prev = None
        for info in self.ledgers:
            if info.ledger_id >= pos.ledger_id:
                break
            n = self._entries_of(info)
            if n > 0:
                prev = Position(info.ledger_id, n - 1)
        return prev if prev is not None else Position(pos.ledger_id, -1)

    def _spans(self, after: Position | None, upto: Position) -> Iterator[tuple[int, int, int]]:
        """(ledger, first, last) entry ids of every ledger holding positions p with after < p <= upto
        (after None: from the start); first > last when it holds none."""
        for info in self.ledgers:
            lid = info.ledger_id
            if lid > upto.ledger_id:
                return
            if after is not None and lid < after.ledger_id:
                continue
            first = after.entry_id + 1 if after is not None and lid == after.ledger_id else 0
            last = self._entries_of(info) - 1
            if lid == upto.ledger_id:
                last = min(last, upto.entry_id)
            yield lid, max(first, 0), last

    def positions_in(self, after: Position | None, upto: Position) -> Iterator[Position]:
        """Every existing entry position p with after < p <= upto (after None: from the start)."""
        for lid, first, last in self._spans(after, upto):
            for e in range(first, last + 1):
                yield Position(lid, e)

    def count_entries(self, after: Position | None, upto: Position | None) -> int:
        """How many positions `positions_in(after, upto)` has (0 when upto is None), without
        walking them."""
        if upto is None:
            return 0
        return sum(last - first + 1 for _, first, last in self._spans(after, upto) if last >= first)

    def entries_count(self) -> int:
        return sum(self._entries_of(i) for i in self.ledgers)

    def total_size(self) -> int:
        """Bytes in every ledger of the list (the open one's confirmed bytes included)."""
        total = 0
        for info in self.ledgers:
            if info.entries is None and self._lh is not None and self._lh.ledger_id == info.ledger_id:
                total += self._lh.confirmed_length
            else:
                total += info.size
        return total

    def size_after(self, pos: Position | None) -> int:
        """Bytes of the entries after `pos` (all of them for None), estimated as Pulsar's
        estimateBacklogSize: whole ledgers after pos's, plus pos's ledger pro rata."""
        if pos is None:
            return self.total_size()
        total = 0
        for info in self.ledgers:
            if info.ledger_id < pos.ledger_id:
                continue
            if info.entries is None and self._lh is not None and self._lh.ledger_id == info.ledger_id:
                size = self._lh.confirmed_length
            else:
                size = info.size
            n = self._entries_of(info)
            if info.ledger_id == pos.ledger_id:
                size = size * max(0, n - pos.entry_id - 1) // n if n else 0
            total += size
        return total

    def _entries_of(self, info: LedgerInfo) -> int:
        if info.entries is not None:
            return info.entries
        lc = self._last_confirmed
        if lc is not None and lc.ledger_id == info.ledger_id:
            return lc.entry_id + 1
        return 0

    async def read_entries(self, start: Position, max_entries: int) -> list[tuple[Position, bytes]]:
        """Up to max_entries entries at or after start, in order, crossing ledger boundaries."""
        out: list[tuple[Position, bytes]] = []
        for info in self.ledgers:
            if len(out) >= max_entries:
                break
            if info.ledger_id < start.ledger_id:
                continue
            first = start.entry_id if info.ledger_id == start.ledger_id else 0
            last = self._entries_of(info) - 1
            if first > last:
                continue
            last = min(last, first + (max_entries - len(out)) - 1)
            out.extend(await self._read_range(info.ledger_id, max(first, 0), last,
                                              closed=info.entries is not None))
        return out

    async def _read_range(self, ledger_id: int, first: int, last: int,
                          closed: bool = False) -> list[tuple[Position, bytes]]:
        out: list[tuple[Position, bytes]] = []
        eid = first
        while eid <= last:   # serve the cached prefix; fetch the rest from the bookies in one read
            data = self._cache.get(Position(ledger_id, eid))
            if data is None:
                break
            out.append((Position(ledger_id, eid), data))
            eid += 1
        if eid <= last:
            try:
                handle = await self._handle_for(ledger_id)
                # The list says how many entries a closed ledger has; if its close failed it is
                # still OPEN in BookKeeper, and its last entry is beyond the LAC the bookies report.
                read = (handle.read_unconfirmed if closed and not handle.is_closed
                        and hasattr(handle, "read_unconfirmed") else handle.read)
                try:
                    datas = await read(eid, last)
                except BKNoSuchEntryError:
                    if not (closed and self.cfg.auto_skip_non_recoverable_data):
                        raise
                    out.extend(await self._read_skipping_lost(read, ledger_id, eid, last))
                    return out
            except BKError as e:
                raise ManagedLedgerError(f"{self.name}: reading {ledger_id}:{eid}..{last}: {e}") from e
            out.extend((Position(ledger_id, eid + i), d) for i, d in enumerate(datas))
        return out

    async def _read_skipping_lost(self, read: Callable, ledger_id: int, first: int,
                                  last: int) -> list[tuple[Position, bytes]]:
        """autoSkipNonRecoverableData: entry by entry, leaving out those that no bookie has."""
        out: list[tuple[Position, bytes]] = []
        for eid in range(first, last + 1):
            try:
                out.extend((Position(ledger_id, eid), d) for d in await read(eid, eid))
            except BKNoSuchEntryError as e:
                self.skipped_entries += 1
                log.warning("%s: skipping non-recoverable entry %d:%d (auto_skip_non_recoverable_data): %s",
                            self.name, ledger_id, eid, e)
        return out

    async def _handle_for(self, ledger_id: int) -> Any:
        if self._lh is not None and self._lh.ledger_id == ledger_id:
            return self._lh
        rh = self._read_handles.get(ledger_id)
        if rh is None:
            rh = await self.bk.open_ledger(ledger_id, recovery=False)
            self._read_handles[ledger_id] = rh
        return rh

    async def wait_for_entries(self, after: Position | None) -> None:
        """Return once an entry after `after` is readable, or the ledger can take no more."""
        while self._state not in ("fenced", "closed"):
            lc = self._last_confirmed
            if lc is not None and (after is None or lc > after):
                return
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    # -- cursors ------------------------------------------------------------------
    async def _load_cursors(self, fence: bool = True) -> None:
        for name in await self.store.children(ml_path(self.name)):
            cur = await ManagedCursor.recover(self, name, fence=fence)
            if cur is not None:
                self.cursors[name] = cur

    async def open_cursor(self, name: str, initial_position: str = "latest") -> "ManagedCursor":
        cur = self.cursors.get(name)
        if cur is not None:
            return cur
        if self._state in ("closed", "fenced"):
            raise self._refusal()
        start = self._last_confirmed if initial_position == "latest" else None
        cur = ManagedCursor(self, name, start)
        if not await cur.create(initial_position):
            # the znode exists already (created meanwhile): recover it as a topic load would
            cur = await ManagedCursor.recover(self, name, fence=True)
            if cur is None:
                raise ManagedLedgerError(f"{self.name}: cursor {name} vanished while being created")
        self.cursors[name] = cur
        return cur

    async def delete_cursor(self, name: str) -> None:
        cur = self.cursors.pop(name, None)
        if cur is not None:
            await cur.delete()
            self.trim_soon()          # it may have been the slowest cursor

    async def close(self) -> None:
        """Stop writing: close the open ledger so the next owner finds it closed."""
        if self._state in ("closed", "fenced"):
            self._notify()
            return
        self._state = "closed"
        self._stop_background()
        self._fail_queued(self._refusal())
        roll = self._roll_task
        if roll is not None:               # let a rollover in flight finish (it creates no ledger now)
            try:
                await asyncio.shield(roll)
            except Exception:
                log.debug("%s: rollover during close", self.name, exc_info=True)
        for cur in list(self.cursors.values()):
            await cur.close()             # writes the last position, closes the cursor ledger
        lh = self._lh
        if lh is not None:
            self._closing_lh = lh
            try:
                await lh.close()           # the adds in flight complete first
            except Exception as e:
                log.warning("%s: closing ledger %d: %s", self.name, lh.ledger_id, e)
            else:
                for info in self.ledgers:
                    if info.ledger_id == lh.ledger_id:
                        info.entries = lh.last_add_confirmed + 1
                        info.size = lh.confirmed_length
        t = self._trim_task
        if t is not None and not t.done():
            t.cancel()
        self._notify()

    # -- housekeeping: message TTL and trimming ---------------------------------------
    async def _housekeeping(self) -> None:
        """Periodically: expire messages past the TTL (every message_expiry_check_interval_s), then
        trim consumed ledgers (every retention_check_interval_s)."""
        c = self.cfg
        now = time.monotonic()
        next_expiry = now + c.message_expiry_check_interval_s
        next_trim = now + c.retention_check_interval_s
        while self._state not in ("closed", "fenced"):
            await asyncio.sleep(max(0.05, min(next_expiry, next_trim) - time.monotonic()))
            if self._state in ("closed", "fenced"):
                return
            try:
                if time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + c.message_expiry_check_interval_s
                    await self.expire_messages()
                if time.monotonic() >= next_trim:
                    next_trim = time.monotonic() + c.retention_check_interval_s
                    await self.trim_now()
            except asyncio.CancelledError:
                raise
            except ManagedLedgerFenced as e:
                self._fence(e)
                return
            except Exception as e:  # noqa: BLE001 - retried at the next interval
                log.warning("%s: housekeeping: %s", self.name, e)

    def trim_soon(self) -> None:
        """Trim in the background (coalesced): after a rollover, when a cursor leaves a ledger."""
        if self._state in ("closed", "fenced", "init"):
            return
        if self._trim_task is not None and not self._trim_task.done():
            self._trim_again = True
            return

        async def run() -> None:
            while True:
                self._trim_again = False
                try:
                    await self.trim_now()
                except ManagedLedgerFenced as e:
                    self._fence(e)
                    return
                except Exception as e:  # noqa: BLE001 - the periodic check tries again
                    log.warning("%s: trimming: %s", self.name, e)
                if not self._trim_again or self._state in ("closed", "fenced"):
                    return
        self._trim_task = self._spawn(run())

    def _slowest_reader_limit(self) -> int:
        """Ledgers with an id below this one are consumed by every durable cursor (Pulsar's
        slowestReaderLedgerId): with no durable cursor, all of them but the current one."""
        current = self.ledgers[-1].ledger_id
        cursors = [c for c in self.cursors.values() if not c.deleted]
        if not cursors:
            return current + 1
        mds = [c.mark_delete_position for c in cursors]
        if any(md is None for md in mds):
            return -1                   # a cursor before the first entry: nothing is consumed
        slowest = min(mds)
        for info in self.ledgers:
            if info.ledger_id == slowest.ledger_id:
                # mark-delete on the last entry of a closed ledger: that ledger is consumed too
                if info.ledger_id != current and info.entries is not None \
                        and slowest.entry_id + 1 >= info.entries:
                    return slowest.ledger_id + 1
                break
        return slowest.ledger_id

    def trimmable(self) -> list[LedgerInfo]:
        """The ledgers trimming would delete now, oldest first (Pulsar's internalTrimLedgers): ahead
        of the slowest durable cursor, never the current ledger, and only while retention by time
        (ledger closed more than retention minutes ago) or by size (what remains is still at least
        the retention size) no longer requires them. -1 is infinite; 0/0 deletes once consumed."""
        if len(self.ledgers) < 2:
            return []
        limit = self._slowest_reader_limit()
        minutes, size_mb, _ = self.retention()
        total = self.total_size()
        now = time.time()
        current = self.ledgers[-1].ledger_id
        out: list[LedgerInfo] = []
        to_delete = 0
        for info in self.ledgers:
            if info.ledger_id >= limit or info.ledger_id == current or info.entries is None:
                break
            to_delete += info.size
            over_size = size_mb >= 0 and total - to_delete >= size_mb * MB
            expired = minutes >= 0 and now - info.timestamp > minutes * 60
            if not (over_size or expired):
                break
            out.append(info)
        return out

    async def trim_now(self) -> list[int]:
        """Delete the ledgers `trimmable()` names: the ledger list in ZooKeeper first (CAS), then each
        ledger from BookKeeper (metadata, then its data on the bookies). Returns their ids."""
        async with self._trim_lock:
            if self._state in ("closed", "fenced", "init") or not self.ledgers:
                return []
            async with self._meta_lock:
                doomed = self.trimmable()
                if not doomed:
                    return []
                ids = {i.ledger_id for i in doomed}
                new_list = [i for i in self.ledgers if i.ledger_id not in ids]
                try:
                    await self._write_list(new_list)
                except ManagedLedgerFenced as e:
                    self._fence(e)
                    raise
                self.ledgers = new_list
            log.info("%s: trimmed ledgers %s", self.name, sorted(ids))
            for lid in sorted(ids):
                self._read_handles.pop(lid, None)
                self._cache.drop_ledger(lid)
                self.deleted_ledgers.append(lid)
            for lid in sorted(ids):
                await self._delete_ledger(lid)
            return sorted(ids)

    async def find_newest_expired(self, after: Position | None, cutoff_ms: float) -> Position | None:
        """The last entry after `after` published before `cutoff_ms` (None: there is none). A closed
        ledger whose close time is before the cutoff expires whole without being read (Pulsar's
        checkExpiryByLedgerClosureTime); the first other ledger is binary-searched by publish time."""
        found: Position | None = None
        for info in list(self.ledgers):
            n = self._entries_of(info)
            if n <= 0 or (after is not None and info.ledger_id < after.ledger_id):
                continue
            first = after.entry_id + 1 if after is not None and info.ledger_id == after.ledger_id else 0
            last = n - 1
            if first > last:
                continue
            if info.entries is not None and info.timestamp and info.timestamp * 1000 < cutoff_ms:
                found = Position(info.ledger_id, last)
                continue
            lo, hi = first, last                  # invariant: entries < lo are expired
            while lo <= hi:
                mid = (lo + hi) // 2
                got = await self.read_entries(Position(info.ledger_id, mid), 1)
                if not got or got[0][0] != Position(info.ledger_id, mid):
                    break
                pt = _publish_time(got[0][1])
                if pt is not None and pt < cutoff_ms:
                    found = Position(info.ledger_id, mid)
                    lo = mid + 1
                else:
                    hi = mid - 1
            if found != Position(info.ledger_id, last):
                break                             # a live entry in this ledger: later ones are too
        return found

    async def expire_messages(self, ttl_s: float | None = None) -> dict[str, Position]:
        """Pulsar's PersistentMessageExpiryMonitor: move every durable cursor past the messages
        published more than the TTL ago (the namespace's message_ttl_seconds unless given)."""
        if ttl_s is None:
            ttl_s = self.retention()[2]
        if not ttl_s or ttl_s <= 0 or self._state in ("closed", "fenced"):
            return {}
        cutoff = time.time() * 1000 - ttl_s * 1000
        done: dict[str, Position] = {}
        for name, cur in list(self.cursors.items()):
            if cur.deleted or is_system_cursor(name):
                continue          # Pulsar expires subscriptions; system cursors (pulsar.dedup) keep their place
            pos = await self.find_newest_expired(cur.mark_delete_position, cutoff)
            if pos is not None and (cur.mark_delete_position is None or pos > cur.mark_delete_position):
                log.info("%s: cursor %s: messages up to %s expired (TTL %ss)", self.name, name, pos, ttl_s)
                cur.expire_to(pos)
                done[name] = pos
                self.expired[name] = pos
        return done

    # -- encoding -----------------------------------------------------------------
    def _encode(self, ledgers: list[LedgerInfo] | None = None) -> bytes:
        ledgers = self.ledgers if ledgers is None else ledgers
        return json.dumps({"ledgers": [i.to_json() for i in ledgers]}).encode()

    def _decode(self, data: bytes) -> list[LedgerInfo]:
        if not data:
            return []
        raw = json.loads(data)
        return [LedgerInfo(int(i["ledger_id"]), i.get("entries"), int(i.get("size", 0)),
                           float(i.get("timestamp", 0))) for i in raw.get("ledgers", [])]
