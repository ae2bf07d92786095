"""One simulation, a sweep, and what they write: the outcomes beside the seed's figure, the history
(LB_EVENT rows in core/observations.py's shape, the scale events as nemesis ops) that the balance
checker judges, JSON and an offline HTML page with inline SVG plots.
"""
from __future__ import annotations

import gc
import html
import json
import resource
from pathlib import Path
from typing import Any, Callable, Mapping

from clusters.loadbalancer.sim.cluster import Cluster
from clusters.loadbalancer.sim.extensible import ExtensibleCluster
from clusters.loadbalancer.sim.modular import ModularCluster
from clusters.loadbalancer.sim.scenario import Scenario
from core.history import INVOKE, NEMESIS_PROCESS, OBSERVER_PROCESS, OK, Op
from core.observations import LB_EVENT, OBSERVE_START

LOAD_MANAGERS: dict[str, type[Cluster]] = {"modular": ModularCluster, "extensible": ExtensibleCluster}


GC_YOUNG_THRESHOLD = 100_000     # allocations between young collections during a simulation (CPython: 700)


def simulate(scenario: Scenario, load_manager: str, *, settings: Mapping[str, Any] | None = None, seed: int = 1,
             progress: Callable[[str], None] | None = None) -> Cluster:
    """Run `scenario` with one load manager; `settings` override the scenario's load balancer settings.

    The cyclic collector's young-generation threshold is raised for the run (restored after): a
    simulation allocates millions of short-lived objects beside a large, long-lived cluster state, and
    at the default (700) collection took half of a full-scale storm's wall time and made it grow faster
    than the events (bench/README.md "Wall time and memory against scale")."""
    cls = LOAD_MANAGERS[load_manager]
    before = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *before[1:])
    try:
        c = cls(scenario, scenario.lb_settings(settings), scenario.sim_params(load_manager), seed, progress)
        c.run()
    finally:
        gc.set_threshold(*before)
    return c


# ------------------------------------------------------------------------------------------ outcomes

def settle_times(c: Cluster) -> list[dict[str, Any]]:
    """Per leave/join event: the seconds from the event until every live broker's usage stays within
    balance_band of their mean for good (until the next event or the end), the streak at least
    balance_hold_s long; None if it never did."""
    rounds: dict[float, dict[str, float]] = {}
    smooth = c.p.balance_smooth_s
    for b, series in c.load_series.items():
        lo, acc = 0, 0.0
        for i, (t, u) in enumerate(series):
            acc += u
            while series[lo][0] <= t - smooth and lo < i:
                acc -= series[lo][1]
                lo += 1
            rounds.setdefault(t, {})[b] = acc / (i - lo + 1) if smooth > 0 else u
    times = sorted(rounds)
    ev = sorted((e.at_s, e.kind) for e in c.sc.events if e.kind in ("leave", "join"))
    out = []
    band, hold = c.p.balance_band, c.p.balance_hold_s
    for i, (at, kind) in enumerate(ev):
        until = ev[i + 1][0] if i + 1 < len(ev) else c.sc.duration_s
        start = None
        for t in times:
            if t <= at + c.p.graceful_unload_ms / 1000 or t > until:
                continue
            us = list(rounds[t].values())
            mean = sum(us) / len(us)
            ok = all(abs(u - mean) <= band for u in us)
            if ok and start is None:
                start = t
            elif not ok:
                start = None
        settled = start is not None and until - start >= hold
        out.append({"event": kind, "at_s": at, "settled_after_s": round(start - at, 1) if settled else None})
    return out


def p9999_ms(c: Cluster, q: float = 0.9999) -> float | None:
    """The q-quantile of publish latency: a message sent while its topic is disconnected waits until the
    topic is connected again (the client's pending queue), else it takes params.publish_ms. Messages
    are counted as the rate times the time (a fluid model), from the first event to the end."""
    t0 = c.first_event_ms
    if t0 is None:
        return None
    dur_s = c.sc.duration_s - t0 / 1000
    total = sum(c.t_rate) * dur_s
    base = c.p.publish_ms
    segs = [(max(a, t0), b, r) for a, b, r in c.gaps if b > t0]
    # open gaps (never reconnected) count to the end
    end_ms = c.sc.duration_s * 1000
    for t in range(len(c.t_name)):
        if c.t_broker[t] is None and c.t_pubs[t] > 0:
            segs.append((max(c.t_since[t], t0), end_ms, c.t_rate[t]))
    if total <= 0:
        return None

    def above(x: float) -> float:
        n = 0.0
        for a, b, r in segs:
            L = b - a
            if L <= 0:
                continue
            top = base + L
            if x < top:
                n += r * min(L, top - x) / 1000
        return n
    target = total * (1 - q)
    if above(base) <= target:
        return base
    lo, hi = base, base + max((b - a for a, b, _ in segs), default=0)
    for _ in range(60):
        mid = (lo + hi) / 2
        if above(mid) > target:
            lo = mid
        else:
            hi = mid
    return round(hi, 1)


def outcomes(c: Cluster, wall_s: float) -> dict[str, Any]:
    t0 = (c.first_event_ms or 0) / 1000
    reconnect = None
    if c.first_event_ms is not None:
        # the last reconnection of a publisher that lost its broker between the first event and the last
        # restarted broker's return (later unloads by the shedder are not the storm's)
        until = c.restarts_done_ms if c.restarts_done_ms is not None else c.sc.duration_s * 1000
        ends = [b for a, b, _ in c.gaps if c.first_event_ms <= a <= until]
        still = [t for t in range(len(c.t_name)) if c.t_broker[t] is None and c.t_pubs[t] > 0
                 and c.first_event_ms <= c.t_since[t] <= until]
        if not still:
            reconnect = round((max(ends) - c.first_event_ms) / 1000, 1) if ends else 0.0
    live = c.live()
    topics = [c.brokers[b].topics for b in live]
    split_times = [t for t, k, _ in c.marks if k == "split"]
    last_split = max(split_times) if split_times else None
    balanced_after_split = None
    if last_split is not None:
        rounds: dict[float, list[float]] = {}
        for series in c.load_series.values():
            for t, u in series:
                if t >= last_split:
                    rounds.setdefault(t, []).append(u)
        start = None
        for t in sorted(rounds):
            us = rounds[t]
            m = sum(us) / len(us)
            if all(abs(u - m) <= c.p.balance_band for u in us):
                start = t if start is None else start
            else:
                start = None
        balanced_after_split = start
    return {
        "load_manager": c.load_manager,
        "reconnect_s": reconnect,
        "p9999_ms": p9999_ms(c) if c.sc.metric == "p9999" else None,
        "settle": settle_times(c),
        "splits": c.counts["splits"],
        "last_split_s": last_split,
        "split_and_balanced_s": balanced_after_split,
        "bundles_end": len(c.bundles),
        "unloads": c.counts["unloads"],
        "assignments": c.counts["assignments"],
        "lookups": c.counts["lookups"],
        "topics_per_broker_spread": (max(topics) - min(topics)) if topics else None,
        "topics_per_broker": {c.brokers[b].name: c.brokers[b].topics for b in live},
        "publishers_connected_end": c.connected_pubs,
        "publishers": c.total_pubs,
        "events": c.sim.events_run,
        "wall_s": round(wall_s, 2),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def headline(sc: Scenario, o: dict[str, Any]) -> str:
    """The figure the seed's table gives for this scenario, ours."""
    m = sc.metric
    if m == "reconnect":
        return "not all reconnected" if o["reconnect_s"] is None else f"{o['reconnect_s'] / 60:.1f} min"
    if m == "p9999":
        return "n/a" if o["p9999_ms"] is None else f"{o['p9999_ms']:.0f} ms"
    if m == "balance":
        parts = []
        for e in o["settle"]:
            v = e["settled_after_s"]
            parts.append(f"{e['event']} " + ("not settled" if v is None else f"{v / 60:.1f} min ({v:.0f} s)"))
        return ", ".join(parts)
    t = o["split_and_balanced_s"]
    return (f"{o['splits']} splits ({o['bundles_end']} bundles), "
            + ("not balanced after" if t is None else f"balanced at {t / 60:.1f} min")
            + f", topics max-min {o['topics_per_broker_spread']}")


# ------------------------------------------------------------------------------------------ history

def history(c: Cluster) -> list[Op]:
    """The simulation as a history: an observe-start naming the brokers, the leave/join events as
    nemesis start-scale/stop-scale ops, every decision and load report as an `lb-event` row (the
    LB_EVENT_FIELDS shape, `mono_ns` the simulated time), and one send at the end (the balance checker
    judges up to the last send)."""
    ms = 1_000_000
    ops = [Op(OBSERVER_PROCESS, OK, OBSERVE_START, value={
        "nodes": {br.name: br.name for br in c.brokers.values()},
        "ports": {br.id: br.name for br in c.brokers.values()}, "simulated": True}, time_ns=0)]
    for t, typ, f, v in c.nemesis:
        ops.append(Op(NEMESIS_PROCESS, INVOKE if typ == INVOKE else OK, f, value=v, time_ns=t * ms))
    for t, v in c.lb_events:
        row = dict(v)
        row.setdefault("logged_by", c.brokers[v["broker"]].name if v.get("broker") in c.brokers
                       else c.brokers[v["leader"]].name if v.get("leader") in c.brokers else "sim")
        row["mono_ns"] = t * ms
        ops.append(Op(OBSERVER_PROCESS, OK, LB_EVENT, key=str(v.get("bundle") or ""), value=row, time_ns=t * ms))
    ops.append(Op(0, OK, "send", key=c.t_name[0], time_ns=int(c.sc.duration_s * 1000) * ms))
    ops.sort(key=lambda o: o.time_ns)
    for i, o in enumerate(ops):
        o.index = i
    return ops


# ------------------------------------------------------------------------------------------ output

def _svg_lines(series: dict[str, list[tuple[float, float]]], marks: list[tuple[float, str, str]], title: str,
               ylabel: str, w: int = 900, h: int = 260, max_series: int = 20) -> str:
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f"<p>{html.escape(title)}: no data</p>"
    x0, x1 = 0.0, max(p[0] for p in pts) or 1.0
    y1 = max(max(p[1] for p in pts), 1e-9)
    L, B = 50, 30

    def X(x: float) -> float:
        return L + (w - L - 10) * (x - x0) / (x1 - x0 or 1)

    def Y(y: float) -> float:
        return h - B - (h - B - 10) * y / y1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" style="background:#fff">',
           f'<text x="{L}" y="12" font-size="12">{html.escape(title)}</text>',
           f'<line x1="{L}" y1="{h - B}" x2="{w - 10}" y2="{h - B}" stroke="#888"/>',
           f'<line x1="{L}" y1="10" x2="{L}" y2="{h - B}" stroke="#888"/>',
           f'<text x="2" y="{Y(y1) + 4:.0f}" font-size="10">{y1:.3g}</text>',
           f'<text x="2" y="{h - B:.0f}" font-size="10">0</text>',
           f'<text x="{w - 60}" y="{h - 5}" font-size="10">{x1:.0f} s</text>',
           f'<text x="{L + 5}" y="{h - 5}" font-size="10">{html.escape(ylabel)}</text>']
    colours = {"unload": "#e66", "split": "#66e", "restart": "#999", "leave": "#c90", "join": "#090",
               "hotspot": "#c0c", "rate": "#c0c"}
    seen_unload = 0
    for t, kind, _ in marks:
        if kind == "unload":
            seen_unload += 1
            if seen_unload > 2000:
                continue
        out.append(f'<line x1="{X(t):.1f}" y1="10" x2="{X(t):.1f}" y2="{h - B}" stroke="{colours.get(kind, "#aaa")}" '
                   f'stroke-opacity="{0.25 if kind in ("unload", "split") else 0.9}"/>')
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
               "#17becf"]
    for i, (name, s) in enumerate(list(series.items())[:max_series]):
        step = max(1, len(s) // 600)
        d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in s[::step])
        out.append(f'<polyline fill="none" stroke="{palette[i % len(palette)]}" stroke-width="1" points="{d}">'
                   f'<title>{html.escape(name)}</title></polyline>')
    out.append("</svg>")
    return "".join(out)


def page(sc: Scenario, results: list[dict[str, Any]], plots: dict[str, str]) -> str:
    rows = "".join(f"<tr><td>{html.escape(r['load_manager'])}</td><td>{html.escape(str(r.get('sweep') or ''))}</td>"
                   f"<td>{html.escape(r['headline'])}</td><td>{html.escape(sc.seed.get(r['load_manager'], '-'))}</td>"
                   f"<td>{r['unloads']}</td><td>{r['splits']}</td><td>{r['topics_per_broker_spread']}</td>"
                   f"<td>{r['wall_s']}</td></tr>" for r in results)
    body = "".join(f"<h2>{html.escape(k)}</h2>{v}" for k, v in plots.items())
    return ("<!doctype html><html><head><meta charset='utf-8'><title>lb-sim " + html.escape(sc.name) + "</title>"
            "<style>body{font:14px sans-serif;margin:20px}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:3px 8px}</style></head><body>"
            f"<h1>lb-sim {html.escape(sc.name)}</h1><p>{html.escape(sc.description)}</p>"
            f"<p>What the seed's figure measures: {html.escape(sc.seed.get('ours', sc.metric))}</p>"
            "<table><tr><th>load manager</th><th>setting</th><th>ours</th><th>the seed's</th><th>unloads</th>"
            "<th>splits</th><th>topics max-min</th><th>wall s</th></tr>" + rows + "</table>"
            "<p>Marks: red unloads, blue splits, grey restarts, orange leaves, green joins.</p>"
            + body + "</body></html>")


def plots_of(c: Cluster, label: str) -> dict[str, str]:
    names = {b: c.brokers[b].name for b in c.brokers}
    load = {names[b]: s for b, s in c.load_series.items() if s}
    curve = {"connected publishers": [(t, float(n)) for t, n in c.reconnect_curve]}
    topics: dict[str, list[tuple[float, float]]] = {}
    for t, per in c.topic_series:
        for b, n in per.items():
            topics.setdefault(b, []).append((t, float(n)))
    return {f"{label}: load score per broker": _svg_lines(load, c.marks, "max_usage_with_weight per broker", "usage"),
            f"{label}: reconnect curve": _svg_lines(curve, c.marks, "connected publishers", "publishers"),
            f"{label}: topics per broker": _svg_lines(topics, c.marks, "topics per broker", "topics")}


def write(out: Path, sc: Scenario, results: list[dict[str, Any]], plots: dict[str, str],
          histories: dict[str, list[Op]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "lb-sim.json").write_text(json.dumps({"scenario": sc.as_dict(), "results": results}, indent=1,
                                                default=str))
    (out / "index.html").write_text(page(sc, results, plots))
    for label, ops in histories.items():
        d = out / label / "journals"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "lb-events.jsonl", "w") as f:
            for op in ops:
                f.write(json.dumps(op.to_json(), default=str) + "\n")
