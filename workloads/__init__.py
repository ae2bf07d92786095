"""Workloads: one module per workload with its op generator, its client code and its checkers.

A workload module meets `workloads.base.Workload` (a typing.Protocol: DESCRIPTION, OPTIONS,
keys, worker_count, start, start_final, checkers; optionally CHOICES, UNSAFE and prepare); see
workloads/log.py, and docs/extending.md for a new one. `REGISTRY` maps each name to a
`WorkloadEntry` whose module is imported on first use.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from core.registry import Registry
from workloads.base import REQUIRED, Workload


class WorkloadError(TypeError):
    """A registered workload module that does not meet the `Workload` contract."""


@dataclass(frozen=True)
class WorkloadEntry:
    """A workload's declaration: the module that implements it (imported on first use)."""
    module: str

    def load(self) -> Workload:
        mod = importlib.import_module(self.module)
        missing = [m for m in REQUIRED if not hasattr(mod, m)]
        if missing:
            raise WorkloadError(f"workload module {self.module} lacks {', '.join(missing)} "
                                f"(see workloads.base.Workload)")
        return mod  # type: ignore[return-value]


# the order is the order in --help
REGISTRY: Registry[WorkloadEntry] = Registry("workload", {
    "log": WorkloadEntry("workloads.log"),
    "queue": WorkloadEntry("workloads.queue"),
    "subscriptions": WorkloadEntry("workloads.subscriptions"),
    "exactly-once": WorkloadEntry("workloads.exactly_once"),
    "ledger": WorkloadEntry("workloads.ledger"),
    "register": WorkloadEntry("workloads.register"),
    "balance": WorkloadEntry("workloads.balance"),
    "schema": WorkloadEntry("workloads.schema"),
})


def available() -> tuple[str, ...]:
    """The registered workloads whose module exists in this checkout."""
    return tuple(name for name, e in REGISTRY.items() if importlib.util.find_spec(e.module) is not None)


def get(name: str) -> Workload:
    """The workload module of `name`; `core.registry.UnknownName` (a KeyError) if none is registered."""
    return REGISTRY[name].load()


def options(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The workload's options: its defaults overlaid with `given` (validated by the spec)."""
    out = {k: d for k, (d, _) in get(name).OPTIONS.items()}
    out.update(given or {})
    return out


def unsafe_causes(name: str, given: dict[str, Any] | None, bugs: dict[str, Any] | None,
                  spec: Any = None) -> list[Any]:
    """Why a configuration must be invalid (`core.expectation.Cause`s): the bug knobs set off their safe
    default (`clusters.bugs.REGISTRY`), the workload's deliberately unsafe settings (its `UNSAFE`) and,
    given the run's spec (a mapping of its test.toml fields), the cluster's unsafe settings
    (`clusters.unsafe_settings`, e.g. journalSyncData=false), unless a bug knob is on: then the unsafe
    setting is the knob's scenario (B12's is BookKeeper's own example at ack quorum 1) and the knob the
    cause under test, so the detection matrix credits the knob alone."""
    from clusters import bugs as bug_knobs
    from clusters import unsafe_settings
    from core.expectation import Cause, causes
    try:
        mod = get(name)
        unsafe, defaults = getattr(mod, "UNSAFE", ()), {k: d for k, (d, _) in mod.OPTIONS.items()}
    except Exception:                     # a workload this checkout lacks: its knobs still count
        unsafe, defaults = (), {}
    found = causes(bugs, bug_knobs.REGISTRY, name, given, unsafe, defaults)
    if any(c.kind == "bug knob" for c in found):
        return found
    return found + [Cause("unsafe setting", label, reason) for label, reason in unsafe_settings.causes(spec)]
