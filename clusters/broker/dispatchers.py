"""How a subscription hands entries to its consumers: the subscription types, what dispatch knows of an
entry (`EntryInfo`), a consumer as the broker sees it (`Consumer`), and one dispatch policy per
subscription type (`DISPATCHERS`: Exclusive and Failover, Shared, Key_Shared). The subscription
(clusters/broker/subscription.py) owns the per-entry state; a dispatcher decides who gets what.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import operator
import time
from typing import Any

from clusters.broker.errors import ConsumerAssignFailed, ConsumerBusy
from clusters.broker.managed_ledger import Position
from clusters.broker.murmur3 import sticky_key_hash
from clusters.broker.selectors import (AutoSplitSelector, ConsistentHashSelector, ConsumerAssignError, StickySelector,
                                       partition_index, pick_active)
from clusters.protocol import frames
from clusters.protocol import PulsarApi_pb2 as pb

log = logging.getLogger(__name__)

SUB_TYPE_NAMES = {0: "Exclusive", 1: "Shared", 2: "Failover", 3: "Key_Shared"}
EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = 0, 1, 2, 3
NONE_KEY = b"NONE_KEY"             # Key_Shared routing key of entries without a key (as Pulsar)


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
