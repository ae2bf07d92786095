"""The ownership checker: at no instant do two brokers hold or serve one bundle (or overlapping ranges); a
namespace's boundaries partition the hash space; shedding never moves a bundle to its owner nor twice
within the grace period; and no broker serves a topic while it does not hold the lock of its bundle.

A pure function over a history holding the bundle-owner observer's rows (`core/observations.py`: process
-2, f `observe-*`, `bundle-owner` (or `bundle-lock`, in runs recorded before it), `boundaries`,
`lb-leader`, `lb-event`) and the clients' ops. The rows are the same whichever load manager keeps
ownership; below, "lock" is one ownership of a bundle by one broker (a ZooKeeper lock under the modular
load manager, an Owned record of the state channel under the extensible one).

The lock timeline. Each incarnation of a lock (its bundle and incarnation: the lock's czxid) held by one broker is a
*segment* with two intervals, in the history's clock (the observer's local monotonic time):
- certain: [first seen, last known held]: from the row that showed it (created, or present at a read of
  the whole tree) to the row that showed it gone, or the start of the gap in which it went, or the end of
  the observation;
- possible: [may have been taken, may have been released]: from its creation (the creation row's time
  less how late the observer saw it, its wall clock against ZooKeeper's ctime; or -inf for a lock
  present when the recorder started, or the gap's start for one found after a gap) to its deletion row
  (or +inf for one still held when the recorder stopped).
Gaps (`observe-gap-start` .. `observe-gap-end`) are when the recorder may have missed changes.

Serving. An ok op whose f is in `serve_fs` (default: send) was served, at some instant of [its invoke,
its completion], by its serving broker: the broker named for its ledger by an ok `ledgers` op
(`{"ledgers": [{"ledger_id", "broker"}]}`, the exact signal: a ledger is written only by the broker that
created it) when there is one, else the op's `node` (the broker the client's log last named for that
producer: approximate around reconnections, which `tolerance_s` absorbs). Its bundle is every lock
range of the topic's namespace that holds CRC-32 of the full topic name (ranges are half-open, the one
ending at 0xffffffff closed). Brokers are compared by node name: a lock's "host:port" is mapped through
the recorder's `observe-start` (the cluster's nodes); names it cannot map are compared as they are.

Anomalies (each names the bundle, the brokers, the times in seconds and the rows and ops that prove it):
- `double-owner` (invalid): (lock/lock) two segments of one namespace with overlapping ranges and
  different brokers whose certain intervals overlap for longer than `lock_tolerance_s` (a split's parent
  and a child held by two brokers at once count); (lock/serve) an op served by broker B while another
  broker's segment covering the topic was certainly held over the whole op window widened by
  `tolerance_s` on each side, while B still held the topic's lock or its session was possibly alive
  (B serving after its session certainly ended, with no lock left, is `served-after-session-loss`).
- `ranges-not-partition` (invalid): a `boundaries` row whose list is not numbers, not strictly
  increasing (overlaps), does not start at 0x00000000 or end at 0xffffffff (gaps at the edges), or
  disagrees with its numBundles.
- `shed-to-owner` (invalid): an `lb-event` unload whose reason starts with "shed" and whose destination is
  its source: the leader sent a bundle back to the broker it believed owned it (Pulsar skips those,
  apache/pulsar#20822).
- `shed-to-stale-owner` (informational): a shedding unload whose destination is not its source but is
  the lock's holder at that time: the leader's load data still placed the bundle on its previous owner
  (its reports lag an assignment by a report interval), so it picked the new owner as the destination.
  Pulsar's doLoadShedding compares with the same data and does the same; the unload is wasted, nothing
  is lost.
- `unload-within-grace` (invalid): two shedding unloads of one bundle less than `grace_s` apart, decided
  by one leader process (the grace period is the leader's memory, as Pulsar's LoadData is: a new leader,
  or the same broker restarted, starts without it; events name the process by `broker` and
  `incarnation`).
- `served-without-lock` (invalid): an op served by broker B when no segment of B covering the topic was
  possibly held at any instant of the op window widened by `tolerance_s`, while B's registration
  (`/loadbalance/brokers/<id>`, ephemeral: its session) was certainly there over the window (or when no
  registration was observed at all). Judged only for windows inside the observation that touch no gap,
  and only in namespaces where some lock was observed (stats count the rest by reason);
  served-without-lock and lock/serve double-owner may report the same op.
- `served-after-session-loss` (informational unless listed in `invalid`): the same, but B's session was
  not certainly alive: Pulsar's default keeps serving what it owns after its ZooKeeper session expired,
  and fencing (the fencing checker) is what keeps the data safe then; a workload that claims
  `zookeeperSessionExpiredPolicy=shutdown` makes it invalid. Another broker may certainly hold the
  bundle meanwhile: the old owner does not know its session expired, and the new owner's fencing of
  the ledger is what stops its writes (the log checker finds any acknowledged message lost).
- `assigned-to-dead-broker` (invalid): an `lb-event` assign (the leader's placement of a bundle) naming a
  broker whose registration was certainly gone at that instant, widened by `tolerance_s` (apache/pulsar#478:
  a preallocation kept after its broker died). Judged only when registrations were observed.
- `owner-mismatch` (informational): an ok op of `owner_fs` (the admin API's answer {"bundle", "broker"})
  naming a broker other than the one certainly holding the bundle's lock over its whole window.

The verdict is False on any invalid case, else "unknown" when the history has no `observe-start` (the
recorder did not run) or served ops fall in a namespace whose locks were never seen, else True.
"""
from __future__ import annotations

from typing import Any

from checkers.toolkit import Cases, OpRefs, anomalies_of, anomaly_stats, mid_tuple, percentile, verdict
from core.history import INVOKE, NEMESIS_PROCESS, OBSERVER_PROCESS, OK, CheckResult, Op
from core.observations import (BOUNDARIES, BROKER_REGISTRATION, BUNDLE_LOCK, BUNDLE_OWNER, CHANGED, CREATED, DELETED, FULL_LOWER, FULL_UPPER,
                               GAP_END, GAP_START, LB_EVENT, LB_LEADER, OBSERVE_START, OBSERVE_STOP, PRESENT,
                               covers, overlap, parse_bundle_name, range_name, topic_hash)

INVALID_BY_DEFAULT = ("double-owner", "ranges-not-partition", "shed-to-owner", "unload-within-grace",
                      "served-without-lock", "assigned-to-dead-broker")
ANOMALY_TYPES = INVALID_BY_DEFAULT + ("served-after-session-loss", "owner-mismatch", "shed-to-stale-owner")

DEFAULTS: dict[str, Any] = {
    "invalid": INVALID_BY_DEFAULT,   # anomaly types that make `valid` False
    "max_anomalies": 1000,           # evidence entries kept per type (None: all); counts stay exact
    "tolerance_s": 1.0,              # op windows widened by this on each side (clock skew, watch delays)
    "lock_tolerance_s": 0.0,         # lock/lock overlaps up to this long are not reported
    "grace_s": 1800.0,               # loadBalancerSheddingGracePeriodMinutes = 30
    "serve_fs": ("send",),           # ok ops served by their broker
    "owner_fs": ("owner", "lookup"),  # ok ops whose value {"bundle", "broker"} is the admin API's owner
    "max_timeline_rows": 2000,       # lock segments listed in stats
}

INF = float("inf")


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check bundle ownership; see the module docstring and `ANOMALY_TYPES`."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    c = _OwnershipCheck(history, o)
    c.scan()
    c.close()
    cases = {k: Cases(o.get("max_anomalies")) for k in ANOMALY_TYPES}
    lock_lock_cases(c, cases["double-owner"])
    ranges_not_partition_cases(c, cases["ranges-not-partition"])
    shed_to_owner_cases(c, cases["shed-to-owner"], cases["shed-to-stale-owner"])
    unload_within_grace_cases(c, cases["unload-within-grace"])
    serving_cases(c, cases["double-owner"], cases["served-without-lock"], cases["served-after-session-loss"])
    owner_mismatch_cases(c, cases["owner-mismatch"])
    assigned_to_dead_cases(c, cases["assigned-to-dead-broker"])
    unknown = c.why_unknown()
    stats = c.stats()
    invalid = o.get("invalid") or ()
    stats.update(anomaly_stats(cases, invalid))
    if unknown:
        stats["unknown_because"] = unknown
    return CheckResult(verdict(cases, invalid, bool(unknown)), anomalies_of(cases), stats)


# ------------------------------------------------------------------------------------ the model

class Segment:
    """One incarnation of a lock held by one broker (see the module docstring)."""
    __slots__ = ("ns", "rng", "broker", "raw_broker", "czxid", "session", "c0", "c1", "p0", "p1", "rows",
                 "how_start", "how_end")

    def __init__(self, ns: str, rng: tuple[int, int], broker: str, raw: str, czxid: Any, session: Any,
                 c0: float, p0: float, row: int, how: str):
        self.ns, self.rng, self.broker, self.raw_broker = ns, rng, broker, raw
        self.czxid, self.session = czxid, session
        self.c0, self.p0 = c0, p0
        self.c1: float = INF
        self.p1: float = INF
        self.rows = [row]
        self.how_start, self.how_end = how, "held at the end"

    def json(self) -> dict[str, Any]:
        return {"bundle": f"{self.ns}/{range_name(*self.rng)}", "broker": self.broker,
                "lock_value_broker": self.raw_broker, "czxid": self.czxid, "session": self.session,
                "held_certainly_s": [_s(self.c0), _s(self.c1)], "held_possibly_s": [_s(self.p0), _s(self.p1)],
                "from": self.how_start, "until": self.how_end, "rows": self.rows}


def _ints(*xs: Any) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) for x in xs)


def _s(t: float) -> float | str:
    if t == INF:
        return "end"
    if t == -INF:
        return "start"
    return round(t / 1e9, 6)


class _OwnershipCheck(OpRefs):
    ref_key = True

    def __init__(self, history: list[Op], o: dict[str, Any]):
        self.h = history
        self.o = o
        self.tol = float(o.get("tolerance_s") or 0.0) * 1e9
        self.lock_tol = float(o.get("lock_tolerance_s") or 0.0) * 1e9
        self.serve_fs = frozenset(o.get("serve_fs") or ())
        self.owner_fs = frozenset(o.get("owner_fs") or ())
        self.started: Op | None = None
        self.stopped: Op | None = None
        self.last_obs = -INF
        self.first_obs = INF
        self.ports: dict[str, str] = {}
        self.hosts: dict[str, str] = {}
        self.names: set[str] = set()
        self.open: dict[str, Segment] = {}                 # lock path -> its current segment
        self.segments: list[Segment] = []
        self.gaps: list[list[Any]] = []                    # [may start, end (INF: never ended), start row]
        self.in_gap: list[Any] | None = None
        self.boundaries: list[Op] = []
        self.leaders: list[dict[str, Any]] = []
        self.lb_events: list[Op] = []
        self.served: list[tuple[Op, Op]] = []              # (invoke, ok)
        self.owner_ops: list[tuple[Op, Op]] = []
        self.ledger_broker: dict[int, str] = {}
        self.lock_rows = 0
        self.unparsed_locks = 0
        self.initial = False                               # in the recorder's first read of the tree
        self.lags: list[int] = []                          # how late creations were seen (ns)
        self.reg_open: dict[str, Segment] = {}             # registration path -> its current segment
        self.regs: dict[str, list[Segment]] = {}           # broker -> its registrations (live sessions)

    # ------------------------------------------------------------------------------------ the pass

    def canon(self, b: Any) -> str:
        """A broker's node name when the cluster's nodes tell it, else the spelling given."""
        if not b:
            return ""
        s = str(b)
        if "://" in s:
            s = s.split("://", 1)[1]
        s = s.rstrip("/")
        if s in self.names:
            return s
        if s in self.ports:
            return self.ports[s]
        host = s.rsplit(":", 1)[0] if ":" in s else s
        return self.hosts.get(host, s)

    def scan(self) -> None:
        open_: dict[int, Op] = {}
        for op in self.h:
            p = op.process
            if p < 0:
                if p == OBSERVER_PROCESS:
                    self._observation(op)
                elif p != NEMESIS_PROCESS and op.f == LB_EVENT:
                    self.lb_events.append(op)
                continue
            if op.type == INVOKE:
                open_[p] = op
                continue
            inv = open_.pop(p, None)
            if op.type != OK or inv is None or inv.f != op.f:
                continue
            f = op.f
            if f in self.serve_fs:
                self.served.append((inv, op))
            elif f in self.owner_fs:
                self.owner_ops.append((inv, op))
            elif f == "ledgers" and isinstance(op.value, dict):
                for led in op.value.get("ledgers") or ():
                    if isinstance(led, dict) and led.get("broker") and isinstance(led.get("ledger_id"), int):
                        self.ledger_broker[led["ledger_id"]] = str(led["broker"])
            elif f == LB_EVENT:
                self.lb_events.append(op)

    def _observation(self, op: Op) -> None:
        t = op.time_ns
        self.last_obs = max(self.last_obs, t)
        self.first_obs = min(self.first_obs, t)
        v = op.value if isinstance(op.value, dict) else {}
        f = op.f
        if v.get("event") != PRESENT and f not in (OBSERVE_START,):
            self.initial = False                           # the first read of the tree is over
        if f == OBSERVE_START:
            self.initial = True
            if self.started is None:
                self.started = op
            self.names |= set((v.get("nodes") or {}).keys())
            hosts: dict[str, list[str]] = {}
            for name, host in (v.get("nodes") or {}).items():
                hosts.setdefault(str(host), []).append(str(name))
            self.hosts.update({h: ns[0] for h, ns in hosts.items() if len(ns) == 1})
            self.ports.update({str(k): str(x) for k, x in (v.get("ports") or {}).items()})
        elif f == OBSERVE_STOP:
            self.stopped = op
        elif f == GAP_START:
            if self.in_gap is None:
                may = v.get("may_start_s")
                start = min(t, float(may) * 1e9) if isinstance(may, (int, float)) else -INF
                self.in_gap = [start, INF, op]
                self.gaps.append(self.in_gap)
        elif f == GAP_END:
            if self.in_gap is not None:
                self.in_gap[1] = t
                self.in_gap = None
        elif f in (BUNDLE_OWNER, BUNDLE_LOCK):         # bundle-lock: runs recorded before bundle-owner
            self.lock_rows += 1
            self._lock(op, v)
        elif f == BOUNDARIES:
            if v.get("event") != DELETED:
                self.boundaries.append(op)
        elif f == BROKER_REGISTRATION:
            self._registration(op, v)
        elif f == LB_LEADER:
            self.leaders.append({"time_s": round(t / 1e9, 6), "event": v.get("event"),
                                 "broker": self.canon(v.get("broker")), "czxid": v.get("czxid"),
                                 "row": self.op_index(op)})
        elif f == LB_EVENT:
            self.lb_events.append(op)

    def _lock(self, op: Op, v: dict[str, Any]) -> None:
        path, t, ev = op.key, op.time_ns, v.get("event")
        rng = v.get("range")
        ns = v.get("namespace")
        if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(x, int) for x in rng) and ns):
            self.unparsed_locks += 1
            return
        seg = self.open.get(path)
        gap = self.in_gap
        row = self.op_index(op)
        if ev == DELETED:
            if seg is not None:
                self._end(path, seg, t, gap, row, "deleted")
            return
        incarnation = v.get("incarnation", v.get("czxid"))
        if seg is not None and (seg.czxid != incarnation or self.canon(v.get("broker")) != seg.broker):
            # a new incarnation (its deletion unseen) or the value now names another broker
            self._end(path, seg, t, gap, row, "replaced" if ev != CHANGED else "value changed")
            seg = None
        if seg is not None:
            seg.rows.append(row)
            return
        if ev == PRESENT:
            p0 = gap[0] if gap is not None else (-INF if self.initial else t)
            how = "found after a gap" if gap is not None else "present when recording began"
        else:
            # it was created before the observer learnt of it: by how much, from ZooKeeper's ctime and
            # the observer's wall clock at the read (one machine's clock; a negative lag counts as 0)
            lag = v.get("wall_ms", 0) - v.get("ctime_ms", 0) if ev == CREATED and _ints(
                v.get("wall_ms"), v.get("ctime_ms")) else 0
            lag_ns = max(0, lag) * 1_000_000
            if lag_ns:
                self.lags.append(lag_ns)
            p0, how = t - lag_ns, ev or "created"
        broker = self.canon(v.get("broker"))
        seg = Segment(ns, (rng[0], rng[1]), broker, str(v.get("broker")), incarnation, v.get("session"),
                      t, p0, row, how)
        self.open[path] = seg
        self.segments.append(seg)

    def _registration(self, op: Op, v: dict[str, Any]) -> None:
        """A broker's registration (its live session) as a segment of its own, over no range."""
        path, t, ev, gap = op.key, op.time_ns, v.get("event"), self.in_gap
        seg = self.reg_open.get(path)
        row = self.op_index(op)
        if ev == DELETED:
            if seg is not None:
                self._end(path, seg, t, gap, row, "deleted", self.reg_open)
            return
        if seg is not None and seg.czxid == v.get("czxid"):
            return
        if seg is not None:
            self._end(path, seg, t, gap, row, "replaced", self.reg_open)
        p0 = (gap[0] if gap is not None else (-INF if self.initial else t)) if ev == PRESENT else t
        seg = Segment("", (0, 0), self.canon(v.get("broker")), str(v.get("broker")), v.get("czxid"),
                      v.get("session"), t, p0, row, ev or "created")
        self.reg_open[path] = seg
        self.regs.setdefault(seg.broker, []).append(seg)

    def session_certainly_live(self, broker: str, a: float, b: float) -> bool | None:
        """Whether the broker's registration was certainly there over [a, b]; None when no registration
        was observed at all (the brokers register elsewhere: nothing can be said)."""
        if not self.regs:
            return None
        return any(r.c0 <= a and b <= r.c1 for r in self.regs.get(broker, ()))

    def _end(self, path: str, seg: Segment, t: float, gap: list[Any] | None, row: int, how: str,
             open_: dict[str, Segment] | None = None) -> None:
        seg.rows.append(row)
        seg.p1 = t
        if gap is not None:          # found gone by the re-read: it went somewhere in the gap
            seg.c1 = max(seg.c0, gap[0])
            seg.how_end = f"{how} (found after a gap)"
        else:
            seg.c1 = t
            seg.how_end = how
        (self.open if open_ is None else open_).pop(path, None)

    def close(self) -> None:
        """Segments still held when the observation ended: held certainly until then, possibly beyond."""
        end = self.stopped.time_ns if self.stopped is not None else self.last_obs
        for seg in [*self.open.values(), *self.reg_open.values()]:
            seg.c1 = max(seg.c0, end)
        self.window = (self.started.time_ns if self.started is not None else INF, end)
        self.by_ns: dict[str, dict[tuple[int, int], list[Segment]]] = {}
        for seg in self.segments:
            self.by_ns.setdefault(seg.ns, {}).setdefault(seg.rng, []).append(seg)
        self._topic_ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}

    # ------------------------------------------------------------------------------------ queries

    def ranges_of(self, ns: str, h: int) -> list[tuple[int, int]]:
        key = (ns, h)
        got = self._topic_ranges.get(key)
        if got is None:
            got = [r for r in self.by_ns.get(ns, {}) if covers(r, h)]
            self._topic_ranges[key] = got
        return got

    def in_gap_or_outside(self, a: float, b: float) -> str | None:
        """Why [a, b] cannot be judged (outside the observation, or touching a gap); None if it can."""
        w0, w1 = self.window
        if a < w0 or b > w1:
            return "outside the observation"
        for g0, g1, _ in self.gaps:
            if a <= g1 and g0 <= b:
                return "in a gap of the observation"
        return None

    def serving_broker(self, op: Op) -> tuple[str, str]:
        m = mid_tuple(op.message_id)
        if m is not None and m[0] in self.ledger_broker:
            return self.canon(self.ledger_broker[m[0]]), "ledger-metadata"
        return self.canon(op.node), "client-log"

    def why_unknown(self) -> list[str]:
        why = []
        if self.started is None:
            why.append("no observe-start row: the ownership recorder did not run (fix: run with a workload "
                       "whose checkers include ownership, so the runner starts it)")
        if getattr(self, "unseen_namespaces", None):
            why.append(f"ops served in namespaces whose locks were never observed: "
                       f"{', '.join(sorted(self.unseen_namespaces))}")
        return why

    def stats(self) -> dict[str, Any]:
        brokers: dict[str, int] = {}
        for s in self.segments:
            brokers[s.broker] = brokers.get(s.broker, 0) + 1
        cap = int(self.o.get("max_timeline_rows") or 0)
        lags = sorted(self.lags)
        return {
            "observed": self.started is not None,
            "observation_s": [_s(self.window[0]) if self.started is not None else None, _s(self.window[1])],
            "lock_rows": self.lock_rows, "lock_segments": len(self.segments), "segments_by_broker": brokers,
            "registrations": {b: [r.json() for r in rs[:cap]] for b, rs in self.regs.items()},
            "unparsed_lock_rows": self.unparsed_locks,
            "gaps": [{"from_s": _s(g0), "to_s": _s(g1),
                      "reason": row.value.get("reason") if isinstance(row.value, dict) else None}
                     for g0, g1, row in self.gaps],
            "creation_seen_late_s": {"n": len(lags), "p50": _p(lags, 0.5), "p99": _p(lags, 0.99),
                                     "max": _p(lags, 1.0)},
            "boundaries_rows": len(self.boundaries), "leaders": self.leaders[:cap],
            "lb_events": len(self.lb_events), "served_ops": len(self.served),
            "served_judged": getattr(self, "judged", 0), "served_unjudged": getattr(self, "unjudged", {}),
            "serving_signal": getattr(self, "signals", {}),
            "timeline": [s.json() for s in self.segments[:cap]],
        }


def _p(sorted_ns: list[int], q: float) -> float | None:
    v = percentile(sorted_ns, q)
    return None if v is None else round(v / 1e9, 6)


# ------------------------------------------------------------------------------------ the finders

def lock_lock_cases(c: _OwnershipCheck, cases: Cases) -> None:
    """`double-owner` (lock/lock): two brokers' segments of overlapping ranges certainly held at once for
    longer than `lock_tolerance_s`. A sweep over each namespace's segments by their certain start."""
    by_ns: dict[str, list[Segment]] = {}
    for s in c.segments:
        by_ns.setdefault(s.ns, []).append(s)
    for ns, segs in by_ns.items():
        segs.sort(key=lambda s: s.c0)
        active: list[Segment] = []
        for s in segs:
            active = [a for a in active if a.c1 - s.c0 > c.lock_tol]
            for a in active:
                if a.broker != s.broker and overlap(a.rng, s.rng):
                    t0, t1 = max(a.c0, s.c0), min(a.c1, s.c1)
                    if t1 - t0 > c.lock_tol:
                        cases.add(lambda a=a, s=s, t0=t0, t1=t1: {
                            "kind": "lock/lock", "namespace": ns,
                            "bundles": [range_name(*a.rng), range_name(*s.rng)], "brokers": [a.broker, s.broker],
                            "from_s": _s(t0), "to_s": _s(t1), "locks": [a.json(), s.json()]})
            active.append(s)


def ranges_not_partition_cases(c: _OwnershipCheck, cases: Cases) -> None:
    """`ranges-not-partition`: a boundaries row whose list does not partition [0x00000000, 0xffffffff]."""
    for op in c.boundaries:
        v = op.value if isinstance(op.value, dict) else {}
        b = v.get("boundaries")
        if b is None:
            continue                        # the value holds no boundaries (yet): nothing to judge
        problems = []
        if not isinstance(b, list) or any(not isinstance(x, int) or isinstance(x, bool) for x in b):
            problems.append("boundaries that are not numbers")
        else:
            if len(b) < 2:
                problems.append(f"{len(b)} boundaries: no bundle")
            else:
                if b[0] != FULL_LOWER:
                    problems.append(f"starts at 0x{b[0]:08x}, not 0x00000000 (a gap below)")
                if b[-1] != FULL_UPPER:
                    problems.append(f"ends at 0x{b[-1]:08x}, not 0xffffffff (a gap above)")
                bad = [i for i in range(1, len(b)) if b[i] <= b[i - 1]]
                if bad:
                    problems.append("not strictly increasing at " + ", ".join(
                        f"#{i} (0x{b[i - 1]:08x} then 0x{b[i]:08x})" for i in bad[:5]) + " (overlapping ranges)")
                if any(x < FULL_LOWER or x > FULL_UPPER for x in b):
                    problems.append("a boundary outside [0x00000000, 0xffffffff]")
                n = v.get("num_bundles")
                if isinstance(n, int) and n != len(b) - 1:
                    problems.append(f"numBundles {n} but {len(b) - 1} ranges")
        if problems:
            cases.add(lambda op=op, b=b, problems=problems: {
                "namespace": (op.value or {}).get("namespace"), "time_s": round(op.time_ns / 1e9, 6),
                "boundaries": [f"0x{x:08x}" if isinstance(x, int) and x >= 0 else x for x in b]
                if isinstance(b, list) else b,
                "problems": problems, "version": (op.value or {}).get("version"), "row": c.ref(op)})


def _unloads(c: _OwnershipCheck) -> list[tuple[Op, dict[str, Any]]]:
    out = []
    for op in c.lb_events:
        v = op.value if isinstance(op.value, dict) else {}
        if v.get("event") == "unload":
            out.append((op, v))
    return out


def _held_certainly_at(c: _OwnershipCheck, bundle: str, t: float) -> Segment | None:
    parsed = parse_bundle_name(bundle)
    if parsed is None:
        return None
    ns, rng = parsed
    for s in c.by_ns.get(ns, {}).get(rng, ()):
        if s.c0 <= t <= s.c1:
            return s
    return None


def shed_to_owner_cases(c: _OwnershipCheck, cases: Cases, stale: Cases) -> None:
    """`shed-to-owner`: a shedding unload whose destination is its source; `shed-to-stale-owner`: one
    whose destination is another broker that held the lock then (the leader's view was behind)."""
    for op, v in _unloads(c):
        if not str(v.get("reason") or "").startswith("shed") or not v.get("destination"):
            continue
        dest = c.canon(v.get("destination"))
        src = c.canon(v.get("source")) if v.get("source") else ""
        holder = _held_certainly_at(c, str(v.get("bundle") or op.key), op.time_ns)
        if dest == src or (holder is not None and holder.broker == dest):
            (cases if dest == src else stale).add(lambda op=op, v=v, dest=dest, src=src, holder=holder: {
                "bundle": v.get("bundle") or op.key, "source": src or None, "destination": dest,
                "lock_holder": holder.json() if holder is not None else None, "reason": v.get("reason"),
                "leader": c.canon(v.get("leader")) or None, "time_s": round(op.time_ns / 1e9, 6),
                "event": c.ref(op)})


def assigned_to_dead_cases(c: _OwnershipCheck, cases: Cases) -> None:
    """`assigned-to-dead-broker`: an assign event naming a broker with no registration possibly there."""
    if not c.regs:
        return
    tol = c.tol
    for op in c.lb_events:
        v = op.value if isinstance(op.value, dict) else {}
        if v.get("event") != "assign" or not v.get("destination"):
            continue
        dest = c.canon(v.get("destination"))
        t = op.time_ns
        regs = c.regs.get(dest, [])
        if any(r.p0 - tol <= t <= r.p1 + tol for r in regs):
            continue
        if c.in_gap_or_outside(t - tol, t + tol) is not None:
            continue
        cases.add(lambda op=op, v=v, dest=dest, regs=regs: {
            "bundle": v.get("bundle") or op.key, "destination": dest, "reason": v.get("reason"),
            "leader": c.canon(v.get("leader")) or None, "time_s": round(op.time_ns / 1e9, 6),
            "its_registrations": [r.json() for r in regs[:5]], "event": c.ref(op)})


def unload_within_grace_cases(c: _OwnershipCheck, cases: Cases) -> None:
    """`unload-within-grace`: a bundle shed again by the same leader process less than `grace_s` after
    it shed it."""
    grace = float(c.o.get("grace_s") or 0.0) * 1e9
    last: dict[tuple[str, str, Any], Op] = {}
    for op, v in sorted(_unloads(c), key=lambda x: x[0].time_ns):
        if not str(v.get("reason") or "").startswith("shed"):
            continue
        b = (str(v.get("bundle") or op.key), c.canon(v.get("broker") or v.get("leader")), v.get("incarnation"))
        prev = last.get(b)
        if prev is not None and op.time_ns - prev.time_ns < grace:
            cases.add(lambda op=op, prev=prev, b=b: {
                "bundle": b[0], "leader": b[1] or None, "first_s": round(prev.time_ns / 1e9, 6),
                "again_s": round(op.time_ns / 1e9, 6),
                "apart_s": round((op.time_ns - prev.time_ns) / 1e9, 6), "grace_s": c.o.get("grace_s"),
                "events": [c.ref(prev), c.ref(op)]})
        last[b] = op


def serving_cases(c: _OwnershipCheck, double: Cases, without: Cases, after_loss: Cases) -> None:
    """`double-owner` (lock/serve) and `served-without-lock`, for every served op (module docstring)."""
    judged = 0
    unjudged: dict[str, int] = {}
    signals: dict[str, int] = {}
    unseen: set[str] = set()
    tol = c.tol
    for inv, ok in c.served:
        broker, signal = c.serving_broker(ok)
        if not broker:
            unjudged["no serving broker"] = unjudged.get("no serving broker", 0) + 1
            continue
        m = mid_tuple(ok.message_id)
        th = topic_hash(ok.key or inv.key, m[2] if m is not None else -1)
        if th is None:
            unjudged["not a topic name"] = unjudged.get("not a topic name", 0) + 1
            continue
        ns, h = th
        if ns not in c.by_ns:
            unseen.add(ns)
            unjudged["no lock of its namespace observed"] = unjudged.get("no lock of its namespace observed", 0) + 1
            continue
        a, b = inv.time_ns - tol, ok.time_ns + tol
        why = c.in_gap_or_outside(a, b)
        if why is not None:
            unjudged[why] = unjudged.get(why, 0) + 1
            continue
        judged += 1
        signals[signal] = signals.get(signal, 0) + 1
        mine: list[Segment] = []
        others: list[Segment] = []
        for rng in c.ranges_of(ns, h):
            for s in c.by_ns[ns][rng]:
                if s.broker == broker:
                    if s.p0 <= b and a <= s.p1:
                        mine.append(s)
                elif s.c0 <= a and b <= s.c1:
                    others.append(s)
        live = c.session_certainly_live(broker, a, b)
        if others and (live is not False or mine):
            double.add(lambda inv=inv, ok=ok, broker=broker, signal=signal, others=others, h=h: {
                "kind": "lock/serve", "topic": ok.key or inv.key, "hash": f"0x{h:08x}",
                "bundles": sorted({range_name(*s.rng) for s in others}),
                "brokers": [broker] + sorted({s.broker for s in others}), "served_by": broker, "signal": signal,
                "window_s": [round(inv.time_ns / 1e9, 6), round(ok.time_ns / 1e9, 6)],
                "op": c.ref(ok), "invoke": c.ref(inv), "held_by": [s.json() for s in others]})
        if not mine:
            near = [s for rng in c.ranges_of(ns, h) for s in c.by_ns[ns][rng] if s.broker == broker]
            regs = c.regs.get(broker, [])
            (without if live is not False else after_loss).add(
                lambda inv=inv, ok=ok, broker=broker, signal=signal, near=near, h=h, ns=ns, others=others,
                live=live, regs=regs: {
                    "topic": ok.key or inv.key, "hash": f"0x{h:08x}", "namespace": ns, "served_by": broker,
                    "signal": signal, "window_s": [round(inv.time_ns / 1e9, 6), round(ok.time_ns / 1e9, 6)],
                    "tolerance_s": c.o.get("tolerance_s"), "op": c.ref(ok), "invoke": c.ref(inv),
                    "session": {None: "no registration observed", True: "registered throughout",
                                False: "not certainly registered"}[live],
                    "its_registrations": [r.json() for r in regs[:5]],
                    "its_locks_of_the_topic": [s.json() for s in near[:5]],
                    "held_by_others": [s.json() for s in others[:5]]})
    c.judged, c.unjudged, c.signals, c.unseen_namespaces = judged, unjudged, signals, unseen


def owner_mismatch_cases(c: _OwnershipCheck, cases: Cases) -> None:
    """`owner-mismatch` (informational): the admin API named an owner other than the certain lock holder."""
    for inv, ok in c.owner_ops:
        v = ok.value if isinstance(ok.value, dict) else {}
        bundle, named = v.get("bundle") or ok.key or inv.key, c.canon(v.get("broker") or v.get("owner"))
        if not named or not bundle:
            continue
        parsed = parse_bundle_name(str(bundle))
        if parsed is None:
            continue
        ns, rng = parsed
        a, b = inv.time_ns - c.tol, ok.time_ns + c.tol
        for s in c.by_ns.get(ns, {}).get(rng, ()):
            if s.c0 <= a and b <= s.c1 and s.broker != named:
                cases.add(lambda inv=inv, ok=ok, s=s, named=named, bundle=bundle: {
                    "bundle": bundle, "reported_owner": named, "lock_holder": s.broker,
                    "window_s": [round(inv.time_ns / 1e9, 6), round(ok.time_ns / 1e9, 6)], "op": c.ref(ok),
                    "lock": s.json()})
                break


__all__ = ["ANOMALY_TYPES", "DEFAULTS", "INVALID_BY_DEFAULT", "check", "covers", "overlap", "topic_hash"]
