"""Disk-corruption faults of a bookie's files, beside `disk-wipe` (nemesis/lifecycle.py), as Jepsen's
newest file nemeses have them (bit flips, truncation):

- `disk-corrupt[:TARGET]`: kill one bookie the target selector resolves to (default a random bookie;
  `ledger-bookies` one of the bookies of a topic's current ledger's last fragment; a bookie's name),
  flip 16 bits in the last quarter of its newest entry log, and start it again at once, so that it
  serves reads of the damaged records (its index still lists them);
- `disk-truncate[:TARGET]`: the same with the newest entry log cut at a point of its last quarter.

The damage stays (nothing undoes a corrupted disk): `stop()` only starts the bookie again if it did
not come up. The start op records the node, its old and new pid, the file, its sizes before and after
and the offsets damaged (`Cluster.corrupt`, clusters/bookie/corrupt.py), whether it came up and its
log's last line. The points are drawn in `choose()` (seeded, repeatable). A correct bookie answers a
read of a damaged record with an error, never "no such entry" (apache/bookkeeper#2908); the knob
`bk.corrupt_log_says_nosuchentry` restores the bug.
"""
from __future__ import annotations

from typing import Any

from clusters.deploy.backend import ClusterError
from nemesis import targets
from nemesis.base import Nemesis, NemesisContext, NemesisError
from nemesis.lifecycle import _last_line, restart_if_down, start_again

FLIPS = 16


class DiskCorruptNemesis(Nemesis):
    """Kill a bookie, damage its newest entry log (`mode` "bitflip" or "truncate"), start it again.

    param: a target selector (nemesis/targets.py), default `bookie`; one bookie of what it resolves to
    is picked by a draw made in choose()."""

    def __init__(self, mode: str, param: str | None = None):
        super().__init__()
        self.mode = mode
        self.name = "disk-corrupt" if mode == "bitflip" else "disk-truncate"
        self.selector = param or "bookie"

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        plan = targets.draw(ctx, self.selector)
        return {**plan, "pick": ctx.rng.random(), "draws": [ctx.rng.random() for _ in range(FLIPS)]}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        name, found = targets.pick_running(ctx, self.name, self.selector, plan, ("bookie",), "bookie",
                                           "bookie, ledger-bookies or a bookie's name")
        node = ctx.cluster.node(name)
        value: dict[str, Any] = {"node": name, "old_pid": node.pid, "selector": self.selector, "target": found,
                                 "mode": self.mode, "corrupted": None, "came_up": False, "error": None}
        self.applied = value
        ctx.cluster.kill(name)
        try:
            value["corrupted"] = ctx.cluster.corrupt(name, self.mode, list(plan.get("draws") or [0.5]), FLIPS)
        except ClusterError as e:          # nothing to damage (no entry log yet): the bookie back as it was
            self.applied = None
            try:
                ctx.cluster.start(name)
            except ClusterError:
                pass
            raise NemesisError(f"{self.name}: {e}") from None
        node = start_again(ctx, name, value)
        value["last_log_line"] = _last_line(node.log)
        return value

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        name = self.applied["node"]
        node = ctx.cluster.node(name)
        out: dict[str, Any] = {"node": name, "restarted": False, "came_up": node.alive, "error": None}
        restart_if_down(ctx, node, out)
        self.applied = None
        return out

    def describe(self) -> str:
        if not self.applied:
            return self.name
        c = self.applied.get("corrupted") or {}
        return (f"{self.name}: {self.applied['node']} {c.get('mode', self.mode)} of {c.get('file', '?')} "
                f"({c.get('size_before', '?')} -> {c.get('size_after', '?')} bytes)")
