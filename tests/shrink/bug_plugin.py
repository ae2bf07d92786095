"""A plugin with a bug that loses data only under one order of two faults, for `pulsar-chaos shrink`.

Built by docs/extending.md's recipes, as tests/extending/plugin.py: three marker faults and a workload.

- `beam`, `gust`, `glint`: each creates a znode `/pulsar-chaos/marks/<run>/<fault>-<n>` in the
  cluster's ZooKeeper when it starts and deletes it when it stops (a fault in force is a znode there).
- the `zk-log` workload: clients append entries (sequential znodes) to a log in ZooKeeper; each ok
  append is acknowledged with its sequence number; the final read lists the log.
- the bug: the workload's compactor watches the marks, and when a `gust` appears while a `beam` is
  there (a gust starting while a beam is in force; not a beam starting during a gust, nor a gust alone),
  it "compacts" the log by deleting its newest `LOST_PER_BUG` entries: acknowledged appends are lost.
- the `zk-log` checker: every ok append is in the final read, else `lost`.

Loaded with PULSAR_CHAOS_PLUGINS=tests.shrink.bug_plugin."""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from checkers import REGISTRY as CHECKERS
from checkers import Checker, select
from checkers.toolkit import Cases, anomalies_of, anomaly_stats, verdict
from core.history import INFO, OK, CheckResult, Op
from core.spec import TestSpec
from nemesis import REGISTRY as FAULTS
from nemesis import Fault, Nemesis, NemesisContext, NemesisError
from workloads import REGISTRY as WORKLOADS
from workloads import WorkloadEntry
from workloads import base
from workloads.base import Context, Planned

MARKS = "/pulsar-chaos/marks"
LOG = "/pulsar-chaos/zk-log"
MARK_FAULTS = ("beam", "gust", "glint")
LOST_PER_BUG = 5
POLL_S = 0.05
FINAL_PROCESS = 1000


def _zk(connect: str):
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=connect, timeout=10.0)
    zk.start(15.0)
    return zk


# ------------------------------------------------------------------------------------ the faults

class MarkNemesis(Nemesis):
    """A fault that is a znode in ZooKeeper while it is in force (the marks of this run's folder)."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        zk = _zk(ctx.cluster.zk_connect)
        try:
            zk.ensure_path(MARKS)
            path = zk.create(f"{MARKS}/{self.name}-", b"", sequence=True)
        except Exception as e:
            raise NemesisError(f"{self.name}: {type(e).__name__}: {e}") from None
        finally:
            zk.stop()
            zk.close()
        self.applied = {"mark": path, "nodes": ["zk-1"]}
        return dict(self.applied)

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        zk = _zk(ctx.cluster.zk_connect)
        try:
            if zk.exists(self.applied["mark"]):
                zk.delete(self.applied["mark"])
        finally:
            zk.stop()
            zk.close()
        done, self.applied = self.applied, None
        return {"mark": done["mark"], "deleted": True}


# ------------------------------------------------------------------------------------ the checker

def check_zk_log(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Every acknowledged append is in the final read of the log (`lost` otherwise)."""
    acked = {op.value: op for op in history if op.process >= 0 and op.f == "append" and op.type == OK
             and isinstance(op.value, int)}
    reads = [op for op in history if op.f == "read" and op.type == OK and isinstance(op.value, list)]
    cases = {"lost": Cases(None)}
    if reads:
        seen = set(reads[-1].value)
        for n, op in sorted(acked.items()):
            if n not in seen:
                cases["lost"].add(lambda n=n, op=op: {"sequence": n, "op": op.index})
    valid = verdict(cases, cases) if reads else "unknown"
    return CheckResult(valid=valid, anomalies=anomalies_of(cases),
                       stats={"appends_ok": len(acked), "read": bool(reads), **anomaly_stats(cases)})


# ------------------------------------------------------------------------------------ the workload

DESCRIPTION = "clients append to a log in ZooKeeper; a compactor loses entries when a gust starts during a beam (test plugin)"
OPTIONS: dict[str, tuple[Any, str]] = {}


def keys(spec: TestSpec, run_id: str) -> list[str]:
    return []


def worker_count(spec: TestSpec) -> int:
    return 1


def _path(ctx: Context) -> str:
    return f"{LOG}/{ctx.run_dir.name}"


def _plan(spec: TestSpec, thread: int) -> Iterator[Planned]:
    rng = random.Random(f"{spec.seed}:zk-log:{thread}")
    while True:
        yield Planned("append", "log", None, rng.uniform(0, 2 * spec.concurrency / spec.rate))


def _perform(zk: Any, path: str) -> Callable[[Planned, int], tuple[str, dict[str, Any]]]:
    def perform(planned: Planned, process: int) -> tuple[str, dict[str, Any]]:
        try:
            made = zk.create_async(f"{path}/e-", b"", sequence=True).get(timeout=5.0)
        except Exception as e:
            return INFO, {"error": f"{type(e).__name__}: {e}"}
        return OK, {"value": int(made.rsplit("-", 1)[1])}
    return perform


def compactor(ctx: Context, zk: Any, path: str) -> None:
    """The bug: a gust mark that appears while a beam mark is there deletes the log's newest entries."""
    seen: set[str] = set()
    zk.ensure_path(MARKS)
    while not ctx.stop.is_set() and time.monotonic() < ctx.deadline + 5:
        marks = set(zk.get_children(MARKS))
        new = marks - seen
        seen |= marks
        if any(m.startswith("gust-") for m in new) and any(m.startswith("beam-") for m in marks - new):
            entries = sorted(zk.get_children(path))
            for e in entries[-LOST_PER_BUG:]:
                zk.delete(f"{path}/{e}")
            print(f"compactor: a gust during a beam: deleted {entries[-LOST_PER_BUG:]}", flush=True)
        time.sleep(POLL_S)


def start(ctx: Context) -> list[threading.Thread]:
    zk = _zk(ctx.cluster["zk_connect"])
    ctx.cleanups.append(zk.stop)
    path = _path(ctx)
    zk.ensure_path(path)
    threads = [(f"append-{t}", lambda t=t: base.drive(ctx, t, ctx.spec.concurrency, _plan(ctx.spec, t),
                                                       _perform(zk, path))) for t in range(ctx.spec.concurrency)]
    return base.start_threads(ctx, threads + [("compactor", lambda: compactor(ctx, zk, path))])


def start_final(ctx: Context) -> list[threading.Thread]:
    zk = _zk(ctx.cluster["zk_connect"])
    ctx.cleanups.append(zk.stop)

    def read() -> tuple[str, dict[str, Any]]:
        return OK, {"value": sorted(int(e.rsplit("-", 1)[1]) for e in zk.get_children(_path(ctx)))}
    return base.start_threads(ctx, [("final-read", lambda: base.once(ctx, FINAL_PROCESS, "read", "log", None, read))])


def checkers(spec: TestSpec | None = None) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    return select({"zk-log": {}})


# ------------------------------------------------------------------------------------ registration

def register() -> None:
    for name, colour in zip(MARK_FAULTS, ("#F2C29B", "#A0B1E9", "#C9D7A0")):
        FAULTS.register(name, Fault(lambda _param, name=name: MarkNemesis(name),
                                    f"a {name} mark in ZooKeeper while in force (test plugin)", colour=colour))
    CHECKERS.register("zk-log", Checker(__name__, "every acknowledged append of the ZooKeeper log is read",
                                        function="check_zk_log"))
    WORKLOADS.register("zk-log", WorkloadEntry(__name__))


def unregister() -> None:
    for name in MARK_FAULTS:
        FAULTS.unregister(name)
    CHECKERS.unregister("zk-log")
    WORKLOADS.unregister("zk-log")


register()
