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
from typing import Any

from clusters.httpd import http_request
from clusters.loadbalancer.bundles import Bundle, parse_range
from clusters.loadbalancer.api import Assignment, Route, UnloadRefused
from clusters.loadbalancer.data import LocalBrokerData, ResourceUsage, need_broker_data_update
from clusters.loadbalancer.modular_leader import ModularLeader
from clusters.loadbalancer.shared import BrokerLoadManager, bundle_stats, now_ms as _now_ms, split_cuts
from clusters.loadbalancer.zk_ownership import ZkOwnership
from clusters.metadata.store import NodeExists, NoNode

log = logging.getLogger(__name__)

LEADER_PATH = "/loadbalance/leader"                       # LeaderElectionService.ELECTION_ROOT
BUNDLE_DATA_ROOT = "/loadbalance/bundle-data"              # LoadBalanceResources.BUNDLE_DATA_BASE_PATH
TIME_AVERAGE_ROOT = "/loadbalance/broker-time-average"     # ... BROKER_TIME_AVERAGE_BASE_PATH
CLASS_NAME = "org.apache.pulsar.broker.loadbalance.impl.ModularLoadManagerImpl"


class ModularLoadManager(BrokerLoadManager):
    name = "modular"

    def __init__(self, service: Any):
        # settings, ids, registry, leader election, decision log, knobs and usage (shared.py); the grace
        # period is this process's memory (Pulsar's LoadData), so its events name the incarnation and the
        # ownership checker compares unloads of one incarnation only
        super().__init__(service, LEADER_PATH)
        # ownership by ZooKeeper locks; an unowned bundle's broker is this load manager's choice
        self.ownership = ZkOwnership(self.store, self.cfg, on_lost=service.bundle_lost)
        self.ownership.assign = self.assign
        self._written: Any = None                 # a copy of the LocalBrokerData last written
        self._local: Any = None                   # this broker's LocalBrokerData, updated in place
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self.counters = {"unload_broker": 0, "unload_bundle": 0, "split": 0, "assign": 0}
        # the leader's decisions, I/O-free (modular_leader.py), with this broker's bug knobs
        self.lead = ModularLeader(self.settings, random.Random(),
                                  shed_to_owner=self.knobs.on("lb.shed_to_owner"),
                                  keep_preallocations=self.knobs.on("lb.keep_preallocations"))

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self.ownership.start()
        self.store.add_listener(self._on_session)
        await self._register()
        await self.election.start()
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
        await self.election.leave()
        try:
            got = await self.store.get_or_none(self.path)
            if got is not None:
                await self.store.delete(self.path, version=got[1])
        except Exception:  # noqa: BLE001 - the session's end removes it anyway
            pass
        try:
            await self.ownership.release_all()
        except Exception as e:  # noqa: BLE001 - the session's end removes the locks anyway
            log.warning("releasing ownership: %s", e)

    def _on_session(self, state: str) -> None:
        if state == "CONNECTED" and not self._stopped:
            asyncio.get_running_loop().create_task(self._after_reconnect())

    async def _after_reconnect(self) -> None:
        try:
            await self._register()
            await self.election.elect()
        except Exception as e:  # noqa: BLE001
            log.warning("re-registering after a new ZooKeeper session: %s", e)

    # -- registration and load report ----------------------------------------------------------
    def resource_usage(self) -> dict[str, float]:
        return {kind: u.percent() for kind, u in self.usage.latest.items()}

    def load_report(self) -> dict[str, Any]:
        return self._local_data().to_json()

    def _local_data(self) -> Any:
        """This broker's LocalBrokerData now: measured usage, and its bundles' stats (the gains and
        losses since the last written report are kept, as Pulsar's LocalBrokerData.update does)."""
        svc = self.service
        if self._local is None:
            self._local = LocalBrokerData(webServiceUrl=self.cfg.web_url, pulsarServiceUrl=self.cfg.service_url,
                                          loadManagerClassName=CLASS_NAME)
        stats = bundle_stats(svc, self.ownership)
        u = self.usage.latest

        def ru(kind: str) -> Any:
            return ResourceUsage(u[kind].usage, u[kind].limit)
        self._local.update(stats, cpu=ru("cpu"), memory=ru("memory"), direct_memory=ru("directMemory"),
                           bandwidth_in=ru("bandwidthIn"), bandwidth_out=ru("bandwidthOut"))
        self._local.lastUpdate = _now_ms()
        return self._local

    def _load_fields(self, data: Any) -> dict[str, Any]:
        """What the balance checker plots: the signals in percent of this broker's limits, the weighted
        max usage the shedders compare (0..1), the message rates and the counts."""
        return {"cpu": round(data.cpu.percent_usage(), 3), "memory": round(data.memory.percent_usage(), 3),
                "bandwidthIn": round(data.bandwidthIn.percent_usage(), 3),
                "bandwidthOut": round(data.bandwidthOut.percent_usage(), 3),
                "max_usage_with_weight": round(data.max_resource_usage_with_weight(self.settings), 5),
                "msgRateIn": round(data.msgRateIn, 3), "msgRateOut": round(data.msgRateOut, 3),
                "msgThroughputIn": round(data.msgThroughputIn, 1), "msgThroughputOut": round(data.msgThroughputOut, 1),
                "numBundles": data.numBundles, "numTopics": data.numTopics}

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
        self._wrote(data)

    def _wrote(self, data: Any) -> None:
        import copy
        self._written = copy.deepcopy(data)
        data.clean_deltas()

    async def _report_loop(self) -> None:
        """LoadReportUpdaterTask: sample the signals, write the report when it changed enough."""
        while True:
            await asyncio.sleep(self.report_interval_s)
            try:
                self.usage.sample()
                data = self._local_data()
                self._event("load-report", **self._load_fields(data))
                if not self.store.connected:
                    continue
                if self._written is None or need_broker_data_update(self._written, data, self.settings,
                                                                    data.lastUpdate):
                    try:
                        await self.store.set(self.path, self._registration(data))
                        self._wrote(data)
                    except NoNode:
                        await self._register()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next round tries again
                log.warning("writing the load report: %s", e)

    @property
    def report_interval_s(self) -> float:
        return max(0.05, self.settings.loadBalancerReportUpdateMinIntervalMillis / 1000.0)

    # -- leader election ----------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.election.is_leader

    @property
    def _is_leader(self) -> bool:
        return self.election.is_leader

    @property
    def _leader(self) -> dict[str, Any] | None:
        return self.election.current

    async def leader(self) -> dict[str, Any] | None:
        return await self.election.read()

    def _on_leader_change(self, elected: bool) -> None:
        self._event("leader-change", elected=elected)
        if elected:
            self.lead.forget()

    async def _safe_elect(self) -> None:
        await self.election.safe_elect()

    # -- the brokers ---------------------------------------------------------------------------
    async def registration(self, broker_id: str) -> dict[str, Any] | None:
        """One broker's registration (its LocalBrokerData JSON), None if it is not live."""
        return await self.registry.registration(broker_id)

    async def available_brokers(self) -> dict[str, dict[str, Any]]:
        return await self.registry.available()

    # -- assignment ------------------------------------------------------------------------------
    async def assign(self, bundle: Bundle) -> Assignment:
        leader = self._leader
        if not self._is_leader and leader and leader.get("brokerId") != self.broker_id:
            reg = await self.registration(str(leader.get("brokerId")))     # the leader's only
            if reg is not None and reg.get("pulsarServiceUrl"):
                return Assignment(url=reg["pulsarServiceUrl"], authoritative=False)
        # the leader, or no live leader: decide here (followers then redirect authoritatively)
        broker = await self.select_broker(bundle)
        if broker is None or broker == self.broker_id:
            return Assignment()
        url = self.lead.urls.get(broker)     # a dead broker's too: only the knob keeps choosing those
        if not url:
            return Assignment()
        return Assignment(url=url, authoritative=True)

    async def select_broker(self, bundle: Bundle) -> str | None:
        """The leader's `selectBrokerForAssignment` over the live brokers (modular_leader.py)."""
        await self._refresh()
        choice = self.lead.select(str(bundle))
        if choice.reason == "no-brokers":
            return None
        if choice.reason != "affinity":
            self.counters["assign"] += 1
        extra = {"decision": choice.decision.as_dict()} if choice.decision is not None else {}
        self._event("assign", bundle=str(bundle), destination=choice.broker, reason=choice.reason, **extra)
        return choice.broker

    async def _refresh(self) -> None:
        """updateAll: every live broker's report into the leader's load data."""
        found = self.lead.refresh(await self.available_brokers())
        for b in found.malformed:
            log.warning("malformed load report of %s", b)
        if found.gone:
            self._event("brokers-gone", brokers=found.gone)

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
        """doLoadShedding: the leader's plan (modular_leader.py), each bundle unloaded towards its
        destination."""
        plan = self.lead.shed(_now_ms())
        self._event("shedding", plan=plan.as_dict())
        done = []
        for u in plan.unloads:
            try:
                self._event("unload", bundle=u.bundle, source=u.src, destination=u.dst,
                            reason=f"shed:{plan.strategy}")
                await self.unload_with_destination(u.bundle, u.src, u.dst)
                self.counters["unload_bundle"] += 1
                done.append({"bundle": u.bundle, "src": u.src, "dst": u.dst})
            except Exception as e:  # noqa: BLE001
                self.lead.unload_failed(u.bundle)
                log.warning("shedding %s from %s: %s", u.bundle, u.src, e)
        self.counters["unload_broker"] += len({d["src"] for d in done})
        return done

    async def unload_with_destination(self, bundle: str, src: str, dst: str | None) -> None:
        """The leader sets the bundle's affinity, then asks the owner to unload it."""
        if dst:
            self.lead.affinity[bundle] = dst
        namespace, rng = bundle.rsplit("/", 1)
        b = parse_range(namespace, rng)
        if src == self.broker_id:
            await self.service.unload_bundle(b)
            return
        reg = self.lead.registrations.get(src) or await self.registration(src)
        if reg is None:
            raise RuntimeError(f"broker {src} is not live")
        url = f"{reg.get('webServiceUrl') or reg.get('web_url')}/admin/v2/namespaces/{bundle}/unload"
        status, body = await http_request("PUT", url, 10.0, body=b"")
        if status >= 300:
            raise RuntimeError(f"{url} answered {status}: {body[:200]!r}")

    async def set_affinity(self, bundle: Bundle, broker_id: str) -> None:
        self.lead.affinity[str(bundle)] = broker_id

    async def unload(self, bundle: Bundle, destination: str | None) -> Route | None:
        """A destination is bundle affinity on the leader (Pulsar's setNamespaceBundleAffinity), then the
        owner unloads; the next lookup is assigned to the destination."""
        if destination:
            if not self._is_leader:
                leader = await self.leader()
                if leader is None or not leader.get("serviceUrl"):
                    raise UnloadRefused(503, "no load-balancer leader now; retry")
                return Route("leader", str(leader["serviceUrl"]))
            await self.set_affinity(bundle, destination)
        owner = await self.ownership.owner(bundle)
        if owner is None:
            return None                     # not owned by anyone: nothing to unload (as Pulsar)
        if owner == self.ownership.me:
            await self.service.unload_bundle(bundle)
            return None
        return Route("owner", owner)

    async def check_namespace_bundle_split(self) -> list[dict[str, Any]]:
        """The leader's BundleSplitterTask: the bundles over Pulsar's thresholds split on their owners."""
        out = []
        for sp in self.lead.splits():
            self._event("split-decision", bundle=sp.bundle, source=sp.owner, reason=sp.reason)
            try:
                await self._split_on_owner(sp.bundle, sp.owner)
                self.counters["split"] += 1
                out.append({"bundle": sp.bundle, "owner": sp.owner, "reason": sp.reason})
            except Exception as e:  # noqa: BLE001
                log.warning("splitting %s on %s: %s", sp.bundle, sp.owner, e)
        return out

    async def _split_on_owner(self, bundle: str, owner: str | None) -> None:
        namespace, rng = bundle.rsplit("/", 1)
        unload = self.settings.loadBalancerAutoUnloadSplitBundlesEnabled
        algo = self.settings.defaultNamespaceBundleSplitAlgorithm
        if owner == self.broker_id:
            await self.split(parse_range(namespace, rng), algo, None, unload)
            return
        reg = self.lead.registrations.get(owner or "")
        if reg is None:
            raise RuntimeError(f"owner {owner} of {bundle} is not live")
        url = (f"{reg.get('webServiceUrl')}/admin/v2/namespaces/{bundle}/split"
               f"?unload={'true' if unload else 'false'}&splitAlgorithmName={algo}")
        status, body = await http_request("PUT", url, 10.0, body=b"")
        if status >= 300:
            raise RuntimeError(f"{url} answered {status}: {body[:200]!r}")

    # -- splitting on the owner ---------------------------------------------------------------------
    async def split(self, bundle: Bundle, algorithm: str | None, positions: list[int] | None,
                    unload: bool) -> list[Bundle]:
        svc = self.service
        algo, cuts = await split_cuts(svc, self.settings, bundle, algorithm, positions)
        children = await self.ownership.split(bundle, list(cuts))
        self._event("split", bundle=str(bundle), children=[c.range_name for c in children], algorithm=algo,
                    unload=unload, source=self.broker_id)
        if unload:
            for c in children:
                self._event("unload", bundle=str(c), source=self.broker_id, destination=None, reason="split")
                await svc.unload_bundle(c)
        return children

    # -- the decision log ------------------------------------------------------------------------------
    def _event(self, event: str, **fields: Any) -> None:
        """One decision, as an `LB_EVENT {json}` line of the broker's log (shared.DecisionLog)."""
        self.events.event(event, **fields)
