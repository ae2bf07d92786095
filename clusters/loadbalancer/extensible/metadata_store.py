"""The channel's second store (PIP-378, Pulsar's ServiceUnitStateMetadataStoreTableViewImpl over
MetadataStoreTableViewImpl), as pure functions: what the I/O wrapper (clusters/loadbalancer/
metadata_table_view.py) decides.

- Layout: one znode per bundle, `/service_unit_state/<tenant>/<namespace>/0xLLLLLLLL_0xUUUUUUUU`, whose
  value is the record's JSON (state.py's `ServiceUnitStateData.encode`, as on the topic); a tombstone
  deletes the znode.
- A write (`put`) reads the znode, runs the conflict resolver with the metadata store's rules
  (`resolve_put`: StorageType.MetadataStore: no version gap, a first record at versionId 1, the
  metadata-store transition table) against what the store holds, and writes at the version read (a
  compare-and-set); a rejection or a lost compare-and-set is a conflict, swallowed (the writer's event
  is simply not applied; apache/pulsar#24186: no retry with a fresh read).
- Reads: the table is fed by the store's notifications (a changed znode is read and replaces the cached
  record, `ChannelView.replace`: no resolver on reads) and by a fill of every znode at start; a
  notification that changes nothing runs no handler.
- The metadata session (apache/pulsar#24478, `session_lost_invalidations`): ZooKeeper delivers no
  notification for what changed while a session was lost, so on SessionLost the table's records are
  untrusted: the bundles this broker owns by them stop being its own (their service units close) and
  the records are dropped; on SessionReestablished every znode is read again (a fill, its records
  handled as existing ones). Without that (the bug knob lb.metadata_table_view_stale_cache, the table
  view before #24478) the records of before the loss stay, and every change made meanwhile is missed
  until its znode changes again: a broker whose bundle the leader moved while its session was lost
  still owns it by its table and serves it beside the new owner.
"""
from __future__ import annotations

from clusters.loadbalancer.extensible.state import (S, ChannelView, ServiceUnitStateData, StorageType,
                                                    resolve)

PATH_PREFIX = "/service_unit_state"
KEY_DEPTH = 3          # tenant / namespace / range


def path_of(key: str) -> str:
    """The znode of a bundle's record (`t/ns/0x.._0x..`)."""
    return f"{PATH_PREFIX}/{key}"


def key_of(path: str) -> str | None:
    """The bundle of a record's znode, None for any other path (a directory, another tree)."""
    if not path.startswith(PATH_PREFIX + "/"):
        return None
    rest = path[len(PATH_PREFIX) + 1:]
    parts = rest.split("/")
    if len(parts) != KEY_DEPTH or not all(parts):
        return None
    rng = parts[2].split("_")
    if len(rng) != 2 or not all(r.startswith("0x") and len(r) == 10 for r in rng):
        return None
    return rest


def resolve_put(current: ServiceUnitStateData | None, new: ServiceUnitStateData | None, *,
                check_version: bool = True) -> str | None:
    """Why a write of `new` over the store's `current` is a conflict (None: it is written): the
    resolver with the metadata store's rules (a tombstone is always accepted)."""
    return resolve(current, new, StorageType.MetadataStore, check_version=check_version)


def owns_by_record(data: ServiceUnitStateData | None, me: str) -> bool:
    """The record makes `me` the bundle's owner (ServiceUnitStateTableViewBase.updateOwnedServiceUnits):
    Owned(dst=me), or Splitting(src=me)."""
    if data is None:
        return False
    return ((data.state == S.Owned and data.dstBroker == me)
            or (data.state == S.Splitting and data.sourceBroker == me))


def session_lost_invalidations(view: ChannelView, me: str) -> list[str]:
    """SessionLost with #24478's handling: the keys of the bundles `me` owned by its (now untrusted)
    records, whose service units it closes; the caller drops every record (`view.clear()`)."""
    return [k for k, d in view.items() if owns_by_record(d, me)]


__all__ = ["KEY_DEPTH", "PATH_PREFIX", "key_of", "owns_by_record", "path_of", "resolve_put",
           "session_lost_invalidations"]
