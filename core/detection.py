"""How fast and how reliably the checkers catch what a run breaks: a run's time to first detection, its
scenario identity, and the detection matrix (per cause and scenario: detected / runs, the anomaly types,
the mean time to first detection, and the false alarms of the same scenario without the cause).

Pure functions over a run's history, its results.json and its test.toml, shared by the runner (results.json's
`detection`), the run's report, `pulsar-chaos detection` (the matrix as markdown, without Spark) and the
Spark analysis (its `detection_matrix` table), so the last two give the same figures.

Time to first detection, for a run judged invalid: seconds from the first fault's start (the invocation of
the history's first nemesis op that was not a failed start; the history's start, t = 0, when the run had no
fault) to the earliest operation named in the evidence of the checkers that judged the run invalid (an
evidence dict naming an op: an `index` and a `time_s` or `time_ns`; only the anomaly types that invalidate
the run, when the checker lists them in `stats.invalid_types`). Evidence is capped per type (the checker's
`max_anomalies`): when the cap cut a deciding type short, an earlier op may lie among the cases left out, so
the figure is an upper bound (`evidence_capped`). Negative seconds: the named op precedes the first fault.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import fields as dc_fields
from typing import Any

from core.faults import FaultTimeline

MAX_EVIDENCE_NODES = 200_000            # dicts and lists walked per checker at most (evidence is capped)
TARGET_RATE = 0.8                        # a detection row meets its target at >= 80 % (4 of 5 seeds)
NONE = "none"                            # the cause of the runs expected valid (the analysis's `detection`)
# test.toml fields that do not make a scenario: names, the seed, where it was written, the knobs, the
# expectation, what it replays
NOT_SCENARIO = frozenset({"test_name", "seed", "results_dir", "bugs", "expected", "expected_reason", "replay_of"})


# ------------------------------------------------------------------------------- first detection

def first_fault(ops: Iterable[Any]) -> tuple[float | None, str | None]:
    """(seconds, name) of the first fault of a history (its nemesis ops, in time order): the invocation of
    the first fault period that did not fail to start; (None, None) when the nemesis did nothing."""
    tl = FaultTimeline.of_history(ops)
    periods = [p for p in tl.periods if not p.failed]
    if not periods:
        return None, None
    p = min(periods, key=lambda p: p.start_ns)
    return round(p.start_ns / 1e9, 6), p.name


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def op_times(evidence: Any, limit: int = MAX_EVIDENCE_NODES) -> Iterator[tuple[float, int]]:
    """(seconds, index) of every op the evidence names: each dict with an `index` and a `time_s` (an
    `OpRefs.ref`) or a `time_ns` (a full op); at most `limit` dicts and lists are walked."""
    stack = [evidence]
    seen = 0
    while stack and seen < limit:
        x = stack.pop()
        if isinstance(x, dict):
            seen += 1
            idx = x.get("index")
            if _number(idx):
                if _number(x.get("time_s")):
                    yield float(x["time_s"]), int(idx)
                elif _number(x.get("time_ns")):
                    yield x["time_ns"] / 1e9, int(idx)
            stack.extend(v for v in x.values() if isinstance(v, (dict, list)))
        elif isinstance(x, list):
            seen += 1
            stack.extend(v for v in x if isinstance(v, (dict, list)))


def _deciding_types(c: Mapping[str, Any]) -> list[str]:
    """The anomaly types of an invalid checker's entry that decide it: those with evidence, narrowed to
    `stats.invalid_types` when the checker lists them (a log checker's duplicates alone do not invalidate)."""
    an = c.get("anomalies") if isinstance(c.get("anomalies"), dict) else {}
    types = [t for t, ev in an.items() if ev]
    inv = (c.get("stats") or {}).get("invalid_types") if isinstance(c.get("stats"), dict) else None
    if isinstance(inv, list):
        narrowed = [t for t in types if t in inv]
        return narrowed or types
    return types


def first_detection(checkers: Mapping[str, Any], first_fault_s: float | None,
                    fault: str | None = None) -> dict[str, Any] | None:
    """Time to first detection from results.json's `checkers` (name -> {"valid", "anomalies", "stats"})
    and the first fault (`first_fault`); None when no checker judged the run invalid.

    {checker, type: the deciding checker and anomaly type whose evidence names the earliest op;
     fault, first_fault_s: the first fault and its start (0.0 and fault None: no fault, from the start);
     first_op_s, first_op_index: that op; seconds: first_op_s - first_fault_s (None: no op named);
     evidence_capped: the cap cut a deciding type short (an earlier op may be among the cases left out);
     note: what the figure means when it is not plain}."""
    failing = {n: c for n, c in checkers.items() if isinstance(c, Mapping) and c.get("valid") is False}
    if not failing:
        return None
    best: tuple[float, int, str, str] | None = None
    capped = False
    first_type: tuple[str, str] | None = None
    for name in sorted(failing):
        c = failing[name]
        types = _deciding_types(c)
        if first_type is None and types:
            first_type = (name, types[0])
        trunc = (c.get("stats") or {}).get("anomalies_truncated") if isinstance(c.get("stats"), dict) else None
        if isinstance(trunc, dict) and any(t in trunc for t in types):
            capped = True
        for t in types:
            for ts, idx in op_times(c["anomalies"][t]):
                if best is None or (ts, idx) < best[:2]:
                    best = (ts, idx, name, t)
    notes = []
    base = first_fault_s
    if base is None:
        base = 0.0
        notes.append("no fault in the history: from its start (t = 0)")
    out: dict[str, Any] = {"checker": None, "type": None, "fault": fault if first_fault_s is not None else None,
                           "first_fault_s": round(base, 6), "first_op_s": None, "first_op_index": None,
                           "seconds": None, "evidence_capped": capped}
    if best is None:
        checker, type_ = first_type or (sorted(failing)[0], None)
        out.update(checker=checker, type=type_)
        notes.append(f"the evidence of {', '.join(sorted(failing))} names no operation")
    else:
        ts, idx, checker, type_ = best
        out.update(checker=checker, type=type_, first_op_s=round(ts, 6), first_op_index=idx,
                   seconds=round(ts - base, 3))
        if ts < base:
            notes.append("the first op named precedes the first fault")
        if capped:
            notes.append("evidence capped: an upper bound")
    out["note"] = "; ".join(notes)
    return out


def detection_of(history: Iterable[Any], checkers: Mapping[str, Any], valid: Any) -> dict[str, Any] | None:
    """results.json's `detection` of a run: `first_detection` when the verdict is invalid (False), else
    None. `checkers` as results.json holds them (CheckResult objects are converted)."""
    if valid is not False:
        return None
    as_json = {n: (c.to_json() if hasattr(c, "to_json") else c) for n, c in checkers.items()}
    t, name = first_fault(history)
    return first_detection(as_json, t, name)


def text(d: Mapping[str, Any] | None) -> str:
    """One line for the report: `time to first detection: 12.3 s (log: lost at t = 17.4 s, op 812; first
    fault kill at t = 5.1 s)`."""
    if not d:
        return ""
    fault = (f"first fault {d.get('fault')} at t = {d.get('first_fault_s')} s" if d.get("fault")
             else "no fault: from the run's start")
    if d.get("seconds") is None:
        head = "time to first detection: n/a"
        where = f"{d.get('checker')}: {d.get('type') or 'invalid'}"
    else:
        head = f"time to first detection: {d['seconds']} s"
        where = f"{d.get('checker')}: {d.get('type')} at t = {d.get('first_op_s')} s, op {d.get('first_op_index')}"
    note = f"; {d['note']}" if d.get("note") else ""
    return f"{head} ({where}; {fault}{note})"


# ------------------------------------------------------------------------------- scenario

def _spec_defaults() -> dict[str, Any]:
    from core.spec import TestSpec
    s = TestSpec()
    return {f.name: getattr(s, f.name) for f in dc_fields(TestSpec)}


def _canon(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_canon(x) for x in v]
    return v


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def scenario(spec: Mapping[str, Any], drop_options: Iterable[str] = ()) -> tuple[str, str]:
    """(label, key) of a run's scenario: its test.toml minus its bug knobs, seed, names and expectation,
    and minus `drop_options` (the workload options that make one of its unsafe settings), with every field
    it does not give at the spec's default. The key is a hash of that (equal for the seeds of one campaign
    entry and for the same entry without its knob); the label is short: `workload / faults`, then the
    E/Qw/Qa and options when not the defaults (`queue / kill,partition / delay_max_ms=3000`)."""
    defaults = _spec_defaults()
    raw = {str(k).replace("-", "_"): v for k, v in spec.items()}
    d = {k: raw.get(k, dv) for k, dv in defaults.items() if k not in NOT_SCENARIO}
    nem = d.get("nemesis")
    if isinstance(nem, str):
        nem = [x.strip() for x in nem.split(",") if x.strip()]
    d["nemesis"] = sorted(str(x) for x in (nem or []))
    drop = set(drop_options)
    d["options"] = {k: v for k, v in (d.get("options") or {}).items() if k not in drop}
    d = _canon(d)
    key = hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]
    faults = d["nemesis"]
    sched = d.get("nemesis_schedule") or []
    if sched and not faults:
        faults = sorted({str(s.get("name", "?")) for s in sched if isinstance(s, dict)})
        faults = [f"scheduled {','.join(faults)}"]
    parts = [str(d.get("workload")), ",".join(faults) or "no faults"]
    q = (d.get("ensemble"), d.get("write_quorum"), d.get("ack_quorum"))
    if q != (_canon(defaults["ensemble"]), _canon(defaults["write_quorum"]), _canon(defaults["ack_quorum"])):
        parts.append(f"{q[0]}/{q[1]}/{q[2]}")
    opts = d["options"]
    if opts:
        parts.append(",".join(f"{k}={_text(v)}" for k, v in sorted(opts.items())))
    return " / ".join(parts), key


def unsafe_option_keys(options: Mapping[str, Any] | None, unsafe: Iterable[Any],
                       option_defaults: Mapping[str, Any]) -> set[str]:
    """The option names of each of a workload's unsafe settings (`core.expectation.Unsafe`) that applies
    (its `when`; the `given` options it needs stay): what `scenario` drops so that the run with the setting
    and the run without it share one scenario."""
    out: set[str] = set()
    for u in unsafe:
        if u.applies(options or {}, option_defaults):
            out.update(u.when)
    return out


# ------------------------------------------------------------------------------- the matrix

def run_facts(spec: Mapping[str, Any], results: Mapping[str, Any] | None, causes: list[str], expected: str,
              drop_options: Iterable[str] = ()) -> dict[str, Any]:
    """What the matrix reads of one run: its causes (["none"] when expected valid), expectation, scenario,
    verdict ("true", "false", "unknown", "missing"), the types that decided it (`checker:type`) and its
    time to first detection (results.json's `detection`)."""
    label, key = scenario(spec, drop_options)
    if results is None:
        verdict = "missing"
    else:
        v = results.get("valid")
        verdict = "true" if v is True else "false" if v is False else str(v)
    types: set[str] = set()
    for name, c in ((results or {}).get("checkers") or {}).items():
        if isinstance(c, Mapping) and c.get("valid") is False:
            types.update(f"{name}:{t}" for t in _deciding_types(c))
    det = (results or {}).get("detection")
    secs = det.get("seconds") if isinstance(det, Mapping) and verdict == "false" else None
    return {"causes": list(causes), "expected": expected, "scenario": label, "scenario_key": key,
            "valid": verdict, "types": sorted(types), "detection_s": secs if _number(secs) else None}


MATRIX_COLUMNS = ("cause", "scenario", "scenario_key", "kind", "runs", "with_verdict", "invalid", "rate",
                  "meets_target", "anomaly_types", "detection_runs", "mean_detection_s",
                  "false_alarm_runs", "false_alarms")


def matrix(facts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (cause, scenario): the runs with that cause in that scenario, how many were judged
    invalid (for a cause: detected; for "none": false alarms), the rate, whether it meets its target (a
    cause: >= 80 %; "none": 0), the deciding types, the mean time to first detection over the invalid runs
    that have one, and (a cause's row) the false alarms of the same scenario's runs expected valid.
    Sorted: causes by name then scenario, the "none" rows last."""
    acc: dict[tuple[str, str], dict[str, Any]] = {}
    for f in facts:
        for cause in f["causes"]:
            a = acc.setdefault((cause, f["scenario_key"]), {
                "cause": cause, "scenario": f["scenario"], "scenario_key": f["scenario_key"], "runs": 0,
                "with_verdict": 0, "invalid": 0, "types": set(), "secs": []})
            a["runs"] += 1
            a["with_verdict"] += f["valid"] in ("true", "false")
            if f["valid"] == "false":
                a["invalid"] += 1
                a["types"].update(f["types"])
                if f["detection_s"] is not None:
                    a["secs"].append(float(f["detection_s"]))
    rows = []
    for (cause, key), a in acc.items():
        none = acc.get((NONE, key)) if cause != NONE else None
        rate = round(a["invalid"] / a["runs"], 4) if a["runs"] else None
        meets = (a["invalid"] == 0) if cause == NONE else (a["invalid"] >= math.ceil(TARGET_RATE * a["runs"] - 1e-9))
        secs = sorted(a["secs"])
        rows.append({"cause": cause, "scenario": a["scenario"], "scenario_key": key,
                     "kind": "false alarm (expected valid)" if cause == NONE else "detection (expected invalid)",
                     "runs": a["runs"], "with_verdict": a["with_verdict"], "invalid": a["invalid"], "rate": rate,
                     "meets_target": bool(meets), "anomaly_types": ",".join(sorted(a["types"])),
                     "detection_runs": len(secs),
                     "mean_detection_s": round(math.fsum(secs) / len(secs), 2) if secs else None,
                     "false_alarm_runs": none["runs"] if none else None,
                     "false_alarms": none["invalid"] if none else None})
    rows.sort(key=lambda r: (r["cause"] == NONE, r["cause"], r["scenario"], r["scenario_key"]))
    return rows


def markdown(rows: list[Mapping[str, Any]]) -> str:
    """The matrix as a markdown table: a row per cause and scenario (one short of its target kept and
    marked with what its missed runs ended as: judged valid, or without a verdict), then the scenarios run only without any cause (their false alarms)."""
    head = ["knob or unsafe setting", "scenario", "detected", "anomaly types", "mean time to first detection (s)",
            "false alarms without it"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    causes = [r for r in rows if r["cause"] != NONE]
    with_cause = {r["scenario_key"] for r in causes}
    short = 0
    for r in causes:
        det = f"{r['invalid']}/{r['runs']}"
        missed = [f"{r['with_verdict'] - r['invalid']} judged valid"] if r["with_verdict"] > r["invalid"] else []
        if r["with_verdict"] < r["runs"]:
            missed.append(f"{r['runs'] - r['with_verdict']} without a verdict")
        if not r["meets_target"]:
            det += f" (short of {math.ceil(TARGET_RATE * r['runs'] - 1e-9)}/{r['runs']}: {', '.join(missed)})"
            short += 1
        elif r["with_verdict"] < r["runs"]:
            det += f", {r['runs'] - r['with_verdict']} without a verdict"
        mean = "n/a" if r["mean_detection_s"] is None else f"{r['mean_detection_s']:.2f}"
        if r["detection_runs"] and r["detection_runs"] < r["invalid"]:
            mean += f" (over {r['detection_runs']})"
        fa = "no run" if r["false_alarm_runs"] is None else f"{r['false_alarms']}/{r['false_alarm_runs']}"
        out.append("| " + " | ".join([f"`{r['cause']}`", f"{r['scenario']} ({r['scenario_key'][:6]})", det,
                                       (r["anomaly_types"] or "—").replace(",", ", "), mean, fa]) + " |")
    for r in rows:
        if r["cause"] == NONE and r["scenario_key"] not in with_cause:
            out.append("| " + " | ".join(["(none)", f"{r['scenario']} ({r['scenario_key'][:6]})", "—",
                                           (r["anomaly_types"] or "—").replace(",", ", "), "—",
                                           f"{r['invalid']}/{r['runs']}"]) + " |")
    fa_runs = sum(r["runs"] for r in rows if r["cause"] == NONE)
    fa = sum(r["invalid"] for r in rows if r["cause"] == NONE)
    out.append("")
    out.append(f"{len(causes)} detection rows, {short} short of {int(TARGET_RATE * 100)} %; false alarms "
               f"{fa}/{fa_runs} runs expected valid.")
    return "\n".join(out) + "\n"
