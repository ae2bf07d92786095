"""Process faults: kill -9 a bookie or broker (random, or a resolved target) and start it again (same
identity and data), or SIGSTOP it and SIGCONT it later."""
from __future__ import annotations

from typing import Any

from nemesis.base import Nemesis, NemesisContext, NemesisError
from nemesis.targets import draw, plan_nodes

TARGET_ROLES = ("bookie", "broker")


class _ProcessNemesis(Nemesis):
    """A signal fault on one random bookie or broker, or on the nodes a selector (`kill:owner`,
    `pause:zk-leader`, `kill:all-bookie`, `pause:broker-2`...) resolves to when the fault starts."""

    roles: tuple[str, ...] = TARGET_ROLES

    def __init__(self, selector: str | None = None, roles: tuple[str, ...] | None = None):
        super().__init__()
        self.selector = selector
        if roles is not None:
            self.roles = tuple(roles)

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.selector is not None:
            return draw(ctx, self.selector)
        pool = ctx.names(*self.roles)        # every node of the roles, not only live ones: the draw
        if not pool:                         # depends on the layout alone
            raise NemesisError(f"{self.name}: the cluster has no {' or '.join(self.roles)} nodes")
        return {"node": ctx.rng.choice(pool)}

    def _refuse(self, node: Any) -> str | None:
        """Why this fault cannot hit a running node now (None: it can)."""
        return None

    def _apply(self, ctx: NemesisContext, name: str) -> None:
        raise NotImplementedError

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        names, extra = plan_nodes(ctx, plan)
        nodes = [ctx.cluster.node(n) for n in names]
        for node in nodes:
            problem = "is not running" if not node.alive else self._refuse(node)
            if problem:
                raise NemesisError(f"{self.name}: {node.name} {problem}")
        value = {"node": nodes[0].name, "role": nodes[0].role, "pid": nodes[0].pid, **extra}
        if len(nodes) > 1:
            value["nodes"] = [n.name for n in nodes]
            value["pids"] = {n.name: n.pid for n in nodes}
        self.applied = value                 # before the side effect, so a half-done start is undone
        for node in nodes:
            self._apply(ctx, node.name)
        return value

    def _targets(self) -> list[str]:
        assert self.applied is not None
        return list(self.applied.get("nodes") or [self.applied["node"]])

    def describe(self) -> str:
        if not self.applied:
            return self.name
        if "nodes" in self.applied:
            return f"{self.name}: {', '.join(self.applied['nodes'])}"
        return f"{self.name}: {self.applied['node']} (pid {self.applied['pid']})"


class KillNemesis(_ProcessNemesis):
    """SIGKILL a random bookie or broker; stop starts it again and waits until it serves."""

    name = "kill"

    def _apply(self, ctx: NemesisContext, name: str) -> None:
        ctx.cluster.kill(name)

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        out = {}
        for name in self._targets():
            node = ctx.cluster.node(name)
            restarted = False
            if not node.alive:
                node = ctx.cluster.start(name)   # bounded by the backend's start timeout
                restarted = True
            out[name] = {"node": name, "role": node.role, "pid": node.pid, "restarted": restarted}
        self.applied = None
        return next(iter(out.values())) if len(out) == 1 else {"nodes": out}


class PauseNemesis(_ProcessNemesis):
    """SIGSTOP a random bookie or broker; stop sends SIGCONT."""

    name = "pause"

    def _refuse(self, node: Any) -> str | None:
        return "is already paused" if node.paused else None

    def _apply(self, ctx: NemesisContext, name: str) -> None:
        ctx.cluster.pause(name)

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        out = {}
        for name in self._targets():
            node = ctx.cluster.node(name)
            resumed = False
            if node.alive and node.paused:
                ctx.cluster.resume(name)
                resumed = True
            out[name] = {"node": name, "role": node.role, "pid": node.pid, "resumed": resumed,
                         "alive": node.alive}
        self.applied = None
        return next(iter(out.values())) if len(out) == 1 else {"nodes": out}
