"""The load balancer's settings, under the names of Pulsar's `ServiceConfiguration`.

`LoadBalancerSettings` holds every setting that the modular load manager's algorithms here
(`data`, `placement`, `shedding`, `splitting`), the extensible load manager's core (`extensible/`)
and the glue around them read, with Pulsar's defaults. The field names are Pulsar's, camelCase and misspellings included
(`loadBalancerBandwithInResourceWeight`), so a `broker.conf` line can be pasted as is.

Where Pulsar's default changed between versions the comment says so; the value here is the newest
one read. Intervals keep Pulsar's unit (minutes) but accept floats, so that a test can run a
shedding cycle every 0.05 minutes (3 s).

`LoadBalancerSettings.from_mapping({...})` builds one from a dict of strings or values (a parsed
broker.conf or JSON): an unknown name is refused with a ValueError naming the nearest known name,
and values are coerced to the field's type ("true" -> True, "10" -> 10.0 for a float field,
"a,b" -> ("a", "b") for a list).
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping

IMPL_PACKAGE = "org.apache.pulsar.broker.loadbalance.impl"
CHANNEL_PACKAGE = "org.apache.pulsar.broker.loadbalance.extensions.channel"
# the extensible load manager's two channel stores (loadManagerServiceUnitStateTableViewClassName)
SYSTEM_TOPIC_TABLE_VIEW = f"{CHANNEL_PACKAGE}.ServiceUnitStateTableViewImpl"
METADATA_STORE_TABLE_VIEW = f"{CHANNEL_PACKAGE}.ServiceUnitStateMetadataStoreTableViewImpl"
TABLE_VIEWS = (SYSTEM_TOPIC_TABLE_VIEW, METADATA_STORE_TABLE_VIEW)

SPLIT_ALGORITHMS = ("range_equally_divide", "topic_count_equally_divide",
                    "specified_positions_divide", "flow_or_qps_equally_divide")


@dataclass(frozen=True)
class LoadBalancerSettings:
    # -- switches and timers (ModularLoadManagerImpl, PulsarService) --------------------------------
    loadBalancerEnabled: bool = True
    loadManagerClassName: str = f"{IMPL_PACKAGE}.ModularLoadManagerImpl"
    loadBalancerSheddingEnabled: bool = True
    loadBalancerSheddingIntervalMinutes: float = 1
    loadBalancerSheddingGracePeriodMinutes: float = 30
    # a broker rewrites its LocalBrokerData when a signal moved more than this (percent) ...
    loadBalancerReportUpdateThresholdPercentage: float = 10
    # ... or when its last write is older than this
    loadBalancerReportUpdateMaxIntervalMinutes: float = 15
    loadBalancerHostUsageCheckIntervalMinutes: float = 1
    # how often a broker samples its load and considers rewriting its report
    # (LoadManagerShared.LOAD_REPORT_UPDATE_MINIMUM_INTERVAL; a setting in newer Pulsar)
    loadBalancerReportUpdateMinIntervalMillis: int = 5000
    # the leader's bundle-data / broker-time-average write period
    loadBalancerResourceQuotaUpdateIntervalMinutes: float = 15
    # top-k bundles per broker written to /loadbalance/bundle-data (<= 0: all)
    loadBalancerMaxNumberOfBundlesInBundleLoadReport: int = 10

    # -- strategies (full Java class name or short name) --------------------------------------------
    # ThresholdShedder is the default since Pulsar 2.10 (OverloadShedder before)
    loadBalancerLoadSheddingStrategy: str = f"{IMPL_PACKAGE}.ThresholdShedder"
    loadBalancerLoadPlacementStrategy: str = f"{IMPL_PACKAGE}.LeastLongTermMessageRate"

    # -- resource usage -----------------------------------------------------------------------------
    loadBalancerBrokerOverloadedThresholdPercentage: float = 85
    loadBalancerBrokerThresholdShedderPercentage: float = 10
    loadBalancerAverageResourceUsageDifferenceThresholdPercentage: float = 10
    loadBalancerHistoryResourcePercentage: float = 0.9
    # the link speed every broker's bandwidth usage is measured against (Pulsar: Optional, unset by default:
    # the NIC's speed); 0 here is unset: each broker's own `nic_speed_gbps` (clusters/config.py)
    loadBalancerOverrideBrokerNicSpeedGbps: float = 0
    loadBalancerCPUResourceWeight: float = 1.0
    # deprecated since 3.0 ("memory is no longer used"); 1.0 up to 2.11 and in 3.0's
    # ServiceConfiguration, 0 in the newest: with 0 the memory term drops out of the weighted max
    loadBalancerMemoryResourceWeight: float = 0.0
    # 1.0 in older versions; 0 in the newest (direct memory does not reflect the machine's load)
    loadBalancerDirectMemoryResourceWeight: float = 0.0
    loadBalancerBandwithInResourceWeight: float = 1.0
    loadBalancerBandwithOutResourceWeight: float = 1.0
    # MB (MiB) a ThresholdShedder cycle must move at least
    loadBalancerBundleUnloadMinThroughputThreshold: float = 10
    lowerBoundarySheddingEnabled: bool = False

    # -- UniformLoadShedder -------------------------------------------------------------------------
    loadBalancerMsgRateDifferenceShedderThreshold: float = 50
    loadBalancerMsgThroughputMultiplierDifferenceShedderThreshold: float = 4
    # 0.2 since Pulsar 2.11 (#13915); 0.5 before
    maxUnloadPercentage: float = 0.2
    minUnloadMessage: int = 1000
    minUnloadMessageThroughput: int = 1024 * 1024
    maxUnloadBundleNumPerShedding: int = -1

    # -- placement ----------------------------------------------------------------------------------
    loadBalancerBrokerMaxTopics: int = 50000
    loadBalancerDistributeBundlesEvenlyEnabled: bool = True

    # -- bundle split -------------------------------------------------------------------------------
    loadBalancerAutoBundleSplitEnabled: bool = True
    loadBalancerAutoUnloadSplitBundlesEnabled: bool = True
    loadBalancerNamespaceBundleMaxTopics: int = 1000
    loadBalancerNamespaceBundleMaxSessions: int = 1000
    loadBalancerNamespaceBundleMaxMsgRate: int = 30000
    loadBalancerNamespaceBundleMaxBandwidthMbytes: int = 100
    loadBalancerNamespaceMaximumBundles: int = 128
    defaultNumberOfNamespaceBundles: int = 4
    defaultNamespaceBundleSplitAlgorithm: str = "range_equally_divide"
    supportedNamespaceBundleSplitAlgorithms: tuple[str, ...] = field(default=SPLIT_ALGORITHMS)
    flowOrQpsDifferenceThresholdPercentage: int = 10

    # -- extensible load manager (ExtensibleLoadManagerImpl, PIP-192; clusters/loadbalancer/extensible) --
    # TransferShedder: the target standard deviation of the brokers' weightedMaxEMA
    loadBalancerBrokerLoadTargetStd: float = 0.25
    # TransferShedder sheds once its condition held on more than this many consecutive cycles
    loadBalancerSheddingConditionHitCountThreshold: int = 3
    loadBalancerMaxNumberOfBrokerSheddingPerCycle: int = 3
    # a broker that lost bundles is not counted until its load data is this much newer than the unload
    loadBalanceSheddingDelayInSeconds: int = 180
    # broker load data older than this is ignored (OutDatedData)
    loadBalancerBrokerLoadDataTTLInSeconds: int = 1800
    # TransferShedder names the destination (transfer); off: plain unload, placed on the next lookup
    loadBalancerTransferEnabled: bool = True
    # namespaces TransferShedder and TopKBundles leave alone
    loadBalancerSheddingExcludedNamespaces: tuple[str, ...] = ()
    # the channel's in-flight states (Assigning, Releasing, Splitting) older than this are overridden
    loadBalancerInFlightServiceUnitStateWaitingTimeInMillis: int = 30000
    loadBalancerServiceUnitStateMonitorIntervalInSeconds: int = 60
    # semi-terminal states (Free, Deleted) older than this are tombstoned
    loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds: int = 3600
    # SplitScheduler: every broker, on its own bundles' instantaneous stats
    loadBalancerSplitIntervalMinutes: float = 1
    loadBalancerNamespaceBundleSplitConditionHitCountThreshold: int = 3
    loadBalancerMaxNumberOfBundlesToSplitPerCycle: int = 10
    # a transfer keeps the clients connected to the source until the destination owns the bundle (PIP-307)
    loadBalancerMultiPhaseBundleUnload: bool = True
    # where the channel's records live (PIP-378): the system topic (ServiceUnitStateTableViewImpl) or the
    # metadata store, one znode per bundle under /service_unit_state (ServiceUnitStateMetadataStoreTableViewImpl);
    # the short class name is accepted too
    loadManagerServiceUnitStateTableViewClassName: str = SYSTEM_TOPIC_TABLE_VIEW

    def __post_init__(self) -> None:
        if self.defaultNamespaceBundleSplitAlgorithm not in self.supportedNamespaceBundleSplitAlgorithms:
            raise ValueError(f"defaultNamespaceBundleSplitAlgorithm {self.defaultNamespaceBundleSplitAlgorithm!r} "
                             f"is not one of supportedNamespaceBundleSplitAlgorithms "
                             f"{list(self.supportedNamespaceBundleSplitAlgorithms)}")
        unknown = [a for a in self.supportedNamespaceBundleSplitAlgorithms if a not in SPLIT_ALGORITHMS]
        if unknown:
            raise ValueError(f"unknown bundle split algorithm(s) {unknown}; known: {list(SPLIT_ALGORITHMS)}")
        tv = self.loadManagerServiceUnitStateTableViewClassName
        full = next((t for t in TABLE_VIEWS if tv in (t, t.rsplit(".", 1)[1])), None)
        if full is None:
            raise ValueError(f"loadManagerServiceUnitStateTableViewClassName {tv!r} is not one of "
                             f"{[t.rsplit('.', 1)[1] for t in TABLE_VIEWS]} (full or short class name)")
        object.__setattr__(self, "loadManagerServiceUnitStateTableViewClassName", full)
        if not 0 <= self.loadBalancerHistoryResourcePercentage <= 1:
            raise ValueError("loadBalancerHistoryResourcePercentage must be within [0, 1]")
        if (self.loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds * 1000
                < self.loadBalancerInFlightServiceUnitStateWaitingTimeInMillis):
            # ServiceUnitStateChannelImpl's constructor refuses this too
            raise ValueError("loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds (in ms) must be at least "
                             "loadBalancerInFlightServiceUnitStateWaitingTimeInMillis")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "LoadBalancerSettings":
        """Settings from `{pulsarName: value}` (defaults for the rest). ValueError on an unknown
        name (naming the nearest known one) or a value that does not fit the field's type."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        for name, raw in values.items():
            if name not in fields:
                near = difflib.get_close_matches(name, fields, n=1, cutoff=0.0)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ValueError(f"unknown load balancer setting {name!r}{hint}")
            kw[name] = _coerce(name, fields[name].type, raw)
        return cls(**kw)

    @property
    def metadata_store_table_view(self) -> bool:
        """The channel's records are znodes (ServiceUnitStateMetadataStoreTableViewImpl)."""
        return self.loadManagerServiceUnitStateTableViewClassName == METADATA_STORE_TABLE_VIEW

    def as_dict(self) -> dict[str, Any]:
        """`{pulsarName: value}` of every setting (lists as lists), JSON-ready."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    def replace(self, **changes: Any) -> "LoadBalancerSettings":
        """A copy with some settings changed (through from_mapping's checks and coercion)."""
        merged = self.as_dict()
        merged.update(changes)
        return type(self).from_mapping(merged)


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _coerce(name: str, typ: Any, raw: Any) -> Any:
    """`raw` as the field's type (annotations are strings under `from __future__ import annotations`)."""
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if t == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
                return raw.strip().lower() in _TRUE
            if isinstance(raw, int) and raw in (0, 1):
                return bool(raw)
            raise ValueError
        if t == "int":
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, float):
                if not raw.is_integer():
                    raise ValueError
                return int(raw)
            return int(str(raw).strip()) if isinstance(raw, str) else int(raw)
        if t == "float":
            if isinstance(raw, bool):
                raise ValueError
            return float(raw.strip()) if isinstance(raw, str) else float(raw)
        if t == "str":
            if not isinstance(raw, str):
                raise ValueError
            return raw.strip()
        if t.startswith("tuple"):
            items = raw.split(",") if isinstance(raw, str) else list(raw)
            return tuple(str(i).strip() for i in items if str(i).strip())
    except (TypeError, ValueError):
        pass
    else:
        raise ValueError(f"load balancer setting {name!r} has an unsupported type {t}")
    raise ValueError(f"load balancer setting {name!r} expects {t}, got {raw!r}")
