"""The shedders and the leader's shedding cycle (plan_shedding)."""
from __future__ import annotations

import random

import pytest

from clusters.loadbalancer.data import NamespaceBundleStats
from clusters.loadbalancer.placement import select_broker
from clusters.loadbalancer.settings import LoadBalancerSettings
from clusters.loadbalancer.shedding import (OverloadShedder, ThresholdShedder, UniformLoadShedder,
                                            make_shedding_strategy, plan_shedding)

from .helpers import MiB, broker, bundle_data, load

S = LoadBalancerSettings()
NS = "t/ns"
# a's bundles with their short-term throughput (MiB/s); usages are exact in binary floats
A_BUNDLES = {f"{NS}/0x00000000_0x40000000": 50, f"{NS}/0x40000000_0x80000000": 30,
             f"{NS}/0x80000000_0xc0000000": 20}
BIG, MID, SMALL = A_BUNDLES


def _cluster(a_cpu=75.0, b_cpu=25.0, c_cpu=12.5, a_thr=100 * MiB, a_bundles=A_BUNDLES):
    """a carries `a_bundles` and 2 * a_thr of throughput; b and c one bundle each."""
    reports = {"a": broker(a_cpu, {b: NamespaceBundleStats() for b in a_bundles}, thr_in=a_thr, thr_out=a_thr),
               "b": broker(b_cpu, {"t/x/0x00000000_0xffffffff": NamespaceBundleStats()}),
               "c": broker(c_cpu, {"t/y/0x00000000_0xffffffff": NamespaceBundleStats()})}
    bundles = {b: bundle_data(short_thr=mib * MiB) for b, mib in a_bundles.items()}
    return load(reports, bundles)


def test_threshold_shedder_sheds_the_overloaded_broker():
    ld = _cluster()
    res = ThresholdShedder().find_bundles_for_unloading(ld, S)
    # first call: averages = current usage: a .75, b .25, c .125; mean .375; a >= .375 + .10.
    # offload fraction .75 - .375 - .10 + .05 = .325 of 200 MiB = 65 MiB: 50 (< 65), then 30 (80 >= 65)
    assert res.unloads == [("a", BIG), ("a", MID)]
    assert res.record["avg_usage"] == pytest.approx(0.375)
    assert res.record["brokers"]["a"]["to_offload"] == pytest.approx(65 * MiB)
    assert res.record["brokers"]["b"]["action"] == "not-overloaded"


def test_threshold_shedder_leaves_a_balanced_cluster():
    ld = _cluster(a_cpu=50.0, b_cpu=50.0, c_cpu=50.0)
    res = ThresholdShedder().find_bundles_for_unloading(ld, S)
    assert res.unloads == []
    assert {r["action"] for r in res.record["brokers"].values()} == {"not-overloaded"}


def test_threshold_shedder_keeps_its_averages_across_calls():
    shedder = ThresholdShedder()
    shedder.find_bundles_for_unloading(_cluster(), S)
    # a's usage drops to .25: its average is .9*.75 + .1*.25 = .7; b .25, c .125; mean .358;
    # .7 >= .458 -> still shed. A fresh shedder sees a at .25 (mean .208, .25 < .308): nothing.
    again = _cluster(a_cpu=25.0)
    res = shedder.find_bundles_for_unloading(again, S)
    assert shedder.avg_usage["a"] == pytest.approx(0.7)
    assert res.unloads and all(b == "a" for b, _ in res.unloads)
    assert ThresholdShedder().find_bundles_for_unloading(_cluster(a_cpu=25.0), S).unloads == []


def test_threshold_shedder_minimum_throughput_sole_bundle_and_grace():
    # 2 * 15 MiB * .325 = 9.75 MiB < loadBalancerBundleUnloadMinThroughputThreshold (10 MB)
    res = ThresholdShedder().find_bundles_for_unloading(_cluster(a_thr=15 * MiB), S)
    assert res.unloads == [] and res.record["brokers"]["a"]["action"] == "below-min-throughput"
    res = ThresholdShedder().find_bundles_for_unloading(_cluster(a_bundles={BIG: 50}), S)
    assert res.unloads == [] and res.record["brokers"]["a"]["action"] == "sole-bundle"
    ld = _cluster()
    ld.recently_unloaded_bundles[BIG] = 0
    # BIG is skipped: 30 (< 65), 20 (50 < 65): both
    assert ThresholdShedder().find_bundles_for_unloading(ld, S).unloads == [("a", MID), ("a", SMALL)]


def test_threshold_shedder_lower_boundary():
    s = S.replace(lowerBoundarySheddingEnabled=True)
    # a .375, b .375, c .125: mean .2917; nobody >= .3917, but c < .1917. The busiest broker above
    # the lower bound with more than one bundle is a (b has one); offload 200 MiB * .10 * .5 = 10 MiB
    ld = _cluster(a_cpu=37.5, b_cpu=37.5, c_cpu=12.5)
    res = ThresholdShedder().find_bundles_for_unloading(ld, s)
    assert res.unloads == [("a", BIG)]
    assert res.record["lower_boundary"]["to_offload"] == pytest.approx(10 * MiB)
    # disabled (Pulsar's default): nothing
    assert ThresholdShedder().find_bundles_for_unloading(_cluster(37.5, 37.5, 12.5), S).unloads == []


def test_overload_shedder():
    # unweighted max 87.5 % >= 85 %: offload .875 - .85 + .05 = .075 of 200 MiB = 15 MiB: BIG alone
    res = OverloadShedder().find_bundles_for_unloading(_cluster(a_cpu=87.5), S)
    assert res.unloads == [("a", BIG)]
    assert res.record["brokers"]["a"]["to_offload"] == pytest.approx(15 * MiB)
    assert OverloadShedder().find_bundles_for_unloading(_cluster(a_cpu=84.0), S).unloads == []


def _uniform_cluster(a_rate, b_rate, a_thr=1000.0, b_thr=1000.0, rates=(1200, 900, 300, 100)):
    names = [f"{NS}/0x{i:08x}_0x{i + 1:08x}" for i in range(len(rates))]
    reports = {"a": broker(bundles={n: NamespaceBundleStats() for n in names}, rate_in=a_rate, thr_in=a_thr),
               "b": broker(bundles={"t/x/0x00000000_0xffffffff": NamespaceBundleStats()}, rate_in=b_rate,
                           thr_in=b_thr)}
    return load(reports, {n: bundle_data(short_rate=r) for n, r in zip(names, rates)}), names


def test_uniform_shedder_by_msg_rate():
    ld, names = _uniform_cluster(10000.0, 2000.0)
    res = UniformLoadShedder().find_bundles_for_unloading(ld, S)
    # (10000 - 2000) * 100 / 2000 = 400 % > 50 %; to move int(8000 * .2) = 1600 >= minUnloadMessage 1000.
    # greedy on rates 1200, 900, 300, 100: 1200 fits (400 left), 900 does not, 300 (100 left), 100 (0)
    assert res.unloads == [("a", names[0]), ("a", names[2]), ("a", names[3])]
    assert res.record["msg_rate_difference_percent"] == 400.0
    capped = UniformLoadShedder().find_bundles_for_unloading(ld, S.replace(maxUnloadBundleNumPerShedding=1))
    assert capped.unloads == [("a", names[0])]


def test_uniform_shedder_balanced_and_below_minimum():
    ld, _ = _uniform_cluster(1000.0, 900.0)       # 11 %, throughput ratio 1
    assert UniformLoadShedder().find_bundles_for_unloading(ld, S).unloads == []
    ld, _ = _uniform_cluster(4000.0, 800.0)       # 400 %, but int(3200 * .2) = 640 < 1000
    res = UniformLoadShedder().find_bundles_for_unloading(ld, S)
    assert res.unloads == [] and res.record["action"] == "below-minimum"


def test_uniform_shedder_by_throughput():
    # rates equal; throughput 10 MiB vs 1 MiB: ratio 10 > 4; to move int(9 MiB * .2) = 1887436 B
    ld, names = _uniform_cluster(1000.0, 1000.0, a_thr=10 * MiB, b_thr=1 * MiB, rates=(0, 0))
    ld.bundles[names[0]] = bundle_data(short_thr=1.5 * MiB)
    ld.bundles[names[1]] = bundle_data(short_thr=0.25 * MiB)
    res = UniformLoadShedder().find_bundles_for_unloading(ld, S)
    assert res.record["by"] == "msgThroughput" and res.record["to_offload"] == int(9 * MiB * 0.2)
    assert res.unloads == [("a", names[0]), ("a", names[1])]


@pytest.mark.parametrize("name,cls", [("org.apache.pulsar.broker.loadbalance.impl.OverloadShedder", OverloadShedder),
                                      ("UniformLoadShedder", UniformLoadShedder),
                                      ("org.apache.pulsar.broker.loadbalance.impl.ThresholdShedder", ThresholdShedder)])
def test_strategy_by_class_name(name, cls):
    assert isinstance(make_shedding_strategy(S.replace(loadBalancerLoadSheddingStrategy=name)), cls)


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="ThresholdShedder"):
        make_shedding_strategy(S.replace(loadBalancerLoadSheddingStrategy="TresholdShedder"))


NOW = 100 * 60_000


def test_plan_shedding_unloads_to_the_destination_and_records_it():
    ld = _cluster()
    recent: dict[str, int] = {}
    d = plan_shedding(ld, ThresholdShedder(), recent, NOW, S, lambda bundle: "c")
    assert [(u.bundle, u.src, u.dst) for u in d.unloads] == [(BIG, "a", "c"), (MID, "a", "c")]
    assert recent == {BIG: NOW, MID: NOW}
    assert d.unloaded_brokers == 1 and d.skipped is None


def test_plan_shedding_grace_period():
    ld = _cluster()
    # BIG was unloaded 31 minutes ago (expired, 30 min grace), MID 5 minutes ago (still kept)
    recent = {BIG: NOW - 31 * 60_000, MID: NOW - 5 * 60_000}
    d = plan_shedding(ld, ThresholdShedder(), recent, NOW, S, lambda bundle: "c")
    assert d.expired == [BIG]
    # MID is not picked: BIG (50 < 65), SMALL (70 >= 65)
    assert [u.bundle for u in d.unloads] == [BIG, SMALL]
    assert recent == {MID: NOW - 5 * 60_000, BIG: NOW, SMALL: NOW}


def test_plan_shedding_skips_destination_equal_to_owner_unless_bug_knob():
    d = plan_shedding(_cluster(), ThresholdShedder(), {}, NOW, S, lambda bundle: "a")
    assert d.unloads == []
    assert [(n["bundle"], n["why"]) for n in d.not_unloaded] == [
        (BIG, "destination is the current owner"), (MID, "destination is the current owner")]
    # apache/pulsar#20822 knob: the bundle is unloaded to the broker it is on
    d = plan_shedding(_cluster(), ThresholdShedder(), {}, NOW, S, lambda bundle: "a", skip_current_owner=False)
    assert [(u.src, u.dst) for u in d.unloads] == [("a", "a"), ("a", "a")]


def test_plan_shedding_no_destination_disabled_single_broker():
    d = plan_shedding(_cluster(), ThresholdShedder(), {}, NOW, S, lambda bundle: None)
    assert d.unloads == [] and {n["why"] for n in d.not_unloaded} == {"no destination"}
    for s in (S.replace(loadBalancerSheddingEnabled=False), S.replace(loadBalancerEnabled=False)):
        assert plan_shedding(_cluster(), ThresholdShedder(), {}, NOW, s, lambda b: "c").skipped == "disabled"
    one = load({"a": broker(90.0, {b: NamespaceBundleStats() for b in A_BUNDLES}, thr_in=100 * MiB)})
    assert plan_shedding(one, OverloadShedder(), {}, NOW, S, lambda b: "c").skipped == "only one broker"


def test_plan_shedding_with_placement_as_destination():
    ld = _cluster()
    ld.brokers["b"].time_average.longTermMsgRateIn = 1000.0
    ld.brokers["c"].time_average.longTermMsgRateIn = 2000.0
    rng = random.Random(0)

    def dest(settings):
        return lambda bundle: select_broker(bundle, ld.brokers, ld, settings, rng, preallocate=False)

    # ThresholdShedder's overloaded broker a has the lowest long-term msg rate. With distribute-evenly
    # off, placement answers a itself: since #20822 nothing is unloaded
    uneven = S.replace(loadBalancerDistributeBundlesEvenlyEnabled=False)
    d = plan_shedding(ld, ThresholdShedder(), {}, NOW, uneven, dest(uneven))
    assert d.unloads == [] and [n["dst"] for n in d.not_unloaded] == ["a", "a"]
    # by default a, with 3 bundles of the namespace against 0, is filtered out: the lowest of b, c
    d = plan_shedding(ld, ThresholdShedder(), {}, NOW, S, dest(S))
    assert [(u.src, u.dst) for u in d.unloads] == [("a", "b"), ("a", "b")]
    assert d.unloads[0].placement["scores"] == {"b": 1000.0, "c": 2000.0}


def test_heartbeat_and_sla_bundles_are_never_shed():
    hb = "pulsar/standalone/10.0.0.1:8080/0x00000000_0xffffffff"
    hb2 = "pulsar/10.0.0.1:8080/0x00000000_0xffffffff"
    sla = "sla-monitor/standalone/10.0.0.1:8080/0x00000000_0xffffffff"
    bundles = {hb: 500, hb2: 400, sla: 300, **A_BUNDLES}
    ld = _cluster(a_bundles=bundles)
    # the system bundles are the biggest but skipped: BIG then MID, as without them
    assert ThresholdShedder().find_bundles_for_unloading(ld, S).unloads == [("a", BIG), ("a", MID)]


def test_placement_destination_does_not_preallocate():
    from clusters.loadbalancer.shedding import placement_destination
    ld = _cluster()
    ld.brokers["a"].time_average.longTermMsgRateIn = 5000.0
    ld.brokers["c"].time_average.longTermMsgRateIn = 10.0
    select = placement_destination(ld, S, random.Random(0), candidates=lambda bundle: ["a", "b", "c"])
    d = plan_shedding(ld, ThresholdShedder(), {}, NOW, S, select)
    # long-term rates a 5000, b 0, c 10 (a, with 3 bundles of t/ns, is filtered out anyway): b
    assert {u.dst for u in d.unloads} == {"b"}
    assert not any(bd.preallocated_bundle_data for bd in ld.brokers.values())
    assert ld.preallocated_bundle_to_broker == {}
