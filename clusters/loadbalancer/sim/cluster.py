"""What both simulated load managers share: namespaces and their bundles, topics and their publishers,
brokers with capacities and load signals, clients that reconnect with back-off, the scenario's events,
the LB_EVENT records and the measurements. A load manager subclass provides `lookup`, `unload`,
the reports and the leader's rounds by calling the load manager's own code.

Model, in short (each number a parameter of params.py):
- A topic belongs to the bundle of its namespace whose range holds the CRC-32 of its name (as the
  brokers hash). Its publishers (the scenario's publishers spread over the topics) are one group: they
  disconnect and reconnect together.
- A disconnected topic's publishers look the topic up after the client's back-off (100 ms doubling to
  60 s, 10 % jitter): the load manager answers the bundle's owner, assigning one if there is none;
  the owner then loads the topic (topic_load_ms, topic_load_concurrency loads at once per broker).
  Then the topic is connected and its rate counts on its broker.
- A broker's load signals come from its connected topics: CPU = base + cpu_per_msg_us per message in
  and out over cpu_cores; bandwidth in/out = bytes/s over nic_mbytes. These fill the load report the
  load manager's own code builds (LocalBrokerData.update / BrokerLoadData.update).
- A restart or a leave is graceful: the broker's bundles are unloaded (their topics disconnect), the
  broker leaves the registry after graceful_unload_ms, and (restart) registers again after
  broker_restart_ms.
"""
from __future__ import annotations

import bisect
import math
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from clusters.loadbalancer.bundles import initial_boundaries
from clusters.loadbalancer.data import NamespaceBundleStats, ResourceUsage, bundle_bounds, bundle_name, namespace_of
from clusters.loadbalancer.settings import LoadBalancerSettings
from clusters.loadbalancer.sim.events import Sim
from clusters.loadbalancer.sim.params import SimParams
from clusters.loadbalancer.sim.scenario import Scenario

FULL_UPPER = 0xFFFFFFFF


def counted_noise(kb_s: float, z: float, dispersion_kb: float, seconds: float) -> float:
    """A report's KB/s as counted over `seconds`: the true rate plus z standard deviations of counting
    noise whose variance is `dispersion_kb` x the KB counted, over seconds squared (an overdispersed
    Poisson count: relative noise falls as 1 / sqrt(rate)); never below 0."""
    if kb_s <= 0 or dispersion_kb <= 0 or seconds <= 0:
        return max(0.0, kb_s)
    return max(0.0, kb_s + z * math.sqrt(dispersion_kb * kb_s / seconds))


@dataclass
class Bundle:
    name: str
    topics: list[int] = field(default_factory=list)
    owner: str | None = None
    waiters: list[Callable[[str | None], None]] = field(default_factory=list)
    assigning: bool = False
    stats: NamespaceBundleStats | None = None      # cached, None when stale
    noise: float = 1.0                              # its rates' factor since the last recomputation

    def __hash__(self) -> int:
        return hash(self.name)


@dataclass
class Broker:
    id: str
    name: str
    up: bool = False
    registered: bool = False
    bundles: set[str] = field(default_factory=set)
    loading: float = 0.0          # when its topic-load queue is free
    dirty: bool = True
    rate_in: float = 0.0
    rate_out: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    topics: int = 0
    epoch: int = 0                # bumped on every stop: callbacks of an older life are dropped
    sys_acc_in: float = 0.0       # bytes beyond the topics' messages served here since the last report: the
    sys_acc_out: float = 0.0      # extensible load manager's system topics, topics' clients connecting
    sys_at: int = 0               # when the last report took them
    burst: bool = False           # the last report carried some: the next is a new sample


class Cluster:
    """The simulated cluster; subclasses: modular.ModularCluster, extensible.ExtensibleCluster."""
    load_manager = "?"

    def __init__(self, scenario: Scenario, settings: LoadBalancerSettings, params: SimParams, seed: int = 1,
                 progress: Callable[[str], None] | None = None):
        self.sc, self.settings, self.p = scenario, settings, params
        self.sim = Sim(seed)
        self.rng = self.sim.rng
        self.progress = progress
        self.report_ms = max(50, settings.loadBalancerReportUpdateMinIntervalMillis)
        self.noisy = params.report_noise > 0 or params.report_noise_kb > 0    # every report a new sample
        # brokers
        self.brokers: dict[str, Broker] = {}
        for i in range(scenario.brokers):
            name = f"broker-{i + 1}"
            self.brokers[f"{name}:8080"] = Broker(f"{name}:8080", name)
        self.order = list(self.brokers)
        self._live: list[str] | None = None
        self.phase: dict[str, float] = {}                 # ms into each report round (params.report_phase)
        # namespaces and bundles
        self.ns_names = [f"sim/ns-{i}" for i in range(scenario.namespaces)]
        per = [scenario.bundles // scenario.namespaces + (1 if i < scenario.bundles % scenario.namespaces else 0)
               for i in range(scenario.namespaces)]
        self.bounds: dict[str, list[int]] = {}           # namespace -> lower bounds of its bundles, sorted
        self.uppers: dict[str, list[int]] = {}
        self.bundles: dict[str, Bundle] = {}
        for ns, n in zip(self.ns_names, per):
            b = initial_boundaries(n)
            self.bounds[ns], self.uppers[ns] = b[:-1], b[1:]
            for lo, hi in zip(b, b[1:]):
                name = bundle_name(ns, lo, hi)
                self.bundles[name] = Bundle(name)
        # topics
        n = scenario.topics
        weights = [1.0 / (i + 1) ** scenario.skew for i in range(n)] if scenario.skew > 0 else [1.0] * n
        total_w = sum(weights)
        self.t_name: list[str] = []
        self.t_ns: list[str] = []
        self.t_hash: list[int] = []
        self.t_rate: list[float] = [scenario.msg_rate * w / total_w for w in weights]
        self.t_pubs: list[int] = [scenario.publishers // n + (1 if i < scenario.publishers % n else 0) for i in range(n)]
        self.t_bundle: list[str] = []
        self.t_broker: list[str | None] = [None] * n    # where it is connected (None: disconnected)
        self.t_attempt: list[int] = [0] * n
        self.t_since: list[int] = [0] * n                # ms it was disconnected at
        self.t_pending: list[bool] = [False] * n         # a reconnect is scheduled
        self.t_epoch: list[int] = [0] * n                # bumped on every disconnect
        self.t_conn: list[int] = [0] * n                 # ms it connected at
        # the brokers' rates are recomputed every stats_interval_ms (0: exact at every moment)
        self.stats_ms = params.stats_interval_ms
        self.stats_at = 0                                # ms of the last recomputation
        for i in range(n):
            ns = self.ns_names[i % scenario.namespaces]
            name = f"persistent://{ns}/t-{i}"
            self.t_name.append(name)
            self.t_ns.append(ns)
            h = zlib.crc32(name.encode()) & 0xFFFFFFFF
            self.t_hash.append(h)
            b = self.bundle_for(ns, h)
            self.t_bundle.append(b)
            self.bundles[b].topics.append(i)
        self.msg_size = scenario.msg_size
        self.subs = scenario.subscriptions
        self.total_pubs = sum(self.t_pubs)
        # measurements
        self.connected_pubs = 0
        self.lb_events: list[tuple[int, dict[str, Any]]] = []
        self.nemesis: list[tuple[int, str, str, dict[str, Any]]] = []     # (ms, type, f, value)
        self.reconnect_curve: list[tuple[float, int]] = []
        self.load_series: dict[str, list[tuple[float, float]]] = {b: [] for b in self.brokers}
        self.topic_series: list[tuple[float, dict[str, int]]] = []
        self.gaps: list[tuple[int, int, float]] = []                      # (start ms, end ms, topic rate)
        self.counts = {"unloads": 0, "splits": 0, "assignments": 0, "lookups": 0, "topic_loads": 0}
        self.marks: list[tuple[float, str, str]] = []                     # (s, kind, detail) for the plots
        self.first_event_ms: int | None = None
        self.restarts_done_ms: int | None = None          # the last restarted broker back
        self.wall_start = time.monotonic()

    # ------------------------------------------------------------------------------------- topology
    def bundle_for(self, ns: str, h: int) -> str:
        lows = self.bounds[ns]
        i = bisect.bisect_right(lows, h) - 1
        return bundle_name(ns, lows[i], self.uppers[ns][i])

    def live(self) -> list[str]:
        """The registered brokers, in order (kept until a broker starts or stops; do not modify)."""
        if self._live is None:
            self._live = [b for b in self.order if self.brokers[b].up and self.brokers[b].registered]
        return self._live

    def ns_bundle_count(self, ns: str) -> int:
        return len(self.bounds[ns])

    def replace_bundle(self, parent: str, children: list[str]) -> None:
        """A split's boundaries: `parent` becomes `children` (full names); its topics are rehashed."""
        ns = namespace_of(parent)
        lo, hi = bundle_bounds(parent)
        i = self.bounds[ns].index(lo)
        cb = [bundle_bounds(c) for c in children]
        cb.sort()
        self.bounds[ns][i:i + 1] = [c[0] for c in cb]
        self.uppers[ns][i:i + 1] = [c[1] for c in cb]
        old = self.bundles.pop(parent)
        for c in children:
            self.bundles.setdefault(c, Bundle(c))
        for t in old.topics:
            b = self.bundle_for(ns, self.t_hash[t])
            self.t_bundle[t] = b
            self.bundles[b].topics.append(t)
        for c in children:
            self.bundles[c].stats = None

    # ------------------------------------------------------------------------------------- events log
    def event(self, kind: str, **fields: Any) -> None:
        fields["event"] = kind
        self.lb_events.append((self.sim.now_ms, fields))

    def mark(self, kind: str, detail: str) -> None:
        self.marks.append((self.sim.now_ms / 1000, kind, detail))

    # ------------------------------------------------------------------------------------- load signals
    def stats_weight(self, t: int) -> float:
        """The share of a connected topic's rate its broker's stats show: all of it with exact stats;
        with stats recomputed every stats_interval_ms (the brokers' Rates), the rate of the last
        recomputation: nothing before the first one since it connected, the part of the interval it
        was connected for at the first (its counters start at zero), all of it after."""
        if not self.stats_ms:
            return 1.0
        since = self.t_conn[t]
        if since > self.stats_at:
            return 0.0
        return min(1.0, (self.stats_at - since) / self.stats_ms)

    def _stats_pass(self) -> None:
        self.stats_at = self.sim.now_ms
        d = self.p.report_noise_kb
        for b in self.bundles.values():
            b.stats = None
            if d > 0:
                # a recomputed rate is a count over the interval: its relative noise is a report's at
                # this bundle's bytes over stats_interval_ms (one draw for the bundle's topics)
                kb = sum(self.t_rate[t] for t in b.topics) * self.msg_size / 1024
                b.noise = counted_noise(kb, self.rng.gauss(0, 1), d, self.stats_ms / 1000) / kb if kb > 0 else 1.0
        for br in self.brokers.values():
            br.dirty = True

    def bundle_stats(self, b: Bundle) -> NamespaceBundleStats:
        if b.stats is None:
            s = NamespaceBundleStats()
            for t in b.topics:
                if self.t_broker[t] is not None:
                    r = self.t_rate[t] * self.stats_weight(t) * b.noise
                    s.msgRateIn += r
                    s.msgThroughputIn += r * self.msg_size
                    s.msgRateOut += r * self.subs
                    s.msgThroughputOut += r * self.msg_size * self.subs
                    s.topics += 1
                    s.producerCount += self.t_pubs[t]
                    s.consumerCount += self.subs
            b.stats = s
        return b.stats

    def broker_stats(self, br: Broker) -> dict[str, NamespaceBundleStats]:
        return {name: self.bundle_stats(self.bundles[name]) for name in sorted(br.bundles) if name in self.bundles}

    def usage(self, br: Broker) -> dict[str, ResourceUsage]:
        """The broker's resource usage from its connected topics (Pulsar's units: CPU percent of
        100 x cores, bandwidth KB/s, memory MB)."""
        p = self.p
        cap = self.sc.capacity.get(br.name, {})
        cores = max(1.0, cap.get("cpu_cores", p.cpu_cores))
        noise = [1.0, 1.0, 1.0]
        if p.report_noise > 0:
            noise = [max(0.0, 1 + self.rng.gauss(0, p.report_noise)) for _ in range(3)]
            br.dirty = True              # the next report is a new sample
        kb_in, kb_out = br.bytes_in / 1024 * noise[1], br.bytes_out / 1024 * noise[2]
        if p.base_kb_s > 0:
            kb_in, kb_out = kb_in + p.base_kb_s, kb_out + p.base_kb_s
        if br.sys_acc_in or br.sys_acc_out:
            span = max(self.report_ms, self.sim.now_ms - br.sys_at) / 1000
            kb_in += br.sys_acc_in / 1024 / span
            kb_out += br.sys_acc_out / 1024 / span
            br.sys_acc_in = br.sys_acc_out = 0.0
            br.burst = True              # the next report is without them
        else:
            br.burst = False
        br.sys_at = self.sim.now_ms
        if p.report_noise_kb > 0:
            # counting noise: one draw for both directions (a second's messages are counted on the way in
            # and out alike), its variance report_noise_kb x the KB/s over the report's seconds
            z = self.rng.gauss(0, 1)
            kb_in, kb_out = (counted_noise(kb_in, z, p.report_noise_kb, self.report_ms / 1000),
                             counted_noise(kb_out, z, p.report_noise_kb, self.report_ms / 1000))
            br.dirty = True
        cpu = p.base_cpu_percent * cores + (br.rate_in + br.rate_out) * p.cpu_per_msg_us / 1e6 * 100 * noise[0]
        nic_kb = cap.get("nic_mbytes", p.nic_mbytes) * 1024
        return {"cpu": ResourceUsage(cpu, 100.0 * cores),
                "memory": ResourceUsage(1024.0, 8192.0),
                "directMemory": ResourceUsage(256.0, 4096.0),
                "bandwidthIn": ResourceUsage(kb_in, nic_kb),
                "bandwidthOut": ResourceUsage(kb_out, nic_kb)}

    def _account(self, t: int, broker: str, sign: int) -> None:
        br = self.brokers[broker]
        r = self.t_rate[t] * sign
        br.rate_in += r
        br.rate_out += r * self.subs
        br.bytes_in += r * self.msg_size
        br.bytes_out += r * self.msg_size * self.subs
        br.topics += sign
        br.dirty = True
        self.bundles[self.t_bundle[t]].stats = None

    # ------------------------------------------------------------------------------------- clients
    def start_clients(self) -> None:
        for t in range(len(self.t_name)):
            if self.t_pubs[t] > 0:
                self.t_since[t] = 0
                self.t_pending[t] = True
                self.sim.at(self.rng.random() * 1000, self._lookup_topic, t, self.t_epoch[t])

    def disconnect(self, t: int) -> None:
        """The topic's publishers lose their broker (an unload, a restart): they reconnect after back-off."""
        b = self.t_broker[t]
        if b is None:
            return
        self._account(t, b, -1)
        self.t_broker[t] = None
        self.connected_pubs -= self.t_pubs[t]
        self.t_since[t] = self.sim.now_ms
        self.t_attempt[t] = 0
        self.t_epoch[t] += 1
        self._retry(t)

    def _retry(self, t: int) -> None:
        p = self.p
        a = self.t_attempt[t]
        self.t_attempt[t] = a + 1
        delay = min(p.backoff_max_ms, p.backoff_initial_ms * (2 ** min(a, 20)))
        delay *= 1 + self.rng.random() * p.backoff_jitter
        self.t_pending[t] = True
        self.sim.after(delay, self._lookup_topic, t, self.t_epoch[t])

    def _lookup_topic(self, t: int, epoch: int) -> None:
        if epoch != self.t_epoch[t] or self.t_broker[t] is not None:
            return
        self.counts["lookups"] += 1
        bundle = self.t_bundle[t]

        def answered(owner: str | None) -> None:
            if epoch != self.t_epoch[t] or self.t_broker[t] is not None:
                return
            if owner is None or not self.brokers[owner].up or bundle != self.t_bundle[t]:
                self._retry(t)
                return
            self._load_topic(t, owner, bundle, epoch)
        self.lookup(bundle, answered)

    def _load_topic(self, t: int, owner: str, bundle: str, epoch: int) -> None:
        br = self.brokers[owner]
        p = self.p
        start = max(float(self.sim.now_ms), br.loading)
        br.loading = start + p.topic_load_ms / max(1, p.topic_load_concurrency)
        life = br.epoch
        self.counts["topic_loads"] += 1

        def loaded() -> None:
            if epoch != self.t_epoch[t] or self.t_broker[t] is not None:
                return
            b = self.bundles.get(self.t_bundle[t])
            if not br.up or br.epoch != life or b is None or not self.owns(b, owner):
                self._retry(t)             # the bundle moved while loading: the client is redirected
                return
            self.t_broker[t] = owner
            self.t_conn[t] = self.sim.now_ms
            self._account(t, owner, +1)
            if p.connect_kb_in or p.connect_kb_out:
                # its clients' lookups, producer and consumer commands, counted in the broker's next report
                br.sys_acc_in += p.connect_kb_in * 1024
                br.sys_acc_out += p.connect_kb_out * 1024
            self.connected_pubs += self.t_pubs[t]
            self.gaps.append((self.t_since[t], self.sim.now_ms, self.t_rate[t]))
            self.t_pending[t] = False
        self.sim.at(start + p.topic_load_ms, loaded)

    def close_bundle(self, name: str, broker: str, disconnect: bool = True) -> None:
        """The broker stops serving `name`: its topics' publishers disconnect (if `disconnect`)."""
        br = self.brokers[broker]
        br.bundles.discard(name)
        br.dirty = True
        b = self.bundles.get(name)
        if b is None:
            return
        if b.owner == broker:
            b.owner = None
        if disconnect:
            for t in list(b.topics):
                if self.t_broker[t] == broker:
                    self.disconnect(t)

    def own_bundle(self, name: str, broker: str) -> None:
        b = self.bundles.get(name)
        if b is None:
            return
        b.owner = broker
        self.brokers[broker].bundles.add(name)
        self.brokers[broker].dirty = True
        # topics connected elsewhere under this bundle (a stale owner) are moved by their clients
        for t in b.topics:
            cur = self.t_broker[t]
            if cur is not None and cur != broker:
                self.disconnect(t)

    # ------------------------------------------------------------------------------------- interface
    def owns(self, b: Bundle, broker: str) -> bool:
        """Whether `broker` serves `b` when a topic of it is loaded there."""
        return b.owner == broker

    def lookup(self, bundle: str, answer: Callable[[str | None], None]) -> None:
        raise NotImplementedError

    def broker_started(self, broker: str) -> None:
        raise NotImplementedError

    def broker_stopping(self, broker: str) -> None:
        """Graceful shutdown begins: the load manager unloads the broker's bundles."""
        raise NotImplementedError

    def broker_stopped(self, broker: str) -> None:
        raise NotImplementedError

    def report_round(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------- brokers
    def start_broker(self, broker: str) -> None:
        br = self.brokers[broker]
        if br.up:
            return
        br.up = True
        br.dirty = True
        self._live = None
        self.sim.after(self.p.metadata_write_ms, self._registered, broker, br.epoch)

    def _registered(self, broker: str, epoch: int) -> None:
        br = self.brokers[broker]
        if br.up and br.epoch == epoch:
            br.registered = True
            self._live = None
            if self.p.report_phase > 0:
                # its reporter's timer starts with the broker: its own offset into every report round
                self.phase[broker] = self.rng.random() * min(1.0, self.p.report_phase) * self.report_ms
            self.broker_started(broker)

    def each_report(self, brokers: list[str], report: Callable[[str], None]) -> None:
        """`report` for each broker of this round: at once (params.report_phase 0: every reporter in
        phase), or each at its own offset into the round (a broker gone or stopped by then is skipped)."""
        if self.p.report_phase <= 0:
            for b in brokers:
                report(b)
            return
        for b in brokers:
            self.sim.after(self.phase.get(b, 0.0), self._phased, b, self.brokers[b].epoch, report)

    def _phased(self, broker: str, epoch: int, report: Callable[[str], None]) -> None:
        br = self.brokers[broker]
        if br.up and br.registered and br.epoch == epoch and self.reporting(broker):
            report(broker)

    def reporting(self, broker: str) -> bool:
        """Whether the broker's reporter still runs (a subclass: not once its stop began)."""
        return True

    def stop_broker(self, broker: str, then_restart: bool = False, then: Callable[[], None] | None = None) -> None:
        """A graceful stop: the load manager's part at once, the broker gone graceful_unload_ms later;
        `then` runs once it is gone (the scale nemesis stops the next broker when the last has exited)."""
        br = self.brokers[broker]
        if not br.up:
            if then is not None:
                then()
            return
        self.broker_stopping(broker)

        def gone() -> None:
            for name in sorted(br.bundles):
                self.close_bundle(name, broker)
            br.up = False
            br.registered = False
            self._live = None
            br.epoch += 1
            self.broker_stopped(broker)
            if then_restart:
                self.sim.after(self.p.broker_restart_ms, self._restarted, broker)
            if then is not None:
                then()
        self.sim.after(self.p.graceful_unload_ms, gone)

    def _restarted(self, broker: str) -> None:
        self.start_broker(broker)
        self.restarts_done_ms = self.sim.now_ms

    # ------------------------------------------------------------------------------------- scenario
    def schedule_scenario(self) -> None:
        for e in self.sc.events:
            self.sim.at(e.at_s * 1000, self._apply_event, e)

    def _apply_event(self, e: Any) -> None:
        if self.first_event_ms is None:
            self.first_event_ms = self.sim.now_ms
        n = e.n_brokers(len(self.order))
        if e.kind == "restart":
            targets = [b for b in self.order if self.brokers[b].up][:n]
            self.mark("restart", f"{len(targets)} brokers")
            if e.sequential:
                self._sequential(targets, 0)
            else:
                step = e.spread_s * 1000 / max(1, len(targets))
                for i, b in enumerate(targets):
                    self.sim.after(i * step, self.stop_broker, b, True)
        elif e.kind == "leave":
            up = [b for b in self.order if self.brokers[b].up]
            targets = sorted(self.rng.sample(up, min(n, len(up))), key=self.order.index) if e.random else up[-n:]
            self.mark("leave", f"{len(targets)} brokers")
            names = [self.brokers[b].name for b in targets]
            self.nemesis.append((self.sim.now_ms, "invoke", "start-scale", {"role": "broker", "nodes": names}))
            # at once, or (sequential) one after another, each once the previous one is gone (not in the same
            # instant: a broker stopping then would hand its bundles to one leaving), as the scale nemesis
            # stops them
            def done() -> None:
                self.nemesis.append((self.sim.now_ms, "ok", "start-scale", {"role": "broker", "nodes": names}))
            if e.sequential:
                def next_stop(i: int) -> None:
                    if i >= len(targets):
                        self.sim.after(1, done)
                        return
                    self.stop_broker(targets[i], then=lambda: self.sim.after(0, next_stop, i + 1))
                next_stop(0)
            else:
                for b in targets:
                    self.stop_broker(b)
                self.sim.after(self.p.graceful_unload_ms + 1, done)
        elif e.kind == "join":
            targets = [b for b in self.order if not self.brokers[b].up][:n]
            self.mark("join", f"{len(targets)} brokers")
            names = [self.brokers[b].name for b in targets]
            self.nemesis.append((self.sim.now_ms, "invoke", "stop-scale", {"role": "broker", "nodes": names}))
            for b in targets:
                self.start_broker(b)
            self.sim.after(self.p.metadata_write_ms + 1,
                           lambda: self.nemesis.append((self.sim.now_ms, "ok", "stop-scale",
                                                        {"role": "broker", "nodes": names})))
        elif e.kind in ("hotspot", "rate"):
            ns = self.ns_names[e.namespace] if e.kind == "hotspot" else None
            self.mark(e.kind, f"x{e.factor}")
            idx = [t for t in range(len(self.t_name)) if ns is None or self.t_ns[t] == ns]
            if e.kind == "hotspot":
                idx = idx[:max(1, int(len(idx) * e.topics))]
            for t in idx:
                b = self.t_broker[t]
                if b is not None:
                    self._account(t, b, -1)
                self.t_rate[t] *= e.factor
                if b is not None:
                    self._account(t, b, +1)

    def _sequential(self, targets: list[str], i: int) -> None:
        if i >= len(targets):
            return
        b = targets[i]
        self.stop_broker(b, then_restart=True)
        wait = self.p.graceful_unload_ms + self.p.broker_restart_ms + self.report_ms * 2
        self.sim.after(wait, self._sequential, targets, i + 1)

    # ------------------------------------------------------------------------------------- sampling
    def sample(self) -> None:
        s = self.sim.now_ms / 1000
        self.reconnect_curve.append((s, self.connected_pubs))

    def sample_topics(self) -> None:
        self.topic_series.append((self.sim.now_ms / 1000,
                                  {self.brokers[b].name: self.brokers[b].topics for b in self.live()}))

    def record_load(self, broker: str, max_usage: float, fields: dict[str, Any]) -> None:
        br = self.brokers[broker]
        self.load_series[broker].append((self.sim.now_ms / 1000, max_usage))
        self.event("load-report", broker=broker, logged_by=br.name, max_usage_with_weight=round(max_usage, 5),
                   numTopics=br.topics, numBundles=len(br.bundles), **fields)

    # ------------------------------------------------------------------------------------- run
    def run(self) -> None:
        for b in self.order[:self.sc.up_at_start]:
            self.start_broker(b)
        self.sim.after(self.p.metadata_write_ms * 2 + 1, self.start_clients)
        self.schedule_scenario()
        if self.stats_ms > 0:
            self.sim.every(self.stats_ms, self._stats_pass)
        self.sim.every(self.report_ms, self.report_round)
        self.sim.every(1000, self.sample, first_ms=0)
        self.sim.every(10_000, self.sample_topics, first_ms=0)
        end = self.sc.duration_s * 1000
        chunk = max(1000.0, end / 100)
        t = 0.0
        last = time.monotonic()
        while t < end:
            t = min(end, t + chunk)
            self.sim.run(t)
            if self.progress and (time.monotonic() - last > 2 or t >= end):
                last = time.monotonic()
                self.progress(f"{self.load_manager}: simulated {t / 1000:.0f}/{end / 1000:.0f} s, "
                              f"wall {time.monotonic() - self.wall_start:.0f} s, {self.sim.events_run} events, "
                              f"{self.connected_pubs}/{self.total_pubs} publishers connected")
