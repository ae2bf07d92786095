"""Acknowledgements, redelivery and dead-letter topics, through the official client."""
from __future__ import annotations

import time
import uuid

import pulsar
import pytest

from tests.netns import netns_cluster, pulsar_client
from tests.conformance.test_subscriptions import EARLIEST, KEY_SHARED, SHARED, drain, nothing_more, \
    receive_n, values


def test_individual_acks_leave_only_the_unacknowledged_to_redeliver(client, topic):
    """Individual acknowledgement: only the acknowledged messages are consumed; a consumer that
    reconnects gets exactly the others again, in order
    (https://pulsar.apache.org/docs/concepts-messaging/#acknowledgment). 150 messages cross a
    ledger rollover (100 entries per ledger here). Exclusive: redelivery_count stays 0 (the single
    active consumer dispatcher has no redelivery tracker)."""
    c = client.subscribe(topic, "s")            # before publishing: retention is 0 here
    producer = client.create_producer(topic)
    for i in range(150):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    got = receive_n(c, 150)
    assert values(got) == [str(i) for i in range(150)]
    skipped = [i for i in range(150) if i % 7 == 3]
    for i, m in enumerate(got):
        if i not in skipped:
            c.acknowledge(m)
    time.sleep(0.5)
    c.close()
    c = client.subscribe(topic, "s", initial_position=EARLIEST)
    again = drain(c)
    assert values(again) == [str(i) for i in skipped]
    assert [m.redelivery_count() for m in again] == [0] * len(skipped)


def test_cumulative_ack_consumes_everything_up_to_the_message(client, topic):
    """Cumulative acknowledgement: 'the consumer only acknowledges the last message it received.
    All messages in the stream up to (and including) the provided message are not redelivered'
    (https://pulsar.apache.org/docs/concepts-messaging/#acknowledgment)."""
    producer = client.create_producer(topic)
    for i in range(10):
        producer.send(f"{i}".encode())
    for sub_type in (pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover):
        name = f"cum-{sub_type}"
        c = client.subscribe(topic, name, consumer_type=sub_type, initial_position=EARLIEST)
        got = receive_n(c, 10)
        c.acknowledge_cumulative(got[5])
        time.sleep(0.5)
        c.close()
        c = client.subscribe(topic, name, consumer_type=sub_type, initial_position=EARLIEST)
        assert values(drain(c)) == [str(i) for i in range(6, 10)]
        c.close()


def test_cumulative_ack_is_refused_on_shared_and_key_shared(client, topic):
    """'Cumulative acknowledgment cannot be used in Shared or Key_Shared subscription type'
    (https://pulsar.apache.org/docs/concepts-messaging/#acknowledgment): the client refuses it with
    CumulativeAcknowledgementNotAllowedError (and Pulsar's broker ignores one that gets through,
    tests/broker/test_consumer_wire.py); nothing is acknowledged."""
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(f"{i}".encode())
    for sub_type in (SHARED, KEY_SHARED):
        name = f"no-cum-{sub_type}"
        c = client.subscribe(topic, name, consumer_type=sub_type, initial_position=EARLIEST)
        got = receive_n(c, 3)
        with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
            c.acknowledge_cumulative(got[2])
        time.sleep(0.3)
        c.close()
        c = client.subscribe(topic, name, consumer_type=sub_type, initial_position=EARLIEST)
        assert values(drain(c)) == ["0", "1", "2"]
        c.close()


def test_negative_ack_redelivers_with_a_growing_redelivery_count(client, topic):
    """Negative acknowledgement: the message is redelivered after the nack delay
    (https://pulsar.apache.org/docs/concepts-messaging/#negative-acknowledgment); on a Shared
    subscription the broker counts each redelivery in CommandMessage.redelivery_count
    (InMemoryRedeliveryTracker)."""
    c = client.subscribe(topic, "nack", consumer_type=SHARED, negative_ack_redelivery_delay_ms=100)
    producer = client.create_producer(topic)
    sent = producer.send(b"x")
    counts = []
    for _ in range(3):
        m = c.receive(10000)
        assert m.message_id() == sent
        counts.append(m.redelivery_count())
        c.negative_acknowledge(m)
    m = c.receive(10000)
    counts.append(m.redelivery_count())
    c.acknowledge(m)
    assert counts == [0, 1, 2, 3]
    assert nothing_more(c, 1000)


def test_negative_ack_on_exclusive_redelivers_without_a_count(client, topic):
    """Exclusive/Failover: a redelivery request rewinds the active consumer
    (PersistentDispatcherSingleActiveConsumer.redeliverUnacknowledgedMessages); that dispatcher has
    no redelivery tracker (RedeliveryTrackerDisabled), so redelivery_count stays 0 - and dead-letter
    topics only work on Shared and Key_Shared subscriptions
    (https://pulsar.apache.org/docs/concepts-messaging/#dead-letter-topic)."""
    c = client.subscribe(topic, "ex", negative_ack_redelivery_delay_ms=100)
    producer = client.create_producer(topic)
    producer.send(b"a")
    producer.send(b"b")
    first = c.receive(10000)
    c.acknowledge(first)
    m = c.receive(10000)
    c.negative_acknowledge(m)
    again = c.receive(10000)
    assert (again.data(), again.redelivery_count()) == (b"b", 0)
    c.acknowledge(again)


def test_ack_timeout_redelivers_unacknowledged_messages(client, topic):
    """Acknowledgment timeout: a message not acknowledged within unacked_messages_timeout_ms is
    redelivered (https://pulsar.apache.org/docs/concepts-messaging/#acknowledgment-timeout), with
    its redelivery count raised on a Shared subscription."""
    c = client.subscribe(topic, "ackto", consumer_type=SHARED, unacked_messages_timeout_ms=10000)
    producer = client.create_producer(topic)
    producer.send(b"slow")
    producer.send(b"fast")
    got = {m.data(): m for m in receive_n(c, 2)}
    c.acknowledge(got[b"fast"])
    start = time.monotonic()
    again = c.receive(30000)
    assert (again.data(), again.redelivery_count()) == (b"slow", 1)
    assert time.monotonic() - start > 5           # not before the timeout (10 s, ticks of 1 s)
    c.acknowledge(again)


def test_dead_letter_topic_after_max_redeliveries(client, topic):
    """Dead-letter topic: after max_redeliver_count redeliveries the client publishes the message to
    <topic>-<subscription>-DLQ and acknowledges it; the broker supplies the redelivery count
    (https://pulsar.apache.org/docs/concepts-messaging/#dead-letter-topic)."""
    dlq = client.subscribe(f"{topic}-dl-DLQ", "inspect", initial_position=EARLIEST)
    c = client.subscribe(topic, "dl", consumer_type=SHARED, negative_ack_redelivery_delay_ms=100,
                         dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2))
    producer = client.create_producer(topic)
    sent = producer.send(b"poison")
    producer.send(b"fine")
    counts = []
    while True:
        try:
            m = c.receive(3000)
        except pulsar.Timeout:
            break
        if m.data() == b"fine":
            c.acknowledge(m)
            continue
        counts.append(m.redelivery_count())
        c.negative_acknowledge(m)
    assert counts == [0, 1, 2]
    dead = dlq.receive(10000)
    assert dead.data() == b"poison"
    assert dead.properties()["REAL_TOPIC"] == topic
    assert dead.properties()["ORIGIN_MESSAGE_ID"] == str(sent)
    # the original is acknowledged: the subscription does not get it back
    c.close()
    c = client.subscribe(topic, "dl", consumer_type=SHARED)
    assert nothing_more(c, 1000)


def _batch_then_partial_ack(client, topic: str) -> list[str]:
    """Publish one 10-message batch, acknowledge its first 4 messages with batch-index acks
    enabled in the client, reconnect: what comes back."""
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                      batching_max_publish_delay_ms=2000)
    for i in range(10):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    c = client.subscribe(topic, "bi", consumer_type=SHARED, initial_position=EARLIEST,
                         batch_index_ack_enabled=True)
    got = receive_n(c, 10)
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 1
    for m in got[:4]:
        c.acknowledge(m)
    time.sleep(0.5)
    c.close()
    c = client.subscribe(topic, "bi", consumer_type=SHARED, initial_position=EARLIEST,
                         batch_index_ack_enabled=True)
    back = values(drain(c))
    c.close()
    return back


def test_partial_batch_acks_are_ignored_by_default(client, topic):
    """A batch is one entry: without the broker's acknowledgmentAtBatchIndexLevelEnabled (off by
    default) it is acknowledged only as a whole, so after a reconnect all of it comes back
    (https://pulsar.apache.org/docs/concepts-messaging/#batching)."""
    assert _batch_then_partial_ack(client, topic) == [str(i) for i in range(10)]


@pytest.fixture(scope="module")
def batch_ack_cluster():
    with netns_cluster("ba", brokers=1, bookies=2, zookeepers=1, ensemble=2, write_quorum=2, ack_quorum=2,
                       broker_config={"acknowledgment_at_batch_index_level_enabled": True}) as c:
        yield c


def test_batch_index_acks_when_the_broker_enables_them(batch_ack_cluster):
    """Batch index acknowledgement (PIP-54): with acknowledgmentAtBatchIndexLevelEnabled the broker
    keeps which messages of a batch were acknowledged and sends that ack_set with the redelivered
    batch; the client skips those, so only the 6 unacknowledged messages come back
    (https://pulsar.apache.org/docs/concepts-messaging/#batching)."""
    with pulsar_client(batch_ack_cluster.service_url) as client:
        topic = f"persistent://public/default/bi-{uuid.uuid4().hex[:8]}"
        assert _batch_then_partial_ack(client, topic) == [str(i) for i in range(4, 10)]
