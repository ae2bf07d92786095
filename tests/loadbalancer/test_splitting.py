"""The split algorithms' boundaries and the leader's choice of bundles to split."""
from __future__ import annotations

import zlib

import pytest

from clusters.loadbalancer.data import NamespaceBundleStats
from clusters.loadbalancer.settings import LoadBalancerSettings
from clusters.loadbalancer.splitting import (TopicLoad, bundles_to_split, child_ranges, flow_or_qps_equally_divide,
                                             range_equally_divide, specified_positions_divide, split_boundaries,
                                             topic_count_equally_divide, topic_hash)

from .helpers import MiB, broker, bundle_data, load

S = LoadBalancerSettings()
TOPICS = [f"persistent://t/ns/topic-{i}" for i in range(4)]


def test_topic_hash_is_standard_crc32():
    # the CRC-32 check value (Guava's Hashing.crc32 is this CRC)
    assert topic_hash("123456789") == 0xCBF43926


def test_range_equally_divide():
    # lower + (upper - lower) / 2
    assert range_equally_divide(0x40000000, 0x80000000) == [0x60000000]
    # the full range's upper bound is 0xffffffff: 0 + 0xffffffff / 2 (long division) = 0x7fffffff
    assert range_equally_divide(0x00000000, 0xFFFFFFFF) == [0x7FFFFFFF]
    assert range_equally_divide(0xC0000000, 0xFFFFFFFF) == [0xDFFFFFFF]
    # canSplitBundle: upper - lower > 1
    assert range_equally_divide(5, 6) is None
    assert range_equally_divide(5, 7) == [6]


def test_topic_count_equally_divide_even():
    h = sorted(zlib.crc32(t.encode()) & 0xFFFFFFFF for t in TOPICS)
    # n = 4: s = h[4/2 - 1] = h[1], e = h[2]; boundary s + (e - s) / 2
    assert topic_count_equally_divide(0, 0xFFFFFFFF, TOPICS) == [h[1] + (h[2] - h[1]) // 2]


def test_topic_count_equally_divide_odd_and_too_few():
    three = TOPICS[:3]
    h = sorted(zlib.crc32(t.encode()) & 0xFFFFFFFF for t in three)
    # n = 3: s = h[max(3/2 - 1, 0)] = h[0], e = h[1]
    assert topic_count_equally_divide(0, 0xFFFFFFFF, three) == [h[0] + (h[1] - h[0]) // 2]
    assert topic_count_equally_divide(0, 0xFFFFFFFF, TOPICS[:1]) is None
    assert topic_count_equally_divide(0, 0xFFFFFFFF, []) is None


def test_specified_positions_divide():
    pos = [0x90000000, 0x50000000, 0x30000000, 0x50000000, 0x40000000, 0x70000000]
    # strictly inside (0x40000000, 0x80000000), sorted, once each
    assert specified_positions_divide(0x40000000, 0x80000000, pos, TOPICS) == [0x50000000, 0x70000000]
    assert specified_positions_divide(0x40000000, 0x80000000, pos, TOPICS[:1]) is None
    assert specified_positions_divide(0x40000000, 0x80000000, pos, [], force=True) == [0x50000000, 0x70000000]
    with pytest.raises(ValueError, match="can't be empty"):
        specified_positions_divide(0x40000000, 0x80000000, [], TOPICS)


def _flow_settings():
    return S.replace(loadBalancerNamespaceBundleMaxMsgRate=100, loadBalancerNamespaceBundleMaxBandwidthMbytes=100)


def test_flow_or_qps_cuts_where_the_running_rate_would_pass_the_limit():
    loads = {t: TopicLoad(msgRateIn=60.0) for t in TOPICS}
    h = sorted(topic_hash(t) for t in TOPICS)
    # bundle rate 240 >= 100 * 1.1; running sum 60, then +60 > 100 at every topic: a cut between each
    # pair, prev + (cur - prev) / 2 + 1
    expected = [h[i - 1] + (h[i] - h[i - 1]) // 2 + 1 for i in (1, 2, 3)]
    assert flow_or_qps_equally_divide(0, 0xFFFFFFFF, loads, _flow_settings()) == expected


def test_flow_or_qps_pairs_and_no_split_cases():
    s = _flow_settings()
    h = sorted((topic_hash(t), t) for t in TOPICS)
    # 40 + 40 = 80 <= 100, + 40 > 100: one cut between the 2nd and 3rd topic in hash order
    loads = {t: TopicLoad(msgRateIn=40.0) for t in TOPICS}
    assert flow_or_qps_equally_divide(0, 0xFFFFFFFF, loads, s) == [h[1][0] + (h[2][0] - h[1][0]) // 2 + 1]
    # 4 * 27 = 108 < 110 (100 * (1 + 10 %)): no split
    assert flow_or_qps_equally_divide(0, 0xFFFFFFFF, {t: TopicLoad(msgRateIn=27.0) for t in TOPICS}, s) is None
    # by bandwidth: 4 * 30 MiB = 120 MiB >= 110 MiB
    by_bytes = {t: TopicLoad(msgThroughputOut=30.0 * MiB) for t in TOPICS}
    assert len(flow_or_qps_equally_divide(0, 0xFFFFFFFF, by_bytes, s)) == 1
    # idle topics and topics without stats do not count: one busy topic -> no split
    few = {TOPICS[0]: TopicLoad(msgRateIn=500.0), TOPICS[1]: TopicLoad(), TOPICS[2]: None}
    assert flow_or_qps_equally_divide(0, 0xFFFFFFFF, few, s) is None
    assert flow_or_qps_equally_divide(0, 0xFFFFFFFF, {TOPICS[0]: TopicLoad(msgRateIn=500.0)}, s) is None


def test_split_boundaries_dispatch_and_child_ranges():
    assert split_boundaries("range_equally_divide", 0x40000000, 0x80000000, S) == [0x60000000]
    only_range = S.replace(supportedNamespaceBundleSplitAlgorithms=["range_equally_divide"])
    with pytest.raises(ValueError, match="not supported"):
        split_boundaries("topic_count_equally_divide", 0, 0xFFFFFFFF, only_range, topics=TOPICS)
    assert child_ranges(0x40000000, 0x80000000, [0x60000000]) == [(0x40000000, 0x60000000), (0x60000000, 0x80000000)]
    with pytest.raises(ValueError, match="strictly inside"):
        child_ranges(0x40000000, 0x80000000, [0x80000000])


NS = "t/ns"
B1, B2, B3, B4 = (f"{NS}/0x{i << 30:08x}_0x{((i + 1) << 30) - (i == 3):08x}" for i in range(4))


def _split_load(stats_a, bundles=None):
    reports = {"a": broker(bundles=stats_a), "b": broker()}
    return load(reports, bundles)


def test_bundles_to_split_reasons():
    ld = _split_load({B1: NamespaceBundleStats(topics=1001),                                   # > 1000 topics
                      B2: NamespaceBundleStats(topics=2, consumerCount=600, producerCount=401),  # 1001 sessions
                      B3: NamespaceBundleStats(topics=2),                                      # long-term rate
                      B4: NamespaceBundleStats(topics=2)},                                     # long-term bytes
                     {B3: bundle_data(long_rate=30001.0), B4: bundle_data(long_thr=100 * MiB + 1)})
    assert bundles_to_split(ld, S, {NS: 4}) == [(B1, "Topics"), (B2, "Sessions"), (B3, "MsgRate"),
                                                (B4, "Bandwidth")]


def test_bundles_to_split_thresholds_are_strict_and_need_two_topics():
    ld = _split_load({B1: NamespaceBundleStats(topics=1000),
                      B2: NamespaceBundleStats(topics=2, consumerCount=500, producerCount=500),
                      B3: NamespaceBundleStats(topics=1, consumerCount=5000),
                      B4: NamespaceBundleStats(topics=2)},
                     {B4: bundle_data(long_rate=30000.0, long_thr=100 * MiB)})
    assert bundles_to_split(ld, S, {NS: 4}) == []
    # loadBalancerNamespaceBundleMaxSessions <= 0 turns the session limit off
    ld = _split_load({B2: NamespaceBundleStats(topics=2, consumerCount=5000)})
    assert bundles_to_split(ld, S.replace(loadBalancerNamespaceBundleMaxSessions=0), {NS: 4}) == []


def test_bundles_to_split_cap_disabled_single_broker_unsplittable():
    hot = {B1: NamespaceBundleStats(topics=2000), B2: NamespaceBundleStats(topics=2000)}
    # 127 bundles + 1 pending reaches the 128 cap: only the first
    assert bundles_to_split(_split_load(hot), S, {NS: 127}) == [(B1, "Topics")]
    assert bundles_to_split(_split_load(hot), S, {NS: 128}) == []
    assert bundles_to_split(_split_load(hot), S.replace(loadBalancerAutoBundleSplitEnabled=False), {NS: 4}) == []
    one = load({"a": broker(bundles=hot)})
    assert bundles_to_split(one, S, {NS: 4}) == []
    tiny = f"{NS}/0x00000000_0x00000001"
    assert bundles_to_split(_split_load({tiny: NamespaceBundleStats(topics=2000)}), S, {NS: 4}) == []
