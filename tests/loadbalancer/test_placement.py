"""select_broker: LeastLongTermMessageRate with preallocation, the filters, the overload fallback."""
from __future__ import annotations

import random

import pytest

from clusters.loadbalancer.data import NamespaceBundleStats
from clusters.loadbalancer.placement import LeastResourceUsageWithWeight, make_placement_strategy, select_broker
from clusters.loadbalancer.settings import LoadBalancerSettings

from .helpers import broker, load

S = LoadBalancerSettings()
NS = "t/ns"
NEW = f"{NS}/0x40000000_0x80000000"


def _with_long_term(ld, **rates):
    """Set each broker's long-term msg rate in (TimeAverageBrokerData) directly."""
    for b, r in rates.items():
        ld.brokers[b].time_average.longTermMsgRateIn = r
    return ld


@pytest.mark.parametrize("seed", range(5))
def test_prefers_lowest_long_term_rate(seed):
    ld = _with_long_term(load({"a": broker(), "b": broker(), "c": broker()}), a=300.0, b=100.0, c=200.0)
    d = select_broker(NEW, ["a", "b", "c"], ld, S, random.Random(seed))
    assert (d.broker, d.reason) == ("b", "selected")
    assert d.scores == {"a": 300.0, "b": 100.0, "c": 200.0}
    assert d.best == ["b"]


def test_preallocation_is_counted_and_answered():
    ld = load({"a": broker(), "b": broker()})
    first = select_broker(f"{NS}/0x00000000_0x40000000", ["a", "b"], ld, S, random.Random(1))
    other = "b" if first.broker == "a" else "a"
    # the first bundle's default long-term data (50 in + 50 out) now weighs on its broker
    assert ld.brokers[first.broker].preallocated_bundle_data
    # same namespace: distribute-evenly counts the preallocation and keeps only the other broker
    same_ns = select_broker(f"{NS}/0x40000000_0x80000000", ["a", "b"], ld, S, random.Random(1))
    assert same_ns.broker == other
    assert ("loadBalancerDistributeBundlesEvenlyEnabled", [other]) in same_ns.filters
    # another namespace: both compete, each scored by one preallocated bundle of 50 in + 50 out
    # (100 vs 100, a tie); the tie's winner then carries two (200 vs 100) and loses the next one
    third = select_broker("t/other/0x00000000_0xffffffff", ["a", "b"], ld, S, random.Random(1))
    assert third.scores == {"a": 100.0, "b": 100.0}
    fourth = select_broker("t/more/0x00000000_0xffffffff", ["a", "b"], ld, S, random.Random(1))
    assert fourth.scores[third.broker] == 200.0
    assert fourth.broker != third.broker
    # asked again, a preallocated bundle goes where it went, without a new choice
    again = select_broker(f"{NS}/0x00000000_0x40000000", ["a", "b"], ld, S, random.Random(2))
    assert (again.broker, again.reason, again.scores) == (first.broker, "preallocated", {})


def test_distribute_evenly_beats_a_lower_rate():
    # a has 2 bundles of the namespace, b 1: only b stays, though a's long-term rate is lower
    ld = _with_long_term(load({"a": broker(), "b": broker()}), a=10.0, b=500.0)
    d = select_broker(NEW, ["a", "b"], ld, S, random.Random(0), namespace_bundle_counts={"a": 2, "b": 1})
    assert d.broker == "b"
    assert ("loadBalancerDistributeBundlesEvenlyEnabled", ["b"]) in d.filters
    off = S.replace(loadBalancerDistributeBundlesEvenlyEnabled=False)
    ld2 = _with_long_term(load({"a": broker(), "b": broker()}), a=10.0, b=500.0)
    assert select_broker(NEW, ["a", "b"], ld2, off, random.Random(0), {"a": 2, "b": 1}).broker == "a"


def test_namespace_counts_default_to_reports_and_preallocations():
    other_ns = "t/other/0x00000000_0x40000000"
    ld = _with_long_term(load({"a": broker(bundles={f"{NS}/0x00000000_0x40000000": NamespaceBundleStats(),
                                                    other_ns: NamespaceBundleStats()}),
                               "b": broker(bundles={other_ns: NamespaceBundleStats()})}), a=0.0, b=900.0)
    assert select_broker(NEW, ["a", "b"], ld, S, random.Random(0)).broker == "b"


def test_max_topics_filter():
    ld = _with_long_term(load({"a": broker(num_topics=50001), "b": broker(num_topics=50000)}), a=0.0, b=999.0)
    d = select_broker(NEW, ["a", "b"], ld, S, random.Random(0))
    assert d.broker == "b"
    assert ("loadBalancerBrokerMaxTopics", ["b"]) in d.filters
    # all over the limit: the filter keeps everybody
    ld = _with_long_term(load({"a": broker(num_topics=60000), "b": broker(num_topics=60000)}), a=0.0, b=999.0)
    assert select_broker(NEW, ["a", "b"], ld, S, random.Random(0)).broker == "a"


def test_overload_fallback_reruns_on_all_candidates():
    # distribute-evenly leaves only a, which is overloaded (cpu 90 % > 85 %): the strategy's answer is
    # a (all infinite -> random among the one candidate); the fallback reruns on {a, b} and picks b
    ld = _with_long_term(load({"a": broker(cpu_percent=90.0), "b": broker(cpu_percent=10.0)}), a=0.0, b=5000.0)
    d = select_broker(NEW, ["a", "b"], ld, S, random.Random(0), namespace_bundle_counts={"a": 0, "b": 3})
    assert (d.broker, d.reason) == ("b", "overload-fallback")
    assert d.scores == {"a": float("inf"), "b": 5000.0}
    assert set(d.overloaded) == {"a"}
    assert NEW in ld.brokers["b"].preallocated_bundle_data


def test_all_overloaded_still_places_somewhere():
    ld = load({"a": broker(cpu_percent=95.0), "b": broker(cpu_percent=99.0)})
    picks = {select_broker(f"{NS}/0x{i:08x}_0x{i + 1:08x}", ["a", "b"], ld, S, random.Random(i),
                           preallocate=False).broker for i in range(20)}
    assert picks == {"a", "b"}


def test_no_candidate_with_a_report():
    ld = load({"a": broker()})
    d = select_broker(NEW, ["z"], ld, S, random.Random(0))
    assert (d.broker, d.reason) == (None, "no-candidates")
    assert ld.preallocated_broker(NEW) is None


def test_least_resource_usage_with_weight():
    s = S.replace(loadBalancerLoadPlacementStrategy="LeastResourceUsageWithWeight",
                  loadBalancerDistributeBundlesEvenlyEnabled=False)
    strategy = make_placement_strategy(s)
    assert isinstance(strategy, LeastResourceUsageWithWeight)
    ld = load({"a": broker(cpu_percent=25.0), "b": broker(cpu_percent=75.0), "c": broker(cpu_percent=50.0)})
    # mean 0.5; best: usage + 0.10 <= 0.5 -> a only
    d = select_broker(NEW, ["a", "b", "c"], ld, s, random.Random(0), strategy=strategy)
    assert d.broker == "a" and d.best == ["a"]
    # the averages persist: a jumps to 75 %, b drops to 25 %: a = 0.9*0.25 + 0.1*0.75 = 0.3,
    # b = 0.9*0.75 + 0.1*0.25 = 0.7, c = 0.5; mean 0.5 -> a is still the only best
    ld.brokers["a"].local.cpu.usage, ld.brokers["b"].local.cpu.usage = 75.0, 25.0
    d = select_broker(f"{NS}/0x80000000_0xc0000000", ["a", "b", "c"], ld, s, random.Random(0), strategy=strategy)
    assert d.scores == pytest.approx({"a": 0.3, "b": 0.7, "c": 0.5})
    assert d.broker == "a"


def test_unknown_placement_strategy_is_refused():
    with pytest.raises(ValueError, match="LeastLongTermMessageRate"):
        make_placement_strategy(S.replace(loadBalancerLoadPlacementStrategy="com.example.Nope"))
    full = S.replace(loadBalancerLoadPlacementStrategy="org.apache.pulsar.broker.loadbalance.impl."
                                                       "LeastResourceUsageWithWeight")
    assert isinstance(make_placement_strategy(full), LeastResourceUsageWithWeight)


def test_selector_without_preallocation_ignores_and_leaves_preallocations():
    ld = _with_long_term(load({"a": broker(), "b": broker()}), a=0.0, b=10.0)
    ld.preallocated_bundle_to_broker[NEW] = "b"
    # selectBroker (the shedder's destination) neither answers nor records preallocations
    d = select_broker(NEW, ["a", "b"], ld, S, random.Random(0), preallocate=False)
    assert (d.broker, d.reason) == ("a", "selected")
    assert ld.preallocated_bundle_to_broker == {NEW: "b"} and not ld.brokers["a"].preallocated_bundle_data
