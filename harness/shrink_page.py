"""shrink.html: a shrink folder's page. The original and the minimal run side by side (their fault
timelines drawn on one time scale, their anomalies), how often the minimal spec reproduced, and every
step of the search (candidate, change, tries, result, kept). Self-contained: no script, no network."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from dataclasses import dataclass

from core import store
from harness.replay import RecordedFault

# the files of a shrink folder (harness/shrink.py writes them; this module only reads them)
SHRINK_JSON = "shrink.json"
MINIMAL_TOML = "minimal.toml"
SHRINK_HTML = "shrink.html"


@dataclass
class Candidate:
    """A candidate as shrink.json records it (harness.shrink.Candidate's fields)."""
    faults: list[RecordedFault]
    time_limit: float
    rate: float
    concurrency: int
    topics: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Candidate":
        return cls([RecordedFault.from_json(f) for f in d["faults"]], d["time_limit"], d["rate"],
                   d["concurrency"], d["topics"])


def signature_text(sig: Any) -> str:
    """`log: lost, queue: duplicated` of (checker, anomaly type) pairs."""
    return ", ".join(f"{c}: {k}" for c, k in sorted(sig)) or "none"

CSS = """body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1a1a1a}main{max-width:1200px;margin:0 auto;
padding:12px 24px 48px}h1{font-size:24px}h2{font-size:19px;margin-top:28px}.muted{color:#666}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:24px}.card{border:1px solid #d5d9de;border-radius:6px;
padding:10px 14px}table{border-collapse:collapse;font-size:13px;width:100%}th,td{border-bottom:1px solid #e4e4e4;
padding:3px 6px;text-align:left;vertical-align:top}th{background:#f4f4f6}.yes{color:#c0262d;font-weight:700}
.no{color:#1b7f3b}.kept{background:#fff6d8}code,pre{font-size:12px;background:#f6f6f8}pre{padding:8px;overflow:auto}
a{color:#0b4f9c}"""

PALETTE = ("#E9A4A0", "#A0B1E9", "#E9DCA0", "#B6DDB0", "#D7B5E8", "#F2C29B", "#A8DCDC", "#C4C4C4")


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _colour(name: str) -> str:
    try:
        from nemesis.registry import colour
        return colour(name)
    except Exception:  # noqa: BLE001 - a colour is cosmetic
        return PALETTE[sum(map(ord, name)) % len(PALETTE)]


def timeline_svg(faults: list[RecordedFault], time_limit: float, scale_s: float, label: str) -> str:
    """One row per fault: a bar from its start for its hold (to the end of the run when held to it)."""
    width, left, row = 520, 150, 22
    h = 30 + row * max(1, len(faults))
    px = (width - left - 10) / max(scale_s, 1.0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img" '
             f'aria-label="{_e(label)}">',
             f'<rect x="{left}" y="4" width="{time_limit * px:.1f}" height="{h - 26}" fill="#f4f6f8"/>']
    for i, f in enumerate(faults):
        y = 6 + i * row
        end = f.at + (f.hold if f.hold is not None else max(0.5, time_limit - f.at))
        parts.append(f'<text x="{left - 6}" y="{y + 14}" font-size="11" text-anchor="end">{_e(f.name)}</text>'
                     f'<rect x="{left + f.at * px:.1f}" y="{y}" width="{max(2.0, (end - f.at) * px):.1f}" '
                     f'height="{row - 6}" fill="{_colour(f.name)}" stroke="#555" stroke-width="0.5">'
                     f'<title>{_e(f.label())}</title></rect>'
                     f'<text x="{left + end * px + 3:.1f}" y="{y + 13}" font-size="10">{_e(",".join(f.nodes))}</text>')
    step = 5 if scale_s <= 40 else 10 if scale_s <= 120 else 30
    t = 0
    while t <= scale_s:
        x = left + t * px
        parts.append(f'<line x1="{x:.1f}" y1="{h - 22}" x2="{x:.1f}" y2="{h - 18}" stroke="#777"/>'
                     f'<text x="{x:.1f}" y="{h - 6}" font-size="10" text-anchor="middle">{t}s</text>')
        t += step
    parts.append(f'<line x1="{left + time_limit * px:.1f}" y1="4" x2="{left + time_limit * px:.1f}" y2="{h - 22}" '
                 f'stroke="#c0262d" stroke-dasharray="3,2"><title>time limit {time_limit:g}s</title></line></svg>')
    return "".join(parts)


def _anomalies(run_dir: str | None) -> str:
    if not run_dir:
        return '<span class="muted">no run</span>'
    res = _read_json(Path(run_dir) / store.RESULTS_JSON)
    if not isinstance(res, dict):
        return f'<span class="muted">{_e(run_dir)}: no results.json</span>'
    if res.get("valid") is True:
        text = "none (valid)"
    else:
        text = store.anomalies_text(res, invalid_only=True) or str(res.get("valid"))
    report = Path(run_dir) / store.REPORT_HTML
    link = f' &middot; <a href="{_e(_rel(report))}">report</a>' if report.is_file() else ""
    return f"{_e(text)}{link}<div class='muted'>{_e(run_dir)}</div>"


_BASE: list[Path] = []


def _rel(p: Path) -> str:
    """A link from the page (in the shrink folder) to p."""
    import os
    try:
        return os.path.relpath(p, _BASE[0]) if _BASE else str(p)
    except ValueError:
        return str(p)


def _side(title: str, cand: Candidate, scale: float, run_dir: str | None, extra: str = "") -> str:
    rows = "".join(f"<tr><td>{_e(f.name)}</td><td>{f.at:.1f}</td><td>{'' if f.hold is None else f'{f.hold:.1f}'}"
                   f"</td><td>{_e(','.join(f.nodes))}{'' if f.pinned else ' (target resolved again)'}</td></tr>"
                   for f in cand.faults)
    return (f'<div class="card"><h3>{_e(title)}</h3>'
            f"<p>{len(cand.faults)} fault(s); time limit {cand.time_limit:g}s; rate {cand.rate:g}; "
            f"concurrency {cand.concurrency}; topics {cand.topics}</p>"
            f"{timeline_svg(cand.faults, cand.time_limit, scale, title + ' faults')}"
            f"<table><thead><tr><th>fault</th><th>at (s)</th><th>hold (s)</th><th>nodes</th></tr></thead>"
            f"<tbody>{rows}</tbody></table><p><b>anomalies:</b> {_anomalies(run_dir)}</p>{extra}</div>")


def page(d: Path, state: dict[str, Any]) -> str:
    start = Candidate.from_json(state["start"])
    best = Candidate.from_json(state["best"])
    scale = max(start.time_limit, best.time_limit)
    steps = state.get("steps") or []
    sig = frozenset(tuple(p) for p in state.get("signature") or [])
    minimal_run = None
    v = state.get("verification")
    for s in reversed(steps):
        if s.get("kept") and s["outcome"].get("runs"):
            minimal_run = s["outcome"]["runs"][-1]
            break
    if v and v.get("runs"):
        repro = [r for r, found in zip(v["runs"], v.get("found") or []) if found and "none" != found]
        minimal_run = repro[0] if repro else v["runs"][0]
    vtext = (f"<p><b>reproduced</b> in {v['reproduced']} of {v['tries']} tries of the minimal spec</p>"
             if v else "<p class='muted'>the minimal spec was not rerun</p>")
    rows = []
    for s in steps:
        o = s["outcome"]
        res = ("skipped: " + o["error"]) if o.get("error") else \
            (f"fails ({o['reproduced']}/{o['tries']})" if o["fails"] else f"no (0/{o['tries']})")
        runs = " ".join(f'<a href="{_e(_rel(Path(r) / store.REPORT_HTML))}">{i + 1}</a>'
                        for i, r in enumerate(o.get("runs") or []))
        rows.append(f"<tr class='{'kept' if s['kept'] else ''}'><td>{s['n']}</td><td>{_e(s['step'])}</td>"
                    f"<td>{_e(s['change'])}</td><td class='{'yes' if o['fails'] else 'no'}'>{_e(res)}</td>"
                    f"<td>{_e('; '.join(o.get('found') or []))}</td>"
                    f"<td>{'known' if s.get('known') else format(o.get('seconds', 0), '.0f')}</td>"
                    f"<td>{'kept' if s['kept'] else ''}</td><td>{runs}</td></tr>")
    minimal = d / MINIMAL_TOML
    spec_text = minimal.read_text() if minimal.is_file() else ""
    stopped = f"<p><b>stopped early:</b> {_e(state['stopped'])}</p>" if state.get("stopped") else ""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>shrink {_e(d.name)}</title>'
            f"<style>{CSS}</style></head><body><main><h1>shrink of {_e(state['original'])}</h1>"
            f"<p>the failure kept: <b>{_e(signature_text(sig))}</b>; {len(steps)} candidates, "
            f"{state.get('tries')} tr{'y' if state.get('tries') == 1 else 'ies'} each at most, "
            f"{state.get('seconds', 0):.0f} s</p>{stopped}"
            f'<div class="pair">{_side("original", start, scale, state["original"])}'
            f'{_side("minimal", best, scale, minimal_run, vtext)}</div>'
            f"<h2>minimal spec</h2><p>rerun: <code>pulsar-chaos run --spec {_e(minimal)}</code></p>"
            f"<pre>{_e(spec_text)}</pre>"
            f"<h2>the search</h2><table><thead><tr><th>#</th><th>step</th><th>change</th><th>still fails?</th>"
            f"<th>what each try found</th><th>s</th><th></th><th>runs</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></main></body></html>")


def render(shrink_dir: Path | str) -> Path:
    d = Path(shrink_dir)
    state = _read_json(d / SHRINK_JSON)
    if not isinstance(state, dict) or "start" not in state:
        raise ValueError(f"{d}: no readable {SHRINK_JSON}")
    _BASE[:] = [d.resolve()]
    out = d / SHRINK_HTML
    store._write_text_atomic(out, page(d, state))
    return out


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
