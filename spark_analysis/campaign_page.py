"""campaign.html: one self-contained page (inline SVG plots, inline JS for sortable tables, no network
URL at all) with the campaign tables and a link to each run's report.html (relative when local)."""
from __future__ import annotations

import html
import math
import os
from datetime import datetime
from pathlib import Path
from typing import Any

SVG_NS = "http://www.w3.org/2000/svg"      # the one URL the page holds: a namespace name, never fetched

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3;cursor:pointer;user-select:none;white-space:nowrap}
th.asc:after{content:" \\25B2"}th.desc:after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b00020;font-weight:600}.good{color:#1b7f3b}.muted{color:#777}
.cards{display:flex;gap:1em;flex-wrap:wrap}.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em}
.card b{font-size:1.4em;display:block}.plots{display:flex;gap:2em;flex-wrap:wrap}
figure{margin:0}figcaption{font-size:12px;color:#555}
"""

JS = """
function sortTable(th){
  var table=th.closest('table'),tb=table.tBodies[0],i=Array.prototype.indexOf.call(th.parentNode.children,th);
  var asc=!th.classList.contains('asc');
  Array.prototype.forEach.call(th.parentNode.children,function(x){x.classList.remove('asc','desc')});
  th.classList.add(asc?'asc':'desc');
  var rows=Array.prototype.slice.call(tb.rows);
  function key(r){var t=r.cells[i]?r.cells[i].getAttribute('data-v')||r.cells[i].textContent:'';
    var n=parseFloat(t);return (t!==''&&!isNaN(n)&&isFinite(t))?[0,n]:[1,t.toLowerCase()]}
  rows.sort(function(a,b){var x=key(a),y=key(b);if(x[0]!==y[0])return x[0]-y[0];
    return (x[1]<y[1]?-1:x[1]>y[1]?1:0)*(asc?1:-1)});
  rows.forEach(function(r){tb.appendChild(r)});
}
document.addEventListener('click',function(e){if(e.target.tagName==='TH'&&e.target.closest('table.sortable'))sortTable(e.target)});
"""


def _na(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    try:
        import pandas as pd
        r = pd.isna(v)
        return bool(r) if isinstance(r, bool) or not hasattr(r, "__len__") else False
    except Exception:
        return False


def _cell(v: Any) -> str:
    if _na(v):
        return '<td class="muted"></td>'
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, bool):
        return f"<td>{'yes' if v else 'no'}</td>"
    if isinstance(v, (int, float)):
        txt = f"{v:g}" if isinstance(v, float) else str(v)
        return f'<td class="num" data-v="{v}">{html.escape(txt)}</td>'
    if isinstance(v, (list, tuple)):
        v = ", ".join(_short(x) for x in v)
    txt = str(v)
    cls = ' class="bad"' if txt in ("false", "NO") else ' class="good"' if txt in ("true", "yes") else ""
    return f"<td{cls}>{html.escape(txt)}</td>"


def _short(x: Any) -> str:
    if hasattr(x, "asDict"):
        x = x.asDict()
    if isinstance(x, dict) and "ledger_id" in x:
        return f"({x['ledger_id']},{x['entry_id']},{x['batch_index']})"
    return str(x)


def table(df: Any, cols: list[str] | None = None, extra: dict[str, list[str]] | None = None,
          max_rows: int = 5000) -> str:
    """A sortable HTML table of a pandas DataFrame; `extra` maps a column to raw HTML cells."""
    if df is None or len(df) == 0:
        return '<p class="muted">none</p>'
    cols = [c for c in (cols or list(df.columns)) if c in df.columns or (extra and c in extra)]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    recs = df.to_dict("records")
    for i, r in enumerate(recs[:max_rows]):
        cells = []
        for c in cols:
            if extra and c in extra:
                cells.append(extra[c][i])
            else:
                cells.append(_cell(r.get(c)))
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f'<p class="muted">{len(recs) - max_rows} more rows in the Parquet table</p>' if len(recs) > max_rows else ""
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{more}'


# ------------------------------------------------------------------------------------ plots

def _tick(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 10 else f"{x:.2g}"


def bar_chart(labels: list[str], series: list[tuple[str, list[float | None], str]], title: str,
              unit: str = "", width: int = 560, height: int = 240) -> str:
    """Grouped vertical bars: one group per label, one bar per series (name, values, colour)."""
    vals = [v for _, vs, _ in series for v in vs if v is not None and not _na(v)]
    if not labels or not vals:
        return ""
    top = max(vals) or 1.0
    left, bottom, pad = 64, 70, 10
    pw, ph = width - left - pad, height - bottom - pad
    gw = pw / len(labels)
    bw = max(2.0, gw * 0.8 / len(series))
    parts = [f'<svg xmlns="{SVG_NS}" width="{width}" height="{height}" role="img" aria-label="{html.escape(title)}" '
             f'style="overflow:visible">']
    for k in range(5):
        y = pad + ph - ph * k / 4
        parts.append(f'<line x1="{left}" x2="{width - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{_tick(top * k / 4)}</text>')
    for i, lab in enumerate(labels):
        x0 = left + i * gw + gw * 0.1
        for j, (name, vs, colour) in enumerate(series):
            v = vs[i]
            if v is None or _na(v):
                continue
            h = ph * (v / top)
            parts.append(f'<rect x="{x0 + j * bw:.1f}" y="{pad + ph - h:.1f}" width="{bw - 1:.1f}" height="{h:.1f}" '
                         f'fill="{colour}"><title>{html.escape(f"{lab} {name}: {v:.4g}{unit}")}</title></rect>')
        short = lab if len(lab) <= 16 else lab[:15] + "…"
        parts.append(f'<text x="{left + (i + .5) * gw:.1f}" y="{height - bottom + 14}" font-size="10" '
                     f'text-anchor="end" transform="rotate(-30 {left + (i + .5) * gw:.1f} {height - bottom + 14})">'
                     f'{html.escape(short)}</text>')
    lx = left
    for name, _, colour in series:
        parts.append(f'<rect x="{lx}" y="{height - 14}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{lx + 14}" y="{height - 5}" font-size="11">{html.escape(name)}</text>')
        lx += 24 + 7 * len(name)
    parts.append("</svg>")
    return f"<figure>{''.join(parts)}<figcaption>{html.escape(title)}</figcaption></figure>"


# ------------------------------------------------------------------------------------ page

def _link(run: Any, page_dir: Path | None) -> str:
    rp = run.report_path()
    if not rp:
        return '<td class="muted">no report</td>'
    href = rp
    if page_dir is not None and run.local:
        href = os.path.relpath(Path(rp).resolve(), page_dir.resolve())
    href = href.replace(os.sep, "/")
    return f'<td><a href="{html.escape(href, quote=True)}">report</a></td>'


def page(res: Any, page_dir: Path | None) -> str:
    from spark_analysis.campaign import TYPE_COLUMNS
    t = res.tables
    runs_df = t.get("runs")
    by_id = {r.run_id: r for r in res.runs}
    n_runs = len(res.runs)
    py_invalid = int((runs_df["python_valid"] == "false").sum()) if runs_df is not None and len(runs_df) else 0
    sp_invalid = int((runs_df["spark_valid"] == "false").sum()) if runs_df is not None and len(runs_df) else 0
    n_anom = int(t["anomaly_counts"]["count"].sum()) if t.get("anomaly_counts") is not None and len(t["anomaly_counts"]) else 0
    cards = "".join(f'<div class="card"><b>{v}</b>{html.escape(k)}</div>' for k, v in (
        ("runs analysed", n_runs), ("runs skipped", len(res.skipped)), ("invalid (checkers)", py_invalid),
        ("invalid (Spark checks)", sp_invalid), ("anomalies found by Spark", n_anom)))

    plots = []
    tr = t.get("trends")
    if tr is not None and len(tr):
        days = [str(d) for d in tr["day"]]
        plots.append(bar_chart(days, [("runs", list(tr["runs"]), "#8da0cb"),
                                      ("invalid", list(tr["python_invalid"]), "#e15759")], "runs per day"))
        if tr["write_p99_ms"].notna().any():
            plots.append(bar_chart(days, [("p50", list(tr["write_p50_ms"]), "#76b7b2"),
                                          ("p99", list(tr["write_p99_ms"]), "#f28e2b")],
                                   "write latency per day (ms)", " ms"))
    det = t.get("detection")
    if det is not None and len(det):
        plots.append(bar_chart([str(k) for k in det["cause"]],
                               [("checkers", list(det["python_rate"]), "#4e79a7"),
                                ("Spark checks", list(det["spark_rate"]), "#59a14f")],
                               "detection rate per bug knob or unsafe option ('none': false-alarm rate; "
                               "no Spark bar: not re-checked)"))
    pbs = t.get("perf_by_state")
    if pbs is not None and len(pbs):
        w = pbs[pbs["f"].isin(["send", "enqueue", "add", "put", "write", "cas"])]
        if len(w):
            labels = [f"{a} {b} {c}" for a, b, c in zip(w["workload"], w["f"], w["state"])]
            plots.append(bar_chart(labels, [("p50", list(w["p50_ms"]), "#76b7b2"),
                                            ("p99", list(w["p99_ms"]), "#f28e2b")],
                                   "write latency by fault state (ms)", " ms"))
    if runs_df is not None and len(runs_df):
        sums = [(c, float(runs_df[c].fillna(0).sum())) for c in TYPE_COLUMNS if c in runs_df]
        sums = [(c, v) for c, v in sums if v > 0]
        if sums:
            plots.append(bar_chart([c for c, _ in sums], [("anomalies", [v for _, v in sums], "#e15759")],
                                   "anomalies found by the Spark checks, by type"))

    sections = [
        ("Verdicts by configuration", "workload x nemesis x E/Qw/Qa x bug knobs x backend; 'valid' / 'invalid' "
         "/ 'unknown' are the run's own checkers (results.json), spark_invalid the Spark checks; the "
         "anomaly columns are the Spark counts.", table(t.get("by_config"))),
        ("Detection and false alarms", "per bug knob or deliberately unsafe workload option (the runs expected "
         "invalid): the share judged invalid; 'none' are the runs expected valid (any invalid one is a false "
         "alarm or a real bug). The Spark columns count only the runs Spark re-checks (log and queue "
         "anomalies); 'not re-checked' where the deciding checker (fencing, elle, linear, exactly-once, perf) "
         "has no Spark equivalent. mean_detection_s: the mean time to first detection (results.json's "
         "detection: from the first fault to the first op the deciding checker names) over the invalid runs.",
         table(t.get("detection"))),
        ("Detection matrix", "per bug knob or unsafe option and scenario (the run's spec without its knobs, seed "
         "and names): detected / runs (target 4 of 5; meets_target false marks a row short of it), the deciding "
         "anomaly types, the mean time to first detection, and false_alarms / false_alarm_runs of the same "
         "scenario without it; the 'none' rows are each scenario's runs expected valid. "
         "`pulsar-chaos detection` prints the same figures as a markdown table.", table(t.get("detection_matrix"))),
        ("Latency and throughput by fault state", "client ops by the fault state at their invocation; "
         "throughput = ok ops per second spent in that state.", table(t.get("perf_by_state"))),
        ("Unavailability by fault state", "gaps between ok writes of a topic, attributed to the state at "
         "their middle.", table(t.get("unavailability"))),
        ("Time to recover after a fault stops", "from the stop to the first ok write after it.",
         table(t.get("recovery"))),
        ("Trends by day", "", table(t.get("trends"))),
    ]
    runs_html = '<p class="muted">none</p>'
    if runs_df is not None and len(runs_df):
        links = [_link(by_id[r], page_dir) if r in by_id else "<td></td>" for r in runs_df["run_id"]]
        cols = (["run_id", "report", "workload", "nemesis", "quorum", "bugs", "backend", "started_at", "ops",
                 "expected", "python_valid", "expectation_met", "spark_valid", "spark_rechecked", "agrees",
                 "longest_gap_s", "detection_s", "scenario"]
                + [c for c in TYPE_COLUMNS if c in runs_df and runs_df[c].fillna(0).sum() > 0] + ["notes"])
        runs_html = table(runs_df, cols, extra={"report": links})
    sections.append(("Runs", "agrees: the Spark counts equal results.json's for every checked type.", runs_html))
    ex = t.get("anomaly_examples")
    sections.append(("Anomaly examples", "the first five per run and type; all of them are in anomalies.parquet.",
                     table(ex, ["run_id", "checker", "type", "topic", "value", "values", "message_ids", "process",
                                "partition", "deliveries", "attempts"])))
    sk = t.get("skipped")
    skipped_html = table(sk) if sk is not None and len(sk) else '<p class="muted">none</p>'
    sections.append(("Skipped runs", "run folders that could not be analysed, with the reason.", skipped_html))

    body = "".join(f"<h2>{html.escape(h)}</h2>" + (f"<p>{html.escape(p)}</p>" if p else "") + s
                   for h, p, s in sections)
    when = datetime.now().astimezone().isoformat(timespec="seconds")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>pulsar-chaos campaign</title>'
            f"<style>{CSS}</style></head><body><h1>pulsar-chaos campaign</h1>"
            f'<p class="muted">{html.escape(when)} &middot; {html.escape(res.out_dir)}</p>'
            f'<div class="cards">{cards}</div><div class="plots">{"".join(plots)}</div>{body}'
            f"<script>{JS}</script></body></html>")
