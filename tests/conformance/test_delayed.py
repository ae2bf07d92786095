"""Delayed delivery through the official client: `deliver_after` / `deliver_at` hold a message on
Shared and Key_Shared subscriptions until its time, never earlier, also across the owner's crash;
Exclusive and Failover deliver at once.

References: https://pulsar.apache.org/docs/concepts-messaging/#delayed-message-delivery ("Delayed
message delivery only works in Shared and Key_Shared subscription type. In Exclusive and Failover
subscription types, the delayed message is dispatched immediately."), the dispatcher's
trackDelayedDelivery and InMemoryDelayedDeliveryTracker (the default tracker; a delayed message is
not acknowledged, so a new owner reads it again and tracks it again).
"""
from __future__ import annotations

import time
from datetime import timedelta

import pulsar
import pytest

from tests.conformance.conftest import owner_of, rest_path, restarted


def _receive_until(consumer, n: int, timeout: float) -> list[tuple[float, bytes]]:
    out = []
    deadline = time.time() + timeout
    while len(out) < n and time.time() < deadline:
        try:
            m = consumer.receive(200)
        except pulsar.Timeout:
            continue
        out.append((time.time(), m.data()))
        consumer.acknowledge(m)
    return out


@pytest.mark.parametrize("sub_type", [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared])
def test_delayed_message_not_delivered_before_its_time(client, admin, topic, sub_type):
    """A message sent with deliver_after=1.5s reaches a Shared / Key_Shared consumer no earlier than
    1.5 s after it was sent; one without a delay sent after it arrives first; the subscription's stats
    count it in msgDelayed meanwhile; deliver_at (an absolute time) works the same."""
    c = client.subscribe(topic, "sub", consumer_type=sub_type)
    p = client.create_producer(topic, batching_enabled=False)
    t0 = time.time()
    p.send(b"late", deliver_after=timedelta(milliseconds=1500), partition_key="k")
    p.send(b"at", deliver_at=int((t0 + 1.8) * 1000), partition_key="j")
    p.send(b"now", partition_key="k")
    first = _receive_until(c, 1, 1.0)
    assert [d for _, d in first] == [b"now"]
    stats = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/stats")
    assert stats["subscriptions"]["sub"]["msgDelayed"] == 2, stats["subscriptions"]["sub"]
    rest = _receive_until(c, 2, 10)
    got = {d: at for at, d in rest}
    assert set(got) == {b"late", b"at"}, rest
    assert got[b"late"] >= t0 + 1.5 and got[b"at"] >= t0 + 1.8, (t0, got)
    p.close()
    c.close()


def test_exclusive_and_failover_ignore_the_delay(client, topic):
    """Exclusive and Failover subscriptions get a delayed message at once (Pulsar's docs)."""
    ex = client.subscribe(topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
    fo = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover)
    p = client.create_producer(topic, batching_enabled=False)
    t0 = time.time()
    p.send(b"d", deliver_after=timedelta(seconds=30))
    for c in (ex, fo):
        got = _receive_until(c, 1, 5)
        assert [d for _, d in got] == [b"d"] and got[0][0] < t0 + 5
        c.close()
    p.close()


def test_delayed_messages_survive_the_owner_crash(cluster, client, admin, topic):
    """The owner is killed (-9) while messages wait for their time: the new owner reads the
    unacknowledged entries again and holds them until their time. None is lost, none arrives
    early."""
    c = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    p = client.create_producer(topic, batching_enabled=False)
    t0 = time.time()
    sent = {}
    for i in range(10):
        data = b"d%d" % i
        sent[data] = t0 + 4 + i * 0.2
        p.send(data, deliver_at=int(sent[data] * 1000))
    p.send(b"plain")
    assert [d for _, d in _receive_until(c, 1, 5)] == [b"plain"]
    owner = owner_of(admin, topic)
    with restarted(cluster, owner):
        got = _receive_until(c, 10, 60)
    assert sorted(d for _, d in got) == sorted(sent), got
    early = [(d, at, sent[d]) for at, d in got if at < sent[d]]
    assert not early, f"delivered before their time: {early}"
    p.close()
    c.close()
