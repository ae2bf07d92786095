"""Process faults: kill -9 a random bookie or broker and start it again (same identity and data), or
SIGSTOP it and SIGCONT it later."""
from __future__ import annotations

from typing import Any

from nemesis.base import Nemesis, NemesisContext, NemesisError

TARGET_ROLES = ("bookie", "broker")


class _ProcessNemesis(Nemesis):
    roles: tuple[str, ...] = TARGET_ROLES

    def __init__(self, roles: tuple[str, ...] | None = None):
        super().__init__()
        if roles is not None:
            self.roles = tuple(roles)

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
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
        node = ctx.cluster.node(plan["node"])
        problem = "is not running" if not node.alive else self._refuse(node)
        if problem:
            raise NemesisError(f"{self.name}: {node.name} {problem}")
        value = {"node": node.name, "role": node.role, "pid": node.pid}
        self.applied = value                 # before the side effect, so a half-done start is undone
        self._apply(ctx, node.name)
        return value

    def describe(self) -> str:
        if not self.applied:
            return self.name
        return f"{self.name}: {self.applied['node']} (pid {self.applied['pid']})"


class KillNemesis(_ProcessNemesis):
    """SIGKILL a random bookie or broker; stop starts it again and waits until it serves."""

    name = "kill"

    def _apply(self, ctx: NemesisContext, name: str) -> None:
        ctx.cluster.kill(name)

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        name = self.applied["node"]
        node = ctx.cluster.node(name)
        restarted = False
        if not node.alive:
            node = ctx.cluster.start(name)   # bounded by the backend's start timeout
            restarted = True
        self.applied = None
        return {"node": name, "role": node.role, "pid": node.pid, "restarted": restarted}


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
        name = self.applied["node"]
        node = ctx.cluster.node(name)
        resumed = False
        if node.alive and node.paused:
            ctx.cluster.resume(name)
            resumed = True
        self.applied = None
        return {"node": name, "role": node.role, "pid": node.pid, "resumed": resumed, "alive": node.alive}
