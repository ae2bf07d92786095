"""Bundle splits: Pulsar's four split algorithms and the leader's choice of bundles to split.

The algorithms (`supportedNamespaceBundleSplitAlgorithms`) return the new boundaries inside a
bundle `[lower, upper)` as Pulsar's NamespaceBundleSplitAlgorithm implementations compute them
(Java long arithmetic on non-negative values, so `//` is Java's `/`), or None for "no split":

- `range_equally_divide`: `lower + (upper - lower) / 2`;
- `topic_count_equally_divide`: the sorted CRC-32 hashes h of the bundle's topics (full names,
  `persistent://t/ns/x`); `s = h[max(n/2 - 1, 0)]`, `e = h[n/2]`, boundary `s + (e - s) / 2`;
  no split with at most one topic;
- `specified_positions_divide`: the given positions strictly inside the bundle, sorted, distinct;
  no split with at most one topic unless forced; no positions is an error;
- `flow_or_qps_equally_divide`: topics with traffic in hash order, cut between two topics
  (`prev + (cur - prev) / 2 + 1`) whenever the running msg rate or throughput would exceed
  loadBalancerNamespaceBundleMaxMsgRate / loadBalancerNamespaceBundleMaxBandwidthMbytes MiB; no
  split with fewer than two such topics or when the bundle is below both limits * (1 +
  flowOrQpsDifferenceThresholdPercentage / 100).

A bundle whose range is not larger than 1 cannot be split at all (NamespaceBundleFactory.
canSplitBundle): every algorithm answers None for it.

`bundles_to_split(load_data, settings, bundle_counts)` is BundleSplitterTask.findBundlesToSplit plus
the checks of ModularLoadManagerImpl.checkNamespaceBundleSplit.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from clusters.loadbalancer.data import MIBI, LoadData, bundle_bounds, namespace_of
from clusters.loadbalancer.settings import LoadBalancerSettings

FULL_LOWER_BOUND = 0x00000000
FULL_UPPER_BOUND = 0xFFFFFFFF


def topic_hash(topic: str) -> int:
    """The unsigned CRC-32 of a full topic name: where the topic falls in its namespace's bundles."""
    return zlib.crc32(topic.encode()) & 0xFFFFFFFF


def can_split(lower: int, upper: int) -> bool:
    return upper - lower > 1


def range_equally_divide(lower: int, upper: int) -> list[int] | None:
    if not can_split(lower, upper):
        return None
    return [lower + (upper - lower) // 2]


def topic_count_equally_divide(lower: int, upper: int, topics: Iterable[str]) -> list[int] | None:
    """`topics`: the full names of the topics the owner serves in the bundle."""
    hashes = sorted(topic_hash(t) for t in topics)
    if not can_split(lower, upper) or len(hashes) <= 1:
        return None
    n = len(hashes)
    start, end = hashes[max(n // 2 - 1, 0)], hashes[n // 2]
    return [start + (end - start) // 2]


def specified_positions_divide(lower: int, upper: int, positions: Sequence[int],
                               topics: Iterable[str] | None = None, force: bool = False) -> list[int] | None:
    """`topics` as for topic_count_equally_divide (only their number matters); `force` is
    Pulsar's SPECIFIED_POSITIONS_DIVIDE_FORCE, which splits whatever the topics."""
    if not positions:
        raise ValueError("SplitBoundaries can't be empty")
    if not can_split(lower, upper):
        return None
    if not force and len(list(topics or ())) <= 1:
        return None
    return sorted({p for p in positions if lower < p < upper})


@dataclass(frozen=True)
class TopicLoad:
    msgRateIn: float = 0.0
    msgRateOut: float = 0.0
    msgThroughputIn: float = 0.0
    msgThroughputOut: float = 0.0


def flow_or_qps_equally_divide(lower: int, upper: int, topics: Mapping[str, TopicLoad | None],
                               settings: LoadBalancerSettings) -> list[int] | None:
    """`topics`: every topic the owner serves in the bundle -> its rates (None: no stats)."""
    if not can_split(lower, upper) or len(topics) <= 1:
        return None
    max_rate = settings.loadBalancerNamespaceBundleMaxMsgRate
    max_bytes = settings.loadBalancerNamespaceBundleMaxBandwidthMbytes * MIBI
    diff = settings.flowOrQpsDifferenceThresholdPercentage / 100.0
    info: dict[int, tuple[float, float]] = {}
    hashes: list[int] = []
    bundle_rate = bundle_bytes = 0.0
    for topic, load in topics.items():
        if load is None:
            continue
        rate = load.msgRateIn + load.msgRateOut
        thr = load.msgThroughputIn + load.msgThroughputOut
        if rate <= 0 and thr <= 0:
            continue                      # an idle topic does not weigh
        h = topic_hash(topic)
        hashes.append(h)
        info[h] = (rate, thr)
        bundle_rate += rate
        bundle_bytes += thr
    if len(info) < 2 or (bundle_rate < max_rate * (1 + diff) and bundle_bytes < max_bytes * (1 + diff)):
        return None
    hashes.sort()
    cuts: list[int] = []
    acc_rate, acc_bytes = info[hashes[0]]
    for i in range(1, len(hashes)):
        rate, thr = info[hashes[i]]
        if acc_rate + rate > max_rate or acc_bytes + thr > max_bytes:
            start, end = hashes[i - 1], hashes[i]
            cuts.append(start + (end - start) // 2 + 1)
            acc_rate, acc_bytes = rate, thr
        else:
            acc_rate += rate
            acc_bytes += thr
    return cuts


def split_boundaries(algorithm: str, lower: int, upper: int, settings: LoadBalancerSettings, *,
                     topics: Iterable[str] = (), topic_loads: Mapping[str, TopicLoad | None] | None = None,
                     positions: Sequence[int] | None = None, force: bool = False) -> list[int] | None:
    """Run the algorithm named (one of supportedNamespaceBundleSplitAlgorithms)."""
    if algorithm not in settings.supportedNamespaceBundleSplitAlgorithms:
        raise ValueError(f"split algorithm {algorithm!r} is not supported; supportedNamespaceBundleSplitAlgorithms="
                         f"{list(settings.supportedNamespaceBundleSplitAlgorithms)}")
    if algorithm == "range_equally_divide":
        return range_equally_divide(lower, upper)
    if algorithm == "topic_count_equally_divide":
        return topic_count_equally_divide(lower, upper, topics)
    if algorithm == "specified_positions_divide":
        return specified_positions_divide(lower, upper, positions or [], topics, force)
    return flow_or_qps_equally_divide(lower, upper, topic_loads if topic_loads is not None
                                      else {t: None for t in topics}, settings)


def child_ranges(lower: int, upper: int, boundaries: Sequence[int]) -> list[tuple[int, int]]:
    """The ranges a split makes: `[lower, b1), [b1, b2), ..., [bn, upper]`. ValueError if a
    boundary is not strictly inside (NamespaceBundleFactory.splitBundles' check)."""
    bs = sorted(set(boundaries))
    if not bs or bs[0] <= lower or bs[-1] >= upper:
        raise ValueError(f"split boundaries {[hex(b) for b in bs]} must lie strictly inside "
                         f"0x{lower:08x}_0x{upper:08x}")
    edges = [lower, *bs, upper]
    return list(zip(edges, edges[1:]))


def bundles_to_split(load_data: LoadData, settings: LoadBalancerSettings,
                     bundle_counts_per_namespace: Mapping[str, int]) -> list[tuple[str, str]]:
    """The bundles the leader splits this cycle, each with why (Topics | Sessions | MsgRate |
    Bandwidth, the first limit exceeded). Nothing if loadBalancerAutoBundleSplitEnabled is off
    or at most one broker is known. A bundle of a broker's last report qualifies with at least
    two topics and topics > loadBalancerNamespaceBundleMaxTopics, or producers + consumers >
    loadBalancerNamespaceBundleMaxSessions (if > 0), or long-term msg rate in+out >
    loadBalancerNamespaceBundleMaxMsgRate, or long-term throughput in+out >
    loadBalancerNamespaceBundleMaxBandwidthMbytes MiB; while the namespace's bundle count
    (`bundle_counts_per_namespace`, else the bundles the reports show) plus the splits already
    chosen this cycle stays below loadBalancerNamespaceMaximumBundles. A chosen bundle whose range
    cannot be split is then dropped (its slot stays used, as in Pulsar)."""
    if not settings.loadBalancerAutoBundleSplitEnabled or len(load_data.brokers) <= 1:
        return []
    max_topics = settings.loadBalancerNamespaceBundleMaxTopics
    max_sessions = settings.loadBalancerNamespaceBundleMaxSessions
    max_rate = settings.loadBalancerNamespaceBundleMaxMsgRate
    max_bytes = settings.loadBalancerNamespaceBundleMaxBandwidthMbytes * MIBI
    reported: dict[str, set[str]] = {}
    for bd in load_data.brokers.values():
        for b in bd.local.lastStats:
            reported.setdefault(namespace_of(b), set()).add(b)
    pending: dict[str, int] = {}
    chosen: list[tuple[str, str]] = []
    for broker in sorted(load_data.brokers):
        for bundle, stats in sorted(load_data.brokers[broker].local.lastStats.items()):
            if stats.topics < 2:
                continue
            rate = thr = 0.0
            data = load_data.bundles.get(bundle)
            if data is not None:
                rate, thr = data.longTermData.total_msg_rate(), data.longTermData.total_msg_throughput()
            if stats.topics > max_topics:
                reason = "Topics"
            elif max_sessions > 0 and stats.consumerCount + stats.producerCount > max_sessions:
                reason = "Sessions"
            elif rate > max_rate:
                reason = "MsgRate"
            elif thr > max_bytes:
                reason = "Bandwidth"
            else:
                continue
            ns = namespace_of(bundle)
            count = bundle_counts_per_namespace.get(ns, len(reported.get(ns, ())))
            if count + pending.get(ns, 0) >= settings.loadBalancerNamespaceMaximumBundles:
                continue
            pending[ns] = pending.get(ns, 0) + 1
            if any(b == bundle for b, _ in chosen):
                continue          # reported by two brokers (a stale report): split once
            if can_split(*bundle_bounds(bundle)):
                chosen.append((bundle, reason))
    return chosen
