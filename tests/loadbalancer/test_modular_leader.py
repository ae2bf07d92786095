"""The modular leader without I/O (clusters/loadbalancer/modular_leader.py): the decisions the broker's
ModularLoadManager carries out, from registrations and a time handed in."""
from __future__ import annotations

import random

from clusters.loadbalancer.data import NamespaceBundleStats
from clusters.loadbalancer.modular_leader import ModularLeader
from clusters.loadbalancer.settings import LoadBalancerSettings
from tests.loadbalancer.helpers import broker


def _reg(cpu: float, bundles: dict[str, NamespaceBundleStats] | None = None, name: str = "x") -> dict:
    doc = broker(cpu_percent=cpu, bundles=bundles).to_json()
    doc["pulsarServiceUrl"] = f"pulsar://{name}:6650"
    return doc


def _stats(rate: float, topics: int = 1) -> NamespaceBundleStats:
    s = NamespaceBundleStats()
    s.msgRateIn, s.msgThroughputIn, s.topics = rate, rate * 1024, topics
    return s


def _leader(seed: int = 1, **kw) -> ModularLeader:
    settings = LoadBalancerSettings.from_mapping({"loadBalancerLoadPlacementStrategy": "LeastResourceUsageWithWeight",
                                                  "loadBalancerBundleUnloadMinThroughputThreshold": 0})
    return ModularLeader(settings, random.Random(seed), **kw)


def test_assignment_prefers_affinity_then_the_least_loaded_broker():
    lead = _leader()
    assert lead.select("t/n/0x00000000_0x40000000").reason == "no-brokers"
    found = lead.refresh({"a:8080": _reg(90, name="a"), "b:8080": _reg(5, name="b"), "c:8080": {"cpu": "x"}})
    assert found.brokers == ["a:8080", "b:8080"] and found.malformed == ["c:8080"]
    assert lead.urls == {"a:8080": "pulsar://a:6650", "b:8080": "pulsar://b:6650"}
    lead.affinity["t/n/0x00000000_0x40000000"] = "a:8080"
    first = lead.select("t/n/0x00000000_0x40000000")
    assert (first.broker, first.reason) == ("a:8080", "affinity")
    # until a owns it, the bundle is preallocated there: the next lookup gets the same answer
    again = lead.select("t/n/0x00000000_0x40000000")
    assert (again.broker, again.reason) == ("a:8080", "preallocated")
    # a reports it: the move is over; an affinity is used once, the next assignment is a placement
    lead.refresh({"a:8080": _reg(90, {"t/n/0x00000000_0x40000000": _stats(1.0)}, name="a"),
                  "b:8080": _reg(5, name="b")})
    assert not lead.moving and "t/n/0x00000000_0x40000000" not in lead.load_data.preallocated_bundle_to_broker
    later = lead.select("t/n/0x00000000_0x40000000")
    assert (later.broker, later.reason) == ("b:8080", "lookup")


B = "t/n/0x00000000_0x40000000"
OTHER = "t/n/0x40000000_0x80000000"


def _reports(a_bundles: dict | None = None, b_bundles: dict | None = None, *, a_time: int = 1000,
             b_time: int = 1000) -> dict:
    """a is the less loaded broker (a placement picks it: b owns another bundle of the namespace, so
    distributing evenly never excludes a), b the destination of the unloads below; each report
    written at the time given (LocalBrokerData.lastUpdate)."""
    a, b = _reg(5, a_bundles, name="a"), _reg(50, {OTHER: _stats(1.0), **(b_bundles or {})}, name="b")
    a["lastUpdate"], b["lastUpdate"] = a_time, b_time
    return {"a:8080": a, "b:8080": b}


def _lookup(lead: ModularLeader, reports: dict) -> str | None:
    """One lookup of the unowned bundle on the leader, as ModularLoadManager.select_broker does it:
    the brokers' reports as they are in ZooKeeper now, then the choice."""
    lead.refresh(reports)
    return lead.select(B).broker


def test_the_lookups_after_an_unload_with_a_destination_all_go_to_the_destination():
    """The race of an unload with destinationBroker: the producer's and the consumer's reconnections
    after the unload are two lookups on the leader; the first uses the affinity, the second must not
    fall back to an older preallocation to the old owner nor to a placement (the old owner, when it is
    the leader, takes the bundle at once, before the client redirected to the destination gets there)."""
    # the old owner's preallocation is still there (its report does not show the bundle yet)
    lead = _leader()
    assert _lookup(lead, _reports()) == "a:8080"               # the first assignment: placed on a
    lead.affinity[B] = "b:8080"                                 # a unloads it towards b
    assert _lookup(lead, _reports()) == "b:8080"
    assert _lookup(lead, _reports()) == "b:8080"                # before: a (its preallocation)
    assert lead.load_data.preallocated_bundle_to_broker[B] == "b:8080"
    assert B not in lead.load_data.brokers["a:8080"].preallocated_bundle_data

    # the old owner's report still lists the bundle (written before the unload)
    lead = _leader()
    assert _lookup(lead, _reports()) == "a:8080"
    owned = {B: _stats(1.0)}
    lead.refresh(_reports(owned))                              # a took it and reports it: preallocation over
    assert B not in lead.load_data.preallocated_bundle_to_broker
    lead.affinity[B] = "b:8080"
    assert [_lookup(lead, _reports(owned)) for _ in range(3)] == ["b:8080"] * 3    # before: b, a, a
    # b takes it and reports it: the move is over, nothing of it stays
    lead.refresh(_reports(b_bundles=owned, b_time=2000))
    assert not lead.moving and B not in lead.load_data.preallocated_bundle_to_broker
    assert not lead.load_data.brokers["b:8080"].preallocated_bundle_data


def test_a_move_by_affinity_ends_when_its_destination_dies_or_another_broker_takes_the_bundle():
    owned = {B: _stats(1.0)}
    # another broker took the bundle after all: its report and the destination's, both written after
    # the move (another lastUpdate: a's clock may have gone back), show it on a only
    for a_time in (2000, 500):
        lead = _leader()
        lead.refresh(_reports(owned))
        lead.affinity[B] = "b:8080"
        assert lead.select(B).broker == "b:8080"
        lead.refresh(_reports(owned))                          # the same, older, report of a
        assert lead.moving and lead.load_data.preallocated_bundle_to_broker[B] == "b:8080"
        lead.refresh(_reports(owned, a_time=a_time))           # a's, maybe sampled before the unload
        assert lead.moving and lead.load_data.preallocated_bundle_to_broker[B] == "b:8080"
        lead.refresh(_reports(owned, a_time=a_time, b_time=3000))
        assert not lead.moving and B not in lead.load_data.preallocated_bundle_to_broker
        assert not lead.load_data.brokers["b:8080"].preallocated_bundle_data
    # the destination dies before it takes the bundle: the next lookup is a placement among the living
    lead = _leader()
    lead.refresh(_reports(owned))
    lead.affinity[B] = "b:8080"
    assert lead.select(B).broker == "b:8080"
    a_only = {"a:8080": _reports(owned)["a:8080"]}
    assert _lookup(lead, a_only) == "a:8080" and not lead.moving
    # an affinity to a broker that is not live is not used
    lead = _leader()
    lead.refresh(_reports())
    lead.affinity[B] = "c:8080"
    assert lead.select(B).reason == "lookup" and not lead.moving


def test_the_same_inputs_and_seed_give_the_same_decisions():
    def run(seed: int) -> list:
        lead = _leader(seed)
        lead.refresh({f"b{i}:8080": _reg(10.0, name=f"b{i}") for i in range(5)})
        return [lead.select(f"t/n/0x{i:08x}_0x{i + 1:08x}").broker for i in range(40)]
    assert run(3) == run(3)
    assert len(set(run(3))) > 1                 # equal brokers: the choice is random, and spread


def test_a_dead_brokers_preallocations_are_released_unless_the_knob_keeps_them():
    for keep in (False, True):
        lead = _leader(keep_preallocations=keep)
        lead.refresh({"a:8080": _reg(5, name="a")})
        bundle = "t/n/0x00000000_0x40000000"
        assert lead.select(bundle).broker == "a:8080"
        assert lead.load_data.preallocated_bundle_to_broker.get(bundle) == "a:8080"
        found = lead.refresh({"b:8080": _reg(5, name="b")})
        assert found.gone == ["a:8080"]
        held = lead.load_data.preallocated_bundle_to_broker.get(bundle)
        assert held == ("a:8080" if keep else None)


def test_shedding_moves_load_off_the_overloaded_broker_never_to_its_owner_unless_the_knob():
    hot = {f"t/n/0x{i:08x}_0x{i + 1:08x}": _stats(100.0 * (i + 1)) for i in range(4)}
    regs = {"a:8080": _reg(95, hot, name="a"), "b:8080": _reg(5, name="b")}
    for knob in (False, True):
        lead = _leader(shed_to_owner=knob)
        for _ in range(3):
            lead.refresh(regs)
        plan = lead.shed(now_ms=1_000_000)
        assert plan.unloads and all(u.src == "a:8080" for u in plan.unloads)
        assert all(u.dst != u.src for u in plan.unloads) or knob
        # the grace period: the bundles just shed are not chosen again at once
        again = lead.shed(now_ms=1_000_001)
        assert not {u.bundle for u in again.unloads} & {u.bundle for u in plan.unloads}
        lead.unload_failed(plan.unloads[0].bundle)
        assert plan.unloads[0].bundle not in lead.recently_unloaded


def test_hot_bundles_split_on_their_owner():
    settings = LoadBalancerSettings.from_mapping({"loadBalancerNamespaceBundleMaxTopics": 2})
    lead = ModularLeader(settings, random.Random(1))
    crowded = {"t/n/0x00000000_0x80000000": _stats(10.0, topics=5)}
    lead.refresh({"a:8080": _reg(10, crowded, name="a"), "b:8080": _reg(10, name="b")})
    splits = lead.splits()
    assert [(s.bundle, s.owner, s.reason) for s in splits] == [("t/n/0x00000000_0x80000000", "a:8080", "Topics")]
    lead.refresh({"a:8080": _reg(10, crowded, name="a")})          # one broker: no split (Pulsar)
    assert lead.splits() == []
