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
