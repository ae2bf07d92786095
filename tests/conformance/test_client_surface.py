"""Pieces of the official client's surface not covered elsewhere (the table in docs/architecture.md,
"The official Python client against this broker", points here): the last message id of an empty
topic, GET .../lastMessageId, the Failover active-consumer delay.

References: ServerCnx.handleGetLastMessageId and ManagedLedgerImpl's lastConfirmedEntry ((current
ledger, -1) while empty), https://pulsar.apache.org/admin-rest-api/ (GET .../lastMessageId),
PersistentDispatcherSingleActiveConsumer.scheduleReadOnActiveConsumer and the broker setting
activeConsumerFailoverDelayTimeMillis (1000).
"""
from __future__ import annotations

import time

import pulsar
import pytest

from tests.conformance.conftest import rest_path


def test_last_message_id_of_an_empty_and_of_a_written_topic(client, admin, topic):
    """Empty: (current ledger, -1), and a reader has nothing available; after a message: its id."""
    c = client.subscribe(topic, "s")
    empty = c.get_last_message_id()
    assert empty.entry_id() == -1 and empty.ledger_id() >= 0, (empty.ledger_id(), empty.entry_id())
    got = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/lastMessageId")
    assert got["entryId"] == -1 and got["ledgerId"] == empty.ledger_id(), got
    r = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not r.has_message_available()
    p = client.create_producer(topic)
    mid = p.send(b"x")
    last = c.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (mid.ledger_id(), mid.entry_id())
    got = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/lastMessageId")
    assert (got["ledgerId"], got["entryId"]) == (mid.ledger_id(), mid.entry_id())
    assert r.has_message_available() and r.read_next(5000).data() == b"x"
    for x in (r, p, c):
        x.close()


def test_failover_new_active_consumer_waits_the_failover_delay(client, topic):
    """When the active Failover consumer leaves, the next one is served only after
    activeConsumerFailoverDelayTimeMillis (1 s); the first active consumer is served at once."""
    p = client.create_producer(topic)
    a = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a")
    t0 = time.time()
    p.send(b"first")
    assert a.receive(5000).data() == b"first" and time.time() - t0 < 0.9
    b = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
    time.sleep(1.5)                        # b may have become the active one (the hash ring decides)
    p.send(b"probe")
    holder, other = None, None
    for c, o in ((a, b), (b, a)):
        try:
            m = c.receive(2000)
            c.acknowledge(m)
            holder, other = c, o
            break
        except pulsar.Timeout:
            continue
    assert holder is not None
    holder.close()
    t1 = time.time()
    p.send(b"after")
    m = other.receive(10000)
    waited = time.time() - t1
    got = [m.data()]
    while got[-1] != b"after":         # "probe" again if its acknowledgement had not gone out yet
        got.append(other.receive(10000).data())
    assert waited >= 0.9, waited           # the hold starts at the broker, before close() returns here
    other.close()
    p.close()


@pytest.mark.parametrize("codec", ["LZ4", "ZLib", "ZSTD", "SNAPPY"])
def test_compressed_batches_properties_and_event_time_pass_through(client, topic, codec):
    """The broker stores and forwards what the producer sent (compressed batches included): the
    consumer decompresses; properties and event time survive
    (https://pulsar.apache.org/docs/concepts-messaging/#compression)."""
    c = client.subscribe(topic, "s")
    p = client.create_producer(topic, compression_type=getattr(pulsar.CompressionType, codec),
                               batching_enabled=True)
    p.send(b"z" * 1000, properties={"a": "b"}, event_timestamp=1234)
    m = c.receive(5000)
    assert (m.data(), m.properties(), m.event_timestamp()) == (b"z" * 1000, {"a": "b"}, 1234)
    p.close()
    c.close()


def test_chunked_message_larger_than_the_max_message_size(client, topic):
    """chunking_enabled: a 6 MiB message (maxMessageSize 5 MiB) goes as chunks the consumer joins
    (https://pulsar.apache.org/docs/concepts-messaging/#chunking); without chunking it is refused
    by the client (MessageTooBig)."""
    c = client.subscribe(topic, "s")
    big = b"q" * (6 * 1024 * 1024)
    p = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    p.send(big)
    assert c.receive(20000).data() == big
    plain = client.create_producer(topic)
    with pytest.raises(pulsar.MessageTooBig):
        plain.send(big)
    for x in (p, plain, c):
        x.close()


def test_batch_receive_and_multi_topic_subscribe(client, topic):
    """batch_receive with a policy of 5 messages; a consumer on a list of topics."""
    c = client.subscribe(topic, "s", batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(5, -1, 500))
    p = client.create_producer(topic)
    for i in range(7):
        p.send(b"%d" % i)
    assert [len(c.batch_receive()) for _ in range(2)] == [5, 2]
    other = topic + "-2"
    multi = client.subscribe([topic, other], "m", initial_position=pulsar.InitialPosition.Earliest)
    client.create_producer(other).send(b"o")
    got = {multi.receive(5000).data() for _ in range(8)}
    assert got == {b"%d" % i for i in range(7)} | {b"o"}
    for x in (p, c, multi):
        x.close()


def test_an_unknown_advertised_listener_fails_the_lookup(cluster):
    """listener_name names an advertised listener; this broker has none, so the lookup fails as
    Pulsar's does for a listener it lacks ("the broker do not have ... listener")."""
    from tests.netns import pulsar_client
    with pulsar_client(cluster.service_url, operation_timeout_seconds=2, listener_name="internal") as c:
        with pytest.raises(pulsar.PulsarException):
            c.create_producer("persistent://public/default/listener-test")
