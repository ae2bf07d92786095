"""Scenarios: the cluster's shape, its load, the events over time and the seed's figure to compare.

A scenario file is TOML:

    name = "my-scale-in"
    description = "6 brokers, 100 topics, 6 -> 3 -> 6"
    brokers = 6                 # brokers that exist (joins bring the absent ones up)
    initial_brokers = 6         # brokers up at t=0 (default: brokers)
    namespaces = 1
    bundles = 32                # initial bundles over all namespaces (each namespace gets bundles/namespaces)
    topics = 100
    publishers = 100            # spread over the topics (at least one a topic when publishers >= topics)
    msg_rate = 1000             # msg/s over all topics (a topic's rate is its share, see skew)
    msg_size = 1024             # bytes
    subscriptions = 1           # consumers per topic: bytes out = bytes in x subscriptions
    skew = 0.0                  # 0: every topic the same rate; s > 0: topic i's weight is 1 / (i+1)^s
    duration_s = 360
    metric = "balance"          # reconnect | p9999 | balance | split (what the seed's figure measures)
    [settings]                  # load balancer settings, Pulsar's names (clusters/loadbalancer/settings.py)
    loadBalancerSheddingIntervalMinutes = 0.0833
    [params]                    # simulator parameters (params.py)
    topic_load_ms = 20
    [load_manager_params.extensible]   # parameters for one load manager only, over [params]
    graceful_unload_ms = 950           # (its brokers stop in their own way: the extensible one transfers first)
    [[events]]                  # kind: restart | leave | join | hotspot | rate
    at_s = 60
    kind = "leave"
    count = 3                   # or fraction = 0.5; restart also takes count = "all"
    [capacity.broker-1]         # one broker's own capacity (default: params' nic_mbytes and cpu_cores)
    nic_mbytes = 250
    cpu_cores = 16
    [seed]                      # the seed's figures, printed beside ours
    modular = "5 min"
    extensible = "3 min"

Event kinds: `restart` (the brokers stop gracefully and start again after params.broker_restart_ms;
`spread_s`: the restarts are spread evenly over that many seconds; `sequential = true`: one after another,
each when the previous one is back), `leave` (graceful stop, the highest-numbered live brokers;
`random = true`: live brokers drawn with the run's seed, as the `scale` nemesis picks them;
`sequential = true`: one after another, each when the previous one is gone), `join`
(the lowest-numbered absent brokers start), `hotspot` (`namespace` index and `factor`: that namespace's
topics' rates times factor; `topics` = fraction of its topics, default all), `rate` (`factor` on every
topic). A malformed file gives `ScenarioError`, one line naming the field and the fix.
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from clusters.loadbalancer.settings import LoadBalancerSettings
from clusters.loadbalancer.sim.params import SimParams

METRICS = ("reconnect", "p9999", "balance", "split")
CAPACITY_KEYS = ("nic_mbytes", "cpu_cores")
EVENT_KINDS = ("restart", "leave", "join", "hotspot", "rate")
LOAD_MANAGER_NAMES = ("modular", "extensible")


class ScenarioError(ValueError):
    """One line: the field, what is wrong, the fix."""

    def __init__(self, where: str, problem: str, fix: str):
        super().__init__(f"{where}: {problem} (fix: {fix})")
        self.where, self.problem, self.fix = where, problem, fix


@dataclass(frozen=True)
class Event:
    at_s: float
    kind: str
    count: int | str | None = None
    fraction: float | None = None
    spread_s: float = 0.0
    sequential: bool = False
    namespace: int = 0
    factor: float = 1.0
    topics: float = 1.0
    random: bool = False

    def n_brokers(self, total: int) -> int:
        if self.count == "all":
            return total
        if self.fraction is not None:
            return max(1, round(total * self.fraction))
        return int(self.count or 1)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    brokers: int = 3
    initial_brokers: int | None = None
    namespaces: int = 1
    bundles: int = 4
    topics: int = 10
    publishers: int = 10
    msg_rate: float = 100.0
    msg_size: int = 1024
    subscriptions: int = 1
    skew: float = 0.0
    duration_s: float = 300.0
    metric: str = "balance"
    settings: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    seed: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, dict[str, float]] = field(default_factory=dict)
    load_manager_params: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def up_at_start(self) -> int:
        return self.brokers if self.initial_brokers is None else self.initial_brokers

    def lb_settings(self, overrides: Mapping[str, Any] | None = None) -> LoadBalancerSettings:
        merged = dict(self.settings)
        merged.update(overrides or {})
        try:
            return LoadBalancerSettings.from_mapping(merged)
        except ValueError as e:
            raise ScenarioError("settings", str(e), "use a setting of clusters/loadbalancer/settings.py "
                                                    "with a value of its type") from None

    def sim_params(self, load_manager: str | None = None) -> SimParams:
        """The simulator's parameters: [params], and over them [load_manager_params.LOAD_MANAGER]'s."""
        where = "params"
        merged = dict(self.params)
        if load_manager is not None and load_manager in self.load_manager_params:
            where = f"load_manager_params.{load_manager}"
            merged.update(self.load_manager_params[load_manager])
        try:
            return SimParams.from_mapping(merged)
        except ValueError as e:
            raise ScenarioError(where, str(e), "use a parameter of clusters/loadbalancer/sim/params.py") from None

    def scaled(self, *, brokers: int | None = None, bundles: int | None = None, topics: int | None = None,
               publishers: int | None = None) -> "Scenario":
        """The same scenario at another size; initial_brokers keeps its ratio to brokers."""
        ch: dict[str, Any] = {}
        if brokers is not None:
            if self.initial_brokers is not None:
                ch["initial_brokers"] = max(1, round(self.initial_brokers * brokers / self.brokers))
            ch["brokers"] = brokers
        if bundles is not None:
            ch["bundles"] = bundles
            ch["namespaces"] = min(self.namespaces, bundles)
        if topics is not None:
            ch["topics"] = topics
        if publishers is not None:
            ch["publishers"] = publishers
        out = dataclasses.replace(self, **ch)
        validate(out)
        return out

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["events"] = [dataclasses.asdict(e) for e in self.events]
        return d


_INT = ("brokers", "initial_brokers", "namespaces", "bundles", "topics", "publishers", "msg_size", "subscriptions")
_FLOAT = ("msg_rate", "skew", "duration_s")


def _num(where: str, v: Any, typ: type) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ScenarioError(where, f"expects a number, got {v!r}", f"write {where} = <number>")
    if typ is int and isinstance(v, float) and not v.is_integer():
        raise ScenarioError(where, f"expects a whole number, got {v!r}", f"write {where} = {int(v)}")
    return typ(v)


def _event(i: int, raw: Any) -> Event:
    where = f"events[{i}]"
    if not isinstance(raw, dict):
        raise ScenarioError(where, "is not a table", "write [[events]] with at_s and kind")
    known = {f.name for f in dataclasses.fields(Event)}
    for k in raw:
        if k not in known:
            raise ScenarioError(f"{where}.{k}", "is not an event field", f"use one of {', '.join(sorted(known))}")
    if "at_s" not in raw or "kind" not in raw:
        raise ScenarioError(where, "needs at_s and kind", f"add at_s = <seconds> and kind = one of {', '.join(EVENT_KINDS)}")
    kind = raw["kind"]
    if kind not in EVENT_KINDS:
        raise ScenarioError(f"{where}.kind", f"unknown kind {kind!r}", f"use one of {', '.join(EVENT_KINDS)}")
    kw: dict[str, Any] = {"kind": kind, "at_s": _num(f"{where}.at_s", raw["at_s"], float)}
    if kw["at_s"] < 0:
        raise ScenarioError(f"{where}.at_s", "is negative", "use a time >= 0")
    if "count" in raw:
        c = raw["count"]
        if c != "all":
            c = _num(f"{where}.count", c, int)
            if c <= 0:
                raise ScenarioError(f"{where}.count", f"must be positive, got {c}", "use count >= 1 or \"all\"")
        kw["count"] = c
    for k in ("fraction", "spread_s", "factor", "topics"):
        if k in raw:
            kw[k] = _num(f"{where}.{k}", raw[k], float)
            if kw[k] < 0:
                raise ScenarioError(f"{where}.{k}", "is negative", "use a value >= 0")
    if "fraction" in kw and not 0 < kw["fraction"] <= 1:
        raise ScenarioError(f"{where}.fraction", f"must be in (0, 1], got {kw['fraction']}", "use e.g. fraction = 0.5")
    if "namespace" in raw:
        kw["namespace"] = _num(f"{where}.namespace", raw["namespace"], int)
    for k in ("sequential", "random"):
        if k in raw:
            if not isinstance(raw[k], bool):
                raise ScenarioError(f"{where}.{k}", f"expects true or false, got {raw[k]!r}", f"write {k} = true")
            kw[k] = raw[k]
    return Event(**kw)


def from_mapping(raw: Mapping[str, Any], origin: str = "scenario") -> Scenario:
    known = {f.name for f in dataclasses.fields(Scenario)}
    for k in raw:
        if k not in known:
            raise ScenarioError(k, "is not a scenario field", f"use one of {', '.join(sorted(known))}")
    if "name" not in raw or not isinstance(raw["name"], str) or not raw["name"].strip():
        raise ScenarioError("name", "is missing", f"add name = \"...\" to {origin}")
    kw: dict[str, Any] = {"name": raw["name"].strip()}
    if "description" in raw:
        kw["description"] = str(raw["description"])
    for k in _INT:
        if k in raw:
            kw[k] = _num(k, raw[k], int)
    for k in _FLOAT:
        if k in raw:
            kw[k] = _num(k, raw[k], float)
    if "metric" in raw:
        kw["metric"] = raw["metric"]
    if "capacity" in raw:
        cap = raw["capacity"]
        if not isinstance(cap, dict) or not all(isinstance(v, dict) for v in cap.values()):
            raise ScenarioError("capacity", "is not a table of brokers", "write [capacity.broker-1] with "
                                                                         "nic_mbytes and/or cpu_cores")
        out: dict[str, dict[str, float]] = {}
        for b, v in cap.items():
            for k, x in v.items():
                if k not in CAPACITY_KEYS:
                    raise ScenarioError(f"capacity.{b}.{k}", "is not a broker capacity",
                                        f"use {' or '.join(CAPACITY_KEYS)}")
                if _num(f"capacity.{b}.{k}", x, float) <= 0:
                    raise ScenarioError(f"capacity.{b}.{k}", f"must be positive, got {x}", "give a positive number")
            out[b] = {k: float(x) for k, x in v.items()}
        kw["capacity"] = out
    for k in ("settings", "params", "seed"):
        if k in raw:
            if not isinstance(raw[k], dict):
                raise ScenarioError(k, "is not a table", f"write [{k}] with name = value lines")
            kw[k] = dict(raw[k])
    if "load_manager_params" in raw:
        lmp = raw["load_manager_params"]
        if not isinstance(lmp, dict) or not all(isinstance(v, dict) for v in lmp.values()):
            raise ScenarioError("load_manager_params", "is not a table of load managers",
                                f"write [load_manager_params.{LOAD_MANAGER_NAMES[0]}] with name = value lines")
        for lm in lmp:
            if lm not in LOAD_MANAGER_NAMES:
                raise ScenarioError(f"load_manager_params.{lm}", "is not a load manager",
                                    f"use one of {', '.join(LOAD_MANAGER_NAMES)}")
        kw["load_manager_params"] = {lm: dict(v) for lm, v in lmp.items()}
    if "events" in raw:
        if not isinstance(raw["events"], list):
            raise ScenarioError("events", "is not a list of tables", "write each event as [[events]]")
        kw["events"] = tuple(_event(i, e) for i, e in enumerate(raw["events"]))
    s = Scenario(**kw)
    validate(s)
    return s


def validate(s: Scenario) -> None:
    for k in ("brokers", "namespaces", "bundles", "topics", "msg_size", "subscriptions"):
        if getattr(s, k) <= 0:
            raise ScenarioError(k, f"must be positive, got {getattr(s, k)}", f"set {k} to at least 1")
    if s.publishers < 0:
        raise ScenarioError("publishers", "is negative", "set publishers >= 0")
    if not 0 < s.up_at_start <= s.brokers:
        raise ScenarioError("initial_brokers", f"must be in 1..brokers ({s.brokers}), got {s.up_at_start}",
                            "set initial_brokers <= brokers")
    if s.bundles < s.namespaces:
        raise ScenarioError("bundles", f"{s.bundles} bundles for {s.namespaces} namespaces",
                            "give every namespace at least one bundle (bundles >= namespaces)")
    if s.duration_s <= 0:
        raise ScenarioError("duration_s", "must be positive", "set duration_s to the simulated seconds to run")
    for b in s.capacity:
        if b not in {f"broker-{i + 1}" for i in range(s.brokers)}:
            raise ScenarioError(f"capacity.{b}", f"no such broker (there are broker-1..broker-{s.brokers})",
                                "name a broker as broker-N")
    if s.metric not in METRICS:
        raise ScenarioError("metric", f"unknown metric {s.metric!r}", f"use one of {', '.join(METRICS)}")
    for i, e in enumerate(s.events):
        if e.at_s > s.duration_s:
            raise ScenarioError(f"events[{i}].at_s", f"{e.at_s} is after duration_s {s.duration_s}",
                                "move the event earlier or lengthen duration_s")
        if e.kind == "hotspot" and not 0 <= e.namespace < s.namespaces:
            raise ScenarioError(f"events[{i}].namespace", f"no namespace {e.namespace} (there are {s.namespaces})",
                                f"use an index in 0..{s.namespaces - 1}")
    s.lb_settings()
    s.sim_params()
    for lm in s.load_manager_params:
        s.sim_params(lm)


def load(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ScenarioError(str(p), f"cannot be read ({e.strerror or e})", "name an existing scenario file") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(str(p), f"is not TOML ({e})", "fix the line named") from None
    return from_mapping(raw, str(p))


# ------------------------------------------------------------------------------------------------------
# built in: the seed's four first (load-balancer.md §5), then small ones

_FAST = {"loadBalancerSheddingIntervalMinutes": 1}

BUILTIN: dict[str, Scenario] = {}


def _add(s: Scenario) -> None:
    validate(s)
    BUILTIN[s.name] = s


_add(Scenario(
    name="reconnect-storm", metric="reconnect",
    description="100 brokers restart within 2 minutes; 100,000 publishers on 60,000 bundles reconnect",
    brokers=100, namespaces=600, bundles=60_000, topics=100_000, publishers=100_000, msg_rate=100_000,
    msg_size=1024, duration_s=1800,
    events=(Event(at_s=60, kind="restart", count="all", spread_s=120),),
    seed={"modular": "20 min", "extensible": "10 min", "ours": "time until every publisher is connected again"}))
_add(Scenario(
    name="restart-latency", metric="p9999",
    description="10 brokers restart one by one; 10,000 partitions on 1,000 bundles at 1,000 msg/s",
    brokers=10, namespaces=10, bundles=1000, topics=10_000, publishers=10_000, msg_rate=1000,
    msg_size=1024, duration_s=900,
    events=(Event(at_s=60, kind="restart", count="all", sequential=True),),
    seed={"modular": "1841 ms", "extensible": "1228 ms", "ours": "p99.99 publish latency"}))
_add(Scenario(
    name="scale-in-out", metric="balance",
    description="10,000 topics on 100 bundles: 10 -> 5 brokers, then 5 -> 10",
    brokers=10, namespaces=1, bundles=100, topics=10_000, publishers=10_000, msg_rate=300_000,
    msg_size=1024, skew=0.0, duration_s=1500,
    events=(Event(at_s=60, kind="leave", fraction=0.5), Event(at_s=780, kind="join", fraction=0.5)),
    seed={"modular": "5 min (10 -> 5), 7 min (5 -> 10)", "extensible": "3 min (10 -> 5), 5 min (5 -> 10)",
          "ours": "time until every broker is within 0.10 of the mean usage, for good"}))
_add(Scenario(
    name="hot-spot-split", metric="split",
    description="10,000 topics with hot spots on 10 brokers: 1 bundle split up to 128, then balanced",
    brokers=10, namespaces=1, bundles=1, topics=10_000, publishers=10_000, msg_rate=300_000, skew=0.8,
    msg_size=1024, duration_s=3600,
    settings={"loadBalancerNamespaceBundleMaxTopics": 50, "loadBalancerBrokerLoadTargetStd": 0.1},
    seed={"modular": "15 min", "extensible": "13 min",
          "ours": "time until the splits end and the load is balanced; max - min topics per broker",
          "topic_spread": "321 and 1.2k (load-balancer.md §5: one per load manager, which not said)"}))
_add(Scenario(
    name="small-6-3-6", metric="balance",
    description="the validation scenario: 6 brokers, 100 topics, 6 -> 3 at 60 s, 3 -> 6 at 180 s "
                "(bench/README.md 'Scale-in and scale-out' settings)",
    brokers=6, namespaces=1, bundles=32, topics=100, publishers=100, duration_s=330,
    settings={"loadBalancerReportUpdateMinIntervalMillis": 1000, "loadBalancerSheddingIntervalMinutes": 0.0833,
              "loadBalancerSheddingGracePeriodMinutes": 1, "defaultNumberOfNamespaceBundles": 32,
              "loadBalancerBrokerThresholdShedderPercentage": 5, "loadBalancerHistoryResourcePercentage": 0.5,
              "loadBalancerBundleUnloadMinThroughputThreshold": 0, "lowerBoundarySheddingEnabled": True,
              "loadBalancerDistributeBundlesEvenlyEnabled": False,
              "loadBalancerLoadPlacementStrategy": "LeastResourceUsageWithWeight"},
    # measured on our real runs' reports before the leave (`python -m bench.lb_sim calibrate`, bench/README.md
    # "Validation against our real cluster"): the workload's sends a second, wire bytes a message and a
    # broker's bytes without topics, the reports' counting noise, a system message's overhead; the link is
    # the runs' 0.00007 Gbps. Measured on our real runs' leaves (`python -m bench.lb_sim leave`): a graceful
    # stop's duration per load manager (modular 0.355 s: one run's three stops in 1.065 s; extensible 0.93 s,
    # the mean of five runs': it transfers its bundles first), a topic's load once its client is answered
    # (89 ms, the median from a bundle's lock to its topics loaded; loads overlap: the default concurrency),
    # the bytes a topic's clients cost the broker that takes it (0.483 KB in, 0.303 out: nine brokers of
    # four runs). An idle broker's CPU (0.306 %, the mean of 1,132 reports of brokers without topics or bundles
    # in those runs: `calibrate`; the assumed 5 % made a joined broker look 0.05 loaded, ten times ours, and
    # TransferShedder moves half the difference). Each broker reports at its own phase of the second (our
    # brokers' reporters start with the broker: each keeps its phase, the six spread over the second; a
    # leave's stops, about 1 s apart, then see the bursts of the last stop's moves in some brokers' reports
    # and not in others'). Settling judged on 15-s averages as theirs; the brokers' rates recomputed every 5 s
    # (clusters/broker/service.py RATE_INTERVAL_S). The leaving brokers are drawn at random and stopped one
    # after another, as the scale nemesis does.
    msg_rate=117.2, msg_size=92,
    params={"nic_mbytes": 0.00896, "report_noise_kb": 0.096, "base_kb_s": 0.245, "system_msg_overhead_bytes": 37,
            "graceful_unload_ms": 355, "topic_load_ms": 89, "connect_kb_in": 0.483, "connect_kb_out": 0.303,
            "balance_smooth_s": 15, "stats_interval_ms": 5000, "base_cpu_percent": 0.306, "report_phase": 1},
    load_manager_params={"extensible": {"graceful_unload_ms": 930}},
    events=(Event(at_s=60, kind="leave", count=3, random=True, sequential=True),
            Event(at_s=180, kind="join", count=3)),
    seed={"modular": "6 -> 3: 14-91 s, 3 -> 6: 14-125 s, 47-60 unloads (our real cluster, bench/README.md)",
          "extensible": "not settled after either event in 5 of 5, 4-20 unloads (our real cluster, bench/README.md)",
          "ours": "settling time after each scale event (15 s band), unloads"}))
_add(dataclasses.replace(
    BUILTIN["small-6-3-6"], name="small-6-3-6-payload",
    description="the validation scenario with 4 KB payloads on 3 Mbit/s links, so that the workload, not the "
                "extensible load manager's system topics, dominates a broker's usage (bench/lb_scale.py "
                "--payload 4096 --lb-setting loadBalancerOverrideBrokerNicSpeedGbps=0.003)",
    # measured on those five real runs (/work/lbscale-ext-payload, bench/README.md) before the leave (`python -m
    # bench.lb_sim calibrate`): sends, wire bytes a message, counting noise, a system message's overhead; the
    # bytes without topics came out at -1.6 KB/s, not measurable against ~80 KB/s a broker: 0; an idle broker's
    # CPU 0.601 % (248 reports). On their leaves (`leave`): an extensible stop 0.958 s; a moved topic's consumer
    # is sent its unacknowledged messages again by the broker that takes it: 10.106 KB out beyond in per topic
    # (ten brokers of five runs, 5.1 to 15.0; about 2.3 messages of 4454 B), so connect_kb_out is that plus
    # the commands' in (0.483, small-6-3-6's: commands do not grow with the payload, and the in side drowns
    # here in the workload's own dip after a leave). The link is 0.003 Gbps (0.384 MB/s). The rest as small-6-3-6.
    msg_rate=114.7, msg_size=4454,
    params={**BUILTIN["small-6-3-6"].params, "nic_mbytes": 0.384, "report_noise_kb": 5.524, "base_kb_s": 0.0,
            "system_msg_overhead_bytes": 311, "base_cpu_percent": 0.601, "connect_kb_out": 10.589},
    load_manager_params={"extensible": {"graceful_unload_ms": 958}},
    seed={"extensible": "our real cluster, bench/README.md 'Validation against our real cluster'",
          "ours": "settling time after each scale event (15 s band), unloads"}))
_add(Scenario(
    name="tiny", metric="reconnect",
    description="3 brokers, 40 topics on 8 bundles, one restart (the unit tests' scenario)",
    brokers=3, namespaces=2, bundles=8, topics=40, publishers=40, msg_rate=400, duration_s=120,
    events=(Event(at_s=20, kind="restart", count=1),),
    params={"broker_restart_ms": 5000}))
