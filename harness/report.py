"""The run report: one self-contained report.html per run folder (verdict, anomalies, charts, faults, spec, files).

Renders whatever a run left behind, even a crashed or interrupted one; the charts are inline SVG drawn here,
so the page opens from disk with no network (no external scripts, styles, fonts or images).
"""
from __future__ import annotations

import bisect
import html
import itertools
import json
import math
import os
import re
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple
from urllib.parse import quote

from core.faults import FaultTimeline
from core.history import NEMESIS_PROCESS

REPORT_NAME = "report.html"
MAX_ROWS = 200                  # anomaly evidence rows shown per type
MAX_POINTS = 2000               # points per chart series
MAX_LINKED_FILES = 200          # files linked per node folder
OP_TYPES = ("invoke", "ok", "fail", "info")
EXIT_MEANING = {0: "valid", 1: "invalid", 2: "unknown", 255: "the harness crashed"}

# Completion types: colour and a shape (or dash) so the charts do not rely on colour alone.
TYPE_STYLE = {"ok": ("#1f5aa6", "circle", ""), "fail": ("#b0306b", "square", "8 4"),
              "info": ("#b35400", "diamond", "2 4"), "ops": ("#1f5aa6", "circle", "")}


class ReportError(ValueError):
    """The report cannot be written at all (no such run folder, or it cannot be written to)."""


# ----------------------------------------------------------------------------------------------- loading

class HOp(NamedTuple):
    time_ns: int
    index: int
    process: int
    type: str
    f: str
    value: Any                  # kept for nemesis ops only (their targets); None for client ops
    error: str


@dataclass
class History:
    source: str
    ops: list[HOp]
    lines: int = 0
    bad_lines: list[int] = field(default_factory=list)
    torn_tail: bool = False


@dataclass
class Fault:
    name: str
    start: float                # seconds since the run started
    stop: float | None          # None: never healed within the history
    targets: str
    status: str = ""
    point: bool = False         # an instantaneous nemesis op, not a period
    failed: bool = False        # it never took effect: listed in the table, not drawn


@dataclass
class Run:
    dir: Path
    notes: list[str] = field(default_factory=list)
    spec_text: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] | None = None
    history: History | None = None


def _load(run_dir: Path) -> Run:
    run = Run(run_dir)
    p = run_dir / "test.toml"
    if p.is_file():
        try:
            run.spec_text = p.read_text(encoding="utf-8", errors="replace")
            run.spec = tomllib.loads(run.spec_text)
        except OSError as e:
            run.notes.append(f"test.toml cannot be read ({e.strerror}).")
        except tomllib.TOMLDecodeError as e:
            run.notes.append(f"test.toml is not valid TOML ({e}); shown verbatim below.")
    else:
        run.notes.append("test.toml is missing: the test spec is unknown.")

    p = run_dir / "results.json"
    if p.is_file():
        try:
            data = json.loads(p.read_text(encoding="utf-8", errors="replace"))
            if isinstance(data, dict):
                run.results = data
            else:
                run.notes.append("results.json is not a JSON object; the verdict is unknown.")
        except OSError as e:
            run.notes.append(f"results.json cannot be read ({e.strerror}); the verdict is unknown.")
        except ValueError as e:
            run.notes.append(f"results.json is not valid JSON ({e}); the verdict is unknown.")
    else:
        run.notes.append("results.json is missing: the checkers did not run or did not finish, "
                         "so the verdict is unknown.")

    run.history = _load_history(run_dir, run.notes)
    if not (run_dir / "nodes").is_dir():
        run.notes.append("nodes/ is missing: no node logs were collected.")
    return run


def _int(v: Any, default: int | None = None) -> int:
    if isinstance(v, bool):
        raise TypeError("bool")
    if v is None:
        if default is None:
            raise TypeError("missing")
        return default
    return int(v)


def _hop(d: Any) -> HOp:
    if not isinstance(d, dict):
        raise TypeError("not an object")
    t = d.get("type")
    if t not in OP_TYPES:
        raise ValueError(f"bad type {t!r}")
    process = _int(d.get("process"))
    err = d.get("error")
    return HOp(_int(d.get("time_ns")), _int(d.get("index"), -1), process, t, str(d.get("f") or ""),
               d.get("value") if process < 0 else None, "" if err is None else str(err))


def _load_history(run_dir: Path, notes: list[str]) -> History | None:
    p = run_dir / "history.jsonl"
    if p.is_file():
        try:
            text = p.read_bytes().decode("utf-8", errors="replace")
        except OSError as e:
            notes.append(f"history.jsonl cannot be read ({e.strerror}).")
            return None
        lines = text.split("\n")
        last = len(lines)
        while last > 0 and not lines[last - 1].strip():
            last -= 1
        h = History("history.jsonl", [], lines=last)
        ops = h.ops
        loads = json.loads
        for n in range(last):
            line = lines[n]
            if not line.strip():
                continue
            try:
                ops.append(_hop(loads(line)))
            except (ValueError, TypeError, KeyError, OverflowError):
                h.bad_lines.append(n + 1)
        h.torn_tail = bool(h.bad_lines) and h.bad_lines[-1] == last
        if h.bad_lines:
            shown = ", ".join(map(str, h.bad_lines[:20])) + (" ..." if len(h.bad_lines) > 20 else "")
            what = " (the last line is torn: the run stopped mid-write)" if h.torn_tail else ""
            notes.append(f"history.jsonl: skipped {len(h.bad_lines)} corrupt line(s){what}: line {shown}.")
        if not ops:
            notes.append("history.jsonl holds no operations.")
        ops.sort(key=lambda o: (o.time_ns, o.index))
        return h
    pq = run_dir / "history.parquet"
    if pq.is_file():
        try:
            import pyarrow.parquet as papq
            table = papq.read_table(pq)
            cols = {c: table.column(c).to_pylist() for c in
                    ("time_ns", "index", "process", "type", "f", "value", "error") if c in table.column_names}
            n = table.num_rows
            h = History("history.parquet", [], lines=n)
            for i in range(n):
                d = {c: v[i] for c, v in cols.items()}
                if isinstance(d.get("value"), str) and _int(d.get("process"), 0) < 0:
                    try:
                        d["value"] = json.loads(d["value"])
                    except ValueError:
                        pass
                try:
                    h.ops.append(_hop(d))
                except (ValueError, TypeError):
                    h.bad_lines.append(i + 1)
            h.ops.sort(key=lambda o: (o.time_ns, o.index))
            notes.append("history.jsonl is missing; the history was read from history.parquet.")
            if h.bad_lines:
                notes.append(f"history.parquet: skipped {len(h.bad_lines)} malformed row(s).")
            return h
        except Exception as e:  # a torn or foreign parquet file: report it, render the rest
            notes.append(f"history.jsonl is missing and history.parquet cannot be read ({e}).")
            return None
    notes.append("history.jsonl is missing: no charts, op counts or fault periods from the history.")
    return None


# ----------------------------------------------------------------------------------------------- analysis

@dataclass
class Analysis:
    t_end: float = 0.0                                      # seconds: last op in the history
    counts: Counter = field(default_factory=Counter)        # client op type -> count
    by_f: dict[str, Counter] = field(default_factory=dict)
    never_completed: int = 0
    latency: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)  # f -> (t_s, ms, type)
    completions: dict[str, list[float]] = field(default_factory=dict)                 # type -> times (s)
    errors: Counter = field(default_factory=Counter)        # (type, f, error) -> count
    nemesis_ops: list[HOp] = field(default_factory=list)


def _analyse(h: History | None) -> Analysis:
    a = Analysis()
    if h is None or not h.ops:
        return a
    a.t_end = max(0.0, h.ops[-1].time_ns / 1e9)
    open_: dict[int, HOp] = {}
    counts = a.counts
    for op in h.ops:
        if op.process < 0:
            if op.process == NEMESIS_PROCESS:       # observers' rows (-2) are neither faults nor clients
                a.nemesis_ops.append(op)
            continue
        counts[op.type] += 1
        c = a.by_f.get(op.f)
        if c is None:
            c = a.by_f[op.f] = Counter()
        c[op.type] += 1
        if op.type == "invoke":
            if op.process in open_:
                a.never_completed += 1
            open_[op.process] = op
            continue
        a.completions.setdefault(op.type, []).append(op.time_ns / 1e9)
        if op.error and op.type in ("fail", "info"):
            a.errors[(op.type, op.f, op.error[:300])] += 1
        inv = open_.pop(op.process, None)
        if inv is not None:
            ms = max((op.time_ns - inv.time_ns) / 1e6, 1e-3)
            a.latency.setdefault(inv.f, []).append((inv.time_ns / 1e9, ms, op.type))
    a.never_completed += len(open_)
    return a


def _faults_from_history(nemesis_ops: list[HOp], t_end: float) -> list[Fault]:
    """Fault periods as `core.faults.FaultTimeline` reads the nemesis ops; one-shot ops (kill) as points.

    A start that failed never took effect (listed, not drawn); a stop that failed leaves the fault on."""
    tl = FaultTimeline()
    for op in nemesis_ops:
        tl.feed(op.time_ns, op.type, op.f, value=op.value, error=op.error)
    out: list[Fault] = []
    for p in tl.periods:
        notes = list(p.notes)
        if p.stop_ns is None and not p.failed:
            if p.stop_invoked_ns is not None:
                notes.append(f"stop invoked at {p.stop_invoked_ns / 1e9:.3f} s, never completed")
            notes.append("not healed by the end of the history")
        out.append(Fault(p.name, p.start_ns / 1e9, None if p.stop_ns is None else p.stop_ns / 1e9,
                         _targets(p.value), "; ".join(notes), point=p.point, failed=p.failed))
    return out


def _faults_from_stats(periods: Any) -> list[Fault] | None:
    if not isinstance(periods, list) or not periods:
        return None
    out = []
    try:
        for p in periods:
            if isinstance(p, dict):
                start, stop = p.get("start", p.get("start_s")), p.get("stop", p.get("stop_s"))
                name, value = p.get("name", p.get("f", "fault")), p.get("value", p.get("targets"))
            else:
                start, stop, name = p[0], p[1], p[2]
                value = p[3] if len(p) > 3 else None
            fl = Fault(str(name), float(start), None if stop is None else float(stop), _targets(value))
            if fl.stop is None:
                fl.status = "not healed by the end of the run"
            out.append(fl)
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    return out


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _targets(v: Any) -> str:
    """What a fault hit, short: "halves: bookie-1, broker-1 | bookie-2, zk-1", "bookie-2", "t0 owner broker-1"."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v):
        return ", ".join(str(x) for x in v)
    if isinstance(v, list) and v and all(isinstance(x, list) for x in v):
        return " | ".join(_targets(x) for x in v)
    if not isinstance(v, dict):
        return _compact(v, limit=400)
    d = dict(v)
    if len(d) > 1:                      # the grudge is derived from the plan; the plan says it shorter
        d.pop("grudge", None)
    d.pop("healed", None)
    parts = []
    if "sides" in d:
        parts.append(_targets(d.pop("sides")))
    if "ring" in d:
        ring = d.pop("ring")
        parts.append(" -> ".join(map(str, ring)) if isinstance(ring, list) else _compact(ring))
    for k in ("node", "nodes", "targets", "target", "topic", "grudge"):
        if k in d:
            parts.append(_targets(d.pop(k)))
    shape = d.pop("shape", None)
    parts += [f"{k} {_compact(x, key=str(k), limit=80)}" for k, x in d.items()]
    text = " ".join(p for p in parts if p)
    if shape is not None:
        text = f"{shape}: {text}" if text else str(shape)
    return _cut(text, 400)


def _percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[i]


# ----------------------------------------------------------------------------------------------- formatting

def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _is_mid(v: Any) -> bool:
    return isinstance(v, dict) and "ledger_id" in v and "entry_id" in v


def _mid(v: dict) -> str:
    return (f"({v.get('ledger_id')},{v.get('entry_id')},{v.get('partition', -1)},"
            f"{v.get('batch_index', -1)})")


def _is_op(v: Any) -> bool:
    return isinstance(v, dict) and (("f" in v and "type" in v) or ("index" in v and "process" in v))


def _op_text(d: dict, limit: int) -> str:
    parts = []
    if d.get("index") is not None:
        parts.append(f"#{d['index']}")
    if d.get("process") is not None:
        parts.append(f"p{d['process']}")
    for k in ("type", "f", "key"):
        if d.get(k) not in (None, ""):
            parts.append(str(d[k]))
    if d.get("value") is not None:
        parts.append("v=" + _compact(d["value"], limit=80))
    if d.get("message_id") is not None:
        parts.append(_compact(d["message_id"], key="message_id"))
    if isinstance(d.get("time_ns"), (int, float)) and not isinstance(d.get("time_ns"), bool):
        parts.append(f"@{d['time_ns'] / 1e9:.3f}s")
    elif isinstance(d.get("time_s"), (int, float)) and not isinstance(d.get("time_s"), bool):
        parts.append(f"@{d['time_s']:.3f}s")
    if d.get("node"):
        parts.append(f"node={d['node']}")
    if d.get("error"):
        parts.append(f"error={_compact(d['error'], limit=120)}")
    for k, v in d.items():
        if k not in ("index", "process", "type", "f", "key", "value", "message_id", "time_ns", "time_s",
                     "node", "error", "seq"):
            parts.append(f"{k}={_compact(v, limit=80)}")
    return _cut(" ".join(parts), limit)


def _cut(s: str, limit: int) -> str:
    return s if len(s) <= limit else s[:limit - 1] + "…"


def _num(v: float) -> str:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v == int(v) and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.6g}"
    return str(v)


def _compact(v: Any, key: str = "", limit: int = 1000, depth: int = 0) -> str:
    """One readable line (or a few) for any JSON value; message ids as (l,e,p,b), ops as one line."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _num(v)
    if isinstance(v, str):
        return _cut(v, limit)
    if _is_mid(v):
        return _mid(v)
    if (isinstance(v, (list, tuple)) and len(v) == 4 and "message_id" in key
            and all(isinstance(x, int) for x in v)):
        return "(" + ",".join(map(str, v)) + ")"
    if depth > 4:
        return _cut(json.dumps(v, default=str), limit)
    if _is_op(v):
        return _op_text(v, limit)
    if isinstance(v, dict):
        s = "{" + ", ".join(f"{k}: {_compact(x, str(k), limit, depth + 1)}" for k, x in
                            list(v.items())[:30]) + (", …" if len(v) > 30 else "") + "}"
        return _cut(s, limit)
    if isinstance(v, (list, tuple)):
        items = list(v[:20])
        more = f" … ({len(v) - 20} more)" if len(v) > 20 else ""
        if items and all(_is_op(x) for x in items):      # several ops: one a line
            return _cut("\n".join(_op_text(x, 300) for x in items) + more, limit * 4)
        return _cut("[" + ", ".join(_compact(x, key, limit, depth + 1) for x in items) + more + "]", limit)
    return _cut(str(v), limit)


def _anchor(s: str, used: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", s).strip("-") or "x"
    a, n = base, 2
    while a in used:
        a, n = f"{base}-{n}", n + 1
    used.add(a)
    return a


def _verdict(v: Any) -> str:
    if v is True or (isinstance(v, str) and v.lower() in ("true", "valid")):
        return "valid"
    if v is False or (isinstance(v, str) and v.lower() in ("false", "invalid")):
        return "INVALID"
    return "unknown"


def _fmt_s(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _fmt_ms(ms: float) -> str:
    if ms != ms:
        return "—"
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.3g} ms"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _fault_colour(name: str, cache: dict[str, str]) -> str:
    """A fault's band colour, as its registry entry declares it (`nemesis.registry.colour`)."""
    if name not in cache:
        from nemesis.registry import colour
        cache[name] = colour(name)
    return cache[name]


# ----------------------------------------------------------------------------------------------- charts

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


# ----------------------------------------------------------------------------------------------- sections

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
    seen = sorted({fl.name for fl in faults})
    if seen:
        nem_txt += f" (faults in this run: {', '.join(seen)})"
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


# The balance checker's move markers: colour and a label for each kind of bundle move.
MOVE_STYLE = {"unload": ("#6a3d9a", "unload (shedding or admin)"), "split-unload": ("#b35400", "unload of a split's child"),
              "split": ("#2e7d32", "split")}
BROKER_PALETTE = ("#1f5aa6", "#b0306b", "#b35400", "#2e7d32", "#6a3d9a", "#00695c", "#7a2e2a", "#4a4f55")
BROKER_DASHES = ("", "8 4", "2 4", "12 4 2 4", "4 4", "1 3", "", "8 4")


def _balance_stats(run: Run) -> dict[str, Any] | None:
    """The stats of the `balance` checker (checkers/balance.py), when results.json has them."""
    for name, c in _checkers(run.results or {}):
        st = c.get("stats")
        if name == "balance" and isinstance(st, dict) and isinstance(st.get("load"), dict):
            return st
    return None


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


if __name__ == "__main__":
    sys.exit(main())
