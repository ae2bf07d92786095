"""Checkers: pure functions `check(history, opts) -> CheckResult` over a run's history.

Each module checks one family of claims; `CHECKERS` maps the names a workload lists to them.
"""
from __future__ import annotations

from checkers import fencing, log, perf

CHECKERS = {"log": log.check, "fencing": fencing.check, "perf": perf.check}
CHECKERS["exactly-once"] = __import__("checkers.exactly_once", fromlist=["check"]).check
CHECKERS["queue"] = __import__("checkers.queue", fromlist=["check"]).check
CHECKERS["elle"] = __import__("checkers.elle", fromlist=["check"]).check
CHECKERS["linear"] = __import__("checkers.linear", fromlist=["check"]).check   # opts["model"], default cas-register

__all__ = ["CHECKERS", "log"]
