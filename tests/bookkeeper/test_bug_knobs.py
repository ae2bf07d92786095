"""The BookKeeper client's bug knobs against real bookie processes, each with the knob and without:
the exact interleaving of the upstream report, made with the client's targeted request faults
(`ChannelPool.fault`: a request lost or late on one connection).

- bk.recovery_reads_no_fence (apache/bookkeeper#2614): the fencing LAC read to one bookie is lost;
- bk.recovery_min_lac_minus_one (apache/bookkeeper#2615): an empty last fragment, a lost write-back;
- bk.ack_broken_entry_on_ensemble_change (apache/bookkeeper#3005): a completed add behind one that
  completes during an ensemble change;
- bk.delayed_ensemble_change_local_only (apache/bookkeeper#1591): bookies failing after Qa one after
  another while the metadata store stalls.
"""
from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from clusters.bookie import protocol as P
from clusters.bookkeeper.channel import DROP, Answer
from clusters.bookkeeper.client import BookKeeper
from clusters.bookkeeper.errors import (BKInvalidEnsembleError, BKLedgerClosedError, BKLedgerFencedError,
                                        BKNoSuchEntryError)
from clusters.bookkeeper.metadata import CLOSED
from clusters.bugs import Knobs
from clusters.metadata.store import MetadataStore

pytestmark = pytest.mark.timeout(90)


def data(i: int) -> bytes:
    return b"entry-%d" % i


@contextlib.asynccontextmanager
async def client(zk: str, n_bookies: int, name: str, bugs: dict | None = None, **kw):
    store = await MetadataStore(zk, name=name).start()
    bk = await BookKeeper(store, name=name, knobs=Knobs(bugs, "bookkeeper-client"), **kw).start()
    try:
        deadline = time.monotonic() + 20
        while len(await bk.available_bookies()) < n_bookies:
            assert time.monotonic() < deadline, "bookies did not register"
            await asyncio.sleep(0.05)
        yield bk
    finally:
        await bk.close()
        await store.close()


def test_recovery_reads_without_fence_let_the_old_writer_ack_past_the_close(bookies, zk):
    """E = Qw = Qa = 2. The writer's entry 5 is on bookie A (Qa - 1 copies), its add to bookie B late;
    the recoverer's fencing LAC read to B is lost (coverage needs A only) and A answers reads slowly, so
    B's 'no such entry' decides entry 5 absent: closed at 4. With fencing reads B is fenced by that
    read and refuses the late add (the writer is fenced); without, B stores it and the writer gets entry
    5 acknowledged beyond the close."""
    bookies.start(2)

    async def once(knob: bool) -> tuple[int, object]:
        bugs = {"bk.recovery_reads_no_fence": True} if knob else None
        async with client(zk, 2, "w") as w, client(zk, 2, "r", bugs=bugs) as r:
            lh = await w.create_ledger(2, 2, 2)
            for i in range(5):
                await lh.add_entry(data(i))
            a, b = lh.ensemble
            w.pool.fault = lambda addr, op, flags, ledger, entry: (
                1.0 if op == P.ADD and addr == b else None)
            r.pool.fault = lambda addr, op, flags, ledger, entry: (
                DROP if op == P.READ and flags & P.FLAG_DO_FENCING and entry == P.INVALID_ENTRY and addr == b
                else 0.3 if op == P.READ and entry != P.INVALID_ENTRY and addr == a else None)
            fut = lh.add_entry_async(data(5))
            await asyncio.sleep(0.2)                       # entry 5 is on A only
            rh = await r.open_ledger(lh.ledger_id, recovery=True)
            assert rh.metadata.state == CLOSED
            try:
                got: object = await asyncio.wait_for(fut, 10)
            except Exception as e:
                got = e
            return rh.last_entry_id, got

    closed, got = asyncio.run(once(knob=False))
    assert closed == 4 and isinstance(got, BKLedgerFencedError), (closed, got)
    closed, got = asyncio.run(once(knob=True))
    assert closed == 4 and got == 5, (closed, got)          # acknowledged beyond the close: truncation


def test_recovery_without_the_lac_floor_builds_an_invalid_fragment(bookies, zk):
    """E = Qw = Qa = 2, four bookies. Entries 0-9 on A, B; the writer's next adds are lost, it replaces
    both bookies (fragment 10: C, D, empty) and dies. The recoverer's write-backs are lost. With the
    floor, recovery starts at 9, finds entry 10 absent and closes at 9; without it, C and D say LAC -1,
    recovery re-adds entry 0 to C, D, the write-back fails and it asks for a fragment at 0 < 10: it
    fails, again on every retry."""
    bookies.start(4)

    async def once(knob: bool) -> object:
        bugs = {"bk.recovery_min_lac_minus_one": True} if knob else None
        async with client(zk, 4, "w") as w, \
                client(zk, 4, "r", bugs=bugs, add_timeout=1.0, read_timeout=2.0) as r:
            lh = await w.create_ledger(2, 2, 2)
            for i in range(10):
                await lh.add_entry(data(i))
            # the writer's ensemble change after both its bookies failed entry 10 (its own code path)
            new = await lh._change_ensemble(dict(enumerate(lh.ensemble)))
            md = await w.ledger_metadata(lh.ledger_id)
            assert sorted(md.ensembles) == [0, 10] and md.ensembles[10] == new
            r.pool.fault = lambda addr, op, flags, ledger, entry: (
                DROP if op == P.ADD and flags & P.FLAG_RECOVERY_ADD else None)
            out = []
            for _ in range(2):                           # a retry fails the same way
                try:
                    out.append((await r.open_ledger(lh.ledger_id, recovery=True)).last_entry_id)
                except Exception as e:
                    out.append(e)
            return out

    assert asyncio.run(once(knob=False)) == [9, 9]
    got = asyncio.run(once(knob=True))
    assert all(isinstance(g, BKInvalidEnsembleError) for g in got), got
    assert "below the last fragment 10" in str(got[0]) or "< 10" in str(got[0]), got


def test_ack_of_a_broken_entry_during_an_ensemble_change(bookies, zk):
    """BookKeeper's own example (apache/bookkeeper#3005): E = 2, Qw = Qa = 1. Entry 1 completes on B
    while entry 0 waits for A; B dies (entry 3 fails) and the ensemble change (slow metadata store)
    replaces it from entry 0 on; entry 0 completes during the change. Without the knob entry 1 loses B's
    ack and is re-sent to the replacement; with it, entry 0's success callback acknowledges entry 1 too,
    which no bookie of its new fragment has."""
    procs = bookies.start(3)
    by_addr = {p.addr: p for p in procs}

    async def once(knob: bool) -> tuple[list, object]:
        bugs = {"bk.ack_broken_entry_on_ensemble_change": True} if knob else None
        async with client(zk, 3, f"w{int(knob)}", bugs=bugs, add_timeout=2.0, read_timeout=2.0) as w:
            lh = await w.create_ledger(2, 1, 1)
            a, b = lh.ensemble
            w.pool.fault = lambda addr, op, flags, ledger, entry: 0.4 if op == P.ADD and addr == a else None
            choose = w._choose_bookies

            async def slow_choose(n, exclude):           # a slow metadata store during the change
                await asyncio.sleep(0.8)
                return await choose(n, exclude)
            w._choose_bookies = slow_choose
            e0, e1 = lh.add_entry_async(data(0)), lh.add_entry_async(data(1))
            deadline = time.monotonic() + 5
            while not lh._pending[1].completed:          # entry 1 stored on B, waiting behind entry 0
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            by_addr[b].kill9()
            e2, e3 = lh.add_entry_async(data(2)), lh.add_entry_async(data(3))
            acked = await asyncio.gather(e0, e1, e2, e3)
            assert b not in lh.ensemble
            try:
                got: object = await lh.read(1, 1)
            except Exception as e:
                got = e
            return acked, got

    acked, got = asyncio.run(once(knob=False))
    assert acked == [0, 1, 2, 3] and got == [data(1)], (acked, got)
    by_addr_alive = [p for p in procs if not p.alive()]
    for p in by_addr_alive:
        p.start()
    acked, got = asyncio.run(once(knob=True))
    assert acked == [0, 1, 2, 3] and isinstance(got, BKNoSuchEntryError), (acked, got)


def test_deferred_replacements_only_local_while_the_metadata_store_stalls(bookies, zk):
    """The issue's own example (apache/bookkeeper#1591): E = 3, Qw = 3, Qa = 2, six bookies. The writer's
    metadata writes stall (ZooKeeper not answering them); the bookies of the first ensemble refuse its
    adds one after another (from entries 10, 20, 30), each refusal after the other two acknowledged, so
    after Qa. Without the knob the first replacement holds every acknowledgement until the new ensemble
    is stored: a recovery meanwhile closes the ledger at the last acknowledged entry, and the writer's
    change then fails. With the knob each replacement is local, acknowledgements go on, the whole
    write set moves to bookies the stored ensemble does not name, and the recovery (which fences and
    reads the stored ensemble) closes the ledger before entries the writer had acknowledged."""
    bookies.start(6)

    async def once(knob: bool) -> tuple[list[int], int, list[str], object]:
        bugs = {"bk.delayed_ensemble_change_local_only": True} if knob else None
        async with client(zk, 6, f"w{int(knob)}", bugs=bugs) as w, client(zk, 6, f"r{int(knob)}") as r:
            lh = await w.create_ledger(3, 3, 2)
            first = list(lh.ensemble)
            w.pool.fault = lambda addr, op, flags, ledger, entry: (
                Answer(P.ERROR, 0.2) if op == P.ADD and addr in first and entry >= 10 * (first.index(addr) + 1)
                else None)
            stalled = asyncio.Event()
            set_ = w.store.set

            async def stalled_set(*a, **kw):             # ZooKeeper takes none of the writer's writes
                await stalled.wait()
                return await set_(*a, **kw)
            w.store.set = stalled_set
            acked: list[int] = []
            pending = None
            for i in range(45):
                fut = lh.add_entry_async(data(i))
                try:
                    acked.append(await asyncio.wait_for(asyncio.shield(fut), 1.0))
                except asyncio.TimeoutError:
                    pending = fut                        # held back by the stalled ensemble change
                    break
                await asyncio.sleep(0.03)
            rh = await r.open_ledger(lh.ledger_id, recovery=True)
            assert rh.metadata.state == CLOSED and rh.metadata.ensembles == {0: first}, rh.metadata
            stalled.set()                                # the writer's metadata update now fails
            deadline = time.monotonic() + 10
            while lh._error is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            outcome: object = None
            try:
                outcome = await asyncio.wait_for(pending if pending is not None else lh.add_entry_async(b"x"), 10)
            except Exception as e:
                outcome = e
            return acked, rh.last_entry_id, list(lh.ensemble), outcome

    acked, closed, ens, outcome = asyncio.run(once(knob=False))
    assert acked == list(range(len(acked))) and 10 <= len(acked) < 30, acked    # held at the first change
    assert closed == acked[-1], (closed, acked)                                  # nothing acknowledged is lost
    assert isinstance(outcome, BKLedgerClosedError), outcome
    acked, closed, ens, outcome = asyncio.run(once(knob=True))
    assert acked == list(range(45)), acked                                       # never held back
    assert closed < acked[-1], (closed, acked)                                   # acknowledged beyond the close
    assert isinstance(outcome, (BKLedgerClosedError, BKLedgerFencedError)), outcome
