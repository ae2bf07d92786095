"""Workloads: one module per workload with its op generator, its client code and its checkers.

A workload module provides (see workloads/log.py; `workloads.base.Context` is what it is handed):
  DESCRIPTION                 one line for `pulsar-chaos run --help`
  OPTIONS                     {name: (default, one-line help)}; spec.options may set them (the default's type)
  keys(spec, run_id)          the topics (znodes, ledgers) it uses; topic-targeted faults pick from them
  worker_count(spec)          how many worker processes run its client threads
  prepare(ctx)                optional, in the runner after deploy (namespace policies and the like)
  start(ctx)                  in worker process ctx.worker: start its client threads, return them
  start_final(ctx)            in the final-reads process: start the final reads / drains, return the threads
  checkers(spec)              {name: (check function, opts)} run over the history
"""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

# name -> module; the order is the order in --help
REGISTRY = {
    "log": "workloads.log",
    "queue": "workloads.queue",
    "subscriptions": "workloads.subscriptions",
    "exactly-once": "workloads.exactly_once",
    "ledger": "workloads.ledger",
    "register": "workloads.register",
}


def available() -> tuple[str, ...]:
    """The workloads whose module exists in this checkout."""
    out = []
    for name, mod in REGISTRY.items():
        if importlib.util.find_spec(mod) is not None:
            out.append(name)
    return tuple(out)


def get(name: str) -> ModuleType:
    if name not in REGISTRY:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(available())}")
    return importlib.import_module(REGISTRY[name])


def options(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The workload's options: its defaults overlaid with `given` (validated by the spec)."""
    out = {k: d for k, (d, _) in getattr(get(name), "OPTIONS", {}).items()}
    out.update(given or {})
    return out
