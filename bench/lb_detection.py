"""Detection of the load balancer's bug knobs: each knob's documented scenario, run for N seeds with the knob
on (must be invalid) and off (must be valid); prints a table and the anomalies that decided each run.

    .venv/bin/python bench/lb_detection.py [--seeds 5] [--knob broker.split_without_cas] [--results DIR]

The runs are ordinary `pulsar-chaos run`s, one after another (clusters on one machine must not overlap);
each scenario's command line is printed, so any run can be repeated by hand. Knobs whose scenarios are
the same command line share their runs without a knob (once per seed). The extensible load manager's
knobs take their scenario from their registry entry (clusters/bugs.py), the one campaigns/detection.toml
repeats.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PULSAR_CHAOS = REPO / ".venv" / "bin" / "pulsar-chaos"

# knob -> the scenario that reveals it (shortened load-balancer timers under Pulsar's names)
SCENARIOS: dict[str, list[str]] = {
    "broker.split_without_cas": [
        "--workload", "balance", "--nemesis", "split", "--nemesis-interval", "2", "--topics", "40", "--brokers", "3",
        "--time-limit", "40", "--lb-setting", "loadBalancerReportUpdateMinIntervalMillis=1000"],
    # a broker the leader placed bundles on dies and the leader lives on (killing the leader resets them)
    "lb.keep_preallocations": [
        "--workload", "balance", "--nemesis", "kill:lb-follower", "--nemesis-interval", "12", "--topics", "40",
        "--brokers", "3", "--time-limit", "50", "--lb-setting", "loadBalancerReportUpdateMinIntervalMillis=1000"],
    # each unload's lock delete is carried out by ZooKeeper, its answer never reaches the owner
    "broker.reactivate_on_release_failure": [
        "--workload", "balance", "--nemesis", "unload:lost-answer", "--nemesis-interval", "10", "--topics", "40",
        "--brokers", "3", "--time-limit", "45", "--lb-setting", "loadBalancerReportUpdateMinIntervalMillis=1000"],
    # the brokers' links so slow (~100 kbit/s) that a test's traffic is a load and its Zipf skew an imbalance
    # ThresholdShedder acts on every cycle; every broker counts as overloaded for placement (threshold 1 %),
    # so a destination is drawn among all brokers, the owner included when the knob lets it in
    "lb.shed_to_owner": [
        "--workload", "balance", "--nemesis", "none", "--topics", "40", "--brokers", "3", "--time-limit", "45",
        "--lb-setting", "loadBalancerReportUpdateMinIntervalMillis=1000",
        "--lb-setting", "loadBalancerSheddingIntervalMinutes=0.1",
        "--lb-setting", "defaultNumberOfNamespaceBundles=12",
        "--lb-setting", "loadBalancerOverrideBrokerNicSpeedGbps=0.0001",
        "--lb-setting", "loadBalancerBrokerOverloadedThresholdPercentage=1",
        "--lb-setting", "loadBalancerBundleUnloadMinThroughputThreshold=0"],
}
# the extensible load manager's: their registry scenarios (two share one)
EXTENSIBLE_KNOBS = ("lb.no_version_check", "lb.tombstone_split_parent", "lb.ignore_existing_assigning",
                    "lb.metadata_table_view_stale_cache")


def _registry_scenarios() -> None:
    from clusters.bugs import REGISTRY
    for knob in EXTENSIBLE_KNOBS:
        if knob in REGISTRY:
            SCENARIOS[knob] = shlex.split(REGISTRY[knob].scenario)


_registry_scenarios()


def pulsar_chaos_run(args: list[str], timeout: float = 900) -> tuple[int, str | None, float]:
    """One `pulsar-chaos run ARGS`: its exit code, its run folder (from its first line) and seconds taken."""
    t = time.monotonic()
    cp = subprocess.run([str(PULSAR_CHAOS), "run", *args], capture_output=True, text=True, timeout=timeout)
    run_dir = next((line.split()[1].rstrip(":") for line in cp.stdout.splitlines() if line.startswith("run ")), None)
    return cp.returncode, run_dir, time.monotonic() - t


def run(knob: str, seed: int, on: bool, results: Path) -> dict:
    name = knob.replace(".", "-") if on else _shared_name(knob)
    argv = [*SCENARIOS[knob], "--seed", str(seed),
            "--results-dir", str(results / ("on" if on else "off")), "--test-name", name]
    if on:
        argv += ["--bug", knob]
    code, run_dir, took = pulsar_chaos_run(argv)
    anomalies: dict = {}
    if run_dir and (Path(run_dir) / "results.json").exists():
        res = json.loads((Path(run_dir) / "results.json").read_text())
        anomalies = {k: sorted(c.get("anomalies") or {}) for k, c in res["checkers"].items() if c.get("anomalies")}
    return {"knob": knob, "seed": seed, "on": on, "exit": code, "took_s": round(took, 1),
            "run_dir": run_dir, "anomalies": anomalies, "argv": " ".join(argv)}


def _shared_name(knob: str) -> str:
    """The test name of a run without a knob: the first knob (by name) with the same scenario."""
    same = sorted(k for k, argv in SCENARIOS.items() if argv == SCENARIOS[knob])
    return "+".join(same).replace(".", "-")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--knob", action="append", choices=sorted(SCENARIOS), default=None)
    p.add_argument("--results", default="/tmp/pulsar-chaos-lb-detection")
    args = p.parse_args()
    results = Path(args.results)
    rows = []
    done_off: dict[tuple[str, int], dict] = {}        # (scenario, seed) -> the run without a knob
    for knob in args.knob or sorted(SCENARIOS):
        print(f"# {knob}: pulsar-chaos run {' '.join(SCENARIOS[knob])} --seed N [--bug {knob}]", flush=True)
        for seed in range(1, args.seeds + 1):
            for on in (True, False):
                shared = (" ".join(SCENARIOS[knob]), seed)
                if not on and shared in done_off:
                    r = {**done_off[shared], "knob": knob}
                    print(f"  seed {seed} knob off: shared with {done_off[shared]['knob']}", flush=True)
                    rows.append(r)
                    continue
                r = run(knob, seed, on, results)
                rows.append(r)
                if not on:
                    done_off[shared] = r
                print(f"  seed {seed} knob {'on ' if on else 'off'}: exit {r['exit']} in {r['took_s']} s "
                      f"{json.dumps(r['anomalies'])}", flush=True)
    print("\n| knob | caught with the knob (exit 1) | valid without it (exit 0) |")
    print("|---|---|---|")
    for knob in args.knob or sorted(SCENARIOS):
        mine = [r for r in rows if r["knob"] == knob]
        on = [r for r in mine if r["on"]]
        off = [r for r in mine if not r["on"]]
        print(f"| `{knob}` | {sum(r['exit'] == 1 for r in on)}/{len(on)} | {sum(r['exit'] == 0 for r in off)}/{len(off)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
