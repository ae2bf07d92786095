"""Non-persistent topics (`non-persistent://`), as Pulsar's NonPersistentTopic,
NonPersistentSubscription and NonPersistentDispatcher{SingleActiveConsumer,MultipleConsumers,
StickyKeyDispatcherMultipleConsumers}.

A message is held only in this broker's memory for as long as it takes to hand it to the consumers
connected at that moment; nothing is written to BookKeeper. The producer's receipt carries message id
(0, 0) at once (Pulsar's `callback.completed(null, 0L, 0L)`), every dispatched message has id (0, 0)
too. A consumer without permits (or with a connection that cannot take more) misses the message: it
is counted as dropped (Pulsar's msgDropRate). There is no backlog, no acknowledgement state (acks and
redelivery requests are ignored), no replay for a late subscriber or a reader's start message id, and
nothing survives an unload, a broker restart or an owner change. Seek answers success and does
nothing (NonPersistentSubscription.resetCursor); GET_LAST_MESSAGE_ID fails ("getLastMessageId is
not supported on non-persistent topic"); readCompacted is refused. Lookups and bundle ownership are
those of persistent topics (the bundle is the CRC-32 of the full name, domain included).

`NonPersistentTopics` is the broker's registry of them (BrokerService.non_persistent); the protocol
side (connection.py) handles them through the same calls as a persistent Topic.
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Any

from clusters.broker.selectors import ConsistentHashSelector, pick_active
from clusters.broker.topic import (ACCESS_MODE_NAMES, SUB_TYPE_NAMES, BrokerServiceError, Consumer,
                                   ConsumerBusy, EntryInfo, NotAllowed, Producer, ProducerBusy,
                                   ProducerFenced, not_served)
from clusters.loadbalancer.bundles import topic_namespace
from clusters.protocol import PulsarApi_pb2 as pb

log = logging.getLogger(__name__)

PREFIX = "non-persistent://"
EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = 0, 1, 2, 3
ACCESS_SHARED, ACCESS_EXCLUSIVE, ACCESS_WAIT_FOR_EXCLUSIVE, ACCESS_EXCLUSIVE_WITH_FENCING = 0, 1, 2, 3
DISABLED_MESSAGE = "Broker is not unable to load non-persistent topic"   # Pulsar's wording, verbatim


def is_non_persistent(topic: str) -> bool:
    return topic.startswith(PREFIX)


class NonPersistentSubscription:
    """A subscription without a cursor: the consumers connected now, and a dispatcher choosing which
    of them gets each message (or dropping it)."""

    durable = True

    def __init__(self, topic: "NonPersistentTopic", name: str, sub_type: int, durable: bool):
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.durable = durable
        self.consumers: list[Consumer] = []
        self.active: Consumer | None = None         # Exclusive / Failover
        self._rr = itertools.count()                 # Shared round robin
        self._selector: ConsistentHashSelector | None = None     # Key_Shared
        self.closed = False
        self.mark_delete = None                      # GET_LAST_MESSAGE_ID's consumer_mark_delete_position
        self.outstanding: dict = {}
        self.msgs_out_removed = 0                    # counters of consumers gone (Pulsar keeps them)
        self.bytes_out_removed = 0
        self.msg_drop = 0                            # messages no consumer could take (msgDropRate's count)
        self.drop_rate = 0.0
        self._drop_sample = (time.monotonic(), 0)
        self.dispatcher = self                       # connection.py reads dispatcher.individual_ack
        self.individual_ack = sub_type in (SHARED, KEY_SHARED)
        self.single_active = sub_type in (EXCLUSIVE, FAILOVER)

    def __repr__(self) -> str:
        return f"NonPersistentSubscription({self.topic.name}, {self.name})"

    # -- consumers --------------------------------------------------------------------
    def add_consumer(self, cnx: Any, cmd: pb.CommandSubscribe) -> Consumer:
        if self.closed:
            raise not_served(self.topic.name, "closing")
        if self.consumers and cmd.subType != self.sub_type:
            raise ConsumerBusy("Subscription is of different type")
        if not self.consumers:
            self.sub_type = cmd.subType
            self.individual_ack = cmd.subType in (SHARED, KEY_SHARED)
            self.single_active = cmd.subType in (EXCLUSIVE, FAILOVER)
        if self.sub_type == EXCLUSIVE and self.consumers:
            raise ConsumerBusy("Exclusive consumer is already connected")
        if self.sub_type not in SUB_TYPE_NAMES:
            raise BrokerServiceError("Unsupported subscription type", pb.MetadataError)
        name = cmd.consumer_name or f"consumer-{cmd.consumer_id}"
        c = Consumer(self, cnx, cmd.consumer_id, name, cmd.priority_level, cmd.subType)
        self.consumers.append(c)
        if self.sub_type == KEY_SHARED:
            if self._selector is None:
                self._selector = ConsistentHashSelector()
            self._selector.add(c)
        self._elect()
        return c

    def _elect(self) -> None:
        if not self.single_active:
            return
        new = (self.consumers[0] if self.sub_type == EXCLUSIVE and self.consumers
               else pick_active(self.consumers, self.topic.name))
        if new is self.active:
            return
        self.active = new
        for c in self.consumers:
            c.cnx.send_active_consumer_change(c.consumer_id, c is new)

    def remove_consumer(self, c: Consumer, **_: Any) -> None:
        if c not in self.consumers:
            return
        c.closed = True
        self.consumers.remove(c)
        self.msgs_out_removed += c.msgs_out
        self.bytes_out_removed += c.bytes_out
        if self._selector is not None:
            self._selector.remove(c)
        if self.active is c:
            self.active = None
        self._elect()
        if not self.durable and not self.consumers:
            # a reader's subscription goes with its consumer (NonPersistentSubscription.removeConsumer)
            self.topic.drop_subscription(self)

    def flow(self, c: Consumer, permits: int) -> None:
        c.permits += permits

    def wake(self) -> None:
        pass            # nothing is waiting: a message no consumer could take is already dropped

    # acknowledgements and redelivery: no state to change (Pulsar's are no-ops)
    def ack_individual(self, positions: Any) -> None:
        pass

    def ack_batch_index(self, pos: Any, ack_set: Any) -> None:
        pass

    def ack_cumulative(self, pos: Any, ack_set: Any = None) -> None:
        pass

    def redeliver(self, c: Consumer, ids: Any) -> None:
        pass

    async def reset(self, target: Any) -> None:
        """SEEK: success, nothing moves (NonPersistentSubscription.resetCursor)."""

    def unacked(self) -> int:
        return 0

    # -- dispatch -------------------------------------------------------------------------
    def _target(self, info: EntryInfo) -> Consumer | None:
        if self.single_active:
            c = self.active
            return c if c is not None and c.available else None
        if self.sub_type == KEY_SHARED:
            c = self._selector.select(info.key_hash) if self._selector is not None else None
            return c if c is not None and c.available else None
        cs = self.consumers
        n = len(cs)
        for _ in range(n):           # the next consumer with permits, round robin
            c = cs[next(self._rr) % n]
            if c.available:
                return c
        return None

    def send(self, entry: bytes, info: EntryInfo) -> None:
        c = self._target(info)
        if c is None:
            self.msg_drop += info.num_messages
            self.topic.msg_drop += info.num_messages
            return
        c.permits -= info.num_messages
        c.msgs_out += info.num_messages
        c.bytes_out += len(entry)
        c.cnx.send_message(c.consumer_id, 0, 0, 0, entry, partition=c.partition)

    async def close(self, *, notify: bool = True, assigned_broker_url: str | None = None) -> None:
        self.closed = True
        for c in list(self.consumers):
            self.consumers.remove(c)
            c.closed = True
            c.cnx.broker_close_consumer(c, assigned_broker_url, notify=notify)


class NonPersistentTopic:
    """One non-persistent topic served by this broker: producers and subscriptions, in memory only."""

    def __init__(self, name: str, service: Any):
        self.name = name
        self.service = service
        self.producers: dict[str, Producer] = {}
        self.subscriptions: dict[str, NonPersistentSubscription] = {}
        self.msgs_in = 0
        self.bytes_in = 0
        self.msg_drop = 0
        self.topic_epoch: int | None = None
        self.exclusive_producer: str | None = None
        self.dedup = None
        self.compacted = None
        self._closing = False
        self.drop_rate = 0.0
        self._drop_sample = (time.monotonic(), 0)

    def update_drop_rate(self, now: float) -> None:
        def rate(sample: tuple[float, int], count: int) -> tuple[float, tuple[float, int]]:
            dt = now - sample[0]
            return ((count - sample[1]) / dt if dt > 0 else 0.0), (now, count)
        self.drop_rate, self._drop_sample = rate(self._drop_sample, self.msg_drop)
        for sub in list(self.subscriptions.values()):
            sub.drop_rate, sub._drop_sample = rate(sub._drop_sample, sub.msg_drop)

    def __repr__(self) -> str:
        return f"NonPersistentTopic({self.name})"

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def active(self) -> bool:
        """Pulsar's NonPersistentTopic.isActive: producers, consumers or subscriptions attached."""
        return bool(self.producers or self.subscriptions)

    # -- producers ----------------------------------------------------------------------
    async def add_producer(self, cnx: Any, producer_id: int, name: str, *, epoch: int = 0,
                           access_mode: int = ACCESS_SHARED, user_provided_name: bool = True,
                           topic_epoch: int | None = None, on_queued: Any = None) -> Producer:
        if self._closing:
            raise not_served(self.name, "closing")
        old = self.producers.get(name)
        if old is not None:
            if old.cnx is cnx and old.producer_id == producer_id:
                return old
            if epoch > old.epoch or not old.cnx.active:
                self.remove_producer(old)
                old.cnx.forget_producer(old)
            else:
                raise ProducerBusy(f"Producer with name '{name}' is already connected to topic {self.name}")
        granted = None
        if access_mode == ACCESS_SHARED:
            if self.exclusive_producer is not None:
                raise ProducerBusy(f"Topic has an existing exclusive producer: {self.exclusive_producer}")
        elif access_mode == ACCESS_EXCLUSIVE:
            if self.exclusive_producer is not None:
                raise ProducerFenced(f"Topic has an existing exclusive producer: {self.exclusive_producer}")
            if self.producers:
                raise ProducerFenced("Topic has existing shared producers")
            granted = self._grant(name, topic_epoch)
        elif access_mode == ACCESS_EXCLUSIVE_WITH_FENCING:
            for other in list(self.producers.values()):
                self.remove_producer(other)
                other.cnx.broker_close_producer(other)
            granted = self._grant(name, None)
        else:
            raise NotAllowed(f"Producer access mode {ACCESS_MODE_NAMES.get(access_mode, access_mode)} "
                             "is not supported on non-persistent topics by this broker")
        p = Producer(self, cnx, producer_id, name, epoch, access_mode, user_provided_name, granted)
        self.producers[name] = p
        return p

    def _grant(self, name: str, producer_epoch: int | None) -> int:
        current = self.topic_epoch
        if producer_epoch is not None and current is not None and producer_epoch < current:
            raise ProducerFenced(f"Topic epoch has already moved. Current epoch: {current}, "
                                 f"Producer epoch: {producer_epoch}")
        epoch = producer_epoch if producer_epoch is not None else (0 if current is None else current + 1)
        self.topic_epoch = epoch
        self.exclusive_producer = name
        return epoch

    def remove_producer(self, p: Producer) -> None:
        p.closed = True
        if self.producers.get(p.name) is p:
            del self.producers[p.name]
            if self.exclusive_producer == p.name:
                self.exclusive_producer = None

    def last_sequence_id(self, producer_name: str) -> int:
        return -1                  # no deduplication on non-persistent topics

    def publish(self, producer: Producer, sequence_id: int, highest_sequence_id: int, entry: bytes,
                metadata: pb.MessageMetadata) -> None:
        """Receipt (0, 0) at once, then one copy to each subscription's chosen consumer (or dropped)."""
        if self._closing or producer.closed:
            return      # CLOSE_PRODUCER is on its way; the client resends after reconnecting
        info = EntryInfo.from_metadata(metadata)
        producer.msgs_in += info.num_messages
        producer.bytes_in += len(entry)
        self.msgs_in += info.num_messages
        self.bytes_in += len(entry)
        producer.cnx.send_receipt(producer.producer_id, sequence_id, 0, 0, highest_sequence_id)
        for sub in list(self.subscriptions.values()):
            sub.send(entry, info)

    # -- subscriptions ------------------------------------------------------------------
    async def subscribe(self, cnx: Any, cmd: pb.CommandSubscribe) -> Consumer:
        if self._closing:
            raise not_served(self.name, "closing")
        if cmd.read_compacted:
            raise NotAllowed("readCompacted only valid on persistent topics")
        sub = self.subscriptions.get(cmd.subscription)
        if sub is None or sub.closed:
            sub = NonPersistentSubscription(self, cmd.subscription, cmd.subType, cmd.durable)
            self.subscriptions[cmd.subscription] = sub
        try:
            return sub.add_consumer(cnx, cmd)
        except BrokerServiceError:
            if not sub.consumers and not sub.durable:
                self.drop_subscription(sub)
            raise

    def drop_subscription(self, sub: NonPersistentSubscription) -> None:
        if self.subscriptions.get(sub.name) is sub:
            del self.subscriptions[sub.name]

    async def unsubscribe(self, consumer: Consumer, *, force: bool = False) -> None:
        sub = consumer.sub
        others = [c for c in sub.consumers if c is not consumer]
        if not force and (others or consumer not in sub.consumers):
            raise BrokerServiceError("Unconnected or shared consumer attempting to unsubscribe",
                                     pb.MetadataError)
        self.drop_subscription(sub)
        for c in others:
            c.cnx.broker_close_consumer(c)
        await sub.close(notify=False)

    # -- queries (what connection.py asks of any topic) ---------------------------------------
    async def last_message_id(self, read_compacted: bool = False) -> tuple[int, int, int]:
        raise BrokerServiceError("getLastMessageId is not supported on non-persistent topic", pb.NotAllowedError)

    async def find_position_by_publish_time(self, publish_time_ms: int) -> None:
        return None

    def seek_target(self, ledger_id: int, entry_id: int) -> None:
        return None

    # -- closing -------------------------------------------------------------------------
    async def close(self, reason: str = "unloading", *, close_ledger: bool = True,
                    assigned_broker_url: str | None = None) -> None:
        """Disconnect every producer and consumer (they look the topic up again); whatever was in
        flight is gone."""
        if self._closing:
            return
        self._closing = True
        log.info("%s: closing (%s)", self, reason)
        for p in list(self.producers.values()):
            self.remove_producer(p)
            p.cnx.broker_close_producer(p, assigned_broker_url)
        for sub in list(self.subscriptions.values()):
            await sub.close(notify=True, assigned_broker_url=assigned_broker_url)
        self.subscriptions.clear()

    # -- stats (Pulsar's NonPersistentTopicStats) -------------------------------------------
    def stats(self, rate: Any, owner: str, broker: str) -> dict[str, Any]:
        r_in = rate("in", self.name)
        publishers = []
        for p in list(self.producers.values()):
            pr = rate("producer", self.name, p.name, p.producer_id)
            publishers.append({
                "producerId": p.producer_id, "producerName": p.name, "accessMode": p.access_mode_name,
                "msgRateIn": pr[0], "msgThroughputIn": pr[1],
                "averageMsgSize": p.bytes_in / p.msgs_in if p.msgs_in else 0.0,
                "msgInCounter": p.msgs_in, "bytesInCounter": p.bytes_in, "msgDropRate": 0.0,
                "address": p.cnx.remote, "clientVersion": p.cnx.client_version,
                "connectedSince": p.connected_since})
        subs: dict[str, Any] = {}
        out_m = out_b = 0
        rate_out = thr_out = 0.0
        for name, sub in list(self.subscriptions.items()):
            consumers = []
            sm, sb = sub.msgs_out_removed, sub.bytes_out_removed
            s_rate = s_thr = 0.0
            for c in list(sub.consumers):
                cr = rate("consumer", self.name, name, c.name, c.consumer_id)
                consumers.append({"consumerName": c.name, "availablePermits": c.permits,
                                  "msgRateOut": cr[0], "msgThroughputOut": cr[1],
                                  "msgOutCounter": c.msgs_out, "bytesOutCounter": c.bytes_out,
                                  "unackedMessages": 0, "address": c.cnx.remote,
                                  "connectedSince": c.connected_since})
                sm += c.msgs_out
                sb += c.bytes_out
                s_rate += cr[0]
                s_thr += cr[1]
            subs[name] = {"type": SUB_TYPE_NAMES.get(sub.sub_type, "None") if sub.consumers else "None",
                          "msgRateOut": s_rate, "msgThroughputOut": s_thr, "msgOutCounter": sm,
                          "bytesOutCounter": sb, "msgBacklog": 0, "unackedMessages": 0,
                          "isDurable": sub.durable, "consumers": consumers,
                          "msgDropCounter": sub.msg_drop, "msgDropRate": sub.drop_rate}
            out_m += sm
            out_b += sb
            rate_out += s_rate
            thr_out += s_thr
        return {
            "msgRateIn": r_in[0], "msgThroughputIn": r_in[1], "msgRateOut": rate_out,
            "msgThroughputOut": thr_out, "msgInCounter": self.msgs_in, "bytesInCounter": self.bytes_in,
            "msgOutCounter": out_m, "bytesOutCounter": out_b,
            "averageMsgSize": self.bytes_in / self.msgs_in if self.msgs_in else 0.0,
            "storageSize": 0, "backlogSize": 0, "msgDropRate": self.drop_rate,
            "msgDropCounter": self.msg_drop, "publishers": publishers, "subscriptions": subs,
            "replication": {}, "deduplicationStatus": "Disabled", "topicEpoch": self.topic_epoch,
            "ownerBroker": owner, "broker": broker,
        }


class NonPersistentTopics:
    """The non-persistent topics this broker serves (kept apart from the persistent ones, which all
    have a managed ledger). Pulsar's enableNonPersistentTopics is `enabled`: when false, a producer,
    consumer or reader gets NotAllowedError, as before."""

    def __init__(self, service: Any, enabled: bool = True):
        self.service = service
        self.enabled = enabled
        self.topics: dict[str, NonPersistentTopic] = {}

    def get(self, topic: str) -> NonPersistentTopic:
        if not self.enabled:
            raise NotAllowed(DISABLED_MESSAGE)
        t = self.topics.get(topic)
        if t is not None and not t.closed:
            return t
        try:
            topic_namespace(topic)
        except ValueError as e:
            raise BrokerServiceError(str(e), pb.InvalidTopicName) from None
        if not self.service.ownership.owns(topic):
            raise not_served(topic)
        t = NonPersistentTopic(topic, self.service)
        self.topics[topic] = t
        log.info("loaded non-persistent topic %s", topic)
        return t

    def names(self, namespace: str) -> list[str]:
        """GET_TOPICS_OF_NAMESPACE's non-persistent part: the active ones loaded here, sorted
        (Pulsar's NamespaceService.getListOfNonPersistentTopics reads its broker's own topic map)."""
        return sorted(n for n, t in self.topics.items()
                      if t.active and not t.closed and topic_namespace(n)[0] == namespace)

    async def unload(self, topic: str) -> bool:
        t = self.topics.pop(topic, None)
        if t is None:
            return False
        await t.close("unloading")
        return True

    async def unload_bundle(self, bundle: Any) -> list[str]:
        names = [n for n in list(self.topics) if self.service.ownership.bundle(n) == bundle]
        for n in names:
            await self.unload(n)
        return names

    async def close_all(self) -> None:
        for n in list(self.topics):
            try:
                await self.unload(n)
            except Exception as e:  # noqa: BLE001
                log.warning("closing %s: %s", n, e)

    def update_drop_rates(self, now: float | None = None) -> None:
        """msgDropRate of every topic and subscription: messages dropped per second since the
        previous call (the broker's rates pass, every RATE_INTERVAL_S)."""
        now = time.monotonic() if now is None else now
        for t in list(self.topics.values()):
            t.update_drop_rate(now)


__all__ = ["NonPersistentTopic", "NonPersistentTopics", "NonPersistentSubscription", "is_non_persistent",
           "DISABLED_MESSAGE"]
