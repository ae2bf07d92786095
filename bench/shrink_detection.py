"""Shrink failing runs of campaigns/detection.toml's knob scenarios.

For each scenario named: run its spec (as the campaign file gives it, with the knob) for seeds from
--first-seed (1000) upwards until one fails (at most --max-seeds), then `pulsar-chaos shrink` that run with
one try a candidate and --verify reruns of the minimal spec; when the one replay of a failing run does not
fail (shrink exit 2), the next failing seed is shrunk instead. Prints, per scenario, the faults before and after,
the minimal run's time limit and load, the wall time of the search and how often the minimal spec
reproduced.

    .venv/bin/python bench/shrink_detection.py zk-isolate power-loss [--verify 5] [--max-hours 0.5]
    .venv/bin/python bench/shrink_detection.py queue preallocations --verify 5 --max-hours 0.33
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SCENARIOS = {        # the knob entries of campaigns/detection.toml (time limits and intervals as there)
    "zk-isolate": ["--workload", "log", "--nemesis", "zk-isolate", "--nemesis-interval", "15", "--time-limit", "35",
                   "--settle", "5", "--bug", "broker.recovery_fencing=false"],
    "power-loss": ["--workload", "log", "--nemesis", "power-loss", "--nemesis-interval", "10", "--time-limit", "30",
                   "--settle", "5", "--bug", "bookie.ack_before_fsync=true"],
    "queue": ["--workload", "queue", "--nemesis", "kill:ledger-bookies,flaky:owner", "--nemesis-interval", "10",
              "--time-limit", "30", "--settle", "5", "--option", "dedup=true", "--bug", "broker.dedup_pushed_only=true"],
    "split": ["--workload", "balance", "--nemesis", "split", "--nemesis-interval", "2", "--brokers", "3",
              "--topics", "40", "--time-limit", "40", "--settle", "5",
              "--lb-setting", "loadBalancerReportUpdateMinIntervalMillis=1000", "--bug", "broker.split_without_cas=true"],
    "preallocations": ["--workload", "balance", "--nemesis", "kill:broker", "--nemesis-interval", "12", "--brokers", "3",
                       "--topics", "40", "--time-limit", "50", "--settle", "5",
                       "--lb-setting", "loadBalancerReportUpdateMinIntervalMillis=1000",
                       "--bug", "lb.keep_preallocations=true"],
    "broken-ack": ["--workload", "ledger", "--nemesis", "kill:bookie", "--nemesis-interval", "2", "--ensemble", "2",
                   "--write-quorum", "1", "--ack-quorum", "1", "--rate", "400", "--time-limit", "30", "--settle", "5",
                   "--option", "recover_interval=20.0", "--option", "slow_adds_ms=20", "--option", "slow_metadata_ms=50",
                   "--bug", "bk.ack_broken_entry_on_ensemble_change=true"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    ap.add_argument("--verify", type=int, default=5)
    ap.add_argument("--max-hours", type=float, default=0.5, help="per shrink")
    ap.add_argument("--max-seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=1000, help="the campaign's seed_base")
    ap.add_argument("--results-dir", default="/tmp/shrink-detection")
    ap.add_argument("--json", help="append the figures to this file (JSON lines)")
    args = ap.parse_args(argv)
    exe = [sys.executable, "-m", "harness.cli"]
    from harness.shrink import Candidate
    for name in args.scenarios:
        shrunk = False
        for seed in range(args.first_seed, args.first_seed + args.max_seeds):
            test = f"{name}-{seed}"
            code = subprocess.run([*exe, "run", *SCENARIOS[name], "--seed", str(seed), "--test-name", test,
                                   "--results-dir", args.results_dir], cwd=REPO,
                                  stdout=subprocess.DEVNULL).returncode
            if code != 1:
                print(f"{name}: seed {seed} did not fail (exit {code})", flush=True)
                continue
            run_dir = max((Path(args.results_dir) / test).iterdir())
            t = time.monotonic()
            code = subprocess.run([*exe, "shrink", str(run_dir), "--tries", "1", "--verify", str(args.verify),
                                   "--max-hours", str(args.max_hours), "--results-dir", args.results_dir],
                                  cwd=REPO).returncode
            seconds = time.monotonic() - t
            sdir = max((Path(args.results_dir) / "shrinks" / run_dir.parent.name).iterdir())
            state = json.loads((sdir / "shrink.json").read_text())
            start, best = Candidate.from_json(state["start"]), Candidate.from_json(state["best"])
            v = state.get("verification") or {}
            fig = {"scenario": name, "seed": seed, "exit": code, "failure": state.get("signature"),
                   "before": start.describe(), "after": best.describe(), "candidates": len(state["steps"]),
                   "search_s": round(seconds), "reproduced": f"{v.get('reproduced')}/{v.get('tries')}",
                   "stopped": state.get("stopped"), "folder": str(sdir)}
            print(json.dumps(fig, indent=1), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(fig) + "\n")
            if code != 2:          # 2: the one replay of a flaky failure did not fail; try the next failing seed
                shrunk = True
                break
        if not shrunk:
            print(f"{name}: no failing seed that shrank in {args.max_seeds} from {args.first_seed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
