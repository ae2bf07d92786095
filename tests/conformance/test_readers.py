"""Readers (non-durable subscriptions) and get_last_message_id, through the official client."""
from __future__ import annotations

import pulsar

from tests.conformance.conftest import rest_path, wait_for
from tests.conformance.test_subscriptions import receive_n, values


def read_all(reader, timeout_ms: int = 1000) -> list[str]:
    out = []
    while True:
        try:
            out.append(reader.read_next(timeout_ms).data().decode())
        except pulsar.Timeout:
            return out


def _publish(client, topic: str, n: int, **kw) -> list:
    producer = client.create_producer(topic, **kw)
    ids = [producer.send(f"{i}".encode()) for i in range(n)]
    producer.close()
    return ids


def _publish_batch(client, topic: str, n: int, prefix: str = "") -> list:
    """`n` messages ("<prefix>0".."<prefix><n-1>") sent as one batch; their ids, as the receipts came."""
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=n,
                                      batching_max_publish_delay_ms=2000)
    ids = []
    for i in range(n):
        producer.send_async(f"{prefix}{i}".encode(), lambda res, mid: ids.append(mid))
    producer.flush()
    wait_for(lambda: len(ids) == n, 10, what="batch receipts")
    producer.close()
    return ids


def test_reader_from_earliest_and_from_latest(client, topic):
    """A reader starts at MessageId.earliest (the first message) or MessageId.latest (only messages
    published after it was created) (https://pulsar.apache.org/docs/concepts-clients/#reader-interface)."""
    _publish(client, topic, 5)
    early = client.create_reader(topic, pulsar.MessageId.earliest)
    late = client.create_reader(topic, pulsar.MessageId.latest)
    producer = client.create_producer(topic)
    producer.send(b"5")
    assert read_all(early) == [str(i) for i in range(6)]
    assert read_all(late) == ["5"]


def test_reader_from_a_message_id_exclusive_and_inclusive(client, topic):
    """A reader created at a message id starts right after it, or at it with
    start_message_id_inclusive (https://pulsar.apache.org/docs/concepts-clients/#reader-interface)."""
    ids = _publish(client, topic, 10)
    assert read_all(client.create_reader(topic, ids[3])) == [str(i) for i in range(4, 10)]
    assert read_all(client.create_reader(topic, ids[3], start_message_id_inclusive=True)) == \
        [str(i) for i in range(3, 10)]
    # an id given back in serialized form works the same
    restored = pulsar.MessageId.deserialize(ids[7].serialize())
    assert read_all(client.create_reader(topic, restored)) == ["8", "9"]


def test_reader_from_a_message_inside_a_batch(client, topic):
    """For a batch message id the broker starts at the batch's entry (PersistentTopic's non-durable
    cursor steps back one entry for batch ids) and the client skips the messages of the batch up to
    the id (https://pulsar.apache.org/docs/concepts-clients/#reader-interface,
    https://pulsar.apache.org/docs/concepts-messaging/#batching)."""
    ids = _publish_batch(client, topic, 10)
    ids.sort(key=lambda m: m.batch_index())
    assert [m.batch_index() for m in ids] == list(range(10))
    assert read_all(client.create_reader(topic, ids[3])) == [str(i) for i in range(4, 10)]
    assert read_all(client.create_reader(topic, ids[3], start_message_id_inclusive=True)) == \
        [str(i) for i in range(3, 10)]


def test_reader_at_latest_inclusive_reads_the_last_message(client, topic):
    """MessageId.latest with start_message_id_inclusive: has_message_available asks the broker for
    the last message id and seeks the reader to it, so the last message is read
    (https://pulsar.apache.org/docs/concepts-clients/#reader-interface; ConsumerImpl::
    hasMessageAvailableAsync compares the consumer_mark_delete_position the broker answers with the
    last message id). Without inclusive the reader at latest has nothing to read."""
    _publish(client, topic, 4)
    plain = client.create_reader(topic, pulsar.MessageId.latest)
    assert not plain.has_message_available()
    reader = client.create_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
    assert reader.has_message_available()
    assert read_all(reader) == ["3"]
    assert not reader.has_message_available()
    assert read_all(plain, 500) == []


def test_has_message_available(client, topic):
    """has_message_available compares the reader's position with the topic's last message id
    (GET_LAST_MESSAGE_ID) (https://pulsar.apache.org/docs/concepts-clients/#reader-interface)."""
    empty = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not empty.has_message_available()
    _publish(client, topic, 2)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.has_message_available()
    assert reader.read_next(5000).data() == b"0"
    assert reader.has_message_available()
    assert reader.read_next(5000).data() == b"1"
    assert not reader.has_message_available()


def test_reader_seek(client, topic):
    """reader.seek(message_id or timestamp) moves a reader like a consumer's seek
    (https://pulsar.apache.org/docs/concepts-messaging/#seek)."""
    ids = _publish(client, topic, 8)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = [reader.read_next(5000) for _ in range(8)]
    reader.seek(ids[2])
    assert read_all(reader) == [str(i) for i in range(3, 8)]
    reader.seek(got[5].publish_timestamp())
    first = reader.read_next(5000).data().decode()
    stamps = [m.publish_timestamp() for m in got]
    assert first == str(stamps.index(stamps[5]))   # the first message published at that time


def test_a_readers_subscription_is_non_durable(client, topic, admin):
    """A reader uses a non-durable subscription: it exists while the reader is connected and
    disappears with it (https://pulsar.apache.org/docs/concepts-clients/#reader-interface,
    https://pulsar.apache.org/docs/concepts-messaging/#subscription-modes)."""
    _publish(client, topic, 1)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.read_next(5000).data() == b"0"
    path = f"/admin/v2/{rest_path(topic)}/stats"
    subs = admin.ok("GET", path)["subscriptions"]
    assert len(subs) == 1 and [s["isDurable"] for s in subs.values()] == [False]
    reader.close()
    wait_for(lambda: admin.ok("GET", path)["subscriptions"] == {}, 10, what="the reader's subscription to go")


def test_get_last_message_id(client, topic):
    """consumer.get_last_message_id(): the id of the topic's last message; for a batch, its last
    index (ServerCnx.getLargestBatchIndexWhenPossible: batch size - 1)
    (https://pulsar.apache.org/docs/develop-binary-protocol/#getlastmessageid)."""
    consumer = client.subscribe(topic, "s")
    assert consumer.get_last_message_id().entry_id() == -1          # nothing published yet
    ids = _publish(client, topic, 3)
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id(), last.batch_index()) == \
        (ids[2].ledger_id(), ids[2].entry_id(), -1)
    batch = _publish_batch(client, topic, 5, prefix="b")
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id(), last.batch_index()) == \
        (batch[0].ledger_id(), batch[0].entry_id(), 4)
    assert values(receive_n(consumer, 8)) == ["0", "1", "2", "b0", "b1", "b2", "b3", "b4"]
