"""The leader's ownership monitor (ServiceUnitStateChannelImpl.monitorOwnerships and doCleanup), pure.

`monitor_ownerships(view, now_ms, active_brokers, metadata_state, settings)` looks at every record,
as the channel owner does every loadBalancerServiceUnitStateMonitorIntervalInSeconds, and only while
its metadata session is Stable:
- Owned whose dstBroker is not an active broker, and in-flight records whose sourceBroker or
  dstBroker (the non-blank ones) is not active: that broker is inactive and all its service units are
  cleaned up (`cleanup_targets`);
- other in-flight records older than loadBalancerInFlightServiceUnitStateWaitingTimeInMillis
  (`now_ms - timestamp >` the wait): orphans, overridden;
- Free, Deleted (not active) older than loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds:
  tombstoned.
The caller selects a broker for each override (LeastResourceUsageWithWeight, excluding the inactive
brokers) and publishes `override_ownership(key, orphan, selected, graceful, now_ms)`.

`broker_deletion_cleanup_delay_ms(state)`: when the leader cleans up after a broker's registration
disappeared: at once (Stable), after MAX_CLEAN_UP_DELAY_TIME_IN_SECS (Jittery), never (Unstable).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable

from clusters.loadbalancer.data import is_system_service_namespace, namespace_of
from clusters.loadbalancer.extensible.state import (S, ChannelView, ServiceUnitStateData, is_active, is_blank,
                                                    is_in_flight, next_version_id)
from clusters.loadbalancer.settings import LoadBalancerSettings

MAX_CLEAN_UP_DELAY_TIME_IN_SECS = 180


class MetadataState(str, enum.Enum):
    Stable = "Stable"
    Jittery = "Jittery"
    Unstable = "Unstable"


def broker_deletion_cleanup_delay_ms(state: MetadataState) -> int | None:
    """handleBrokerDeletionEvent's delay; None: the cleanup is skipped (Unstable)."""
    return {MetadataState.Stable: 0, MetadataState.Jittery: MAX_CLEAN_UP_DELAY_TIME_IN_SECS * 1000,
            MetadataState.Unstable: None}[state]


def _is_system(key: str) -> bool:
    ns = namespace_of(key)
    return ns.startswith("pulsar/system") or is_system_service_namespace(ns)


def cleanup_targets(view: ChannelView, broker: str) -> list[str]:
    """The service units doCleanup(broker) overrides: dstBroker == broker in an active state, or
    sourceBroker == broker in flight. Non-system bundles first (Pulsar waits for those before the
    system ones), each group sorted."""
    keys = [k for k, d in view.items()
            if (d.dstBroker == broker and is_active(d.state)) or (d.sourceBroker == broker and is_in_flight(d.state))]
    return [k for k in keys if not _is_system(k)] + [k for k in keys if _is_system(k)]


@dataclass
class MonitorDecision:
    skipped: str | None = None                                   # why nothing was looked at
    inactive_brokers: list[str] = field(default_factory=list)
    # (key, orphan record, why: "inactive-broker:<id>" | "in-flight-timeout")
    overrides: list[tuple[str, ServiceUnitStateData, str]] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)


def monitor_ownerships(view: ChannelView, now_ms: int, active_brokers: Iterable[str],
                       metadata_state: MetadataState, settings: LoadBalancerSettings, *,
                       is_channel_owner: bool = True) -> MonitorDecision:
    if not is_channel_owner:
        return MonitorDecision(skipped="not the channel owner")
    if metadata_state != MetadataState.Stable:
        return MonitorDecision(skipped=f"metadata state {metadata_state.value}")
    active = set(active_brokers)
    in_flight_wait = settings.loadBalancerInFlightServiceUnitStateWaitingTimeInMillis
    tombstone_delay = settings.loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds * 1000
    inactive: list[str] = []
    timed_out: list[tuple[str, ServiceUnitStateData, str]] = []
    tombstones: list[str] = []
    for key, d in view.items():
        elapsed = now_ms - d.timestamp
        if d.state == S.Owned:
            if d.dstBroker not in active and d.dstBroker not in inactive:
                inactive.append(d.dstBroker)
        elif is_in_flight(d.state):
            if not is_blank(d.sourceBroker) and d.sourceBroker not in active:
                if d.sourceBroker not in inactive:
                    inactive.append(d.sourceBroker)
            elif not is_blank(d.dstBroker) and d.dstBroker not in active:
                if d.dstBroker not in inactive:
                    inactive.append(d.dstBroker)
            elif elapsed > in_flight_wait:
                timed_out.append((key, d, "in-flight-timeout"))
        elif elapsed > tombstone_delay:
            tombstones.append(key)
    decision = MonitorDecision(inactive_brokers=inactive, tombstones=tombstones)
    seen: set[str] = set()
    for b in inactive:
        for key in cleanup_targets(view, b):
            if key not in seen:
                seen.add(key)
                decision.overrides.append((key, view.get(key), f"inactive-broker:{b}"))
    decision.overrides.extend(o for o in timed_out if o[0] not in seen)
    return decision


def override_ownership(key: str, orphan: ServiceUnitStateData, selected: str | None, graceful: bool,
                       now_ms: int) -> ServiceUnitStateData:
    """The forced record that replaces an orphan (overrideOwnership), versionId = orphan's + 1:
    - no broker selected: Free(src = the orphan's owner);
    - Splitting: Splitting(dst = orphan's dst, src = selected, same children) — the selected broker
      finishes the split;
    - Owned: Releasing if graceful (the owner still closes it), else Owned, with dst = selected and
      src = the orphan's dst (unless that is the selected broker);
    - Assigning, Releasing: Owned(dst = selected, src = the orphan's src unless selected)."""
    v = next_version_id(orphan)
    if selected is None:
        owner = orphan.dstBroker if not is_blank(orphan.dstBroker) else orphan.sourceBroker
        return ServiceUnitStateData(S.Free, None, owner, None, True, now_ms, v)
    if orphan.state == S.Splitting:
        return ServiceUnitStateData(S.Splitting, orphan.dstBroker, selected,
                                    dict(orphan.splitServiceUnitToDestBroker or {}), True, now_ms, v)
    if orphan.state == S.Owned:
        src = orphan.dstBroker if orphan.dstBroker != selected else None
        return ServiceUnitStateData(S.Releasing if graceful else S.Owned, selected, src, None, True, now_ms, v)
    src = orphan.sourceBroker if orphan.sourceBroker != selected else None
    return ServiceUnitStateData(S.Owned, selected, src, None, True, now_ms, v)
