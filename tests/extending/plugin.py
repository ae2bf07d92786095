"""A plugin made by following docs/extending.md once for each recipe: a fault (`nudge`), a workload
(`zk-sequence`) and its checker (`sequence`). Nothing outside this file names them; the tests load it
as a user would, through PULSAR_CHAOS_PLUGINS=tests.extending.plugin."""
from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

from checkers import REGISTRY as CHECKERS
from checkers import Checker, select
from checkers.toolkit import Cases, anomalies_of, anomaly_stats, verdict
from core.history import FAIL, INFO, INVOKE, OK, CheckResult, Op
from core.spec import TestSpec
from nemesis import REGISTRY as FAULTS
from nemesis import Fault, Nemesis, NemesisContext, NemesisError
from workloads import REGISTRY as WORKLOADS
from workloads import WorkloadEntry
from workloads import base
from workloads.base import Context, Planned

# ------------------------------------------------------------------------------------ the fault

NUDGE_S = 7.0
NUDGE_COLOUR = "#2E8B57"


class NudgeNemesis(Nemesis):
    """`nudge`: one random broker's wall clock set NUDGE_S seconds ahead, put back at the stop. It needs
    the brokers under libfaketime, which its registry entry declares (`deploy`)."""

    name = "nudge"

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        brokers = ctx.names("broker")
        if not brokers:
            raise NemesisError("nudge: the cluster has no brokers")
        return {"node": ctx.rng.choice(brokers), "offset_s": NUDGE_S}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan or self.choose(ctx)
        ctx.cluster.set_clock(plan["node"], plan["offset_s"])     # raises before any effect if it cannot
        self.applied = dict(plan)
        return dict(plan)

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        ctx.cluster.set_clock(self.applied["node"], 0.0)
        done, self.applied = self.applied, None
        return {"node": done["node"], "offset_s": 0.0}



# ------------------------------------------------------------------------------------ the checker


def creates(history: list[Op]) -> list[tuple[Op, Op]]:
    """(invoke, ok completion) of every create that got a sequence number."""
    invoked: dict[int, Op] = {}
    done: list[tuple[Op, Op]] = []
    for op in history:
        if op.f != "create" or op.process < 0:
            continue
        if op.type == INVOKE:
            invoked[op.process] = op
        elif op.type == OK and op.process in invoked and isinstance(op.value, int):
            done.append((invoked.pop(op.process), op))
    return done


def duplicate_sequence_cases(done: list[tuple[Op, Op]], cases: Cases) -> None:
    """`duplicate-sequence`: two ok creates got the same number; evidence: the number and both ops."""
    seen: dict[int, Op] = {}
    for _, ok in done:
        first = seen.setdefault(ok.value, ok)
        if first is not ok:
            cases.add(lambda ok=ok, first=first: {"sequence": ok.value, "ops": [first.index, ok.index]})


def reordered_cases(done: list[tuple[Op, Op]], cases: Cases) -> None:
    """`sequence-reordered`: a create invoked after another had completed got a smaller number (the
    real-time order says it came later); evidence: it, and the highest number completed before it."""
    by_end = sorted(done, key=lambda p: p[1].time_ns)
    best: Op | None = None                  # the create with the highest number completed so far
    j = 0
    for inv, ok in sorted(done, key=lambda p: p[0].time_ns):
        while j < len(by_end) and by_end[j][1].time_ns < inv.time_ns:
            if best is None or by_end[j][1].value > best.value:
                best = by_end[j][1]
            j += 1
        if best is not None and ok.value < best.value:
            cases.add(lambda ok=ok, best=best: {"sequence": ok.value, "op": ok.index, "after": best.index,
                                                "after_sequence": best.value})


def check_sequence(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """ZooKeeper's sequential znodes: every ok `create` got a number no other ok create got, and one
    that completed before another was invoked got a smaller number."""
    done = creates(history)
    cases = {"duplicate-sequence": Cases(None), "sequence-reordered": Cases(None)}
    duplicate_sequence_cases(done, cases["duplicate-sequence"])
    reordered_cases(done, cases["sequence-reordered"])
    return CheckResult(valid=verdict(cases, cases), anomalies=anomalies_of(cases),
                       stats={"creates_ok": len(done), **anomaly_stats(cases)})


# ------------------------------------------------------------------------------------ the workload

DESCRIPTION = "clients create sequential znodes in ZooKeeper; their numbers must be unique and ordered (test plugin)"
OPTIONS: dict[str, tuple[Any, str]] = {}
ROOT = "/pulsar-chaos/zk-sequence"


def keys(spec: TestSpec, run_id: str) -> list[str]:
    return []                                   # no topics: topic-targeted faults pick random targets


def worker_count(spec: TestSpec) -> int:
    return 1


def _plan(spec: TestSpec, thread: int) -> Iterator[Planned]:
    rng = random.Random(f"{spec.seed}:zk-sequence:{thread}")
    while True:
        yield Planned("create", "seq", None, rng.uniform(0, 2 * spec.concurrency / spec.rate))


def _perform(zk: Any, path: str) -> Callable[[Planned, int], tuple[str, dict[str, Any]]]:
    def perform(planned: Planned, process: int) -> tuple[str, dict[str, Any]]:
        if not zk.connected:
            return FAIL, {"error": "not connected to ZooKeeper"}
        try:
            made = zk.create_async(f"{path}/n-", b"", sequence=True).get(timeout=5.0)
        except Exception as e:
            return INFO, {"error": f"{type(e).__name__}: {e}"}
        return OK, {"value": int(made.rsplit("-", 1)[1])}
    return perform


def start(ctx: Context) -> list[threading.Thread]:
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=ctx.cluster["zk_connect"], timeout=10.0)
    zk.start(15.0)
    ctx.cleanups.append(zk.stop)
    path = f"{ROOT}/{ctx.run_dir.name}"
    zk.ensure_path(path)
    return base.start_threads(ctx, [(f"seq-{t}", lambda t=t: base.drive(
        ctx, t, ctx.spec.concurrency, _plan(ctx.spec, t), _perform(zk, path))) for t in range(ctx.spec.concurrency)])


def start_final(ctx: Context) -> list[threading.Thread]:
    return []                                   # the creates themselves are the observations


def checkers(spec: TestSpec | None = None) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    return select({"sequence": {}, "perf": {"write_fs": ("create",)}})


# ------------------------------------------------------------------------------------ registration

def register() -> None:
    """One entry per registry: the whole of what the house needs to know."""
    FAULTS.register("nudge", Fault(lambda _param: NudgeNemesis(), f"one broker's clock {NUDGE_S:g} s ahead "
                                   "(test plugin)", colour=NUDGE_COLOUR, deploy={"fake_clocks": ("broker",)}))
    CHECKERS.register("sequence", Checker(__name__, "ZooKeeper sequence numbers: unique, in real-time order",
                                          function="check_sequence"))
    WORKLOADS.register("zk-sequence", WorkloadEntry(__name__))


def unregister() -> None:
    """For tests that load this plugin in their own process."""
    FAULTS.unregister("nudge")
    CHECKERS.unregister("sequence")
    WORKLOADS.unregister("zk-sequence")


register()
