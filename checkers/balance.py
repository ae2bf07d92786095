"""The balance checker: how the load balancer spreads load after brokers leave and join, how often it
moves bundles, and how long each move leaves the moved topics without an acknowledged send.

A pure function over a history holding the brokers' `lb-event` rows (`core/observations.py`, from
`harness/lb_events.py`), the nemesis ops and the clients' sends. What it reads:

- Load. Every `load-report` event (one per broker per report interval) gives that broker's
  `max_usage_with_weight` (0..1, what the shedders compare), message rates, `numBundles` and
  `numTopics`. A broker is *live* at instant t when its last report is at most `report_window_s` old
  (default: 3 x the median interval between one broker's reports, at least 1 s).
- Scale events. Each occurrence of a fault in `scale_faults` (default scale, kill, kill-role) that
  targets a broker: its start's completion (brokers leave) and its stop's completion (they join).
- Time to balanced, per scale event: the first instant at or after the event when the live brokers
  reflect it (a leaving broker no longer live, a joining one has reported since) and, over them, the
  spread (max - min) of max_usage_with_weight is at most `target_spread` (default 0.10, Pulsar's
  loadBalancerBrokerThresholdShedderPercentage = 10) and the spread of numTopics is at most
  `target_topic_spread` (default: `topic_spread_fraction` (0.5) x the live brokers' mean numTopics,
  but never less than their mean topics per bundle: the balancer moves whole bundles, so one bundle's
  worth is the finest spread it can reach). Instants are the reports and the moments a broker's last
  report goes stale, up to the last send (the load winds down after it, through the settle and the final
  reads, and the brokers are torn down after those: a cluster whose traffic stops, or whose brokers stop
  one by one, would look balanced). With `smooth_s` a broker's score is the mean of its reports over the
  last `smooth_s` seconds instead of its last report. With `spread_measure="band"` the usage criterion is
  every live broker within `target_spread` of their mean (ThresholdShedder's own band) instead of max -
  min. With `scores="leader"` the scores are the leader's averaged ones that ThresholdShedder compares
  (its `shedding` events), the instants its cycles, the live brokers those it judged, and the topic
  criterion is not applied. With `hold_s` the criterion must then hold at every instant for `hold_s`
  seconds (judged up to the last send; the time is to the first of them). With `settled` the time is to
  the start of the streak that lasts until the event's phase ends (the next scale event's beginning, its
  op's invocation: brokers stop or start reporting before it completes; or the last send), if it lasted
  `hold_s`: the settling time ("not balanced before the next event" otherwise). Otherwise "not balanced by the end".
- Moves. `unload` events by reason (`shed:<Strategy>`, `split`), `split` and `split-decision` events,
  and the nemesis's admin `unload` and `split` ops (ok or info starts; their bundles from the value:
  `bundle`, `bundles` or `splits`). Admin unloads log no event; an admin split logs `split` and its
  children's `unload` events, so a nemesis op is an unload episode of its own only when no `unload`
  event of an overlapping bundle falls in [its invoke, its completion + 1 s].
- Unavailability, per unload episode (its instant: the event's time, or the nemesis op's invoke) and
  per topic of the bundle (CRC-32 of the full topic name in the bundle's range; a partition's name is
  `<topic>-partition-<p>`): the gap between the last ok send completed before the instant and the first
  ok send completed after it, beside the topic's median gap between ok sends (its usual pace: a topic
  sent to rarely has long gaps anyway). No ok send after it: unavailable until the topic's last failed
  send (`open_until_end`); a topic no send tried again after the unload is not judged.

Anomalies (none by default: Pulsar promises neither a convergence time nor a bound on unavailability;
the stats report both either way):
- `not-balanced` (only when `require_convergence` is true; default false, since 60 s runs are short):
  a scale event after which the cluster was never balanced. Invalid.
- `long-unavailability` (only when `max_unavailable_s` is set): a topic's gap after an unload longer
  than `max_unavailable_s` (a gap open until the end counts). Invalid.
The verdict is "unknown" when `require_convergence` is true and the history has no load-report rows.
"""
from __future__ import annotations

import bisect
import functools
import statistics
from collections import deque
from typing import Any

from checkers.toolkit import Cases, anomalies_of, anomaly_stats, partition_of, percentile, rounded, verdict
from core import faults as fg
from core.history import INVOKE, NEMESIS_PROCESS, OBSERVER_PROCESS, OK, CheckResult, Op
from core.observations import LB_EVENT, OBSERVE_START, covers, overlap, parse_bundle_name, topic_hash

ANOMALY_TYPES = ("not-balanced", "long-unavailability")

DEFAULTS: dict[str, Any] = {
    "target_spread": 0.10,           # loadBalancerBrokerThresholdShedderPercentage / 100
    "target_topic_spread": None,     # None: topic_spread_fraction x mean numTopics, >= topics per bundle
    "topic_spread_fraction": 0.5,
    "report_window_s": None,         # None: 3 x the median report interval, at least 1 s
    "require_convergence": False,    # not-balanced makes the verdict False
    "max_unavailable_s": None,       # a topic gap longer than this after an unload: long-unavailability
    "scale_faults": ("scale", "kill", "kill-role"),
    "unload_faults": ("unload",),
    "split_faults": ("split",),
    "send_fs": ("send",),
    # > 0: a broker's load score at an instant is the mean of its reports' max_usage_with_weight over the
    # last smooth_s seconds (one report is one interval's bytes and CPU time: noisy at a test's rates);
    # 0: its last report, as is
    "smooth_s": 0.0,
    # how the load scores are judged against target_spread: "range", max - min; "band", every live broker
    # within target_spread of their mean (ThresholdShedder's own band: it sheds a broker above mean +
    # threshold and, with lowerBoundarySheddingEnabled, towards one below mean - threshold)
    "spread_measure": "range",
    # whose scores: "reports", each broker's load reports; "leader", the leader's averaged scores that
    # ThresholdShedder compares (`shedding` events: avg_usage per broker, the topic criterion not applied)
    "scores": "reports",
    # > 0: balanced only once the criterion has held at every instant for hold_s seconds (the time is
    # still to the first of them): a band met by chance for a moment, e.g. by a joined broker's first
    # one or two reports, does not count
    "hold_s": 0.0,
    # True: balanced only from the start of the streak that lasts until the event's phase ends (the next
    # scale event, or the last send), and at least hold_s: the settling time. A load still arriving (the
    # producers of a leaving broker's bundles come back over some 20 s) can meet the band for a while
    # before it moves out of it; that is not convergence
    "settled": False,
    "max_anomalies": 1000,
    "max_unavailability_rows": 500,  # per-topic rows listed in stats (the worst first)
}


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Judge balance after scale events and unavailability during unloads; see the module docstring."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    for k, allowed in (("spread_measure", ("range", "band")), ("scores", ("reports", "leader"))):
        if o.get(k) not in allowed:
            raise ValueError(f"balance checker option {k}={o.get(k)!r}: use one of {', '.join(allowed)}")
    b = _Balance(history, o)
    b.scan()
    cases = {k: Cases(o.get("max_anomalies")) for k in ANOMALY_TYPES}
    events = b.scale_events()
    if o.get("require_convergence"):
        not_balanced_cases(events, cases["not-balanced"])
    episodes = b.unload_episodes()
    gaps = b.unavailability(episodes)
    long_unavailability_cases(gaps, o.get("max_unavailable_s"), cases["long-unavailability"])
    invalid = []
    if o.get("require_convergence"):
        invalid.append("not-balanced")
    if o.get("max_unavailable_s") is not None:
        invalid.append("long-unavailability")
    unknown = bool(o.get("require_convergence")) and not b.reports
    stats = b.stats(events, episodes, gaps)
    stats.update(anomaly_stats(cases, invalid))
    if unknown:
        stats["unknown_because"] = ["no load-report rows in the history: the brokers logged no load reports "
                                    "(fix: brokers with load-report LB_EVENTs, clusters/loadbalancer/modular.py)"]
    return CheckResult(verdict(cases, invalid, unknown), anomalies_of(cases), stats)


# ------------------------------------------------------------------------------------ finders

def not_balanced_cases(events: list[dict[str, Any]], cases: Cases) -> None:
    """Scale events after which the cluster was never balanced (judged only when there were reports)."""
    for e in events:
        if e["balanced_after_s"] is None and e.get("judged"):
            cases.add(lambda e=e: dict(e))


def long_unavailability_cases(gaps: list[dict[str, Any]], limit: Any, cases: Cases) -> None:
    """Topics of an unloaded bundle without an ok send for longer than `limit` seconds."""
    if limit is None:
        return
    for g in gaps:
        if g["gap_s"] is not None and g["gap_s"] > float(limit):
            cases.add(lambda g=g: dict(g))


# ------------------------------------------------------------------------------------ the model

class _Streak:
    """The first instant of a run of instants at which the criterion held for at least `hold_ns`
    (0: the first instant it held); an instant where it did not, or that does not reflect the event,
    starts over. `settled`: feed answers nothing, and `settled_at(end)` gives the start of the run still
    going at `end`, if it lasted `hold_ns`."""

    def __init__(self, hold_ns: float, settled: bool = False):
        self.hold = hold_ns
        self.settled = settled
        self.start: tuple[float, Any] | None = None

    def feed(self, t: float, ok: bool, info: Any = None) -> tuple[float, Any] | None:
        if not ok:
            self.start = None
            return None
        if self.start is None:
            self.start = (t, info)
        return self.start if not self.settled and t - self.start[0] >= self.hold else None

    def settled_at(self, end: float) -> tuple[float, Any] | None:
        if self.settled and self.start is not None and end - self.start[0] >= self.hold:
            return self.start
        return None


def _reflects(kind: str, brokers: list[str], present: Any, reported_since: Any = None) -> bool:
    """Whether the brokers `present` at an instant reflect a scale event: none of a leave's brokers is
    there; every one of a join's is (and, for reports, has reported since the event)."""
    if kind == "leave":
        return not any(b in present for b in brokers)
    return all(b in present and (reported_since is None or b in reported_since) for b in brokers)


def _mean_since(samples: deque[tuple[int, float]], since: float, default: Any) -> Any:
    """The mean of the samples taken at or after `since` (the last one if none is that recent). Instants
    only move forward, so older samples are dropped for good (the last one kept)."""
    while len(samples) > 1 and samples[0][0] < since:
        samples.popleft()
    if not samples:
        return default
    vals = [u for t, u in samples if t >= since]
    return sum(vals) / len(vals) if vals else samples[-1][1]


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _s(t_ns: float | None) -> float | None:
    return None if t_ns is None else round(t_ns / 1e9, 3)


class _Balance:
    def __init__(self, history: list[Op], o: dict[str, Any]):
        self.h = history
        self.o = o
        self.ports: dict[str, str] = {}       # "host:port" -> node name
        self.hosts: dict[str, str] = {}       # host -> node name
        self.reports: list[tuple[int, str, dict[str, Any]]] = []    # (t, broker, value)
        self.lb: list[tuple[int, dict[str, Any]]] = []               # other lb-events (t, value)
        self.nemesis: list[Op] = []
        self.sends: dict[str, list[int]] = {}      # full topic name -> ok send completion times
        self.failed: dict[str, list[int]] = {}     # full topic name -> fail/info send completion times
        self.t_end = 0
        self.t_clients = -1                        # the last send: the load winds down after it (settle,
                                                   # final reads) and the brokers' teardown comes after

    def canon(self, b: Any) -> str:
        if not b:
            return ""
        s = str(b)
        if "://" in s:
            s = s.split("://", 1)[1]
        s = s.rstrip("/")
        if s in self.ports:
            return self.ports[s]
        host = s.rsplit(":", 1)[0] if ":" in s else s
        return self.hosts.get(host, s)

    def scan(self) -> None:
        send_fs = frozenset(self.o.get("send_fs") or ())
        for op in self.h:
            self.t_end = max(self.t_end, op.time_ns)
            p = op.process
            if p == NEMESIS_PROCESS:
                self.nemesis.append(op)
                continue
            if p == OBSERVER_PROCESS:
                v = op.value if isinstance(op.value, dict) else {}
                if op.f == OBSERVE_START:
                    self.hosts.update({h: n for n, h in (v.get("nodes") or {}).items() if isinstance(h, str)})
                    self.ports.update({k: n for k, n in (v.get("ports") or {}).items() if isinstance(n, str)})
                elif op.f == LB_EVENT:
                    if v.get("event") == "load-report":
                        if v.get("logged_by") and v.get("broker"):
                            self.ports.setdefault(str(v["broker"]), str(v["logged_by"]))
                        self.reports.append((op.time_ns, str(v.get("logged_by") or v.get("broker") or ""), v))
                    else:
                        self.lb.append((op.time_ns, v))
                continue
            if p >= 0 and op.f in send_fs:
                self.t_clients = max(self.t_clients, op.time_ns)
            if p < 0 or op.f not in send_fs or op.type == INVOKE:
                continue
            th = topic_hash(op.key, partition_of(op.message_id))
            if th is None:
                continue
            name = op.key if partition_of(op.message_id) < 0 or "-partition-" in op.key.rsplit("/", 1)[-1] \
                else f"{op.key}-partition-{partition_of(op.message_id)}"
            (self.sends if op.type == OK else self.failed).setdefault(name, []).append(op.time_ns)
        self.reports.sort(key=lambda r: r[0])
        # a report's broker by node name, however it was spelt
        self.reports = [(t, self.canon(b) if ":" in b else b, v) for t, b, v in self.reports]
        for ts in (*self.sends.values(), *self.failed.values()):
            ts.sort()
        self.brokers = sorted({b for _, b, _ in self.reports})
        self.window = self._window()

    def _window(self) -> float:
        w = self.o.get("report_window_s")
        if w is not None:
            return float(w) * 1e9
        gaps = []
        last: dict[str, int] = {}
        for t, b, _ in self.reports:
            if b in last:
                gaps.append(t - last[b])
            last[b] = t
        med = statistics.median(gaps) if gaps else 1e9
        return max(1e9, 3 * med)

    # ---------------------------------------------------------------------------- scale events

    def _broker_targets(self, value: Any, start_value: Any) -> list[str]:
        """The brokers a scale fault took away: its nodes when its role is broker, else the nodes that
        sent load reports or are named like brokers (scale's value names no role)."""
        names: list[str] = []
        role = None
        for v in (start_value, value):
            if not isinstance(v, dict):
                continue
            role = role or v.get("role")
            for n in list(v.get("nodes") or []) + ([v["node"]] if v.get("node") else []):
                if isinstance(n, str) and n not in names:
                    names.append(n)
        if role not in (None, "broker"):
            return []
        return [n for n in names if role == "broker" or n in self.brokers or n.startswith("broker")]

    def scale_events(self) -> list[dict[str, Any]]:
        scale = frozenset(self.o.get("scale_faults") or ())
        tl = fg.FaultTimeline()
        for op in self.nemesis:
            tl.feed(op.time_ns, op.type, op.f, op=op)
        events = []
        for p in tl.occurrences():
            if p.name not in scale:
                continue
            targets = self._broker_targets(p.value, getattr(p.start_op, "value", None))
            if not targets:
                continue
            # (at, the moment it began to happen, ...): an event is judged from its op's completion (the
            # brokers are gone, or back), but began with the op's invocation (a leaving broker stops
            # reporting, a joining one reports, before the op completes)
            events.append((p.started_ns, p.start_ns, f"{p.name} start", "leave", targets))
            if p.stop_ns is not None:
                events.append((p.stop_ns, p.stop_began_ns or p.stop_ns, f"{p.name} stop", "join", targets))
        events.sort(key=lambda x: x[0])
        judged = []
        for at, _, what, kind, targets in events:
            # settled: judged until the first later event began (its phase: the brokers present then no
            # longer reflect it); otherwise up to the last send, as always
            later = [began for _, began, *_ in events if began > at]
            until = min(later) if later and self.o.get("settled") else None
            judged.append(self._judge(what, kind, targets, at, until))
        events = judged
        for i, e in enumerate(events):
            nxt = events[i + 1]["at_s"] if i + 1 < len(events) else None
            e["next_event_s"] = nxt
            e["before_next_event"] = (e["balanced_after_s"] is not None and
                                      (nxt is None or e["at_s"] + e["balanced_after_s"] <= nxt))
        return events

    def spread(self, live: dict[str, dict[str, Any]]) -> tuple[float, float, float] | None:
        """(usage spread, topic spread, the topic target) over live brokers; None if none is live."""
        us = [u for u in (_num(v.get("max_usage_with_weight")) for v in live.values()) if u is not None]
        ts = [x for x in (_num(v.get("numTopics")) for v in live.values()) if x is not None]
        if not us or not ts:
            return None
        target = self.o.get("target_topic_spread")
        if target is None:
            mean = sum(ts) / len(ts)
            bundles = sum(_num(v.get("numBundles")) or 0 for v in live.values())
            per_bundle = sum(ts) / bundles if bundles else 0.0
            target = max(float(self.o.get("topic_spread_fraction") or 0) * mean, per_bundle)
        return self.usage_spread(us), max(ts) - min(ts), float(target)

    def usage_spread(self, us: list[float]) -> float:
        """The spread of load scores `spread_measure` names: max - min, or the largest distance from
        their mean ("band")."""
        if self.o.get("spread_measure") == "band":
            mean = sum(us) / len(us)
            return max(abs(u - mean) for u in us)
        return max(us) - min(us)

    @functools.cached_property
    def leader_scores(self) -> list[tuple[int, dict[str, float]]]:
        """(t, {broker node: averaged score}) of every ThresholdShedder cycle of the leader (read once,
        for every scale event)."""
        out = []
        for t, v in self.lb:
            if v.get("event") != "shedding":
                continue
            rec = (v.get("plan") or {}).get("strategy_record") or {}
            scores = {self.canon(b): _num(d.get("avg_usage")) for b, d in (rec.get("brokers") or {}).items()
                      if isinstance(d, dict)}
            scores = {b: u for b, u in scores.items() if u is not None}
            if scores:
                out.append((t, scores))
        return out

    def _streak(self) -> _Streak:
        return _Streak(float(self.o.get("hold_s") or 0.0) * 1e9, bool(self.o.get("settled")))

    def _judge_leader(self, e: dict[str, Any], kind: str, brokers: list[str], at: float,
                      end: float, cut: bool) -> dict[str, Any]:
        """_judge on the leader's averaged scores: the first shedding cycle at or after `at` (and before
        `end`) whose brokers reflect the event and whose scores are within the target."""
        cycles = [(t, sc) for t, sc in self.leader_scores if at <= t < end]
        e["judged"] = bool(cycles)
        last = held = None
        streak = self._streak()
        for t, sc in cycles:
            if not _reflects(kind, brokers, sc):
                streak.feed(t, False)
                continue
            sp = self.usage_spread(list(sc.values()))
            last = (t, sp, sc)
            held = streak.feed(t, sp <= float(self.o["target_spread"]) + 1e-12, (sp, sc))
            if held:
                break
        held = held or streak.settled_at(end)
        if held:
            t0, (sp0, sc0) = held
            e.update(balanced_after_s=round((t0 - at) / 1e9, 3), outcome="balanced", usage_spread=round(sp0, 4),
                     live_brokers=sorted(sc0))
            return e
        e["outcome"] = (("not balanced before the next event" if cut else "not balanced by the end") if cycles
                        else "unknown: no shedding cycles of ThresholdShedder")
        if last is not None:
            e.update(last_usage_spread=round(last[1], 4), live_brokers=sorted(last[2]), last_judged_s=_s(last[0]))
        return e

    def _judge(self, what: str, kind: str, brokers: list[str], at: float, until: float | None) -> dict[str, Any]:
        """Sweep the instants from `at` on (the event, each report, each report going stale) with each
        broker's last report so far, up to the last send and before `until` (the next event began; only
        when settled); the first instant that reflects the event and is balanced (settled: the start of
        the streak still going at the end)."""
        e: dict[str, Any] = {"event": what, "kind": kind, "brokers": brokers, "at_s": _s(at),
                             "balanced_after_s": None, "judged": bool(self.reports)}
        if self.o.get("scores") == "leader":
            end = self.t_clients if self.t_clients >= 0 else self.t_end
            return self._judge_leader(e, kind, brokers, at, end + 1 if until is None else min(end + 1, until),
                                      until is not None and until <= end + 1)
        if not self.reports:
            e["outcome"] = "unknown: no load-report rows"
            return e
        w = self.window
        stale = sorted(t + w + 1 for t, _, _ in self.reports if t + w + 1 > at)
        # judged until the last client op: after it the brokers are torn down, and a cluster whose
        # brokers stop reporting one by one would look balanced once one is left
        end = self.t_clients if self.t_clients >= 0 else self.reports[-1][0]
        cut = until is not None and until - 1 < end
        if cut:
            end = until - 1
        instants = sorted(x for x in {at, *(t for t, _, _ in self.reports if t >= at), *stale} if x <= end)
        last_of: dict[str, tuple[int, dict[str, Any]]] = {}
        smooth = float(self.o.get("smooth_s") or 0.0) * 1e9
        recent: dict[str, deque[tuple[int, float]]] = {}
        reported_since: set[str] = set()
        i, n = 0, len(self.reports)
        last = held = None
        streak = self._streak()
        for t in instants:
            while i < n and self.reports[i][0] <= t:
                rt, rb, rv = self.reports[i]
                last_of[rb] = (rt, rv)
                if smooth > 0 and _num(rv.get("max_usage_with_weight")) is not None:
                    recent.setdefault(rb, deque()).append((rt, _num(rv.get("max_usage_with_weight"))))
                if rt >= at:
                    reported_since.add(rb)
                i += 1
            live = {b: v for b, (rt, v) in last_of.items() if t - rt <= w}
            if smooth > 0:
                live = {b: {**v, "max_usage_with_weight": _mean_since(recent.get(b, []), t - smooth,
                                                                      v.get("max_usage_with_weight"))}
                        for b, v in live.items()}
            if not _reflects(kind, brokers, live, reported_since):
                streak.feed(t, False)
                continue
            sp = self.spread(live)
            if sp is None:
                streak.feed(t, False)
                continue
            last = (t, sp, live)
            held = streak.feed(t, sp[0] <= float(self.o["target_spread"]) + 1e-12 and sp[1] <= sp[2] + 1e-9,
                               (sp, sorted(live)))
            if held:
                break
        held = held or streak.settled_at(end)
        if held:
            t0, (sp0, live0) = held
            e.update(balanced_after_s=round((t0 - at) / 1e9, 3), outcome="balanced",
                     usage_spread=round(sp0[0], 4), topic_spread=sp0[1], topic_target=round(sp0[2], 2),
                     live_brokers=live0)
            return e
        e["outcome"] = "not balanced before the next event" if cut else "not balanced by the end"
        if last is not None:
            t, sp, live = last
            e.update(last_usage_spread=round(sp[0], 4), last_topic_spread=sp[1], topic_target=round(sp[2], 2),
                     live_brokers=sorted(live), last_judged_s=_s(t))
        return e

    # ---------------------------------------------------------------------------- unloads

    def _nemesis_bundles(self, v: Any) -> list[str]:
        if not isinstance(v, dict):
            return []
        out = [v["bundle"]] if isinstance(v.get("bundle"), str) else []
        out += [b for b in v.get("bundles") or [] if isinstance(b, str)]
        out += [s["bundle"] for s in v.get("splits") or [] if isinstance(s, dict) and isinstance(s.get("bundle"), str)]
        return list(dict.fromkeys(out))

    def unload_episodes(self) -> list[dict[str, Any]]:
        eps: list[dict[str, Any]] = []
        for t, v in self.lb:
            if v.get("event") == "unload" and isinstance(v.get("bundle"), str):
                eps.append({"t": t, "bundle": v["bundle"], "by": "lb-event",
                            "reason": str(v.get("reason") or "unknown"), "source": self.canon(v.get("source")),
                            "destination": self.canon(v.get("destination")) or None})
        ev_unloads = [(e["t"], parse_bundle_name(e["bundle"])) for e in eps]
        kinds = {**{f: "admin-unload" for f in self.o.get("unload_faults") or ()},
                 **{f: "admin-split" for f in self.o.get("split_faults") or ()}}
        invoked: dict[str, int] = {}
        for op in self.nemesis:
            kind, name = fg.parse(op.f)
            if kind != fg.START or name not in kinds:
                continue
            if op.type == INVOKE:
                invoked[op.f] = op.time_ns
                continue
            t0 = invoked.pop(op.f, op.time_ns)
            if op.type not in (OK, "info"):
                continue
            for bundle in self._nemesis_bundles(op.value):
                pb = parse_bundle_name(bundle)
                if pb is None:
                    continue
                logged = any(x is not None and x[0] == pb[0] and overlap(x[1], pb[1]) and
                             t0 <= te <= op.time_ns + 1e9 for te, x in ev_unloads)
                if not logged:
                    eps.append({"t": t0, "bundle": bundle, "by": "nemesis", "reason": kinds[name],
                                "source": None, "destination": None, "completed_s": _s(op.time_ns)})
        eps.sort(key=lambda e: e["t"])
        return eps

    def unavailability(self, episodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        by_ns: dict[str, list[tuple[str, int]]] = {}
        for name in self.sends:
            th = topic_hash(name)
            if th is not None:
                by_ns.setdefault(th[0], []).append((name, th[1]))
        usual: dict[str, float | None] = {}
        out = []
        for ep in episodes:
            pb = parse_bundle_name(ep["bundle"])
            if pb is None:
                continue
            t0 = ep["t"]
            for name, h in by_ns.get(pb[0], ()):
                if not covers(pb[1], h):
                    continue
                ts = self.sends[name]
                i = bisect.bisect_right(ts, t0)
                if i == 0:
                    continue                       # never sent before: nothing to lose
                before = ts[i - 1]
                after = ts[i] if i < len(ts) else None
                if name not in usual:
                    d = sorted(b - a for a, b in zip(ts, ts[1:]))
                    usual[name] = percentile(d, 0.5) if d else None
                u = usual[name]
                fl = self.failed.get(name, [])
                if after is None:
                    # no ok send after it: open until the topic's last failed send, if it was tried at all
                    # (a topic nobody sent to again after the unload shows nothing)
                    if not fl or fl[-1] <= t0:
                        continue
                    hi = fl[-1]
                else:
                    hi = after
                n_failed = bisect.bisect_right(fl, hi) - bisect.bisect_left(fl, before)
                gap = hi - before
                out.append({"topic": name, "bundle": ep["bundle"], "unload_s": _s(t0), "by": ep["by"],
                            "reason": ep["reason"], "last_ok_before_s": _s(before),
                            "first_ok_after_s": _s(after), "gap_s": round(gap / 1e9, 3),
                            "open_until_end": after is None,
                            "usual_gap_s": None if u is None else round(u / 1e9, 3),
                            "excess_s": None if u is None else round(max(0.0, gap - u) / 1e9, 3),
                            "failed_sends_between": n_failed})
        return out

    # ---------------------------------------------------------------------------- stats

    def stats(self, events: list[dict[str, Any]], episodes: list[dict[str, Any]],
              gaps: list[dict[str, Any]]) -> dict[str, Any]:
        load: dict[str, dict[str, list[Any]]] = {}
        for t, b, v in self.reports:
            s = load.setdefault(b, {"t": [], "usage": [], "msg_rate": [], "bundles": [], "topics": []})
            s["t"].append(_s(t))
            s["usage"].append(_num(v.get("max_usage_with_weight")))
            rin, rout = _num(v.get("msgRateIn")), _num(v.get("msgRateOut"))
            s["msg_rate"].append(None if rin is None and rout is None else round((rin or 0) + (rout or 0), 3))
            s["bundles"].append(v.get("numBundles"))
            s["topics"].append(v.get("numTopics"))
        unloads_by_reason: dict[str, int] = {}
        for ep in episodes:
            unloads_by_reason[ep["reason"]] = unloads_by_reason.get(ep["reason"], 0) + 1
        splits = [(t, v) for t, v in self.lb if v.get("event") == "split"]
        decisions = {v.get("bundle") for _, v in self.lb if v.get("event") == "split-decision"}
        moves = [{"t_s": _s(ep["t"]), "kind": "split-unload" if ep["reason"] in ("split", "admin-split")
                  else "unload", "bundle": ep["bundle"], "reason": ep["reason"], "by": ep["by"],
                  "source": ep["source"], "destination": ep["destination"]} for ep in episodes]
        moves += [{"t_s": _s(t), "kind": "split", "bundle": v.get("bundle"),
                   "reason": "auto" if v.get("bundle") in decisions else "admin", "by": "lb-event",
                   "source": self.canon(v.get("source")), "destination": None,
                   "children": v.get("children")} for t, v in splits]
        moves.sort(key=lambda m: m["t_s"] or 0)
        worst = sorted(gaps, key=lambda g: -g["gap_s"])
        cap = int(self.o.get("max_unavailability_rows") or 0)
        per_topic_worst: dict[str, float] = {}
        for g in gaps:
            per_topic_worst[g["topic"]] = max(per_topic_worst.get(g["topic"], 0.0), g["gap_s"])
        ttb = [e["balanced_after_s"] for e in events if e["balanced_after_s"] is not None]
        return {
            "load_reports": len(self.reports),
            "brokers": self.brokers,
            "report_window_s": round(self.window / 1e9, 3),
            "target_spread": self.o["target_spread"],
            "spread_measure": self.o.get("spread_measure"),
            "scores": self.o.get("scores"),
            "hold_s": self.o.get("hold_s"),
            "settled": bool(self.o.get("settled")),
            "target_topic_spread": self.o.get("target_topic_spread"),
            "topic_spread_fraction": self.o.get("topic_spread_fraction"),
            "scale_events": events,
            "time_to_balanced_s": {"events": len(events), "balanced": len(ttb),
                                   "not_balanced": sum(1 for e in events if e.get("judged") and
                                                       e["balanced_after_s"] is None),
                                   "max": max(ttb) if ttb else None,
                                   "p50": rounded(percentile(sorted(ttb), 0.5)) if ttb else None},
            "unloads": len(episodes),
            "unloads_by_reason": unloads_by_reason,
            "splits": len(splits),
            "splits_by_leader": sum(1 for _, v in splits if v.get("bundle") in decisions),
            "admin_splits": sum(1 for op in self.nemesis if op.type == OK and fg.parse(op.f) == (fg.START, "split")),
            "admin_unloads": sum(1 for op in self.nemesis if op.type == OK and fg.parse(op.f) == (fg.START, "unload")),
            "unavailability": {"topic_unloads": len(gaps), "topics": len(per_topic_worst),
                               "worst_gap_s": worst[0]["gap_s"] if worst else None,
                               "worst_topic": worst[0]["topic"] if worst else None,
                               "p50_gap_s": rounded(percentile(sorted(g["gap_s"] for g in gaps), 0.5)) if gaps
                               else None,
                               "open_until_end": sum(1 for g in gaps if g["open_until_end"]),
                               # the longest beyond the topic's own pace (a topic sent to rarely has long
                               # gaps with no unload at all)
                               "worst_excess": max((g for g in gaps if g["excess_s"] is not None),
                                                   key=lambda g: g["excess_s"], default=None)},
            "unavailability_rows": worst[:cap],
            "moves": moves,
            "load": load,
            "tables": ["scale_events", "unavailability_rows"],
        }


__all__ = ["ANOMALY_TYPES", "DEFAULTS", "check", "covers", "long_unavailability_cases", "not_balanced_cases",
           "topic_hash"]
