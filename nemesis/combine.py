"""The nemesis process: a schedule of faults (start, hold, stop, rest) journaled as history ops.

One fault at a time, chosen with the run's rng, so a seed replays the same faults on the same layout.
Every op is process -1: `start-<name>` / `stop-<name>` invoke then ok (or info with the error), and
`heal` at the end.
"""
from __future__ import annotations

import logging
import random
import threading
from typing import Any

from clusters.deploy.backend import Cluster
from harness.history import INFO, INVOKE, NEMESIS_PROCESS, OK, Journal, Op
from nemesis.base import Nemesis, NemesisContext
from nemesis.partition import PartitionNemesis, ZkIsolateNemesis
from nemesis.process import KillNemesis, PauseNemesis

log = logging.getLogger(__name__)

FACTORIES = {
    "partition": lambda: PartitionNemesis("halves"),
    "partition-one": lambda: PartitionNemesis("one"),
    "partition-bridge": lambda: PartitionNemesis("bridge"),
    "partition-ring": lambda: PartitionNemesis("majorities-ring"),
    "kill": KillNemesis,
    "pause": PauseNemesis,
    "zk-isolate": ZkIsolateNemesis,
}


def make(name: str) -> Nemesis:
    try:
        return FACTORIES[name]()
    except KeyError:
        raise ValueError(f"unknown nemesis {name!r}; use one of {', '.join(FACTORIES)}") from None


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _key(value: Any, default: str = "") -> str:
    return str(value.get("topic", default)) if isinstance(value, dict) else default


def _node(value: Any) -> str:
    if isinstance(value, dict):
        for k in ("node", "owner"):
            if isinstance(value.get(k), str):
                return value[k]
    return ""


class NemesisRunner:
    """Runs faults against a cluster until told to stop, journaling every start and stop."""

    def __init__(self, cluster: Cluster, names: list[str], interval: float, rng: random.Random,
                 journal: Journal, topics: list[str], *, nemeses: dict[str, Nemesis] | None = None):
        if not names:
            raise ValueError("no nemesis to run; give at least one name")
        if interval < 0:
            raise ValueError(f"interval must be >= 0, got {interval}")
        self.cluster = cluster
        self.names = list(names)             # repeats weigh the choice
        self.interval = float(interval)
        self.journal = journal
        self.ctx = NemesisContext(cluster=cluster, rng=rng, topics=list(topics))
        self.nemeses: dict[str, Nemesis] = dict(nemeses or {})
        for n in self.names:
            if n not in self.nemeses:
                self.nemeses[n] = make(n)
        self._active: list[Nemesis] = []     # started (or half-started) and not yet undone
        self._lock = threading.RLock()

    # -- the schedule ------------------------------------------------------------------
    def run(self, stop: threading.Event, max_cycles: int | None = None) -> None:
        """Blocking: rest `interval`, start a random fault, hold it `interval`, stop it; repeat until
        `stop` is set (or max_cycles faults ran). Returns with no fault of ours active, unless undoing
        one failed twice (journaled as info; `active()` lists it and `heal()` retries it)."""
        cycles = 0
        try:
            while max_cycles is None or cycles < max_cycles:
                if stop.wait(self.interval):
                    break
                nem = self.start_fault()
                cycles += 1
                if nem.is_active():
                    stop.wait(self.interval)
                    self.stop_faults()
        finally:
            # Undo what is in force (a no-op after a normal cycle). An undo that fails again (a node
            # that will not restart) is journaled as info and left for heal(), which retries it.
            self.stop_faults()

    def start_fault(self, name: str | None = None) -> Nemesis:
        """Start one fault now (a random one of `names` if None), journaled; returns its nemesis.

        Faults whose undo failed earlier are retried first. Check `is_active()` / `applied` for the
        outcome: a fault that failed is journaled as info and (unless half done) is not active."""
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

    def _start(self, nem: Nemesis) -> None:
        with self._lock:
            f = f"start-{nem.name}"
            try:
                plan = nem.choose(self.ctx)
            except Exception as e:
                inv = self._journal(Op(process=NEMESIS_PROCESS, type=INVOKE, f=f))
                self._journal(inv.complete(INFO, error=_error(e)))
                return
            inv = self._journal(Op(process=NEMESIS_PROCESS, type=INVOKE, f=f, key=_key(plan),
                                   value=plan, node=_node(plan)))
            try:
                value = nem.start(self.ctx, plan)
            except Exception as e:
                log.warning("nemesis %s failed to start: %s", nem.name, _error(e))
                self._journal(inv.complete(INFO, error=_error(e),
                                           value=nem.applied if nem.applied is not None else plan))
                if nem.is_active() and nem not in self._active:   # half done: it must still be undone
                    self._active.append(nem)
                return
            self._active.append(nem)
            self._journal(inv.complete(OK, value=value, key=_key(value, inv.key), node=_node(value) or inv.node))

    def _stop(self, nem: Nemesis) -> bool:
        with self._lock:
            applied = nem.applied
            inv = self._journal(Op(process=NEMESIS_PROCESS, type=INVOKE, f=f"stop-{nem.name}",
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
