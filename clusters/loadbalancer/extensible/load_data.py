"""The extensible load manager's load data (extensions/data, models/TopKBundles, the reporters).

- `BrokerLoadData`: what each broker publishes on
  `non-persistent://pulsar/system/loadbalancer-broker-load-data`, with Pulsar's JSON field names.
  `update(...)` takes a new sample: `maxResourceUsage` = max(cpu, directMemory, bandwidthIn,
  bandwidthOut) percent / 100 (memory left out), `weightedMaxEMA` = w on the first update, else
  h * ema + (1 - h) * w with w the weighted max over the five resources and h =
  loadBalancerHistoryResourcePercentage, `msgThroughputEMA` the same EMA over throughput in + out.
  The first update is the one with `updatedAt == 0` (as in Pulsar), so `now_ms` must be > 0.
- `need_broker_load_data_update(last_published, current, settings, now_ms)`: BrokerLoadDataReporter's
  rule: push when nothing was pushed, when the last push is older than
  loadBalancerReportUpdateMaxIntervalMinutes, or when max(%change of msg rate in+out, of throughput
  in+out, of bundleCount, 100 * |change of maxResourceUsage|) > loadBalancerReportUpdateThresholdPercentage.
- `top_k_bundles(stats, k, excluded)` and `TopBundlesLoadData`: the k largest bundles by
  NamespaceBundleStats.compareTo (bandwidth in, out, msg rate, topics+connections, cache size, each
  compared at a coarse resolution), heartbeat/SLA namespaces and excluded namespaces left out, listed
  in TopKBundles' order: the smallest of the k first.
- `select_broker(candidates, broker_load, settings, rng)`: the assignment's LeastResourceUsageWithWeight
  over the reported weightedMaxEMA (placement.pick_least_usage).
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from clusters.loadbalancer.data import (NamespaceBundleStats, ResourceUsage, _percent_change,
                                        is_system_service_namespace, namespace_of)
from clusters.loadbalancer.placement import pick_least_usage
from clusters.loadbalancer.settings import LoadBalancerSettings

BROKER_LOAD_DATA_TOPIC = "non-persistent://pulsar/system/loadbalancer-broker-load-data"
TOP_BUNDLES_LOAD_DATA_TOPIC = "non-persistent://pulsar/system/loadbalancer-top-bundles-load-data"

_RESOURCES = ("cpu", "memory", "directMemory", "bandwidthIn", "bandwidthOut")


@dataclass
class BrokerLoadData:
    cpu: ResourceUsage = field(default_factory=ResourceUsage)
    memory: ResourceUsage = field(default_factory=ResourceUsage)
    directMemory: ResourceUsage = field(default_factory=ResourceUsage)
    bandwidthIn: ResourceUsage = field(default_factory=ResourceUsage)
    bandwidthOut: ResourceUsage = field(default_factory=ResourceUsage)
    msgThroughputIn: float = 0.0
    msgThroughputOut: float = 0.0
    msgRateIn: float = 0.0
    msgRateOut: float = 0.0
    bundleCount: int = 0
    topics: int = 0
    maxResourceUsage: float = 0.0
    weightedMaxEMA: float = 0.0
    msgThroughputEMA: float = 0.0
    updatedAt: int = 0
    reportedAt: int = 0

    def update(self, usage: Mapping[str, ResourceUsage], msg_throughput_in: float, msg_throughput_out: float,
               msg_rate_in: float, msg_rate_out: float, bundle_count: int, topics: int,
               settings: LoadBalancerSettings, now_ms: int) -> None:
        """A new sample: `usage` maps cpu, memory, directMemory, bandwidthIn, bandwidthOut to a
        ResourceUsage (missing ones count as unused)."""
        if now_ms <= 0:
            raise ValueError(f"now_ms must be positive (0 marks load data never updated), got {now_ms}")
        for name in _RESOURCES:
            setattr(self, name, usage.get(name, ResourceUsage()))
        self.msgThroughputIn, self.msgThroughputOut = msg_throughput_in, msg_throughput_out
        self.msgRateIn, self.msgRateOut = msg_rate_in, msg_rate_out
        self.bundleCount, self.topics = bundle_count, topics
        self.maxResourceUsage = max(self.cpu.percent_usage(), self.directMemory.percent_usage(),
                                    self.bandwidthIn.percent_usage(), self.bandwidthOut.percent_usage()) / 100
        w = self.max_resource_usage_with_weight(settings)
        throughput = msg_throughput_in + msg_throughput_out
        h = settings.loadBalancerHistoryResourcePercentage
        if self.updatedAt == 0:
            self.weightedMaxEMA, self.msgThroughputEMA = w, throughput
        else:
            self.weightedMaxEMA = self.weightedMaxEMA * h + (1 - h) * w
            self.msgThroughputEMA = self.msgThroughputEMA * h + (1 - h) * throughput
        self.updatedAt = now_ms

    def mark_reported(self, now_ms: int) -> None:
        """The reporter published this data at `now_ms` (the 15-minute rule counts from here)."""
        self.reportedAt = now_ms

    def max_resource_usage_with_weight(self, s: LoadBalancerSettings) -> float:
        return max(self.cpu.percent_usage() * s.loadBalancerCPUResourceWeight,
                   self.memory.percent_usage() * s.loadBalancerMemoryResourceWeight,
                   self.directMemory.percent_usage() * s.loadBalancerDirectMemoryResourceWeight,
                   self.bandwidthIn.percent_usage() * s.loadBalancerBandwithInResourceWeight,
                   self.bandwidthOut.percent_usage() * s.loadBalancerBandwithOutResourceWeight) / 100

    def msg_throughput(self) -> float:
        return self.msgThroughputIn + self.msgThroughputOut

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            out[k] = v.to_json() if isinstance(v, ResourceUsage) else v
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "BrokerLoadData":
        """Unknown fields are ignored (Pulsar's mapper does the same)."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"a BrokerLoadData is a JSON object, got {type(raw).__name__}")
        d = cls()
        try:
            for k, f in cls.__dataclass_fields__.items():
                if k not in raw or raw[k] is None:
                    continue
                v = raw[k]
                if k in _RESOURCES:
                    v = ResourceUsage.from_json(v)
                elif f.type == "int":
                    v = int(v)
                else:
                    v = float(v)
                setattr(d, k, v)
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"bad BrokerLoadData JSON: {e}") from None
        return d


def no_data_default() -> BrokerLoadData:
    """What placement assumes of a broker without load data: fully used."""
    return BrokerLoadData(maxResourceUsage=1.0, weightedMaxEMA=1.0)


def need_broker_load_data_update(last_published: BrokerLoadData | None, current: BrokerLoadData,
                                 settings: LoadBalancerSettings, now_ms: int) -> bool:
    if last_published is None:
        return True
    if now_ms - last_published.reportedAt > settings.loadBalancerReportUpdateMaxIntervalMinutes * 60_000:
        return True
    change = max(
        _percent_change(last_published.msgRateIn + last_published.msgRateOut, current.msgRateIn + current.msgRateOut),
        _percent_change(last_published.msg_throughput(), current.msg_throughput()),
        _percent_change(last_published.bundleCount, current.bundleCount),
        100.0 * abs(last_published.maxResourceUsage - current.maxResourceUsage))
    return change > settings.loadBalancerReportUpdateThresholdPercentage


# -- top bundles ---------------------------------------------------------------------------------------

THROUGHPUT_RESOLUTION = 1e5       # NamespaceBundleStats: 100 KB/s
MSG_RATE_RESOLUTION = 100
TOPIC_CONNECTION_RESOLUTION = 500
CACHE_SIZE_RESOLUTION = 100_000


def _cmp(a: float, b: float, resolution: float) -> int:
    if abs(a - b) > resolution:
        return (a > b) - (a < b)
    return 0


def compare_bundle_stats(a: NamespaceBundleStats, b: NamespaceBundleStats) -> int:
    """NamespaceBundleStats.compareTo (not transitive, as Pulsar's)."""
    return (_cmp(a.msgThroughputIn, b.msgThroughputIn, THROUGHPUT_RESOLUTION)
            or _cmp(a.msgThroughputOut, b.msgThroughputOut, THROUGHPUT_RESOLUTION)
            or _cmp(a.msgRateIn + a.msgRateOut, b.msgRateIn + b.msgRateOut, MSG_RATE_RESOLUTION)
            or _cmp(a.topics + a.consumerCount + a.producerCount, b.topics + b.consumerCount + b.producerCount,
                    TOPIC_CONNECTION_RESOLUTION)
            or _cmp(a.cacheSize, b.cacheSize, CACHE_SIZE_RESOLUTION))


@dataclass
class TopBundlesLoadData:
    # (bundleName, stats), TopKBundles' order (ascending: the largest last)
    topBundlesLoadData: list[tuple[str, NamespaceBundleStats]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"topBundlesLoadData": [{"bundleName": b, "stats": s.to_json()} for b, s in self.topBundlesLoadData]}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "TopBundlesLoadData":
        try:
            return cls([(e["bundleName"], NamespaceBundleStats.from_json(e["stats"]))
                        for e in raw.get("topBundlesLoadData", [])])
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise ValueError(f"bad TopBundlesLoadData JSON: {e!r}") from None


def top_k_bundles(bundle_stats: Mapping[str, NamespaceBundleStats], k: int,
                  excluded_namespaces: Iterable[str] = ()) -> TopBundlesLoadData:
    """TopKBundles.update: the k largest bundles (k = loadBalancerMaxNumberOfBundlesInBundleLoadReport)
    of this broker's bundle stats. Ties (equal at the resolution) keep the bundles' name order."""
    excluded = set(excluded_namespaces)
    items = [(b, s) for b, s in sorted(bundle_stats.items())
             if not is_system_service_namespace(namespace_of(b)) and namespace_of(b) not in excluded]
    if k <= 0 or not items:
        return TopBundlesLoadData()
    ordered = sorted(items, key=functools.cmp_to_key(lambda x, y: compare_bundle_stats(y[1], x[1])))
    return TopBundlesLoadData(list(reversed(ordered[:k])))


# -- assignment ----------------------------------------------------------------------------------------

def select_broker(candidates: Iterable[str], broker_load: Mapping[str, BrokerLoadData],
                  settings: LoadBalancerSettings, rng: random.Random) -> str | None:
    """The broker an unowned bundle goes to (extensions' LeastResourceUsageWithWeight): random among
    the candidates whose reported weightedMaxEMA is at least the difference threshold below the mean
    of the candidates with load data, else random among all candidates; None without candidates."""
    cands = sorted(set(candidates))
    usage = {b: broker_load[b].weightedMaxEMA for b in cands if b in broker_load}
    return pick_least_usage(cands, usage, settings, rng)[0]
