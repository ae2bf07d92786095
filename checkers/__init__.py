"""Checkers: pure functions `check(history, opts) -> CheckResult` over a run's history.

Each module checks one family of claims; `CHECKERS` maps the names a workload lists to them.
"""
from __future__ import annotations

from checkers import elle, exactly_once, fencing, linear, log, perf, queue

CHECKERS = {
    "log": log.check,
    "queue": queue.check,
    "elle": elle.check,
    "fencing": fencing.check,
    "perf": perf.check,
    "exactly-once": exactly_once.check,
    "linear": linear.check,            # opts["model"], default cas-register
}

__all__ = ["CHECKERS"]
