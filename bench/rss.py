"""Wall time and peak memory of a command and every process it starts (a Spark job's Python driver
and its JVM together), sampled from /proc every 0.2 s; for the figures of bench/README.md.

    .venv/bin/python bench/rss.py -- .venv/bin/pulsar-chaos analyze OUT/single --out /tmp/an
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(p.name))
    return kids


def descendants(root: int) -> list[int]:
    """`root` and every process below it now."""
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def tree_rss(root: int) -> int:
    """Bytes resident in `root` and all its descendants now."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in descendants(root):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=0.2, help="seconds between samples")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("give the command to measure after --")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(args.every)
    wall = time.monotonic() - t0
    print(f"rss.py: exit {proc.returncode}, wall {wall:.1f} s, peak {peak / 2**30:.2f} GiB "
          f"(the command and its descendants, sampled every {args.every:g} s)", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
