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
  within the session. The stop disarms the cut. With `to-restarted` (the extensible load manager): a
  random broker that is not the channel owner is killed; while it is down (its registration outlives it
  for a session timeout) up to `RESTART_TRANSFERS` bundles of other owners are transferred towards it
  (each left Assigning to it: their answers are awaited at most `TO_NODE_ANSWER_S` each, such a transfer
  settling only once it is back); then it is restarted at once, within its session, and must complete
  them from the channel's history (apache/pulsar#25379). The brokers' channel views
  (`GET /admin/v2/loadbalancer/channel`) name the channel owner and the bundles' owners.
- `split` (`split:ALGORITHM`): the bundles of two random workload topics split at the same moment (as
  concurrent admin calls, or an admin split beside the leader's split task, do), each on its owner,
  with Pulsar's split algorithm (range_equally_divide by default), their children unloaded.

- `replay`: earlier messages of the service-unit state channel (the extensible load manager's
  `persistent://pulsar/system/loadbalancer-service-unit-state`) published again, as a partitioned
  broker's producer delivers its queued commands late (apache/pulsar#19620's delayed message): read
  from the earliest message with a Reader as any client can, then for up to `REPLAY_BUNDLES` bundles
  one earlier message each (not the bundle's latest): its latest forced record if it has one, else its
  latest transfer command (Releasing with a destination), else its first message; bundles whose latest
  record is Deleted or a tombstone (split parents) first, then those with a forced record, then the
  others in a seeded random order. Each goes out with the bundle as its key and its bytes unchanged.
  Every broker's table view must reject them all (each has an older versionId than the record it
  meets); only a bundle whose record was tombstoned (Init accepts anything) takes one.

Unloads, splits and replays are instants: `stop` has nothing to undo.
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
TO_NODE_ANSWER_S = 1.0                # unload:to-restarted: how long each transfer's answer is awaited
RESTART_TRANSFERS = 2
ASSIGNING_WAIT_S = 2.0                # ... and how long the Assigning records are waited for before the restart
REPLAY_BUNDLES = 8
CHANNEL_TOPIC = "persistent://pulsar/system/loadbalancer-service-unit-state"
REPLAY_READ_S = 10.0                  # reading the channel, at most
REPLAY_MAX_MESSAGES = 200_000
ZK_DELETE = 2                         # ZooKeeper's OpCode.delete
SPLIT_ALGORITHMS = ("range_equally_divide", "topic_count_equally_divide", "flow_or_qps_equally_divide")
MIN_BROKERS_LEFT = 1


def _admin_urls(ctx: NemesisContext) -> list[str]:
    """The admin URLs of the running brokers, in name order."""
    return [f"http://{n.host}:{n.ports.get('http', 8080)}" for n in sorted(ctx.cluster.nodes("broker"),
                                                                          key=lambda n: n.name)
            if n.alive and not n.paused]


def admin_call(ctx: NemesisContext, method: str, path: str,
               timeout: float = ADMIN_TIMEOUT) -> tuple[int, Any, str]:
    """The first running broker that answers: (status, JSON or text, its admin URL)."""
    errors = []
    for url in _admin_urls(ctx):
        req = urllib.request.Request(url + path, method=method, data=b"" if method == "PUT" else None)
        try:
            with _OPENER.open(req, timeout=timeout) as r:
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
        if mode not in (None, "dest", "lost-answer", "to-restarted"):
            raise ValueError(f"unload:{mode}: write unload, unload:dest for a random destination broker, "
                             "unload:lost-answer for a lock delete whose answer the owner never gets, or "
                             "unload:to-restarted for transfers towards a broker killed and restarted meanwhile")
        self.to_restarted = mode == "to-restarted"
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
        killed = (self.applied or {}).get("node") if self.to_restarted else None
        self.applied = None
        if killed is not None and not ctx.cluster.node(killed).alive:   # a start that failed half-way
            ctx.cluster.start(killed)
            return {"restarted": killed}
        if not armed:
            return {}
        ctx.cluster.undeafen(armed["node"], armed["peers"], trigger=self._trigger)
        return {"disarmed": armed["node"]}

    def _views(self, ctx: NemesisContext) -> dict[str, dict[str, Any]]:
        """Each live broker's channel view (node name -> its answer), those that answer."""
        out = {}
        for n in sorted(ctx.cluster.nodes("broker"), key=lambda n: n.name):
            if not n.alive or n.paused:
                continue
            try:
                with _OPENER.open(f"http://{n.host}:{n.ports.get('http', 8080)}/admin/v2/loadbalancer/channel",
                                  timeout=ADMIN_TIMEOUT) as r:
                    doc = json.loads(r.read(1 << 22))
            except Exception:  # noqa: BLE001 - a broker that does not answer is left out
                continue
            if isinstance(doc, dict) and isinstance(doc.get("records"), dict):
                out[n.name] = doc
        return out

    def _start_to_restarted(self, ctx: NemesisContext, plan: dict[str, Any]) -> dict[str, Any]:
        import random as _random
        import time
        rng = _random.Random(plan["u"])
        views = self._views(ctx)
        if not views:
            raise NemesisError("unload:to-restarted: no broker answers GET /admin/v2/loadbalancer/channel "
                               "(it needs --load-manager extensible)")
        followers = sorted(name for name, v in views.items() if not v.get("leader"))
        if not followers:
            raise NemesisError(f"unload:to-restarted: no running broker but the channel owner ({sorted(views)})")
        name = rng.choice(followers)
        node = ctx.cluster.node(name)
        dest = f"{node.host}:{node.ports.get('http', 8080)}"
        records = next(v for n, v in sorted(views.items()) if n != name)["records"]
        owned = sorted(k for k, r in records.items() if isinstance(r, dict) and r.get("state") == "Owned"
                       and r.get("dstBroker") not in (None, dest))
        bundles = sorted(rng.sample(owned, min(RESTART_TRANSFERS, len(owned))))
        if not bundles:
            raise NemesisError(f"unload:to-restarted: no bundle owned by another broker than {name}")
        other = ctx.cluster.node(next(n for n in sorted(views) if n != name))
        via = f"http://{other.host}:{other.ports.get('http', 8080)}"
        value: dict[str, Any] = {"node": name, "destination": dest, "bundles": bundles, "pid": node.pid,
                                 "via": via, "answers": {}}
        self.applied = value                   # before the kill: a failed start is healed (restarted)
        ctx.cluster.kill(name)
        t0 = time.monotonic()
        for b in bundles:
            req = urllib.request.Request(f"{via}/admin/v2/namespaces/{b}/unload?destinationBroker={quote(dest)}",
                                         method="PUT", data=b"")
            try:
                with _OPENER.open(req, timeout=TO_NODE_ANSWER_S) as r:
                    value["answers"][b] = r.status
            except urllib.error.HTTPError as e:
                value["answers"][b] = e.code
            except Exception as e:  # noqa: BLE001 - the transfer waits for the destination: no answer yet
                value["answers"][b] = f"none within {TO_NODE_ANSWER_S} s ({type(e).__name__})"
        assigning: list[str] = []
        for _ in range(20):                    # bounded: ASSIGNING_WAIT_S
            seen = next(iter(self._views(ctx).values()), {}).get("records") or {}
            assigning = [b for b in bundles if isinstance(seen.get(b), dict) and seen[b].get("state") == "Assigning"
                         and seen[b].get("dstBroker") == dest]
            if len(assigning) == len(bundles) or time.monotonic() - t0 > ASSIGNING_WAIT_S:
                break
            time.sleep(0.1)
        value["assigning"] = assigning
        value["down_s"] = round(time.monotonic() - t0, 3)
        ctx.cluster.start(name)                # bounded by the backend's start timeout
        value["restarted_pid"] = ctx.cluster.node(name).pid
        return value

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        if self.to_restarted:
            return self._start_to_restarted(ctx, plan)
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


class ReplayNemesis(Nemesis):
    """Earlier channel messages published again (see the module's docstring)."""

    name = "replay"

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        return {"u": ctx.rng.random()}

    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        self.applied = None
        return {}

    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        import time

        import pulsar
        self._check_idle()
        plan = plan if plan is not None else self.choose(ctx)
        url = getattr(ctx.cluster, "service_url", "")
        if not url:
            raise NemesisError("replay: the cluster has no service URL to read the channel from")
        client = pulsar.Client(url, operation_timeout_seconds=10, connection_timeout_ms=5000,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            msgs = _read_channel(client, time.monotonic() + REPLAY_READ_S)
            chosen = choose_replays(msgs, plan["u"])
            value: dict[str, Any] = {"read": len(msgs), "replayed": [
                {"bundle": k, "message_id": mid, "state": rec.get("state") if isinstance(rec, dict) else None,
                 "versionId": rec.get("versionId") if isinstance(rec, dict) else None,
                 "force": bool(rec.get("force")) if isinstance(rec, dict) else False} for k, mid, _, rec in chosen]}
            self.applied = value
            if chosen:
                producer = client.create_producer(CHANNEL_TOPIC, batching_enabled=False, send_timeout_millis=10000)
                try:
                    for key, _, data, _ in chosen:
                        producer.send(data, partition_key=key)
                finally:
                    producer.close()
            return value
        except pulsar.PulsarException as e:  # type: ignore[attr-defined]
            raise NemesisError(f"replay: {type(e).__name__}: {e}") from None
        finally:
            client.close()


def _read_channel(client: Any, deadline: float) -> list[tuple[str, list[int], bytes]]:
    """(key, message id, payload) of every channel message, from the earliest, until none is left or the
    deadline."""
    import time

    import pulsar
    reader = client.create_reader(CHANNEL_TOPIC, pulsar.MessageId.earliest, receiver_queue_size=1000)
    out: list[tuple[str, list[int], bytes]] = []
    try:
        while len(out) < REPLAY_MAX_MESSAGES and time.monotonic() < deadline and reader.has_message_available():
            try:
                m = reader.read_next(1000)
            except pulsar.Timeout:
                break
            mid = m.message_id()
            out.append((m.partition_key() or "", [mid.ledger_id(), mid.entry_id(), mid.batch_index()],
                        m.data() or b""))
    finally:
        reader.close()
    return out


def choose_replays(msgs: list[tuple[str, list[int], bytes]], u: float,
                   limit: int = REPLAY_BUNDLES) -> list[tuple[str, list[int], bytes, Any]]:
    """The messages `replay` publishes again, in the channel's order: (key, message id, payload, record
    or None). Pure (unit-tested)."""
    import random as _random
    by_key: dict[str, list[tuple[int, list[int], bytes, Any]]] = {}
    for i, (key, mid, data) in enumerate(msgs):
        if not key:
            continue
        try:
            rec = json.loads(data) if data else None
        except ValueError:
            rec = None
        by_key.setdefault(key, []).append((i, mid, data, rec if isinstance(rec, dict) else None))
    ranked: list[tuple[int, str, tuple[int, list[int], bytes, Any]]] = []
    for key, seq in by_key.items():
        if len(seq) < 2:
            continue
        latest = seq[-1]
        earlier = [m for m in seq[:-1] if m[3] is not None and m[2] != latest[2]]
        if not earlier:
            continue
        forced = [m for m in earlier if m[3].get("force") is True]
        transfers = [m for m in earlier if m[3].get("state") == "Releasing" and m[3].get("dstBroker")]
        pick = forced[-1] if forced else transfers[-1] if transfers else earlier[0]
        gone = latest[3] is None or latest[3].get("state") == "Deleted"
        ranked.append((0 if gone else 1 if forced else 2, key, pick))
    rng = _random.Random(u)
    rng.shuffle(ranked)
    ranked.sort(key=lambda r: r[0])
    picked = sorted((r[2] for r in ranked[:limit]), key=lambda m: m[0])
    keys = {id(r[2]): r[1] for r in ranked[:limit]}
    return [(keys[id(m)], m[1], m[2], m[3]) for m in picked]
