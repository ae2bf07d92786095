"""Every nemesis on a live netns cluster (real ZooKeeper, bookies, brokers): the fault has its effect
while active and is gone after stop; the broker's HTTP lookup names the owner the client uses."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pulsar
import pytest

from clusters.deploy import procs
from core.history import INVOKE, OK, Journal, read_jsonl
from nemesis.base import http_lookup
from tests.netns import netns_cluster, owner_node
from nemesis.combine import NemesisRunner

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    with netns_cluster("nm", brokers=2, bookies=3, zookeepers=1) as c:
        yield c


@pytest.fixture(scope="module")
def topic(cluster):
    """A topic with data, produced by the real pulsar client (so it has an owner)."""
    name = f"persistent://public/default/nem-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(name)
        for i in range(10):
            producer.send(str(i).encode())
        producer.close()
    finally:
        client.close()
    return name


@pytest.fixture
def runner(cluster, topic, tmp_path):
    journal = Journal(tmp_path / "nemesis.jsonl", time.monotonic_ns())
    r = NemesisRunner(cluster, ["partition", "kill", "pause", "zk-isolate"], 0.3, random.Random(42),
                      journal, [topic])
    try:
        yield r
    finally:
        r.heal()
        journal.close()
        assert all(n.alive and not n.paused for n in cluster.nodes() if n.role != "client")


def ops_of(runner) -> list:
    runner.journal.sync()
    return list(read_jsonl(runner.journal.path))


def connect_from(cluster, src: str, dst: str, port_name: str, timeout: float = 1.0) -> bool:
    """Can node `src` open a TCP connection to node `dst`'s port? (run inside src's namespace)"""
    s, d = cluster.node(src), cluster.node(dst)
    code = (f"import socket\ntry:\n socket.create_connection(({d.host!r}, {d.ports[port_name]}), {timeout}).close()"
            f"\n print('ok')\nexcept OSError as e:\n print('fail', e)")
    out = subprocess.run(["ip", "netns", "exec", s.namespace, sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=timeout + 15).stdout
    return out.startswith("ok")


PORT = {"zookeeper": "client", "bookie": "bookie", "broker": "pulsar"}


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()[0]


def fetch(url: str) -> bytes:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as r:
        return r.read()


def test_http_lookup_names_the_owner(cluster, topic):
    owner = owner_node(cluster, topic)
    host = cluster.node(owner).host
    for b in cluster.nodes("broker"):
        ans = http_lookup(f"http://{b.host}:{b.ports['http']}", topic)
        assert ans["brokerUrl"] == ans["nativeUrl"] == f"pulsar://{host}:6650"
        assert ans["httpUrl"] == f"http://{host}:8080"
        assert fetch(f"http://{b.host}:{b.ports['http']}/admin/v2/brokers/health") == b"ok"
    stats_url = f"http://{host}:8080/admin/v2/persistent/{topic.split('://')[1]}/internalStats"
    stats = json.loads(fetch(stats_url))
    assert stats["source"] == "memory" and stats["ledgers"] and stats["lastConfirmedEntry"].endswith(":9")
    # The official client can use the HTTP lookup too (service URL http://...).
    client = pulsar.Client(f"http://{cluster.nodes('broker')[0].host}:8080", operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [int(reader.read_next(10000).data()) for _ in range(10)] == list(range(10))
    finally:
        client.close()


def test_kill_and_restart(cluster, runner):
    nem = runner.start_fault("kill")
    v = nem.applied
    assert v and v["role"] in ("bookie", "broker")
    assert not procs.alive(v["pid"]) and not cluster.node(v["node"]).alive
    assert runner.active() == [nem.describe()]
    assert runner.stop_faults()
    node = cluster.node(v["node"])
    assert node.alive and node.pid != v["pid"] and proc_state(node.pid) in ("S", "R")
    port = PORT[node.role]
    assert connect_from(cluster, "zk-1", node.name, port)         # serving again
    ops = ops_of(runner)
    assert [(o.type, o.f) for o in ops] == [(INVOKE, "start-kill"), (OK, "start-kill"),
                                           (INVOKE, "stop-kill"), (OK, "stop-kill")]
    assert ops[1].node == v["node"] and ops[1].value["pid"] == v["pid"] and ops[3].value["restarted"]


def test_pause_and_resume(cluster, runner):
    nem = runner.start_fault("pause")
    v = nem.applied
    assert proc_state(v["pid"]) == "T" and cluster.node(v["node"]).paused
    assert runner.stop_faults()
    assert proc_state(v["pid"]) in ("S", "R") and not cluster.node(v["node"]).paused
    ops = ops_of(runner)
    assert [o.f for o in ops] == ["start-pause"] * 2 + ["stop-pause"] * 2
    assert ops[1].value == {"node": v["node"], "role": cluster.node(v["node"]).role, "pid": v["pid"]}


def test_partition_halves(cluster, runner):
    nem = runner.start_fault("partition")
    small, big = nem.applied["sides"]
    assert "zk-1" in big
    a, b = small[0], big[-1]
    try:
        role_b, role_a = cluster.node(b).role, cluster.node(a).role
        assert not connect_from(cluster, a, b, PORT[role_b])       # across the cut: dropped
        assert not connect_from(cluster, b, a, PORT[role_a])
        if len(big) > 1:
            c = big[0]
            assert connect_from(cluster, c, b, PORT[role_b])        # same side: fine
        assert cluster.status()["partitions"]
    finally:
        assert runner.stop_faults()
    assert connect_from(cluster, a, b, PORT[cluster.node(b).role])
    assert cluster.status()["partitions"] == []
    ops = ops_of(runner)
    assert ops[1].f == "start-partition" and ops[1].value["grudge"][a] == sorted(big)
    assert ops[3].f == "stop-partition" and ops[3].value["healed"]


def test_zk_isolate_cuts_the_owner_from_zookeeper(cluster, runner, topic):
    owner = runner.ctx.owner_of(topic)
    assert owner == owner_node(cluster, topic)
    nem = runner.start_fault("zk-isolate")
    v = nem.applied
    try:
        assert v["topic"] == topic and v["owner"] == owner
        assert v["grudge"] == {owner: ["zk-1"], "zk-1": [owner]}
        assert not connect_from(cluster, owner, "zk-1", "client")
        other = next(n.name for n in cluster.nodes("broker") if n.name != owner)
        assert connect_from(cluster, owner, "bookie-1", "bookie")
        assert connect_from(cluster, owner, other, "pulsar")
        assert connect_from(cluster, other, "zk-1", "client")
    finally:
        assert runner.stop_faults()
    assert connect_from(cluster, owner, "zk-1", "client")
    ops = ops_of(runner)
    assert [(o.type, o.f, o.key) for o in ops] == [(INVOKE, "start-zk-isolate", topic), (OK, "start-zk-isolate", topic),
                                                  (INVOKE, "stop-zk-isolate", topic), (OK, "stop-zk-isolate", topic)]
    assert ops[1].node == owner and ops[1].value["grudge"] == v["grudge"]


def test_runner_for_a_few_seconds_leaves_no_fault(cluster, runner):
    stop = threading.Event()
    t = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    t.start()
    time.sleep(4.0)
    stop.set()
    t.join(120)
    assert not t.is_alive()
    assert runner.active() == []
    assert cluster.status()["partitions"] == []
    assert all(n.alive and not n.paused for n in cluster.nodes() if n.role != "client")
    ops = ops_of(runner)
    starts = [o for o in ops if o.f.startswith("start-") and o.type == INVOKE]
    assert starts
    assert len([o for o in ops if o.type == INVOKE]) == len([o for o in ops if o.type != INVOKE])
    for o in ops:
        if o.type != INVOKE and o.f.startswith("start-") and o.type == OK:
            assert o.value
