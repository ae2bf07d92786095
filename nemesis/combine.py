"""The nemesis process: faults started and stopped on a schedule, journaled as history ops.

Fault names (`NAME` or `NAME:TARGET`) come from `nemesis.registry`. The runner draws faults with
the run's rng, so a seed replays the same faults on the same layout: one at a time by default (rest,
start, hold, stop), or up to `overlap` at once (Jepsen's combined nemesis: a new fault every
`interval`, each held `interval * overlap`), or the faults and times of a schedule. Every op is process -1: `start-<name>` / `stop-<name>` invoke then
ok, or `fail` with the reason when the fault could not be applied (nothing was done), or `info`
when it was half done or its undo failed; `heal` at the end.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from clusters.deploy.backend import Cluster
from core.faults import start_f, stop_f
from core.history import FAIL, INFO, INVOKE, NEMESIS_PROCESS, OK, Journal, Op
from nemesis.base import Nemesis, NemesisContext
from nemesis.registry import make

log = logging.getLogger(__name__)


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _key(value: Any, default: str = "") -> str:
    return str(value.get("topic", default)) if isinstance(value, dict) else default


def _node(value: Any) -> str:
    if isinstance(value, dict):
        for k in ("node", "owner", "broker"):
            if isinstance(value.get(k), str):
                return value[k]
    return ""


@dataclass(frozen=True)
class Scheduled:
    """One entry of a fault schedule: start `name` `at` seconds after the faults begin, stop it
    `hold` seconds later (None: at the end); `grudge` for the grudge nemesis."""
    at: float
    name: str
    hold: float | None = None
    grudge: dict[str, list[str]] | None = None
    # the fault's draws and targets as a run journaled them (a replay): used instead of new draws
    plan: dict[str, Any] | None = None


class NemesisRunner:
    """Runs faults against a cluster until told to stop, journaling every start and stop."""

    def __init__(self, cluster: Cluster, names: list[str], interval: float, rng: random.Random,
                 journal: Journal, topics: list[str], *, nemeses: dict[str, Nemesis] | None = None,
                 overlap: int = 1, schedule: list[Scheduled] | None = None,
                 grudge: dict[str, list[str]] | None = None):
        if not names and not schedule:
            raise ValueError("no nemesis to run; give at least one name or a schedule")
        if interval < 0:
            raise ValueError(f"interval must be >= 0, got {interval}")
        if overlap < 1:
            raise ValueError(f"overlap must be >= 1, got {overlap}")
        self.cluster = cluster
        self.names = list(names)             # repeats weigh the choice
        self.interval = float(interval)
        self.overlap = int(overlap)
        self.schedule = sorted(schedule or [], key=lambda e: e.at)
        self.journal = journal
        self.ctx = NemesisContext(cluster=cluster, rng=rng, topics=list(topics), grudge=dict(grudge or {}))
        self.nemeses: dict[str, Nemesis] = dict(nemeses or {})
        for n in self.names:
            if n not in self.nemeses:
                self.nemeses[n] = make(n)
        self._active: list[Nemesis] = []     # started (or half-started) and not yet undone
        self._lock = threading.RLock()

    # -- the schedule ------------------------------------------------------------------
    def run(self, stop: threading.Event, max_cycles: int | None = None) -> None:
        """Blocking: run the faults until `stop` is set (or max_cycles faults started). Returns with
        no fault of ours active, unless undoing one failed twice (journaled as info; `active()` lists
        it and `heal()` retries it)."""
        try:
            if self.schedule:
                self._run_schedule(stop)
            elif self.overlap == 1:
                self._run_serial(stop, max_cycles)
            else:
                self._run_overlapping(stop, max_cycles)
        finally:
            # Undo what is in force (a no-op after a normal cycle). An undo that fails again (a node
            # that will not restart) is journaled as info and left for heal(), which retries it.
            self.stop_faults()

    def _run_serial(self, stop: threading.Event, max_cycles: int | None) -> None:
        """Rest `interval`, start a random fault, hold it `interval`, stop it; repeat."""
        cycles = 0
        while max_cycles is None or cycles < max_cycles:
            if stop.wait(self.interval):
                break
            nem = self.start_fault()
            cycles += 1
            if nem.is_active():
                stop.wait(self.interval)
                self.stop_faults()

    def _run_overlapping(self, stop: threading.Event, max_cycles: int | None) -> None:
        """Every `interval` a random fault not already in force starts (while fewer than `overlap`
        are); each is stopped `interval * overlap` after its start, so faults overlap."""
        hold = self.interval * self.overlap
        deadlines: dict[int, float] = {}     # id(nemesis) -> when to stop it
        cycles = 0
        next_start = time.monotonic() + self.interval
        while not stop.is_set():
            now = time.monotonic()
            for nem in list(self._active):
                if deadlines.get(id(nem), now) <= now:
                    self._stop(nem)
                    deadlines.pop(id(nem), None)
            if now >= next_start and (max_cycles is None or cycles < max_cycles):
                with self._lock:
                    idle = [n for n in self.names if not self.nemeses[n].is_active()]
                    if idle and len(self._active) < self.overlap:
                        name = self.ctx.rng.choice(idle)
                        nem = self.nemeses[name]
                        self._start(nem)
                        cycles += 1
                        if nem.is_active():
                            deadlines[id(nem)] = time.monotonic() + hold
                next_start = now + self.interval
            if max_cycles is not None and cycles >= max_cycles and not self._active:
                break
            wake = min([next_start, *deadlines.values()])
            stop.wait(max(0.0, wake - time.monotonic()))

    def _run_schedule(self, stop: threading.Event) -> None:
        """Start each scheduled fault at its time and stop it after its hold (or at the end)."""
        t0 = time.monotonic()
        pending = list(self.schedule)
        running: list[tuple[float, Nemesis]] = []
        while not stop.is_set() and (pending or running):
            now = time.monotonic() - t0
            for due, nem in list(running):
                if due <= now:
                    running.remove((due, nem))
                    if nem in self._active:
                        self._stop(nem)
            while pending and pending[0].at <= now:
                entry = pending.pop(0)
                nem = make(entry.name, grudge=entry.grudge)
                self._start(nem, entry.plan)
                if nem.is_active() and entry.hold is not None:
                    running.append((entry.at + entry.hold, nem))
            wakes = [d for d, _ in running] + ([pending[0].at] if pending else [])
            if not wakes:                    # only faults held until the end are left
                stop.wait()
                break
            stop.wait(max(0.0, min(wakes) - (time.monotonic() - t0)))

    def start_fault(self, name: str | None = None) -> Nemesis:
        """Start one fault now (a random one of `names` if None), journaled; returns its nemesis.

        Faults whose undo failed earlier are retried first. Check `is_active()` / `applied` for the
        outcome: a fault that failed is journaled as fail or info and (unless half done) is not active."""
        with self._lock:
            self.stop_faults()
            name = self.ctx.rng.choice(self.names) if name is None else name
            if name not in self.nemeses:
                self.nemeses[name] = make(name)
            nem = self.nemeses[name]
            self._start(nem)
            return nem

    def stop_faults(self) -> bool:
        """Undo every active fault (journaled); True if none is left active."""
        with self._lock:
            for nem in list(self._active):
                self._stop(nem)
            return not self._active

    def heal(self) -> None:
        """Undo every active fault, then heal the network and resume / restart every server node
        that is paused or dead. Each undo is journaled (stop-<name>), then one `heal` op."""
        with self._lock:
            self.stop_faults()
            inv = self._journal(Op(process=NEMESIS_PROCESS, type=INVOKE, f="heal"))
            resumed, started, errors = [], [], []
            try:
                self.cluster.heal()
            except Exception as e:
                errors.append(f"network: {_error(e)}")
            try:
                nodes = [n for n in self.cluster.nodes() if n.role != "client"]
            except Exception as e:
                nodes = []
                errors.append(f"inventory: {_error(e)}")
            for n in nodes:
                try:
                    if n.alive and n.paused:
                        self.cluster.resume(n.name)
                        resumed.append(n.name)
                    elif not n.alive and n.pid is not None:
                        self.cluster.start(n.name)
                        started.append(n.name)
                except Exception as e:
                    errors.append(f"{n.name}: {_error(e)}")
            value = {"healed": True, "resumed": resumed, "started": started}
            if errors:
                self._journal(inv.complete(INFO, value=value, error="; ".join(errors)))
            else:
                self._journal(inv.complete(OK, value=value))

    def active(self) -> list[str]:
        """Descriptions of the faults in force now (for a progress display)."""
        with self._lock:
            return [nem.describe() for nem in self._active]

    # -- one fault --------------------------------------------------------------------
    def _journal(self, op: Op) -> Op:
        try:
            return self.journal.append(op)
        except Exception:          # a full disk must not leave a fault in force
            log.exception("journaling nemesis op %s", op.f)
            return op

    def _start(self, nem: Nemesis, given: dict[str, Any] | None = None) -> None:
        """Start `nem` with new draws (`choose`), or with a plan a run journaled (`given`: a replay).
        The invoke journals the plan, with the whole fault name (`fault`: kill:owner) when it has a
        parameter, so that a replay knows which fault to make."""
        with self._lock:
            f = start_f(nem.name)
            full = getattr(nem, "fault_name", nem.name)
            named = {"fault": full} if full != nem.name else {}
            try:
                plan = dict(given) if given is not None else nem.choose(self.ctx)
            except Exception as e:           # nothing was done: the fault failed
                log.warning("nemesis %s could not start: %s", nem.name, _error(e))
                inv = self._journal(Op(process=NEMESIS_PROCESS, type=INVOKE, f=f, value=named or None))
                self._journal(inv.complete(FAIL, error=_error(e)))
                return
            inv = self._journal(Op(process=NEMESIS_PROCESS, type=INVOKE, f=f, key=_key(plan),
                                   value={**plan, **named} if isinstance(plan, dict) else plan, node=_node(plan)))
            try:
                value = nem.start(self.ctx, plan)
            except Exception as e:
                log.warning("nemesis %s failed to start: %s", nem.name, _error(e))
                if not nem.is_active():      # refused before any side effect: a failed fault op
                    self._journal(inv.complete(FAIL, error=_error(e), value=plan))
                    return
                # half done: indeterminate, and it must still be undone
                self._journal(inv.complete(INFO, error=_error(e), value=nem.applied))
                if nem not in self._active:
                    self._active.append(nem)
                return
            self._active.append(nem)
            self._journal(inv.complete(OK, value=value, key=_key(value, inv.key), node=_node(value) or inv.node))

    def _stop(self, nem: Nemesis) -> bool:
        with self._lock:
            applied = nem.applied
            inv = self._journal(Op(process=NEMESIS_PROCESS, type=INVOKE, f=stop_f(nem.name),
                                   key=_key(applied), node=_node(applied)))
            try:
                value = nem.stop(self.ctx)
            except Exception as e:
                log.warning("nemesis %s failed to stop: %s", nem.name, _error(e))
                self._journal(inv.complete(INFO, error=_error(e)))
                return False
            if nem in self._active:
                self._active.remove(nem)
            self._journal(inv.complete(OK, value=value))
            return True
