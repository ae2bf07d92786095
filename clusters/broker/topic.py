"""A topic as the broker serves it: producers append to its ManagedLedger, subscriptions dispatch from it.

Entries are stored as the producer sent them (from the 0x0e01 magic on) and forwarded verbatim in
MESSAGE frames. Per-subscription state is kept per entry, never per message: outstanding
(delivered-but-unacked or waiting for redelivery) positions, their redelivery counts, and the read
position; the mark-delete position is derived from them and persisted through the cursor.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import heapq
import itertools
import logging
import time
import zlib
from typing import Any, Iterable

from clusters.broker.managed_ledger import ManagedLedgerError, ManagedLedgerFenced, Position
from clusters.protocol import frames
from clusters.protocol import PulsarApi_pb2 as pb

log = logging.getLogger(__name__)

INT64_MAX = (1 << 63) - 1
SUB_TYPE_NAMES = {0: "Exclusive", 1: "Shared", 2: "Failover", 3: "Key_Shared"}
EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = 0, 1, 2, 3
ACCESS_SHARED, ACCESS_EXCLUSIVE, ACCESS_WAIT_FOR_EXCLUSIVE, ACCESS_EXCLUSIVE_WITH_FENCING = 0, 1, 2, 3

TAIL_CACHE_ENTRIES = 4096          # recently added entries kept for tailing subscriptions
TAIL_CACHE_BYTES = 32 * 1024 * 1024
MAX_READ_ENTRIES = 100             # entries per dispatch round
CLOSE_DRAIN_TIMEOUT = 5.0          # how long close() waits for in-flight adds before disconnecting
LIVENESS_CHECK_TIMEOUT = 5.0       # probe of the previous holder of an exclusive subscription
NON_DURABLE_GRACE = 30.0           # a reader's subscription outlives a seek's disconnect this long
NONE_KEY = b"NONE_KEY"             # Key_Shared routing key of entries without a key (as Pulsar)


# ----------------------------------------------------------------------------- errors

class BrokerServiceError(Exception):
    """A request refused with a ServerError code; `str(e)` is the message sent to the client."""
    code: int = pb.UnknownError

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class ServiceUnitNotReady(BrokerServiceError):
    """The topic is not (or no longer) served here; the client redoes the lookup and retries."""
    code = pb.ServiceNotReady


class ProducerBusy(BrokerServiceError):
    code = pb.ProducerBusy


class ConsumerBusy(BrokerServiceError):
    code = pb.ConsumerBusy


class NotAllowed(BrokerServiceError):
    code = pb.NotAllowedError


def not_served(topic: str, why: str = "") -> ServiceUnitNotReady:
    extra = f" ({why})" if why else ""
    return ServiceUnitNotReady(f"Topic {topic} not served by this instance{extra}. Please redo the lookup")


# ----------------------------------------------------------------------------- entries

class EntryInfo:
    """What dispatch needs to know about an entry, parsed once from its metadata."""
    __slots__ = ("num_messages", "key", "publish_time", "is_batch")

    def __init__(self, num_messages: int, key: bytes | None, publish_time: int, is_batch: bool):
        self.num_messages = num_messages
        self.key = key
        self.publish_time = publish_time
        self.is_batch = is_batch

    @classmethod
    def from_metadata(cls, md: pb.MessageMetadata) -> "EntryInfo":
        batch = md.HasField("num_messages_in_batch")
        n = md.num_messages_in_batch if batch else 1
        if md.HasField("ordering_key"):
            key = md.ordering_key
        elif md.HasField("partition_key"):
            key = md.partition_key.encode()
        else:
            key = None
        return cls(max(n, 1), key, md.publish_time, batch)

    @classmethod
    def from_entry(cls, entry: bytes) -> "EntryInfo":
        try:
            return cls.from_metadata(frames.entry_metadata(entry))
        except frames.ProtocolError:
            log.warning("stored entry with unreadable metadata; dispatching it as one message")
            return cls(1, None, 0, False)


class _CachedEntry:
    __slots__ = ("entry", "info", "next")

    def __init__(self, entry: bytes, info: EntryInfo):
        self.entry = entry
        self.info = info
        self.next: Position | None = None     # the position added right after this one, once known


# ----------------------------------------------------------------------------- producers

class Producer:
    __slots__ = ("topic", "cnx", "producer_id", "name", "epoch", "access_mode", "user_provided_name",
                 "closed", "msgs_in", "bytes_in", "created")

    def __init__(self, topic: "Topic", cnx: Any, producer_id: int, name: str, epoch: int,
                 access_mode: int, user_provided_name: bool):
        self.topic = topic
        self.cnx = cnx
        self.producer_id = producer_id
        self.name = name
        self.epoch = epoch
        self.access_mode = access_mode
        self.user_provided_name = user_provided_name
        self.closed = False
        self.msgs_in = 0
        self.bytes_in = 0
        self.created = time.time()

    def __repr__(self) -> str:
        return f"Producer({self.name!r}, id={self.producer_id}, topic={self.topic.name})"


class _PendingAdd:
    __slots__ = ("producer", "sequence_id", "highest_sequence_id", "entry", "info", "pos", "error", "done")

    def __init__(self, producer: Producer, sequence_id: int, highest: int, entry: bytes, info: EntryInfo):
        self.producer = producer
        self.sequence_id = sequence_id
        self.highest_sequence_id = highest
        self.entry = entry
        self.info = info
        self.pos: Position | None = None
        self.error: BaseException | None = None
        self.done = False


# ----------------------------------------------------------------------------- consumers

class Consumer:
    __slots__ = ("sub", "cnx", "consumer_id", "name", "priority", "permits", "pending", "join_seq",
                 "closed", "key_ranges", "msgs_out", "bytes_out", "redelivered", "connected_since",
                 "sub_type")

    _seq = itertools.count()

    def __init__(self, sub: "Subscription", cnx: Any, consumer_id: int, name: str, priority: int,
                 sub_type: int, key_ranges: list[tuple[int, int]] | None = None):
        self.sub = sub
        self.cnx = cnx
        self.consumer_id = consumer_id
        self.name = name
        self.priority = priority
        self.sub_type = sub_type
        self.permits = 0
        self.pending: dict[Position, int] = {}     # delivered, not yet acked: position -> messages
        self.join_seq = next(Consumer._seq)
        self.closed = False
        self.key_ranges = key_ranges
        self.msgs_out = 0
        self.bytes_out = 0
        self.redelivered = 0
        self.connected_since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    @property
    def available(self) -> bool:
        return self.permits > 0 and self.cnx.writable and not self.closed

    def deliver(self, pos: Position, entry: bytes, n: int, redelivery_count: int) -> None:
        self.pending[pos] = n
        self.sub.outstanding[pos] = self
        self.permits -= n
        self.msgs_out += n
        self.bytes_out += len(entry)
        self.cnx.send_message(self.consumer_id, pos.ledger_id, pos.entry_id, redelivery_count, entry)

    def __repr__(self) -> str:
        return f"Consumer({self.name!r}, id={self.consumer_id}, sub={self.sub.name})"


class NonDurableCursor:
    """The in-memory cursor of a reader's (non-durable) subscription; same surface as ManagedCursor."""

    def __init__(self, name: str, mark_delete: Position | None):
        self.name = name
        self.mark_delete_position = mark_delete

    async def mark_delete(self, pos: Position) -> None:
        if self.mark_delete_position is None or pos > self.mark_delete_position:
            self.mark_delete_position = pos

    async def reset(self, pos: Position | None) -> None:
        self.mark_delete_position = None if pos is None else Position(pos.ledger_id, pos.entry_id - 1)

    async def flush(self) -> None:
        return None


# ----------------------------------------------------------------------------- dispatch policies

class Dispatcher:
    """Decides which consumer gets which entry. Subclasses implement one subscription type."""

    def __init__(self, sub: "Subscription"):
        self.sub = sub

    def consumers_changed(self) -> None:
        pass

    def permits(self) -> int:
        """Messages the subscription may send now (0: nothing to do until FLOW / writability)."""
        return sum(c.permits for c in self.sub.consumers if c.available)

    def dispatch(self, entries: list[tuple[Position, bytes, EntryInfo]], redeliveries: dict) -> int:
        """Send a prefix of `entries`; return its length (entries not taken are retried later)."""
        raise NotImplementedError


class SingleActiveDispatcher(Dispatcher):
    """Exclusive and Failover: everything goes to one active consumer.

    Failover picks the consumer with the lowest priority_level, then the earliest attached one, so
    a joining consumer never takes over from a working one. When the active consumer changes, what
    the old one had not acknowledged is redelivered to the new one.
    """

    def __init__(self, sub: "Subscription"):
        super().__init__(sub)
        self.active: Consumer | None = None

    def consumers_changed(self) -> None:
        cs = self.sub.consumers
        new = min(cs, key=lambda c: (c.priority, c.join_seq)) if cs else None
        if new is self.active:
            return
        old, self.active = self.active, new
        if old is not None and not old.closed:
            self.sub.rewind_consumer(old)
        if self.sub.sub_type == FAILOVER:
            for c in cs:
                c.cnx.send_active_consumer_change(c.consumer_id, c is new)

    def permits(self) -> int:
        a = self.active
        return a.permits if a is not None and a.available else 0

    def dispatch(self, entries, redeliveries) -> int:
        c = self.active
        if c is None:
            return 0
        n = 0
        for pos, entry, info in entries:
            if not c.available:
                break
            c.deliver(pos, entry, info.num_messages, redeliveries.get(pos, 0))
            n += 1
        return n


class SharedDispatcher(Dispatcher):
    """Shared: entries round-robin over the consumers that have permits."""

    def __init__(self, sub: "Subscription"):
        super().__init__(sub)
        self._rr = 0

    def dispatch(self, entries, redeliveries) -> int:
        cs = self.sub.consumers
        if not cs:
            return 0
        n = 0
        k = len(cs)
        for pos, entry, info in entries:
            for _ in range(k):
                c = cs[self._rr % k]
                self._rr += 1
                if c.available:
                    break
            else:
                return n
            c.deliver(pos, entry, info.num_messages, redeliveries.get(pos, 0))
            n += 1
        return n


class KeySharedDispatcher(Dispatcher):
    """Key_Shared: an entry goes to the consumer owning the hash of its key (ordering key, else
    partition key, else a fixed key). AUTO_SPLIT splits 0..65535 evenly over the consumers in join
    order; STICKY uses the ranges each consumer declared. A key whose consumer has no permits holds
    back the entries behind it (per-key order first). Simplification: when consumers come and go,
    keys move at once (Pulsar delays a moved key until the old owner acked it)."""

    RANGE = 65536

    def _select(self, key: bytes | None) -> Consumer | None:
        cs = self.sub.consumers
        if not cs:
            return None
        h = zlib.crc32(key if key is not None else NONE_KEY) % self.RANGE
        sticky = [c for c in cs if c.key_ranges]
        if sticky:
            for c in sticky:
                for lo, hi in c.key_ranges:
                    if lo <= h <= hi:
                        return c
            return None
        return cs[h * len(cs) // self.RANGE]

    def dispatch(self, entries, redeliveries) -> int:
        n = 0
        for pos, entry, info in entries:
            c = self._select(info.key)
            if c is None or not c.available:
                break
            c.deliver(pos, entry, info.num_messages, redeliveries.get(pos, 0))
            n += 1
        return n


DISPATCHERS: dict[int, type[Dispatcher]] = {
    EXCLUSIVE: SingleActiveDispatcher,
    FAILOVER: SingleActiveDispatcher,
    SHARED: SharedDispatcher,
    KEY_SHARED: KeySharedDispatcher,
}


# ----------------------------------------------------------------------------- subscriptions

class Subscription:
    """A cursor plus the consumers attached to it.

    State (per entry): `outstanding` maps every delivered-but-unacked position to the consumer
    holding it (None: waiting in `replay` for redelivery); `redeliveries` counts how often each was
    handed back; `read_position` is the next entry never read (None: the first entry of the topic).
    The mark-delete position is the one right before min(outstanding, read_position): everything
    that exists before it was read and acknowledged.
    """

    def __init__(self, topic: "Topic", name: str, cursor: Any, sub_type: int, durable: bool):
        self.topic = topic
        self.ml = topic.ml
        self.name = name
        self.cursor = cursor
        self.durable = durable
        self.sub_type = sub_type
        self.consumers: list[Consumer] = []
        self.mark_delete: Position | None = cursor.mark_delete_position
        self.read_position: Position | None = (
            self.ml.next_position(self.mark_delete) if self.mark_delete is not None else None)
        self.outstanding: dict[Position, Consumer | None] = {}
        self._heap: list[tuple[int, int]] = []          # outstanding positions (lazy deletion)
        self.replay: set[Position] = set()
        self._replay_heap: list[tuple[int, int]] = []
        self.redeliveries: dict[Position, int] = {}
        self.dispatcher: Dispatcher = DISPATCHERS[sub_type](self)
        self.epoch = 0                  # bumped whenever positions change under an in-flight read
        self.closed = False
        self._paused = 0
        self._wake = asyncio.Event()
        self._persist_task: asyncio.Task | None = None
        self._persist_again = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"dispatch {topic.name}/{name}")

    def __repr__(self) -> str:
        return f"Subscription({self.topic.name}/{self.name}, {SUB_TYPE_NAMES.get(self.sub_type)})"

    # -- consumers ---------------------------------------------------------------
    async def add_consumer(self, cnx: Any, cmd: pb.CommandSubscribe) -> Consumer:
        sub_type = cmd.subType
        if self.consumers and sub_type != self.sub_type:
            raise ConsumerBusy(f"Subscription {self.name} is of type {SUB_TYPE_NAMES.get(self.sub_type)}, "
                               f"not {SUB_TYPE_NAMES.get(sub_type)}")
        if sub_type == EXCLUSIVE and self.consumers:
            await self._evict_dead(self.consumers[0], cnx)
            if self.consumers:
                raise ConsumerBusy("Exclusive consumer is already connected")
        if self.closed or self.topic.closed:
            raise not_served(self.topic.name, "closing")
        if sub_type != self.sub_type:
            self.sub_type = sub_type
            self.dispatcher = DISPATCHERS[sub_type](self)
        ranges = None
        if sub_type == KEY_SHARED and cmd.HasField("keySharedMeta") and \
                cmd.keySharedMeta.keySharedMode == pb.STICKY:
            ranges = [(r.start, r.end) for r in cmd.keySharedMeta.hashRanges]
        c = Consumer(self, cnx, cmd.consumer_id, cmd.consumer_name or f"consumer-{cmd.consumer_id}",
                     cmd.priority_level, sub_type, ranges)
        self.consumers.append(c)
        self.dispatcher.consumers_changed()
        self.wake()
        return c

    async def _evict_dead(self, holder: Consumer, cnx: Any) -> None:
        """Before refusing with ConsumerBusy, make sure the holder's connection is alive (a client that
        reconnected after a network fault finds its old, half-open connection still registered)."""
        old = holder.cnx
        if old is cnx:
            return
        alive = await old.check_liveness(LIVENESS_CHECK_TIMEOUT)
        if not alive:
            log.info("%s: connection %s of %s is dead; closing it", self, old, holder)
            old.close("did not answer the liveness check")

    def remove_consumer(self, c: Consumer, *, redeliver: bool = True, keep: bool = False) -> None:
        if c.closed:
            return
        c.closed = True
        try:
            self.consumers.remove(c)
        except ValueError:
            pass
        if redeliver:
            self._to_replay(c, list(c.pending))
        c.pending.clear()
        self.dispatcher.consumers_changed()
        if not self.consumers and not self.durable and not self.closed:
            if keep:
                # a reader seeking: it comes back to this position; drop the subscription if not
                asyncio.get_running_loop().call_later(NON_DURABLE_GRACE, self._drop_if_abandoned)
            else:
                self._drop()
        self.wake()

    def _drop(self) -> None:
        self.topic._drop_subscription(self)
        self._stop()

    def _drop_if_abandoned(self) -> None:
        if not self.consumers and not self.closed:
            self._drop()

    def rewind_consumer(self, c: Consumer) -> None:
        """Hand everything `c` holds back for redelivery (Failover switch, redeliver-all)."""
        self._to_replay(c, list(c.pending))

    def _to_replay(self, c: Consumer, positions: Iterable[Position]) -> None:
        moved = False
        for pos in positions:
            if c.pending.pop(pos, None) is None:
                continue
            if self.outstanding.get(pos) is c:
                self.outstanding[pos] = None
                self.replay.add(pos)
                heapq.heappush(self._replay_heap, (pos.ledger_id, pos.entry_id))
                self.redeliveries[pos] = self.redeliveries.get(pos, 0) + 1
                c.redelivered += 1
                moved = True
        if moved:
            self.wake()

    def redeliver(self, c: Consumer, ids: list[Position] | None) -> None:
        if not ids or self.sub_type in (EXCLUSIVE, FAILOVER):
            self.rewind_consumer(c)
        else:
            self._to_replay(c, ids)

    def flow(self, c: Consumer, permits: int) -> None:
        c.permits += permits
        if c.permits > 0:
            self.wake()

    # -- acknowledgements --------------------------------------------------------
    def ack_individual(self, positions: Iterable[Position]) -> None:
        md = self.mark_delete
        outstanding = self.outstanding
        for pos in positions:
            if md is not None and pos <= md:
                continue
            holder = outstanding.pop(pos, _MISSING)
            if holder is _MISSING:
                continue
            if holder is None:
                self.replay.discard(pos)
            else:
                holder.pending.pop(pos, None)
            self.redeliveries.pop(pos, None)
        self._update_mark_delete()

    def ack_cumulative(self, pos: Position) -> None:
        md = self.mark_delete
        if md is not None and pos <= md:
            return
        lc = self.ml.last_confirmed
        if lc is None:
            return
        if pos > lc:
            pos = lc
        heap = self._heap
        key = (pos.ledger_id, pos.entry_id)
        while heap and heap[0] <= key:
            p = Position(*heapq.heappop(heap))
            holder = self.outstanding.pop(p, _MISSING)
            if holder is None:
                self.replay.discard(p)
            elif holder is not _MISSING:
                holder.pending.pop(p, None)
            self.redeliveries.pop(p, None)
        rp = self.read_position
        if rp is None or rp <= pos:
            # acked past what we read (a client that knows more than we do, e.g. after a seek)
            self.read_position = self.ml.next_position(pos)
            self.epoch += 1
        self._set_mark_delete(pos)
        self._update_mark_delete()

    def _update_mark_delete(self) -> None:
        heap = self._heap
        outstanding = self.outstanding
        while heap:
            top = heap[0]
            if Position(top[0], top[1]) in outstanding:
                break
            heapq.heappop(heap)
        rp = self.read_position
        if heap:
            lo = heap[0]
            if rp is not None and (rp.ledger_id, rp.entry_id) < lo:
                lo = (rp.ledger_id, rp.entry_id)
        elif rp is not None:
            lo = (rp.ledger_id, rp.entry_id)
        else:
            return
        self._set_mark_delete(Position(lo[0], lo[1] - 1))

    def _set_mark_delete(self, pos: Position) -> None:
        if self.mark_delete is not None and pos <= self.mark_delete:
            return
        self.mark_delete = pos
        self._persist()

    def _persist(self) -> None:
        if self._persist_task is not None and not self._persist_task.done():
            self._persist_again = True
            return
        self._persist_task = asyncio.get_running_loop().create_task(self._persist_loop())

    async def _persist_loop(self) -> None:
        while True:
            self._persist_again = False
            md = self.mark_delete
            if md is not None:
                try:
                    await self.cursor.mark_delete(md)
                except ManagedLedgerFenced as e:
                    self.topic._on_fenced(e)
                    return
                except Exception as e:  # noqa: BLE001 - the position stays in memory; retried on next ack
                    log.warning("%s: persisting mark-delete %s: %s", self, md, e)
            if not self._persist_again:
                return

    # -- seek --------------------------------------------------------------------
    async def reset(self, target: Position | None) -> None:
        """Disconnect the consumers, then make `target` (None: the first entry) the next read."""
        self._paused += 1
        self.epoch += 1
        try:
            for c in list(self.consumers):
                c.cnx.broker_close_consumer(c)
                self.remove_consumer(c, redeliver=False, keep=True)
            self.outstanding.clear()
            self._heap.clear()
            self.replay.clear()
            self._replay_heap.clear()
            self.redeliveries.clear()
            await self.cursor.reset(target)
            self.mark_delete = self.cursor.mark_delete_position
            self.read_position = target
        finally:
            self._paused -= 1
            self.epoch += 1
            self.wake()

    # -- lifecycle ---------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def _stop(self) -> None:
        self.closed = True
        self._task.cancel()
        self._wake.set()

    async def close(self, *, notify: bool = True, assigned_broker_url: str | None = None) -> None:
        """Stop dispatching, disconnect consumers (CLOSE_CONSUMER when `notify`), flush the position."""
        self._stop()
        for c in list(self.consumers):
            c.cnx.broker_close_consumer(c, assigned_broker_url, notify=notify)
            self.remove_consumer(c, redeliver=False)
        if self._persist_task is not None and not self._persist_task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._persist_task), CLOSE_DRAIN_TIMEOUT)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass

    # -- the dispatch loop -------------------------------------------------------
    async def _run(self) -> None:
        backoff = 0.05
        while not self.closed:
            # clear first: a wake-up that arrives while this round awaits a read is not lost
            self._wake.clear()
            try:
                did = await self._dispatch_once()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except ManagedLedgerError as e:
                log.warning("%s: read failed: %s", self, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except Exception:  # noqa: BLE001 - never let a subscription stop silently
                log.exception("%s: dispatch error", self)
                await asyncio.sleep(1.0)
                continue
            if did:
                await asyncio.sleep(0)      # let the connections breathe between rounds
            else:
                await self._wake.wait()     # new entries, permits, consumers, writability, seek

    async def _dispatch_once(self) -> bool:
        """One round; False when there was nothing to do (the loop then waits for a wake-up)."""
        if self._paused or not self.consumers:
            return False
        permits = self.dispatcher.permits()
        if permits <= 0:
            return False
        avg = self.topic.avg_messages_per_entry
        max_entries = max(1, min(MAX_READ_ENTRIES, int(permits / avg) if avg > 1 else permits))
        epoch = self.epoch
        if self.replay:
            entries = await self._read_replay(max_entries)
            if epoch != self.epoch or self.closed:
                return True
            entries = [e for e in entries if e[0] in self.replay]
            if not entries:
                return True
            n = self.dispatcher.dispatch(entries, self.redeliveries)
            for pos, _, _ in entries[:n]:
                self.replay.discard(pos)
            return n > 0
        start = self.read_position if self.read_position is not None else self.ml.first_position()
        lc = self.ml.last_confirmed
        if start is None or lc is None or start > lc:
            return False
        entries = self.topic.cached_run(start, max_entries)
        if not entries:
            raw = await self.ml.read_entries(start, max_entries)
            if epoch != self.epoch or self.closed:
                return True
            if not raw:
                return False
            entries = [(p, e, self.topic.entry_info(p, e)) for p, e in raw]
        md = self.mark_delete
        if md is not None and entries[0][0] <= md:
            entries = [e for e in entries if e[0] > md]
            if not entries:
                self.read_position = self.ml.next_position(md)
                return True
        n = self.dispatcher.dispatch(entries, self.redeliveries)
        if n == 0:
            return False
        heap = self._heap
        for pos, _, _ in entries[:n]:
            heapq.heappush(heap, (pos.ledger_id, pos.entry_id))
        last = entries[n - 1][0]
        self.read_position = self.topic.successor(last)
        return True

    async def _read_replay(self, max_entries: int) -> list[tuple[Position, bytes, EntryInfo]]:
        positions: list[Position] = []
        heap = self._replay_heap
        seen = set()
        while heap and len(positions) < max_entries:
            l, e = heapq.heappop(heap)
            p = Position(l, e)
            if p in self.replay and p not in seen:
                positions.append(p)
                seen.add(p)
        # popped positions not dispatched this round are pushed back by the caller's next round
        for p in positions:
            heapq.heappush(heap, (p.ledger_id, p.entry_id))
        out: dict[Position, tuple[Position, bytes, EntryInfo]] = {}
        missing: list[Position] = []
        for p in positions:
            hit = self.topic.cached(p)
            if hit is not None:
                out[p] = (p, hit.entry, hit.info)
            else:
                missing.append(p)
        i = 0
        while i < len(missing):
            p0 = missing[i]
            j = i
            while (j + 1 < len(missing) and missing[j + 1].ledger_id == p0.ledger_id
                   and missing[j + 1].entry_id - p0.entry_id < 4 * MAX_READ_ENTRIES):
                j += 1
            span = missing[j].entry_id - p0.entry_id + 1
            wanted = set(missing[i:j + 1])
            for pos, data in await self.ml.read_entries(p0, span):
                if pos in wanted:
                    out[pos] = (pos, data, self.topic.entry_info(pos, data))
            for p in wanted:
                if p not in out:     # gone from storage: nothing left to redeliver
                    log.warning("%s: entry %s to redeliver no longer exists", self, p)
                    self.replay.discard(p)
                    self.outstanding.pop(p, None)
            i = j + 1
        return [out[p] for p in positions if p in out]

    # -- introspection -----------------------------------------------------------
    def unacked(self) -> int:
        return sum(len(c.pending) for c in self.consumers)


_MISSING = object()


# ----------------------------------------------------------------------------- the topic

class Topic:
    """One topic served by this broker, over its ManagedLedger."""

    _names = itertools.count()

    def __init__(self, name: str, ml: Any, service: Any):
        self.name = name
        self.ml = ml
        self.service = service
        self.producers: dict[str, Producer] = {}        # by producer name
        self.subscriptions: dict[str, Subscription] = {}
        self._adds: collections.deque[_PendingAdd] = collections.deque()
        self._adds_drained: asyncio.Event | None = None
        self._cache: collections.OrderedDict[Position, _CachedEntry] = collections.OrderedDict()
        self._cache_bytes = 0
        self._last_added: Position | None = None
        self._sub_lock = asyncio.Lock()
        self._closing = False
        self._closed = False
        self._close_task: asyncio.Task | None = None
        self.avg_messages_per_entry = 1.0
        self.msgs_in = 0
        self.bytes_in = 0
        self._loop = asyncio.get_running_loop()

    def __repr__(self) -> str:
        return f"Topic({self.name})"

    @property
    def closed(self) -> bool:
        """True once closing started: the topic takes no new producers, consumers or messages."""
        return self._closing

    # -- producers ---------------------------------------------------------------
    async def add_producer(self, cnx: Any, producer_id: int, name: str, *, epoch: int = 0,
                           access_mode: int = ACCESS_SHARED, user_provided_name: bool = True) -> Producer:
        """Register a producer. A name already connected elsewhere is ProducerBusy, unless this is the
        same client reconnecting (a higher epoch) or the other connection fails a liveness check."""
        old = self.producers.get(name)
        if (old is not None and old.cnx is not cnx and old.cnx.active and epoch <= old.epoch
                and not await old.cnx.check_liveness(LIVENESS_CHECK_TIMEOUT)):
            log.info("%s: connection %s of producer %s is dead; closing it", self, old.cnx, name)
            old.cnx.close("did not answer the liveness check")
        if self._closing:
            raise not_served(self.name, "closing")
        old = self.producers.get(name)
        if old is not None:
            if old.cnx is cnx and old.producer_id == producer_id:
                return old
            if epoch > old.epoch or not old.cnx.active:
                # the same client producer, reconnected: its previous registration is stale
                log.info("%s: producer %s (epoch %d) replaces epoch %d", self, name, epoch, old.epoch)
                self.remove_producer(old)
                old.cnx.forget_producer(old)
            else:
                raise ProducerBusy(f"Producer with name '{name}' is already connected to topic {self.name}")
        if access_mode != ACCESS_SHARED:
            if any(p.name != name for p in self.producers.values()):
                raise ProducerBusy(f"Topic {self.name} has other producers; exclusive access refused")
        elif any(p.access_mode != ACCESS_SHARED for p in self.producers.values()):
            raise ProducerBusy(f"Topic {self.name} has an exclusive producer")
        p = Producer(self, cnx, producer_id, name, epoch, access_mode, user_provided_name)
        self.producers[name] = p
        return p

    def remove_producer(self, p: Producer) -> None:
        p.closed = True
        if self.producers.get(p.name) is p:
            del self.producers[p.name]

    # -- publishing: the hot path -----------------------------------------------
    def publish(self, producer: Producer, sequence_id: int, highest_sequence_id: int, entry: bytes,
                metadata: pb.MessageMetadata) -> None:
        """Append an entry; the receipt (or SendError) goes out in call order once it is persisted."""
        if self._closing or producer.closed:
            return      # CLOSE_PRODUCER is on its way; the client resends after reconnecting
        info = EntryInfo.from_metadata(metadata)
        op = _PendingAdd(producer, sequence_id, highest_sequence_id, entry, info)
        self._adds.append(op)
        producer.msgs_in += info.num_messages
        producer.bytes_in += len(entry)
        producer.cnx.add_pending_send(1)
        task = self._loop.create_task(self.ml.add_entry(entry))
        task.add_done_callback(functools.partial(self._add_done, op))

    def _add_done(self, op: _PendingAdd, task: asyncio.Task) -> None:
        if task.cancelled():
            op.error = ManagedLedgerError("add cancelled")
        else:
            exc = task.exception()
            if exc is None:
                op.pos = task.result()
            else:
                op.error = exc
        op.done = True
        adds = self._adds
        if adds[0] is not op:
            return            # an earlier add is still in flight; it completes this one too
        notify = False
        fenced = None
        while adds and adds[0].done:
            op = adds.popleft()
            p = op.producer
            p.cnx.add_pending_send(-1)
            pos = op.pos
            if pos is not None:
                self._cache_put(pos, op.entry, op.info)
                self.msgs_in += op.info.num_messages
                self.bytes_in += len(op.entry)
                self.avg_messages_per_entry = 0.9 * self.avg_messages_per_entry + 0.1 * op.info.num_messages
                notify = True
                if not p.closed:
                    p.cnx.send_receipt(p.producer_id, op.sequence_id, pos.ledger_id, pos.entry_id,
                                       op.highest_sequence_id)
            elif isinstance(op.error, ManagedLedgerFenced):
                fenced = op.error
            else:
                if not p.closed:
                    log.warning("%s: persisting seq %d of %s failed: %s", self, op.sequence_id, p.name,
                                op.error)
                    p.cnx.send_send_error(p.producer_id, op.sequence_id, pb.PersistenceError,
                                          f"Failed to persist message: {op.error}")
        if notify:
            for sub in self.subscriptions.values():
                sub._wake.set()
        if not adds and self._adds_drained is not None:
            self._adds_drained.set()
        if fenced is not None:
            self._on_fenced(fenced)

    def _on_fenced(self, exc: BaseException) -> None:
        if self._closing:
            return
        log.warning("%s: managed ledger fenced (%s); closing the topic", self, exc)
        hook = getattr(self.service, "topic_fenced", None)
        if hook is not None:
            try:
                hook(self.name)
            except Exception:  # noqa: BLE001
                log.exception("%s: service.topic_fenced", self)
        self._loop.create_task(self.close("fenced by another broker"))

    # -- the tail cache ----------------------------------------------------------
    def _cache_put(self, pos: Position, entry: bytes, info: EntryInfo) -> None:
        cache = self._cache
        prev = self._last_added
        if prev is not None:
            hit = cache.get(prev)
            if hit is not None:
                hit.next = pos
        self._last_added = pos
        cache[pos] = _CachedEntry(entry, info)
        self._cache_bytes += len(entry)
        while len(cache) > TAIL_CACHE_ENTRIES or self._cache_bytes > TAIL_CACHE_BYTES:
            _, old = cache.popitem(last=False)
            self._cache_bytes -= len(old.entry)

    def cached(self, pos: Position) -> _CachedEntry | None:
        return self._cache.get(pos)

    def cached_run(self, start: Position, max_entries: int) -> list[tuple[Position, bytes, EntryInfo]]:
        """Consecutive cached entries from `start` ([] when `start` is not cached)."""
        cache = self._cache
        out = []
        pos = start
        while pos is not None and len(out) < max_entries:
            hit = cache.get(pos)
            if hit is None:
                break
            out.append((pos, hit.entry, hit.info))
            pos = hit.next
        return out

    def successor(self, pos: Position) -> Position:
        hit = self._cache.get(pos)
        if hit is not None and hit.next is not None:
            return hit.next
        return self.ml.next_position(pos)

    def entry_info(self, pos: Position, entry: bytes) -> EntryInfo:
        hit = self._cache.get(pos)
        if hit is not None:
            return hit.info
        return EntryInfo.from_entry(entry)

    # -- subscriptions -----------------------------------------------------------
    async def subscribe(self, cnx: Any, cmd: pb.CommandSubscribe) -> Consumer:
        if self._closing:
            raise not_served(self.name, "closing")
        name = cmd.subscription
        async with self._sub_lock:
            sub = self.subscriptions.get(name)
            if sub is None or sub.closed:
                if cmd.durable:
                    initial = "earliest" if cmd.initialPosition == pb.CommandSubscribe.Earliest else "latest"
                    cursor = await self.ml.open_cursor(name, initial)
                else:
                    cursor = NonDurableCursor(name, self._reader_start(cmd))
                if self._closing:
                    raise not_served(self.name, "closing")
                sub = Subscription(self, name, cursor, cmd.subType, cmd.durable)
                self.subscriptions[name] = sub
        return await sub.add_consumer(cnx, cmd)

    def _reader_start(self, cmd: pb.CommandSubscribe) -> Position | None:
        """Mark-delete position of a new non-durable subscription.

        A start id (l, e) is delivered inclusively: the client drops ids <= start itself (or < start
        for start_message_id_inclusive), so starting at the entry serves both, and batch ids."""
        lc = self.ml.last_confirmed
        if cmd.HasField("start_message_id"):
            l = frames.to_signed64(cmd.start_message_id.ledgerId)
            e = frames.to_signed64(cmd.start_message_id.entryId)
            if l < 0 or e < 0:
                return None                                   # earliest
            if l == INT64_MAX or (lc is not None and Position(l, e) > lc):
                return lc                                     # latest / past the end
            return Position(l, e - 1)
        if cmd.initialPosition == pb.CommandSubscribe.Earliest:
            return None
        return lc

    def _drop_subscription(self, sub: Subscription) -> None:
        if self.subscriptions.get(sub.name) is sub:
            del self.subscriptions[sub.name]

    async def unsubscribe(self, consumer: Consumer, *, force: bool = False) -> None:
        sub = consumer.sub
        others = [c for c in sub.consumers if c is not consumer]
        if others and not force:
            raise ConsumerBusy(f"Subscription {sub.name} has other connected consumers")
        self._drop_subscription(sub)
        for c in others:
            c.cnx.broker_close_consumer(c)
        await sub.close(notify=False)
        if sub.durable:
            await self.ml.delete_cursor(sub.name)

    # -- queries -----------------------------------------------------------------
    async def last_message_id(self) -> tuple[int, int, int]:
        """(ledger, entry, batch_index) of the last entry; (-1, -1, -1) when the topic is empty."""
        lc = self.ml.last_confirmed
        if lc is None:
            return -1, -1, -1
        hit = self._cache.get(lc)
        if hit is not None:
            info = hit.info
        else:
            got = await self.ml.read_entries(lc, 1)
            info = EntryInfo.from_entry(got[0][1]) if got and got[0][0] == lc else None
        batch_index = info.num_messages - 1 if info is not None and info.is_batch else -1
        return lc.ledger_id, lc.entry_id, batch_index

    async def find_position_by_publish_time(self, publish_time_ms: int) -> Position | None:
        """The first entry published at or after the time; past the end when none is."""
        finder = getattr(self.ml, "find_position_by_publish_time", None)
        if finder is not None:
            return await finder(publish_time_ms)
        pos = self.ml.first_position()
        lc = self.ml.last_confirmed
        while pos is not None and lc is not None and pos <= lc:
            batch = await self.ml.read_entries(pos, 500)
            if not batch:
                break
            for p, data in batch:
                if self.entry_info(p, data).publish_time >= publish_time_ms:
                    return p
            pos = self.ml.next_position(batch[-1][0])
        lc = self.ml.last_confirmed
        return self.ml.next_position(lc) if lc is not None else None

    def seek_target(self, ledger_id: int, entry_id: int) -> Position | None:
        """Where a SEEK to (ledger, entry) starts reading: None is the first entry."""
        if ledger_id < 0 or entry_id < 0:
            return None
        lc = self.ml.last_confirmed
        target = Position(ledger_id, entry_id)
        if lc is None:
            return None
        if target > lc:
            return self.ml.next_position(lc)
        return target

    # -- closing -----------------------------------------------------------------
    async def close(self, reason: str = "unloading", *, close_ledger: bool = True,
                    assigned_broker_url: str | None = None) -> None:
        """Stop serving: let in-flight adds finish (their receipts go out), then send CLOSE_PRODUCER /
        CLOSE_CONSUMER to every attached client (they redo the lookup and reconnect), flush the
        cursors and close the managed ledger. New producers/consumers get ServiceNotReady."""
        self._closing = True
        if self._close_task is None:
            self._close_task = self._loop.create_task(
                self._close(reason, close_ledger, assigned_broker_url))
        await asyncio.shield(self._close_task)

    async def _close(self, reason: str, close_ledger: bool, url: str | None) -> None:
        self._closing = True
        log.info("%s: closing (%s)", self, reason)
        if self._adds:
            self._adds_drained = asyncio.Event()
            try:
                await asyncio.wait_for(self._adds_drained.wait(), CLOSE_DRAIN_TIMEOUT)
            except asyncio.TimeoutError:
                log.warning("%s: %d adds still in flight at close", self, len(self._adds))
        for p in list(self.producers.values()):
            self.remove_producer(p)
            p.cnx.broker_close_producer(p, url)
        for sub in list(self.subscriptions.values()):
            await sub.close(notify=True, assigned_broker_url=url)
        self.subscriptions.clear()
        if close_ledger:
            try:
                await self.ml.close()
            except Exception as e:  # noqa: BLE001
                log.warning("%s: closing the managed ledger: %s", self, e)
        self._cache.clear()
        self._closed = True
        log.info("%s: closed", self)
