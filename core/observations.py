"""What observers record: rows of the history that say what the harness *saw* in the cluster (bundle
locks, boundaries, the load-balancer leader), not ops it performed; and how to read their values back.

An observer journals into `journals/<name>.jsonl` like any process; its rows carry process
`OBSERVER_PROCESS` (-2) and type `ok`, with no invoke: an observation is one instant, the local
monotonic time at which the observer learnt it (the same clock as every other op). The f names:

- `observe-start` {"zk_connect", "roots", "nodes": {node name: host}, "ports": {"host:port": node name},
  "session_timeout_s"}: the observer is watching from now on (the snapshot follows as `present` rows).
- `observe-gap-start` {"reason", "detected_s", "may_start_s"}: from `may_start_s` (run seconds, a
  conservative lower bound: the observer learns of a dead connection late) the observer may miss or
  mis-time changes, until the next `observe-gap-end` {"session"} (written once a full re-read ended).
- `observe-stop` {"events", "reason"}: watching ended; nothing after it is observed.
- `bundle-owner` key = the bundle `<tenant>/<ns>/0xLLLLLLLL_0xUUUUUUUU`: who owns it, whatever keeps
  ownership (the load manager's source, harness/observers.py); {"event": present | created | changed |
  deleted, "source": "zk-lock" (the modular load manager's ZooKeeper lock) | "channel" (the extensible
  one's service-unit state channel), "namespace", "range": [lower, upper] (the name's two numbers; the
  bundle covers [lower, upper), the last one [lower, 0xffffffff]), "broker" (the owner), "incarnation"
  (one ownership of the bundle by one broker: the lock's czxid; the channel record's versionId that
  made it), "session" (the owner's ZooKeeper session keeping it, hex; null on the channel), and the
  source's own fields}; `deleted`: nobody owns it now. A `zk-lock` row adds the lock's path ("path"),
  "czxid", "mzxid", "version", "session" (ephemeralOwner, hex), "ctime_ms", "mtime_ms"
  (ZooKeeper's wall clock), "wall_ms" (the observer's wall clock when it read this: wall_ms - mtime_ms
  is how late it learnt of the change, on one machine), "zxid" (the client's last zxid when it read
  this), "data" (the value, text, capped).
  `present`: found by a (re-)read of the whole tree, so it existed at some unknown time before.
  `deleted`: gone; a deletion found by a re-read after a gap happened somewhere in the gap.
- `bundle-lock`, key = the lock's path: the same fields without source, incarnation and path; what runs
  recorded before `bundle-owner` rows (still read).
- `boundaries` key = `/admin/local-policies/<tenant>/<ns>`; {"event", "namespace", "boundaries": [ints]
  or null when the value holds none, "num_bundles", "czxid", "mzxid", "version", "zxid", "data"}.
- `broker-registration` key = `/loadbalance/brokers/<brokerId>` (ephemeral: the broker's live ZooKeeper
  session); {"event": present | created | deleted, "broker" (the znode's name), "czxid", "session",
  "ctime_ms", "wall_ms", "zxid"}; its value (the load report, rewritten often) is not read.
- `lb-leader` key = `/loadbalance/leader` (the modular load manager's leader; the extensible one's
  channel recorders do not watch its leader znode); {"event", "broker", "czxid", "mzxid", "session",
  "zxid", "data"}.
- `lb-event` key = the bundle `<tenant>/<ns>/0x..._0x...`: a decision a broker logged (an unload, a
  split) in the shape `LB_EVENT_FIELDS` documents; see docs/architecture.md.
- `channel-message` key = the bundle: one message of the extensible load manager's service-unit state
  channel (`CHANNEL_TOPIC`), in the topic's order; {"message_id": [ledger, entry, batch index],
  "publish_ms" (the publishing broker's wall clock), "wall_ms" (the observer's wall clock when it read
  it), "value": the record's JSON (Pulsar's ServiceUnitStateData: state, dstBroker, sourceBroker,
  splitServiceUnitToDestBroker, force, timestamp, versionId) or null for a tombstone (an empty value),
  "undecodable": the text, when the value is neither}. Messages read again after a gap repeat their
  message ids; readers keep the first.
- `channel-view` key = a broker's id (`host:http port`): one sample of that broker's table view
  (`GET /admin/v2/loadbalancer/channel`): {"broker", "leader", "last_applied": [ledger, entry] | null
  (the last channel message applied), "records": {bundle: record JSON}, "wall_ms", "final": true on the
  samples taken after the run} or {"error", "wall_ms"} when it did not answer.
"""
from __future__ import annotations

import json
import zlib
from typing import Any

from core.history import OBSERVER_PROCESS


OBSERVE_START = "observe-start"
GAP_START = "observe-gap-start"
GAP_END = "observe-gap-end"
OBSERVE_STOP = "observe-stop"
BUNDLE_OWNER = "bundle-owner"
BUNDLE_LOCK = "bundle-lock"                         # runs recorded before bundle-owner rows
BOUNDARIES = "boundaries"
LB_LEADER = "lb-leader"
LB_EVENT = "lb-event"
BROKER_REGISTRATION = "broker-registration"
CHANNEL_MESSAGE = "channel-message"
CHANNEL_VIEW = "channel-view"
OBSERVATION_FS = frozenset({OBSERVE_START, GAP_START, GAP_END, OBSERVE_STOP, BUNDLE_OWNER, BUNDLE_LOCK, BOUNDARIES,
                            LB_LEADER, LB_EVENT, BROKER_REGISTRATION, CHANNEL_MESSAGE, CHANNEL_VIEW})

PRESENT, CREATED, CHANGED, DELETED = "present", "created", "changed", "deleted"

NAMESPACE_ROOT = "/namespace"                       # Pulsar's ServiceUnitUtils.OWNER_INFO_ROOT
LOCAL_POLICIES_ROOT = "/admin/local-policies"       # LocalPoliciesResources.LOCAL_POLICIES_ROOT
LB_LEADER_PATH = "/loadbalance/leader"              # the modular load manager's leader election
LB_EXT_LEADER_PATH = "/loadbalance/extension/leader"  # the extensible one's (ExtensibleLoadManagerImpl.ELECTION_ROOT)
LB_LEADER_PATHS = (LB_LEADER_PATH, LB_EXT_LEADER_PATH)  # a cluster runs one load manager: the nemeses' lb-leader
BROKERS_PATH = "/loadbalance/brokers"               # one ephemeral znode per live broker
# the extensible load manager's service-unit state channel (Pulsar's ServiceUnitStateChannelImpl.TOPIC)
CHANNEL_TOPIC = "persistent://pulsar/system/loadbalancer-service-unit-state"
FULL_LOWER = 0x00000000
FULL_UPPER = 0xFFFFFFFF

# The event a broker logs for each load-balancer decision (one JSON object per line, after the marker
# `LB_EVENT ` in its node log); the ownership checker reads `unload` events.
LB_EVENT_FIELDS = {
    "event": "unload | split | assign (the leader's decisions); lock-acquired | lock-released | lock-lost | "
             "lock-reacquired | serving-started | serving-stopped (a broker's own view of its bundles)",
    "bundle": "<tenant>/<ns>/0xLLLLLLLL_0xUUUUUUUU",
    "source": "the owner before (broker id host:port), null if none",
    "destination": "the broker chosen (host:port), null if the leader left it to the next lookup",
    "reason": "shed:<Shedder> | admin | split | overload | lookup | preallocated | affinity | ...",
    "leader": "the leader that decided (host:port)",
    "children": "split only: the child ranges; with algorithm, unload and the boundaries' new version",
    "broker": "lock-*/serving-*: the broker logging it; with session (hex) and czxid of its lock",
    "mono_ns": "CLOCK_MONOTONIC of the broker's host when decided (the history's clock on one machine)",
    "wall_ms": "the broker's wall clock, for people",
}


def topic_hash(topic: str, partition: int = -1) -> tuple[str, int] | None:
    """(tenant/ns, CRC-32 of the full topic name) as Pulsar hashes a topic into its bundles; the name of
    partition p is `<topic>-partition-<p>`. None for a key that is not a topic name."""
    name = topic
    if partition >= 0 and "-partition-" not in topic.rsplit("/", 1)[-1]:
        name = f"{topic}-partition-{partition}"
    rest = name.split("://", 1)[1] if "://" in name else name
    parts = rest.split("/")
    if len(parts) < 3 or not all(parts[:3]):
        return None
    return f"{parts[0]}/{parts[1]}", zlib.crc32(name.encode()) & 0xFFFFFFFF


def covers(rng: tuple[int, int], h: int) -> bool:
    """Whether bundle range (lower, upper) holds hash h: [lower, upper), the last one [lower, 0xffffffff]."""
    lo, hi = rng
    return lo <= h < hi or (hi == FULL_UPPER and h == FULL_UPPER)


def overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two bundle ranges share a hash."""
    ahi = a[1] + 1 if a[1] == FULL_UPPER else a[1]
    bhi = b[1] + 1 if b[1] == FULL_UPPER else b[1]
    return a[0] < bhi and b[0] < ahi


def parse_range(name: str) -> tuple[int, int] | None:
    """(lower, upper) of a bundle range name "0xLLLLLLLL_0xUUUUUUUU"; None if it is not one."""
    lo, sep, hi = name.partition("_")
    if not sep or not lo.lower().startswith("0x") or not hi.lower().startswith("0x"):
        return None
    try:
        a, b = int(lo, 16), int(hi, 16)
    except ValueError:
        return None
    return (a, b)


def range_name(lower: int, upper: int) -> str:
    return f"0x{lower:08x}_0x{upper:08x}"


def parse_bundle_path(path: str) -> tuple[str, tuple[int, int] | None] | None:
    """(tenant/ns, range or None if the last part is not a range) of `/namespace/<t>/<ns>/<range>`;
    None for any other path (the tenant and namespace znodes above the locks)."""
    parts = path.strip("/").split("/")
    if len(parts) != 4 or "/" + parts[0] != NAMESPACE_ROOT:
        return None
    return f"{parts[1]}/{parts[2]}", parse_range(parts[3])


def parse_bundle_name(name: str) -> tuple[str, tuple[int, int]] | None:
    """(tenant/ns, range) of a bundle name `<t>/<ns>/0x.._0x..`; None if it is not one."""
    parts = name.strip("/").split("/")
    if len(parts) != 3:
        return None
    rng = parse_range(parts[2])
    return None if rng is None else (f"{parts[0]}/{parts[1]}", rng)


def namespace_of_policies(path: str) -> str | None:
    """tenant/ns of `/admin/local-policies/<t>/<ns>`; None for other paths."""
    root = LOCAL_POLICIES_ROOT.strip("/").split("/")
    parts = path.strip("/").split("/")
    if len(parts) != len(root) + 2 or parts[:len(root)] != root:
        return None
    return "/".join(parts[len(root):])


def _bound(x: Any) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, str):
        try:
            return int(x, 16) if x.lower().startswith("0x") else int(x)
        except ValueError:
            return None
    return None


def parse_boundaries(data: Any) -> tuple[list[int] | None, int | None]:
    """(boundaries, numBundles) from a local-policies value: Pulsar's LocalPolicies JSON
    {"bundles": {"boundaries": ["0x00000000", ...], "numBundles": n}} (or the same fields at the top).
    Boundaries that are not numbers stay in the list as None, for the checker to report."""
    if isinstance(data, (bytes, bytearray)):
        data = data.decode("utf-8", "replace")
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return None, None
    if not isinstance(data, dict):
        return None, None
    b = data.get("bundles") if isinstance(data.get("bundles"), dict) else data
    raw = b.get("boundaries")
    n = b.get("numBundles", b.get("num_bundles"))
    if not isinstance(raw, list):
        return None, n if isinstance(n, int) else None
    return [_bound(x) for x in raw], n if isinstance(n, int) and not isinstance(n, bool) else None


def broker_of(data: Any) -> str | None:
    """The broker named by a lock's or the leader's JSON value: "broker", else Pulsar's
    NamespaceEphemeralData "nativeUrl" or LeaderBroker "brokerId"/"serviceUrl"; a bare string as is."""
    if isinstance(data, (bytes, bytearray)):
        data = data.decode("utf-8", "replace")
    if isinstance(data, str):
        s = data.strip()
        try:
            data = json.loads(s)
        except ValueError:
            return s or None
    if isinstance(data, str):
        return data or None
    if not isinstance(data, dict):
        return None
    for k in ("broker", "brokerId", "nativeUrl", "serviceUrl", "brokerUrl", "httpUrl", "webServiceUrl"):
        if data.get(k):
            return str(data[k])
    return None
