"""The table of bench/round2_detection.sh: per test name, each run's seed, verdict and anomaly counts
(every checker's), read from the runs' results.json under a results dir.

    .venv/bin/python bench/round2_table.py RESULTS_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(root: Path) -> list[tuple[str, int, object, str]]:
    out = []
    for res in sorted(root.glob("*/2*/results.json")):
        r = json.loads(res.read_text())
        counts = []
        for name, c in sorted((r.get("checkers") or {}).items()):
            for k, n in sorted(((c.get("stats") or {}).get("anomaly_counts") or {}).items()):
                counts.append(f"{name} {k} {n}")
        out.append((res.parent.parent.name, int(r["run"].get("seed") or 0), r.get("valid"), ", ".join(counts)))
    return out


def main() -> None:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit(f"usage: {sys.argv[0]} RESULTS_DIR (a folder of <test-name>/<run>/results.json)")
    rs = rows(Path(sys.argv[1]))
    print("| test | seed | verdict | anomaly counts |\n|---|---|---|---|")
    for name, seed, valid, counts in sorted(rs, key=lambda x: (x[0], x[1])):
        print(f"| {name} | {seed} | {'valid' if valid is True else 'invalid' if valid is False else valid} | {counts or '-'} |")
    by: dict[str, list] = {}
    for name, _, valid, _ in rs:
        by.setdefault(name, []).append(valid)
    for name, vs in sorted(by.items()):
        print(f"{name}: valid {sum(v is True for v in vs)}, invalid {sum(v is False for v in vs)}, "
              f"other {sum(v not in (True, False) for v in vs)} of {len(vs)}")


if __name__ == "__main__":
    main()
