"""Nemesis conformance: the same tests on every deployment backend (netns, docker).

Each partition shape blocks exactly the pairs its grudge names and nothing else, probed with TCP
connects from every node to every other (a refused connect counts as reachable: the peer's kernel
answered); stopping the fault restores every pair. Overlapping partitions compose. Pause stops a
node's progress and resume restores it; kill and restart keep the data; every fault op is in the
history with its targets, and a fault that cannot be applied is a `fail` op with the reason.
"""
from __future__ import annotations

import json
import random
import sys
import threading
import time
import urllib.request
import uuid

import pulsar
import pytest

from clusters.deploy.backend import grudge_edges
from core.history import FAIL, INVOKE, OK, Journal, read_jsonl
from nemesis.base import NemesisContext
from nemesis.combine import NemesisRunner, Scheduled
from nemesis.registry import make
from tests.netns import netns_cluster, pulsar_client

pytestmark = pytest.mark.integration

BACKENDS = ["netns", pytest.param("docker", marks=pytest.mark.docker)]
PROBE_PORT = {"zookeeper": "client", "bookie": "bookie", "broker": "pulsar"}
CLIENT_PORT = 9                    # nothing listens there: a reachable client host answers with a reset

# Connects to every target at once from the node it runs on; prints {name: reachable}.
PROBE = r"""
import json, socket, sys, threading
targets = json.loads(sys.argv[1]); out = {}
def probe(name, host, port):
    s = socket.socket(); s.settimeout(1.5)
    try:
        s.connect((host, port)); out[name] = True
    except ConnectionRefusedError:
        out[name] = True
    except OSError:
        out[name] = False
    finally:
        s.close()
ts = [threading.Thread(target=probe, args=t) for t in targets]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(request):
    if request.param == "docker":           # module-scoped: set up before the autouse image fixture
        request.getfixturevalue("docker_image")
    with netns_cluster(f"cf{request.param[0]}", backend=request.param, brokers=2, bookies=3, zookeepers=1,
                       clients=1) as c:
        yield c


@pytest.fixture(scope="module")
def topics(cluster):
    """Two topics with data, produced by the real pulsar client (so each has an owner)."""
    names = [f"persistent://public/default/cf-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    with pulsar_client(cluster.service_url) as client:
        for t in names:
            producer = client.create_producer(t)
            for i in range(10):
                producer.send(str(i).encode())
            producer.close()
    return names


@pytest.fixture
def ctx(cluster, topics):
    c = NemesisContext(cluster=cluster, rng=random.Random(11), topics=list(topics))
    try:
        yield c
    finally:
        cluster.heal()
        for n in cluster.nodes():
            if n.role != "client" and n.alive and n.paused:
                cluster.resume(n.name)
            elif n.role != "client" and not n.alive:
                cluster.start(n.name)


def reachability(cluster) -> dict[tuple[str, str], bool]:
    """(a, b) -> can a open a TCP connection to b, for every ordered pair of nodes."""
    nodes = cluster.nodes()
    python = getattr(cluster, "python", sys.executable)
    out: dict[tuple[str, str], bool] = {}
    for src in nodes:
        targets = [(n.name, n.host, n.ports[PROBE_PORT[n.role]] if n.role in PROBE_PORT else CLIENT_PORT)
                   for n in nodes if n.name != src.name]
        res = cluster.exec(src.name, [python, "-c", PROBE, json.dumps(targets)], timeout=30)
        assert res.returncode == 0, f"probe from {src.name} failed: {res.stderr[-500:]}"
        for dst, ok in json.loads(res.stdout).items():
            out[(src.name, dst)] = ok
    return out


def blocked(cluster) -> set[tuple[str, str]]:
    return {pair for pair, ok in reachability(cluster).items() if not ok}


def cut_pairs(grudge) -> set[tuple[str, str]]:
    edges = grudge_edges(grudge)
    return edges | {(b, a) for a, b in edges}


SHAPES = ["partition", "partition-ring", "partition-bridge", "isolate", "isolate:ledger-bookies", "primaries",
          "zk-isolate", "zk-isolate:ledger-bookies", "client-link"]


def test_healthy_cluster_reaches_every_pair(cluster, ctx):
    assert blocked(cluster) == set()


@pytest.mark.parametrize("name", SHAPES)
def test_partition_shape_blocks_exactly_its_pairs_and_stop_restores_them(cluster, ctx, name):
    nem = make(name)
    value = nem.start(ctx, nem.choose(ctx))
    try:
        expected = cut_pairs(value["grudge"])
        assert expected, f"{name} cut nothing: {value}"
        assert blocked(cluster) == expected
        servers = {n.name for n in cluster.nodes() if n.role != "client"}
        if name.startswith("zk-isolate"):          # only ZooKeeper links are cut
            zks = {n.name for n in cluster.nodes("zookeeper")}
            assert all(a in zks or b in zks for a, b in expected)
        elif name == "client-link":                # only client links, to one broker
            clients = {n.name for n in cluster.nodes("client")}
            assert all((a in clients) != (b in clients) for a, b in expected)
            assert {b for a, b in expected if a in clients} == {value["broker"]}
        else:                                      # server partitions never cut a client host
            assert all(a in servers and b in servers for a, b in expected)
    finally:
        nem.stop(ctx)
    assert blocked(cluster) == set()


def test_explicit_grudge_and_overlapping_partitions_compose(cluster, ctx):
    g = make("grudge")
    g.grudge = {"broker-1": ["zk-1"], "bookie-1": ["broker-2"]}
    part = make("isolate:bookie-2")
    v1 = g.start(ctx)
    v2 = part.start(ctx, part.choose(ctx))
    try:
        assert blocked(cluster) == cut_pairs(v1["grudge"]) | cut_pairs(v2["grudge"])
        g.stop(ctx)                                # undoing one keeps the other's cuts
        assert blocked(cluster) == cut_pairs(v2["grudge"])
    finally:
        g.stop(ctx)
        part.stop(ctx)
    assert blocked(cluster) == set()


def _progress(node, timeout: float = 2.0) -> bool:
    """Does the node's process answer a request (not just the kernel a TCP handshake)?"""
    if node.role == "zookeeper":
        from clusters import zookeeper
        return zookeeper.is_serving(node.host, node.ports["client"])
    path = "/metrics" if node.role == "broker" else "/heartbeat"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{node.host}:{node.ports['http']}{path}", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("target", ["broker-1", "bookie-1"])
def test_pause_stops_progress_and_resume_restores_it(cluster, ctx, target):
    assert _progress(cluster.node(target))
    nem = make(f"pause:{target}")
    value = nem.start(ctx, nem.choose(ctx))
    try:
        assert value["node"] == target and cluster.node(target).paused
        assert not _progress(cluster.node(target))
    finally:
        nem.stop(ctx)
    node = cluster.node(target)
    assert node.alive and not node.paused
    deadline = time.monotonic() + 20
    while not _progress(node) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _progress(node)


def test_kill_and_restart_keep_the_data(cluster, ctx, topics):
    """Kill every bookie and every broker at once, restart them: every message written before is there."""
    topic = topics[0]
    with pulsar_client(cluster.service_url) as client:
        producer = client.create_producer(topic)
        for i in range(10, 30):
            producer.send(str(i).encode())
        producer.close()
    kills = [make("kill:all-bookie"), make("kill:all-broker")]
    values = [k.start(ctx, k.choose(ctx)) for k in kills]
    assert sorted(values[0]["nodes"]) == ["bookie-1", "bookie-2", "bookie-3"]
    assert not any(n.alive for n in cluster.nodes() if n.role in ("bookie", "broker"))
    for k in kills:
        k.stop(ctx)
    assert all(n.alive for n in cluster.nodes() if n.role != "client")
    assert all(values[0]["pids"][n.name] != n.pid for n in cluster.nodes("bookie"))
    # Right after the restart the lookup may still name a broker by the ownership znode of its
    # previous incarnation (until that ZooKeeper session expires), which refuses with "redo the
    # lookup"; the C++ client then waits out its whole operation timeout, so retry with short ones.
    got: list[int] = []
    deadline = time.monotonic() + 90
    while True:
        try:
            with pulsar_client(cluster.service_url, operation_timeout_seconds=10) as client:
                reader = client.create_reader(topic, pulsar.MessageId.earliest)
                while reader.has_message_available() and len(got) < 100:
                    got.append(int(reader.read_next(timeout_millis=30_000).data()))
                reader.close()
            break
        except pulsar.Timeout:
            if time.monotonic() > deadline:
                raise
    assert got == list(range(30))


def test_every_fault_op_is_in_the_history_with_its_targets_and_unappliable_ones_fail(cluster, ctx, tmp_path):
    journal = Journal(tmp_path / "nemesis.jsonl", time.monotonic_ns())
    schedule = [Scheduled(0.0, "isolate:bookie-1", 1.0), Scheduled(0.1, "zk-isolate", 1.0),
                Scheduled(1.5, "kill:broker-2", 3.0), Scheduled(2.0, "pause:broker-2"),  # dead: fails
                Scheduled(2.2, "kill:broker-9"),                                          # no such node
                Scheduled(2.4, "client-link:bookie-2", 1.0)]                              # not a broker
    r = NemesisRunner(cluster, [], 1.0, random.Random(5), journal, list(ctx.topics), schedule=schedule)
    stop = threading.Event()
    t = threading.Thread(target=r.run, args=(stop,))
    t.start()
    time.sleep(6.0)
    stop.set()
    t.join(120)
    r.heal()
    journal.close()
    ops = list(read_jsonl(journal.path))
    done = {(o.f, o.type): o for o in ops if o.type != INVOKE}
    assert all(o.process == -1 for o in ops)
    iso = done[("start-isolate", OK)]
    assert iso.node == "bookie-1" and cut_pairs(iso.value["grudge"]) >= {("bookie-1", "zk-1")}
    zk = done[("start-zk-isolate", OK)]
    assert zk.value["owner"] == zk.node and zk.key in ctx.topics
    kill = done[("start-kill", OK)]
    assert kill.node == "broker-2" and kill.value["pid"]
    assert done[("stop-kill", OK)].value["restarted"]
    fails = {o.f: o.error for o in ops if o.type == FAIL}
    assert "not running" in fails["start-pause"]
    assert "broker-9" in fails["start-kill"]
    assert "not a broker" in fails["start-client-link"]
    assert ("stop-pause", OK) not in done                  # a failed fault is never undone
    assert ops[-1].f == "heal" and ops[-1].type == OK
    assert all(n.alive and not n.paused for n in cluster.nodes() if n.role != "client")
