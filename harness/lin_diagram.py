"""A Porcupine-style diagram of a linearizability counterexample, as a self-contained HTML fragment.

One row per process; each operation is a bar from its invocation to its completion (an
indeterminate one runs to the right edge, dashed). The longest linearizable prefix found is drawn
as numbered linearization points joined in order (each point lies inside its op's bar, in
linearization order); hovering or focusing a bar shows the op and the model state after it. The op
that cannot be placed next is drawn in red with the state it met; other candidates that were
illegal there in orange; ops that overlap the stretch but were not linearized in grey.

Input: one counterexample dict of `checkers.linear` (the `nonlinearizable` anomaly). Output: inline
SVG, CSS and a few lines of JS; no network, no external files. `page()` wraps fragments in a whole
HTML document (what `pulsar-chaos lin --out FILE.html` writes).
"""
from __future__ import annotations

import html
import itertools
import json
from typing import Any

_ids = itertools.count(1)

ROW_H = 28
BAR_H = 16
LEFT = 92
WIDTH = 1000
TOP = 34

CSS = """
.lin-diagram{margin:12px 0 20px;font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
.lin-diagram svg{width:100%;height:auto;max-width:1100px;display:block;border:1px solid #d0d4d9;background:#fff}
.lin-diagram .bar{stroke-width:1.5}
.lin-diagram .bar:focus{outline:none;stroke:#c77700;stroke-width:3}
.lin-diagram .lin{fill:#1f5aa6;stroke:#1f5aa6}
.lin-diagram .bad{fill:#f6c9c6;stroke:#a8201a;stroke-width:3}
.lin-diagram .cand{fill:#fbe3c4;stroke:#b35400}
.lin-diagram .other{fill:#e6e8eb;stroke:#7a7f85}
.lin-diagram .crash{stroke-dasharray:6 4}
.lin-diagram .status{min-height:1.5em;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:13px;
white-space:pre-wrap;background:#f5f7f9;border:1px solid #d0d4d9;border-radius:4px;padding:4px 8px;margin-top:4px}
.lin-diagram table{border-collapse:collapse;font-size:13px;margin:6px 0}
.lin-diagram td,.lin-diagram th{border:1px solid #c8cdd2;padding:2px 6px;text-align:left;vertical-align:top}
.lin-diagram .legend span{display:inline-block;margin-right:14px}
.lin-diagram .sw{display:inline-block;width:14px;height:10px;border:1.5px solid;margin-right:4px;vertical-align:-1px}
"""

JS = """
(function(){var f=document.getElementById('%s');if(!f)return;var st=f.querySelector('.status');
function show(e){var t=e.target.closest('[data-info]');if(t)st.textContent=t.getAttribute('data-info');}
f.addEventListener('mouseover',show);f.addEventListener('focusin',show);})();
"""


def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _short(v: Any, n: int = 24) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str, separators=(",", ":"))
    return s if len(s) <= n else s[:n - 1] + "…"


def _op_label(op: dict[str, Any]) -> str:
    v = op.get("value")
    return f"{op.get('f')}" + ("" if v is None else f" {_short(v)}")


def _op_line(op: dict[str, Any]) -> str:
    t = op.get("type")
    kind = "indeterminate" if t in ("info", "invoke") else t
    key = op.get("key")
    return (f"p{op.get('process')} {op.get('f')} {_short(op.get('value'), 60)}"
            + (f" key={_short(key)}" if key not in (None, "") else "") + f" ({kind})")


def fragment(ce: dict[str, Any], title: str | None = None) -> str:
    """The diagram of one counterexample as an HTML fragment (a <figure>)."""
    uid = f"lin-diagram-{next(_ids)}"
    ops: dict[Any, dict[str, Any]] = {}
    role: dict[Any, str] = {}
    order: dict[Any, tuple[int, Any]] = {}

    def ident(op: dict[str, Any]) -> Any:
        return (op.get("invoke_index"), op.get("process"))

    for n, p in enumerate(ce.get("prefix") or []):
        op = p.get("op") or {}
        k = ident(op)
        ops[k] = op
        role[k] = "lin"
        order[k] = (n + 1 + int(ce.get("prefix_omitted") or 0), p.get("state"))
    for c in ce.get("concurrent") or []:
        k = ident(c)
        ops.setdefault(k, c)
        role.setdefault(k, "other")
    for op in ce.get("cannot_place") or []:
        k = ident(op)
        ops[k] = op
        role[k] = "cand"
    bad = ce.get("op")
    if bad:
        k = ident(bad)
        ops[k] = bad
        role[k] = "bad"
    if not ops:
        return f'<figure class="lin-diagram" id="{uid}"><figcaption>No ops to draw.</figcaption></figure>'

    def t_call(op: dict[str, Any]) -> float:
        return float(op.get("invoke_time_ns") or 0)

    def t_ret(op: dict[str, Any]) -> float | None:
        t = op.get("time_ns")
        return None if t is None or op.get("type") in ("info", "invoke") else float(t)

    # the stretch of time the ok ops cover; indeterminate ops called earlier are clipped at the left
    fixed = [o for o in ops.values() if t_ret(o) is not None] or list(ops.values())
    t0 = min(t_call(o) for o in fixed)
    t1 = max([t_ret(o) or t_call(o) for o in ops.values()] + [t0 + 1])
    span = t1 - t0
    t1 += span * 0.08                                  # room on the right for open-ended ops
    span = t1 - t0
    procs = sorted({o.get("process") for o in ops.values()}, key=lambda p: (not isinstance(p, int), str(p)
                                                                            if not isinstance(p, int) else p))
    row = {p: i for i, p in enumerate(procs)}
    h = TOP + ROW_H * len(procs) + 30
    plot_w = WIDTH - LEFT - 16
    ns = ce.get("time_order", "time_ns") == "time_ns"

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * plot_w

    svg = [f'<svg viewBox="0 0 {WIDTH} {h}" role="img" aria-label="{esc(title or "linearizability counterexample")}"'
           f' xmlns="http://www.w3.org/2000/svg">']
    # axis
    for i in range(6):
        t = t0 + span * i / 5
        xx = x(t)
        lab = f"{(t - t0) / 1e6:.1f} ms" if ns else f"{t - t0:.0f}"
        svg.append(f'<line x1="{xx:.1f}" y1="{TOP - 6}" x2="{xx:.1f}" y2="{h - 24}" stroke="#eceef0"/>'
                   f'<text x="{xx:.1f}" y="{h - 8}" font-size="11" text-anchor="middle" fill="#4a4f55">'
                   f'{esc(lab)}</text>')
    svg.append(f'<text x="{LEFT}" y="16" font-size="12" fill="#4a4f55">time since the first op shown'
               f'{"" if ns else " (history position)"}</text>')
    for p in procs:
        y = TOP + row[p] * ROW_H
        svg.append(f'<text x="8" y="{y + BAR_H - 3}" font-size="12" fill="#1a1a1a">process {esc(p)}</text>')
    # bars
    for k, op in sorted(ops.items(), key=lambda kv: t_call(kv[1])):
        y = TOP + row[op.get("process")] * ROW_H
        xa = x(max(t0, t_call(op)))
        tr = t_ret(op)
        xb = x(tr) if tr is not None else WIDTH - 16
        w = max(4.0, xb - xa)
        r = role[k]
        label = "" if r == "bad" else _op_label(op)          # the bad op is labelled beside it
        if w < 6.5 * len(label) + 6:
            label = label if len(label) <= 3 else ""
        cls = f"bar {r}" + (" crash" if tr is None else "")
        info = _op_line(op)
        if k in order:
            info = f"#{order[k][0]} in the linearization: {info}\nstate after: {_short(order[k][1], 200)}"
        elif r == "bad":
            info = (f"cannot be linearized next: {info}\nstate before it: {_short(ce.get('state'), 200)}")
        elif r == "cand":
            info = f"illegal in state {_short(ce.get('state'), 120)}: {info}"
        else:
            info = f"not linearized in this prefix: {info}"
        fill_op = ' fill-opacity="0.18"' if r == "lin" else ""
        svg.append(f'<g tabindex="0" data-info="{esc(info)}"><title>{esc(info)}</title>'
                   f'<rect class="{cls}" x="{xa:.1f}" y="{y}" width="{w:.1f}" height="{BAR_H}" rx="3"'
                   f'{fill_op}/>'
                   + (f'<text x="{xa + 3:.1f}" y="{y + BAR_H - 4}" font-size="11" fill="#1a1a1a">'
                      f'{esc(label)}</text>' if label else "")
                   + ("" if t_call(op) >= t0 else f'<text x="{LEFT - 10}" y="{y + BAR_H - 4}" font-size="11" '
                      f'fill="#7a7f85">‹</text>') + "</g>")
    # linearization points, in order, each inside its bar and not before the previous one
    pts = []
    last = t0
    for k, (n, st) in sorted(order.items(), key=lambda kv: kv[1][0]):
        op = ops[k]
        a = t_call(op)
        b = t_ret(op)
        t = max(last, a)
        if b is not None:
            t = min(t, b)
        last = t
        pts.append((x(t), TOP + row[op.get("process")] * ROW_H + BAR_H / 2, n, st, op))
    if len(pts) > 1:
        svg.append('<polyline fill="none" stroke="#1f5aa6" stroke-width="1.2" stroke-opacity="0.7" points="'
                   + " ".join(f"{px:.1f},{py:.1f}" for px, py, *_ in pts) + '"/>')
    last_label: dict[float, float] = {}
    for px, py, n, st, op in pts:
        info = f"#{n}: {_op_line(op)}\nstate after: {_short(st, 200)}"
        room = px - last_label.get(py, -1e9) >= 7 * len(str(n)) + 4
        if room:
            last_label[py] = px
        svg.append(f'<g data-info="{esc(info)}"><title>{esc(info)}</title>'
                   f'<circle class="lin" cx="{px:.1f}" cy="{py:.1f}" r="4.5"/>'
                   + (f'<text x="{px:.1f}" y="{py - 7:.1f}" font-size="10" text-anchor="middle" fill="#1f5aa6">'
                      f'{n}</text>' if room else "") + "</g>")
    if bad:
        k = ident(bad)
        y = TOP + row[bad.get("process")] * ROW_H + BAR_H / 2
        tr = t_ret(bad)
        xb = x(tr) if tr is not None else WIDTH - 16
        text = f"✗ {_op_label(bad)} (state {_short(ce.get('state'), 16)})"
        xa = x(max(t0, t_call(bad)))
        if xb + 8 + 7 * len(text) <= WIDTH:
            where = f'x="{xb + 4:.1f}"'
        else:                                                 # no room on the right: on the left
            where = f'x="{max(LEFT, xa - 4):.1f}" text-anchor="end"'
        svg.append(f'<text {where} y="{y + 5:.1f}" font-size="12" font-weight="700" fill="#a8201a">'
                   f'{esc(text)}</text>')
    svg.append("</svg>")

    n_prefix = int(ce.get("prefix_length") or 0)
    omitted = int(ce.get("prefix_omitted") or 0)
    cap = [f"<strong>{esc(title)}</strong>. " if title else "",
           f"Model <code>{esc(ce.get('model'))}</code>"
           + (f", key <code>{esc(_short(ce.get('key'), 60))}</code>" if ce.get("key") not in (None, "") else "")
           + f": the longest linearizable prefix found has {n_prefix} ops"
           + (f" (the last {n_prefix - omitted} drawn)" if omitted else "")
           + ". "]
    if bad:
        cap.append(f"Then <code>{esc(_op_line(bad))}</code> cannot be placed: the state is "
                   f"<code>{esc(_short(ce.get('state'), 120))}</code>.")
    legend = ('<div class="legend"><span><i class="sw" style="background:#d2deee;border-color:#1f5aa6"></i>'
              'linearized (numbered points in order)</span><span><i class="sw" style="background:#f6c9c6;'
              'border-color:#a8201a"></i>cannot be placed</span><span><i class="sw" style="background:#fbe3c4;'
              'border-color:#b35400"></i>also illegal there</span><span><i class="sw" style="background:'
              '#e6e8eb;border-color:#7a7f85"></i>not linearized</span><span><i class="sw" style="border-style:'
              'dashed;border-color:#7a7f85"></i>indeterminate (info)</span></div>')
    rows = [f"<tr><td>{n}</td><td>{esc(_op_line(ops[k]))}</td><td><code>{esc(_short(st, 120))}</code></td></tr>"
            for k, (n, st) in sorted(order.items(), key=lambda kv: kv[1][0])]
    table = ""
    if rows:
        first = (f"<tr><td></td><td>state before #{omitted + 1}</td><td><code>"
                 f"{esc(_short(ce.get('state_before_prefix'), 120))}</code></td></tr>")
        last = (f"<tr><td>✗</td><td>{esc(_op_line(bad))}</td><td>cannot be placed</td></tr>" if bad else "")
        table = ("<details><summary>The linearization, op by op</summary><table><thead><tr><th>#</th>"
                 "<th>op</th><th>state after</th></tr></thead><tbody>" + first + "".join(rows) + last
                 + "</tbody></table></details>")
    return (f'<figure class="lin-diagram" id="{uid}"><style>{CSS}</style>{"".join(svg)}'
            f'<div class="status" aria-live="polite">Hover or focus an op to see it and the model state.</div>'
            f'<figcaption>{"".join(cap)}</figcaption>{legend}{table}<script>{JS % uid}</script></figure>')


def page(counterexamples: list[dict[str, Any]], title: str = "linearizability counterexample") -> str:
    """A whole offline HTML page with one diagram per counterexample."""
    body = "".join(fragment(ce, title=f"Key {_short(ce.get('key'), 40)}" if ce.get("key") not in (None, "")
                            else None) for ce in counterexamples)
    if not counterexamples:
        body = "<p>No counterexample: the history is linearizable.</p>"
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)}</title></head><body style="margin:0 auto;max-width:1180px;padding:12px 24px;'
            'font:16px/1.5 system-ui,-apple-system,Segoe UI,Roboto,DejaVu Sans,sans-serif">'
            f'<h1 style="font-size:24px">{esc(title)}</h1>{body}</body></html>\n')


__all__ = ["fragment", "page"]
