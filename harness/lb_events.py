"""The load balancer's decisions as history rows: each `LB_EVENT {json}` line of a collected broker log
(nodes/<name>/node.log) becomes an `lb-event` row of journals/lb-events.jsonl (core/observations.py).

A broker logs the event's `mono_ns` (CLOCK_MONOTONIC, which libfaketime leaves alone and every node of
one machine shares with the runner), so the row's time is `mono_ns - t0_ns`, the history's clock. An
event without it, or a line that is not JSON, is counted and skipped, never guessed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core import store
from core.history import OBSERVER_PROCESS, OK, Op, write_jsonl
from core.observations import LB_EVENT

MARKER = "LB_EVENT "
JOURNAL_NAME = "lb-events.jsonl"
MAX_LINE = 1 << 16


def import_lb_events(run_dir: Path | str, t0_ns: int) -> dict[str, int]:
    """Write journals/lb-events.jsonl from the run's node logs (replacing it); counts of what was read."""
    run_dir = Path(run_dir)
    rows: list[Op] = []
    counts = {"events": 0, "untimed": 0, "malformed": 0}
    for log in sorted((run_dir / store.NODES).glob("*/node.log")):
        try:
            f = open(log, encoding="utf-8", errors="replace")
        except OSError:
            continue
        with f:
            for line in f:
                at = line.find(MARKER)
                if at < 0:
                    continue
                try:
                    ev: Any = json.loads(line[at + len(MARKER):][:MAX_LINE])
                except ValueError:
                    counts["malformed"] += 1
                    continue
                if not isinstance(ev, dict):
                    counts["malformed"] += 1
                    continue
                mono = ev.get("mono_ns")
                if not isinstance(mono, int) or isinstance(mono, bool):
                    counts["untimed"] += 1
                    continue
                ev.setdefault("logged_by", log.parent.name)
                rows.append(Op(process=OBSERVER_PROCESS, type=OK, f=LB_EVENT, key=str(ev.get("bundle") or ""),
                               value=ev, time_ns=mono - t0_ns))
                counts["events"] += 1
    rows.sort(key=lambda op: op.time_ns)
    if rows:
        write_jsonl(rows, store.journal_dir(run_dir) / JOURNAL_NAME)
    return counts
