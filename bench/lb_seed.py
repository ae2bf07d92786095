"""The seed's four load-balancer scenarios (reference/load-balancer.md section 5), scaled to one machine,
on real netns clusters, with the modular and the extensible load manager side by side, the same seeds:

    (a) storm    every broker restarted within a short window (each stops gracefully and joins again
                 after a few seconds, the next one a few seconds later): time until every producer
                 publishes again (from the first broker's stop)
    (b) rolling  brokers restarted one by one (`rolling-restart:broker+stop`) under steady publishing:
                 over the sends invoked from the restart's start to 10 s after its last broker is
                 ready: p99 and p99.99 publish latency, the longest per-topic gap between
                 acknowledged sends, the failed sends
    (c) scale    6 -> 3 and 3 -> 6 brokers (`scale:3`): time to a balanced cluster after each
                 (bench/lb_scale.py's "15 s band" measure, settled), the shedder's unloads in each
                 phase and the leaving brokers' own transfers
    (d) split    one bundle (the namespace's only one) split up to the namespace's limit under load:
                 the bundles at the last send and the time of the last split, the time to a balanced
                 cluster (the same band, settled until the last send), max - min topics per broker at
                 the last send, the shedder's unloads

    .venv/bin/python -m bench.lb_seed [--seeds 1,2,3] [--scenarios storm,rolling,scale,split]
                                      [--load-managers modular,extensible] [--results DIR]
    .venv/bin/python -m bench.lb_seed --measure DIR/raw.jsonl      # the table again from the runs

Runs go seed by seed (every cell of seed 1 first, so a partial table exists early), one cluster at a
time. Each run's raw figures are appended to DIR/raw.jsonl as one JSON line as soon as it ends; at the
end the markdown table and the JSON of the raw figures are printed. Every run keeps its test.toml (the
settings below under Pulsar's names, the same for both load managers). The load average of the machine
is recorded before and after each run: the machine is shared, and latency percentiles move with it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from bench.lb_detection import pulsar_chaos_run
from bench.lb_scale import MEASURES, SETTINGS as SCALE_SETTINGS, measure as scale_measure
from checkers.toolkit import percentile
from core import faults as fg
from core import store
from core.history import INVOKE, NEMESIS_PROCESS, OK, Op

LOAD_MANAGERS = ("modular", "extensible")
# Every scenario's settings: bench/lb_scale.py's (the modular load manager's ThresholdShedder made to act at
# a test's few KB/s, each explained there) plus the extensible load manager's own timers, shortened the
# same way; the same dict for both load managers (each reads the names it knows).
SETTINGS: dict[str, Any] = {
    **SCALE_SETTINGS,
    # Pulsar: 4. 48 topics on 16 bundles: 3 topics a bundle, 4 bundles a broker at four brokers
    "defaultNumberOfNamespaceBundles": 16,
    # Pulsar: 15. A broker republishes its load data when it moved by 10 % or when its last report is this
    # old; TransferShedder waits (CoolDown) for data newer than its last unload from a broker, and at a
    # steady load that may take the whole interval (bench/README.md, lb-sim)
    "loadBalancerReportUpdateMaxIntervalMinutes": 0.25,
    # Pulsar: 180. TransferShedder's CoolDown after a broker lost bundles; 3 minutes is a whole scenario
    "loadBalanceSheddingDelayInSeconds": 15,
    # Pulsar: 0.25. TransferShedder's target standard deviation of the brokers' weightedMaxEMA; at 0.25
    # nothing a test's load can make is ever off target. 0.05, the ThresholdShedder threshold above (5 %)
    "loadBalancerBrokerLoadTargetStd": 0.05,
    # Pulsar: 1 (minute). The extensible SplitScheduler's cycle, the shedding cycle's 5 s (the modular
    # leader here checks for splits on each of its report rounds)
    "loadBalancerSplitIntervalMinutes": 0.0833,
}
# (d) only: the namespace starts as one bundle and may reach 16 (Pulsar: 128, a bundle over 1,000 topics)
SPLIT_SETTINGS: dict[str, Any] = {
    "defaultNumberOfNamespaceBundles": 1,
    "loadBalancerNamespaceMaximumBundles": 16,    # Pulsar: 128
    "loadBalancerNamespaceBundleMaxTopics": 3,    # Pulsar: 1000; 48 topics: 16 bundles of 3
}
TOPICS = 48
BASE = ["--workload", "balance", "--option", "skew=0", "--option", "lookup=all", "--client-lifetime", "0",
        "--topics", str(TOPICS)]


def _storm_schedule(brokers: int, at: float = 30.0, every: float = 4.0, hold: float = 6.0) -> str:
    """Each broker in turn leaves gracefully and joins again `hold` s later, one every `every` s (at most
    two away at once with these numbers: `scale` refuses to stop the last broker)."""
    return "".join(f'[[fault]]\nat = {at + i * every}\nname = "scale"\nhold = {hold}\nplan = {{ node = "broker-{i + 1}" }}\n\n'
                   for i in range(brokers))


SCENARIOS: dict[str, dict[str, Any]] = {
    "storm": {"brokers": 4, "time_limit": 100, "schedule": _storm_schedule(4),
              "what": "every broker restarted within ~18 s: time until every producer publishes again",
              "seed_figure": "100 brokers restarted within 2 min, 100,000 publishers: 20 min (modular), "
                             "10 min (extensible)"},
    "rolling": {"brokers": 4, "time_limit": 100,
                "schedule": '[[fault]]\nat = 30\nname = "rolling-restart:broker+stop"\n',
                "what": "brokers restarted one by one: p99 / p99.99 publish latency, longest per-topic gap",
                "seed_figure": "10 brokers one by one, 10,000 partitions at 1,000 msg/s: p99.99 1,841 ms "
                               "(modular), 1,228 ms (extensible)"},
    "scale": {"brokers": 6, "time_limit": 180, "schedule": '[[fault]]\nat = 30\nname = "scale:3"\nhold = 75\n',
              "what": "6 -> 3 and 3 -> 6 brokers: time to a balanced cluster, unloads",
              "seed_figure": "10 -> 5: 5 min (modular), 3 min (extensible); 5 -> 10: 7 min, 5 min"},
    "split": {"brokers": 4, "time_limit": 130, "schedule": None, "settings": SPLIT_SETTINGS,
              "what": "one bundle split up to its limit (16): time to balanced, max - min topics per broker",
              "seed_figure": "1 -> 128 bundles + balance: 15 min (modular), 13 min (extensible); "
                             "topic spread 321 / 1.2k"},
}
AFTER_S = 10.0       # (b) is judged from the restart's start to this long after its last broker is back
GAP_S = 2.0          # a per-topic gap between acknowledged sends longer than this is an interruption
BAND = MEASURES["15 s band"]       # the balance measure of (c) and (d): 15-s averages within 0.10 of the mean


def command(scenario: str, load_manager: str, schedule_path: str | None) -> list[str]:
    sc = SCENARIOS[scenario]
    settings = {**SETTINGS, **sc.get("settings", {})}
    argv = [*BASE, "--brokers", str(sc["brokers"]), "--time-limit", str(sc["time_limit"]),
            "--load-manager", load_manager]
    argv += ["--nemesis-schedule", schedule_path] if sc["schedule"] else ["--nemesis", "none"]
    for k, v in settings.items():
        argv += ["--lb-setting", f"{k}={v}"]
    return argv


# ----------------------------------------------------------------------------- pure figures of a history

def sends_by_topic(history: Iterable[Op], f: str = "send") -> dict[str, list[tuple[int, int, str]]]:
    """Per topic (op.key), each send as (invoke ns, completion ns, ok|fail|info), in invocation order. A
    client process has one op outstanding at a time: its next completion belongs to its last invoke."""
    open_: dict[int, Op] = {}
    out: dict[str, list[tuple[int, int, str]]] = {}
    for op in history:
        if op.process < 0 or op.f != f:
            continue
        if op.type == INVOKE:
            open_[op.process] = op
            continue
        inv = open_.pop(op.process, None)
        if inv is None:
            continue
        out.setdefault(inv.key, []).append((inv.time_ns, op.time_ns, op.type))
    for v in out.values():
        v.sort()
    return out


def _oks(sends: list[tuple[int, int, str]]) -> list[int]:
    return sorted(c for _, c, t in sends if t == OK)


def reconnect_time(sends: dict[str, list[tuple[int, int, str]]], t0: int, t1: int,
                   gap_s: float = GAP_S) -> dict[str, Any]:
    """(a): per topic, its interruptions: gaps longer than `gap_s` between consecutive acknowledged sends
    that overlap [t0, t1] (t0 the first broker's stop, t1 the last one's join). The topic publishes again
    at the ack that ends its last interruption (a topic never interrupted does not count; one with no
    ack after t0 never came back). The figure: the last topic's return, from t0, in seconds."""
    back: dict[str, int | None] = {}
    for topic, ss in sends.items():
        oks = _oks(ss)
        if not oks or oks[0] > t1:
            continue
        last = None
        for a, b in zip(oks, oks[1:]):
            if b - a > gap_s * 1e9 and b > t0 and a < t1:
                last = b
        tail = oks[-1]
        if tail < t1 and any(inv > tail for inv, _, _ in ss):
            last = None                      # tried again after its last ack: never came back
            back[topic] = None
            continue
        if last is not None:
            back[topic] = last
    never = sorted(t for t, v in back.items() if v is None)
    done = [v for v in back.values() if v is not None]
    last = None if never else max(done) if done else t0
    return {"topics": len(sends), "interrupted": len(back), "never_back": never,
            "all_back_s": None if last is None else round((last - t0) / 1e9, 3),
            # the same instant from t1 (negative: every topic was back before the last join)
            "after_last_join_s": None if last is None else round((last - t1) / 1e9, 3)}


def latency(sends: dict[str, list[tuple[int, int, str]]], t0: int, t1: int) -> dict[str, Any]:
    """(b): the sends invoked in [t0, t1]: p99, p99.99 and max of the acknowledged ones' latency (ms,
    nearest rank), the failed or unknown ones, and the longest gap between consecutive acks of one topic
    that overlaps [t0, t1] (s)."""
    lat = sorted((c - i) / 1e6 for ss in sends.values() for i, c, t in ss if t == OK and t0 <= i <= t1)
    bad = sum(1 for ss in sends.values() for i, _, t in ss if t != OK and t0 <= i <= t1)
    worst, worst_topic = 0.0, None
    for topic, ss in sends.items():
        oks = _oks(ss)
        for a, b in zip(oks, oks[1:]):
            if b > t0 and a < t1 and (b - a) / 1e9 > worst:
                worst, worst_topic = (b - a) / 1e9, topic
    r = lambda x: None if x is None else round(x, 1)  # noqa: E731
    return {"acked": len(lat), "failed": bad, "p99_ms": r(percentile(lat, 0.99)),
            "p9999_ms": r(percentile(lat, 0.9999)), "max_ms": r(lat[-1] if lat else None),
            "longest_gap_s": round(worst, 3), "longest_gap_topic": worst_topic}


def band_settled(load: dict[str, dict[str, list]], t_from: float, t_end: float, *, smooth_s: float = 15.0,
                 target: float = 0.10, hold_s: float = 15.0, window_s: float = 3.0) -> float | None:
    """(d): seconds from `t_from` until the live brokers' load is balanced for good: the start of the
    streak of instants (their reports in [t_from, t_end]) that lasts until `t_end`, at each of which every
    live broker (a report within `window_s`) has its reports' mean usage over the last `smooth_s` within
    `target` of the brokers' mean; None if no such streak of at least `hold_s`. `load` is the balance
    checker's stats["load"] (per broker: t in s, usage)."""
    instants = sorted({t for s in load.values() for t in s["t"] if t_from <= t <= t_end})
    start = None
    for t in instants:
        scores = []
        for s in load.values():
            recent = [u for ts, u in zip(s["t"], s["usage"]) if t - smooth_s < ts <= t and u is not None]
            if recent and any(t - window_s <= ts <= t for ts in s["t"]):
                scores.append(statistics.fmean(recent))
        ok = len(scores) >= 2 and all(abs(x - statistics.fmean(scores)) <= target for x in scores)
        if ok and start is None:
            start = t
        elif not ok:
            start = None
    if start is None or t_end - start < hold_s:
        return None
    return round(start - t_from, 3)


def topic_spread(load: dict[str, dict[str, list]], t_end: float, window_s: float = 3.0) -> int | None:
    """(d): max - min of numTopics over the brokers that reported within `window_s` before `t_end` (each
    its last report up to then)."""
    last = []
    for s in load.values():
        pts = [(t, n) for t, n in zip(s["t"], s["topics"]) if t <= t_end and n is not None]
        if pts and pts[-1][0] >= t_end - window_s:
            last.append(pts[-1][1])
    return max(last) - min(last) if len(last) >= 2 else None


def _fault_ops(history: list[Op], name: str) -> list[Op]:
    return [op for op in history if op.process == NEMESIS_PROCESS and fg.parse(op.f)[1].split(":")[0] == name]


def verdict(run_dir: Path) -> dict[str, Any]:
    """The run's verdict and, per checker that found any, its anomaly counts (results.json)."""
    res = store.read_results(run_dir) or {}
    v = res.get("valid")
    bad = {name: {k: len(x) if isinstance(x, list) else x for k, x in (c.get("anomalies") or {}).items() if x}
           for name, c in (res.get("checkers") or {}).items() if isinstance(c, dict) and c.get("valid") is not True}
    return {"verdict": "valid" if v is True else "invalid" if v is False else "unknown",
            "anomalies": {k: x for k, x in bad.items() if x}}


def measure(scenario: str, run_dir: Path) -> dict[str, Any]:
    """The scenario's figures from a finished run folder (and its verdict)."""
    return {**_figures(scenario, run_dir), **verdict(run_dir)}


def _figures(scenario: str, run_dir: Path) -> dict[str, Any]:
    history = store.load_history(run_dir)
    sends = sends_by_topic(history)
    last_send = max((c for ss in sends.values() for _, c, _ in ss), default=0)
    if scenario in ("storm", "rolling"):
        name = "scale" if scenario == "storm" else "rolling-restart"
        ops = _fault_ops(history, name)
        starts = [op for op in ops if fg.parse(op.f)[0] == fg.START]
        inv = [op.time_ns for op in starts if op.type == INVOKE]
        if not inv:
            return {"error": f"no {name} fault in the history"}
        t0 = min(inv)
        if scenario == "storm":              # to the last broker's join (the stop of its `scale`)
            ends = [op.time_ns for op in ops if op.type != INVOKE]
            t1 = max(ends) if ends else last_send
        else:                                # a rolling restart happens within its start op; and 10 s after
            ends = [op.time_ns for op in starts if op.type != INVOKE]
            t1 = min(last_send, max(ends) + int(AFTER_S * 1e9)) if ends else last_send
        out = {"window_s": round((t1 - t0) / 1e9, 3), "faults_ok": sum(1 for op in starts if op.type == OK),
               "faults": len(inv)}
        out.update(reconnect_time(sends, t0, t1) if scenario == "storm" else latency(sends, t0, t1))
        return out
    from checkers import balance
    if scenario == "scale":
        events, moves = scale_measure(run_dir)
        st = balance.check(history, {"target_topic_spread": float("inf"), **BAND}).stats
        # each phase from its op's invocation (a leaving broker's own transfers happen within its stop)
        ops = _fault_ops(history, "scale")
        ats = sorted(op.time_ns / 1e9 for op in ops if op.type == INVOKE)[:len(events)] + [last_send / 1e9]
        rows = []
        for i, e in enumerate(events):
            moved = [m for m in st["moves"] if m["kind"] != "split" and m["t_s"] is not None
                     and ats[i] <= m["t_s"] < ats[i + 1]]
            rows.append({"kind": e["kind"], "brokers": e["brokers"], "at_s": e["at_s"],
                         "balanced_after_s": e["15 s band"],
                         "unloads": sum(1 for m in moved if str(m["reason"]).startswith("shed")),
                         "shutdown_transfers": sum(1 for m in moved if m["reason"] == "shutdown")})
        return {"events": rows, "unloads": moves.get("unloads"), "unloads_by_reason": moves.get("unloads_by_reason")}
    st = balance.check(history, {"target_topic_spread": float("inf")}).stats
    t_first = min((i for ss in sends.values() for i, _, _ in ss), default=0) / 1e9
    t_end = last_send / 1e9
    splits = [m["t_s"] for m in st["moves"] if m["kind"] == "split" and m["t_s"] is not None and m["t_s"] <= t_end]
    start = int(SPLIT_SETTINGS["defaultNumberOfNamespaceBundles"])
    return {"splits": len(splits), "bundles": start + len(splits),
            "last_split_s": round(max(splits) - t_first, 3) if splits else None,
            "balanced_after_s": band_settled(st["load"], t_first, t_end,
                                             smooth_s=BAND["smooth_s"], hold_s=BAND["hold_s"]),
            "topic_spread": topic_spread(st["load"], t_end),
            "shed_unloads": sum(1 for m in st["moves"] if m["kind"] != "split" and m["t_s"] is not None
                                and m["t_s"] <= t_end and str(m["reason"]).startswith("shed")),
            "unloads": st["unloads"], "unloads_by_reason": st["unloads_by_reason"]}


# ----------------------------------------------------------------------------- the table

def _num(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:.1f}"


def _cell(rows: list[dict], fn, none: str = "never") -> str:
    """Per-seed values `a / b / c` (seed order), then the median over the seeds that have a number."""
    vals = [fn(r) for r in sorted(rows, key=lambda r: r["seed"])]
    shown = [none if v is None else _num(v) if isinstance(v, (int, float)) else str(v) for v in vals]
    nums = [v for v in vals if isinstance(v, (int, float))]
    return " / ".join(shown) + (f" (median {_num(statistics.median(nums))})" if len(vals) > 1 and nums else "")


FIGURES: list[tuple[Any, ...]] = [
    # (scenario, figure, function of a row's figures[, what None means])
    ("storm", "all producers publish again after (s)", lambda f: f.get("all_back_s")),
    ("storm", "... after the last broker's join (s)", lambda f: f.get("after_last_join_s")),
    ("storm", "topics interrupted", lambda f: f.get("interrupted")),
    ("storm", "verdict", lambda f: f.get("verdict")),
    ("rolling", "p99 publish latency (ms)", lambda f: f.get("p99_ms")),
    ("rolling", "p99.99 publish latency (ms)", lambda f: f.get("p9999_ms")),
    ("rolling", "longest per-topic gap (s)", lambda f: f.get("longest_gap_s")),
    ("rolling", "failed sends", lambda f: f.get("failed")),
    ("rolling", "verdict", lambda f: f.get("verdict")),
    ("scale", "6 -> 3: balanced after (s)", lambda f: _ev(f, "leave", "balanced_after_s"), "not settled"),
    ("scale", "6 -> 3: unloads by the shedder", lambda f: _ev(f, "leave", "unloads")),
    ("scale", "6 -> 3: transfers by the leaving brokers", lambda f: _ev(f, "leave", "shutdown_transfers")),
    ("scale", "3 -> 6: balanced after (s)", lambda f: _ev(f, "join", "balanced_after_s"), "not settled"),
    ("scale", "3 -> 6: unloads by the shedder", lambda f: _ev(f, "join", "unloads")),
    ("scale", "verdict", lambda f: f.get("verdict")),
    ("split", "bundles at the last send (the last split, s)", lambda f: f"{f.get('bundles')} ({_num(f['last_split_s']) if f.get('last_split_s') is not None else '-'})"),
    ("split", "balanced after (s)", lambda f: f.get("balanced_after_s"), "not settled"),
    ("split", "max - min topics per broker", lambda f: f.get("topic_spread")),
    ("split", "unloads by the shedder", lambda f: f.get("shed_unloads")),
    ("split", "verdict", lambda f: f.get("verdict")),
]


def _ev(f: dict, kind: str, key: str) -> Any:
    return next((e.get(key) for e in f.get("events", []) if e.get("kind") == kind), None)


def table(rows: list[dict]) -> str:
    """One markdown row per figure: per load manager the per-seed values and their median; beside it
    the seed's figure of the scenario."""
    out = ["| scenario (seeds) | figure | modular: per seed (median) | extensible: per seed (median) "
           "| the seed's (modular, extensible) |", "|---|---|---|---|---|"]
    for sc, fig, fn, *none in FIGURES:
        by = {lm: [r for r in rows if r["scenario"] == sc and r["load_manager"] == lm] for lm in LOAD_MANAGERS}
        if not any(by.values()):
            continue
        cells = []
        for lm in LOAD_MANAGERS:
            ok = [r for r in by[lm] if "figures" in r and "error" not in r["figures"]]
            cells.append(_cell(ok, lambda r: fn(r["figures"]), *none) if ok else "not run")
        first = fig == next(f[1] for f in FIGURES if f[0] == sc)
        seeds = ", ".join(str(x) for x in sorted({r["seed"] for r in by["modular"] + by["extensible"]}))
        out.append(f"| {f'{sc} ({seeds})' if first else ''} | {fig} | {cells[0]} | {cells[1]} | "
                   f"{SCENARIOS[sc]['seed_figure'] if first else ''} |")
    loads = [x for r in rows for x in (r.get("load_before"), r.get("load_after")) if x is not None]
    if loads:
        out.append("")
        out.append(f"Load average (1 min) before / after each run: {min(loads):.1f} to {max(loads):.1f} "
                   f"on {os.cpu_count()} cores.")
    return "\n".join(out)


# ----------------------------------------------------------------------------- runs

def run_one(scenario: str, load_manager: str, seed: int, results: Path) -> dict[str, Any]:
    sc = SCENARIOS[scenario]
    results.mkdir(parents=True, exist_ok=True)
    sched = None
    if sc["schedule"]:
        p = results / f"{scenario}-schedule.toml"
        p.write_text(sc["schedule"])
        sched = str(p)
    argv = command(scenario, load_manager, sched)
    before = os.getloadavg()[0]
    code, run_dir, took = pulsar_chaos_run([*argv, "--seed", str(seed), "--results-dir", str(results),
                                            "--test-name", f"seed-{scenario}-{load_manager}"], timeout=900)
    row: dict[str, Any] = {"scenario": scenario, "load_manager": load_manager, "seed": seed, "exit": code,
                           "run_dir": run_dir, "took_s": round(took, 1), "load_before": round(before, 2),
                           "load_after": round(os.getloadavg()[0], 2)}
    if run_dir and Path(run_dir).exists():
        try:
            row["figures"] = measure(scenario, Path(run_dir))
        except Exception as e:               # noqa: BLE001 - one run's failure must not stop the others
            row["figures"] = {"error": f"{type(e).__name__}: {e}"}
    return row


def _list(arg: str, allowed: Iterable[str], what: str) -> list[str]:
    items = [x.strip() for x in arg.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        print(f"lb_seed: unknown {what} {bad or arg!r}; use a comma list of {', '.join(allowed)}", file=sys.stderr)
        sys.exit(254)
    return items


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2,3", help="comma list of seeds (default 1,2,3)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--load-managers", default=",".join(LOAD_MANAGERS))
    p.add_argument("--results", default="/tmp/pulsar-chaos-lb-seed")
    p.add_argument("--measure", metavar="RAW_JSONL", help="print the table of a raw.jsonl again (re-measuring "
                                                          "each run folder that still exists)")
    args = p.parse_args()
    if args.measure:
        try:
            rows = [json.loads(line) for line in Path(args.measure).read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as e:
            print(f"lb_seed: cannot read {args.measure} ({e}); give the raw.jsonl a run of this bench wrote",
                  file=sys.stderr)
            return 254
        for r in rows:
            if r.get("run_dir") and Path(r["run_dir"]).exists():
                r["figures"] = measure(r["scenario"], Path(r["run_dir"]))
        print(table(rows))
        print(json.dumps(rows, indent=1))
        return 0
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        print(f"lb_seed: --seeds {args.seeds!r} is not a comma list of integers, e.g. --seeds 1,2,3", file=sys.stderr)
        return 254
    scenarios = _list(args.scenarios, SCENARIOS, "scenario")
    lms = _list(args.load_managers, LOAD_MANAGERS, "load manager")
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    raw = results / "raw.jsonl"
    for sc in scenarios:
        print(f"# {sc}: pulsar-chaos run {' '.join(command(sc, 'LM', 'SCHEDULE'))} --seed N"
              f"   (SCHEDULE: {SCENARIOS[sc]['schedule']!r})", flush=True)
    rows = []
    for seed in seeds:
        for sc in scenarios:
            for lm in lms:
                t = time.monotonic()
                row = run_one(sc, lm, seed, results)
                rows.append(row)
                with raw.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
                print(f"# {sc} {lm} seed {seed}: exit {row['exit']} in {time.monotonic() - t:.0f} s", flush=True)
    print()
    print(table(rows))
    print()
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
