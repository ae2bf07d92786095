"""Scale-in and scale-out under the balance workload: how long a load manager (modular by default,
`--load-manager extensible`) takes to bring the cluster back to balanced after three of six brokers
leave (6 -> 3) and after they join again (3 -> 6), per seed, as the `balance` checker measures it
(checkers/balance.py: the time from the event until the live brokers' load is balanced for good, three
ways (below), the topic criterion off).

    .venv/bin/python -m bench.lb_scale [--seeds 3] [--first-seed 1] [--results DIR] [--load-manager extensible]
    .venv/bin/python -m bench.lb_scale --measure RUN_DIR...

Each run is one `pulsar-chaos run` (its command line is printed): six brokers, a fault schedule with one
`scale:3` (three brokers leave gracefully at 60 s and join again at 180 s), then 150 s more to converge.

Three times per event (MEASURES below), each settled (from the streak that lasts until the next event
begins, or the last send, and at least 15 s): each broker's reports averaged over 15 s (one report is
one second's bytes, noisy at a test's rates); the leader's averaged scores that ThresholdShedder
compares; max - min of one-second reports. Instants are judged up to the last send. Load-balancer
timers and limits are shortened under Pulsar's names (SETTINGS below) and every run's test.toml keeps them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.lb_detection import pulsar_chaos_run
from checkers import balance
from core import store

SETTINGS = {
    "loadBalancerReportUpdateMinIntervalMillis": 1000,    # Pulsar: 5000
    # Pulsar: 1. ThresholdShedder's average of a broker moves part of the way per cycle (10 % at Pulsar's
    # loadBalancerHistoryResourcePercentage = 0.9), so a joined broker needs cycles to look loaded
    "loadBalancerSheddingIntervalMinutes": 0.0833,        # 5 s
    # Pulsar: 30 (minutes a shed bundle is not shed again: 30 cycles of its 1-minute interval). Kept at 30
    # minutes, every bundle shed once (after the leave) is frozen for the rest of the run, and after the
    # join the brokers the shedder sees overloaded have nothing left to shed (measured: 0.19 off the band
    # at the end, "overloaded" with no bundle to offer). One minute is 12 of the 5-s cycles.
    "loadBalancerSheddingGracePeriodMinutes": 1,
    # Pulsar: 4 (4 bundles cannot load 6 brokers). At 16 (2.7 a broker) one bundle was about 0.09 of a
    # link, as wide as the band itself: the brokers' loads came in steps the band could hardly fit
    "defaultNumberOfNamespaceBundles": 32,
    # Pulsar: 10. The shedder rests once its averages are within this of their mean; aimed at the same
    # 0.10 the measures below judge, the real load sat on the band's edge, 0.10 to 0.16 off for minutes
    # after a join (bench/README.md). Half of it leaves the noise of one-second reports inside the target
    "loadBalancerBrokerThresholdShedderPercentage": 5,
    # Pulsar: 0.9. ThresholdShedder's average of a broker keeps this share of its old value each cycle. At
    # 0.9 the averages of the brokers that had carried the scale-in's load stayed high for a minute after
    # the join, the shedder went on taking bundles from them past the even point, and one seed's load
    # ended 0.11 off the mean; at 0.5 an average follows its broker within a few cycles
    "loadBalancerHistoryResourcePercentage": 0.5,
    # ~70 kbit/s: a test's few KB/s are a load, about 0.2 of a link per broker at six brokers and 0.4 at
    # three, so that a scale event leaves brokers well outside the band (at 0.1 a joined broker at 0 would
    # already be within 0.10 of the mean) while no broker goes over 1.0 at three (above 1.0 Pulsar takes
    # the limits for mis-set and ignores that signal: an overloaded broker would look idle)
    "loadBalancerOverrideBrokerNicSpeedGbps": 0.00007,
    # Pulsar: false. ThresholdShedder sheds only brokers above the mean + 10 %; the brokers that joined pull
    # the mean down slowly (each cycle moves a broker's average 10 % of the way), so at a test's modest
    # load nothing moves to them. Pulsar's own switch for that case (2.11+) also sheds towards them.
    "lowerBoundarySheddingEnabled": "true",
    "loadBalancerBundleUnloadMinThroughputThreshold": 0,  # Pulsar: 10 MB/s, far above a test's traffic
    # Pulsar: true. With it, placement keeps only the brokers with the fewest bundles of the namespace, and
    # after a scale event that is often the overloaded broker itself: doLoadShedding then skips the unload
    # ("destination is the current owner") on every cycle and the cluster never converges (bench/README.md)
    "loadBalancerDistributeBundlesEvenlyEnabled": "false",
    # Pulsar: LeastLongTermMessageRate. Pulsar recommends LeastResourceUsageWithWeight with ThresholdShedder:
    # the default scores brokers by their long-term message rate (an average over hundreds of reports), so
    # right after a scale event it keeps picking the overloaded owner as the destination (skipped).
    "loadBalancerLoadPlacementStrategy": "LeastResourceUsageWithWeight",
}
# uniform rates (skew 0): under the default Zipf skew one bundle alone carries more than the 0.10 of a
# link that the target allows, and no split threshold is reached at a test's rates (bench/README.md)
SMOOTH_S = 15.0          # one shedding interval: the smoothed load score is the mean of 15 reports
# leave at 60 s, join at 180 s, once: after a leave the placement sends most orphaned bundles to the
# brokers that looked least loaded a moment before, and shedding one bundle a cycle took 50 to 60 s to
# even them out (a 60-s phase ended before some seeds had)
SCHEDULE = '[[fault]]\nat = 60\nname = "scale:3"\nhold = 120\n'
COMMAND = ["--workload", "balance", "--option", "skew=0", "--brokers", "6", "--topics", "100", "--client-lifetime", "0",
           "--option", "lookup=all",
           "--nemesis-schedule", "SCHEDULE", "--time-limit", "330",
           *[a for k, v in SETTINGS.items() for a in ("--lb-setting", f"{k}={v}")]]


# How an event's convergence is judged (the balance checker's options; target 0.10 each, Pulsar's
# loadBalancerBrokerThresholdShedderPercentage), each held for HOLD_S: a band met for a moment (a joined
# broker's first one or two reports can meet it by chance) is not convergence.
HOLD_S = 15.0
# and judged settled: from the start of the streak that lasts until the next event (or the last send).
# Right after a leave the orphaned bundles' producers come back over some 20 s, and the brokers can sit
# in the band for 15 s before that load arrives and pushes them out of it (seen: "converged" 2.2 s after
# a leave, then 0.22 off the mean for a minute)
SETTLED = {"hold_s": HOLD_S, "settled": True}
MEASURES = {
    # each broker's reports averaged over one SMOOTH_S window, every live broker within 0.10 of their
    # mean: the load as it is, in ThresholdShedder's band
    "15 s band": {"smooth_s": SMOOTH_S, "spread_measure": "band", **SETTLED},
    # the leader's averaged scores that ThresholdShedder compares, in the same band: the shedder at rest
    "leader band": {"scores": "leader", "spread_measure": "band", **SETTLED},
    # the first version's measure: max - min of one-second reports at most 0.10
    "report range": SETTLED,
}


def measure(run_dir: Path) -> tuple[list[dict], dict]:
    """Each scale event of a finished run with the time to converge under every measure."""
    history = store.load_history(run_dir)
    per = {name: balance.check(history, {"target_topic_spread": float("inf"), **o}).stats
           for name, o in MEASURES.items()}
    first = next(iter(per.values()))
    events = []
    for i, e in enumerate(first.get("scale_events", [])):
        row = {k: e.get(k) for k in ("event", "kind", "brokers", "at_s")}
        for name, st in per.items():
            ev = st["scale_events"][i]
            row[name] = ev.get("balanced_after_s")
            row[name + " spread"] = ev.get("usage_spread", ev.get("last_usage_spread"))
        events.append(row)
    return events, {k: first.get(k) for k in ("unloads", "unloads_by_reason", "splits")}


def run(seed: int, results: Path, extra: list[str]) -> dict:
    results.mkdir(parents=True, exist_ok=True)
    schedule = results / "scale-schedule.toml"
    schedule.write_text(SCHEDULE)
    code, run_dir, took = pulsar_chaos_run([*[str(schedule) if a == "SCHEDULE" else a for a in COMMAND], *extra,
                                            "--seed", str(seed), "--results-dir", str(results),
                                            "--test-name", "lb-scale"], timeout=1200)
    events: list[dict] = []
    moves: dict = {}
    if run_dir and (Path(run_dir) / "results.json").exists():
        events, moves = measure(Path(run_dir))
    return {"seed": seed, "exit": code, "took_s": round(took, 1), "run_dir": run_dir, "events": events,
            "moves": moves}


def shed_unloads(moves: dict) -> int:
    """The shedder's unloads (reason shed:*): the extensible load manager also logs a stopping broker's
    transfers (reason shutdown), which the modular one does not."""
    return sum(n for r, n in (moves.get("unloads_by_reason") or {}).items() if r.startswith("shed:"))


def table(rows: list[dict]) -> str:
    names = list(MEASURES)
    out = [f"| seed | verdict | 6 -> 3: converged after ({' / '.join(names)}) | 3 -> 6: the same | "
           "unloads (the shedder's / all) |", "|---|---|---|---|---|"]
    for r in rows:
        by = {e["kind"]: e for e in r["events"]}

        def cells(kind: str) -> str:
            e = by.get(kind)
            if e is None:
                return "no event"
            never = "not by the join" if kind == "leave" else "not by the end"
            return " / ".join(f"{e[n]:.1f} s" if e[n] is not None else never for n in names)
        verdict = {0: "valid", 1: "invalid", 2: "unknown"}.get(r["exit"], f"exit {r['exit']}")
        out.append(f"| {r['seed']} | {verdict} | {cells('leave')} | {cells('join')} | "
                   f"{shed_unloads(r['moves'])} / {r['moves'].get('unloads')} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=1, help="seeds FIRST .. FIRST + SEEDS - 1")
    p.add_argument("--results", default="/tmp/pulsar-chaos-lb-scale")
    p.add_argument("--lb-setting", action="append", default=[], metavar="NAME=VALUE",
                   help="one more load-balancer setting (overrides SETTINGS)")
    p.add_argument("--load-manager", choices=("modular", "extensible"), default="modular",
                   help="the brokers' load manager (default modular); SETTINGS apply to both, the extensible "
                        "one's own settings keep Pulsar's defaults unless given with --lb-setting")
    p.add_argument("--payload", type=int, default=0, metavar="BYTES",
                   help="each send's payload padded to BYTES (the balance workload's `payload` option; 0: the "
                        "value's digits); with a link scaled to match, the workload's bytes dominate every "
                        "broker's usage, not the extensible load manager's system topics (bench/README.md)")
    p.add_argument("--measure", nargs="+", metavar="RUN_DIR", help="only judge finished runs again")
    args = p.parse_args()
    if args.measure:
        rows = []
        for i, d in enumerate(args.measure, 1):
            events, moves = measure(Path(d))
            res = json.loads((Path(d) / "results.json").read_text()) if (Path(d) / "results.json").exists() else {}
            rows.append({"seed": i, "exit": {True: 0, False: 1}.get(res.get("valid"), 2), "events": events,
                         "moves": moves, "run_dir": d})
            print(json.dumps(rows[-1]), flush=True)
        print(table(rows))
        return 0
    extra = [a for kv in args.lb_setting for a in ("--lb-setting", kv)]
    if args.load_manager != "modular":
        extra += ["--load-manager", args.load_manager]
    if args.payload > 0:
        extra += ["--option", f"payload={args.payload}"]
    print(f"# pulsar-chaos run {' '.join(COMMAND + extra)} --seed N   (SCHEDULE: {SCHEDULE!r})", flush=True)
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        rows.append(run(seed, Path(args.results), extra))
        print(json.dumps(rows[-1]), flush=True)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
