"""What both broker-side load managers (modular.py, extensible_manager.py) share:

- `LeaderElection`: an ephemeral znode holding `{"brokerId", "serviceUrl"}` (Pulsar's
  LeaderElectionImpl): taken when free, replaced when it holds this broker's value under an old
  session, watched; `on_change(elected)` runs on every change of this broker's role.
- `DecisionLog`: the `LB_EVENT {json}` lines (harness/lb_events.py reads them) and their last 500.
- `bundle_stats(service, ownership)`: NamespaceBundleStats of every bundle this broker serves, from
  its topics' rates.
- `split_cuts(...)`: the boundaries an admin or automatic split of a bundle cuts at (splitting.py).
- `periodic(interval_s, step, what)`: a timer loop whose failing round is logged and retried.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from typing import Any, Awaitable, Callable

from clusters.loadbalancer import splitting
from clusters.loadbalancer.bundles import Bundle, BundleError
from clusters.loadbalancer.data import NamespaceBundleStats
from clusters.loadbalancer.settings import LoadBalancerSettings
from clusters.loadbalancer.signals import HostUsage
from clusters.metadata.brokers import BROKERS_PATH, BrokerRegistry
from clusters.metadata.store import NodeExists

log = logging.getLogger(__name__)
decisions_log = logging.getLogger("lb")


def now_ms() -> int:
    return int(time.time() * 1000)


class BrokerLoadManager:
    """What every load manager of a broker sets up alike from its BrokerService: the settings under
    Pulsar's names, this broker's id and registration path, the broker registry, the leader election at
    `leader_path` (the subclass's `_on_leader_change` hears it), the decision log, the bug knobs and the
    host's resource usage."""

    def __init__(self, service: Any, leader_path: str):
        self.service = service
        cfg = service.config
        self.cfg = cfg
        self.store = service.store
        self.settings = LoadBalancerSettings.from_mapping(dict(cfg.load_balancer or {}))
        self.broker_id = f"{cfg.host}:{cfg.http_port}"
        self.path = f"{BROKERS_PATH}/{self.broker_id}"
        self.registry = BrokerRegistry(self.store)
        self.election = LeaderElection(self.store, leader_path, self.broker_id, cfg.web_url, self._on_leader_change)
        # the incarnation is this process's start (ms): the decision log names it and the leader this
        # broker knows
        self.events = DecisionLog(self.broker_id, self.election.leader_id)
        self.incarnation = self.events.incarnation
        self.decisions = self.events.decisions
        self.knobs = service.knobs.of("load-balancer")          # bug knobs (clusters/bugs.py)
        self.usage = HostUsage(service.io, cpu_cores=cfg.cpu_cores, memory_limit_mb=cfg.memory_limit_mb,
                               nic_speed_gbps=self.settings.loadBalancerOverrideBrokerNicSpeedGbps or cfg.nic_speed_gbps)

    def _on_leader_change(self, elected: bool) -> None:
        raise NotImplementedError


class DecisionLog:
    """One decision, as an `LB_EVENT {json}` line of the broker's log, kept in `decisions` too.
    `mono_ns` is CLOCK_MONOTONIC, shared by every process of one machine and left alone by
    libfaketime; `leader()` names the leader the broker knows; `incarnation` this process's start (ms)."""

    def __init__(self, broker_id: str, leader: Callable[[], str | None]):
        self.broker_id = broker_id
        self.leader = leader
        self.incarnation = now_ms()
        self.decisions: deque[dict[str, Any]] = deque(maxlen=500)

    def event(self, event: str, **fields: Any) -> dict[str, Any]:
        doc = {"event": event, "mono_ns": time.monotonic_ns(), "wall_ms": now_ms(), "broker": self.broker_id,
               "leader": self.leader(), "incarnation": self.incarnation, **fields}
        self.decisions.append(doc)
        try:
            decisions_log.info("LB_EVENT %s", json.dumps(doc, sort_keys=True, default=str))
        except (TypeError, ValueError):
            decisions_log.info("LB_EVENT %s", json.dumps({k: str(v) for k, v in doc.items()}))
        return doc


class LeaderElection:
    """The leader election at `path` among brokers of one metadata store."""

    def __init__(self, store: Any, path: str, broker_id: str, service_url: str,
                 on_change: Callable[[bool], Any]):
        self.store = store
        self.path = path
        self.broker_id = broker_id
        self.service_url = service_url          # the leader's web service URL (LeaderBroker.serviceUrl)
        self.on_change = on_change
        self.is_leader = False
        self.current: dict[str, Any] | None = None     # the leader's value as last seen
        self.stopped = False
        self._lock = asyncio.Lock()

    def value(self) -> dict[str, Any]:
        return {"brokerId": self.broker_id, "serviceUrl": self.service_url}

    def leader_id(self) -> str | None:
        return (self.current or {}).get("brokerId")

    async def read(self) -> dict[str, Any] | None:
        got = await self.store.get_or_none(self.path)
        if got is None:
            return None
        try:
            doc = json.loads(got[0])
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    async def start(self) -> None:
        await self.elect()
        self._watch()

    async def elect(self) -> None:
        """Take the znode if it is free; a value of ours held by an old session of this broker is
        replaced (as the coordination service's LeaderElectionImpl does)."""
        body = json.dumps(self.value()).encode()
        async with self._lock:
            if self.stopped:
                return
            try:
                await self.store.create(self.path, body, ephemeral=True, makepath=True)
                self._become(True)
                return
            except NodeExists:
                pass
            got = await self.store.get_or_none(self.path)
            if got is None:
                return                       # gone meanwhile: the watch elects again
            doc = json.loads(got[0] or b"{}") if got[0] else {}
            if doc.get("brokerId") == self.broker_id:
                if await self.store.owner_session(self.path) == self.store.session_id:
                    self._become(True)
                    return
                try:
                    await self.store.delete(self.path, version=got[1])
                    await self.store.create(self.path, body, ephemeral=True)
                    self._become(True)
                    return
                except Exception:  # noqa: BLE001 - someone else won
                    pass
            self.current = doc
            self._become(False)

    async def safe_elect(self) -> None:
        try:
            await self.elect()
        except Exception as e:  # noqa: BLE001
            log.warning("leader election at %s: %s", self.path, e)

    def _become(self, leader: bool) -> None:
        changed = leader != self.is_leader
        self.is_leader = leader
        if leader:
            self.current = self.value()
        if changed:
            self.on_change(leader)

    def _watch(self) -> None:
        def on_data(data: bytes | None) -> None:
            if self.stopped:
                return
            if data is None:
                was = self.is_leader
                self.is_leader = False
                self.current = None
                if was:
                    self.on_change(False)
                asyncio.get_running_loop().create_task(self.safe_elect())
                return
            try:
                doc = json.loads(data)
            except ValueError:
                return
            self.current = doc if isinstance(doc, dict) else None
            if self.current and self.current.get("brokerId") != self.broker_id and self.is_leader:
                self._become(False)
        self.store.watch_data(self.path, on_data)

    async def leave(self) -> None:
        """Stop taking part: the znode is deleted if it is ours."""
        self.stopped = True
        try:
            got = await self.store.get_or_none(self.path)
            if got is not None and self.is_leader:
                await self.store.delete(self.path, version=got[1])
        except Exception:  # noqa: BLE001 - the session's end removes it anyway
            pass
        self.is_leader = False


def bundle_stats(service: Any, ownership: Any) -> dict[str, NamespaceBundleStats]:
    """Every bundle this broker owns (and every bundle of a topic it serves) -> its stats now."""
    stats: dict[str, NamespaceBundleStats] = {str(b): NamespaceBundleStats() for b in ownership.owned}
    for name, t in list(service.topics.items()):
        try:
            bundle = str(ownership.bundle(name))
        except ValueError:
            continue
        s = stats.setdefault(bundle, NamespaceBundleStats())
        rin, bin_ = service.rate("in", name)
        rout, bout = service.rate("out", name)
        s.msgRateIn += rin
        s.msgThroughputIn += bin_
        s.msgRateOut += rout
        s.msgThroughputOut += bout
        s.topics += 1
        s.producerCount += len(t.producers)
        s.consumerCount += sum(len(sub.consumers) for sub in t.subscriptions.values())
    return stats


async def split_cuts(service: Any, settings: Any, bundle: Bundle, algorithm: str | None,
                     positions: list[int] | None) -> tuple[str, list[int]]:
    """(the algorithm, the boundaries) a split of `bundle` cuts at; BundleError if there are none."""
    algo = algorithm or settings.defaultNamespaceBundleSplitAlgorithm
    if algo not in settings.supportedNamespaceBundleSplitAlgorithms:
        raise BundleError(f"unsupported split algorithm {algo!r}; use one of "
                          f"{', '.join(settings.supportedNamespaceBundleSplitAlgorithms)}")
    topics = [t for t in await service.topics_of_namespace(bundle.namespace)
              if bundle.contains(splitting.topic_hash(t))]
    loads = {}
    for t in topics:
        rin, bin_ = service.rate("in", t)
        rout, bout = service.rate("out", t)
        loads[t] = splitting.TopicLoad(msgRateIn=rin, msgRateOut=rout, msgThroughputIn=bin_,
                                       msgThroughputOut=bout) if t in service.topics else None
    try:
        cuts = splitting.split_boundaries(algo, bundle.lower, bundle.upper, settings, topics=topics,
                                          topic_loads=loads, positions=positions)
    except ValueError as e:
        raise BundleError(str(e)) from None
    if not cuts:
        raise BundleError(f"{algo} finds no split position in {bundle} ({len(topics)} topics)")
    return algo, list(cuts)


async def periodic(interval_s: Callable[[], float], step: Callable[[], Awaitable[Any]], what: str) -> None:
    """Run `step` every `interval_s()` seconds for ever; a failing round is logged, the next one tries again."""
    while True:
        await asyncio.sleep(max(0.05, interval_s()))
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            log.warning("%s: %s", what, e, exc_info=True)
