"""Subscription types, initial positions and unsubscribe, through the official client.

Each test cites the Pulsar page or source whose semantics it asserts. Helpers compute what Pulsar
would choose from its documented algorithms (Murmur3 from clusters/broker/murmur3.py, itself checked
against the MurmurHash3 reference vectors in tests/broker/test_selectors.py)."""
from __future__ import annotations

import time

import pulsar
import pytest

from clusters.broker.murmur3 import pulsar_hash, sticky_key_hash
from tests.conformance.conftest import rest_path

EARLIEST = pulsar.InitialPosition.Earliest
SHARED = pulsar.ConsumerType.Shared
FAILOVER = pulsar.ConsumerType.Failover
KEY_SHARED = pulsar.ConsumerType.KeyShared


def drain(consumer, timeout_ms: int = 1000, limit: int = 10000) -> list:
    """Everything the consumer receives until it has been quiet for `timeout_ms`."""
    out = []
    while len(out) < limit:
        try:
            out.append(consumer.receive(timeout_ms))
        except pulsar.Timeout:
            break
    return out


def receive_n(consumer, n: int, timeout_ms: int = 10000) -> list:
    return [consumer.receive(timeout_ms) for _ in range(n)]


def nothing_more(consumer, timeout_ms: int = 700) -> bool:
    try:
        m = consumer.receive(timeout_ms)
    except pulsar.Timeout:
        return True
    raise AssertionError(f"unexpected message {m.data()!r} {m.message_id()}")


def values(msgs) -> list[str]:
    return [m.data().decode() for m in msgs]


# ----------------------------------------------------------------------------- Exclusive

def test_exclusive_refuses_a_second_consumer_and_another_type(client, topic):
    """Exclusive: 'If more than one consumer attempts to subscribe to a topic using the same
    subscription, the consumer receives an error'
    (https://pulsar.apache.org/docs/concepts-messaging/#exclusive); a consumer of another type on an
    attached subscription gets 'Subscription is of different type' (ConsumerBusy,
    PersistentSubscription.addConsumerInternal); once detached, the subscription takes any type."""
    first = client.subscribe(topic, "ex")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "ex")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "ex", consumer_type=SHARED)
    first.close()
    again = client.subscribe(topic, "ex", consumer_type=SHARED)
    again.close()


# ----------------------------------------------------------------------------- Shared

def test_shared_dispatches_round_robin(client, topic):
    """Shared: 'messages are delivered in a round-robin distribution across consumers'
    (https://pulsar.apache.org/docs/concepts-messaging/#shared); PersistentDispatcherMultipleConsumers
    hands each read to the next consumer (getNextConsumer), so entries published one at a time
    alternate between two consumers with permits."""
    a = client.subscribe(topic, "sh", consumer_type=SHARED, consumer_name="a")
    b = client.subscribe(topic, "sh", consumer_type=SHARED, consumer_name="b")
    producer = client.create_producer(topic)
    for i in range(20):
        producer.send(f"{i}".encode())
        time.sleep(0.02)                          # each entry is read and dispatched on its own
    got_a = [int(v) for v in values(drain(a))]
    got_b = [int(v) for v in values(drain(b))]
    assert {tuple(got_a), tuple(got_b)} == {tuple(range(0, 20, 2)), tuple(range(1, 20, 2))}


def test_shared_dispatch_stays_within_each_consumers_permits(client, topic, admin):
    """Flow control: a consumer gets at most the permits it granted (its receiver queue); one that
    granted none gets nothing while the others take everything
    (https://pulsar.apache.org/docs/develop-binary-protocol/#flow-control,
    https://pulsar.apache.org/docs/concepts-clients/#receiver-queue)."""
    small = client.subscribe(topic, "sh", consumer_type=SHARED, consumer_name="small", receiver_queue_size=5)
    zero = client.subscribe(topic, "sh", consumer_type=SHARED, consumer_name="zero", receiver_queue_size=0)
    big = client.subscribe(topic, "sh", consumer_type=SHARED, consumer_name="big")
    producer = client.create_producer(topic)
    for i in range(50):
        producer.send(f"{i}".encode())
    got_big = drain(big, 1500)
    assert len(got_big) == 45
    stats = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/stats")["subscriptions"]["sh"]
    by_name = {c["consumerName"]: c for c in stats["consumers"]}
    assert by_name["zero"]["availablePermits"] == 0 and by_name["zero"]["unackedMessages"] == 0
    assert by_name["small"]["unackedMessages"] == 5 and by_name["small"]["availablePermits"] == 0
    got_small = receive_n(small, 5)
    assert sorted(int(v) for v in values(got_big + got_small)) == list(range(50))
    zero.close()


def test_shared_consumer_closing_hands_its_unacked_messages_to_the_others(client, topic):
    """Shared: messages a consumer did not acknowledge go to the remaining consumers when it
    leaves (PersistentDispatcherMultipleConsumers.removeConsumer: pending acks are added for
    replay, the redelivery tracker only `addIfAbsent`, so redelivery_count stays 0)
    (https://pulsar.apache.org/docs/concepts-messaging/#shared)."""
    a = client.subscribe(topic, "sh", consumer_type=SHARED, consumer_name="a")
    b = client.subscribe(topic, "sh", consumer_type=SHARED, consumer_name="b")
    producer = client.create_producer(topic)
    for i in range(10):
        producer.send(f"{i}".encode())
        time.sleep(0.02)
    held = drain(a)
    mine = drain(b)
    assert len(held) == 5 and len(mine) == 5
    for m in mine:
        b.acknowledge(m)
    a.close()
    again = receive_n(b, 5)
    assert sorted(values(again)) == sorted(values(held))
    assert [m.redelivery_count() for m in again] == [0] * 5
    assert [m.message_id() for m in again] == sorted(m.message_id() for m in held)
    assert nothing_more(b)


# ----------------------------------------------------------------------------- Failover

def expected_active(names: list[str], topic: str) -> str:
    """Pulsar's active consumer of a Failover subscription on a non-partitioned topic
    (AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer): consumers sorted by
    priority then name, 100 points each on a ring at Murmur3(name + i), the point at or after
    Murmur3(topic name) wins."""
    order = sorted(names)
    ring: dict[int, int] = {}
    for i, n in enumerate(order):
        for j in range(100):
            ring[pulsar_hash(f"{n}{j}")] = i
    h = pulsar_hash(topic)
    after = [p for p in sorted(ring) if p >= h]
    return order[ring[after[0] if after else min(ring)]]


def test_failover_active_consumer_is_chosen_as_pulsar_does_and_fails_over(client, topic):
    """Failover: one active consumer gets every message; when it leaves, the next one chosen takes
    over from the first unacknowledged message
    (https://pulsar.apache.org/docs/concepts-messaging/#failover). The choice is
    AbstractDispatcherSingleActiveConsumer's (consistent hashing on a non-partitioned topic), so it
    does not depend on the order consumers joined. Pulsar's single-active dispatcher keeps no
    redelivery count (RedeliveryTrackerDisabled)."""
    names = ["fo-a", "fo-b", "fo-c"]
    consumers = {n: client.subscribe(topic, "fo", consumer_type=FAILOVER, consumer_name=n)
                 for n in ("fo-c", "fo-a", "fo-b")}
    active = expected_active(names, topic)
    producer = client.create_producer(topic)
    for i in range(10):
        producer.send(f"{i}".encode())
    got = receive_n(consumers[active], 10)
    assert values(got) == [str(i) for i in range(10)]
    for n in names:
        if n != active:
            assert nothing_more(consumers[n], 300)
    for m in got[:5]:
        consumers[active].acknowledge(m)
    time.sleep(0.5)                               # acks are grouped for 100 ms by the client
    consumers.pop(active).close()
    nxt = expected_active(list(consumers), topic)
    again = receive_n(consumers[nxt], 5)
    assert values(again) == [str(i) for i in range(5, 10)]
    assert [m.redelivery_count() for m in again] == [0] * 5
    for n in consumers:
        if n != nxt:
            assert nothing_more(consumers[n], 300)


# ----------------------------------------------------------------------------- Key_Shared

def ring_owner(names: list[str], h: int) -> int:
    """Which of the consumers named `names` (in join order) owns hash slot h under Pulsar's default
    ConsistentHashingStickyKeyConsumerSelector (100 points per consumer at the sticky-key hash of
    name NUL 0 NUL i; a hash goes to the first point at or after it)."""
    points: dict[int, int] = {}
    for idx, name in enumerate(names):
        for i in range(100):
            points.setdefault(sticky_key_hash(f"{name}\0{0}\0{i}".encode()), idx)
    ring = sorted(points)
    return points[next((p for p in ring if p >= h), ring[0])]


def test_key_shared_routes_each_key_to_its_hash_range_owner_in_order(client, topic):
    """Key_Shared: 'messages with the same key are delivered to only one consumer', in order
    (https://pulsar.apache.org/docs/concepts-messaging/#key_shared); the sticky key is the ordering
    key, else the partition key, hashed with Murmur3_32 modulo 65536 and looked up on the consistent-
    hash ring of Pulsar's default selector (ConsistentHashingStickyKeyConsumerSelector,
    subscriptionKeySharedUseConsistentHashing=true; StickyKeyConsumerSelector.makeStickyKeyHash,
    Commands.peekStickyKey)."""
    names = ["k0", "k1", "k2"]
    consumers = [client.subscribe(topic, "ks", consumer_type=KEY_SHARED, consumer_name=f"k{i}")
                 for i in range(3)]
    producer = client.create_producer(topic)
    keys = [f"key-{i}" for i in range(30)]
    for r in range(5):
        for k in keys:
            producer.send_async(f"{k}:{r}".encode(), None, partition_key=k)
    # the ordering key wins over the partition key
    pairs = [(f"ok-{i}", f"pk-{j}") for i in range(40) for j in range(40)]
    split = next((o, p) for o, p in pairs if ring_owner(names, sticky_key_hash(o.encode()))
                 != ring_owner(names, sticky_key_hash(p.encode())))
    producer.send_async(b"ordering", None, partition_key=split[1], ordering_key=split[0])
    producer.flush()
    seen: dict[str, list[int]] = {}
    where: dict[str, set[int]] = {}
    total = 0
    deadline = time.time() + 30
    while total < 151 and time.time() < deadline:
        for idx, c in enumerate(consumers):
            for m in drain(c, 100):
                total += 1
                v = m.data().decode()
                if v == "ordering":
                    assert idx == ring_owner(names, sticky_key_hash(split[0].encode()))
                    continue
                k, r = v.split(":")
                seen.setdefault(k, []).append(int(r))
                where.setdefault(k, set()).add(idx)
                c.acknowledge(m)
    assert total == 151
    for k in keys:
        assert where[k] == {ring_owner(names, sticky_key_hash(k.encode()))}, k
        assert seen[k] == list(range(5)), k
    assert len({next(iter(w)) for w in where.values()}) == 3     # all three consumers got keys


def test_key_shared_new_consumer_gets_a_moved_key_only_after_earlier_messages_are_acked(client, topic):
    """Key_Shared ordering when consumers join: a key whose hash range moves to the newcomer is not
    delivered to it while the previous owner still holds unacknowledged messages of that key
    (https://pulsar.apache.org/docs/concepts-messaging/#preserving-order-of-processing, Pulsar 4's
    draining hashes, PIP-379); keys that stay put keep flowing."""
    moved = next(f"m-{i}" for i in range(100) if ring_owner(["a", "b"], sticky_key_hash(f"m-{i}".encode())) == 1)
    stays = next(f"s-{i}" for i in range(100) if ring_owner(["a", "b"], sticky_key_hash(f"s-{i}".encode())) == 0)
    a = client.subscribe(topic, "ks", consumer_type=KEY_SHARED, consumer_name="a")
    producer = client.create_producer(topic)
    for v, k in ((f"{moved}:0", moved), (f"{moved}:1", moved), (f"{stays}:0", stays)):
        producer.send(v.encode(), partition_key=k)
    held = {m.data().decode(): m for m in receive_n(a, 3)}
    b = client.subscribe(topic, "ks", consumer_type=KEY_SHARED, consumer_name="b")   # takes `moved`
    producer.send(f"{moved}:2".encode(), partition_key=moved)
    producer.send(f"{stays}:1".encode(), partition_key=stays)
    assert values(receive_n(a, 1)) == [f"{stays}:1"]
    assert nothing_more(b, 1000)
    a.acknowledge(held[f"{moved}:0"])
    assert nothing_more(b, 1000)                  # a still holds moved:1
    a.acknowledge(held[f"{moved}:1"])
    assert values(receive_n(b, 1)) == [f"{moved}:2"]
    # the previous owner leaving: the consumer taking its range gets what it held first, in order
    producer.send(f"{stays}:2".encode(), partition_key=stays)
    time.sleep(0.3)                               # delivered to a (its receiver queue), not acked
    a.close()
    producer.send(f"{stays}:3".encode(), partition_key=stays)
    again = receive_n(b, 4)
    assert values(again) == [f"{stays}:{i}" for i in range(4)]
    assert [m.redelivery_count() for m in again] == [0] * 4


def test_key_shared_out_of_order_delivery_skips_the_wait(client, topic):
    """Key_Shared with allowOutOfOrderDelivery: 'the broker can dispatch messages to a new consumer
    right away', without waiting for the previous owner's acknowledgements
    (https://pulsar.apache.org/docs/concepts-messaging/#key_shared, KeySharedPolicy
    setAllowOutOfOrderDelivery). Messages without a key share the key "NONE_KEY"
    (Commands.peekStickyKey) and so one consumer."""
    policy = pulsar.ConsumerKeySharedPolicy(allow_out_of_order_delivery=True)
    moved = next(f"m-{i}" for i in range(100) if ring_owner(["a", "b"], sticky_key_hash(f"m-{i}".encode())) == 1)
    a = client.subscribe(topic, "ooo", consumer_type=KEY_SHARED, key_shared_policy=policy, consumer_name="a")
    producer = client.create_producer(topic)
    producer.send(f"{moved}:0".encode(), partition_key=moved)
    assert values(receive_n(a, 1)) == [f"{moved}:0"]
    b = client.subscribe(topic, "ooo", consumer_type=KEY_SHARED, key_shared_policy=policy, consumer_name="b")
    producer.send(f"{moved}:1".encode(), partition_key=moved)
    assert values(receive_n(b, 1)) == [f"{moved}:1"]          # a still holds moved:0
    for i in range(5):
        producer.send(f"nokey:{i}".encode())
    owner = (a, b)[ring_owner(["a", "b"], sticky_key_hash(b"NONE_KEY"))]
    other = a if owner is b else b
    assert values(receive_n(owner, 5)) == [f"nokey:{i}" for i in range(5)]
    assert nothing_more(other, 500)


def test_key_shared_sticky_ranges_are_exclusive(client, topic):
    """Key_Shared STICKY: consumers declare their hash ranges; an overlapping declaration is refused
    with ConsumerAssignError ('Range conflict with consumer ...',
    HashRangeExclusiveStickyKeyConsumerSelector); a key goes to the consumer whose range holds its
    hash (https://pulsar.apache.org/docs/concepts-messaging/#key_shared)."""
    def policy(*ranges):
        return pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky,
                                              sticky_ranges=list(ranges))
    low = client.subscribe(topic, "st", consumer_type=KEY_SHARED, key_shared_policy=policy((0, 30000)))
    with pytest.raises(pulsar.ConsumerAssignError):
        client.subscribe(topic, "st", consumer_type=KEY_SHARED, key_shared_policy=policy((20000, 40000)))
    high = client.subscribe(topic, "st", consumer_type=KEY_SHARED, key_shared_policy=policy((30001, 65535)))
    # an AUTO_SPLIT consumer cannot join a STICKY subscription
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "st", consumer_type=KEY_SHARED)
    producer = client.create_producer(topic)
    keys = [f"key-{i}" for i in range(20)]
    for k in keys:
        producer.send(k.encode(), partition_key=k)
    got_low, got_high = set(values(drain(low))), set(values(drain(high)))
    assert got_low == {k for k in keys if sticky_key_hash(k.encode()) <= 30000}
    assert got_high == set(keys) - got_low


# ----------------------------------------------------------------------------- positions, unsubscribe

def test_initial_position_latest_and_earliest(client, topic):
    """A new subscription starts at the end of the topic (Latest, the client's default) or at its
    first message (Earliest) (https://pulsar.apache.org/docs/concepts-messaging/#subscription-modes,
    SubscriptionInitialPosition)."""
    producer = client.create_producer(topic)
    producer.send(b"old")
    latest = client.subscribe(topic, "latest")
    earliest = client.subscribe(topic, "earliest", initial_position=EARLIEST)
    producer.send(b"new")
    assert values(drain(latest)) == ["new"]
    assert values(drain(earliest)) == ["old", "new"]
    # an existing subscription keeps its position whatever the initial position asked later
    latest.close()
    again = client.subscribe(topic, "latest", initial_position=EARLIEST)
    producer.send(b"newer")
    assert values(drain(again)) == ["new", "newer"]      # "new" was never acknowledged


def test_unsubscribe_deletes_the_subscription(client, topic):
    """Unsubscribe deletes the subscription and its position; subscribing again under the same name
    starts from the initial position (https://pulsar.apache.org/docs/concepts-messaging/#subscriptions).
    Only its sole consumer may unsubscribe: 'Unconnected or shared consumer attempting to
    unsubscribe' (PersistentSubscription.doUnsubscribe, a MetadataError)."""
    producer = client.create_producer(topic)
    a = client.subscribe(topic, "u", consumer_type=SHARED, initial_position=EARLIEST)
    b = client.subscribe(topic, "u", consumer_type=SHARED)
    for i in range(3):
        producer.send(f"{i}".encode())
    with pytest.raises(pulsar.BrokerMetadataError):
        a.unsubscribe()
    b.close()
    for m in drain(a):
        a.acknowledge(m)
    time.sleep(0.3)
    a.unsubscribe()
    producer.send(b"3")
    fresh = client.subscribe(topic, "u", initial_position=EARLIEST)
    assert values(drain(fresh)) == ["0", "1", "2", "3"]        # the acknowledgements went with it
    fresh.unsubscribe()
    producer.send(b"4")
    latest = client.subscribe(topic, "u")
    producer.send(b"5")
    assert values(drain(latest)) == ["5"]
