"""What a broker does with the channel (ServiceUnitStateChannelImpl), as pure functions.

- `handle_event(key, previous, new, me, view=..., multi_phase=...)`: the actions for a message the
  view ACCEPTED (`handleEvent`), run by every broker on every message:
  * Assigning: the destination publishes Owned(dst, src, v+1);
  * Owned: lookups complete with dst; the destination has the bundle (`BundleOwned`); the source of
    a transfer (multi-phase unload) or of a forced override closes it, disconnecting its clients;
  * Releasing at the source: close (a multi-phase transfer keeps the clients connected), then
    Assigning(dst=B, src, v+1) for a transfer, Free(src, v+1) for a plain unload;
  * Splitting at the source: Owned(dst=src, v=1) for each child not in the table yet, then the caller
    updates the namespace's boundaries
    (`UpdateNamespaceBundles`), then Deleted(src, v+1) for the parent;
  * Free: lookups complete empty; with force, the source closes and tombstones;
  * Deleted: lookups fail; the record stays (Pulsar's newest handleDeleteEvent: the leader's monitor
    tombstones it after loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds, so a late message of
    the split parent meets Deleted and its version and is rejected). With `tombstone_deleted` (the bug
    knob lb.tombstone_split_parent, the 3.0-era handler of apache/pulsar#19490) the source tombstones the
    parent at once: the bundle is Init again, which accepts anything (compaction may have dropped
    history), so a transfer step that raced the split re-owns the split parent;
  * a tombstone (Init): lookups complete empty.
  The actions are returned in the order the broker performs them.
- `handle_existing(key, data, me)`: what a (re)starting broker does with the records it finds when it
  has read the channel's history (handleExisting): an Owned(dst=me) is its bundle; an Assigning(dst=me)
  is completed with Owned (apache/pulsar#25379's fix; with `ignore_assigning`, the bug knob
  lb.ignore_existing_assigning, it is ignored and the bundle stays Assigning until the leader's
  ownership monitor overrides it).
- `handle_skipped(key, current)`: a REJECTED message completes pending lookups with the current owner.
- `get_owner(view, key, me, registered)`: getOwnerAsync's answer.
- `assign_event`, `unload_event`, `split_event`: the records the publishers write (versionId =
  previous + 1); a transfer to the current owner is refused (`TransferToSameBrokerError`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Union

from clusters.loadbalancer.extensible.state import (S, ChannelView, ServiceUnitStateData, is_blank, next_version_id,
                                                    state_of)


# -- actions -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Publish:
    key: str
    data: ServiceUnitStateData


@dataclass(frozen=True)
class Tombstone:
    key: str


@dataclass(frozen=True)
class CloseServiceUnit:
    key: str
    disconnect_clients: bool


@dataclass(frozen=True)
class CompleteLookups:
    key: str
    owner: str | None          # None: no owner, the caller assigns


@dataclass(frozen=True)
class FailLookups:
    key: str
    reason: str


@dataclass(frozen=True)
class BundleOwned:
    """This broker now owns `key` (onNamespaceBundleOwned)."""
    key: str


@dataclass(frozen=True)
class UpdateNamespaceBundles:
    """Split step: replace `parent` by `children` (full bundle names) in the namespace's boundaries
    (LocalPolicies, compare-and-set); the caller does it before publishing the parent's Deleted."""
    parent: str
    children: tuple[str, ...]


Action = Union[Publish, Tombstone, CloseServiceUnit, CompleteLookups, FailLookups, BundleOwned,
               UpdateNamespaceBundles]


def child_key(parent: str, child_range: str) -> str:
    """`t/ns/0x00000000_0xffffffff` + `0x00000000_0x7fffffff` -> `t/ns/0x00000000_0x7fffffff`."""
    return f"{parent.rsplit('/', 1)[0]}/{child_range}"


def is_transfer(data: ServiceUnitStateData) -> bool:
    return not is_blank(data.dstBroker) and not is_blank(data.sourceBroker) and data.dstBroker != data.sourceBroker


def handle_event(key: str, previous: ServiceUnitStateData | None, new: ServiceUnitStateData | None, me: str, *,
                 view: ChannelView | None = None, multi_phase: bool = True, now_ms: int = 0,
                 tombstone_deleted: bool = False) -> list[Action]:
    """The actions broker `me` takes for an accepted message (`new` None: a tombstone). `view` (the
    table after the message) tells which split children exist already; `now_ms` stamps what `me`
    publishes. `previous` is the record before the message (kept for the caller's logs; the
    handlers of Pulsar look only at the new record)."""
    del previous
    st = state_of(new)
    if new is None:
        return [CompleteLookups(key, None)]
    dst, src = new.dstBroker, new.sourceBroker
    out: list[Action] = []
    if st == S.Assigning:
        if dst == me:
            out.append(Publish(key, ServiceUnitStateData(S.Owned, dst, src, None, False, now_ms,
                                                         next_version_id(new))))
    elif st == S.Owned:
        out.append(CompleteLookups(key, dst))
        if dst == me:
            out.append(BundleOwned(key))
        elif src == me and (new.force or (multi_phase and is_transfer(new))):
            out.append(CloseServiceUnit(key, True))
    elif st == S.Releasing:
        if src == me:
            if not is_blank(dst):
                out.append(CloseServiceUnit(key, not multi_phase))
                out.append(Publish(key, ServiceUnitStateData(S.Assigning, dst, src, None, False, now_ms,
                                                             next_version_id(new))))
            else:
                out.append(CloseServiceUnit(key, True))
                out.append(Publish(key, ServiceUnitStateData(S.Free, None, src, None, False, now_ms,
                                                             next_version_id(new))))
    elif st == S.Splitting:
        if src == me:
            children = []
            for rng in sorted(new.splitServiceUnitToDestBroker or {}):
                child = child_key(key, rng)
                children.append(child)
                if view is None or child not in view:
                    # the children stay on the parent's owner (the map's destinations are not used)
                    out.append(Publish(child, ServiceUnitStateData(S.Owned, src, None, None, False, now_ms, 1)))
            out.append(UpdateNamespaceBundles(key, tuple(children)))
            out.append(Publish(key, ServiceUnitStateData(S.Deleted, dst, src, None, False, now_ms,
                                                         next_version_id(new))))
    elif st == S.Free:
        out.append(CompleteLookups(key, None))
        if new.force and src == me:
            out.append(CloseServiceUnit(key, True))
            out.append(Tombstone(key))
    elif st == S.Deleted:
        out.append(FailLookups(key, f"{key} is deleted (split)"))
        if tombstone_deleted and src == me:
            out.append(Tombstone(key))
    return out


def handle_existing(key: str, data: ServiceUnitStateData, me: str, *, now_ms: int = 0,
                    ignore_assigning: bool = False) -> list[Action]:
    """The actions of a broker that has just read the channel's history, for one record it found
    (ServiceUnitStateChannelImpl.handleExisting): Owned(dst=me) -> `BundleOwned`; Assigning(dst=me) ->
    Publish Owned(dst=me, src, v+1), as if the message had come now (apache/pulsar#25379: before it, a
    restarted broker skipped it and the bundle stayed Assigning until the ownership monitor's override;
    `ignore_assigning` restores that). Anything else: nothing."""
    if data.state == S.Owned and data.dstBroker == me:
        return [BundleOwned(key)]
    if data.state == S.Assigning and data.dstBroker == me and not ignore_assigning:
        return [Publish(key, ServiceUnitStateData(S.Owned, me, data.sourceBroker, None, False, now_ms,
                                                  next_version_id(data)))]
    return []


def handle_skipped(key: str, current: ServiceUnitStateData | None) -> list[Action]:
    """A message the resolver rejected: pending lookups complete with the current Owned owner
    (apache/pulsar#20677); nothing if the bundle is not Owned."""
    if current is not None and current.state == S.Owned:
        return [CompleteLookups(key, current.dstBroker)]
    return []


# -- lookups ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OwnerAnswer:
    """getOwnerAsync: `owner` (a broker), `wait` (for Owned, up to the in-flight waiting time),
    `none` (no owner: the caller selects a broker and assigns) or `error`."""
    kind: str
    broker: str | None = None
    reason: str = ""


def get_owner(view: ChannelView, key: str, me: str, registered: Iterable[str]) -> OwnerAnswer:
    data = view.get(key)
    st = state_of(data)
    if data is None or st in (S.Init, S.Free):
        return OwnerAnswer("none")
    if st == S.Owned:
        if data.dstBroker in set(registered):
            return OwnerAnswer("owner", data.dstBroker)
        return OwnerAnswer("wait", data.dstBroker, "owner not registered (deferred)")
    if st == S.Splitting:
        return OwnerAnswer("owner", data.sourceBroker)
    if st in (S.Assigning, S.Releasing):
        if data.dstBroker == me:
            return OwnerAnswer("wait", me, "this broker is the destination")
        if is_blank(data.dstBroker):
            return OwnerAnswer("none")
        return OwnerAnswer("owner", data.dstBroker)
    return OwnerAnswer("error", None, f"{key} is deleted")


# -- events --------------------------------------------------------------------------------------------

class TransferToSameBrokerError(ValueError):
    pass


def assign_event(view: ChannelView, key: str, broker: str, now_ms: int) -> ServiceUnitStateData:
    """publishAssignEventAsync: Assigning(dst=broker, v=prev+1)."""
    return ServiceUnitStateData(S.Assigning, broker, None, None, False, now_ms, next_version_id(view.get(key)))


def unload_event(view: ChannelView, key: str, source: str, destination: str | None = None, *,
                 force: bool = False, now_ms: int) -> ServiceUnitStateData:
    """publishUnloadEventAsync: Releasing(dst=destination (a transfer) or None, src=source, v=prev+1)."""
    cur = view.get(key)
    owner = cur.dstBroker if cur is not None and cur.state == S.Owned else None
    if destination is not None and destination in (source, owner):
        raise TransferToSameBrokerError(f"bundle {key} cannot be transfer to same broker {destination} "
                                        f"(its current owner); name another destination broker or none")
    return ServiceUnitStateData(S.Releasing, destination, source, None, force, now_ms,
                                next_version_id(view.get(key)))


def split_event(view: ChannelView, key: str, source: str, children: Mapping[str, str | None],
                now_ms: int) -> ServiceUnitStateData:
    """publishSplitEventAsync: Splitting(src=source, child range -> destination or None, v=prev+1)."""
    if len(children) < 2:
        raise ValueError(f"a split of {key} needs at least two child ranges, got {sorted(children)}")
    return ServiceUnitStateData(S.Splitting, None, source, dict(children), False, now_ms,
                                next_version_id(view.get(key)))
