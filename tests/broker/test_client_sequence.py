"""The official client's sequence ids with broker deduplication (clusters/broker/dedup.py), over the
in-memory ManagedLedger: a producer whose first write fails before it ever got a receipt.

The C++ client under `pulsar-client` (3.x) takes its next sequence id from the broker's
CommandProducerSuccess.last_sequence_id on every reconnect while it has had no receipt
(`lastSequenceIdPublished_ == -1`; the Java client stopped doing so in apache/pulsar#2047). A failed
write makes the broker forget what was pushed but not persisted (Pulsar's
resetHighestSequenceIdPushed), so the reconnect answers -1 and the client numbers its next message 0
again, the number of the message still pending. The pending one is stored; the next one is answered as
a duplicate, (-1, -1), and never stored. The workloads give their producers an initial sequence id
(workloads/pulsar_client.py), which turns that reset off; the queue workload's `pin_sequence_ids=false`
leaves the client's default on."""
from __future__ import annotations

import asyncio
import io

import pulsar
import pytest

from clusters.broker.dedup import MemorySnapshots, MessageDeduplication
from workloads.pulsar_client import INITIAL_SEQUENCE_ID, Session


def _dedup_topic(broker, client, topic: str) -> None:
    client.create_producer(topic).close()           # the topic now exists on the broker

    async def enable():
        t = broker.service.topics[topic]
        t.dedup = MessageDeduplication(topic, t.ml, MemorySnapshots({}))
        await t.dedup.apply(True)
    broker.call(enable())


def _stored(client, topic: str) -> list[bytes]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(5000).data())
    reader.close()
    return got


def _first_write_fails_then_send_again(broker, client, topic: str, make_producer=None, **producer_kw):
    """`make_producer()` (default: the client's, unbatched, with `producer_kw`) on a deduplicated topic."""
    _dedup_topic(broker, client, topic)
    producer = (make_producer or (lambda: client.create_producer(topic, batching_enabled=False, **producer_kw)))()
    broker.run(lambda: setattr(broker.service.mls[topic], "fail_adds", 1))
    first = producer.send(b"first")     # SEND_ERROR -> reconnect -> resent -> stored
    second = producer.send(b"second")   # numbered after the reconnect
    producer.close()
    return first, second, _stored(client, topic)


def test_client_default_reuses_a_sequence_id_and_dedup_drops_the_second_message(client, topic, broker):
    first, second, stored = _first_write_fails_then_send_again(broker, client, topic)
    assert first.ledger_id() >= 0
    # acknowledged, as a duplicate of "first", and not stored: a lost message
    assert (second.ledger_id(), second.entry_id()) == (-1, -1), second
    assert stored == [b"first"]


def test_an_initial_sequence_id_keeps_the_client_numbering_and_both_are_stored(client, topic, broker):
    first, second, stored = _first_write_fails_then_send_again(
        broker, client, topic, initial_sequence_id=INITIAL_SEQUENCE_ID)
    assert first.ledger_id() >= 0 and second.ledger_id() >= 0
    assert stored == [b"first", b"second"]


@pytest.mark.parametrize("pin", [True, False])
def test_the_workloads_session_pins_its_producers_unless_told_not_to(client, topic, broker, pin):
    """The producers the workloads send through (workloads/pulsar_client.Session, whose `pin_sequence_ids`
    the queue workload's option of that name sets): both messages stored when pinned (the default); the
    second lost, as with the client's default, when not."""
    session = Session(broker.url, "seq", out=io.StringIO(), pin_sequence_ids=pin)
    try:
        first, second, stored = _first_write_fails_then_send_again(
            broker, client, topic, lambda: session.producer(topic, batched=False))
    finally:
        session.close()
    assert first.ledger_id() >= 0
    if pin:
        assert second.ledger_id() >= 0 and stored == [b"first", b"second"]
    else:
        assert (second.ledger_id(), second.entry_id()) == (-1, -1) and stored == [b"first"]
