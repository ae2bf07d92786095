"""The BookKeeper client against real bookie processes: pipelined striped writes, ensemble
changes under kill -9, recovery with and without fencing."""
from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from clusters.bookie import protocol as P
from clusters.bookkeeper.channel import Answer
from clusters.bookkeeper.client import BookKeeper
from clusters.bookkeeper.errors import (BKError, BKLedgerClosedError, BKLedgerFencedError,
                                        BKNoSuchEntryError, BKNoSuchLedgerError,
                                        BKNotEnoughBookiesError)
from clusters.bookkeeper.metadata import (CLOSED, OPEN, LedgerMetadata, ledger_path,
                                          parse_ledger_path)
from clusters.metadata.store import MetadataStore

pytestmark = pytest.mark.timeout(90)


def data(i: int) -> bytes:
    return (b"%08d-" % i) + b"x" * 91          # 100 bytes


@contextlib.asynccontextmanager
async def client(zk: str, n_bookies: int, name: str = "c", **kw):
    store = await MetadataStore(zk, name=name).start()
    bk = await BookKeeper(store, name=name, **kw).start()
    try:
        deadline = time.monotonic() + 20
        while len(await bk.available_bookies()) < n_bookies:
            assert time.monotonic() < deadline, "bookies did not register"
            await asyncio.sleep(0.05)
        yield bk
    finally:
        await bk.close()
        await store.close()


def test_metadata_paths_and_serialization():
    assert ledger_path(42) == "/ledgers/00/0000/L0042"
    assert ledger_path(1234567890) == "/ledgers/12/3456/L7890"
    assert parse_ledger_path(ledger_path(987654)) == 987654
    md = LedgerMetadata(7, 3, 2, 2, OPEN, -1, 0, 1, {0: ["a:1", "b:1", "c:1"],
                                                     10: ["a:1", "d:1", "c:1"]}, {"k": "v"})
    back = LedgerMetadata.deserialize(md.serialize(), 3)
    assert back.ensembles == md.ensembles and back.version == 3 and back.custom == {"k": "v"}
    assert md.ensemble_for(9) == ["a:1", "b:1", "c:1"]
    assert md.ensemble_for(10) == md.ensemble_for(500) == ["a:1", "d:1", "c:1"]


def test_pipelined_adds_in_order_and_read_back(bookies, zk):
    bookies.start(3)

    async def scenario():
        async with client(zk, 3) as bk:
            with pytest.raises(BKNotEnoughBookiesError):
                await bk.create_ledger(4, 2, 2)
            with pytest.raises(ValueError):
                await bk.create_ledger(3, 2, 3)
            lh = await bk.create_ledger(3, 2, 2, custom={"topic": "t"})
            assert lh.last_add_confirmed == -1
            order: list[int] = []

            async def one(i: int) -> int:
                eid = await lh.add_entry(data(i))
                order.append(eid)
                return eid
            t0 = time.monotonic()
            tasks = [asyncio.create_task(one(i)) for i in range(1000)]
            ids = await asyncio.gather(*tasks)
            elapsed = time.monotonic() - t0
            assert ids == list(range(1000))
            assert order == list(range(1000)), "completions out of entry-id order"
            assert lh.last_add_confirmed == 999
            got = await lh.read(0, 999)
            assert got == [data(i) for i in range(1000)]
            with pytest.raises(BKNoSuchEntryError):
                await lh.read(0, 1000)
            # a reader of the still-open ledger learns the LAC piggy-backed on later adds (all
            # 1000 adds above were sent before any ack, so they all carried LAC -1)
            rh = await bk.open_ledger(lh.ledger_id, recovery=False)
            assert rh.metadata.state == OPEN
            assert await rh.read_lac() == -1
            with pytest.raises(BKNoSuchEntryError):
                await rh.read(0, 0)
            assert await lh.add_entry(data(1000)) == 1000
            assert await rh.read_lac() == 999
            assert (await rh.read(990, 999)) == [data(i) for i in range(990, 1000)]
            await lh.close()
            md = await bk.ledger_metadata(lh.ledger_id)
            assert md.state == CLOSED and md.last_entry_id == 1000
            assert md.length == 100 * 1001 and md.custom == {"topic": "t"}
            with pytest.raises(BKLedgerClosedError):
                await lh.add_entry(b"after close")
            rh = await bk.open_ledger(lh.ledger_id)
            assert rh.last_entry_id == 1000
            assert (await rh.read(500, 1000)) == [data(i) for i in range(500, 1001)]
            with pytest.raises(BKNoSuchEntryError):
                await rh.read(1000, 1001)
            # deletion
            await bk.delete_ledger(lh.ledger_id)
            with pytest.raises(BKNoSuchLedgerError):
                await bk.open_ledger(lh.ledger_id)
            return elapsed
    elapsed = asyncio.run(scenario())
    print(f"1000 pipelined 3/2/2 adds in {elapsed:.3f}s")


def test_close_waits_for_in_flight_adds(bookies, zk):
    bookies.start(3)

    async def scenario():
        async with client(zk, 3) as bk:
            lh = await bk.create_ledger(3, 2, 2)
            futs = [lh.add_entry_async(data(i)) for i in range(300)]
            await lh.close()
            assert [f.result() for f in futs] == list(range(300))
            md = await bk.ledger_metadata(lh.ledger_id)
            assert md.state == CLOSED and md.last_entry_id == 299
            await lh.close()                                  # idempotent
    asyncio.run(scenario())


def test_kill9_bookie_mid_stream_ensemble_change(bookies, zk):
    from clusters.bookkeeper.client import ENSEMBLE_CHANGES, PENDING_ADDS
    procs = bookies.start(4)
    by_addr = {b.addr: b for b in procs}
    changes_before, pending_before = ENSEMBLE_CHANGES.value(), PENDING_ADDS.value()

    async def scenario():
        async with client(zk, 4, add_timeout=3.0) as bk:
            lh = await bk.create_ledger(3, 2, 2)
            victim = by_addr[lh.ensemble[1]]
            acked: dict[int, int] = {}
            failures: list[BaseException] = []

            async def writer():
                futs = []
                for i in range(3000):
                    fut = lh.add_entry_async(data(i))
                    futs.append((i, fut))
                    if i == 1000:
                        victim.kill9()          # SIGKILL a bookie of the ensemble mid-stream
                    if i % 50 == 0:
                        await asyncio.sleep(0.005)
                for i, fut in futs:
                    try:
                        acked[await fut] = i
                    except BKError as e:
                        failures.append(e)
            await writer()
            assert not failures, failures[:3]
            assert sorted(acked) == list(range(3000))
            assert all(acked[e] == e for e in acked)
            md = await bk.ledger_metadata(lh.ledger_id)
            assert len(md.ensembles) >= 2, md.ensembles
            assert victim.addr not in md.current_ensemble
            assert lh.ensemble_changes >= 1
            # the process's metrics saw it: one change counted per change, nothing left pending
            assert ENSEMBLE_CHANGES.value() - changes_before == lh.ensemble_changes
            assert PENDING_ADDS.value() == pending_before
            # nothing acknowledged is lost: read everything back through a fresh reader
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id, recovery=False)
            assert rh.last_entry_id == 2999
            assert await rh.read(0, 2999) == [data(i) for i in range(3000)]
    asyncio.run(scenario())


def test_recovery_fences_the_old_writer(bookies, zk):
    bookies.start(3)

    async def scenario():
        async with client(zk, 3, name="w") as bk1, client(zk, 3, name="r") as bk2:
            lh = await bk1.create_ledger(3, 2, 2)
            for i in range(200):
                lh.add_entry_async(data(i))
            last_acked = await lh.add_entry(data(200))
            # some adds still in flight while the other client recovers
            inflight = [lh.add_entry_async(data(i)) for i in range(201, 260)]
            from clusters.bookkeeper.client import RECOVERIES
            fenced_before = RECOVERIES.value("true")
            rh = await bk2.open_ledger(lh.ledger_id, recovery=True)
            assert rh.metadata.state == CLOSED
            assert RECOVERIES.value("true") == fenced_before + 1
            results = await asyncio.gather(*inflight, return_exceptions=True)
            acked = [r for r in results if isinstance(r, int)]
            last_acked = max([last_acked] + acked)
            # every acknowledged entry is inside the recovered ledger, and readable
            assert rh.last_entry_id >= last_acked
            got = await rh.read(0, rh.last_entry_id)
            assert got == [data(i) for i in range(rh.last_entry_id + 1)]
            # the old writer is fenced: its next add fails
            with pytest.raises(BKLedgerFencedError):
                await lh.add_entry(b"after fence")
            with pytest.raises((BKLedgerFencedError, BKLedgerClosedError)):
                await lh.add_entry(b"again")
            # a second recovery converges on the same end
            rh2 = await bk1.open_ledger(lh.ledger_id, recovery=True)
            assert rh2.last_entry_id == rh.last_entry_id
    asyncio.run(scenario())


def test_concurrent_recoveries_converge(bookies, zk):
    bookies.start(3)

    async def scenario():
        async with client(zk, 3, name="w") as bk1, client(zk, 3, name="a") as bka, \
                client(zk, 3, name="b") as bkb:
            lh = await bk1.create_ledger(3, 3, 2)
            futs = [lh.add_entry_async(data(i)) for i in range(500)]
            await futs[300]
            ra, rb = await asyncio.gather(bka.open_ledger(lh.ledger_id),
                                          bkb.open_ledger(lh.ledger_id))
            res = await asyncio.gather(*futs, return_exceptions=True)
            acked = [r for r in res if isinstance(r, int)]
            assert ra.last_entry_id == rb.last_entry_id >= max(acked) >= 300
            assert (await rb.read(0, rb.last_entry_id)) == \
                [data(i) for i in range(rb.last_entry_id + 1)]
    asyncio.run(scenario())


def test_recovery_without_fencing_is_unsafe(bookies, zk):
    """broker.recovery_fencing=false: the ledger is CLOSED in metadata, yet the old writer still
    gets adds acknowledged beyond its last entry - acknowledged data nobody will read."""
    bookies.start(3)

    async def scenario():
        async with client(zk, 3, name="w") as bk1, client(zk, 3, name="r") as bk2:
            lh = await bk1.create_ledger(3, 2, 2)
            for i in range(100):
                await lh.add_entry(data(i))
            rh = await bk2.open_ledger(lh.ledger_id, recovery=True, fence=False)
            assert rh.metadata.state == CLOSED
            closed_at = rh.last_entry_id
            assert closed_at >= 99
            eid = await lh.add_entry(b"acknowledged but lost")   # succeeds: nothing fenced
            assert eid > closed_at
            with pytest.raises(BKNoSuchEntryError):
                await rh.read(eid, eid)
            # the fenced path, for contrast, stops the writer
            rh = await bk2.open_ledger(lh.ledger_id, recovery=True, fence=True)
            assert rh.last_entry_id == closed_at          # already CLOSED: nothing to do
    asyncio.run(scenario())


def test_recovery_with_a_dead_bookie_and_empty_ledger(bookies, zk):
    procs = bookies.start(4)
    by_addr = {b.addr: b for b in procs}

    async def scenario():
        async with client(zk, 4, name="w", add_timeout=2.0, read_timeout=2.0) as bk1, \
                client(zk, 4, name="r", read_timeout=2.0) as bk2:
            empty = await bk1.create_ledger(3, 2, 2)
            rh = await bk2.open_ledger(empty.ledger_id)
            assert rh.last_entry_id == -1 and rh.metadata.state == CLOSED
            lh = await bk1.create_ledger(3, 2, 2)
            for i in range(300):
                lh.add_entry_async(data(i))
            last = await lh.add_entry(data(300))
            by_addr[lh.ensemble[0]].kill9()    # one bookie of the ensemble is gone for good
            rh = await bk2.open_ledger(lh.ledger_id)
            assert rh.last_entry_id >= last
            assert (await rh.read(0, last)) == [data(i) for i in range(last + 1)]
            with pytest.raises((BKLedgerFencedError, BKLedgerClosedError)):
                for i in range(10):
                    await lh.add_entry(b"nope")
            md = await bk2.ledger_metadata(lh.ledger_id)
            assert md.state == CLOSED
    asyncio.run(scenario())


def test_stalled_bookie_times_out_into_an_ensemble_change(bookies, zk):
    """SIGSTOP (a hung bookie, connection still open): adds time out, the bookie is replaced, and
    its late answers after SIGCONT are ignored."""
    import os
    import signal
    procs = bookies.start(4)
    by_addr = {b.addr: b for b in procs}

    async def scenario():
        async with client(zk, 4, add_timeout=1.0, read_timeout=1.0) as bk:
            lh = await bk.create_ledger(3, 2, 2)
            for i in range(100):
                await lh.add_entry(data(i))
            victim = by_addr[lh.ensemble[2]]
            os.kill(victim.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                futs = [lh.add_entry_async(data(i)) for i in range(100, 400)]
                assert [await f for f in futs] == list(range(100, 400))
                assert time.monotonic() - t0 >= 0.9          # waited for the add timeout
                assert victim.addr not in lh.ensemble
            finally:
                os.kill(victim.pid, signal.SIGCONT)
            for i in range(400, 450):
                assert await lh.add_entry(data(i)) == i
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id)
            assert await rh.read(0, 449) == [data(i) for i in range(450)]
    asyncio.run(scenario())


def test_failures_after_qa_are_deferred_and_delay_ensemble_change_waits_for_qa(bookies, zk):
    """E = 3, Qw = 3, Qa = 2 on five bookies. A bookie refusing an add that already reached Qa is replaced
    when the next add is sent, by the ordinary (stored) ensemble change at LAC + 1 (BookKeeper's deferred
    failure handling). With delay_ensemble_change (BookKeeper's delayEnsembleChange) it is not replaced
    at all, and an add refused by Qw - Qa bookies waits; once a second bookie refuses it too (it can no
    longer reach Qa), both are replaced in one change. Entries 0-7, a refusing from 3, b from 6."""
    bookies.start(5)
    refuse: dict[str, int] = {}            # bookie -> first entry it refuses

    def fault(addr, op, flags, ledger, entry):
        return Answer(P.ERROR, 0.2) if op == P.ADD and entry >= refuse.get(addr, 1 << 62) else None

    async def scenario(delay: bool) -> tuple[dict, dict, dict]:
        refuse.clear()
        async with client(zk, 5, f"d{int(delay)}", delay_ensemble_change=delay) as bk:
            bk.pool.fault = fault
            lh = await bk.create_ledger(3, 3, 2)
            a, b, c = first = list(lh.ensemble)
            refuse[a] = 3
            for i in range(4):
                await lh.add_entry(data(i))      # entry 3 is acknowledged by b and c, refused by a later
            await asyncio.sleep(0.4)
            before = (await bk.ledger_metadata(lh.ledger_id)).ensembles
            assert lh.ensemble == first, lh.ensemble                # nothing replaced until the next add
            await lh.add_entry(data(4))
            after = (await bk.ledger_metadata(lh.ledger_id)).ensembles
            refuse[b] = 6
            got = await asyncio.wait_for(lh.add_entry(data(5)), 10)
            assert got == 5
            await asyncio.sleep(0.4)
            got = await asyncio.wait_for(lh.add_entry(data(6)), 10)
            assert got == 6
            await asyncio.sleep(0.4)
            got = await asyncio.wait_for(lh.add_entry(data(7)), 10)
            assert got == 7
            final = (await bk.ledger_metadata(lh.ledger_id)).ensembles
            return before, after, final

    before, after, final = asyncio.run(scenario(delay=False))
    assert len(before) == 1 and sorted(after) == [0, 4], (before, after)
    first = before[0]
    assert after[4][0] not in first and after[4][1:] == first[1:], after
    assert sorted(final) == [0, 4, 7], final                # b (refusing entry 6 after Qa) at entry 7
    before, after, final = asyncio.run(scenario(delay=True))
    first = before[0]
    assert len(after) == 1, after                           # the refusal after Qa replaced nothing
    assert sorted(final) == [0, 6], final                   # entry 6 could not reach Qa: a and b at once
    assert final[6][0] not in first and final[6][1] not in first and final[6][2] == first[2], final
