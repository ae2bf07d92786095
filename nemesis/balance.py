"""Faults that move load: brokers leaving and joining (scale-in and scale-out), and admin-driven bundle
unloads and splits, through Pulsar's admin API on any live broker.

- `scale` (`scale:kill`, `scale:N`, `scale:kill:N`): a running broker (N of them at once) leaves,
  gracefully (stop: it unloads its bundles and unregisters) or killed; the stop brings it back, a broker
  joining the cluster with no bundles.
- `unload` (`unload:dest`, `unload:lost-answer`): the bundle of a random workload topic unloaded; with
  `dest`, towards a random other live broker (`destinationBroker`, the leader's bundle affinity); with
  `lost-answer`, ZooKeeper carries out the owner's delete of the bundle's lock but the answer never
  reaches the owner: the owner's ZooKeeper connection that carries the delete hears nothing more (a
  one-way cut armed by the request's bytes, `Cluster.deafen(trigger=...)`), so its client gives that
  connection up after 2/3 of a session timeout (the delete fails, its outcome unknown) and reconnects
  within the session. The stop disarms the cut.
- `split` (`split:ALGORITHM`): the bundles of two random workload topics split at the same moment (as
  concurrent admin calls, or an admin split beside the leader's split task, do), each on its owner,
  with Pulsar's split algorithm (range_equally_divide by default), their children unloaded.

Unloads and splits are instants: `stop` has nothing to undo.
"""
from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from nemesis.base import _OPENER, Nemesis, NemesisContext, NemesisError

ADMIN_TIMEOUT = 15.0
ZK_DELETE = 2                         # ZooKeeper's OpCode.delete
SPLIT_ALGORITHMS = ("range_equally_divide", "topic_count_equally_divide", "flow_or_qps_equally_divide")
MIN_BROKERS_LEFT = 1


def _admin_urls(ctx: NemesisContext) -> list[str]:
    """The admin URLs of the running brokers, in name order."""
    return [f"http://{n.host}:{n.ports.get('http', 8080)}" for n in sorted(ctx.cluster.nodes("broker"),
                                                                          key=lambda n: n.name)
            if n.alive and not n.paused]


def admin_call(ctx: NemesisContext, method: str, path: str) -> tuple[int, Any, str]:
    """The first running broker that answers: (status, JSON or text, its admin URL)."""
    errors = []
    for url in _admin_urls(ctx):
        req = urllib.request.Request(url + path, method=method, data=b"" if method == "PUT" else None)
        try:
            with _OPENER.open(req, timeout=ADMIN_TIMEOUT) as r:
                status, body = r.status, r.read(1 << 20)
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read(1 << 16)
        except Exception as e:  # noqa: BLE001 - the next broker may answer
            errors.append(f"{url}: {type(e).__name__}: {e}")
            continue
        try:
            data: Any = json.loads(body) if body else None
        except ValueError:
            data = body.decode(errors="replace")
        return status, data, url
    raise NemesisError("no running broker answered the admin API: " + ("; ".join(errors) or "no brokers running"))


def zk_delete_request(path: str) -> bytes:
    """The bytes a ZooKeeper client's delete request of `path` carries after its xid: the opcode, the
    path's length and the path (the trigger of `unload:lost-answer`'s one-way cut)."""
    raw = path.encode()
    return struct.pack(">ii", ZK_DELETE, len(raw)) + raw


def _reason(data: Any) -> str:
    return str(data.get("reason")) if isinstance(data, dict) and data.get("reason") else str(data)[:200]


def topic_bundle(ctx: NemesisContext, topic: str) -> str:
    """`tenant/ns/0x..._0x...`: the topic's bundle as the brokers say now."""
    domain, rest = topic.split("://", 1)
    status, data, _ = admin_call(ctx, "GET", f"/lookup/v2/topic/{domain}/{'/'.join(quote(p, safe='') for p in rest.split('/'))}/bundle")
    if status != 200 or not isinstance(data, str):
        raise NemesisError(f"the bundle of {topic}: HTTP {status}: {_reason(data)}")
    tenant, ns = rest.split("/")[:2]
    return f"{tenant}/{ns}/{data.strip()}"


class ScaleNemesis(Nemesis):
    name = "scale"

    def __init__(self, mode: str | None = None):
        super().__init__()
        self.mode, self.count = "stop", 1
        for part in (mode.split(":") if mode else []):
            if part in ("stop", "kill"):
                self.mode = part
            elif part.isdigit() and int(part) >= 1:
                self.count = int(part)
            else:
                raise ValueError(f"scale:{mode}: write scale[:MODE][:N]: MODE stop (graceful, the default) or kill, "
                                 "N the brokers that leave at once (1 by default), e.g. scale:3 or scale:kill:2")

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        pool = ctx.names("broker")
        if not pool:
            raise NemesisError("scale: the cluster has no brokers")
        if self.count == 1:
            return {"node": ctx.rng.choice(pool)}
        return {"nodes": sorted(ctx.rng.sample(pool, min(self.count, len(pool))))}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        names = plan.get("nodes") or [plan["node"]]
        nodes = [ctx.cluster.node(n) for n in names]
        running = [n for n in ctx.cluster.nodes("broker") if n.alive]
        down = [n.name for n in nodes if not n.alive]
        if down:
            raise NemesisError(f"scale: {', '.join(down)} not running")
        if len(running) - len(nodes) < MIN_BROKERS_LEFT:
            raise NemesisError(f"scale: {', '.join(names)} leaving would leave no running broker")
        value: dict[str, Any] = {"node": names[0], "mode": self.mode, "pid": nodes[0].pid,
                                 "brokers_left": len(running) - len(nodes)}
        if len(names) > 1:
            value.update(nodes=names, pids=[n.pid for n in nodes])
        self.applied = value
        for node in nodes:
            if self.mode == "kill":
                ctx.cluster.kill(node.name)
            else:
                ctx.cluster.stop(node.name)
        return value

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.applied is None:
            return {}
        names = self.applied.get("nodes") or [self.applied["node"]]
        joined, pids = [], []
        for name in names:
            node = ctx.cluster.node(name)
            if not node.alive:
                node = ctx.cluster.start(name)
                joined.append(name)
            pids.append(node.pid)
        self.applied = None
        if len(names) == 1:
            return {"node": names[0], "pid": pids[0], "joined": bool(joined)}
        return {"node": names[0], "nodes": names, "pids": pids, "joined": bool(joined), "joined_nodes": joined}

    def describe(self) -> str:
        if not self.applied:
            return self.name
        return f"scale: {', '.join(self.applied.get('nodes') or [self.applied['node']])} left ({self.applied['mode']})"


class _BundleNemesis(Nemesis):
    """An instant admin action on the bundle of a random workload topic."""

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        if not ctx.topics:
            raise NemesisError(f"{self.name}: the workload has no topics to pick a bundle from")
        return {"topic": ctx.rng.choice(sorted(ctx.topics)), "u": ctx.rng.random()}

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        self.applied = None
        return {}


class UnloadNemesis(_BundleNemesis):
    name = "unload"

    def __init__(self, mode: str | None = None):
        super().__init__()
        if mode not in (None, "dest", "lost-answer"):
            raise ValueError(f"unload:{mode}: write unload, unload:dest for a random destination broker, or "
                             "unload:lost-answer for a lock delete whose answer the owner never gets")
        self.dest = mode == "dest"
        self.lost_answer = mode == "lost-answer"
        self._trigger = b""

    def _arm(self, ctx: NemesisContext, topic: str, bundle: str, value: dict[str, Any]) -> None:
        """Arm the owner's one-way cut from ZooKeeper on its delete request of the bundle's lock (the
        request's bytes: the opcode, the path's length and the path)."""
        zks = ctx.names("zookeeper")
        if not zks:
            raise NemesisError("unload:lost-answer: the cluster has no ZooKeeper nodes")
        owner = ctx.owner_of(topic)
        path = f"/namespace/{bundle}"
        trigger = zk_delete_request(path)
        value.update(owner=owner, lock=path, deaf={"node": owner, "peers": zks})
        self.applied = value                 # before the side effect, so a half-done start is undone
        self._trigger = trigger
        ctx.cluster.deafen(owner, zks, trigger=trigger)

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        armed = (self.applied or {}).get("deaf")
        self.applied = None
        if not armed:
            return {}
        ctx.cluster.undeafen(armed["node"], armed["peers"], trigger=self._trigger)
        return {"disarmed": armed["node"]}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        bundle = topic_bundle(ctx, plan["topic"])
        query = ""
        value: dict[str, Any] = {"topic": plan["topic"], "bundle": bundle}
        if self.dest:
            status, brokers, _ = admin_call(ctx, "GET", "/admin/v2/brokers/standalone")
            if status != 200 or not isinstance(brokers, list) or not brokers:
                raise NemesisError(f"unload: the broker list: HTTP {status}: {_reason(brokers)}")
            dest = sorted(brokers)[int(plan["u"] * len(brokers)) % len(brokers)]
            query = f"?destinationBroker={quote(dest)}"
            value["destination"] = dest
        self.applied = value
        if self.lost_answer:
            self._arm(ctx, plan["topic"], bundle, value)
        status, data, via = admin_call(ctx, "PUT", f"/admin/v2/namespaces/{bundle}/unload{query}")
        if status >= 300 and not self.lost_answer:
            raise NemesisError(f"unload {bundle}: HTTP {status}: {_reason(data)}")
        value.update(via=via, status=status)
        return value


class SplitNemesis(_BundleNemesis):
    name = "split"

    def __init__(self, algorithm: str | None = None):
        super().__init__()
        if algorithm is not None and algorithm not in SPLIT_ALGORITHMS:
            raise ValueError(f"split:{algorithm}: use one of {', '.join(SPLIT_ALGORITHMS)}")
        self.algorithm = algorithm or "range_equally_divide"

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        if not ctx.topics:
            raise NemesisError("split: the workload has no topics to pick a bundle from")
        pool = sorted(ctx.topics)
        return {"topics": ctx.rng.sample(pool, min(2, len(pool)))}

    def _split(self, ctx: NemesisContext, bundle: str) -> dict[str, Any]:
        status, data, via = admin_call(ctx, "PUT", f"/admin/v2/namespaces/{bundle}/split"
                                                   f"?unload=true&splitAlgorithmName={self.algorithm}")
        if status >= 300:
            return {"bundle": bundle, "error": f"HTTP {status}: {_reason(data)}"}
        return {"bundle": bundle, "children": data.get("children") if isinstance(data, dict) else None,
                "via": via}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        import concurrent.futures
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        bundles = sorted({topic_bundle(ctx, t) for t in plan["topics"]})
        value: dict[str, Any] = {"topics": plan["topics"], "bundles": bundles, "algorithm": self.algorithm}
        self.applied = value
        with concurrent.futures.ThreadPoolExecutor(len(bundles)) as pool:
            value["splits"] = list(pool.map(lambda b: self._split(ctx, b), bundles))
        if all("error" in r for r in value["splits"]):
            raise NemesisError("split: " + "; ".join(f"{r['bundle']}: {r['error']}" for r in value["splits"]))
        return value
