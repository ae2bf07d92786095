"""The extensible load manager's load data (EMAs, reporter rule, TopKBundles, assignment), TransferShedder
(in the spirit of Pulsar's TransferShedderTest) and SplitScheduler."""
from __future__ import annotations

import json
import random

import pytest

from clusters.loadbalancer.data import MIBI, NamespaceBundleStats, ResourceUsage
from clusters.loadbalancer.extensible.load_data import (BrokerLoadData, TopBundlesLoadData,
                                                        need_broker_load_data_update, select_broker, top_k_bundles)
from clusters.loadbalancer.extensible.split_scheduler import SplitScheduler
from clusters.loadbalancer.extensible.state import S, ChannelView, ServiceUnitStateData
from clusters.loadbalancer.extensible.transfer_shedder import TransferShedder, Unload
from clusters.loadbalancer.settings import LoadBalancerSettings

DEFAULT = LoadBalancerSettings()


# -- BrokerLoadData ---------------------------------------------------------------------------------------

def test_ema_figures_of_pulsars_broker_load_data_test():
    s = LoadBalancerSettings.from_mapping({
        "loadBalancerCPUResourceWeight": 0.5, "loadBalancerMemoryResourceWeight": 0.5,
        "loadBalancerDirectMemoryResourceWeight": 0.5, "loadBalancerBandwithInResourceWeight": 0.5,
        "loadBalancerBandwithOutResourceWeight": 0.5, "loadBalancerHistoryResourcePercentage": 0.75})
    d = BrokerLoadData()
    u1 = {"cpu": ResourceUsage(1.0, 100.0), "memory": ResourceUsage(800.0, 200.0),
          "directMemory": ResourceUsage(2.0, 100.0), "bandwidthIn": ResourceUsage(3.0, 100.0),
          "bandwidthOut": ResourceUsage(4.0, 100.0)}
    d.update(u1, 1, 2, 3, 4, 5, 6, s, now_ms=1000)
    assert (d.msgThroughputIn, d.msgThroughputOut, d.msgRateIn, d.msgRateOut) == (1, 2, 3, 4)
    assert (d.bundleCount, d.topics) == (5, 6)
    assert d.maxResourceUsage == 0.04           # memory left out
    assert d.weightedMaxEMA == 2                # the first sample as is: memory 400 % * 0.5
    assert d.msgThroughputEMA == 3
    assert d.updatedAt == 1000 and d.reportedAt == 0
    u2 = dict(u1, cpu=ResourceUsage(300.0, 100.0), memory=ResourceUsage(200.0, 200.0))
    d.update(u2, 5, 6, 7, 8, 9, 10, s, now_ms=2000)
    assert d.maxResourceUsage == 3.0
    assert d.weightedMaxEMA == 1.875            # 0.75 * 2 + 0.25 * 1.5
    assert d.msgThroughputEMA == 5              # 0.75 * 3 + 0.25 * 11
    with pytest.raises(ValueError, match="now_ms must be positive"):
        d.update(u2, 0, 0, 0, 0, 0, 0, s, now_ms=0)


def test_broker_load_data_json_round_trip_with_pulsars_names():
    d = BrokerLoadData(cpu=ResourceUsage(5, 100), msgThroughputIn=2.5, bundleCount=3, weightedMaxEMA=0.4,
                       updatedAt=7, reportedAt=8)
    raw = json.loads(json.dumps(d.to_json()))
    assert set(raw) == {"cpu", "memory", "directMemory", "bandwidthIn", "bandwidthOut", "msgThroughputIn",
                        "msgThroughputOut", "msgRateIn", "msgRateOut", "bundleCount", "topics", "maxResourceUsage",
                        "weightedMaxEMA", "msgThroughputEMA", "updatedAt", "reportedAt"}
    assert raw["cpu"] == {"usage": 5, "limit": 100}
    assert BrokerLoadData.from_json(dict(raw, unknown=1)) == d
    with pytest.raises(ValueError, match="bad BrokerLoadData"):
        BrokerLoadData.from_json({"bundleCount": "many"})


def _pub(**kw):
    return BrokerLoadData(msgRateIn=100, msgThroughputIn=1000, bundleCount=10, maxResourceUsage=0.5, reportedAt=0, **kw)


@pytest.mark.parametrize("change,push", [
    ({}, False), ({"msgRateIn": 110}, False), ({"msgRateIn": 111}, True), ({"msgThroughputIn": 889}, True),
    ({"bundleCount": 11}, False), ({"bundleCount": 12}, True), ({"maxResourceUsage": 0.6}, False),
    ({"maxResourceUsage": 0.61}, True)])
def test_reporter_ten_percent_rule(change, push):
    cur = _pub()
    for k, v in change.items():
        setattr(cur, k, v)
    assert need_broker_load_data_update(_pub(), cur, DEFAULT, now_ms=60_000) is push


def test_reporter_pushes_after_fifteen_minutes_and_first_time():
    fifteen = 15 * 60_000
    assert need_broker_load_data_update(None, _pub(), DEFAULT, 1) is True
    assert need_broker_load_data_update(_pub(), _pub(), DEFAULT, fifteen) is False
    assert need_broker_load_data_update(_pub(), _pub(), DEFAULT, fifteen + 1) is True
    last = _pub()
    last.mark_reported(fifteen)
    assert need_broker_load_data_update(last, _pub(), DEFAULT, fifteen + 1) is False


def _stats(thr_in=0.0, thr_out=0.0, rate=0.0, topics=1):
    return NamespaceBundleStats(msgRateIn=rate, msgThroughputIn=thr_in, msgThroughputOut=thr_out, topics=topics)


def test_top_k_bundles_order_exclusions_and_resolution():
    stats = {"t/ns/0x0_1": _stats(1e6), "t/ns/0x1_2": _stats(3e6), "t/ns/0x2_3": _stats(2e6),
             "pulsar/c1/h:8080/0x00000000_0xffffffff": _stats(9e6), "ex/ns/0x0_1": _stats(8e6)}
    top = top_k_bundles(stats, 2, excluded_namespaces=["ex/ns"])
    assert [b for b, _ in top.topBundlesLoadData] == ["t/ns/0x2_3", "t/ns/0x1_2"]     # the largest last
    assert top_k_bundles(stats, 0).topBundlesLoadData == []
    assert len(top_k_bundles(stats, 50).topBundlesLoadData) == 4
    # within 100 KB/s the inbound throughput ties and the outbound decides
    close = {"t/ns/a": _stats(1e6 + 5e4, 0), "t/ns/b": _stats(1e6, 5e5)}
    assert [b for b, _ in top_k_bundles(close, 1).topBundlesLoadData] == ["t/ns/b"]
    raw = json.loads(json.dumps(top.to_json()))
    assert raw["topBundlesLoadData"][0]["bundleName"] == "t/ns/0x2_3"
    assert TopBundlesLoadData.from_json(raw) == top


def test_select_broker_least_weighted_max_ema():
    loads = {"a": BrokerLoadData(weightedMaxEMA=0.1), "b": BrokerLoadData(weightedMaxEMA=0.5),
             "c": BrokerLoadData(weightedMaxEMA=0.9)}
    picks = {select_broker(["a", "b", "c"], loads, DEFAULT, random.Random(i)) for i in range(30)}
    assert picks == {"a"}
    even = {k: BrokerLoadData(weightedMaxEMA=0.5) for k in "abc"}
    assert {select_broker(["a", "b", "c"], even, DEFAULT, random.Random(i)) for i in range(60)} == {"a", "b", "c"}
    assert select_broker([], loads, DEFAULT, random.Random(1)) is None


# -- TransferShedder -----------------------------------------------------------------------------------------

NOW = 10_000_000
S0 = DEFAULT.replace(loadBalancerSheddingConditionHitCountThreshold=0)


def bld(ema, thr=0.0, thr_ema=None, updated=NOW):
    return BrokerLoadData(weightedMaxEMA=ema, msgThroughputIn=thr, msgThroughputEMA=thr if thr_ema is None else thr_ema,
                          updatedAt=updated)


def tops(*bundles):
    """(name, throughput) pairs, given in the report's (ascending) order."""
    return TopBundlesLoadData([(b, _stats(t)) for b, t in bundles])


def run(shedder=None, loads=None, top=None, settings=S0, available=None, ru_bundles=None, ru_brokers=None, view=None,
        now=NOW):
    shedder = shedder or TransferShedder()
    return shedder.find_bundles_for_unloading(
        broker_load=loads, top_bundles=top or {}, available_brokers=available if available is not None else list(loads),
        recently_unloaded_bundles=ru_bundles or {},
        recently_unloaded_brokers=ru_brokers if ru_brokers is not None else {},
        settings=settings, now_ms=now, view=view)


TWO = {"a": bld(0.9, 100), "b": bld(0.1, 10)}
A_TOPS = {"a": tops(("t/ns/a1", 10), ("t/ns/a2", 20), ("t/ns/a3", 30), ("t/ns/a4", 40))}


def units(result):
    return [(d.unload.sourceBroker, d.unload.serviceUnit, d.unload.destBroker, d.reason) for d in result.decisions]


def test_overloaded_offload_math():
    r = run(loads=TWO, top=A_TOPS)
    # std 0.4 > 0.25; offload (0.9 - 0.1) / 2 = 0.4 of load = 100 * 0.4 / 0.9 = 44.4 of throughput: 10 + 20, not 30
    assert units(r) == [("a", "t/ns/a1", "b", "Overloaded"), ("a", "t/ns/a2", "b", "Overloaded")]
    assert r.label == "Success" and r.breakdown() == [("Success", "Overloaded")] * 2
    assert r.avg == pytest.approx(0.5) and r.std == pytest.approx(0.4)


def test_transfer_off_unloads_without_destination():
    r = run(loads=TWO, top=A_TOPS, settings=S0.replace(loadBalancerTransferEnabled=False))
    assert [(s, b, dst) for s, b, dst, _ in units(r)] == [("a", "t/ns/a1", None), ("a", "t/ns/a2", None)]


def test_hit_count_must_exceed_the_threshold_and_resets_after_shedding():
    sh = TransferShedder()
    s3 = DEFAULT           # threshold 3
    for i in range(1, 4):
        r = run(sh, TWO, A_TOPS, s3)
        assert (r.label, r.reason, r.hit_count) == ("Skip", "HitCount", i)
    r = run(sh, TWO, A_TOPS, s3)
    assert r.decisions and sh.hit_count == 0
    # a balanced cycle resets the count
    sh.hit_count = 3
    r = run(sh, {"a": bld(0.5, 10), "b": bld(0.5, 10)}, A_TOPS, s3)
    assert sh.hit_count == 0 and r.reason == "HitCount"


def test_cool_down_after_an_unload():
    delay = DEFAULT.loadBalanceSheddingDelayInSeconds * 1000
    ru = {"a": NOW - delay + 1}
    r = run(loads=TWO, top=A_TOPS, ru_brokers=ru)
    assert (r.label, r.reason, r.decisions) == ("Skip", "CoolDown", [])
    ru = {"a": NOW - delay}
    r = run(loads=TWO, top=A_TOPS, ru_brokers=ru)
    assert r.decisions and ru == {}            # the entry is dropped once the delay passed


def test_outdated_data_is_ignored():
    ttl = DEFAULT.loadBalancerBrokerLoadDataTTLInSeconds * 1000
    old = {"a": bld(0.9, 100, updated=NOW - ttl - 1), "b": bld(0.1, 10, updated=NOW - ttl - 1)}
    assert run(loads=old, top=A_TOPS).reason == "OutDatedData"
    edge = {"a": bld(0.9, 100, updated=NOW - ttl), "b": bld(0.1, 10, updated=NOW - ttl)}
    assert run(loads=edge, top=A_TOPS).decisions


def test_no_load_data_and_no_brokers():
    assert run(loads=TWO, top=A_TOPS, available=["a", "b", "c"]).reason == "NoLoadData"
    assert run(loads={}, top=A_TOPS, available=[]).reason == "NoBrokers"
    # no top bundles for the max broker
    assert run(loads=TWO, top={}).reason == "NoLoadData"


def test_sole_bundle_gives_no_bundles():
    r = run(loads=TWO, top={"a": tops(("t/ns/a1", 10))})
    assert (r.label, r.reason) == ("Skip", "NoBundles")


def test_underloaded_min_broker():
    loads = {"a": bld(0.5, 100), "b": bld(0.5, 100), "c": bld(0.02, 100)}    # std 0.226 <= 0.25
    r = run(loads=loads, top={"b": tops(("t/ns/b1", 10), ("t/ns/b2", 10), ("t/ns/b3", 10)),
                               "a": tops(("t/ns/a1", 10), ("t/ns/a2", 10))})
    assert r.decisions and {d.reason for d in r.decisions} == {"Underloaded"}
    assert {d.unload.destBroker for d in r.decisions} == {"c"}
    # by throughput EMA: equal load, but c's throughput EMA is below the max broker's * 0.125
    loads = {"a": bld(0.5, 100, thr_ema=100), "b": bld(0.45, 100, thr_ema=100), "c": bld(0.44, 100, thr_ema=10)}
    r = run(loads=loads, top={"a": tops(("t/ns/a1", 1), ("t/ns/a2", 1), ("t/ns/a3", 1))})
    assert r.decisions and r.decisions[0].reason == "Underloaded"


def test_balanced_cluster_sheds_nothing():
    loads = {"a": bld(0.5, 100), "b": bld(0.45, 90), "c": bld(0.4, 80)}
    r = run(loads=loads, top=A_TOPS)
    assert (r.label, r.reason) == ("Skip", "HitCount")


def test_overloaded_max_broker_with_small_std():
    # std <= target, nobody underloaded, but a > 0.85 and > avg + 0.25
    loads = {b: bld(0.6, 100) for b in "bcdefgh"}
    loads["a"] = bld(0.9, 100)
    r = run(loads=loads, top={"a": tops(("t/ns/a1", 5), ("t/ns/a2", 5), ("t/ns/a3", 5))})
    assert r.std <= 0.25                     # not the std rule
    assert r.decisions and r.decisions[0].reason == "Overloaded" and r.decisions[0].unload.sourceBroker == "a"


def test_at_most_max_brokers_per_cycle():
    loads = {f"h{i}": bld(0.95, 100) for i in range(5)}
    loads.update({f"l{i}": bld(0.05, 100) for i in range(5)})
    top = {f"h{i}": tops((f"t/ns/h{i}a", 10), (f"t/ns/h{i}b", 10), (f"t/ns/h{i}c", 10)) for i in range(5)}
    r = run(loads=loads, top=top)
    assert len({d.unload.sourceBroker for d in r.decisions}) == 3
    r = run(loads=loads, top=top, settings=S0.replace(loadBalancerMaxNumberOfBrokerSheddingPerCycle=1))
    assert len({d.unload.sourceBroker for d in r.decisions}) == 1
    assert all(d.unload.destBroker != d.unload.sourceBroker for d in r.decisions)


def test_skips_bundles_not_owned_recently_unloaded_or_idle():
    top = {"a": tops(("t/ns/a0", 0), ("t/ns/a1", 10), ("t/ns/a2", 20), ("t/ns/a3", 30), ("t/ns/a4", 40))}
    view = ChannelView()
    for b in ("t/ns/a0", "t/ns/a2", "t/ns/a3", "t/ns/a4"):
        view.apply(b, ServiceUnitStateData(S.Owned, "a", None, None, False, 0, 1))
    view.apply("t/ns/a1", ServiceUnitStateData(S.Owned, "b", None, None, False, 0, 1))    # not a's
    r = run(loads=TWO, top=top, view=view, ru_bundles={"t/ns/a2": NOW - 1})
    # a0 idle, a1 not a's, a2 recently unloaded; a3 (30 <= 44.4) goes; a4 would overshoot
    assert [u[1] for u in units(r)] == ["t/ns/a3"]


def test_stops_at_the_last_remaining_top_bundle():
    r = run(loads={"a": bld(0.9, 100), "b": bld(0.1, 0)}, top={"a": tops(("t/ns/a1", 1), ("t/ns/a2", 1))})
    assert [u[1] for u in units(r)] == ["t/ns/a1"]


def test_swap_brings_a_min_bundle_back():
    loads = {"a": bld(0.9, 100), "b": bld(0.1, 30)}
    top = {"a": tops(("t/ns/a1", 50), ("t/ns/a2", 50)), "b": tops(("t/ns/b1", 20))}
    r = run(loads=loads, top=top)
    assert units(r) == [("b", "t/ns/b1", "a", "Overloaded"), ("a", "t/ns/a1", "b", "Overloaded")]
    # without transfer there is no swap, and the overshooting bundle is not taken
    r = run(loads=loads, top=top, settings=S0.replace(loadBalancerTransferEnabled=False))
    assert r.decisions == [] and r.reason == "NoBundles"
    # a swap that does not balance enough is not made
    r = run(loads={"a": bld(0.9, 100), "b": bld(0.1, 60)}, top=top)
    assert r.decisions == []
    # balanced (min <= max) but the max broker would keep 80 >= 0.75 * 100: no swap
    r = run(loads={"a": bld(0.9, 100), "b": bld(0.1, 50)}, top={"a": top["a"], "b": tops(("t/ns/b1", 30))})
    assert r.decisions == []


def test_unload_dataclass():
    assert Unload("a", "t/ns/x") == Unload("a", "t/ns/x", None)


# -- SplitScheduler ------------------------------------------------------------------------------------------

NS = "t/ns"
BIG = NamespaceBundleStats(topics=1001)


def owned_view(*bundles, owner="me"):
    v = ChannelView()
    for b in bundles:
        v.apply(b, ServiceUnitStateData(S.Owned, owner, None, None, False, 0, 1))
    return v


def test_split_needs_more_than_threshold_consecutive_hits():
    b = "t/ns/0x00000000_0x80000000"
    sch, v = SplitScheduler(), owned_view(b)
    for i in range(3):
        r = sch.decide({b: BIG}, me="me", view=v, bundle_counts={NS: 4}, settings=DEFAULT)
        assert r.decisions == [] and sch.hit_counts[b] == i + 1
    r = sch.decide({b: BIG}, me="me", view=v, bundle_counts={NS: 4}, settings=DEFAULT)
    assert [(d.bundle, d.reason) for d in r.decisions] == [(b, "Topics")]
    assert r.decisions[0].children == {"0x00000000_0x40000000": None, "0x40000000_0x80000000": None}
    assert b not in sch.hit_counts


def test_split_hit_count_resets_when_the_condition_stops():
    b = "t/ns/0x00000000_0x80000000"
    sch, v = SplitScheduler(), owned_view(b)
    for stats in (BIG, BIG, BIG, NamespaceBundleStats(topics=5), BIG):
        r = sch.decide({b: stats}, me="me", view=v, bundle_counts={NS: 4}, settings=DEFAULT)
    assert r.decisions == [] and sch.hit_counts[b] == 1


@pytest.mark.parametrize("stats,reason", [
    (NamespaceBundleStats(topics=2, producerCount=600, consumerCount=401), "Sessions"),
    (NamespaceBundleStats(topics=2, msgRateIn=30001), "MsgRate"),
    (NamespaceBundleStats(topics=2, msgThroughputOut=100 * MIBI + 1), "Bandwidth"),
    (NamespaceBundleStats(topics=1, msgRateIn=10 ** 6), None),
    (NamespaceBundleStats(topics=2, msgRateIn=30000), None)])
def test_split_reasons(stats, reason):
    b = "t/ns/0x00000000_0x80000000"
    s = DEFAULT.replace(loadBalancerNamespaceBundleSplitConditionHitCountThreshold=0)
    r = SplitScheduler().decide({b: stats}, me="me", view=owned_view(b), bundle_counts={NS: 4}, settings=s)
    assert [d.reason for d in r.decisions] == ([reason] if reason else [])


def test_split_only_own_bundles_cap_and_per_cycle_max():
    s = DEFAULT.replace(loadBalancerNamespaceBundleSplitConditionHitCountThreshold=0)
    bundles = [f"t/ns/0x{i:08x}_0x{i + 0x1000:08x}" for i in range(0, 0x10000, 0x1000)]
    stats = {b: BIG for b in bundles}
    r = SplitScheduler().decide(stats, me="me", view=owned_view(*bundles, owner="other"), bundle_counts={NS: 16},
                                settings=s)
    assert r.decisions == []
    r = SplitScheduler().decide(stats, me="me", view=owned_view(*bundles), bundle_counts={NS: 16}, settings=s)
    assert len(r.decisions) == 10                                       # loadBalancerMaxNumberOfBundlesToSplitPerCycle
    r = SplitScheduler().decide(stats, me="me", view=owned_view(*bundles), bundle_counts={NS: 125}, settings=s)
    assert len(r.decisions) == 3                                        # 125 + 3 reaches 128
    r = SplitScheduler().decide(stats, me="me", view=owned_view(*bundles), bundle_counts={NS: 128}, settings=s)
    assert r.decisions == []


def test_split_skips_a_bundle_next_to_one_splitting_and_unsplittable_ranges():
    s = DEFAULT.replace(loadBalancerNamespaceBundleSplitConditionHitCountThreshold=0)
    b, parent = "t/ns/0x00000000_0x40000000", "t/ns/0x00000000_0x80000000"
    v = owned_view(b)
    v.apply(parent, ServiceUnitStateData(S.Splitting, None, "me", {}, False, 0, 1))
    assert SplitScheduler().decide({b: BIG}, me="me", view=v, bundle_counts={NS: 4}, settings=s).decisions == []
    tiny = "t/ns/0x00000010_0x00000011"
    r = SplitScheduler().decide({tiny: BIG}, me="me", view=owned_view(tiny), bundle_counts={NS: 4}, settings=s)
    assert r.decisions == [] and r.failures[0][0] == tiny
    off = s.replace(loadBalancerAutoBundleSplitEnabled=False)
    assert SplitScheduler().decide({b: BIG}, me="me", view=owned_view(b), bundle_counts={NS: 4},
                                   settings=off).decisions == []


def test_extensible_defaults_are_pulsars():
    s = DEFAULT
    assert (s.loadBalancerBrokerLoadTargetStd, s.loadBalancerSheddingConditionHitCountThreshold,
            s.loadBalancerMaxNumberOfBrokerSheddingPerCycle, s.loadBalanceSheddingDelayInSeconds,
            s.loadBalancerBrokerLoadDataTTLInSeconds, s.loadBalancerTransferEnabled) == (0.25, 3, 3, 180, 1800, True)
    assert (s.loadBalancerInFlightServiceUnitStateWaitingTimeInMillis,
            s.loadBalancerServiceUnitStateMonitorIntervalInSeconds,
            s.loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds) == (30000, 60, 3600)
    assert (s.loadBalancerMaxNumberOfBundlesInBundleLoadReport, s.loadBalancerSplitIntervalMinutes,
            s.loadBalancerNamespaceBundleSplitConditionHitCountThreshold,
            s.loadBalancerMaxNumberOfBundlesToSplitPerCycle,
            s.loadBalancerMultiPhaseBundleUnload) == (10, 1, 3, 10, True)
    assert s.loadBalancerSheddingExcludedNamespaces == ()
    assert LoadBalancerSettings.from_mapping({"loadBalancerSheddingExcludedNamespaces": "a/b, c/d"}
                                             ).loadBalancerSheddingExcludedNamespaces == ("a/b", "c/d")
