"""The modular load manager on a real 4-broker cluster (network namespaces, real ZooKeeper, bookies), driven
through the official `pulsar-client` and the brokers' admin API at Pulsar's paths.

One cluster for the module. Load-balancer timers are shortened through Pulsar's own setting names
(LB_SETTINGS below); everything else is Pulsar's default.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pulsar
import pytest
from kazoo.client import KazooClient

from clusters.loadbalancer.bundles import FULL_UPPER, NamespaceBundles, initial_boundaries, parse_bundles_data
from nemesis.balance import zk_delete_request
from tests.conformance.conftest import Admin
from tests.netns import netns_cluster, pulsar_client

pytestmark = pytest.mark.integration

LB_SETTINGS = {
    "loadBalancerReportUpdateMinIntervalMillis": 500,     # Pulsar: 5000
    "loadBalancerSheddingIntervalMinutes": 60,            # no shedding here (its own tests below)
    "loadBalancerNamespaceBundleMaxTopics": 6,            # Pulsar: 1000: a hot bundle with few topics
}


@pytest.fixture(scope="module")
def cluster():
    with netns_cluster("lb", brokers=4, bookies=3, zookeepers=1, ensemble=2, write_quorum=2, ack_quorum=2,
                       lb_settings=dict(LB_SETTINGS)) as c:
        yield c


def call(cluster: Any, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    """The conformance suite's admin client on this module's cluster: (status, JSON or text)."""
    return Admin(cluster).call(method, path, body, **kw)


def wait_for(fn, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")


def new_namespace(cluster: Any, bundles: int | None = None) -> str:
    ns = f"public/lb-{uuid.uuid4().hex[:6]}"
    body = {"bundles": {"numBundles": bundles}} if bundles else None
    status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}", body)
    assert status == 204, out
    return ns


def lookup(cluster: Any, topic: str, broker: int) -> str:
    status, out = call(cluster, "GET", f"/lookup/v2/topic/persistent/{topic.split('://', 1)[1]}", broker=broker)
    assert status == 200, out
    return out["brokerUrl"]


def test_brokers_and_clusters_are_listed_by_pulsars_ids(cluster):
    status, clusters = call(cluster, "GET", "/admin/v2/clusters")
    assert status == 200 and clusters == ["standalone"]
    status, brokers = call(cluster, "GET", "/admin/v2/brokers/standalone")
    assert status == 200
    assert sorted(brokers) == sorted(f"{n.host}:{n.ports['http']}" for n in cluster.nodes("broker"))
    status, report = call(cluster, "GET", "/admin/v2/broker-stats/load-report", broker=1)
    assert status == 200 and report["pulsarServiceUrl"].startswith("pulsar://")
    assert {"cpu", "memory", "bandwidthIn", "bandwidthOut", "msgRateIn", "lastStats"} <= set(report)
    assert report["cpu"]["limit"] > 0 and report["memory"]["usage"] > 0


def test_every_broker_answers_a_lookup_with_the_same_owner(cluster):
    ns = new_namespace(cluster, bundles=8)
    topics = [f"persistent://{ns}/t{i}" for i in range(12)]
    for t in topics:
        answers = {lookup(cluster, t, b) for b in range(4)}
        assert len(answers) == 1, (t, answers)
    # the official client agrees with the admin API, on every broker's service URL
    with pulsar_client(cluster.service_url) as client:
        for t in topics[:4]:
            p = client.create_producer(t)
            p.send(b"x")
            p.close()
    owners = {t: lookup(cluster, t, 0) for t in topics}
    assert len(set(owners.values())) >= 2                # placement spread the bundles


def test_one_leader_and_a_new_one_after_the_leader_is_killed(cluster):
    def leaders():
        out = set()
        for b in range(4):
            status, doc = call(cluster, "GET", "/admin/v2/brokers/leaderBroker", broker=b, timeout=5)
            if status != 200:
                return None
            out.add(doc["brokerId"])
        return out if len(out) == 1 else None
    (leader,) = wait_for(leaders, 20, "one leader seen by every broker")
    node = next(n for n in cluster.nodes("broker") if f"{n.host}:{n.ports['http']}" == leader)
    cluster.kill(node.name)
    started = time.monotonic()
    try:
        others = [i for i, n in enumerate(cluster.nodes("broker")) if n.name != node.name]

        def new_leader():
            status, doc = call(cluster, "GET", "/admin/v2/brokers/leaderBroker", broker=others[0], timeout=5)
            return doc["brokerId"] if status == 200 and doc["brokerId"] != leader else None
        new = wait_for(new_leader, 6.0 + 10, "a new leader after the leader was killed")
        took = time.monotonic() - started
        assert new != leader and took <= 6.0 + 10        # the session timeout (6 s) and a margin
    finally:
        cluster.start(node.name)


def test_unload_with_a_destination_lands_on_that_broker(cluster):
    ns = new_namespace(cluster, bundles=4)
    topic = f"persistent://{ns}/moving"
    with pulsar_client(cluster.service_url) as client:
        producer = client.create_producer(topic)
        producer.send(b"before")
        owner = lookup(cluster, topic, 0)
        status, bundle = call(cluster, "GET", f"/lookup/v2/topic/persistent/{ns}/moving/bundle")
        assert status == 200
        status, brokers = call(cluster, "GET", "/admin/v2/brokers/standalone")
        owner_id = next(b for b in brokers if b.split(":")[0] == owner.split("://")[1].split(":")[0])
        dest = next(b for b in brokers if b != owner_id)
        status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/{bundle}/unload?destinationBroker={dest}",
                           broker=3)
        assert status == 204, out
        producer.send(b"after")                          # the client looked the topic up again
        new_owner = lookup(cluster, topic, 1)
        assert new_owner.split("://")[1].split(":")[0] == dest.split(":")[0]
        producer.close()
    status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/{bundle}/unload?destinationBroker=10.0.0.1:1")
    assert status == 400 and "not a live broker" in out["reason"]


def test_a_lock_delete_whose_answer_is_lost_fails_the_release_and_the_session_survives(cluster):
    """`Cluster.deafen(trigger=...)` on real iptables: ZooKeeper carries out the owner's delete of the
    bundle's lock, the answer never reaches the owner, whose client gives that connection up (the unload
    waits for it) and reconnects within the session. Without the bug knob the owner does not serve the
    bundle on a lock it no longer holds: the bundle is assigned afresh and the client goes on."""
    ns = new_namespace(cluster, bundles=4)
    topic = f"persistent://{ns}/lost-answer"
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start(20)
    with pulsar_client(cluster.service_url) as client:
        producer = client.create_producer(topic)
        producer.send(b"before")
        status, bundle = call(cluster, "GET", f"/lookup/v2/topic/persistent/{ns}/lost-answer/bundle")
        path = f"/namespace/{ns}/{bundle}"
        owner_ip = json.loads(zk.get(path)[0])["broker"].split(":")[0]
        owner = next(n for n in cluster.nodes("broker") if n.host == owner_ip)
        registration = f"/loadbalance/brokers/{owner.host}:{owner.ports['http']}"
        session, lock_czxid = zk.get(registration)[1].ephemeralOwner, zk.get(path)[1].czxid
        other = next(i for i, n in enumerate(cluster.nodes("broker")) if n.name != owner.name)
        trigger = zk_delete_request(path)
        zks = [n.name for n in cluster.nodes("zookeeper")]
        cluster.deafen(owner.name, zks, trigger=trigger)
        try:
            t0 = time.monotonic()
            status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/{bundle}/unload", broker=other, timeout=30)
            waited = time.monotonic() - t0
        finally:
            cluster.undeafen(owner.name, zks, trigger=trigger)
        assert waited >= 2.0, (status, out, waited)         # the owner waited for an answer it never got
        producer.send(b"after")                            # assigned afresh; the client looked it up again
        lock = wait_for(lambda: zk.exists(path), 10, "the bundle's lock taken again")
        assert lock.czxid != lock_czxid                    # the delete was carried out
        assert zk.get(registration)[1].ephemeralOwner == session   # the owner's session survived
        producer.close()
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [reader.read_next(10_000).data() for _ in range(2)] == [b"before", b"after"]
    zk.stop()
    zk.close()


def test_admin_split_gives_pulsars_boundaries(cluster):
    ns = new_namespace(cluster, bundles=2)
    topics = [f"persistent://{ns}/s{i}" for i in range(6)]
    for t in topics:
        status, out = call(cluster, "PUT", f"/admin/v2/persistent/{t.split('://', 1)[1]}")
        assert status in (204, 409), out                   # created: owned, with a managed ledger
    status, data = call(cluster, "GET", f"/admin/v2/namespaces/{ns}/bundles")
    assert data["boundaries"] == ["0x00000000", "0x80000000", "0xffffffff"]
    status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/0x00000000_0x80000000/split"
                                       "?splitAlgorithmName=range_equally_divide", broker=2)
    assert status == 200, out
    status, data = call(cluster, "GET", f"/admin/v2/namespaces/{ns}/bundles", broker=1)
    assert data["boundaries"] == ["0x00000000", "0x40000000", "0x80000000", "0xffffffff"]
    # specified positions, in the body
    status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/0x80000000_0xffffffff/split"
                                       "?splitAlgorithmName=specified_positions_divide", [0x90000000])
    assert status == 200, out
    status, data = call(cluster, "GET", f"/admin/v2/namespaces/{ns}/bundles")
    assert data["boundaries"][-2:] == ["0x90000000", "0xffffffff"]
    # bad requests: 4xx with a reason
    status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/0x00000000_0x40000000/split"
                                       "?splitAlgorithmName=no_such_algorithm")
    assert 400 <= status < 500 and "algorithm" in out["reason"]
    status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/0x00000000_0x80000000/split")
    assert status == 404 and "its bundles are" in out["reason"]
    # every topic still maps to exactly one bundle, owned by one broker on every broker's lookup
    nb = NamespaceBundles(ns, parse_bundles_data(data))
    assert nb.boundaries[0] == 0 and nb.boundaries[-1] == FULL_UPPER
    for t in topics:
        assert len({lookup(cluster, t, b) for b in range(4)}) == 1


def test_a_hot_bundle_splits_on_its_own_and_its_children_move(cluster):
    ns = new_namespace(cluster, bundles=1)
    assert initial_boundaries(1) == [0, FULL_UPPER]
    topics = [f"persistent://{ns}/hot{i}" for i in range(10)]     # over loadBalancerNamespaceBundleMaxTopics
    with pulsar_client(cluster.service_url) as client:
        producers = [client.create_producer(t) for t in topics]
        for p in producers:
            p.send(b"x")

        def split():
            status, data = call(cluster, "GET", f"/admin/v2/namespaces/{ns}/bundles")
            return data if status == 200 and data["numBundles"] > 1 else None
        data = wait_for(split, 30, "the leader split the hot bundle")
        for p in producers:
            p.send(b"after the split")                    # the children were unloaded and looked up again
        for p in producers:
            p.close()
    owners = {lookup(cluster, t, 0) for t in topics}
    assert data["numBundles"] >= 2 and len(owners) >= 1
