"""Where a command's CPU goes, by thread kind: the JVM's JIT compilers, Spark's task threads, the
collector, the driver's own threads, and the Python processes; for bench/README.md's Spark sections.

    .venv/bin/python bench/spark_cpu.py -- .venv/bin/pulsar-chaos analyze OUT/single --out /tmp/an

Every 0.5 s it reads /proc/<pid>/task/<tid>/stat of the command and every process it starts, and keeps
each thread's last CPU time (user + system) by its name; a thread that ends between two samples loses
at most its last half second. Prints wall time, the CPU of each kind and the total.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rss import descendants  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
KINDS = [("jit C2", r"^C2 Compiler"), ("jit C1", r"^C1 Compiler"),
         ("tasks", r"^Executor task"), ("gc", r"^(GC |ParGC|G1 |VM Periodic)"),
         ("shuffle/io", r"^(shuffle|block-manager|dispatcher|rpc|netty|map-output)"),
         ("jvm other", r"")]


def sample(root: int, seen: dict[tuple[int, int], tuple[str, str, float]]) -> None:
    for pid in descendants(root):
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                s = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            name = s[s.index("(") + 1:s.rindex(")")]
            f = s.rsplit(")", 1)[1].split()
            seen[(pid, int(tid))] = (exe, name, (int(f[11]) + int(f[12])) / TICK)


def kind(exe: str, name: str) -> str:
    if exe != "java":
        return f"{exe} (all threads)"
    return next(k for k, rx in KINDS if re.search(rx, name))


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv)
    seen: dict[tuple[int, int], tuple[str, str, float]] = {}
    for _ in range(int(4 * 3600 / 0.5)):            # bounded: at most four hours
        sample(proc.pid, seen)
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    rc = proc.wait()
    wall = time.monotonic() - t0
    by: dict[str, float] = {}
    for exe, name, cpu in seen.values():
        k = kind(exe, name)
        by[k] = by.get(k, 0.0) + cpu
    print(f"\nwall {wall:.1f} s, exit {rc}; CPU by thread kind (s):", file=sys.stderr)
    for k, v in sorted(by.items(), key=lambda kv: -kv[1]):
        print(f"  {k:24s} {v:7.1f}", file=sys.stderr)
    print(f"  {'total':24s} {sum(by.values()):7.1f}", file=sys.stderr)
    other: dict[str, float] = {}
    for exe, name, cpu in seen.values():
        if kind(exe, name) == "jvm other":
            n = re.sub(r"[-#0-9 ]+$", "", name)
            other[n] = other.get(n, 0.0) + cpu
    top = sorted(other.items(), key=lambda kv: -kv[1])[:6]
    print("  jvm other: " + ", ".join(f"{n} {v:.1f}" for n, v in top), file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
