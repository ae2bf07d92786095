"""Grudge shapes, nemesis targets and the runner's schedule, on an in-memory cluster."""
from __future__ import annotations

import random
import threading
import time

import pytest

from core.history import FAIL, INFO, INVOKE, OK, Journal, read_jsonl
from nemesis import grudge as shapes
from nemesis.base import NemesisContext, NemesisError, lookup_url, normalize_topic
from nemesis.combine import NemesisRunner
from nemesis.partition import PartitionNemesis, ZkIsolateNemesis
from nemesis.process import KillNemesis, PauseNemesis
from tests.nemesis.fakes import FakeCluster

DATA = ["broker-1", "broker-2", "bookie-1", "bookie-2", "bookie-3"]


def edges(g) -> set[tuple[str, str]]:
    out = set()
    for a, bs in (shapes.grudge_json(g) if not isinstance(g, dict) else g).items():
        out.update((a, b) for b in bs)
    return out


@pytest.mark.parametrize("data,zks", [(DATA, ["zk-1"]), (DATA[:4], ["zk-1", "zk-2", "zk-3"]),
                                      (DATA[:2], ["zk-1"]), (DATA[:4], [])])
def test_halves(data, zks):
    seen = set()
    for seed in range(200):
        sides, g = shapes.halves(data, random.Random(seed), majority_extra=zks)
        small, big = sides
        assert small and big and not set(small) & set(big)
        assert set(small) | set(big) == set(data) | set(zks)
        assert set(zks) <= set(big) and len(big) >= len(small)       # ZooKeeper on the majority side
        e = edges(g)
        assert e == {(a, b) for a in small for b in big} | {(b, a) for a in small for b in big}
        assert all((b, a) in e for a, b in e)                        # symmetric
        seen.add(tuple(small))
    assert len(seen) > 1                                             # really random
    with pytest.raises(shapes.GrudgeError):
        shapes.halves(["broker-1"], random.Random(0))


def test_isolate_and_one():
    e = edges(shapes.isolate("broker-1", ["zk-1", "zk-2", "broker-1"]))
    assert e == {("broker-1", "zk-1"), ("zk-1", "broker-1"), ("broker-1", "zk-2"), ("zk-2", "broker-1")}
    node, g = shapes.one(DATA, random.Random(3))
    assert node in DATA and edges(g) == {(node, o) for o in DATA if o != node} | {(o, node) for o in DATA if o != node}
    with pytest.raises(shapes.GrudgeError):
        shapes.isolate("a", ["a"])


def test_bridge_and_majorities_ring():
    nodes = ["zk-1", *DATA]
    (a, b), node, g = shapes.bridge(nodes, random.Random(1))
    vis = shapes.visible(g, nodes)
    assert vis[node] == set(nodes)                                   # the bridge sees everyone
    assert all(vis[x] == set(a) | {node} for x in a) and all(vis[x] == set(b) | {node} for x in b)
    for n in range(3, 9):
        pool = [f"n{i}" for i in range(n)]
        ring, g = shapes.majorities_ring(pool, random.Random(n))
        assert sorted(ring) == pool
        vis = shapes.visible(g, pool)
        assert all(len(v) >= n // 2 + 1 for v in vis.values())      # everyone sees a majority
        assert g.number_of_edges() > 0                               # and something is cut
        if n >= 4:
            assert len({frozenset(v) for v in vis.values()}) == n   # no two see the same majority


def test_topic_names_and_lookup_url():
    assert normalize_topic("t") == "persistent://public/default/t"
    assert normalize_topic("a/b/t") == "persistent://a/b/t"
    assert lookup_url("http://h:8080/", "a/b/c d") == "http://h:8080/lookup/v2/topic/persistent/a/b/c%20d"


def ctx_for(cluster, seed=0, topics=("t1", "t2"), owner="broker-2"):
    return NemesisContext(cluster=cluster, rng=random.Random(seed), topics=list(topics),
                          lookup=lambda topic: owner)


def test_partition_nemesis_on_fake_cluster():
    c = FakeCluster()
    ctx = ctx_for(c)
    nem = PartitionNemesis()
    v = nem.start(ctx)
    small, big = v["sides"]
    assert "zk-1" in big and c.drops == edges(v["grudge"])
    assert c.drops == {(a, b) for a in small for b in big} | {(b, a) for a in small for b in big}
    assert nem.is_active() and "partition:" in nem.describe()
    with pytest.raises(NemesisError):
        nem.start(ctx)                                               # one at a time
    assert nem.stop(ctx) == {"healed": True, "grudge": v["grudge"]}
    assert not c.drops and not nem.is_active() and nem.stop(ctx) == {}
    for shape in ("one", "bridge", "majorities-ring"):
        p = PartitionNemesis(shape)
        v = p.start(ctx)
        assert c.drops and c.drops == edges(v["grudge"])
        p.stop(ctx)
        assert not c.drops


def test_zk_isolate_cuts_the_owner_from_zookeeper_only():
    c = FakeCluster(zookeepers=3)
    nem = ZkIsolateNemesis()
    v = nem.start(ctx_for(c, owner="broker-2"))
    assert v["owner"] == "broker-2" and v["topic"].startswith("persistent://public/default/t")
    assert v["grudge"] == {"broker-2": ["zk-1", "zk-2", "zk-3"], "zk-1": ["broker-2"], "zk-2": ["broker-2"],
                           "zk-3": ["broker-2"]}
    assert {b for a, b in c.drops if a == "broker-2"} == {"zk-1", "zk-2", "zk-3"}
    nem.stop(ctx_for(c))
    assert not c.drops
    # no topics (the ledger and register workloads): a random broker or bookie is cut instead
    nem = ZkIsolateNemesis()
    v = nem.start(ctx_for(c, topics=(), owner="never-asked"))
    assert v["topic"] == "" and v["owner"] in DATA and "owner of" not in nem.describe()
    assert {b for a, b in c.drops if a == v["owner"]} == {"zk-1", "zk-2", "zk-3"}
    nem.stop(ctx_for(c))
    assert not c.drops


def test_kill_and_pause_on_fake_cluster():
    c = FakeCluster()
    ctx = ctx_for(c, seed=5)
    k = KillNemesis()
    v = k.start(ctx)
    assert v["role"] in ("bookie", "broker") and not c.node(v["node"]).alive
    s = k.stop(ctx)
    assert s["restarted"] and c.node(v["node"]).alive and s["pid"] != v["pid"]
    p = PauseNemesis()
    v = p.start(ctx)
    assert c.node(v["node"]).paused
    assert p.stop(ctx)["resumed"] and not c.node(v["node"]).paused


def run_fake(seed: int, tmp_path, cycles: int = 40, names=("partition", "kill", "pause", "zk-isolate")):
    c = FakeCluster()
    j = Journal(tmp_path / f"nemesis-{seed}-{random.random()}.jsonl", 0)
    r = NemesisRunner(c, list(names), 0.0, random.Random(seed), j, ["t1", "t2", "t3"])
    owners = iter(["broker-1", "broker-2"] * 1000)
    r.ctx.lookup = lambda topic: next(owners)
    r.run(threading.Event(), max_cycles=cycles)
    j.close()
    return c, r, list(read_jsonl(j.path))


def test_same_seed_same_faults(tmp_path):
    def shape(ops):
        return [(o.type, o.f, o.key, o.node, o.value) for o in ops]
    _, _, a = run_fake(7, tmp_path)
    _, _, b = run_fake(7, tmp_path)
    _, _, c = run_fake(8, tmp_path)
    assert shape(a) == shape(b)
    assert shape(a) != shape(c)
    assert {o.f for o in a} >= {"start-partition", "stop-partition", "start-kill", "stop-kill",
                                "start-pause", "stop-pause", "start-zk-isolate", "stop-zk-isolate"}


def test_runner_ops_are_paired_and_leave_nothing_active(tmp_path):
    cluster, runner, ops = run_fake(3, tmp_path)
    assert all(o.process == -1 for o in ops)
    assert [o.type for o in ops] == [INVOKE, OK] * (len(ops) // 2)
    for inv, done in zip(ops[::2], ops[1::2]):
        assert inv.f == done.f
        if inv.f == "start-zk-isolate":
            assert inv.key == done.key and done.value["owner"] == done.node and done.value["grudge"]
        if inv.f in ("start-kill", "start-pause"):
            assert inv.value == {"node": done.node} and done.value["pid"]
        if inv.f == "start-partition":
            assert set(done.value) == {"shape", "sides", "grudge"}
    assert runner.active() == [] and not cluster.drops
    assert all(n.alive and not n.paused for n in cluster.nodes())


def test_a_fault_not_applied_is_fail_an_undo_that_failed_is_info_and_the_runner_goes_on(tmp_path):
    c = FakeCluster()
    j = Journal(tmp_path / "n.jsonl", 0)
    r = NemesisRunner(c, ["zk-isolate", "kill"], 0.0, random.Random(1), j, ["t"])

    def no_broker(topic):
        raise NemesisError("no broker answered the lookup")
    r.ctx.lookup = no_broker
    # a node that will not restart once: the undo is info, retried before the next fault
    real_start, failures = c.start, [1]

    def flaky_start(name):
        if failures:
            failures.pop()
            raise RuntimeError("would not start")
        return real_start(name)
    c.start = flaky_start
    r.run(threading.Event(), max_cycles=12)
    r.heal()
    j.close()
    ops = list(read_jsonl(j.path))
    infos = [o for o in ops if o.type == INFO]
    fails = [o for o in ops if o.type == FAIL]
    assert any(o.f == "start-zk-isolate" and "no broker answered" in o.error for o in fails)
    assert not any(o.f == "start-zk-isolate" for o in infos)
    assert any(o.f == "stop-kill" and "would not start" in o.error for o in infos)
    # a failed start is never undone: no stop follows it
    assert sum(o.f == "stop-zk-isolate" for o in ops) == 0
    assert sum(o.f.startswith("start-") and o.type == INVOKE for o in ops) == 12
    assert ops[-2].f == "heal" and ops[-1].type == OK and ops[-1].value["healed"]
    assert r.active() == [] and all(n.alive for n in c.nodes())


def test_stop_event_cuts_a_fault_short(tmp_path):
    c = FakeCluster()
    j = Journal(tmp_path / "n.jsonl", 0)
    r = NemesisRunner(c, ["pause"], 1.0, random.Random(1), j, [])
    stop = threading.Event()
    t = threading.Thread(target=r.run, args=(stop,))
    t.start()
    deadline = time.monotonic() + 5
    while not r.active() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert r.active() and any(n.paused for n in c.nodes())
    held = time.monotonic()
    stop.set()                                  # mid-hold: the fault is undone at once
    t.join(5)
    assert not t.is_alive() and time.monotonic() - held < 0.5
    assert r.active() == [] and not any(n.paused for n in c.nodes())
    j.close()
    assert [o.f for o in read_jsonl(j.path)] == ["start-pause"] * 2 + ["stop-pause"] * 2
