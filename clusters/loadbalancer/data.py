"""The load data of Pulsar's modular load manager, as plain objects (no I/O).

- `ResourceUsage`, `NamespaceBundleStats`, `LocalBrokerData`: what each broker reports under
  `/loadbalance/brokers/<brokerId>`, with Pulsar's JSON field names (`to_json` / `from_json`).
- `need_broker_data_update`: ModularLoadManagerImpl.needBrokerDataUpdate, whether a broker rewrites
  its report (older than loadBalancerReportUpdateMaxIntervalMinutes, or a signal moved more than
  loadBalancerReportUpdateThresholdPercentage).
- `TimeAverageMessageData`, `BundleData` (10 short-term, 1000 long-term samples),
  `TimeAverageBrokerData`: the leader's running averages, stored under `/loadbalance/bundle-data`
  and `/loadbalance/broker-time-average`.
- `BrokerData` and `LoadData`: the leader's view; `LoadData.update_all_broker_data(reports)` and
  `LoadData.update_bundle_data()` do what ModularLoadManagerImpl.updateAllBrokerData and
  updateBundleData do on every change under `/loadbalance/brokers`.

Bundle names are Pulsar's `"<tenant>/<ns>/0xLLLLLLLL_0xUUUUUUUU"`. Percentages of a ResourceUsage
are computed in 32-bit floats as Java's `ResourceUsage.percentUsage()` does, so scores compare
as Pulsar's do.
"""
from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from clusters.loadbalancer.settings import LoadBalancerSettings

# ModularLoadManagerImpl: what an unseen bundle is assumed to carry, in and out each
DEFAULT_MESSAGE_RATE = 50.0
DEFAULT_MESSAGE_THROUGHPUT = 50000.0
NUM_SHORT_SAMPLES = 10
NUM_LONG_SAMPLES = 1000
MIBI = 1024 * 1024


def _f32(x: float) -> float:
    """`x` rounded to a Java float."""
    return struct.unpack("f", struct.pack("f", x))[0]


@functools.lru_cache(maxsize=1 << 16)
def _percent(usage: float, limit: float) -> float:
    """ResourceUsage.percentUsage in Java floats (a pure function of its two numbers: cached, since
    placement asks it of every broker for every bundle)."""
    proportion = _f32(_f32(usage) / _f32(limit)) if limit > 0 else 0.0
    return _f32(proportion * 100)


def namespace_of(bundle: str) -> str:
    """`tenant/ns/0x..._0x...` -> `tenant/ns` (LoadManagerShared.getNamespaceNameFromBundleName)."""
    return bundle.rsplit("/", 1)[0]


def range_of(bundle: str) -> str:
    """`tenant/ns/0x..._0x...` -> `0x..._0x...` (LoadManagerShared.getBundleRangeFromBundleName)."""
    return bundle.rsplit("/", 1)[1]


def bundle_bounds(bundle: str) -> tuple[int, int]:
    """`tenant/ns/0x40000000_0x80000000` -> (0x40000000, 0x80000000)."""
    lo, hi = range_of(bundle).split("_")
    return int(lo, 16), int(hi, 16)


def bundle_name(namespace: str, lower: int, upper: int) -> str:
    return f"{namespace}/0x{lower:08x}_0x{upper:08x}"


# ---------------------------------------------------------------------------------------------------
# what a broker reports

@dataclass
class ResourceUsage:
    usage: float = 0.0
    limit: float = 0.0

    def percent_usage(self) -> float:
        """100 * usage / limit in Java floats; 0 when there is no limit."""
        return _percent(self.usage, self.limit)

    def to_json(self) -> dict[str, float]:
        return {"usage": self.usage, "limit": self.limit}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> "ResourceUsage":
        raw = raw or {}
        return cls(float(raw.get("usage", 0.0)), float(raw.get("limit", 0.0)))


@dataclass
class NamespaceBundleStats:
    msgRateIn: float = 0.0
    msgThroughputIn: float = 0.0
    msgRateOut: float = 0.0
    msgThroughputOut: float = 0.0
    consumerCount: int = 0
    producerCount: int = 0
    topics: int = 0
    cacheSize: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "NamespaceBundleStats":
        return cls(**{k: type(getattr(cls, k))(raw[k]) for k in cls.__dataclass_fields__ if k in raw})


_RESOURCES = ("cpu", "memory", "directMemory", "bandwidthIn", "bandwidthOut")


@dataclass
class LocalBrokerData:
    """A broker's load report (Pulsar's LocalBrokerData). `equals` in Pulsar compares only the
    four URLs (it is the value of the broker's lock); here `same_broker` does that."""
    webServiceUrl: str | None = None
    webServiceUrlTls: str | None = None
    pulsarServiceUrl: str | None = None
    pulsarServiceUrlTls: str | None = None
    persistentTopicsEnabled: bool = True
    nonPersistentTopicsEnabled: bool = True
    cpu: ResourceUsage = field(default_factory=ResourceUsage)
    memory: ResourceUsage = field(default_factory=ResourceUsage)
    directMemory: ResourceUsage = field(default_factory=ResourceUsage)
    bandwidthIn: ResourceUsage = field(default_factory=ResourceUsage)
    bandwidthOut: ResourceUsage = field(default_factory=ResourceUsage)
    msgThroughputIn: float = 0.0
    msgThroughputOut: float = 0.0
    msgRateIn: float = 0.0
    msgRateOut: float = 0.0
    lastUpdate: int = 0
    lastStats: dict[str, NamespaceBundleStats] = field(default_factory=dict)
    numTopics: int = 0
    numBundles: int = 0
    numConsumers: int = 0
    numProducers: int = 0
    bundles: set[str] = field(default_factory=set)
    lastBundleGains: set[str] = field(default_factory=set)
    lastBundleLosses: set[str] = field(default_factory=set)
    brokerVersionString: str | None = None
    protocols: dict[str, str] = field(default_factory=dict)
    advertisedListeners: dict[str, Any] = field(default_factory=dict)
    loadManagerClassName: str | None = None

    def same_broker(self, other: "LocalBrokerData") -> bool:
        return all(getattr(self, k) == getattr(other, k)
                   for k in ("webServiceUrl", "webServiceUrlTls", "pulsarServiceUrl", "pulsarServiceUrlTls"))

    # -- updates (LocalBrokerData.update) -------------------------------------------------------------
    def update(self, bundle_stats: Mapping[str, NamespaceBundleStats], *, cpu: ResourceUsage | None = None,
               memory: ResourceUsage | None = None, direct_memory: ResourceUsage | None = None,
               bandwidth_in: ResourceUsage | None = None, bandwidth_out: ResourceUsage | None = None) -> None:
        """New resource usage (the ones given) and bundle stats: the message sums and counts are
        recomputed, and bundles gained or lost since the last `clean_deltas` are recorded."""
        for name, value in zip(_RESOURCES, (cpu, memory, direct_memory, bandwidth_in, bandwidth_out)):
            if value is not None:
                setattr(self, name, value)
        for b in list(self.bundles):
            if b not in bundle_stats:
                self.lastBundleLosses.add(b)
                self.bundles.discard(b)
        self.msgRateIn = self.msgRateOut = self.msgThroughputIn = self.msgThroughputOut = 0.0
        topics = consumers = producers = 0
        for b, s in bundle_stats.items():
            if b not in self.bundles:
                self.lastBundleGains.add(b)
                self.bundles.add(b)
            self.msgThroughputIn += s.msgThroughputIn
            self.msgThroughputOut += s.msgThroughputOut
            self.msgRateIn += s.msgRateIn
            self.msgRateOut += s.msgRateOut
            topics += s.topics
            consumers += s.consumerCount
            producers += s.producerCount
        self.numTopics, self.numBundles = topics, len(bundle_stats)
        self.numConsumers, self.numProducers = consumers, producers
        self.lastStats = dict(bundle_stats)

    def clean_deltas(self) -> None:
        self.lastBundleGains.clear()
        self.lastBundleLosses.clear()

    # -- resource scores -----------------------------------------------------------------------------
    def max_resource_usage(self) -> float:
        """Unweighted max of cpu, direct memory, bandwidth in/out, as a fraction (1.0 = 100 %).
        Memory is left out, as in Pulsar >= 3.0 ("noisy because of GC"); 2.x included it."""
        return max(self.cpu.percent_usage(), self.directMemory.percent_usage(),
                   self.bandwidthIn.percent_usage(), self.bandwidthOut.percent_usage()) / 100

    def _weighted(self, s: LoadBalancerSettings) -> list[float]:
        return [self.cpu.percent_usage() * s.loadBalancerCPUResourceWeight,
                self.memory.percent_usage() * s.loadBalancerMemoryResourceWeight,
                self.directMemory.percent_usage() * s.loadBalancerDirectMemoryResourceWeight,
                self.bandwidthIn.percent_usage() * s.loadBalancerBandwithInResourceWeight,
                self.bandwidthOut.percent_usage() * s.loadBalancerBandwithOutResourceWeight]

    def max_resource_usage_with_weight(self, settings: LoadBalancerSettings) -> float:
        """max(percent * weight) over cpu, memory, direct memory, bandwidth in/out, / 100
        (getMaxResourceUsageWithWeight); a weight of 0 (memory's default) drops the signal."""
        return max(self._weighted(settings)) / 100

    def max_resource_usage_with_weight_within_limit(self, settings: LoadBalancerSettings) -> float:
        """The same, ignoring weighted signals above 100 % (mis-set limits); 0 if all are."""
        return max([0.0] + [v for v in self._weighted(settings) if v <= 100.0]) / 100

    # -- JSON ----------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            if isinstance(v, ResourceUsage):
                v = v.to_json()
            elif k == "lastStats":
                v = {b: s.to_json() for b, s in v.items()}
            elif isinstance(v, set):
                v = sorted(v)
            elif isinstance(v, dict):
                v = dict(v)
            out[k] = v
        out["loadReportType"] = "LocalBrokerData"
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "LocalBrokerData":
        """From Pulsar's JSON; fields it does not know (bundleStats, maxResourceUsage,
        loadReportType...) are ignored, as Pulsar's ObjectMapper does."""
        d = cls()
        for k in cls.__dataclass_fields__:
            if k not in raw or raw[k] is None and k not in ("webServiceUrl", "webServiceUrlTls",
                                                            "pulsarServiceUrl", "pulsarServiceUrlTls",
                                                            "brokerVersionString", "loadManagerClassName"):
                continue
            v = raw[k]
            if k in _RESOURCES:
                v = ResourceUsage.from_json(v)
            elif k == "lastStats":
                v = {b: NamespaceBundleStats.from_json(s) for b, s in v.items()}
            elif k in ("bundles", "lastBundleGains", "lastBundleLosses"):
                v = set(v)
            elif k in ("msgThroughputIn", "msgThroughputOut", "msgRateIn", "msgRateOut"):
                v = float(v)
            elif k in ("lastUpdate", "numTopics", "numBundles", "numConsumers", "numProducers"):
                v = int(v)
            setattr(d, k, v)
        return d


def _percent_change(old: float, new: float) -> float:
    if old == 0:
        return 0.0 if new == 0 else float("inf")
    return 100 * abs((old - new) / old)


def need_broker_data_update(last_written: LocalBrokerData | None, current: LocalBrokerData,
                            settings: LoadBalancerSettings, now_ms: int) -> bool:
    """Whether a broker rewrites its load report (ModularLoadManagerImpl.needBrokerDataUpdate):
    always when nothing was written yet or the last write (`last_written.lastUpdate`) is older than
    loadBalancerReportUpdateMaxIntervalMinutes; otherwise when the largest of the percent changes of
    msgRateIn+Out, msgThroughputIn+Out, numBundles and 100 * |change of the weighted max resource
    usage| exceeds loadBalancerReportUpdateThresholdPercentage (a signal rising from 0 counts as
    an infinite change)."""
    if last_written is None:
        return True
    if now_ms - last_written.lastUpdate > settings.loadBalancerReportUpdateMaxIntervalMinutes * 60_000:
        return True
    max_change = max(
        _percent_change(last_written.msgRateIn + last_written.msgRateOut, current.msgRateIn + current.msgRateOut),
        _percent_change(last_written.msgThroughputIn + last_written.msgThroughputOut,
                        current.msgThroughputIn + current.msgThroughputOut),
        _percent_change(last_written.numBundles, current.numBundles),
        100.0 * abs(last_written.max_resource_usage_with_weight(settings)
                    - current.max_resource_usage_with_weight(settings)))
    return max_change > settings.loadBalancerReportUpdateThresholdPercentage


# ---------------------------------------------------------------------------------------------------
# the leader's averages

@dataclass
class TimeAverageMessageData:
    """A running average over at most `maxSamples` samples: after n samples (n capped at
    maxSamples) `avg = ((n - 1) * avg + sample) / n`, so once full it is an exponential average."""
    maxSamples: int = NUM_SHORT_SAMPLES
    numSamples: int = 0
    msgThroughputIn: float = 0.0
    msgThroughputOut: float = 0.0
    msgRateIn: float = 0.0
    msgRateOut: float = 0.0

    @classmethod
    def with_default(cls, max_samples: int, default: NamespaceBundleStats) -> "TimeAverageMessageData":
        """One sample of `default` (Pulsar's TimeAverageMessageData(maxSamples, defaultStats))."""
        return cls(max_samples, 1, default.msgThroughputIn, default.msgThroughputOut,
                   default.msgRateIn, default.msgRateOut)

    def update(self, sample: NamespaceBundleStats) -> None:
        self.numSamples = min(self.numSamples + 1, self.maxSamples)
        n = self.numSamples
        self.msgThroughputIn = ((n - 1) * self.msgThroughputIn + sample.msgThroughputIn) / n
        self.msgThroughputOut = ((n - 1) * self.msgThroughputOut + sample.msgThroughputOut) / n
        self.msgRateIn = ((n - 1) * self.msgRateIn + sample.msgRateIn) / n
        self.msgRateOut = ((n - 1) * self.msgRateOut + sample.msgRateOut) / n

    def total_msg_rate(self) -> float:
        return self.msgRateIn + self.msgRateOut

    def total_msg_throughput(self) -> float:
        return self.msgThroughputIn + self.msgThroughputOut

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "TimeAverageMessageData":
        return cls(int(raw.get("maxSamples", 0)), int(raw.get("numSamples", 0)),
                   float(raw.get("msgThroughputIn", 0.0)), float(raw.get("msgThroughputOut", 0.0)),
                   float(raw.get("msgRateIn", 0.0)), float(raw.get("msgRateOut", 0.0)))


def default_bundle_stats() -> NamespaceBundleStats:
    """What the leader assumes of a bundle it has never seen: 50 msg/s and 50000 B/s each way."""
    return NamespaceBundleStats(msgRateIn=DEFAULT_MESSAGE_RATE, msgThroughputIn=DEFAULT_MESSAGE_THROUGHPUT,
                                msgRateOut=DEFAULT_MESSAGE_RATE, msgThroughputOut=DEFAULT_MESSAGE_THROUGHPUT)


@dataclass
class BundleData:
    shortTermData: TimeAverageMessageData = field(default_factory=lambda: TimeAverageMessageData(NUM_SHORT_SAMPLES))
    longTermData: TimeAverageMessageData = field(default_factory=lambda: TimeAverageMessageData(NUM_LONG_SAMPLES))
    topics: int = 0

    @classmethod
    def new_default(cls) -> "BundleData":
        """An unseen bundle's data: one sample of the defaults in both averages."""
        d = default_bundle_stats()
        return cls(TimeAverageMessageData.with_default(NUM_SHORT_SAMPLES, d),
                   TimeAverageMessageData.with_default(NUM_LONG_SAMPLES, d))

    def update(self, sample: NamespaceBundleStats) -> None:
        self.shortTermData.update(sample)
        self.longTermData.update(sample)
        self.topics = sample.topics

    def to_json(self) -> dict[str, Any]:
        return {"shortTermData": self.shortTermData.to_json(), "longTermData": self.longTermData.to_json(),
                "topics": self.topics}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "BundleData":
        return cls(TimeAverageMessageData.from_json(raw.get("shortTermData") or {"maxSamples": NUM_SHORT_SAMPLES}),
                   TimeAverageMessageData.from_json(raw.get("longTermData") or {"maxSamples": NUM_LONG_SAMPLES}),
                   int(raw.get("topics", 0)))


_TA_FIELDS = ("shortTermMsgThroughputIn", "shortTermMsgThroughputOut", "shortTermMsgRateIn", "shortTermMsgRateOut",
              "longTermMsgThroughputIn", "longTermMsgThroughputOut", "longTermMsgRateIn", "longTermMsgRateOut")


@dataclass
class TimeAverageBrokerData:
    """Sums of the short- and long-term averages of a broker's bundles."""
    shortTermMsgThroughputIn: float = 0.0
    shortTermMsgThroughputOut: float = 0.0
    shortTermMsgRateIn: float = 0.0
    shortTermMsgRateOut: float = 0.0
    longTermMsgThroughputIn: float = 0.0
    longTermMsgThroughputOut: float = 0.0
    longTermMsgRateIn: float = 0.0
    longTermMsgRateOut: float = 0.0

    def reset(self, bundles: Iterable[str], data: Mapping[str, BundleData],
              default: NamespaceBundleStats | None = None) -> None:
        """Recompute the sums over `bundles`; one without data counts as `default` (the 50 msg/s,
        50000 B/s defaults) in both terms."""
        default = default or default_bundle_stats()
        # each sum in local variables, added in the bundles' order (the same floats as field by field)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        for b in bundles:
            bd = data.get(b)
            if bd is not None:
                s, l = bd.shortTermData, bd.longTermData
                a0 += s.msgThroughputIn
                a1 += s.msgThroughputOut
                a2 += s.msgRateIn
                a3 += s.msgRateOut
                a4 += l.msgThroughputIn
                a5 += l.msgThroughputOut
                a6 += l.msgRateIn
                a7 += l.msgRateOut
            else:
                a0 += default.msgThroughputIn
                a1 += default.msgThroughputOut
                a2 += default.msgRateIn
                a3 += default.msgRateOut
                a4 += default.msgThroughputIn
                a5 += default.msgThroughputOut
                a6 += default.msgRateIn
                a7 += default.msgRateOut
        (self.shortTermMsgThroughputIn, self.shortTermMsgThroughputOut, self.shortTermMsgRateIn,
         self.shortTermMsgRateOut, self.longTermMsgThroughputIn, self.longTermMsgThroughputOut,
         self.longTermMsgRateIn, self.longTermMsgRateOut) = (a0, a1, a2, a3, a4, a5, a6, a7)

    def to_json(self) -> dict[str, float]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "TimeAverageBrokerData":
        return cls(**{k: float(raw.get(k, 0.0)) for k in _TA_FIELDS})


# ---------------------------------------------------------------------------------------------------
# the leader's view

class PreallocatedBundles(dict):
    """bundle -> BundleData preallocated to one broker; keeps the sums placement asks of it on every
    placement (the long-term msg rate in+out, the topics) until the next change of its entries. A
    preallocated BundleData is not updated in place while preallocated (update_bundle_data drops the
    preallocations of the bundles it updates, and forgets these sums first)."""
    __slots__ = ("_sums",)

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self._sums: tuple[float, int] | None = None

    def forget(self) -> None:
        self._sums = None

    def __setitem__(self, k: str, v: "BundleData") -> None:
        self._sums = None
        super().__setitem__(k, v)

    def __delitem__(self, k: str) -> None:
        self._sums = None
        super().__delitem__(k)

    def pop(self, *a: Any) -> Any:
        self._sums = None
        return super().pop(*a)

    def popitem(self) -> Any:
        self._sums = None
        return super().popitem()

    def clear(self) -> None:
        self._sums = None
        super().clear()

    def update(self, *a: Any, **kw: Any) -> None:
        self._sums = None
        super().update(*a, **kw)

    def setdefault(self, k: str, d: Any = None) -> Any:
        self._sums = None
        return super().setdefault(k, d)

    def sums(self) -> tuple[float, int]:
        """(sum of long-term msgRateIn + msgRateOut, sum of topics), in the entries' order."""
        if self._sums is None:
            self._sums = (sum(d.longTermData.msgRateIn + d.longTermData.msgRateOut for d in self.values()),
                          sum(d.topics for d in self.values()))
        return self._sums


def preallocated_sums(preallocated: Mapping[str, "BundleData"]) -> tuple[float, int]:
    """(long-term msg rate in+out, topics) summed over a broker's preallocated bundles."""
    if isinstance(preallocated, PreallocatedBundles):
        return preallocated.sums()
    return (sum(d.longTermData.msgRateIn + d.longTermData.msgRateOut for d in preallocated.values()),
            sum(d.topics for d in preallocated.values()))


@dataclass
class BrokerData:
    local: LocalBrokerData
    time_average: TimeAverageBrokerData = field(default_factory=TimeAverageBrokerData)
    # bundles assigned to this broker that its reports do not show yet
    preallocated_bundle_data: dict[str, BundleData] = field(default_factory=PreallocatedBundles)


@dataclass
class LoadData:
    brokers: dict[str, BrokerData] = field(default_factory=dict)
    bundles: dict[str, BundleData] = field(default_factory=dict)
    # bundle -> broker it was preallocated to (ModularLoadManagerImpl.preallocatedBundleToBroker)
    preallocated_bundle_to_broker: dict[str, str] = field(default_factory=dict)
    # bundle -> ms of its unload by the shedder (plan_shedding prunes and fills it)
    recently_unloaded_bundles: dict[str, int] = field(default_factory=dict)

    def preallocated_broker(self, bundle: str) -> str | None:
        """The broker `bundle` was already assigned to and whose report does not show it yet."""
        return self.preallocated_bundle_to_broker.get(bundle)

    def bundle_data_for_load_shedding(self) -> dict[str, BundleData]:
        """The bundles the shedders may pick (LoadData.getBundleDataForLoadShedding): all but those
        of Pulsar's system-service namespaces (heartbeat `pulsar/<cluster>/<broker>` and
        `pulsar/<broker>`, SLA monitor `sla-monitor/...`)."""
        return {b: d for b, d in self.bundles.items() if not is_system_service_namespace(namespace_of(b))}

    def update_all_broker_data(self, reports: Mapping[str, LocalBrokerData | None]) -> list[str]:
        """Take the reports of the available brokers (`brokerId -> LocalBrokerData`, None for a
        broker whose report is missing): each replaces that broker's local data (its preallocations
        and time averages are kept); brokers without a report are forgotten. Preallocations to
        forgotten brokers are released (reapDeadBrokerPreallocations). Returns the forgotten ones."""
        gone = []
        for broker, report in reports.items():
            if report is None:
                if self.brokers.pop(broker, None) is not None:
                    gone.append(broker)
            elif broker in self.brokers:
                self.brokers[broker].local = report
            else:
                self.brokers[broker] = BrokerData(report)
        for broker in list(self.brokers):
            if broker not in reports:
                del self.brokers[broker]
                gone.append(broker)
        for bundle, broker in list(self.preallocated_bundle_to_broker.items()):
            if broker not in self.brokers:
                del self.preallocated_bundle_to_broker[bundle]
        return gone

    def update_bundle_data(self, stored: Callable[[str], BundleData | None] | None = None) -> list[str]:
        """Add each broker's `lastStats` as one sample to its bundles' averages (a bundle first seen
        starts from `stored(bundle)` — the glue's read of /loadbalance/bundle-data — or from one
        sample of the defaults); drop preallocations of bundles a broker now reports; recompute every
        broker's time-average sums. Bundles no broker reports are dropped from `bundles` (the leader
        then deletes their bundle-data znode); returns those."""
        reported: set[str] = set()
        for bd in self.brokers.values():
            if isinstance(bd.preallocated_bundle_data, PreallocatedBundles):
                bd.preallocated_bundle_data.forget()
        for bd in self.brokers.values():
            for bundle, stats in bd.local.lastStats.items():
                reported.add(bundle)
                data = self.bundles.get(bundle)
                if data is None:
                    data = (stored(bundle) if stored else None) or BundleData.new_default()
                    self.bundles[bundle] = data
                data.update(stats)
        for broker, bd in self.brokers.items():
            for bundle in list(bd.preallocated_bundle_data):
                if bundle in reported:
                    del bd.preallocated_bundle_data[bundle]
                    if self.preallocated_bundle_to_broker.get(bundle) == broker:
                        del self.preallocated_bundle_to_broker[bundle]
            bd.time_average.reset(bd.local.lastStats.keys(), self.bundles)
        removed = [b for b in self.bundles if b not in reported]
        for b in removed:
            del self.bundles[b]
        return removed

    def namespace_bundle_counts(self, namespace: str) -> dict[str, int]:
        """Per broker, the bundles of `namespace` it reports or was preallocated
        (brokerToNamespaceToBundleRange, as removeMostServicingBrokersForNamespace counts them)."""
        out = {}
        for broker, bd in self.brokers.items():
            names = set(bd.local.lastStats) | set(bd.preallocated_bundle_data)
            out[broker] = sum(1 for b in names if namespace_of(b) == namespace)
        return out


def bundles_to_persist(load_data: LoadData, settings: LoadBalancerSettings) -> list[str]:
    """The bundles whose BundleData the leader writes to /loadbalance/bundle-data this period
    (ModularLoadManagerImpl.writeBundleDataOnZooKeeper / selectTopKBundle): all of them if
    loadBalancerMaxNumberOfBundlesInBundleLoadReport <= 0, else the top k * max(1, #brokers),
    ordered as BundleData.compareTo, biggest first: short-term throughput in+out, then short-term
    msg rate, then the same of the long-term data (bundle name last, for a stable order)."""
    def key(item: tuple[str, BundleData]) -> tuple:
        name, d = item
        s, l = d.shortTermData, d.longTermData
        return (-s.total_msg_throughput(), -s.total_msg_rate(), -l.total_msg_throughput(), -l.total_msg_rate(), name)
    ranked = [name for name, _ in sorted(load_data.bundles.items(), key=key)]
    k = settings.loadBalancerMaxNumberOfBundlesInBundleLoadReport
    if k <= 0:
        return ranked
    return ranked[:k * max(1, len(load_data.brokers))]


_SYSTEM_SERVICE_NAMESPACES = (re.compile(r"pulsar/[^/]+/([^:]+:\d+)"), re.compile(r"pulsar/([^:]+:\d+)"),
                              re.compile(r"sla-monitor/[^/]+/([^:]+:\d+)"))


def is_system_service_namespace(namespace: str) -> bool:
    """Heartbeat (`pulsar/<cluster>/<host:port>`, `pulsar/<host:port>`) and SLA-monitor
    (`sla-monitor/<cluster>/<host:port>`) namespaces (NamespaceService.isSystemServiceNamespace)."""
    return any(p.fullmatch(namespace) for p in _SYSTEM_SERVICE_NAMESPACES)
