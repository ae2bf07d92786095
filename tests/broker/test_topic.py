"""Topic and Subscription logic without a network: a recording stand-in for the connection."""
from __future__ import annotations

import asyncio

import pytest

from clusters.broker.managed_ledger import Position
from clusters.broker.topic import ServiceUnitNotReady, Topic
from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames
from tests.broker.memory import MemoryBrokerService, MemoryManagedLedger


class FakeCnx:
    """Records what the topic asks the connection to send."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, Position, int]] = []
        self.receipts: list[tuple[int, int, Position]] = []
        self.send_errors: list[tuple[int, int, int]] = []
        self.closed_producers: list[int] = []
        self.closed_consumers: list[int] = []
        self.consumers: dict = {}
        self.producers: dict = {}
        self.writable = True
        self.active = True
        self.pending = 0

    def send_message(self, consumer_id, ledger_id, entry_id, redelivery_count, entry):
        self.messages.append((consumer_id, Position(ledger_id, entry_id), redelivery_count))

    def send_receipt(self, producer_id, sequence_id, ledger_id, entry_id, highest):
        self.receipts.append((producer_id, sequence_id, Position(ledger_id, entry_id)))

    def send_send_error(self, producer_id, sequence_id, error, message):
        self.send_errors.append((producer_id, sequence_id, error))

    def add_pending_send(self, delta):
        self.pending += delta

    def broker_close_producer(self, p, url=None):
        self.closed_producers.append(p.producer_id)

    def forget_producer(self, p):
        pass

    def broker_close_consumer(self, c, url=None, *, notify=True):
        if notify:
            self.closed_consumers.append(c.consumer_id)

    def send_active_consumer_change(self, consumer_id, is_active):
        pass

    async def check_liveness(self, timeout):
        return True

    def close(self, reason=""):
        self.active = False


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def _send(topic: Topic, producer, seq: int, batch: int | None = None) -> None:
    md = pb.MessageMetadata(producer_name=producer.name, sequence_id=seq, publish_time=1000 + seq)
    if batch:
        md.num_messages_in_batch = batch
    entry = frames.build_entry(md, b"payload")
    topic.publish(producer, seq, seq, entry, md)


def _subscribe_cmd(name: str, consumer_id: int, sub_type: int = 0, earliest: bool = True):
    c = pb.CommandSubscribe(topic="persistent://public/default/t", subscription=name, subType=sub_type,
                            consumer_id=consumer_id, request_id=0)
    if earliest:
        c.initialPosition = pb.CommandSubscribe.Earliest
    return c


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _topic(entries_per_ledger: int | None = None) -> tuple[Topic, MemoryManagedLedger]:
    svc = MemoryBrokerService(entries_per_ledger=entries_per_ledger)
    t = await svc.get_topic("persistent://public/default/t")
    return t, svc.mls["persistent://public/default/t"]


def test_receipts_are_in_order_and_dispatch_crosses_ledgers():
    async def scenario():
        topic, ml = await _topic(entries_per_ledger=4)
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 0, "p")
        for i in range(10):
            _send(topic, p, i)
        await _settle()
        assert [r[1] for r in cnx.receipts] == list(range(10))
        ledgers = sorted({r[2].ledger_id for r in cnx.receipts})
        assert len(ledgers) == 3 and cnx.pending == 0
        c = await topic.subscribe(cnx, _subscribe_cmd("s", 1))
        c.sub.flow(c, 100)
        await _settle()
        assert [m[1] for m in cnx.messages] == [r[2] for r in cnx.receipts]
        # acks across the ledger boundary move the mark-delete to the last entry
        c.sub.ack_individual([m[1] for m in cnx.messages[:5]])
        assert c.sub.mark_delete == cnx.messages[4][1]
        c.sub.ack_individual([m[1] for m in cnx.messages[6:]])
        assert c.sub.mark_delete == cnx.messages[4][1]          # hole at index 5
        c.sub.ack_individual([cnx.messages[5][1]])
        assert c.sub.mark_delete == cnx.messages[9][1]
        await _settle()
        assert ml.cursors["s"].mark_delete_position == cnx.messages[9][1]
    run(scenario())


def test_batches_consume_permits_per_message_and_cumulative_ack():
    async def scenario():
        topic, ml = await _topic()
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 0, "p")
        for i in range(5):
            _send(topic, p, i * 10, batch=10)
        await _settle()
        c = await topic.subscribe(cnx, _subscribe_cmd("s", 1))
        c.sub.flow(c, 25)           # 3 batches of 10 (the last one overdraws, as Pulsar does)
        await _settle()
        assert len(cnx.messages) == 3 and c.permits == -5
        c.sub.flow(c, 100)
        await _settle()
        assert len(cnx.messages) == 5
        c.sub.ack_cumulative(cnx.messages[2][1])
        assert c.sub.mark_delete == cnx.messages[2][1] and len(c.pending) == 2
    run(scenario())


def test_consumer_removal_redelivers_with_counts():
    async def scenario():
        topic, _ = await _topic()
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 0, "p")
        for i in range(4):
            _send(topic, p, i)
        await _settle()
        c = await topic.subscribe(cnx, _subscribe_cmd("s", 1))
        c.sub.flow(c, 100)
        await _settle()
        c.sub.ack_individual([cnx.messages[1][1]])
        sub = c.sub
        sub.remove_consumer(c)
        cnx.messages.clear()
        c2 = await topic.subscribe(cnx, _subscribe_cmd("s", 2))
        sub.flow(c2, 100)
        await _settle()
        assert [(m[0], m[2]) for m in cnx.messages] == [(2, 1)] * 3
        # redeliver-all on the new consumer bumps the count again
        cnx.messages.clear()
        sub.redeliver(c2, None)
        await _settle()
        assert [m[2] for m in cnx.messages] == [2, 2, 2]
    run(scenario())


def test_shared_subscription_round_robin_and_redelivery_of_listed_ids():
    async def scenario():
        topic, _ = await _topic()
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 0, "p")
        for i in range(6):
            _send(topic, p, i)
        await _settle()
        a = await topic.subscribe(cnx, _subscribe_cmd("s", 1, sub_type=1))
        b = await topic.subscribe(cnx, _subscribe_cmd("s", 2, sub_type=1))
        a.sub.flow(a, 3)
        a.sub.flow(b, 3)
        await _settle()
        assert sorted(m[0] for m in cnx.messages) == [1, 1, 1, 2, 2, 2]
        mine = [m[1] for m in cnx.messages if m[0] == 1]
        cnx.messages.clear()
        a.sub.ack_individual(mine[1:])
        a.sub.flow(b, 10)
        a.sub.redeliver(a, [mine[0]])
        await _settle()
        assert cnx.messages == [(2, mine[0], 1)]
    run(scenario())


def test_closing_topic_drains_adds_then_closes_clients_and_refuses_new_ones():
    async def scenario():
        topic, ml = await _topic()
        ml.add_delay = 0.05
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 7, "p")
        c = await topic.subscribe(cnx, _subscribe_cmd("s", 3))
        for i in range(3):
            _send(topic, p, i)
        closing = asyncio.ensure_future(topic.close("test"))
        await asyncio.sleep(0)
        assert topic.closed
        with pytest.raises(ServiceUnitNotReady, match="Please redo the lookup"):
            await topic.add_producer(cnx, 8, "q")
        with pytest.raises(ServiceUnitNotReady):
            await topic.subscribe(cnx, _subscribe_cmd("s2", 4))
        _send(topic, p, 3)                  # dropped: the client resends after reconnecting
        await closing
        assert [r[1] for r in cnx.receipts] == [0, 1, 2]     # receipts before CLOSE_PRODUCER
        assert cnx.closed_producers == [7] and cnx.closed_consumers == [3]
        assert ml.closed and ml.adds == 3 and c.closed
    run(scenario())


def test_persistence_error_and_fencing():
    async def scenario():
        svc = MemoryBrokerService()
        topic = await svc.get_topic("persistent://public/default/t")
        ml = svc.mls["persistent://public/default/t"]
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 0, "p")
        ml.fail_adds = 1
        _send(topic, p, 0)
        _send(topic, p, 1)
        await _settle()
        assert cnx.send_errors == [(0, 0, pb.PersistenceError)]
        assert [r[1] for r in cnx.receipts] == [1]
        ml.fenced = True
        _send(topic, p, 2)
        for _ in range(50):
            await asyncio.sleep(0.01)
            if cnx.closed_producers:
                break
        assert cnx.closed_producers == [0] and svc.fenced_topics == [topic.name] and topic.closed
    run(scenario())


def test_reader_start_positions():
    async def scenario():
        topic, _ = await _topic()
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 0, "p")
        for i in range(5):
            _send(topic, p, i)
        await _settle()
        ids = [r[2] for r in cnx.receipts]

        async def first_delivery(start):
            cnx.messages.clear()
            cmd = _subscribe_cmd(f"r-{start}", 9, earliest=False)
            cmd.durable = False
            if start is not None:
                cmd.start_message_id.ledgerId = frames.to_unsigned64(start[0])
                cmd.start_message_id.entryId = frames.to_unsigned64(start[1])
            c = await topic.subscribe(cnx, cmd)
            c.sub.flow(c, 1)
            await _settle()
            c.sub.remove_consumer(c)
            return cnx.messages[0][1] if cnx.messages else None

        assert await first_delivery((-1, -1)) == ids[0]
        # a start id is delivered inclusively; the client filters it (or keeps it when inclusive)
        assert await first_delivery((ids[2].ledger_id, ids[2].entry_id)) == ids[2]
        assert await first_delivery(((1 << 63) - 1, (1 << 63) - 1)) is None
        assert await first_delivery(None) is None                 # Latest
    run(scenario())
