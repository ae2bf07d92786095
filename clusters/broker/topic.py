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
import operator
import time
from typing import Any, Iterable

from clusters.broker.compaction import Compactor
from clusters.broker.dedup import DUP as DEDUP_DUP, ENABLED as DEDUP_ENABLED, NOT_DUP as DEDUP_NOT_DUP
from clusters.broker.managed_ledger import EntryCache, ManagedLedgerError, ManagedLedgerFenced, Position
from clusters.broker.murmur3 import sticky_key_hash
from clusters.bugs import Knobs
from clusters.broker.selectors import (AutoSplitSelector, ConsistentHashSelector, ConsumerAssignError, StickySelector,
                                       partition_index, pick_active)
from clusters.protocol import frames
from clusters.protocol import PulsarApi_pb2 as pb

log = logging.getLogger(__name__)

INT64_MAX = (1 << 63) - 1
SUB_TYPE_NAMES = {0: "Exclusive", 1: "Shared", 2: "Failover", 3: "Key_Shared"}
EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = 0, 1, 2, 3
ACCESS_SHARED, ACCESS_EXCLUSIVE, ACCESS_WAIT_FOR_EXCLUSIVE, ACCESS_EXCLUSIVE_WITH_FENCING = 0, 1, 2, 3
ACCESS_MODE_NAMES = {0: "Shared", 1: "Exclusive", 2: "WaitForExclusive", 3: "ExclusiveWithFencing"}

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


class ConsumerAssignFailed(BrokerServiceError):
    """No Key_Shared hash range for the consumer (Pulsar's ConsumerAssignException)."""
    code = pb.ConsumerAssignError


class ProducerFenced(BrokerServiceError):
    code = pb.ProducerFenced


class MessageDupUnknown(BrokerServiceError):
    """Deduplication cannot tell yet whether this message is a duplicate (its original is in flight)."""
    code = pb.PersistenceError

    def __init__(self) -> None:
        super().__init__("Cannot determine whether the message is a duplicate at this time")


class TopicFencedForPublish(BrokerServiceError):
    """A write failed; publishing resumes once the adds in flight have completed (Pulsar's fenced topic)."""
    code = pb.PersistenceError

    def __init__(self) -> None:
        super().__init__("Topic is temporarily unavailable: a write failed, retry")


def not_served(topic: str, why: str = "") -> ServiceUnitNotReady:
    extra = f" ({why})" if why else ""
    return ServiceUnitNotReady(f"Topic {topic} not served by this instance{extra}. Please redo the lookup")


# ----------------------------------------------------------------------------- entries

class EntryInfo:
    """What dispatch needs to know about an entry, parsed once from its metadata."""
    __slots__ = ("num_messages", "key", "publish_time", "is_batch", "_key_hash", "deliver_at")

    def __init__(self, num_messages: int, key: bytes | None, publish_time: int, is_batch: bool,
                 deliver_at: int = 0):
        self.num_messages = num_messages
        self.key = key
        self.publish_time = publish_time
        self.is_batch = is_batch
        self._key_hash: int | None = None
        self.deliver_at = deliver_at        # MessageMetadata.deliver_at_time (ms), 0: none

    @property
    def key_hash(self) -> int:
        """Key_Shared's sticky key hash (Murmur3 of the key, else of NONE_KEY), computed on first use:
        the info is shared through the tail cache by every subscription and every round."""
        h = self._key_hash
        if h is None:
            h = self._key_hash = sticky_key_hash(self.key if self.key is not None else NONE_KEY)
        return h

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
        return cls(max(n, 1), key, md.publish_time, batch,
                   md.deliver_at_time if md.HasField("deliver_at_time") else 0)

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
                 "closed", "msgs_in", "bytes_in", "created", "topic_epoch", "connected_since",
                 "duplicates", "schema_version")

    def __init__(self, topic: "Topic", cnx: Any, producer_id: int, name: str, epoch: int,
                 access_mode: int, user_provided_name: bool, topic_epoch: int | None = None):
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
        self.duplicates = 0             # sends answered as duplicates (deduplication on)
        self.created = time.time()
        self.connected_since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.topic_epoch = topic_epoch  # set for exclusive producers (CommandProducerSuccess.topic_epoch)
        self.schema_version: int | None = None     # its schema's version (None: no schema)

    @property
    def access_mode_name(self) -> str:
        return ACCESS_MODE_NAMES.get(self.access_mode, str(self.access_mode))

    def __repr__(self) -> str:
        return f"Producer({self.name!r}, id={self.producer_id}, topic={self.topic.name})"


class _PendingAdd:
    """A SEND on its way to a receipt, in SEND order. `dup`: answered as a duplicate (-1, -1) without
    being written; `error` set without a write: refused (dedup Unknown, topic fenced for publishing)."""
    __slots__ = ("producer", "sequence_id", "highest_sequence_id", "entry", "info", "pos", "error", "done",
                 "dup", "written")

    def __init__(self, producer: Producer, sequence_id: int, highest: int, entry: bytes, info: EntryInfo):
        self.producer = producer
        self.sequence_id = sequence_id
        self.highest_sequence_id = highest
        self.entry = entry
        self.info = info
        self.pos: Position | None = None
        self.error: BaseException | None = None
        self.done = False
        self.dup = False
        self.written = True


# ----------------------------------------------------------------------------- consumers

class Consumer:
    __slots__ = ("sub", "cnx", "consumer_id", "name", "priority", "permits", "pending", "join_seq",
                 "closed", "key_ranges", "msgs_out", "bytes_out", "redelivered", "connected_since",
                 "sub_type", "key_hashes", "partition", "read_compacted")

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
        # Key_Shared: how many of `pending` have each key hash (the hashes this consumer still drains)
        self.key_hashes: collections.Counter[int] | None = None
        # the topic's partition index, -1 when not a `-partition-N` topic (Pulsar's Consumer.partitionIdx):
        # every MESSAGE's MessageIdData carries it, so the client's message ids name their partition
        self.partition = partition_index(sub.topic.name)
        self.read_compacted = False

    @property
    def available(self) -> bool:
        return self.permits > 0 and self.cnx.writable and not self.closed

    def deliver(self, pos: Position, entry: bytes, n: int, redelivery_count: int,
                ack_set: list[int] | None = None) -> None:
        """Send one entry. `n` is the messages it counts for (a batch's unacknowledged ones);
        `ack_set` the batch's remaining-unacknowledged bitset (Pulsar's CommandMessage.ack_set)."""
        self.pending[pos] = n
        self.sub.outstanding[pos] = self
        self.permits -= n
        self.msgs_out += n
        self.bytes_out += len(entry)
        self.cnx.send_message(self.consumer_id, pos.ledger_id, pos.entry_id, redelivery_count, entry,
                              ack_set=ack_set, partition=self.partition)

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

MAX_ROUND_ROBIN_BATCH = 20            # Pulsar's dispatcherMaxRoundRobinBatchSize
KEY_SHARED_LOOKAHEAD_PER_CONSUMER = 2000       # keySharedLookAheadMsgInReplayThresholdPerConsumer
KEY_SHARED_LOOKAHEAD_PER_SUBSCRIPTION = 20000  # keySharedLookAheadMsgInReplayThresholdPerSubscription
_U64 = (1 << 64) - 1
_POSITION_KEY = operator.attrgetter("ledger_id", "entry_id")    # sort key: position order, fast


def unacked_in_batch(ack_set: list[int], n: int) -> int:
    """Messages of an n-message batch still unacknowledged: the set bits among the first n of a
    bitset of 64-bit words, lowest bit first (java.util.BitSet.toLongArray, as ack_set carries it)."""
    total = 0
    for i, w in enumerate(ack_set):
        lo = i * 64
        if lo >= n:
            break
        w &= _U64
        if lo + 64 > n:
            w &= (1 << (n - lo)) - 1
        total += bin(w).count("1")
    return total


def _dec(counter: collections.Counter, key: int) -> None:
    left = counter.get(key, 0) - 1
    if left > 0:
        counter[key] = left
    else:
        counter.pop(key, None)


class Dispatcher:
    """Decides which consumer gets which entry. Subclasses implement one subscription type.

    `dispatch(entries, replay)` is offered entries in position order, read from the log
    (`replay=False`) or waiting for redelivery (`replay=True`). It delivers what it can (`send`)
    and returns how many entries, from the front, it dealt with: a log read resumes after them.
    Key_Shared also deals with an entry by deferring it (Subscription.defer: it waits in the replay
    set). The hooks (`replayed`, `unreplayed`, `unpend`, `forget`, `cleared`) let a dispatcher follow
    the subscription's per-entry state; only Key_Shared needs them."""

    single_active = False     # Exclusive/Failover: Pulsar's PersistentDispatcherSingleActiveConsumer
    individual_ack = False    # Shared/Key_Shared: cumulative acks ignored, redeliveries counted
    looks_ahead = False       # may read the log while entries wait for redelivery (Key_Shared)
    active: Consumer | None = None   # the consumer everything goes to (single-active dispatchers)

    def __init__(self, sub: "Subscription"):
        self.sub = sub

    def add(self, c: Consumer, cmd: pb.CommandSubscribe) -> None:
        """Validate a joining consumer (before it is in `sub.consumers`); raise to refuse it."""

    def consumers_changed(self, added: Consumer | None = None) -> None:
        """After a consumer joined (`added`) or left."""

    def removed(self, c: Consumer) -> None:
        """`c` left `sub.consumers`; what it held already went back for redelivery."""
        self.consumers_changed()

    def permits(self) -> int:
        """Messages the subscription may send now (0: nothing to do until FLOW / writability)."""
        return sum(c.permits for c in self.sub.consumers if c.available)

    def lookahead_limit(self) -> int:
        return 0

    def lookahead_ok(self) -> bool:
        return False

    def replay_ok(self, pos: Position, memo: dict[int, bool] | None = None) -> bool:
        """May the entry at `pos`, waiting for redelivery, go out now? `memo` carries answers
        between calls of one round (nothing changes in between)."""
        return True

    def send(self, c: Consumer, pos: Position, entry: bytes, info: EntryInfo) -> None:
        sub = self.sub
        n = info.num_messages
        ack_set = sub.batch_acks.get(pos) if sub.batch_acks else None
        if ack_set is not None:
            n = unacked_in_batch(ack_set, n)
        rc = sub.redeliveries.get(pos, 0) if self.individual_ack else 0
        c.deliver(pos, entry, n, rc, ack_set)

    def dispatch(self, entries: list[tuple[Position, bytes, EntryInfo]], replay: bool) -> int:
        raise NotImplementedError

    # per-entry state hooks
    def replayed(self, pos: Position) -> None:
        pass

    def unreplayed(self, pos: Position) -> None:
        pass

    def unpend(self, c: Consumer, pos: Position) -> None:
        pass

    def forget(self, pos: Position) -> None:
        pass

    def cleared(self) -> None:
        pass


class SingleActiveDispatcher(Dispatcher):
    """Exclusive and Failover: everything goes to one active consumer.

    Failover picks it as Pulsar does (`selectors.pick_active`: priority level, then name; partition
    index modulo, or a consistent-hash ring for a non-partitioned topic), so a joining consumer may
    take over. Whenever the active consumer changes, what the previous one had not acknowledged is
    redelivered to the new one (Pulsar rewinds the cursor) and every consumer gets
    ACTIVE_CONSUMER_CHANGE; a consumer that joins without changing it gets one about itself.
    Redelivery counts stay 0: Pulsar tracks them only for Shared and Key_Shared."""

    single_active = True

    def __init__(self, sub: "Subscription"):
        super().__init__(sub)
        self.active: Consumer | None = None

    def consumers_changed(self, added: Consumer | None = None) -> None:
        sub = self.sub
        cs = sub.consumers
        failover = sub.sub_type == FAILOVER
        if failover:
            new = pick_active(cs, sub.topic.name)
        else:
            new = cs[0] if cs else None
        if new is self.active:
            if failover and added is not None and new is not None:
                added.cnx.send_active_consumer_change(added.consumer_id, added is new)
            return
        old, self.active = self.active, new
        if old is not None and not old.closed:
            sub.rewind_consumer(old)
        if failover and new is not None:
            for c in cs:
                c.cnx.send_active_consumer_change(c.consumer_id, c is new)
            cfg = getattr(sub.topic.service, "config", None)
            delay = float(getattr(cfg, "active_consumer_failover_delay_s", 1.0))
            if old is not None and delay > 0:
                # activeConsumerFailoverDelayTimeMillis: the previous active consumer may still be
                # acknowledging what it had; the new one is served after the delay
                loop = asyncio.get_running_loop()
                self._hold_until = loop.time() + delay
                loop.call_later(delay, sub.wake)

    _hold_until = 0.0

    def permits(self) -> int:
        a = self.active
        if self._hold_until and asyncio.get_running_loop().time() < self._hold_until:
            return 0
        return a.permits if a is not None and a.available else 0

    def dispatch(self, entries, replay) -> int:
        c = self.active
        if c is None:
            return 0
        n = 0
        for pos, entry, info in entries:
            if not c.available:
                break
            self.send(c, pos, entry, info)
            n += 1
        return n


class SharedDispatcher(Dispatcher):
    """Shared, as PersistentDispatcherMultipleConsumers: consumers in turn get up to 20 entries each
    (dispatcherMaxRoundRobinBatchSize), within their permits; a consumer of a better (lower) priority
    level with permits goes before those of worse levels."""

    individual_ack = True

    def __init__(self, sub: "Subscription"):
        super().__init__(sub)
        self._rr = 0

    def _next(self, cs: list[Consumer]) -> Consumer | None:
        avail = [i for i, c in enumerate(cs) if c.available]
        if not avail:
            return None
        best = min(cs[i].priority for i in avail)
        level = [i for i in avail if cs[i].priority == best]
        pick = next((i for i in level if i >= self._rr), level[0])
        self._rr = pick + 1
        return cs[pick]

    def dispatch(self, entries, replay) -> int:
        cs = sorted(self.sub.consumers, key=lambda c: c.priority)
        if not cs or not entries:
            return 0
        remaining = sum(info.num_messages for _, _, info in entries)
        avg = max(remaining // len(entries), 1)
        i = 0
        while i < len(entries):
            c = self._next(cs)
            if c is None:
                break
            take = max(min(remaining, c.permits, MAX_ROUND_ROBIN_BATCH) // avg, 1)
            for pos, entry, info in entries[i:i + take]:
                self.send(c, pos, entry, info)
                remaining -= info.num_messages
            i += take
        return min(i, len(entries))


class KeySharedDispatcher(Dispatcher):
    """Key_Shared: an entry goes to the consumer owning the hash of its sticky key (ordering key,
    else partition key, else "NONE_KEY"): Murmur3 modulo 65536 (murmur3.sticky_key_hash), looked up in
    AUTO_SPLIT mode (selectors.ConsistentHashSelector, Pulsar's default consistent-hashing selector;
    selectors.AutoSplitSelector, HashRangeAutoSplitStickyKeyConsumerSelector, when the broker's
    `key_shared_use_consistent_hashing` is off) or in the ranges STICKY consumers declared
    (selectors.StickySelector). The first consumer fixes the mode; another mode is refused.

    Order per key, as Pulsar 4's draining hashes (PIP-379): an entry is not given to its consumer
    while another consumer still holds unacknowledged entries of the same hash (a hash that moved when
    consumers came or went), nor, when read from the log, while an entry of that hash waits for
    redelivery. Such entries, and those whose consumer has no permits (or that no consumer covers),
    wait in the replay set while reading goes on for other keys, up to 2000 waiting entries per
    consumer and 20000 per subscription (keySharedLookAheadMsgInReplayThreshold*). A subscription
    whose consumers allow out-of-order delivery skips the two order rules."""

    individual_ack = True
    looks_ahead = True

    def __init__(self, sub: "Subscription"):
        super().__init__(sub)
        self.mode = pb.AUTO_SPLIT
        self.out_of_order = False
        self.selector: Any = self._auto_selector()
        self.hashes: dict[Position, int] = {}         # key hash of outstanding entries read so far
        self.replay_hashes: collections.Counter[int] = collections.Counter()   # of those waiting
        self.replay_known = 0       # entries waiting whose hash is known (others: restored, not read yet)

    def add(self, c: Consumer, cmd: pb.CommandSubscribe) -> None:
        ksm = cmd.keySharedMeta if cmd.HasField("keySharedMeta") else None
        mode = ksm.keySharedMode if ksm is not None else pb.AUTO_SPLIT
        ooo = bool(ksm.allowOutOfOrderDelivery) if ksm is not None else False
        if not self.sub.consumers:
            self.mode, self.out_of_order = mode, ooo
            self.selector = StickySelector() if mode == pb.STICKY else self._auto_selector()
        elif mode != self.mode:
            raise ConsumerBusy(
                "Subscription is of different type. Active subscription key_shared mode of "
                f"'{pb.KeySharedMode.Name(self.mode)}' is different than the connecting consumer's "
                f"key_shared mode '{pb.KeySharedMode.Name(mode)}'.")
        elif ooo != self.out_of_order:
            raise ConsumerBusy(
                "Subscription is of different type. Active subscription "
                + ("allows" if self.out_of_order else "does not allow")
                + " out of order delivery while the connecting consumer "
                + ("allows it." if ooo else "does not allow it."))
        try:
            if isinstance(self.selector, StickySelector):
                self.selector.add(c, c.key_ranges or [])
            else:
                self.selector.add(c)
        except ConsumerAssignError as e:
            raise ConsumerAssignFailed(str(e)) from None
        c.key_hashes = collections.Counter()

    def _auto_selector(self) -> Any:
        cfg = getattr(self.sub.topic.service, "config", None)
        if getattr(cfg, "key_shared_use_consistent_hashing", True):
            return ConsistentHashSelector(int(getattr(cfg, "key_shared_consistent_hashing_points", 100)))
        return AutoSplitSelector()

    def removed(self, c: Consumer) -> None:
        self.selector.remove(c)

    def lookahead_limit(self) -> int:
        return min(KEY_SHARED_LOOKAHEAD_PER_SUBSCRIPTION,
                   KEY_SHARED_LOOKAHEAD_PER_CONSUMER * max(1, len(self.sub.consumers)))

    def _draining(self, c: Consumer, h: int) -> bool:
        """Another consumer still holds unacknowledged entries of hash `h`."""
        if self.out_of_order:
            return False
        for d in self.sub.consumers:
            if d is not c and d.key_hashes and d.key_hashes.get(h):
                return True
        return False

    def lookahead_ok(self) -> bool:
        """Reading the log while entries wait is safe only once every waiting entry's hash is known."""
        return self.replay_known >= len(self.sub.replay)

    def replay_ok(self, pos: Position, memo: dict[int, bool] | None = None) -> bool:
        h = self.hashes.get(pos)
        if h is None:
            return True
        if memo is not None:
            ok = memo.get(h)
            if ok is not None:
                return ok
        c = self.selector.select(h)
        ok = c is not None and c.available and not self._draining(c, h)
        if memo is not None:
            memo[h] = ok
        return ok

    def dispatch(self, entries, replay) -> int:
        sub = self.sub
        limit = self.lookahead_limit()
        n = 0
        for pos, entry, info in entries:
            if replay:
                h = self.hashes.get(pos)
                if h is None:
                    h = self.hashes[pos] = info.key_hash
                    self.replay_hashes[h] += 1
                    self.replay_known += 1
            else:
                h = info.key_hash
            c = self.selector.select(h)
            ok = c is not None and c.available and not self._draining(c, h)
            if ok and not replay and not self.out_of_order and self.replay_hashes.get(h):
                ok = False      # an earlier entry of this key waits for redelivery
            if ok:
                self.hashes[pos] = h
                self.send(c, pos, entry, info)
                c.key_hashes[h] += 1
            elif not replay:
                if len(sub.replay) >= limit:
                    break
                self.hashes[pos] = h
                sub.defer(pos)
            n += 1
        return n

    def replayed(self, pos: Position) -> None:
        h = self.hashes.get(pos)
        if h is not None:
            self.replay_hashes[h] += 1
            self.replay_known += 1

    def unreplayed(self, pos: Position) -> None:
        h = self.hashes.get(pos)
        if h is not None:
            _dec(self.replay_hashes, h)
            self.replay_known -= 1

    def unpend(self, c: Consumer, pos: Position) -> None:
        h = self.hashes.get(pos)
        if h is not None and c.key_hashes is not None:
            _dec(c.key_hashes, h)

    def forget(self, pos: Position) -> None:
        self.hashes.pop(pos, None)

    def cleared(self) -> None:
        self.hashes.clear()
        self.replay_hashes.clear()
        self.replay_known = 0
        for c in self.sub.consumers:
            if c.key_hashes is not None:
                c.key_hashes.clear()


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
        self.batch_acks: dict[Position, list[int]] = {}   # partly acknowledged batches: their ack_set
        # delayed delivery (Shared/Key_Shared): entries read whose deliver_at_time is still ahead,
        # position -> that time (ms); they stay outstanding (None), so the cursor keeps them
        self.delayed: dict[Position, int] = {}
        self._delayed_heap: list[tuple[int, int, int]] = []
        self._delay_timer: asyncio.TimerHandle | None = None
        self._delay_timer_at = 0
        svc_cfg = getattr(topic.service, "config", None)
        self.knobs = topic.knobs                        # the broker's bug knobs (clusters/bugs.py)
        self._delayed_enabled = bool(getattr(svc_cfg, "delayed_delivery_enabled", True))
        self._delayed_in_memory = self.knobs.on("broker.delayed_index_in_memory")
        self.dispatcher: Dispatcher = DISPATCHERS[sub_type](self)
        self.epoch = 0                  # bumped whenever positions change under an in-flight read
        self.closed = False
        self._paused = 0
        self._wake = asyncio.Event()
        self._persist_task: asyncio.Task | None = None
        self._persist_again = False
        self._restore_from_cursor()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"dispatch {topic.name}/{name}")

    def __repr__(self) -> str:
        return f"Subscription({self.topic.name}/{self.name}, {SUB_TYPE_NAMES.get(self.sub_type)})"

    # -- consumers ---------------------------------------------------------------
    async def add_consumer(self, cnx: Any, cmd: pb.CommandSubscribe) -> Consumer:
        sub_type = cmd.subType
        if self.consumers and sub_type != self.sub_type:
            raise ConsumerBusy("Subscription is of different type. Active subscription type of "
                               f"'{SUB_TYPE_NAMES.get(self.sub_type)}' is different than the connecting "
                               f"consumer's type '{SUB_TYPE_NAMES.get(sub_type)}'.")
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
        c.read_compacted = bool(cmd.read_compacted)
        self.dispatcher.add(c, cmd)            # may refuse it (Key_Shared mode or ranges)
        self.consumers.append(c)
        self.dispatcher.consumers_changed(c)
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
        """Detach `c`; what it had not acknowledged goes to the others (`redeliver`), with its
        redelivery count unchanged, as Pulsar does on a consumer's close or disconnect."""
        if c.closed:
            return
        c.closed = True
        try:
            self.consumers.remove(c)
        except ValueError:
            pass
        if redeliver:
            self._to_replay(c, list(c.pending), bump=False)
        c.pending.clear()
        if c.key_hashes:
            c.key_hashes.clear()
        self.dispatcher.removed(c)
        if not self.consumers and self.dispatcher.individual_ack:
            self.redeliveries.clear()       # Pulsar's redelivery tracker forgets when the last one leaves
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
        """Hand everything `c` holds back for redelivery (Failover switch, Exclusive redeliver-all)."""
        self._to_replay(c, list(c.pending), bump=False)

    def _to_replay(self, c: Consumer, positions: Iterable[Position], *, bump: bool) -> None:
        """Positions `c` holds go back for redelivery; `bump` counts a redelivery (Shared/Key_Shared
        only: Pulsar's single-active dispatchers have no redelivery tracker)."""
        moved = False
        count = bump and self.dispatcher.individual_ack
        for pos in positions:
            if pos not in c.pending:
                continue
            self._unpend(c, pos)
            if self.outstanding.get(pos) is c:
                self.outstanding[pos] = None
                self._replay_add(pos)
                if count:
                    self.redeliveries[pos] = self.redeliveries.get(pos, 0) + 1
                c.redelivered += 1
                moved = True
        if moved:
            self.wake()

    def _unpend(self, holder: Consumer, pos: Position) -> None:
        if holder.pending.pop(pos, None) is not None:
            self.dispatcher.unpend(holder, pos)

    def _replay_add(self, pos: Position) -> None:
        self.replay.add(pos)
        heapq.heappush(self._replay_heap, (pos.ledger_id, pos.entry_id))
        self.dispatcher.replayed(pos)

    def _replay_discard(self, pos: Position) -> None:
        if pos in self.replay:
            self.replay.discard(pos)
            self.dispatcher.unreplayed(pos)

    def defer(self, pos: Position) -> None:
        """A just-read entry nobody may take now (Key_Shared): it waits in the replay set."""
        self.outstanding[pos] = None
        self._replay_add(pos)

    def redeliver(self, c: Consumer, ids: list[Position] | None) -> None:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES, as ServerCnx and the dispatchers handle it: Shared and
        Key_Shared hand back the listed positions `c` holds (all of them for an empty list) with the
        redelivery count raised; Exclusive/Failover rewind the active consumer (counts stay 0)."""
        d = self.dispatcher
        if d.single_active:
            if c is d.active:
                self._to_replay(c, list(c.pending), bump=False)
            return
        self._to_replay(c, ids if ids else list(c.pending), bump=True)

    def flow(self, c: Consumer, permits: int) -> None:
        c.permits += permits
        if c.permits > 0:
            self.wake()

    # -- acknowledgements --------------------------------------------------------
    def ack_individual(self, positions: Iterable[Position]) -> None:
        md = self.mark_delete
        outstanding = self.outstanding
        d = self.dispatcher
        batch_acks = self.batch_acks
        for pos in positions:
            if md is not None and pos <= md:
                continue
            holder = outstanding.pop(pos, _MISSING)
            if holder is _MISSING:
                continue
            if holder is None:
                self._replay_discard(pos)
                if self.delayed:
                    self.delayed.pop(pos, None)
            else:
                self._unpend(holder, pos)
            d.forget(pos)
            self.redeliveries.pop(pos, None)
            if batch_acks:
                batch_acks.pop(pos, None)
        self._update_mark_delete()
        if self.replay and d.looks_ahead:
            self.wake()                 # a draining key may be free now

    def ack_batch_index(self, pos: Position, ack_set: list[int]) -> None:
        """A partial acknowledgement of a batch entry (Pulsar's batch-index acknowledgement):
        `ack_set` has a bit set for every message of the batch still unacknowledged. The bits add up
        (AND) with earlier ones; the entry is acknowledged once none is left. Ignored unless the
        broker enables it (acknowledgmentAtBatchIndexLevelEnabled), as in Pulsar."""
        if not self.batch_index_acks:
            return
        md = self.mark_delete
        if (md is not None and pos <= md) or pos not in self.outstanding:
            return
        old = self.batch_acks.get(pos)
        words = [w & _U64 for w in ack_set]
        if old is not None:
            words = [a & b for a, b in itertools.zip_longest(old, words, fillvalue=0)]
        if not any(words):
            self.ack_individual([pos])
            return
        self.batch_acks[pos] = [w - (1 << 64) if w >> 63 else w for w in words]   # int64, as on the wire

    @property
    def batch_index_acks(self) -> bool:
        cfg = getattr(self.topic.service, "config", None)
        return bool(getattr(cfg, "acknowledgment_at_batch_index_level_enabled", False))

    def ack_cumulative(self, pos: Position, ack_set: list[int] | None = None) -> None:
        """Everything up to `pos` is acknowledged. With an `ack_set` (some messages of the batch at
        `pos` still unacknowledged) only what precedes `pos`, plus those batch indexes.
        (The connection refuses cumulative acks from Shared and Key_Shared consumers, as Pulsar's
        Consumer.messageAcked does; message expiry uses this on any subscription.)"""
        if ack_set is not None and any(ack_set):
            self.ack_cumulative(self.ml.previous_position(pos))
            self.ack_batch_index(pos, ack_set)
            return
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
        d = self.dispatcher
        batch_acks = self.batch_acks
        while heap and heap[0] <= key:
            p = Position(*heapq.heappop(heap))
            holder = self.outstanding.pop(p, _MISSING)
            if holder is None:
                self._replay_discard(p)
                if self.delayed:
                    self.delayed.pop(p, None)
            elif holder is not _MISSING:
                self._unpend(holder, p)
            d.forget(p)
            self.redeliveries.pop(p, None)
            if batch_acks:
                batch_acks.pop(p, None)
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
        md = Position(lo[0], lo[1] - 1)
        if self.mark_delete is None or md > self.mark_delete:
            self._set_mark_delete(md)
        elif self.durable:
            self._persist()             # an individual ack above the mark-delete: ranges changed

    def _set_mark_delete(self, pos: Position) -> None:
        if self.mark_delete is not None and pos <= self.mark_delete:
            return
        self.mark_delete = pos
        self._persist()

    def _persist(self) -> None:
        """Hand the state to the cursor. A ManagedCursor (durable) takes it without waiting and
        writes it itself, rate-limited (cursor_mark_delete_rate), reading the individually acked
        ranges from `_individually_deleted` at write time; other cursors get a task."""
        update = getattr(self.cursor, "update", None)
        if update is not None:
            update(self.mark_delete)
            return
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

    def _individually_deleted(self, limit: int = 10000) -> list[tuple[Position, Position]]:
        """Acknowledged ranges above the mark-delete position, (start, end] open-closed as Pulsar's
        individuallyDeletedMessages, the lowest `limit` of them: every position read (before
        read_position) and not outstanding was acknowledged."""
        rp = self.read_position
        if rp is None:
            return []
        md = self.mark_delete
        lo = md if md is not None else Position(-1, -1)
        out: list[tuple[Position, Position]] = []
        holes = sorted((p for p in self.outstanding if md is None or p > md), key=_POSITION_KEY)
        holes.append(rp)
        for hole in holes:
            if len(out) >= limit:
                break
            hi = self.ml.previous_position(hole)
            if hi > lo:
                out.append((lo, hi))
            if hole > lo:
                lo = hole
        return out

    def _restore_from_cursor(self) -> None:
        """A durable subscription starts from its cursor's persisted state: entries at or before the
        mark-delete position and in its individually deleted ranges are consumed; every other entry
        up to the last range is queued for redelivery (first), and reading resumes after it."""
        cursor = self.cursor
        attach = getattr(cursor, "attach", None)
        if not self.durable or attach is None:
            return
        md = cursor.mark_delete_position
        self.mark_delete = md
        self.read_position = self.ml.next_position(md) if md is not None else None
        ranges = cursor.individually_deleted_ranges()
        if ranges:
            end = ranges[-1][1]
            k = 0
            for p in self.ml.positions_in(md, end):
                while k < len(ranges) and ranges[k][1] < p:
                    k += 1
                if k < len(ranges) and ranges[k][0] < p <= ranges[k][1]:
                    continue                           # acknowledged before the restart
                self.outstanding[p] = None
                self.replay.add(p)
                heapq.heappush(self._heap, (p.ledger_id, p.entry_id))
                heapq.heappush(self._replay_heap, (p.ledger_id, p.entry_id))
            self.read_position = self.ml.next_position(end)
            log.info("%s: restored mark-delete %s, %d acknowledged ranges, %d entries to redeliver "
                     "before reading from %s", self, md, len(ranges), len(self.replay), self.read_position)
        attach(ranges_fn=self._individually_deleted, on_expire=self.expire_to,
               on_fenced=self.topic._on_fenced)

    def expire_to(self, pos: Position) -> None:
        """Message TTL (the managed ledger's expiry check): everything up to `pos` is consumed, as a
        cumulative acknowledgement would make it."""
        self.ack_cumulative(pos)

    # -- seek --------------------------------------------------------------------
    async def reset(self, target: Position | None) -> None:
        """Seek, as PersistentSubscription.resetCursor: disconnect the consumers (Exclusive/Failover:
        the active one), forget every acknowledgement and redelivery above `target`, and make it
        (None: the first entry) the next read."""
        self._paused += 1
        self.epoch += 1
        try:
            d = self.dispatcher
            victims = list(self.consumers)
            if d.single_active:
                victims = [c for c in victims if c is d.active]
            for c in victims:
                c.cnx.broker_close_consumer(c)
                self.remove_consumer(c, redeliver=False, keep=True)
            for c in self.consumers:
                c.pending.clear()
            self.outstanding.clear()
            self._heap.clear()
            self.replay.clear()
            self._replay_heap.clear()
            self.redeliveries.clear()
            self.batch_acks.clear()
            self.delayed.clear()
            self._delayed_heap.clear()
            self.dispatcher.cleared()
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
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
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
        d = self.dispatcher
        permits = d.permits()
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
            if entries and d.individual_ack and self._delayed_enabled:
                before = len(entries)
                entries = self._hold_delayed_replay(entries)
                if not entries and before:
                    return True             # all of them wait for their time now; go on
            if entries:
                d.dispatch(entries, True)
                sent = 0
                for pos, _, _ in entries:
                    if self.outstanding.get(pos) is not None:
                        self._replay_discard(pos)
                        sent += 1
                if sent:
                    return True
            if self.replay:
                # what waits cannot go out now; only Key_Shared reads on, for other keys
                if not (d.looks_ahead and d.lookahead_ok() and len(self.replay) < d.lookahead_limit()
                        and d.permits() > 0):
                    return False
        view = self.topic.compacted
        if view is not None and self.reads_compacted() and (
                self.read_position is None or self.read_position <= view.horizon):
            return self._dispatch_compacted(view, max_entries)
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
        if d.individual_ack and self._delayed_enabled:
            now = time.time() * 1000.0
            for _, _, info in entries:
                if info.deliver_at > now:
                    return self._dispatch_with_delayed(entries, now)
        n = d.dispatch(entries, False)
        if n == 0:
            return False
        heap = self._heap
        for pos, _, _ in entries[:n]:
            heapq.heappush(heap, (pos.ledger_id, pos.entry_id))
        last = entries[n - 1][0]
        self.read_position = self.topic.successor(last)
        return True

    # -- reading the compacted view (Pulsar's CompactedTopicImpl.asyncReadEntriesOrWait) ---------
    def reads_compacted(self) -> bool:
        a = self.dispatcher.active
        return a is not None and a.read_compacted

    def _dispatch_compacted(self, view: Any, max_entries: int) -> bool:
        """The read position is at or before the compaction horizon: serve the compacted entries
        from it on (with their original ids), then continue in the topic after the horizon."""
        md = self.mark_delete
        start = self.read_position
        if md is not None and (start is None or start <= md):
            # from the mark-delete's successor on (not from the view's first entry, or a read of
            # max_entries all acknowledged would end the view and skip its later entries)
            start = Position(md.ledger_id, md.entry_id + 1)
        entries = [(p, e, EntryInfo.from_entry(e)) for p, e in view.from_position(start, max_entries)]
        if md is not None:
            entries = [x for x in entries if x[0] > md]
        if not entries:
            self.read_position = self.ml.next_position(view.horizon)
            self.epoch += 1
            return True
        n = self.dispatcher.dispatch(entries, False)
        if n == 0:
            return False
        for pos, _, _ in entries[:n]:
            heapq.heappush(self._heap, (pos.ledger_id, pos.entry_id))
        last = entries[n - 1][0]
        self.read_position = self.ml.next_position(last)
        return True

    # -- delayed delivery (Pulsar's DelayedDeliveryTracker, on Shared and Key_Shared) -------------
    def _dispatch_with_delayed(self, entries: list, now: float) -> bool:
        """A log read holding entries whose deliver_at_time is ahead: those wait in the delayed
        index (outstanding, so the cursor keeps them); the others are dispatched. Reading resumes
        after the last entry dealt with."""
        kept = [e for e in entries if e[2].deliver_at <= now]
        n = self.dispatcher.dispatch(kept, False) if kept else 0
        boundary = kept[n][0] if n < len(kept) else None      # the first entry not dealt with
        heap = self._heap
        for pos, _, _ in kept[:n]:
            heapq.heappush(heap, (pos.ledger_id, pos.entry_id))
        held = 0
        for pos, _, info in entries:
            if info.deliver_at <= now:
                continue
            if boundary is not None and pos > boundary:
                break
            self._delay(pos, info.deliver_at)
            heapq.heappush(heap, (pos.ledger_id, pos.entry_id))
            held += 1
        if n == 0 and held == 0:
            return False
        self.read_position = boundary if boundary is not None else self.topic.successor(entries[-1][0])
        if self._delayed_in_memory:
            self._update_mark_delete()
        return True

    def _hold_delayed_replay(self, entries: list) -> list:
        """Entries waiting for redelivery (after a restart, a consumer leaving) whose time has not
        come go back to the delayed index; the rest are returned."""
        now = time.time() * 1000.0
        out = []
        for e in entries:
            at = e[2].deliver_at
            if at > now:
                self._replay_discard(e[0])
                self._delay(e[0], at)
            else:
                out.append(e)
        return out

    def _delay(self, pos: Position, at: int) -> None:
        self.delayed[pos] = at
        heapq.heappush(self._delayed_heap, (at, pos.ledger_id, pos.entry_id))
        if self._delayed_in_memory:
            # the bug knob: to the cursor the message looks consumed; only this index remembers it
            self.outstanding.pop(pos, None)
        else:
            self.outstanding[pos] = None
        self._arm_delay_timer()

    def _arm_delay_timer(self) -> None:
        heap = self._delayed_heap
        if not heap or self.closed:
            return
        at = heap[0][0]
        if self._delay_timer is not None:
            if self._delay_timer_at <= at:
                return
            self._delay_timer.cancel()
        loop = asyncio.get_running_loop()
        self._delay_timer_at = at
        self._delay_timer = loop.call_later(max(0.0, (at - time.time() * 1000.0) / 1000.0) + 0.001,
                                            self._delayed_due)

    def _delayed_due(self) -> None:
        """Entries whose time has come join the replay set (delivered before new reads)."""
        self._delay_timer = None
        now = time.time() * 1000.0
        heap = self._delayed_heap
        woke = False
        while heap and heap[0][0] <= now:
            at, l, e = heapq.heappop(heap)
            pos = Position(l, e)
            if self.delayed.get(pos) != at:
                continue
            del self.delayed[pos]
            if self._delayed_in_memory:
                if pos in self.outstanding:
                    continue
                self.outstanding[pos] = None
                heapq.heappush(self._heap, (l, e))
            elif self.outstanding.get(pos, _MISSING) is not None:
                continue                 # acknowledged (or handed out) meanwhile
            self._replay_add(pos)
            woke = True
        if woke:
            self.wake()
        self._arm_delay_timer()

    async def _read_replay(self, max_entries: int) -> list[tuple[Position, bytes, EntryInfo]]:
        positions: list[Position] = []
        d = self.dispatcher
        heap = self._replay_heap
        if len(heap) > 2 * len(self.replay) + 64:           # drop stale heap items now and then
            heap[:] = [(p.ledger_id, p.entry_id) for p in self.replay]
            heapq.heapify(heap)
        if d.looks_ahead:
            # Key_Shared: the lowest waiting entries that could go out now (their consumer has
            # permits and the key is not draining elsewhere); sorted on (ledger, entry) tuples,
            # which compare in C (Position's generated ordering runs in Python)
            ok_by_hash: dict[int, bool] = {}
            for p in sorted(self.replay, key=_POSITION_KEY):
                if d.replay_ok(p, ok_by_hash):
                    positions.append(p)
                    if len(positions) >= max_entries:
                        break
        else:
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
        view = self.topic.compacted if self.reads_compacted() else None
        for p in positions:
            if view is not None and p <= view.horizon:
                data = view.get(p)
                if data is not None:
                    out[p] = (p, data, EntryInfo.from_entry(data))
                else:
                    self._replay_discard(p)        # compacted away meanwhile
                    self.outstanding.pop(p, None)
                    d.forget(p)
                continue
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
                    self._replay_discard(p)
                    self.outstanding.pop(p, None)
                    d.forget(p)
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

    def __init__(self, name: str, ml: Any, service: Any, knobs: Knobs | None = None):
        self.name = name
        self.ml = ml
        self.service = service
        # the broker's bug knobs (clusters/bugs.py), which its subscriptions read; None: the ones of
        # the service's configuration (all safe without one)
        self.knobs = knobs if knobs is not None else Knobs(getattr(getattr(service, "config", None), "bugs", None),
                                                           "broker")
        self.producers: dict[str, Producer] = {}        # by producer name
        self.subscriptions: dict[str, Subscription] = {}
        self._adds: collections.deque[_PendingAdd] = collections.deque()
        self._adds_drained: asyncio.Event | None = None
        # The same age limit as the managed ledger's cache: without it, a reader from the earliest
        # message would be served entries from this broker's memory that the bookies no longer have.
        self._cache = EntryCache(TAIL_CACHE_BYTES, getattr(getattr(ml, "cfg", None), "cache_eviction_s", 0.0),
                                 TAIL_CACHE_ENTRIES)
        self._last_added: Position | None = None
        self._sub_lock = asyncio.Lock()
        self._closing = False
        self._closed = False
        self._close_task: asyncio.Task | None = None
        self.avg_messages_per_entry = 1.0
        self.msgs_in = 0
        self.bytes_in = 0
        self._loop = asyncio.get_running_loop()
        # producer side: deduplication (clusters/broker/dedup.py, set by the service), access modes
        self.dedup: Any = None
        self.topic_epoch: int | None = None
        self.exclusive_producer: str | None = None
        self._waiting_exclusive: collections.deque = collections.deque()
        self._publish_fenced = False        # a write failed: refuse publishes until the adds drain
        # topic compaction (clusters/broker/compaction.py): the compacted view and the runs
        self.compacted: Any = None
        self.compaction = Compactor(self)

    def __repr__(self) -> str:
        return f"Topic({self.name})"

    @property
    def closed(self) -> bool:
        """True once closing started: the topic takes no new producers, consumers or messages."""
        return self._closing

    # -- producers ---------------------------------------------------------------
    async def add_producer(self, cnx: Any, producer_id: int, name: str, *, epoch: int = 0,
                           access_mode: int = ACCESS_SHARED, user_provided_name: bool = True,
                           topic_epoch: int | None = None, on_queued: Any = None) -> Producer:
        """Register a producer. A name already connected elsewhere is ProducerBusy, unless this is the
        same client reconnecting (a higher epoch) or the other connection fails a liveness check.

        Access modes as Pulsar's AbstractTopic.incrementTopicEpochIfNeeded: Shared is refused
        (ProducerBusy) while an exclusive producer holds or waits for the topic; Exclusive is refused
        (ProducerFenced) while any other producer is attached; WaitForExclusive queues (`on_queued()` is
        called, the client is told producer_ready=false) until the topic is free; ExclusiveWithFencing
        disconnects every other producer. Exclusive producers get a topic epoch; one reconnecting with
        an epoch older than the topic's is fenced."""
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
        granted: int | None = None
        if access_mode == ACCESS_SHARED:
            if self.exclusive_producer is not None or self._waiting_exclusive:
                raise ProducerBusy(f"Topic has an existing exclusive producer: {self.exclusive_producer}")
        elif access_mode == ACCESS_EXCLUSIVE:
            if self.exclusive_producer is not None or self._waiting_exclusive:
                raise ProducerFenced(f"Topic has an existing exclusive producer: {self.exclusive_producer}")
            if self.producers:
                raise ProducerFenced("Topic has existing shared producers")
            granted = self._grant_exclusive(name, topic_epoch)
        elif access_mode == ACCESS_EXCLUSIVE_WITH_FENCING:
            for other in list(self.producers.values()):
                self.remove_producer(other)
                other.cnx.broker_close_producer(other)
            self._fail_waiting(ProducerFenced("Fenced by a producer with ExclusiveWithFencing access"))
            self.exclusive_producer = None
            granted = self._grant_exclusive(name, None)
        elif access_mode == ACCESS_WAIT_FOR_EXCLUSIVE:
            if self.exclusive_producer is not None or self.producers:
                fut = self._loop.create_future()
                self._waiting_exclusive.append((name, topic_epoch, fut))
                log.info("%s: producer %s waits for exclusive access", self, name)
                if on_queued is not None:
                    on_queued()
                granted = await fut          # _release_exclusive grants it (or fails it)
                if self._closing:
                    self._release_exclusive(name)
                    raise not_served(self.name, "closing")
            else:
                granted = self._grant_exclusive(name, topic_epoch)
        else:
            raise NotAllowed(f"Invalid producer access mode: {access_mode}")
        p = Producer(self, cnx, producer_id, name, epoch, access_mode, user_provided_name, granted)
        self.producers[name] = p
        return p

    def _grant_exclusive(self, name: str, producer_epoch: int | None) -> int:
        """Make `name` the exclusive producer; returns the new topic epoch (ProducerFenced if the
        producer's epoch is older than the topic's: another producer held the topic in between)."""
        current = self.topic_epoch
        if producer_epoch is not None and current is not None and producer_epoch < current:
            raise ProducerFenced(f"Topic epoch has already moved. Current epoch: {current}, "
                                 f"Producer epoch: {producer_epoch}")
        epoch = producer_epoch if producer_epoch is not None else (0 if current is None else current + 1)
        self.topic_epoch = epoch
        self.exclusive_producer = name
        return epoch

    def _release_exclusive(self, name: str | None) -> None:
        """The exclusive producer left (or, `name` None, the last shared one): hand the topic to the
        first waiting producer."""
        if name is not None:
            if self.exclusive_producer != name:
                return
            self.exclusive_producer = None
        if self.exclusive_producer is not None or self.producers:
            return
        while self._waiting_exclusive:
            wname, wepoch, fut = self._waiting_exclusive.popleft()
            if fut.done():
                continue
            try:
                fut.set_result(self._grant_exclusive(wname, wepoch))
            except ProducerFenced as e:
                fut.set_exception(e)
                continue
            log.info("%s: producer %s now has exclusive access", self, wname)
            return

    def _fail_waiting(self, exc: BaseException) -> None:
        while self._waiting_exclusive:
            _, _, fut = self._waiting_exclusive.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def remove_producer(self, p: Producer) -> None:
        p.closed = True
        if self.producers.get(p.name) is p:
            del self.producers[p.name]
            if p.topic_epoch is not None:
                self._release_exclusive(p.name)
            elif self._waiting_exclusive and not self.producers:
                self._release_exclusive(None)
        if self._closing:
            self._fail_waiting(not_served(self.name, "closing"))

    def last_sequence_id(self, producer_name: str) -> int:
        """What PRODUCER_SUCCESS tells a producer: the highest sequence id pushed under its name when
        deduplicating (the client resumes after it), else -1."""
        dedup = self.dedup
        return dedup.last_sequence_id(producer_name) if dedup is not None else -1

    # -- publishing: the hot path -----------------------------------------------
    def publish(self, producer: Producer, sequence_id: int, highest_sequence_id: int, entry: bytes,
                metadata: pb.MessageMetadata) -> None:
        """Append an entry; the receipt (or SendError) goes out in call order once it is persisted.

        With deduplication on, a message already persisted under this producer name is answered
        at once (in order) with message id (-1, -1) and not written; one whose original is still in
        flight gets a SendError (Pulsar's MessageDupStatus.Unknown). After a failed write the topic
        refuses publishes until the adds in flight have completed (Pulsar fences the topic), so a
        later message cannot be persisted ahead of a resent earlier one."""
        if self._closing or producer.closed:
            return      # CLOSE_PRODUCER is on its way; the client resends after reconnecting
        info = EntryInfo.from_metadata(metadata)
        op = _PendingAdd(producer, sequence_id, highest_sequence_id, entry, info)
        producer.cnx.add_pending_send(1)
        if self._publish_fenced or (self._adds and self.ml.state == "failed"):
            # (the second: the managed ledger failed adds we have not answered yet; a message
            # written now could land ahead of their resends)
            op.error = TopicFencedForPublish()
            self._complete_unwritten(op)
            return
        dedup = self.dedup
        if dedup is not None and dedup.status == DEDUP_ENABLED:
            status = dedup.check(producer.name, sequence_id, highest_sequence_id)
            if status != DEDUP_NOT_DUP:
                if status == DEDUP_DUP:
                    op.dup = True
                    producer.duplicates += info.num_messages
                else:
                    op.error = MessageDupUnknown()
                self._complete_unwritten(op)
                return
        self._adds.append(op)
        producer.msgs_in += info.num_messages
        producer.bytes_in += len(entry)
        task = self._loop.create_task(self.ml.add_entry(entry))
        task.add_done_callback(functools.partial(self._add_done, op))

    def _complete_unwritten(self, op: _PendingAdd) -> None:
        """Answer a send that is not written, after the sends before it (receipts stay in order)."""
        op.written = False
        op.done = True
        self._adds.append(op)
        if self._adds[0] is op:
            self._drain_adds()

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
        if self._adds[0] is op:
            self._drain_adds()
        # else: an earlier add is still in flight; it completes this one too

    def _drain_adds(self) -> None:
        """Answer every completed send at the head of the queue, in SEND order."""
        adds = self._adds
        dedup = self.dedup
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
                if dedup is not None:
                    dedup.record_persisted(p.name, op.sequence_id, op.highest_sequence_id, pos)
                if not p.closed:
                    p.cnx.send_receipt(p.producer_id, op.sequence_id, pos.ledger_id, pos.entry_id,
                                       op.highest_sequence_id)
            elif op.dup:
                if not p.closed:
                    p.cnx.send_receipt(p.producer_id, op.sequence_id, -1, -1, op.highest_sequence_id)
            elif isinstance(op.error, ManagedLedgerFenced):
                fenced = op.error
            else:
                if op.written:
                    self._publish_fenced = True        # lifted once the queue has drained
                if not p.closed:
                    err = op.error
                    if isinstance(err, BrokerServiceError):
                        code, text = err.code, str(err)
                    else:
                        log.warning("%s: persisting seq %d of %s failed: %s", self, op.sequence_id,
                                    p.name, err)
                        code, text = pb.PersistenceError, f"Failed to persist message: {err}"
                    p.cnx.send_send_error(p.producer_id, op.sequence_id, code, text)
        if notify:
            for sub in self.subscriptions.values():
                sub._wake.set()
        if not adds:
            if self._publish_fenced:
                # as Pulsar's decrementPendingWriteOpsAndCheck: un-fence, and let what was pushed but
                # not persisted be written again when the client resends it
                self._publish_fenced = False
                if dedup is not None:
                    dedup.reset_pushed()
            if self._adds_drained is not None:
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
        cache.put(pos, _CachedEntry(entry, info), len(entry))

    def cached(self, pos: Position) -> _CachedEntry | None:
        return self._cache.get(pos)

    def cached_run(self, start: Position, max_entries: int) -> list[tuple[Position, bytes, EntryInfo]]:
        """Consecutive cached entries from `start` ([] when `start` is not cached)."""
        cache = self._cache
        cache.evict_old()                   # once for the run, not per entry (dispatch's hot path)
        out = []
        pos = start
        while pos is not None and len(out) < max_entries:
            hit = cache.peek(pos)
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
        if cmd.read_compacted and cmd.subType not in (EXCLUSIVE, FAILOVER):
            raise NotAllowed("readCompacted only allowed on failover or exclusive subscriptions")
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
        """Delete the subscription, as PersistentSubscription.doUnsubscribe: only its one consumer
        (the active one of an Exclusive/Failover subscription) may, unless `force`, which first
        disconnects the others."""
        sub = consumer.sub
        others = [c for c in sub.consumers if c is not consumer]
        d = sub.dispatcher
        if not force and (others or consumer not in sub.consumers
                          or (d.single_active and d.active is not consumer)):
            raise BrokerServiceError("Unconnected or shared consumer attempting to unsubscribe",
                                     pb.MetadataError)
        self._drop_subscription(sub)
        for c in others:
            c.cnx.broker_close_consumer(c)
        await sub.close(notify=False)
        if sub.durable:
            await self.ml.delete_cursor(sub.name)

    # -- queries -----------------------------------------------------------------
    async def last_message_id(self, read_compacted: bool = False) -> tuple[int, int, int]:
        """(ledger, entry, batch_index) of the last entry; (current ledger, -1, -1) when the topic is
        empty (Pulsar's lastConfirmedEntry of a managed ledger with no entry). For
        a compacted reader, when the whole topic is compacted, the compacted view's last entry (the
        topic's last one may have been compacted away, a tombstone): Pulsar's getLastMessageId."""
        lc = self.ml.last_confirmed
        view = self.compacted
        if read_compacted and view is not None and lc is not None and lc <= view.horizon:
            last = view.last()
            if last is None:
                return -1, -1, -1
            info = EntryInfo.from_entry(view.get(last))
            return last.ledger_id, last.entry_id, info.num_messages - 1 if info.is_batch else -1
        if lc is None:
            # an empty topic: Pulsar answers its managed ledger's lastConfirmedEntry, (current ledger, -1)
            ledgers = getattr(self.ml, "ledgers", None)
            if ledgers:
                last = ledgers[-1]
                return (last.ledger_id if hasattr(last, "ledger_id") else last[0]), -1, -1
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
        await self.compaction.stop()        # a run must not outlive this owner
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
