"""The leader's ownership monitor (ServiceUnitStateChannelImpl.monitorOwnerships and doCleanup), pure.

`monitor_ownerships(view, now_ms, active_brokers, metadata_state, settings)` looks at every record,
as the channel owner does every loadBalancerServiceUnitStateMonitorIntervalInSeconds, and only while
its metadata session is Stable:
- an Owned record whose dstBroker, or an in-flight record whose sourceBroker or dstBroker (the non-blank
  ones), is not an active broker: that broker is inactive and all its service units are cleaned up
  (`cleanup_targets`, overridden by `override_ownership`);
- other in-flight records older than loadBalancerInFlightServiceUnitStateWaitingTimeInMillis
  (`now_ms - timestamp >` the wait): orphans, overridden by `override_in_flight` (only in a run that
  found no inactive broker);
- Free, Deleted (not active) older than loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds:
  tombstoned.
The caller selects a broker for each override (LeastResourceUsageWithWeight without the broker
`excluded_for_override` names); `plan_overrides` does the whole step with a `select` callback.

`broker_deletion_cleanup_delay_ms(state)`: when the leader cleans up after a broker's registration
disappeared: at once (Stable), after MAX_CLEAN_UP_DELAY_TIME_IN_SECS (Jittery), never (Unstable).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable

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
    # the matching keys, sorted (the same list as filtering the sorted items, without sorting every record)
    keys = sorted(k for k, d in view.data.items()
                  if (d.dstBroker == broker and is_active(d.state)) or (d.sourceBroker == broker and is_in_flight(d.state)))
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
    """One run of the monitor. Per record, the first rule that applies:
    1. an Owned record whose dstBroker, or an in-flight record whose non-blank sourceBroker or
       dstBroker, is not an active broker: each such broker is inactive;
    2. an in-flight record older than the waiting time: an orphan;
    3. a record not active (Free, Deleted) older than the tombstone delay: a tombstone.
    If any broker is inactive, the overrides are its `cleanup_targets` (the leader cleans up at once
    while Stable) and the in-flight orphans wait for a later run, as in Pulsar; otherwise the
    overrides are the orphans."""
    if not is_channel_owner:
        return MonitorDecision(skipped="not the channel owner")
    active = set(active_brokers)
    if not active:
        return MonitorDecision(skipped="no active brokers")
    if metadata_state != MetadataState.Stable:
        return MonitorDecision(skipped=f"metadata state {metadata_state.value}")
    in_flight_wait = settings.loadBalancerInFlightServiceUnitStateWaitingTimeInMillis
    tombstone_delay = settings.loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds * 1000
    inactive: list[str] = []
    timed_out: list[tuple[str, ServiceUnitStateData, str]] = []
    tombstones: list[str] = []
    for key, d in view.items():
        elapsed = now_ms - d.timestamp
        if is_active(d.state):
            # the inactive brokers the record depends on: an Owned record's owner (its dstBroker; the source
            # of a finished transfer no longer matters, and flagging it on every run would block the
            # in-flight overrides while it stays dead), both brokers of an in-flight record (Pulsar's
            # newest monitorOwnerships); every one of them, so a dead source never hides a dead owner
            named = (d.dstBroker,) if d.state == S.Owned else (d.sourceBroker, d.dstBroker)
            gone = [b for b in named if not is_blank(b) and b not in active]
            for b in gone:
                if b not in inactive:
                    inactive.append(b)
            if gone:
                continue
        if is_in_flight(d.state):
            if elapsed > in_flight_wait:
                timed_out.append((key, d, IN_FLIGHT_TIMEOUT))
            continue
        if not is_active(d.state) and elapsed > tombstone_delay:
            tombstones.append(key)
    decision = MonitorDecision(inactive_brokers=inactive, tombstones=tombstones)
    seen: set[str] = set()
    for b in inactive:
        for key in cleanup_targets(view, b):
            if key not in seen:
                seen.add(key)
                decision.overrides.append((key, view.get(key), INACTIVE_BROKER + b))
    if not inactive:
        decision.overrides.extend(timed_out)
    return decision


IN_FLIGHT_TIMEOUT = "in-flight-timeout"
INACTIVE_BROKER = "inactive-broker:"


def override_in_flight(key: str, orphan: ServiceUnitStateData, selected: str | None,
                       available_brokers: Iterable[str], now_ms: int) -> ServiceUnitStateData | None:
    """The forced record for an in-flight record that timed out (getOverrideInFlightStateData),
    versionId = orphan's + 1; None when it needs a broker and none was selected (retried later):
    - Assigning: rolled forward, Owned(dst = selected), `selected` chosen without the orphan's dst;
    - Splitting: the same Splitting again (its source retries the split);
    - Releasing: rolled back to Owned(dst = src) if the source is available, else rolled forward to
      Owned(dst = selected), `selected` chosen without the orphan's src."""
    v = next_version_id(orphan)
    if orphan.state == S.Splitting:
        return ServiceUnitStateData(S.Splitting, orphan.dstBroker, orphan.sourceBroker,
                                    dict(orphan.splitServiceUnitToDestBroker or {}), True, now_ms, v)
    if orphan.state == S.Releasing and orphan.sourceBroker in set(available_brokers):
        return ServiceUnitStateData(S.Owned, orphan.sourceBroker, None, None, True, now_ms, v)
    if orphan.state in (S.Assigning, S.Releasing):
        return None if selected is None else ServiceUnitStateData(S.Owned, selected, None, None, True, now_ms, v)
    raise ValueError(f"{key}: {orphan.state.value} is not an in-flight state")


def excluded_for_override(orphan: ServiceUnitStateData, why: str) -> set[str]:
    """The brokers the caller's selection must leave out for an override of `orphan` flagged `why`
    by the monitor: the inactive broker, or the broker an in-flight record was stuck on."""
    if why.startswith(INACTIVE_BROKER):
        return {why[len(INACTIVE_BROKER):]}
    stuck = orphan.dstBroker if orphan.state == S.Assigning else orphan.sourceBroker
    return set() if is_blank(stuck) else {stuck}


def plan_overrides(decision: MonitorDecision, select: Callable[[str, set[str]], str | None],
                   available_brokers: Iterable[str], now_ms: int,
                   graceful: bool = False) -> list[tuple[str, ServiceUnitStateData]]:
    """The records to publish for `decision.overrides`; `select(key, excluded)` picks a broker
    (e.g. load_data.select_broker over the active brokers minus `excluded`)."""
    avail = set(available_brokers)
    out: list[tuple[str, ServiceUnitStateData]] = []
    for key, orphan, why in decision.overrides:
        selected = select(key, excluded_for_override(orphan, why))
        if why.startswith(INACTIVE_BROKER):
            out.append((key, override_ownership(key, orphan, selected, graceful, now_ms)))
        else:
            rec = override_in_flight(key, orphan, selected, avail, now_ms)
            if rec is not None:
                out.append((key, rec))
    return out


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
