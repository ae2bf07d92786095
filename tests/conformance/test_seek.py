"""Seek by message id and by publish time, through the official client."""
from __future__ import annotations

import time

import pulsar

from tests.conformance.test_subscriptions import EARLIEST, SHARED, drain, receive_n, values


def _publish(client, topic: str, n: int, gap_at: int | None = None) -> list:
    """n messages "0".."n-1" (a 50 ms pause before message `gap_at`); returns their ids."""
    producer = client.create_producer(topic)
    ids = []
    for i in range(n):
        if i == gap_at:
            time.sleep(0.05)
        ids.append(producer.send(f"{i}".encode()))
    producer.close()
    return ids


def test_seek_to_a_message_id_resets_the_subscription(client, topic):
    """consumer.seek(message_id) resets the subscription's cursor to that message: what was acked
    after it is delivered again (https://pulsar.apache.org/docs/concepts-messaging/#seek, Java's
    order in PersistentSubscription.resetCursor: disconnect consumers, reset, reconnect). The broker
    restarts at the id itself; the C++ client then drops that one message unless the consumer was
    created with start_message_id_inclusive."""
    c = client.subscribe(topic, "s")
    inclusive = client.subscribe(topic, "incl", start_message_id_inclusive=True)
    ids = _publish(client, topic, 10)
    for consumer in (c, inclusive):
        for m in receive_n(consumer, 10):
            consumer.acknowledge(m)
    time.sleep(0.3)
    c.seek(ids[3])
    again = drain(c)
    assert values(again) == [str(i) for i in range(4, 10)]
    assert [m.redelivery_count() for m in again] == [0] * 6
    inclusive.seek(ids[3])
    assert values(drain(inclusive)) == [str(i) for i in range(3, 10)]
    # the subscription stays usable: new messages follow
    producer = client.create_producer(topic)
    producer.send(b"10")
    assert values(drain(c)) == ["10"]


def test_seek_to_earliest_and_latest(client, topic):
    """MessageId.earliest and MessageId.latest as seek targets: the first message of the topic, or
    after the last one (https://pulsar.apache.org/docs/concepts-messaging/#seek)."""
    c = client.subscribe(topic, "s")
    _publish(client, topic, 5)
    for m in receive_n(c, 5):
        c.acknowledge(m)
    c.seek(pulsar.MessageId.earliest)
    assert values(drain(c)) == [str(i) for i in range(5)]
    c.seek(pulsar.MessageId.latest)
    assert drain(c, 700) == []
    producer = client.create_producer(topic)
    producer.send(b"5")
    assert values(drain(c)) == ["5"]


def test_seek_by_publish_time(client, topic):
    """consumer.seek(timestamp) resets to the first message published at or after the timestamp
    (PersistentMessageFinder finds the newest entry published before it,
    MessageImpl.isEntryPublishedEarlierThan: entryTimestamp < timestamp, and resets after it)
    (https://pulsar.apache.org/docs/concepts-messaging/#seek)."""
    c = client.subscribe(topic, "s")
    _publish(client, topic, 10, gap_at=6)
    got = receive_n(c, 10)
    for m in got:
        c.acknowledge(m)
    stamps = [m.publish_timestamp() for m in got]
    assert stamps == sorted(stamps) and stamps[6] > stamps[5]
    c.seek(stamps[6])
    assert values(drain(c)) == [str(i) for i in range(6, 10)]
    c.seek(stamps[-1] + 1)                         # after the last message: nothing
    assert drain(c, 700) == []
    c.seek(0)                                      # before the first: everything
    assert values(drain(c)) == [str(i) for i in range(10)]


def test_seek_on_a_shared_subscription_resets_it_for_every_consumer(client, topic):
    """A seek resets the subscription, not one consumer: every consumer of a Shared subscription is
    disconnected and gets messages from the new position (PersistentSubscription.resetCursor
    disconnects all the dispatcher's consumers) (https://pulsar.apache.org/docs/concepts-messaging/#seek)."""
    a = client.subscribe(topic, "sh", consumer_type=SHARED, consumer_name="a")
    b = client.subscribe(topic, "sh", consumer_type=SHARED, consumer_name="b")
    _publish(client, topic, 10, gap_at=4)
    stamps = {}
    for consumer in (a, b):
        for m in drain(consumer):
            stamps[m.data().decode()] = m.publish_timestamp()
            consumer.acknowledge(m)
    assert sorted(stamps, key=int) == [str(i) for i in range(10)]
    time.sleep(0.3)
    a.seek(stamps["4"])
    again = values(drain(a)) + values(drain(b))
    assert sorted(again, key=int) == [str(i) for i in range(4, 10)]


def test_seek_forgets_individual_acknowledgements_after_the_target(client, topic):
    """Resetting the cursor drops the acknowledgement state past the new position: messages that
    were individually acknowledged come back (ManagedCursorImpl.resetCursor clears
    individuallyDeletedMessages) (https://pulsar.apache.org/docs/concepts-messaging/#seek)."""
    c = client.subscribe(topic, "s", initial_position=EARLIEST)
    ids = _publish(client, topic, 6)
    got = receive_n(c, 6)
    for m in got[::2]:                             # 0, 2, 4 acknowledged; 1, 3, 5 not
        c.acknowledge(m)
    time.sleep(0.3)
    c.seek(ids[0])
    assert values(drain(c)) == [str(i) for i in range(1, 6)]
