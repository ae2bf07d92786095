"""The netns backend against real namespaces, iptables and ZooKeeper (placeholders stand in for
bookies and brokers): lifecycle, process faults, partitions, teardown and cleanup of killed runs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import networkx as nx
import pytest

from clusters import zookeeper
from clusters.deploy import hostnet, procs
from clusters.deploy.backend import ClusterError
from clusters.deploy.netns import NetnsCluster
from clusters.deploy.spec import ROOT

from .conftest import connect_from, host_connect, unique_name

pytestmark = pytest.mark.integration


def ours(cid: str) -> tuple[list[str], list[str], list[list[str]]]:
    pre = f"pc-{cid}-"
    return ([n for n in hostnet.netns_list() if n.startswith(pre)],
            [n for n in hostnet.link_names() if n.startswith(pre)],
            hostnet.tagged_host_rules(cid))


def wait_for(pred, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_up_status_faults_and_down(make_cluster):
    c = make_cluster()
    st = c.status()
    assert st["status"] == "up"
    assert [n["name"] for n in st["nodes"]] == ["zk-1", "bookie-1", "broker-1", "client-1"]
    by = {n["name"]: n for n in st["nodes"]}
    for name in ("zk-1", "bookie-1", "broker-1"):
        assert by[name]["alive"] and by[name]["state"] == "running"
        assert procs.in_netns(by[name]["pid"], by[name]["namespace"])
        assert os.path.exists(by[name]["log"])
    assert st["service_url"] == f"pulsar://{by['broker-1']['host']}:6650"
    assert c.zk_connect == f"{by['zk-1']['host']}:2181"
    state = json.loads(c.state_path.read_text())
    assert state["nodes"]["zk-1"]["pid"] == by["zk-1"]["pid"]

    zk = c.node("zk-1")
    assert zookeeper.mode(zk.host, 2181) == "standalone"         # reachable from the host
    assert connect_from(c.node("broker-1").namespace, zk.host, 2181) == "ok"
    assert connect_from(c.node("broker-1").namespace, "1.1.1.1", 53) == "OSError"  # no route out

    c.kill("zk-1")
    assert not c.is_alive("zk-1") and not host_connect(zk.host, 2181)
    with pytest.raises(ClusterError):
        c.kill("zk-1")                                          # not running
    old_pid = zk.pid
    c.start("zk-1")                                             # same config, data, address
    zk = c.node("zk-1")
    assert zk.alive and zk.pid != old_pid and zookeeper.is_serving(zk.host, 2181)
    with pytest.raises(ClusterError):
        c.start("zk-1")                                         # already running

    c.pause("zk-1")
    zk = c.node("zk-1")
    assert zk.alive and zk.paused
    assert not zookeeper.is_serving(zk.host, 2181)              # accepts in the kernel, never answers
    c.resume("zk-1")
    assert not c.node("zk-1").paused and wait_for(lambda: zookeeper.is_serving(zk.host, 2181), 5)

    c.stop("bookie-1")
    assert not c.is_alive("bookie-1")
    c.start("bookie-1")
    assert c.is_alive("bookie-1") and host_connect(c.node("bookie-1").host, 3181)

    pids = [n.pid for n in c.nodes() if n.pid]
    c.down()
    assert ours(c.id) == ([], [], [])
    assert not any(procs.alive(p) for p in pids)
    assert c.status()["status"] == "down"
    assert os.path.exists(c.node("zk-1").log)                 # logs and data stay
    c.down()                                                   # idempotent


def test_partitions_drop_traffic_and_heal_restores(make_cluster):
    c = make_cluster()
    zk, bookie, broker = c.node("zk-1"), c.node("bookie-1"), c.node("broker-1")
    # zk-1 drops bookie-1's packets: bookie-1's SYNs vanish, so its connect times out
    c.partition({"zk-1": {"bookie-1"}})
    assert connect_from(bookie.namespace, zk.host, 2181) == "timeout"
    assert connect_from(broker.namespace, zk.host, 2181) == "ok"   # others unaffected
    assert zookeeper.is_serving(zk.host, 2181)                     # and the host too
    # composes: a graph grudge adds broker-1 <-> zk-1 on top
    c.partition(nx.DiGraph([("broker-1", "zk-1")]))
    assert connect_from(broker.namespace, zk.host, 2181) != "ok"
    assert connect_from(bookie.namespace, zk.host, 2181) == "timeout"
    assert sorted(map(tuple, c.status()["partitions"])) == [("broker-1", "zk-1"), ("zk-1", "bookie-1")]
    c.heal()
    assert connect_from(bookie.namespace, zk.host, 2181) == "ok"
    assert connect_from(broker.namespace, zk.host, 2181) == "ok"
    assert c.status()["partitions"] == []

    # the harness host can be cut off too ('host'), e.g. to isolate clients running on it
    c.partition({"zk-1": {"host"}})
    assert not host_connect(zk.host, 2181)
    assert connect_from(bookie.namespace, zk.host, 2181) == "ok"
    c.heal()
    assert host_connect(zk.host, 2181)

    # a client host: its links can be cut like any node's
    probe = ["python3", "-c", f"import socket; socket.create_connection(('{zk.host}', 2181), timeout=1)"]
    assert c.run_client(probe, stderr=subprocess.DEVNULL).wait(10) == 0
    c.partition({"client-1": {"zk-1"}})
    assert c.run_client(probe, stderr=subprocess.DEVNULL).wait(10) != 0
    c.heal()

    # flaky with p=1 drops everything; heal removes it
    c.flaky("bookie-1", "zk-1", 1.0)
    assert connect_from(bookie.namespace, zk.host, 2181) != "ok"
    c.heal()
    assert connect_from(bookie.namespace, zk.host, 2181) == "ok"
    with pytest.raises(ClusterError):
        c.partition({"zk-1": {"nobody"}})


def test_second_up_of_same_name_refuses_and_leaves_first_running(make_cluster):
    c = make_cluster(bookies=0, brokers=0)
    again = NetnsCluster(c.spec)
    with pytest.raises(ClusterError, match="already up"):
        again.up()
    assert c.is_alive("zk-1") and zookeeper.is_serving(c.node("zk-1").host, 2181)


def test_cleanup_after_a_killed_run():
    name = unique_name("k")
    script = textwrap.dedent(f"""
        import os, signal
        from clusters.deploy.netns import NetnsCluster
        from clusters.deploy.spec import ClusterSpec
        NetnsCluster(ClusterSpec(name={name!r}, bookies=0, brokers=0)).up()
        print("up", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)      # no down(), no atexit: a killed run
    """)
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert out.returncode == -9 and "up" in out.stdout, out.stderr
        c = NetnsCluster.attach(name)
        zk = c.node("zk-1")
        assert zk.alive and zookeeper.is_serving(zk.host, 2181)  # the orphan still runs
        subprocess.run(["ip", "netns", "add", f"pc-{c.id}-stray"], check=True)  # unrecorded leftover
        assert ours(c.id)[0] and ours(c.id)[1] and ours(c.id)[2]

        cli = subprocess.run([os.path.join(os.path.dirname(sys.executable), "pulsar-chaos"),
                              "cluster", "down", "--force", "--name", name],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        report = json.loads(cli.stdout)
        assert report["clusters"] == [name] and f"pc-{c.id}-stray" in report["namespaces"]
        assert ours(c.id) == ([], [], [])
        assert wait_for(lambda: not procs.alive(zk.pid), 5)
        assert c.status()["status"] == "down"
    finally:
        NetnsCluster.cleanup_all(force=True, names=[name])
        shutil.rmtree(ROOT / name, ignore_errors=True)
