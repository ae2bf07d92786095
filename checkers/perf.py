"""The perf checker: latency, throughput and availability per fault state, and time to recover after heal.

A pure function over any workload's history; it judges nothing unless asked (`max_unavailable_s`).

Fault states come from the nemesis ops (process -1), read by `core.faults.FaultTimeline`: a fault X
is *active* while it is in force, from the ok or info completion of its `start-X` to the ok or info
completion of its `stop-X` or of a heal (a failed stop leaves it active). Faults running at once form a combined state, the active
names sorted and joined by "+" ("kill+partition"); no active fault is "healthy". An op belongs
to the state in force at its invocation (history order breaks ties).

Only the workload's ops count: client processes below `final_process` (the final reads and other
after-the-run ops are left out). The workload window runs from the first client invocation to the
last client event.

- Per state and per f: ok / fail / info / unfinished counts, throughput (ok ops per second of time
  spent in that state inside the window; None when no time was spent in it) and latency p50, p90,
  p99 and max of the ok ops (nearest rank, ms).
- Availability per topic (op.key of the write kinds, `write_fs`): the topic's window runs from its
  first write invocation to its last write event; its longest *unavailable* window is the longest
  stretch of it without an ok write completing (the edges count: from the first invocation to the
  first ok, and from the last ok to the end), with the seconds it spent in each fault state.
- Time to recover, per fault occurrence that was stopped: for every topic whose window contains the
  stop, from the stop's ok completion to the completion of the first ok write after it (None when no
  ok write came before the topic's window ended).

`valid` is True, unless `opts["max_unavailable_s"]` is set and some topic has an unavailable window
longer than that: then False, with one `unavailable` anomaly per such window (the ok writes around
it as evidence). The pass is linear; the latency lists are sorted once per (state, f).
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any

from checkers.toolkit import Cases, anomalies_of, anomaly_stats, full_op, jsonable, percentile, rounded, verdict
from core.faults import HEALTHY, FaultTimeline
from core.history import FAIL, INVOKE, NEMESIS_PROCESS, OK, CheckResult, Op

WRITE_FS = ("send", "enqueue", "add", "put", "write", "cas")
ANOMALY_TYPES = ("unavailable",)

DEFAULTS: dict[str, Any] = {
    "write_fs": WRITE_FS,            # fs whose ok completions make a topic available
    "max_unavailable_s": None,       # set: a longer unavailable window is an `unavailable` anomaly
    "final_process": 1_000_000,      # processes at or above this (final reads) are left out
    "max_anomalies": 1000,           # evidence entries kept (None: all); counts stay exact
    "max_rows": 2000,                # rows kept per table (by_state, availability, recovery)
}


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Perf and availability by fault state; see the module docstring."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    return _perf(history, o)


def _sorted_by_time(history: list[Op]) -> list[Op]:
    prev = None
    for op in history:
        t = op.time_ns
        if prev is not None and t < prev:
            return sorted(history, key=lambda x: (x.time_ns, x.index))
        prev = t
    return history


class _States:
    """The fault-state timeline: state i holds from times[i] (times[0] = -inf) to times[i + 1]."""

    def __init__(self, times: list[float], names: list[str]):
        self.times, self.names = times, names

    def overlap(self, a: int, b: int) -> dict[str, float]:
        """Seconds of [a, b] spent in each state."""
        out: dict[str, float] = {}
        if b < a:
            return out
        i = max(0, bisect_right(self.times, a) - 1)
        n = len(self.times)
        while i < n:
            s = max(a, self.times[i])
            e = min(b, self.times[i + 1]) if i + 1 < n else b
            if s > b:
                break
            if e > s or (a == b and s == e):
                name = self.names[i]
                out[name] = out.get(name, 0.0) + (e - s) / 1e9
            i += 1
        return {k: round(v, 3) for k, v in out.items()}


def _perf(history: list[Op], o: dict[str, Any]) -> CheckResult:
    h = _sorted_by_time(history)
    final = int(o.get("final_process") or 1_000_000)
    write_fs = frozenset(o.get("write_fs") or WRITE_FS)

    tl = FaultTimeline()
    seg_t, seg_s = tl.seg_t, tl.seg_s

    acc: dict[tuple[str, str], list[Any]] = {}      # (state, f) -> [ok, fail, info, unfinished, latencies]
    open_: dict[int, tuple[int, str, str, str]] = {}   # process -> (t invoke, state, f, key)
    topic_ok_t: dict[str, list[int]] = {}
    topic_ok_op: dict[str, list[Op]] = {}
    topic_win: dict[str, list[int]] = {}           # topic -> [first write invoke, last write event]
    w0: int | None = None
    w1 = 0
    final_ops = orphans = 0
    n_nem = 0

    for op in h:
        p = op.process
        t = op.time_ns
        if p < 0:                           # the nemesis; observers (-2) are not clients
            if p == NEMESIS_PROCESS:
                n_nem += 1
                tl.feed(t, op.type, op.f, op)
            continue
        if p >= final:
            final_ops += 1
            continue
        f = op.f
        if op.type == INVOKE:
            if w0 is None:
                w0 = t
            if t > w1:
                w1 = t
            old = open_.get(p)
            if old is not None:                       # invoked again without a completion
                _acc(acc, old[1], old[2])[3] += 1
            open_[p] = (t, tl.state, f, op.key)
            if f in write_fs:
                win = topic_win.get(op.key)
                if win is None:
                    topic_win[op.key] = [t, t]
                else:
                    win[1] = t
            continue
        if t > w1:
            w1 = t
        rec = open_.pop(p, None)
        if rec is None or rec[2] != f:
            orphans += 1
            if rec is not None:
                _acc(acc, rec[1], rec[2])[3] += 1
            continue
        a = acc.get((rec[1], f))
        if a is None:
            a = _acc(acc, rec[1], f)
        ty = op.type
        if ty == OK:
            a[0] += 1
            a[4].append(t - rec[0])
        elif ty == FAIL:
            a[1] += 1
        else:
            a[2] += 1
        if f in write_fs:
            key = rec[3]
            win = topic_win.get(key)
            if win is not None and t > win[1]:
                win[1] = t
            if ty == OK:
                lst = topic_ok_t.get(key)
                if lst is None:
                    lst = topic_ok_t[key] = []
                    topic_ok_op[key] = []
                lst.append(t)
                topic_ok_op[key].append(op)
    for t_inv, st, f, _ in open_.values():
        _acc(acc, st, f)[3] += 1

    states = _States(seg_t, seg_s)
    if w0 is None:
        w0 = w1 = 0
    time_in = states.overlap(w0, w1) if w1 > w0 else {}
    max_rows = int(o.get("max_rows") or 2000)

    # ---- per state and f
    by_state: list[dict[str, Any]] = []
    totals: dict[str, dict[str, Any]] = {}
    for (st, f) in sorted(acc, key=lambda k: (k[0] != HEALTHY, k[0], k[1])):
        ok, fail, info, unf, lat = acc[(st, f)]
        lat.sort()
        secs = time_in.get(st)
        row = {"state": st, "f": f, "time_s": secs, "ok": ok, "fail": fail, "info": info, "unfinished": unf,
               "ok_per_s": rounded(ok / secs) if secs else None}
        for q, name in ((0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms")):
            v = percentile(lat, q)
            row[name] = rounded(v / 1e6) if v is not None else None
        row["max_ms"] = rounded(lat[-1] / 1e6) if lat else None
        by_state.append(row)
        tot = totals.setdefault(st, {"time_s": secs, "ok": 0, "fail": 0, "info": 0, "unfinished": 0})
        for k in ("ok", "fail", "info", "unfinished"):
            tot[k] += row[k]
    for st, secs in time_in.items():
        totals.setdefault(st, {"time_s": secs, "ok": 0, "fail": 0, "info": 0, "unfinished": 0})
    for st, tot in totals.items():
        tot["ok_per_s"] = rounded(tot["ok"] / tot["time_s"]) if tot["time_s"] else None

    # ---- availability
    thr = o.get("max_unavailable_s")
    thr_ns = None if thr is None else float(thr) * 1e9
    unavailable = Cases(o.get("max_anomalies"))
    availability: list[dict[str, Any]] = []
    for topic in sorted(topic_win, key=str):
        ts, te = topic_win[topic]
        times = topic_ok_t.get(topic, [])
        ops = topic_ok_op.get(topic, [])
        best = (-1, ts, te, -1)                  # (length, start, end, index of the ok after)
        prev = ts
        for i in range(len(times) + 1):
            t = times[i] if i < len(times) else te
            g = t - prev
            if g > best[0]:
                best = (g, prev, t, i)
            if thr_ns is not None and g > thr_ns:
                unavailable.add(lambda: {
                    "topic": topic, "start_s": rounded(prev / 1e9), "end_s": rounded(t / 1e9),
                    "duration_s": rounded(g / 1e9),
                    "threshold_s": thr, "states": states.overlap(prev, t),
                    "edge": "start" if i == 0 else "end" if i == len(times) else None,
                    "last_ok_before": full_op(ops[i - 1]) if i > 0 else None,
                    "first_ok_after": full_op(ops[i]) if i < len(ops) else None})
            prev = t
        g, s, e, i = best
        availability.append({"topic": topic, "ok_writes": len(times),
                             "window_s": [rounded(ts / 1e9), rounded(te / 1e9)],
                             "longest_unavailable_s": rounded(max(g, 0) / 1e9), "from_s": rounded(s / 1e9),
                             "to_s": rounded(e / 1e9), "states": states.overlap(s, e),
                             "edge": "start" if i == 0 else "end" if i == len(times) else None})

    # ---- time to recover after each stop
    recovery: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    for n, occ in enumerate(tl.occurrences(), 1):
        stop = occ.stop_ns
        d = {"n": n, "fault": occ.name, "start_s": rounded(occ.started_ns / 1e9),
             "stop_s": rounded(stop / 1e9) if stop is not None else None,
             "targets": jsonable(occ.value), "max_recovery_s": None, "not_recovered": []}
        faults.append(d)
        if stop is None:
            continue
        worst = None
        for topic in sorted(topic_win, key=str):
            ts, te = topic_win[topic]
            if not ts <= stop <= te:
                continue
            times = topic_ok_t.get(topic, [])
            i = bisect_right(times, stop)
            rec = (times[i] - stop) / 1e9 if i < len(times) else None
            if rec is None:
                d["not_recovered"].append(topic)
            elif worst is None or rec > worst:
                worst = rec
            if len(recovery) < max_rows:
                recovery.append({"n": n, "fault": occ.name, "stop_s": rounded(stop / 1e9), "topic": topic,
                                 "recovery_s": rounded(rec),
                                 "first_ok_after_s": rounded(times[i] / 1e9) if rec is not None else None})
        d["max_recovery_s"] = rounded(worst)

    cases = {"unavailable": unavailable}
    stats: dict[str, Any] = {
        "window_s": [rounded(w0 / 1e9), rounded(w1 / 1e9)],
        "duration_s": rounded((w1 - w0) / 1e9),
        "states": totals,
        "by_state": by_state[:max_rows],
        "availability": availability[:max_rows],
        "recovery": recovery,
        "faults": faults[:max_rows],
        "timeline": [[rounded(t / 1e9) if t != float("-inf") else None, s]
                     for t, s in zip(seg_t, seg_s)][:max_rows],
        "max_unavailable_s": thr,
        "write_fs": sorted(write_fs),
        **anomaly_stats(cases, ANOMALY_TYPES),
        "history": {"ops": len(h), "nemesis_ops": n_nem, "final_ops_excluded": final_ops,
                    "orphan_completions": orphans},
        "tables": ["by_state", "availability", "recovery"],
    }
    return CheckResult(valid=verdict(cases, ANOMALY_TYPES), anomalies=anomalies_of(cases), stats=stats)


def _acc(acc: dict[tuple[str, str], list[Any]], st: str, f: str) -> list[Any]:
    a = acc.get((st, f))
    if a is None:
        a = acc[(st, f)] = [0, 0, 0, 0, []]
    return a
