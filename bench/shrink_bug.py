"""Shrink a 60-s run of the plugin bug of tests/shrink/bug_plugin.py to its two faults.

The bug loses acknowledged appends only when a `gust` starts while a `beam` is in force. The original
run (60 s, the zk-log workload, a one-broker one-bookie cluster) has eight faults of three kinds, only
one pair of which is the bug's; the other gusts start alone or before a beam. Then `pulsar-chaos
shrink` with every reduction. Prints the faults before and after, the minimal run's time limit, the
candidates, the wall time of the search and how often the minimal spec reproduced.

    .venv/bin/python bench/shrink_bug.py [--tries 1] [--verify 5] [--results-dir /tmp/shrink-bench] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "tests.shrink.bug_plugin"
SMALL = ["--brokers", "1", "--bookies", "1", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1",
         "--rate", "50", "--concurrency", "2", "--settle", "0", "--final-read-timeout", "10"]
# (at, name, hold): only the gust at 29 s starts while a beam (24-34 s) is in force
EIGHT = [(3.0, "gust", 4.0), (9.0, "glint", 5.0), (14.0, "gust", 6.0), (16.0, "beam", 3.0), (24.0, "beam", 10.0),
         (29.0, "gust", 3.0), (40.0, "glint", 4.0), (47.0, "gust", 5.0)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tries", type=int, default=1)
    ap.add_argument("--verify", type=int, default=5, help="reruns of the minimal spec (default 5)")
    ap.add_argument("--results-dir", default="/tmp/shrink-bench")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    env = {**os.environ, "PULSAR_CHAOS_PLUGINS": PLUGIN, "PYTHONPATH": str(REPO)}
    exe = [sys.executable, "-m", "harness.cli"]
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    name = f"bug-{uuid.uuid4().hex[:6]}"
    sched = results / f"{name}.toml"
    sched.write_text("".join(f'[[fault]]\nat = {a}\nname = "{n}"\nhold = {h}\n\n' for a, n, h in EIGHT))
    out = subprocess.run([*exe, "run", "--workload", "zk-log", "--nemesis-schedule", str(sched), "--time-limit", "60",
                          *SMALL, "--results-dir", str(results), "--test-name", name], cwd=REPO, env=env)
    run_dir = max((results / name).iterdir())
    if out.returncode != 1:
        print(f"the original run was not invalid (exit {out.returncode}): {run_dir}")
        return 1
    t = time.monotonic()
    code = subprocess.run([*exe, "shrink", str(run_dir), "--tries", str(args.tries), "--verify", str(args.verify),
                           "--results-dir", str(results)], cwd=REPO, env=env).returncode
    seconds = time.monotonic() - t
    sdir = max((results / "shrinks" / name).iterdir())
    state = json.loads((sdir / "shrink.json").read_text())
    sys.path.insert(0, str(REPO))
    from harness.shrink import Candidate
    start, best = Candidate.from_json(state["start"]), Candidate.from_json(state["best"])
    v = state.get("verification") or {}
    figures = {"exit": code, "before": start.describe(), "after": best.describe(),
               "after_faults": [f.name for f in best.faults], "time_limit": best.time_limit,
               "candidates": len(state["steps"]), "search_s": round(seconds),
               "reproduced": f"{v.get('reproduced')}/{v.get('tries')}", "folder": str(sdir)}
    for k, val in figures.items():
        print(f"{k}: {val}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    ok = figures["after_faults"] == ["beam", "gust"] and best.time_limit <= 20
    print("OK: exactly the beam and the gust, in that order, in a run of at most 20 s" if ok else "NOT as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
