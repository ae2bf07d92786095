"""A topic as the broker serves it: producers append to its ManagedLedger, subscriptions dispatch from it.

Entries are stored as the producer sent them (from the 0x0e01 magic on) and forwarded verbatim in
MESSAGE frames. Per-subscription state is kept per entry, never per message: outstanding
(delivered-but-unacked or waiting for redelivery) positions, their redelivery counts, and the read
position; the mark-delete position is derived from them and persisted through the cursor.

This module holds the topic and its producers; subscriptions are in subscription.py (delayed delivery
in delayed.py), dispatch policies and consumers in dispatchers.py, the errors in errors.py. The names
they define that callers import from here (`Consumer`, `SUB_TYPE_NAMES`, the errors) are re-exported.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import time
from typing import Any

from clusters.broker.compaction import Compactor
from clusters.broker.dedup import DUP as DEDUP_DUP, ENABLED as DEDUP_ENABLED, NOT_DUP as DEDUP_NOT_DUP
from clusters.broker.dispatchers import (DISPATCHERS, EXCLUSIVE, FAILOVER, KEY_SHARED,  # noqa: F401
                                         MAX_ROUND_ROBIN_BATCH, NONE_KEY, SHARED, SUB_TYPE_NAMES, Consumer,
                                         Dispatcher, EntryInfo, KeySharedDispatcher, SharedDispatcher,
                                         SingleActiveDispatcher, unacked_in_batch)
from clusters.broker.errors import (BrokerServiceError, ConsumerAssignFailed, ConsumerBusy,  # noqa: F401
                                    MessageDupUnknown, NotAllowed, ProducerBusy, ProducerFenced,
                                    ServiceUnitNotReady, TopicFencedForPublish, not_served)
from clusters.broker.managed_ledger import EntryCache, ManagedLedgerError, ManagedLedgerFenced, Position
from clusters.broker.subscription import (CLOSE_DRAIN_TIMEOUT, LIVENESS_CHECK_TIMEOUT,  # noqa: F401
                                          MAX_READ_ENTRIES, NON_DURABLE_GRACE, NonDurableCursor, Subscription)
from clusters.bugs import Knobs
from clusters.protocol import frames
from clusters.protocol import PulsarApi_pb2 as pb

log = logging.getLogger(__name__)

INT64_MAX = (1 << 63) - 1
ACCESS_SHARED, ACCESS_EXCLUSIVE, ACCESS_WAIT_FOR_EXCLUSIVE, ACCESS_EXCLUSIVE_WITH_FENCING = 0, 1, 2, 3
ACCESS_MODE_NAMES = {0: "Shared", 1: "Exclusive", 2: "WaitForExclusive", 3: "ExclusiveWithFencing"}

TAIL_CACHE_ENTRIES = 4096          # recently added entries kept for tailing subscriptions
TAIL_CACHE_BYTES = 32 * 1024 * 1024


# ----------------------------------------------------------------------------- entries

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
            self._disconnect_producers()
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

    def _disconnect_producers(self, url: str | None = None) -> None:
        """Every producer removed and told to reconnect (CLOSE_PRODUCER, with the new owner's `url`)."""
        for p in list(self.producers.values()):
            self.remove_producer(p)
            p.cnx.broker_close_producer(p, url)

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
        close_producers = False
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
                    # lifted once the queue has drained; the producers are disconnected first
                    close_producers = close_producers or not self._publish_fenced
                    self._publish_fenced = True
                if not p.closed:
                    err = op.error
                    if isinstance(err, BrokerServiceError):
                        code, text = err.code, str(err)
                    else:
                        log.warning("%s: persisting seq %d of %s failed: %s", self, op.sequence_id,
                                    p.name, err)
                        code, text = pb.PersistenceError, f"Failed to persist message: {err}"
                    p.cnx.send_send_error(p.producer_id, op.sequence_id, code, text)
        if close_producers:
            # as Pulsar's addFailed: a failed write disconnects every producer before the topic is
            # un-fenced, so a send pipelined behind the failed one is not written ahead of its resend
            # (with deduplication that resend would then be taken for a duplicate and dropped); the
            # clients reconnect and resend what they have pending, in order
            self._disconnect_producers()
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

    async def create_subscription(self, name: str, initial_position: str = "latest") -> bool:
        """A durable subscription with no consumer yet (Pulsar's admin createSubscription, whose
        default position is the latest): its cursor is created at `initial_position` ("latest" or
        "earliest") and persisted. False when the subscription exists already."""
        if self._closing:
            raise not_served(self.name, "closing")
        async with self._sub_lock:
            sub = self.subscriptions.get(name)
            if (sub is not None and not sub.closed) or name in self.ml.cursors:
                return False
            cursor = await self.ml.open_cursor(name, initial_position)
            if self._closing:
                raise not_served(self.name, "closing")
            self.subscriptions[name] = Subscription(self, name, cursor, EXCLUSIVE, True)
        return True

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
        self._disconnect_producers(url)
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
