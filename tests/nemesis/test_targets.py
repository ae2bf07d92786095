"""Fault targets resolved at fault time (nemesis/targets.py).

Unit tests answer the cluster's questions with a fake cluster and fake probes; the integration tests
resolve every selector on a real netns cluster (3 ZooKeeper nodes, 3 bookies, 2 brokers) and check
each answer another way: the owner by a lookup through another broker and the ownership znode, the
ledger's bookies against the BookKeeper metadata read by our BookKeeper client, the ZooKeeper leader
against each node's `srvr` Mode (and again after the leader is killed), the load-balancer leader
against the znode.

Semantics: Pulsar's lookup (https://pulsar.apache.org/docs/concepts-clients/#client-setup-phase),
internal stats (https://pulsar.apache.org/docs/admin-api-topics/#get-internal-stats), ZooKeeper's
four-letter words (https://zookeeper.apache.org/doc/r3.8.4/zookeeperAdmin.html#sc_4lw), Pulsar's
LeaderElectionService (ELECTION_ROOT /loadbalance/leader, pulsar-broker
.../broker/loadbalance/LeaderElectionService.java).
"""
from __future__ import annotations

import asyncio
import json
import random
import time
import uuid

import pytest

from clusters.bookkeeper.metadata import LedgerMetadata
from nemesis import targets
from nemesis.base import NemesisContext, NemesisError, http_lookup
from tests.nemesis.fakes import FakeCluster


# ------------------------------------------------------------------------------ fakes

class FakeProbes(targets.Probes):
    def __init__(self, stats=None, znodes=None, srvr=None):
        self.stats = stats or {}            # admin url -> internalStats answer (or an exception)
        self.znodes = znodes or {}          # path -> bytes
        self.srvr_answers = srvr or {}      # host -> srvr text
        self.asked: list[str] = []

    def internal_stats(self, admin_url, topic):
        self.asked.append(admin_url)
        ans = self.stats.get(admin_url)
        if isinstance(ans, BaseException):
            raise ans
        if ans is None:
            raise NemesisError("connection refused")
        return ans

    def zk_get(self, zk_connect, path):
        return self.znodes.get(path)

    def srvr(self, host, port):
        return self.srvr_answers.get(host, "")


def ctx_of(cluster, seed=7, topics=("persistent://public/default/t1", "persistent://public/default/t2"),
           lookup=None):
    return NemesisContext(cluster=cluster, rng=random.Random(seed), topics=list(topics), lookup=lookup)


def ledger_md(lid, ensembles, state="OPEN"):
    return LedgerMetadata(ledger_id=lid, ensemble_size=3, write_quorum=2, ack_quorum=2, state=state,
                          ensembles=ensembles).serialize()


def srvr_text(mode, zxid="0x100000005"):
    return f"Zookeeper version: 3.8.0\nLatency min/avg/max: 0/0/0\nZxid: {zxid}\nMode: {mode}\nNode count: 5\n"


# ------------------------------------------------------------------------------ draws

def test_draws_are_fixed_per_selector_and_layout_whatever_the_cluster_state():
    """The same seed gives the same draws, and a draw consumes the same randomness whether the
    drawn nodes are alive or not (the pools are the layout's)."""
    c = FakeCluster()
    a, b = ctx_of(c, seed=3), ctx_of(c, seed=3)
    for sel in ("random", "broker", "bookie", "zookeeper", "owner", "ledger-bookies", "zk-leader", "all-bookie"):
        assert targets.draw(a, sel) == targets.draw(b, sel)
    c.kill("bookie-1")
    c.kill("broker-2")
    d, e = ctx_of(c, seed=3), ctx_of(FakeCluster(), seed=3)
    for sel in ("random", "bookie", "owner", "zk-leader", "broker-1"):
        assert targets.draw(d, sel) == targets.draw(e, sel)
    assert d.rng.getstate() == e.rng.getstate()
    # what each selector draws
    f = ctx_of(FakeCluster(), seed=1)
    assert targets.draw(f, "random")["node"] in {"broker-1", "broker-2", "bookie-1", "bookie-2", "bookie-3"}
    assert targets.draw(f, "zookeeper") == {"selector": "zookeeper", "node": "zk-1"}
    assert targets.draw(f, "owner")["topic"] in {"persistent://public/default/t1", "persistent://public/default/t2"}
    assert targets.draw(f, "owner", topic="t9") == {"selector": "owner", "topic": "persistent://public/default/t9"}
    state = f.rng.getstate()
    for sel in ("zk-leader", "lb-leader", "all-broker", "bookie-2"):
        assert targets.draw(f, sel) == {"selector": sel}
    assert f.rng.getstate() == state


def test_random_role_all_and_exact_selectors():
    c = FakeCluster(brokers=2, bookies=3, zookeepers=3)
    ctx = ctx_of(c)
    r = targets.resolve(ctx, "random")
    assert r["selector"] == "random" and len(r["nodes"]) == 1 and r["nodes"][0].split("-")[0] in ("broker", "bookie")
    assert targets.resolve(ctx, "bookie")["nodes"][0].startswith("bookie-")
    assert targets.resolve(ctx, "zookeeper")["nodes"][0].startswith("zk-")
    assert targets.resolve(ctx, "all-bookie") == {"selector": "all-bookie", "nodes": ["bookie-1", "bookie-2", "bookie-3"]}
    assert targets.resolve(ctx, "all-zookeeper")["nodes"] == ["zk-1", "zk-2", "zk-3"]
    assert targets.resolve(ctx, "broker-2") == {"selector": "broker-2", "nodes": ["broker-2"]}
    # a plan drawn earlier is what start resolves (no new draw)
    plan = targets.draw(ctx, "broker")
    state = ctx.rng.getstate()
    assert targets.resolve(ctx, "broker", plan=plan)["nodes"] == [plan["node"]]
    assert ctx.rng.getstate() == state
    # a plan without the draw (a nemesis that drew only a topic) is completed now
    assert targets.resolve(ctx, "broker", plan={"selector": "broker"})["nodes"][0].startswith("broker-")
    with pytest.raises(NemesisError, match="drawn for another selector"):
        targets.resolve(ctx, "bookie", plan=plan)


@pytest.mark.parametrize("selector, problem", [
    ("leader", "no such selector or node"),
    ("broker-9", "no such selector or node"),
    ("client-1", "no such selector or node"),
    ("", "empty selector"),
])
def test_unknown_selector_names_itself_and_the_valid_ones(selector, problem):
    with pytest.raises(NemesisError) as ei:
        targets.resolve(ctx_of(FakeCluster()), selector)
    msg = str(ei.value)
    assert f"target {selector!r}: {problem}" in msg
    for valid in ("random", "owner", "ledger-bookies", "zk-leader", "lb-leader", "all-bookie", "broker-1", "zk-1"):
        assert valid in msg


def test_topic_selectors_need_topics_and_roles_need_nodes():
    with pytest.raises(NemesisError, match="'owner': the workload has no topics"):
        targets.draw(ctx_of(FakeCluster(), topics=()), "owner")
    with pytest.raises(NemesisError, match="'ledger-bookies': the workload has no topics"):
        targets.resolve(ctx_of(FakeCluster(), topics=()), "ledger-bookies")
    with pytest.raises(NemesisError, match="'broker': the cluster has no broker nodes"):
        targets.draw(ctx_of(FakeCluster(brokers=0)), "broker")
    with pytest.raises(NemesisError, match="'all-zookeeper': the cluster has no zookeeper nodes"):
        targets.resolve(ctx_of(FakeCluster(zookeepers=0)), "all-zookeeper")


def test_owner_is_the_lookup_answer():
    asked = []
    ctx = ctx_of(FakeCluster(), lookup=lambda t: asked.append(t) or "broker-2")
    r = targets.resolve(ctx, "owner", topic="my-topic")
    assert r == {"selector": "owner", "topic": "persistent://public/default/my-topic", "nodes": ["broker-2"]}
    assert asked == ["persistent://public/default/my-topic"]


# ------------------------------------------------------------------------------ ledger bookies

def _stats(*ledger_ids):
    return {"ledgers": [{"ledgerId": i, "entries": None, "size": 0} for i in ledger_ids]}


def test_ledger_bookies_are_the_last_fragment_of_the_current_ledger():
    c = FakeCluster(brokers=2, bookies=4)
    b1, b2 = "http://10.0.0.61:8080", "http://10.0.0.62:8080"
    probes = FakeProbes(
        stats={b1: _stats(3, 7)},
        znodes={"/ledgers/00/0000/L0007": ledger_md(7, {0: ["10.0.0.21:3181", "10.0.0.22:3181", "10.0.0.23:3181"],
                                                        42: ["10.0.0.24:3181", "10.0.0.22:3181", "10.0.0.23:3181"]})})
    r = targets.resolve(ctx_of(c), "ledger-bookies", topic="t1", probes=probes)
    assert r == {"selector": "ledger-bookies", "topic": "persistent://public/default/t1", "asked": "broker-1",
                 "ledger": 7, "ledger_state": "OPEN", "fragment_first_entry": 42,
                 "ensemble": ["10.0.0.24:3181", "10.0.0.22:3181", "10.0.0.23:3181"],
                 "nodes": ["bookie-4", "bookie-2", "bookie-3"]}
    # a dead broker is skipped, one that fails is reported and the next asked
    c.kill("broker-1")
    probes.stats = {b2: _stats(7)}
    assert targets.resolve(ctx_of(c), "ledger-bookies", topic="t1", probes=probes)["asked"] == "broker-2"
    probes.stats = {b2: NemesisError("HTTP 503: ZooKeeper unreachable")}
    with pytest.raises(NemesisError, match=r"no broker answered the internal stats .*broker-1: not running; "
                                           r"broker-2: NemesisError: HTTP 503"):
        targets.resolve(ctx_of(c), "ledger-bookies", topic="t1", probes=probes)


@pytest.mark.parametrize("stats, znodes, problem", [
    (_stats(), {}, "has no ledger yet"),
    (_stats(9), {}, "ledger 9 of persistent://public/default/t1 has no metadata"),
    (_stats(9), {"/ledgers/00/0000/L0009": ledger_md(9, {0: ["10.0.0.21:3181", "10.9.9.9:3181"]})},
     r"bookies \['10.9.9.9:3181'\] are not bookies of this cluster"),
])
def test_ledger_bookies_failures(stats, znodes, problem):
    probes = FakeProbes(stats={"http://10.0.0.61:8080": stats}, znodes=znodes)
    with pytest.raises(NemesisError, match=problem):
        targets.resolve(ctx_of(FakeCluster()), "ledger-bookies", topic="t1", probes=probes)


# ------------------------------------------------------------------------------ leaders

def test_zk_leader_from_srvr_modes():
    c = FakeCluster(zookeepers=3)
    probes = FakeProbes(srvr={"10.0.0.11": srvr_text("follower"), "10.0.0.12": srvr_text("leader"),
                              "10.0.0.13": srvr_text("follower")})
    r = targets.resolve(ctx_of(c), "zk-leader", probes=probes)
    assert r["nodes"] == ["zk-2"] and r["modes"] == {"zk-1": "follower", "zk-2": "leader", "zk-3": "follower"}
    # an old leader that still claims it: the higher epoch wins
    probes.srvr_answers["10.0.0.11"] = srvr_text("leader", zxid="0x200000001")
    assert targets.resolve(ctx_of(c), "zk-leader", probes=probes)["nodes"] == ["zk-1"]
    # standalone
    one = FakeProbes(srvr={"10.0.0.11": srvr_text("standalone")})
    assert targets.resolve(ctx_of(FakeCluster()), "zk-leader", probes=one)["nodes"] == ["zk-1"]
    # nobody leads (no quorum): an error naming the answers
    c.kill("zk-2")
    probes.srvr_answers = {"10.0.0.11": "This ZooKeeper instance is not currently serving requests\n"}
    with pytest.raises(NemesisError, match=r"no ZooKeeper node answers srvr as leader.*'zk-2': None"):
        targets.resolve(ctx_of(c), "zk-leader", probes=probes)


@pytest.mark.parametrize("data, node", [
    (b'{"serviceUrl": "http://10.0.0.62:8080"}', "broker-2"),                           # Pulsar 2.x LeaderBroker
    (b'{"brokerId": "10.0.0.61:8080", "serviceUrl": "http://10.0.0.61:8080"}', "broker-1"),  # 3.x
    (b"10.0.0.62:8080", "broker-2"),
])
@pytest.mark.parametrize("path", ["/loadbalance/leader", "/loadbalance/extension/leader"])   # modular, extensible
def test_lb_leader_from_the_znode(data, node, path):
    probes = FakeProbes(znodes={path: data})
    r = targets.resolve(ctx_of(FakeCluster()), "lb-leader", probes=probes)
    assert r["nodes"] == [node] and r["znode"] == path


def test_lb_follower_is_the_draw_unless_it_leads():
    """lb-follower draws a broker as `broker` does (the same randomness), and resolves to it unless it is
    the load-balancer leader, then to the next broker by name; never to the leader."""
    c = FakeCluster(brokers=3)
    a, b = ctx_of(c, seed=5), ctx_of(c, seed=5)
    assert targets.draw(a, "lb-follower")["node"] == targets.draw(b, "broker")["node"]
    assert a.rng.getstate() == b.rng.getstate()
    for lead, drawn, want in (("broker-2", "broker-1", "broker-1"), ("broker-2", "broker-2", "broker-3"),
                              ("broker-3", "broker-3", "broker-1"), ("broker-1", "broker-3", "broker-3")):
        host = c.node(lead).host
        probes = FakeProbes(znodes={"/loadbalance/leader": json.dumps({"serviceUrl": f"http://{host}:8080"}).encode()})
        r = targets.resolve(ctx_of(c), "lb-follower", plan={"selector": "lb-follower", "node": drawn}, probes=probes)
        assert r["nodes"] == [want] and r["lb_leader"] == lead and r["drawn"] == drawn
    # over many draws: every broker but the leader, never the leader
    host = c.node("broker-2").host
    probes = FakeProbes(znodes={"/loadbalance/extension/leader": f"{host}:8080".encode()})
    ctx = ctx_of(c, seed=1)
    got = {targets.resolve(ctx, "lb-follower", probes=probes)["nodes"][0] for _ in range(60)}
    assert got == {"broker-1", "broker-3"}
    with pytest.raises(NemesisError, match="no broker holds the load-balancer leadership"):
        targets.resolve(ctx_of(c), "lb-follower", probes=FakeProbes())
    one = FakeCluster(brokers=1)
    probes = FakeProbes(znodes={"/loadbalance/leader": f"{one.node('broker-1').host}:8080".encode()})
    with pytest.raises(NemesisError, match="none besides the leader"):
        targets.resolve(ctx_of(one), "lb-follower", probes=probes)


def test_lb_leader_missing_or_foreign():
    with pytest.raises(NemesisError, match=r"no broker holds the load-balancer leadership \(neither /loadbalance/leader "
                                           r"nor /loadbalance/extension/leader exists"):
        targets.resolve(ctx_of(FakeCluster()), "lb-leader", probes=FakeProbes())
    for path in ("/loadbalance/leader", "/loadbalance/extension/leader"):
        probes = FakeProbes(znodes={path: b'{"serviceUrl": "http://10.9.9.9:8080"}'})
        with pytest.raises(NemesisError, match=f"{path} names .* not a broker of this cluster"):
            targets.resolve(ctx_of(FakeCluster()), "lb-leader", probes=probes)


def test_pick_depends_on_the_draw_only():
    assert targets.pick(["b", "a", "c"], 0.0) == "a"
    assert targets.pick(["b", "a", "c"], 0.5) == "b"
    assert targets.pick(["b", "a", "c"], 0.9999) == "c"
    assert targets.pick(["x"], 0.7) == "x"
    with pytest.raises(NemesisError):
        targets.pick([], 0.1)


# ------------------------------------------------------------------------------ a real cluster

@pytest.fixture(scope="module")
def cluster():
    import shutil
    from tests.netns import netns_cluster
    with netns_cluster("tg", brokers=2, bookies=3, zookeepers=3) as c:
        base = c.base_dir
        yield c
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def topics(cluster):
    """Two topics with data, produced by the official client (so each has an owner and a ledger)."""
    from tests.netns import pulsar_client
    names = [f"persistent://public/default/tg-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    with pulsar_client(cluster.service_url) as client:
        for t in names:
            p = client.create_producer(t, batching_enabled=False)
            for i in range(5):
                p.send(f"{i}".encode())
            p.close()
    return names


def _kazoo(cluster):
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zk_connect, timeout=10)
    zk.start(30)
    return zk


@pytest.mark.integration
def test_owner_on_a_cluster(cluster, topics):
    from tests.netns import owner_node
    ctx = ctx_of(cluster, topics=topics)
    for t in topics:
        r = targets.resolve(ctx, "owner", topic=t)
        owner = cluster.node(r["nodes"][0])
        assert owner.role == "broker"
        assert r["nodes"] == [owner_node(cluster, t)]                    # the ownership znode
        last = sorted(cluster.nodes("broker"), key=lambda n: n.name)[-1]  # owner_of asks broker-1 first
        ans = http_lookup(f"http://{last.host}:{last.ports['http']}", t)
        assert ans["brokerUrl"] == f"pulsar://{owner.host}:6650"


@pytest.mark.integration
def test_ledger_bookies_on_a_cluster(cluster, topics):
    from clusters.broker.managed_ledger import ml_name, ml_path
    from clusters.autorecovery.check import connect
    ctx = ctx_of(cluster, topics=topics)
    addrs = {f"{n.host}:{n.ports['bookie']}": n.name for n in cluster.nodes("bookie")}
    zk = _kazoo(cluster)
    try:
        for t in topics:
            r = targets.resolve(ctx, "ledger-bookies", topic=t)
            # the topic's current ledger, read from its managed-ledger znode (not through the broker)
            info = json.loads(zk.get(ml_path(ml_name(t)))[0])
            assert r["ledger"] == info["ledgers"][-1]["ledger_id"]

            async def metadata():
                async with connect(cluster.zk_connect) as (_s, bk, _u):
                    return await bk.ledger_metadata(r["ledger"])
            md = asyncio.run(metadata())
            key = md.last_ensemble_key()
            assert r["fragment_first_entry"] == key and r["ledger_state"] == md.state == "OPEN"
            assert r["ensemble"] == md.ensembles[key]
            assert r["nodes"] == [addrs[a] for a in md.ensembles[key]] and len(r["nodes"]) == 3
    finally:
        zk.stop()
        zk.close()


@pytest.mark.integration
def test_zk_leader_on_a_three_node_ensemble(cluster):
    from clusters import zookeeper
    ctx = ctx_of(cluster)
    r = targets.resolve(ctx, "zk-leader")
    leader = cluster.node(r["nodes"][0])
    modes = {n.name: zookeeper.mode(n.host, n.ports["client"]) for n in cluster.nodes("zookeeper")}
    assert modes[leader.name] == "leader"
    assert sorted(modes.values()) == ["follower", "follower", "leader"] and r["modes"] == modes
    # the leader killed: the resolver follows the new one
    cluster.kill(leader.name)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r2 = targets.resolve(ctx, "zk-leader")
                break
            except NemesisError:
                assert time.monotonic() < deadline, "no new ZooKeeper leader within 60 s"
                time.sleep(0.5)
        assert r2["nodes"][0] != leader.name and r2["modes"][leader.name] is None
        new = cluster.node(r2["nodes"][0])
        assert zookeeper.mode(new.host, new.ports["client"]) == "leader"
    finally:
        cluster.start(leader.name)


@pytest.mark.integration
def test_lb_leader_on_a_cluster(cluster):
    """The brokers elect a load-balancer leader (the modular load manager's /loadbalance/leader,
    Pulsar's LeaderBroker JSON); the selector resolves to the broker the znode names, and follows a
    change of leader."""
    ctx = ctx_of(cluster)
    zk = _kazoo(cluster)
    try:
        deadline = time.monotonic() + 20
        while zk.exists("/loadbalance/leader") is None and time.monotonic() < deadline:
            time.sleep(0.2)
        doc = json.loads(zk.get("/loadbalance/leader")[0])
        r = targets.resolve(ctx, "lb-leader")
        (leader,) = r["nodes"]
        node = cluster.node(leader)
        assert doc["brokerId"] == f"{node.host}:{node.ports['http']}" and r["leader"] == doc
        # lb-follower: the other broker, whatever the draw
        assert {targets.resolve(ctx, "lb-follower")["nodes"][0] for _ in range(6)} == {"broker-1", "broker-2"} - {leader}
        cluster.kill(leader)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    now = targets.resolve(ctx, "lb-leader")["nodes"]
                except NemesisError:
                    now = []
                if now and now != [leader]:
                    break
                time.sleep(0.3)
            assert now and now != [leader]
        finally:
            cluster.start(leader)
    finally:
        zk.stop()
        zk.close()


@pytest.mark.integration
def test_roles_and_names_on_a_cluster(cluster):
    ctx = ctx_of(cluster)
    assert targets.resolve(ctx, "all-zookeeper")["nodes"] == ["zk-1", "zk-2", "zk-3"]
    assert targets.resolve(ctx, "all-broker")["nodes"] == ["broker-1", "broker-2"]
    assert targets.resolve(ctx, "bookie")["nodes"][0] in {"bookie-1", "bookie-2", "bookie-3"}
    assert targets.resolve(ctx, "zk-2")["nodes"] == ["zk-2"]
    with pytest.raises(NemesisError, match="'bookie-4': no such selector or node"):
        targets.resolve(ctx, "bookie-4")
