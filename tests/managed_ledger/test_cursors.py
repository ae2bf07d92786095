"""Durable cursors persisted as Pulsar's ManagedCursorImpl: a cursor ledger named by the cursor's
znode, position records appended to it (rate-limited), rollover to a new ledger, recovery with
fencing on a new owner, and the fallbacks to the znode. Real ZooKeeper and real bookie processes."""
from __future__ import annotations

import asyncio
import json

import pytest

from clusters.bookkeeper.errors import BKError, BKNoSuchLedgerError
from clusters.bookkeeper.metadata import CLOSED
from clusters.broker.ledger_meta import ManagedLedgerError
from clusters.broker.managed_ledger import ManagedLedger, Position
from tests.managed_ledger.conftest import broker_cfg, ml_name, run, session

pytestmark = pytest.mark.timeout(120)

P = Position


def d(i: int) -> bytes:
    return b"%06d-" % i + b"c" * 20


async def znode(store, name: str, cursor: str) -> dict:
    raw, _ = await store.get(f"/managed-ledgers/{name}/{cursor}")
    return json.loads(raw)


async def last_record(bk, ledger_id: int) -> dict:
    """The last record of a cursor ledger, read without recovery (so without fencing its writer):
    entries past the LAC the bookies report are read too (the LAC rides on the next add)."""
    rh = await bk.open_ledger(ledger_id, recovery=False)
    last, e = None, 0
    while True:
        try:
            last = (await rh.read_unconfirmed(e, e))[0]
        except BKError:
            break
        e += 1
    assert last is not None, f"cursor ledger {ledger_id} has no record"
    return json.loads(last)


def test_cursor_ledger_records_position_and_ranges_and_new_owner_recovers_them(shared_bookies, shared_zk):
    """Creating a cursor creates its ledger and records its id in the znode; each write appends the
    mark-delete position and the individually deleted ranges to it. A new owner recovers both from
    the ledger's last entry; opening the ledger with recovery fences it, so the old owner's next
    write fails, its managed ledger is fenced, its subscription is told, and the znode keeps the new
    owner's content (CAS)."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), session(shared_zk, name="b") as (sb, bkb):
            ml_a = await ManagedLedger.open(name, sa, bka, broker_cfg(max_entries_per_ledger=10))
            ps = [await ml_a.add_entry(d(i)) for i in range(25)]         # ledgers of 10, 10, 5
            cur = await ml_a.open_cursor("sub", "earliest")
            info = await znode(sa, name, "sub")
            assert cur.cursor_ledger_id >= 0 and info["cursors_ledger_id"] == cur.cursor_ledger_id
            assert (await bka.ledger_metadata(cur.cursor_ledger_id)).custom["cursor"] == "sub"
            # the subscription acknowledged ps[0..3], ps[5], ps[7..12] (across a ledger boundary)
            ranges = [(ps[4], ps[5]), (ps[6], ps[12])]
            fenced: list[BaseException] = []
            cur.attach(ranges_fn=lambda limit: ranges[:limit], on_fenced=fenced.append)
            cur.update(ps[3])
            await cur.flush()
            assert cur.persisted_mark_delete == ps[3]
            rec = await last_record(bka, cur.cursor_ledger_id)
            assert rec["mark_delete"] == [ps[3].ledger_id, ps[3].entry_id]
            assert rec["individual_deleted"] == [[a.ledger_id, a.entry_id, b.ledger_id, b.entry_id]
                                                 for a, b in ranges]
            assert cur.individually_deleted_ranges() == ranges
            old_ledger = cur.cursor_ledger_id

            # B takes the topic over while A still serves it
            ml_b = await ManagedLedger.open(name, sb, bkb, broker_cfg(name="broker-b"))
            cb = ml_b.cursors["sub"]
            assert cb.mark_delete_position == ps[3]
            assert cb.individually_deleted_ranges() == ranges
            assert cb.cursor_ledger_id == old_ledger
            md = await bkb.ledger_metadata(old_ledger)
            assert md.state == CLOSED                     # recovered (fenced + closed) by B
            info_b = await znode(sb, name, "sub")

            # A's next write is refused: the ledger is fenced; A does not touch the znode
            ranges.append((ps[13], ps[14]))
            cur.update(ps[4])
            await cur.flush()
            await asyncio.sleep(0.1)
            assert ml_a.fenced, "the old owner's managed ledger is not fenced"
            assert fenced, "the subscription was not told the cursor was fenced"
            assert await znode(sb, name, "sub") == info_b
            assert (await last_record(bkb, old_ledger))["mark_delete"] == [ps[3].ledger_id, ps[3].entry_id]

            # B's first write moves to a new cursor ledger and deletes the recovered one
            cb.update(ps[12])
            await cb.flush()
            assert cb.cursor_ledger_id not in (-1, old_ledger)
            assert (await znode(sb, name, "sub"))["cursors_ledger_id"] == cb.cursor_ledger_id
            assert cb.individually_deleted_ranges() == []        # both ranges are below ps[12] now
            for _ in range(50):
                try:
                    await bkb.ledger_metadata(old_ledger)
                except BKNoSuchLedgerError:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"old cursor ledger {old_ledger} was not deleted")
            await ml_b.close()
    run(scenario())


def test_cursor_ledger_rolls_over_after_n_records(shared_bookies, shared_zk):
    """After cursor_max_entries_per_ledger records the cursor switches ledgers: the new ledger gets
    the current record, the znode is switched to it (with the mark-delete position), the old ledger
    is deleted; a reload reads the last record."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            cfg = broker_cfg(cursor_max_entries_per_ledger=3)
            ml = await ManagedLedger.open(name, store, bk, cfg)
            ps = [await ml.add_entry(d(i)) for i in range(12)]
            cur = await ml.open_cursor("sub", "earliest")       # record 1 of the first ledger
            ledgers = [cur.cursor_ledger_id]
            for p in ps:
                cur.update(p)
                await cur.flush()
                if cur.cursor_ledger_id != ledgers[-1]:
                    ledgers.append(cur.cursor_ledger_id)
            # 1 + 12 records, 3 per ledger -> the 4th, 7th, 10th, 13th records open new ledgers
            assert len(ledgers) == 5, ledgers
            assert cur.ledger_switches == 5
            info = await znode(store, name, "sub")
            assert info["cursors_ledger_id"] == ledgers[-1]
            assert info["mark_delete"] == [ps[11].ledger_id, ps[11].entry_id]  # as of the last switch
            assert (await last_record(bk, ledgers[-1]))["mark_delete"] == [ps[11].ledger_id, ps[11].entry_id]
            await asyncio.sleep(0.5)
            for lid in ledgers[:-1]:
                with pytest.raises(BKNoSuchLedgerError):
                    await bk.ledger_metadata(lid)
            await ml.close()
        async with session(shared_zk, name="b") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(name="broker-b"))
            assert ml.cursors["sub"].mark_delete_position == ps[11]
            await ml.close()
    run(scenario())


def test_recovery_falls_back_to_the_znode(shared_bookies, shared_zk):
    """A cursor ledger that is gone or empty: the position recorded in the znode is used. With no
    ledger at all (cursors_ledger_id -1) the znode's position and ranges are used."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg())
            ps = [await ml.add_entry(d(i)) for i in range(10)]
            gone = await ml.open_cursor("gone", "earliest")
            gone.update(ps[2])
            await gone.flush()                   # in the ledger only; the znode still says None
            empty = await ml.open_cursor("empty", "earliest")
            nol = await ml.open_cursor("noledger", "earliest")
            await ml.close()
            await bk.delete_ledger(gone.cursor_ledger_id)
            # "empty": a ledger with no record, the znode naming it with a position
            lh = await bk.create_ledger(3, 2, 2)
            await lh.close()
            path = f"/managed-ledgers/{name}"
            raw, v = await store.get(f"{path}/empty")
            await store.set(f"{path}/empty", json.dumps({"cursors_ledger_id": lh.ledger_id,
                                                         "mark_delete": [ps[4].ledger_id, ps[4].entry_id]}).encode(), v)
            raw, v = await store.get(f"{path}/noledger")
            r = [ps[6].ledger_id, ps[6].entry_id, ps[8].ledger_id, ps[8].entry_id]
            await store.set(f"{path}/noledger", json.dumps({"cursors_ledger_id": -1,
                                                            "mark_delete": [ps[5].ledger_id, ps[5].entry_id],
                                                            "individual_deleted": [r]}).encode(), v)
        async with session(shared_zk, name="b") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(name="broker-b"))
            assert ml.cursors["gone"].mark_delete_position is None
            assert ml.cursors["gone"].cursor_ledger_id == -1
            assert ml.cursors["empty"].mark_delete_position == ps[4]
            assert ml.cursors["noledger"].mark_delete_position == ps[5]
            assert ml.cursors["noledger"].individually_deleted_ranges() == [(ps[6], ps[8])]
            # the next write gives each a ledger again
            for c in ml.cursors.values():
                c.update(ps[9])
                await c.flush()
                assert c.cursor_ledger_id >= 0
            await ml.close()
    run(scenario())


def test_writes_are_rate_limited_and_unpersisted_acks_are_lost_on_takeover(shared_bookies, shared_zk):
    """With cursor_mark_delete_rate=0.5/s, a burst of 150 updates becomes at most 2 writes, the last
    one carrying the latest position. An update made after the last write (inside the rate window)
    is not persisted when another broker takes over: that is the at-least-once window (those
    messages are redelivered)."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), session(shared_zk, name="b") as (sb, bkb):
            ml = await ManagedLedger.open(name, sa, bka, broker_cfg(cursor_mark_delete_rate=0.5))
            ps = [await ml.add_entry(d(i)) for i in range(200)]
            cur = await ml.open_cursor("sub", "earliest")
            w0 = cur.writes
            for p in ps[:150]:
                cur.update(p)
                await asyncio.sleep(0)
            await asyncio.sleep(2.5)
            assert cur.persisted_mark_delete == ps[149]
            assert 1 <= cur.writes - w0 <= 2, cur.writes - w0
            cur.update(ps[199])                 # within the rate window: not written yet
            ml_b = await ManagedLedger.open(name, sb, bkb, broker_cfg(name="broker-b"))
            assert ml_b.cursors["sub"].mark_delete_position == ps[149]
            await ml_b.close()
    run(scenario())


@pytest.mark.parametrize("knob", [False, True])
def test_bug_knob_cursor_persist_read_position_skips_an_entry_after_a_crash(shared_bookies, shared_zk, knob):
    """broker.cursor_persist_read_position (apache/pulsar#18236): a subscription created at the latest
    position and another reset to an entry persist the read position as their mark-delete position;
    the broker dies (no close) before their next write, and the new owner's cursors have skipped an
    entry nobody acknowledged. Without the knob they start at the entry the subscription expects."""
    name = ml_name()
    bugs = {"broker.cursor_persist_read_position": True} if knob else {}

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), session(shared_zk, name="b") as (sb, bkb):
            ml = await ManagedLedger.open(name, sa, bka, broker_cfg(bugs=bugs))
            ps = [await ml.add_entry(d(i)) for i in range(6)]
            latest = await ml.open_cursor("latest-sub", "latest")     # md = ps[5]: delivers from the 7th
            reset = await ml.open_cursor("reset-sub", "earliest")
            await reset.reset(ps[2])                                   # redeliver from the 3rd
            assert latest.mark_delete_position == ps[5] and reset.mark_delete_position == ps[1]
            new = await ml.add_entry(d(6))                             # nobody has acknowledged it
            # broker a is killed -9: nothing more is written; broker b takes the topic over
            ml_b = await ManagedLedger.open(name, sb, bkb, broker_cfg(name="broker-b"))
            got_latest = ml_b.cursors["latest-sub"].mark_delete_position
            got_reset = ml_b.cursors["reset-sub"].mark_delete_position
            await ml_b.close()
            if knob:
                assert got_latest == new, got_latest                   # the unacknowledged entry skipped
                assert got_reset == ps[2], got_reset                   # the reset's target skipped
            else:
                assert got_latest == ps[5] and got_reset == ps[1]
    run(scenario())


def test_reset_fails_unless_its_position_is_persisted(shared_bookies, shared_zk):
    """A seek is answered only once the reset position is durable (Pulsar's internalResetCursor
    completes in the mark-delete's callback and fails with "unable to persist readPosition for
    cursor reset"). Broker A still serves the topic after B took it over: A's reset cannot be
    written (its cursor ledger is fenced, the znode CAS-ed by B), so it raises instead of reporting
    a seek that B, the owner the consumer reconnects to, never sees; a second reset on the now
    fenced cursor raises too. B's own reset succeeds and is what the next owner recovers. (A chaos
    run lost a processor's seek this way: the consumer, already moved to B, had B's deliveries
    cleared by A's late seek success and skipped a ledger's tail.)"""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), session(shared_zk, name="b") as (sb, bkb):
            ml_a = await ManagedLedger.open(name, sa, bka, broker_cfg(name="broker-a"))
            ps = [await ml_a.add_entry(d(i)) for i in range(10)]
            cur = await ml_a.open_cursor("sub", "earliest")
            cur.update(ps[8])
            await cur.flush()
            ml_b = await ManagedLedger.open(name, sb, bkb, broker_cfg(name="broker-b"))
            assert ml_b.cursors["sub"].mark_delete_position == ps[8]
            assert not ml_a.fenced                  # A has not noticed yet: its next write will
            with pytest.raises(ManagedLedgerError, match="reset"):
                await cur.reset(ps[3])
            assert ml_a.fenced
            with pytest.raises(ManagedLedgerError, match="reset"):
                await cur.reset(ps[2])              # on a cursor known to be fenced
            # the owner's position is untouched, in memory and in what a next owner recovers
            assert ml_b.cursors["sub"].mark_delete_position == ps[8]
            await ml_b.cursors["sub"].reset(ps[4])
            assert ml_b.cursors["sub"].persisted_mark_delete == ps[3]
            await ml_b.close()
            ml_c = await ManagedLedger.open(name, sa, bka, broker_cfg(name="broker-c"))
            assert ml_c.cursors["sub"].mark_delete_position == ps[3]
            await ml_c.close()
    run(scenario())
