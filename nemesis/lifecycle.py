"""Lifecycle faults: a rolling restart of a role, a kill of every node of a role, and a disk wipe.

- `rolling-restart[:ROLE+MODE]` (default brokers, graceful): every node of the role in a random
  order, one at a time: stop it (SIGTERM, `cluster.stop`) or kill it (`kill`), start it again,
  wait until it is healthy and ready (a broker answers /admin/v2/brokers/ready, a bookie is
  registered under /ledgers/available), then the next. It all happens in `start()`, within a
  bounded total time; the start op records the order and each node's restart. `stop()` only starts
  a node the restart left down.
- `kill-role[:ROLE]` (default brokers): SIGKILL every live node of the role at once; `stop()` starts
  them all again (in parallel: a ZooKeeper ensemble needs a quorum back before any member serves).
- `disk-wipe[:TARGET]` (default a random bookie): kill one node the target selector resolves to
  (a bookie or ZooKeeper node; `ledger-bookies` picks one of the bookies of a topic's current
  ledger's last fragment), delete its data (`cluster.wipe`), leave it down for the hold; `stop()`
  starts it with the same identity. A bookie with cookies refuses its wiped disk (the refusal is
  recorded); then the operator's answer follows: `cluster.format` (a new bookie under the same id:
  its old cookie and data gone, the ledgers it held in limbo and re-replicated) and a start. It
  records whether it came up, the refusal and the format, with its log's last line.

Each class takes one `param: str | None`, the part after ':' in the nemesis name.
"""
from __future__ import annotations

import concurrent.futures
import os
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from clusters.deploy.backend import ClusterError
from nemesis import targets
from nemesis.base import Nemesis, NemesisContext, NemesisError

ROLES = ("broker", "bookie", "zookeeper")
RESTART_MODES = ("stop", "kill")
WIPE_ROLES = ("bookie", "zookeeper")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _last_line(path: Any, limit: int = 300) -> str:
    """The last non-empty line of a node's log ('' if unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except (OSError, TypeError):
        return ""
    return lines[-1][:limit] if lines else ""


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _broker_ready(node: Any) -> bool:
    try:
        with _OPENER.open(f"http://{node.host}:{node.ports.get('http', 8080)}/admin/v2/brokers/ready",
                          timeout=2.0) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - not ready yet
        return False


def wait_ready(ctx: NemesisContext, name: str, timeout: float) -> bool:
    """After `cluster.start` (which waits for the port): a broker answering `ready` (it has a
    ZooKeeper session), a bookie registered under /ledgers/available; ZooKeeper is ready once
    started. False if not within `timeout` seconds."""
    node = ctx.cluster.node(name)
    deadline = time.monotonic() + max(0.0, timeout)
    if node.role == "broker":
        while not _broker_ready(node):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.25)
        return True
    if node.role == "bookie":
        path = f"/ledgers/available/{node.host}:{node.ports.get('bookie', 3181)}"
        from kazoo.client import KazooClient
        zk = KazooClient(hosts=ctx.cluster.zk_connect, timeout=10.0)
        try:
            zk.start(max(1.0, min(10.0, timeout)))
            while zk.exists(path) is None:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.25)
            return True
        except Exception:  # noqa: BLE001 - ZooKeeper unreachable: not known to be ready
            return False
        finally:
            zk.stop()
            zk.close()
    return True


def start_again(ctx: NemesisContext, name: str, out: dict[str, Any]) -> Any:
    """Start node `name`, which a fault left down: `out` gets came_up (True) or error (why the start
    failed), and pid (None unless it runs). Returns the node as it is after."""
    try:
        node = ctx.cluster.start(name)
        out["came_up"] = True
    except ClusterError as e:
        out["error"] = str(e)
        node = ctx.cluster.node(name)
    out["pid"] = node.pid if node.alive else None
    return node


def restart_if_down(ctx: NemesisContext, node: Any, out: dict[str, Any],
                    recover: Callable[[NemesisContext, Any, dict[str, Any]], Any] | None = None) -> Any:
    """The shared stop() of disk-wipe and disk-corrupt, whose fault took `node` down: a node that runs is
    left alone; one that is down is started again (`out` gets restarted True and, by `start_again`,
    came_up or error); after a failed start (`out["came_up"]` still False) `recover(ctx, node, out)` may
    bring it up another way and returns the node. `out` gets pid (None if down). Returns the node."""
    if node.alive:
        out["pid"] = node.pid
        return node
    out["restarted"] = True
    node = start_again(ctx, node.name, out)
    if recover is not None and not out["came_up"]:
        node = recover(ctx, node, out)
        out["pid"] = node.pid if node.alive else None
    return node


def _parse_role(nemesis: str, token: str | None, default: str) -> str:
    role = token or default
    if role not in ROLES:
        raise ValueError(f"{nemesis}: unknown role {role!r}; use one of {', '.join(ROLES)}")
    return role


# ------------------------------------------------------------------------ rolling restart

class RollingRestartNemesis(Nemesis):
    """Restart every node of a role in turn (default brokers, graceful stop); see the module doc.

    param: `ROLE`, `MODE` or `ROLE+MODE`, with ROLE broker | bookie | zookeeper and MODE stop
    (SIGTERM, then SIGKILL after the backend's stop timeout) | kill (SIGKILL)."""

    name = "rolling-restart"

    def __init__(self, param: str | None = None, *, max_total_s: float = 180.0, ready_timeout_s: float = 30.0,
                 ready: Callable[[NemesisContext, str, float], bool] | None = None):
        super().__init__()
        self.ready = ready or wait_ready
        role, mode = "broker", "stop"
        for token in (param.split("+") if param else []):
            if token in ROLES:
                role = token
            elif token in RESTART_MODES:
                mode = token
            else:
                raise ValueError(f"rolling-restart: unknown {token!r} in {param!r}; use ROLE, MODE or ROLE+MODE "
                                 f"with ROLE one of {', '.join(ROLES)} and MODE one of {', '.join(RESTART_MODES)}")
        self.role, self.mode = role, mode
        self.max_total_s = float(max_total_s)
        self.ready_timeout_s = float(ready_timeout_s)

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        pool = ctx.names(self.role)          # the layout's nodes, live or not: one draw per layout
        if not pool:
            raise NemesisError(f"rolling-restart: the cluster has no {self.role} nodes")
        return {"role": self.role, "mode": self.mode, "order": ctx.rng.sample(pool, len(pool))}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        order = list(plan["order"])
        live = [n for n in order if ctx.cluster.node(n).alive]
        if not live:
            raise NemesisError(f"rolling-restart: no {self.role} is running ({', '.join(order)})")
        value: dict[str, Any] = {"role": self.role, "mode": self.mode, "order": order, "nodes": order,
                                 "restarts": [], "down": None, "complete": False}
        self.applied = value                 # before the first side effect
        t0 = time.monotonic()
        deadline = t0 + self.max_total_s
        for name in order:
            left = deadline - time.monotonic()
            if left <= 0:
                value["elapsed_s"] = round(time.monotonic() - t0, 3)
                raise NemesisError(f"rolling-restart: out of time ({self.max_total_s:.0f}s) before {name}; "
                                   f"restarted {[r['node'] for r in value['restarts']]}")
            node = ctx.cluster.node(name)
            if not node.alive or node.paused:
                value["restarts"].append({"node": name, "skipped": "paused" if node.paused else "not running"})
                continue
            t_node = time.monotonic()
            value["down"] = name
            if self.mode == "kill":
                ctx.cluster.kill(name)
            else:
                ctx.cluster.stop(name)
            t_stopped = time.monotonic()
            try:
                new = ctx.cluster.start(name)
            except ClusterError as e:
                value["elapsed_s"] = round(time.monotonic() - t0, 3)
                raise NemesisError(f"rolling-restart: {name} did not come back: {e}") from None
            value["down"] = None
            ready = self.ready(ctx, name, min(self.ready_timeout_s, max(0.0, deadline - time.monotonic())))
            value["restarts"].append({"node": name, "old_pid": node.pid, "pid": new.pid, "ready": ready,
                                      "stop_s": round(t_stopped - t_node, 3),
                                      "took_s": round(time.monotonic() - t_node, 3)})
        value["complete"] = True
        value["elapsed_s"] = round(time.monotonic() - t0, 3)
        return value

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        name = self.applied.get("down")
        out: dict[str, Any] = {"role": self.role, "restarted": None}
        if name is not None and not ctx.cluster.node(name).alive:
            node = ctx.cluster.start(name)   # raises: the fault stays active for another try
            out.update(restarted=name, pid=node.pid)
        self.applied = None
        return out

    def describe(self) -> str:
        if not self.applied:
            return self.name
        done = [r["node"] for r in self.applied["restarts"] if "pid" in r]
        return f"{self.name} ({self.mode}): {len(done)}/{len(self.applied['order'])} {self.role}s restarted"


# ------------------------------------------------------------------------ kill a role

def _parallel(fn: Any, names: list[str]) -> dict[str, BaseException | Any]:
    """fn(name) for every name at once; name -> result or the exception it raised."""
    if not names:
        return {}
    out: dict[str, Any] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
        futs = {pool.submit(fn, n): n for n in names}
        for f in concurrent.futures.as_completed(futs):
            try:
                out[futs[f]] = f.result()
            except BaseException as e:  # noqa: BLE001 - reported per node
                out[futs[f]] = e
    return out


class KillRoleNemesis(Nemesis):
    """SIGKILL every live node of a role at once (default brokers); stop starts them all again.

    param: broker | bookie | zookeeper."""

    name = "kill-role"

    def __init__(self, param: str | None = None):
        super().__init__()
        self.role = _parse_role("kill-role", param, "broker")

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        return {"role": self.role}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        nodes = ctx.cluster.nodes(self.role)
        live = sorted((n for n in nodes if n.alive), key=lambda n: n.name)
        if not live:
            raise NemesisError(f"kill-role: no {self.role} is running"
                               + (f" ({', '.join(sorted(n.name for n in nodes))} all down)" if nodes else ""))
        value = {"role": self.role, "nodes": [n.name for n in live], "pids": {n.name: n.pid for n in live},
                 "skipped": sorted(n.name for n in nodes if not n.alive)}
        self.applied = value
        results = _parallel(ctx.cluster.kill, value["nodes"])
        errors = {n: _error(r) for n, r in results.items() if isinstance(r, BaseException)}
        if errors:
            value["errors"] = errors
            still = [n for n in value["nodes"] if ctx.cluster.node(n).alive]
            if still:
                raise NemesisError(f"kill-role: could not kill {', '.join(still)}: "
                                   + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items())))
        return value

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        names = list(self.applied["nodes"])
        down = [n for n in names if not ctx.cluster.node(n).alive]
        results = _parallel(ctx.cluster.start, down)
        errors = {n: _error(r) for n, r in results.items() if isinstance(r, BaseException)}
        if errors:                           # the fault stays active: stop is retried (heal too)
            raise NemesisError("kill-role: could not restart " + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items())))
        out = {n: {"restarted": n in down, "pid": ctx.cluster.node(n).pid} for n in names}
        self.applied = None
        return {"role": self.role, "nodes": out}

    def describe(self) -> str:
        if not self.applied:
            return self.name
        return f"{self.name}: {', '.join(self.applied['nodes'])} killed"


# ------------------------------------------------------------------------ disk wipe

def _format_refused(ctx: NemesisContext, node: Any, out: dict[str, Any]) -> Any:
    """The operator's answer to a bookie that refused to start on its wiped disk (its cookie is missing):
    format it as a new bookie and start it; `out` moves the start's error to refused and gets formatted,
    then came_up or the new error. A node of another role is left as it is."""
    if node.role != "bookie" or node.alive:
        return node
    out["refused"], out["error"] = out["error"], None
    try:
        out["formatted"] = ctx.cluster.format(node.name)
        node = ctx.cluster.start(node.name)
        out["came_up"] = True
    except ClusterError as e:
        out["error"] = str(e)
        node = ctx.cluster.node(node.name)
    return node


class DiskWipeNemesis(Nemesis):
    """Kill a bookie (or a ZooKeeper node), wipe its data dir, keep it down for the hold; stop starts
    it with the same identity; a bookie that refuses its wiped disk (its cookie is missing) is
    formatted as a new bookie and started again, as an operator would. Records whether it came up,
    the refusal (`refused`), the format (`formatted`) and the final start error (`error`).

    param: a target selector (nemesis/targets.py), default `bookie` (a random bookie); one node of
    what it resolves to is picked by a draw made in choose()."""

    name = "disk-wipe"

    def __init__(self, param: str | None = None):
        super().__init__()
        self.selector = param or "bookie"

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        plan = targets.draw(ctx, self.selector)
        return {**plan, "pick": ctx.rng.random()}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        name, found = targets.pick_running(ctx, "disk-wipe", self.selector, plan, WIPE_ROLES,
                                           "bookie or ZooKeeper node",
                                           "bookie, ledger-bookies, zk-leader or a bookie's name")
        node = ctx.cluster.node(name)
        value: dict[str, Any] = {"node": name, "role": node.role, "pid": node.pid, "selector": self.selector,
                                 "target": found, "wiped": None}
        self.applied = value
        ctx.cluster.kill(name)
        value["wiped"] = ctx.cluster.wipe(name)
        return value

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        name = self.applied["node"]
        node = ctx.cluster.node(name)
        out: dict[str, Any] = {"node": name, "role": node.role, "restarted": False, "came_up": node.alive,
                               "refused": None, "formatted": None, "error": None}
        node = restart_if_down(ctx, node, out, _format_refused)
        out["last_log_line"] = _last_line(node.log)
        self.applied = None
        return out

    def describe(self) -> str:
        if not self.applied:
            return self.name
        w = self.applied.get("wiped") or {}
        return f"{self.name}: {self.applied['node']} down, {w.get('files', '?')} files wiped"
