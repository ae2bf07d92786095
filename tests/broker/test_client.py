"""The broker's protocol side against the official `pulsar-client`, over the in-memory ManagedLedger."""
from __future__ import annotations

import threading
import time

import pulsar
import pytest

EARLIEST = pulsar.InitialPosition.Earliest


def send_all(producer, payloads: list[bytes], timeout: float = 30.0) -> list:
    """send_async everything, wait for all callbacks; returns the message ids in send order."""
    ids: list = [None] * len(payloads)
    errors: list = []
    done = threading.Event()
    left = [len(payloads)]
    lock = threading.Lock()

    def cb_for(i):
        def cb(res, mid):
            if res != pulsar.Result.Ok:
                errors.append(res)
            ids[i] = mid
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()
        return cb

    for i, p in enumerate(payloads):
        producer.send_async(p, cb_for(i))
    producer.flush()
    assert done.wait(timeout), f"{left[0]} sends outstanding"
    assert not errors, errors[:5]
    return ids


def receive_n(consumer, n: int, timeout_ms: int = 10000) -> list:
    return [consumer.receive(timeout_ms) for _ in range(n)]


def assert_no_more(consumer, timeout_ms: int = 300) -> None:
    with pytest.raises(pulsar.Timeout):
        m = consumer.receive(timeout_ms)
        pytest.fail(f"unexpected message {m.data()!r} {m.message_id()}")


def test_unbatched_produce_and_consume_in_order(client, topic, broker):
    producer = client.create_producer(topic, block_if_queue_full=True)
    payloads = [f"m-{i}".encode() for i in range(3000)]
    ids = send_all(producer, payloads)
    assert all(i.batch_index() == -1 for i in ids)
    assert [(i.ledger_id(), i.entry_id()) for i in ids] == sorted((i.ledger_id(), i.entry_id()) for i in ids)
    assert len({(i.ledger_id(), i.entry_id()) for i in ids}) == len(ids)

    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST)
    got = receive_n(consumer, len(payloads))
    assert [m.data() for m in got] == payloads
    assert [str(m.message_id()) for m in got] == [str(i) for i in ids]
    assert all(m.redelivery_count() == 0 for m in got)
    for m in got:
        consumer.acknowledge(m)
    assert_no_more(consumer)
    consumer.close()
    # everything acknowledged: the cursor reached the last entry
    ml = broker.service.mls[topic]
    last = ids[-1]
    deadline = time.time() + 5
    while time.time() < deadline:
        md = ml.storage.cursors[ml.name]["sub"]
        if md is not None and (md.ledger_id, md.entry_id) >= (last.ledger_id(), last.entry_id()):
            break
        time.sleep(0.05)
    assert (md.ledger_id, md.entry_id) == (last.ledger_id(), last.entry_id())


def test_batched_produce_and_consume(client, topic):
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                      batching_max_publish_delay_ms=5, block_if_queue_full=True)
    payloads = [f"b-{i}".encode() for i in range(5000)]
    ids = send_all(producer, payloads)
    assert any(i.batch_index() > 0 for i in ids)
    entries = {(i.ledger_id(), i.entry_id()) for i in ids}
    assert len(entries) < len(ids) / 10            # really batched

    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST, receiver_queue_size=1000)
    got = receive_n(consumer, len(payloads))
    assert [m.data() for m in got] == payloads
    assert [str(m.message_id()) for m in got] == [str(i) for i in ids]
    consumer.acknowledge_cumulative(got[-1])
    assert_no_more(consumer)
    consumer.close()
    # resubscribing after the cumulative ack: nothing left
    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST)
    assert_no_more(consumer, 500)


def test_latest_subscription_sees_only_new_messages(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    send_all(producer, [b"old-1", b"old-2"])
    consumer = client.subscribe(topic, "late")          # Python's default: Latest
    producer.send(b"new")
    assert consumer.receive(5000).data() == b"new"
    assert_no_more(consumer)


def test_reader_from_earliest_and_from_an_id(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    payloads = [f"r-{i}".encode() for i in range(200)]
    ids = send_all(producer, payloads)

    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(5000).data())
    assert got == payloads
    reader.close()

    reader = client.create_reader(topic, ids[99])               # exclusive of the start id
    assert reader.read_next(5000).data() == payloads[100]
    reader.close()
    reader = client.create_reader(topic, ids[99], start_message_id_inclusive=True)
    assert reader.read_next(5000).data() == payloads[99]
    reader.close()
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    assert not reader.has_message_available()
    producer.send(b"after")
    assert reader.read_next(5000).data() == b"after"
    reader.close()


def test_reader_on_a_batched_topic_from_a_batch_id(client, topic):
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                      batching_max_publish_delay_ms=50)
    payloads = [f"x-{i}".encode() for i in range(50)]
    ids = send_all(producer, payloads)
    mid = next(i for i in ids if i.batch_index() == 4)
    k = ids.index(mid)
    reader = client.create_reader(topic, mid)
    assert reader.read_next(5000).data() == payloads[k + 1]


def test_unacked_messages_are_redelivered_on_resubscribe(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    payloads = [f"u-{i}".encode() for i in range(20)]
    send_all(producer, payloads)
    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST)
    got = receive_n(consumer, 20)
    for m in got[:10]:
        consumer.acknowledge(m)
    consumer.acknowledge(got[15])
    time.sleep(0.3)                           # the client groups acks for 100 ms
    consumer.close()

    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST)
    again = receive_n(consumer, 9)
    assert [m.data() for m in again] == [payloads[i] for i in (10, 11, 12, 13, 14, 16, 17, 18, 19)]
    # Exclusive: Pulsar's single-active dispatcher keeps no redelivery counts
    assert all(m.redelivery_count() == 0 for m in again)
    assert_no_more(consumer)


def test_redeliver_unacknowledged_and_negative_ack(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    send_all(producer, [b"a", b"b", b"c"])
    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST, negative_ack_redelivery_delay_ms=100)
    got = receive_n(consumer, 3)
    consumer.acknowledge(got[0])
    consumer.negative_acknowledge(got[1])
    again = consumer.receive(5000)
    # Exclusive: the client asks for everything unacked (b and c) again; no redelivery count
    assert again.data() in (b"b", b"c") and again.redelivery_count() == 0


def test_shared_subscription_splits_and_redelivers(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    payloads = [f"s-{i}".encode() for i in range(400)]
    send_all(producer, payloads)
    c1 = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared,
                          initial_position=EARLIEST, receiver_queue_size=10)
    c2 = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared,
                          initial_position=EARLIEST, receiver_queue_size=10)
    seen: list[bytes] = []
    counts = {1: 0, 2: 0}
    deadline = time.time() + 20
    while len(seen) < len(payloads) and time.time() < deadline:
        for k, c in ((1, c1), (2, c2)):
            try:
                m = c.receive(50)
            except pulsar.Timeout:
                continue
            seen.append(m.data())
            counts[k] += 1
            c.acknowledge(m)
    assert sorted(seen) == sorted(payloads)
    assert counts[1] > 0 and counts[2] > 0
    # an exclusive consumer is refused while shared consumers are attached
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Exclusive)


def test_exclusive_subscription_refuses_a_second_consumer(client, topic):
    client.subscribe(topic, "ex")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "ex")


def test_failover_switches_to_the_standby(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    c1 = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover,
                          initial_position=EARLIEST, consumer_name="a")
    c2 = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover,
                          initial_position=EARLIEST, consumer_name="b")
    # Pulsar's choice for a non-partitioned topic: a consistent-hash ring of the consumer names
    from types import SimpleNamespace
    from clusters.broker.selectors import pick_active
    if pick_active([SimpleNamespace(name=n, priority=0) for n in "ab"], topic).name == "b":
        c1, c2 = c2, c1
    send_all(producer, [f"f-{i}".encode() for i in range(10)])
    got = receive_n(c1, 10)
    for m in got[:5]:
        c1.acknowledge(m)
    assert_no_more(c2)
    time.sleep(0.3)
    c1.close()
    again = receive_n(c2, 5)
    assert [m.data() for m in again] == [f"f-{i}".encode() for i in range(5, 10)]


def test_broker_closing_the_topic_is_transparent(client, topic, broker):
    producer = client.create_producer(topic, send_timeout_millis=20000, block_if_queue_full=True)
    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST)
    first = [f"c-{i}".encode() for i in range(100)]
    send_all(producer, first)
    got = receive_n(consumer, 50)
    for m in got:
        consumer.acknowledge(m)
    time.sleep(0.3)
    broker.call(broker.service.unload(topic))          # CLOSE_PRODUCER / CLOSE_CONSUMER
    second = [f"d-{i}".encode() for i in range(100)]
    ids = send_all(producer, second)                     # reconnects, new ledger
    assert ids[-1].ledger_id() != got[0].message_id().ledger_id()
    rest = receive_n(consumer, 150)
    datas = [m.data() for m in rest]
    assert datas == first[50:] + second      # (redelivery counts are per topic load, like Pulsar's)
    for m in rest:
        consumer.acknowledge(m)
    assert_no_more(consumer)


def test_new_producers_are_refused_while_not_served(client, topic, broker):
    broker.service.serving = False
    try:
        with pytest.raises((pulsar.Timeout, pulsar.ServiceUnitNotReady)):
            pulsar.Client(broker.url, operation_timeout_seconds=2,
                          logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)).create_producer(topic)
    finally:
        broker.service.serving = True


def test_persistence_error_makes_the_client_resend(client, topic, broker):
    producer = client.create_producer(topic, block_if_queue_full=True)
    producer.send(b"before")
    broker.run(lambda: setattr(broker.service.mls[topic], "fail_adds", 1))
    ids = send_all(producer, [b"p-0", b"p-1", b"p-2"])   # SEND_ERROR -> reconnect -> resend
    assert len(ids) == 3
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(5000).data())
    assert got[0] == b"before" and set(got[1:]) == {b"p-0", b"p-1", b"p-2"}


def test_fenced_ledger_closes_the_topic(client, topic, broker):
    producer = client.create_producer(topic, send_timeout_millis=10000)
    producer.send(b"one")
    old_ml = broker.service.mls[topic]
    broker.run(lambda: setattr(old_ml, "fenced", True))
    mid = producer.send(b"two")       # fenced add -> topic closed -> reconnect to the reloaded topic
    assert topic in broker.service.fenced_topics
    assert broker.service.mls[topic] is not old_ml
    assert mid.ledger_id() != 3
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(5000).data())
    assert got == [b"one", b"two"]


def test_seek_by_message_id_and_by_time(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    payloads = [f"k-{i}".encode() for i in range(30)]
    ids = []
    for i, p in enumerate(payloads):
        ids.append(producer.send(p))
        if i == 19:
            time.sleep(0.05)
            mark = int(time.time() * 1000)
            time.sleep(0.05)
    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST)
    got = receive_n(consumer, 30)
    for m in got:
        consumer.acknowledge(m)
    consumer.seek(ids[9])                   # delivery resumes after the seek id
    again = receive_n(consumer, 20)
    assert [m.data() for m in again] == payloads[10:]
    consumer.seek(mark)
    again = receive_n(consumer, 10)
    assert [m.data() for m in again] == payloads[20:]
    consumer.seek(pulsar.MessageId.earliest)
    assert consumer.receive(5000).data() == payloads[0]


def test_get_last_message_id(client, topic):
    consumer = client.subscribe(topic, "sub")
    last = consumer.get_last_message_id()
    assert last.entry_id() == -1
    producer = client.create_producer(topic, block_if_queue_full=True)
    mid = producer.send(b"x")
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (mid.ledger_id(), mid.entry_id())
    batched = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=20)
    ids = send_all(batched, [b"1", b"2", b"3"])
    last = consumer.get_last_message_id()
    assert (last.entry_id(), last.batch_index()) == (ids[-1].entry_id(), ids[-1].batch_index())


def test_message_ids_of_a_partition_name_it(client, topic):
    """A `-partition-N` topic's MESSAGEs carry partition N in their MessageIdData (Pulsar's
    Consumer.partitionIdx), as its GET_LAST_MESSAGE_ID answer does: the client compares the two with
    an == that includes the partition, so a reader whose ids lacked it saw has_message_available()
    stay true after reading everything. A non-partitioned topic's ids keep -1."""
    part = topic + "-partition-2"
    producer = client.create_producer(part)
    ids = [producer.send(f"v-{i}".encode()) for i in range(5)]
    # the producer of a topic the client does not know as partitioned: -1 (the client sets it)
    assert [i.partition() for i in ids] == [-1] * 5
    consumer = client.subscribe(part, "sub", initial_position=EARLIEST)
    got = receive_n(consumer, 5)
    assert [m.message_id().partition() for m in got] == [2] * 5
    assert [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got] == \
        [(i.ledger_id(), i.entry_id()) for i in ids]
    assert pulsar.MessageId.deserialize(got[0].message_id().serialize()).partition() == 2
    assert consumer.get_last_message_id() == got[-1].message_id()
    consumer.acknowledge(got[0])
    consumer.seek(got[1].message_id())          # delivery resumes after the seek id
    assert [m.data() for m in receive_n(consumer, 3)] == [b"v-2", b"v-3", b"v-4"]
    reader = client.create_reader(part, pulsar.MessageId.earliest)
    read = [reader.read_next(5000) for _ in range(5)]
    assert [m.message_id().partition() for m in read] == [2] * 5
    assert not reader.has_message_available()
    reader.seek(read[2].message_id())
    assert reader.read_next(5000).message_id() == read[3].message_id()

    plain = client.subscribe(topic, "sub", initial_position=EARLIEST)
    mid = client.create_producer(topic).send(b"x")
    m = plain.receive(5000)
    assert (mid.partition(), m.message_id().partition()) == (-1, -1)
    assert plain.get_last_message_id() == m.message_id()


def test_unsubscribe_deletes_the_subscription(client, topic, broker):
    producer = client.create_producer(topic, block_if_queue_full=True)
    send_all(producer, [b"1", b"2"])
    consumer = client.subscribe(topic, "gone", initial_position=EARLIEST)
    receive_n(consumer, 2)
    consumer.unsubscribe()
    ml = broker.service.mls[topic]
    assert "gone" not in ml.storage.cursors.get(ml.name, {})
    consumer = client.subscribe(topic, "gone", initial_position=EARLIEST)
    assert consumer.receive(5000).data() == b"1"


def test_producer_names_and_busy_names(client, topic):
    p = client.create_producer(topic, block_if_queue_full=True)
    assert p.producer_name()
    named = client.create_producer(topic, producer_name="fixed")
    assert named.producer_name() == "fixed"
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic, producer_name="fixed")
    named.close()
    client.create_producer(topic, producer_name="fixed").close()


def test_large_message(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    big = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    producer.send(big)
    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST)
    assert consumer.receive(10000).data() == big


def test_connection_drop_redelivers_what_was_not_acknowledged(client, topic, broker):
    producer = client.create_producer(topic, block_if_queue_full=True)
    send_all(producer, [f"q-{i}".encode() for i in range(10)])
    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST)
    got = receive_n(consumer, 10)
    for m in got[:4]:
        consumer.acknowledge(m)
    time.sleep(0.3)
    broker.run(lambda: [c.abort() for c in list(broker.service.connections)])
    again = receive_n(consumer, 6, timeout_ms=15000)
    assert [m.data() for m in again] == [f"q-{i}".encode() for i in range(4, 10)]
    assert all(m.redelivery_count() == 0 for m in again)      # Exclusive: no redelivery tracker
    producer.send(b"after")                       # the producer reconnected too
    assert consumer.receive(5000).data() == b"after"


def test_key_shared_keeps_a_key_on_one_consumer(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    c1 = client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, initial_position=EARLIEST)
    c2 = client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, initial_position=EARLIEST)
    for i in range(200):
        producer.send_async(f"{i}".encode(), None, partition_key=f"key-{i % 10}")
    producer.flush()
    owners: dict[str, set[int]] = {}
    order: dict[str, list[int]] = {}
    n = 0
    deadline = time.time() + 15
    while n < 200 and time.time() < deadline:
        for k, c in ((1, c1), (2, c2)):
            while True:
                try:
                    m = c.receive(20)
                except pulsar.Timeout:
                    break
                owners.setdefault(m.partition_key(), set()).add(k)
                order.setdefault(m.partition_key(), []).append(int(m.data()))
                c.acknowledge(m)
                n += 1
    assert n == 200
    assert all(len(v) == 1 for v in owners.values())
    assert all(v == sorted(v) for v in order.values())


def test_reader_seek(client, topic):
    producer = client.create_producer(topic, block_if_queue_full=True)
    payloads = [f"v-{i}".encode() for i in range(20)]
    ids = []
    for i, p in enumerate(payloads):
        ids.append(producer.send(p))
        if i == 11:
            time.sleep(0.05)
            mark = int(time.time() * 1000)
            time.sleep(0.05)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [reader.read_next(5000).data() for _ in range(20)] == payloads
    reader.seek(ids[5])
    assert reader.read_next(5000).data() == payloads[6]
    reader.seek(mark)
    assert reader.read_next(5000).data() == payloads[12]
