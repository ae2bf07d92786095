"""Broker-side deduplication at the Topic level (Pulsar's MessageDeduplication): a recording
connection, the in-memory managed ledger of tests/broker/memory.py and an in-memory snapshot store."""
from __future__ import annotations

import asyncio

import pytest

from checkers.log import check as log_check
from clusters import bugs as bug_knobs
from clusters.broker.dedup import (DEDUP_CURSOR, DISABLED, ENABLED, MemorySnapshots,
                                   MessageDeduplication)
from clusters.broker.managed_ledger import Position
from clusters.broker.topic import Topic
from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames
from core.history import INVOKE, OK, Op
from tests.broker.helpers import FakeCnx, run
from tests.broker.memory import MemoryManagedLedger, MemoryStorage

T = "persistent://public/default/dedup"


class Cnx(FakeCnx):
    """Records receipts, send errors and producer closes in one list, in the order the topic emits them."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[tuple] = []

    def send_receipt(self, producer_id, sequence_id, ledger_id, entry_id, highest):
        self.out.append(("receipt", sequence_id, Position(ledger_id, entry_id)))

    def send_send_error(self, producer_id, sequence_id, error, message):
        self.out.append(("error", sequence_id, error, message))

    def broker_close_producer(self, p, url=None):
        self.out.append(("closed", p.producer_id))


def send(topic: Topic, producer, seq: int, batch: int = 0) -> None:
    md = pb.MessageMetadata(producer_name=producer.name, sequence_id=seq, publish_time=1000 + seq)
    if batch:
        md.num_messages_in_batch = batch
    highest = seq + batch - 1 if batch > 1 else seq
    topic.publish(producer, seq, highest, frames.build_entry(md, f"v{seq}".encode()), md)


async def settle(topic: Topic) -> None:
    for _ in range(200):
        if not topic._adds:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("adds did not complete")


async def open_topic(storage: MemoryStorage, saved: dict, *, enabled: bool = True,
                     interval: int = 1000, bugs: dict | None = None) -> tuple[Topic, MemoryManagedLedger]:
    ml = MemoryManagedLedger("public/default/persistent/dedup", storage)
    t = Topic(T, ml, None)
    knobs = bug_knobs.Knobs(bugs, "broker")            # as the broker service hands them over
    t.dedup = MessageDeduplication(T, ml, MemorySnapshots(saved), interval=interval, knobs=knobs)
    await t.dedup.apply(enabled)
    return t, ml


def entries(ml: MemoryManagedLedger) -> list[int]:
    """The sequence id of every stored entry, in log order."""
    out = []
    for _, es in ml.ledgers:
        out.extend(frames.entry_metadata(e).sequence_id for e in es)
    return out


def test_resent_persisted_message_is_acknowledged_with_minus_one_and_not_written():
    async def go():
        t, ml = await open_topic(MemoryStorage(), {})
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "prod")
        for seq in range(5):
            send(t, p, seq)
        await settle(t)
        send(t, p, 2)                      # a resend of a persisted message
        send(t, p, 4)
        send(t, p, 5)                      # new
        await settle(t)
        assert entries(ml) == [0, 1, 2, 3, 4, 5]
        receipts = [(s, pos) for kind, s, pos in cnx.out]
        assert receipts[5:] == [(2, Position(-1, -1)), (4, Position(-1, -1)),
                                (5, Position(ml.ledgers[-1][0], 5))]
        assert t.last_sequence_id("prod") == 5 and t.last_sequence_id("other") == -1
        assert p.duplicates == 2 and t.dedup.duplicates == 2
    run(go())


def test_without_deduplication_a_resend_is_written_again():
    async def go():
        t, ml = await open_topic(MemoryStorage(), {}, enabled=False)
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "prod")
        for seq in (0, 1, 2, 1, 2):
            send(t, p, seq)
        await settle(t)
        assert entries(ml) == [0, 1, 2, 1, 2]
        assert all(pos.ledger_id >= 0 for _, _, pos in cnx.out)
        assert t.last_sequence_id("prod") == -1 and t.dedup.status == DISABLED
    run(go())


def test_resend_while_the_original_is_in_flight_is_refused_then_accepted_as_duplicate():
    async def go():
        t, ml = await open_topic(MemoryStorage(), {})
        ml.add_delay = 0.05
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "prod")
        send(t, p, 0)
        send(t, p, 0)                      # the original is not persisted yet: Unknown
        await settle(t)
        assert [o[0] for o in cnx.out] == ["receipt", "error"]
        assert cnx.out[1][2] == pb.PersistenceError and "duplicate" in cnx.out[1][3]
        send(t, p, 0)                      # the client's resend after reconnecting
        await settle(t)
        assert cnx.out[2] == ("receipt", 0, Position(-1, -1))
        assert entries(ml) == [0]
    run(go())


def _resend_after_a_failed_write(bugs: dict | None) -> tuple[Cnx, MemoryManagedLedger]:
    """A producer sends 0, its write of 1 fails, and it resends 1 (as the client does)."""
    async def go():
        t, ml = await open_topic(MemoryStorage(), {}, bugs=bugs)
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "prod")
        send(t, p, 0)
        await settle(t)
        ml.fail_adds = 1
        send(t, p, 1)
        await settle(t)
        assert cnx.out[-1] == ("closed", 1)          # the failed write disconnected the producer
        p = await t.add_producer(cnx, 2, "prod")     # the client reconnects and resends
        send(t, p, 1)
        await settle(t)
        return cnx, ml
    return run(go())


def _history(cnx: Cnx, ml: MemoryManagedLedger) -> list[Op]:
    """What a client would record: each acknowledged send (the receipt's sequence id is the value),
    then a final read of the topic's entries."""
    ops: list[Op] = []
    for kind, seq, *rest in cnx.out:
        if kind == "receipt":
            ops += [Op(0, INVOKE, "send", T, seq), Op(0, OK, "send", T, seq)]
    read = [{"value": seq, "message_id": {"ledger_id": 0, "entry_id": i}} for i, seq in enumerate(entries(ml))]
    ops += [Op(1, INVOKE, "read", T), Op(1, OK, "read", T, read)]
    for i, op in enumerate(ops):
        op.index, op.time_ns = i, i * 1_000_000
    return ops


def test_failed_write_is_not_mistaken_for_a_duplicate():
    """Pulsar's fix for apache/pulsar#5218: after a failed add, `pushed` falls back to `persisted`,
    so the client's resend of the failed message is written, not acknowledged as a duplicate."""
    cnx, ml = _resend_after_a_failed_write(None)
    assert cnx.out[1][:2] == ("error", 1) and cnx.out[1][2] == pb.PersistenceError
    assert cnx.out[3][0] == "receipt" and cnx.out[3][2].ledger_id >= 0
    assert entries(ml) == [0, 1]


@pytest.mark.parametrize("knob", [False, True])
def test_bug_knob_dedup_pushed_only_loses_a_resend_and_the_log_checker_says_so(knob):
    """broker.dedup_pushed_only (apache/pulsar#5218): the resend of a message whose write failed is
    acknowledged as a duplicate (-1, -1) and never stored; the log checker reports it lost. Off, the
    same scenario stores it and the checker finds nothing."""
    cnx, ml = _resend_after_a_failed_write({"broker.dedup_pushed_only": True} if knob else None)
    r = log_check(_history(cnx, ml))
    if knob:
        assert cnx.out[-1] == ("receipt", 1, Position(-1, -1)) and entries(ml) == [0]
        assert r.valid is False and [a["value"] for a in r.anomalies["lost"]] == [1]
    else:
        assert cnx.out[-1][0] == "receipt" and cnx.out[-1][2].ledger_id >= 0 and entries(ml) == [0, 1]
        assert r.valid is True and not r.anomalies


def test_failed_write_disconnects_the_producers_and_fences_publishing_until_the_adds_in_flight_complete():
    """Pulsar's addFailed: after a failed write the topic disconnects every producer and refuses
    publishing until its pending adds are done, so a send pipelined behind the failed one is never
    persisted ahead of its resend (with deduplication the resend would then be dropped as a duplicate)."""
    async def go():
        t, ml = await open_topic(MemoryStorage(), {}, enabled=False)
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "prod")
        ml.fail_adds = 1
        ml.add_delay = 0.05
        send(t, p, 0)                      # fails at once
        send(t, p, 1)                      # in flight when the failure is answered
        await asyncio.sleep(0.01)
        send(t, p, 2)                      # pipelined behind them: the producer is closed, not written
        other = await t.add_producer(cnx, 2, "other")
        send(t, other, 7)                  # arrives while the topic is fenced for publishing
        await settle(t)
        assert [o[:2] for o in cnx.out] == [("error", 0), ("closed", 1), ("error", 7)]
        assert "temporarily unavailable" in cnx.out[2][3]
        assert entries(ml) == [1]          # the add already in flight completed; 2 was never written
        q = await t.add_producer(cnx, 3, "prod")   # the client reconnects and resends, in order
        for seq in (0, 1, 2):
            send(t, q, seq)
        await settle(t)
        assert [o[:2] for o in cnx.out[3:]] == [("receipt", 0), ("receipt", 1), ("receipt", 2)]
        assert entries(ml) == [1, 0, 1, 2]
    run(go())


def test_batches_count_up_to_their_highest_sequence_id():
    async def go():
        t, ml = await open_topic(MemoryStorage(), {})
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "prod")
        send(t, p, 10, batch=5)            # 10..14
        await settle(t)
        send(t, p, 12)
        send(t, p, 15)
        await settle(t)
        assert entries(ml) == [10, 15]
        assert cnx.out[1] == ("receipt", 12, Position(-1, -1))
        assert t.last_sequence_id("prod") == 15
    run(go())


def test_state_survives_a_reload_from_the_snapshot_and_the_entries_after_it():
    async def go():
        storage, saved = MemoryStorage(), {}
        t, ml = await open_topic(storage, saved, interval=4)
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "a")
        q = await t.add_producer(cnx, 2, "b")
        for seq in range(10):
            send(t, p, seq)
        send(t, q, 100)
        await settle(t)
        await t.dedup.flush()
        assert t.dedup.snapshot_position is not None          # snapshots at entries 4 and 8
        snap_pos = t.dedup.snapshot_position
        assert ml.cursors[DEDUP_CURSOR].mark_delete_position == snap_pos
        await t.close("reload")

        t2, ml2 = await open_topic(storage, saved, interval=4)  # another broker's view of the log
        assert t2.dedup.status == ENABLED
        assert t2.dedup.snapshot_position == snap_pos
        assert t2.dedup.replayed_entries == 11 - 8             # only the entries after the snapshot
        assert t2.last_sequence_id("a") == 9 and t2.last_sequence_id("b") == 100
        cnx2 = Cnx()
        p2 = await t2.add_producer(cnx2, 1, "a")
        send(t2, p2, 9)
        send(t2, p2, 10)
        await settle(t2)
        assert cnx2.out[0] == ("receipt", 9, Position(-1, -1))
        assert cnx2.out[1][2].ledger_id >= 0
        assert entries(ml2) == list(range(10)) + [100, 10]
    run(go())


def test_without_a_snapshot_the_whole_log_after_the_cursor_is_replayed():
    async def go():
        storage, saved = MemoryStorage(), {}
        t, ml = await open_topic(storage, saved, enabled=False)
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "a")
        send(t, p, 0)                       # written before deduplication was on: not replayed
        await settle(t)
        await t.dedup.apply(True)
        for seq in (5, 6):
            send(t, p, seq)
        await settle(t)
        await t.close("reload")
        t2, _ = await open_topic(storage, saved)
        assert t2.dedup.replayed_entries == 2 and t2.last_sequence_id("a") == 6
    run(go())


def test_disabling_deletes_the_cursor_and_the_snapshot():
    async def go():
        storage, saved = MemoryStorage(), {}
        t, ml = await open_topic(storage, saved, interval=1)
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "a")
        send(t, p, 0)
        await settle(t)
        await t.dedup.flush()
        assert saved and DEDUP_CURSOR in ml.cursors
        await t.dedup.apply(False)
        assert not saved and DEDUP_CURSOR not in ml.cursors
        assert t.dedup.status == DISABLED and t.last_sequence_id("a") == -1
        send(t, p, 0)
        await settle(t)
        assert entries(ml) == [0, 0]
    run(go())


def test_exclusive_access_modes():
    async def go():
        t, _ = await open_topic(MemoryStorage(), {}, enabled=False)
        from clusters.broker.topic import (ACCESS_EXCLUSIVE, ACCESS_EXCLUSIVE_WITH_FENCING,
                                           ACCESS_WAIT_FOR_EXCLUSIVE, ProducerBusy, ProducerFenced)
        c1, c2, c3 = Cnx(), Cnx(), Cnx()
        shared = await t.add_producer(c1, 1, "shared")
        try:
            await t.add_producer(c2, 1, "ex", access_mode=ACCESS_EXCLUSIVE)
            raise AssertionError("exclusive producer admitted next to a shared one")
        except ProducerFenced as e:
            assert "shared producers" in str(e)
        queued = []
        waiter = asyncio.ensure_future(t.add_producer(c2, 1, "waiter", access_mode=ACCESS_WAIT_FOR_EXCLUSIVE,
                                                      on_queued=lambda: queued.append(1)))
        await asyncio.sleep(0.01)
        assert queued == [1] and not waiter.done()
        t.remove_producer(shared)                # the topic is free: the waiter gets it
        w = await asyncio.wait_for(waiter, 5)
        assert t.exclusive_producer == "waiter" and w.topic_epoch == 0
        try:
            await t.add_producer(c3, 1, "late")
            raise AssertionError("shared producer admitted next to an exclusive one")
        except ProducerBusy:
            pass
        f = await t.add_producer(c3, 2, "fencer", access_mode=ACCESS_EXCLUSIVE_WITH_FENCING)
        assert ("closed", 1) in c2.out and t.exclusive_producer == "fencer" and f.topic_epoch == 1
        try:                                      # the old exclusive producer reconnects: fenced
            await t.add_producer(c2, 1, "waiter", access_mode=ACCESS_EXCLUSIVE, topic_epoch=0)
            raise AssertionError("stale exclusive producer admitted")
        except ProducerFenced:
            pass
    run(go())


@pytest.mark.parametrize("knob", [False, True])
def test_bug_knob_dedup_recovery_race_stores_a_resend_twice(knob):
    """broker.dedup_recovery_race (apache/pulsar#25954): a topic with topic-level policies is loaded
    by a new owner; the policy path and the load chain both check deduplication. With the knob the
    load chain finds the policy path's recovery Recovering, takes it as done and exposes the topic
    while the replay still reads: the producer's resend of a message the previous owner persisted is
    stored again (two copies of one (producer, sequence id); the queue checker's `duplicated`). Without
    it the load chain waits for the recovery and the resend is answered as a duplicate."""
    async def go():
        storage, saved = MemoryStorage(), {}
        t, ml = await open_topic(storage, saved)
        cnx = Cnx()
        p = await t.add_producer(cnx, 1, "prod")
        for seq in range(20):
            send(t, p, seq)
        await settle(t)
        await t.close("owner change")                       # the previous owner had persisted 0..19

        ml2 = MemoryManagedLedger("public/default/persistent/dedup", storage)
        real_read = ml2.read_entries

        async def slow_read(start, n):                     # bookie reads take a while
            await asyncio.sleep(0.05)
            return await real_read(start, n)
        ml2.read_entries = slow_read
        t2 = Topic(T, ml2, None)
        t2.dedup = MessageDeduplication(T, ml2, MemorySnapshots(saved),
                                        knobs=bug_knobs.Knobs({"broker.dedup_recovery_race": knob}, "broker"))
        policy_path = asyncio.get_running_loop().create_task(t2.dedup.apply(True))
        await asyncio.sleep(0)                              # it starts first, as initTopicPolicy does
        await t2.dedup.apply(True)                          # the load chain's check; then producers
        exposed_while = t2.dedup.status
        cnx2 = Cnx()
        p2 = await t2.add_producer(cnx2, 1, "prod")
        send(t2, p2, 19)                                    # its receipt was lost: resent
        await settle(t2)
        await policy_path
        stored = entries(ml2)
        if knob:
            assert exposed_while == "Recovering"
            assert stored.count(19) == 2, stored
            assert cnx2.out[0][0] == "receipt" and cnx2.out[0][2].ledger_id >= 0
        else:
            assert exposed_while == ENABLED
            assert stored.count(19) == 1, stored
            assert cnx2.out[0] == ("receipt", 19, Position(-1, -1))
        assert t2.dedup.status == ENABLED
    run(go())
