"""`pulsar-chaos serve`: a read-only local web page of every run and campaign under a results dir (Jepsen's
`serve`): a sortable, filterable table of runs, the campaigns with their summaries and Spark pages, a
trend of verdicts by night, and every file of a run folder. Flask (werkzeug) does the HTTP; bound to
127.0.0.1 unless told otherwise; it only reads.
"""
from __future__ import annotations

import html
import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import store

STAMP = re.compile(r"^(\d{8})T(\d{6})(?:-\d+)?$")
MAX_DEPTH = 8


@dataclass
class RunRow:
    path: str                       # relative to the results dir
    test: str
    workload: str
    nemesis: str
    knobs: str
    options: str
    verdict: str
    expected: str
    met: str
    anomalies: str
    date: str                       # YYYY-mm-dd HH:MM:SS, from the folder name
    campaign: str
    has_report: bool


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _read_toml(p: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def _date(name: str) -> str:
    m = STAMP.match(name)
    if not m:
        return ""
    d, t = m.group(1), m.group(2)
    return f"{d[:4]}-{d[4:6]}-{d[6:]} {t[:2]}:{t[2:4]}:{t[4:]}"


def run_row(root: Path, d: Path) -> RunRow:
    spec = _read_toml(d / store.TEST_TOML)
    res = _read_json(d / store.RESULTS_JSON)
    res = res if isinstance(res, dict) else {}
    v = res.get("valid") if res else None
    verdict = "valid" if v is True else "invalid" if v is False else ("unknown" if res else "no results")
    nem = spec.get("nemesis", [])
    nem = ",".join(nem) if isinstance(nem, list) else str(nem)
    bugs = spec.get("bugs") or {}
    knobs = ",".join(f"{k}={json.dumps(x)}" for k, x in sorted(bugs.items())) if isinstance(bugs, dict) else ""
    opts = spec.get("options") or {}
    options = ",".join(f"{k}={x}" for k, x in sorted(opts.items())) if isinstance(opts, dict) else ""
    expected, m = res.get("expected") or spec.get("expected"), res.get("expectation_met")
    if expected not in ("valid", "invalid"):       # a run made before expectations: derived as now
        import workloads
        from core.expectation import met
        found = workloads.unsafe_causes(str(spec.get("workload", "log")), opts if isinstance(opts, dict) else {},
                                        bugs if isinstance(bugs, dict) else {}, spec)
        expected = "invalid" if found else "valid"
        m = met(expected, v) if res else None
    rel = d.relative_to(root)
    parts = rel.parts
    campaign = f"{parts[1]}/{parts[2]}" if len(parts) > 3 and parts[0] == "campaigns" else ""
    return RunRow(path=rel.as_posix(), test=str(spec.get("test_name") or d.parent.name),
                  workload=str(spec.get("workload", "")), nemesis=nem or "none", knobs=knobs or "none",
                  options=options, verdict=verdict, expected=expected,
                  met="yes" if m is True else "NO" if m is False else "", anomalies=store.anomalies_text(res),
                  date=_date(d.name), campaign=campaign, has_report=(d / store.REPORT_HTML).is_file())


def find_runs(root: Path) -> list[Path]:
    """Every run folder (holding test.toml) under root, not following links (results/latest)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        if store.TEST_TOML in filenames and STAMP.match(Path(dirpath).name):
            out.append(Path(dirpath))
            dirnames[:] = []
            continue
        dirnames[:] = [n for n in dirnames if depth < MAX_DEPTH and n not in (store.NODES, store.JOURNALS, store.LOGS)
                       and not (Path(dirpath) / n).is_symlink()]
    return sorted(out)


def find_campaigns(root: Path) -> list[dict[str, Any]]:
    out = []
    for cj in sorted(root.glob("campaigns/*/*/campaign.json")):
        state = _read_json(cj) or {}
        recs = state.get("entries") or []
        d = cj.parent
        pages = sorted(d.glob("analysis/*/campaign.html"))
        out.append({"path": d.relative_to(root).as_posix(), "name": state.get("campaign", d.parent.name),
                    "date": _date(d.name), "runs": len(recs),
                    "met": sum(1 for r in recs if r.get("met") is True),
                    "not_met": sum(1 for r in recs if r.get("met") is False),
                    "other": sum(1 for r in recs if r.get("met") is None),
                    "summary": (d / "summary.txt").is_file(), "junit": (d / "junit.xml").is_file(),
                    "spark": pages[-1].relative_to(root).as_posix() if pages else None})
    return out


def find_simulations(root: Path) -> list[dict[str, Any]]:
    """Every `pulsar-chaos lb-sim --out DIR` under root (a folder holding lb-sim.json): its scenario and,
    per run, the load manager, the setting swept and the headline figure beside the seed's."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        if "lb-sim.json" in filenames:
            d = Path(dirpath)
            data = _read_json(d / "lb-sim.json") or {}
            sc = data.get("scenario") or {}
            runs = [f"{r.get('load_manager')}{' ' + r['sweep'] if r.get('sweep') else ''}: {r.get('headline')}"
                    for r in data.get("results") or [] if isinstance(r, dict)]
            out.append({"path": d.relative_to(root).as_posix(), "scenario": sc.get("name", "?"),
                        "size": f"{sc.get('brokers')} brokers, {sc.get('bundles')} bundles, {sc.get('topics')} topics",
                        "runs": runs, "seed": sc.get("seed") or {}, "page": (d / "index.html").is_file()})
            dirnames[:] = []
            continue
        dirnames[:] = [n for n in dirnames if depth < MAX_DEPTH and n not in (store.NODES, store.JOURNALS, store.LOGS)
                       and not (Path(dirpath) / n).is_symlink()]
    return sorted(out, key=lambda x: x["path"])


def simulations_table(sims: list[dict[str, Any]]) -> str:
    if not sims:
        return '<p class="muted">none (<code>pulsar-chaos lb-sim SCENARIO --out DIR</code> under this folder)</p>'
    rows = []
    for x in sims:
        link = (f'<a href="/files/{_e(x["path"])}/index.html">page</a> ' if x["page"] else "")
        seed = "; ".join(f"{k}: {v}" for k, v in x["seed"].items() if k in ("modular", "extensible"))
        rows.append(f"<tr><td>{_e(x['path'])}</td><td>{_e(x['scenario'])}</td><td>{_e(x['size'])}</td>"
                    f"<td>{'<br>'.join(_e(r) for r in x['runs'])}</td><td>{_e(seed)}</td>"
                    f"<td>{link}<a href=\"/files/{_e(x['path'])}/lb-sim.json\">json</a></td></tr>")
    return ("<table id='simulations'><thead><tr><th>folder</th><th>scenario</th><th>size</th><th>ours</th>"
            "<th>the seed's</th><th>files</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def find_shrinks(root: Path) -> list[dict[str, Any]]:
    """Every shrink folder (`pulsar-chaos shrink`) under root: what it shrank, to what, its page."""
    from harness.shrink import SHRINK_HTML, SHRINK_JSON, Candidate, signature_text
    out = []
    for sj in sorted(root.glob(f"shrinks/*/*/{SHRINK_JSON}")):
        state = _read_json(sj) or {}
        d = sj.parent
        try:
            start, best = Candidate.from_json(state["start"]), Candidate.from_json(state["best"])
        except (KeyError, TypeError, ValueError):
            continue
        v = state.get("verification") or {}
        out.append({"path": d.relative_to(root).as_posix(), "date": _date(d.name),
                    "original": str(state.get("original", "")),
                    "failure": signature_text(frozenset(tuple(p) for p in state.get("signature") or [])),
                    "from": f"{len(start.faults)} faults, {start.time_limit:g}s",
                    "to": f"{len(best.faults)} faults ({', '.join(f.name for f in best.faults) or 'none'}), "
                          f"{best.time_limit:g}s",
                    "reproduced": f"{v['reproduced']}/{v['tries']}" if v else "",
                    "candidates": len(state.get("steps") or []),
                    "page": (d / SHRINK_HTML).is_file()})
    return out


# ------------------------------------------------------------------------------------ pages

CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:20px;color:#1a1a1a}h1{margin:0 0 4px}
.muted{color:#777}table{border-collapse:collapse;margin:8px 0 24px;font-size:13px}
th,td{border-bottom:1px solid #e4e4e4;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f6;cursor:pointer;user-select:none;position:sticky;top:0}th.sorted-asc:after{content:" \\25B2"}
th.sorted-desc:after{content:" \\25BC"}.v-valid{color:#1b7f3b;font-weight:600}.v-invalid{color:#c0262d;font-weight:700}
.v-unknown,.v-no-results{color:#a66900;font-weight:600}.met-NO{color:#c0262d;font-weight:700}
input#filter{font-size:14px;padding:6px 8px;width:28em}td.anom{max-width:40em}a{color:#2456a6}"""

JS = """
function sortTable(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th);
 const asc=!th.classList.contains('sorted-asc');t.querySelectorAll('th').forEach(h=>h.classList.remove('sorted-asc','sorted-desc'));
 th.classList.add(asc?'sorted-asc':'sorted-desc');const b=t.tBodies[0];
 const rows=[...b.rows].sort((x,y)=>{const a=x.cells[i].dataset.key??x.cells[i].textContent,c=y.cells[i].dataset.key??y.cells[i].textContent;
  const na=a.trim()===''?NaN:Number(a),nc=c.trim()===''?NaN:Number(c);const r=(!isNaN(na)&&!isNaN(nc))?na-nc:a.localeCompare(c);return asc?r:-r});
 rows.forEach(r=>b.appendChild(r))}
document.querySelectorAll('th').forEach(th=>th.addEventListener('click',()=>sortTable(th)));
const f=document.getElementById('filter');
function applyFilter(){const words=f.value.toLowerCase().split(/\\s+/).filter(Boolean);let n=0;
 document.querySelectorAll('#runs tbody tr').forEach(r=>{const t=r.textContent.toLowerCase();
  const show=words.every(w=>t.includes(w));r.style.display=show?'':'none';if(show)n++});
 document.getElementById('shown').textContent=n}
if(f){f.addEventListener('input',applyFilter);applyFilter()}
"""


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def trend_svg(rows: list[RunRow]) -> str:
    """Stacked bars per night (the run folder's date): valid, invalid, unknown."""
    by: dict[str, dict[str, int]] = {}
    for r in rows:
        if r.date:
            day = by.setdefault(r.date[:10], {"valid": 0, "invalid": 0, "unknown": 0})
            day["valid" if r.verdict == "valid" else "invalid" if r.verdict == "invalid" else "unknown"] += 1
    if not by:
        return '<p class="muted">no dated runs</p>'
    days = sorted(by)[-60:]
    top = max(sum(by[d].values()) for d in days) or 1
    w, h, left, bottom = max(240, 22 * len(days) + 60), 180, 40, 50
    bw = (w - left - 10) / len(days)
    colours = {"valid": "#59a14f", "invalid": "#e15759", "unknown": "#f1a33c"}
    parts = [f'<svg id="trend" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" '
             f'aria-label="verdicts per night">']
    ph = h - bottom - 10
    for i, d in enumerate(days):
        y = 10 + ph
        for k in ("valid", "invalid", "unknown"):
            n = by[d][k]
            if n:
                bh = ph * n / top
                y -= bh
                parts.append(f'<rect x="{left + i * bw + 2:.1f}" y="{y:.1f}" width="{max(1.0, bw - 4):.1f}" '
                             f'height="{bh:.1f}" fill="{colours[k]}"><title>{d}: {n} {k}</title></rect>')
        x = left + (i + .5) * bw
        parts.append(f'<text x="{x:.1f}" y="{h - bottom + 12}" font-size="10" text-anchor="end" '
                     f'transform="rotate(-40 {x:.1f} {h - bottom + 12})">{d[5:]}</text>')
    parts.append(f'<text x="{left - 6}" y="18" font-size="10" text-anchor="end">{top}</text>'
                 f'<text x="{left - 6}" y="{10 + ph}" font-size="10" text-anchor="end">0</text></svg>')
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {k}' for k, c in colours.items())
    return "".join(parts) + f"<div class='muted'>{legend}</div>"


def index_page(root: Path) -> str:
    rows = [run_row(root, d) for d in find_runs(root)]
    rows.sort(key=lambda r: r.date, reverse=True)
    camps = find_campaigns(root)
    th = "".join(f"<th>{c}</th>" for c in ("date", "test", "workload", "nemesis", "knobs", "options", "verdict",
                                            "expected", "met", "anomalies", "campaign", "files"))
    body = []
    for r in rows:
        rep = (f'<a class="report" href="/files/{_e(r.path)}/report.html">report</a> '
               if r.has_report else "")
        body.append(
            f'<tr data-run="{_e(r.path)}"><td>{_e(r.date)}</td><td>{_e(r.test)}</td><td>{_e(r.workload)}</td>'
            f"<td>{_e(r.nemesis)}</td><td>{_e(r.knobs)}</td><td>{_e(r.options)}</td>"
            f'<td class="v-{_e(r.verdict.replace(" ", "-"))}">{_e(r.verdict)}</td><td>{_e(r.expected)}</td>'
            f'<td class="met-{_e(r.met)}">{_e(r.met)}</td><td class="anom">{_e(r.anomalies)}</td>'
            f"<td>{_e(r.campaign)}</td><td>{rep}<a href=\"/files/{_e(r.path)}/\">files</a></td></tr>")
    ctab = '<p class="muted">none</p>'
    if camps:
        crow = []
        for c in camps:
            links = [f'<a href="/campaign/{_e(c["path"])}">summary</a>']
            if c["junit"]:
                links.append(f'<a href="/files/{_e(c["path"])}/junit.xml">junit.xml</a>')
            if c["spark"]:
                links.append(f'<a href="/files/{_e(c["spark"])}">Spark campaign.html</a>')
            links.append(f'<a href="/files/{_e(c["path"])}/">files</a>')
            crow.append(f"<tr><td>{_e(c['date'])}</td><td>{_e(c['name'])}</td><td>{c['runs']}</td><td>{c['met']}</td>"
                        f"<td class=\"met-{'NO' if c['not_met'] else ''}\">{c['not_met']}</td><td>{c['other']}</td>"
                        f"<td>{' '.join(links)}</td></tr>")
        ctab = ("<table id='campaigns'><thead><tr><th>date</th><th>campaign</th><th>runs</th><th>met</th>"
                "<th>not met</th><th>unknown / not run</th><th>links</th></tr></thead><tbody>"
                + "".join(crow) + "</tbody></table>")
    shrinks = find_shrinks(root)
    stab = ""
    if shrinks:
        srow = []
        for x in shrinks:
            links = ([f'<a href="/files/{_e(x["path"])}/shrink.html">shrink.html</a>'] if x["page"] else []) + \
                [f'<a href="/files/{_e(x["path"])}/minimal.toml">minimal.toml</a>',
                 f'<a href="/files/{_e(x["path"])}/">files</a>']
            srow.append(f"<tr><td>{_e(x['date'])}</td><td>{_e(x['original'])}</td><td>{_e(x['failure'])}</td>"
                        f"<td>{_e(x['from'])}</td><td>{_e(x['to'])}</td><td>{_e(x['reproduced'])}</td>"
                        f"<td>{x['candidates']}</td><td>{' '.join(links)}</td></tr>")
        stab = ("<h2>Shrinks</h2><table id='shrinks'><thead><tr><th>date</th><th>run</th><th>failure</th>"
                "<th>from</th><th>to</th><th>reproduced</th><th>candidates</th><th>links</th></tr></thead><tbody>"
                + "".join(srow) + "</tbody></table>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>pulsar-chaos results</title>'
            f"<style>{CSS}</style></head><body><h1>pulsar-chaos results</h1>"
            f'<p class="muted">{_e(root.resolve())} &middot; {len(rows)} runs, {len(camps)} campaigns</p>'
            f"<h2>Verdicts by night</h2>{trend_svg(rows)}<h2>Campaigns</h2>{ctab}{stab}"
            f"<h2>Simulations</h2>{simulations_table(find_simulations(root))}"
            f'<h2>Runs</h2><p><input id="filter" type="search" placeholder="filter: words that every row shown '
            f'must contain (e.g. invalid queue)" autofocus> <span class="muted"><span id="shown">{len(rows)}'
            f"</span> of {len(rows)} shown; click a heading to sort</span></p>"
            f"<table id='runs'><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            f"<script>{JS}</script></body></html>")


def campaign_page(root: Path, rel: str) -> str | None:
    d = (root / rel).resolve()
    if not str(d).startswith(str(root.resolve())) or not (d / "campaign.json").is_file():
        return None
    summary = (d / "summary.txt").read_text() if (d / "summary.txt").is_file() else "(no summary yet)"
    pages = sorted(d.glob("analysis/*/campaign.html"))
    links = [f'<a href="/files/{_e(rel)}/junit.xml">junit.xml</a>', f'<a href="/files/{_e(rel)}/">files</a>']
    if pages:
        links.insert(0, f'<a href="/files/{_e(pages[-1].relative_to(root.resolve()).as_posix())}">Spark campaign.html</a>')
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>campaign {_e(rel)}</title>'
            f"<style>{CSS}</style></head><body><p><a href='/'>&larr; all runs</a></p><h1>campaign {_e(rel)}</h1>"
            f"<p>{' &middot; '.join(links)}</p><pre>{_e(summary)}</pre></body></html>")


def listing(root: Path, rel: str, d: Path) -> str:
    items = sorted(d.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    lis = "".join(f'<li><a href="/files/{_e((Path(rel) / p.name).as_posix())}{"/" if p.is_dir() else ""}">'
                  f'{_e(p.name)}{"/" if p.is_dir() else ""}</a></li>' for p in items)
    up = (Path(rel).parent.as_posix() + "/") if rel not in ("", ".") else ""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(rel)}</title>'
            f"<style>{CSS}</style></head><body><p><a href='/'>&larr; all runs</a>"
            + (f" &middot; <a href='/files/{_e(up)}'>up</a>" if up and up != "./" else "")
            + f"</p><h1>{_e(rel)}/</h1><ul>{lis}</ul></body></html>")


def make_app(results_dir: str | Path):
    from flask import Flask, abort, redirect, send_from_directory
    root = Path(results_dir).resolve()
    app = Flask("pulsar-chaos-serve")

    @app.get("/")
    def index() -> str:
        return index_page(root)

    @app.get("/campaign/<path:rel>")
    def campaign(rel: str):
        page = campaign_page(root, rel)
        if page is None:
            abort(404)
        return page

    @app.get("/files/")
    @app.get("/files/<path:rel>")
    def files(rel: str = ""):
        p = (root / rel).resolve()
        if p != root and root not in p.parents:
            abort(404)
        if p.is_dir():
            if rel and not rel.endswith("/"):
                return redirect(f"/files/{rel}/")
            return listing(root, rel.rstrip("/"), p)
        return send_from_directory(root, rel)          # werkzeug's safe join: nothing outside root

    @app.after_request
    def no_store(resp):
        resp.headers["Cache-Control"] = "no-store"
        resp.headers["X-Content-Type-Options"] = "nosniff"
        return resp

    return app                                          # GET only: Flask answers 405 to any other method


def serve(results_dir: str, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve until Ctrl-C. OSError if the port cannot be bound (the CLI makes it a one-line error)."""
    import socket
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))                            # refuse a taken port before werkzeug's own message
    app = make_app(results_dir)
    print(f"serving {Path(results_dir).resolve()} on http://{host}:{port}/ (Ctrl-C to stop)", flush=True)
    app.run(host=host, port=port, debug=False, use_reloader=False, threaded=True)
