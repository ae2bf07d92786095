"""A plugin for the ownership run test: workload `log-owned`, the `log` workload with the ownership
checker added, so the runner records the bundle locks while the log workload runs under faults."""
from __future__ import annotations

from typing import Any

import workloads.log as _log
from checkers import select
from workloads import REGISTRY, WorkloadEntry

DESCRIPTION = "the log workload with the ownership checker (test plugin)"
OPTIONS = _log.OPTIONS
keys = _log.keys
worker_count = _log.worker_count
start = _log.start
start_final = _log.start_final


def checkers(spec: Any = None) -> dict[str, Any]:
    out = _log.checkers(spec)
    out.update(select({"ownership": {}}))
    return out


REGISTRY.register("log-owned", WorkloadEntry(__name__), replace=True)
