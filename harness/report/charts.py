"""The report's charts: inline SVG (a time axis shared by all charts, linear or log y, fault bands in
lanes) and the charts drawn with it: latency, throughput, checker stats and brokers' load."""
from __future__ import annotations

import itertools
import math
from typing import Any

from harness.report.fmt import _cut, _fault_colour, _fmt_ms, _fmt_s, _num, esc
from harness.report.model import MAX_POINTS, TYPE_STYLE, Fault


W, PLOT_W = 1100, 1000
ML, MR = 84, 16
LANE_H = 20
MAX_LANES = 6


def _nice_step(span: float, target: int = 8) -> float:
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _downsample(points: list[tuple[float, float]], x_max: float, buckets: int = MAX_POINTS // 2
                ) -> list[tuple[float, float]]:
    """At most 2 x buckets points: the lowest and the highest of each x bucket, so outliers survive."""
    if len(points) <= 2 * buckets:
        return points
    lo: dict[int, tuple[float, float]] = {}
    hi: dict[int, tuple[float, float]] = {}
    scale = buckets / x_max if x_max > 0 else 0
    for p in points:
        b = min(buckets - 1, int(p[0] * scale))
        cur = lo.get(b)
        if cur is None:
            lo[b] = hi[b] = p
        elif p[1] < cur[1]:
            lo[b] = p
        elif p[1] > hi[b][1]:
            hi[b] = p
    out = list(lo.values()) + [p for b, p in hi.items() if p is not lo[b]]
    out.sort()
    return out


_chart_ids = itertools.count(1)


class _Chart:
    """One SVG chart: time on x (shared by all charts of a report), linear or log y, fault bands."""

    def __init__(self, x_max: float, y_lo: float, y_hi: float, log: bool, faults: list[Fault],
                 colours: dict[str, str], plot_h: int = 300):
        self.x_max, self.log, self.plot_h = x_max if x_max > 0 else 1.0, log, plot_h
        self.faults, self.colours = faults, colours
        self.uid = next(_chart_ids)
        if log:
            y_lo, y_hi = max(y_lo, 1e-3), max(y_hi, 1e-3)
            self.y_lo = 10 ** math.floor(math.log10(y_lo))
            self.y_hi = 10 ** math.ceil(math.log10(y_hi))
            if self.y_hi <= self.y_lo:
                self.y_hi = self.y_lo * 10
        else:
            step = _nice_step(y_hi - y_lo if y_hi > y_lo else max(1.0, y_hi), 5)
            self.y_lo = 0.0 if y_lo >= 0 else math.floor(y_lo / step) * step
            self.y_hi = max(step, math.ceil(y_hi / step) * step)
        self.lanes = self._assign_lanes()
        self.mt = 12 + LANE_H * max(1, len(set(self.lanes.values()))) + 8 if faults else 16
        self.h = self.mt + plot_h + 84

    def x(self, t: float) -> float:
        return ML + PLOT_W * min(max(t / self.x_max, 0.0), 1.0)

    def y(self, v: float) -> float:
        if self.log:
            v = max(v, self.y_lo)
            frac = (math.log10(v) - math.log10(self.y_lo)) / (math.log10(self.y_hi) - math.log10(self.y_lo))
        else:
            frac = (v - self.y_lo) / (self.y_hi - self.y_lo)
        return self.mt + self.plot_h * (1 - min(max(frac, 0.0), 1.0))

    def _label(self, fl: Fault) -> str:
        return _cut(f"{fl.name} {fl.targets}".strip(), 44)

    def _assign_lanes(self) -> dict[int, int]:
        lanes_end: list[float] = []
        out: dict[int, int] = {}
        for i, fl in sorted(enumerate(self.faults), key=lambda p: p[1].start):
            x0 = self.x(fl.start)
            x1 = self.x(self.x_max if fl.stop is None else fl.stop)
            end = max(x1, x0 + 8 + 7.6 * len(self._label(fl)))
            for lane, e in enumerate(lanes_end):
                if e + 4 <= x0:
                    lanes_end[lane] = end
                    out[i] = lane
                    break
            else:
                if len(lanes_end) < MAX_LANES:
                    lanes_end.append(end)
                    out[i] = len(lanes_end) - 1
                else:                       # too crowded: the band stays, the table names it
                    out[i] = -1
        return out

    def render(self, title: str, y_label: str, body: list[str], legend: list[tuple[str, str, str, str]],
               desc: str) -> str:
        o: list[str] = []
        o.append(f'<svg viewBox="0 0 {W} {self.h}" width="{W}" height="{self.h}" role="img" '
                 f'aria-labelledby="t-{self.uid} d-{self.uid}" font-family="system-ui, sans-serif" '
                 f'font-size="14">')
        o.append(f'<title id="t-{self.uid}">{esc(title)}</title><desc id="d-{self.uid}">{esc(desc)}</desc>')
        o.append(f'<rect x="0" y="0" width="{W}" height="{self.h}" fill="#ffffff"/>')
        top, bottom = self.mt, self.mt + self.plot_h
        # fault bands (under everything) and their labels in lanes above the plot
        for i, fl in enumerate(self.faults):
            col = _fault_colour(fl.name, self.colours)
            x0 = self.x(fl.start)
            x1 = self.x(self.x_max if fl.stop is None else fl.stop)
            lab = self._label(fl)
            tip = f"{fl.name} {fl.targets} {_fmt_s(fl.start)}–{_fmt_s(fl.stop)} s".strip()
            if fl.point:
                o.append(f'<line x1="{x0:.1f}" y1="{top}" x2="{x0:.1f}" y2="{bottom}" stroke="#7a2e2a" '
                         f'stroke-width="2" stroke-dasharray="4 3"><title>{esc(tip)}</title></line>')
            else:
                o.append(f'<rect x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 1.5):.1f}" height="{self.plot_h}" '
                         f'fill="{col}" fill-opacity="0.55"><title>{esc(tip)}</title></rect>')
            lane = self.lanes.get(i, -1)
            if lane >= 0:
                ly = 10 + lane * LANE_H
                o.append(f'<rect x="{x0:.1f}" y="{ly}" width="{max(x1 - x0, 3):.1f}" height="{LANE_H - 3}" '
                         f'fill="{col}" stroke="#5b5b5b" stroke-width="0.5"/>')
                o.append(f'<text x="{x0 + 4:.1f}" y="{ly + LANE_H - 8}" fill="#1a1a1a">{esc(lab)}</text>')
        # axes and grid
        o.append(f'<rect x="{ML}" y="{top}" width="{PLOT_W}" height="{self.plot_h}" fill="none" '
                 f'stroke="#5b5b5b"/>')
        if self.log:
            e0, e1 = round(math.log10(self.y_lo)), round(math.log10(self.y_hi))
            ticks = [10.0 ** e for e in range(e0, e1 + 1)]
        else:
            step = _nice_step(self.y_hi - self.y_lo, 5)
            ticks = [self.y_lo + i * step for i in range(int(round((self.y_hi - self.y_lo) / step)) + 1)]
        for v in ticks:
            y = self.y(v)
            o.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + PLOT_W}" y2="{y:.1f}" stroke="#d0d4d9"/>')
            lab = _fmt_ms(v) if self.log else _num(float(v))
            o.append(f'<text x="{ML - 8}" y="{y + 5:.1f}" text-anchor="end" fill="#1a1a1a">{esc(lab)}</text>')
        step = _nice_step(self.x_max, 10)
        k = 0
        while k * step <= self.x_max + 1e-9:
            x = self.x(k * step)
            o.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 6}" stroke="#5b5b5b"/>')
            o.append(f'<text x="{x:.1f}" y="{bottom + 22}" text-anchor="middle" fill="#1a1a1a">'
                     f'{_num(float(round(k * step, 6)))}</text>')
            k += 1
        o.append(f'<text x="{ML + PLOT_W / 2}" y="{bottom + 44}" text-anchor="middle" fill="#1a1a1a">'
                 f'time since the run started (s)</text>')
        o.append(f'<text transform="translate(18 {top + self.plot_h / 2}) rotate(-90)" text-anchor="middle" '
                 f'fill="#1a1a1a">{esc(y_label)}</text>')
        o.append(f'<clipPath id="c-{self.uid}"><rect x="{ML}" y="{top - 6}" width="{PLOT_W}" '
                 f'height="{self.plot_h + 12}"/></clipPath><g clip-path="url(#c-{self.uid})">')
        o.extend(body)
        o.append("</g>")
        # legend, bottom row
        lx, ly = ML, bottom + 70
        for label, colour, shape, dash in legend:
            o.append(_marker(lx + 8, ly - 5, colour, shape, dash))
            o.append(f'<text x="{lx + 24}" y="{ly}" fill="#1a1a1a">{esc(label)}</text>')
            lx += 36 + 8 * len(label)
        o.append("</svg>")
        return "".join(o)


def _marker(x: float, y: float, colour: str, shape: str, dash: str | None) -> str:
    if dash is not None and shape == "line":
        return (f'<line x1="{x - 10}" y1="{y}" x2="{x + 10}" y2="{y}" stroke="{colour}" stroke-width="3" '
                f'stroke-dasharray="{dash}"/>')
    if shape == "square":
        return f'<rect x="{x - 4.5}" y="{y - 4.5}" width="9" height="9" fill="{colour}"/>'
    if shape == "diamond":
        return f'<path d="M{x} {y - 6}l6 6-6 6-6-6z" fill="{colour}"/>'
    if shape == "band":
        return f'<rect x="{x - 9}" y="{y - 7}" width="18" height="14" fill="{colour}" stroke="#5b5b5b"/>'
    return f'<circle cx="{x}" cy="{y}" r="4.5" fill="{colour}"/>'


def _scatter_path(chart: _Chart, pts: list[tuple[float, float]], colour: str, shape: str) -> str:
    if shape == "diamond":
        d = "".join(f"M{chart.x(t):.1f} {chart.y(v) - 4:.1f}l4 4-4 4-4-4z" for t, v in pts)
        return f'<path d="{d}" fill="{colour}" fill-opacity="0.85"/>'
    d = "".join(f"M{chart.x(t):.1f} {chart.y(v):.1f}h0" for t, v in pts)
    cap = "square" if shape == "square" else "round"
    return (f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{5 if cap == "square" else 5.5}" '
            f'stroke-linecap="{cap}" stroke-opacity="0.75"/>')


def _line_path(chart: _Chart, pts: list[tuple[float, float]], colour: str, dash: str) -> str:
    d = "M" + "L".join(f"{chart.x(t):.1f} {chart.y(v):.1f}" for t, v in pts)
    da = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="2.2"{da} stroke-linejoin="round"/>'


def _fault_legend(faults: list[Fault], colours: dict[str, str]) -> list[tuple[str, str, str, str]]:
    seen: dict[str, str] = {}
    for fl in faults:
        if not fl.point:
            seen.setdefault(fl.name, _fault_colour(fl.name, colours))
    leg = [(f"fault: {n}", c, "band", "") for n, c in seen.items()]
    if any(fl.point for fl in faults):
        leg.append(("one-shot nemesis op", "#7a2e2a", "line", "4 3"))
    return leg


def _latency_chart(f: str, pts: list[tuple[float, float, str]], x_max: float, faults: list[Fault],
                   colours: dict[str, str]) -> str:
    by_type: dict[str, list[tuple[float, float]]] = {}
    for t, ms, ty in pts:
        by_type.setdefault(ty, []).append((t, ms))
    lo = min(p[1] for p in pts)
    hi = max(p[1] for p in pts)
    chart = _Chart(x_max, lo, hi, True, faults, colours)
    body, legend, shown = [], [], 0
    for ty in ("ok", "fail", "info"):
        series = by_type.get(ty)
        if not series:
            continue
        colour, shape, _ = TYPE_STYLE[ty]
        ds = _downsample(series, chart.x_max)
        shown += len(ds)
        body.append(_scatter_path(chart, ds, colour, shape))
        legend.append((f"{ty} ({len(series)})", colour, shape, None))
    legend += _fault_legend(faults, colours)
    desc = (f"Latency of {len(pts)} {f} operations (invoke to completion), log scale, by completion type, "
            f"with fault periods shaded.")
    svg = chart.render(f"Latency of {f} over time", "latency (log scale)", body, legend, desc)
    note = ""
    if shown < len(pts):
        note = (f" Showing {shown} of {len(pts)} points: the lowest and highest latency of each of "
                f"{MAX_POINTS // 2} time slices.")
    return (f'<figure class="chart"><figcaption>Latency of <code>{esc(f)}</code> ops: each point is one op, '
            f"at its invocation time, coloured by how it ended.{esc(note)}</figcaption>{svg}</figure>")


def _throughput_chart(completions: dict[str, list[float]], x_max: float, faults: list[Fault],
                      colours: dict[str, str]) -> str:
    x_max = x_max if x_max > 0 else 1.0
    n_bins = max(1, math.ceil(x_max))
    bin_s = 1.0
    if n_bins > MAX_POINTS:
        bin_s = math.ceil(x_max / MAX_POINTS)
        n_bins = math.ceil(x_max / bin_s)
    series: dict[str, list[tuple[float, float]]] = {}
    hi = 0.0
    for ty in ("ok", "fail", "info"):
        ts = completions.get(ty)
        if not ts:
            continue
        bins = [0] * n_bins
        for t in ts:
            bins[min(n_bins - 1, max(0, int(t / bin_s)))] += 1
        pts = []
        for i, c in enumerate(bins):      # a step line: flat across each bin
            r = c / bin_s
            pts.append((i * bin_s, r))
            pts.append((min((i + 1) * bin_s, x_max), r))
        hi = max(hi, max(bins) / bin_s)
        series[ty] = pts
    chart = _Chart(x_max, 0.0, hi, False, faults, colours)
    body, legend = [], []
    for ty, pts in series.items():
        colour, _, dash = TYPE_STYLE[ty]
        body.append(_line_path(chart, pts, colour, dash))
        legend.append((f"{ty} ({len(completions[ty])})", colour, "line", dash))
    legend += _fault_legend(faults, colours)
    per = "second" if bin_s == 1 else f"{_num(float(bin_s))} s (averaged)"
    svg = chart.render("Client ops completed per second", "ops per second", body, legend,
                       f"Client operations completed per {per}, by completion type, with fault periods shaded.")
    return (f'<figure class="chart"><figcaption>Client ops completed per {esc(per)}: ok, fail and info '
            f"(indeterminate).</figcaption>{svg}</figure>")


def _stats_series(v: Any) -> tuple[dict[str, list[tuple[float, float]]], bool]:
    """Best-effort series out of a checker stat (when there is no history): name -> points, and whether
    the x values were given (else the index is the second)."""
    out: dict[str, list[tuple[float, float]]] = {}
    if isinstance(v, dict) and isinstance(v.get("bucket_s"), (int, float)):
        # the log checker's shape: {bucket_s, start_s, <name>: [one value a bucket, null if none], ...}
        b, s0 = float(v["bucket_s"]), float(v.get("start_s") or 0.0)
        for k, xs in v.items():
            if k in ("window_s", "points", "gaps") or not isinstance(xs, list) or len(xs) < 2:
                continue
            if all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in xs):
                pts = [(s0 + i * b, float(x)) for i, x in enumerate(xs) if x is not None]
                if pts:
                    out[str(k)] = pts
        return out, True
    if isinstance(v, dict):
        for k, s in v.items():
            sub, _ = _stats_series(s)
            for name, pts in sub.items():
                out[k if name == "value" else f"{k} {name}"] = pts
        return out, True
    if not isinstance(v, list):
        return out, False
    for i, item in enumerate(v):
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            out.setdefault("value", []).append((float(i), float(item)))
        elif isinstance(item, (list, tuple)) and len(item) >= 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in item[:2]):
            out.setdefault("value", []).append((float(item[0]), float(item[1])))
        elif isinstance(item, dict):
            t = next((item[k] for k in ("t", "time", "time_s", "second", "s", "start") if k in item), i)
            if not isinstance(t, (int, float)):
                continue
            for k, x in item.items():
                if k in ("t", "time", "time_s", "second", "s", "start"):
                    continue
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    out.setdefault(str(k), []).append((float(t), float(x)))
    return out, True


# Friendlier legend names for the log checker's stat series.
STAT_NAMES = {"per_bucket": "ok sends per second", "p50_ms": "p50", "p95_ms": "p95", "p99_ms": "p99",
              "max_ms": "max", "value": "value"}


def _stats_points(v: Any) -> list[tuple[float, float, str]]:
    """[[time s, latency ms, type], ...] from a checker's stats, the malformed ones skipped."""
    out = []
    for p in v if isinstance(v, list) else []:
        try:
            t, ms = float(p[0]), float(p[1])
            ty = str(p[2]) if len(p) > 2 else "ok"
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        if math.isfinite(t) and math.isfinite(ms):
            out.append((t, max(ms, 1e-3), ty))
    return out


def _stats_chart(title: str, y_label: str, series: dict[str, list[tuple[float, float]]], log: bool,
                 faults: list[Fault], colours: dict[str, str], x_max: float) -> str:
    series = {k: _downsample(sorted(v), x_max) for k, v in series.items() if v}
    if not series:
        return ""
    ys = [p[1] for v in series.values() for p in v]
    chart = _Chart(x_max, min(ys), max(ys), log, faults, colours)
    palette = ("#1f5aa6", "#b0306b", "#b35400", "#2e7d32", "#6a3d9a", "#00695c")
    dashes = ("", "8 4", "2 4", "12 4 2 4", "4 4", "1 3")
    body, legend = [], []
    for i, (k, pts) in enumerate(series.items()):
        c, d = palette[i % len(palette)], dashes[i % len(dashes)]
        body.append(_line_path(chart, pts, c, d))
        legend.append((k, c, "line", d))
    legend += _fault_legend(faults, colours)
    svg = chart.render(title, y_label, body, legend, f"{title} (from the checker's stats).")
    return f'<figure class="chart"><figcaption>{esc(title)} (from the checker\'s stats)</figcaption>{svg}</figure>'


# The balance checker's move markers: colour and a label for each kind of bundle move.
MOVE_STYLE = {"unload": ("#6a3d9a", "unload (shedding or admin)"), "split-unload": ("#b35400", "unload of a split's child"),
              "split": ("#2e7d32", "split")}
BROKER_PALETTE = ("#1f5aa6", "#b0306b", "#b35400", "#2e7d32", "#6a3d9a", "#00695c", "#7a2e2a", "#4a4f55")
BROKER_DASHES = ("", "8 4", "2 4", "12 4 2 4", "4 4", "1 3", "", "8 4")


def _move_ticks(chart: _Chart, moves: list[Any]) -> list[str]:
    """Unloads and splits as short vertical ticks at the top of the plot, one colour per kind."""
    o = []
    top = chart.mt
    for m in moves:
        if not isinstance(m, dict) or not isinstance(m.get("t_s"), (int, float)):
            continue
        colour, _ = MOVE_STYLE.get(str(m.get("kind")), ("#4a4f55", ""))
        x = chart.x(float(m["t_s"]))
        y0 = top if m.get("kind") == "split" else top + 20       # splits above, unloads below them
        tip = (f"{m.get('kind')} {m.get('bundle')} at {float(m['t_s']):.3f} s ({m.get('reason')}"
               + (f", {m.get('source')} -> {m.get('destination')}" if m.get("source") else "") + ")")
        o.append(f'<line class="move-tick" x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 18}" stroke="{colour}" '
                 f'stroke-width="2.5"><title>{esc(tip)}</title></line>')
    return o


def _runs(pts: list[tuple[float, float]], max_gap: float) -> list[list[tuple[float, float]]]:
    """A broker's points cut where its reports stop for longer than max_gap (it was down): no line
    is drawn across the time it sent nothing."""
    out: list[list[tuple[float, float]]] = []
    for p in pts:
        if out and p[0] - out[-1][-1][0] <= max_gap:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def _load_chart(title: str, y_label: str, key: str, load: dict[str, Any], moves: list[Any], x_max: float,
                faults: list[Fault], colours: dict[str, str], max_gap: float = 3.0) -> str:
    series: dict[str, list[tuple[float, float]]] = {}
    for broker, s in sorted(load.items()):
        if not isinstance(s, dict):
            continue
        ts, vs = s.get("t") or [], s.get(key) or []
        pts = [(float(t), float(v)) for t, v in zip(ts, vs) if isinstance(t, (int, float)) and
               isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        if pts:
            series[str(broker)] = _downsample(sorted(pts), x_max)
    if not series:
        return ""
    ys = [p[1] for v in series.values() for p in v]
    chart = _Chart(x_max, 0.0, max(ys) or 1.0, False, faults, colours)
    body, legend = [], []
    for i, (b, pts) in enumerate(series.items()):
        c, d = BROKER_PALETTE[i % len(BROKER_PALETTE)], BROKER_DASHES[i % len(BROKER_DASHES)]
        for run_pts in _runs(pts, max_gap):
            body.append(_line_path(chart, run_pts, c, d) if len(run_pts) > 1 else _scatter_path(chart, run_pts, c,
                                                                                              "circle"))
        legend.append((b, c, "line", d))
    body += _move_ticks(chart, moves)
    kinds = {str(m.get("kind")) for m in moves if isinstance(m, dict)}
    legend += [(label, colour, "line", "") for k, (colour, label) in MOVE_STYLE.items() if k in kinds]
    legend += _fault_legend(faults, colours)
    desc = (f"{title}: one line per broker from its load reports, unloads and splits as ticks at the top, "
            f"fault periods shaded.")
    svg = chart.render(title, y_label, body, legend, desc)
    return (f'<figure class="chart" data-series="{esc(key)}"><figcaption>{esc(title)}: one line per broker (its '
            f'load reports); ticks at the top mark unloads and splits (hover for the bundle).</figcaption>{svg}'
            f'</figure>')
