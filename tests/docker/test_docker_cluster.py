"""The docker backend on a real cluster (ZooKeeper, 3 bookies, 2 brokers, a client host, one container
each): nodes up and healthy, partitions that block exactly their grudge (probed from inside the
containers) and compose per call, pause/resume, kill and restart keeping data, wipe, and clients
run with `docker exec` that signals reach."""
from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from clusters import zookeeper
from clusters.config import BrokerConfig
from clusters.deploy import health as health_checks
from clusters.deploy.backend import HOST, ClusterError, grudge_edges, partition_groups
from clusters.deploy.docker import LABEL, VENV_PYTHON
from tests.netns import netns_cluster, pulsar_client

from .conftest import SERVICE_PORT, docker_json, http_ok, probe_from, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.docker]

SERVERS = ["zk-1", "bookie-1", "bookie-2", "bookie-3", "broker-1", "broker-2"]


@pytest.fixture(scope="module")
def cluster(docker_image):
    with netns_cluster("dk", backend="docker", image=docker_image, brokers=2, bookies=3, zookeepers=1,
                       clients=1, ensemble=3, write_quorum=2, ack_quorum=2) as c:
        yield c


def reachability(cluster) -> dict[tuple[str, str], str]:
    """(from, to) -> probe result, from every node (the client too) to every other server's service port."""
    nodes = cluster.nodes()
    servers = [n for n in nodes if n.role != "client"]
    out = {}
    for src in nodes:
        targets = [t for t in servers if t.name != src.name]
        results = probe_from(cluster, src.name, [(t.host, t.ports[SERVICE_PORT[t.role]]) for t in targets])
        out.update({(src.name, t.name): r for t, r in zip(targets, results)})
    return out


def assert_blocked_exactly(cluster, cut: set[tuple[str, str]]) -> None:
    """Every pair of a cut edge (either way: a drop is symmetric) times out; every other pair connects."""
    blocked = cut | {(b, a) for a, b in cut}
    got = reachability(cluster)
    wrong = {pair: r for pair, r in got.items() if r != ("timeout" if pair in blocked else "ok")}
    assert not wrong, f"expected blocked exactly {sorted(blocked)}; wrong: {wrong}"


def wait_all_healthy(cluster, timeout: float = 60) -> None:
    def healthy() -> bool:
        return all(n.alive and not n.paused and health_checks.DEFAULT[n.role](n)
                   for n in cluster.nodes() if n.role != "client")
    assert wait_for(healthy, timeout)


def test_nodes_up_and_healthy(cluster):
    st = cluster.status()
    assert st["status"] == "up" and st["backend"] == "docker"
    assert [n["name"] for n in st["nodes"]] == SERVERS + ["client-1"]
    net = docker_json("network", "inspect", cluster.network)[0]
    assert net["Internal"] is True and net["Labels"][LABEL] == cluster.name
    assert net["IPAM"]["Config"][0]["Subnet"] == st["subnet"]
    assert cluster.host_address == st["subnet"].rsplit(".", 1)[0] + ".1"
    for node in cluster.nodes():
        assert node.alive and not node.paused, node
        if node.role != "client":
            assert health_checks.DEFAULT[node.role](node), f"{node.name} not healthy"
        assert node.log.read_text().startswith("=== pulsar-chaos ")
        info = docker_json("inspect", node.namespace)[0]
        assert info["Config"]["Labels"][LABEL] == cluster.name
        assert info["NetworkSettings"]["Networks"][cluster.network]["IPAddress"] == node.host
        node_dir = str(node.log.parent)
        assert any(m["Source"] == node_dir and m["Destination"] == node_dir for m in info["Mounts"])
        assert info["State"]["Pid"] == node.pid
    zk = cluster.node("zk-1")
    assert zookeeper.mode(zk.host, zk.ports["client"]) == "standalone"      # reachable from the host
    assert cluster.service_url == "pulsar://" + ",".join(
        f"{cluster.node(b).host}:6650" for b in ("broker-1", "broker-2"))
    # an internal network: no way out of the cluster
    assert probe_from(cluster, "broker-1", [("1.1.1.1", 53)]) != ["ok"]


def test_partition_blocks_exactly_the_grudge_and_heal_restores(cluster):
    assert_blocked_exactly(cluster, set())
    halves = partition_groups([["broker-1", "bookie-1"], ["broker-2", "bookie-2", "zk-1"]])
    overlap = {"broker-1": ["broker-2"]}                  # also cut by `halves`
    try:
        cluster.partition(halves)
        assert_blocked_exactly(cluster, grudge_edges(halves))
        cluster.partition(overlap)
        # undoing one partition keeps the links the other still cuts
        cluster.unpartition(halves)
        assert_blocked_exactly(cluster, {("broker-1", "broker-2")})
        assert cluster.status()["partitions"] == [["broker-1", "broker-2"]]
        # a node restarted during a partition comes back cut (its container loads the rules first)
        cluster.kill("broker-1")
        cluster.start("broker-1")
        assert_blocked_exactly(cluster, {("broker-1", "broker-2")})
        cluster.unpartition(overlap)
        assert_blocked_exactly(cluster, set())
        # the harness host as a node of a grudge
        b1, b2 = cluster.node("broker-1"), cluster.node("broker-2")
        cluster.partition({"broker-2": [HOST]})
        assert not health_checks.tcp_accepts(b2.host, 6650, timeout=1.5)
        assert health_checks.tcp_accepts(b1.host, 6650, timeout=1.5)
        cluster.flaky("bookie-3", "broker-1", 1.0)         # p=1: every packet of that link dropped
        assert probe_from(cluster, "bookie-3", [(b1.host, 6650), (b2.host, 6650)]) == ["timeout", "ok"]
        cluster.unflaky("bookie-3", "broker-1", 1.0)
        assert probe_from(cluster, "bookie-3", [(b1.host, 6650), (b2.host, 6650)]) == ["ok", "ok"]
        cluster.flaky("bookie-3", "broker-1", 1.0)         # left for heal()
        assert cluster.status()["flaky"] == [["bookie-3", "broker-1", 1.0]]
    finally:
        cluster.heal()
    assert cluster.status()["partitions"] == [] and cluster.status()["flaky"] == []
    assert health_checks.tcp_accepts(cluster.node("broker-2").host, 6650, timeout=1.5)
    assert_blocked_exactly(cluster, set())
    wait_all_healthy(cluster)


def test_pause_stops_progress_and_resume_restores_it(cluster):
    b = cluster.node("broker-1")
    url = f"http://{b.host}:{b.ports['http']}/admin/v2/brokers/health"
    assert wait_for(lambda: http_ok(url), 30)
    cluster.pause("broker-1")
    try:
        node = cluster.node("broker-1")
        assert node.alive and node.paused
        assert docker_json("inspect", node.namespace)[0]["State"]["Paused"] is True
        assert not http_ok(url, timeout=3)       # the kernel accepts; the frozen broker never answers
        cluster.pause("broker-1")                # idempotent
    finally:
        cluster.resume("broker-1")
    assert not cluster.node("broker-1").paused
    assert wait_for(lambda: http_ok(url), 30)


def test_kill_and_start_keep_data(cluster):
    import pulsar
    topic = f"persistent://public/default/dk-{uuid.uuid4().hex[:8]}"
    sent = [f"message-{i}".encode() for i in range(50)]
    with pulsar_client(cluster.service_url) as client:
        producer = client.create_producer(topic)
        for m in sent:
            producer.send(m)
        producer.close()
    ids = {n: docker_json("inspect", cluster.node(n).namespace)[0]["Id"] for n in SERVERS}
    for name in reversed(SERVERS):              # brokers, bookies, then ZooKeeper: every node down
        cluster.kill(name)
    assert not any(n.alive for n in cluster.nodes() if n.role != "client")
    with pytest.raises(ClusterError, match="not running"):
        cluster.kill("broker-1")
    for name in SERVERS:
        cluster.start(name, timeout=90)
    with pytest.raises(ClusterError, match="already running"):
        cluster.start("zk-1")
    for name in SERVERS:                        # the same containers, restarted
        assert docker_json("inspect", cluster.node(name).namespace)[0]["Id"] == ids[name]
        assert cluster.node(name).log.read_text().count("=== pulsar-chaos ") >= 2
    # The bundle's ownership znode of the killed broker session outlives it by the ZooKeeper session
    # timeout; a reader created inside that window is refused once ("not served by this instance")
    # and its creation then hangs (the same on the netns backend: a reference-system finding).
    time.sleep(BrokerConfig.zk_session_timeout + 3)
    got = []
    with pulsar_client(cluster.service_url) as client:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        while len(got) < len(sent):
            got.append(reader.read_next(60_000).data())
        reader.close()
    assert got == sent


def test_wipe_a_stopped_bookie(cluster):
    with pytest.raises(ClusterError, match="is running"):
        cluster.wipe("bookie-3")
    node = cluster.node("bookie-3")
    cluster.stop("bookie-3")
    assert not cluster.node("bookie-3").alive
    report = cluster.wipe("bookie-3")
    assert report["node"] == "bookie-3" and report["files"] > 0 and report["removed"]
    assert list(node.data_dir.iterdir()) == []
    assert node.config.is_file() and node.log.is_file()        # identity and history stay
    with pytest.raises(ClusterError, match="exited with code 3 while starting: .*cookie is missing on disk"):
        cluster.start("bookie-3")                              # its cookie is in ZooKeeper still
    assert cluster.format("bookie-3")["cookie_deleted"] is True
    cluster.start("bookie-3")
    assert cluster.node("bookie-3").alive


def test_run_client_runs_in_the_client_container_and_signals_reach_it(cluster, tmp_path):
    client_dir = cluster.node("client-1").log.parent
    out = client_dir / f"probe-{uuid.uuid4().hex[:6]}.txt"
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
            "open(sys.argv[1], 'w').write(sys.executable)\n"
            "time.sleep(600)\n")
    proc = cluster.run_client([sys.executable, "-c", code, str(out)])
    assert wait_for(lambda: out.exists() and out.read_text() != "", 30)
    assert out.read_text() == VENV_PYTHON                  # the image's Python, not the host's
    proc.terminate()
    assert proc.wait(30) == 7                              # SIGTERM reached the command's handler
    stubborn = cluster.run_client(["sh", "-c", "trap '' TERM; sleep 600"], stdout=subprocess.DEVNULL)
    assert stubborn.inner_pid() is not None
    stubborn.terminate()
    with pytest.raises(subprocess.TimeoutExpired):
        stubborn.wait(2)
    stubborn.kill()
    assert stubborn.wait(30) == 128 + 9
    assert "sleep 600" not in cluster.exec("client-1", ["ps", "-eo", "args"]).stdout
    script = tmp_path / "not-mounted.py"
    script.write_text("print('hi')\n")
    with pytest.raises(ClusterError, match="not visible"):
        cluster.run_client([sys.executable, str(script)])
    out.unlink()
