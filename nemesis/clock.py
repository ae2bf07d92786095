"""Clock faults: a broker's or bookie's wall clock bumped by an offset for the hold, or strobed
between two offsets, through `cluster.set_clock` (nodes deployed with fake clocks: libfaketime).

Only the wall clock moves (time.time(), datetime.now()); the monotonic clock every timer of the
reference system runs on does not, as with a real clock step. docs/architecture.md ("Clock skew")
lists what reads the wall clock and what a skew does to each.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from nemesis.base import Nemesis, NemesisContext, NemesisError
from nemesis.targets import draw, plan_nodes

ROLES = ("bookie", "broker")           # the roles a deployment can fake the clock of
MODES = ("bump", "strobe")
OFFSET_RANGE_S = (1.0, 300.0)          # |offset| drawn uniformly from this range, either sign
PERIOD_RANGE_MS = (1000, 3000)         # strobe period; libfaketime reads the offset once a second
STROBE_LIMIT_S = 900.0                 # a strobe thread flips for at most this long


class _Strobe(threading.Thread):
    """Flips the nodes' clocks between two offsets every period until stopped (or the limit)."""

    def __init__(self, ctx: NemesisContext, names: list[str], offsets: list[float], period_s: float,
                 limit_s: float):
        super().__init__(name="clock-strobe", daemon=True)
        self.ctx, self.names, self.offsets, self.period_s = ctx, names, offsets, period_s
        self.deadline = time.monotonic() + limit_s
        self.halt = threading.Event()
        self.flips = 0
        self.errors: list[str] = []

    def run(self) -> None:
        current = 1                                   # start() set offsets[1]
        while not self.halt.wait(self.period_s) and time.monotonic() < self.deadline:
            current ^= 1
            for name in self.names:
                try:
                    self.ctx.cluster.set_clock(name, self.offsets[current])
                except Exception as e:  # noqa: BLE001 - recorded; stop() resets the clock anyway
                    if len(self.errors) < 10:
                        self.errors.append(f"{name}: {type(e).__name__}: {e}")
            self.flips += 1


class ClockNemesis(Nemesis):
    """Skew a random broker's or bookie's wall clock (or those of a TARGET selector: `clock:owner`,
    `clock:all-bookie`, `clock:broker-2`), in one of two modes drawn with the run's rng:

    - bump: the clock jumps by an offset of 1..300 s (either sign) for the whole hold;
    - strobe: a thread flips it between true time and such an offset every 1..3 s.

    stop() ends the strobe and sets the offset back to 0. Journaled: node(s), mode, offsets."""

    name = "clock"

    def __init__(self, selector: str | None = None, mode: str | None = None,
                 offset_range_s: tuple[float, float] = OFFSET_RANGE_S,
                 period_range_ms: tuple[int, int] = PERIOD_RANGE_MS, strobe_limit_s: float = STROBE_LIMIT_S):
        super().__init__()
        if mode is not None and mode not in MODES:
            raise ValueError(f"unknown clock mode {mode!r}; use one of {', '.join(MODES)}")
        lo, hi = offset_range_s
        if not 0 <= lo <= hi:
            raise ValueError(f"offset range {offset_range_s} must be 0 <= low <= high")
        self.selector, self.mode = selector, mode
        self.offset_range_s, self.period_range_ms = (float(lo), float(hi)), period_range_ms
        self.strobe_limit_s = strobe_limit_s
        self._set: list[str] = []             # nodes whose clock this fault moved
        self._strobe: _Strobe | None = None

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        rng = ctx.rng
        if self.selector is not None:
            plan: dict[str, Any] = dict(draw(ctx, self.selector))
        else:
            pool = ctx.names(*ROLES)          # the layout's brokers and bookies, live or not
            if not pool:
                raise NemesisError("clock: the cluster has no broker or bookie")
            plan = {"node": rng.choice(pool)}
        # the same draws in every mode, so a seed replays the same faults
        mode = rng.choice(MODES)
        magnitude = rng.uniform(*self.offset_range_s)
        sign = rng.choice((-1.0, 1.0))
        period_ms = rng.randint(*self.period_range_ms)
        offset = round(sign * magnitude, 3)
        plan["mode"] = self.mode or mode
        if plan["mode"] == "bump":
            plan["offset_s"] = offset
        else:
            plan["offsets"] = [0.0, offset]
            plan["period_ms"] = period_ms
        return plan

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        names, extra = plan_nodes(ctx, plan)
        nodes = [ctx.cluster.node(n) for n in names]
        for node in nodes:
            if node.role not in ROLES:
                raise NemesisError(f"clock: {node.name} is a {node.role}; only brokers' and bookies' "
                                   "clocks can be skewed")
        mode = plan["mode"]
        if mode == "bump":
            first, detail = float(plan["offset_s"]), {"offset_s": float(plan["offset_s"])}
        elif mode == "strobe":
            offsets = [float(x) for x in plan["offsets"]]
            if len(offsets) != 2 or int(plan["period_ms"]) < 1:
                raise NemesisError(f"clock: a strobe needs two offsets and a period, got {plan}")
            first, detail = offsets[1], {"offsets": offsets, "period_ms": int(plan["period_ms"])}
        else:
            raise NemesisError(f"clock: unknown mode {mode!r}")
        value: dict[str, Any] = {"node": nodes[0].name, "role": nodes[0].role, "mode": mode, **detail, **extra}
        if len(nodes) > 1:
            value["nodes"] = [n.name for n in nodes]
        self.applied = value                  # before the first side effect
        self._set = []
        try:
            for node in nodes:
                ctx.cluster.set_clock(node.name, first)
                self._set.append(node.name)
        except BaseException:
            if not self._set:                 # nothing moved: the fault was not applied
                self.applied = None
            raise
        if mode == "strobe":
            self._strobe = _Strobe(ctx, list(self._set), detail["offsets"], detail["period_ms"] / 1000.0,
                                   self.strobe_limit_s)
            self._strobe.start()
        return value

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        out: dict[str, Any] = {"node": self.applied["node"], "mode": self.applied["mode"]}
        if self._strobe is not None:
            strobe, self._strobe = self._strobe, None
            strobe.halt.set()
            strobe.join(strobe.period_s + 30.0)
            out["flips"] = strobe.flips
            if strobe.errors:
                out["strobe_errors"] = strobe.errors
        for name in list(self._set):          # an error here leaves the fault active for a retry
            ctx.cluster.set_clock(name, 0.0)
        out["reset"] = list(self._set)
        self._set = []
        self.applied = None
        return out

    def describe(self) -> str:
        if not self.applied:
            return self.name
        a = self.applied
        who = ", ".join(a.get("nodes") or [a["node"]])
        if a["mode"] == "bump":
            return f"clock: {who} {a['offset_s']:+.1f} s"
        return f"clock: {who} strobing {a['offsets'][0]:+.1f} / {a['offsets'][1]:+.1f} s every {a['period_ms']} ms"
