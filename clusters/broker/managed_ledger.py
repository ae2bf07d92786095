"""A topic's storage, as Pulsar's ManagedLedger: a chain of BookKeeper ledgers listed in ZooKeeper.

Opening it on a new owner recovers (fences and closes) the previous owner's last ledger before a new
ledger is created and CAS-appended to the list; cursors persist their mark-delete position in ZooKeeper.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from clusters import bugs as bug_knobs
from clusters.bookkeeper.errors import (BKError, BKLedgerClosedError, BKLedgerFencedError,
                                        BKMetadataVersionError, BKNoSuchLedgerError)
from clusters.config import BrokerConfig
from clusters.metadata.store import BadVersion, MetadataStore, NodeExists, NoNode

log = logging.getLogger(__name__)

ML_ROOT = "/managed-ledgers"


@dataclass(frozen=True, order=True)
class Position:
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


class ManagedLedgerError(Exception):
    """Persistence failed; the add may be retried (the client resends)."""


class ManagedLedgerFenced(ManagedLedgerError):
    """Another broker took the topic over (its ledger was fenced or the list changed under us)."""


def ml_name(topic: str) -> str:
    """`persistent://public/default/t` -> `public/default/persistent/t` (Pulsar's ML naming)."""
    if "://" in topic:
        domain, rest = topic.split("://", 1)
    else:
        domain, rest = "persistent", topic
    tenant, namespace, local = rest.split("/", 2)
    return f"{tenant}/{namespace}/{domain}/{local}"


def _path(name: str) -> str:
    return f"{ML_ROOT}/{name}"


@dataclass
class LedgerInfo:
    ledger_id: int
    entries: int | None = None      # None while the ledger is open (its owner is writing it)
    size: int = 0
    timestamp: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"ledger_id": self.ledger_id, "entries": self.entries, "size": self.size,
                "timestamp": self.timestamp}


class _TailCache:
    """Recently added entries by position, bounded in bytes, so tailing readers skip the bookies."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._d: collections.OrderedDict[Position, bytes] = collections.OrderedDict()

    def put(self, pos: Position, data: bytes) -> None:
        self._d[pos] = data
        self.bytes += len(data)
        while self.bytes > self.max_bytes and self._d:
            _, old = self._d.popitem(last=False)
            self.bytes -= len(old)

    def get(self, pos: Position) -> bytes | None:
        return self._d.get(pos)


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


class ManagedLedger:
    """Append-only log of entries for one topic, owned by one broker at a time."""

    def __init__(self, name: str, store: MetadataStore, bk: Any, cfg: BrokerConfig):
        self.name = name
        self.store = store
        self.bk = bk
        self.cfg = cfg
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
        self._cache = _TailCache(64 * 1024 * 1024)
        self._read_handles: dict[int, Any] = {}
        self._roll_task: asyncio.Task | None = None
        self.cursors: dict[str, ManagedCursor] = {}

    # -- open: the log-recovery protocol ------------------------------------------
    @classmethod
    async def open(cls, name: str, store: MetadataStore, bk: Any, cfg: BrokerConfig) -> "ManagedLedger":
        ml = cls(name, store, bk, cfg)
        await ml._initialize()
        return ml

    async def _initialize(self) -> None:
        got = await self.store.get_or_none(_path(self.name))
        if got is None:
            try:
                await self.store.create(_path(self.name), self._encode(), makepath=True)
            except NodeExists:
                pass
            got = await self.store.get(_path(self.name))
        data, self._version = got
        self.ledgers = self._decode(data)
        # Recover the previous owner's last ledger: fence it on the bookies and close it, so that
        # owner can get nothing more acknowledged (broker.recovery_fencing=false skips the fencing).
        fence = bool(bug_knobs.value(self.cfg.bugs, "broker.recovery_fencing"))
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
            self._read_handles[info.ledger_id] = rh
            log.info("%s: recovered ledger %d (fence=%s), last entry %d", self.name, info.ledger_id,
                     fence, rh.last_entry_id)
        # Empty ledgers carry nothing; drop them from the list.
        self.ledgers = [i for i in self.ledgers if i.entries]
        for info in reversed(self.ledgers):
            self._last_confirmed = Position(info.ledger_id, info.entries - 1)
            break
        await self._create_ledger()
        await self._load_cursors()

    async def _create_ledger(self) -> None:
        """Create a ledger, append it to the list with a CAS; BadVersion means we lost the topic."""
        try:
            lh = await self.bk.create_ledger(self.cfg.ensemble, self.cfg.write_quorum, self.cfg.ack_quorum,
                                             custom={"managed-ledger": self.name, "broker": self.cfg.name})
        except BKError as e:
            raise ManagedLedgerError(f"creating a ledger for {self.name}: {e}") from e
        if self._state in ("closed", "fenced"):      # closed (or fenced) while we were creating it
            await self._abandon(lh)
            raise self._refusal()
        new_list = self.ledgers + [LedgerInfo(lh.ledger_id, None, 0, time.time())]
        encoded = self._encode(new_list)
        try:
            self._version = await self.store.set(_path(self.name), encoded, self._version)
        except BadVersion:
            await self._abandon(lh)
            raise ManagedLedgerFenced(f"{self.name}: ledger list changed by another broker") from None
        except Exception as e:
            # The outcome is unknown (connection loss): if our write did land, the list names the new
            # ledger and its version moved; deleting the ledger and keeping the old version would make
            # our next CAS fail with BadVersion and fence us for nothing.
            got = None
            try:
                got = await self.store.get(_path(self.name))
            except Exception:
                pass
            if got is not None and got[0] == encoded:
                self._version = got[1]
            else:
                await self._abandon(lh)
                if got is not None and got[1] != self._version:
                    raise ManagedLedgerFenced(f"{self.name}: ledger list changed by another broker") from e
                raise ManagedLedgerError(f"{self.name}: updating the ledger list: {e}") from e
        self.ledgers = new_list
        self._lh = lh
        self._lh_created = time.monotonic()
        self._lh_entries = 0
        self._lh_bytes = 0
        if self._state in ("closed", "fenced"):
            return       # closed during the CAS: close() closes this ledger once the rollover is over
        self._state = "open"
        log.info("%s: writing to ledger %d", self.name, lh.ledger_id)

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

    def _full(self) -> bool:
        c = self.cfg
        return self._lh_entries > 0 and (
            self._lh_entries >= c.max_entries_per_ledger
            or self._lh_bytes >= c.max_ledger_size_mb * 1024 * 1024
            or time.monotonic() - self._lh_created >= c.max_ledger_age_s)

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
                self._read_handles[old.ledger_id] = old
                self._lh = None
            if self._state in ("closed", "fenced"):
                return
            await self._create_ledger()
        except ManagedLedgerFenced as e:
            self._fence(e)
            return
        except ManagedLedgerError as e:
            if self._state not in ("closed", "fenced"):
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
        if self._state != "fenced":
            log.warning("%s: fenced; another broker took it over", self.name)
        self._state = "fenced"
        self._fail_queued(exc or ManagedLedgerFenced(f"{self.name} is fenced"))
        self._notify()

    # -- reads --------------------------------------------------------------------
    def first_position(self) -> Position | None:
        for info in self.ledgers:
            if self._entries_of(info) > 0:
                return Position(info.ledger_id, 0)
        return None

    def next_position(self, pos: Position) -> Position:
        return Position(pos.ledger_id, pos.entry_id + 1)

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
                if closed and not handle.is_closed and hasattr(handle, "read_unconfirmed"):
                    # The list says how many entries this ledger has, but its close failed so it is
                    # still OPEN in BookKeeper: its last entry is beyond the LAC the bookies report.
                    datas = await handle.read_unconfirmed(eid, last)
                else:
                    datas = await handle.read(eid, last)
            except BKError as e:
                raise ManagedLedgerError(f"{self.name}: reading {ledger_id}:{eid}..{last}: {e}") from e
            out.extend((Position(ledger_id, eid + i), d) for i, d in enumerate(datas))
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
    async def _load_cursors(self) -> None:
        for name in await self.store.children(_path(self.name)):
            got = await self.store.get_or_none(f"{_path(self.name)}/{name}")
            if got is None:
                continue
            self.cursors[name] = ManagedCursor.from_json(self, name, got[0], got[1])

    async def open_cursor(self, name: str, initial_position: str = "latest") -> "ManagedCursor":
        cur = self.cursors.get(name)
        if cur is not None:
            return cur
        start = self._last_confirmed if initial_position == "latest" else None
        cur = ManagedCursor(self, name, start)
        await cur.create()
        self.cursors[name] = cur
        return cur

    async def delete_cursor(self, name: str) -> None:
        cur = self.cursors.pop(name, None)
        if cur is not None:
            await cur.delete()

    async def close(self) -> None:
        """Stop writing: close the open ledger so the next owner finds it closed."""
        if self._state in ("closed", "fenced"):
            self._notify()
            return
        self._state = "closed"
        self._fail_queued(self._refusal())
        roll = self._roll_task
        if roll is not None:               # let a rollover in flight finish (it creates no ledger now)
            try:
                await asyncio.shield(roll)
            except Exception:
                log.debug("%s: rollover during close", self.name, exc_info=True)
        for cur in list(self.cursors.values()):
            await cur.flush()
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
        self._notify()

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


class ManagedCursor:
    """A durable subscription position: everything at or before mark_delete_position is consumed."""

    def __init__(self, ml: ManagedLedger, name: str, mark_delete: Position | None, version: int = -1):
        self.ml = ml
        self.name = name
        self.mark_delete_position = mark_delete
        self._persisted: Position | None = mark_delete
        self._version = version
        self._writing: asyncio.Task | None = None
        self._deleted = False

    @property
    def path(self) -> str:
        return f"{_path(self.ml.name)}/{self.name}"

    @classmethod
    def from_json(cls, ml: ManagedLedger, name: str, data: bytes, version: int) -> "ManagedCursor":
        raw = json.loads(data or b"{}")
        md = raw.get("mark_delete")
        pos = Position(int(md[0]), int(md[1])) if md else None
        return cls(ml, name, pos, version)

    def _encode(self, pos: Position | None) -> bytes:
        return json.dumps({"mark_delete": [pos.ledger_id, pos.entry_id] if pos else None}).encode()

    async def create(self) -> None:
        try:
            await self.ml.store.create(self.path, self._encode(self.mark_delete_position), makepath=True)
            self._version = 0
        except NodeExists:
            data, self._version = await self.ml.store.get(self.path)
            other = ManagedCursor.from_json(self.ml, self.name, data, self._version)
            self.mark_delete_position = self._persisted = other.mark_delete_position

    async def mark_delete(self, pos: Position) -> None:
        """Move the position forward (never back) and persist it; writes are coalesced."""
        if self.mark_delete_position is not None and pos <= self.mark_delete_position:
            return
        self.mark_delete_position = pos
        self._kick()

    async def reset(self, pos: Position | None) -> None:
        """Seek: the next entry read is `pos` (None = the first entry)."""
        if pos is None:
            self.mark_delete_position = None
        else:
            self.mark_delete_position = Position(pos.ledger_id, pos.entry_id - 1)
        self._kick()
        await self.flush()

    def _kick(self) -> None:
        if self._writing is None or self._writing.done():
            self._writing = asyncio.get_running_loop().create_task(self._persist_loop())

    async def _persist_loop(self) -> None:
        backoff = 0.1
        while not self._deleted and self._persisted != self.mark_delete_position:
            target = self.mark_delete_position
            try:
                self._version = await self.ml.store.set(self.path, self._encode(target), -1)
                self._persisted = target
                backoff = 0.1
            except NoNode:
                try:
                    await self.ml.store.create(self.path, self._encode(target), makepath=True)
                    self._persisted = target
                except Exception as e:
                    log.warning("cursor %s/%s: %s", self.ml.name, self.name, e)
                    await asyncio.sleep(backoff)
            except Exception as e:   # ZooKeeper unreachable: keep the position in memory, retry
                log.warning("cursor %s/%s: persisting %s: %s", self.ml.name, self.name, target, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def flush(self) -> None:
        if self._writing is not None and not self._writing.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._writing), 5.0)
            except (asyncio.TimeoutError, Exception):
                pass

    async def delete(self) -> None:
        self._deleted = True
        try:
            await self.ml.store.delete(self.path)
        except NoNode:
            pass
