"""How often a power loss loses acknowledged messages, with and without `bookie.ack_before_fsync`.

For seeds 1..N, one `pulsar-chaos run` of the log workload under the power-loss nemesis per seed and
configuration (the default bookies, which fsync their journal before acknowledging, and
`--bug bookie.ack_before_fsync`), through the CLI as a user would run it; prints each run's verdict,
its lost acknowledged messages and wall time, then the rate of runs reporting lost acknowledged
messages per configuration. A run reports them as the log checker's `lost` (acknowledged, never
read back) or the fencing checker's `beyond-close` / `lost-entry` (acknowledged above the point where
ledger recovery closed the ledger, or missing below it): the same loss, seen from the final reads or
from the ledgers' recorded ends. When a lost entry leaves a hole below a ledger's close, the final
read cannot pass it (the broker retries the read, as Pulsar does without autoSkipNonRecoverableData)
and the log checker says unknown while the fencing checker still counts the loss.

    .venv/bin/python bench/power_loss.py --seeds 5
    .venv/bin/python bench/power_loss.py --seeds 5 --nemesis power-loss          # bookies only
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / ".venv" / "bin" / "pulsar-chaos"
CONFIGS = {"default": [], "ack_before_fsync": ["--bug", "bookie.ack_before_fsync"]}


def one_run(results: Path, config: str, seed: int, args: argparse.Namespace) -> dict:
    name = f"power-{config.replace('_', '-')}-{seed}"
    argv = [str(CLI), "run", "--workload", "log", "--nemesis", args.nemesis,
            "--nemesis-interval", str(args.interval), "--time-limit", str(args.time_limit),
            "--seed", str(seed), "--results-dir", str(results), "--test-name", name, *CONFIGS[config]]
    t = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=args.time_limit + 900)
    wall = time.monotonic() - t
    run_dir = sorted((results / name).glob("2*"))[-1]
    return {"config": config, "seed": seed, "exit": out.returncode, **summarize(run_dir), "wall_s": round(wall, 1),
            "command": " ".join(argv[1:])}


def summarize(run_dir: Path) -> dict:
    """A run's verdict and its losses from results.json and history.jsonl."""
    res = json.loads((run_dir / "results.json").read_text())
    checkers = res.get("checkers", {})
    log = checkers.get("log", {}).get("anomalies") or {}
    fencing = checkers.get("fencing", {}).get("anomalies") or {}
    faults = dropped = 0
    history = run_dir / "history.jsonl"
    for line in history.open() if history.exists() else []:
        op = json.loads(line)
        if op.get("f") == "start-power-loss" and op.get("type") == "ok":
            faults += 1
            dropped += int((op.get("value") or {}).get("dropped_bytes", 0))
    lost = len(log.get("lost", []))
    beyond = len(fencing.get("beyond-close", [])) + len(fencing.get("lost-entry", []))
    return {"verdict": {True: "valid", False: "invalid"}.get(res.get("valid"), "unknown"),
            "log": str(checkers.get("log", {}).get("valid")), "lost": lost, "beyond_close": beyond,
            "loses": lost > 0 or beyond > 0, "power_losses": faults, "dropped_bytes": dropped,
            "final_reads_s": (res.get("run", {}).get("timings") or {}).get("final_reads_s"),
            "run_dir": str(run_dir)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--nemesis", default="power-loss:all-bookie+all-broker",
                    help="the fault (default: every bookie and broker loses power at once)")
    ap.add_argument("--interval", type=float, default=5.0, help="--nemesis-interval")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--results-dir", default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="write every run's figures here")
    args = ap.parse_args()
    tmp = None if args.results_dir else tempfile.TemporaryDirectory(prefix="power-loss-")
    results = Path(args.results_dir or tmp.name)
    rows = []
    t0 = time.monotonic()
    try:
        for seed in range(1, args.seeds + 1):
            for config in CONFIGS:
                row = one_run(results, config, seed, args)
                rows.append(row)
                print(f"{config:17} seed {seed}: exit {row['exit']} {row['verdict']:8} log {row['log']:8} "
                      f"lost {row['lost']:4} beyond-close/lost-entry {row['beyond_close']:4} "
                      f"({row['power_losses']} power losses dropping {row['dropped_bytes']} bytes; "
                      f"{row['wall_s']:.0f} s)", flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(f"\n{args.nemesis}, --nemesis-interval {args.interval:g}, --time-limit {args.time_limit:g}, "
          f"seeds 1..{args.seeds} ({time.monotonic() - t0:.0f} s in all)")
    for config in CONFIGS:
        mine = [r for r in rows if r["config"] == config]
        losing = sum(1 for r in mine if r["loses"])
        print(f"  {config:17} runs reporting lost acknowledged messages: {losing}/{len(mine)}; "
              f"verdicts {[r['verdict'] for r in mine]}; lost {[r['lost'] for r in mine]}; "
              f"beyond-close/lost-entry {[r['beyond_close'] for r in mine]}; "
              f"wall {[r['wall_s'] for r in mine]} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
