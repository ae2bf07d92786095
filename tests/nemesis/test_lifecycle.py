"""Lifecycle faults (nemesis/lifecycle.py): rolling restart, kill of a whole role, disk wipe.

Unit tests drive the nemeses on the in-memory FakeCluster; the integration tests run each on a real
netns cluster (1 ZooKeeper, 3 bookies, 2 brokers, E/Qw/Qa 3/2/2) and check its effect while active,
the values it records, and that the cluster serves again afterwards through the official client.

The recovery tests are about bookie cookies: a bookie restarted with an empty disk refuses to start
(BookKeeper's cookies, apache/bookkeeper#544 and PR #712: its directories have no cookie while
ZooKeeper holds one) until it is formatted as a new bookie, and the ledgers it held are then in
limbo (answered ERROR, never NoSuchEntry; BP-46), so ledger recovery keeps every acknowledged
entry. With the knob `bookie.no_cookie` the wiped bookie rejoins under its old identity, answers
NoSuchEntry, and recovery truncates acknowledged entries (apache/bookkeeper#4812, apache/pulsar#26074).
Semantics: https://bookkeeper.apache.org/docs/getting-started/concepts#ledger-recovery (fencing,
recovery reads), https://bookkeeper.apache.org/docs/latest/api/javadoc/org/apache/bookkeeper/bookie/Cookie.html.
"""
from __future__ import annotations

import asyncio
import random
import shutil
import time
import uuid
from typing import Any

import pytest

from clusters.deploy.backend import ClusterError
from nemesis.base import NemesisContext, NemesisError
from nemesis.lifecycle import DiskWipeNemesis, KillRoleNemesis, RollingRestartNemesis
from tests.nemesis.fakes import FakeCluster


class WipeableFake(FakeCluster):
    """refuse: nodes that refuse to start until formatted; unformattable: their format fails too."""

    def __init__(self, *a: Any, refuse: set[str] = frozenset(), unformattable: set[str] = frozenset(), **kw: Any):
        super().__init__(*a, **kw)
        self.refuse = set(refuse)
        self.unformattable = set(unformattable)

    def format(self, name: str) -> dict[str, Any]:
        if self._nodes[name].alive:
            raise ClusterError(f"{name} is running")
        self.calls.append(("format", name))
        if name in self.unformattable:
            raise ClusterError(f"formatting {name} failed: ZooKeeper not reachable")
        self.refuse.discard(name)
        return {"node": name, "bookie": f"{self._nodes[name].host}:3181", "cookie_deleted": True,
                "removed": ["current"]}

    def stop(self, name: str) -> None:
        super().kill(name)
        self.calls[-1] = ("stop", name)

    def start(self, name: str):
        if name in self.refuse:
            self.calls.append(("refused", name))
            raise ClusterError(f"{name} exited with code 3 while starting: cookie is missing")
        return super().start(name)

    def wipe(self, name: str) -> dict[str, Any]:
        if self._nodes[name].alive:
            raise ClusterError(f"{name} is running")
        self.calls.append(("wipe", name))
        return {"node": name, "files": 3, "bytes": 1234, "removed": ["journal"], "kept": []}


def ctx_of(cluster, seed=5, topics=()):
    return NemesisContext(cluster=cluster, rng=random.Random(seed), topics=list(topics))


def always_ready(ctx, name, timeout):
    return True


# ------------------------------------------------------------------------------ unit

def test_rolling_restart_one_at_a_time_in_the_drawn_order():
    c = WipeableFake(brokers=3)
    nem = RollingRestartNemesis(None, ready=always_ready)
    ctx = ctx_of(c)
    plan = nem.choose(ctx)
    assert plan == RollingRestartNemesis(None).choose(ctx_of(c)) and sorted(plan["order"]) == ["broker-1", "broker-2", "broker-3"]
    old = {n.name: n.pid for n in c.nodes("broker")}
    v = nem.start(ctx, plan)
    assert v["order"] == plan["order"] and v["complete"] is True and v["down"] is None and v["mode"] == "stop"
    assert [r["node"] for r in v["restarts"]] == plan["order"]
    assert all(r["old_pid"] == old[r["node"]] and r["pid"] != r["old_pid"] and r["ready"] for r in v["restarts"])
    # stop then start per node, never two down at once
    assert c.calls == [(op, n) for n in plan["order"] for op in ("stop", "start")]
    assert nem.stop(ctx) == {"role": "broker", "restarted": None} and nem.applied is None
    assert nem.stop(ctx) == {}


def test_rolling_restart_params_and_a_node_that_does_not_come_back():
    assert (RollingRestartNemesis("bookie+kill").role, RollingRestartNemesis("bookie+kill").mode) == ("bookie", "kill")
    assert RollingRestartNemesis("kill").role == "broker"
    with pytest.raises(ValueError, match="unknown 'fast' in 'bookie\\+fast'"):
        RollingRestartNemesis("bookie+fast")
    c = WipeableFake(bookies=3, refuse={"bookie-2"})
    nem = RollingRestartNemesis("bookie+kill", ready=always_ready)
    ctx = ctx_of(c)
    plan = {"role": "bookie", "mode": "kill", "order": ["bookie-1", "bookie-2", "bookie-3"]}
    with pytest.raises(NemesisError, match="bookie-2 did not come back"):
        nem.start(ctx, plan)
    assert nem.applied["down"] == "bookie-2" and [r["node"] for r in nem.applied["restarts"]] == ["bookie-1"]
    assert not c.node("bookie-2").alive and c.node("bookie-3").alive
    c.refuse.clear()
    assert nem.stop(ctx)["restarted"] == "bookie-2" and c.node("bookie-2").alive and nem.applied is None


def test_rolling_restart_is_bounded_in_time():
    c = WipeableFake(brokers=2)
    slow = RollingRestartNemesis(None, max_total_s=0.05, ready=lambda ctx, n, t: time.sleep(0.1) or True)
    with pytest.raises(NemesisError, match=r"out of time \(0s\) before broker-2"):
        slow.start(ctx_of(c), {"role": "broker", "mode": "stop", "order": ["broker-1", "broker-2"]})
    assert [r["node"] for r in slow.applied["restarts"]] == ["broker-1"] and slow.applied["complete"] is False
    assert all(n.alive for n in c.nodes())


def test_kill_role_kills_every_live_node_and_restarts_them():
    c = WipeableFake(bookies=3)
    c.kill("bookie-3")                      # already down: not ours to restart
    nem = KillRoleNemesis("bookie")
    ctx = ctx_of(c)
    v = nem.start(ctx, nem.choose(ctx))
    assert v["role"] == "bookie" and v["nodes"] == ["bookie-1", "bookie-2"] and v["skipped"] == ["bookie-3"]
    assert not any(n.alive for n in c.nodes("bookie")) and all(n.alive for n in c.nodes("broker"))
    out = nem.stop(ctx)
    assert set(out["nodes"]) == {"bookie-1", "bookie-2"} and all(r["restarted"] for r in out["nodes"].values())
    assert c.node("bookie-1").alive and c.node("bookie-2").alive and not c.node("bookie-3").alive
    assert KillRoleNemesis(None).role == "broker"
    with pytest.raises(ValueError, match="unknown role 'client'"):
        KillRoleNemesis("client")
    c.kill("bookie-1")
    c.kill("bookie-2")
    idle = KillRoleNemesis("bookie")
    with pytest.raises(NemesisError, match=r"no bookie is running \(bookie-1, bookie-2, bookie-3 all down\)"):
        idle.start(ctx, {"role": "bookie"})
    assert idle.applied is None


def test_disk_wipe_kills_wipes_and_records_the_restart():
    c = WipeableFake(bookies=3)
    nem = DiskWipeNemesis(None)
    ctx = ctx_of(c)
    plan = nem.choose(ctx)
    assert plan["selector"] == "bookie" and 0 <= plan["pick"] < 1 and plan == DiskWipeNemesis(None).choose(ctx_of(c))
    v = nem.start(ctx, plan)
    name = v["node"]
    assert name == plan["node"] and v["wiped"]["files"] == 3 and not c.node(name).alive
    assert c.calls == [("kill", name), ("wipe", name)]
    out = nem.stop(ctx)
    assert out["came_up"] is True and out["restarted"] is True and out["error"] is None and c.node(name).alive
    assert out["refused"] is None and out["formatted"] is None         # it started on its empty disk
    # a bookie that refuses its empty disk: recorded, formatted as a new bookie, started again
    c2 = WipeableFake(bookies=3, refuse={"bookie-1"})
    nem2 = DiskWipeNemesis("bookie-1")
    ctx2 = ctx_of(c2)
    nem2.start(ctx2, nem2.choose(ctx2))
    out2 = nem2.stop(ctx2)
    assert out2["came_up"] is True and "cookie is missing" in out2["refused"] and out2["error"] is None
    assert out2["formatted"]["cookie_deleted"] is True and out2["pid"] == c2.node("bookie-1").pid
    assert c2.calls[-3:] == [("refused", "bookie-1"), ("format", "bookie-1"), ("start", "bookie-1")]
    assert nem2.applied is None
    # a format that fails too: recorded, not retried; a ZooKeeper node that refuses is not formatted
    c3 = WipeableFake(bookies=3, refuse={"bookie-2", "zk-1"}, unformattable={"bookie-2"})
    for target, formats in (("bookie-2", True), ("zk-1", False)):
        nem3 = DiskWipeNemesis(target)
        ctx3 = ctx_of(c3)
        nem3.start(ctx3, nem3.choose(ctx3))
        out3 = nem3.stop(ctx3)
        assert out3["came_up"] is False and out3["pid"] is None and nem3.applied is None
        if formats:
            assert "cookie is missing" in out3["refused"] and "ZooKeeper not reachable" in out3["error"]
        else:
            assert out3["refused"] is None and "cookie is missing" in out3["error"]
        assert (("format", target) in c3.calls) is formats
    # a target that is no bookie or ZooKeeper node
    with pytest.raises(NemesisError, match="resolved to \\['broker-1'\\], no bookie or ZooKeeper node"):
        DiskWipeNemesis("broker-1").start(ctx2)


def test_disk_wipe_stop_records_each_outcome_in_one_shape():
    """The stop op's value, field by field in order: a node started by someone else meanwhile (left
    alone), a clean start, a refusal then a format and start, a refusal then a failed format."""
    keys = ["node", "role", "restarted", "came_up", "refused", "formatted", "error", "pid", "last_log_line"]
    c = WipeableFake(bookies=3, refuse={"bookie-2", "bookie-3"}, unformattable={"bookie-3"})
    outs = {}
    for target in ("bookie-1", "zk-1", "bookie-2", "bookie-3"):
        nem = DiskWipeNemesis(target)
        ctx = ctx_of(c)
        nem.start(ctx, nem.choose(ctx))
        if target == "bookie-1":
            c.start(target)
        outs[target] = nem.stop(ctx)
        assert list(outs[target]) == keys and nem.applied is None
    pid = {n: c.node(n).pid for n in ("bookie-1", "zk-1", "bookie-2")}
    formatted = {"node": "bookie-2", "bookie": "10.0.0.22:3181", "cookie_deleted": True, "removed": ["current"]}
    assert [list(o.values()) for o in outs.values()] == [
        ["bookie-1", "bookie", False, True, None, None, None, pid["bookie-1"], ""],
        ["zk-1", "zookeeper", True, True, None, None, None, pid["zk-1"], ""],
        ["bookie-2", "bookie", True, True, "bookie-2 exited with code 3 while starting: cookie is missing",
         formatted, None, pid["bookie-2"], ""],
        ["bookie-3", "bookie", True, False, "bookie-3 exited with code 3 while starting: cookie is missing",
         None, "formatting bookie-3 failed: ZooKeeper not reachable", None, ""]]


def test_the_runner_journals_lifecycle_faults(tmp_path):
    """Start and stop ops carry the nemeses' values through the journal (JSON) as they returned them."""
    from core.history import INVOKE, OK, Journal, read_jsonl
    from nemesis.combine import NemesisRunner
    c = WipeableFake(brokers=2, bookies=3)
    journal = Journal(tmp_path / "nemesis.jsonl", time.monotonic_ns())
    nemeses = {"rolling-restart": RollingRestartNemesis(None, ready=always_ready),
               "kill-role:bookie": KillRoleNemesis("bookie"), "disk-wipe": DiskWipeNemesis(None)}
    runner = NemesisRunner(c, list(nemeses), 0.0, random.Random(4), journal, [], nemeses=nemeses)
    for name in nemeses:
        runner.start_fault(name)
        assert runner.stop_faults()
    journal.sync()
    ops = [op for op in read_jsonl(journal.path) if op.type != INVOKE]
    journal.close()
    assert [op.f for op in ops] == ["start-rolling-restart", "stop-rolling-restart", "start-kill-role",
                                    "stop-kill-role", "start-disk-wipe", "stop-disk-wipe"]
    assert all(op.type == OK for op in ops), [(op.f, op.type, op.error) for op in ops]
    assert ops[0].value["complete"] is True and len(ops[0].value["order"]) == 2
    assert ops[2].value["nodes"] == ["bookie-1", "bookie-2", "bookie-3"]
    assert ops[4].value["wiped"]["files"] == 3 and ops[4].node == ops[4].value["node"]
    assert ops[5].value["came_up"] is True
    assert all(n.alive for n in c.nodes())


# ------------------------------------------------------------------------------ a real cluster

@pytest.fixture(scope="module")
def cluster():
    from tests.netns import netns_cluster
    with netns_cluster("lc", brokers=2, bookies=3, zookeepers=1, ensemble=3, write_quorum=2, ack_quorum=2) as c:
        base = c.base_dir
        yield c
    shutil.rmtree(base, ignore_errors=True)


def produce(cluster, topic: str, values: list[int]) -> None:
    from tests.netns import pulsar_client
    with pulsar_client(cluster.service_url) as client:
        p = client.create_producer(topic, batching_enabled=False, send_timeout_millis=60000)
        for v in values:
            p.send(str(v).encode())
        p.close()


def read_all(cluster, topic: str, expected: int) -> list[int]:
    import pulsar
    from tests.netns import pulsar_client
    with pulsar_client(cluster.service_url) as client:
        r = client.create_reader(topic, pulsar.MessageId.earliest)
        out = []
        while len(out) < expected:
            out.append(int(r.read_next(30000).data()))
        assert not r.has_message_available()
        r.close()
        return out


def new_topic() -> str:
    return f"persistent://public/default/lc-{uuid.uuid4().hex[:8]}"


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_rolling_restart_on_a_cluster(cluster):
    topic = new_topic()
    produce(cluster, topic, list(range(10)))
    ctx = ctx_of(cluster, seed=11, topics=[topic])
    for param in (None, "bookie+kill"):
        nem = RollingRestartNemesis(param)
        before = {n.name: n.pid for n in cluster.nodes(nem.role)}
        v = nem.start(ctx, nem.choose(ctx))
        assert v["complete"] is True and sorted(v["order"]) == sorted(before) and v["down"] is None
        assert [r["node"] for r in v["restarts"]] == v["order"]
        for r in v["restarts"]:
            assert r["old_pid"] == before[r["node"]] and r["pid"] == cluster.node(r["node"]).pid != r["old_pid"]
            assert r["ready"] is True
        assert all(n.alive and not n.paused for n in cluster.nodes() if n.role != "client")
        assert nem.stop(ctx) == {"role": nem.role, "restarted": None}
    produce(cluster, topic, list(range(10, 15)))
    assert read_all(cluster, topic, 15) == list(range(15))


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_kill_role_on_a_cluster(cluster):
    topic = new_topic()
    produce(cluster, topic, list(range(5)))
    ctx = ctx_of(cluster)
    for role in ("broker", "bookie"):
        nem = KillRoleNemesis(None if role == "broker" else role)
        before = {n.name: n.pid for n in cluster.nodes(role)}
        v = nem.start(ctx, nem.choose(ctx))
        assert v == {"role": role, "nodes": sorted(before), "pids": before, "skipped": []}
        assert not any(n.alive for n in cluster.nodes(role))
        assert all(n.alive for n in cluster.nodes() if n.role not in (role, "client"))
        out = nem.stop(ctx)
        assert out["role"] == role and sorted(out["nodes"]) == sorted(before)
        for name, r in out["nodes"].items():
            assert r["restarted"] is True and r["pid"] == cluster.node(name).pid != before[name]
        assert nem.applied is None
    produce(cluster, topic, list(range(5, 10)))
    assert read_all(cluster, topic, 10) == list(range(10))


async def _read_from(cluster, addr: str, ledger: int, entry: int):
    """The entry as the bookie at addr stores it, or the error it answers."""
    from clusters.autorecovery.check import connect
    from clusters.bookkeeper.admin import BookKeeperAdmin
    async with connect(cluster.zk_connect, name="lc-test") as (_s, bk, _u):
        try:
            return await BookKeeperAdmin(bk).read_entry_from(addr, ledger, entry)
        except Exception as e:  # noqa: BLE001 - the answer is what the test looks at
            return e


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_disk_wipe_of_a_ledger_bookie_then_restart(cluster):
    from clusters.bookkeeper import quorum
    from clusters.bookkeeper.errors import BKNoSuchEntryError, BKReadError
    topic = new_topic()
    produce(cluster, topic, list(range(20)))
    ctx = ctx_of(cluster, seed=2, topics=[topic])
    nem = DiskWipeNemesis("ledger-bookies")
    plan = nem.choose(ctx)
    assert plan["topic"] == topic
    # what it will hit: one bookie of the last fragment of the topic's current ledger
    from nemesis import targets
    found = targets.resolve(ctx_of(cluster), "ledger-bookies", topic=topic)
    ledger, ensemble = found["ledger"], found["ensemble"]
    victim = targets.pick(found["nodes"], plan["pick"])
    addr = ensemble[found["nodes"].index(victim)]
    index = ensemble.index(addr)
    held = [e for e in range(20) if index in quorum.write_set(e, 3, 2)]
    from clusters.bookkeeper.admin import StoredEntry
    stored = asyncio.run(_read_from(cluster, addr, ledger, held[0]))   # a Pulsar entry: metadata, then the value
    assert held and isinstance(stored, StoredEntry) and stored.payload.endswith(str(held[0]).encode())

    v = nem.start(ctx, plan)
    assert v["node"] == victim and v["role"] == "bookie" and v["target"]["ledger"] == ledger
    assert v["wiped"]["files"] > 0 and v["wiped"]["bytes"] > 0 and "journal" in v["wiped"]["removed"]
    node = cluster.node(victim)
    assert not node.alive and list(node.data_dir.iterdir()) == []
    with pytest.raises(ClusterError, match="is running"):
        cluster.wipe(sorted(set(found["nodes"]) - {victim})[0])
    out = nem.stop(ctx)
    # it refused its wiped disk (its cookie is missing), was formatted and came up as a new bookie
    assert "exited with code 3" in out["refused"] and "cookie is missing on disk" in out["refused"]
    refusals = [ln for ln in cluster.node(victim).log.read_text().splitlines() if "cookie is missing" in ln]
    assert len(refusals) == 1 and "format it as a new bookie" in refusals[0]
    assert out["formatted"]["cookie_deleted"] is True and out["formatted"]["bookie"] == addr
    assert out["came_up"] is True and out["restarted"] is True and out["error"] is None
    assert out["pid"] == cluster.node(victim).pid != v["pid"] and out["last_log_line"]
    # the new bookie has the same address and none of the entries it had acknowledged: they are in
    # limbo there (ERROR, never "no such entry")
    for e in held[:3]:
        answer = asyncio.run(_read_from(cluster, addr, ledger, e))
        assert isinstance(answer, BKReadError) and not isinstance(answer, BKNoSuchEntryError), answer
        assert "ERROR" in str(answer)
    # the other copy still serves every message
    assert read_all(cluster, topic, 20) == list(range(20))


def _wipe_a_bookie_of_the_last_entry(cluster, no_cookie: bool) -> tuple[int, int, str, str, dict]:
    """Write 6 entries acknowledged by Qa=2 bookies (the writer goes away without closing), wipe one
    of the two bookies of the last entry's write set with the disk-wipe nemesis (with `no_cookie`,
    its config turned to bookie.no_cookie first) and kill the other: (ledger, last, wiped, down,
    the nemesis's stop value)."""
    from clusters import config as node_config
    from clusters.autorecovery.check import connect
    from clusters.bookkeeper import quorum
    names = {f"{n.host}:{n.ports['bookie']}": n.name for n in cluster.nodes("bookie")}

    async def write() -> tuple[int, list[str], int]:
        async with connect(cluster.zk_connect, name="lc-writer") as (_s, bk, _u):
            lh = await bk.create_ledger(3, 2, 2)
            last = -1
            for i in range(6):
                last = await lh.add_entry(f"e{i}".encode())     # acknowledged by 2 bookies
            return lh.ledger_id, list(lh.ensemble), last      # the writer goes away without closing
    ledger, ensemble, last = asyncio.run(write())
    ws = [ensemble[i] for i in quorum.write_set(last, 3, 2)]
    wiped, down = names[ws[0]], names[ws[1]]
    ctx = ctx_of(cluster)
    nem = DiskWipeNemesis(wiped)
    nem.start(ctx, nem.choose(ctx))
    if no_cookie:
        path = cluster.node(wiped).config
        cfg = node_config.load(path)
        cfg.bugs = {**cfg.bugs, "bookie.no_cookie": True}
        node_config.write(cfg, path)
    out = nem.stop(ctx)
    cluster.kill(down)
    return ledger, last, wiped, down, out


def _recover(cluster, ledger: int):
    """Open the ledger with recovery: its metadata once closed, or the error (undecidable is safe)."""
    from clusters.autorecovery.check import connect

    async def recover():
        async with connect(cluster.zk_connect, name="lc-recovery") as (_s, bk, _u):
            try:
                rh = await asyncio.wait_for(bk.open_ledger(ledger, recovery=True), 60)
            except Exception as e:  # noqa: BLE001 - recovery that cannot decide is safe
                return e
            return rh.metadata
    return asyncio.run(recover())


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_recovery_keeps_acknowledged_entries_after_a_bookie_wipe(cluster):
    """Entries acknowledged by Qa=2 bookies; one of the two bookies of the last entry's write set is
    wiped, the other is down, the third is up. The wiped bookie refuses to start (its cookie is
    missing) until formatted; formatted, the ledger is in limbo on it. Recovery of the ledger must
    either keep every acknowledged entry or fail (it cannot tell): it must not close the ledger
    before the last acknowledged entry."""
    ledger, last, wiped, down, out = _wipe_a_bookie_of_the_last_entry(cluster, no_cookie=False)
    try:
        assert "cookie is missing" in out["refused"] and out["formatted"]["cookie_deleted"] is True
        assert out["came_up"] is True
        md = _recover(cluster, ledger)
        if not isinstance(md, Exception):
            assert md.last_entry_id >= last, (f"ledger {ledger} closed at entry {md.last_entry_id}: acknowledged "
                                              f"entries {md.last_entry_id + 1}..{last} truncated")
        # the last entry's write set is the formatted bookie (in limbo: ERROR) and the down one
        assert "cannot tell whether it exists" in str(md), md
    finally:
        cluster.start(down)
    md = _recover(cluster, ledger)       # with both copies' other bookie back it is decided, in full
    assert not isinstance(md, Exception) and md.last_entry_id == last, md


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_without_cookies_recovery_truncates_acknowledged_entries(cluster):
    """bookie.no_cookie (apache/bookkeeper#4812, apache/pulsar#26074): the wiped bookie rejoins at
    once under its old identity, answers NoSuchEntry, and recovery closes the ledger before
    acknowledged entries. Afterwards the bookie gets its config back and is formatted as an operator
    would (it then refuses its disk, whose cookie the no-cookie run never wrote)."""
    from clusters import config as node_config
    ledger, last, wiped, down, out = _wipe_a_bookie_of_the_last_entry(cluster, no_cookie=True)
    try:
        assert out["came_up"] is True and out["refused"] is None and out["formatted"] is None
        md = _recover(cluster, ledger)
        assert not isinstance(md, Exception), md
        assert md.last_entry_id < last, f"ledger {ledger} closed at {md.last_entry_id}: nothing truncated"
    finally:
        path = cluster.node(wiped).config
        cfg = node_config.load(path)
        cfg.bugs = {k: v for k, v in cfg.bugs.items() if k != "bookie.no_cookie"}
        node_config.write(cfg, path)
        cluster.stop(wiped)
        with pytest.raises(ClusterError, match="cookie is missing"):
            cluster.start(wiped)
        assert cluster.format(wiped)["cookie_deleted"] is True
        cluster.start(wiped)
        cluster.start(down)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_disk_wipe_of_the_zookeeper_leader():
    """The leader of a 3-node ensemble killed and wiped (its zoo.cfg and myid kept): it comes back
    as a follower and gets the data again from the new leader (ZooKeeper's SNAP sync).
    https://zookeeper.apache.org/doc/r3.8.4/zookeeperInternals.html#sc_atomicBroadcast"""
    from kazoo.client import KazooClient

    from clusters import zookeeper
    from tests.netns import netns_cluster
    with netns_cluster("lz", brokers=0, bookies=0, zookeepers=3, clients=0) as c:
        zk = KazooClient(hosts=c.zk_connect, timeout=10)
        zk.start(30)
        try:
            zk.create("/lc/before-wipe", b"kept by the others", makepath=True)
        finally:
            zk.stop()
            zk.close()
        ctx = ctx_of(c)
        nem = DiskWipeNemesis("zk-leader")
        v = nem.start(ctx, nem.choose(ctx))
        leader = v["node"]
        assert v["role"] == "zookeeper" and v["target"]["modes"][leader] == "leader"
        assert v["wiped"]["removed"] == ["version-2"] and v["wiped"]["kept"] == ["myid", "zoo.cfg"]
        assert sorted(p.name for p in c.node(leader).data_dir.iterdir()) == ["myid", "zoo.cfg"]
        out = nem.stop(ctx)
        assert out["came_up"] is True and out["error"] is None
        node = c.node(leader)
        assert zookeeper.mode(node.host, node.ports["client"]) == "follower"
        only = KazooClient(hosts=f"{node.host}:{node.ports['client']}", timeout=10)
        only.start(30)
        try:
            only.sync("/lc/before-wipe")
            assert only.get("/lc/before-wipe")[0] == b"kept by the others"
        finally:
            only.stop()
            only.close()
    shutil.rmtree(c.base_dir, ignore_errors=True)
