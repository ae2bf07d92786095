"""Checkers: pure functions `check(history, opts) -> CheckResult` over a run's history.

Each module checks one family of claims; `CHECKERS` maps the names a workload lists to them.
"""
from __future__ import annotations

from checkers import fencing, log, perf

CHECKERS = {"log": log.check, "fencing": fencing.check, "perf": perf.check}

__all__ = ["CHECKERS", "log"]
