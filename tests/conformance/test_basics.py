"""Produce and consume through the official client: the baseline every other conformance test builds on."""
from __future__ import annotations

from tests.conformance.conftest import owner_of


def test_produce_consume_in_order(client, topic, admin):
    """Messages published by one producer are delivered in publish order to an Exclusive
    subscription (https://pulsar.apache.org/docs/concepts-messaging/#ordering-guarantee)."""
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic)
    sent = [producer.send(f"m{i}".encode()) for i in range(250)]   # crosses two ledger rollovers
    got = []
    for _ in range(250):
        m = consumer.receive(10000)
        got.append(m.data().decode())
        consumer.acknowledge(m)
    assert got == [f"m{i}" for i in range(250)]
    assert len({(s.ledger_id(), s.entry_id()) for s in sent}) == 250
    assert owner_of(admin, topic).startswith("broker-")
