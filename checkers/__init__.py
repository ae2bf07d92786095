"""Checkers: pure functions `check(history, opts) -> CheckResult` over a run's history.

Each module checks one family of claims; `REGISTRY` maps the names a workload asks for to a
`Checker` entry, whose module is imported on first use (a workload sharing a definition with its
checker does not import every checker, and networkx, into each worker). `toolkit` holds what
several checkers share.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.history import CheckResult, Op
from core.registry import Registry

CheckFn = Callable[[list[Op], "dict[str, Any] | None"], CheckResult]


@dataclass(frozen=True)
class Checker:
    """A checker's declaration: the module whose `function` is the check, one line of help, and the
    observers the runner must run for it (`observers`: names of harness/observers.py's entries, whose rows
    join the history; e.g. "bundle-owner")."""
    module: str
    help: str
    function: str = "check"
    observers: tuple[str, ...] = ()

    @property
    def check(self) -> CheckFn:
        return getattr(importlib.import_module(self.module), self.function)


REGISTRY: Registry[Checker] = Registry("checker", {
    "log": Checker("checkers.log", "lost, duplicated, diverging and reordered messages of a log"),
    "queue": Checker("checkers.queue", "lost, unexpected and duplicated messages of a queue"),
    "elle": Checker("checkers.elle", "Elle-style dependency cycles (G0, G1c, G-single, G2) over a log"),
    "fencing": Checker("checkers.fencing", "split-brain writers, writes past a ledger's close, ownership"),
    "perf": Checker("checkers.perf", "latency, throughput, availability and recovery per fault state"),
    "exactly-once": Checker("checkers.exactly_once", "a processor's outputs against its inputs, exactly once"),
    "linear": Checker("checkers.linear", "linearizability against a model (opts['model'], default cas-register)"),
    "ownership": Checker("checkers.ownership", "one owner per bundle at a time, boundaries that partition the "
                         "hash space, shedding rules, no serving without the lock", observers=("bundle-owner",)),
    "channel": Checker("checkers.channel", "the extensible load manager's state channel replayed by an oracle of "
                       "its conflict resolver: versions, the brokers' views, double owners, stuck in-flight "
                       "states, splits", observers=("bundle-owner",)),
    "balance": Checker("checkers.balance", "load per broker over time, time to a balanced cluster after brokers "
                       "leave or join, unloads and splits, per-topic unavailability during unloads"),
    "schema": Checker("checkers.schema", "schema versions of messages against the registry: lost-version, "
                      "unaccepted-version, divergence (brokers answering differently), incompatible-accepted, "
                      "version-conflict (two schemas under one version)"),
})


def observers(names: "Iterable[str]") -> set[str]:
    """The observers the registered checkers among `names` need the runner to run."""
    return {o for n in names if n in REGISTRY for o in REGISTRY[n].observers}


def select(wanted: Mapping[str, dict[str, Any]]) -> dict[str, tuple[CheckFn, dict[str, Any]]]:
    """{name: (check, opts)} for a workload's `checkers(spec)`: the wanted ones that are registered."""
    return {n: (REGISTRY[n].check, dict(o)) for n, o in wanted.items() if n in REGISTRY}


__all__ = ["Checker", "REGISTRY", "observers", "select"]
