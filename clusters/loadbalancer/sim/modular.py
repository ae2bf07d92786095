"""The modular load manager (ModularLoadManagerImpl) in simulated time: the brokers' LocalBrokerData
reports built by `LocalBrokerData.update` and written when `need_broker_data_update` says so; the
leader's decisions from `ModularLeader` (modular_leader.py): `refresh`, `select`, `shed`, `splits`,
the very object the reference broker's modular.py wraps. What this file adds is only what the broker's
wrapper does with I/O: ZooKeeper (a queue with latencies), HTTP redirects and unload calls, timers.

- Lookup of an unowned bundle: a broker, a redirect to the leader, the leader's synchronized
  selectBrokerForAssignment (one at a time, params.leader_assign_ms each), a redirect to the chosen
  broker, its ownership lock (a metadata write); the bundle's other lookups wait for that one.
- The leader: the first live broker (ZooKeeper's election); a new leader starts a new ModularLeader
  (a new term: fresh load data, no affinity, no grace memory, as a newly elected Pulsar leader).
- Leader rounds: updateAll when a report changed (at most every report interval), the bundle split
  task every loadBalancerSplitIntervalMinutes, shedding every loadBalancerSheddingIntervalMinutes.
- An unload with a destination sets the bundle's affinity on the leader, then the owner closes the
  bundle (its publishers reconnect; their lookups go to the destination).
"""
from __future__ import annotations

import copy
from typing import Any, Callable

from clusters.loadbalancer.data import LocalBrokerData, bundle_bounds, bundle_name, namespace_of, need_broker_data_update
from clusters.loadbalancer.modular_leader import ModularLeader
from clusters.loadbalancer.splitting import child_ranges, split_boundaries
from clusters.loadbalancer.sim.cluster import Cluster
from clusters.loadbalancer.sim.events import Server


def _snapshot(d: LocalBrokerData) -> LocalBrokerData:
    s = copy.copy(d)
    s.bundles = set(d.bundles)
    s.lastStats = dict(d.lastStats)
    s.lastBundleGains, s.lastBundleLosses = set(d.lastBundleGains), set(d.lastBundleLosses)
    return s


class ModularCluster(Cluster):
    load_manager = "modular"

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.local: dict[str, LocalBrokerData] = {}
        self.written: dict[str, LocalBrokerData] = {}
        self.registry: dict[str, LocalBrokerData] = {}       # /loadbalance/brokers as the leader reads it
        self.reg_dirty = True
        self.leader: str | None = None
        self.lead: ModularLeader | None = None
        self.leader_q = Server(self.sim, self.p.leader_assign_ms)
        self.zk = Server(self.sim, self.p.metadata_write_service_ms)
        self.last_shed = 0
        self.last_split = 0
        self.terms = 0

    # -- leader election -------------------------------------------------------------------------
    def _elect(self) -> None:
        live = self.live()
        new = live[0] if live else None
        if new != self.leader:
            self.leader = new
            self.lead = ModularLeader(self.settings, self.rng) if new else None
            self.reg_dirty = True
            self.terms += 1
            self.last_shed = self.last_split = self.sim.now_ms
            if new:
                self.event("leader", broker=new)

    def broker_started(self, broker: str) -> None:
        self.local[broker] = LocalBrokerData(webServiceUrl=f"http://{broker}",
                                             pulsarServiceUrl=f"pulsar://{self.brokers[broker].name}:6650")
        self.written.pop(broker, None)
        self._report(broker)
        if self.leader is None:
            self._elect()

    def broker_stopping(self, broker: str) -> None:
        pass

    def broker_stopped(self, broker: str) -> None:
        self.registry.pop(broker, None)
        self.reg_dirty = True
        if self.leader == broker:
            self.leader = None
            self._elect()

    # -- lookups and assignment ------------------------------------------------------------------
    def lookup(self, bundle: str, answer: Callable[[str | None], None]) -> None:
        b = self.bundles.get(bundle)
        if b is None:
            self.sim.after(self.p.lookup_ms, answer, None)
            return
        if b.owner is not None and self.brokers[b.owner].up:
            self.sim.after(self.p.lookup_ms, answer, b.owner)
            return
        b.waiters.append(answer)
        if b.assigning:
            return
        b.assigning = True
        self.sim.after(self.p.lookup_ms + self.p.redirect_ms, self._to_leader, bundle)

    def _fail(self, bundle: str) -> None:
        b = self.bundles.get(bundle)
        if b is None:
            return
        waiters, b.waiters, b.assigning = b.waiters, [], False
        for w in waiters:
            w(None)

    def _to_leader(self, bundle: str) -> None:
        if self.leader is None or self.lead is None:
            self._fail(bundle)
            return
        self.leader_q.submit(self._assign, bundle, self.leader)

    def _assign(self, bundle: str, leader: str) -> None:
        if leader != self.leader or self.lead is None or bundle not in self.bundles:
            self._fail(bundle)
            return
        if self.reg_dirty:
            self._refresh()
        choice = self.lead.select(bundle)
        if choice.broker is None or not self.brokers[choice.broker].up:
            self._fail(bundle)
            return
        self.counts["assignments"] += 1
        self.event("assign", bundle=bundle, destination=choice.broker, reason=choice.reason, leader=leader)
        life = self.brokers[choice.broker].epoch
        done = self.zk.submit(lambda: None)           # the ownership lock: one metadata write
        self.sim.at(done + self.p.redirect_ms + self.p.metadata_write_ms, self._locked, bundle, choice.broker, life)

    def _locked(self, bundle: str, broker: str, life: int) -> None:
        b = self.bundles.get(bundle)
        br = self.brokers[broker]
        if b is None or not br.up or br.epoch != life:
            self._fail(bundle)
            return
        if b.owner is None:
            self.own_bundle(bundle, broker)
        waiters, b.waiters, b.assigning = b.waiters, [], False
        for w in waiters:
            w(b.owner)

    # -- reports -----------------------------------------------------------------------------------
    def _report(self, broker: str) -> None:
        br = self.brokers[broker]
        local = self.local[broker]
        if br.dirty or self.noisy or br.burst or br.sys_acc_in or br.sys_acc_out:
            u = self.usage(br)
            local.update(self.broker_stats(br), cpu=u["cpu"], memory=u["memory"], direct_memory=u["directMemory"],
                         bandwidth_in=u["bandwidthIn"], bandwidth_out=u["bandwidthOut"])
            br.dirty = False
        local.lastUpdate = self.sim.now_ms
        if need_broker_data_update(self.written.get(broker), local, self.settings, self.sim.now_ms):
            snap = _snapshot(local)
            self.written[broker] = snap
            local.clean_deltas()
            self.sim.after(self.p.metadata_write_ms, self._write, broker, snap, br.epoch)
        self.record_load(broker, local.max_resource_usage_with_weight(self.settings),
                         {"msgRateIn": round(local.msgRateIn, 3), "msgRateOut": round(local.msgRateOut, 3)})

    def _write(self, broker: str, snap: LocalBrokerData, epoch: int) -> None:
        br = self.brokers[broker]
        if br.up and br.registered and br.epoch == epoch:
            self.registry[broker] = snap
            self.reg_dirty = True

    def _refresh(self) -> None:
        assert self.lead is not None
        found = self.lead.refresh({b: d for b, d in self.registry.items() if self.brokers[b].registered})
        self.reg_dirty = False
        if found.gone:
            self.event("brokers-gone", brokers=found.gone, leader=self.leader)

    def report_round(self) -> None:
        self.each_report([b for b in self.order if self.brokers[b].up and self.brokers[b].registered], self._report)
        if self.leader is None or self.lead is None:
            return
        now = self.sim.now_ms
        if self.reg_dirty:
            self._refresh()
        if now - self.last_split >= self.settings.loadBalancerSplitIntervalMinutes * 60_000:
            self.last_split = now
            self._splits()
        if now - self.last_shed >= self.settings.loadBalancerSheddingIntervalMinutes * 60_000:
            self.last_shed = now
            self._shed()

    # -- shedding ----------------------------------------------------------------------------------
    def _shed(self) -> None:
        assert self.lead is not None
        plan = self.lead.shed(self.sim.now_ms)
        if plan.skipped:
            return
        self.event("shedding", leader=self.leader, strategy=plan.strategy, unloads=len(plan.unloads))
        for u in plan.unloads:
            self.event("unload", bundle=u.bundle, source=u.src, destination=u.dst,
                       reason=f"shed:{plan.strategy}", leader=self.leader)
            self.lead.affinity[u.bundle] = u.dst
            self.sim.after(self.p.redirect_ms, self._unload_at_owner, u.bundle, u.src, self.leader)

    def _unload_at_owner(self, bundle: str, src: str, leader: str | None) -> None:
        b = self.bundles.get(bundle)
        if b is None or b.owner != src or not self.brokers[src].up:
            if self.lead is not None and leader == self.leader:
                self.lead.unload_failed(bundle)
            return
        self.counts["unloads"] += 1
        self.mark("unload", bundle)
        done = self.zk.submit(lambda: None)          # the ownership lock deleted
        self.close_bundle(bundle, src, disconnect=False)
        self.sim.at(done + self.p.metadata_write_ms, self._disconnect_bundle, bundle, src)

    def _disconnect_bundle(self, bundle: str, src: str) -> None:
        b = self.bundles.get(bundle)
        if b is None:
            return
        for t in list(b.topics):
            if self.t_broker[t] == src:
                self.disconnect(t)

    # -- splits ------------------------------------------------------------------------------------
    def _splits(self) -> None:
        assert self.lead is not None
        for sp in self.lead.splits():
            b = self.bundles.get(sp.bundle)
            if b is None or sp.owner is None or b.owner != sp.owner:
                continue
            ns = namespace_of(sp.bundle)
            lo, hi = bundle_bounds(sp.bundle)
            names = [self.t_name[t] for t in b.topics]
            cuts = split_boundaries(self.settings.defaultNamespaceBundleSplitAlgorithm, lo, hi, self.settings,
                                    topics=names)
            if not cuts:
                continue
            children = [bundle_name(ns, a, c) for a, c in child_ranges(lo, hi, cuts)]
            self.counts["splits"] += 1
            self.mark("split", sp.bundle)
            self.event("split", bundle=sp.bundle, source=sp.owner, reason=sp.reason, leader=self.leader,
                       children=[c.rsplit("/", 1)[1] for c in children],
                       unload=self.settings.loadBalancerAutoUnloadSplitBundlesEnabled)
            owner = sp.owner
            connected = [t for t in b.topics if self.t_broker[t] == owner]
            self.close_bundle(sp.bundle, owner, disconnect=False)
            self.replace_bundle(sp.bundle, children)
            for c in children:
                self.own_bundle(c, owner)
            if self.settings.loadBalancerAutoUnloadSplitBundlesEnabled:
                for c in children:
                    self.event("unload", bundle=c, source=owner, destination=None, reason="split", leader=self.leader)
                    self.close_bundle(c, owner, disconnect=False)
                for t in connected:
                    if self.t_broker[t] == owner:
                        self.disconnect(t)
