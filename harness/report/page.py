"""The report page: its HTML sections (verdict, summary, anomalies, charts, balance, faults, spec, files),
style and script, and `render`, which writes report.html into a run folder."""
from __future__ import annotations

import bisect
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

from harness.report.charts import (STAT_NAMES, _latency_chart, _load_chart, _stats_chart, _stats_points, _stats_series,
                                   _throughput_chart)
from harness.report.fmt import _anchor, _compact, _fault_colour, _fmt_ms, _is_mid, _num, _size, _verdict, esc
from harness.report.model import (EXIT_MEANING, MAX_LINKED_FILES, MAX_ROWS, REPORT_NAME, Analysis, Fault, ReportError, Run,
                                  _analyse, _faults_from_history, _faults_from_stats, _join, _load, _percentile)


def _table(headers: list[str], rows: Iterable[list[Any]], cls: str = "sortable", num_cols: set[int] = frozenset()
           ) -> str:
    o = [f'<div class="tablewrap"><table class="{cls}"><thead><tr>']
    o += [f'<th scope="col">{esc(h)}</th>' for h in headers]
    o.append("</tr></thead><tbody>")
    for r in rows:
        o.append("<tr>")
        for i, c in enumerate(r):
            if isinstance(c, _Raw):
                o.append(f"<td>{c.html}</td>")
            elif isinstance(c, _Secs):
                o.append(f'<td class="num" data-v="{c.v}">{c.v:.3f}</td>')
            elif (isinstance(c, (int, float)) and not isinstance(c, bool)) or i in num_cols:
                dv = f' data-v="{esc(c)}"' if isinstance(c, (int, float)) and not isinstance(c, bool) else ""
                o.append(f'<td class="num"{dv}>{esc(_num(c) if isinstance(c, float) else c)}</td>')
            else:
                o.append(f'<td>{esc(c)}</td>')
        o.append("</tr>")
    o.append("</tbody></table></div>")
    return "".join(o)


class _Secs:
    """A time in seconds, shown with millisecond precision and sorted by value."""

    def __init__(self, v: float):
        self.v = float(v)


class _Raw:
    def __init__(self, html_: str):
        self.html = html_


def _evidence_table(items: list[Any]) -> str:
    rows = items[:MAX_ROWS]
    cols: list[str] = []
    seen: set[str] = set()
    for it in rows:
        keys = it.keys() if isinstance(it, dict) and not _is_mid(it) else ["value"]
        for k in keys:
            if str(k) not in seen:
                seen.add(str(k))
                cols.append(str(k))
    o = ['<div class="tablewrap scroll" tabindex="0" role="region" aria-label="evidence">'
         '<table class="sortable evidence"><thead><tr><th scope="col">#</th>']
    o += [f'<th scope="col">{esc(c)}</th>' for c in cols]
    o.append("</tr></thead><tbody>")
    for n, it in enumerate(rows, 1):
        d = it if isinstance(it, dict) and not _is_mid(it) else {"value": it}
        o.append(f'<tr><td class="num" data-v="{n}">{n}</td>')
        for c in cols:
            v = d.get(c) if c in d else next((x for k, x in d.items() if str(k) == c), None)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                o.append(f'<td class="num" data-v="{esc(v)}">{esc(_num(v))}</td>')
            else:
                o.append(f'<td class="ev">{esc(_compact(v, key=c))}</td>')
        o.append("</tr>")
    o.append("</tbody></table></div>")
    if len(items) > MAX_ROWS:
        o.append(f'<p class="more">{len(items) - MAX_ROWS} more not shown (first {MAX_ROWS} of {len(items)}); '
                 f'all are in <a href="results.json">results.json</a>.</p>')
    return "".join(o)


def _count(ev: Any) -> int:
    if isinstance(ev, (list, tuple)):
        return len(ev)
    if isinstance(ev, bool):
        return int(ev)
    if isinstance(ev, int):
        return ev
    if isinstance(ev, dict):
        c = ev.get("count")
        return c if isinstance(c, int) and not isinstance(c, bool) else len(ev)
    return 0 if ev is None else 1


def _checkers(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    ch = results.get("checkers")
    if isinstance(ch, dict):
        return [(str(k), v if isinstance(v, dict) else {"valid": v}) for k, v in ch.items()]
    if "anomalies" in results:
        return [("checker", results)]
    return []


def _stats_table(stats: dict[str, Any]) -> str:
    rows = []
    for k, v in stats.items():
        if isinstance(v, list) and len(v) > 12:
            txt = f"{len(v)} items: " + _compact(v[:8], key=str(k), limit=400) + " …"
        elif isinstance(v, dict) and all(isinstance(x, (int, float, str, bool)) or x is None for x in v.values()):
            txt = ", ".join(f"{a}: {_compact(b)}" for a, b in v.items())
        else:
            txt = _compact(v, key=str(k), limit=1500)
        rows.append([str(k), txt])
    return _table(["stat", "value"], rows, cls="kv")


def _stats_row_tables(name: str, stats: dict[str, Any]) -> str:
    """The stats a checker names in stats["tables"] (lists of flat row dicts, e.g. perf by fault state,
    the fencing checker's ownership timeline), each as a sortable table."""
    o = []
    names = stats.get("tables")
    for k in names if isinstance(names, list) else []:
        rows = stats.get(k)
        if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
            o.append(f'<h4>{esc(name)}: {esc(k)}</h4>{_evidence_table(rows)}')
    return "".join(o)


def _section_anomalies(run: Run, used: set[str]) -> str:
    o = ['<section id="anomalies" aria-labelledby="h-anomalies"><h2 id="h-anomalies">Anomalies</h2>']
    if run.results is None:
        o.append("<p>No results.json: the checkers' findings are unknown.</p></section>")
        return "".join(o)
    checkers = _checkers(run.results)
    if not checkers:
        o.append("<p>results.json names no checkers.</p></section>")
        return "".join(o)
    for name, c in checkers:
        v = _verdict(c.get("valid"))
        anomalies = c.get("anomalies") or {}
        if not isinstance(anomalies, dict):
            anomalies = {"anomalies": anomalies}
        total = sum(_count(x) for x in anomalies.values())
        o.append(f'<h3>Checker <code>{esc(name)}</code>: <span class="badge b-{_vclass(v)}">{esc(v)}</span>'
                 f' — {total} anomal{"y" if total == 1 else "ies"}</h3>')
        if c.get("error"):
            o.append(f'<pre class="error">{esc(c.get("error"))}</pre>')
        if anomalies:
            rows = []
            ids = {}
            for ty, ev in anomalies.items():
                ids[ty] = _anchor(f"anomaly-{name}-{ty}", used)
                rows.append([_Raw(f'<a href="#{ids[ty]}">{esc(ty)}</a>'), _count(ev)])
            o.append(_table(["anomaly type", "count"], rows))
            for ty, ev in anomalies.items():
                n = _count(ev)
                o.append(f'<details{" open" if n else ""} class="anomaly"><summary><h4 id="{ids[ty]}">'
                         f'{esc(ty)}: {n}</h4></summary>')
                if isinstance(ev, list):
                    o.append(_evidence_table(ev) if ev else "<p>None.</p>")
                    ces = [x for x in ev[:3] if isinstance(x, dict) and "prefix" in x and "cannot_place" in x]
                    if ces:             # linearizability counterexamples: their diagrams (lin_diagram.py)
                        from harness import lin_diagram
                        o.extend(lin_diagram.fragment(x) for x in ces)
                elif isinstance(ev, dict):
                    o.append(_stats_table(ev))
                else:
                    o.append(f"<p>{esc(_compact(ev))}</p>")
                o.append("</details>")
        else:
            o.append("<p>No anomalies found.</p>")
        stats = c.get("stats")
        if isinstance(stats, dict) and stats:
            o.append(_stats_row_tables(name, stats))
            o.append(f'<details class="stats"><summary>Stats of <code>{esc(name)}</code></summary>'
                     f'{_stats_table(stats)}</details>')
    o.append("</section>")
    return "".join(o)


def _vclass(v: str) -> str:
    return {"valid": "valid", "INVALID": "invalid"}.get(v, "unknown")


def _section_verdict(run: Run) -> str:
    r = run.results or {}
    v = _verdict(r.get("valid")) if run.results is not None else "unknown"
    code = r.get("exit_code")
    lines = []
    if run.results is None:
        lines.append("The run was not checked: there is no usable results.json.")
    if isinstance(code, int) and not isinstance(code, bool):
        meaning = EXIT_MEANING.get(code, "")
        lines.append(f"exit code {code}" + (f" ({meaning})" if meaning else ""))
    checkers = _checkers(r) if run.results is not None else []
    bad = []
    for name, c in checkers:
        an = c.get("anomalies")
        if isinstance(an, dict):
            for ty, ev in an.items():
                if _count(ev):
                    bad.append(f"{ty}: {_count(ev)}")
    if bad:
        lines.append("anomalies — " + ", ".join(bad))
    exp = r.get("expected")
    if exp in ("valid", "invalid"):
        from core.expectation import met_word
        m = r.get("expectation_met")
        why = f" ({r.get('expected_reason')})" if exp == "invalid" and r.get("expected_reason") else ""
        lines.append(f"expected {exp}{why}: expectation {met_word(m if isinstance(m, bool) else None)}")
    if isinstance(r.get("detection"), dict):
        from core.detection import text as detection_text
        lines.append(detection_text(r["detection"]))
    o = [f'<section id="verdict" class="verdict v-{_vclass(v)}" aria-label="verdict">'
         f'<p class="label">Verdict</p><p class="word">{esc(v)}</p>']
    for ln in lines:
        o.append(f'<p class="sub">{esc(ln)}</p>')
    if r.get("error"):
        o.append(f'<pre class="error">{esc(r.get("error"))}</pre>')
    o.append("</section>")
    if run.notes:
        o.append('<section class="notes" aria-label="missing or partial data"><h2>Missing or partial data</h2><ul>')
        o += [f"<li>{esc(n)}</li>" for n in run.notes]
        o.append("</ul></section>")
    return "".join(o)


def _section_summary(run: Run, a: Analysis, faults: list[Fault]) -> str:
    spec, r = run.spec, run.results or {}
    info = r.get("run") if isinstance(r.get("run"), dict) else {}
    rows: list[list[Any]] = []
    name = _test_name(run)
    rows.append(["test", str(name)])
    rows.append(["run folder", str(info.get("dir") or run.dir)])
    unknown = "unknown (no test.toml)" if not spec else "—"
    rows.append(["workload", str(spec.get("workload", unknown))])
    nem = spec.get("nemesis")
    nem_txt = ", ".join(map(str, nem)) if isinstance(nem, list) else (str(nem) if nem is not None else unknown)
    if isinstance(nem, list) and not nem:
        nem_txt = "none"
    seen = sorted({fl.name for fl in faults if not fl.failed})
    failed = sorted({fl.name for fl in faults if fl.failed})
    if seen or failed:
        nem_txt += f" (faults in this run: {', '.join(seen) or 'none'}"
        nem_txt += f"; failed to start, no effect: {', '.join(failed)})" if failed else ")"
    rows.append(["nemeses", nem_txt])
    for k in ("started_at", "ended_at"):
        if info.get(k) is not None:
            rows.append([k.replace("_", " "), str(info[k])])
    wall = _wall_duration(info.get("started_at"), info.get("ended_at"))
    dur = []
    if wall is not None:
        dur.append(f"{wall:.1f} s wall clock")
    if run.history and run.history.ops:
        dur.append(f"{a.t_end:.1f} s of history")
    if spec.get("time_limit") is not None:
        dur.append(f"time limit {_compact(spec.get('time_limit'))} s")
    rows.append(["duration", "; ".join(dur) or "unknown"])
    if info.get("service_url"):
        rows.append(["service URL", str(info["service_url"])])
    cl = [f"{spec[k]} {label if spec[k] == 1 else label + 's'}" for k, label in
          (("zookeepers", "ZooKeeper"), ("bookies", "bookie"), ("brokers", "broker")) if k in spec]
    if cl:
        q = "/".join(str(spec[k]) for k in ("ensemble", "write_quorum", "ack_quorum") if k in spec)
        rows.append(["cluster", ", ".join(cl) + (f"; ensemble/write/ack quorum {q}" if q else "")])
    load = [f"{spec[k]} {k}" for k in ("concurrency", "rate", "topics") if k in spec]
    if load:
        rows.append(["load", ", ".join(load).replace(" rate", " ops/s").replace(" concurrency", " processes")])
    if spec.get("bugs"):
        rows.append(["bug knobs", _compact(spec["bugs"])])
    if spec.get("seed") is not None:
        rows.append(["seed", str(spec["seed"])])
    for k, v in info.items():
        if k not in ("dir", "started_at", "ended_at", "service_url"):
            rows.append([f"run.{k}", _compact(v, key=k)])
    if run.history is not None:
        c = a.counts
        rows.append(["client ops", f"{c['invoke']} invoked: {c['ok']} ok, {c['fail']} fail, {c['info']} info "
                                   f"(indeterminate), {a.never_completed} never completed"])
        rows.append(["nemesis ops", f"{len(a.nemesis_ops)} history rows, {len(faults)} fault periods/events"])
    o = ['<section id="summary" aria-labelledby="h-summary"><h2 id="h-summary">Summary</h2>',
         _table(["", ""], rows, cls="kv summary")]
    if a.by_f:
        frows = []
        for f, cnt in sorted(a.by_f.items(), key=lambda p: -p[1]["invoke"]):
            lat = sorted(ms for _, ms, ty in a.latency.get(f, []) if ty == "ok")
            frows.append([f, cnt["invoke"], cnt["ok"], cnt["fail"], cnt["info"],
                          _fmt_ms(_percentile(lat, 0.5)), _fmt_ms(_percentile(lat, 0.95)),
                          _fmt_ms(_percentile(lat, 0.99)), _fmt_ms(lat[-1] if lat else float("nan"))])
        o.append("<h3>Client ops by function</h3>")
        o.append(_table(["f", "invoked", "ok", "fail", "info", "ok p50", "ok p95", "ok p99", "ok max"], frows,
                        num_cols={5, 6, 7, 8}))
    if a.errors:
        erows = [[ty, f, err, n] for (ty, f, err), n in a.errors.most_common(15)]
        more = len(a.errors) - 15
        o.append("<h3>Most common errors of failed and indeterminate ops</h3>")
        o.append(_table(["type", "f", "error", "count"], erows))
        if more > 0:
            o.append(f'<p class="more">{more} more distinct errors not shown.</p>')
    o.append("</section>")
    return "".join(o)


def _test_name(run: Run) -> str:
    """The spec's test_name; else, for results/<test>/<timestamp>/, the parent folder's name."""
    name = run.spec.get("test_name")
    if isinstance(name, str) and name:
        return name
    if re.fullmatch(r"\d{8}T\d{6}.*", run.dir.name) and run.dir.parent.name:
        return run.dir.parent.name
    return run.dir.name or str(run.dir)


def _wall_duration(a: Any, b: Any) -> float | None:
    from datetime import datetime

    def parse(x: Any) -> float | None:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return float(x) / (1e9 if x > 1e14 else 1)
        if isinstance(x, str):
            try:
                return datetime.fromisoformat(x.replace("Z", "+00:00")).timestamp()
            except ValueError:
                return None
        return None
    pa, pb = parse(a), parse(b)
    if pa is None or pb is None or pb < pa:
        return None
    return pb - pa


def _section_charts(run: Run, a: Analysis, faults: list[Fault], colours: dict[str, str]) -> str:
    o = ['<section id="charts" aria-labelledby="h-charts"><h2 id="h-charts">Charts</h2>']
    x_max = max([a.t_end] + [fl.stop if fl.stop is not None else fl.start for fl in faults] + [0.0])
    faults = [fl for fl in faults if not fl.failed]
    drew = False
    if a.latency:
        fs = sorted(a.latency, key=lambda f: (f != "send", -len(a.latency[f])))[:4]
        for f in fs:
            o.append(_latency_chart(f, a.latency[f], x_max, faults, colours))
        if len(a.latency) > 4:
            o.append(f"<p>{len(a.latency) - 4} less frequent op functions are not charted.</p>")
        drew = True
    if a.completions:
        o.append(_throughput_chart(a.completions, x_max, faults, colours))
        drew = True
    if not drew:
        # no history: fall back to whatever series the checkers computed, on one shared time axis
        planned: list[tuple[str, Any]] = []
        for _, c in _checkers(run.results or {}):
            st = c.get("stats") if isinstance(c.get("stats"), dict) else {}
            lot = st.get("latency_over_time")
            pts = _stats_points(lot.get("points") if isinstance(lot, dict) else None)
            if pts:
                planned.append(("points", pts))
            for key, title, yl, log in (("latency_over_time", "Latency over time", "latency (ms, log)", True),
                                        ("throughput", "Throughput", "ops per second", False)):
                if key not in st or (key == "latency_over_time" and pts):
                    continue
                try:
                    series, _ = _stats_series(st[key])
                except (TypeError, ValueError):
                    continue
                series = {STAT_NAMES.get(k, k): [(t, max(v, 1e-3) if log else v) for t, v in ps
                                                 if math.isfinite(t) and math.isfinite(v)]
                          for k, ps in series.items()}
                series = {k: ps for k, ps in series.items() if ps}
                if series:
                    planned.append(("series", (title, yl, series, log)))
        for kind, item in planned:
            xs = [p[0] for p in item] if kind == "points" else [p[0] for ps in item[2].values() for p in ps]
            x_max = max([x_max] + xs)
        for kind, item in planned:
            if kind == "points":
                o.append(_latency_chart("send", item, x_max, faults, colours)
                         .replace("</figcaption>", " (points from the checker's stats)</figcaption>", 1))
            else:
                title, yl, series, log = item
                o.append(_stats_chart(title, yl, series, log, faults, colours, x_max))
            drew = True
    if not drew:
        o.append("<p>No client operations with completions in the history (or no history): nothing to chart."
                 "</p>")
    o.append("</section>")
    return "".join(o)


def _balance_stats(run: Run) -> dict[str, Any] | None:
    """The stats of the `balance` checker (checkers/balance.py), when results.json has them."""
    for name, c in _checkers(run.results or {}):
        st = c.get("stats")
        if name == "balance" and isinstance(st, dict) and isinstance(st.get("load"), dict):
            return st
    return None


def _section_balance(run: Run, a: Analysis, faults: list[Fault], colours: dict[str, str]) -> str:
    """The load balancer: each broker's load over time, time to balanced per scale event, moves and the
    worst per-topic unavailability, from the balance checker's stats."""
    st = _balance_stats(run)
    if st is None:
        return ""
    o = ['<section id="balance" aria-labelledby="h-balance"><h2 id="h-balance">Load balance</h2>']
    load = st.get("load") or {}
    moves = st.get("moves") if isinstance(st.get("moves"), list) else []
    x_max = max([a.t_end] + [fl.stop if fl.stop is not None else fl.start for fl in faults] +
                [t for s in load.values() if isinstance(s, dict) for t in (s.get("t") or [])
                 if isinstance(t, (int, float))] + [0.0])
    drawn = [fl for fl in faults if not fl.failed]
    gap = st.get("report_window_s")
    gap = float(gap) if isinstance(gap, (int, float)) and not isinstance(gap, bool) and gap > 0 else 3.0
    charts = [_load_chart("Load per broker (max usage with weight)", "max usage with weight (0..1)", "usage", load,
                          moves, x_max, drawn, colours, gap),
              _load_chart("Message rate per broker (in + out)", "messages per second", "msg_rate", load, moves,
                          x_max, drawn, colours, gap),
              _load_chart("Topics per broker", "topics", "topics", load, moves, x_max, drawn, colours, gap)]
    if any(charts):
        o.extend(c for c in charts if c)
    else:
        o.append("<p>No load reports in the history: the brokers logged no <code>load-report</code> events "
                 "(brokers older than the load-report events, or no load balancer), so there is no load to "
                 "draw and no time to balanced.</p>")
    tgt = st.get("target_topic_spread")
    o.append(f"<p>Balanced: over the brokers with a load report in the last {esc(_compact(st.get('report_window_s')))}"
             f" s, the spread of max usage with weight at most {esc(_compact(st.get('target_spread')))} and the "
             f"spread of topic counts at most "
             + (esc(_compact(tgt)) if tgt is not None else
                f"{esc(_compact(st.get('topic_spread_fraction')))} &times; their mean (at least one bundle's "
                f"worth of topics)") + ".</p>")
    rows = []
    for e in st.get("scale_events") or []:
        if not isinstance(e, dict):
            continue
        ttb = e.get("balanced_after_s")
        spreads = (f"usage {e.get('usage_spread')}, topics {e.get('topic_spread')}" if ttb is not None else
                   f"last: usage {e.get('last_usage_spread')}, topics {e.get('last_topic_spread')}"
                   if e.get("last_judged_s") is not None else "")
        rows.append([str(e.get("event")), ", ".join(map(str, e.get("brokers") or [])),
                     _Secs(e["at_s"]) if isinstance(e.get("at_s"), (int, float)) else "",
                     _Secs(ttb) if isinstance(ttb, (int, float)) else str(e.get("outcome") or ""),
                     spreads, "" if e.get("topic_target") is None else e.get("topic_target"),
                     "" if ttb is None else "yes" if e.get("before_next_event") else "no"])
    o.append("<h3>Time to balanced after each scale event</h3>")
    o.append(_table(["event", "brokers", "at (s)", "balanced after (s)", "spreads then", "topic target",
                     "before the next event"], rows) if rows else "<p>No scale events (brokers leaving or "
             "joining) in this run.</p>")
    un = st.get("unavailability") if isinstance(st.get("unavailability"), dict) else {}
    by_reason = st.get("unloads_by_reason") if isinstance(st.get("unloads_by_reason"), dict) else {}
    mrows = [["unloads", st.get("unloads", 0)]]
    mrows += [[f"unloads: {k}", v] for k, v in sorted(by_reason.items())]
    mrows += [["splits (logged by owners)", st.get("splits", 0)],
              ["splits decided by the leader", st.get("splits_by_leader", 0)],
              ["admin splits (nemesis)", st.get("admin_splits", 0)],
              ["admin unloads (nemesis)", st.get("admin_unloads", 0)]]
    worst = un.get("worst_gap_s")
    rows_u = st.get("unavailability_rows") if isinstance(st.get("unavailability_rows"), list) else []
    w = rows_u[0] if rows_u and isinstance(rows_u[0], dict) else {}
    mrows.append(["worst per-topic unavailability (s)",
                  "none measured" if worst is None else
                  f"{worst} s: {w.get('topic')} (usual gap {w.get('usual_gap_s')} s), {w.get('reason')} unload of "
                  f"{w.get('bundle')} at {w.get('unload_s')} s"])
    ex = un.get("worst_excess")
    if isinstance(ex, dict):
        mrows.append(["worst excess over the topic's usual gap (s)",
                      f"{ex.get('excess_s')} s: {ex.get('topic')} (gap {ex.get('gap_s')} s, usual {ex.get('usual_gap_s')}"
                      f" s), {ex.get('reason')} unload of {ex.get('bundle')} at {ex.get('unload_s')} s"])
    mrows.append(["median per-topic gap during unloads (s)",
                  "none measured" if un.get("p50_gap_s") is None else _compact(un.get("p50_gap_s"))])
    o.append("<h3>Moves and unavailability</h3>")
    o.append(_table(["", ""], mrows, cls="kv summary"))
    o.append("</section>")
    return "".join(o)


def _section_faults(a: Analysis, faults: list[Fault], colours: dict[str, str], source: str) -> str:
    o = ['<section id="faults" aria-labelledby="h-faults"><h2 id="h-faults">Fault timeline</h2>']
    if not faults:
        o.append("<p>No faults were recorded" + (" in the history." if source else ": no history.") + "</p>")
        o.append("</section>")
        return "".join(o)
    counted = " The ok, fail and info counts are client ops that completed while the fault was active." \
        if a.completions else ""
    o.append(f"<p>From {esc(source)}. Times are seconds since the run started.{counted}</p>")
    comp = {ty: a.completions.get(ty, []) for ty in ("ok", "fail", "info")}   # already in time order
    rows = []
    for i, fl in enumerate(faults, 1):
        end = a.t_end if fl.stop is None else fl.stop
        counts: list[Any] = []
        for ty in ("ok", "fail", "info"):
            ts = comp[ty]
            counts.append("" if fl.point or fl.failed or not a.completions else
                          bisect.bisect_right(ts, end) - bisect.bisect_left(ts, fl.start))
        swatch = f'<span class="swatch" style="background:{_fault_colour(fl.name, colours)}"></span>'
        dur = "—" if fl.stop is None else f"{fl.stop - fl.start:.3f}"
        rows.append([i, _Raw(swatch + esc(fl.name)), _Secs(fl.start),
                     "—" if fl.stop is None else _Secs(fl.stop), dur, fl.targets, *counts,
                     _join("one-shot" if fl.point else "", fl.status)])
    o.append(_table(["#", "fault", "start (s)", "stop (s)", "duration (s)", "targets", "ok", "fail", "info",
                     "notes"], rows, num_cols={4}))
    o.append("</section>")
    return "".join(o)


def _section_spec(run: Run) -> str:
    o = ['<section id="spec" aria-labelledby="h-spec"><h2 id="h-spec">Test spec (test.toml)</h2>']
    if run.spec_text is None:
        o.append("<p>test.toml is missing.</p>")
    else:
        o.append('<p><a href="test.toml">test.toml</a>, verbatim:</p>')
        o.append(f'<pre class="spec">{esc(run.spec_text)}</pre>')
    o.append("</section>")
    return "".join(o)


def _href(rel: str) -> str:
    return esc(quote(rel, safe="/"))


def _section_files(run: Run) -> str:
    o = ['<section id="files" aria-labelledby="h-files"><h2 id="h-files">Node logs and raw files</h2>',
         "<h3>Node logs</h3>"]
    nodes = run.dir / "nodes"
    if nodes.is_dir():
        try:
            entries = sorted(nodes.iterdir(), key=lambda p: p.name)
        except OSError:
            entries = []
        if not entries:
            o.append("<p>nodes/ is empty.</p>")
        o.append("<ul class='files'>")
        for node in entries:
            if node.is_dir():
                files = []
                try:
                    for root, dirs, names in os.walk(node):
                        dirs.sort()
                        for nm in sorted(names):
                            files.append(Path(root) / nm)
                            if len(files) > MAX_LINKED_FILES:
                                break
                        if len(files) > MAX_LINKED_FILES:
                            break
                except OSError:
                    pass
                o.append(f"<li><strong>{esc(node.name)}</strong>")
                if files:
                    o.append("<ul>")
                    for p in files[:MAX_LINKED_FILES]:
                        rel = p.relative_to(run.dir).as_posix()
                        o.append(f'<li><a href="{_href(rel)}">{esc(p.relative_to(node).as_posix())}</a> '
                                 f'<span class="size">{esc(_file_size(p))}</span></li>')
                    if len(files) > MAX_LINKED_FILES:
                        o.append(f"<li>… more files in {esc(node.relative_to(run.dir).as_posix())}/</li>")
                    o.append("</ul>")
                else:
                    o.append(" (no files)")
                o.append("</li>")
            else:
                rel = node.relative_to(run.dir).as_posix()
                o.append(f'<li><a href="{_href(rel)}">{esc(node.name)}</a> '
                         f'<span class="size">{esc(_file_size(node))}</span></li>')
        o.append("</ul>")
    else:
        o.append("<p>No nodes/ folder: node logs were not collected.</p>")
    o.append("<h3>Raw files</h3><ul class='files'>")
    try:
        top = sorted(p for p in run.dir.iterdir() if p.is_file() and p.name != REPORT_NAME
                     and not p.name.endswith(".tmp"))
    except OSError:
        top = []
    names = {p.name for p in top}
    for p in top:
        o.append(f'<li><a href="{_href(p.name)}">{esc(p.name)}</a> <span class="size">{esc(_file_size(p))}'
                 f'</span></li>')
    for expected in ("test.toml", "history.jsonl", "history.parquet", "deliveries.parquet", "results.json"):
        if expected not in names:
            o.append(f'<li class="missing">{esc(expected)} — missing</li>')
    o.append("</ul></section>")
    return "".join(o)


def _file_size(p: Path) -> str:
    try:
        return _size(p.stat().st_size)
    except OSError:
        return ""


CSS = """
:root{color-scheme:light}
*{box-sizing:border-box}
body{margin:0;background:#fff;color:#1a1a1a;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,
"DejaVu Sans",sans-serif}
main{max-width:1180px;margin:0 auto;padding:12px 24px 64px}
nav{position:sticky;top:0;z-index:2;background:#f1f3f5;border-bottom:1px solid #c8cdd2;padding:8px 24px;
font-size:15px}
nav a{margin-right:16px}
a{color:#0b4f9c}
a:focus-visible,th:focus-visible,summary:focus-visible{outline:3px solid #c77700;outline-offset:2px}
h1{font-size:26px;margin:16px 0 8px}
h2{font-size:22px;margin:32px 0 8px;border-bottom:2px solid #d0d4d9;padding-bottom:4px}
h3{font-size:18px;margin:20px 0 6px}
h4{font-size:17px;margin:0;display:inline}
.verdict{border-radius:10px;padding:16px 24px;color:#fff;margin:12px 0}
.verdict p{margin:0}
.verdict .label{font-size:16px;text-transform:uppercase;letter-spacing:.08em}
.verdict .word{font-size:60px;font-weight:800;line-height:1.1}
.verdict .sub{font-size:18px}
.verdict pre.error{background:#fff;color:#1a1a1a;margin-top:10px;max-height:20em}
.v-valid{background:#17692f}.v-invalid{background:#a8201a}.v-unknown{background:#80460a}
.badge{padding:1px 10px;border-radius:6px;color:#fff;font-weight:700}
.b-valid{background:#17692f}.b-invalid{background:#a8201a}.b-unknown{background:#80460a}
.notes{background:#fff6dc;border:2px solid #a87a00;border-radius:8px;padding:4px 20px 8px;margin:12px 0}
.notes h2{border:0;margin:8px 0 0;font-size:18px}
.tablewrap{overflow-x:auto;max-width:100%}
.tablewrap.scroll{max-height:36em;overflow-y:auto;border-bottom:1px solid #c8cdd2}
.tablewrap.scroll thead th{position:sticky;top:0;z-index:1}
table{border-collapse:collapse;font-size:15px;margin:6px 0 12px}
th,td{border:1px solid #c8cdd2;padding:4px 8px;text-align:left;vertical-align:top}
thead th{background:#e6eaee;position:relative}
table.sortable thead th{cursor:pointer}
table.sortable thead th[aria-sort=ascending]::after{content:" \\25B2"}
table.sortable thead th[aria-sort=descending]::after{content:" \\25BC"}
tbody tr:nth-child(even){background:#f5f7f9}
table.kv td:first-child{font-weight:600;white-space:nowrap}
table.summary thead{display:none}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.ev{white-space:pre-line;overflow-wrap:break-word;min-width:7em;max-width:44em;font-family:ui-monospace,"DejaVu Sans Mono",
monospace;font-size:14px}
code,pre{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:14px}
pre{background:#f5f7f9;border:1px solid #c8cdd2;border-radius:6px;padding:12px;overflow:auto;white-space:pre-wrap}
details{margin:8px 0}
summary{cursor:pointer;padding:2px 0}
.more{font-style:italic}
figure.chart{margin:12px 0 24px}
figure.chart figcaption{margin-bottom:4px}
figure.chart svg{width:100%;height:auto;max-width:1100px;display:block;border:1px solid #d0d4d9}
.swatch{display:inline-block;width:14px;height:14px;border:1px solid #5b5b5b;margin-right:6px;
vertical-align:-2px}
ul.files{padding-left:22px}
.size{color:#4a4f55}
li.missing{color:#6b3a00}
"""

JS = """
(function(){
function key(c){if(!c)return '';var v=c.getAttribute('data-v');if(v!==null&&v!==''&&!isNaN(Number(v)))return Number(v);
var t=c.textContent.trim(),n=Number(t);return(t!==''&&!isNaN(n))?n:t.toLowerCase();}
function sortBy(th){var table=th.closest('table'),tb=table.tBodies[0],i=th.cellIndex;
var asc=th.getAttribute('aria-sort')!=='ascending';
Array.prototype.forEach.call(th.parentNode.cells,function(h){h.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',asc?'ascending':'descending');
var rows=Array.prototype.slice.call(tb.rows);
rows.sort(function(a,b){var x=key(a.cells[i]),y=key(b.cells[i]);
if(typeof x!==typeof y){x=String(x);y=String(y);}return(x<y?-1:x>y?1:0)*(asc?1:-1);});
rows.forEach(function(r){tb.appendChild(r);});}
Array.prototype.forEach.call(document.querySelectorAll('table.sortable thead th'),function(th){
th.tabIndex=0;th.title='Sort by this column';
th.addEventListener('click',function(){sortBy(th);});
th.addEventListener('keydown',function(e){if(e.key==='Enter'||e.key===' '){e.preventDefault();sortBy(th);}});});
})();
"""


# ----------------------------------------------------------------------------------------------- entry points

def render(run_dir: Path | str) -> Path:
    """Write `report.html` into the run folder from whatever the run left there; return its path.

    Never fails on a partial run (missing or corrupt files are named on the page); raises ReportError
    only if the folder does not exist or the report cannot be written."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run folder; fix: give the folder of one run, "
                          f"e.g. results/latest")
    run = _load(run_dir)
    a = _analyse(run.history)
    stats_faults = None
    for _, c in _checkers(run.results or {}):
        st = c.get("stats")
        if isinstance(st, dict) and stats_faults is None:
            stats_faults = _faults_from_stats(st.get("fault_periods"))
    # the history says more (start/stop outcomes, errors); the checker's periods serve when it is gone
    if a.nemesis_ops or stats_faults is None:
        faults = _faults_from_history(a.nemesis_ops, a.t_end)
        fault_source = "the history's nemesis ops" if run.history is not None else ""
    else:
        faults, fault_source = stats_faults, "the checker's fault_periods"
    colours: dict[str, str] = {}
    used: set[str] = {"verdict", "summary", "anomalies", "charts", "balance", "faults", "spec", "files"}

    v = _verdict((run.results or {}).get("valid")) if run.results is not None else "unknown"
    name = _test_name(run)
    title = f"{v} — {name} {run_dir.name} — pulsar-chaos report"
    body = [
        _section_verdict(run),
        _section_summary(run, a, faults),
        _section_anomalies(run, used),
        _section_charts(run, a, faults, colours),
        _section_balance(run, a, faults, colours),
        _section_faults(a, faults, colours, fault_source),
        _section_spec(run),
        _section_files(run),
    ]
    page = "".join([
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        '<nav aria-label="sections"><a href="#verdict">Verdict</a><a href="#summary">Summary</a>'
        '<a href="#anomalies">Anomalies</a><a href="#charts">Charts</a>'
        + ('<a href="#balance">Balance</a>' if _balance_stats(run) is not None else "") + '<a href="#faults">Faults</a>'
        '<a href="#spec">Spec</a><a href="#files">Files</a></nav>',
        f'<main><h1>pulsar-chaos: {esc(name)} <span class="run">{esc(run_dir.name)}</span></h1>',
        *body,
        "</main>",
        f"<script>{JS}</script></body></html>\n",
    ])
    out = run_dir / REPORT_NAME
    tmp = run_dir / (REPORT_NAME + ".tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        raise ReportError(f"{out}: cannot write the report ({e.strerror}); fix: make the run folder "
                          f"writable") from None
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.report RUN_DIR...`: (re)write each run's report.html."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m harness.report RUN_DIR...", file=sys.stderr)
        return 254
    rc = 0
    for d in args:
        try:
            print(render(d))
        except ReportError as e:
            print(f"error: {e}", file=sys.stderr)
            rc = 1
    return rc

