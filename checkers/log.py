"""The log checker: acknowledged sends survive, every reader agrees on the log, producers go forward.

A pure function over a `log` workload history (send, receive, final read per topic) that finds lost,
unexpected, duplicated and divergent messages and nonmonotonic sends, and gathers the report's stats.

Model (after Jepsen's kafka checker, mapped to Pulsar): a topic is an append-only log; a message's
position is its MessageId (ledger_id, entry_id, batch_index) and sent values are unique. Every ok
send, ok receive and ok final read is an observation "value v sits at position m of topic t"; two
values at one position is `divergence`, one value at two positions is a `duplicate`. The final reads
(a Reader from the earliest message after the faults healed) must hold every acknowledged send.

Positions ignore the partition field (ledger ids are unique in a cluster) and treat batch_index -1
(an entry that is not a batch) as 0: an entry holds either one plain message or a batch, never both,
so the two spellings can only denote the same message.

One pass over the history keeps dicts keyed by (topic, value) and (topic, position); the cost is
linear in the number of ops and delivered messages, the memory linear in distinct messages.
"""
from __future__ import annotations

import math
from typing import Any

from harness.history import FAIL, INFO, INVOKE, NEMESIS_PROCESS, OK, CheckResult, MessageId, Op

# Anomaly types that make the history invalid unless opts["invalid"] says otherwise.
INVALID_BY_DEFAULT = ("lost", "unexpected", "divergence", "nonmonotonic-send")
# Every anomaly type this checker can report, invalidating or informational.
ANOMALY_TYPES = ("lost", "unexpected", "divergence", "nonmonotonic-send", "duplicate", "aborted-read",
                 "misplaced", "nonmonotonic-read", "unseen")

DEFAULTS: dict[str, Any] = {
    "invalid": INVALID_BY_DEFAULT,   # anomaly types that make `valid` False
    "max_anomalies": 1000,           # evidence entries kept per type (None: all); counts stay exact
    "bucket_s": 1.0,                 # width of the throughput / latency-over-time buckets
    "max_buckets": 5000,             # wider buckets when a run is longer than this many buckets
    "max_points": 2000,              # raw (t, latency) points kept for the latency scatter plot
    "gap_s": 1.0,                    # a pause between ok sends longer than this counts as unavailable
}

_NO_VALUE = object()


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check a log-workload history; see the module docstring and `ANOMALY_TYPES`."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    c = _LogCheck(history, o)
    c.scan()
    return c.result()


# ---------------------------------------------------------------------------------------- helpers

def _norm(v: Any) -> Any:
    """A message value as a hashable, comparable key: ints stay ints, strings of ints become ints."""
    if type(v) is int:
        return v
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s)
        except ValueError:
            return v
    if isinstance(v, bytes):
        return _norm(v.decode("utf-8", "replace"))
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, (int, float)):
        return v
    return repr(v)        # unhashable or odd: still comparable as text


def _mid(d: Any) -> tuple[int, int, int, int] | None:
    """(ledger, entry, partition, batch_index) from a dict, list, MessageId or "(l,e,p,b)" string."""
    if d is None:
        return None
    try:
        if isinstance(d, dict):
            return (int(d["ledger_id"]), int(d["entry_id"]), int(d.get("partition", -1)),
                    int(d.get("batch_index", -1)))
        if isinstance(d, MessageId):
            return (d.ledger_id, d.entry_id, d.partition, d.batch_index)
        if isinstance(d, str):
            d = [x for x in d.strip("()[] ").replace(":", ",").split(",") if x.strip()]
        if isinstance(d, (list, tuple)) and 2 <= len(d) <= 4:
            t = [int(x) for x in d] + [-1] * (4 - len(d))
            return (t[0], t[1], t[2], t[3])
    except (KeyError, TypeError, ValueError):
        return None
    return None


def _mid_json(m: tuple[int, int, int, int] | None) -> dict[str, int] | None:
    if m is None:
        return None
    return {"ledger_id": m[0], "entry_id": m[1], "partition": m[2], "batch_index": m[3]}


def _order(m: tuple[int, int, int, int]) -> tuple[int, int, int]:
    """The log order of a message id: (ledger, entry, batch index with -1 read as 0)."""
    b = m[3]
    return (m[0], m[1], b if b > 0 else 0)


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        try:
            return sorted(_jsonable(x) for x in v)
        except TypeError:
            return [_jsonable(x) for x in v]
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, MessageId):
        return _mid_json(_mid(v))
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _entry(m: Any) -> tuple[Any, tuple[int, int, int, int] | None, int]:
    """(value, message id, redelivery count) of one delivered message."""
    if isinstance(m, dict):
        rc = m.get("redelivery_count") or 0
        try:
            rc = int(rc)
        except (TypeError, ValueError):
            rc = 0
        return _norm(m.get("value")), _mid(m.get("message_id")), rc
    return _norm(m), None, 0


def _pct(sorted_vals: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    n = len(sorted_vals)
    if n == 0:
        return None
    return sorted_vals[min(n - 1, max(0, math.ceil(q * n) - 1))]


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _fault_name(f: str) -> tuple[str, str]:
    """("start"|"stop"|"heal"|"", name) of a nemesis op's f."""
    if f.startswith("start-"):
        return "start", f[6:]
    if f.startswith("stop-"):
        if f[5:] in ("all", "faults"):
            return "heal", ""
        return "stop", f[5:]
    if f in ("heal", "heal-all", "stop"):
        return "heal", ""
    return "", f


# An observation of a value at a position: (source, op, message id, slot in the op's message list).
Obs = tuple[str, Op, "tuple[int, int, int, int] | None", int]


class _LogCheck:
    def __init__(self, history: list[Op], opts: dict[str, Any]):
        self.h = history
        self.o = opts
        self.counts: dict[tuple[str, str], int] = {}
        self.open: dict[int, Op] = {}
        # (topic, value) -> [invoke, completion | None]; insertion (invoke) order
        self.sends: dict[tuple[str, Any], list[Any]] = {}
        self.send_topics: dict[str, list[int]] = {}          # topic -> [invoked, ok, fail, info]
        self.reused_values = 0
        self.ok_without_id = 0
        self.orphans = 0
        self.dangling = 0                                     # a process invoked again without completing
        self.lat: list[tuple[int, int, str]] = []             # (invoke ns, latency ns, type) of sends
        self.ok_done: list[int] = []                          # completion ns of ok sends
        self.last_send: dict[tuple[int, str, int], tuple[tuple[int, int, int], list[Any]]] = {}
        self.nonmono_send: list[tuple[list[Any], list[Any]]] = []
        # (topic, l, e, b) -> (value, obs), and the positions seen with more than one value
        self.pos: dict[tuple[str, int, int, int], tuple[Any, Obs]] = {}
        self.conflicts: dict[tuple[str, int, int, int], dict[Any, Obs]] = {}
        # (topic, value) -> (position | None, obs) from reads and receives, and values at >1 position
        self.vpos: dict[tuple[str, Any], tuple[Any, Obs]] = {}
        self.dups: dict[tuple[str, Any], dict[Any, Obs]] = {}
        self.recv_first: dict[tuple[str, Any], Obs] = {}
        self.recv_topics: set[str] = set()
        self.recv_msgs = 0
        self.redelivered = 0
        self.received_again = 0
        self.read_status: dict[str, list[str]] = {}
        self.reads: dict[str, list[tuple[Op, set[Any], int]]] = {}
        self.nonmono_read: list[dict[str, Any]] = []
        self.read_repeats = 0
        self.malformed: list[dict[str, Any]] = []
        self.malformed_n = 0
        self.faults: list[list[Any]] = []
        self.open_faults: dict[str, list[list[Any]]] = {}
        self.nem_open: Op | None = None
        self.t_min: int | None = None
        self.t_max = 0
        self._index_of: dict[int, int] | None = None

    # ------------------------------------------------------------------------------------ the pass

    def scan(self) -> None:
        counts = self.counts
        t_min = None
        t_max = 0
        for op in self.h:
            k = (op.f, op.type)
            counts[k] = counts.get(k, 0) + 1
            t = op.time_ns
            if t_min is None or t < t_min:
                t_min = t
            if t > t_max:
                t_max = t
            p = op.process
            if p == NEMESIS_PROCESS:
                self._nemesis(op)
                continue
            f = op.f
            if op.type == INVOKE:
                if p in self.open:
                    self.dangling += 1
                self.open[p] = op
                if f == "send":
                    self._send_invoke(op)
                elif f == "receive":
                    self.recv_topics.add(op.key)
                elif f == "read":
                    self.read_status.setdefault(op.key, [])
                continue
            inv = self.open.pop(p, None)
            if inv is None:
                self.orphans += 1
            elif inv.f != f:
                self.orphans += 1
                inv = None
            if f == "send":
                self._send_done(inv, op)
            elif f == "receive":
                if op.type == OK:
                    self._receive(inv, op)
            elif f == "read":
                self._read_done(inv, op)
        self.t_min = t_min if t_min is not None else 0
        self.t_max = t_max

    def _send_invoke(self, op: Op) -> None:
        key = (op.key, _norm(op.value))
        st = self.send_topics.get(op.key)
        if st is None:
            st = self.send_topics[op.key] = [0, 0, 0, 0]
        st[0] += 1
        if key in self.sends:
            self.reused_values += 1
            rec = self.sends[key]
            if rec[1] is not None and rec[1].type == OK:
                return          # keep the acknowledged one; the reuse is counted in stats
        self.sends[key] = [op, None]

    def _send_done(self, inv: Op | None, op: Op) -> None:
        topic = inv.key if inv is not None else op.key
        value = _norm(inv.value if inv is not None else op.value)
        key = (topic, value)
        rec = self.sends.get(key)
        if inv is None:                              # a completion whose invoke is not in the history
            if rec is None:
                rec = self.sends[key] = [op, None]
                self.send_topics.setdefault(topic, [0, 0, 0, 0])[0] += 1
            elif rec[1] is not None:
                rec = [op, None]
        elif rec is None or rec[0] is not inv:       # a reused value behind an acknowledged one
            rec = [inv, None]
        rec[1] = op
        t = op.type
        st = self.send_topics.setdefault(topic, [0, 0, 0, 0])
        st[1 if t == OK else 2 if t == FAIL else 3] += 1
        if inv is not None:
            self.lat.append((inv.time_ns, op.time_ns - inv.time_ns, t))
        if t != OK:
            return
        self.ok_done.append(op.time_ns)
        m = _mid(op.message_id)
        if m is None:
            self.ok_without_id += 1
            return
        self._at(topic, m, value, ("send", op, m, -1))
        k = (op.process, topic, m[2])
        order = _order(m)
        last = self.last_send.get(k)
        if last is not None and order < last[0]:
            self.nonmono_send.append((last[1], rec))
        self.last_send[k] = (order, rec)

    def _messages(self, op: Op) -> list[Any]:
        v = op.value
        if v is None:
            return []
        if isinstance(v, dict):
            return [v]
        if isinstance(v, (list, tuple)):
            return list(v)
        self._bad(op, "value is not a list of messages")
        return []

    def _receive(self, inv: Op | None, op: Op) -> None:
        topic = op.key or (inv.key if inv is not None else "")
        self.recv_topics.add(topic)
        for j, m in enumerate(self._messages(op)):
            v, mid, rc = _entry(m)
            if v is None:
                self._bad(op, f"message {j} has no value")
                continue
            self.recv_msgs += 1
            if rc > 0:
                self.redelivered += 1
            obs = ("receive", op, mid, j)
            k = (topic, v)
            if k in self.recv_first:
                self.received_again += 1
            else:
                self.recv_first[k] = obs
            self._seen(topic, v, mid, obs)

    def _read_done(self, inv: Op | None, op: Op) -> None:
        topic = op.key or (inv.key if inv is not None else "")
        self.read_status.setdefault(topic, []).append(op.type)
        if op.type != OK:
            return
        vals: set[Any] = set()
        last: dict[int, tuple[tuple[int, int, int], int, Any, tuple[int, int, int, int]]] = {}
        msgs = self._messages(op)
        for j, m in enumerate(msgs):
            v, mid, _ = _entry(m)
            if v is None:
                self._bad(op, f"message {j} has no value")
                continue
            vals.add(v)
            self._seen(topic, v, mid, ("read", op, mid, j))
            if mid is not None:
                order = _order(mid)
                prev = last.get(mid[2])
                if prev is not None:
                    if order < prev[0]:
                        self.nonmono_read.append({
                            "topic": topic, "partition": mid[2], "read": self._ref(op),
                            "previous": {"slot": prev[1], "value": _jsonable(prev[2]),
                                         "message_id": _mid_json(prev[3])},
                            "next": {"slot": j, "value": _jsonable(v), "message_id": _mid_json(mid)}})
                    elif order == prev[0]:
                        self.read_repeats += 1
                last[mid[2]] = (order, j, v, mid)
        self.reads.setdefault(topic, []).append((op, vals, len(msgs)))

    def _seen(self, topic: str, v: Any, mid: tuple[int, int, int, int] | None, obs: Obs) -> None:
        """A read or receive saw v (at mid, when known)."""
        k = (topic, v)
        pk = None
        if mid is not None:
            b = mid[3]
            pk = (topic, mid[0], mid[1], b if b > 0 else 0)
            self._at(topic, mid, v, obs, pk)
        cur = self.vpos.get(k)
        if cur is None:
            self.vpos[k] = (pk, obs)
        elif pk is not None and cur[0] != pk:
            if cur[0] is None:
                self.vpos[k] = (pk, obs)
                return
            d = self.dups.get(k)
            if d is None:
                self.dups[k] = {cur[0]: cur[1], pk: obs}
            elif pk not in d:
                d[pk] = obs

    def _at(self, topic: str, mid: tuple[int, int, int, int], v: Any, obs: Obs,
            pk: tuple[str, int, int, int] | None = None) -> None:
        """Some op says v sits at mid of topic."""
        if pk is None:
            b = mid[3]
            pk = (topic, mid[0], mid[1], b if b > 0 else 0)
        cur = self.pos.get(pk)
        if cur is None:
            self.pos[pk] = (v, obs)
        elif cur[0] != v:
            d = self.conflicts.get(pk)
            if d is None:
                self.conflicts[pk] = {cur[0]: cur[1], v: obs}
            elif v not in d:
                d[v] = obs

    def _nemesis(self, op: Op) -> None:
        kind, name = _fault_name(op.f)
        if op.type == INVOKE:
            self.nem_open = op
            if kind == "start":
                self.open_faults.setdefault(name, []).append(
                    [op.time_ns, None, name, op.value, op])
            return
        inv = self.nem_open if (self.nem_open is not None and self.nem_open.f == op.f) else None
        self.nem_open = None
        if kind == "start":
            stack = self.open_faults.setdefault(name, [])
            period = next((p for p in reversed(stack) if p[4] is inv), None) if inv is not None else None
            if period is None:                       # a completion without its invoke
                period = [op.time_ns, None, name, op.value, op]
                stack.append(period)
            if op.type == FAIL:                      # the fault never started
                stack.remove(period)
            elif op.value is not None:
                period[3] = op.value                 # the targets as resolved
        elif kind in ("stop", "heal") and op.type == FAIL:
            return                                   # the fault is still on
        elif kind == "stop":
            stack = self.open_faults.get(name)
            if stack:
                p = stack.pop(0)
                p[1] = op.time_ns
                self.faults.append(p)
        elif kind == "heal":
            for stack in self.open_faults.values():
                for p in stack:
                    p[1] = op.time_ns
                    self.faults.append(p)
                stack.clear()
        elif op.type != FAIL:                        # an instantaneous fault such as "kill"
            start = inv.time_ns if inv is not None else op.time_ns
            value = op.value if op.value is not None else (inv.value if inv is not None else None)
            self.faults.append([start, op.time_ns, name, value, op])

    def _bad(self, op: Op, why: str) -> None:
        self.malformed_n += 1
        if len(self.malformed) < 20:
            self.malformed.append({"op": self._ref(op), "why": why})

    # ---------------------------------------------------------------------------------- evidence

    def _index(self, op: Op) -> int:
        if op.index >= 0:
            return op.index
        if self._index_of is None:
            self._index_of = {id(x): i for i, x in enumerate(self.h)}
        return self._index_of.get(id(op), -1)

    def _ref(self, op: Op | None) -> dict[str, Any] | None:
        if op is None:
            return None
        r = {"index": self._index(op), "time_s": round(op.time_ns / 1e9, 6), "process": op.process,
             "type": op.type, "f": op.f, "node": op.node or None}
        if op.error:
            r["error"] = op.error
        return r

    def _send_json(self, rec: list[Any]) -> dict[str, Any]:
        inv, comp = rec
        out = {"topic": inv.key, "value": _jsonable(_norm(inv.value)),
               "outcome": comp.type if comp is not None else None,
               "message_id": _mid_json(_mid(comp.message_id)) if comp is not None else None,
               "invoke": self._ref(inv) if inv.type == INVOKE else None,
               "completion": self._ref(comp),
               "latency_ms": (_r((comp.time_ns - inv.time_ns) / 1e6)
                              if comp is not None and inv.type == INVOKE else None)}
        return out

    def _obs_json(self, topic: str, v: Any, obs: Obs) -> dict[str, Any]:
        src, op, mid, slot = obs
        out = {"source": src, "value": _jsonable(v), "message_id": _mid_json(mid), "op": self._ref(op)}
        if src == "send":
            rec = self.sends.get((topic, v))
            out["invoke"] = self._ref(rec[0]) if rec is not None and rec[0].type == INVOKE else None
        else:
            out["slot"] = slot
        return out

    # ------------------------------------------------------------------------------------ verdict

    def result(self) -> CheckResult:
        cap = self.o.get("max_anomalies")
        found: dict[str, list[Any]] = {t: [] for t in ANOMALY_TYPES}
        counts = {t: 0 for t in ANOMALY_TYPES}

        def add(kind: str, make) -> None:
            counts[kind] += 1
            if cap is None or len(found[kind]) < cap:
                found[kind].append(make())

        # which topics' final reads completed
        final: dict[str, dict[str, Any]] = {}
        incomplete: list[str] = []
        for topic in sorted(set(self.send_topics) | set(self.read_status), key=str):
            status = self.read_status.get(topic)
            reads = self.reads.get(topic, [])
            if reads:
                st = OK
            elif status:
                st = INFO if INFO in status else FAIL
            else:
                st = "missing"
            last = reads[-1] if reads else None
            final[topic] = {"status": st, "reads": len(status or []), "ok_reads": len(reads),
                            "messages": last[2] if last else None,
                            "distinct_values": len(last[1]) if last else None}
            if st != OK and topic in self.send_topics:
                incomplete.append(topic)
        complete = {t for t, d in final.items() if d["status"] == OK}

        info_sends = {"total": 0, "found": 0, "not_found": 0, "unknown": 0}
        lost_by_topic: dict[str, int] = {}
        for (topic, v), rec in self.sends.items():
            inv, comp = rec
            t = comp.type if comp is not None else None
            seen = self.vpos.get((topic, v))
            if t == OK:
                if topic in complete:
                    missing = [op for op, vals, _ in self.reads[topic] if v not in vals]
                    if missing:
                        lost_by_topic[topic] = lost_by_topic.get(topic, 0) + 1
                        add("lost", lambda: {
                            "topic": topic, "value": _jsonable(v),
                            "message_id": _mid_json(_mid(comp.message_id)),
                            "send": self._send_json(rec),
                            "missing_from_reads": [self._ref(op) for op in missing],
                            "read_by": (self._obs_json(topic, v, seen[1]) if seen is not None else None),
                            "received_during_run": (self._obs_json(topic, v, self.recv_first[(topic, v)])
                                                    if (topic, v) in self.recv_first else None)})
                    elif topic in self.recv_topics and (topic, v) not in self.recv_first:
                        add("unseen", lambda: {"topic": topic, "value": _jsonable(v),
                                               "message_id": _mid_json(_mid(comp.message_id)),
                                               "send": self._send_json(rec)})
                m = _mid(comp.message_id)
                if m is not None and seen is not None and seen[0] is not None:
                    b = m[3]
                    pk = (topic, m[0], m[1], b if b > 0 else 0)
                    at = self.dups.get((topic, v)) or {seen[0]: seen[1]}
                    if pk not in at and pk not in self.conflicts:
                        add("misplaced", lambda: {
                            "topic": topic, "value": _jsonable(v), "acked_message_id": _mid_json(m),
                            "read_message_ids": [_mid_json(o[2]) for o in at.values()],
                            "send": self._send_json(rec),
                            "observations": [self._obs_json(topic, v, o) for o in at.values()]})
            elif t == FAIL:
                if seen is not None:
                    add("aborted-read", lambda: {"topic": topic, "value": _jsonable(v),
                                                 "send": self._send_json(rec),
                                                 "observation": self._obs_json(topic, v, seen[1])})
            else:                                         # info, or never completed
                info_sends["total"] += 1
                if seen is not None:
                    info_sends["found"] += 1
                elif topic in complete:
                    info_sends["not_found"] += 1
                else:
                    info_sends["unknown"] += 1

        # values read that no send to that topic ever attempted
        sent_to: dict[Any, list[str]] | None = None
        for (topic, v), (pk, obs) in self.vpos.items():
            if (topic, v) in self.sends:
                continue
            if sent_to is None:
                sent_to = {}
                for (t2, v2) in self.sends:
                    sent_to.setdefault(v2, []).append(t2)
            add("unexpected", lambda: {"topic": topic, "value": _jsonable(v),
                                       "message_id": _mid_json(obs[2]),
                                       "observation": self._obs_json(topic, v, obs),
                                       "sent_to_topics": sent_to.get(v, [])})

        for pk, by_value in self.conflicts.items():
            topic = pk[0]
            obs_list = list(by_value.items())
            add("divergence", lambda: {
                "topic": topic,
                "message_id": _mid_json(obs_list[0][1][2]),
                "values": [_jsonable(v) for v, _ in obs_list],
                "sources": sorted({o[0] for _, o in obs_list}),
                "observations": [self._obs_json(topic, v, o) for v, o in obs_list]})

        for (topic, v), by_pos in self.dups.items():
            obs_list = list(by_pos.values())
            rec = self.sends.get((topic, v))
            add("duplicate", lambda: {
                "topic": topic, "value": _jsonable(v),
                "message_ids": [_mid_json(o[2]) for o in obs_list],
                "observations": [self._obs_json(topic, v, o) for o in obs_list],
                "send": self._send_json(rec) if rec is not None else None})

        for earlier, later in self.nonmono_send:
            add("nonmonotonic-send", lambda: {
                "topic": later[0].key, "process": later[1].process,
                "partition": _mid(later[1].message_id)[2],
                "earlier": self._send_json(earlier), "later": self._send_json(later)})

        for a in self.nonmono_read:
            add("nonmonotonic-read", lambda: a)

        anomalies = {k: v for k, v in found.items() if counts[k]}
        invalid_types = set(self.o.get("invalid") or ())
        if any(counts.get(k) for k in invalid_types):
            valid: bool | str = False
        elif incomplete:
            valid = "unknown"
        else:
            valid = True

        stats = self._stats()
        stats["anomaly_counts"] = {k: n for k, n in counts.items() if n}
        stats["anomalies_truncated"] = {k: n for k, n in counts.items()
                                        if n > len(found[k])}
        stats["invalid_types"] = sorted(invalid_types)
        stats["lost_count"] = counts["lost"]
        stats["duplicate_count"] = counts["duplicate"]
        stats["unseen_count"] = counts["unseen"]
        stats["final_reads"] = final
        stats["incomplete_topics"] = incomplete
        stats["info_sends"] = info_sends
        for topic, d in stats["topics"].items():
            d["lost"] = lost_by_topic.get(topic, 0)
            d["final_read"] = final.get(topic, {}).get("status", "missing")
            d["final_read_messages"] = final.get(topic, {}).get("messages")
        return CheckResult(valid=valid, anomalies=anomalies, stats=stats)

    # -------------------------------------------------------------------------------------- stats

    def _stats(self) -> dict[str, Any]:
        o = self.o
        ops: dict[str, dict[str, int]] = {}
        for (f, t), n in sorted(self.counts.items()):
            ops.setdefault(f, {})[t] = n

        ok_lat = sorted(l for _, l, t in self.lat if t == OK)
        ms = [x / 1e6 for x in ok_lat]
        latency = {"count": len(ms), "p50": _r(_pct(ms, 0.50)), "p95": _r(_pct(ms, 0.95)),
                   "p99": _r(_pct(ms, 0.99)), "max": _r(ms[-1] if ms else None),
                   "mean": _r(sum(ms) / len(ms) if ms else None)}

        # the window the sends ran in, and its buckets
        send_times = [i for i, _, _ in self.lat] + self.ok_done
        if send_times:
            w0, w1 = min(send_times), max(max(send_times), max(i + l for i, l, _ in self.lat)
                                          if self.lat else 0)
        else:
            w0 = w1 = 0
        span_s = (w1 - w0) / 1e9
        bucket_s = float(o.get("bucket_s") or 1.0)
        max_b = int(o.get("max_buckets") or 5000)
        if span_s / bucket_s > max_b:
            bucket_s = float(math.ceil(span_s / max_b / bucket_s) * bucket_s)
        start_s = math.floor(w0 / 1e9 / bucket_s) * bucket_s
        b_ns = bucket_s * 1e9
        s_ns = start_s * 1e9
        nb = int((w1 - s_ns) // b_ns) + 1 if send_times else 0
        per = [0] * nb
        for t in self.ok_done:
            per[min(nb - 1, max(0, int((t - s_ns) // b_ns)))] += 1
        lat_b: list[list[int]] = [[] for _ in range(nb)]
        for i, l, t in self.lat:
            if t == OK:
                lat_b[min(nb - 1, max(0, int((i - s_ns) // b_ns)))].append(l)
        p50, p99, mx = [], [], []
        for b in lat_b:
            b.sort()
            p50.append(_r(_pct(b, 0.5) / 1e6) if b else None)
            p99.append(_r(_pct(b, 0.99) / 1e6) if b else None)
            mx.append(_r(b[-1] / 1e6) if b else None)
        throughput = {"ok_sends": len(self.ok_done),
                      "ok_sends_per_s": _r(len(self.ok_done) / span_s if span_s > 0 else None),
                      "window_s": [_r(w0 / 1e9), _r(w1 / 1e9)],
                      "bucket_s": bucket_s, "start_s": _r(start_s),
                      "per_bucket": [_r(n / bucket_s) for n in per]}
        over_time = {"bucket_s": bucket_s, "start_s": _r(start_s), "p50_ms": p50, "p99_ms": p99,
                     "max_ms": mx, "points": self._points()}

        # unavailability: gaps between consecutive ok sends
        done = sorted(self.ok_done)
        gap_s = float(o.get("gap_s", 1.0))
        longest, at, total, gaps = 0.0, None, 0.0, []
        for a, b in zip(done, done[1:]):
            g = (b - a) / 1e9
            if g > longest:
                longest, at = g, [_r(a / 1e9), _r(b / 1e9)]
            if g > gap_s:
                total += g
                if len(gaps) < 1000:
                    gaps.append([_r(a / 1e9), _r(b / 1e9)])
        unavailable = {"longest_gap_s": _r(longest), "longest_gap_at": at, "threshold_s": gap_s,
                       "total_s": _r(total), "gaps": gaps}

        faults = [[_r(p[0] / 1e9), _r((p[1] if p[1] is not None else self.t_max) / 1e9), p[2],
                   _jsonable(p[3])] for p in self.faults]
        open_at_end = [p for stack in self.open_faults.values() for p in stack]
        faults += [[_r(p[0] / 1e9), _r(self.t_max / 1e9), p[2], _jsonable(p[3])] for p in open_at_end]
        faults.sort(key=lambda p: (p[0], p[1]))

        sends = {"attempted": len(self.sends) + self.reused_values, "ok": 0, "fail": 0, "info": 0,
                 "unfinished": 0, "ok_without_message_id": self.ok_without_id,
                 "reused_values": self.reused_values}
        for inv, comp in self.sends.values():
            sends[comp.type if comp is not None else "unfinished"] += 1
        topics = {t: {"sends": st[0], "ok": st[1], "fail": st[2], "info": st[3]}
                  for t, st in sorted(self.send_topics.items(), key=lambda x: str(x[0]))}

        return {
            "ops": ops,
            "duration_s": _r((self.t_max - (self.t_min or 0)) / 1e9),
            "sends": sends,
            "send_latency_ms": latency,
            "throughput": throughput,
            "latency_over_time": over_time,
            "unavailable": unavailable,
            "fault_periods": faults,
            "faults_open_at_end": len(open_at_end),
            "receives": {"messages": self.recv_msgs, "distinct": len(self.recv_first),
                         "redelivered": self.redelivered, "received_again": self.received_again,
                         "topics": sorted(self.recv_topics, key=str)},
            "read_repeats": self.read_repeats,
            "topics": topics,
            "history": {"ops": len(self.h), "orphan_completions": self.orphans,
                        "abandoned_invocations": self.dangling + len(self.open),
                        "malformed": self.malformed_n, "malformed_examples": self.malformed},
        }

    def _points(self) -> list[list[Any]]:
        """(invoke time s, latency ms, type) of sends, at most max_points, every fail/info kept first."""
        budget = int(self.o.get("max_points") or 2000)
        ok = [x for x in self.lat if x[2] == OK]
        other = [x for x in self.lat if x[2] != OK]

        def sample(xs: list, n: int) -> list:
            if len(xs) <= n:
                return xs
            if n <= 0:
                return []
            step = len(xs) / n
            return [xs[int(i * step)] for i in range(n)]

        other = sample(other, budget // 2)
        ok = sample(ok, budget - len(other))
        pts = sorted(ok + other)
        return [[_r(i / 1e9), _r(l / 1e6), t] for i, l, t in pts]
