"""Checkers: pure functions `check(history, opts) -> CheckResult` over a run's history.

Each module checks one family of claims; `CHECKERS` maps the names a workload lists to them. It is
built on first use, so that importing one checker module (a workload sharing a definition with its
checker) does not import them all.
"""
from __future__ import annotations

import importlib
from typing import Any

_MODULES = {"log": "log", "queue": "queue", "elle": "elle", "fencing": "fencing", "perf": "perf",
            "exactly-once": "exactly_once",
            "linear": "linear"}            # opts["model"], default cas-register


def __getattr__(name: str) -> Any:
    if name == "CHECKERS":
        table = {k: importlib.import_module(f"checkers.{m}").check for k, m in _MODULES.items()}
        globals()["CHECKERS"] = table
        return table
    raise AttributeError(name)


__all__ = ["CHECKERS"]
