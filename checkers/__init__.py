"""Checkers: pure functions `check(history, opts) -> CheckResult` over a run's history.

Each module checks one family of claims; `CHECKERS` maps the names a workload lists to them.
"""
from __future__ import annotations

from checkers import log

CHECKERS = {"log": log.check}

__all__ = ["CHECKERS", "log"]
