"""Fault targets resolved at fault time, through the admin API, ZooKeeper and four-letter words.

A *selector* names which nodes a fault hits; `resolve(ctx, selector)` turns it into node names at
the moment the fault starts, and says how it found them:

| selector | nodes | found through |
|---|---|---|
| `random` | one random broker or bookie | the layout (`ctx.rng`) |
| `broker`, `bookie`, `zookeeper` | one random node of the role | the layout (`ctx.rng`) |
| `all-broker`, `all-bookie`, `all-zookeeper` | every node of the role | the layout |
| `owner` | the broker owning a random topic of `ctx.topics` | `ctx.owner_of` (the brokers' lookup) |
| `ledger-bookies` | the bookies of the last fragment of that topic's current ledger | a broker's `internalStats` (ledger id), then the ledger's metadata znode in ZooKeeper |
| `zk-leader` | the ZooKeeper node whose `srvr` says `Mode: leader` (or `standalone`) | `srvr` on each node's client port |
| `lb-leader` | the broker named by the load-balancer leader znode: `/loadbalance/leader` (modular), else `/loadbalance/extension/leader` (extensible: the channel owner) | ZooKeeper |
| `lb-follower` | one random broker that is not the load-balancer leader: the drawn broker, or the next one by name when the draw is the leader | the layout (`ctx.rng`), then the leader znode |
| a node name (`broker-1`) | that node | the layout |

Random draws are split from resolution: `draw(ctx, selector)` makes the selector's draws (and
nothing else), always the same number for a given selector and layout, whatever the cluster's state
(the role pools hold every node of the role, live or not; a topic is drawn from `ctx.topics`);
`resolve(ctx, selector, plan=draw)` then asks the cluster. A nemesis calls `draw` in `choose` and
`resolve` in `start`, so a seed replays the same draws on the same layout. A plan with `pinned`
(node names: a replay of a run's fault, `harness/shrink.py`) resolves to those nodes without asking.

The questions asked of the cluster (`internalStats`, a znode, `srvr`) go through a `Probes` object,
so unit tests can answer them without a cluster.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from clusters import zookeeper
from clusters.bookkeeper.metadata import LedgerMetadata, ledger_path
from clusters.protocol.topics import normalize_topic
from core.observations import LB_LEADER_PATHS
from nemesis.base import FaultNameError, NemesisContext, NemesisError

ROLES = ("broker", "bookie", "zookeeper")
RANDOM_ROLES = ("broker", "bookie")           # what `random` draws from, as the kill/pause nemeses
TOPIC_SELECTORS = ("owner", "ledger-bookies")
LB_FOLLOWER = "lb-follower"               # a broker the leader may have preallocated bundles to (#478)
FIXED_SELECTORS = ("random", *TOPIC_SELECTORS, "zk-leader", "lb-leader", LB_FOLLOWER, *ROLES,
                   *(f"all-{r}" for r in ROLES))
HTTP_TIMEOUT = 5.0
ZK_TIMEOUT = 10.0
SRVR_TIMEOUT = 2.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def valid_selectors(ctx: NemesisContext | None = None) -> str:
    """The selectors, for error messages (with the node names when a context is given)."""
    names = ""
    if ctx is not None:
        try:
            nodes = ctx.names(*ROLES)
            names = f" ({', '.join(nodes)})" if nodes else ""
        except Exception:  # noqa: BLE001 - only for a message
            names = ""
    return ", ".join(FIXED_SELECTORS) + f", or a node name{names}"


def _fail(selector: str, problem: str, ctx: NemesisContext | None = None) -> NemesisError:
    return NemesisError(f"target {selector!r}: {problem}; selectors: {valid_selectors(ctx)}")


class Probes:
    """The cluster questions a resolution asks (real network calls); tests substitute their own."""

    def internal_stats(self, admin_url: str, topic: str) -> dict[str, Any]:
        """GET a broker's /admin/v2/<topic>/internalStats (forwarded to the owner by the broker)."""
        domain, rest = normalize_topic(topic).split("://", 1)
        path = "/".join(quote(p, safe="") for p in rest.split("/"))
        url = f"{admin_url.rstrip('/')}/admin/v2/{domain}/{path}/internalStats"
        try:
            with _OPENER.open(url, timeout=HTTP_TIMEOUT) as resp:
                body = resp.read(8 << 20)
        except urllib.error.HTTPError as e:
            try:
                reason = json.loads(e.read(1 << 16)).get("reason", "")
            except Exception:  # noqa: BLE001 - the reason is optional
                reason = ""
            raise NemesisError(f"HTTP {e.code}" + (f": {reason}" if reason else "")) from None
        data = json.loads(body)
        if not isinstance(data, dict):
            raise NemesisError(f"malformed internalStats answer {body[:200]!r}")
        return data

    def zk_get(self, zk_connect: str, path: str) -> bytes | None:
        """The data of a znode (None if it does not exist), through a short kazoo session."""
        from kazoo.client import KazooClient
        from kazoo.exceptions import NoNodeError
        zk = KazooClient(hosts=zk_connect, timeout=ZK_TIMEOUT, connection_retry={"max_tries": 3})
        try:
            zk.start(ZK_TIMEOUT)
        except Exception as e:
            zk.stop()
            zk.close()
            raise NemesisError(f"ZooKeeper at {zk_connect} unreachable: {type(e).__name__}: {e}") from None
        try:
            data, _ = zk.get(path)
            return data
        except NoNodeError:
            return None
        finally:
            zk.stop()
            zk.close()

    def srvr(self, host: str, port: int) -> str:
        """A ZooKeeper server's answer to `srvr` ('' if it does not answer)."""
        return zookeeper.four_letter(host, port, "srvr", timeout=SRVR_TIMEOUT)


PROBES = Probes()


@dataclass
class _Layout:
    """The cluster's server nodes at resolution time."""
    by_name: dict[str, Any]

    @classmethod
    def of(cls, ctx: NemesisContext) -> "_Layout":
        return cls({n.name: n for n in ctx.cluster.nodes() if n.role in ROLES})

    def role(self, role: str) -> list[Any]:
        return sorted((n for n in self.by_name.values() if n.role == role), key=lambda n: n.name)


# ---------------------------------------------------------------------------- draws

def check_selector(ctx: NemesisContext, selector: str) -> None:
    """Raise NemesisError unless `selector` is a selector or a server node of the cluster."""
    if not isinstance(selector, str) or not selector:
        raise _fail(str(selector), "empty selector", ctx)
    if selector in FIXED_SELECTORS:
        return
    if selector not in ctx.names(*ROLES):
        raise _fail(selector, "no such selector or node", ctx)


def draw(ctx: NemesisContext, selector: str, topic: str | None = None) -> dict[str, Any]:
    """The selector's random draws (and nothing else): {"selector", and "node" or "topic"}.

    `random`, a role and `lb-follower` (a broker) draw one node of the layout (live or not); `owner`
    and `ledger-bookies` draw one topic of ctx.topics unless `topic` is given; the others draw nothing."""
    check_selector(ctx, selector)
    plan: dict[str, Any] = {"selector": selector}
    if _draws_a_node(selector):
        pool = ctx.names(*(RANDOM_ROLES if selector == "random" else
                           ("broker",) if selector == LB_FOLLOWER else (selector,)))
        if not pool:
            what = "broker or bookie" if selector == "random" else selector
            raise _fail(selector, f"the cluster has no {what} nodes", ctx)
        plan["node"] = ctx.rng.choice(pool)
    elif selector in TOPIC_SELECTORS:
        if topic is None:
            if not ctx.topics:
                raise _fail(selector, "the workload has no topics to draw from", ctx)
            topic = ctx.rng.choice(sorted(ctx.topics))
        plan["topic"] = normalize_topic(topic)
    return plan


def _draws_a_node(selector: str) -> bool:
    return selector == "random" or selector in ROLES or selector == LB_FOLLOWER


_NODE_NAME = re.compile(r"^(zk|bookie|broker|client)-[1-9][0-9]*$")


def check_name(selector: str) -> None:
    """Before any cluster exists (a spec's `kill:TARGET`): FaultNameError unless `selector` could name a
    target on some cluster, a selector or a node name like broker-1."""
    if selector in FIXED_SELECTORS or _NODE_NAME.match(selector):
        return
    raise FaultNameError(f"unknown target {selector!r}",
                         f"use one of {', '.join(FIXED_SELECTORS)}, or a node name like broker-1")


# ---------------------------------------------------------------------------- resolution

def plan_nodes(ctx: NemesisContext, plan: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The nodes a fault's plan hits now, and what to record of how they were found: a plan drawn
    without a selector names its node; one with a selector is resolved now."""
    if "selector" not in plan:
        return list(plan.get("nodes") or [plan["node"]]), {}
    found = resolve_plan(ctx, plan)
    return list(found["nodes"]), {"selector": plan["selector"], "target": found}


def resolve_plan(ctx: NemesisContext, plan: dict[str, Any]) -> dict[str, Any]:
    """resolve() of a nemesis plan that holds an earlier draw ({"selector", "node" or "topic", ...})."""
    return resolve(ctx, plan["selector"], plan={k: plan[k] for k in ("selector", "node", "topic", "pinned")
                                                if k in plan})


def resolve(ctx: NemesisContext, selector: str, topic: str | None = None, *,
            plan: dict[str, Any] | None = None, probes: Probes | None = None) -> dict[str, Any]:
    """The nodes `selector` names now: {"selector", "nodes": [names], ...how they were found}.

    `plan` is an earlier draw(ctx, selector, topic) (made now when None). Raises NemesisError
    naming the selector and the valid ones when it cannot be resolved."""
    if plan is not None and plan.get("selector", selector) != selector:
        raise _fail(selector, f"plan {plan} was drawn for another selector", ctx)
    if plan is not None and plan.get("pinned"):
        # a replay of a run's fault on the nodes it resolved to then, whatever the selector says now
        found = {"selector": selector, "nodes": list(plan["pinned"]), "pinned": True}
        if plan.get("topic"):
            found["topic"] = plan["topic"]
        return found
    if plan is None or (_draws_a_node(selector) and "node" not in plan) \
            or (selector in TOPIC_SELECTORS and not plan.get("topic")):
        plan = draw(ctx, selector, topic or (plan or {}).get("topic") or None)
    probes = probes or PROBES
    layout = _Layout.of(ctx)
    if selector == "random" or selector in ROLES:
        return {"selector": selector, "nodes": [plan["node"]]}
    if selector.startswith("all-") and selector[4:] in ROLES:
        nodes = [n.name for n in layout.role(selector[4:])]
        if not nodes:
            raise _fail(selector, f"the cluster has no {selector[4:]} nodes", ctx)
        return {"selector": selector, "nodes": nodes}
    if selector == "owner":
        owner = ctx.owner_of(plan["topic"])
        return {"selector": selector, "topic": plan["topic"], "nodes": [owner]}
    if selector == "ledger-bookies":
        return _ledger_bookies(ctx, layout, plan["topic"], probes)
    if selector == "zk-leader":
        return _zk_leader(ctx, layout, probes)
    if selector == "lb-leader":
        return _lb_leader(ctx, layout, probes)
    if selector == LB_FOLLOWER:
        return _lb_follower(ctx, layout, probes, plan["node"])
    if selector in layout.by_name:
        return {"selector": selector, "nodes": [selector]}
    raise _fail(selector, "no such selector or node", ctx)


def _ledger_bookies(ctx: NemesisContext, layout: _Layout, topic: str, probes: Probes) -> dict[str, Any]:
    sel = "ledger-bookies"
    errors: list[str] = []
    stats = asked = None
    for b in layout.role("broker"):             # the first live broker that answers (it forwards)
        if not b.alive or b.paused:
            errors.append(f"{b.name}: {'paused' if b.paused else 'not running'}")
            continue
        try:
            stats = probes.internal_stats(f"http://{b.host}:{b.ports.get('http', 8080)}", topic)
            asked = b.name
            break
        except Exception as e:  # noqa: BLE001 - try the next broker, report them all
            errors.append(f"{b.name}: {type(e).__name__}: {e}")
    if stats is None:
        raise _fail(sel, f"no broker answered the internal stats of {topic}: " + ("; ".join(errors) or "no brokers"),
                    ctx)
    ledgers = [i for i in stats.get("ledgers") or [] if isinstance(i, dict) and "ledgerId" in i]
    if not ledgers:
        raise _fail(sel, f"{topic} has no ledger yet (internal stats from {asked})", ctx)
    ledger_id = int(ledgers[-1]["ledgerId"])
    data = probes.zk_get(ctx.cluster.zk_connect, ledger_path(ledger_id))
    if data is None:
        raise _fail(sel, f"ledger {ledger_id} of {topic} has no metadata in ZooKeeper (deleted?)", ctx)
    md = LedgerMetadata.deserialize(data)
    first = md.last_ensemble_key()
    ensemble = list(md.ensembles[first])
    by_addr = {f"{n.host}:{n.ports.get('bookie', 3181)}": n.name for n in layout.role("bookie")}
    unknown = [a for a in ensemble if a not in by_addr]
    if unknown:
        raise _fail(sel, f"ledger {ledger_id}'s bookies {unknown} are not bookies of this cluster", ctx)
    return {"selector": sel, "topic": topic, "asked": asked, "ledger": ledger_id, "ledger_state": md.state,
            "fragment_first_entry": first, "ensemble": ensemble, "nodes": [by_addr[a] for a in ensemble]}


_ZXID = re.compile(r"^Zxid:\s*(0x[0-9a-fA-F]+)", re.M)


def _zk_leader(ctx: NemesisContext, layout: _Layout, probes: Probes) -> dict[str, Any]:
    """The node answering `srvr` with Mode leader (standalone for a single server). Two nodes can
    both claim it for a moment (an old leader cut off keeps its role until syncLimit runs out): the
    one with the highest zxid (its epoch in the upper 32 bits) is the current leader."""
    zks = layout.role("zookeeper")
    if not zks:
        raise _fail("zk-leader", "the cluster has no ZooKeeper nodes", ctx)
    answers: dict[str, str | None] = {}
    zxids: dict[str, int] = {}
    for n in zks:
        reply = probes.srvr(n.host, n.ports.get("client", zookeeper.CLIENT_PORT)) if n.alive and not n.paused else ""
        mode = None
        for line in reply.splitlines():
            if line.startswith("Mode:"):
                mode = line.split(":", 1)[1].strip()
        answers[n.name] = mode
        m = _ZXID.search(reply)
        if m:
            zxids[n.name] = int(m.group(1), 16)
    leaders = [name for name, mode in answers.items() if mode in ("leader", "standalone")]
    if not leaders:
        raise _fail("zk-leader", f"no ZooKeeper node answers srvr as leader or standalone: {answers}", ctx)
    leader = max(leaders, key=lambda name: (zxids.get(name, -1), name))
    return {"selector": "zk-leader", "nodes": [leader], "modes": answers,
            "zxid": f"0x{zxids[leader]:x}" if leader in zxids else None}


def _lb_leader(ctx: NemesisContext, layout: _Layout, probes: Probes) -> dict[str, Any]:
    """The broker named by the load-balancer leader znode: /loadbalance/leader (the modular load
    manager's LeaderElectionService), else /loadbalance/extension/leader (the extensible one's, whose
    leader owns the service-unit state channel). Pulsar's LeaderBroker JSON, {"serviceUrl":
    "http://host:8080"} (and "brokerId": "host:port" since 3.0); a bare URL or host:port is accepted
    too. The broker is matched by host."""
    path, data = next(((p, d) for p in LB_LEADER_PATHS if (d := probes.zk_get(ctx.cluster.zk_connect, p)) is not None),
                      (None, None))
    if data is None:
        raise _fail("lb-leader", "no broker holds the load-balancer leadership (neither "
                                 f"{' nor '.join(LB_LEADER_PATHS)} exists: no load manager has elected a leader yet)", ctx)
    text = data.decode(errors="replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = text
    urls = []
    if isinstance(doc, dict):
        urls = [str(doc[k]) for k in ("serviceUrl", "brokerId", "webServiceUrl", "brokerUrl") if doc.get(k)]
    elif isinstance(doc, str):
        urls = [doc]
    by_host = {n.host: n.name for n in layout.role("broker")}
    for u in urls:
        host = urlsplit(u if "://" in u else f"//{u}").hostname
        if host in by_host:
            return {"selector": "lb-leader", "nodes": [by_host[host]], "znode": path, "leader": doc}
    raise _fail("lb-leader", f"{path} names {text[:200]!r}, not a broker of this cluster", ctx)


def _lb_follower(ctx: NemesisContext, layout: _Layout, probes: Probes, drawn: str) -> dict[str, Any]:
    """A broker other than the load-balancer leader: the drawn one, or the next broker by name when the
    draw is the leader. What apache/pulsar#478 needs: the leader outlives a broker it placed bundles on."""
    leader = _lb_leader(ctx, layout, probes)
    brokers = [n.name for n in layout.role("broker")]
    if len(brokers) < 2:
        raise _fail(LB_FOLLOWER, f"the cluster has {len(brokers)} broker(s): none besides the leader", ctx)
    (lead,) = leader["nodes"]
    node = brokers[(brokers.index(drawn) + 1) % len(brokers)] if drawn == lead else drawn
    return {"selector": LB_FOLLOWER, "nodes": [node], "drawn": drawn, "lb_leader": lead,
            "znode": leader["znode"]}


def pick(nodes: list[str], u: float) -> str:
    """One of `nodes` by a uniform draw u in [0, 1) made earlier: the draw does not depend on how
    many nodes the cluster's state yields."""
    if not nodes:
        raise NemesisError("no node to pick from")
    ordered = sorted(nodes)
    return ordered[min(int(u * len(ordered)), len(ordered) - 1)]


def pick_running(ctx: NemesisContext, fault: str, selector: str, plan: dict[str, Any], roles: tuple[str, ...],
                 what: str, use: str) -> tuple[str, dict[str, Any]]:
    """(name, what the selector resolved to) of one running node of `roles` among those `selector`
    resolves to (with the plan's draw; plan["pick"] picks it). NemesisError naming `fault`, `what` it
    needs and the selectors to `use` when there is none, or when the one picked is not running."""
    draw = {k: v for k, v in plan.items() if k not in ("pick", "draws")}
    found = resolve(ctx, selector, plan=draw)
    role_of = {n.name: n.role for n in ctx.cluster.nodes()}
    candidates = [n for n in found["nodes"] if role_of.get(n) in roles]
    if not candidates:
        raise NemesisError(f"{fault}: target {selector!r} resolved to {found['nodes']}, no {what}; use {use}")
    name = pick(candidates, float(plan.get("pick", 0.0)))
    if not ctx.cluster.node(name).alive:
        raise NemesisError(f"{fault}: {name} is not running")
    return name, found
