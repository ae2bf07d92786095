"""A worker process: runs its share of the workload's logical client threads (or the final reads)
inside the client namespace and journals every op to <run>/journals/<name>.jsonl.

    python -m harness.worker --run-dir DIR --worker N --t0-ns T --deadline-ns D
    python -m harness.worker --run-dir DIR --final-reads --t0-ns T

SIGTERM/SIGINT stop it: ops in flight are left without a completion (indeterminate) and the journal
is closed. It also stops when the runner that started it dies.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from core import store
from core.history import Journal
from harness import plugins

STOP_GRACE_S = 2.0          # after a signal, how long in-flight ops may still complete


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.worker")
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--worker", type=int, default=0, help="worker number (workload mode)")
    p.add_argument("--workers", type=int, default=None, help="worker processes in the run")
    p.add_argument("--t0-ns", type=int, required=True, help="CLOCK_MONOTONIC ns of the run's time 0")
    p.add_argument("--deadline-ns", type=int, default=None, help="CLOCK_MONOTONIC ns to stop issuing ops")
    p.add_argument("--final-reads", action="store_true", help="read every topic from the earliest, then exit")
    p.add_argument("--plugins", default=None, help="plugin modules to import first (the CLI's PULSAR_CHAOS_PLUGINS)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    plugins.load(args.plugins)
    import workloads
    from workloads.base import Context

    run_dir: Path = args.run_dir
    spec = store.load_spec(run_dir, catalog=None)     # the runner validated it
    workload = workloads.get(spec.workload)
    cluster = json.loads((run_dir / store.CLUSTER_JSON).read_text())
    name = "final-reads" if args.final_reads else f"worker-{args.worker}"
    journal = Journal(store.journal_dir(run_dir) / f"{name}.jsonl", args.t0_ns)
    deadline = (args.deadline_ns or (args.t0_ns + int(spec.time_limit * 1e9))) / 1e9
    ctx = Context(run_dir=run_dir, spec=spec, cluster=cluster, keys=workload.keys(spec, run_dir.name),
                  journal=journal, deadline=deadline, worker=args.worker,
                  workers=args.workers or workload.worker_count(spec), name=name, out=sys.stdout)
    stop = ctx.stop
    caught: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        caught.append(signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    parent = os.getppid()

    def watch_parent() -> None:         # the runner died (SIGKILL): nobody will read what we do
        while not stop.wait(1.0):
            if os.getppid() != parent:
                print(f"{name}: the runner (pid {parent}) is gone; stopping", flush=True)
                stop.set()

    threading.Thread(target=watch_parent, daemon=True).start()

    print(f"{time.strftime('%H:%M:%S')} {name}: pid {os.getpid()}, {spec.workload} workload, "
          f"{ctx.service_url}", flush=True)
    crashed: list[str] = []
    try:
        threads = workload.start_final(ctx) if args.final_reads else workload.start(ctx)
    except Exception:
        crashed.append(traceback.format_exc())
        print(crashed[-1], flush=True)
        threads = []

    while any(t.is_alive() for t in threads) and not stop.is_set():
        stop.wait(0.2)
    if stop.is_set():
        end = time.monotonic() + STOP_GRACE_S
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
    journal.close()
    for fn in ctx.cleanups:
        try:
            fn()
        except Exception:
            pass
    crashed += ctx.crashed
    print(f"{time.strftime('%H:%M:%S')} {name}: done"
          + (f" (signal {caught[0]})" if caught else "") + (" (a thread crashed)" if crashed else ""), flush=True)
    sys.stdout.flush()
    # skip interpreter teardown: the C++ client's destructors can hang on a cut-off broker
    os._exit(128 + caught[0] if caught else 1 if crashed else 0)


if __name__ == "__main__":
    sys.exit(main())
