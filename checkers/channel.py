"""The channel checker: the extensible load manager's service-unit state channel, replayed by an oracle of
its own, against the brokers' table views and the ownership rules.

Input: the rows of the channel observer (harness/channel_recorder.py; core/observations.py):
`channel-message` (every message of the channel topic, key = the bundle, value = the record's JSON or null
for a tombstone), `channel-view` (samples of each broker's table view), `observe-*`, and the nemesis's ops
(core/faults.py's timeline, for the fault windows).

The oracle (`Oracle`) is this module's own model of Pulsar's rules, written from Pulsar's
`ServiceUnitState` (the states and the transition table for `StorageType.SystemTopic`) and
`ServiceUnitStateDataConflictResolver.shouldKeepLeft` (the resolver every table view and the compactor
apply), not taken from the reference implementation (clusters/ is not imported):
1. a tombstone is accepted (the record goes; the bundle is Init again);
2. versions: `from.v == MAX_LONG and to.v == MIN_LONG` goes on (overflow); `from.v >= to.v` is rejected
   (`version-not-newer`); a gap (`from.v < to.v - 1`) is accepted (the system topic's compaction drops
   messages) and counted;
3. `to.force` is accepted (after the version check);
4. a transition not in the table is rejected (`invalid-transition`);
5. the brokers must agree (`broker-mismatch`): Owned->Splitting: no dst, src = from.dst;
   Owned->Releasing: src = from.dst (not blank), dst != from.dst; Assigning->Owned, Releasing->Free,
   Splitting->Deleted: the same dst and src; Releasing->Assigning: dst not blank and the same brokers;
   Free->Assigning: no src, a dst.
A message whose value is not a record (not JSON, an unknown state, a non-Free record naming no broker) is
rejected as `undecodable`. The oracle applies the messages in the topic's order (message ids), each once.

Owner of a record: Owned -> its dstBroker; Splitting -> its sourceBroker (the parent stays with its owner
until it is Deleted); any other state -> nobody.

Anomalies (each names the bundle, the messages (their ids, rows and records) and the times):
- `version-not-increasing` (invalid): an accepted record whose versionId is not above the last versionId
  the oracle accepted for its bundle. The resolver itself never accepts one, except after a tombstone
  (Init accepts anything): a record after a tombstone must restart at 1 (VERSION_ID_INIT) or go above the
  versions before it, else a stale message resurrected the bundle (apache/pulsar#19620's delayed message).
- `view-version-regressed` (invalid): two samples of one broker's view (its last_applied not moving back:
  a restarted broker re-reads the channel) where a bundle's versionId went down with no tombstone of it
  between the two samples' positions.
- `view-invalid-transition` (invalid): two samples of one broker's view where a bundle's versionId went
  up by exactly one (one step) to a record that is not forced and whose state change is not a valid
  transition (a state to itself is not one: Owned -> Owned names a new owner without a transfer).
- `view-divergence` (invalid): a sample whose records differ from the oracle's table after the message
  its `last_applied` names (a [ledger, entry] id: after the last message of that entry, a batch being
  applied whole; a sample without `last_applied`, or naming a message the observer did not read, is not
  judged) (a broker that accepted what the resolver rejects, e.g. a stale message from a
  partitioned broker, apache/pulsar#19620; or one that skipped what it accepts). The evidence names, per
  bundle, both records and the message the view's record came from when there is one (with the oracle's
  reason for rejecting it). Reported once per (broker, bundle, view record, oracle record).
- `view-not-converged` (invalid): after the run (the samples marked `final`), a broker's view that has not
  applied the last message of the channel or whose records differ from the final table; a broker that
  did not answer its final sample (down) is not judged.
- `double-owned` (invalid): at some point of the topic two records of overlapping ranges of one namespace
  name different owners (a split parent Owned/Splitting by A while a child is Owned by B:
  apache/pulsar#19490's transfer racing a split). Reported once per episode (from the message that
  began it).
- `stuck-in-flight` (invalid): an accepted in-flight record (Assigning, Releasing, Splitting) not replaced
  by another accepted record within `in_flight_limit_s` (publish times; a record still in flight at the
  end counts from its publication to the end of the observation), while no fault was active in its
  window (widened before by `fault_settle_s`: the leader's monitor overrides only while its metadata
  state is Stable, 180 s after its session came back). `stuck-in-flight-under-fault` (informational):
  the same with a fault in the window.
- `stuck-at-destination` (invalid): an accepted Assigning record whose destination broker held it in its
  view (a sample of that broker's view, at or after the message, with that record) and that was not
  replaced by another accepted record within `assign_limit_s` of that sample (the in-flight waiting
  time: lookups of the bundle wait that long), while no fault was active in between. A running
  destination completes an Assigning at once, as a tail message or, after its restart, as an existing
  record (apache/pulsar#25379: a restarted broker that skips it leaves the bundle Assigning until the
  leader's ownership monitor overrides it, up to the waiting time plus the monitor's interval, which
  `stuck-in-flight` allows).
- `split-parent-reowned` (invalid): a bundle whose split completed (Splitting -> Deleted) that has an
  active record (Assigning, Owned, Releasing, Splitting) again: after a split the parent stays Deleted,
  its range is its children's (apache/pulsar#19490: a transfer racing the split re-owned the parent once
  it was tombstoned; `double-owned` also names it when the new owner differs from a child's).
- `split-incomplete` (invalid): a split whose parent left Splitting other than to Deleted (or was
  tombstoned while Splitting), or was Deleted while a child range of its map had no record yet.
- `split-child-elsewhere` (invalid): a child of a split (a range of the parent's
  splitServiceUnitToDestBroker with no record when the split began) whose first accepted record is not
  Owned by the parent's owner (the Splitting record's sourceBroker).

When the channel's records are znodes (ServiceUnitStateMetadataStoreTableViewImpl; the recorder's
`observe-start` says `"source": "metadata-store"`), a `channel-message` row is a record read from its znode
(message id `[mzxid, 0, -1]`): `StoreOracle` takes each as the bundle's record (the store's resolver passed
it; writes between two reads are not seen), the views carry no `last_applied` and are judged at the end
only (`view-not-converged`: records that differ from the store's final table; apache/pulsar#24478's
stale table), and the rules on the records' sequence (versions, double owners, in-flight times) hold as
they are. A split's children have no record there until assigned (the store refuses Init -> Owned), so
`split-incomplete` and `split-child-elsewhere` do not apply to such runs.

The verdict is False on any invalid case, else "unknown" when the history has no `channel-message` row
(the observer did not run), else True. Stats: message and rejection counts (by reason), version gaps,
bundles, views sampled/judged/unjudged by reason per broker, in-flight durations, splits.
"""
from __future__ import annotations

from typing import Any

from checkers.toolkit import Cases, OpRefs, anomalies_of, anomaly_stats, percentile, verdict
from core.faults import FaultTimeline
from core.history import NEMESIS_PROCESS, OBSERVER_PROCESS, CheckResult, Op
from core.observations import (CHANNEL_MESSAGE, CHANNEL_VIEW, GAP_START, OBSERVE_START, OBSERVE_STOP, overlap,
                               parse_bundle_name)

# -------------------------------------------------------------------------------- the oracle's rules

INIT, FREE, OWNED, ASSIGNING, RELEASING, SPLITTING, DELETED = (
    "Init", "Free", "Owned", "Assigning", "Releasing", "Splitting", "Deleted")
STATES = (INIT, FREE, OWNED, ASSIGNING, RELEASING, SPLITTING, DELETED)
IN_FLIGHT = frozenset({ASSIGNING, RELEASING, SPLITTING})

# ServiceUnitState's table for StorageType.SystemTopic: Init may go anywhere (compaction drops history)
TRANSITIONS: dict[str, frozenset[str]] = {
    INIT: frozenset({FREE, OWNED, ASSIGNING, RELEASING, SPLITTING, DELETED}),
    FREE: frozenset({ASSIGNING, INIT}),
    OWNED: frozenset({SPLITTING, RELEASING}),
    ASSIGNING: frozenset({OWNED}),
    RELEASING: frozenset({ASSIGNING, FREE}),
    SPLITTING: frozenset({DELETED}),
    DELETED: frozenset({INIT}),
}
LONG_MAX, LONG_MIN = 2 ** 63 - 1, -(2 ** 63)
VERSION_ID_INIT = 1

NOT_NEWER, INVALID, MISMATCH, UNDECODABLE = "version-not-newer", "invalid-transition", "broker-mismatch", "undecodable"

FIELDS = ("state", "dstBroker", "sourceBroker", "splitServiceUnitToDestBroker", "force", "timestamp", "versionId")


class RecordError(ValueError):
    """A value that is not a ServiceUnitStateData."""


def valid_transition(frm: str, to: str) -> bool:
    return to in TRANSITIONS.get(frm, frozenset())


def _blank(s: Any) -> bool:
    return s is None or (isinstance(s, str) and not s.strip())


def _long(x: Any, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or not LONG_MIN <= x <= LONG_MAX:
        raise RecordError(f"{name} is not a Java long: {x!r}")
    return x


def record(raw: Any) -> dict[str, Any]:
    """A record's JSON as the oracle holds it (every field, defaults filled: Java's primitives are 0/false,
    absent objects null); RecordError when Pulsar would not decode it."""
    if not isinstance(raw, dict):
        raise RecordError(f"a record is a JSON object, not {type(raw).__name__}")
    state = raw.get("state")
    if state not in STATES:
        raise RecordError(f"unknown state {state!r}")
    dst, src = raw.get("dstBroker"), raw.get("sourceBroker")
    for k, v in (("dstBroker", dst), ("sourceBroker", src)):
        if v is not None and not isinstance(v, str):
            raise RecordError(f"{k} is not a string: {v!r}")
    if state != FREE and _blank(dst) and _blank(src):
        raise RecordError(f"a {state} record names no broker")
    split = raw.get("splitServiceUnitToDestBroker")
    if split is not None and not (isinstance(split, dict) and all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in split.items())):
        raise RecordError(f"splitServiceUnitToDestBroker is not a map of ranges to brokers: {split!r}")
    force = raw.get("force", False)
    if not isinstance(force, bool):
        raise RecordError(f"force is not a boolean: {force!r}")
    return {"state": state, "dstBroker": dst, "sourceBroker": src,
            "splitServiceUnitToDestBroker": dict(split) if split is not None else None, "force": force,
            "timestamp": _long(raw.get("timestamp", 0), "timestamp"),
            "versionId": _long(raw.get("versionId", 0), "versionId")}


def state_of(rec: dict[str, Any] | None) -> str:
    return INIT if rec is None else rec["state"]


def owner_of(rec: dict[str, Any] | None) -> str | None:
    """Who owns the bundle by this record: Owned -> dst; Splitting -> src (until Deleted); else nobody."""
    if rec is None:
        return None
    if rec["state"] == OWNED:
        return rec["dstBroker"] or None
    if rec["state"] == SPLITTING:
        return rec["sourceBroker"] or None
    return None


def _brokers_disagree(frm: dict[str, Any], to: dict[str, Any]) -> bool:
    pair = (frm["state"], to["state"])
    same = frm["dstBroker"] == to["dstBroker"] and frm["sourceBroker"] == to["sourceBroker"]
    if pair == (OWNED, SPLITTING):
        return not _blank(to["dstBroker"]) or frm["dstBroker"] != to["sourceBroker"]
    if pair == (OWNED, RELEASING):
        return _blank(to["sourceBroker"]) or frm["dstBroker"] != to["sourceBroker"] or frm["dstBroker"] == to["dstBroker"]
    if pair in ((ASSIGNING, OWNED), (RELEASING, FREE), (SPLITTING, DELETED)):
        return not same
    if pair == (RELEASING, ASSIGNING):
        return _blank(to["dstBroker"]) or not same
    if pair == (FREE, ASSIGNING):
        return not _blank(to["sourceBroker"]) or _blank(to["dstBroker"])
    return False


def reject_reason(frm: dict[str, Any] | None, to: dict[str, Any] | None) -> str | None:
    """Why the resolver keeps `frm` against `to` (None: `to` is accepted); see the module docstring."""
    if to is None:
        return None
    if frm is not None:
        if frm["versionId"] == LONG_MAX and to["versionId"] == LONG_MIN:
            pass
        elif frm["versionId"] >= to["versionId"]:
            return NOT_NEWER
    if to["force"]:
        return None
    if not valid_transition(state_of(frm), to["state"]):
        return INVALID
    if frm is not None and _brokers_disagree(frm, to):
        return MISMATCH
    return None


def is_version_gap(frm: dict[str, Any] | None, to: dict[str, Any] | None) -> bool:
    return (frm is not None and to is not None and frm["versionId"] != LONG_MAX
            and frm["versionId"] < to["versionId"] - 1)


class Oracle:
    """The table of the channel as every view must hold it: `apply(key, value)` with the resolver, where
    value is a record's JSON, None (a tombstone) or anything else (undecodable). Returns (accepted,
    reason, previous record, the record applied or None)."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, Any]] = {}

    def apply(self, key: str, raw: Any, tombstone: bool) -> tuple[bool, str | None, dict | None, dict | None]:
        prev = self.table.get(key)
        if tombstone:
            self.table.pop(key, None)
            return True, None, prev, None
        try:
            rec = record(raw)
        except RecordError:
            return False, UNDECODABLE, prev, None
        why = self.reject_reason(prev, rec)
        if why is not None:
            return False, why, prev, rec
        self.table[key] = rec
        return True, None, prev, rec

    def reject_reason(self, prev: dict | None, rec: dict) -> str | None:
        """Why the resolver refuses `rec` over `prev` (None: accepted)."""
        return reject_reason(prev, rec)


class StoreOracle(Oracle):
    """The table when the channel's records are znodes (the recorder's `observe-start` says
    `"source": "metadata-store"`): the store's resolver ran on every write, and the observer sees only the
    record each read finds (writes between two reads are not seen), so a record read is the bundle's record
    as it is, not a message to judge: every decodable record is accepted, a tombstone removes it."""

    def reject_reason(self, prev: dict | None, rec: dict) -> str | None:
        return None


def fast_key(raw: Any) -> Any:
    """A key of a record's JSON, equal for two values exactly when `record` makes equal records of them
    (defaults filled, the types of the numbers kept); None when it is not an object. It may hold lists
    (a value that is no record): hashing it then raises TypeError."""
    if type(raw) is not dict:
        return None
    split = raw.get("splitServiceUnitToDestBroker")
    if split is not None:
        if type(split) is not dict:
            return None
        split = tuple(sorted(split.items()))
    f, t, v = raw.get("force", False), raw.get("timestamp", 0), raw.get("versionId", 0)
    return (raw.get("state"), raw.get("dstBroker"), raw.get("sourceBroker"), f, t, v, split, type(f), type(t), type(v))


def same_record(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(a.get(k) == b.get(k) for k in FIELDS)


# ------------------------------------------------------------------------------------------ checker

INVALID_BY_DEFAULT = ("version-not-increasing", "view-version-regressed", "view-invalid-transition",
                      "view-divergence", "view-not-converged", "double-owned", "stuck-in-flight",
                      "stuck-at-destination", "split-incomplete", "split-child-elsewhere", "split-parent-reowned")
ANOMALY_TYPES = INVALID_BY_DEFAULT + ("stuck-in-flight-under-fault",)

DEFAULTS: dict[str, Any] = {
    "invalid": INVALID_BY_DEFAULT,
    "max_anomalies": 1000,
    # loadBalancerInFlightServiceUnitStateWaitingTimeInMillis (30 s) + the monitor's interval (60 s)
    "in_flight_limit_s": 90.0,
    # loadBalancerInFlightServiceUnitStateWaitingTimeInMillis (30 s): how long a running destination may
    # leave an Assigning it holds
    "assign_limit_s": 30.0,
    # MAX_CLEAN_UP_DELAY_TIME_IN_SECS: the monitor acts only this long after its session came back
    "fault_settle_s": 180.0,
    "max_differences": 20,           # bundles listed per view-divergence case
}

INF = float("inf")


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check the service-unit state channel; see the module docstring and `ANOMALY_TYPES`."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    c = _ChannelCheck(history, o)
    c.run()
    stats = c.stats()
    invalid = o.get("invalid") or ()
    stats.update(anomaly_stats(c.cases, invalid))
    unknown = not c.msgs
    if unknown:
        stats["unknown_because"] = "no channel-message rows: the channel observer did not run"
    return CheckResult(verdict(c.cases, invalid, unknown), anomalies_of(c.cases), stats)


def _mid(x: Any) -> tuple[int, ...] | None:
    if isinstance(x, (list, tuple)) and 2 <= len(x) <= 3 and all(isinstance(i, int) and not isinstance(i, bool)
                                                                 for i in x):
        return tuple(x)
    return None


class _Msg:
    __slots__ = ("op", "key", "mid", "publish_ms", "wall_ms", "raw", "tomb", "accepted", "reason", "rec", "prev")

    def __init__(self, op: Op, mid: tuple[int, ...]):
        v = op.value
        self.op, self.key, self.mid = op, op.key, (mid + (-1,))[:3]
        self.publish_ms = v.get("publish_ms") if isinstance(v.get("publish_ms"), int) else None
        self.wall_ms = v.get("wall_ms") if isinstance(v.get("wall_ms"), int) else None
        self.tomb = v.get("value") is None and "undecodable" not in v
        self.raw = v.get("value") if "undecodable" not in v else v.get("undecodable")
        self.accepted, self.reason, self.rec, self.prev = False, None, None, None


class _ChannelCheck(OpRefs):
    ref_key = True

    def __init__(self, history: list[Op], o: dict[str, Any]):
        self.h, self.o = history, o
        self.cases = {k: Cases(o.get("max_anomalies")) for k in ANOMALY_TYPES}
        self.limit_ms = float(o.get("in_flight_limit_s") or 0) * 1000.0
        self.assign_limit_ns = float(o.get("assign_limit_s") or 0) * 1e9
        self.assignings: list[tuple[int, _Msg, _Msg | None]] = []    # (position, Assigning, what replaced it)
        self.split_done: dict[str, _Msg] = {}                          # a split parent -> its Deleted
        self.settle_ns = float(o.get("fault_settle_s") or 0) * 1e9
        self.ports: dict[str, str] = {}
        self.store_mode = False        # the records are znodes (see StoreOracle)
        self.msgs: list[_Msg] = []
        self.duplicates = 0
        self.bad_rows = 0
        self.views: dict[str, list[Op]] = {}
        self.faults = FaultTimeline()
        self.stop_op: Op | None = None
        self.last_obs_ns = -INF
        self.gaps = 0
        self.rejected: dict[str, int] = {}
        self.version_gaps = 0
        self.tombstones = 0
        self.in_flight_ms: list[float] = []
        self.in_flight_open: list[dict[str, Any]] = []
        self.splits = {"begun": 0, "completed": 0, "open_at_end": 0, "children_existing": 0}
        self.view_stats: dict[str, dict[str, int]] = {}
        self.convergence: dict[str, str] = {}
        self._memo: dict[Any, Any] = {}                   # fast key -> its record (False: not one)

    # ------------------------------------------------------------------------------ reading the history

    def node(self, broker: Any) -> Any:
        return self.ports.get(str(broker), broker) if broker else broker

    def run(self) -> None:
        seen: set[tuple[int, ...]] = set()
        for op in self.h:
            if op.process == NEMESIS_PROCESS:
                self.faults.feed(op.time_ns, op.type, op.f, op)
                continue
            if op.process != OBSERVER_PROCESS:
                continue
            v = op.value if isinstance(op.value, dict) else {}
            self.last_obs_ns = max(self.last_obs_ns, op.time_ns)
            if op.f == OBSERVE_START:
                self.ports.update({str(k): str(x) for k, x in (v.get("ports") or {}).items()})
                self.store_mode = self.store_mode or v.get("source") == "metadata-store"
            elif op.f == OBSERVE_STOP:
                self.stop_op = op
            elif op.f == GAP_START:
                self.gaps += 1
            elif op.f == CHANNEL_MESSAGE:
                mid = _mid(v.get("message_id"))
                if mid is None or not op.key:
                    self.bad_rows += 1
                    continue
                m = _Msg(op, mid)
                if m.mid in seen:                      # read again after a gap
                    self.duplicates += 1
                    continue
                seen.add(m.mid)
                self.msgs.append(m)
            elif op.f == CHANNEL_VIEW and op.key:
                self.views.setdefault(op.key, []).append(op)
        self.msgs.sort(key=lambda m: m.mid)
        self.pos = {m.mid: i for i, m in enumerate(self.msgs)}
        self.by_key: dict[str, list[int]] = {}
        for i, m in enumerate(self.msgs):
            self.by_key.setdefault(m.key, []).append(i)
        self.entry_last = {m.mid[:2]: i for i, m in enumerate(self.msgs)}
        self._replay()
        self._destinations()
        self._view_sequences()
        self._convergence()

    def end_wall_ms(self) -> float | None:
        if self.stop_op is not None and isinstance(self.stop_op.value, dict) and isinstance(
                self.stop_op.value.get("wall_ms"), int):
            return self.stop_op.value["wall_ms"]
        walls = [m.wall_ms for m in self.msgs if m.wall_ms is not None]
        return max(walls) if walls else None

    # ------------------------------------------------------------------------------------- evidence

    def msg_ev(self, m: _Msg | None) -> dict[str, Any] | None:
        if m is None:
            return None
        r = self.ref(m.op)
        r.update({"message_id": list(m.mid), "publish_ms": m.publish_ms, "value": m.raw if not m.tomb else None,
                  "accepted": m.accepted, "reason": m.reason})
        return r

    def position_of(self, la: Any) -> tuple[int | None, str]:
        """The index of the message a view's last_applied names (-1: none applied), or None and why."""
        if la is None:
            return -1, ""
        mid = _mid(la)
        if mid is None:
            return None, "last_applied is not a message id"
        i = self.pos.get(mid) if len(mid) == 3 else self.entry_last.get(mid)
        if i is None:
            return None, "last_applied names a message the observer did not read"
        return i, ""

    # ------------------------------------------------------------------------------------- the replay

    def _replay(self) -> None:
        oracle = StoreOracle() if self.store_mode else Oracle()
        last_v: dict[str, int] = {}                       # bundle -> last accepted versionId
        before_tomb: dict[str, int] = {}                  # bundle -> its last versionId before its tombstone
        made_by: dict[str, _Msg] = {}                     # bundle -> the message of its current record
        owners: dict[str, tuple[dict, dict]] = {}         # ns -> ({bundle: (range, owner)}, {bucket: bundles})
        doubles: dict[str, set[tuple[str, str]]] = {}   # bundle -> the double-owned pairs it is in
        inflight: dict[str, _Msg] = {}
        splits: dict[str, dict[str, Any]] = {}            # parent -> the open split
        child_of: dict[str, str] = {}                     # child bundle -> its parent's open split
        # the views' samples by the position they name
        at: dict[int, list[Op]] = {}
        for broker, samples in self.views.items():
            vs = self.view_stats.setdefault(broker, {"samples": 0, "errors": 0, "judged": 0, "unjudged": 0})
            for op in samples:
                vs["samples"] += 1
                v = op.value if isinstance(op.value, dict) else {}
                if v.get("error") is not None or not isinstance(v.get("records"), dict):
                    vs["errors"] += 1
                    continue
                i, why = self.position_of(v.get("last_applied")) if "last_applied" in v else (None, "")
                if i is None:
                    vs["unjudged"] += 1
                    continue
                vs["judged"] += 1
                at.setdefault(i, []).append(op)
        self.diverged: set[tuple[Any, ...]] = set()
        self._table = oracle.table                        # the table as it stands during the replay
        self._tkeys: dict[str, Any] = {}                  # its records' fast keys
        for op in at.get(-1, ()):
            self._compare_view(op, oracle.table, made_by, -1)
        for i, m in enumerate(self.msgs):
            ok, why, prev, rec = oracle.apply(m.key, m.raw, m.tomb)
            m.accepted, m.reason, m.prev, m.rec = ok, why, prev, rec
            if not ok:
                self.rejected[why] = self.rejected.get(why, 0) + 1
            else:
                self._accepted(i, m, prev, rec, last_v, before_tomb, made_by, owners, doubles, inflight,
                               splits, child_of)
            for op in at.get(i, ()):
                self._compare_view(op, oracle.table, made_by, i)
        self.final = oracle.table
        self.final_made_by = made_by
        end = self.end_wall_ms()
        for key, m in sorted(inflight.items()):
            if m.rec is not None and m.rec["state"] == ASSIGNING:
                self.assignings.append((self.pos[m.mid], m, None))
            if end is not None and m.publish_ms is not None and end - m.publish_ms > self.limit_ms:
                self._stuck(m, None, end - m.publish_ms)
            else:
                self.in_flight_open.append({"bundle": key, "state": state_of(m.rec), "message": self.msg_ev(m)})
        self.splits["open_at_end"] = len(splits)

    def _accepted(self, i: int, m: _Msg, prev: dict | None, rec: dict | None, last_v: dict[str, int],
                  before_tomb: dict[str, int], made_by: dict[str, _Msg], owners: dict, doubles: dict,
                  inflight: dict[str, _Msg], splits: dict[str, dict[str, Any]], child_of: dict[str, str]) -> None:
        key = m.key
        if rec is None:                                   # a tombstone
            self.tombstones += 1
            if key in last_v:
                before_tomb[key] = last_v.pop(key)
        else:
            if is_version_gap(prev, rec):
                self.version_gaps += 1
            v = rec["versionId"]
            old = last_v.get(key)
            if old is not None and not (old == LONG_MAX and v == LONG_MIN) and v <= old:
                self._case("version-not-increasing", key, m, made_by.get(key), f"versionId {v} after {old}")
            elif old is None and key in before_tomb and v != VERSION_ID_INIT and v <= before_tomb[key]:
                self._case("version-not-increasing", key, m, None,
                           f"versionId {v} after a tombstone, not above {before_tomb[key]} (the version before "
                           f"it) nor a restart at {VERSION_ID_INIT}: a stale message resurrected the bundle")
            last_v[key] = v
        prior = made_by.get(key)
        if rec is None:
            made_by.pop(key, None)
            self._tkeys.pop(key, None)
        else:
            made_by[key] = m
            self._tkeys[key] = fast_key(rec)
        # in flight: each in-flight record must be replaced within the limit
        old_f = inflight.pop(key, None)
        if old_f is not None and old_f.rec is not None and old_f.rec["state"] == ASSIGNING:
            self.assignings.append((self.pos[old_f.mid], old_f, m))
        if old_f is not None:
            dur = (m.publish_ms - old_f.publish_ms) if m.publish_ms is not None and old_f.publish_ms is not None \
                else (m.op.time_ns - old_f.op.time_ns) / 1e6
            self.in_flight_ms.append(dur)
            if dur > self.limit_ms:
                self._stuck(old_f, m, dur)
        if rec is not None and rec["state"] in IN_FLIGHT:
            inflight[key] = m
        self._owners(m, rec, owners, doubles, made_by)
        done = self.split_done.get(key)
        if done is not None and rec is not None and rec["state"] in IN_FLIGHT | {OWNED}:
            self.cases["split-parent-reowned"].add(lambda: {
                "bundle": key, "why": f"{state_of(rec)} of {key} after its split completed (Deleted)",
                "message": self.msg_ev(m), "deleted": self.msg_ev(done)})
        self._split(m, prev, rec, prior, splits, child_of)

    def _case(self, kind: str, key: str, m: _Msg, other: _Msg | None, why: str, **extra: Any) -> None:
        self.cases[kind].add(lambda: {"bundle": key, "why": why, "message": self.msg_ev(m),
                                      "previous": self.msg_ev(other), **extra})

    # ------------------------------------------------------------------------------ double ownership

    def _owners(self, m: _Msg, rec: dict | None, owners: dict, doubles: dict, made_by: dict[str, _Msg]) -> None:
        """Who owns what after message m; a new overlap of two owners is `double-owned`. Per namespace, the
        owned ranges by bucket of the hash space (a range is listed in every bucket it touches), so that
        the ranges overlapping one are found without reading the whole namespace."""
        parsed = parse_bundle_name(m.key)
        if parsed is None:
            return
        ns, rng = parsed
        table, buckets = owners.setdefault(ns, ({}, {}))
        old = table.pop(m.key, None)
        if old is not None:
            for b in _buckets(old[0]):
                buckets[b].discard(m.key)
        who = owner_of(rec)
        for pair in list(doubles.get(m.key, ())):
            other = pair[0] if pair[1] == m.key else pair[1]
            if who is None or other not in table or not overlap(rng, table[other][0]) or table[other][1] == who:
                for k in pair:
                    doubles.get(k, set()).discard(pair)
        if who is None:
            return
        table[m.key] = (rng, who)
        near: set[str] = set()
        for b in _buckets(rng):
            near |= buckets.setdefault(b, set())
            buckets[b].add(m.key)
        for other in sorted(near):
            orng, owho = table[other]
            if other == m.key or owho == who or not overlap(rng, orng):
                continue
            pair = tuple(sorted((m.key, other)))
            if pair in doubles.get(m.key, ()):
                continue
            doubles.setdefault(m.key, set()).add(pair)
            doubles.setdefault(other, set()).add(pair)
            om = made_by.get(other)
            self.cases["double-owned"].add(lambda other=other, owho=owho, om=om: {
                "bundle": m.key, "other_bundle": other,
                "owners": {m.key: [who, self.node(who)], other: [owho, self.node(owho)]},
                "why": f"{m.key} {state_of(rec)} by {who} while {other} {state_of(om.rec if om else None)} "
                       f"by {owho}", "time_s": round(m.op.time_ns / 1e9, 6),
                "message": self.msg_ev(m), "other_message": self.msg_ev(om)})

    # ------------------------------------------------------------------------------------- in flight

    def _stuck(self, m: _Msg, resolved_by: _Msg | None, dur_ms: float) -> None:
        lag_ns = max(0, (m.wall_ms or 0) - (m.publish_ms or m.wall_ms or 0)) * 1e6
        t0 = m.op.time_ns - lag_ns
        t1 = resolved_by.op.time_ns if resolved_by is not None else self.last_obs_ns
        faults = [p for p in self.faults.periods if not p.failed and p.started_ns is not None
                  and p.start_ns <= t1 and (p.stop_ns if p.stop_ns is not None else INF) >= t0 - self.settle_ns]
        kind = "stuck-in-flight-under-fault" if faults else "stuck-in-flight"
        self.cases[kind].add(lambda: {
            "bundle": m.key, "state": state_of(m.rec), "in_flight_s": round(dur_ms / 1000, 3),
            "limit_s": round(self.limit_ms / 1000, 3), "window_s": [round(t0 / 1e9, 6), round(t1 / 1e9, 6)],
            "message": self.msg_ev(m), "resolved_by": self.msg_ev(resolved_by),
            "faults": [{"fault": p.name, "start_s": round(p.start_ns / 1e9, 6),
                        "stop_s": None if p.stop_ns is None else round(p.stop_ns / 1e9, 6)} for p in faults]})

    def _destinations(self) -> None:
        """`stuck-at-destination`: each Assigning held by its running destination's view for longer than
        the limit."""
        if self.assign_limit_ns <= 0:
            return
        for i, m, by in self.assignings:
            dst = m.rec.get("dstBroker") if m.rec else None
            samples = self.views.get(str(dst), []) if dst else []
            end_i = self.pos[by.mid] if by is not None else None
            t1 = by.op.time_ns if by is not None else self.last_obs_ns
            seen: Op | None = None
            for op in samples:
                v = op.value if isinstance(op.value, dict) else {}
                if v.get("error") is not None or not isinstance(v.get("records"), dict) or "last_applied" not in v:
                    continue
                p, _ = self.position_of(v.get("last_applied"))
                if p is None or p < i or (end_i is not None and p >= end_i):
                    continue
                r = v["records"].get(m.key)
                if not (isinstance(r, dict) and r.get("state") == ASSIGNING
                        and r.get("versionId") == m.rec["versionId"]):
                    continue
                # from the first such sample after which no fault was active until the record was replaced
                if any(not f.failed and f.started_ns is not None and f.start_ns <= t1
                       and (f.stop_ns if f.stop_ns is not None else INF) >= op.time_ns for f in self.faults.periods):
                    continue
                seen = op
                break
            if seen is None:
                continue
            t0 = seen.time_ns
            if t1 - t0 <= self.assign_limit_ns:
                continue
            self.cases["stuck-at-destination"].add(lambda m=m, by=by, seen=seen, t0=t0, t1=t1, dst=dst: {
                "bundle": m.key, "destination": [dst, self.node(dst)],
                "why": f"Assigning(dst={dst}) held by {dst}'s view from {t0 / 1e9:.3f} s, "
                       f"{'replaced' if by is not None else 'still in flight'} at {t1 / 1e9:.3f} s "
                       f"({(t1 - t0) / 1e9:.3f} s > {self.assign_limit_ns / 1e9:.3f} s)",
                "message": self.msg_ev(m), "sample": self.ref(seen), "resolved_by": self.msg_ev(by)})

    # ------------------------------------------------------------------------------------------ splits

    def _split(self, m: _Msg, prev: dict | None, rec: dict | None, prior: _Msg | None,
               splits: dict[str, dict[str, Any]], child_of: dict[str, str]) -> None:
        key = m.key
        sp = splits.get(key)
        if rec is not None and rec["state"] == SPLITTING:
            if sp is None:
                ns = key.rsplit("/", 1)[0]
                children = {}
                for r in (rec["splitServiceUnitToDestBroker"] or {}):
                    ck = r if "/" in r else f"{ns}/{r}"
                    children[ck] = None
                sp = {"message": m, "src": rec["sourceBroker"], "children": children,
                      "existing": {ck for ck in children if ck in self._table}}
                self.splits["begun"] += 1
                self.splits["children_existing"] += len(sp["existing"])
                splits[key] = sp
                for ck in children:
                    if ck not in sp["existing"]:
                        child_of[ck] = key
            else:                                          # an override names a new source
                sp["src"] = rec["sourceBroker"]
                sp["message"] = m
            return
        if sp is not None:
            del splits[key]
            for ck in sp["children"]:
                if child_of.get(ck) == key:
                    child_of.pop(ck)
            missing = [ck for ck, first in sp["children"].items() if first is None and ck not in sp["existing"]]
            if self.store_mode:
                missing = []           # the store refuses the children's Owned: they are assigned later
            if rec is not None and rec["state"] == DELETED and not missing:
                self.splits["completed"] += 1
                self.split_done[key] = m
            else:
                why = (f"the parent was Deleted while child {', '.join(missing)} had no record" if rec is not None
                       and rec["state"] == DELETED else
                       f"the parent left Splitting for {state_of(rec) if rec is not None else 'a tombstone'}")
                self.cases["split-incomplete"].add(lambda: {
                    "bundle": key, "why": why, "splitting": self.msg_ev(sp["message"]), "message": self.msg_ev(m),
                    "children": {ck: self.msg_ev(first) for ck, first in sp["children"].items()}})
            return
        parent = child_of.get(key)
        if parent is not None:
            psp = splits[parent]
            child_of.pop(key)
            psp["children"][key] = m
            if (rec is None or rec["state"] != OWNED or rec["dstBroker"] != psp["src"]) and not self.store_mode:
                self.cases["split-child-elsewhere"].add(lambda: {
                    "bundle": key, "parent": parent, "parent_owner": [psp["src"], self.node(psp["src"])],
                    "why": f"its first record is {state_of(rec)} by "
                           f"{(rec or {}).get('dstBroker')}, not Owned by the parent's owner {psp['src']}",
                    "message": self.msg_ev(m), "splitting": self.msg_ev(psp["message"])})

    # ----------------------------------------------------------------------------------------- views

    def _view_records(self, op: Op) -> tuple[dict[str, dict[str, Any]], int]:
        """A sample's records as the oracle holds them (memoised: samples repeat the same records), and how
        many were not records."""
        recs, bad = {}, 0
        memo = self._memo
        for k, raw in (op.value.get("records") or {}).items():
            fk = fast_key(raw)
            try:
                got = memo.get(fk) if fk is not None else None
            except TypeError:                     # unhashable: no record
                fk, got = None, None
            if got is None:
                try:
                    got = record(raw)
                except (RecordError, TypeError):
                    got = False
                if fk is not None:
                    memo[fk] = got
            if got is False:
                bad += 1
            else:
                recs[k] = got
        return recs, bad

    def _compare_view(self, op: Op, table: dict[str, dict], made_by: dict[str, _Msg], i: int) -> None:
        raws = op.value.get("records") or {}
        tkeys = self._tkeys
        # the bundles whose record differs (by fast key, which is equal exactly when the records are)
        differ = [k for k in set(raws) | set(table) if k not in raws or k not in tkeys or fast_key(raws[k]) != tkeys[k]]
        if not differ:
            return
        recs, bad = self._view_records(op)
        diffs = []
        for k in sorted(differ):
            a, b = recs.get(k), table.get(k)
            if same_record(a, b):
                continue
            sig = (op.key, k, _sig(a), _sig(b))
            if sig in self.diverged:
                continue
            self.diverged.add(sig)
            diffs.append((k, a, b))
        if bad:
            vs = self.view_stats.setdefault(op.key, {})
            vs["undecodable_records"] = vs.get("undecodable_records", 0) + bad
        if not diffs:
            return
        cap = int(self.o.get("max_differences") or 20)
        broker = op.key
        pos = self.msgs[i] if i >= 0 else None

        def make() -> dict[str, Any]:
            out = []
            for k, a, b in diffs[:cap]:
                src = self._message_of(k, a, i)
                out.append({"bundle": k, "view": a, "oracle": b, "oracle_message": self.msg_ev(made_by.get(k)),
                            "view_message": self.msg_ev(src)})
            return {"broker": broker, "node": self.node(broker), "sample": self.ref(op),
                    "last_applied": self.msg_ev(pos), "bundles": [d[0] for d in diffs],
                    "differences": out}
        self.cases["view-divergence"].add(make)

    def _message_of(self, key: str, rec: dict | None, upto: int) -> _Msg | None:
        """The last message up to position `upto` whose record is `rec` (the message a view applied)."""
        if rec is None:
            return None
        for j in reversed(self.by_key.get(key, ())):
            m = self.msgs[j]
            if j <= upto and not m.tomb and m.rec is not None and same_record(m.rec, rec):
                return m
        return None

    def _view_sequences(self) -> None:
        tombs: dict[str, list[int]] = {}
        for i, m in enumerate(self.msgs):
            if m.tomb:
                tombs.setdefault(m.key, []).append(i)
        for broker, samples in self.views.items():
            prev: tuple[Op, dict, int | None] | None = None
            vs = self.view_stats.setdefault(broker, {})
            for op in samples:
                v = op.value if isinstance(op.value, dict) else {}
                if v.get("error") is not None or not isinstance(v.get("records"), dict):
                    continue
                recs, _ = self._view_records(op)
                pos, _ = self.position_of(v.get("last_applied")) if "last_applied" in v else (None, "")
                if prev is not None:
                    pop, precs, ppos = prev
                    if pos is not None and ppos is not None and pos < ppos:
                        vs["restarts"] = vs.get("restarts", 0) + 1
                    else:
                        self._steps(broker, pop, precs, ppos, op, recs, pos, tombs)
                prev = (op, recs, pos)

    def _steps(self, broker: str, pop: Op, precs: dict, ppos: int | None, op: Op, recs: dict, pos: int | None,
               tombs: dict[str, list[int]]) -> None:
        for k in sorted(set(precs) & set(recs)):
            a, b = precs[k], recs[k]
            va, vb = a["versionId"], b["versionId"]
            if vb < va and not (va == LONG_MAX and vb == LONG_MIN):
                if ppos is None or pos is None:
                    between = any(True for _ in tombs.get(k, ()))   # positions unknown: any tombstone excuses
                else:
                    between = any(ppos < t <= pos for t in tombs.get(k, ()))
                if not between:
                    self.cases["view-version-regressed"].add(lambda k=k, a=a, b=b: {
                        "broker": broker, "node": self.node(broker), "bundle": k,
                        "why": f"versionId {a['versionId']} then {b['versionId']} with no tombstone between",
                        "before": {"sample": self.ref(pop), "record": a},
                        "after": {"sample": self.ref(op), "record": b}})
            elif vb == va + 1 and not b["force"] and not valid_transition(
                    a["state"], b["state"]):
                self.cases["view-invalid-transition"].add(lambda k=k, a=a, b=b: {
                    "broker": broker, "node": self.node(broker), "bundle": k,
                    "why": f"{a['state']} -> {b['state']} in one step (versionId {a['versionId']} -> "
                           f"{b['versionId']}) is not a valid transition",
                    "before": {"sample": self.ref(pop), "record": a},
                    "after": {"sample": self.ref(op), "record": b}})

    def _convergence(self) -> None:
        end = len(self.msgs) - 1
        for broker, samples in sorted(self.views.items()):
            finals = [op for op in samples if isinstance(op.value, dict) and op.value.get("final")]
            if not finals:
                self.convergence[broker] = "not judged: no sample after the run"
                continue
            last = finals[-1]
            v = last.value
            if v.get("error") is not None or not isinstance(v.get("records"), dict):
                self.convergence[broker] = f"not judged: down ({v.get('error')})"
                continue
            recs, _ = self._view_records(last)
            pos, why = self.position_of(v.get("last_applied"))
            if pos is None and "last_applied" in v and _mid(v.get("last_applied")) is not None:
                self.convergence[broker] = "not judged: the observer did not read its last applied message"
                continue
            diffs = sorted(k for k in set(recs) | set(self.final) if not same_record(recs.get(k), self.final.get(k)))
            if self.store_mode and "last_applied" not in v:
                pos = end              # znodes have no position: the records alone are compared
            if pos == end and not diffs:
                self.convergence[broker] = "converged"
                continue
            self.convergence[broker] = "not converged"
            self.cases["view-not-converged"].add(lambda broker=broker, last=last, pos=pos, diffs=diffs, recs=recs, why=why: {
                "broker": broker, "node": self.node(broker), "sample": self.ref(last),
                "last_applied": v.get("last_applied"), "behind": pos != end,
                "why": why or ("its last applied message is not the channel's last" if pos != end
                               else "its records differ from the final table"),
                "channel_last": self.msg_ev(self.msgs[end]) if end >= 0 else None,
                "bundles": diffs[:int(self.o.get("max_differences") or 20)],
                "differences": [{"bundle": k, "view": recs.get(k), "oracle": self.final.get(k),
                                 "oracle_message": self.msg_ev(self.final_made_by.get(k))}
                                for k in diffs[:int(self.o.get("max_differences") or 20)]]})

    # ----------------------------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        d = sorted(self.in_flight_ms)
        return {
            "messages": len(self.msgs), "messages_read_twice": self.duplicates, "bad_rows": self.bad_rows,
            "accepted": sum(1 for m in self.msgs if m.accepted), "rejected_by_reason": dict(sorted(self.rejected.items())),
            "tombstones": self.tombstones, "version_gaps": self.version_gaps,
            "bundles": len({m.key for m in self.msgs}), "final_records": len(getattr(self, "final", {})),
            "gaps": self.gaps, "views": self.view_stats, "convergence": self.convergence,
            "in_flight_s": {"count": len(d), "p50": _sec(percentile(d, 0.5)), "p99": _sec(percentile(d, 0.99)),
                            "max": _sec(d[-1] if d else None), "limit": round(self.limit_ms / 1000, 3)},
            "in_flight_open_at_end": self.in_flight_open[:100], "splits": self.splits,
        }


BUCKET_SHIFT = 22                  # 1024 buckets of the 32-bit hash space


def _buckets(rng: tuple[int, int]) -> range:
    lo, hi = rng
    last = hi if hi == 0xFFFFFFFF else max(lo, hi - 1)
    return range(lo >> BUCKET_SHIFT, (last >> BUCKET_SHIFT) + 1)


def _sec(ms: float | None) -> float | None:
    return None if ms is None else round(ms / 1000, 3)


def _sig(rec: dict | None) -> Any:
    if rec is None:
        return None
    return tuple((k, repr(rec.get(k))) for k in FIELDS)


__all__ = ["ANOMALY_TYPES", "DEFAULTS", "INVALID_BY_DEFAULT", "Oracle", "TRANSITIONS", "check", "owner_of",
           "record", "reject_reason", "valid_transition"]
