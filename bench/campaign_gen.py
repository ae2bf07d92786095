"""Synthetic run folders for the Spark analysis: a nightly campaign of small runs, or one very long run,
each with anomalies planted at known places and a manifest that lists them.

The histories come from the `log` simulation of bench/checkers.py (`gen_log`), steered through its
hooks (`CampaignHooks`): nemesis start/stop ops recorded the way nemesis/combine.py records them
(process -1, the same values), fault windows that stall and slow the sends and roll the topics'
ledgers, and five planted anomaly types, each made so that it is exactly one anomaly of that type
for checkers/log.py and nothing else:

- lost: an acknowledged send left out of its topic's final read (consumers may have received it);
- duplicate: a send appended twice, at two consecutive positions;
- divergence: an indeterminate send that never reached the log, delivered by a receive at the
  position of the first message of that receive (two values at one message id);
- nonmonotonic-send: a producer's send acknowledged at a position held open before its previous
  send's (the log keeps both; the second one lies first);
- unexpected: a value that nobody sent, delivered by a receive at a position of an unused ledger.

    python bench/campaign_gen.py campaign OUT --runs 200 --seed 1     # OUT/<test-name>/<time>/ + manifest
    python bench/campaign_gen.py single OUT --ops 10000000 --seed 1   # one long run, written in chunks
    python bench/campaign_gen.py check OUT/single/<time> --manifest OUT/manifest.json
    python bench/campaign_gen.py detection OUT --seeds 5 --valid-seeds 20  # OUT/runs/...: knobs x scenarios

A campaign run folder holds test.toml (a validated TestSpec), history.jsonl, history.parquet and
deliveries.parquet (core.store's writers) and results.json (the log checker's result, as the
runner writes it, plus a "synthetic" entry naming this generator). A single run holds no
history.jsonl (use --jsonl) and a results.json that says "unknown" until `check` has run the
checker over it. Campaign and detection runs record their expectation (test.toml's `expected`, results.json's
`expected`, `expectation_met`) and results.json's `detection` (time to first detection), as the runner
does. OUT/manifest.json lists, per run, its configuration, its fault windows and the
planted anomalies (type -> entries with their values), and for campaign runs whether the log
checker found exactly those.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):                     # run as a script: the repository on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.checkers import FINAL_READ_PROCESS, MS, LogHooks, _mid, gen_log  # noqa: E402
from checkers.log import INVALID_BY_DEFAULT  # noqa: E402
from core import store  # noqa: E402
from core.detection import detection_of  # noqa: E402
from core.expectation import met  # noqa: E402
from core.history import FAIL, INFO, INVOKE, NEMESIS_PROCESS, OK, MessageId, Op, write_jsonl  # noqa: E402
from core.spec import SpecError, TestSpec  # noqa: E402
from harness.catalog import CATALOG  # noqa: E402

S = 1_000_000_000
TYPES = ("lost", "duplicate", "divergence", "nonmonotonic-send", "unexpected")
UNEXPECTED_LEDGER = 900_000_000          # ledgers no topic ever reaches: positions of unexpected values
MANIFEST = "manifest.json"

# Planted anomalies per fault window of a run with the bug knob set to its unsafe value: type ->
# probability that one anomaly of that type is planted inside the window (several knobs: each
# draws). Synthetic rates, not measurements: the point is that the analysis must find exactly these.
KNOB_EFFECTS: dict[str, dict[str, float]] = {
    "bookie.ack_before_fsync": {"lost": 0.5, "duplicate": 0.15},
    "bookie.ignore_fence": {"lost": 0.3, "divergence": 0.3, "nonmonotonic-send": 0.2},
    "broker.recovery_fencing": {"lost": 0.35, "divergence": 0.2, "duplicate": 0.2, "unexpected": 0.15,
                                "nonmonotonic-send": 0.15},
}
UNSAFE = {"bookie.ack_before_fsync": True, "bookie.ignore_fence": True, "broker.recovery_fencing": False}

# The campaign's grid: every nemesis set meets every bug setting (runs cycle through the cells).
NEMESES: tuple[tuple[str, ...], ...] = ((), ("partition",), ("kill",), ("pause",), ("zk-isolate",),
                                        ("partition", "kill"), ("kill", "pause", "zk-isolate"))
BUG_SETTINGS: tuple[tuple[str, ...], ...] = ((), ("bookie.ack_before_fsync",), ("bookie.ignore_fence",),
                                             ("broker.recovery_fencing",), ())
QUORUMS = ((3, 2, 2), (3, 3, 2), (2, 2, 2))
DEFAULT_SINGLE_PLANTS = {"lost": 25, "duplicate": 20, "divergence": 15, "nonmonotonic-send": 10, "unexpected": 5}


# ------------------------------------------------------------------------------------ the hooks

@dataclass
class Window:
    name: str
    start: int
    outage_end: int                       # sends invoked before this stall until it
    slow: float                           # latency factor for the rest of the window
    topic: int | None                     # the one topic hit (zk-isolate), None: all
    stop: int | None = None
    values: dict[str, Any] = field(default_factory=dict)


class CampaignHooks(LogHooks):
    """Faults and planted anomalies for one simulated run (see the module docstring).

    Plants are armed by time (`plant_at`, campaign: inside fault windows drawn from `rates`) or by op
    count (`plant_after`, single run); the first fitting event after that takes the plant. A plant
    is recorded in `planted` only once it has taken effect, so what the manifest lists is what the
    history holds even when the run ends early."""

    def __init__(self, seed: int, spec: TestSpec, rates: dict[str, float] | None = None,
                 plant_after: list[tuple[int, str]] | None = None):
        self.rng = random.Random(seed * 7919 + 17)
        self.spec = spec
        self.faults = list(spec.nemesis)
        self.interval = int(spec.nemesis_interval * S)
        self.rates = rates or {}
        self.triggers: list[tuple[str, str, int]] = []          # (type, "t" | "n", threshold)
        for n, kind in sorted(plant_after or []):
            self.triggers.append((kind, "n", n))
        self.windows: list[Window] = []
        self.cur: Window | None = None
        self.recover_until = 0
        self.nodes = {"zookeeper": [f"zk-{i + 1}" for i in range(spec.zookeepers)],
                      "bookie": [f"bookie-{i + 1}" for i in range(spec.bookies)],
                      "broker": [f"broker-{i + 1}" for i in range(spec.brokers)]}
        self.planted: dict[str, list[dict[str, Any]]] = {k: [] for k in TYPES}
        self.div_at: set[tuple[int, Any]] = set()                # (topic, position) of divergences
        self.lost: dict[int, int] = {}                           # value -> topic, acked: left out of reads
        self.lost_pending: dict[int, int] = {}
        self.dup: dict[int, int] = {}                            # value -> topic: appended twice
        self.div_pending: list[tuple[int, int, int]] = []        # (topic, value, invoke ns)
        self.nm_a: dict[int, int] = {}                           # value -> thread: its next send goes first
        self.nm_wait: dict[int, list[Any]] = {}                  # thread -> [topic, slot, pos, a, b]
        self.nm_b: dict[int, int] = {}                           # b value -> thread
        self.unexpected_n = 0
        self.pids = 4000
        self.workload_end = 0

    # -- arming ---------------------------------------------------------------------------------
    def _take(self, t: int, kinds: tuple[str, ...]) -> str | None:
        """The first armed trigger of one of `kinds`, removed; None if none is armed."""
        n = self.sim.n
        for k, (kind, by, x) in enumerate(self.triggers):
            if kind in kinds and (t >= x if by == "t" else n >= x):
                del self.triggers[k]
                return kind
        return None

    # -- faults ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self.faults:
            self.sim.at(self.interval + self.rng.randrange(0, S // 2), "nemesis", "start")

    def _pid(self) -> int:
        self.pids += self.rng.randrange(1, 400)
        return self.pids

    def _emit_at(self, t: int, process: int, type_: str, f: str, key: str = "", value: Any = None,
                 node: str = "", error: str = "") -> None:
        self.sim.at(t, "emit", (process, type_, f, key, value, None, node, error))

    def nemesis(self, t: int, data: Any) -> None:
        if data == "start":
            self._start_fault(t)
            self.sim.at(t + self.interval, "nemesis", "stop")
        else:
            self._stop_fault(t)
            self.sim.at(t + self.interval, "nemesis", "start")

    def _start_fault(self, t: int) -> None:
        rng = self.rng
        name = rng.choice(self.faults)
        data_nodes = self.nodes["bookie"] + self.nodes["broker"]
        topic: int | None = None
        key = node = ""
        if name == "partition":
            shuffled = rng.sample(data_nodes, len(data_nodes))
            cut = rng.randrange(1, len(shuffled))
            a, b = sorted(shuffled[:cut]), sorted(shuffled[cut:])
            small, big = (a, b) if len(a) <= len(b) else (b, a)
            sides = [small, sorted(big + self.nodes["zookeeper"])]
            grudge = {n: list(sides[1]) for n in sides[0]} | {n: list(sides[0]) for n in sides[1]}
            plan: dict[str, Any] = {"shape": "halves", "sides": sides}
            ok = {**plan, "grudge": grudge}
            stop = {"healed": True, "grudge": grudge}
            hits_broker = any(n.startswith("broker") for n in small)
            outage, roll = (rng.uniform(1.0, 3.0), True) if hits_broker else (rng.uniform(0.2, 0.8), False)
        elif name in ("kill", "pause"):
            target = rng.choice(data_nodes)
            role = target.split("-")[0]
            plan = {"node": target}
            node = target
            ok = {"node": target, "role": role, "pid": self._pid()}
            if name == "kill":
                stop = {"node": target, "role": role, "pid": self._pid(), "restarted": True}
            else:
                stop = {"node": target, "role": role, "pid": ok["pid"], "resumed": True, "alive": True}
            if role == "broker":
                outage, roll = (rng.uniform(1.5, 3.0) if name == "kill" else rng.uniform(2.0, 4.0)), True
            else:
                outage, roll = rng.uniform(0.1, 0.6), False
        else:                                               # zk-isolate: a topic's owner loses ZooKeeper
            topic = rng.randrange(len(self.names))
            owner = rng.choice(self.nodes["broker"])
            zk = self.nodes["zookeeper"][0]
            key = self.names[topic]
            plan = {"topic": key}
            ok = {"topic": key, "owner": owner, "grudge": {owner: [zk], zk: [owner]}}
            stop = {"healed": True, **ok}
            node = owner
            outage, roll = rng.uniform(0.3, 1.2), True
        done = t + rng.randrange(5 * MS, 15 * MS)
        self._emit_at(t, NEMESIS_PROCESS, INVOKE, f"start-{name}", key, plan, "" if name == "zk-isolate" else node)
        self._emit_at(done, NEMESIS_PROCESS, OK, f"start-{name}", key, ok, node)
        w = Window(name, t, done + int(outage * S), rng.uniform(1.3, 2.5), topic,
                   values={"key": key, "node": node, "stop": stop})
        self.windows.append(w)
        self.cur = w
        if roll:                                            # the topic moves: its new owner opens a ledger
            for i, lg in enumerate(self.logs):
                if topic is None or i == topic:
                    lg.roll()
        for kind, p in self.rates.items():                  # this window's plants
            if self.rng.random() < p:
                self.triggers.append((kind, "t", t + int(self.interval * self.rng.uniform(0.2, 0.8))))
        self.triggers.sort(key=lambda x: x[2])

    def _stop_fault(self, t: int) -> None:
        w = self.cur
        if w is None:
            return
        name, v = w.name, w.values
        self._emit_at(t, NEMESIS_PROCESS, INVOKE, f"stop-{name}", v["key"], None, v["node"])
        done = t + self.rng.randrange(10 * MS, 60 * MS)
        self._emit_at(done, NEMESIS_PROCESS, OK, f"stop-{name}", v["key"], v["stop"], v["node"])
        w.stop = done
        self.cur = None
        if name == "kill":                                  # the restarted node catches up
            self.recover_until = done + int(self.rng.uniform(0.2, 1.0) * S)

    def end(self, t: int) -> int:
        """The workload's end: a fault still on is stopped, then everything healed; the final reads
        follow after the spec's settle time."""
        self.workload_end = t
        # fault ops already scheduled (a start's or stop's completion) are recorded first
        pending = sorted(e for e in self.sim.heap if e[2] == "emit")
        for te, _, _, data in pending:
            self.sim.emit(max(te, t), *data)
            t = max(te, t)
        t += 50 * MS
        if self.cur is not None:
            w, v = self.cur, self.cur.values
            self.sim.emit(t, NEMESIS_PROCESS, INVOKE, f"stop-{w.name}", v["key"], None, None, v["node"])
            t += 30 * MS
            self.sim.emit(t, NEMESIS_PROCESS, OK, f"stop-{w.name}", v["key"], v["stop"], None, v["node"])
            w.stop = t
            self.cur = None
        if self.faults:
            t += 1 * MS
            self.sim.emit(t, NEMESIS_PROCESS, INVOKE, "heal", "")
            t += 20 * MS
            self.sim.emit(t, NEMESIS_PROCESS, OK, "heal", "", {"healed": True, "resumed": [], "started": []})
        return t + int(self.spec.settle * S)

    def _in_outage(self, t: int, topic: int) -> Window | None:
        w = self.cur
        if w is not None and t < w.outage_end and (w.topic is None or w.topic == topic):
            return w
        return None

    # -- sends ----------------------------------------------------------------------------------
    def send_topic(self, t: int, thread: int, topic: int) -> int:
        w = self.nm_wait.get(thread)
        return w[0] if w is not None else topic

    def send_outcome(self, t: int, thread: int, topic: int, value: int) -> str | None:
        w = self.nm_wait.get(thread)
        if w is not None:                                   # the second send of a nonmonotonic pair
            if w[4] is None:
                w[4] = value
                self.nm_b[value] = thread
                return OK
        kind = self._take(t, ("lost", "duplicate", "divergence", "nonmonotonic-send"))
        if kind is not None:
            if kind == "lost":
                self.lost_pending[value] = topic
                return OK
            if kind == "duplicate":
                self.dup[value] = topic
                return OK
            if kind == "divergence":
                self.div_pending.append((topic, value, t))
                return INFO                                 # indeterminate, and never appended
            self.nm_a[value] = thread
            return OK
        if self._in_outage(t, topic) is not None:          # what clients see while the fault bites
            r = self.rng.random()
            if r < 0.04:
                return FAIL
            if r < 0.05:
                return INFO
            if r < 0.06:
                return "info-appended"
        return None

    def send_latency(self, t: int, topic: int, lat: int) -> int:
        w = self._in_outage(t, topic)
        if w is not None:                                   # appended once the fault's outage is over
            return 2 * (w.outage_end - t) + lat
        if self.cur is not None and (self.cur.topic is None or self.cur.topic == topic):
            return int(lat * self.cur.slow)
        if t < self.recover_until:
            return 2 * (self.recover_until - t) + lat
        return lat

    def append(self, t: int, topic: int, value: int) -> tuple[int, int]:
        lg = self.logs[topic]
        if value in self.dup:
            first = lg.append(t, value)
            second = lg.append(t, value)
            self.planted["duplicate"].append({"topic": self.names[topic], "value": value,
                                              "message_ids": [_mid(*first), _mid(*second)]})
            return first
        if value in self.nm_a:
            thread = self.nm_a.pop(value)
            slot = len(lg.entries)
            held = lg.append(t, None)                       # held open for the producer's next send
            self.nm_wait[thread] = [topic, slot, held, value, None]
            return lg.append(t, value)
        if value in self.nm_b:
            w = self.nm_wait[self.nm_b[value]]
            _, slot, held, _, _ = w
            lg.entries[slot] = (t, value, held[0], held[1])
            return held
        return lg.append(t, value)

    def send_done(self, t: int, thread: int, process: int, topic: int, value: int, type_: str) -> None:
        if value in self.lost_pending and type_ == OK:
            self.lost[value] = self.lost_pending.pop(value)
            self.planted["lost"].append({"topic": self.names[topic], "value": value})
        elif value in self.nm_b and type_ == OK:
            th = self.nm_b.pop(value)
            tp, _, held, a, b = self.nm_wait.pop(th)
            self.planted["nonmonotonic-send"].append({"topic": self.names[tp], "process": process,
                                                      "earlier": a, "later": b,
                                                      "later_message_id": _mid(*held)})

    # -- receives and reads ---------------------------------------------------------------------
    def receive(self, t: int, topic: int, msgs: list[dict]) -> list[dict]:
        for k, (tp, w, t_inv) in enumerate(self.div_pending):
            if tp == topic and t_inv <= t:
                # a message of this receive whose position holds no divergence yet (a redelivery may
                # bring one back): w is delivered at its position too
                first = next((m for m in msgs if (topic, _mid_key(m["message_id"])) not in self.div_at), None)
                if first is None:
                    break
                del self.div_pending[k]
                self.div_at.add((topic, _mid_key(first["message_id"])))
                msgs.append({"value": w, "message_id": dict(first["message_id"]), "redelivery_count": 0})
                self.planted["divergence"].append({"topic": self.names[topic],
                                                   "message_id": dict(first["message_id"]),
                                                   "values": [first["value"], w]})
                break
        if self._take(t, ("unexpected",)) is not None:
            self.unexpected_n += 1
            v = -self.unexpected_n                          # sent values are positive: nobody sent it
            mid = _mid(UNEXPECTED_LEDGER + self.unexpected_n, 0)
            msgs.append({"value": v, "message_id": mid, "redelivery_count": 0})
            self.planted["unexpected"].append({"topic": self.names[topic], "value": v, "message_id": dict(mid)})
        return msgs

    def final_read(self, topic: int, msgs: list[dict]) -> None:
        lost = {v for v, tp in self.lost.items() if tp == topic}
        if lost or any(m["value"] is None for m in msgs):
            msgs[:] = [m for m in msgs if m["value"] is not None and m["value"] not in lost]


# ------------------------------------------------------------------------------------ one run

def _workload_shape(spec: TestSpec) -> tuple[int, int]:
    """(producers, consumers) as the log workload splits `concurrency` (workloads.log.threads)."""
    c = spec.concurrency
    consumers = 0 if c < 2 else min(spec.topics, max(1, c // 3))
    return max(1, c - consumers), max(1, consumers)


def log_opts(spec: TestSpec) -> dict[str, Any]:
    """The log checker's opts for the spec's workload, as the runner passes them."""
    import workloads
    return dict(workloads.get(spec.workload).checkers(spec)["log"][1])


def _drains(hooks: CampaignHooks, t: int) -> int:
    """The subscriptions workload's final drains: what each topic's subscription has not received."""
    sim = hooks.sim
    for ti, lg in enumerate(hooks.logs):
        c = hooks.cursor[ti]
        lost = {v for v, tp in hooks.lost.items() if tp == ti}
        msgs = [{"value": v, "message_id": _mid(le, en), "redelivery_count": 0}
                for (_, v, le, en) in lg.entries[c:] if v is not None and v not in lost]
        p = FINAL_READ_PROCESS + len(hooks.logs) + ti
        sim.emit(t, p, INVOKE, "drain", hooks.names[ti])
        t += 100 * MS
        if msgs:
            sim.emit(t, p, OK, "drain", hooks.names[ti], msgs, None, f"broker-{ti % 2 + 1}")
        else:
            sim.emit(t, p, FAIL, "drain", hooks.names[ti], None, None, "", "empty")
    return t


class _SubscriptionHooks(CampaignHooks):
    def end(self, t: int) -> int:
        return _drains(self, super().end(t))


def simulate(spec: TestSpec, run_id: str, *, rates: dict[str, float] | None = None,
             plant_after: list[tuple[int, str]] | None = None, n_ops: int | None = None,
             sink: Any = None, producers: int | None = None, consumers: int | None = None
             ) -> tuple[list[Op], CampaignHooks]:
    """The history of one simulated run of `spec` (log or subscriptions workload) and its hooks
    (planted anomalies, fault windows). Without n_ops the run lasts spec.time_limit at spec.rate."""
    from workloads.pulsar_client import topic_names
    p, c = _workload_shape(spec)
    p, c = producers or p, consumers or c
    cls = _SubscriptionHooks if spec.workload == "subscriptions" else CampaignHooks
    hooks = cls(spec.seed, spec, rates, plant_after)
    sends_per_s = max(0.5, spec.rate / 2)                  # the rest of the ops are receives
    gap = int(2 * p / sends_per_s * S) if n_ops is None else 2 * MS
    ops = gen_log(n_ops if n_ops is not None else 10**12, spec.seed, topics=spec.topics, producers=p,
                  consumers=c, hooks=hooks, sink=sink, names=topic_names(spec.test_name, run_id, spec.topics),
                  send_gap_ns=max(1, gap), t_stop=None if n_ops is not None else int(spec.time_limit * S))
    return ops, hooks


def planted_counts(planted: dict[str, list[Any]]) -> dict[str, int]:
    return {k: len(planted.get(k, [])) for k in TYPES}


def found_by_checker(result: Any) -> dict[str, list[dict[str, Any]]]:
    """The five types' anomalies of a log-checker result, in the manifest's form (sorted)."""
    an = result.anomalies if hasattr(result, "anomalies") else result.get("anomalies", {})
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in TYPES}
    for a in an.get("lost", []):
        out["lost"].append({"topic": a["topic"], "value": a["value"]})
    for a in an.get("duplicate", []):
        out["duplicate"].append({"topic": a["topic"], "value": a["value"],
                                 "message_ids": sorted(a["message_ids"], key=_mid_key)})
    for a in an.get("divergence", []):
        out["divergence"].append({"topic": a["topic"], "message_id": a["message_id"],
                                  "values": sorted(a["values"])})
    for a in an.get("nonmonotonic-send", []):
        out["nonmonotonic-send"].append({"topic": a["topic"], "process": a["process"],
                                         "earlier": a["earlier"]["value"], "later": a["later"]["value"],
                                         "later_message_id": a["later"]["message_id"]})
    for a in an.get("unexpected", []):
        out["unexpected"].append({"topic": a["topic"], "value": a["value"], "message_id": a["message_id"]})
    return {k: sorted(v, key=_entry_key) for k, v in out.items()}


def normalized(planted: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for k in TYPES:
        rows = []
        for e in planted.get(k, []):
            e = dict(e)
            if k == "duplicate":
                e["message_ids"] = sorted(e["message_ids"], key=_mid_key)
            if k == "divergence":
                e["values"] = sorted(e["values"])
            rows.append(e)
        out[k] = sorted(rows, key=_entry_key)
    return out


def _mid_key(m: dict[str, int]) -> tuple[int, ...]:
    return (m["ledger_id"], m["entry_id"], max(m.get("batch_index", -1), 0))


def _entry_key(e: dict[str, Any]) -> str:
    return json.dumps(e, sort_keys=True)


def compare(planted: dict[str, list[dict[str, Any]]], result: Any) -> tuple[bool, dict[str, int]]:
    """(the checker found exactly the planted anomalies of the five types, its counts of them)."""
    stats = result.stats if hasattr(result, "stats") else result.get("stats", {})
    counts = {k: stats.get("anomaly_counts", {}).get(k, 0) for k in TYPES}
    return (normalized(planted) == found_by_checker(result) and counts == planted_counts(planted)), counts


# ------------------------------------------------------------------------------------ the campaign

def campaign_spec(i: int, rng: random.Random, out: Path) -> TestSpec:
    """Run i's spec: the grid cell (nemesis set x bug setting) of i, the rest drawn."""
    nemesis = NEMESES[i % len(NEMESES)]
    knobs = BUG_SETTINGS[(i // len(NEMESES)) % len(BUG_SETTINGS)]
    workload = "subscriptions" if rng.random() < 0.25 else "log"
    e, qw, qa = rng.choice(QUORUMS)
    name = f"{workload}-{'-'.join(nemesis) or 'none'}"
    spec = TestSpec(test_name=name, workload=workload, nemesis=list(nemesis), time_limit=rng.choice((30.0, 60.0)),
                    rate=rng.choice((20.0, 30.0, 40.0)), concurrency=6, topics=rng.choice((2, 2, 3)),
                    ensemble=e, write_quorum=qw, ack_quorum=qa, bugs={k: UNSAFE[k] for k in knobs},
                    options={"subscription": "failover"} if workload == "subscriptions" else {},
                    seed=rng.randrange(1, 2**31), results_dir=str(out),
                    backend="docker" if rng.random() < 0.3 else "netns")
    return spec.validate("campaign_gen", catalog=CATALOG)


def rates_for(spec: TestSpec) -> dict[str, float]:
    """Per fault window, the probability of each type: each unsafe knob draws on its own (1 - prod)."""
    keep: dict[str, float] = {}
    for knob, val in spec.bugs.items():
        if UNSAFE.get(knob) == val:
            for kind, p in KNOB_EFFECTS[knob].items():
                keep[kind] = 1 - (1 - keep.get(kind, 0.0)) * (1 - p)
    return keep


def run_times(n: int, start: datetime, days: int, rng: random.Random) -> list[float]:
    """Nightly: the runs spread over `days` nights from 01:00, a few minutes apart; epoch seconds."""
    per_night = math.ceil(n / days)
    out = []
    for i in range(n):
        night, k = divmod(i, per_night)
        t = start + timedelta(days=night, hours=1, minutes=3 * k, seconds=rng.randrange(0, 90))
        out.append(t.timestamp())
    return out


def write_run(out: Path, spec: TestSpec, when: float, *, rates: dict[str, float], jsonl: bool = True
              ) -> dict[str, Any]:
    """One campaign run folder; its manifest entry."""
    from checkers.log import check
    run_dir = store.create_run_dir(out, spec.test_name, when=when)
    spec = spec.with_expectation(CATALOG)            # test.toml records the resolved expectation, as a run's does
    store.write_test_toml(run_dir, spec)
    history, hooks = simulate(spec, run_dir.name, rates=rates)
    if jsonl:
        write_jsonl(history, run_dir / store.HISTORY_JSONL)
    store.write_parquet(history, run_dir)
    t0 = time.monotonic()
    result = check(history, log_opts(spec))
    check_s = time.monotonic() - t0
    started = datetime.fromtimestamp(when).astimezone()
    dur = history[-1].time_ns / S if history else 0.0
    valid = result.valid
    store.write_results(
        run_dir, valid=valid, exit_code=store.exit_code_for(valid), error=None,
        run={"dir": str(run_dir), "test_name": spec.test_name, "started_at": started.isoformat(timespec="seconds"),
             "ended_at": (started + timedelta(seconds=dur + 5)).isoformat(timespec="seconds"),
             "service_url": "", "seed": spec.seed, "cluster": "", "cluster_dir": None,
             "topics": list(hooks.names), "workers": 2, "step": "final-reads", "final_reads": True,
             "interrupted": None, "errors": [],
             "timings": {"workload_s": spec.time_limit, "check_s": round(check_s, 3)}},
        checkers={"log": result}, synthetic={"generator": "bench/campaign_gen.py", "seed": spec.seed},
        expected=spec.expected, expected_reason=spec.expected_reason, expectation_met=met(spec.expected, valid),
        detection=detection_of(history, {"log": result}, valid))
    matches, counts = compare(hooks.planted, result)
    return manifest_entry(out, run_dir, spec, hooks, len(history), rates) | {
        "python": {"valid": valid, "counts": counts, "matches_planted": matches}}


def manifest_entry(out: Path, run_dir: Path, spec: TestSpec, hooks: CampaignHooks, n_ops: int,
                   rates: dict[str, float]) -> dict[str, Any]:
    planted = normalized(hooks.planted)
    return {"run": os.path.relpath(run_dir, out), "test_name": spec.test_name, "workload": spec.workload,
            "nemesis": list(spec.nemesis), "bugs": dict(spec.bugs), "backend": spec.backend,
            "ensemble": spec.ensemble, "write_quorum": spec.write_quorum, "ack_quorum": spec.ack_quorum,
            "ops": n_ops, "topics": list(hooks.names),
            "fault_windows": [{"fault": w.name, "start_s": round(w.start / S, 3),
                               "stop_s": round(w.stop / S, 3) if w.stop is not None else None}
                              for w in hooks.windows],
            "rates_per_window": rates,
            # the log checker's verdict without unknowns: duplicates alone do not invalidate a run
            "expected_valid": not any(planted[k] for k in TYPES if k in INVALID_BY_DEFAULT),
            "counts": planted_counts(planted), "planted": planted}


def campaign(out: Path, runs: int, seed: int, days: int, start: datetime | None, jsonl: bool) -> dict[str, Any]:
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    if start is None:
        today = datetime.now().replace(hour=0, minute=0, second=0, microsecond=0)
        start = today - timedelta(days=days)
    times = run_times(runs, start, days, rng)
    entries = []
    t0 = time.monotonic()
    for i in range(runs):
        spec = campaign_spec(i, rng, out)
        entries.append(write_run(out, spec, times[i], rates=rates_for(spec), jsonl=jsonl))
        if (i + 1) % 20 == 0 or i + 1 == runs:
            print(f"{i + 1}/{runs} runs, {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    manifest = {"generator": "bench/campaign_gen.py", "mode": "campaign", "seed": seed, "runs": entries,
                "types": list(TYPES), "knob_effects_per_window": KNOB_EFFECTS,
                "totals": {k: sum(e["counts"][k] for e in entries) for k in TYPES},
                "python_matches_planted": all(e["python"]["matches_planted"] for e in entries)}
    store.write_json(out / MANIFEST, manifest)
    return manifest


# ------------------------------------------------------------------------------------ a detection campaign

# the detection campaign's scenarios (as campaigns/detection.toml's): each knob of KNOB_EFFECTS under one of
# them (knob i under scenario i mod n), `seeds` runs with it; every scenario `valid_seeds` runs without any
DETECTION_SCENARIOS: tuple[tuple[str, ...], ...] = (("kill",), ("partition", "kill"))


def detection_spec(nemesis: tuple[str, ...], knob: str | None, seed: int, out: Path) -> TestSpec:
    name = f"det-{'-'.join(nemesis)}-{(knob or 'none').replace('.', '-').replace('_', '-')}-{seed}"
    spec = TestSpec(test_name=name, workload="log", nemesis=list(nemesis), time_limit=30.0, rate=30.0,
                    concurrency=6, topics=2, bugs={knob: UNSAFE[knob]} if knob else {}, seed=seed,
                    results_dir=str(out))
    return spec.validate("campaign_gen", catalog=CATALOG)


def detection_campaign(out: Path, seeds: int, valid_seeds: int, seed: int, jsonl: bool) -> dict[str, Any]:
    """Run folders laid out as a campaign folder's (OUT/runs/<test>/<time>/): each knob under its scenario
    for `seeds` seeds, each scenario without a knob for `valid_seeds`; manifest.json lists them."""
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    plan: list[tuple[tuple[str, ...], str | None]] = []
    for i, knob in enumerate(sorted(KNOB_EFFECTS)):
        plan += [(DETECTION_SCENARIOS[i % len(DETECTION_SCENARIOS)], knob)] * seeds
    for nem in DETECTION_SCENARIOS:
        plan += [(nem, None)] * valid_seeds
    start = datetime.now().replace(microsecond=0) - timedelta(hours=len(plan))
    entries = []
    for n, (nem, knob) in enumerate(plan):
        spec = detection_spec(nem, knob, seed * 1000 + n + 1, runs_dir)
        when = (start + timedelta(minutes=2 * n)).timestamp()
        entries.append(write_run(runs_dir, spec, when, rates=rates_for(spec), jsonl=jsonl))
    for e in entries:
        e["run"] = os.path.relpath(out / "runs" / e["run"], out)
    manifest = {"generator": "bench/campaign_gen.py", "mode": "detection", "seed": seed, "runs": entries,
                "scenarios": [list(s) for s in DETECTION_SCENARIOS], "knob_effects_per_window": KNOB_EFFECTS}
    store.write_json(out / MANIFEST, manifest)
    return manifest


# ------------------------------------------------------------------------------------ one long run

class ParquetSink:
    """history.parquet and deliveries.parquet written a chunk of ops at a time (one row group each)."""

    def __init__(self, run_dir: Path, jsonl: bool = False):
        import pyarrow.parquet as pq
        hs, ds = store._schemas()
        self.paths = [run_dir / store.HISTORY_PARQUET, run_dir / store.DELIVERIES_PARQUET]
        self.tmp = [p.with_name(p.name + ".tmp") for p in self.paths]
        self.hw = pq.ParquetWriter(self.tmp[0], hs)
        self.dw = pq.ParquetWriter(self.tmp[1], ds)
        self.jsonl = open(run_dir / (store.HISTORY_JSONL + ".tmp"), "w", encoding="utf-8") if jsonl else None
        self.run_dir = run_dir
        self.ops = 0
        self.deliveries = 0
        self.last: dict[int, tuple] = {}      # each process's latest op, carried across chunks (its invoke)

    def __call__(self, ops: list[Op]) -> None:
        self.hw.write_table(store.history_table(ops, self.last))
        d = store.deliveries_table(ops)
        if d.num_rows:
            self.dw.write_table(d)
        self.ops += len(ops)
        self.deliveries += d.num_rows
        if self.jsonl is not None:
            from core.history import json_default
            for op in ops:
                self.jsonl.write(json.dumps(op.to_json(), separators=(",", ":"), default=json_default) + "\n")

    def close(self) -> None:
        self.hw.close()
        self.dw.close()
        for tmp, path in zip(self.tmp, self.paths):
            os.replace(tmp, path)
        if self.jsonl is not None:
            self.jsonl.close()
            os.replace(self.run_dir / (store.HISTORY_JSONL + ".tmp"), self.run_dir / store.HISTORY_JSONL)


def single(out: Path, n_ops: int, seed: int, plants: dict[str, int], name: str, jsonl: bool) -> dict[str, Any]:
    """One run folder with an n_ops history written in chunks, and the manifest."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    spec = TestSpec(test_name=name, workload="log", nemesis=["partition", "kill", "pause", "zk-isolate"],
                    time_limit=max(1.0, round(n_ops / 5_000.0)), concurrency=28, topics=8,
                    bugs={"broker.recovery_fencing": False}, seed=seed, results_dir=str(out)).validate("campaign_gen", catalog=CATALOG)
    plant_after = sorted((int(n_ops * rng.uniform(0.05, 0.9)), kind) for kind, k in plants.items() for _ in range(k))
    when = time.time()
    run_dir = store.create_run_dir(out, name, when=when)
    store.write_test_toml(run_dir, spec)
    sink = ParquetSink(run_dir, jsonl)
    t0 = time.monotonic()
    _, hooks = simulate(spec, run_dir.name, plant_after=plant_after, n_ops=n_ops, sink=sink,
                        producers=20, consumers=8)
    sink.close()
    gen_s = time.monotonic() - t0
    spec.time_limit = float(max(1, round(hooks.workload_end / S)))
    store.write_test_toml(run_dir, spec)                 # the workload's simulated length, now known
    store.write_results(run_dir, valid="unknown", exit_code=2,
                        error=f"not checked yet; fix: run `python bench/campaign_gen.py check {run_dir}`",
                        run={"dir": str(run_dir), "test_name": name, "seed": seed, "topics": list(hooks.names),
                             "errors": [], "timings": {"generate_s": round(gen_s, 1)}},
                        checkers={}, synthetic={"generator": "bench/campaign_gen.py", "seed": seed})
    entry = manifest_entry(out, run_dir, spec, hooks, sink.ops, {})
    entry["planted_requested"] = plants
    entry["deliveries"] = sink.deliveries
    manifest = {"generator": "bench/campaign_gen.py", "mode": "single", "seed": seed, "runs": [entry],
                "types": list(TYPES), "totals": entry["counts"],
                "generate_s": round(gen_s, 1),
                "generate_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    store.write_json(out / MANIFEST, manifest)
    return manifest


# ------------------------------------------------------------------------------------ checking

def ops_from_parquet(path: Path, limit: int | None = None) -> list[Op]:
    """A history.parquet as the Op list the checkers take, read one row group at a time."""
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(path)
    out: list[Op] = []
    loads = json.loads
    names = ["index", "time_ns", "process", "type", "f", "key", "value", "message_id", "node", "error"]
    for g in range(pf.num_row_groups):
        t = pf.read_row_group(g, columns=names)      # not the invoke_* columns: an Op has no use for them
        cols = {name: t.column(name).to_pylist() for name in t.column_names}
        del t
        for idx, tn, p, ty, f, k, v, m, nd, er in zip(cols["index"], cols["time_ns"], cols["process"],
                                                      cols["type"], cols["f"], cols["key"], cols["value"],
                                                      cols["message_id"], cols["node"], cols["error"]):
            out.append(Op(process=p, type=ty, f=f, key=k or "", value=loads(v) if v is not None else None,
                          message_id=MessageId(**m) if m is not None else None, node=nd or "",
                          error=er or "", time_ns=tn, index=idx))
            if limit is not None and len(out) >= limit:
                return out
        del cols
    return out


def check_run(run_dir: Path, manifest: Path | None) -> dict[str, Any]:
    """Load a run's history.parquet, run the log checker, write results.json, compare with the manifest."""
    from checkers.log import check
    spec = store.load_spec(run_dir, catalog=None)
    if not (run_dir / store.HISTORY_PARQUET).is_file():
        raise store.HistoryError(f"{run_dir / store.HISTORY_PARQUET}: missing; fix: give a run folder written "
                                 f"by this generator or by `pulsar-chaos run`")
    t0 = time.monotonic()
    history = ops_from_parquet(run_dir / store.HISTORY_PARQUET)
    load_s = time.monotonic() - t0
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t1 = time.monotonic()
    result = check(history, log_opts(spec))
    check_s = time.monotonic() - t1
    n = len(history)
    del history
    valid = result.valid
    old = store.read_results(run_dir) or {}
    run = dict(old.get("run") or {"dir": str(run_dir), "test_name": spec.test_name})
    run["errors"] = []
    run.setdefault("timings", {})["check_s"] = round(check_s, 1)
    store.write_results(run_dir, valid=valid, exit_code=store.exit_code_for(valid), error=None, run=run,
                        checkers={"log": result}, checked_at=store.now_iso(),
                        synthetic=old.get("synthetic", {"generator": "bench/campaign_gen.py"}))
    out: dict[str, Any] = {"run": str(run_dir), "ops": n, "load_s": round(load_s, 1), "check_s": round(check_s, 1),
                           "rss_after_load_mib": round(rss_loaded),
                           "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                           "valid": valid, "anomaly_counts": result.stats.get("anomaly_counts", {})}
    if manifest is not None:
        m = json.loads(manifest.read_text())
        rel = os.path.relpath(run_dir, manifest.parent)
        entry = next((e for e in m["runs"] if e["run"] == rel), None)
        if entry is None:
            out["matches_planted"] = None
            out["note"] = f"{rel} is not in {manifest}"
        else:
            out["matches_planted"], out["found"] = compare(entry["planted"], result)
            out["planted"] = entry["counts"]
    return out


# ------------------------------------------------------------------------------------ the CLI

def _plants(s: str) -> dict[str, int]:
    out = dict(DEFAULT_SINGLE_PLANTS)
    for item in filter(None, (x.strip() for x in s.split(","))):
        k, sep, v = item.partition("=")
        if not sep or k.strip() not in TYPES or not v.strip().isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not TYPE=COUNT with TYPE one of {', '.join(TYPES)}")
        out[k.strip()] = int(v)
    return out


def _date(s: str) -> datetime:
    try:
        return datetime.strptime(s, "%Y-%m-%d")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a date like 2026-10-22") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("campaign", help="many small run folders over workloads x nemeses x configs and ~30 days")
    c.add_argument("out", type=Path)
    c.add_argument("--runs", type=int, default=200)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--days", type=int, default=30, help="nights the runs are spread over")
    c.add_argument("--start", type=_date, help="the first night (default: --days ago)")
    c.add_argument("--no-jsonl", action="store_true", help="leave history.jsonl out (parquet only)")
    s = sub.add_parser("single", help="one run folder with a long history, written in chunks")
    s.add_argument("out", type=Path)
    s.add_argument("--ops", type=int, default=10_000_000)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--name", default="single", help="the test name (folder under OUT)")
    s.add_argument("--plant", type=_plants, default=dict(DEFAULT_SINGLE_PLANTS),
                   help="planted anomalies, e.g. lost=25,duplicate=20 (defaults: "
                        + ",".join(f"{k}={v}" for k, v in DEFAULT_SINGLE_PLANTS.items()) + ")")
    s.add_argument("--jsonl", action="store_true", help="also write history.jsonl (about 300 bytes an op)")
    d = sub.add_parser("detection", help="a detection campaign's run folders (OUT/runs/...): each bug knob under "
                                         "its scenario, and each scenario without a knob")
    d.add_argument("out", type=Path)
    d.add_argument("--seeds", type=int, default=5, help="runs per knob (default 5)")
    d.add_argument("--valid-seeds", type=int, default=20, help="runs per scenario without a knob (default 20)")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--no-jsonl", action="store_true", help="leave history.jsonl out (parquet only)")
    k = sub.add_parser("check", help="the Python log checker over a run's history.parquet, against the manifest")
    k.add_argument("run_dir", type=Path)
    k.add_argument("--manifest", type=Path, help="default: OUT/manifest.json two levels up")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "campaign":
            if args.runs < 1 or args.days < 1:
                ap.error("--runs and --days must be at least 1")
            t0 = time.monotonic()
            m = campaign(args.out, args.runs, args.seed, args.days, args.start, not args.no_jsonl)
            print(json.dumps({"runs": len(m["runs"]), "planted": m["totals"],
                              "python_matches_planted": m["python_matches_planted"],
                              "seconds": round(time.monotonic() - t0, 1),
                              "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                              "manifest": str(args.out / MANIFEST)}))
            return 0 if m["python_matches_planted"] else 1
        if args.cmd == "detection":
            if args.seeds < 1 or args.valid_seeds < 0:
                ap.error("--seeds must be at least 1 and --valid-seeds at least 0")
            m = detection_campaign(args.out, args.seeds, args.valid_seeds, args.seed, not args.no_jsonl)
            print(json.dumps({"runs": len(m["runs"]), "folder": str(args.out), "manifest": str(args.out / MANIFEST)}))
            return 0
        if args.cmd == "single":
            if args.ops < 1000:
                ap.error("--ops must be at least 1000")
            m = single(args.out, args.ops, args.seed, args.plant, args.name, args.jsonl)
            e = m["runs"][0]
            print(json.dumps({"run": str(args.out / e["run"]), "ops": e["ops"], "deliveries": e["deliveries"],
                              "planted": e["counts"], "seconds": m["generate_s"],
                              "peak_rss_mib": m["generate_peak_rss_mib"], "manifest": str(args.out / MANIFEST)}))
            return 0
        manifest = args.manifest
        if manifest is None:
            guess = args.run_dir.resolve().parents[1] / MANIFEST
            manifest = guess if guess.exists() else None
        r = check_run(args.run_dir, manifest)
        print(json.dumps(r))
        return 0 if r.get("matches_planted") in (True, None) else 1
    except (SpecError, store.HistoryError) as e:
        print(f"campaign_gen: {e}", file=sys.stderr)
        return 254
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"campaign_gen: {where}{e.strerror or e}; fix: check the paths given", file=sys.stderr)
        return 254


if __name__ == "__main__":
    sys.exit(main())
