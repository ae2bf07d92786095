"""Trimming (Pulsar's internalTrimLedgers), retention by size and time, message TTL, rollover by
age with a timer, reads from one bookie of the write set, and the bookie's deletion and entry-log
garbage collection. Real ZooKeeper and real bookie processes, except the storage-level GC test."""
from __future__ import annotations

import asyncio
import json
import time

import crc32c
import pytest

from clusters.bookie import protocol as BP
from clusters.bookie.storage import LedgerStorage
from clusters.bookkeeper.errors import BKNoSuchLedgerError
from clusters.broker.managed_ledger import ManagedLedger, Position
from clusters.metrics import scrape
from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames
from tests.managed_ledger.conftest import broker_cfg, ml_name, run, session

pytestmark = pytest.mark.timeout(120)


def d(i: int, size: int = 40) -> bytes:
    return (b"%06d-" % i).ljust(size, b"t")


async def ledger_ids(store, name: str) -> list[int]:
    raw, _ = await store.get(f"/managed-ledgers/{name}")
    return [i["ledger_id"] for i in json.loads(raw)["ledgers"]]


async def bookie_statuses(bk, bookies: list[str], ledger_id: int) -> set[int]:
    """What each bookie answers to a read of entry 0 of the ledger (protocol status codes)."""
    loop = asyncio.get_running_loop()
    futs = []
    for addr in bookies:
        f = loop.create_future()
        futs.append(f)
        bk.pool.channel(addr).request(BP.READ, 0, ledger_id, 0, [],
                                      lambda ctx, st, body: ctx.done() or ctx.set_result(st), f, 5.0)
    return set(await asyncio.gather(*futs))


async def assert_gone_from_bookies(bk, bookies: list[str], ledger_id: int) -> None:
    with pytest.raises(BKNoSuchLedgerError):
        await bk.ledger_metadata(ledger_id)
    deadline = time.monotonic() + 10
    while True:        # the bookies are told asynchronously
        got = await bookie_statuses(bk, bookies, ledger_id)
        if got == {BP.NO_SUCH_LEDGER}:
            return
        assert time.monotonic() < deadline, f"bookies still answer {got} for ledger {ledger_id}"
        await asyncio.sleep(0.1)


def test_trim_follows_the_slowest_cursor_and_never_deletes_the_current_ledger(shared_bookies, shared_zk):
    """Retention 0/0: a ledger is deleted once every durable cursor's mark-delete position is past
    it (a mark-delete on the last entry of a closed ledger passes it), never the current ledger;
    the ledger list in ZooKeeper is updated and the bookies no longer hold the ledger."""
    name = ml_name()
    bookies = [b.addr for b in shared_bookies.procs]

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            cfg = broker_cfg(max_entries_per_ledger=10, default_retention_minutes=0,
                             default_retention_size_mb=0)
            ml = await ManagedLedger.open(name, store, bk, cfg)
            a = await ml.open_cursor("a", "earliest")
            b = await ml.open_cursor("b", "earliest")
            ps = [await ml.add_entry(d(i)) for i in range(35)]
            L = sorted({p.ledger_id for p in ps})
            assert len(L) == 4                                   # 10 + 10 + 10 + 5 (current)
            assert await ml.trim_now() == []                     # nothing consumed
            await a.mark_delete(ps[29])                          # a: the last entry of L[2]
            await b.mark_delete(ps[5])                           # b: inside L[0]
            assert await ml.trim_now() == []                     # b still needs L[0]
            await b.mark_delete(ps[19])                          # b: the last entry of L[1]
            assert await ml.trim_now() == L[:2]
            assert await ledger_ids(store, name) == L[2:]
            for lid in L[:2]:
                await assert_gone_from_bookies(bk, bookies, lid)
            assert ml.first_position() == Position(L[2], 0)
            got = await ml.read_entries(ml.first_position(), 100)
            assert [p for p, _ in got] == ps[20:]
            await a.mark_delete(ps[34])
            await b.mark_delete(ps[34])                          # both at the end of the current ledger
            assert await ml.trim_now() == [L[2]]
            assert await ledger_ids(store, name) == [L[3]]       # the current ledger stays
            assert await ml.trim_now() == []
            # deleting the slowest cursor lets the others decide: with none, retention alone decides
            for i in range(35, 50):
                ps.append(await ml.add_entry(d(i)))
            await a.mark_delete(ps[-1])
            await ml.delete_cursor("b")
            await ml.delete_cursor("a")
            deadline = time.monotonic() + 10
            while len(await ledger_ids(store, name)) > 1:         # trimmed in the background
                assert time.monotonic() < deadline, await ledger_ids(store, name)
                await asyncio.sleep(0.1)
            await ml.close()
    run(scenario())


def test_retention_by_size_and_time(shared_bookies, shared_zk):
    """Consumed ledgers are kept while retention needs them: by size, the oldest are deleted while
    what remains is still at least the retention size; by time, a ledger closed more than the
    retention time ago is deleted. -1 keeps everything. With no subscription at all, retention
    alone decides."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            cfg = broker_cfg(max_entries_per_ledger=10, default_retention_minutes=-1,
                             default_retention_size_mb=2)
            ml = await ManagedLedger.open(name, store, bk, cfg)
            cur = await ml.open_cursor("c", "earliest")
            ps = [await ml.add_entry(d(i, 110_000)) for i in range(35)]   # 1.05 MiB per ledger
            L = sorted({p.ledger_id for p in ps})
            await cur.mark_delete(ps[-1])
            # 3.67 MiB in all: dropping L0 leaves 2.62 >= 2; dropping L1 too would leave 1.57 < 2
            assert await ml.trim_now() == [L[0]]
            assert await ml.trim_now() == []
            # by time: retention 1 minute, infinite size; L1 closed 2 minutes ago, L2 just now
            ml.cfg.default_retention_minutes, ml.cfg.default_retention_size_mb = 1, -1
            ml.ledgers[0].timestamp = time.time() - 120
            assert await ml.trim_now() == [L[1]]
            assert await ml.trim_now() == []
            # infinite retention keeps consumed ledgers
            ml.cfg.default_retention_minutes = -1
            ml.ledgers[0].timestamp = time.time() - 3600
            assert await ml.trim_now() == []
            # no subscription: retention alone decides (an unconsumed ledger goes too)
            await ml.delete_cursor("c")
            ml.cfg.default_retention_minutes = 0
            await asyncio.sleep(0.2)
            await ml.trim_now()
            assert await ledger_ids(store, name) == [L[3]]
            await ml.close()
    run(scenario())


def test_namespace_policies_decide_retention_ttl_and_persistence(shared_bookies, shared_zk):
    """The managed ledger reads its namespace's policies (PolicyCache): retention and TTL, and the
    persistence policy (E/Qw/Qa) of the ledgers it creates."""
    from clusters.broker.policies import PolicyCache
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            cfg = broker_cfg(max_entries_per_ledger=5)
            pc = PolicyCache(store, cfg)
            ns = "/".join(name.split("/")[:2])
            await pc.update(ns, {"retention_policies": {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0},
                                 "message_ttl_in_seconds": 30,
                                 "persistence": {"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2,
                                                 "bookkeeperAckQuorum": 1}})
            ml = await ManagedLedger.open(name, store, bk, cfg, policies=pc)
            assert ml.retention() == (0, 0, 30)
            ps = [await ml.add_entry(d(i)) for i in range(12)]
            md = await bk.ledger_metadata(ps[-1].ledger_id)
            assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (2, 2, 1)
            assert len(md.current_ensemble) == 2
            # no cursor, retention 0: every ledger but the current one goes (trimmed after rollovers)
            await ml.trim_now()
            assert await ledger_ids(store, name) == [ps[-1].ledger_id]
            await ml.close()
    run(scenario())


def entry(seq: int, publish_ms: int) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=publish_ms)
    return frames.build_entry(md, b"v%d" % seq)


def test_message_ttl_expires_the_backlog(shared_bookies, shared_zk):
    """Pulsar's PersistentMessageExpiryMonitor: each durable cursor moves past the entries published
    more than the TTL ago (binary search by publish time in the first ledger not wholly expired; a
    closed ledger whose close time is past the TTL expires whole without being read)."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_entries_per_ledger=8))
            now = int(time.time() * 1000)
            old = [await ml.add_entry(entry(i, now - 100_000 + i)) for i in range(13)]   # 8 + 5
            new = [await ml.add_entry(entry(i, now + i)) for i in range(13, 20)]
            slow = await ml.open_cursor("slow", "earliest")
            fast = await ml.open_cursor("fast", "earliest")
            await fast.mark_delete(new[2])
            seen: list[Position] = []
            slow.attach(on_expire=lambda p: (seen.append(p), slow.update(p)))
            assert await ml.expire_messages(ttl_s=3600) == {}              # nothing that old
            got = await ml.expire_messages(ttl_s=50)
            assert got == {"slow": old[-1]} and seen == [old[-1]]
            assert slow.mark_delete_position == old[-1]
            assert fast.mark_delete_position == new[2]                      # already past them
            # ledgers closed before the cutoff expire whole, whatever their entries' publish times
            c2 = await ml.open_cursor("c2", "earliest")
            for info in ml.ledgers[:-1]:
                info.timestamp = time.time() - 120
            closed_last = Position(ml.ledgers[-2].ledger_id, ml.ledgers[-2].entries - 1)
            assert closed_last == new[2]
            assert (await ml.expire_messages(ttl_s=60)) == {"c2": closed_last, "slow": closed_last}
            assert c2.mark_delete_position == closed_last
            await ml.close()
    run(scenario())


def test_rollover_by_age_with_a_timer(shared_bookies, shared_zk):
    """A ledger older than max_ledger_age_s is rolled over by a timer even when no add comes (so
    it can be trimmed); an empty ledger is not rolled over."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_ledger_age_s=0.7))
            first = (await ledger_ids(store, name))[-1]
            ps = [await ml.add_entry(d(i)) for i in range(3)]
            deadline = time.monotonic() + 10
            while (await ledger_ids(store, name))[-1] == first:
                assert time.monotonic() < deadline, "no rollover by age"
                await asyncio.sleep(0.1)
            raw, _ = await store.get(f"/managed-ledgers/{name}")
            infos = json.loads(raw)["ledgers"]
            assert infos[0]["ledger_id"] == first and infos[0]["entries"] == 3
            assert infos[-1]["entries"] is None
            second = infos[-1]["ledger_id"]
            await asyncio.sleep(2.0)                         # empty: stays
            assert (await ledger_ids(store, name)) == [first, second]
            assert (await ml.add_entry(d(3))).ledger_id == second
            assert [p for p, _ in await ml.read_entries(ps[0], 10)] == ps + [Position(second, 0)]
            await ml.close()
    run(scenario())


def metric(port: int, name: str) -> float:
    got = scrape(f"http://127.0.0.1:{port}", timeout=5)
    return sum(v for k, v in got.items() if k == name or k.startswith(name + "{"))


def test_reads_go_to_one_bookie_of_the_write_set_and_fail_over(bookies, zk):
    """Reading an entry asks one bookie of its write set (E/Qw 3/2: each entry is on 2 of 3), and the
    next one when that bookie fails (here: killed)."""
    procs = bookies.start(3)

    async def scenario():
        async with session(zk, name="r") as (store, bk):
            lh = await bk.create_ledger(3, 2, 2)
            for i in range(60):
                await lh.add_entry(d(i))
            await lh.close()
            before = sum(metric(p.cfg.http_port, "bookie_reads_total") for p in procs)
            rh = await bk.open_ledger(lh.ledger_id, recovery=False)
            assert await rh.read(0, 59) == [d(i) for i in range(60)]
            after = sum(metric(p.cfg.http_port, "bookie_reads_total") for p in procs)
            assert after - before == 60, f"{after - before} bookie reads for 60 entries"
            procs[0].kill9()
            rh2 = await bk.open_ledger(lh.ledger_id, recovery=False)
            assert await rh2.read(0, 59) == [d(i) for i in range(60)]
    run(scenario())


def test_bookie_storage_deletes_ledgers_and_collects_entry_logs(tmp_path):
    """A deleted ledger is gone at once (no state, no reads); its index rows go at the next
    checkpoint, and entry logs holding only deleted ledgers are removed from disk; logs with live
    entries stay readable."""
    async def scenario():
        st = LedgerStorage(tmp_path, max_log_bytes=64 * 1024)
        st.open()
        payload = b"x" * 20_000
        crc = crc32c.crc32c(payload)
        for e in range(6):                         # ledger 1: ~2 logs worth
            st.add_entry(1, e, e - 1, (e + 1) * len(payload), crc, payload)
        await st.checkpoint(1)
        for e in range(2):                         # ledger 2 in a later log
            st.add_entry(2, e, e - 1, (e + 1) * len(payload), crc, payload)
        await st.checkpoint(2)
        logs_before = sorted(p.name for p in (tmp_path / "entrylogs").glob("*.log"))
        assert len(logs_before) >= 3
        st.delete(1)
        assert st.state(1) is None and st.cached(1, 0) is None
        await st.checkpoint(3)
        assert st.gc_removed_logs, "no entry log was collected"
        logs_after = sorted(p.name for p in (tmp_path / "entrylogs").glob("*.log"))
        assert len(logs_after) < len(logs_before)
        st._read_cache = type(st._read_cache)(0)   # force reads from disk
        for e in range(2):
            got = await st.read(2, e)
            assert got is not None and got[3] == payload
        assert await st.read(1, 0) is None
        await st.close()
    asyncio.run(scenario())
