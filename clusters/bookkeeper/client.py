"""The BookKeeper client: ledger creation, pipelined striped writes with ensemble changes,
fencing + recovery (open with recovery), reads.  Runs inside the caller's asyncio loop.

Protocol rules implemented here (see docs: bookkeeper-and-pulsar-internals.md, 1.1-1.5):
  * metadata changes are versioned CAS writes in a re-read-and-retry loop;
  * entry e is written to ensemble[(e + i) % E] for i < Qw and is complete once Qa distinct
    bookies of its write set acknowledged it; completions (and LAC) advance strictly in
    entry-id order, and are held back while an ensemble change is in progress;
  * a bookie error/timeout triggers an ensemble change: new fragment keyed LAC + 1, every
    pending add re-sent to the replacement; a FENCED answer fails the writer for good;
  * deferred failure handling (Qw > Qa): a bookie error for an add that already reached Qa is
    noted and the bookie replaced when the next add is sent, by the same ensemble change, so the
    writer's acknowledgements wait until the new ensemble is in the metadata store (BookKeeper's
    notifyWriteFailed / maybeHandleDelayedWriteBookieFailure since apache/bookkeeper#1592); with
    `delay_ensemble_change` (BookKeeper's delayEnsembleChange, off by default) such an error replaces
    nothing, and an error before Qa replaces bookies only once the add can no longer reach Qa;
  * open with recovery: OPEN -> IN_RECOVERY, fence the last ensemble until quorum coverage,
    start at max(max LAC, first entry of the last fragment - 1), read forward with fencing
    reads (positive on any OK, negative on Qw - Qa + 1 NoSuchEntry), write back with recovery
    adds, then CAS IN_RECOVERY -> CLOSED.

Bug knobs (component "bookkeeper-client", clusters/bugs.py), each restoring a fixed BookKeeper bug:
  * bk.recovery_reads_no_fence (apache/bookkeeper#2614, PR #2616): recovery reads carry no fence
    flag, so a bookie whose fencing LAC read was lost stays unfenced and the old writer's last add
    can reach Qa on it after recovery decided that entry absent;
  * bk.recovery_min_lac_minus_one (apache/bookkeeper#2615, PR #2654): recovery starts at the max
    LAC the last ensemble reports, without the floor first-entry-of-the-last-fragment - 1; an
    empty last fragment makes it re-add earlier fragments' entries to it, and a write-back failure
    then asks for a fragment keyed below the last one: the recovery fails, every time;
  * bk.ack_broken_entry_on_ensemble_change (apache/bookkeeper#3005, PR #3041): after an ensemble
    change the pending adds are re-examined in order, and one the replaced bookie was not in the
    write set of acknowledges the completed adds behind it before they were re-examined, so an add
    whose ack quorum counted the replaced bookie is acknowledged with fewer than Qa copies in its
    (new) fragment, and never re-sent;
  * bk.delayed_ensemble_change_local_only (apache/bookkeeper#1591, fixed by PR #1592): the deferred
    replacement of a bookie that failed after Qa is made in the writer's local ensemble at once, its
    metadata update left to the background, and acknowledgements go on meanwhile; with the metadata
    store slow, successive failures move the whole write set to bookies the stored ensemble does not
    name, and a recovery in that window closes the ledger without the entries acknowledged on them.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections import deque
from typing import Any, Awaitable, Callable

import crc32c
from kazoo.exceptions import KazooException

from clusters.bookie import protocol as P
from clusters.bugs import Knobs
from clusters.metadata.store import BadVersion, MetadataStore, NodeExists, NoNode
from clusters.metrics import REGISTRY

from . import quorum
from .channel import ChannelPool
from .errors import (BKDigestError, BKError, BKLedgerClosedError, BKLedgerFencedError,
                     BKInvalidEnsembleError, BKMetadataVersionError, BKNoSuchEntryError,
                     BKNoSuchLedgerError, BKNotEnoughBookiesError, BKReadError, BKRecoveryError,
                     BKTimeoutError)
from .metadata import (AVAILABLE, CLOSED, IDGEN, IN_RECOVERY, LEDGERS, OPEN, LedgerMetadata,
                       ledger_path, parse_ledger_path)

log = logging.getLogger(__name__)

ENSEMBLE_CHANGES = REGISTRY.counter("bookkeeper_client_ensemble_changes_total",
                                    "ensemble changes of ledgers written by this process")
RECOVERIES = REGISTRY.counter("bookkeeper_client_ledger_recoveries_total",
                              "ledger recoveries (open with recovery) run by this process", ["fence"])
_HANDLES: "weakref.WeakSet[LedgerHandle]" = weakref.WeakSet()     # open write handles, for the gauge
PENDING_ADDS = REGISTRY.gauge("bookkeeper_client_pending_adds",
                              "adds sent and not yet acknowledged by an ack quorum",
                              fn=lambda: sum(len(h._pending) for h in list(_HANDLES)))

ZK_RETRY_FOR = 15.0          # seconds of ZooKeeper connection trouble tolerated per operation
ZK_OP_TIMEOUT = 10.0         # one ZooKeeper call (zkTimeout)
QUARANTINE_S = 10.0          # prefer other bookies for this long after one failed
READ_WINDOW = 512            # max entry reads in flight per read() call
KNOBS_COMPONENT = "bookkeeper-client"   # its bug knobs' component (clusters/bugs.py)
RECOVERY_READ_AHEAD = 16


def _status_name(st: int) -> str:
    return P.STATUS.get(st, str(st))


class BookKeeper:
    def __init__(self, store: MetadataStore, *, add_timeout: float = 5.0,
                 read_timeout: float = 5.0, name: str = "", knobs: Knobs | None = None,
                 delay_ensemble_change: bool = False):
        self.store = store
        # BookKeeper's delayEnsembleChange (default false): a bookie error replaces bookies only once an
        # add can no longer reach Qa, and an error after Qa replaces nothing (the entry stays under-replicated)
        self.delay_ensemble_change = delay_ensemble_change
        # bug knobs (clusters/bugs.py): the owner's (a broker's, a bookie's auto-recovery), seen as the
        # bookkeeper-client's; None (the harness's clients) is every knob at its safe default
        self.knobs = knobs.of(KNOBS_COMPONENT) if knobs is not None else Knobs.defaults(KNOBS_COMPONENT)
        self.add_timeout = add_timeout
        self.read_timeout = read_timeout
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pool: ChannelPool | None = None
        self._quarantine: dict[str, float] = {}
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------
    async def start(self) -> "BookKeeper":
        self.loop = asyncio.get_running_loop()
        self.pool = ChannelPool(self.loop, min(self.add_timeout, self.read_timeout))
        self.pool.start()
        for path in (LEDGERS, AVAILABLE, IDGEN):
            await self._zk(self.store.ensure_path, path)
        return self

    async def close(self) -> None:
        self._closed = True
        if self.pool is not None:
            await self.pool.close()

    # -- ZooKeeper helpers ---------------------------------------------------------------
    async def _zk(self, fn: Callable[..., Awaitable], *args: Any, **kw: Any) -> Any:
        """Run a metadata-store call, retrying connection trouble (not logical errors)."""
        deadline = time.monotonic() + ZK_RETRY_FOR
        delay = 0.05
        while True:
            try:
                return await asyncio.wait_for(fn(*args, **kw), ZK_OP_TIMEOUT)
            except (NoNode, NodeExists, BadVersion):
                raise
            except (KazooException, asyncio.TimeoutError) as e:
                if time.monotonic() >= deadline or self._closed:
                    raise BKError(f"metadata store unavailable: {e!r}") from e
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

    async def _read_metadata(self, ledger_id: int) -> LedgerMetadata:
        try:
            data, version = await self._zk(self.store.get, ledger_path(ledger_id))
        except NoNode:
            raise BKNoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        return LedgerMetadata.deserialize(data, version)

    async def _update_metadata(self, md: LedgerMetadata,
                               predicate: Callable[[LedgerMetadata], bool],
                               transform: Callable[[LedgerMetadata], LedgerMetadata],
                               on_conflict: Callable[[LedgerMetadata], None] | None = None
                               ) -> tuple[LedgerMetadata, bool]:
        """MetadataUpdateLoop: while predicate(md): CAS transform(md); re-read on BadVersion.
        Returns (metadata now, whether we wrote it).  The predicate may raise to abort;
        on_conflict(md) is told of each version conflict (with the metadata that lost)."""
        path = ledger_path(md.ledger_id)
        deadline = time.monotonic() + ZK_RETRY_FOR
        while True:
            if not predicate(md):
                return md, False
            new = transform(md)
            try:
                new.version = await asyncio.wait_for(
                    self.store.set(path, new.serialize(), md.version), ZK_OP_TIMEOUT)
                return new, True
            except BadVersion:
                if on_conflict is not None:
                    on_conflict(md)
                md = await self._read_metadata(md.ledger_id)
            except NoNode:
                raise BKNoSuchLedgerError(f"ledger {md.ledger_id} was deleted") from None
            except (KazooException, asyncio.TimeoutError) as e:
                # outcome unknown: re-read and re-evaluate the predicate
                if time.monotonic() >= deadline or self._closed:
                    raise BKError(f"ledger {md.ledger_id}: metadata update failed: {e!r}") from e
                log.info("ledger %d metadata update: %r; re-reading", md.ledger_id, e)
                await asyncio.sleep(0.1)
                md = await self._read_metadata(md.ledger_id)

    async def available_bookies(self) -> list[str]:
        return [b for b in await self._zk(self.store.children, AVAILABLE) if ":" in b]

    def quarantine(self, addr: str) -> None:
        self._quarantine[addr] = time.monotonic() + QUARANTINE_S

    async def _choose_bookies(self, n: int, exclude: set[str]) -> list[str]:
        avail = [b for b in await self.available_bookies() if b not in exclude]
        now = time.monotonic()
        good = [b for b in avail if self._quarantine.get(b, 0) <= now]
        bad = [b for b in avail if self._quarantine.get(b, 0) > now]
        if len(avail) < n:
            raise BKNotEnoughBookiesError(
                f"need {n} bookies besides {sorted(exclude)}, only {len(avail)} available")
        random.shuffle(good)
        random.shuffle(bad)
        return (good + bad)[:n]

    # -- ledger lifecycle ------------------------------------------------------------------
    async def _new_ledger_id(self) -> int:
        path = await self._zk(self.store.create, IDGEN + "/ID-", b"", sequence=True,
                              makepath=True)
        lid = int(path.rsplit("-", 1)[1])

        async def drop() -> None:
            try:
                await self.store.delete(path)
            except Exception:
                pass
        self.loop.create_task(drop())
        return lid

    async def create_ledger(self, ensemble: int, write_quorum: int, ack_quorum: int,
                            custom: dict | None = None) -> "LedgerHandle":
        if not (ensemble >= write_quorum >= ack_quorum >= 1):
            raise ValueError(f"need E >= Qw >= Qa >= 1, got {ensemble}/{write_quorum}/{ack_quorum}")
        bookies = await self._choose_bookies(ensemble, set())
        lid = await self._new_ledger_id()
        md = LedgerMetadata(lid, ensemble, write_quorum, ack_quorum, OPEN, -1, 0,
                            int(time.time() * 1000), {0: bookies}, dict(custom or {}))
        data = md.serialize()
        try:
            await self._zk(self.store.create, ledger_path(lid), data, makepath=True)
        except NodeExists:   # a retried create of ours that had succeeded
            cur, _ = await self._zk(self.store.get, ledger_path(lid))
            if cur != data:
                raise BKError(f"ledger id {lid} already in use") from None
        md.version = 0
        log.debug("created ledger %d on %s", lid, bookies)
        return LedgerHandle(self, md)

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return await self._read_metadata(ledger_id)

    async def delete_ledger(self, ledger_id: int) -> None:
        md = await self._read_metadata(ledger_id)
        try:
            await self._zk(self.store.delete, ledger_path(ledger_id))
        except NoNode:
            raise BKNoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        for addr in md.bookies():   # best effort: bookies drop the ledger's data
            self.pool.channel(addr).request(P.DELETE, 0, ledger_id, P.INVALID_ENTRY, [],
                                            lambda ctx, st, body: None, None,
                                            self.read_timeout)

    async def list_ledgers(self) -> list[int]:
        """Every ledger id with metadata (walks the hierarchical layout)."""
        out = []
        for a in await self._zk(self.store.children, LEDGERS):
            if not (len(a) == 2 and a.isdigit()):
                continue
            for b in await self._zk(self.store.children, f"{LEDGERS}/{a}"):
                for c in await self._zk(self.store.children, f"{LEDGERS}/{a}/{b}"):
                    lid = parse_ledger_path(f"{LEDGERS}/{a}/{b}/{c}")
                    if lid is not None:
                        out.append(lid)
        return sorted(out)

    async def all_ledger_metadata(self) -> dict[int, LedgerMetadata]:
        """The metadata of every ledger (those deleted while listing are left out)."""
        out = {}
        for lid in await self.list_ledgers():
            try:
                out[lid] = await self._read_metadata(lid)
            except BKNoSuchLedgerError:
                pass
        return out

    async def open_ledger(self, ledger_id: int, recovery: bool = True,
                          fence: bool = True) -> "ReadHandle":
        md = await self._read_metadata(ledger_id)
        if not recovery or md.state == CLOSED:
            return ReadHandle(self, md)
        md, _ = await self._update_metadata(md, lambda m: m.state == OPEN,
                                            lambda m: m.copy(state=IN_RECOVERY))
        if md.state == CLOSED:
            return ReadHandle(self, md)
        md = await self._recover(md, fence)
        return ReadHandle(self, md)

    # -- recovery -----------------------------------------------------------------------
    async def _recover(self, md: LedgerMetadata, fence: bool) -> LedgerMetadata:
        lid = md.ledger_id
        last_key = md.last_ensemble_key()
        RECOVERIES.inc(1, str(fence).lower())
        max_lac = await self._read_lac_quorum(md, fencing=fence, recovery=True)
        if self.knobs.on("bk.recovery_min_lac_minus_one"):
            lac = max_lac          # apache/bookkeeper#2615: no floor at the last fragment's start
        else:
            lac = max(max_lac, last_key - 1)
        log.info("recovering ledger %d (fence=%s): max LAC %d, start %d, ensemble %s",
                 lid, fence, max_lac, lac, md.current_ensemble)
        rh = LedgerHandle(self, md.copy(), recovery=True, start_lac=lac)
        futs: list[asyncio.Future] = []
        eid = lac + 1
        window: deque[tuple[int, asyncio.Future]] = deque()
        try:
            while True:
                while len(window) < RECOVERY_READ_AHEAD:
                    nxt = eid + len(window)
                    window.append((nxt, self._recovery_read(md, nxt, fence)))
                _, fut = window.popleft()
                res = await fut
                if res is None:
                    break
                payload, entry_length = res
                futs.append(rh._add_recovered(eid, payload, entry_length))
                eid += 1
        finally:
            for _, f in window:
                if f.done():
                    if not f.cancelled():
                        f.exception()   # mark retrieved
                else:
                    f.cancel()
        if futs:
            results = await asyncio.gather(*futs, return_exceptions=True)
            for r in results:
                if isinstance(r, BKInvalidEnsembleError):
                    raise BKInvalidEnsembleError(f"ledger {lid}: write-back failed: {r}") from r
                if isinstance(r, BaseException):
                    raise BKRecoveryError(f"ledger {lid}: write-back failed: {r!r}") from r
        last = rh.last_add_confirmed
        length = rh.confirmed_length
        if last == lac:
            length = await self._length_at(md, lac)
        recovered_ensembles = dict(rh.recovery_ensembles)

        def predicate(m: LedgerMetadata) -> bool:
            if m.state == OPEN:
                raise BKRecoveryError(f"ledger {lid} went back to OPEN during recovery")
            return m.state == IN_RECOVERY

        def transform(m: LedgerMetadata) -> LedgerMetadata:
            new = m.copy(state=CLOSED, last_entry_id=last, length=length)
            lk = m.last_ensemble_key()
            for k, ens in sorted(recovered_ensembles.items()):
                if k < lk:
                    raise BKInvalidEnsembleError(f"ledger {lid}: recovery ensemble {k} < {lk}")
                new.ensembles[k] = list(ens)
            return new
        md2, wrote = await self._update_metadata(md, predicate, transform)
        log.info("ledger %d recovered: CLOSED at %d (%s)", lid, md2.last_entry_id,
                 "by us" if wrote else "by another client")
        return md2

    async def _length_at(self, md: LedgerMetadata, entry: int) -> int:
        if entry < 0:
            return 0
        try:
            _, length = await self._read_entry(md, entry, with_length=True)
            return length
        except BKError as e:
            log.warning("ledger %d: length at entry %d unknown: %r", md.ledger_id, entry, e)
            return md.length

    def _read_lac_quorum(self, md: LedgerMetadata, fencing: bool,
                         recovery: bool = False) -> asyncio.Future:
        """Ask every bookie of the last ensemble for its LAC (fencing it if asked); completes
        with the max LAC once the answers give quorum coverage."""
        fut = self.loop.create_future()
        ens = md.current_ensemble
        cov = quorum.CoverageSet(md.ensemble_size, md.write_quorum, md.ack_quorum)
        state = {"max": -1, "errors": []}
        op, flags = (P.READ, P.FLAG_DO_FENCING | P.FLAG_HIGH_PRIORITY) if fencing \
            else (P.READ_LAC, 0)

        def cb(i: int, status: int, body: bytes) -> None:
            if fut.done():
                return
            if status == P.OK:
                try:
                    _, _, _, max_lac, _, _ = P.decode_read_body(body)
                    state["max"] = max(state["max"], max_lac)
                    cov.add_known(i)
                except ValueError:
                    cov.add_unknown(i)
            elif status in (P.NO_SUCH_LEDGER, P.NO_SUCH_ENTRY):
                cov.add_known(i)
            else:
                state["errors"].append(f"{ens[i]}: {_status_name(status)}")
                cov.add_unknown(i)
            if cov.covered():
                fut.set_result(state["max"])
            elif cov.all_answered():
                err = BKRecoveryError if recovery else BKReadError
                fut.set_exception(err(
                    f"ledger {md.ledger_id}: no quorum coverage of {ens} "
                    f"({'fencing' if fencing else 'LAC read'}): {state['errors']}"))
        for i, addr in enumerate(ens):
            self.pool.channel(addr).request(op, flags, md.ledger_id, P.INVALID_ENTRY, [],
                                            cb, i, self.read_timeout)
        return fut

    def _recovery_read(self, md: LedgerMetadata, eid: int, fencing: bool) -> asyncio.Future:
        """Read entry eid from its whole write set: (payload, length) on the first OK, None once
        Qw - Qa + 1 bookies say they do not have it; BKRecoveryError if undecidable."""
        fut = self.loop.create_future()
        ens = md.ensemble_for(eid)
        ws = quorum.write_set(eid, md.ensemble_size, md.write_quorum)
        st = [0, 0, 0]   # ok, missing, answered
        errors: list[str] = []
        if self.knobs.on("bk.recovery_reads_no_fence"):
            fencing = False        # apache/bookkeeper#2614: only the LAC reads fence
        flags = (P.FLAG_DO_FENCING | P.FLAG_HIGH_PRIORITY) if fencing else P.FLAG_HIGH_PRIORITY

        def cb(i: int, status: int, body: bytes) -> None:
            if fut.done():
                return
            st[2] += 1
            if status == P.OK:
                try:
                    _, length, crc, _, _, payload = P.decode_read_body(body)
                    if crc32c.crc32c(payload) != crc:
                        raise ValueError("checksum mismatch")
                    fut.set_result((payload, length))
                    return
                except ValueError as e:
                    errors.append(f"{ens[i]}: {e}")
            elif status in (P.NO_SUCH_ENTRY, P.NO_SUCH_LEDGER):
                st[1] += 1
            else:
                errors.append(f"{ens[i]}: {_status_name(status)}")
            outcome = quorum.recovery_read_outcome(md.write_quorum, md.ack_quorum, st[0],
                                                   st[1], st[2])
            if outcome == "negative":
                fut.set_result(None)
            elif outcome == "unknown":
                fut.set_exception(BKRecoveryError(
                    f"ledger {md.ledger_id} entry {eid}: cannot tell whether it exists: {errors}"))
        for i in ws:
            self.pool.channel(ens[i]).request(P.READ, flags, md.ledger_id, eid, [], cb, i,
                                              self.read_timeout)
        return fut

    # -- reads ------------------------------------------------------------------------
    def _read_entry(self, md: LedgerMetadata, eid: int, with_length: bool = False
                    ) -> asyncio.Future:
        """Read one entry from the first bookie of its write set that has it."""
        fut = self.loop.create_future()
        ens = md.ensemble_for(eid)
        ws = quorum.write_set(eid, md.ensemble_size, md.write_quorum)
        now = time.monotonic()
        # try bookies not in quarantine first, keeping write-set order otherwise
        order = sorted(ws, key=lambda i: self._quarantine.get(ens[i], 0) > now)
        results: list[int] = []

        def attempt(k: int) -> None:
            self.pool.channel(ens[order[k]]).request(P.READ, 0, md.ledger_id, eid, [], cb, k,
                                                     self.read_timeout)

        def cb(k: int, status: int, body: bytes) -> None:
            if fut.done():
                return
            if status == P.OK:
                try:
                    _, length, crc, _, _, payload = P.decode_read_body(body)
                except ValueError:
                    status = P.BAD_REQUEST
                else:
                    if crc32c.crc32c(payload) == crc:
                        fut.set_result((payload, length) if with_length else payload)
                        return
                    status = -1
            results.append(status)
            if status in (P.TIMEOUT, P.CONNECTION_LOST):
                self.quarantine(ens[order[k]])
            if k + 1 < len(order):
                attempt(k + 1)
                return
            if all(s in (P.NO_SUCH_ENTRY, P.NO_SUCH_LEDGER) for s in results):
                err: BKError = BKNoSuchEntryError(
                    f"ledger {md.ledger_id} entry {eid}: no bookie of {[ens[i] for i in ws]} has it")
            elif -1 in results:
                err = BKDigestError(f"ledger {md.ledger_id} entry {eid}: checksum mismatch")
            elif all(s == P.TIMEOUT for s in results):
                err = BKTimeoutError(f"ledger {md.ledger_id} entry {eid}: read timed out")
            else:
                err = BKReadError(f"ledger {md.ledger_id} entry {eid}: "
                                  f"{[_status_name(s) for s in results]}")
            fut.set_exception(err)
        attempt(0)
        return fut

    async def _read_entries(self, md: LedgerMetadata, first: int, last: int) -> list[bytes]:
        out: list[bytes] = []
        eid = first
        while eid <= last:
            hi = min(last, eid + READ_WINDOW - 1)
            futs = [self._read_entry(md, e) for e in range(eid, hi + 1)]
            try:
                for f in futs:
                    out.append(await f)
            finally:
                for f in futs:
                    if not f.done():
                        f.cancel()
                    elif not f.cancelled():
                        f.exception()   # mark retrieved
            eid = hi + 1
        return out


class _PendingAdd:
    __slots__ = ("entry_id", "payload", "length", "crc", "fut", "acked", "completed", "sent",
                 "ws", "failed")

    def __init__(self, entry_id: int, payload: bytes, length: int, crc: int,
                 fut: asyncio.Future, ws: list[int]):
        self.entry_id = entry_id
        self.payload = payload
        self.length = length
        self.crc = crc
        self.fut = fut
        self.acked = 0          # bitmask of ensemble indexes that acknowledged
        self.failed = 0         # bitmask of ensemble indexes that answered an error (delay_ensemble_change)
        self.completed = False
        self.sent = False
        self.ws = ws


class LedgerHandle:
    """The writer of one ledger (also used internally for recovery write-back)."""

    def __init__(self, bk: BookKeeper, md: LedgerMetadata, *, recovery: bool = False,
                 start_lac: int = -1):
        _HANDLES.add(self)
        self.bk = bk
        self.metadata = md          # the writer's view (with bk.delayed_ensemble_change_local_only it
        self._stored = md           # can be ahead of _stored, the metadata as the store has it)
        self.ledger_id = md.ledger_id
        self.E, self.Qw, self.Qa = md.ensemble_size, md.write_quorum, md.ack_quorum
        self.ensemble: list[str] = list(md.current_ensemble)
        self.last_add_pushed = start_lac
        self.last_add_confirmed = start_lac
        self.length = 0             # ledger length through last_add_pushed
        self.confirmed_length = 0   # ledger length through last_add_confirmed
        self._recovery = recovery
        self._flags = (P.FLAG_RECOVERY_ADD | P.FLAG_HIGH_PRIORITY) if recovery else P.FLAG_NONE
        self.recovery_ensembles: dict[int, list[str]] = {}
        self._pending: deque[_PendingAdd] = deque()
        self._changing = False
        self._failed_bookies: dict[int, str] = {}
        # bookies that failed an add after it reached Qa, replaced when the next add is sent (BookKeeper's
        # delayedWriteFailedBookies)
        self._delayed_failed: dict[int, str] = {}
        self._change_task: asyncio.Task | None = None
        self._local_task: asyncio.Task | None = None      # bk.delayed_ensemble_change_local_only's
        self._persist_task: asyncio.Task | None = None    # (its local change, its metadata update)
        self._error: BKError | None = None
        self._closing = False
        self._closed = False
        self._drain_waiter: asyncio.Future | None = None
        self._write_sets = [quorum.write_set(i, self.E, self.Qw) for i in range(self.E)]
        self.ensemble_changes = 0

    # -- public ----------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def pending_adds(self) -> int:
        return len(self._pending)

    async def add_entry(self, data: bytes) -> int:
        """Append data; returns its entry id.  Completes in entry-id order.  The entry id is
        assigned when this coroutine starts; use add_entry_async to assign it synchronously."""
        return await self.add_entry_async(data)

    def add_entry_async(self, data: bytes) -> asyncio.Future:
        """Assign the next entry id now and send it; a future of the entry id."""
        fut = self.bk.loop.create_future()
        if self._error is not None:
            fut.set_exception(self._copy_error(self._error))
            return fut
        if self._closing or self._closed:
            fut.set_exception(BKLedgerClosedError(f"ledger {self.ledger_id} is closed"))
            return fut
        data = bytes(data)
        self.last_add_pushed += 1
        eid = self.last_add_pushed
        self.length += len(data)
        op = _PendingAdd(eid, data, self.length, crc32c.crc32c(data), fut,
                         self._write_sets[eid % self.E])
        self._pending.append(op)
        self._maybe_handle_delayed_failures()
        if not self._changing:
            self._send(op, op.ws)
        return fut

    def _add_recovered(self, eid: int, data: bytes, length: int) -> asyncio.Future:
        """Recovery write-back of entry eid (must be last_add_pushed + 1)."""
        if eid != self.last_add_pushed + 1:
            raise BKRecoveryError(f"unexpected recovery entry {eid} after {self.last_add_pushed}")
        fut = self.bk.loop.create_future()
        if self._error is not None:
            fut.set_exception(self._copy_error(self._error))
            return fut
        self.last_add_pushed = eid
        self.length = length
        op = _PendingAdd(eid, data, length, crc32c.crc32c(data), fut,
                         self._write_sets[eid % self.E])
        self._pending.append(op)
        self._maybe_handle_delayed_failures()
        if not self._changing:
            self._send(op, op.ws)
        return fut

    async def read(self, first: int, last: int) -> list[bytes]:
        if first < 0 or last < first:
            raise ValueError(f"bad range {first}..{last}")
        if last > self.last_add_confirmed:
            raise BKNoSuchEntryError(f"ledger {self.ledger_id}: entry {last} is beyond the "
                                     f"last add confirmed {self.last_add_confirmed}")
        return await self.bk._read_entries(self.metadata, first, last)

    async def close(self, drain_timeout: float | None = None) -> None:
        """Close the ledger at its LAC (CAS OPEN -> CLOSED with lastEntryId = LAC).

        New adds are refused at once.  Adds already in flight get up to `drain_timeout`
        (default: twice the add timeout) to complete - unlike BookKeeper, which fails them
        immediately - and whatever is still pending then fails with BKLedgerClosedError."""
        if self._closed:
            return
        self._closing = True
        if drain_timeout is None:
            drain_timeout = 2 * self.bk.add_timeout
        if self._pending and self._error is None and drain_timeout > 0:
            self._drain_waiter = self.bk.loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._drain_waiter), drain_timeout)
            except asyncio.TimeoutError:
                pass
            finally:
                self._drain_waiter = None
        for task in (self._change_task, self._local_task, self._persist_task):
            if task is not None:
                try:
                    await task
                except Exception:
                    pass
        if self._pending:
            self._fail_pending(BKLedgerClosedError(f"ledger {self.ledger_id} closed"),
                               sticky=False)
        lac, length = self.last_add_confirmed, self.confirmed_length

        def predicate(m: LedgerMetadata) -> bool:
            if m.state == CLOSED:
                if m.last_entry_id == lac and m.length == length:
                    return False
                raise BKMetadataVersionError(
                    f"ledger {self.ledger_id} already closed at {m.last_entry_id}, not {lac}")
            return True

        md, _ = await self.bk._update_metadata(
            self.metadata, predicate,
            lambda m: m.copy(state=CLOSED, last_entry_id=lac, length=length))
        self.metadata = self._stored = md
        self._closed = True

    # -- sending / acks ------------------------------------------------------------------
    def _send(self, op: _PendingAdd, indexes: list[int]) -> None:
        op.sent = True
        body = P.ADD_BODY.pack(self.last_add_confirmed, op.length, op.crc)
        parts = [body, op.payload]
        pool = self.bk.pool
        ens = self.ensemble
        timeout = self.bk.add_timeout
        lid = self.ledger_id
        for i in indexes:
            addr = ens[i]
            pool.channel(addr).request(P.ADD, self._flags, lid, op.entry_id, parts,
                                       self._on_add, (op, i, addr), timeout)

    def _on_add(self, ctx: tuple, status: int, body: bytes) -> None:
        op, i, addr = ctx
        if self.ensemble[i] != addr:
            return   # an answer from a bookie that has been replaced since: ignore it
        if status == P.OK:
            op.acked |= 1 << i
            if not op.completed and op.acked.bit_count() >= self.Qa:
                op.completed = True
                if self._pending and self._pending[0] is op:
                    self._send_success_callbacks()
            return
        if status == P.FENCED:
            self._fail_pending(BKLedgerFencedError(
                f"ledger {self.ledger_id} fenced (bookie {addr}, entry {op.entry_id})"))
            return
        if self._error is not None or self._closed:
            return
        if self._failed_bookies.get(i) != addr and self._delayed_failed.get(i) != addr:
            log.info("ledger %d: add %d to bookie %s failed: %s", self.ledger_id, op.entry_id,
                     addr, _status_name(status))
            self.bk.quarantine(addr)
        if op.completed:
            # the entry already reached Qa (it is under-replicated): the bookie is replaced when the next
            # add is sent (deferred failure handling), or never with delay_ensemble_change
            if not self.bk.delay_ensemble_change:
                self._delayed_failed[i] = addr
            return
        if self.bk.delay_ensemble_change:
            op.failed |= 1 << i
            if op.failed.bit_count() <= self.Qw - self.Qa:
                return                  # the add can still reach Qa without it
            self._handle_bookie_failure({j: self.ensemble[j] for j in op.ws if (op.failed >> j) & 1})
            return
        self._handle_bookie_failure({i: addr})

    def _send_success_callbacks(self) -> None:
        if self._changing:
            return
        p = self._pending
        while p:
            op = p[0]
            if not op.completed:
                break
            p.popleft()
            self.last_add_confirmed = op.entry_id
            self.confirmed_length = op.length
            if not op.fut.done():
                op.fut.set_result(op.entry_id)
        if not p:
            self._wake_drain()

    def _wake_drain(self) -> None:
        w = self._drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    @staticmethod
    def _copy_error(e: BKError) -> BKError:
        return type(e)(*e.args)

    def _fail_pending(self, err: BKError, sticky: bool = True) -> None:
        if sticky and self._error is None:
            self._error = err
        pending, self._pending = self._pending, deque()
        for op in pending:
            if not op.fut.done():
                op.fut.set_exception(self._copy_error(err))
        self._wake_drain()

    # -- ensemble change -------------------------------------------------------------------
    def _handle_bookie_failure(self, failed: dict[int, str]) -> None:
        if self._error is not None or self._closed:
            return
        for i, a in failed.items():
            if self.ensemble[i] == a:
                self._failed_bookies[i] = a
        if self._failed_bookies and not self._changing:
            self._changing = True
            self._change_task = self.bk.loop.create_task(self._ensemble_change_loop())

    async def _ensemble_change_loop(self) -> None:
        try:
            while self._failed_bookies and self._error is None:
                failed = {i: a for i, a in self._failed_bookies.items() if self.ensemble[i] == a}
                self._failed_bookies.clear()
                if not failed:
                    continue
                try:
                    new_ens = await self._change_ensemble(failed)
                except BKError as e:
                    log.warning("ledger %d: ensemble change failed: %r", self.ledger_id, e)
                    self._fail_pending(e)
                    return
                except Exception as e:
                    log.exception("ledger %d: ensemble change failed", self.ledger_id)
                    self._fail_pending(BKError(f"ensemble change failed: {e!r}"))
                    return
                replaced = [i for i in range(self.E) if new_ens[i] != self.ensemble[i]]
                self.ensemble = list(new_ens)
                self.ensemble_changes += 1
                mask = 0
                for i in replaced:
                    mask |= 1 << i
                broken = self.bk.knobs.on("bk.ack_broken_entry_on_ensemble_change")
                if broken:
                    # apache/bookkeeper#3005: the change counts as over before the pending adds are
                    # re-examined, and an add untouched by it acknowledges the completed ones behind
                    # it (sendAddSuccessCallbacks) before their ack sets lost the replaced bookie
                    self._changing = False
                for op in list(self._pending):
                    if broken and op.fut.done():
                        continue           # acknowledged meanwhile: neither unset nor re-sent
                    if not op.sent:
                        self._send(op, op.ws)
                        continue
                    if broken and not any((mask >> i) & 1 for i in op.ws):
                        before = self.last_add_confirmed
                        self._send_success_callbacks()
                        if self.last_add_confirmed != before:
                            log.info("ledger %d: entries %d-%d acknowledged during the ensemble change's "
                                     "unset (bk.ack_broken_entry_on_ensemble_change)", self.ledger_id,
                                     before + 1, self.last_add_confirmed)
                        continue
                    self._unset_and_resend(op, mask)
                if broken:
                    self._changing = True      # (until this loop ends, as without the knob)
        finally:
            self._changing = False
            self._change_task = None
            if self._error is None:
                self._send_success_callbacks()

    def _unset_and_resend(self, op: _PendingAdd, mask: int) -> None:
        """The bookies at the indexes in `mask` were replaced: they no longer count in op's ack set, and
        op is sent to their replacements (BookKeeper's unsetSuccessAndSendWriteRequest)."""
        op.acked &= ~mask
        op.failed &= ~mask
        if op.completed and op.acked.bit_count() < self.Qa:
            op.completed = False
        targets = [i for i in op.ws if (mask >> i) & 1]
        if targets:
            self._send(op, targets)

    # -- deferred failure handling --------------------------------------------------------
    def _maybe_handle_delayed_failures(self) -> None:
        """Before an add is sent: replace the bookies that failed an add after it reached Qa."""
        if not self._delayed_failed or self._error is not None or self._closed:
            return
        failed = {i: a for i, a in self._delayed_failed.items() if self.ensemble[i] == a}
        self._delayed_failed.clear()
        if not failed:
            return
        if not self._recovery and self.bk.knobs.on("bk.delayed_ensemble_change_local_only"):
            if self._local_task is not None or self._changing:
                self._delayed_failed.update(failed)       # the next add tries again
            else:
                self._local_task = self.bk.loop.create_task(self._local_only_change(failed))
            return
        # the fix of apache/bookkeeper#1591: the same ensemble change as for a failure before Qa, which
        # holds every acknowledgement until the new ensemble is stored
        self._handle_bookie_failure(failed)

    async def _local_only_change(self, failed: dict[int, str]) -> None:
        """bk.delayed_ensemble_change_local_only (apache/bookkeeper#1591): replace the bookies in the local
        ensemble now, store the change in the background, and keep acknowledging adds meanwhile."""
        try:
            try:
                new_bookies = await self.bk._choose_bookies(len(failed), set(self.ensemble) | set(failed.values()))
            except BKError:
                self._handle_bookie_failure(failed)       # no spare bookie: the ordinary path fails it
                return
            failed = {i: a for i, a in failed.items() if self.ensemble[i] == a}
            if not failed or self._error is not None or self._closed:
                return
            new_key = self.last_add_confirmed + 1
            if self._changing or self.metadata.last_ensemble_key() > new_key:
                self._delayed_failed.update(failed)
                return
            ens = list(self.ensemble)
            mask = 0
            for (i, _), nb in zip(sorted(failed.items()), new_bookies):
                ens[i] = nb
                mask |= 1 << i
            local = self.metadata.copy()
            local.ensembles[new_key] = ens
            ENSEMBLE_CHANGES.inc()
            log.info("ledger %d: ensemble changed locally at entry %d: %s -> %s; its metadata update goes on in "
                     "the background, acknowledgements do not wait (bk.delayed_ensemble_change_local_only)",
                     self.ledger_id, new_key, sorted(failed.values()), new_bookies)
            self.metadata = local
            self.ensemble = ens
            self.ensemble_changes += 1
            for op in list(self._pending):
                if op.sent:
                    self._unset_and_resend(op, mask)
            if self._persist_task is None:
                self._persist_task = self.bk.loop.create_task(self._persist_local())
        finally:
            self._local_task = None

    def _local_ahead_of(self, m: LedgerMetadata) -> bool:
        lk = m.last_ensemble_key()
        return any(k >= lk and m.ensembles.get(k) != ens for k, ens in self.metadata.ensembles.items())

    def _overlay_local(self, m: LedgerMetadata) -> LedgerMetadata:
        """`m` with the local fragments it lacks (those keyed at or after its last one)."""
        new = m.copy()
        lk = m.last_ensemble_key()
        for k, ens in sorted(self.metadata.ensembles.items()):
            if k >= lk:
                new.ensembles[k] = list(ens)
        return new

    async def _persist_local(self) -> None:
        """Store the local-only fragments, in the background, until the store has them all; a ledger
        recovered or closed meanwhile fails the writer (then, not before, it learns it was fenced)."""
        def predicate(m: LedgerMetadata) -> bool:
            if m.state == CLOSED:
                raise BKLedgerClosedError(f"ledger {self.ledger_id} was closed by another client")
            if m.state == IN_RECOVERY:
                raise BKLedgerFencedError(f"ledger {self.ledger_id} is being recovered by another client")
            return self._local_ahead_of(m)
        try:
            while self._error is None and not self._closed:
                new, _ = await self.bk._update_metadata(self._stored, predicate, self._overlay_local)
                self._stored = new
                if not self._local_ahead_of(new):
                    self.metadata = new
                    return
                self.metadata = self._overlay_local(new)
        except BKError as e:
            log.warning("ledger %d: background metadata update failed: %r", self.ledger_id, e)
            self._fail_pending(e)
        finally:
            self._persist_task = None

    async def _change_ensemble(self, failed: dict[int, str]) -> list[str]:
        """Replace the failed bookies; returns the new current ensemble (written to metadata
        unless this is a recovery handle, which only keeps it locally until close)."""
        md = self.metadata
        exclude = set(self.ensemble) | set(failed.values())
        new_bookies = await self.bk._choose_bookies(len(failed), exclude)
        new_key = self.last_add_confirmed + 1
        ENSEMBLE_CHANGES.inc()
        log.info("ledger %d: ensemble change at entry %d: %s -> %s", self.ledger_id, new_key,
                 {self.ensemble[i]: None for i in failed}, new_bookies)

        def transform_local(m: LedgerMetadata) -> LedgerMetadata:
            new = m.copy()
            ens = list(m.current_ensemble)
            for (i, _), nb in zip(sorted(failed.items()), new_bookies):
                ens[i] = nb
            lk = m.last_ensemble_key()
            if lk > new_key:
                raise BKInvalidEnsembleError(f"ledger {self.ledger_id}: a new fragment at LAC+1 "
                                             f"{new_key} below the last fragment {lk}")
            new.ensembles[new_key] = ens    # replaces the last fragment if lk == new_key
            return new

        if self._recovery:
            new = transform_local(md)
            self.metadata = new
            self.recovery_ensembles[new_key] = list(new.current_ensemble)
            return list(new.current_ensemble)

        def predicate(m: LedgerMetadata) -> bool:
            if m.state == CLOSED:
                raise BKLedgerClosedError(f"ledger {self.ledger_id} was closed by another client")
            if m.state == IN_RECOVERY:
                raise BKLedgerFencedError(
                    f"ledger {self.ledger_id} is being recovered by another client")
            cur = m.current_ensemble
            return all(cur[i] == a for i, a in failed.items())

        new, wrote = await self.bk._update_metadata(md, predicate, transform_local)
        self.metadata = self._stored = new
        return list(new.current_ensemble)


class ReadHandle:
    """A reader of a ledger: closed (after recovery) or as its metadata was when opened."""

    def __init__(self, bk: BookKeeper, md: LedgerMetadata):
        self.bk = bk
        self.metadata = md
        self.ledger_id = md.ledger_id
        self._lac = md.last_entry_id if md.state == CLOSED else -1

    @property
    def is_closed(self) -> bool:
        return self.metadata.state == CLOSED

    @property
    def last_entry_id(self) -> int:
        """The last entry of a closed ledger (else the last add confirmed known so far)."""
        return self.metadata.last_entry_id if self.is_closed else self._lac

    @property
    def last_add_confirmed(self) -> int:
        return self.last_entry_id

    @property
    def length(self) -> int:
        return self.metadata.length

    async def refresh(self) -> LedgerMetadata:
        self.metadata = await self.bk._read_metadata(self.ledger_id)
        if self.is_closed:
            self._lac = self.metadata.last_entry_id
        return self.metadata

    async def read_lac(self) -> int:
        """The last add confirmed: last_entry_id if closed, else the max LAC the bookies of the
        last ensemble report (quorum coverage, no fencing)."""
        if self.is_closed:
            return self.metadata.last_entry_id
        await self.refresh()
        if self.is_closed:
            return self.metadata.last_entry_id
        lac = await self.bk._read_lac_quorum(self.metadata, fencing=False)
        self._lac = max(self._lac, lac)
        return self._lac

    async def read(self, first: int, last: int) -> list[bytes]:
        if first < 0 or last < first:
            raise ValueError(f"bad range {first}..{last}")
        if last > self.last_entry_id and not self.is_closed:
            await self.read_lac()
        if last > self.last_entry_id:
            raise BKNoSuchEntryError(f"ledger {self.ledger_id}: entry {last} is beyond "
                                     f"{self.last_entry_id}")
        return await self.read_unconfirmed(first, last)

    async def read_unconfirmed(self, first: int, last: int) -> list[bytes]:
        """Read without checking the range against the LAC (may see unacknowledged entries)."""
        try:
            return await self.bk._read_entries(self.metadata, first, last)
        except (BKNoSuchEntryError, BKReadError, BKTimeoutError):
            if self.is_closed:
                raise
            old = self.metadata.ensembles
            await self.refresh()          # an ensemble change may have moved the entries
            if self.metadata.ensembles == old:
                raise
            return await self.bk._read_entries(self.metadata, first, last)
