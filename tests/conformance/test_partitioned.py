"""Partitioned topics and pattern subscriptions, through the official client and the admin API."""
from __future__ import annotations

import re
import time
from collections import Counter, defaultdict

import pulsar

from tests.conformance.conftest import owner_of, rest_path


def _partitioned(admin, topic: str, n: int) -> None:
    status, body = admin.put(f"/admin/v2/{rest_path(topic)}/partitions", n)
    assert status == 204, (status, body)


def _receive_all(consumer, n: int, timeout_ms: int = 10000) -> list:
    got = []
    for _ in range(n):
        m = consumer.receive(timeout_ms)
        consumer.acknowledge(m)
        got.append(m)
    return got


def test_partitioned_metadata_and_round_robin_over_every_partition(client, admin, namespace):
    """https://pulsar.apache.org/docs/concepts-messaging/#partitioned-topics: a partitioned topic is N
    internal topics `<topic>-partition-<i>`; the client learns N from PARTITIONED_METADATA, a producer
    with the default RoundRobinPartition mode spreads keyless messages over the partitions
    (https://pulsar.apache.org/docs/concepts-messaging/#routing-modes) and a consumer of the topic
    receives from every partition. REST: PUT /admin/v2/persistent/{t}/{ns}/{topic}/partitions
    (https://pulsar.apache.org/admin-rest-api/#operation/createPartitionedTopic)."""
    topic = f"persistent://{namespace}/rr"
    _partitioned(admin, topic, 4)
    assert admin.ok("GET", f"/admin/v2/{rest_path(topic)}/partitions") == {"partitions": 4}
    assert admin.ok("GET", f"/admin/v2/{rest_path(topic)}-partition-2/partitions") == {"partitions": 0}
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"v{i}".encode()) for i in range(40)]
    assert sorted({m.partition() for m in ids}) == [0, 1, 2, 3]
    got = _receive_all(consumer, 40)
    assert sorted(m.data().decode() for m in got) == sorted(f"v{i}" for i in range(40))
    per_partition = Counter(m.topic_name() for m in got)
    assert per_partition == {f"{topic}-partition-{i}": 10 for i in range(4)}, per_partition
    # each partition is its own topic with its own managed ledger and stats
    for i in range(4):
        st = admin.ok("GET", f"/admin/v2/{rest_path(topic)}-partition-{i}/stats")
        assert st["msgInCounter"] == 10, (i, st["msgInCounter"])
    total = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/partitioned-stats")
    assert total["metadata"] == {"partitions": 4} and total["msgInCounter"] == 40
    assert sorted(total["partitions"]) == [f"{topic}-partition-{i}" for i in range(4)]
    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(4)]


def test_message_ids_carry_their_partition(client, admin, namespace, topic):
    """A message of partition N has `message_id().partition() == N`: Pulsar's broker puts the
    partition index in the MessageIdData of every MESSAGE it sends (Consumer.java's partitionIdx, from
    the `-partition-N` topic name, in Commands.newMessageCommand) and the C++ client takes the id from
    there; send receipts carry no partition (Commands.newSendReceiptCommand), the client's producer of
    partition N sets it (ProducerImpl::ackReceived). Acknowledgements and redeliveries still work on
    those ids, and `serialize()` keeps the partition. A non-partitioned topic's ids keep -1."""
    part = f"persistent://{namespace}/ids"
    _partitioned(admin, part, 3)
    consumer = client.subscribe(part, "s", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest,
                                negative_ack_redelivery_delay_ms=100)
    producer = client.create_producer(part, batching_enabled=False)
    sent = {f"v{i}": producer.send(f"v{i}".encode()).partition() for i in range(30)}
    assert Counter(sent.values()) == {0: 10, 1: 10, 2: 10}

    def partition_of(m) -> int:
        name = m.topic_name()
        assert name.startswith(f"{part}-partition-"), name
        return int(name.rsplit("-partition-", 1)[1])

    got = [consumer.receive(10000) for _ in range(30)]
    assert sorted(m.data().decode() for m in got) == sorted(sent)
    first_id = {}
    for m in got:
        p = partition_of(m)
        mid = m.message_id()
        assert (mid.partition(), sent[m.data().decode()]) == (p, p), (str(mid), m.topic_name())
        assert pulsar.MessageId.deserialize(mid.serialize()).partition() == p
        first_id[m.data().decode()] = str(mid)
    # ack half, negatively ack the other half: exactly that half comes back, on the same ids
    nacked = set()
    for i, m in enumerate(got):
        if i % 2:
            consumer.negative_acknowledge(m)
            nacked.add(m.data().decode())
        else:
            consumer.acknowledge(m)
    again = [consumer.receive(10000) for _ in range(len(nacked))]
    assert sorted(m.data().decode() for m in again) == sorted(nacked)
    for m in again:
        assert m.redelivery_count() >= 1
        assert m.message_id().partition() == partition_of(m) == sent[m.data().decode()]
        assert str(m.message_id()) == first_id[m.data().decode()]
        consumer.acknowledge(m)
    try:
        extra = consumer.receive(1000)
        raise AssertionError(f"unexpected {extra.data()!r} {extra.message_id()} after every ack")
    except pulsar.Timeout:
        pass
    consumer.close()
    # the acknowledgements reached the brokers: nothing is left for the subscription
    consumer = client.subscribe(part, "s", consumer_type=pulsar.ConsumerType.Shared)
    try:
        extra = consumer.receive(1000)
        raise AssertionError(f"acknowledged {extra.data()!r} {extra.message_id()} came back")
    except pulsar.Timeout:
        pass
    consumer.close()

    # a non-partitioned topic: -1 in receipts, deliveries and serialized ids
    plain = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    ids = [client.create_producer(topic).send(b"x").partition()]
    m = plain.receive(10000)
    ids += [m.message_id().partition(), pulsar.MessageId.deserialize(m.message_id().serialize()).partition()]
    assert ids == [-1, -1, -1]
    plain.acknowledge(m)


def test_key_routing_sends_each_key_to_one_partition_in_order(client, admin, namespace):
    """https://pulsar.apache.org/docs/concepts-messaging/#routing-modes: a message with a key goes to
    the partition of the key's hash, so all messages of a key land in one partition, in order."""
    topic = f"persistent://{namespace}/keys"
    _partitioned(admin, topic, 3)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"k{j}" for j in range(8)]
    for i in range(80):
        producer.send(f"{keys[i % 8]}:{i}".encode(), partition_key=keys[i % 8])
    got = _receive_all(consumer, 80)
    where: dict[str, set[str]] = defaultdict(set)
    order: dict[str, list[int]] = defaultdict(list)
    for m in got:
        key, i = m.data().decode().split(":")
        assert m.partition_key() == key
        where[key].add(m.topic_name())
        order[key].append(int(i))
    assert all(len(ps) == 1 for ps in where.values()), dict(where)
    assert all(seq == sorted(seq) and len(seq) == 10 for seq in order.values())


def test_partitions_are_owned_independently(client, admin, namespace):
    """https://pulsar.apache.org/docs/concepts-messaging/#partitioned-topics: "partitions are spread
    across brokers": each partition is looked up on its own and may be served by a different broker.
    Here two partitions in different bundles are given to different brokers (an authoritative lookup
    asked of a broker makes it the owner of an unowned bundle), and a producer and a consumer of the
    partitioned topic work across both."""
    topic = f"persistent://{namespace}/spread"
    n = 8
    _partitioned(admin, topic, n)
    names = [f"{topic}-partition-{i}" for i in range(n)]
    bundle = {p: admin.ok("GET", f"/lookup/v2/topic/{rest_path(p)}/bundle") for p in names}
    first = names[0]
    other = next(p for p in names if bundle[p] != bundle[first])
    admin.ok("GET", f"/lookup/v2/topic/{rest_path(first)}?authoritative=true", broker=0)
    admin.ok("GET", f"/lookup/v2/topic/{rest_path(other)}?authoritative=true", broker=1)
    owners = {p: owner_of(admin, p) for p in names}
    assert owners[first] != owners[other], owners
    # the bundle owners the admin API reports agree with the lookups
    listed = admin.ok("GET", f"/admin/v2/namespaces/{namespace}/bundles")["owners"]
    brokers = {n.name: f"{n.host}" for n in admin.cluster.nodes("broker")}
    for p in names:
        assert listed[bundle[p]].split(":")[0] == brokers[owners[p]]
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n * 5):
        producer.send(f"v{i}".encode())
    got = _receive_all(consumer, n * 5)
    assert Counter(m.topic_name() for m in got) == {p: 5 for p in names}
    for p in (first, other):
        assert admin.ok("GET", f"/admin/v2/{rest_path(p)}/stats")["broker"] == owners[p]


def test_pattern_subscription_sees_the_topics_of_the_namespace(client, admin, namespace):
    """https://pulsar.apache.org/docs/concepts-messaging/#multi-topic-subscriptions: a consumer
    subscribed with a regular expression gets the messages of every matching topic of the namespace;
    the client lists them with GET_TOPICS_OF_NAMESPACE (partitions listed one by one, as
    `GET /admin/v2/namespaces/{t}/{ns}/topics` does)."""
    ns = namespace
    plain = [f"persistent://{ns}/foo-a", f"persistent://{ns}/foo-b", f"persistent://{ns}/bar-c"]
    part = f"persistent://{ns}/foo-p"
    _partitioned(admin, part, 2)
    for t in plain:
        p = client.create_producer(t)
        p.send(t.rsplit("/", 1)[1].encode())
        p.close()
    p = client.create_producer(part, batching_enabled=False)
    p.send(b"foo-p:0")
    p.send(b"foo-p:1")
    p.close()
    listed = admin.ok("GET", f"/admin/v2/namespaces/{ns}/topics")
    assert listed == sorted(plain + [f"{part}-partition-0", f"{part}-partition-1"])
    assert admin.ok("GET", f"/admin/v2/persistent/{ns}") == listed
    assert admin.ok("GET", f"/admin/v2/persistent/{ns}/partitioned") == [part]

    consumer = client.subscribe(re.compile(f"persistent://{ns}/foo-.*"), "pat",
                                initial_position=pulsar.InitialPosition.Earliest)
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 4 and time.monotonic() < deadline:
        try:
            m = consumer.receive(2000)
        except pulsar.Timeout:
            continue
        consumer.acknowledge(m)
        got.append((m.topic_name(), m.data().decode()))
    assert sorted(d for _, d in got) == ["foo-a", "foo-b", "foo-p:0", "foo-p:1"], got
    with_bar = [t for t, _ in got if "bar-c" in t]
    assert with_bar == []
    try:
        extra = consumer.receive(1500)
        raise AssertionError(f"unexpected message from {extra.topic_name()}")
    except pulsar.Timeout:
        pass
    consumer.close()


# Not tested here: topics created after a pattern subscription are picked up at the client's next
# re-listing, which the Python client (3.13) does only every 60 s whatever pattern_auto_discovery_period
# says (checked by hand: the second GET_TOPICS_OF_NAMESPACE arrives 60 s after the first).
