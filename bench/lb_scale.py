"""Scale-in and scale-out under the balance workload: how long the modular load manager takes to bring
the cluster back to balanced after three of six brokers leave (6 -> 3) and after they join again
(3 -> 6), per seed, as the `balance` checker measures it (checkers/balance.py: the time from the event
until the live brokers' load-score spread is at most 0.10 and their topic spread under its target).

    .venv/bin/python -m bench.lb_scale [--seeds 3] [--results DIR]

Each run is one `pulsar-chaos run` (its command line is printed): six brokers, a fault schedule with one
`scale:3` (three brokers leave gracefully at 60 s and join again at 120 s), then 120 s more to converge.

Three times per event: until the load-score spread (max - min of the live brokers' weighted max resource
usage, what the shedders compare) is at most 0.10 (the balance checker run again on the history with its
topic criterion off), on each broker's last report and on the mean of its reports over the last 15 s
(`smooth_s`: one report is one second's bytes, noisy at a test's rates), and the checker's own, stricter
"balanced" (the spread and the topic-count spread under its target, see checkers/balance.py), which
ThresholdShedder does not aim at (it moves load, not topics). Instants are judged up to the last send. Load-balancer
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
    "loadBalancerSheddingIntervalMinutes": 0.25,          # Pulsar: 1
    "defaultNumberOfNamespaceBundles": 16,                # Pulsar: 4 (4 bundles cannot load 6 brokers)
    "loadBalancerOverrideBrokerNicSpeedGbps": 0.0001,     # ~100 kbit/s: a test's few KB/s are a load
    # Pulsar: false. ThresholdShedder sheds only brokers above the mean + 10 %; the brokers that joined pull
    # the mean down slowly (each cycle moves a broker's average 10 % of the way), so at a test's modest
    # load nothing moves to them. Pulsar's own switch for that case (2.11+) also sheds towards them.
    "lowerBoundarySheddingEnabled": "true",
    "loadBalancerBundleUnloadMinThroughputThreshold": 0,  # Pulsar: 10 MB/s, far above a test's traffic
    # Pulsar: true. With it, placement keeps only the brokers with the fewest bundles of the namespace, and
    # after a scale event that is often the overloaded broker itself: doLoadShedding then skips the unload
    # ("destination is the current owner") on every cycle and the cluster never converges (bench/README.md)
    "loadBalancerDistributeBundlesEvenlyEnabled": "false",
}
# uniform rates (skew 0): under the default Zipf skew one bundle alone carries more than the 0.10 of a
# link that the target allows, and no split threshold is reached at a test's rates (bench/README.md)
SMOOTH_S = 15.0          # one shedding interval: the smoothed load score is the mean of 15 reports
SCHEDULE = '[[fault]]\nat = 60\nname = "scale:3"\nhold = 60\n'   # leave at 60 s, join at 120 s, once
COMMAND = ["--workload", "balance", "--option", "skew=0", "--brokers", "6", "--topics", "100",
           "--nemesis-schedule", "SCHEDULE", "--time-limit", "240",
           *[a for k, v in SETTINGS.items() for a in ("--lb-setting", f"{k}={v}")]]


def run(seed: int, results: Path) -> dict:
    results.mkdir(parents=True, exist_ok=True)
    schedule = results / "scale-schedule.toml"
    schedule.write_text(SCHEDULE)
    code, run_dir, took = pulsar_chaos_run([*[str(schedule) if a == "SCHEDULE" else a for a in COMMAND], "--seed",
                                            str(seed), "--results-dir", str(results), "--test-name", "lb-scale"],
                                           timeout=1200)
    events = []
    moves = {}
    if run_dir and (Path(run_dir) / "results.json").exists():
        res = json.loads((Path(run_dir) / "results.json").read_text())
        stats = res["checkers"].get("balance", {}).get("stats", {})
        history = store.load_history(Path(run_dir))
        usage_only = balance.check(history, {"target_topic_spread": float("inf")}).stats
        smoothed = balance.check(history, {"target_topic_spread": float("inf"), "smooth_s": SMOOTH_S}).stats
        for e, u, m in zip(stats.get("scale_events", []), usage_only.get("scale_events", []),
                           smoothed.get("scale_events", [])):
            events.append({**{k: e.get(k) for k in ("event", "kind", "brokers", "balanced_after_s", "outcome",
                                                   "usage_spread", "topic_spread", "topic_target")},
                           "usage_spread_ok_after_s": u.get("balanced_after_s"), "usage_spread_then": u.get("usage_spread"),
                           "smoothed_ok_after_s": m.get("balanced_after_s")})
        moves = {k: stats.get(k) for k in ("unloads", "splits") if k in stats}
    return {"seed": seed, "exit": code, "took_s": round(took, 1), "run_dir": run_dir,
            "events": events, "moves": moves}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--results", default="/tmp/pulsar-chaos-lb-scale")
    args = p.parse_args()
    print(f"# pulsar-chaos run {' '.join(COMMAND)} --seed N   (SCHEDULE: {SCHEDULE!r})", flush=True)
    rows = []
    for seed in range(1, args.seeds + 1):
        r = run(seed, Path(args.results))
        rows.append(r)
        print(json.dumps(r), flush=True)
    print("\n| seed | verdict | 6 -> 3: spread <= 0.10 after (one report / 15 s mean / + topics) "
          "| 3 -> 6: the same | unloads |")
    print("|---|---|---|---|---|")
    for r in rows:
        by = {e["kind"]: e for e in r["events"]}

        def cell(kind: str, key: str) -> str:
            e = by.get(kind)
            if e is None:
                return "no event"
            return f"{e[key]} s" if e[key] is not None else "not by the end"
        verdict = {0: "valid", 1: "invalid", 2: "unknown"}.get(r["exit"], f"exit {r['exit']}")
        def cells(kind: str) -> str:
            return " / ".join(cell(kind, k) for k in ("usage_spread_ok_after_s", "smoothed_ok_after_s", "balanced_after_s"))
        print(f"| {r['seed']} | {verdict} | {cells('leave')} | {cells('join')} | {r['moves'].get('unloads')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
