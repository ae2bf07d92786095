"""Durable subscriptions keep their acknowledgements across a change of owner, through the official
client: the mark-delete position and the individually acknowledged ranges above it are persisted in
the subscription's cursor ledger (Pulsar's ManagedCursor), so a new owner redelivers exactly the
unacknowledged messages.

What Pulsar allows (https://pulsar.apache.org/docs/concepts-messaging/#acknowledgment and
managed-ledger/.../ManagedCursorImpl.java): delivery is at-least-once; every unacknowledged message
is redelivered after a broker crash; an acknowledged message may be redelivered only if its
acknowledgement had not been persisted yet (the broker persists cursor positions at most
`managedLedgerDefaultMarkDeleteRateLimit` = 1 time per second, our `cursor_mark_delete_rate`, and
the client groups acknowledgements for 100 ms). Acknowledgements made at least 3 s before the crash
are persisted, so they must not come back; those made just before it may.
"""
from __future__ import annotations

import time

import pulsar

from tests.conformance.conftest import owner_of, rest_path, restarted

N = 250                  # 3 ledgers of 100 entries: acknowledged ranges cross ledger boundaries
PERSIST_WAIT = 3.0       # > client ack grouping (0.1 s) + one cursor write interval (1 s)


def _pos(msg) -> str:
    mid = msg.message_id()
    return f"{mid.ledger_id()}:{mid.entry_id()}"


def _value(msg) -> int:
    return int(msg.data().decode().split("-", 1)[1])


def _produce(client, topic: str, n: int) -> list:
    producer = client.create_producer(topic, batching_enabled=False)
    try:
        return [producer.send(f"m-{i}".encode()) for i in range(n)]
    finally:
        producer.close()


def _receive_all(consumer, n: int, timeout_ms: int = 15000) -> dict[int, object]:
    got = {}
    while len(got) < n:
        msg = consumer.receive(timeout_ms)
        got[_value(msg)] = msg
    return got


def _drain(consumer, expect: set[int], deadline_s: float = 60.0, quiet_ms: int = 3000) -> list[int]:
    """Receive until every value of `expect` arrived (or the deadline), then until `quiet_ms` pass
    with nothing: returns every value received, in order, duplicates included."""
    got: list[int] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            msg = consumer.receive(quiet_ms if expect <= set(got) else 5000)
        except pulsar.Timeout:
            if expect <= set(got):
                break
            continue
        got.append(_value(msg))
        consumer.acknowledge(msg)
    return got


def test_owner_crash_redelivers_every_unacked_message_and_no_persisted_ack(cluster, client, topic, admin):
    """Kill -9 the owner mid-consumption, with messages individually acknowledged (across ledger
    boundaries, holes left) and others not. A new consumer on the new owner receives every
    unacknowledged message and none whose acknowledgement was persisted (acknowledged >= 3 s before
    the kill); the few acknowledged right before the kill (`late`) may come back, as Pulsar allows.
    https://pulsar.apache.org/docs/concepts-messaging/#acknowledgment"""
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    _produce(client, topic, N)        # after subscribing: without retention nothing else keeps them
    msgs = _receive_all(consumer, N)
    # acknowledged: 0..41 contiguous (40 and 41 are not multiples of 3), then every i % 3 != 0
    acked = {i for i in range(N) if i < 40 or i % 3 != 0}
    for i in sorted(acked):
        consumer.acknowledge(msgs[i])
    time.sleep(PERSIST_WAIT)
    # the broker's view (internalStats): mark-delete on message 41, then ranges (42..44], (45..47]...
    st = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/internalStats")["cursors"]["sub"]
    assert st["cursorLedger"] >= 0, st
    assert st["markDeletePosition"] == _pos(msgs[41]), st
    assert st["individuallyDeletedMessages"].startswith(f"[({_pos(msgs[42])}..{_pos(msgs[44])}],"), st
    unacked = set(range(N)) - acked
    late = sorted(unacked)[:10]                 # acknowledged right before the kill
    for i in late:
        consumer.acknowledge(msgs[i])
    owner = owner_of(admin, topic)
    with restarted(cluster, owner):
        consumer.close()
        again = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
        got = _drain(again, unacked - set(late))
        again.close()
    missing = unacked - set(late) - set(got)
    assert not missing, f"unacknowledged messages not redelivered: {sorted(missing)}"
    persisted_acks_back = set(got) & acked
    assert not persisted_acks_back, f"acknowledged (and persisted) messages redelivered: " \
                                    f"{sorted(persisted_acks_back)}"
    assert set(got) - unacked == set(), sorted(set(got) - unacked)
    assert len(got) == len(set(got)), "a message was delivered twice to the new consumer"


def test_unload_flushes_acknowledgements_exactly(cluster, client, topic, admin):
    """A graceful unload (the topic moves, as in a bundle unload) writes the cursor's latest state
    before the ledger closes: the next owner redelivers exactly the unacknowledged messages, even
    those acknowledged just before the unload.
    https://pulsar.apache.org/docs/administration-load-balance/#unload-topics-and-bundles"""
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest)
    _produce(client, topic, N)
    msgs = _receive_all(consumer, N)
    acked = {i for i in range(N) if i % 4 != 1}
    for i in sorted(acked):
        consumer.acknowledge(msgs[i])
    time.sleep(0.5)                 # the client's ack grouping (100 ms): the acks reach the broker
    consumer.close()
    admin.ok("PUT", f"/admin/v2/{rest_path(topic)}/unload")
    again = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    got = _drain(again, set(range(N)) - acked)
    again.close()
    assert sorted(got) == sorted(set(range(N)) - acked)
