"""Node configurations of the reference system, as written to each node's config.json.

One dataclass per role; `clusters.node` reads the file and hands the dataclass to the role's `serve()`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# Pulsar's loadManagerClassName default, the one place it is written: an entry of
# clusters/loadbalancer/manager.py's LOAD_MANAGERS (`--load-manager`)
DEFAULT_LOAD_MANAGER = "modular"


@dataclass(kw_only=True)
class NodeConfig:
    name: str
    role: str
    host: str                      # address the node binds and advertises
    zk: str                        # ZooKeeper connect string, "h1:2181,h2:2181"
    data_dir: str
    bugs: dict[str, Any] = field(default_factory=dict)
    zk_session_timeout: float = 6.0


@dataclass(kw_only=True)
class BookieConfig(NodeConfig):
    role: str = "bookie"
    port: int = 3181
    http_port: int = 8000                   # /metrics and status (BookKeeper's httpServerPort)
    journal_sync_data: bool = True          # BookKeeper's journalSyncData: fsync before ack
    journal_max_group_wait_ms: float = 2.0  # group commit window (journalMaxGroupWaitMSec)
    journal_max_group_bytes: int = 512 * 1024
    flush_interval_ms: int = 1000           # checkpoint: write cache -> entry log + index
    write_cache_mb: int = 64
    read_cache_mb: int = 64
    # BookKeeper's gcWaitTime: every this many ms the bookie drops the ledgers whose metadata is gone
    # (clusters/bookie/gc.py); BookKeeper's default, 10 minutes
    gc_wait_time_ms: int = 600_000
    # auto-recovery (clusters/autorecovery/), run inside the bookie process as with BookKeeper's
    # autoRecoveryDaemonEnabled: an auditor elected among the bookies + a replication worker each
    autorecovery_enabled: bool = True
    lost_bookie_recovery_delay_s: float = 5.0       # lostBookieRecoveryDelay: a bookie gone this long is lost
    audit_interval_s: float = 300.0                 # auditorPeriodicCheckInterval: full audit (0 = off)
    open_ledger_rereplication_grace_s: float = 30.0  # openLedgerRereplicationGracePeriod, then fence
    rereplication_backoff_s: float = 1.0            # rwRereplicateBackoffMs: worker poll / first retry delay

    @property
    def bookie_id(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(kw_only=True)
class BrokerConfig(NodeConfig):
    role: str = "broker"
    port: int = 6650
    http_port: int = 8080
    cluster: str = "standalone"
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    bundles: int = 4                        # defaultNumberOfNamespaceBundles: bundles of a new namespace
    # the load manager (clusters/loadbalancer/manager.py: LOAD_MANAGERS) and its settings, under
    # Pulsar's ServiceConfiguration names (clusters/loadbalancer/settings.py), e.g.
    # {"loadBalancerSheddingIntervalMinutes": 0.1}
    load_manager: str = DEFAULT_LOAD_MANAGER
    load_balancer: dict[str, Any] = field(default_factory=dict)
    # this broker's limits, against which its measured load is a percentage (signals.py)
    cpu_cores: float = 1.0                  # Pulsar: availableProcessors / the cgroup quota
    memory_limit_mb: float = 1024.0         # Pulsar: the JVM's max heap
    nic_speed_gbps: float = 1.0             # the link; the setting loadBalancerOverrideBrokerNicSpeedGbps overrides it
    max_entries_per_ledger: int = 50000
    max_ledger_size_mb: int = 256
    max_ledger_age_s: float = 4 * 3600.0    # managedLedgerMaxLedgerRolloverTimeMinutes (also a timer)
    cache_eviction_s: float = 1.0           # managedLedgerCacheEvictionTimeThresholdMillis: cached entries
                                            # older than this are evicted (0: by size only)
    min_ledger_rollover_s: float = 0.0      # managedLedgerMinLedgerRolloverTimeMinutes (Pulsar: 10 min)
    # autoSkipNonRecoverableData: a read skips an entry of a closed ledger that no bookie of its write
    # set has (all answer NoSuchEntry/NoSuchLedger) instead of retrying it for ever. Pulsar skips to
    # the next ledger; this skips exactly the missing entries. Off as in Pulsar; deployed test
    # clusters turn it on (clusters/deploy/spec.py) so that final reads get past a lost entry.
    auto_skip_non_recoverable_data: bool = False
    # cursors (clusters/broker/managed_ledger.py): managedLedgerDefaultMarkDeleteRateLimit,
    # managedLedgerCursorMaxEntriesPerLedger, managedLedgerCursorRolloverTimeInSeconds,
    # managedLedgerMaxUnackedRangesToPersist(InMetadataStore)
    cursor_mark_delete_rate: float = 1.0    # cursor position writes per second per cursor (0: no limit)
    cursor_max_entries_per_ledger: int = 50000
    cursor_ledger_rollover_s: float = 14400.0
    cursor_max_unacked_ranges: int = 10000
    cursor_max_unacked_ranges_in_zk: int = 1000
    # housekeeping: retentionCheckIntervalInSeconds (Pulsar: 120), messageExpiryCheckIntervalInMinutes (5)
    retention_check_interval_s: float = 60.0
    message_expiry_check_interval_s: float = 60.0
    add_timeout_s: float = 5.0              # BookKeeper addEntryTimeout
    max_message_size: int = 5 * 1024 * 1024
    # consumers (clusters/broker/topic.py): Pulsar's acknowledgmentAtBatchIndexLevelEnabled (off by
    # default there too: a partial batch ack is ignored and the whole batch comes back)
    acknowledgment_at_batch_index_level_enabled: bool = False
    # namespace policy defaults (clusters/broker/policies.py); Pulsar's defaultRetentionTimeInMinutes,
    # defaultRetentionSizeInMB, ttlDurationDefaultInSeconds, brokerDeduplicationEnabled
    default_retention_minutes: int = 0
    default_retention_size_mb: int = 0
    default_message_ttl_s: int = 0
    deduplication_enabled: bool = False
    # Key_Shared AUTO_SPLIT: subscriptionKeySharedUseConsistentHashing (Pulsar's default: true) and
    # subscriptionKeySharedConsistentHashingReplicaPoints; false: the auto-split range selector
    key_shared_use_consistent_hashing: bool = True
    key_shared_consistent_hashing_points: int = 100
    # Failover: activeConsumerFailoverDelayTimeMillis, the pause before a new active consumer is served
    active_consumer_failover_delay_s: float = 1.0
    # schemas (clusters/broker/schema.py): schemaCompatibilityStrategy, the namespaces' default
    schema_compatibility_strategy: str = "FULL"
    # delayed delivery (Shared/Key_Shared): delayedDeliveryEnabled
    delayed_delivery_enabled: bool = True
    # topic compaction (clusters/broker/compaction.py): brokerServiceCompactionThresholdInBytes (the
    # namespaces' default, 0: never by threshold) and brokerServiceCompactionMonitorIntervalInSeconds
    compaction_threshold: int = 0
    compaction_monitor_interval_s: float = 60.0
    # non-persistent:// topics (clusters/broker/nonpersistent.py): enableNonPersistentTopics; false
    # refuses their producers and consumers with NotAllowedError
    enable_non_persistent_topics: bool = True

    def __post_init__(self) -> None:
        # the setting under Pulsar's name, when given, is the bundles of a new namespace
        if "defaultNumberOfNamespaceBundles" in self.load_balancer:
            self.bundles = int(self.load_balancer["defaultNumberOfNamespaceBundles"])

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.host}:{self.port}"

    @property
    def web_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


ROLES = {"bookie": BookieConfig, "broker": BrokerConfig}


def to_json(cfg: NodeConfig) -> str:
    return json.dumps(asdict(cfg), indent=2, sort_keys=True)


def write(cfg: NodeConfig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_json(cfg))
    return path


def load(path: Path | str) -> NodeConfig:
    raw = json.loads(Path(path).read_text())
    role = raw.get("role")
    cls = ROLES.get(role)
    if cls is None:
        raise ValueError(f"{path}: unknown role {role!r}; expected one of {sorted(ROLES)}")
    known = {f.name for f in fields(cls)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{path}: unknown settings {sorted(unknown)} for role {role}")
    return cls(**raw)
