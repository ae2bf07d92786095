"""The faults a run really had, read back from its history, and the spec that replays them exactly.

A run's nemesis journals every fault it started: the start's invocation carries the fault's plan (its
random draws, and `fault`: the whole name, `kill:owner`, when it has a parameter), its completion what
the fault resolved and hit (`owner` -> broker-2). `recorded_faults(run)` turns those into
`RecordedFault`s: the time from the start of the faults' clock (`nemesis_start_s` in results.json's
timings; the first client op for runs older than it), the name, the hold (to the undo's invocation;
None when only the end of the run undid it), the plan, and the concrete nodes. Starts that failed had no
effect and are left out.

`replay_spec(run)` is the run's own spec (its workload seed included) with `nemesis_schedule` set to
those faults, each with `plan` *pinned* to the nodes it hit (`nemesis.targets.resolve` takes a plan's
`pinned` nodes as the resolution): the same faults, at the same times, on the same nodes. A fault can
also be replayed symbolically (`pinned=False`): the same draws, its target resolved again when it starts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import store
from core.faults import INVOKE, START, FaultTimeline, parse
from core.history import NEMESIS_PROCESS, HistoryError
from core.spec import TestSpec

PLAN_DROP = ("fault",)             # keys the journal adds to a plan that are not the nemesis's


class ReplayError(ValueError):
    """A run folder that cannot be replayed (or shrunk): one line naming the folder and the fix."""


@dataclass
class RecordedFault:
    """One fault a run had (or a candidate of the shrink search will have)."""
    at: float                           # seconds from the start of the faults' clock
    name: str                           # the whole fault name: kill:owner, partition
    hold: float | None = None           # seconds until its undo began; None: until the end of the run
    plan: dict[str, Any] | None = None  # the journaled draws; None: new draws when it starts
    nodes: list[str] = field(default_factory=list)   # the concrete nodes it hit (for display)
    pinned: bool = True                 # replay on `nodes` (True) or resolve the target again (False)

    def entry(self) -> dict[str, Any]:
        """The `nemesis_schedule` entry of this fault."""
        e: dict[str, Any] = {"at": round(self.at, 3), "name": self.name}
        if self.hold is not None:
            e["hold"] = round(max(self.hold, 0.1), 3)
        plan = pinned_plan(self.plan, self.nodes) if self.pinned else self.plan
        if plan is not None:
            e["plan"] = _clean(plan)
        return e

    def label(self) -> str:
        """`kill:owner@12.0s+5.0s on broker-2`."""
        hold = f"+{self.hold:.1f}s" if self.hold is not None else "+end"
        on = f" on {','.join(self.nodes)}" if self.nodes else ""
        pin = "" if self.pinned or not _symbolic(self.plan) else " (target resolved again)"
        return f"{self.name}@{self.at:.1f}s{hold}{on}{pin}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RecordedFault":
        return cls(**{k: d[k] for k in ("at", "name", "hold", "plan", "nodes", "pinned") if k in d})


def _symbolic(plan: dict[str, Any] | None) -> bool:
    """Whether the plan resolves a target when the fault starts (a selector asking the cluster)."""
    if not isinstance(plan, dict):
        return False
    if "selectors" in plan:
        return True
    return "selector" in plan or ("topic" in plan and "owner" not in plan and "sides" not in plan)


def symbolic(plan: dict[str, Any] | None) -> bool:
    return _symbolic(plan)


def _clean(v: Any) -> Any:
    """A plan TOML can hold: None values dropped (TOML has no null)."""
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v if x is not None]
    return v


def nodes_of(value: Any) -> list[str]:
    """The concrete nodes a fault's recorded start value names (its target's, or the nodes, owner or
    node it hit; the sides of a partition)."""
    if not isinstance(value, dict):
        return []
    target = value.get("target")
    if isinstance(target, dict) and isinstance(target.get("nodes"), list):
        return [str(n) for n in target["nodes"]]
    for k in ("nodes", "primaries"):
        if isinstance(value.get(k), list) and all(isinstance(n, str) for n in value[k]):
            return list(value[k])
    for k in ("node", "owner", "broker"):
        if isinstance(value.get(k), str) and value[k]:
            return [value[k]]
    if isinstance(value.get("sides"), list):
        return sorted({n for side in value["sides"] for n in side})
    if isinstance(value.get("ring"), list):
        return list(value["ring"])
    return []


def pinned_plan(plan: dict[str, Any] | None, nodes: list[str]) -> dict[str, Any] | None:
    """`plan` fixed to `nodes`: a selector's resolution pinned (`pinned`), a zk-isolate's owner given."""
    if plan is None:
        return None
    p = dict(plan)
    if not nodes:
        return p
    if "selectors" in p:            # power-loss over several selectors: resolved again (not pinned)
        return p
    if "selector" in p:
        p["pinned"] = list(nodes)
    elif "topic" in p and "owner" not in p and "sides" not in p:    # zk-isolate's default: the owner
        p["owner"] = nodes[0]
    return p


def _nemesis_start_s(run_dir: Path, history: list[Any]) -> float:
    res = store.read_results(run_dir) or {}
    t = ((res.get("run") or {}).get("timings") or {}).get("nemesis_start_s")
    if isinstance(t, (int, float)):
        return float(t)
    first = next((op.time_ns for op in history if op.process >= 0), None)   # older runs: the first op
    return first / 1e9 if first is not None else 0.0


def recorded_faults(run_dir: Path | str, history: list[Any] | None = None) -> list[RecordedFault]:
    """The faults the run had, in start order (see the module's doc)."""
    run_dir = Path(run_dir)
    if history is None:
        history = store.load_history(run_dir)
    t0 = _nemesis_start_s(run_dir, history)
    tl = FaultTimeline()
    plans: dict[int, Any] = {}
    for op in history:
        if op.process != NEMESIS_PROCESS:
            continue
        tl.feed(op.time_ns, op.type, op.f, op)
        kind, _ = parse(op.f)
        if kind == START and op.type == INVOKE and tl.periods:
            plans[id(tl.periods[-1])] = op.value
    out: list[RecordedFault] = []
    for p in tl.periods:
        if p.failed:
            continue
        invoked = plans.get(id(p))
        plan = {k: v for k, v in invoked.items() if k not in PLAN_DROP} if isinstance(invoked, dict) else None
        name = invoked.get("fault") if isinstance(invoked, dict) and invoked.get("fault") else p.name
        if name == p.name and isinstance(plan, dict) and isinstance(plan.get("selector"), str):
            name = f"{p.name}:{plan['selector']}"        # a run from before the journal named the fault
        at = max(0.0, p.start_ns / 1e9 - t0)
        hold = None
        ended_by_heal = any(n.startswith("ended by ") for n in p.notes)
        if p.point:
            hold = None
        elif p.stop_ns is not None and not ended_by_heal:
            began = p.stop_began_ns if p.stop_began_ns is not None else p.stop_ns
            hold = max(0.1, began / 1e9 - t0 - at)
        out.append(RecordedFault(at=round(at, 3), name=name, hold=None if hold is None else round(hold, 3),
                                 plan=plan or None, nodes=nodes_of(p.value)))
    return out


def load_run(run_dir: Path | str) -> tuple[Path, TestSpec, dict[str, Any] | None]:
    """(folder, spec, results) of a finished run folder; ReplayError naming the problem and the fix."""
    from harness.catalog import CATALOG
    try:
        run_dir = store.check_run_dir(run_dir)
        spec = store.load_spec(run_dir, catalog=CATALOG)
    except HistoryError as e:
        raise ReplayError(str(e)) from None
    return run_dir, spec, store.read_results(run_dir)


def spec_with_faults(spec: TestSpec, faults: list[RecordedFault], **changes: Any) -> TestSpec:
    """`spec` with exactly `faults` as its schedule (no random faults), and `changes` on top."""
    d = dataclasses.asdict(spec)
    d.update(nemesis=[], nemesis_schedule=[f.entry() for f in faults], **changes)
    return TestSpec(**d)


def replay_spec(run_dir: Path | str, results_dir: str | None = None) -> TestSpec:
    """The spec of `pulsar-chaos run --replay RUN` (see the module's doc)."""
    run_dir, spec, _ = load_run(run_dir)
    try:
        faults = recorded_faults(run_dir)
    except HistoryError as e:
        raise ReplayError(str(e)) from None
    if not faults:
        raise ReplayError(f"{run_dir}: the run had no fault to replay (its nemesis journal starts none); fix: "
                          f"rerun it with `pulsar-chaos run --spec {run_dir / store.TEST_TOML}`")
    changes: dict[str, Any] = {"replay_of": str(run_dir)}
    if results_dir is not None:
        changes["results_dir"] = results_dir
    return spec_with_faults(spec, faults, **changes)


# How far a replayed fault's start may be from the original's, in seconds: the faults' clock starts with
# the workload's first op (its set-up varies by a second or so between runs), and a start waits for the
# undo of an earlier fault (a killed node's restart) when they fall together.
REPLAY_TOLERANCE_S = 3.0
