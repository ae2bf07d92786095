"""The extensible load manager (ExtensibleLoadManagerImpl, PIP-192) in simulated time, driving the pure
core of clusters/loadbalancer/extensible/: the service-unit channel as one ordered log applied through
`ChannelView` (the conflict resolver) and `handle_event` (what each broker does with a message), lookups
answered by `get_owner` and assigned by any broker with `load_data.select_broker` + `assign_event`,
`BrokerLoadData` reports with `need_broker_load_data_update`, `top_k_bundles`, the leader's
`TransferShedder` and ownership monitor (`monitor_ownerships` / `plan_overrides`), and every broker's
`SplitScheduler`.

One table view serves every broker: Pulsar's brokers read the same topic in the same order and the
resolver is deterministic, so their views are equal (state.py); each accepted message runs
`handle_event` for the brokers it names (source, destination) — every other broker's actions for it
are only to complete its own pending lookups, which the simulator does once per bundle. A broker's
concurrent lookups of one bundle are deduplicated (Pulsar dedupes per broker; the simulator for the
whole cluster: one assignment in flight per bundle).

Graceful shutdown: the broker transfers its bundles away (ServiceUnitStateChannel.cleanOwnerships:
override_ownership with graceful=True, a broker selected for each), then leaves.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Callable

from clusters.loadbalancer.data import namespace_of
from clusters.loadbalancer.extensible.handlers import (BundleOwned, CloseServiceUnit, CompleteLookups, FailLookups,
                                                       Publish, Tombstone, UpdateNamespaceBundles, assign_event,
                                                       get_owner, handle_event, handle_skipped, split_event,
                                                       unload_event)
from clusters.loadbalancer.extensible.load_data import (BrokerLoadData, TopBundlesLoadData,
                                                        need_broker_load_data_update, select_broker, top_k_bundles)
from clusters.loadbalancer.extensible.monitor import (MetadataState, cleanup_targets, monitor_ownerships,
                                                      override_ownership, plan_overrides)
from clusters.loadbalancer.extensible.split_scheduler import SplitScheduler
from clusters.loadbalancer.extensible.state import ChannelView, ServiceUnitStateData
from clusters.loadbalancer.extensible.transfer_shedder import TransferShedder
from clusters.loadbalancer.sim.cluster import Cluster
from clusters.loadbalancer.sim.events import Server

OBSERVER = "-observer-"
# what our broker wrapper does around the core (extensible_manager.py; test_lb_sim checks they agree): after a
# broker joins, every broker pushes its load data every round for max(this, 4 report intervals), whatever
# the reporter rule says (a non-persistent topic keeps nothing for the newcomer's reader)
REPUBLISH_ON_JOIN_S = 10.0


class ExtensibleCluster(Cluster):
    load_manager = "extensible"

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.view = ChannelView()
        self.chan = Server(self.sim, self.p.channel_service_ms)
        self.load: dict[str, BrokerLoadData] = {}
        self.published: dict[str, BrokerLoadData] = {}        # the broker-load-data table view
        self.top: dict[str, TopBundlesLoadData] = {}          # the top-bundles table view
        self.top_fresh: dict[str, bool] = {}
        self.splitters: dict[str, SplitScheduler] = {}
        self.leader: str | None = None
        self.shedder = TransferShedder()
        self.recent_bundles: dict[str, int] = {}
        self.recent_brokers: dict[str, int] = {}
        self.last_shed = self.last_split = self.last_monitor = 0
        self.rejected = 0
        self._top_sent: dict[str, str] = {}                   # the top-bundles body last published, per broker
        self.republish_until = 0                              # ms: every broker pushes its load data until then
        self.push: set[str] = set()                           # brokers whose next report pushes (new leader)
        self.draining: set[str] = set()                       # stopping: transferring away, timers stopped

    # -- the system topics' traffic ----------------------------------------------------------------
    def system_message(self, payload_bytes: int, readers: int) -> None:
        """A message on a system topic (the channel, the load-data topics): the leader owns them
        (extensible_manager.py), so it reads the message from its producer and writes it to every
        reader; counted in its bandwidth (params.system_msg_overhead_bytes > 0, else not modelled)."""
        over = self.p.system_msg_overhead_bytes
        if over <= 0 or self.leader is None:
            return
        br = self.brokers[self.leader]
        size = payload_bytes + over
        br.sys_acc_in += size
        br.sys_acc_out += size * readers

    # -- the channel -----------------------------------------------------------------------------
    def publish(self, key: str, data: ServiceUnitStateData | None) -> None:
        if self.p.system_msg_overhead_bytes > 0:
            # every broker tails the channel
            self.system_message(len(key) + (len(data.encode()) if data is not None else 0), len(self.live()))
        done = self.chan.submit(lambda: None)
        self.sim.at(done + self.p.channel_ms, self._apply, key, data)

    def _apply(self, key: str, data: ServiceUnitStateData | None) -> None:
        res = self.view.apply(key, data)
        if not res.accepted:
            self.rejected += 1
            for a in handle_skipped(key, res.current):
                if isinstance(a, CompleteLookups):
                    self._complete(key, a.owner)
            return
        mp = self.settings.loadBalancerMultiPhaseBundleUnload
        now = self.sim.now_ms
        for a in handle_event(key, res.previous, data, OBSERVER, view=self.view, multi_phase=mp, now_ms=now):
            if isinstance(a, CompleteLookups):
                self._complete(key, a.owner)
            elif isinstance(a, FailLookups):
                self._complete(key, None)
        if data is None:
            return
        named = [b for b in dict.fromkeys((data.dstBroker, data.sourceBroker)) if b and b in self.brokers]
        for me in named:
            if not self.brokers[me].up:
                continue
            for a in handle_event(key, res.previous, data, me, view=self.view, multi_phase=mp, now_ms=now):
                self._act(me, a)

    def _act(self, me: str, a: Any) -> None:
        if isinstance(a, Publish):
            self.publish(a.key, a.data)
        elif isinstance(a, Tombstone):
            self.publish(a.key, None)
        elif isinstance(a, BundleOwned):
            self.own_bundle(a.key, me)
        elif isinstance(a, CloseServiceUnit):
            self.close_bundle(a.key, me, disconnect=a.disconnect_clients)
        elif isinstance(a, UpdateNamespaceBundles):
            if a.parent in self.bundles:
                self.brokers[me].bundles.discard(a.parent)
                self.brokers[me].dirty = True
                self.replace_bundle(a.parent, list(a.children))
                self.counts["splits"] += 1
                self.mark("split", a.parent)

    def _complete(self, key: str, owner: str | None) -> None:
        b = self.bundles.get(key)
        if b is None:
            return
        waiters, b.waiters, b.assigning = b.waiters, [], False
        for w in waiters:
            w(owner)

    def owns(self, b: Any, broker: str) -> bool:
        """A broker serves what the channel says it owns (a restarted broker finds its Owned records)."""
        if not self.view.is_owner(b.name, broker):
            return False
        if b.owner != broker:
            self.own_bundle(b.name, broker)
        return True

    # -- lookups -----------------------------------------------------------------------------------
    def lookup(self, bundle: str, answer: Callable[[str | None], None]) -> None:
        b = self.bundles.get(bundle)
        live = self.live()
        if b is None or not live:
            self.sim.after(self.p.lookup_ms, answer, None)
            return
        me = live[self.rng.randrange(len(live))]
        ans = get_owner(self.view, bundle, me, live)
        if ans.kind == "owner":
            self.sim.after(self.p.lookup_ms + (self.p.redirect_ms if ans.broker != me else 0), answer, ans.broker)
            return
        if ans.kind == "error":
            self.sim.after(self.p.lookup_ms, answer, None)
            return
        done = [False]

        def once(owner: str | None) -> None:
            if not done[0]:
                done[0] = True
                answer(owner)
        b.waiters.append(once)
        # Pulsar's lookups wait at most the in-flight waiting time, then fail (the client retries)
        self.sim.after(self.settings.loadBalancerInFlightServiceUnitStateWaitingTimeInMillis, once, None)
        if ans.kind == "none" and not b.assigning:
            dst = select_broker(live, self.published, self.settings, self.rng)
            if dst is None:
                self._complete(bundle, None)
                return
            b.assigning = True
            self.counts["assignments"] += 1
            self.event("assign", bundle=bundle, destination=dst, reason="lookup", leader=me)
            self.publish(bundle, assign_event(self.view, bundle, dst, self.sim.now_ms))

    # -- brokers -----------------------------------------------------------------------------------
    def broker_started(self, broker: str) -> None:
        self.load[broker] = BrokerLoadData()
        self.splitters[broker] = SplitScheduler()
        self.top_fresh[broker] = False
        # the others see it register and push their load data every round for a while
        self.republish_until = self.sim.now_ms + int(max(REPUBLISH_ON_JOIN_S * 1000, 4 * self.report_ms))
        self._report(broker)
        if self.leader is None:
            self._elect()

    def _elect(self) -> None:
        live = self.live()
        new = live[0] if live else None
        if new != self.leader:
            self.leader = new
            # playLeader: a fresh scheduler, no memory of recent unloads, the top bundles' table read anew
            self.shedder = TransferShedder()
            self.recent_bundles.clear()
            self.recent_brokers.clear()
            self.top.clear()
            self.last_shed = self.last_monitor = self.sim.now_ms
            # the load-data topics moved: every broker pushes its load data and top bundles again
            self.push = set(live)
            self._top_sent.clear()
            for b in live:
                self.top_fresh[b] = False
            if new:
                self.event("leader", broker=new)

    def broker_stopping(self, broker: str) -> None:
        """cleanOwnerships: every bundle the broker owns is transferred (graceful override); its timers
        stop (report_round), while it stays registered until it is gone, as our broker's stop."""
        self.draining.add(broker)
        others = [b for b in self.live() if b != broker]
        now = self.sim.now_ms
        for key in cleanup_targets(self.view, broker):
            orphan = self.view.get(key)
            sel = select_broker(others, self.published, self.settings, self.rng) if others else None
            self.publish(key, override_ownership(key, orphan, sel, True, now))

    def broker_stopped(self, broker: str) -> None:
        self.draining.discard(broker)
        self._top_sent.pop(broker, None)
        self.published.pop(broker, None)
        self.top.pop(broker, None)
        self.load.pop(broker, None)
        if self.leader == broker:
            self.leader = None
            self._elect()

    # -- reports -----------------------------------------------------------------------------------
    def _report(self, broker: str) -> None:
        br = self.brokers[broker]
        bl = self.load[broker]
        changed = br.dirty
        stats = self.broker_stats(br) if changed or not self.top_fresh.get(broker) or self.stats_ms else None
        u = self.usage(br)
        now = self.sim.now_ms
        if self.stats_ms and stats is not None:
            # the broker's rates as its stats show them (recomputed every stats_interval_ms: always read)
            sums = [sum(getattr(x, k) for x in stats.values())
                    for k in ("msgThroughputIn", "msgThroughputOut", "msgRateIn", "msgRateOut")]
            bl.update(u, *sums, len(br.bundles), br.topics, self.settings, now)
        else:
            bl.update(u, br.bytes_in, br.bytes_out, br.rate_in, br.rate_out, len(br.bundles), br.topics,
                      self.settings, now)
        br.dirty = False
        if stats is not None:
            self.top_fresh[broker] = True
            top = top_k_bundles(stats, self.settings.loadBalancerMaxNumberOfBundlesInBundleLoadReport,
                                self.settings.loadBalancerSheddingExcludedNamespaces)
            self.sim.after(self.p.channel_ms, self._set_top, broker, top, br.epoch)
            if self.p.system_msg_overhead_bytes > 0:
                # the broker publishes its top bundles when they changed; the leader reads them
                body = json.dumps(top.to_json(), sort_keys=True)
                if body != self._top_sent.get(broker):
                    self._top_sent[broker] = body
                    self.system_message(len(broker) + len(body), 1)
        if (need_broker_load_data_update(self.published.get(broker), bl, self.settings, now)
                or now < self.republish_until or broker in self.push):
            self.push.discard(broker)
            snap = copy.copy(bl)
            snap.mark_reported(now)
            self.sim.after(self.p.channel_ms, self._set_load, broker, snap, br.epoch)
            if self.p.system_msg_overhead_bytes > 0:
                # every broker reads every broker's load data
                self.system_message(len(broker) + len(json.dumps(snap.to_json())), len(self.live()))
        self.record_load(broker, bl.max_resource_usage_with_weight(self.settings),
                         {"weightedMaxEMA": round(bl.weightedMaxEMA, 5)})

    def _set_load(self, broker: str, snap: BrokerLoadData, epoch: int) -> None:
        if self.brokers[broker].up and self.brokers[broker].epoch == epoch:
            self.published[broker] = snap

    def _set_top(self, broker: str, top: TopBundlesLoadData, epoch: int) -> None:
        if self.brokers[broker].up and self.brokers[broker].epoch == epoch:
            self.top[broker] = top

    def report_round(self) -> None:
        # a stopping broker's timers (reporter, split scheduler, the leader's tasks) are cancelled first
        # (extensible_manager.py stop): its last published load data stays as it was
        live = [b for b in self.live() if b not in self.draining]
        self.each_report(live, self._report)
        now = self.sim.now_ms
        s = self.settings
        if now - self.last_split >= s.loadBalancerSplitIntervalMinutes * 60_000:
            self.last_split = now
            for b in live:
                self._split(b)
        if self.leader is None or self.leader in self.draining:
            return
        registered = self.live()        # the leader sees a stopping broker until it unregisters
        if now - self.last_shed >= s.loadBalancerSheddingIntervalMinutes * 60_000:
            self.last_shed = now
            self._shed(registered)
        if now - self.last_monitor >= s.loadBalancerServiceUnitStateMonitorIntervalInSeconds * 1000:
            self.last_monitor = now
            self._monitor(registered)

    def reporting(self, broker: str) -> bool:
        return broker not in self.draining

    # -- the leader: shedding and the monitor -------------------------------------------------------
    def _shed(self, live: list[str]) -> None:
        s = self.settings
        now = self.sim.now_ms
        grace = s.loadBalancerSheddingGracePeriodMinutes * 60_000
        for k in [k for k, t in self.recent_bundles.items() if now - t > grace]:
            del self.recent_bundles[k]
        if not (s.loadBalancerEnabled and s.loadBalancerSheddingEnabled):
            return
        res = self.shedder.find_bundles_for_unloading(
            broker_load={b: d for b, d in self.published.items() if b in live}, top_bundles=self.top,
            available_brokers=live, recently_unloaded_bundles=self.recent_bundles,
            recently_unloaded_brokers=self.recent_brokers, settings=s, now_ms=now, view=self.view)
        self.event("shedding", leader=self.leader, label=res.label, reason=res.reason, std=round(res.std, 4),
                   unloads=len(res.decisions))
        for d in res.decisions:
            u = d.unload
            try:
                rec = unload_event(self.view, u.serviceUnit, u.sourceBroker, u.destBroker, now_ms=now)
            except ValueError:
                continue
            self.counts["unloads"] += 1
            self.mark("unload", u.serviceUnit)
            self.event("unload", bundle=u.serviceUnit, source=u.sourceBroker, destination=u.destBroker,
                       reason=f"shed:TransferShedder:{d.reason}", leader=self.leader)
            self.recent_bundles[u.serviceUnit] = now
            self.recent_brokers[u.sourceBroker] = now       # the source only, as the broker's shed() records
            self.publish(u.serviceUnit, rec)

    def _monitor(self, live: list[str]) -> None:
        now = self.sim.now_ms
        dec = monitor_ownerships(self.view, now, live, MetadataState.Stable, self.settings)
        if dec.skipped:
            return

        def select(key: str, excluded: set[str]) -> str | None:
            return select_broker([b for b in live if b not in excluded], self.published, self.settings, self.rng)
        for key, rec in plan_overrides(dec, select, live, now):
            self.event("override", bundle=key, destination=rec.dstBroker, leader=self.leader)
            self.publish(key, rec)
        for key in dec.tombstones:
            self.publish(key, None)

    # -- splits (every broker, its own bundles) ------------------------------------------------------
    def _split(self, broker: str) -> None:
        br = self.brokers[broker]
        stats = self.broker_stats(br)
        counts = {ns: self.ns_bundle_count(ns) for ns in {namespace_of(b) for b in stats}}
        topics = None
        if self.settings.defaultNamespaceBundleSplitAlgorithm == "topic_count_equally_divide":
            topics = {b: [self.t_name[t] for t in self.bundles[b].topics] for b in stats}
        res = self.splitters[broker].decide(stats, me=broker, view=self.view, bundle_counts=counts,
                                            settings=self.settings, topics=topics)
        for d in res.decisions:
            self.event("split", bundle=d.bundle, source=broker, reason=d.reason, leader=broker,
                       children=sorted(d.children))
            self.publish(d.bundle, split_event(self.view, d.bundle, broker, d.children, self.sim.now_ms))
