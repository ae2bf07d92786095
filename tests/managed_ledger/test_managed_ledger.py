"""ManagedLedger over real ZooKeeper and real bookie processes (3 bookies, E/Qw/Qa = 3/2/2).

Each test uses its own ML name; the tests that do not harm bookies share one module-wide cluster.
"""
from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from kazoo.exceptions import ConnectionLoss

from clusters.bookkeeper.errors import BKError, BKNotEnoughBookiesError
from clusters.bookkeeper.metadata import CLOSED
from clusters.broker.managed_ledger import (ManagedLedger, ManagedLedgerError, ManagedLedgerFenced,
                                            Position)
from tests.managed_ledger.conftest import broker_cfg, ml_name, run, session

pytestmark = pytest.mark.timeout(120)


def d(i: int) -> bytes:
    return b"%06d-" % i + b"m" * 40


async def ledger_list(store, name: str) -> list[dict]:
    raw, _ = await store.get(f"/managed-ledgers/{name}")
    return json.loads(raw)["ledgers"]


async def read_all(ml: ManagedLedger, batch: int = 10_000) -> list[tuple[Position, bytes]]:
    """Walk the whole log with read_entries/next_position in batches of `batch`."""
    out: list[tuple[Position, bytes]] = []
    pos = ml.first_position()
    while pos is not None:
        got = await ml.read_entries(pos, batch)
        assert len(got) <= batch
        if not got:
            break
        out.extend(got)
        pos = ml.next_position(got[-1][0])
    return out


async def adds_in_call_order(ml: ManagedLedger, n: int, first: int = 0, yield_every: int = 0):
    """Create n add_entry tasks in call order; returns (positions, completion order, errors)."""
    done: list[int] = []

    async def one(i: int) -> Position:
        pos = await ml.add_entry(d(i))
        done.append(i)
        return pos
    tasks = []
    for i in range(first, first + n):
        tasks.append(asyncio.create_task(one(i)))
        if yield_every and i % yield_every == 0:
            await asyncio.sleep(0)            # let the event loop run: rollovers happen mid-stream
        if yield_every and i % (yield_every * 31) == 0:
            await asyncio.sleep(0.003)
    res = await asyncio.gather(*tasks, return_exceptions=True)
    errors = {first + k: r for k, r in enumerate(res) if isinstance(r, BaseException)}
    return res, done, errors


def strictly_increasing(ps) -> bool:
    return all(a < b for a, b in zip(ps, ps[1:]))


# 1 -----------------------------------------------------------------------------------------------
def test_pipelined_adds_rollover_reads_and_ledger_list(shared_bookies, shared_zk):
    """2000 concurrent adds complete in call order with increasing positions; ledgers roll every 100
    entries; reads (cache and bookies) return each entry once, in order, across ledger boundaries;
    the ledger list in ZooKeeper records closed ledgers with their real entry counts."""
    name = ml_name()
    n, per = 2000, 100

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_entries_per_ledger=per))
            assert ml.first_position() is None and ml.last_confirmed is None
            assert await ml.read_entries(Position(0, 0), 10) == []
            positions, done, errors = await adds_in_call_order(ml, n)
            assert not errors
            assert done == list(range(n)), "add_entry calls completed out of call order"
            assert strictly_increasing(positions)
            assert ml.last_confirmed == positions[-1]
            per_ledger = Counter(p.ledger_id for p in positions)
            assert max(per_ledger.values()) <= per, f"a ledger exceeded {per} entries: {per_ledger}"
            assert len(per_ledger) == n // per
            for lid, cnt in per_ledger.items():      # entry ids within a ledger are 0..cnt-1
                assert sorted(p.entry_id for p in positions if p.ledger_id == lid) == list(range(cnt))
            # the writer reads everything back (tail cache and/or bookies)
            got = await ml.read_entries(ml.first_position(), 5 * n)
            assert [p for p, _ in got] == positions
            assert [x for _, x in got] == [d(i) for i in range(n)]
            await ml.close()
            # ledger list after a clean close: every ledger but the current one is closed with its count
            lst = await ledger_list(store, name)
            assert [i["ledger_id"] for i in lst] == sorted(per_ledger)
            for info in lst[:-1]:
                assert info["entries"] == per_ledger[info["ledger_id"]]
                md = await bk.ledger_metadata(info["ledger_id"])
                assert md.state == CLOSED and md.last_entry_id == info["entries"] - 1
            md = await bk.ledger_metadata(lst[-1]["ledger_id"])
            assert md.state == CLOSED and md.last_entry_id == per_ledger[lst[-1]["ledger_id"]] - 1

        # a new owner (another session, empty tail cache) reads from the bookies
        async with session(shared_zk, name="b") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(name="broker-b",
                                                                      max_entries_per_ledger=per))
            for batch in (10_000, 37, 100, 1):
                got = await read_all(ml, batch)
                assert [p for p, _ in got] == positions, f"batch {batch}"
                assert [x for _, x in got] == [d(i) for i in range(n)], f"batch {batch}"
            # a read starting 5 entries before a ledger boundary continues in the next ledger
            k = positions.index(Position(sorted(per_ledger)[3], per - 5))
            got = await ml.read_entries(positions[k], 10)
            assert [p for p, _ in got] == positions[k:k + 10]
            # a position just past the end of a ledger (next_position of its last entry) also works
            got = await ml.read_entries(ml.next_position(positions[k + 4]), 3)
            assert [p for p, _ in got] == positions[k + 5:k + 8]
            lst = await ledger_list(store, name)
            assert [i["ledger_id"] for i in lst[:-1]] == sorted(per_ledger)
            assert all(i["entries"] == per_ledger[i["ledger_id"]] for i in lst[:-1])
            assert lst[-1]["entries"] is None            # the new owner's open ledger
            pos = await ml.add_entry(b"next")
            assert pos == Position(lst[-1]["ledger_id"], 0) and pos > positions[-1]
            await ml.close()
    run(scenario())


# 2 -----------------------------------------------------------------------------------------------
def test_adds_during_rollovers_are_queued_and_complete_in_order(shared_bookies, shared_zk):
    """A stream of adds, with the event loop running between them, while the ML rolls every 20
    entries: adds issued during a rollover wait for the new ledger, then complete in call order;
    nothing is lost, duplicated or reordered."""
    name = ml_name()
    n, per = 1500, 20

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_entries_per_ledger=per))
            positions, done, errors = await adds_in_call_order(ml, n, yield_every=3)
            assert not errors
            assert done == list(range(n)), "completions out of call order"
            assert strictly_increasing(positions), "positions not increasing in call order"
            per_ledger = Counter(p.ledger_id for p in positions)
            assert len(per_ledger) >= n // per and max(per_ledger.values()) <= per
            got = await read_all(ml, 64)
            assert [x for _, x in got] == [d(i) for i in range(n)]
            assert [p for p, _ in got] == positions
            await ml.close()
    run(scenario())


# 3 -----------------------------------------------------------------------------------------------
def test_takeover_fences_the_old_owner(shared_bookies, shared_zk):
    """B opens the ML while A is writing: B's open fences and recovers A's ledger; A's adds then fail
    with ManagedLedgerFenced; B reads every entry A got acknowledged (in order, a prefix of A's
    call order) and appends after them."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), \
                session(shared_zk, name="b") as (sb, bkb):
            ml_a = await ManagedLedger.open(name, sa, bka, broker_cfg(name="broker-a"))
            acked: dict[int, Position] = {}
            errors: dict[int, BaseException] = {}

            async def one(i: int) -> None:
                try:
                    acked[i] = await ml_a.add_entry(d(i))
                except ManagedLedgerError as e:
                    errors[i] = e
            await asyncio.gather(*(one(i) for i in range(100)))
            assert len(acked) == 100

            async def writer() -> None:     # keeps ~30 adds in flight until A is fenced
                i, inflight = 100, set()
                while not errors and i < 100_000:
                    t = asyncio.create_task(one(i))
                    inflight.add(t)
                    t.add_done_callback(inflight.discard)
                    i += 1
                    if len(inflight) >= 30:
                        await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                    else:
                        await asyncio.sleep(0)
                if inflight:
                    await asyncio.wait(inflight)
            w = asyncio.create_task(writer())
            await asyncio.sleep(0.3)
            ml_b = await ManagedLedger.open(name, sb, bkb, broker_cfg(name="broker-b"))
            await asyncio.wait_for(w, 20)
            assert errors, "A was never told it lost the topic"
            assert all(isinstance(e, ManagedLedgerFenced) for e in errors.values()), errors
            assert ml_a.fenced
            with pytest.raises(ManagedLedgerFenced):
                await ml_a.add_entry(b"after takeover")
            assert len(acked) > 100
            # B has every acknowledged entry, at the position A was told
            got = await read_all(ml_b, 500)
            datas = [x for _, x in got]
            by_pos = dict(got)
            for i, pos in acked.items():
                assert by_pos.get(pos) == d(i), f"acked entry {i} at {pos} missing from B"
            # what B recovered is a prefix of A's call order (recovery may keep un-acked entries)
            assert datas == [d(i) for i in range(len(datas))]
            assert len(datas) >= max(acked) + 1
            # B appends after A's entries, in a new ledger
            pos = await ml_b.add_entry(b"from B")
            assert pos > got[-1][0] and pos.ledger_id > got[-1][0].ledger_id
            assert (await ml_b.read_entries(pos, 5)) == [(pos, b"from B")]
            await ml_a.close()          # a no-op on a fenced ML
            await ml_b.close()
    run(scenario())


def test_takeover_detected_when_the_old_owner_rolls_over(shared_bookies, shared_zk):
    """A's current ledger is full; B takes over; A's next add starts a rollover whose ledger-list CAS
    loses to B's: the add fails with ManagedLedgerFenced and A leaves no ledger behind."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), \
                session(shared_zk, name="b") as (sb, bkb):
            ml_a = await ManagedLedger.open(name, sa, bka, broker_cfg(max_entries_per_ledger=10))
            for i in range(10):
                await ml_a.add_entry(d(i))
            ml_b = await ManagedLedger.open(name, sb, bkb, broker_cfg(name="broker-b"))
            before = await ledger_list(sb, name)
            ledgers_before = set(await bkb.list_ledgers())
            with pytest.raises(ManagedLedgerFenced):
                await ml_a.add_entry(d(10))
            assert ml_a.fenced
            with pytest.raises(ManagedLedgerFenced):
                await ml_a.add_entry(d(11))
            assert await ledger_list(sb, name) == before
            await asyncio.sleep(0.2)
            assert set(await bkb.list_ledgers()) <= ledgers_before, "A's abandoned ledger was kept"
            assert [x for _, x in await read_all(ml_b)] == [d(i) for i in range(10)]
            await ml_b.close()
    run(scenario())


def test_takeover_without_recovery_fencing_loses_acknowledged_entries(shared_bookies, shared_zk):
    """broker.recovery_fencing=false on B: B closes A's ledger in metadata without fencing it, so A's
    next add is ACKNOWLEDGED, yet neither B nor a later owner can ever read it."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), \
                session(shared_zk, name="b") as (sb, bkb):
            ml_a = await ManagedLedger.open(name, sa, bka, broker_cfg(name="broker-a"))
            first = [await ml_a.add_entry(d(i)) for i in range(50)]
            unsafe = broker_cfg(name="broker-b", bugs={"broker.recovery_fencing": False})
            ml_b = await ManagedLedger.open(name, sb, bkb, unsafe)
            lost = await ml_a.add_entry(b"acknowledged but lost")     # succeeds: nothing fenced
            assert lost == Position(first[0].ledger_id, 50)
            assert not ml_a.fenced
            got_b = await read_all(ml_b)
            assert [x for _, x in got_b] == [d(i) for i in range(50)]
            lst = await ledger_list(sb, name)
            assert (lst[0]["ledger_id"], lst[0]["entries"]) == (first[0].ledger_id, 50)
            await ml_b.close()
        async with session(shared_zk, name="c") as (sc, bkc):
            ml_c = await ManagedLedger.open(name, sc, bkc, broker_cfg(name="broker-c"))
            got_c = [x for _, x in await read_all(ml_c)]
            assert got_c == [d(i) for i in range(50)]
            assert b"acknowledged but lost" not in got_c
            await ml_c.close()
    run(scenario())



def _bookie_ledgers(bookies) -> set[int]:
    """Every ledger id the bookie processes store (their /api/v1/bookie/list_ledgers)."""
    import urllib.request
    out: set[int] = set()
    for b in bookies.procs:
        with urllib.request.urlopen(f"http://127.0.0.1:{b.cfg.http_port}/api/v1/bookie/list_ledgers",
                                    timeout=5) as r:
            out.update(json.loads(r.read())["ledgers"])
    return out


def test_takeover_deletes_the_old_owners_empty_ledger_and_its_late_add_is_refused(shared_bookies, shared_zk):
    """A has written nothing to its ledger when B takes the topic over: B recovers it (fenced, closed
    empty), leaves it out of the list and deletes it, metadata and bookies. A's late add to it is
    refused as fenced: the bookies keep the fence of a ledger deleted while fenced
    (apache/bookkeeper#4462; tests/bookie/test_gc.py has the knob that forgets it, and the ack)."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), \
                session(shared_zk, name="b") as (sb, bkb):
            ml_a = await ManagedLedger.open(name, sa, bka, broker_cfg(name="broker-a"))
            empty = (await ledger_list(sa, name))[-1]["ledger_id"]
            ml_b = await ManagedLedger.open(name, sb, bkb, broker_cfg(name="broker-b"))
            assert empty not in [x["ledger_id"] for x in await ledger_list(sb, name)]
            for _ in range(200):        # B's delete reaches the bookies in the background
                if empty not in set(await bkb.list_ledgers()) and \
                        empty not in await asyncio.to_thread(_bookie_ledgers, shared_bookies):
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail(f"ledger {empty} was not deleted from the metadata and the bookies")
            with pytest.raises(ManagedLedgerFenced):
                await ml_a.add_entry(b"late")
            assert ml_a.fenced
            assert await read_all(ml_b) == []
            await ml_b.close()
    run(scenario())


# 4 -----------------------------------------------------------------------------------------------
def test_cursors_earliest_latest_mark_delete_and_reset(shared_bookies, shared_zk):
    name = ml_name()

    def next_read(ml: ManagedLedger, cur) -> Position | None:
        md = cur.mark_delete_position
        return ml.first_position() if md is None else ml.next_position(md)

    async def first_read(ml: ManagedLedger, cur) -> list[Position]:
        start = next_read(ml, cur)
        return [] if start is None else [p for p, _ in await ml.read_entries(start, 100)]

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_entries_per_ledger=4))
            empty = await ml.open_cursor("on-empty", "latest")        # latest on an empty log
            ps = [await ml.add_entry(d(i)) for i in range(10)]        # 3 ledgers: 4 + 4 + 2
            assert len({p.ledger_id for p in ps}) == 3
            assert await first_read(ml, empty) == ps
            early = await ml.open_cursor("early", "earliest")
            late = await ml.open_cursor("late", "latest")
            assert early.mark_delete_position is None
            assert late.mark_delete_position == ps[-1]
            assert await first_read(ml, early) == ps
            assert await first_read(ml, late) == []
            p10 = await ml.add_entry(d(10))
            ps.append(p10)
            assert await first_read(ml, late) == [p10]
            # an existing cursor keeps its position whatever initial position is asked for
            assert (await ml.open_cursor("early", "latest")) is early
            # mark_delete moves forward only
            await early.mark_delete(ps[5])
            await early.mark_delete(ps[2])
            assert early.mark_delete_position == ps[5]
            assert (await first_read(ml, early))[0] == ps[6]
            # reset: the next read starts at the given position (here the first entry of a ledger)
            assert ps[4].entry_id == 0
            await late.reset(ps[4])
            assert next_read(ml, late) == ps[4]
            assert await first_read(ml, late) == ps[4:]
            rewound = await ml.open_cursor("rewound", "latest")
            await rewound.reset(None)
            assert await first_read(ml, rewound) == ps
            await ml.open_cursor("gone", "earliest")
            await ml.delete_cursor("gone")
            await ml.close()
        # a new instance (another session) sees the persisted positions
        async with session(shared_zk, name="b") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(name="broker-b"))
            assert set(ml.cursors) == {"on-empty", "early", "late", "rewound"}
            assert ml.cursors["early"].mark_delete_position == ps[5]
            assert (await ml.open_cursor("early", "latest")).mark_delete_position == ps[5]
            assert next_read(ml, ml.cursors["late"]) == ps[4]
            assert await first_read(ml, ml.cursors["late"]) == ps[4:]
            assert ml.cursors["rewound"].mark_delete_position is None
            assert ml.cursors["on-empty"].mark_delete_position is None
            # a fresh "latest" cursor on the reopened ML starts after the recovered entries
            fresh = await ml.open_cursor("fresh", "latest")
            assert fresh.mark_delete_position == ps[-1]
            await ml.close()
    run(scenario())


# 5 -----------------------------------------------------------------------------------------------
def test_wait_for_entries_wakes_on_add_fence_and_close(shared_bookies, shared_zk):
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), \
                session(shared_zk, name="b") as (sb, bkb):
            ml = await ManagedLedger.open(name, sa, bka, broker_cfg())
            w0 = asyncio.create_task(ml.wait_for_entries(None))         # empty log: waits
            await asyncio.sleep(0.2)
            assert not w0.done()
            p0 = await ml.add_entry(d(0))
            await asyncio.wait_for(w0, 2)
            await asyncio.wait_for(ml.wait_for_entries(None), 1)       # entries exist: returns
            w1 = asyncio.create_task(ml.wait_for_entries(p0))
            await asyncio.sleep(0.2)
            assert not w1.done()
            await ml.add_entry(d(1))
            await asyncio.wait_for(w1, 2)
            # fenced: A learns it lost the topic on its next add; the waiter returns
            w2 = asyncio.create_task(ml.wait_for_entries(ml.last_confirmed))
            ml_b = await ManagedLedger.open(name, sb, bkb, broker_cfg(name="broker-b"))
            await asyncio.sleep(0.2)
            assert not w2.done()
            with pytest.raises(ManagedLedgerFenced):
                await ml.add_entry(d(2))
            await asyncio.wait_for(w2, 2)
            await asyncio.wait_for(ml.wait_for_entries(ml.last_confirmed), 1)
            # closed: the waiter returns
            w3 = asyncio.create_task(ml_b.wait_for_entries(ml_b.last_confirmed))
            await asyncio.sleep(0.2)
            assert not w3.done()
            await ml_b.close()
            await asyncio.wait_for(w3, 2)
            await asyncio.wait_for(ml_b.wait_for_entries(ml_b.last_confirmed), 1)
    run(scenario())


# 6 -----------------------------------------------------------------------------------------------
def test_close_closes_the_ledger_so_the_next_owner_needs_no_recovery(shared_bookies, shared_zk):
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg())
            ps = [await ml.add_entry(d(i)) for i in range(30)]
            # 50 more adds in flight when close() is called: they are all persisted first
            tasks = [asyncio.create_task(ml.add_entry(d(i))) for i in range(30, 80)]
            await asyncio.sleep(0)
            await ml.close()
            ps += await asyncio.gather(*tasks)
            lid = ps[0].ledger_id
            assert {p.ledger_id for p in ps} == {lid} and [p.entry_id for p in ps] == list(range(80))
            md = await bk.ledger_metadata(lid)
            assert md.state == CLOSED and md.last_entry_id == 79
            with pytest.raises(ManagedLedgerError):
                await ml.add_entry(b"after close")
            await ml.close()                                  # idempotent
        async with session(shared_zk, name="b") as (store, bk):
            recoveries = []
            real_recover = bk._recover

            async def spy(md, fence):
                recoveries.append(md.ledger_id)
                return await real_recover(md, fence)
            bk._recover = spy
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(name="broker-b"))
            assert recoveries == [], "the closed ledger was recovered again"
            md2 = await bk.ledger_metadata(lid)
            assert md2.state == CLOSED and md2.version == md.version and md2.last_entry_id == 79
            assert [x for _, x in await read_all(ml)] == [d(i) for i in range(80)]
            await ml.close()
    run(scenario())


# bugs ------------------------------------------------------------------------------------------
def test_close_during_rollover_leaves_no_open_ledger(shared_bookies, shared_zk):
    """close() while a rollover is in flight: the ML stays closed (adds are refused) and no ledger of
    it is left OPEN in BookKeeper (the next owner would need recovery to learn its end)."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_entries_per_ledger=5))
            for i in range(5):
                await ml.add_entry(d(i))
            t = asyncio.create_task(ml.add_entry(d(5)))   # the ledger is full: starts a rollover
            await asyncio.sleep(0)
            await ml.close()
            res = (await asyncio.gather(t, return_exceptions=True))[0]
            assert isinstance(res, (ManagedLedgerError, Position))
            await asyncio.sleep(0.5)                      # any rollover work left runs now
            with pytest.raises(ManagedLedgerError):
                await ml.add_entry(b"after close")
            for lid in await bk.list_ledgers():
                md = await bk.ledger_metadata(lid)
                if md.custom.get("managed-ledger") == name:
                    assert md.state == CLOSED, f"ledger {lid} left {md.state} after close()"
    run(scenario())


def test_rollover_failure_fails_queued_adds_then_recovers(shared_bookies, shared_zk):
    """The ledger creation of a rollover fails (BookKeeper refuses): the queued add fails with a
    retryable ManagedLedgerError (not Fenced); the next add rolls again and succeeds."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_entries_per_ledger=5))
            ps = [await ml.add_entry(d(i)) for i in range(5)]
            real_create = bk.create_ledger
            calls = []

            async def failing_once(*a, **kw):
                calls.append(1)
                if len(calls) == 1:
                    raise BKNotEnoughBookiesError("injected: no bookies")
                return await real_create(*a, **kw)
            bk.create_ledger = failing_once
            r = await asyncio.gather(ml.add_entry(d(5)), ml.add_entry(d(6)), return_exceptions=True)
            assert all(isinstance(x, ManagedLedgerError) and not isinstance(x, ManagedLedgerFenced)
                       for x in r), r
            assert not ml.fenced
            p7 = await ml.add_entry(d(7))
            assert p7 > ps[-1] and p7.ledger_id != ps[-1].ledger_id and len(calls) == 2
            assert [x for _, x in await read_all(ml)] == [d(i) for i in (0, 1, 2, 3, 4, 7)]
            lst = await ledger_list(store, name)
            assert [i["entries"] for i in lst] == [5, None]
            await ml.close()
    run(scenario())


def test_failed_close_at_rollover_keeps_the_ledger_readable(shared_bookies, shared_zk):
    """The close of a full ledger fails (its metadata store write gave up) but the rollover goes on:
    the ledger list says how many entries it has, so every entry stays readable to this owner and to
    the next one although the ledger is still OPEN in BookKeeper (its last entry is beyond the LAC
    the bookies know)."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_entries_per_ledger=5))
            ps = [await ml.add_entry(d(i)) for i in range(5)]
            lh = ml._lh

            async def failing_close(*a, **kw):
                raise BKError("injected: metadata store unavailable")
            lh.close = failing_close
            ps += [await ml.add_entry(d(i)) for i in range(5, 8)]
            assert ps[5].ledger_id != ps[4].ledger_id
            assert (await bk.ledger_metadata(ps[0].ledger_id)).state != CLOSED
            await ml.close()
        async with session(shared_zk, name="b") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(name="broker-b"))
            got = await read_all(ml, 3)
            assert [p for p, _ in got] == ps
            assert [x for _, x in got] == [d(i) for i in range(8)]
            await ml.close()
    run(scenario())


def test_ledger_list_update_with_lost_reply_does_not_fence(shared_bookies, shared_zk):
    """The ledger-list CAS of a rollover lands but its reply is lost (ConnectionLoss): the ML must
    find out its write happened, keep the new ledger and go on; otherwise it deletes a ledger the
    list names and its next CAS, with a stale version, fences it although nobody else owns it."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_entries_per_ledger=5))
            ps = [await ml.add_entry(d(i)) for i in range(5)]
            real_set = store.set
            injected: list[str] = []

            async def reply_lost_once(path, data, version=-1):
                v = await real_set(path, data, version)
                if path.startswith("/managed-ledgers/") and not injected:
                    injected.append(path)
                    raise ConnectionLoss("injected: the reply was lost")
                return v
            store.set = reply_lost_once
            ps += [await ml.add_entry(d(i)) for i in range(5, 15)]     # two more rollovers
            assert injected and not ml.fenced
            assert strictly_increasing(ps)
            assert [x for _, x in await read_all(ml, 4)] == [d(i) for i in range(15)]
            lst = await ledger_list(store, name)
            assert [i["ledger_id"] for i in lst] == sorted({p.ledger_id for p in ps})
            for info in lst:
                await bk.ledger_metadata(info["ledger_id"])        # exists (was not abandoned)
            await ml.close()
    run(scenario())


def test_bookie_crash_adds_are_resubmitted_on_a_new_ledger(bookies, zk):
    """kill -9 a bookie of the ensemble with no spare bookie: the ensemble change fails, so the
    ledger's pending adds fail. As Pulsar does (OpAddEntry.handleAddFailure -> ledgerClosed), the
    ML closes the ledger at its LAC and re-submits those adds, in order, on a new ledger (a fourth
    bookie is started just before the rollover creates it): every add succeeds, in call order."""
    procs = bookies.start(3)
    by_addr = {b.addr: b for b in procs}
    name = ml_name()

    async def scenario():
        async with session(zk, 3, name="a", add_timeout=2.0) as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg())
            first, _, errs = await adds_in_call_order(ml, 50)
            assert not errs
            lid0 = first[0].ledger_id
            real_create = bk.create_ledger

            async def create_with_spare(*a, **kw):
                if len(bookies.procs) == 3:
                    await asyncio.to_thread(bookies.start, 1)
                    while len(await bk.available_bookies()) < 4:
                        await asyncio.sleep(0.05)
                return await real_create(*a, **kw)
            bk.create_ledger = create_with_spare
            victim = by_addr[ml._lh.ensemble[1]]
            victim.kill9()
            rest, done, errs = await adds_in_call_order(ml, 200, first=50)
            assert not errs, f"{len(errs)} adds failed, e.g. {next(iter(errs.values()))!r}"
            positions = first + rest
            assert done == list(range(50, 250))
            assert strictly_increasing(positions)
            assert len(bookies.procs) == 4, "the ledger never rolled over"
            got = await read_all(ml, 64)
            assert [x for _, x in got] == [d(i) for i in range(250)]
            assert [p for p, _ in got] == positions
            md0 = await bk.ledger_metadata(lid0)
            lst = await ledger_list(store, name)
            assert lst[0]["ledger_id"] == lid0 and lst[0]["entries"] == md0.last_entry_id + 1
            assert md0.state == CLOSED
            assert victim.addr not in ml._lh.ensemble
            await ml.close()
    run(scenario(), timeout=60)
