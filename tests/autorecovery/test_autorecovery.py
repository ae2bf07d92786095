"""Auto-recovery against real ZooKeeper and real bookie processes (loopback): the auditor election,
marking, replicating a closed ledger, a metadata CAS conflict with a live writer, the open-ledger
grace path, and 3 bookies (no spare: nothing changes) then a 4th (everything replicated).

Semantics follow BookKeeper's auto-recovery (https://bookkeeper.apache.org/docs/admin/autorecovery,
replication/Auditor.java, ReplicationWorker.java, LedgerFragmentReplicator.java,
meta/ZkLedgerUnderreplicationManager.java)."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from clusters.autorecovery import ReplicationWorker, lock_path, stats, ur_path
from clusters.bookkeeper.admin import BookKeeperAdmin, fragments
from clusters.bookkeeper.errors import BKLedgerClosedError, BKLedgerFencedError
from clusters.bookkeeper.metadata import CLOSED, OPEN, LedgerMetadata, ledger_path
from clusters.metadata.store import MetadataStore
from clusters.metrics import scrape

from .conftest import MANUAL, autorecovery, client, gone_from_zk, payload, run, wait_until

pytestmark = pytest.mark.timeout(150)


async def write_ledger(bk, n: int, close: bool = True, E: int = 3, Qw: int = 2, Qa: int = 2):
    lh = await bk.create_ledger(E, Qw, Qa)
    futs = [lh.add_entry_async(payload(lh.ledger_id, i)) for i in range(n)]
    assert await asyncio.gather(*futs) == list(range(n))
    if close:
        await lh.close()
    return lh


async def assert_two_live_copies(bk, lid: int, live: set[str], n: int) -> LedgerMetadata:
    md = await bk.ledger_metadata(lid)
    assert md.state == CLOSED
    assert md.bookies() <= live, f"ledger {lid} still on {md.bookies() - live}"
    got = await BookKeeperAdmin(bk).check_copies(md, live)
    assert got["problems"] == []
    assert got["entries"] == n and got["copies"] == 2 * n
    rh = await bk.open_ledger(lid, recovery=False)
    assert await rh.read(0, n - 1) == [payload(lid, i) for i in range(n)]
    return md


def test_paths_and_fragments():
    assert ur_path(42) == "/ledgers/underreplication/ledgers/0000/0000/0000/002a/urL0000000042"
    assert ur_path(0x1234_5678_9ABC) == \
        "/ledgers/underreplication/ledgers/0000/1234/5678/9abc/urL" + f"{0x123456789ABC:010d}"
    assert lock_path(7) == "/ledgers/underreplication/locks/urL0000000007"
    md = LedgerMetadata(5, 3, 2, 2, CLOSED, 14, 0, 0, {0: ["a", "b", "c"], 10: ["d", "b", "c"],
                                                        20: ["d", "e", "c"]})
    fr = fragments(md)
    assert [(f.key, f.first, f.last) for f in fr] == [(0, 0, 9), (10, 10, 14), (20, 20, 14)]
    # E=3, Qw=2: entry e is on indexes e%3 and (e+1)%3
    assert fr[0].entries_of(0, 3, 2) == [0, 2, 3, 5, 6, 8, 9]
    assert fr[2].entries_of(0, 3, 2) == []           # an empty trailing fragment
    md.state, md.last_entry_id = OPEN, -1
    assert fragments(md)[-1].last is None and not fragments(md)[-1].closed


def test_auditor_election_two_candidates(zk):
    async def scenario():
        async with client(zk) as (_store, _bk, _urm):
            async with autorecovery(zk, "10.0.0.1:3181", worker=False) as a:
                await wait_until(lambda: a.is_auditor, 10, "the first candidate to be elected")
                async with autorecovery(zk, "10.0.0.2:3181", worker=False) as b:
                    await asyncio.sleep(1.0)
                    assert a.is_auditor and not b.is_auditor, "exactly one auditor"
                    assert await b.auditor_of() == "10.0.0.1:3181"
                    await a.stop()        # its session closes: the vote goes at once
                    await wait_until(lambda: b.is_auditor, 15, "the second candidate to take over")
                    assert await b.auditor_of() == "10.0.0.2:3181"
                    async with autorecovery(zk, "10.0.0.3:3181", worker=False) as c:
                        await asyncio.sleep(1.0)
                        assert b.is_auditor and not c.is_auditor
    run(scenario())


def test_auditor_marks_only_ledgers_on_the_lost_bookie(bookies, zk):
    procs = bookies.start(4, **MANUAL)

    async def scenario():
        async with client(zk, 4) as (store, bk, urm):
            lhs = [await write_ledger(bk, 12) for _ in range(8)]
            mds = {lh.ledger_id: await bk.ledger_metadata(lh.ledger_id) for lh in lhs}
            counts = {p.addr: sum(p.addr in md.bookies() for md in mds.values()) for p in procs}
            # a victim that some ledgers hold and some do not (each ledger leaves one bookie out)
            victim = next(p for p in sorted(procs, key=lambda p: counts[p.addr])
                          if 0 < counts[p.addr] < len(mds))
            expect = sorted(lid for lid, md in mds.items() if victim.addr in md.bookies())
            marked_before = stats.LEDGERS_MARKED.value()
            async with autorecovery(zk, "auditor:1", worker=False,
                                    lost_bookie_recovery_delay_s=1.0) as ar:
                await wait_until(lambda: ar.is_auditor, 10, "election")
                assert await urm.list() == []
                victim.kill9()
                await wait_until(urm.list, 30, "ledgers marked under-replicated")
                await asyncio.sleep(1.0)        # one audit marks them all; nothing more follows
                assert await urm.list() == expect
                for lid in expect:
                    data, _ = await store.get(ur_path(lid))     # BookKeeper's hierarchical path
                    rec = json.loads(data)
                    assert rec["replicas"] == [victim.addr] and rec["auditor"] == "auditor:1"
                assert stats.LEDGERS_MARKED.value() - marked_before == len(expect)
                # a full audit again marks nothing new
                marked = await ar.auditor.audit()
                assert sorted(marked) == expect
                assert stats.LEDGERS_MARKED.value() - marked_before == len(expect)
                for md in mds.values():   # the auditor never touches ledger metadata
                    assert (await bk.ledger_metadata(md.ledger_id)).version == md.version
    run(scenario())


def test_worker_replicates_a_closed_ledger(bookies, zk):
    procs = bookies.start(4, **MANUAL)
    by_addr = {p.addr: p for p in procs}

    async def scenario():
        async with client(zk, 4) as (store, bk, urm):
            n = 100
            lh = await write_ledger(bk, n)
            lid = lh.ledger_id
            md0 = await bk.ledger_metadata(lid)
            ens = md0.ensembles[0]
            victim, spare = ens[1], next(a for a in by_addr if a not in ens)
            admin = BookKeeperAdmin(bk)
            before = {}                          # a surviving copy of every entry
            for e in range(n):
                survivor = ens[next(i for i in (e % 3, (e + 1) % 3) if i != 1)]
                before[e] = await admin.read_entry_from(survivor, lid, e)
            by_addr[victim].kill9()
            await gone_from_zk(bk, victim)
            assert await urm.mark(lid, {victim}, "test")
            copied0 = stats.ENTRIES_COPIED.value()
            w = ReplicationWorker(bk, urm, "worker:1", grace_s=30)
            assert await w.run_once() == {lid: "replicated"}
            assert await urm.list() == []
            assert await store.get_or_none(lock_path(lid)) is None, "lock released"
            md = await bk.ledger_metadata(lid)
            assert md.ensembles == {0: [ens[0], spare, ens[2]]}
            assert (md.state, md.last_entry_id, md.length) == \
                (CLOSED, md0.last_entry_id, md0.length)
            # exactly the entries whose write set holds index 1, byte for byte as written
            moved = [e for e in range(n) if 1 in ((e % 3), (e + 1) % 3)]
            assert stats.ENTRIES_COPIED.value() - copied0 == len(moved)
            for e in moved:
                assert await admin.read_entry_from(spare, lid, e) == before[e]
            await assert_two_live_copies(bk, lid, set(by_addr) - {victim}, n)
    run(scenario())


def test_metadata_cas_conflict_with_a_live_writer(bookies, zk):
    """The ledger stays open and its writer keeps writing: it replaces the dead bookie itself for
    new entries, the worker repairs the older fragment; a concurrent metadata change makes the
    worker's CAS fail once, and the writer's later close must not undo the swap."""
    procs = bookies.start(4, **MANUAL)
    by_addr = {p.addr: p for p in procs}

    async def scenario():
        async with client(zk, 4, name="writer") as (store, bk, urm), \
                client(zk, 4, name="other") as (_s2, bk2, _u2):
            lh = await write_ledger(bk, 30, close=False)
            lid = lh.ledger_id
            a, b, c = lh.ensemble
            by_addr[a].kill9()
            for i in range(30, 60):        # the writer's ensemble change: a -> d at entry 30
                assert await lh.add_entry(payload(lid, i)) == i
            md = await bk.ledger_metadata(lid)
            assert md.state == OPEN and sorted(md.ensembles) == [0, 30]
            d = md.ensembles[30][0]
            assert md.ensembles[30] == [d, b, c] and d not in (a, b, c)
            await gone_from_zk(bk, a)
            await urm.mark(lid, {a}, "test")

            w = ReplicationWorker(bk2, urm, "worker:1", grace_s=300)
            seen = []

            async def concurrent_change(md_at_copy, frag, index, target):
                seen.append((frag.key, frag.first, frag.last, index, target))
                await bk._update_metadata(await bk.ledger_metadata(lid), lambda m: True,
                                          lambda m: m.copy(custom={**m.custom, "touched": 1}))
            w.before_swap = concurrent_change
            conflicts0 = stats.METADATA_CONFLICTS.value()
            assert await w.run_once() == {lid: "replicated"}
            assert seen == [(0, 0, 29, 0, d)]
            assert stats.METADATA_CONFLICTS.value() - conflicts0 >= 1
            md = await bk.ledger_metadata(lid)
            assert md.custom.get("touched") == 1, "the concurrent change was lost"
            assert md.ensembles == {0: [d, b, c], 30: [d, b, c]} and md.state == OPEN
            # someone replacing a bookie that is already replaced changes nothing
            again, wrote = await BookKeeperAdmin(bk2).replace_bookie(lid, 0, 0, a, "x:1", (0, 29))
            assert not wrote and again.version == md.version

            for i in range(60, 70):           # the writer goes on with stale metadata
                assert await lh.add_entry(payload(lid, i)) == i
            await lh.close()
            md = await bk.ledger_metadata(lid)
            assert md.state == CLOSED and md.last_entry_id == 69
            assert md.ensembles == {0: [d, b, c], 30: [d, b, c]}, "the close undid the swap"
            await assert_two_live_copies(bk, lid, set(by_addr) - {a}, 70)
    run(scenario())


def test_open_ledger_waits_the_grace_period_then_fences_the_writer(bookies, zk):
    procs = bookies.start(4, **MANUAL)
    by_addr = {p.addr: p for p in procs}

    async def scenario():
        async with client(zk, 4, name="writer") as (store, bk, urm), \
                client(zk, 4, name="worker") as (_s2, bk2, _u2):
            lh = await bk.create_ledger(3, 2, 2)
            lid = lh.ledger_id
            for i in range(20):     # one at a time: the bookies learn LAC 18 from entry 19, so
                await lh.add_entry(payload(lid, i))    # recovery leaves entries 0..18 in place
            a, b, c = lh.ensemble
            victim = a
            by_addr[victim].kill9()
            await gone_from_zk(bk, victim)
            await urm.mark(lid, {victim}, "test")
            w = ReplicationWorker(bk2, urm, "worker:1", grace_s=2.0, backoff_s=0.2)
            t0 = time.monotonic()
            assert await w.run_once() == {lid: "deferred"}
            md = await bk.ledger_metadata(lid)
            assert md.state == OPEN and victim in md.current_ensemble
            assert await urm.list() == [lid]
            assert await w.run_once() == {}, "not due again before the grace period"
            fenced0 = stats.OPEN_LEDGERS_RECOVERED.value()
            copied0 = stats.ENTRIES_COPIED.value()
            got = await wait_until(w.run_once, 10, "the grace period to end", interval=0.2)
            assert got == {lid: "replicated"} and time.monotonic() - t0 >= 2.0
            assert stats.OPEN_LEDGERS_RECOVERED.value() - fenced0 == 1
            assert await urm.list() == []
            md = await bk.ledger_metadata(lid)
            assert md.state == CLOSED and md.last_entry_id == 19
            # recovered as closed, then its fragment copied: 13 of the 20 entries were on index 0
            d = next(x for x in by_addr if x not in (a, b, c))
            assert md.ensembles == {0: [d, b, c]}
            assert stats.ENTRIES_COPIED.value() - copied0 == 13
            with pytest.raises((BKLedgerFencedError, BKLedgerClosedError)):
                await lh.add_entry(b"after the fence")
            await assert_two_live_copies(bk, lid, set(by_addr) - {victim}, 20)
    run(scenario())


def _metrics(proc) -> dict[str, float]:
    return scrape(f"http://127.0.0.1:{proc.cfg.http_port}", timeout=5)


def test_three_bookies_no_spare_then_a_fourth(bookies, zk):
    """Auto-recovery running inside the bookie processes.  With 3 bookies and E=3 every ensemble
    already holds every bookie, so a lost bookie has no replacement: the ledgers are marked, the
    workers report "not enough bookies", and no metadata changes.  A 4th bookie then lets the
    workers replicate everything."""
    settings = dict(autorecovery_enabled=True, zk_session_timeout=2.0,
                    lost_bookie_recovery_delay_s=0.5, rereplication_backoff_s=0.3,
                    open_ledger_rereplication_grace_s=2.0)
    procs = bookies.start(3, **settings)

    async def scenario():
        async with client(zk, 3) as (store, bk, urm):
            lids = [(await write_ledger(bk, 30)).ledger_id for _ in range(3)]
            raw = {lid: await store.get(ledger_path(lid)) for lid in lids}
            victim = procs[0]
            victim.kill9()

            async def all_failed() -> bool:
                if await urm.list() != lids:
                    return False
                for lid in lids:
                    rec, _ = await urm.get(lid)
                    if rec["replicas"] != [victim.addr] or "not_enough_bookies" not in \
                            (rec.get("last_failure") or {}).get("error", ""):
                        return False
                return True
            await wait_until(all_failed, 40, "every ledger marked and a worker's failure noted")
            rec, _ = await urm.get(lids[0])
            assert "not enough bookies" in rec["last_failure"]["error"]
            await asyncio.sleep(1.0)
            for lid in lids:
                assert await store.get(ledger_path(lid)) == raw[lid], "metadata changed"
            live_procs = procs[1:]
            series = 'bookkeeper_autorecovery_failures_total{reason="not_enough_bookies"}'
            assert sum(_metrics(p).get(series, 0) for p in live_procs) > 0
            assert sum(_metrics(p)["bookkeeper_autorecovery_auditor"] for p in live_procs) == 1

            fourth = bookies.start(1, **settings)[0]
            live = {p.addr for p in live_procs} | {fourth.addr}

            async def repaired() -> bool:
                if await urm.list():
                    return False
                mds = [await bk.ledger_metadata(lid) for lid in lids]
                return all(victim.addr not in md.bookies() for md in mds)
            await wait_until(repaired, 40, "every ledger replicated onto the 4th bookie")
            for lid in lids:
                md = await assert_two_live_copies(bk, lid, live, 30)
                assert fourth.addr in md.bookies()
            copied = sum(_metrics(p).get("bookkeeper_autorecovery_entries_copied_total", 0)
                         for p in [*live_procs, fourth])
            assert copied >= 3 * 20          # 2 of every 3 entries were on the lost bookie
    run(scenario(), timeout=130)


def test_a_bookie_formatted_at_the_same_address_is_replicated_off(bookies, zk):
    """apache/bookkeeper#4812: a bookie wiped and formatted comes back as a new bookie under its old
    address. It refuses its wiped disk (cookie), is formatted, and at its new first start marks the
    ledgers the metadata lists it in as under-replicated with itself `formatted`: the worker then
    moves its fragments to a spare although a bookie with that id is registered (a record without
    `formatted` would change nothing: the bookie counts as live)."""
    import shutil
    from pathlib import Path

    from clusters.bookie import cookie
    from clusters.bookie import protocol as P
    from tests.bookie.test_bookie import RawClient
    procs = bookies.start(4, **MANUAL)
    by_addr = {p.addr: p for p in procs}

    async def write():
        async with client(zk, 4) as (_store, bk, _urm):
            lh = await write_ledger(bk, 30)
            return lh.ledger_id, (await bk.ledger_metadata(lh.ledger_id)).ensembles[0]
    lid, ens = run(write())
    victim = by_addr[ens[1]]
    victim.kill9()
    for p in Path(victim.cfg.data_dir).iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    victim.start(wait=False)
    victim.proc.wait(30)
    assert victim.proc.returncode == 3 and "cookie is missing" in victim.log_tail(5)

    async def fmt():
        store = await MetadataStore(zk).start()
        try:
            return await cookie.format_bookie(store, victim.addr, victim.cfg.data_dir)
        finally:
            await store.close()
    assert run(fmt())["cookie_deleted"] is True
    victim.start()

    async def scenario():
        async with client(zk, 4) as (_store, bk, urm):
            rec, _ = await urm.get(lid)
            assert rec["replicas"] == [victim.addr] and rec["formatted"] == [victim.addr]
            w = ReplicationWorker(bk, urm, "worker:1", grace_s=30)
            outcome, md = await w.replicate_ledger(lid, {victim.addr})      # without `formatted`
            assert outcome == "replicated" and md.ensembles == {0: ens}      # nothing moved
            assert await w.run_once() == {lid: "replicated"}
            assert await urm.list() == []
            md = await bk.ledger_metadata(lid)
            spare = next(a for a in by_addr if a not in ens)
            assert md.ensembles == {0: [ens[0], spare, ens[2]]}
            await assert_two_live_copies(bk, lid, set(by_addr) - {victim.addr}, 30)
            c = await RawClient(victim.cfg.port).connect()
            try:
                assert (await c.read(lid, 1))[0] == P.ERROR     # still in limbo there, never "absent"
            finally:
                await c.close()
    run(scenario())
