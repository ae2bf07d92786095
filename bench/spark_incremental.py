"""Incremental analysis on a generated nightly campaign: `pulsar-chaos analyze` over every night but the
last, then again once the last night's runs are there (only those read, the others' per-run tables
reused), then `--redo` (every run read again), each in its own process as a user runs it.

    .venv/bin/python bench/spark_incremental.py /tmp/inc --runs 100 --days 10 --seed 7

Prints, per call, the runs read and reused (the manifest's counts), the wall time and the phases, and
compares the incremental call's tables with the full one's (the approximate latency percentiles may
differ in their last digit: percentile_approx merges its sketches in the order the data comes).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def analyze(results: Path, out: Path, *extra: str) -> dict:
    t0 = time.monotonic()
    cp = subprocess.run([str(Path(sys.executable).parent / "pulsar-chaos"), "analyze", str(results), "--out", str(out),
                         *extra], capture_output=True, text=True, cwd=REPO)
    wall = time.monotonic() - t0
    if cp.returncode != 0:
        raise SystemExit(f"analyze failed ({cp.returncode}): {cp.stderr[-2000:]}")
    page = next(line.split(": ", 1)[1] for line in cp.stdout.splitlines() if line.startswith("page: "))
    m = json.loads((Path(page).parent / "manifest.json").read_text())
    return {"dir": str(Path(page).parent), "wall_s": round(wall, 1), "runs": m["runs"],
            "read": m["runs_read"], "reused": m["runs_reused"], "files": m["history_files_read"],
            "phases": m["phases_s"]}


def tables(d: str) -> dict:
    import pandas as pd
    out = {}
    for p in sorted(Path(d).glob("*.parquet")):
        df = pd.read_parquet(p)
        if len(df):
            key = df.astype(str).apply(lambda r: "\x00".join(r), axis=1)
            df = df.loc[key.sort_values(kind="stable").index].reset_index(drop=True)
        out[p.stem] = df
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    from bench import campaign_gen
    if a.out.exists():
        shutil.rmtree(a.out)
    gen, held, out = a.out / "results", a.out / "last-night", a.out / "out"
    start = datetime.now() - timedelta(days=a.days)
    campaign_gen.campaign(gen, a.runs, a.seed, a.days, start, False)
    (gen / "latest").unlink(missing_ok=True)
    runs = sorted(p.parent for p in gen.glob("*/*/test.toml"))
    last = max(p.name[:8] for p in runs)
    for p in runs:
        if p.name.startswith(last):
            dest = held / p.parent.name / p.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(p), dest)
    first = analyze(gen, out)
    for p in sorted(held.glob("*/*")):
        dest = gen / p.parent.name / p.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(p), dest)
    second = analyze(gen, out)
    redo = analyze(gen, out, "--redo")
    mine, theirs = tables(second["dir"]), tables(redo["dir"])
    differ = []
    for k, v in theirs.items():
        if mine[k].shape != v.shape or list(mine[k].columns) != list(v.columns):
            differ.append(f"{k}: shape or columns")
            continue
        for c in v.columns:
            ne = (mine[k][c].astype(str) != v[c].astype(str)).sum()
            if ne:
                differ.append(f"{k}.{c}: {ne} of {len(v)} rows")
    for name, r in (("first (all nights but the last)", first), ("second (the last night added)", second),
                    ("--redo (every run)", redo)):
        print(f"{name}: {r['runs']} runs, {r['read']} read, {r['reused']} reused, {r['files']} history files; "
              f"{r['wall_s']} s wall; phases {r['phases']}")
    print("the incremental call's tables differ from --redo's in: " + ("; ".join(differ) or "nothing"))
    return 0 if all(".p" in d and "_ms" in d for d in differ) else 1


if __name__ == "__main__":
    sys.exit(main())
