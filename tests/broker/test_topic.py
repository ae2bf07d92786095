"""Topic and Subscription logic without a network: a recording stand-in for the connection
(tests/broker/helpers.py)."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from clusters.broker.managed_ledger import Position
from clusters.broker.topic import ServiceUnitNotReady, Topic
from clusters.broker.service import RATE_INTERVAL_S, Rates
from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames
from tests.broker.helpers import FakeCnx, run
from tests.broker.memory import MemoryBrokerService, MemoryManagedLedger


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


async def _topic(entries_per_ledger: int | None = None, **config: object) -> tuple[Topic, MemoryManagedLedger]:
    svc = MemoryBrokerService(entries_per_ledger=entries_per_ledger)
    for k, v in config.items():
        setattr(svc.config, k, v)
    t = await svc.get_topic("persistent://public/default/t")
    return t, svc.mls["persistent://public/default/t"]


async def _topic_with(n: int, *, batch: int | None = None, entries_per_ledger: int | None = None,
                      svc: MemoryBrokerService | None = None) -> tuple[Topic, FakeCnx, list[Position]]:
    """A topic (of `svc`, default a new in-memory broker) whose producer "p" (id 0, on a new
    FakeCnx) has published `n` entries, all persisted: single messages with sequence ids 0..n-1, or
    batches of `batch` messages with sequence ids 0, batch, 2*batch ... -> (topic, cnx, the entries'
    positions in receipt order)."""
    if svc is None:
        svc = MemoryBrokerService(entries_per_ledger=entries_per_ledger)
    topic = await svc.get_topic("persistent://public/default/t")
    cnx = FakeCnx()
    p = await topic.add_producer(cnx, 0, "p")
    for i in range(n):
        _send(topic, p, i * batch if batch else i, batch=batch)
    await _settle()
    return topic, cnx, [r[2] for r in cnx.receipts]


def test_receipts_are_in_order_and_dispatch_crosses_ledgers():
    async def scenario():
        topic, cnx, _ = await _topic_with(10, entries_per_ledger=4)
        ml = topic.ml
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
        topic, cnx, _ = await _topic_with(5, batch=10)
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


def test_redelivery_counts_follow_pulsar():
    """Counts come from Pulsar's redelivery tracker: Shared/Key_Shared count explicit redeliveries
    (negative acks, ack timeouts, redeliver-all) but not a consumer leaving, and forget them when the
    last consumer leaves; Exclusive/Failover have no tracker (always 0)."""
    async def scenario():
        topic, cnx, _ = await _topic_with(4)
        # Exclusive: a consumer going away, a redeliver-all: the entries come again, count 0
        c = await topic.subscribe(cnx, _subscribe_cmd("ex", 1))
        c.sub.flow(c, 100)
        await _settle()
        c.sub.ack_individual([cnx.messages[1][1]])
        sub = c.sub
        sub.remove_consumer(c)
        cnx.messages.clear()
        c2 = await topic.subscribe(cnx, _subscribe_cmd("ex", 2))
        sub.flow(c2, 100)
        await _settle()
        assert [(m[0], m[2]) for m in cnx.messages] == [(2, 0)] * 3
        cnx.messages.clear()
        sub.redeliver(c2, None)
        await _settle()
        assert [m[2] for m in cnx.messages] == [0, 0, 0]
        # Shared: a listed redelivery counts, the holder leaving does not
        cnx.messages.clear()
        a = await topic.subscribe(cnx, _subscribe_cmd("sh", 3, sub_type=1))
        a.sub.flow(a, 100)
        await _settle()
        ids = [m[1] for m in cnx.messages]
        assert len(ids) == 4
        cnx.messages.clear()
        a.sub.redeliver(a, [ids[0]])
        await _settle()
        assert cnx.messages == [(3, ids[0], 1)]
        b = await topic.subscribe(cnx, _subscribe_cmd("sh", 4, sub_type=1))
        cnx.messages.clear()
        a.sub.remove_consumer(a)
        a.sub.flow(b, 100)
        await _settle()
        assert sorted(cnx.messages) == sorted([(4, ids[0], 1)] + [(4, i, 0) for i in ids[1:]])
        # redeliver-all (an empty list) counts every entry the consumer holds
        cnx.messages.clear()
        b.sub.redeliver(b, [])
        await _settle()
        assert sorted(cnx.messages) == sorted([(4, ids[0], 2)] + [(4, i, 1) for i in ids[1:]])
        # the last consumer leaving resets the counts
        shared = b.sub
        shared.remove_consumer(b)
        d = await topic.subscribe(cnx, _subscribe_cmd("sh", 5, sub_type=1))
        cnx.messages.clear()
        shared.flow(d, 100)
        await _settle()
        assert sorted(cnx.messages) == sorted((5, i, 0) for i in ids)
    run(scenario())


def test_shared_subscription_round_robin_and_redelivery_of_listed_ids():
    async def scenario():
        topic, cnx, _ = await _topic_with(6)
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
        # the failed write disconnected the producer (Pulsar's addFailed): the add behind it is
        # written, its receipt is not sent (the client resends it after reconnecting)
        assert cnx.closed_producers == [0] and cnx.receipts == [] and p.closed
        p = await topic.add_producer(cnx, 1, "p")
        ml.fenced = True
        _send(topic, p, 2)
        for _ in range(50):
            await asyncio.sleep(0.01)
            if len(cnx.closed_producers) > 1:
                break
        assert cnx.closed_producers == [0, 1] and svc.fenced_topics == [topic.name] and topic.closed
    run(scenario())


def test_reader_start_positions():
    async def scenario():
        topic, cnx, ids = await _topic_with(5)

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


# ----------------------------------------------------------------------------- dispatch policies

def _send_key(topic: Topic, producer, seq: int, key: str) -> None:
    md = pb.MessageMetadata(producer_name=producer.name, sequence_id=seq, publish_time=1000 + seq,
                            partition_key=key)
    topic.publish(producer, seq, seq, frames.build_entry(md, b"payload"), md)


def test_shared_round_robin_in_batches_of_20_within_permits_and_priority():
    async def scenario():
        topic, cnx, _ = await _topic_with(70)
        a = await topic.subscribe(cnx, _subscribe_cmd("s", 1, sub_type=1))
        b = await topic.subscribe(cnx, _subscribe_cmd("s", 2, sub_type=1))
        zero = await topic.subscribe(cnx, _subscribe_cmd("s", 3, sub_type=1))   # never sends FLOW
        sub = a.sub
        a.permits, b.permits = 1000, 25                 # as FLOW would
        sub.wake()
        await _settle()
        runs = [(k, len(list(g))) for k, g in itertools.groupby(m[0] for m in cnx.messages)]
        # Pulsar's dispatcherMaxRoundRobinBatchSize: up to 20 entries to one consumer, then the next
        assert runs == [(1, 20), (2, 20), (1, 20), (2, 5), (1, 5)]
        assert b.permits == 0 and not any(m[0] == 3 for m in cnx.messages) and zero.permits == 0
        # a better priority level goes first while it has permits
        topic2, cnx2, _ = await _topic_with(30)
        low = _subscribe_cmd("s", 1, sub_type=1)
        low.priority_level = 1
        lo = await topic2.subscribe(cnx2, low)
        hi = await topic2.subscribe(cnx2, _subscribe_cmd("s", 2, sub_type=1))
        lo.permits, hi.permits = 100, 10
        lo.sub.wake()
        await _settle()
        assert [m[0] for m in cnx2.messages] == [2] * 10 + [1] * 20
    run(scenario())


def test_failover_serves_a_new_active_consumer_after_the_failover_delay():
    """activeConsumerFailoverDelayTimeMillis: when the active consumer changes from one to another,
    the new one gets nothing until the delay has passed; the first one is served at once."""
    async def scenario():
        topic, _ = await _topic(active_consumer_failover_delay_s=0.5)
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 0, "p")
        cmd = _subscribe_cmd("fo", 1, sub_type=2)
        cmd.consumer_name = "a"
        a = await topic.subscribe(cnx, cmd)
        a.sub.flow(a, 100)
        _send(topic, p, 0)
        await _settle()
        assert [m[0] for m in cnx.messages] == [1]
        cmd2 = _subscribe_cmd("fo", 2, sub_type=2)
        cmd2.consumer_name = "b"
        b = await topic.subscribe(cnx, cmd2)
        b.sub.flow(b, 100)
        a.sub.remove_consumer(a)              # a leaves: b becomes active, after the delay
        _send(topic, p, 1)
        await _settle()
        assert [m[0] for m in cnx.messages] == [1]
        await asyncio.sleep(0.6)
        await _settle()
        assert [m[0] for m in cnx.messages][1:] and set(m[0] for m in cnx.messages[1:]) == {2}
    run(scenario())


def test_key_shared_routes_by_murmur3_auto_split_and_drains_moved_keys_in_order():
    """(The auto-split selector: key_shared_use_consistent_hashing off.)"""
    from clusters.broker.murmur3 import sticky_key_hash

    async def scenario():
        topic, _ = await _topic(key_shared_use_consistent_hashing=False)
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 0, "p")
        keys = [f"key-{i}" for i in range(12)]
        low = [k for k in keys if sticky_key_hash(k.encode()) <= 32768]      # B's half once it joins
        high = [k for k in keys if k not in low]
        assert low and high
        a = await topic.subscribe(cnx, _subscribe_cmd("ks", 1, sub_type=3))
        a.sub.flow(a, 1000)
        for i, k in enumerate(keys):
            _send_key(topic, p, i, k)
        await _settle()
        first = {m[1]: k for m, k in zip(cnx.messages, keys)}
        assert [m[0] for m in cnx.messages] == [1] * 12
        # B joins and takes [0, 32768]; A still holds the first message of every key
        b = await topic.subscribe(cnx, _subscribe_cmd("ks", 2, sub_type=3))
        b.sub.flow(b, 1000)
        cnx.messages.clear()
        for i, k in enumerate(keys):
            _send_key(topic, p, 100 + i, k)
        await _settle()
        # keys staying with A flow on; keys moved to B wait until A acknowledges them
        assert [m[0] for m in cnx.messages] == [1] * len(high)
        assert len(a.sub.replay) == len(low)
        # A acknowledges the first message of one moved key: only that key goes to B
        moved = low[0]
        pos_first = next(pos for pos, k in first.items() if k == moved)
        cnx.messages.clear()
        a.sub.ack_individual([pos_first])
        await _settle()
        assert [m[0] for m in cnx.messages] == [2]
        # the rest follows once A lets go of everything (its pending go back; B gets their keys)
        cnx.messages.clear()
        a.sub.ack_individual(list(first))
        await _settle()
        assert sorted(m[0] for m in cnx.messages) == [2] * (len(low) - 1)
        # ordering rule for reads: a key with an entry waiting for redelivery is not read past it
        cnx.messages.clear()
        b.permits = 0
        _send_key(topic, p, 500, low[1])
        await _settle()
        assert cnx.messages == [] and len(a.sub.replay) == 1
        _send_key(topic, p, 501, high[0])                  # another key: not held up
        await _settle()
        assert [m[0] for m in cnx.messages] == [1]
        b.sub.flow(b, 10)
        await _settle()
        assert [m[0] for m in cnx.messages] == [1, 2]
    run(scenario())


def test_key_shared_refuses_mixed_modes_and_overlapping_sticky_ranges():
    from clusters.broker.topic import ConsumerAssignFailed, ConsumerBusy

    def sticky(cid, ranges):
        cmd = _subscribe_cmd("ks", cid, sub_type=3)
        cmd.keySharedMeta.keySharedMode = pb.STICKY
        for s_, e_ in ranges:
            r = cmd.keySharedMeta.hashRanges.add()
            r.start, r.end = s_, e_
        return cmd

    async def scenario():
        topic, _ = await _topic()
        cnx = FakeCnx()
        await topic.subscribe(cnx, sticky(1, [(0, 100)]))
        with pytest.raises(ConsumerAssignFailed, match="Range conflict"):
            await topic.subscribe(cnx, sticky(2, [(50, 200)]))
        with pytest.raises(ConsumerBusy, match="key_shared mode of 'STICKY'"):
            await topic.subscribe(cnx, _subscribe_cmd("ks", 3, sub_type=3))
        with pytest.raises(ConsumerBusy, match="Subscription is of different type"):
            await topic.subscribe(cnx, _subscribe_cmd("ks", 4, sub_type=1))
        assert len(topic.subscriptions["ks"].consumers) == 1
    run(scenario())


def test_failover_picks_as_pulsar_and_notifies_every_consumer():
    from clusters.broker.selectors import pick_active

    def fo(cid, name):
        cmd = _subscribe_cmd("fo", cid, sub_type=2)
        cmd.consumer_name = name
        return cmd

    async def scenario():
        svc = MemoryBrokerService()
        svc.config.active_consumer_failover_delay_s = 0.0   # (the delay has its own test)
        name = "persistent://public/default/t-partition-1"
        topic = await svc.get_topic(name)
        cnx = FakeCnx()
        c = {}
        c["b"] = await topic.subscribe(cnx, fo(2, "b"))
        assert cnx.active_changes == [(2, True)]
        c["c"] = await topic.subscribe(cnx, fo(3, "c"))      # sorted [b, c]: partition 1 -> c
        assert cnx.active_changes[1:] == [(2, False), (3, True)]
        cnx.active_changes.clear()
        c["a"] = await topic.subscribe(cnx, fo(1, "a"))      # [a, b, c]: 1 % 3 -> b
        assert sorted(cnx.active_changes) == [(1, False), (2, True), (3, False)]
        sub = c["a"].sub
        assert sub.dispatcher.active is c["b"]
        cnx.active_changes.clear()
        c["d"] = await topic.subscribe(cnx, fo(4, "d"))      # [a..d]: 1 % 4 -> b, unchanged
        assert cnx.active_changes == [(4, False)]            # only the newcomer is told
        # the active one leaving hands what it held to the next, redelivery count 0
        p = await topic.add_producer(cnx, 0, "p")
        for i in range(3):
            _send(topic, p, i)
        for x in c.values():
            sub.flow(x, 10)
        await _settle()
        assert [m[0] for m in cnx.messages] == [2, 2, 2]
        cnx.messages.clear()
        sub.remove_consumer(c["b"])                          # [a, c, d]: 1 % 3 -> c
        await _settle()
        assert sub.dispatcher.active is c["c"]
        assert [(m[0], m[2]) for m in cnx.messages] == [(3, 0)] * 3
        # a non-partitioned topic: the consistent-hash ring, whatever the join order
        t2 = await svc.get_topic("persistent://public/default/plain")
        for cid, n in enumerate(["x", "y", "z", "w"]):
            await t2.subscribe(cnx, fo(10 + cid, n))
        s2 = t2.subscriptions["fo"]
        assert s2.dispatcher.active is pick_active(s2.consumers, t2.name)
    run(scenario())


def test_batch_index_acknowledgement():
    async def scenario():
        svc = MemoryBrokerService()
        svc.config.acknowledgment_at_batch_index_level_enabled = True
        topic, cnx, _ = await _topic_with(2, batch=10, svc=svc)
        c = await topic.subscribe(cnx, _subscribe_cmd("s", 1, sub_type=1))
        sub = c.sub
        sub.flow(c, 100)
        await _settle()
        e0, e1 = cnx.messages[0][1], cnx.messages[1][1]
        assert c.permits == 80
        # indexes 0-3 of the first batch acknowledged: bits 4..9 still set
        sub.ack_batch_index(e0, [0b1111110000])
        sub.ack_batch_index(e0, [0b1111111100])      # bits add up (AND): 0-3 stay acknowledged
        assert sub.batch_acks[e0] == [0b1111110000] and sub.mark_delete is None
        cnx.messages.clear()
        sub.redeliver(c, [e0])
        await _settle()
        # the redelivery carries the ack_set and costs only the 6 unacknowledged messages
        assert cnx.messages == [(1, e0, 1)] and cnx.ack_sets[(1, e0)] == [0b1111110000]
        assert c.permits == 80 - 6 and c.pending[e0] == 6
        sub.ack_batch_index(e0, [0])                 # the rest: the entry is acknowledged
        assert e0 not in sub.outstanding and e0 not in sub.batch_acks
        # negative words (bit 63 set) survive as int64
        sub.ack_batch_index(e1, [-2])
        assert sub.batch_acks[e1] == [-2]
        # disabled (Pulsar's default): partial acks are ignored
        svc.config.acknowledgment_at_batch_index_level_enabled = False
        sub.ack_batch_index(e1, [1])
        assert sub.batch_acks[e1] == [-2]
    run(scenario())


def test_cumulative_ack_with_an_ack_set_stops_before_the_batch():
    async def scenario():
        svc = MemoryBrokerService()
        svc.config.acknowledgment_at_batch_index_level_enabled = True
        topic, cnx, _ = await _topic_with(3, batch=10, svc=svc)
        c = await topic.subscribe(cnx, _subscribe_cmd("s", 1))
        c.sub.flow(c, 100)
        await _settle()
        ids = [m[1] for m in cnx.messages]
        c.sub.ack_cumulative(ids[1], [0b1111100000])
        assert c.sub.mark_delete == ids[0] and c.sub.batch_acks[ids[1]] == [0b1111100000]
    run(scenario())


def test_seek_forgets_acks_and_disconnects_consumers():
    async def scenario():
        topic, cnx, ids = await _topic_with(5)
        c = await topic.subscribe(cnx, _subscribe_cmd("s", 1, sub_type=1))
        sub = c.sub
        sub.flow(c, 100)
        await _settle()
        sub.ack_individual(ids)
        sub.redeliveries[ids[0]] = 3
        await sub.reset(ids[1])
        assert cnx.closed_consumers == [1] and not sub.consumers
        assert sub.mark_delete == ids[0] and sub.read_position == ids[1] and not sub.redeliveries
        cnx.messages.clear()
        c2 = await topic.subscribe(cnx, _subscribe_cmd("s", 2, sub_type=1))
        sub.flow(c2, 100)
        await _settle()
        assert [m[1] for m in cnx.messages] == ids[1:]
    run(scenario())


def test_a_burst_sent_before_the_first_rate_pass_shows_as_a_rate():
    """Rates count a new topic's and producer's messages from zero (their counters at creation), not
    from the first pass that sees them: ten messages sent right after creation are a rate in the
    first pass, then 0; a topic created between passes counts from the previous pass."""
    topic, _, _ = run(_topic_with(10))
    rates = Rates()
    rates.update({topic.name: topic}, now=100.0)
    rate_in, bytes_in = rates.get("in", topic.name)
    assert rate_in == 10 / RATE_INTERVAL_S and bytes_in > 0
    assert [r[0] for k, r in rates.values.items() if k[0] == "producer"] == [10 / RATE_INTERVAL_S]
    rates.update({topic.name: topic}, now=102.0)
    assert rates.get("in", topic.name) == (0.0, 0.0)
    later, _, _ = run(_topic_with(4))
    rates.update({topic.name: topic, "later": later}, now=104.0)
    assert rates.get("in", "later")[0] == 4 / 2.0
    rates.update({"later": later}, now=106.0)
    assert rates.get("in", topic.name) == (0.0, 0.0) and ("in", topic.name) not in rates.values
