"""The log checker: acknowledged sends survive, every reader agrees on the log, producers and consumers go forward.

A pure function over a `log`-style history (send, receive/drain, final read per topic) that finds lost,
unexpected, duplicated and divergent messages, nonmonotonic sends, consumers that skip or go back in
the log (Jepsen's Kafka taxonomy, mapped to Pulsar's subscription types), and gathers the report's stats.

Model (after Jepsen's kafka checker, mapped to Pulsar): a topic is an append-only log; a message's
position is its MessageId (ledger_id, entry_id, batch_index) and sent values are unique. Every ok
send, ok receive and ok final read is an observation "value v sits at position m of topic t"; two
values at one position is `divergence` (Jepsen's inconsistent-offsets), one value at two positions is
a `duplicate`. The final reads (a Reader from the earliest message after the faults healed) must hold
every acknowledged send (`lost` otherwise, Jepsen's lost-write); an acknowledged send that no
consumer received during the run is `unseen`.

A topic whose final read did not end ok cannot show what it lost, so its verdict is at best
"unknown"; one loss is still proven: an acknowledged send whose entry's every copy was on a bookie
wiped after the acknowledgement (checkers/wipes.py), reported as `lost` with that proof.

Positions ignore the partition field (ledger ids are unique in a cluster) and treat batch_index -1
(an entry that is not a batch) as 0: an entry holds either one plain message or a batch, never both,
so the two spellings can only denote the same message.

Consumer order. The log order of a topic (per partition) is the order of its longest ok final read
(or, with no final read, the order of every position observed). A consumer is (process, topic,
subscription); the subscription is the message's "subscription" field, "" when absent (one per
topic). A delivery is a *redelivery* when its redelivery_count > 0 or the subscription already
received that value before (a rewind after a reconnect or failover replays unacknowledged messages);
every other delivery is a *first delivery*. Then, by opts["subscription_type"]:

- Exclusive, Failover:
  - `nonmonotonic-poll`: a consumer's first delivery lies before its previous delivery in the log.
  - `poll-skip`: between two consecutive deliveries to a consumer the log has a message that the
    subscription never received at all (by the end of the history, through any consumer or drain).
    Messages that another consumer of the subscription got (a failover) are not skipped.
  - `nonmonotonic-subscription`: a first delivery to one consumer lies before a first delivery to
    another consumer of the subscription in a receive that completed before this one was invoked
    (first deliveries of a subscription go forward in time order; concurrent receives are not
    compared, their order is unknown).
- Key_Shared (per message "key"; messages without one share the key None):
  - `nonmonotonic-key`: for a key, a first delivery lies before a first delivery of that key in a
    receive that completed before this one was invoked (any consumer), or before an earlier one in
    the same receive.
  - `key-overlap`: two consumers held key k unacknowledged at once. Precisely: consumers A and B
    (different processes) get first deliveries a and b of key k, a lies before b in the log, and
    B's receive that returned b completed before A's receive that returned a did. The broker
    dispatches a key's messages in log order (what nonmonotonic-key checks), so a was dispatched
    to A before b to B; the workload acknowledges each message at the end of the receive that
    returned it, so A still held a, unacknowledged, when B already had b. (A plain time overlap
    of the two receives is not enough: a consumer waiting in receive may get k only after the
    other consumer acknowledged it, when the key moves on a rebalance.)
- Shared: no order claim (consumers compete), so none of these are computed.

One pass over the history keeps dicts keyed by topic, then value or position; a second pass over the
recorded deliveries checks consumer order. The cost is linear in ops and delivered messages (plus a
log factor per receive for the time frontier), the memory linear in distinct messages.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from operator import attrgetter
from typing import Any

from checkers.toolkit import (BATCH_LIMIT, ENTRY_LIMIT, Cases, Mid, OpRefs, anomalies_of, anomaly_stats,
                              gc_paused, jsonable, mid_json, mid_tuple, norm_value, op_names, partition_of,
                              percentile, position_key, redelivery_count, rounded, unpack_position, verdict)
from checkers.wipes import Wipes
from core.faults import FaultTimeline
from core.history import FAIL, INFO, INVOKE, NEMESIS_PROCESS, OK, CheckResult, MessageId, Op

# Anomaly types that make the history invalid whatever the subscription type.
INVALID_BY_DEFAULT = ("lost", "unexpected", "divergence", "nonmonotonic-send")
# ... and those that make it invalid for a subscription type (see the module docstring).
INVALID_BY_SUBSCRIPTION: dict[str, tuple[str, ...]] = {
    "Exclusive": ("nonmonotonic-poll", "poll-skip", "nonmonotonic-subscription"),
    "Failover": ("nonmonotonic-poll", "poll-skip", "nonmonotonic-subscription"),
    "Key_Shared": ("nonmonotonic-key", "key-overlap"),
    "Shared": (),
}
SUBSCRIPTION_TYPES = tuple(INVALID_BY_SUBSCRIPTION)
# The anomaly types of consumer order (the walk over the deliveries finds them).
ORDER_TYPES = ("nonmonotonic-poll", "poll-skip", "nonmonotonic-subscription", "nonmonotonic-key", "key-overlap")
# Every anomaly type this checker can report, invalidating or informational.
ANOMALY_TYPES = ("lost", "unexpected", "divergence", "nonmonotonic-send", "duplicate", "aborted-read",
                 "misplaced", "nonmonotonic-read", "unseen") + ORDER_TYPES

DEFAULTS: dict[str, Any] = {
    # anomaly types that make `valid` False; None: INVALID_BY_DEFAULT plus
    # INVALID_BY_SUBSCRIPTION[subscription_type] (of every type in use when it is a dict)
    "invalid": None,
    "subscription_type": "Exclusive",  # Exclusive | Failover | Shared | Key_Shared, or {topic: type}
    "send": ("send",),               # f names of sends
    "receive": ("receive", "drain"),  # f names of consumer deliveries (receive ops, final drains)
    "read": ("read",),               # f names of final reads (a Reader from the earliest message)
    "max_anomalies": 1000,           # evidence entries kept per type (None: all); counts stay exact
    "bucket_s": 1.0,                 # width of the throughput / latency-over-time buckets
    "max_buckets": 5000,             # wider buckets when a run is longer than this many buckets
    "max_points": 2000,              # raw (t, latency) points kept for the latency scatter plot
    "gap_s": 1.0,                    # a pause between ok sends longer than this counts as unavailable
}


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check a log-workload history; see the module docstring and `ANOMALY_TYPES`."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    with gc_paused():
        c = _LogCheck(history, o)
        c.scan()
        r = c.result()
        del c                       # freed before the collector is back, which then has less to walk
    return r


def subscription_type(name: Any) -> str:
    """The canonical spelling of a subscription type ("key_shared", "KeyShared" -> "Key_Shared")."""
    key = str(name).replace("_", "").replace("-", "").lower()
    for t in SUBSCRIPTION_TYPES:
        if t.replace("_", "").lower() == key:
            return t
    raise ValueError(f"unknown subscription_type {name!r}; fix: use one of {', '.join(SUBSCRIPTION_TYPES)}")


_NONE = object()


def _before(a: Any, b: Any) -> bool:
    """Position a lies before position b in the log."""
    if type(a) is int and type(b) is int:
        return a < b
    return unpack_position(a) < unpack_position(b)


def _msg_at(op: Op, slot: int) -> Any:
    v = op.value
    if isinstance(v, dict):
        return v
    try:
        return v[slot]
    except (IndexError, KeyError, TypeError):
        return None


# An observation of a value at a position: (source "send" | "receive" | "read", op, slot in the op's
# message list, -1 for a send's acknowledgement). Message ids are looked up again for evidence only.
Obs = tuple[str, Op, int]
# A topic's log order: (source "final-read" | "positions", partition -> value -> index, partition -> values).
Order = tuple[str, dict[int, dict[Any, int]], dict[int, list[Any]]]
# A delivery placed in the log order: (log index, receive op, slot, value, redelivery count).
Deliv = tuple[int, Op, int, Any, int]
# topic -> (values whose send failed, values whose send ended info or never completed).
Unacked = dict[str, tuple[list[Any], list[Any]]]


class _LogCheck(OpRefs):
    def __init__(self, history: list[Op], opts: dict[str, Any]):
        self.h = history
        self.o = opts
        self.send_fs, self.recv_fs, self.read_fs = op_names(opts)
        st = opts.get("subscription_type") or "Exclusive"
        if isinstance(st, dict):
            self.sub_types = {k: subscription_type(v) for k, v in st.items()}
            self.sub_default = subscription_type(st.get("*", "Exclusive"))
        else:
            self.sub_types = {}
            self.sub_default = subscription_type(st)
        self.counts: dict[tuple[str, str], int] = {}
        self.open: dict[int, Op] = {}
        self.open_rec: dict[int, list[Any] | None] = {}      # a process's open send's record
        # topic -> value -> [invoke, completion | None, acknowledged position | None]; invoke order
        self.sends: dict[str, dict[Any, list[Any]]] = {}
        self.send_topics: dict[str, list[int]] = {}          # topic -> [invoked, ok, fail, info]
        self.reused_values = 0
        self.ok_without_id = 0
        self.orphans = 0
        self.dangling = 0                                     # a process invoked again without completing
        self.ok_inv: list[int] = []                           # invoke ns of ok sends (with their invoke)
        self.ok_lat: list[int] = []                           # ... and their latency ns
        self.other_lat: list[tuple[int, int, str]] = []       # (invoke ns, latency ns, type), other sends
        self.ok_done: list[int] = []                          # completion ns of ok sends
        self.last_send: dict[tuple[int, str, int], tuple[Any, list[Any]]] = {}
        self.nonmono_send: list[tuple[list[Any], list[Any]]] = []
        # topic -> position -> (value, obs), and the positions seen with more than one value
        self.pos: dict[str, dict[Any, tuple[Any, Obs]]] = {}
        self.conflicts: dict[tuple[str, Any], dict[Any, Obs]] = {}
        # topic -> value -> (position | None, obs) from reads and receives, and values at >1 position
        self.vpos: dict[str, dict[Any, tuple[Any, Obs]]] = {}
        self.dups: dict[tuple[str, Any], dict[Any, Obs]] = {}
        self.recv_first: dict[str, dict[Any, Obs]] = {}     # topic -> value -> first receive
        self.recv_topics: set[str] = set()
        self.recv_msgs = 0
        self.redelivered = 0
        self.received_again = 0
        # receive ops in completion order: (op, invoke ns, topic, [(value, redelivery count,
        # partition, key, subscription, slot)])
        self.deliveries: list[tuple[Op, int, str, list[tuple[Any, int, int, Any, Any, int]]]] = []
        self.read_status: dict[str, list[str]] = {}
        # topic -> [(op, its values, messages, partition -> value -> index, partition -> values)]
        self.reads: dict[str, list[tuple[Op, Any, int, dict[int, dict[Any, int]], dict[int, list[Any]]]]] = {}
        self.nonmono_read: list[dict[str, Any]] = []
        self.read_repeats = 0
        self.malformed: list[dict[str, Any]] = []
        self.malformed_n = 0
        self.faults = FaultTimeline()
        self.wipes = Wipes()                                  # disk wipes and final ledger listings
        self.t_min: int | None = None
        self.t_max = 0

    def _sub_type(self, topic: str) -> str:
        return self.sub_types.get(topic, self.sub_default)

    # ------------------------------------------------------------------------------------ the pass

    def scan(self) -> None:
        self.counts = dict(Counter(map(attrgetter("f", "type"), self.h)))
        times = list(map(attrgetter("time_ns"), self.h))
        t_min = min(times, default=None)
        t_max = max(times, default=0)
        del times
        open_ = self.open
        open_rec = self.open_rec
        send_fs, recv_fs, read_fs = self.send_fs, self.recv_fs, self.read_fs
        for op in self.h:
            f = op.f
            typ = op.type
            p = op.process
            if p < 0:                       # the nemesis; observers (-2) are not clients
                if p == NEMESIS_PROCESS:
                    self.faults.feed(op.time_ns, op.type, op.f, op)
                    self.wipes.nemesis(op)
                continue
            if typ == INVOKE:
                if p in open_:
                    self.dangling += 1
                open_[p] = op
                if f in send_fs:
                    open_rec[p] = self._send_invoke(op)
                elif f in recv_fs:
                    self.recv_topics.add(op.key)
                elif f in read_fs:
                    self.read_status.setdefault(op.key, [])
                continue
            inv = open_.pop(p, None)
            if inv is None:
                self.orphans += 1
            elif inv.f != f:
                self.orphans += 1
                inv = None
            if f in send_fs:
                self._send_done(inv, op, open_rec.pop(p, None) if inv is not None else None)
            elif f in recv_fs:
                # a receive that ended info may still carry what it got (a drain cut short)
                if typ == OK or (typ == INFO and isinstance(op.value, (list, tuple))):
                    self._receive(inv, op)
            elif f in read_fs:
                self._read_done(inv, op)
            else:
                self.wipes.ledgers(op)
        self.t_min = t_min if t_min is not None else 0
        self.t_max = t_max

    def _send_invoke(self, op: Op) -> list[Any] | None:
        """Record an attempt; its record, or None when an acknowledged send of the value is kept."""
        topic = op.key
        v = op.value
        if type(v) is not int:
            v = norm_value(v)
        by_v = self.sends.get(topic)
        if by_v is None:
            by_v = self.sends[topic] = {}
            self.send_topics[topic] = [0, 0, 0, 0]
        self.send_topics[topic][0] += 1
        rec = by_v.get(v)
        if rec is not None:
            self.reused_values += 1
            if rec[1] is not None and rec[1].type == OK:
                return None     # keep the acknowledged one; the reuse is counted in stats
        rec = by_v[v] = [op, None, None]
        return rec

    def _send_done(self, inv: Op | None, op: Op, rec: list[Any] | None) -> None:
        """A send's completion; rec is what _send_invoke returned for inv (None: look it up)."""
        topic = inv.key if inv is not None else op.key
        st = self.send_topics.get(topic)
        if st is None:
            st = self.send_topics[topic] = [0, 0, 0, 0]
        if rec is not None and rec[0] is inv:
            value = _NONE                            # only needed below for an ack
        else:
            value = inv.value if inv is not None else op.value
            if type(value) is not int:
                value = norm_value(value)
            by_v = self.sends.get(topic)
            if by_v is None:
                by_v = self.sends[topic] = {}
            rec = by_v.get(value)
            if inv is None:                          # a completion whose invoke is not in the history
                if rec is None:
                    rec = by_v[value] = [op, None, None]
                    st[0] += 1
                elif rec[1] is not None:
                    rec = [op, None, None]
            elif rec is None or rec[0] is not inv:   # a reused value behind an acknowledged one
                rec = [inv, None, None]
        rec[1] = op
        t = op.type
        st[1 if t == OK else 2 if t == FAIL else 3] += 1
        if t != OK:
            if inv is not None:
                self.other_lat.append((inv.time_ns, op.time_ns - inv.time_ns, t))
            return
        if inv is not None:
            self.ok_inv.append(inv.time_ns)
            self.ok_lat.append(op.time_ns - inv.time_ns)
        self.ok_done.append(op.time_ns)
        d = op.message_id
        pk = position_key(d) if d is not None else None
        if pk is None:
            self.ok_without_id += 1
            return
        rec[2] = pk
        if value is _NONE:
            value = inv.value
            if type(value) is not int:
                value = norm_value(value)
        pos_t = self.pos.get(topic)
        if pos_t is None:
            pos_t = self.pos[topic] = {}
        cur = pos_t.get(pk)
        if cur is None:
            pos_t[pk] = (value, ("send", op, -1))
        elif cur[0] != value:
            self._conflict(topic, pk, cur, value, ("send", op, -1))
        k = (op.process, topic, d.partition if type(d) is MessageId else partition_of(d))
        last = self.last_send.get(k)
        if last is not None:
            lp = last[0]
            if (pk < lp) if (type(pk) is int and type(lp) is int) else _before(pk, lp):
                self.nonmono_send.append((last[1], rec))
        self.last_send[k] = (pk, rec)

    def _messages(self, op: Op) -> list[Any]:
        v = op.value
        if v is None:
            return []
        if isinstance(v, dict):
            return [v]
        if isinstance(v, (list, tuple)):
            return v
        self._bad(op, "value is not a list of messages")
        return []

    def _receive(self, inv: Op | None, op: Op) -> None:
        topic = op.key or (inv.key if inv is not None else "")
        self.recv_topics.add(topic)
        first = self.recv_first.get(topic)
        if first is None:
            first = self.recv_first[topic] = {}
        pos_t = self.pos.get(topic)
        if pos_t is None:
            pos_t = self.pos[topic] = {}
        vpos_t = self.vpos.get(topic)
        if vpos_t is None:
            vpos_t = self.vpos[topic] = {}
        seen = self._seen
        out = []
        n = redelivered = again = 0
        for j, m in enumerate(self._messages(op)):
            if type(m) is dict:
                v = m.get("value")
                if type(v) is not int:
                    v = norm_value(v)
                d = m.get("message_id")
                rc = m.get("redelivery_count") or 0
                if type(rc) is not int:
                    rc = redelivery_count(rc)
                key = m.get("key")
                sub = m.get("subscription", "")
            else:
                v, d, rc, key, sub = norm_value(m), None, 0, None, ""
            if v is None:
                self._bad(op, f"message {j} has no value")
                continue
            n += 1
            if rc > 0:
                redelivered += 1
            obs = None
            if v in first:
                again += 1
            else:
                obs = first[v] = ("receive", op, j)
            if type(d) is dict:
                # position_key and partition_of inlined for the common spelling of a message id
                lg, e, b = d.get("ledger_id"), d.get("entry_id"), d.get("batch_index", -1)
                if type(lg) is int and type(e) is int and type(b) is int and lg >= 0 and 0 <= e < ENTRY_LIMIT \
                        and b < BATCH_LIMIT:
                    pk = ((lg << 32) | e) << 16 | (b if b > 0 else 0)
                else:
                    pk = position_key(d)
                part = d.get("partition", -1) if pk is not None else -1
                if type(part) is not int:
                    part = partition_of(d)
            elif d is not None:
                pk = position_key(d)
                part = partition_of(d) if pk is not None else -1
            else:
                pk, part = None, -1
            # _seen, inlined: the usual case is a position already known with this value (the ack)
            # and a value seen for the first time
            cur = pos_t.get(pk) if pk is not None else _NONE
            cv = vpos_t.get(v)
            if (cur is None or (cur is not _NONE and cur[0] != v)) or cv is not None:
                seen(topic, v, pk, "receive", op, j, pos_t, vpos_t)
            else:
                vpos_t[v] = (pk, obs or ("receive", op, j))
            out.append((v, rc, part, key, sub, j))
        self.recv_msgs += n
        self.redelivered += redelivered
        self.received_again += again
        if out:
            t_inv = inv.time_ns if inv is not None else op.time_ns
            self.deliveries.append((op, t_inv, topic, out))

    def _read_done(self, inv: Op | None, op: Op) -> None:
        topic = op.key or (inv.key if inv is not None else "")
        self.read_status.setdefault(topic, []).append(op.type)
        if op.type != OK:
            return
        pos_t = self.pos.get(topic)
        if pos_t is None:
            pos_t = self.pos[topic] = {}
        vpos_t = self.vpos.get(topic)
        if vpos_t is None:
            vpos_t = self.vpos[topic] = {}
        seen = self._seen
        # the read's order: partition -> value -> index (first occurrence), partition -> values
        idx: dict[int, dict[Any, int]] = {}
        vls: dict[int, list[Any]] = {}
        cur_part: Any = None
        ix: dict[Any, int] = {}
        vl: list[Any] = []
        last: dict[int, tuple[Any, int, Any, Any]] = {}
        msgs = self._messages(op)
        for j, m in enumerate(msgs):
            if type(m) is dict:
                v = m.get("value")
                if type(v) is not int:
                    v = norm_value(v)
                d = m.get("message_id")
            else:
                v, d = norm_value(m), None
            if v is None:
                self._bad(op, f"message {j} has no value")
                continue
            if d is None:
                part, pk = -1, None
            else:
                part = d.get("partition", -1) if type(d) is dict else partition_of(d)
                pk = position_key(d)
            if part != cur_part:
                ix = idx.get(part)
                if ix is None:
                    ix = idx[part] = {}
                    vl = vls[part] = []
                else:
                    vl = vls[part]
                cur_part = part
            if v not in ix:
                ix[v] = len(vl)
                vl.append(v)
            seen(topic, v, pk, "read", op, j, pos_t, vpos_t)
            if pk is not None:
                prev = last.get(part)
                if prev is not None:
                    lp = prev[0]
                    if (pk < lp) if (type(pk) is int and type(lp) is int) else _before(pk, lp):
                        self.nonmono_read.append({
                            "topic": topic, "partition": part, "read": self.ref(op),
                            "previous": {"slot": prev[1], "value": jsonable(prev[2]),
                                         "message_id": mid_json(mid_tuple(prev[3]))},
                            "next": {"slot": j, "value": jsonable(v), "message_id": mid_json(mid_tuple(d))}})
                    elif pk == prev[0]:
                        self.read_repeats += 1
                last[part] = (pk, j, v, d)
        vals: Any = next(iter(idx.values())) if len(idx) == 1 else set().union(*idx.values())
        self.reads.setdefault(topic, []).append((op, vals, len(msgs), idx, vls))

    def _seen(self, topic: str, v: Any, pk: Any, src: str, op: Op, slot: int,
              pos_t: dict[Any, tuple[Any, Obs]], vpos_t: dict[Any, tuple[Any, Obs]]) -> None:
        """A read or receive saw v (at position pk, when known)."""
        if pk is not None:
            cur = pos_t.get(pk)
            if cur is None:
                pos_t[pk] = (v, (src, op, slot))
            elif cur[0] != v:
                self._conflict(topic, pk, cur, v, (src, op, slot))
        cur = vpos_t.get(v)
        if cur is None:
            vpos_t[v] = (pk, (src, op, slot))
        elif pk is not None and cur[0] != pk:
            if cur[0] is None:
                vpos_t[v] = (pk, (src, op, slot))
                return
            k = (topic, v)
            d = self.dups.get(k)
            if d is None:
                self.dups[k] = {cur[0]: cur[1], pk: (src, op, slot)}
            elif pk not in d:
                d[pk] = (src, op, slot)

    def _at(self, topic: str, pk: Any, v: Any, src: str, op: Op, slot: int,
            pos_t: dict[Any, tuple[Any, Obs]]) -> None:
        """Some op says v sits at position pk of topic."""
        cur = pos_t.get(pk)
        if cur is None:
            pos_t[pk] = (v, (src, op, slot))
        elif cur[0] != v:
            self._conflict(topic, pk, cur, v, (src, op, slot))

    def _conflict(self, topic: str, pk: Any, cur: tuple[Any, Obs], v: Any, obs: Obs) -> None:
        d = self.conflicts.get((topic, pk))
        if d is None:
            self.conflicts[(topic, pk)] = {cur[0]: cur[1], v: obs}
        elif v not in d:
            d[v] = obs

    def _bad(self, op: Op, why: str) -> None:
        self.malformed_n += 1
        if len(self.malformed) < 20:
            self.malformed.append({"op": self.ref(op), "why": why})

    # ----------------------------------------------------------------------------- consumer order

    def _log_order(self, topic: str) -> Order:
        """(source, partition -> value -> index, partition -> values) of a topic's log: its longest ok
        final read, else every observed position in order (one sequence, partition -1)."""
        reads = self.reads.get(topic)
        if reads:
            best = max(range(len(reads)), key=lambda k: (reads[k][2], k))
            return "final-read", reads[best][3], reads[best][4]
        pos_t = self.pos.get(topic) or {}
        ix, vl = {}, []
        for pk in sorted(pos_t, key=unpack_position):
            v = pos_t[pk][0]
            if v not in ix:
                ix[v] = len(vl)
                vl.append(v)
        return "positions", {-1: ix}, {-1: vl}

    def order_cases(self, cap: int | None) -> tuple[dict[str, Cases], dict[str, Any]]:
        """The consumer-order anomalies of the subscription types (module docstring), by type in
        `ORDER_TYPES` order, and the stats of the walk over the deliveries that finds them."""
        cases = {k: Cases(cap) for k in ORDER_TYPES}
        types = {topic: self._sub_type(topic) for topic in self.recv_topics}
        st = {"subscription_types": dict(sorted(types.items(), key=lambda x: str(x[0]))),
              "log_order": {}, "deliveries": 0, "first_deliveries": 0, "redeliveries": 0,
              "not_in_log": 0, "consumers": 0, "keys": 0}
        orders: dict[str, Order] = {}
        for topic, t in types.items():
            if t != "Shared":
                orders[topic] = self._log_order(topic)
                st["log_order"][topic] = orders[topic][0]
        if not orders:
            return cases, st
        marks, gaps, overlap, counts = self._order_walk(orders, types, cases)
        cases["poll-skip"] = self.poll_skip_cases(cap, orders, marks, gaps)
        cases["key-overlap"] = self.key_overlap_cases(cap, overlap)
        st.update(counts)
        return cases, st

    def _order_walk(self, orders: dict[str, Order], types: dict[str, str], cases: dict[str, Cases]
                    ) -> tuple[dict[tuple[Any, ...], bytearray], list[tuple[Any, ...]],
                               dict[tuple[Any, ...], list[list[Any]]], dict[str, int]]:
        """One walk over the deliveries in completion order that finds the anomalies needing its running
        state, into `cases`: `nonmonotonic-poll`, `nonmonotonic-subscription` (Exclusive, Failover) and
        `nonmonotonic-key` (Key_Shared), each with the two deliveries as evidence. A walk per type would
        repeat the work of placing every delivery in the log, so they share this one. It returns what
        the other two finders need: the log indexes each subscription received (bytearrays per
        (topic, subscription, partition)), the consumers' gaps (poll-skip candidates), the first
        deliveries of each key per receive (key-overlap), and the delivery counts for stats."""
        poll, subscription, by_key = (cases["nonmonotonic-poll"], cases["nonmonotonic-subscription"],
                                      cases["nonmonotonic-key"])
        marks: dict[tuple[Any, ...], bytearray] = {}        # (topic, sub, part) -> received by the subscription
        cons: dict[tuple[Any, ...], Deliv] = {}             # consumer -> its last delivery
        gaps: list[tuple[tuple[Any, ...], Deliv, Deliv]] = []
        # time frontier per subscription (Exclusive/Failover) or (subscription, key) (Key_Shared):
        # [completion times, running max of first-delivery index, the delivery holding that max]
        fronts: dict[tuple[Any, ...], list[list[Any]]] = {}
        # (sub, key) -> per receive with first deliveries of the key: [invoke ns, completion ns, process,
        # op, (lowest index, slot, value), (highest index, slot, value)]
        overlap: dict[tuple[Any, ...], list[list[Any]]] = {}
        n = first_n = redeliv_n = unplaced = 0
        users: set[tuple[int, str]] = set()
        for op, t_inv, topic, msgs in self.deliveries:
            o = orders.get(topic)
            if o is None:
                continue
            source, idx, vals = o
            exclusive = types[topic] != "Key_Shared"
            proc = op.process
            t_done = op.time_ns
            users.add((proc, topic))
            local: dict[tuple[Any, ...], tuple[int, Any]] = {}   # this op's highest first delivery per frontier
            for v, rc, part, key, sub, j in msgs:
                n += 1
                if source == "positions":
                    part = -1
                ix = idx.get(part)
                i = ix.get(v) if ix is not None else None
                if i is None:
                    unplaced += 1
                    continue
                sk = (topic, sub, part)
                mk = marks.get(sk)
                if mk is None:
                    mk = marks[sk] = bytearray(len(vals[part]))
                again = rc > 0 or mk[i]
                mk[i] = 1
                if again:
                    redeliv_n += 1
                else:
                    first_n += 1
                d = (i, op, j, v, rc)
                if exclusive:
                    ck = (proc, sk)
                    cur = cons.get(ck)
                    if cur is not None and not again:
                        if i < cur[0]:
                            poll.add(lambda: self._order_json(
                                "consumer", topic, part, sub, None, cur, d, source))
                        elif i > cur[0] + 1:
                            gaps.append((sk, cur, d))
                    cons[ck] = d
                    fk = sk
                else:
                    fk = (sk, key)
                    if not again:
                        ov = overlap.get(fk)
                        if ov is None:
                            ov = overlap[fk] = []
                        if not ov or ov[-1][3] is not op:
                            ov.append([t_inv, t_done, proc, op, (i, j, v), (i, j, v)])
                        else:
                            e = ov[-1]
                            if i < e[4][0]:
                                e[4] = (i, j, v)
                            if i > e[5][0]:
                                e[5] = (i, j, v)
                if again:
                    continue
                fr = fronts.get(fk)
                if fr is not None:
                    k = bisect_left(fr[0], t_inv) - 1
                    if k >= 0 and fr[1][k] > i:
                        e = fr[2][k]
                        if not exclusive:
                            by_key.add(lambda: self._order_json(
                                "key", topic, part, sub, key, e, d, source))
                        elif e[1].process != proc:
                            subscription.add(lambda: self._order_json(
                                "subscription", topic, part, sub, None, e, d, source))
                lo = local.get(fk)
                if lo is not None and not exclusive and i < lo[0]:
                    e = lo[1]
                    by_key.add(lambda: self._order_json(
                        "key", topic, part, sub, key, e, d, source))
                if lo is None or i > lo[0]:
                    local[fk] = (i, d)
            for fk, (i, d) in local.items():
                fr = fronts.get(fk)
                if fr is None:
                    fronts[fk] = [[t_done], [i], [d]]
                elif i > fr[1][-1]:
                    fr[0].append(t_done)
                    fr[1].append(i)
                    fr[2].append(d)
                else:
                    fr[0].append(t_done)
                    fr[1].append(fr[1][-1])
                    fr[2].append(fr[2][-1])
        counts = {"deliveries": n, "first_deliveries": first_n, "redeliveries": redeliv_n, "not_in_log": unplaced,
                  "consumers": len(users), "keys": len(overlap)}
        return marks, gaps, overlap, counts

    def poll_skip_cases(self, cap: int | None, orders: dict[str, Order], marks: dict[tuple[Any, ...], bytearray],
                        gaps: list[tuple[tuple[Any, ...], Deliv, Deliv]]) -> Cases:
        """`poll-skip` (Exclusive, Failover): between two consecutive deliveries to a consumer the log
        holds a message that the subscription never received, through any consumer. Evidence: the
        consumer's two deliveries, the count of skipped messages and the first ten skipped values."""
        cases = Cases(cap)
        for sk, a, b in gaps:
            mk = marks[sk]
            lo, hi = a[0] + 1, b[0]
            if mk.find(0, lo, hi) < 0:
                continue
            topic, sub, part = sk
            src, _, vals = orders[topic]
            missed = [vals[part][x] for x in range(lo, hi) if not mk[x]]
            cases.add(lambda: dict(self._order_json("consumer", topic, part, sub, None, a, b, src),
                                   skipped=len(missed), skipped_values=[jsonable(x) for x in missed[:10]]))
        return cases

    def key_overlap_cases(self, cap: int | None, overlap: dict[tuple[Any, ...], list[list[Any]]]) -> Cases:
        """`key-overlap` (Key_Shared): consumer B's receive of b completed before consumer A's receive of
        a, where a and b are first deliveries of one key and a lies before b in the log, so both held
        the key unacknowledged at once. Evidence: topic, partition, subscription, key, and the two
        deliveries (first: A's, second: B's) with their receives' invoke and completion times."""
        cases = Cases(cap)
        for (sk, key), ov in overlap.items():
            ov.sort(key=lambda x: -x[1])            # latest completion first
            best1 = best2 = None                    # lowest index among later completions, 2 processes
            k = 0
            while k < len(ov):
                t = ov[k][1]
                group = []
                while k < len(ov) and ov[k][1] == t:
                    group.append(ov[k])
                    k += 1
                for e in group:                     # e is B: compare with receives completed later
                    cand = best1 if best1 is not None and best1[2] != e[2] else best2
                    if cand is not None and cand[4][0] < e[5][0]:
                        a = cand
                        cases.add(lambda: {
                            "topic": sk[0], "partition": sk[2], "subscription": sk[1], "key": jsonable(key),
                            "first": self._overlap_json(a, a[4]), "second": self._overlap_json(e, e[5])})
                for e in group:
                    if best1 is None or e[4][0] < best1[4][0]:
                        if best1 is not None and best1[2] != e[2]:
                            best2 = best1
                        best1 = e
                    elif e[2] != best1[2] and (best2 is None or e[4][0] < best2[4][0]):
                        best2 = e
        return cases

    def _order_json(self, scope: str, topic: str, part: int, sub: Any, key: Any, a: Deliv, b: Deliv,
                    source: str) -> dict[str, Any]:
        out = {"topic": topic, "partition": part, "subscription": sub}
        if scope == "key":
            out["key"] = jsonable(key)
        if scope == "consumer":
            out["consumer"] = b[1].process
            out["previous"], out["next"] = self._deliv_json(a), self._deliv_json(b)
        else:
            out["earlier"], out["later"] = self._deliv_json(a), self._deliv_json(b)
        out["log_order"] = source
        return out

    def _deliv_json(self, d: Deliv) -> dict[str, Any]:
        i, op, j, v, rc = d
        m = _msg_at(op, j)
        return {"value": jsonable(v), "log_index": i,
                "message_id": mid_json(mid_tuple(m.get("message_id"))) if isinstance(m, dict) else None,
                "redelivery_count": rc, "op": self.ref(op), "slot": j}

    def _overlap_json(self, e: list[Any], d: tuple[int, int, Any]) -> dict[str, Any]:
        t_inv, t_done, proc, op = e[:4]
        i, j, v = d
        return {"consumer": proc, "value": jsonable(v), "log_index": i, "slot": j, "op": self.ref(op),
                "invoke_s": round(t_inv / 1e9, 6), "complete_s": round(t_done / 1e9, 6)}

    # ---------------------------------------------------------------------------------- evidence

    def _send_json(self, rec: list[Any]) -> dict[str, Any]:
        inv, comp = rec[0], rec[1]
        out = {"topic": inv.key, "value": jsonable(norm_value(inv.value)),
               "outcome": comp.type if comp is not None else None,
               "message_id": mid_json(mid_tuple(comp.message_id)) if comp is not None else None,
               "invoke": self.ref(inv) if inv.type == INVOKE else None,
               "completion": self.ref(comp),
               "latency_ms": (rounded((comp.time_ns - inv.time_ns) / 1e6)
                              if comp is not None and inv.type == INVOKE else None)}
        return out

    def _send_rec(self, topic: str, v: Any) -> list[Any] | None:
        by_v = self.sends.get(topic)
        return by_v.get(v) if by_v is not None else None

    @staticmethod
    def _obs_mid(obs: Obs) -> Mid | None:
        src, op, slot = obs
        if slot < 0:
            return mid_tuple(op.message_id)
        m = _msg_at(op, slot)
        return mid_tuple(m.get("message_id")) if isinstance(m, dict) else None

    def _obs_json(self, topic: str, v: Any, obs: Obs) -> dict[str, Any]:
        src, op, slot = obs
        out = {"source": src, "value": jsonable(v), "message_id": mid_json(self._obs_mid(obs)),
               "op": self.ref(op)}
        if src == "send":
            rec = self._send_rec(topic, v)
            out["invoke"] = self.ref(rec[0]) if rec is not None and rec[0].type == INVOKE else None
        else:
            out["slot"] = slot
        return out

    # ------------------------------------------------------------------------------------ verdict

    def _invalid_types(self) -> set[str]:
        inv = self.o.get("invalid")
        if inv is not None:
            return set(inv)
        out = set(INVALID_BY_DEFAULT)
        for t in {self.sub_default, *self.sub_types.values()}:
            out.update(INVALID_BY_SUBSCRIPTION[t])
        return out

    def result(self) -> CheckResult:
        """The verdict: every finder's cases, the stats, and the final reads that decide "unknown"."""
        cap = self.o.get("max_anomalies")
        final, incomplete = self.final_reads()
        complete = {t for t, d in final.items() if d["status"] == OK}
        unacked = self.unacknowledged()
        lost, lost_by_topic = self.lost_cases(cap, complete)
        wiped = self.wiped_lost(incomplete)
        for topic, found in wiped.items():
            lost_by_topic[topic] = len(found)
            for ev in found:
                lost.add(lambda ev=ev: ev)
        order, order_stats = self.order_cases(cap)
        found = {"lost": lost, "unexpected": self.unexpected_cases(cap), "divergence": self.divergence_cases(cap),
                 "nonmonotonic-send": self.nonmonotonic_send_cases(cap), "duplicate": self.duplicate_cases(cap),
                 "aborted-read": self.aborted_read_cases(cap, unacked), "misplaced": self.misplaced_cases(cap),
                 "nonmonotonic-read": self.nonmonotonic_read_cases(cap),
                 "unseen": self.unseen_cases(cap, complete), **order}
        cases = {t: found[t] for t in ANOMALY_TYPES}          # the report lists them in this order
        invalid_types = self._invalid_types()

        stats = self._stats()
        stats.update(anomaly_stats(cases, invalid_types))
        stats["lost_count"] = lost.count
        stats["lost_wiped_count"] = sum(map(len, wiped.values()))     # of them, proven by a disk wipe
        stats["duplicate_count"] = cases["duplicate"].count
        stats["unseen_count"] = cases["unseen"].count
        stats["final_reads"] = final
        stats["incomplete_topics"] = incomplete
        stats["info_sends"] = self.info_sends(complete, unacked)
        stats["consumer_order"] = order_stats
        for topic, d in stats["topics"].items():
            d["lost"] = lost_by_topic.get(topic, 0)
            d["final_read"] = final.get(topic, {}).get("status", "missing")
            d["final_read_messages"] = final.get(topic, {}).get("messages")
        return CheckResult(valid=verdict(cases, invalid_types, unknown=bool(incomplete)),
                           anomalies=anomalies_of(cases), stats=stats)

    def final_reads(self) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Per topic, how its final reads ended (status ok, info, fail or missing; reads, ok reads, the
        messages and distinct values of the last ok one), and the topics with sends whose final read
        did not end ok: their lost messages cannot be judged, so the verdict is at best "unknown"."""
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
        return final, incomplete

    # ---------------------------------------------------------------------------------- the finders

    def unacknowledged(self) -> Unacked:
        """topic -> (values whose send failed, values whose send ended info or never completed), each in
        send order: one pass over the sends' outcomes for the two finders of unacknowledged sends."""
        out: Unacked = {}
        for topic, by_v in self.sends.items():
            failed: list[Any] = []
            other: list[Any] = []
            for v, rec in by_v.items():
                comp = rec[1]
                if comp is None:
                    other.append(v)
                elif comp.type != OK:
                    (failed if comp.type == FAIL else other).append(v)
            out[topic] = (failed, other)
        return out

    def lost_cases(self, cap: int | None, complete: set[str]) -> tuple[Cases, dict[str, int]]:
        """`lost` (Jepsen's lost-write): an acknowledged send missing from an ok final read of its topic
        (topics whose final read completed). Evidence: topic, value, the acknowledged message id, the
        send, the final reads that miss it, and where it was read and received during the run, if
        anywhere. Also the count per topic, for the topics' stats."""
        cases = Cases(cap)
        by_topic: dict[str, int] = {}
        for topic, by_v in self.sends.items():
            if topic not in complete:
                continue
            reads = self.reads[topic]
            if len(reads) == 1:
                rv = reads[0][1]
                missing = [v for v in by_v if v not in rv]
            else:
                missing = [v for v in by_v if any(v not in rd[1] for rd in reads)]
            vpos_t = self.vpos.get(topic, {})
            first_t = self.recv_first.get(topic, {})
            for v in missing:
                rec = by_v[v]
                if rec[1] is None or rec[1].type != OK:
                    continue
                by_topic[topic] = by_topic.get(topic, 0) + 1
                cases.add(lambda: {
                    "topic": topic, "value": jsonable(v), "message_id": mid_json(mid_tuple(rec[1].message_id)),
                    "send": self._send_json(rec),
                    "missing_from_reads": [self.ref(rd[0]) for rd in reads if v not in rd[1]],
                    "read_by": (self._obs_json(topic, v, vpos_t[v][1]) if v in vpos_t else None),
                    "received_during_run": (self._obs_json(topic, v, first_t[v]) if v in first_t else None)})
        return cases, by_topic

    def wiped_lost(self, topics: list[str]) -> dict[str, list[dict[str, Any]]]:
        """topic -> `lost` evidence of its acknowledged sends proven lost by a disk wipe (checkers/wipes.py),
        for topics without an ok final read."""
        out: dict[str, list[dict[str, Any]]] = {}
        for topic in topics:
            by_v = self.sends.get(topic, {})
            acked = [(v, rec[1]) for v, rec in by_v.items() if rec[1] is not None and rec[1].type == OK]
            for v, comp, proof in self.wipes.proofs(topic, acked):
                rec = by_v[v]
                out.setdefault(topic, []).append({
                    "topic": topic, "value": jsonable(v), "message_id": mid_json(mid_tuple(comp.message_id)),
                    "send": self._send_json(rec), "proof": {**proof, "ledgers_op": self.ref(proof["ledgers_op"])},
                    "missing_from_reads": [], "read_by": None,
                    "received_during_run": (self._obs_json(topic, v, self.recv_first[topic][v])
                                            if v in self.recv_first.get(topic, {}) else None)})
        return out

    def unseen_cases(self, cap: int | None, complete: set[str]) -> Cases:
        """`unseen` (informational): an acknowledged send that every ok final read of its topic holds
        but no consumer received during the run (topics with receives whose final read completed; the
        consumers' backlog at the end shows up here). Evidence: topic, value, message id, the send."""
        cases = Cases(cap)
        for topic, by_v in self.sends.items():
            if topic not in complete or topic not in self.recv_topics:
                continue
            reads = self.reads[topic]
            first_t = self.recv_first.get(topic, {})
            for v in [v for v in by_v if v not in first_t]:
                rec = by_v[v]
                if rec[1] is None or rec[1].type != OK or any(v not in rd[1] for rd in reads):
                    continue                                  # not acknowledged, or lost
                cases.add(lambda: {"topic": topic, "value": jsonable(v),
                                   "message_id": mid_json(mid_tuple(rec[1].message_id)),
                                   "send": self._send_json(rec)})
        return cases

    def misplaced_cases(self, cap: int | None) -> Cases:
        """`misplaced` (informational): an acknowledged send whose value was read or received, but never
        at its acknowledged position, while no other value was seen there either (that would be a
        divergence). Evidence: topic, value, the acknowledged and the observed message ids, the send
        and the observations."""
        cases = Cases(cap)
        for topic, by_v in self.sends.items():
            vpos_t = self.vpos.get(topic)
            if not vpos_t:
                continue
            for v, rec in by_v.items():
                pk = rec[2]                                   # the acknowledged position
                if pk is None:
                    continue
                seen = vpos_t.get(v)
                comp = rec[1]
                if seen is None or seen[0] is None or seen[0] == pk or comp is None or comp.type != OK:
                    continue
                at = self.dups.get((topic, v)) or {seen[0]: seen[1]}
                if pk in at or (topic, pk) in self.conflicts:
                    continue
                cases.add(lambda: {
                    "topic": topic, "value": jsonable(v),
                    "acked_message_id": mid_json(mid_tuple(comp.message_id)),
                    "read_message_ids": [mid_json(self._obs_mid(o)) for o in at.values()],
                    "send": self._send_json(rec),
                    "observations": [self._obs_json(topic, v, o) for o in at.values()]})
        return cases

    def aborted_read_cases(self, cap: int | None, unacked: Unacked) -> Cases:
        """`aborted-read` (informational): a send that failed (a definite failure) whose value was read
        or received all the same. Evidence: topic, value, the send, the first observation."""
        cases = Cases(cap)
        for topic, (failed, _) in unacked.items():
            vpos_t = self.vpos.get(topic, {})
            for v in failed:
                if v in vpos_t:
                    cases.add(lambda: {"topic": topic, "value": jsonable(v),
                                       "send": self._send_json(self.sends[topic][v]),
                                       "observation": self._obs_json(topic, v, vpos_t[v][1])})
        return cases

    def unexpected_cases(self, cap: int | None) -> Cases:
        """`unexpected`: a value read or received on a topic that no send to that topic ever attempted.
        Evidence: topic, value, message id, the observation and the topics it was sent to, if any."""
        cases = Cases(cap)
        sent_to: dict[Any, list[str]] | None = None
        for topic, vpos_t in self.vpos.items():
            by_v = self.sends.get(topic, {})
            for v, (pk, obs) in vpos_t.items():
                if v in by_v:
                    continue
                if sent_to is None:                           # built once, at the first case
                    sent_to = {}
                    for t2, d2 in self.sends.items():
                        for v2 in d2:
                            sent_to.setdefault(v2, []).append(t2)
                cases.add(lambda: {"topic": topic, "value": jsonable(v),
                                   "message_id": mid_json(self._obs_mid(obs)),
                                   "observation": self._obs_json(topic, v, obs),
                                   "sent_to_topics": sent_to.get(v, [])})
        return cases

    def divergence_cases(self, cap: int | None) -> Cases:
        """`divergence` (Jepsen's inconsistent-offsets): two values observed at one position of a topic
        (by sends' acks, receives or reads). Evidence: topic, message id, the values, the sources that
        saw them and an observation of each."""
        cases = Cases(cap)
        for (topic, pk), by_value in self.conflicts.items():
            obs_list = list(by_value.items())
            cases.add(lambda: {
                "topic": topic,
                "message_id": mid_json(self._obs_mid(obs_list[0][1])),
                "values": [jsonable(v) for v, _ in obs_list],
                "sources": sorted({o[0] for _, o in obs_list}),
                "observations": [self._obs_json(topic, v, o) for v, o in obs_list]})
        return cases

    def duplicate_cases(self, cap: int | None) -> Cases:
        """`duplicate`: one value of a topic read or received at two or more positions. Evidence: topic,
        value, the message ids, an observation at each, and the send of the value when there is one."""
        cases = Cases(cap)
        for (topic, v), by_pos in self.dups.items():
            obs_list = list(by_pos.values())
            rec = self._send_rec(topic, v)
            cases.add(lambda: {
                "topic": topic, "value": jsonable(v),
                "message_ids": [mid_json(self._obs_mid(o)) for o in obs_list],
                "observations": [self._obs_json(topic, v, o) for o in obs_list],
                "send": self._send_json(rec) if rec is not None else None})
        return cases

    def nonmonotonic_send_cases(self, cap: int | None) -> Cases:
        """`nonmonotonic-send`: a producer's (process, topic, partition) acknowledgement at a position
        before that of its previous acknowledgement. Evidence: topic, process, partition, both sends."""
        cases = Cases(cap)
        for earlier, later in self.nonmono_send:
            cases.add(lambda: {
                "topic": later[0].key, "process": later[1].process,
                "partition": mid_tuple(later[1].message_id)[2],
                "earlier": self._send_json(earlier), "later": self._send_json(later)})
        return cases

    def nonmonotonic_read_cases(self, cap: int | None) -> Cases:
        """`nonmonotonic-read` (informational): a final read that returns a partition's messages out of
        log order. Evidence (made during the scan): topic, partition, the read, the two messages."""
        cases = Cases(cap)
        for a in self.nonmono_read:
            cases.add(lambda: a)
        return cases

    def info_sends(self, complete: set[str], unacked: Unacked) -> dict[str, int]:
        """Sends that ended info or never completed: how many, and how many of them were found in a read
        or receive, were not found in a topic whose final read completed, or cannot be told."""
        out = {"total": 0, "found": 0, "not_found": 0, "unknown": 0}
        for topic, (_, other) in unacked.items():
            vpos_t = self.vpos.get(topic, {})
            out["total"] += len(other)
            for v in other:
                if v in vpos_t:
                    out["found"] += 1
                elif topic in complete:
                    out["not_found"] += 1
                else:
                    out["unknown"] += 1
        return out

    # -------------------------------------------------------------------------------------- stats

    def _stats(self) -> dict[str, Any]:
        o = self.o
        ops: dict[str, dict[str, int]] = {}
        for (f, t), n in sorted(self.counts.items()):
            ops.setdefault(f, {})[t] = n

        ok_lat = sorted(self.ok_lat)
        ms = [x / 1e6 for x in ok_lat]
        latency = {"count": len(ms), "p50": rounded(percentile(ms, 0.50)), "p95": rounded(percentile(ms, 0.95)),
                   "p99": rounded(percentile(ms, 0.99)), "max": rounded(ms[-1] if ms else None),
                   "mean": rounded(sum(ms) / len(ms) if ms else None)}

        # the window the sends ran in, and its buckets
        other_inv = [i for i, _, _ in self.other_lat]
        any_sends = bool(self.ok_inv or other_inv or self.ok_done)
        if any_sends:
            w0 = min(min(self.ok_inv, default=math.inf), min(other_inv, default=math.inf),
                     min(self.ok_done, default=math.inf))
            w1 = max(max(self.ok_inv, default=0), max(other_inv, default=0), max(self.ok_done, default=0),
                     max(map(int.__add__, self.ok_inv, self.ok_lat), default=0),
                     max((i + l for i, l, _ in self.other_lat), default=0))
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
        nb = int((w1 - s_ns) // b_ns) + 1 if any_sends else 0
        per = [0] * nb
        top = nb - 1
        for t in self.ok_done:             # every time lies in [w0, w1], so the index is in range
            b = int((t - s_ns) // b_ns)
            per[b if 0 <= b <= top else (0 if b < 0 else top)] += 1
        lat_b: list[list[int]] = [[] for _ in range(nb)]
        for i, l in zip(self.ok_inv, self.ok_lat):
            b = int((i - s_ns) // b_ns)
            lat_b[b if 0 <= b <= top else (0 if b < 0 else top)].append(l)
        p50, p99, mx = [], [], []
        for b in lat_b:
            b.sort()
            p50.append(rounded(percentile(b, 0.5) / 1e6) if b else None)
            p99.append(rounded(percentile(b, 0.99) / 1e6) if b else None)
            mx.append(rounded(b[-1] / 1e6) if b else None)
        throughput = {"ok_sends": len(self.ok_done),
                      "ok_sends_per_s": rounded(len(self.ok_done) / span_s if span_s > 0 else None),
                      "window_s": [rounded(w0 / 1e9), rounded(w1 / 1e9)],
                      "bucket_s": bucket_s, "start_s": rounded(start_s),
                      "per_bucket": [rounded(n / bucket_s) for n in per]}
        over_time = {"bucket_s": bucket_s, "start_s": rounded(start_s), "p50_ms": p50, "p99_ms": p99,
                     "max_ms": mx, "points": self._points()}

        # unavailability: gaps between consecutive ok sends
        done = sorted(self.ok_done)
        gap_s = float(o.get("gap_s", 1.0))
        longest, at, total, gaps = 0.0, None, 0.0, []
        for a, b in zip(done, done[1:]):
            g = (b - a) / 1e9
            if g > longest:
                longest, at = g, [rounded(a / 1e9), rounded(b / 1e9)]
            if g > gap_s:
                total += g
                if len(gaps) < 1000:
                    gaps.append([rounded(a / 1e9), rounded(b / 1e9)])
        unavailable = {"longest_gap_s": rounded(longest), "longest_gap_at": at, "threshold_s": gap_s,
                       "total_s": rounded(total), "gaps": gaps}

        periods = [p for p in self.faults.periods if not p.failed]
        faults = [[rounded(p.start_ns / 1e9), rounded((p.stop_ns if p.stop_ns is not None else self.t_max) / 1e9),
                   p.name, jsonable(p.value)] for p in periods]
        faults.sort(key=lambda p: (p[0], p[1]))
        open_at_end = self.faults.open_periods()

        sends = {"attempted": 0, "ok": 0, "fail": 0, "info": 0,
                 "unfinished": 0, "ok_without_message_id": self.ok_without_id,
                 "reused_values": self.reused_values}
        for by_v in self.sends.values():
            for rec in by_v.values():
                comp = rec[1]
                sends[comp.type if comp is not None else "unfinished"] += 1
        sends["attempted"] = sum(len(by_v) for by_v in self.sends.values()) + self.reused_values
        topics = {t: {"sends": st[0], "ok": st[1], "fail": st[2], "info": st[3]}
                  for t, st in sorted(self.send_topics.items(), key=lambda x: str(x[0]))}

        return {
            "ops": ops,
            "duration_s": rounded((self.t_max - (self.t_min or 0)) / 1e9),
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
        def sample(n_all: int, n: int) -> list[int]:
            if n_all <= n:
                return list(range(n_all))
            if n <= 0:
                return []
            step = n_all / n
            return [int(i * step) for i in range(n)]

        other = [self.other_lat[i] for i in sample(len(self.other_lat), budget // 2)]
        ok = [(self.ok_inv[i], self.ok_lat[i], OK) for i in sample(len(self.ok_inv), budget - len(other))]
        pts = sorted(ok + other)
        return [[rounded(i / 1e9), rounded(l / 1e6), t] for i, l, t in pts]
