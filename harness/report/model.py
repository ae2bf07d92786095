"""The report's run model: what a run folder holds (spec, results, history, node folders), loaded
whatever state the run was left in, and the history's analysis (ops by function, completions, faults)."""
from __future__ import annotations

import json
import math
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from core.faults import FaultTimeline
from core.history import NEMESIS_PROCESS
from harness.report.fmt import _compact, _cut

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
