"""The backend registry, and `cluster list` / `cluster status` over state files of every backend written
into temporary roots (in the format written before the shared lifecycle): no root needed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clusters.deploy import backends
from clusters.deploy.backend import ClusterError
from clusters.deploy.docker import DockerCluster
from clusters.deploy.lifecycle import StateFileCluster, short_id
from clusters.deploy.netns import NetnsCluster
from clusters.deploy.spec import ClusterSpec
from harness import cli


class FakeCluster(NetnsCluster):
    """A third backend, registered only by the test that needs it."""
    backend = "fake"


def old_state(backend: str, name: str, root: Path, status: str, subnet: str) -> dict[str, Any]:
    """A one-ZooKeeper cluster's state.json as the netns or docker backend wrote it before."""
    base, net, cid = root / name, subnet.rsplit(".", 1)[0], short_id(name)
    node_dir = base / "nodes" / "zk-1"
    node = {"name": "zk-1", "role": "zookeeper", "index": 1, "host": f"{net}.11",
            "ports": {"client": 2181, "peer": 2888, "election": 3888}, "dir": str(node_dir),
            "log": str(node_dir / "node.log"), "data_dir": str(node_dir / "data"), "config": None, "argv": None,
            "pid": None, "started_at": None}
    state = {"version": 1, "name": name, "id": cid, "status": status, "created_at": "2024-01-01T00:00:00+00:00",
             "owner_pid": 1, "owner_start": None, "detached": True, "base_dir": str(base),
             "spec": ClusterSpec(name=name, base_dir=base, brokers=0, bookies=0).to_json(), "subnet": subnet,
             "host_address": f"{net}.1", "clients": [], "drops": [["zk-1", "host"]], "flaky": []}
    if backend == "docker":
        node.update(container=f"pcd-{name}-zk-1", container_id=None)
        state.update(backend="docker", image="pulsar-chaos-node:000000000000", image_id="sha256:0", mounts=[],
                     iptables="nft", network={"name": f"pcd-{name}", "id": None, "bridge": f"pcd-{cid}"},
                     drop_counts={"zk-1>host": 1})
    else:
        node.update(namespace=f"pc-{cid}-zk-1", veth=f"pc-{cid}-z1", netns_ino=None, pid_start=None)
        state.update(bridge={"name": f"pc-{cid}-br", "address": f"{net}.1/24"}, host_rules=[], slow=[])
    state["nodes"] = {"zk-1": node}
    return state


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Each backend's root in tmp_path, holding: netns `alpha` (up, present), netns `beta` (up, but gone
    from the host), docker `alpha` (down), and a corrupt state that listing skips. Presence is decided
    by the name, so that no namespace or container is needed."""
    present = {("netns", "alpha")}
    for cls in (NetnsCluster, DockerCluster, FakeCluster):
        monkeypatch.setattr(cls, "root", tmp_path / cls.backend)
        monkeypatch.setattr(cls, "is_present", classmethod(lambda c, s: (c.backend, s["name"]) in present))
    for backend, name, status, subnet in (("netns", "alpha", "up", "10.213.250.0/24"),
                                          ("netns", "beta", "up", "10.213.251.0/24"),
                                          ("docker", "alpha", "down", "10.213.252.0/24")):
        root = tmp_path / backend
        (root / name).mkdir(parents=True)
        (root / name / "state.json").write_text(json.dumps(old_state(backend, name, root, status, subnet)))
    (tmp_path / "netns" / "broken").mkdir()
    (tmp_path / "netns" / "broken" / "state.json").write_text("{not json")
    return tmp_path


def cli_json(capsys, *argv: str) -> Any:
    assert cli.main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_the_registry_names_each_backend_and_imports_none_until_asked():
    code = ("import sys, clusters.deploy.backends as b; "
            "print(sorted(b.BACKENDS), sorted(m for m in sys.modules if m.startswith('clusters.deploy.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['docker', 'netns'] ['clusters.deploy.backend', 'clusters.deploy.backends']"
    assert backends.DEFAULT == "netns"
    for name, entry in backends.BACKENDS.items():
        cls = entry.cluster_class()
        assert issubclass(cls, StateFileCluster) and cls.backend == name and entry.help
    assert backends.get("docker").cluster_class() is DockerCluster
    with pytest.raises(ClusterError, match="unknown backend 'nope'.*netns, docker"):
        backends.get("nope")


def test_cluster_list_shows_the_clusters_of_every_backend(roots, capsys):
    rows = cli_json(capsys, "cluster", "list")
    assert [(r["backend"], r["name"], r["status"]) for r in rows] == [
        ("netns", "alpha", "up"), ("netns", "beta", "gone"), ("docker", "alpha", "down")]
    assert rows[2] == {"name": "alpha", "backend": "docker", "status": "down", "subnet": "10.213.252.0/24",
                       "base_dir": str(roots / "docker" / "alpha")}
    assert backends.list_clusters() == rows


def test_a_backend_that_cannot_look_lists_its_clusters_as_unknown(roots, capsys, monkeypatch):
    def no_engine(cls, state):
        raise ClusterError("docker not found")
    monkeypatch.setattr(DockerCluster, "is_present", classmethod(no_engine))
    root = roots / "docker"
    (root / "delta").mkdir()
    (root / "delta" / "state.json").write_text(json.dumps(old_state("docker", "delta", root, "up", "10.213.254.0/24")))
    rows = cli_json(capsys, "cluster", "list")
    assert [(r["backend"], r["name"], r["status"]) for r in rows] == [
        ("netns", "alpha", "up"), ("netns", "beta", "gone"), ("docker", "alpha", "down"),
        ("docker", "delta", "unknown")]


def test_cli_backends_come_from_the_registry(roots, capsys, monkeypatch):
    with pytest.raises(SystemExit) as ex:
        cli.main(["cluster", "status", "--backend", "fake"])
    assert ex.value.code == 254 and "invalid choice: 'fake'" in capsys.readouterr().err
    monkeypatch.setitem(backends.BACKENDS, "fake",
                        backends.BackendEntry("fake", f"{__name__}:FakeCluster", "a backend of this test"))
    root = roots / "fake"
    (root / "gamma").mkdir(parents=True)
    (root / "gamma" / "state.json").write_text(json.dumps(old_state("netns", "gamma", root, "down", "10.213.253.0/24")))
    assert [(r["backend"], r["name"]) for r in cli_json(capsys, "cluster", "list")][-1] == ("fake", "gamma")
    st = cli_json(capsys, "cluster", "status", "--backend", "fake", "--name", "gamma")
    assert (st["backend"], st["name"], st["status"]) == ("fake", "gamma", "down")
    assert st["nodes"][0]["state"] == "never started"


def test_states_written_before_the_shared_lifecycle_attach_and_report(roots):
    netns = NetnsCluster.attach("alpha").status()
    assert (netns["status"], netns["bridge"], netns["partitions"]) == ("up", f"pc-{short_id('alpha')}-br",
                                                                       [["zk-1", "host"]])
    assert netns["zk_connect"] == "10.213.250.11:2181" and netns["nodes"][0]["namespace"] == "pc-alpha-zk-1"
    assert NetnsCluster.attach("beta").state_status() == "gone"
    docker = DockerCluster.attach("alpha")
    assert docker.image == "pulsar-chaos-node:000000000000" and docker.base_dir == roots / "docker" / "alpha"
    with pytest.raises(ClusterError, match="docker cluster 'nope' is not up.*--backend docker --name nope"):
        DockerCluster.attach("nope")


def test_one_chain_of_drop_rules_from_the_state_for_every_backend(roots):
    c = NetnsCluster.attach("alpha")
    state = c._state()
    state["nodes"]["zk-2"] = {**state["nodes"]["zk-1"], "name": "zk-2", "host": "10.213.250.12"}
    state["flaky"] = [["zk-1", "zk-2", 0.25], ["zk-2", "zk-1", 0.5]]
    assert c._chain_rules(state, "zk-1") == [
        "-A PCHAOS -s 10.213.250.1/32 -j DROP", "-A PCHAOS -d 10.213.250.1/32 -j DROP",
        "-A PCHAOS -s 10.213.250.12/32 -m statistic --mode random --probability 0.250000 -j DROP",
        "-A PCHAOS -d 10.213.250.12/32 -m statistic --mode random --probability 0.250000 -j DROP"]


def test_one_way_cuts_are_rules_on_the_deaf_node_only(roots):
    """deafen(node, peers): the node drops what the peers send it (no -d rule); with a trigger, the
    connection that carried the trigger's bytes is marked and the peer's packets on it dropped."""
    from clusters.deploy import statefile
    c = NetnsCluster.attach("alpha")
    state = c._state()
    state["nodes"]["zk-2"] = {**state["nodes"]["zk-1"], "name": "zk-2", "host": "10.213.250.12"}
    state["drops"], state["flaky"] = [], []
    # counted per call, like partitions: two cuts, one undone, one left
    assert statefile.count_drops(state, [("zk-1", "zk-2")], +1, "inbound") == [("zk-1", "zk-2")]
    assert statefile.count_drops(state, [("zk-1", "zk-2")], +1, "inbound") == []
    assert statefile.count_drops(state, [("zk-1", "zk-2")], -1, "inbound") == []
    assert state["inbound"] == [["zk-1", "zk-2"]] and state["drops"] == []
    assert c._chain_rules(state, "zk-1") == ["-A PCHAOS -s 10.213.250.12/32 -j DROP"]
    assert c._chain_rules(state, "zk-2") == []
    assert statefile.count_drops(state, [("zk-1", "zk-2")], -1, "inbound") == [("zk-1", "zk-2")]
    assert state["inbound"] == [] and c._chain_rules(state, "zk-1") == []

    state["inbound_on"] = [["zk-1", "zk-2", b"\x00\x00\x00\x02/ns".hex()]]
    mark_rule, drop_rule = c._chain_rules(state, "zk-1")
    assert mark_rule.startswith("-A PCHAOS -d 10.213.250.12/32 -m string --algo bm --hex-string |000000022f6e73| "
                                "-j CONNMARK --set-mark 0x")
    mark = mark_rule.rsplit(" ", 1)[1]
    assert drop_rule == f"-A PCHAOS -s 10.213.250.12/32 -m connmark --mark {mark} -j DROP"
    assert int(mark, 16) != 0 and c._chain_rules(state, "zk-2") == []
    with pytest.raises(ClusterError, match="not the host"):
        c.deafen("host", ["zk-1"])
    with pytest.raises(ClusterError, match="trigger is empty"):
        c.deafen("zk-1", ["zk-2"], trigger=b"")
