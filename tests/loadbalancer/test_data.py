"""Load data: resource scores, the report-rewrite rule, time averages, the leader's updates."""
from __future__ import annotations

import json

import pytest

from clusters.loadbalancer.data import (BundleData, LoadData, LocalBrokerData, NamespaceBundleStats, ResourceUsage,
                                        TimeAverageMessageData, need_broker_data_update)
from clusters.loadbalancer.settings import LoadBalancerSettings

from .helpers import broker

NS = "t/ns"
B1 = f"{NS}/0x00000000_0x40000000"
B2 = f"{NS}/0x40000000_0x80000000"


def test_percent_usage():
    assert ResourceUsage(50, 100).percent_usage() == 50.0
    assert ResourceUsage(5, 0).percent_usage() == 0.0          # no limit: 0, not a division error
    # Java computes in floats: 1/3 is 0.33333334f, times 100 is 33.333336f, not the double 33.333333...
    assert ResourceUsage(1, 3).percent_usage() != 100 / 3
    assert ResourceUsage(1, 3).percent_usage() == pytest.approx(100 / 3, rel=1e-6)


def test_max_resource_usage_as_pulsars_local_broker_data_test():
    # the values of Pulsar's LocalBrokerDataTest.testMaxResourceUsage
    d = LocalBrokerData(cpu=ResourceUsage(1.0, 100.0), memory=ResourceUsage(800.0, 200.0),
                        directMemory=ResourceUsage(2.0, 100.0), bandwidthIn=ResourceUsage(3.0, 100.0),
                        bandwidthOut=ResourceUsage(4.0, 100.0))
    # memory (400 %) is skipped by the unweighted max: max(1, 2, 3, 4) % = 0.04
    assert d.max_resource_usage() == pytest.approx(0.04)
    half = LoadBalancerSettings().replace(
        loadBalancerCPUResourceWeight=0.5, loadBalancerMemoryResourceWeight=0.5,
        loadBalancerDirectMemoryResourceWeight=0.5, loadBalancerBandwithInResourceWeight=0.5,
        loadBalancerBandwithOutResourceWeight=0.5)
    # weighted: max(0.5, 400*0.5, 1, 1.5, 2) / 100 = 2.0
    assert d.max_resource_usage_with_weight(half) == pytest.approx(2.0)
    # within limit: 200 is above 100 and ignored -> 2 / 100
    assert d.max_resource_usage_with_weight_within_limit(half) == pytest.approx(0.02)
    # default weights: memory and direct memory 0 -> max(1, 3, 4) % = 0.04
    assert d.max_resource_usage_with_weight(LoadBalancerSettings()) == pytest.approx(0.04)


def test_local_broker_data_reads_pulsars_json():
    # a report as a Pulsar 2.11 broker writes it (LocalBrokerDataTest), with getters' extra fields
    raw = json.loads('{"webServiceUrl":"http://10.244.2.23:8080","pulsarServiceUrlTls":"pulsar+ssl://10.244.2.23:6651",'
                     '"persistentTopicsEnabled":true,"nonPersistentTopicsEnabled":false,'
                     '"cpu":{"usage":3.1577712104798255,"limit":100.0},"memory":{"usage":614.0,"limit":1228.0},'
                     '"msgThroughputIn":0.0,"lastUpdate":1650886425227,'
                     '"lastStats":{"pulsar/pulsar/10.244.2.23:8080/0x00000000_0xffffffff":{"msgRateIn":0.0,'
                     '"consumerCount":0,"producerCount":0,"topics":1,"cacheSize":0}},"numTopics":1,"numBundles":1,'
                     '"bundles":["pulsar/pulsar/10.244.2.23:8080/0x00000000_0xffffffff"],"lastBundleGains":[],'
                     '"brokerVersionString":"2.11.0","protocols":{},"advertisedListeners":{},'
                     '"bundleStats":{},"maxResourceUsage":0.49645519256591797,"loadReportType":"LocalBrokerData"}')
    d = LocalBrokerData.from_json(raw)
    assert d.memory.percent_usage() == 50.0
    assert d.nonPersistentTopicsEnabled is False
    assert d.lastStats["pulsar/pulsar/10.244.2.23:8080/0x00000000_0xffffffff"].topics == 1
    assert d.bundles == {"pulsar/pulsar/10.244.2.23:8080/0x00000000_0xffffffff"}
    assert d.lastUpdate == 1650886425227
    again = LocalBrokerData.from_json(json.loads(json.dumps(d.to_json())))
    assert again == d
    assert d.to_json()["loadReportType"] == "LocalBrokerData"


def test_update_sums_stats_and_tracks_gains_and_losses():
    d = LocalBrokerData()
    d.update({B1: NamespaceBundleStats(msgRateIn=10, msgThroughputOut=5, topics=3, consumerCount=2)})
    d.clean_deltas()
    d.update({B2: NamespaceBundleStats(msgRateIn=1, topics=4, producerCount=1),
              f"{NS}/0x80000000_0xffffffff": NamespaceBundleStats(msgRateOut=2, topics=1)})
    assert (d.msgRateIn, d.msgRateOut, d.msgThroughputOut) == (1, 2, 0)
    assert (d.numTopics, d.numBundles, d.numConsumers, d.numProducers) == (5, 2, 0, 1)
    assert d.lastBundleLosses == {B1}
    assert d.lastBundleGains == {B2, f"{NS}/0x80000000_0xffffffff"}


S = LoadBalancerSettings()
NOW = 10_000_000


def _report(rate=100.0, thr=1000.0, bundles=2, cpu=10.0, last_update=NOW - 60_000):
    d = LocalBrokerData(cpu=ResourceUsage(cpu, 100.0), msgRateIn=rate, msgThroughputIn=thr, numBundles=bundles)
    d.lastUpdate = last_update
    return d


@pytest.mark.parametrize("current,expected", [
    (_report(), False),                       # nothing moved
    (_report(rate=109.0), False),             # +9 % <= 10 %
    (_report(rate=111.0), True),              # +11 % > 10 %
    (_report(thr=850.0), True),               # -15 %
    (_report(bundles=3), True),               # +50 %
    (_report(cpu=19.0), False),               # 100 * |0.19 - 0.10| = 9
    (_report(cpu=21.0), True),                # 100 * |0.21 - 0.10| = 11
])
def test_need_broker_data_update_change_rules(current, expected):
    assert need_broker_data_update(_report(), current, S, NOW) is expected


def test_need_broker_data_update_time_and_zero_rules():
    assert need_broker_data_update(None, _report(), S, NOW) is True
    # older than loadBalancerReportUpdateMaxIntervalMinutes (15) -> rewrite even if nothing moved
    old = _report(last_update=NOW - 15 * 60_000 - 1)
    assert need_broker_data_update(old, _report(), S, NOW) is True
    assert need_broker_data_update(_report(last_update=NOW - 15 * 60_000), _report(), S, NOW) is False
    # from 0 to anything is an infinite change; 0 to 0 is none
    assert need_broker_data_update(_report(rate=0.0), _report(rate=0.01), S, NOW) is True
    assert need_broker_data_update(_report(rate=0.0), _report(rate=0.0), S, NOW) is False


def test_time_average_update_rule():
    t = TimeAverageMessageData(maxSamples=2)
    for rate in (10.0, 20.0, 30.0):
        t.update(NamespaceBundleStats(msgRateIn=rate))
    # n=1: 10; n=2: (1*10 + 20)/2 = 15; n stays 2: (1*15 + 30)/2 = 22.5
    assert (t.numSamples, t.msgRateIn) == (2, 22.5)


def test_unseen_bundle_starts_from_one_sample_of_the_defaults():
    d = BundleData.new_default()
    assert (d.shortTermData.maxSamples, d.longTermData.maxSamples) == (10, 1000)
    assert (d.shortTermData.numSamples, d.shortTermData.msgRateOut, d.longTermData.msgThroughputIn) == (1, 50, 50000)
    d.update(NamespaceBundleStats(msgRateIn=150.0, topics=7))
    # (1*50 + 150)/2 in both averages
    assert (d.shortTermData.msgRateIn, d.longTermData.msgRateIn, d.topics) == (100.0, 100.0, 7)


def test_leader_updates_bundle_and_time_average_data():
    ld = LoadData()
    a = broker(bundles={B1: NamespaceBundleStats(msgRateIn=150.0, msgRateOut=50.0)})
    b = broker(bundles={})
    ld.update_all_broker_data({"a:8080": a, "b:8080": b})
    # B2 was assigned to b and not reported yet; B1 was preallocated to a
    ld.brokers["b:8080"].preallocated_bundle_data[B2] = BundleData.new_default()
    ld.preallocated_bundle_to_broker[B2] = "b:8080"
    ld.brokers["a:8080"].preallocated_bundle_data[B1] = BundleData.new_default()
    ld.preallocated_bundle_to_broker[B1] = "a:8080"
    ld.update_bundle_data()
    # B1: default sample (50, 50) then (150, 50): in = (50+150)/2 = 100, out = (50+50)/2 = 50
    assert ld.bundles[B1].longTermData.msgRateIn == 100.0
    ta = ld.brokers["a:8080"].time_average
    assert (ta.longTermMsgRateIn, ta.longTermMsgRateOut, ta.shortTermMsgRateIn) == (100.0, 50.0, 100.0)
    # a reports B1: its preallocation is gone; b's B2 stays until b reports it
    assert ld.preallocated_broker(B1) is None and B1 not in ld.brokers["a:8080"].preallocated_bundle_data
    assert ld.preallocated_broker(B2) == "b:8080"
    # a second report adds one more sample (n = 3): in = (2*100 + 150)/3
    ld.update_bundle_data()
    assert ld.bundles[B1].longTermData.msgRateIn == pytest.approx((2 * 100 + 150) / 3)

    # b dies: forgotten, its preallocations released
    assert ld.update_all_broker_data({"a:8080": a}) == ["b:8080"]
    assert ld.preallocated_broker(B2) is None
    # a drops B1: its data is dropped and named for deletion
    a.update({})
    assert ld.update_bundle_data() == [B1]
    assert B1 not in ld.bundles


def test_bundle_first_seen_starts_from_stored_data():
    ld = LoadData()
    ld.update_all_broker_data({"a:8080": broker(bundles={B1: NamespaceBundleStats(msgRateIn=0.0)})})
    stored = BundleData(TimeAverageMessageData(10, 10, 0, 0, 1000.0, 0), TimeAverageMessageData(1000, 1000, 0, 0, 1000.0, 0))
    ld.update_bundle_data(lambda b: stored if b == B1 else None)
    # ample history: (9*1000 + 0)/10 short term, (999*1000 + 0)/1000 long term
    assert ld.bundles[B1].shortTermData.msgRateIn == 900.0
    assert ld.bundles[B1].longTermData.msgRateIn == 999.0


def test_bundles_to_persist_top_k_per_broker():
    from clusters.loadbalancer.data import bundles_to_persist

    from .helpers import bundle_data
    ld = LoadData()
    ld.update_all_broker_data({"a:8080": broker(), "b:8080": broker()})
    names = [f"{NS}/0x{i:08x}_0x{i + 1:08x}" for i in range(6)]
    # throughputs 0..5; names[4] and names[5] tie on throughput, names[5] has the higher rate
    thr = [0, 1, 2, 3, 5, 5]
    for i, n in enumerate(names):
        ld.bundles[n] = bundle_data(short_thr=thr[i], short_rate=i)
    # k = 2 per broker, 2 brokers: the 4 biggest
    s = S.replace(loadBalancerMaxNumberOfBundlesInBundleLoadReport=2)
    assert bundles_to_persist(ld, s) == [names[5], names[4], names[3], names[2]]
    assert len(bundles_to_persist(ld, s.replace(loadBalancerMaxNumberOfBundlesInBundleLoadReport=0))) == 6
