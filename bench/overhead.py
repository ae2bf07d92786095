"""The harness's own overhead: time from `pulsar-chaos run` to the first op, and from the last op
to the written report, on the default cluster (1 ZooKeeper, 3 bookies, 2 brokers).

    .venv/bin/python bench/overhead.py [--runs 3] [--time-limit 10]

Each run is a real `pulsar-chaos run --nemesis none` started as a subprocess; the process's start-up
(interpreter and imports) is the wall time outside the runner's own `total_s`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one(time_limit: float, results_dir: str) -> dict:
    t = time.monotonic()
    proc = subprocess.run([str(ROOT / ".venv/bin/pulsar-chaos"), "run", "--nemesis", "none",
                           "--time-limit", str(time_limit), "--settle", "1", "--test-name", "overhead",
                           "--results-dir", results_dir], capture_output=True, text=True)
    wall = time.monotonic() - t
    latest = Path(results_dir) / "latest" / "results.json"
    r = json.loads(latest.read_text())
    tm = r["run"]["timings"]
    startup = wall - tm["total_s"]
    return {"exit": proc.returncode, "wall_s": wall, "startup_s": startup, "deploy_s": tm["deploy_s"],
            "run_to_first_op_s": startup + tm["run_to_first_op_s"],
            "last_op_to_report_s": tm["last_op_to_report_s"], "teardown_s": tm.get("teardown_s"),
            "final_reads_s": tm.get("final_reads_s"), "check_s": tm.get("check_s"), "report_s": tm.get("report_s")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=10)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pc-overhead-") as d:
        runs = [one(args.time_limit, d) for _ in range(args.runs)]
    for k in ("run_to_first_op_s", "startup_s", "deploy_s", "last_op_to_report_s", "final_reads_s",
              "teardown_s", "check_s", "report_s"):
        xs = [r[k] for r in runs if r.get(k) is not None]
        print(f"{k:22} median {statistics.median(xs):6.2f} s   (runs: {', '.join(f'{x:.2f}' for x in xs)})")
    print("exit codes:", [r["exit"] for r in runs])
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
