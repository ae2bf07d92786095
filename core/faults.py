"""The fault-op grammar of nemesis histories, and the one fault timeline every reader builds from it.

The nemesis (process -1) journals a held fault X as `start-X` then `stop-X`, each an invoke and its
completion; `heal` (also `heal-all`, `stop`, `stop-all`, `stop-faults`, as Jepsen's nemeses write)
ends every fault; any other f (`kill`) is a one-shot fault. The rules, applied once here for the log
and perf checkers, the report and the Spark analysis:

- a period of X opens at its start's invocation; X is *in force* from the start's completion when
  that is ok or info (info: it may have taken effect); a failed start never took effect;
- a `stop-X` that completes ok or info ends the oldest open period of X (Jepsen's nemeses complete
  every op as info; ours journal info when an undo raised, noted as indeterminate); one that fails
  leaves X on, and says so in the period's notes;
- a heal that completes ok or info ends every open period; a failed one ends none;
- a one-shot fault is a point period from its invocation to its completion.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.history import FAIL, INFO, INVOKE, NEMESIS_PROCESS, OK

START, STOP, HEAL, ONE_SHOT = "start", "stop", "heal", ""
HEALTHY = "healthy"                     # the state with no fault in force
HEAL_FS = frozenset({"heal", "heal-all", "stop", "stop-all", "stop-faults"})


def start_f(name: str) -> str:
    """The f of the op that starts fault `name`."""
    return f"start-{name}"


def stop_f(name: str) -> str:
    """The f of the op that undoes fault `name`."""
    return f"stop-{name}"


def parse(f: str) -> tuple[str, str]:
    """(START | STOP | HEAL | ONE_SHOT, fault name) of a nemesis op's f ("" as the name of a heal)."""
    if f in HEAL_FS:
        return HEAL, ""
    if f.startswith("start-"):
        return START, f[6:]
    if f.startswith("stop-"):
        return STOP, f[5:]
    return ONE_SHOT, f


@dataclass(eq=False)
class FaultPeriod:
    """One occurrence of a fault, as the history tells it."""
    name: str
    start_ns: float                      # the start's invocation (its completion if no invoke was seen)
    started_ns: float | None = None      # the start's completion: in force from then, unless it failed
    stop_ns: float | None = None         # when it ended (a stop or heal completed); None: still on
    value: Any = None                    # the targets: the start's plan, then what it resolved
    start_op: Any = None                 # the start's completion (the op given to feed)
    stop_op: Any = None                  # the completion that ended it
    stop_invoked_ns: float | None = None   # an undo invoked and not (yet) completed
    stop_began_ns: float | None = None     # the invocation of the undo that ended it (its completion if none)
    failed: bool = False                 # the start failed: no effect
    point: bool = False                  # a one-shot fault
    notes: list[str] = field(default_factory=list)

    @property
    def in_force(self) -> bool:
        """Started (ok or info), not failed, not a point, not ended."""
        return self.started_ns is not None and not self.failed and not self.point and self.stop_ns is None

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def status(self) -> str:
        return "; ".join(self.notes)


def _err(error: str) -> str:
    return f": {error}" if error else ""


class FaultTimeline:
    """The fault periods and the fault state over time, fed the nemesis ops in time order.

    `periods` lists every period in start order; `state` is the state now ("healthy", or the names in
    force joined by "+"), and `seg_t` / `seg_s` the state from each change on (seg_t[0] = `neg`)."""

    def __init__(self, neg: float = float("-inf")):
        self.periods: list[FaultPeriod] = []
        self.state = HEALTHY
        self.seg_t: list[float] = [neg]
        self.seg_s: list[str] = [HEALTHY]
        self._open: dict[str, list[FaultPeriod]] = {}      # name -> open periods, oldest first
        self._invoked: dict[str, FaultPeriod] = {}          # start f -> the period its invoke opened
        self._one_shot: dict[str, float] = {}               # one-shot f -> its invocation time

    def feed(self, t: float, type_: str, f: str, op: Any = None, value: Any = None,
             error: str = "") -> None:
        """One nemesis op (an invoke or a completion); `op`, when given, supplies value and error."""
        if op is not None:
            value, error = getattr(op, "value", value), getattr(op, "error", error) or ""
        kind, name = parse(f)
        if kind == START:
            self._start(t, type_, f, name, op, value, error)
        elif kind == STOP:
            self._stop(t, type_, name, op, error)
        elif kind == HEAL:
            self._heal(t, type_, f, op, error)
        elif type_ == INVOKE:
            self._one_shot[f] = t
        else:
            p = FaultPeriod(name, self._one_shot.pop(f, t), started_ns=t, stop_ns=t, value=value, start_op=op,
                            stop_op=op, failed=type_ == FAIL, point=True)
            if type_ != OK:
                p.note(f"{type_}{_err(error)}")
            self.periods.append(p)

    @classmethod
    def of_history(cls, ops: Any) -> "FaultTimeline":
        """The timeline of a history's nemesis ops (in time order)."""
        tl = cls()
        for op in ops:
            if op.process == NEMESIS_PROCESS:
                tl.feed(op.time_ns, op.type, op.f, op)
        return tl

    def tally(self) -> dict[str, Any]:
        """What the nemesis did, by fault name: {"took_effect": {name: n}, "failed": {name: n},
        "first_error": {name: the first failed start's error}} (one-shot faults counted by their
        outcome too). A run whose faults all failed tested nothing under faults: results.json and the
        run's last lines say so."""
        took: dict[str, int] = {}
        failed: dict[str, int] = {}
        first: dict[str, str] = {}
        for p in self.periods:
            if p.failed:
                failed[p.name] = failed.get(p.name, 0) + 1
                err = getattr(p.start_op, "error", "") or ""
                first.setdefault(p.name, err)
            elif p.started_ns is not None:
                took[p.name] = took.get(p.name, 0) + 1
        return {"took_effect": took, "failed": failed, "first_error": first}

    def open_periods(self) -> list[FaultPeriod]:
        """Periods not ended (failed starts excluded), in start order."""
        return [p for p in self.periods if p.stop_ns is None and not p.failed and not p.point]

    def occurrences(self) -> list[FaultPeriod]:
        """Periods that took effect (ok or info starts of held faults), in start order."""
        return [p for p in self.periods if p.started_ns is not None and not p.failed and not p.point]

    # -- the rules -------------------------------------------------------------------------
    def _start(self, t: float, type_: str, f: str, name: str, op: Any, value: Any, error: str) -> None:
        if type_ == INVOKE:
            p = FaultPeriod(name, t, value=value)
            self._invoked[f] = p
            self._open.setdefault(name, []).append(p)
            self.periods.append(p)
            return
        p = self._invoked.pop(f, None)
        if p is None:                                     # a completion without its invocation
            p = FaultPeriod(name, t)
            self._open.setdefault(name, []).append(p)
            self.periods.append(p)
        if value is not None:
            p.value = value
        p.start_op = op
        if type_ == FAIL:
            p.failed, p.stop_ns, p.started_ns = True, t, None
            self._drop_open(p)
            p.note(f"start failed{_err(error)}: no effect")
            return
        if type_ == INFO:
            p.note(f"start indeterminate{_err(error)}")
        p.started_ns = t
        self._state_changed(t)

    def _stop(self, t: float, type_: str, name: str, op: Any, error: str) -> None:
        stack = self._open.get(name)
        if not stack:
            return
        p = stack[0]
        if type_ == INVOKE:
            p.stop_invoked_ns = t
            return
        began, p.stop_invoked_ns = p.stop_invoked_ns, None
        if type_ == FAIL:
            p.note(f"stop failed{_err(error)}: still on")
            return
        if type_ == INFO:
            p.note(f"stop indeterminate{_err(error)}")
        stack.pop(0)
        p.stop_ns, p.stop_op, p.stop_began_ns = t, op, t if began is None else began
        self._state_changed(t)

    def _heal(self, t: float, type_: str, f: str, op: Any, error: str) -> None:
        open_ = [p for stack in self._open.values() for p in stack]
        for p in open_:
            if type_ == INVOKE:
                p.stop_invoked_ns = t
                continue
            began, p.stop_invoked_ns = p.stop_invoked_ns, None
            if type_ == FAIL:
                p.note(f"{f} failed{_err(error)}: still on")
            else:
                p.stop_ns, p.stop_op, p.stop_began_ns = t, op, t if began is None else began
                p.note(f"ended by {f}")
        if type_ != INVOKE and type_ != FAIL:
            self._open.clear()
            self._state_changed(t)

    def _drop_open(self, p: FaultPeriod) -> None:
        stack = self._open.get(p.name)
        if stack and p in stack:
            stack.remove(p)

    def _state_changed(self, t: float) -> None:
        new = "+".join(sorted({p.name for stack in self._open.values() for p in stack if p.in_force})) or HEALTHY
        if new == self.state:
            return
        self.state = new
        if self.seg_t[-1] == t:
            self.seg_s[-1] = new
        else:
            self.seg_t.append(t)
            self.seg_s.append(new)
