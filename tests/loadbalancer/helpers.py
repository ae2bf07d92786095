"""Builders for load data in the loadbalancer tests (no ZooKeeper, no network)."""
from __future__ import annotations

from clusters.loadbalancer.data import (BundleData, LoadData, LocalBrokerData, NamespaceBundleStats, ResourceUsage,
                                        TimeAverageMessageData)

MiB = 1024 * 1024


def bundle_data(short_thr: float = 0.0, short_rate: float = 0.0, long_rate: float = 0.0,
                long_thr: float = 0.0, topics: int = 0) -> BundleData:
    """Bundle data with the given short-term throughput/rate (all "in") and long-term rate/throughput."""
    return BundleData(TimeAverageMessageData(10, 10, short_thr, 0.0, short_rate, 0.0),
                      TimeAverageMessageData(1000, 1000, long_thr, 0.0, long_rate, 0.0), topics)


def broker(cpu_percent: float = 0.0, bundles: dict[str, NamespaceBundleStats] | None = None,
           thr_in: float = 0.0, thr_out: float = 0.0, rate_in: float = 0.0, rate_out: float = 0.0,
           num_topics: int = 0) -> LocalBrokerData:
    """A report with `cpu_percent` of cpu used (limit 100), the given bundles, and message sums."""
    d = LocalBrokerData(webServiceUrl="http://x:8080", pulsarServiceUrl="pulsar://x:6650")
    d.cpu = ResourceUsage(cpu_percent, 100.0)
    d.update(bundles or {})
    d.msgThroughputIn, d.msgThroughputOut, d.msgRateIn, d.msgRateOut = thr_in, thr_out, rate_in, rate_out
    if num_topics:
        d.numTopics = num_topics
    return d


def load(reports: dict[str, LocalBrokerData], bundles: dict[str, BundleData] | None = None) -> LoadData:
    ld = LoadData()
    ld.update_all_broker_data(reports)
    ld.bundles.update(bundles or {})
    return ld
