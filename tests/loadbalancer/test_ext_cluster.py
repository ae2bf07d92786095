"""The extensible load manager (`--load-manager extensible`) on a real 4-broker cluster (network
namespaces, real ZooKeeper, bookies), driven through the official `pulsar-client` and the brokers'
admin API at Pulsar's paths.

One cluster for the module. The part of test_lb_cluster.py that holds for either load manager runs
here too, on this cluster (imported below). Timers are shortened through Pulsar's own setting names
(LB_SETTINGS); everything else is Pulsar's default.
"""
from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

import pulsar
import pytest

from clusters.loadbalancer.extensible.state import CHANNEL_TOPIC, ServiceUnitStateData
from nemesis import targets
from nemesis.base import NemesisContext
from tests.conformance.conftest import Admin
from tests.netns import netns_cluster, pulsar_client
# the tests of the modular load manager's module that hold for both load managers, on this cluster
from tests.loadbalancer.test_lb_cluster import (test_admin_split_gives_pulsars_boundaries,  # noqa: F401
                                                test_every_broker_answers_a_lookup_with_the_same_owner,
                                                test_unload_with_a_destination_lands_on_that_broker)

pytestmark = pytest.mark.integration

LB_SETTINGS = {
    "loadBalancerReportUpdateMinIntervalMillis": 500,                 # Pulsar: 5000
    "loadBalancerSheddingIntervalMinutes": 60,                        # no shedding here
    "loadBalancerSplitIntervalMinutes": 60,                           # no automatic split here
    "loadBalancerServiceUnitStateMonitorIntervalInSeconds": 1,        # Pulsar: 60
    "loadBalancerInFlightServiceUnitStateWaitingTimeInMillis": 10000,  # Pulsar: 30000
    # Pulsar: 10. Placement random among all brokers: on a loaded test machine one broker's reported
    # weightedMaxEMA can sit 10 points below the mean, and LeastResourceUsageWithWeight then sends every
    # bundle a test creates to it (as Pulsar would: a clean-clone make test once saw all 12 topics of
    # 8 bundles on one broker); these tests need bundles on several brokers, and the strategy's choice
    # is tested on its own (tests/loadbalancer/test_ext_load.py, test_placement.py).
    "loadBalancerAverageResourceUsageDifferenceThresholdPercentage": 100,
}


@pytest.fixture(scope="module")
def cluster():
    with netns_cluster("xlb", brokers=4, bookies=3, zookeepers=1, ensemble=2, write_quorum=2, ack_quorum=2,
                       load_manager="extensible", lb_settings=dict(LB_SETTINGS)) as c:
        yield c


def call(cluster: Any, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
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


def new_namespace(cluster: Any, bundles: int) -> str:
    ns = f"public/x-{uuid.uuid4().hex[:6]}"
    status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": bundles}})
    assert status == 204, out
    return ns


def broker_ids(cluster: Any) -> list[str]:
    return [f"{n.host}:{n.ports['http']}" for n in cluster.nodes("broker")]


def alive(cluster: Any) -> list[int]:
    return [i for i, n in enumerate(cluster.nodes("broker")) if n.alive]


def channel(cluster: Any, broker: int) -> dict[str, Any]:
    status, doc = call(cluster, "GET", "/admin/v2/loadbalancer/channel", broker=broker, timeout=10)
    assert status == 200, doc
    return doc


def settled_channel(cluster: Any, timeout: float = 15) -> dict[str, Any]:
    """The channel's records once every live broker's view holds the same ones."""
    def same():
        docs = [channel(cluster, b) for b in alive(cluster)]
        first = docs[0]["records"]
        return first if all(d["records"] == first for d in docs) else None
    return wait_for(same, timeout, "every broker's view of the channel alike")


def lookup(cluster: Any, topic: str, broker: int) -> str:
    status, out = call(cluster, "GET", f"/lookup/v2/topic/persistent/{topic.split('://', 1)[1]}", broker=broker)
    assert status == 200, out
    return out["brokerUrl"]


def owner_id_of_url(cluster: Any, url: str) -> str:
    host = url.split("://", 1)[1].rsplit(":", 1)[0]
    return next(b for b in broker_ids(cluster) if b.split(":")[0] == host)


def bundle_of(cluster: Any, ns: str, name: str) -> str:
    status, rng = call(cluster, "GET", f"/lookup/v2/topic/persistent/{ns}/{name}/bundle")
    assert status == 200, rng
    return f"{ns}/{rng}"


def test_registry_and_leader_are_the_extensible_ones(cluster):
    status, brokers = call(cluster, "GET", "/admin/v2/brokers/standalone")
    assert status == 200 and sorted(brokers) == sorted(broker_ids(cluster))
    leaders = {call(cluster, "GET", "/admin/v2/brokers/leaderBroker", broker=b)[1]["brokerId"] for b in range(4)}
    assert len(leaders) == 1 and leaders <= set(broker_ids(cluster))
    docs = [channel(cluster, b) for b in range(4)]
    assert [d["broker"] for d in docs] == broker_ids(cluster)
    assert sum(d["leader"] for d in docs) == 1
    assert next(d["broker"] for d in docs if d["leader"]) in leaders
    # the faults' `lb-leader` target is that broker, the channel owner, by the extensible election's znode
    r = targets.resolve(NemesisContext(cluster=cluster, rng=random.Random(1), topics=[]), "lb-leader")
    assert r["znode"] == "/loadbalance/extension/leader"
    assert [f"{cluster.node(n).host}:{cluster.node(n).ports['http']}" for n in r["nodes"]] == sorted(leaders)
    # the modular load manager's leader znode is not used
    status, out = call(cluster, "GET", "/admin/v2/broker-stats/load-report", broker=2)
    assert status == 200 and out["loadManagerClassName"].endswith("ExtensibleLoadManagerImpl")
    assert {"weightedMaxEMA", "bundleCount", "cpu"} <= set(out)


def test_many_topics_each_served_by_one_broker_and_every_view_agrees(cluster):
    ns = new_namespace(cluster, bundles=8)
    topics = [f"persistent://{ns}/t{i}" for i in range(24)]
    with pulsar_client(cluster.service_url) as client:
        producers = [client.create_producer(t) for t in topics]
        for i, p in enumerate(producers):
            p.send(f"m{i}".encode())
        consumers = [client.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest) for t in topics]
        for i, c in enumerate(consumers):
            m = c.receive(timeout_millis=10000)
            assert m.data() == f"m{i}".encode()
            c.acknowledge(m)
        for p in producers:
            p.close()
    owners = {t: {lookup(cluster, t, b) for b in range(4)} for t in topics}
    assert all(len(o) == 1 for o in owners.values()), owners
    assert len({next(iter(o)) for o in owners.values()}) >= 2           # placement spread the bundles
    records = settled_channel(cluster)
    mine = {k: ServiceUnitStateData.from_json(v) for k, v in records.items() if k.startswith(ns + "/")}
    assert mine and all(r.state.value == "Owned" for r in mine.values())
    # each bundle served by the broker the channel names, by that one only
    served: dict[str, list[str]] = {}
    for i, bid in enumerate(broker_ids(cluster)):
        status, owned = call(cluster, "GET", f"/admin/v2/brokers/standalone/{bid}/ownedNamespaces", broker=i)
        assert status == 200, owned
        for b in owned:
            served.setdefault(b, []).append(bid)
    for key, r in mine.items():
        assert served.get(key) == [r.dstBroker], (key, served.get(key), r)
    for t, o in owners.items():
        assert owner_id_of_url(cluster, next(iter(o))) == mine[bundle_of(cluster, ns, t.rsplit("/", 1)[1])].dstBroker


def test_the_channel_topic_is_readable_by_the_official_client(cluster):
    ns = new_namespace(cluster, bundles=2)
    with pulsar_client(cluster.service_url) as client:
        client.create_producer(f"persistent://{ns}/r").close()
        reader = client.create_reader(CHANNEL_TOPIC, pulsar.MessageId.earliest)
        seen: dict[str, dict[str, Any]] = {}
        while True:
            try:
                m = reader.read_next(timeout_millis=2000)
            except pulsar.Timeout:
                break
            assert m.partition_key(), "every channel message is keyed by its bundle"
            if m.data():
                seen[m.partition_key()] = json.loads(m.data())
        reader.close()
    keys = [k for k in seen if k.startswith(ns + "/")]
    assert keys, sorted(seen)[:5]
    rec = seen[keys[0]]
    assert rec["state"] == "Owned" and rec["dstBroker"] in broker_ids(cluster)
    assert {"state", "force", "timestamp", "versionId"} <= set(rec) and rec["versionId"] >= 2
    for doc in seen.values():
        ServiceUnitStateData.from_json(doc)                 # every record decodes with Pulsar's fields


def test_unload_transfer_and_a_transfer_to_the_owner_refused(cluster):
    ns = new_namespace(cluster, bundles=4)
    with pulsar_client(cluster.service_url) as client:
        producer = client.create_producer(f"persistent://{ns}/u")
        producer.send(b"one")
        key = bundle_of(cluster, ns, "u")
        rng = key.rsplit("/", 1)[1]
        owner = owner_id_of_url(cluster, lookup(cluster, f"persistent://{ns}/u", 0))
        status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/{rng}/unload?destinationBroker={owner}",
                           broker=1)
        assert status == 400 and "cannot be transfer to same broker" in out["reason"], (status, out)
        dest = next(b for b in broker_ids(cluster) if b != owner)
        status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/{rng}/unload?destinationBroker={dest}",
                           broker=2)
        assert status == 204, out
        rec = settled_channel(cluster)[key]
        assert (rec["state"], rec["dstBroker"], rec["sourceBroker"]) == ("Owned", dest, owner)
        status, info = call(cluster, "GET", f"/admin/v2/namespaces/{key}", broker=1)
        assert status == 200 and info["httpUrl"] == f"http://{dest}", info
        producer.send(b"two")                                # the client followed the bundle
        assert owner_id_of_url(cluster, lookup(cluster, f"persistent://{ns}/u", 3)) == dest
        # a plain unload: Free, and the next lookup assigns it afresh
        status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{ns}/{rng}/unload", broker=0)
        assert status == 204, out
        producer.send(b"three")
        producer.close()
        rec = settled_channel(cluster)[key]
        assert rec["state"] == "Owned" and rec["versionId"] >= 6


def test_split_children_stay_with_the_parents_owner(cluster):
    ns = new_namespace(cluster, bundles=1)
    with pulsar_client(cluster.service_url) as client:
        for i in range(4):
            client.create_producer(f"persistent://{ns}/p{i}").close()
    parent = f"{ns}/0x00000000_0xffffffff"
    owner = settled_channel(cluster)[parent]["dstBroker"]
    status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{parent}/split?splitAlgorithmName=range_equally_divide",
                       broker=next(i for i, b in enumerate(broker_ids(cluster)) if b != owner))
    assert status == 200 and out["children"] == ["0x00000000_0x7fffffff", "0x7fffffff_0xffffffff"], out
    records = settled_channel(cluster)
    assert parent not in records or records[parent]["state"] == "Deleted"
    for c in out["children"]:
        assert (records[f"{ns}/{c}"]["state"], records[f"{ns}/{c}"]["dstBroker"]) == ("Owned", owner)
    status, data = call(cluster, "GET", f"/admin/v2/namespaces/{ns}/bundles", broker=1)
    assert data["boundaries"] == ["0x00000000", "0x7fffffff", "0xffffffff"]
    with pulsar_client(cluster.service_url) as client:
        for i in range(4):
            p = client.create_producer(f"persistent://{ns}/p{i}")
            p.send(b"x")
            p.close()


def _leader_index(cluster: Any) -> int:
    return next(b for b in alive(cluster) if channel(cluster, b)["leader"])


def _no_bundle_of(records: dict[str, Any], broker: str) -> bool:
    """No record has `broker` as the owner (dstBroker of an active record) or moving a bundle
    (sourceBroker in flight); an Owned record may still name it as the source it came from."""
    in_flight = ("Assigning", "Releasing", "Splitting")
    return not any((r["state"] in in_flight + ("Owned",) and r.get("dstBroker") == broker)
                   or (r["state"] in in_flight and r.get("sourceBroker") == broker) for r in records.values())


def _wait_replaced(replaced: Any, timeout: float = 40) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    got: Any = None
    while time.monotonic() < deadline:
        got = replaced()
        if not isinstance(got, tuple):
            return got
        time.sleep(0.5)
    raise AssertionError(f"no new channel owner with every bundle of the dead broker reassigned within "
                         f"{timeout}s: (leader, last applied) by broker, the dead broker's records: {got}")


def test_a_killed_channel_owner_is_replaced_and_its_bundles_reassigned(cluster):
    ns = new_namespace(cluster, bundles=8)
    with pulsar_client(cluster.service_url) as client:
        for i in range(16):
            client.create_producer(f"persistent://{ns}/k{i}").close()
    leader = _leader_index(cluster)
    dead = broker_ids(cluster)[leader]
    node = cluster.nodes("broker")[leader]
    mine = {k: r for k, r in settled_channel(cluster).items() if k.startswith(ns + "/") and r["state"] == "Owned"}
    if not any(r["dstBroker"] == dead for r in mine.values()):      # give the leader a bundle to lose
        key = sorted(mine)[0]
        status, out = call(cluster, "PUT", f"/admin/v2/namespaces/{key}/unload?destinationBroker={dead}")
        assert status == 204, out
    assert any(r["dstBroker"] == dead for k, r in settled_channel(cluster).items() if k.startswith(ns + "/"))
    cluster.kill(node.name)
    try:
        others = [i for i in range(4) if i != leader]

        def replaced():
            docs = [channel(cluster, b) for b in others]
            recs = docs[0]["records"]
            if (sum(d["leader"] for d in docs) != 1 or not _no_bundle_of(recs, dead)
                    or any(d["records"] != recs for d in docs)):
                return ({d["broker"]: (d["leader"], d["last_applied"]) for d in docs},
                        {k: r for k, r in recs.items() if not _no_bundle_of({k: r}, dead)})
            return recs
        recs = _wait_replaced(replaced)
        assert not any(r["state"] in ("Assigning", "Releasing", "Splitting") for r in recs.values())
        with pulsar_client(cluster.service_url) as client:       # every topic is served again
            for i in range(16):
                p = client.create_producer(f"persistent://{ns}/k{i}")
                p.send(b"after")
                p.close()
    finally:
        cluster.start(node.name)


def test_a_graceful_stop_transfers_the_bundles_away(cluster):
    ns = new_namespace(cluster, bundles=8)
    with pulsar_client(cluster.service_url) as client:
        for i in range(16):
            client.create_producer(f"persistent://{ns}/g{i}").close()
    records = settled_channel(cluster)
    ids = broker_ids(cluster)
    counts = {b: sum(1 for k, r in records.items() if k.startswith(ns + "/") and r.get("dstBroker") == b) for b in ids}
    victim = max((b for b in ids if not channel(cluster, ids.index(b))["leader"]), key=lambda b: counts[b])
    assert counts[victim] > 0
    node = cluster.nodes("broker")[ids.index(victim)]
    cluster.stop(node.name, timeout=30)
    try:
        recs = settled_channel(cluster)
        assert _no_bundle_of(recs, victim)
        moved = [r for k, r in recs.items() if k.startswith(ns + "/") and r.get("sourceBroker") == victim]
        assert moved and all(r["state"] == "Owned" for r in moved)     # transferred, none left Free
        with pulsar_client(cluster.service_url) as client:
            for i in range(16):
                p = client.create_producer(f"persistent://{ns}/g{i}")
                p.send(b"after")
                p.close()
    finally:
        cluster.start(node.name)
    # back: it read the channel's whole history (kept: pulsar/system retains everything) into its view
    after = settled_channel(cluster, timeout=20)         # every live view alike, the restarted broker's too
    assert {k for k in recs if k.startswith(ns + "/")} <= set(after)
    assert channel(cluster, ids.index(victim))["records"] == after
    status, retention = call(cluster, "GET", "/admin/v2/namespaces/pulsar/system/retention")
    assert status == 200 and retention == {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}, retention
