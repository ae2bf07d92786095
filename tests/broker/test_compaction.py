"""Compaction runs without a cluster (clusters/broker/compaction.py): what happens to the new
compacted ledger when the znode write fails, answers late, or the topic closes mid-run; and a
read_compacted subscription whose mark-delete lies inside the compacted view."""
from __future__ import annotations

import asyncio
import json

from clusters.broker import compaction as C
from clusters.broker.managed_ledger import Position
from clusters.metadata.store import BadVersion
from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames
from tests.broker.helpers import FakeCnx, run
from tests.broker.memory import MemoryBrokerService

TOPIC = "persistent://public/default/t"


class FakeLedger:
    def __init__(self, bk: "FakeBK", lid: int):
        self.bk, self.ledger_id, self.entries = bk, lid, []

    async def add_entry(self, data: bytes) -> int:
        self.entries.append(data)
        return len(self.entries) - 1

    async def close(self) -> None:
        pass

    async def read(self, first: int, last: int) -> list[bytes]:
        return self.entries[first:last + 1]


class FakeBK:
    def __init__(self) -> None:
        self.ledgers: dict[int, FakeLedger] = {}
        self.deleted: list[int] = []
        self.next_id = 100

    async def create_ledger(self, e, w, a, custom=None) -> FakeLedger:
        self.next_id += 1
        lh = self.ledgers[self.next_id] = FakeLedger(self, self.next_id)
        return lh

    async def open_ledger(self, lid: int, recovery: bool = True) -> FakeLedger:
        return self.ledgers[lid]

    async def delete_ledger(self, lid: int) -> None:
        self.deleted.append(lid)
        self.ledgers.pop(lid, None)


class FakeStore:
    """path -> (data, version). `fail_write`: the next create/set raises it, after applying the
    write when `applied` (a ZooKeeper timeout that comes after the server applied it).
    `fail_reads`: so many later reads raise TimeoutError. `block`: writes wait on this event."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.fail_write: BaseException | None = None
        self.applied = False
        self.fail_reads = 0
        self.block: asyncio.Event | None = None
        self.writes = 0

    async def get_or_none(self, path: str):
        if self.fail_reads:
            self.fail_reads -= 1
            raise TimeoutError("read timed out")
        return self.nodes.get(path)

    async def _write(self, path: str, data: bytes) -> None:
        if self.block is not None:
            await self.block.wait()
        err, self.fail_write = self.fail_write, None
        if err is None or self.applied:
            self.writes += 1
            old = self.nodes.get(path)
            self.nodes[path] = (data, 0 if old is None else old[1] + 1)
        if err is not None:
            raise err

    async def create(self, path: str, data: bytes, makepath: bool = False) -> None:
        await self._write(path, data)

    async def set(self, path: str, data: bytes, version: int = -1) -> None:
        await self._write(path, data)


async def _topic(n_keys: int = 3, rounds: int = 2):
    svc = MemoryBrokerService()
    svc.store, svc.bk = FakeStore(), FakeBK()
    t = await svc.get_topic(TOPIC)
    t.ml.persistence = lambda: (1, 1, 1)
    for r in range(rounds):
        for k in range(n_keys):
            md = pb.MessageMetadata(producer_name="p", sequence_id=r * n_keys + k, publish_time=1,
                                    partition_key=f"k{k}")
            await t.ml.add_entry(frames.build_entry(md, f"{r}".encode()))
    return svc, t


def _named(svc) -> int | None:
    got = svc.store.nodes.get(C.compaction_path(svc.mls[TOPIC].name))
    return None if got is None else json.loads(got[0])["ledger"]


def test_a_znode_write_that_times_out_after_being_applied_keeps_the_ledger():
    async def main():
        svc, t = await _topic()
        svc.store.fail_write, svc.store.applied = TimeoutError("zk timeout"), True
        await t.compaction.run()
        lid = _named(svc)
        assert lid is not None and lid not in svc.bk.deleted
        assert t.compacted is not None and t.compacted.ledger_id == lid
        # a new owner loads the view the znode names
        view = await C.load_view(svc.store, svc.bk, svc.mls[TOPIC].name)
        assert [p.entry_id for p, _ in view.entries] == [3, 4, 5]
    run(main())


def test_a_znode_write_that_failed_drops_the_ledger_and_an_unknown_outcome_keeps_it():
    async def main():
        svc, t = await _topic()
        svc.store.fail_write = TimeoutError("zk timeout")     # not applied; the re-read says so
        try:
            await t.compaction.run()
        except C.CompactionError:
            pass
        else:
            raise AssertionError("the run succeeded")
        assert _named(svc) is None and svc.bk.deleted == [101]
        # not applied, and the re-read fails too: the outcome is unknown, the ledger stays
        svc.store.fail_write, svc.store.fail_reads = TimeoutError("zk timeout"), 0
        orig = svc.store.get_or_none
        calls = []

        async def flaky(path):
            calls.append(path)
            if len(calls) == 2:
                raise TimeoutError("read timed out")
            return await orig(path)
        svc.store.get_or_none = flaky
        try:
            await t.compaction.run()
        except C.CompactionError as e:
            assert "kept" in str(e)
        assert svc.bk.deleted == [101] and 102 in svc.bk.ledgers
        # a lost compare-and-set drops it
        svc.store.get_or_none = orig
        svc.store.fail_write = BadVersion("changed")
        try:
            await t.compaction.run()
        except C.CompactionError:
            pass
        assert 103 in svc.bk.deleted and _named(svc) is None
    run(main())


def test_closing_the_topic_ends_a_compaction_run_before_it_writes_the_znode():
    async def main():
        svc, t = await _topic()
        svc.store.block = asyncio.Event()
        assert t.compaction.trigger()
        for _ in range(20):
            await asyncio.sleep(0)
        assert t.compaction.running
        await t.close()
        assert not t.compaction.running and t.compaction.status == "ERROR"
        svc.store.block.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert svc.store.writes == 0 and _named(svc) is None
        assert not t.compaction.trigger()
    run(main())


def test_a_run_that_finds_its_topic_closed_does_not_write_the_znode():
    async def main():
        svc, t = await _topic()
        t._closing = True
        try:
            await t.compaction.run()
        except C.CompactionError as e:
            assert "closed" in str(e)
        assert svc.store.writes == 0 and svc.bk.deleted == [101]
    run(main())


def test_a_compacted_read_with_no_read_position_starts_after_the_mark_delete():
    async def main():
        svc, t = await _topic(n_keys=3, rounds=2)
        await t.compaction.run()
        view = t.compacted
        ids = [p for p, _ in view.entries]                 # the second round: three entries
        assert len(ids) == 3
        cnx = FakeCnx()
        cmd = pb.CommandSubscribe(topic=TOPIC, subscription="s", subType=pb.CommandSubscribe.Exclusive,
                                  consumer_id=1, request_id=0, read_compacted=True)
        cmd.initialPosition = pb.CommandSubscribe.Earliest
        c = await t.subscribe(cnx, cmd)
        sub = c.sub
        sub.mark_delete, sub.read_position = ids[0], None   # acknowledged the view's first entry
        c.sub.flow(c, 10)
        for _ in range(20):
            await asyncio.sleep(0)
        cnx.messages.clear()
        sub.mark_delete, sub.read_position = ids[0], None
        sub.outstanding.clear()
        sub._heap.clear()
        assert sub._dispatch_compacted(view, 1)
        assert [m[1] for m in cnx.messages] == [ids[1]]
        assert sub.read_position <= view.horizon         # the view's last entry is still to come
    run(main())
