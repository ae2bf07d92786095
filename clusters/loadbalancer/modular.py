"""Pulsar's default load manager, `ModularLoadManagerImpl`, in a reference broker: the ZooKeeper side.

- Every broker registers `/loadbalance/brokers/<brokerId>` (ephemeral; brokerId is
  `<host>:<webServicePort>`), whose value is its `LocalBrokerData` load report, rewritten every
  `loadBalancerReportUpdateMinIntervalMillis` when Pulsar's change rules say so (data.py).
- One broker is the leader: the ephemeral `/loadbalance/leader` (`{"brokerId", "serviceUrl"}`).
- A lookup of an unowned bundle on a follower is redirected to the leader; the leader chooses a broker
  (placement.py: `LeastLongTermMessageRate` with preallocation and the overload fallback) and
  redirects the client there with `authoritative`; that broker takes the bundle's lock. Without a
  leader a follower decides itself (Pulsar #7200).
- The leader keeps every broker's data and time averages, sheds load every
  `loadBalancerSheddingIntervalMinutes` (shedding.py) by unloading bundles with a destination
  (bundle affinity), and splits hot bundles (splitting.py) on the owners.

Every decision (scores, choice, bundles shed and why, splits) is logged on the `lb` logger as one JSON
line and counted in the `pulsar_lb_*` metrics.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import deque
from typing import Any

from clusters.broker.ownership import BROKERS_PATH, Assignment
from clusters.loadbalancer.bundles import Bundle, BundleError, parse_range, topic_namespace
from clusters.loadbalancer.signals import HostUsage
from clusters.metadata.store import NodeExists, NoNode

log = logging.getLogger(__name__)
decisions_log = logging.getLogger("lb")

LEADER_PATH = "/loadbalance/leader"                       # LeaderElectionService.ELECTION_ROOT
BUNDLE_DATA_ROOT = "/loadbalance/bundle-data"              # LoadBalanceResources.BUNDLE_DATA_BASE_PATH
TIME_AVERAGE_ROOT = "/loadbalance/broker-time-average"     # ... BROKER_TIME_AVERAGE_BASE_PATH
CLASS_NAME = "org.apache.pulsar.broker.loadbalance.impl.ModularLoadManagerImpl"


def _now_ms() -> int:
    return int(time.time() * 1000)


class ModularLoadManager:
    name = "modular"

    def __init__(self, service: Any):
        from clusters.loadbalancer.settings import LoadBalancerSettings
        self.service = service
        cfg = service.config
        self.cfg = cfg
        self.store = service.store
        self.settings = LoadBalancerSettings.from_mapping(dict(cfg.load_balancer or {}))
        self.broker_id = f"{cfg.host}:{cfg.http_port}"
        self.path = f"{BROKERS_PATH}/{self.broker_id}"
        self.usage = HostUsage(service.io, cpu_cores=cfg.cpu_cores, memory_limit_mb=cfg.memory_limit_mb,
                               nic_speed_gbps=cfg.nic_speed_gbps)
        self.rng = random.Random()
        self._leader: dict[str, Any] | None = None
        self._is_leader = False
        self._written: Any = None                 # the LocalBrokerData last written
        self._tasks: list[asyncio.Task] = []
        self._elect_lock = asyncio.Lock()
        self._stopped = False
        self.brokers: dict[str, dict[str, Any]] = {}      # every live broker's registration (leader)
        self.load_data: Any = None                        # data.LoadData (leader)
        self.shedder: Any = None                          # the shedding strategy (keeps its state)
        self.affinity: dict[str, str] = {}                # bundle -> brokerId (unload with destination)
        self.recently_unloaded: dict[str, int] = {}       # bundle -> ms (the grace period)
        self.decisions: deque[dict[str, Any]] = deque(maxlen=500)
        self.counters = {"unload_broker": 0, "unload_bundle": 0, "split": 0, "assign": 0}
        # bug knobs (clusters/bugs.py): set by BrokerService
        self.shed_to_owner = False
        self.keep_preallocations = False

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        from clusters.loadbalancer.data import LoadData
        self.load_data = LoadData()
        self.store.add_listener(self._on_session)
        await self._register()
        await self._elect()
        self._watch_leader()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._report_loop(), name="lb-report"),
                       loop.create_task(self._leader_loop(), name="lb-leader")]

    async def stop(self) -> None:
        self._stopped = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        for path in (LEADER_PATH, self.path):
            try:
                got = await self.store.get_or_none(path)
                if got is not None and (path == self.path or self._is_leader):
                    await self.store.delete(path, version=got[1])
            except Exception:  # noqa: BLE001 - the session's end removes them anyway
                pass
        self._is_leader = False

    def _on_session(self, state: str) -> None:
        if state == "CONNECTED" and not self._stopped:
            asyncio.get_running_loop().create_task(self._after_reconnect())

    async def _after_reconnect(self) -> None:
        try:
            await self._register()
            await self._elect()
        except Exception as e:  # noqa: BLE001
            log.warning("re-registering after a new ZooKeeper session: %s", e)

    # -- registration and load report ----------------------------------------------------------
    def load_report(self) -> dict[str, Any]:
        return self._local_data().to_json()

    def _local_data(self) -> Any:
        """This broker's LocalBrokerData now: measured usage, and its bundles' stats."""
        from clusters.loadbalancer.data import LocalBrokerData, NamespaceBundleStats, ResourceUsage
        svc = self.service
        usage = self.usage.latest
        stats: dict[str, Any] = {}
        for name, t in list(svc.topics.items()):
            try:
                bundle = str(svc.ownership.bundle(name))
            except ValueError:
                continue
            s = stats.setdefault(bundle, NamespaceBundleStats())
            rin, bin_ = svc.rate("in", name)
            rout, bout = svc.rate("out", name)
            s.msgRateIn += rin
            s.msgThroughputIn += bin_
            s.msgRateOut += rout
            s.msgThroughputOut += bout
            s.topics += 1
            s.producerCount += len(t.producers)
            s.consumerCount += sum(len(sub.consumers) for sub in t.subscriptions.values())
        bundles = sorted(str(b) for b in svc.ownership.owned)
        for b in bundles:
            stats.setdefault(b, NamespaceBundleStats())
        data = LocalBrokerData(
            webServiceUrl=self.cfg.web_url, pulsarServiceUrl=self.cfg.service_url,
            cpu=ResourceUsage(usage["cpu"].usage, usage["cpu"].limit),
            memory=ResourceUsage(usage["memory"].usage, usage["memory"].limit),
            directMemory=ResourceUsage(usage["directMemory"].usage, usage["directMemory"].limit),
            bandwidthIn=ResourceUsage(usage["bandwidthIn"].usage, usage["bandwidthIn"].limit),
            bandwidthOut=ResourceUsage(usage["bandwidthOut"].usage, usage["bandwidthOut"].limit),
            lastStats=stats, bundles=bundles, lastUpdate=_now_ms(),
            loadManagerClassName=CLASS_NAME)
        data.msgRateIn = sum(s.msgRateIn for s in stats.values())
        data.msgRateOut = sum(s.msgRateOut for s in stats.values())
        data.msgThroughputIn = sum(s.msgThroughputIn for s in stats.values())
        data.msgThroughputOut = sum(s.msgThroughputOut for s in stats.values())
        data.numTopics = sum(s.topics for s in stats.values())
        data.numBundles = len(bundles)
        data.numProducers = sum(s.producerCount for s in stats.values())
        data.numConsumers = sum(s.consumerCount for s in stats.values())
        return data

    def _registration(self, data: Any) -> bytes:
        doc = data.to_json()
        # ours, beside Pulsar's fields: how the other brokers and the harness name this broker
        doc.update({"broker": f"{self.cfg.host}:{self.cfg.port}", "service_url": self.cfg.service_url,
                    "web_url": self.cfg.web_url, "name": self.cfg.name, "brokerId": self.broker_id})
        return json.dumps(doc, sort_keys=True).encode()

    async def _register(self) -> None:
        data = self._local_data()
        body = self._registration(data)
        try:
            await self.store.create(self.path, body, ephemeral=True, makepath=True)
        except NodeExists:
            # a previous incarnation's session may still hold it; replace it
            try:
                await self.store.delete(self.path)
            except NoNode:
                pass
            await self.store.create(self.path, body, ephemeral=True, makepath=True)
        self._written = data

    async def _report_loop(self) -> None:
        """LoadReportUpdaterTask: sample the signals, write the report when it changed enough."""
        from clusters.loadbalancer.data import need_broker_data_update
        while True:
            await asyncio.sleep(self.report_interval_s)
            try:
                self.usage.sample()
                data = self._local_data()
                if not self.store.connected:
                    continue
                if self._written is None or need_broker_data_update(self._written, data, self.settings,
                                                                    data.lastUpdate):
                    try:
                        await self.store.set(self.path, self._registration(data))
                    except NoNode:
                        await self._register()
                    self._written = data
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next round tries again
                log.warning("writing the load report: %s", e)

    @property
    def report_interval_s(self) -> float:
        return max(0.05, self.settings.loadBalancerReportUpdateMinIntervalMillis / 1000.0)

    # -- leader election ----------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self._is_leader

    async def leader(self) -> dict[str, Any] | None:
        got = await self.store.get_or_none(LEADER_PATH)
        if got is None:
            return None
        try:
            doc = json.loads(got[0])
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def _leader_value(self) -> bytes:
        return json.dumps({"brokerId": self.broker_id, "serviceUrl": self.cfg.web_url}).encode()

    async def _elect(self) -> None:
        """Take /loadbalance/leader if it is free; a value of ours held by an old session of this
        broker is replaced (as the coordination service's LeaderElectionImpl does)."""
        async with self._elect_lock:
            if self._stopped:
                return
            try:
                await self.store.create(LEADER_PATH, self._leader_value(), ephemeral=True, makepath=True)
                self._become(True)
                return
            except NodeExists:
                pass
            got = await self.store.get_or_none(LEADER_PATH)
            if got is None:
                return                       # gone meanwhile: the watch elects again
            doc = json.loads(got[0] or b"{}") if got[0] else {}
            if doc.get("brokerId") == self.broker_id:
                if await self.store.owner_session(LEADER_PATH) == self.store.session_id:
                    self._become(True)
                    return
                try:
                    await self.store.delete(LEADER_PATH, version=got[1])
                    await self.store.create(LEADER_PATH, self._leader_value(), ephemeral=True)
                    self._become(True)
                    return
                except Exception:  # noqa: BLE001 - someone else won
                    pass
            self._leader = doc
            self._become(False)

    def _become(self, leader: bool) -> None:
        if leader != self._is_leader:
            self._decision({"event": "leader", "leader": leader, "broker": self.broker_id})
            if leader:
                from clusters.loadbalancer.data import LoadData
                self.load_data = LoadData()
                self.shedder = None
        self._is_leader = leader
        if leader:
            self._leader = {"brokerId": self.broker_id, "serviceUrl": self.cfg.web_url}

    def _watch_leader(self) -> None:
        def on_data(data: bytes | None) -> None:
            if self._stopped:
                return
            if data is None:
                self._is_leader = False
                self._leader = None
                asyncio.get_running_loop().create_task(self._safe_elect())
                return
            try:
                doc = json.loads(data)
            except ValueError:
                return
            self._leader = doc if isinstance(doc, dict) else None
            if self._leader and self._leader.get("brokerId") != self.broker_id and self._is_leader:
                self._become(False)
        self.store.watch_data(LEADER_PATH, on_data)

    async def _safe_elect(self) -> None:
        try:
            await self._elect()
        except Exception as e:  # noqa: BLE001
            log.warning("leader election: %s", e)

    # -- the brokers ---------------------------------------------------------------------------
    async def available_brokers(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for key in await self.store.children(BROKERS_PATH):
            got = await self.store.get_or_none(f"{BROKERS_PATH}/{key}")
            if got is None:
                continue
            try:
                doc = json.loads(got[0])
            except ValueError:
                continue
            if isinstance(doc, dict):
                out[key] = doc
        return out

    # -- assignment ------------------------------------------------------------------------------
    async def assign(self, bundle: Bundle) -> Assignment:
        leader = self._leader
        if not self._is_leader and leader and leader.get("brokerId") != self.broker_id:
            brokers = await self.available_brokers()
            reg = brokers.get(str(leader.get("brokerId")))
            if reg is not None and reg.get("pulsarServiceUrl"):
                return Assignment(url=reg["pulsarServiceUrl"], authoritative=False)
        # the leader, or no live leader: decide here (followers then redirect authoritatively)
        broker = await self.select_broker(bundle)
        if broker is None or broker == self.broker_id:
            return Assignment()
        reg = self.brokers.get(broker) or (await self.available_brokers()).get(broker)
        if reg is None or not reg.get("pulsarServiceUrl"):
            return Assignment()
        return Assignment(url=reg["pulsarServiceUrl"], authoritative=True)

    async def select_broker(self, bundle: Bundle) -> str | None:
        """The leader's `selectBrokerForAssignment`: affinity first, then a preallocation, then the
        placement strategy over the live brokers (the choice is preallocated)."""
        from clusters.loadbalancer.placement import select_broker
        await self._refresh()
        name = str(bundle)
        live = sorted(self.brokers)
        if not live:
            return None
        dest = self.affinity.pop(name, None)
        if dest in self.brokers:
            self._decision({"event": "assign", "bundle": name, "broker": dest, "reason": "affinity"})
            self.load_data.preallocate(name, dest)
            return dest
        pre = self.load_data.preallocated_broker(name)
        if pre is not None and (pre in self.brokers or self.keep_preallocations):
            self._decision({"event": "assign", "bundle": name, "broker": pre, "reason": "preallocated"})
            return pre
        counts = self._namespace_bundle_counts(bundle.namespace)
        decision = select_broker(name, live, self.load_data, self.settings, self.rng,
                                 namespace_bundle_counts=counts)
        chosen = decision.broker
        self.counters["assign"] += 1
        self._decision({"event": "assign", "bundle": name, **decision.as_dict()})
        return chosen

    def _namespace_bundle_counts(self, namespace: str) -> dict[str, int]:
        counts = {b: 0 for b in self.brokers}
        for b, reg in self.brokers.items():
            for name in reg.get("bundles") or []:
                if isinstance(name, str) and name.startswith(namespace + "/"):
                    counts[b] += 1
        for name, b in self.load_data.preallocations().items():
            if name.startswith(namespace + "/") and b in counts:
                counts[b] += 1
        return counts

    async def _refresh(self) -> None:
        """updateAll: every live broker's report into the load data; dead brokers' data dropped."""
        from clusters.loadbalancer.data import LocalBrokerData
        regs = await self.available_brokers()
        reports = {}
        for b, doc in regs.items():
            try:
                reports[b] = LocalBrokerData.from_json(doc)
            except Exception:  # noqa: BLE001 - a malformed report: skip the broker this round
                log.warning("malformed load report of %s", b)
        self.brokers = regs
        self.load_data.update_all_broker_data(reports, keep_dead_preallocations=self.keep_preallocations)
        self.load_data.update_bundle_data()

    # -- the leader's timers -----------------------------------------------------------------------
    async def _leader_loop(self) -> None:
        last_shed = time.monotonic()
        while True:
            await asyncio.sleep(self.report_interval_s)
            if not self._is_leader:
                if self._leader is None:
                    await self._safe_elect()
                continue
            try:
                await self._refresh()
                await self.check_namespace_bundle_split()
                interval = self.settings.loadBalancerSheddingIntervalMinutes * 60
                if time.monotonic() - last_shed >= interval:
                    last_shed = time.monotonic()
                    await self.do_load_shedding()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next round tries again
                log.warning("load manager leader round: %s", e, exc_info=True)

    async def do_load_shedding(self) -> list[dict[str, Any]]:
        from clusters.loadbalancer.shedding import make_strategy, plan_shedding
        if self.shedder is None:
            self.shedder = make_strategy(self.settings.loadBalancerLoadSheddingStrategy)

        def destination(bundle: str) -> str | None:
            from clusters.loadbalancer.placement import select_broker
            ns = bundle.rsplit("/", 1)[0]
            d = select_broker(bundle, sorted(self.brokers), self.load_data, self.settings, self.rng,
                              namespace_bundle_counts=self._namespace_bundle_counts(ns), preallocate=False)
            return d.broker

        plan = plan_shedding(self.load_data, self.shedder, self.recently_unloaded, _now_ms(), self.settings,
                             destination, skip_current_owner=not self.shed_to_owner)
        self._decision({"event": "shedding", **plan.as_dict()})
        done = []
        for u in plan.unloads:
            try:
                await self.unload_with_destination(u.bundle, u.src, u.dst)
                self.recently_unloaded[u.bundle] = _now_ms()
                self.counters["unload_bundle"] += 1
                done.append({"bundle": u.bundle, "src": u.src, "dst": u.dst})
            except Exception as e:  # noqa: BLE001
                log.warning("shedding %s from %s: %s", u.bundle, u.src, e)
        if done:
            self.counters["unload_broker"] += len({d["src"] for d in done})
        return done

    async def unload_with_destination(self, bundle: str, src: str, dst: str | None) -> None:
        """The leader sets the bundle's affinity, then asks the owner to unload it."""
        if dst:
            self.affinity[bundle] = dst
        namespace, rng = bundle.rsplit("/", 1)
        b = parse_range(namespace, rng)
        if src == self.broker_id:
            await self.service.unload_bundle(b)
            return
        reg = self.brokers.get(src) or (await self.available_brokers()).get(src)
        if reg is None:
            raise RuntimeError(f"broker {src} is not live")
        from clusters.httpd import http_request
        url = f"{reg.get('webServiceUrl') or reg.get('web_url')}/admin/v2/namespaces/{bundle}/unload"
        status, body = await http_request("PUT", url, b"", timeout=10.0)
        if status >= 300:
            raise RuntimeError(f"{url} answered {status}: {body[:200]!r}")

    async def set_affinity(self, bundle: Bundle, broker_id: str) -> None:
        self.affinity[str(bundle)] = broker_id

    async def check_namespace_bundle_split(self) -> list[dict[str, Any]]:
        """The leader's BundleSplitterTask: split the bundles over Pulsar's thresholds, on their owners."""
        from clusters.loadbalancer.splitting import bundles_to_split
        if not (self.settings.loadBalancerAutoBundleSplitEnabled and len(self.brokers) > 1):
            return []
        counts: dict[str, int] = {}
        for reg in self.brokers.values():
            for name in reg.get("bundles") or []:
                counts[name.rsplit("/", 1)[0]] = counts.get(name.rsplit("/", 1)[0], 0) + 1
        out = []
        for bundle, reason in bundles_to_split(self.load_data, self.settings, counts):
            owner = self.load_data.owner_of(bundle)
            try:
                await self._split_on_owner(bundle, owner)
                self.counters["split"] += 1
                out.append({"bundle": bundle, "owner": owner, "reason": reason})
                self._decision({"event": "split", "bundle": bundle, "owner": owner, "reason": reason})
            except Exception as e:  # noqa: BLE001
                log.warning("splitting %s on %s: %s", bundle, owner, e)
        return out

    async def _split_on_owner(self, bundle: str, owner: str | None) -> None:
        namespace, rng = bundle.rsplit("/", 1)
        unload = self.settings.loadBalancerAutoUnloadSplitBundlesEnabled
        algo = self.settings.defaultNamespaceBundleSplitAlgorithm
        if owner == self.broker_id:
            await self.split(parse_range(namespace, rng), algo, None, unload)
            return
        reg = self.brokers.get(owner or "")
        if reg is None:
            raise RuntimeError(f"owner {owner} of {bundle} is not live")
        from clusters.httpd import http_request
        url = (f"{reg.get('webServiceUrl')}/admin/v2/namespaces/{bundle}/split"
               f"?unload={'true' if unload else 'false'}&splitAlgorithmName={algo}")
        status, body = await http_request("PUT", url, b"", timeout=10.0)
        if status >= 300:
            raise RuntimeError(f"{url} answered {status}: {body[:200]!r}")

    # -- splitting on the owner ---------------------------------------------------------------------
    async def split(self, bundle: Bundle, algorithm: str | None, positions: list[int] | None,
                    unload: bool) -> list[Bundle]:
        from clusters.loadbalancer import splitting
        svc = self.service
        algo = algorithm or self.settings.defaultNamespaceBundleSplitAlgorithm
        if algo not in self.settings.supportedNamespaceBundleSplitAlgorithms:
            raise BundleError(f"unsupported split algorithm {algo!r}; use one of "
                              f"{', '.join(self.settings.supportedNamespaceBundleSplitAlgorithms)}")
        topics = [t for t in await svc.topics_of_namespace(bundle.namespace)
                  if bundle.contains(splitting.topic_hash(t))]
        rates = {t: svc.rate("in", t) for t in topics}
        cuts = splitting.split_positions(algo, bundle.lower, bundle.upper, topics=topics, rates=rates,
                                         positions=positions, settings=self.settings)
        if not cuts:
            raise BundleError(f"{algo} finds no split position in {bundle} ({len(topics)} topics)")
        children = await svc.ownership.split(bundle, cuts, cas=not svc.bug("broker.split_without_cas"))
        self._decision({"event": "split-done", "bundle": str(bundle), "algorithm": algo,
                        "children": [c.range_name for c in children]})
        if unload:
            for c in children:
                await svc.unload_bundle(c)
        return children

    # -- the decision log ------------------------------------------------------------------------------
    def _decision(self, doc: dict[str, Any]) -> None:
        doc = {"ts": round(time.time(), 3), "broker": self.broker_id, **doc}
        self.decisions.append(doc)
        try:
            decisions_log.info("%s", json.dumps(doc, sort_keys=True, default=str))
        except (TypeError, ValueError):
            decisions_log.info("%s", doc)


def namespace_of(bundle: str) -> str:
    return topic_namespace(f"persistent://{bundle}/x")[0]
