"""Namespace policies, stored in ZooKeeper where Pulsar keeps them: `/admin/policies/{tenant}/{namespace}`.

The JSON uses the field names of Pulsar's `Policies` class for the parts we implement:

    {"retention_policies": {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0},
     "message_ttl_in_seconds": null,
     "deduplicationEnabled": null,
     "persistence": {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2},
     "schema_compatibility_strategy": "UNDEFINED", "is_allow_auto_update_schema": true,
     "schema_validation_enforced": false, "compaction_threshold": null}

A missing field (or a missing znode) means the broker's default from its `BrokerConfig`, as in
Pulsar (`defaultRetentionTimeInMinutes`, `ttlDurationDefaultInSeconds`,
`brokerDeduplicationEnabled`, `managedLedgerDefaultEnsembleSize`...). Retention -1 means infinite.

`PolicyCache` is each broker's view: read on first use, refreshed by a ZooKeeper data watch, so
a change made through any broker's admin API reaches the topics served by every broker. The same
class, given another znode path, caches the topic-level overrides (clusters/broker/service.py).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from clusters.config import BrokerConfig
from clusters.metadata.codec import decode_json_object
from clusters.metadata.store import BadVersion, NodeExists

log = logging.getLogger(__name__)

POLICIES_ROOT = "/admin/policies"
# Pulsar's SchemaCompatibilityStrategy values (UNDEFINED in a namespace's policies: the broker's default)
SCHEMA_STRATEGIES = ("ALWAYS_INCOMPATIBLE", "ALWAYS_COMPATIBLE", "BACKWARD", "FORWARD", "FULL",
                     "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE")


def policies_path(namespace: str) -> str:
    """`tenant/namespace` -> its znode."""
    return f"{POLICIES_ROOT}/{namespace}"


class PolicyError(ValueError):
    """A policy document that does not make sense (the admin API answers 400 with this text)."""


@dataclass(frozen=True)
class NamespacePolicies:
    retention_time_minutes: int = 0          # -1: infinite
    retention_size_mb: int = 0               # -1: infinite
    message_ttl_seconds: int = 0             # 0: no TTL
    deduplication: bool = False
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    schema_compatibility_strategy: str = "FULL"     # UNDEFINED in the JSON: the broker's default
    is_allow_auto_update_schema: bool = True
    schema_validation_enforced: bool = False
    compaction_threshold: int = 0            # bytes of backlog that trigger a compaction; 0: never

    @classmethod
    def defaults(cls, cfg: BrokerConfig) -> "NamespacePolicies":
        return cls(retention_time_minutes=cfg.default_retention_minutes,
                   retention_size_mb=cfg.default_retention_size_mb,
                   message_ttl_seconds=cfg.default_message_ttl_s,
                   deduplication=cfg.deduplication_enabled,
                   ensemble=cfg.ensemble, write_quorum=cfg.write_quorum, ack_quorum=cfg.ack_quorum,
                   schema_compatibility_strategy=getattr(cfg, "schema_compatibility_strategy", "FULL"),
                   compaction_threshold=getattr(cfg, "compaction_threshold", 0))

    @classmethod
    def from_json(cls, raw: dict[str, Any], base: "NamespacePolicies") -> "NamespacePolicies":
        """Overlay Pulsar-shaped JSON on `base` (the broker defaults); PolicyError on bad shapes."""
        if not isinstance(raw, dict):
            raise PolicyError("policies must be a JSON object")
        kw: dict[str, Any] = {}
        ret = raw.get("retention_policies")
        if ret is not None:
            if not isinstance(ret, dict):
                raise PolicyError("retention_policies must be an object")
            kw["retention_time_minutes"] = _int(ret, "retentionTimeInMinutes", base.retention_time_minutes, -1)
            kw["retention_size_mb"] = _int(ret, "retentionSizeInMB", base.retention_size_mb, -1)
        if raw.get("message_ttl_in_seconds") is not None:
            kw["message_ttl_seconds"] = _int(raw, "message_ttl_in_seconds", 0, 0)
        if raw.get("deduplicationEnabled") is not None:
            if not isinstance(raw["deduplicationEnabled"], bool):
                raise PolicyError("deduplicationEnabled must be true or false")
            kw["deduplication"] = raw["deduplicationEnabled"]
        per = raw.get("persistence")
        if per is not None:
            if not isinstance(per, dict):
                raise PolicyError("persistence must be an object")
            e = _int(per, "bookkeeperEnsemble", base.ensemble, 1)
            w = _int(per, "bookkeeperWriteQuorum", base.write_quorum, 1)
            a = _int(per, "bookkeeperAckQuorum", base.ack_quorum, 1)
            if not e >= w >= a:
                raise PolicyError(f"persistence needs bookkeeperEnsemble >= bookkeeperWriteQuorum >= "
                                  f"bookkeeperAckQuorum, got {e}/{w}/{a}")
            kw.update(ensemble=e, write_quorum=w, ack_quorum=a)
        strategy = raw.get("schema_compatibility_strategy")
        if strategy is not None and strategy != "UNDEFINED":
            if strategy not in SCHEMA_STRATEGIES:
                raise PolicyError(f"schema_compatibility_strategy must be one of UNDEFINED, "
                                  f"{', '.join(SCHEMA_STRATEGIES)}; got {json.dumps(strategy)[:40]}")
            kw["schema_compatibility_strategy"] = strategy
        for key in ("is_allow_auto_update_schema", "schema_validation_enforced"):
            if raw.get(key) is not None:
                if not isinstance(raw[key], bool):
                    raise PolicyError(f"{key} must be true or false")
                kw[key] = raw[key]
        if raw.get("compaction_threshold") is not None:
            kw["compaction_threshold"] = _int(raw, "compaction_threshold", 0, 0)
        return cls(**{**base.__dict__, **kw})

    def to_json(self) -> dict[str, Any]:
        return {"retention_policies": {"retentionTimeInMinutes": self.retention_time_minutes,
                                       "retentionSizeInMB": self.retention_size_mb},
                "message_ttl_in_seconds": self.message_ttl_seconds,
                "deduplicationEnabled": self.deduplication,
                "persistence": {"bookkeeperEnsemble": self.ensemble,
                                "bookkeeperWriteQuorum": self.write_quorum,
                                "bookkeeperAckQuorum": self.ack_quorum},
                "schema_compatibility_strategy": self.schema_compatibility_strategy,
                "is_allow_auto_update_schema": self.is_allow_auto_update_schema,
                "schema_validation_enforced": self.schema_validation_enforced,
                "compaction_threshold": self.compaction_threshold}


def _int(d: dict[str, Any], key: str, default: int, minimum: int) -> int:
    v = d.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise PolicyError(f"{key} must be an integer, got {json.dumps(v)[:40]}")
    if v < minimum:
        raise PolicyError(f"{key} must be >= {minimum}, got {v}")
    return v


class PolicyCache:
    """A broker's view of policy znodes: `await get(key)`, `await update(key, raw_json)`.

    `path(key)` names the znode of a key: by default a namespace's (`tenant/ns` ->
    `/admin/policies/tenant/ns`); the broker keeps a second cache, keyed by topic, for the
    topic-level overrides."""

    def __init__(self, store: Any, cfg: BrokerConfig, path: Callable[[str], str] = policies_path):
        self.store = store
        self.path = path
        self.base = NamespacePolicies.defaults(cfg)
        self._raw: dict[str, dict[str, Any]] = {}       # key -> stored JSON ({} when none)
        self._listeners: list[Any] = []

    def on_change(self, fn: Any) -> None:
        """fn(key, NamespacePolicies) after a change (topics re-apply their policies)."""
        self._listeners.append(fn)

    async def raw(self, key: str) -> dict[str, Any]:
        """The stored JSON of `key` ({} when none), read once and then kept current by a watch."""
        if key not in self._raw:
            got = await self.store.get_or_none(self.path(key))
            self._raw[key] = decode_json_object(got[0] if got else b"")
            self._watch(key)
        return self._raw[key]

    async def get(self, key: str) -> NamespacePolicies:
        try:
            return NamespacePolicies.from_json(await self.raw(key), self.base)
        except PolicyError:
            log.warning("bad policies for %s in ZooKeeper; using defaults", key)
            return self.base

    def cached(self, key: str) -> NamespacePolicies:
        """Without waiting: the last known policies (defaults before the first read)."""
        try:
            return NamespacePolicies.from_json(self._raw.get(key, {}), self.base)
        except PolicyError:
            return self.base

    async def update(self, key: str, patch: dict[str, Any]) -> NamespacePolicies:
        """Merge `patch` (Pulsar-shaped keys; a key set to None removes it) into the stored policies."""
        path = self.path(key)
        for _ in range(10):
            got = await self.store.get_or_none(path)
            current = decode_json_object(got[0] if got else b"")
            merged = {**current, **patch}
            merged = {k: v for k, v in merged.items() if v is not None}
            result = NamespacePolicies.from_json(merged, self.base)   # validate before writing
            data = json.dumps(merged, sort_keys=True).encode()
            try:
                if got is None:
                    await self.store.ensure_path(path.rsplit("/", 1)[0])
                    await self.store.create(path, data)
                else:
                    await self.store.set(path, data, version=got[1])
            except (NodeExists, BadVersion):     # lost a race: read again
                continue
            self._raw[key] = merged
            self._fire(key)
            return result
        raise RuntimeError(f"could not update {path}: too many concurrent writers")

    def _watch(self, key: str) -> None:
        def on_data(data: bytes | None) -> None:
            new = decode_json_object(data or b"")
            if self._raw.get(key) != new:
                self._raw[key] = new
                self._fire(key)
        try:
            self.store.watch_data(self.path(key), on_data)
        except Exception:
            log.debug("no data watch on %s", self.path(key), exc_info=True)

    def _fire(self, key: str) -> None:
        pol = self.cached(key)
        for fn in self._listeners:
            try:
                fn(key, pol)
            except Exception:
                log.warning("policy listener failed", exc_info=True)
