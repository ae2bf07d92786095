"""The queue checker: what goes in must come out, once (Jepsen's total-queue, plus delivery counts).

A pure function over a queue-style history: enqueues (f "enqueue", or a log workload's "send"; the
invoke value is the unique payload), dequeues (f "dequeue" / "receive"; the ok value is a list of
{"value", "message_id", "redelivery_count", ...} like a receive, one such dict, or a bare value) and
final drains (f "drain", same shape; ok, or fail with an error starting "empty", means the queue
was emptied; info or another failure means the drain did not complete). Final reads of a log (f "read": a Reader from the earliest message) do not
consume: they only prove that a value is in the topic. Queues are the ops' keys (topics).

Anomalies (Jepsen's names):
- `lost`: an ok enqueue that no dequeue, drain or final read of its queue ever returned (only for
  queues whose drain or final read completed; otherwise the verdict is "unknown").
- `unexpected`: a dequeued value that no enqueue of that queue ever attempted (not even invoked).
- `duplicated`: a value delivered more often than it was enqueued (attempts; at least once) to one
  subscription (the message's "subscription" field, "" when absent). Pulsar delivers at least once
  (redeliveries after a reconnect, an ack timeout or a negative ack), so this is informational
  unless opts["exactly_once"] is true.
- `recovered`: an enqueue that ended info (or fail, or never completed) whose value was dequeued
  (informational: the write took effect after all). The evidence says which outcome it had.
- `early`: a delayed message (its delivery carries "deliver_at", the wall-clock ms it was due, and
  "received_ms", when the consumer got it) delivered before its time. Invalid, unless the history
  holds a clock fault (a nemesis op "start-clock"): the broker decides with its own wall clock,
  which that nemesis moves, so under skew an early delivery is Pulsar's behaviour too
  (docs/architecture.md, "Clock skew"); then it is informational, with the largest skew applied
  in the stats (`clock_skew_ms`). Only delayed messages carry the fields.
- `duplicate`: one value stored at two message ids (the acknowledged id and the delivered ones):
  a producer retry written twice. Invalid when opts["dedup"] is true (broker deduplication on). An
  acknowledgement with message id (-1, -1) (a deduplicating broker's answer to a resend of a stored
  message) names no position and is not counted.

Stats: attempted / acknowledged / failed / indeterminate / lost / recovered counts, deliveries and
redeliveries, the delivery-count histogram of acknowledged enqueues per subscription and the
exactly-once ratio (the share of those delivered exactly once), per queue and in all.

The run's `subscriptions` and `log` workloads name their ops send/receive/read: the defaults accept
both vocabularies (opts["enqueue"] = ("enqueue", "send"), ...), so this checker runs on any of them.
One pass; memory linear in distinct values.
"""
from __future__ import annotations

from typing import Any

from checkers.toolkit import (Cases, OpRefs, anomalies_of, anomaly_stats, gc_paused, jsonable, mid_json, mid_tuple,
                              norm_value, op_names, position_key, redelivery_count, verdict)
from core.history import FAIL, INFO, INVOKE, NEMESIS_PROCESS, OK, CheckResult, Op

ANOMALY_TYPES = ("lost", "unexpected", "duplicated", "recovered", "duplicate", "early")

DEFAULTS: dict[str, Any] = {
    "enqueue": ("enqueue", "send"),       # f names of enqueues
    "dequeue": ("dequeue", "receive"),    # f names of dequeues (consume)
    "drain": ("drain",),                  # f names of final drains (consume; ok/fail: emptied)
    "read": ("read",),                    # f names of final reads (observe, do not consume)
    "exactly_once": False,                # duplicated deliveries make the history invalid
    "dedup": False,                       # a value stored at two message ids makes it invalid
    "delayed": False,                     # informational: the workload sent delayed messages
    # anomaly types that make `valid` False; None: lost and unexpected, plus duplicated with
    # exactly_once and duplicate with dedup
    "invalid": None,
    "max_anomalies": 1000,                # evidence entries kept per type (None: all)
    "max_observations": 5,                # deliveries listed per duplicated value
}


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check a queue history; see the module docstring."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    with gc_paused():
        c = _QueueCheck(history, o)
        c.scan()
        r = c.result()
        del c                       # freed before the collector is back, which then has less to walk
    return r


def invalid_types(opts: dict[str, Any], *, clock_faults: bool = False) -> set[str]:
    """The anomaly types that make the history invalid; `early` is not one when the history holds
    clock faults (see the module docstring)."""
    if opts.get("invalid") is not None:
        return set(opts["invalid"])
    out = {"lost", "unexpected"} if clock_faults else {"lost", "unexpected", "early"}
    if opts.get("exactly_once"):
        out.add("duplicated")
    if opts.get("dedup"):
        out.add("duplicate")
    return out


# A delivery: (op, slot in its message list, redelivery count).
Deliv = tuple[Op, int, int]


class _QueueCheck(OpRefs):
    def __init__(self, history: list[Op], opts: dict[str, Any]):
        self.h = history
        self.o = opts
        names = op_names(opts, "enqueue", "drain", "dequeue", "read")
        self.enq_fs, self.drain_fs, self.read_fs = names[0], names[1], names[3]
        self.deq_fs = names[2] | self.drain_fs               # a drain consumes as a dequeue does
        # queue -> value -> [invoke, completion | None, attempts]
        self.enq: dict[str, dict[Any, list[Any]]] = {}
        # (queue, subscription) -> value -> deliveries; and the first delivery of each value
        self.count: dict[tuple[str, Any], dict[Any, int]] = {}
        self.first: dict[tuple[str, Any], dict[Any, Deliv]] = {}
        self.more: dict[tuple[str, Any, Any], list[Deliv]] = {}      # further deliveries, a few
        self.read_seen: dict[str, dict[Any, Deliv]] = {}             # queue -> value -> first read
        # queue -> value -> position (ack or delivery), and values at more than one position
        self.pos: dict[str, dict[Any, tuple[Any, Deliv | None]]] = {}
        self.multi: dict[tuple[str, Any], dict[Any, Deliv | None]] = {}
        self.drains: dict[str, list[str]] = {}                       # queue -> completion types
        self.reads: dict[str, list[str]] = {}
        self.open: dict[int, Op] = {}
        self.deliveries = 0
        self.redelivered = 0
        self.early: list[tuple[str, Any, Deliv, int, int]] = []      # (queue, value, delivery, due, got)
        self.delayed_deliveries = 0
        self.clock_faults = 0
        self.clock_skew_ms = 0                                        # the largest |offset| applied
        self.malformed = 0
        self.orphans = 0

    # ------------------------------------------------------------------------------------ the pass

    def scan(self) -> None:
        open_ = self.open
        enq_fs, deq_fs, drain_fs, read_fs = self.enq_fs, self.deq_fs, self.drain_fs, self.read_fs
        for op in self.h:
            p = op.process
            if p < 0:                       # the nemesis and observers are not clients
                if p == NEMESIS_PROCESS and op.f.startswith("start-clock"):
                    self._clock_fault(op)
                continue
            f = op.f
            if op.type == INVOKE:
                open_[p] = op
                if f in enq_fs:
                    self._enqueue_invoke(op)
                continue
            inv = open_.pop(p, None)
            if inv is not None and inv.f != f:
                inv = None
            if inv is None:
                self.orphans += 1
            if f in enq_fs:
                self._enqueue_done(inv, op)
            elif f in deq_fs:
                if f in drain_fs:
                    # fail "empty": the drain found nothing left, which completes it too
                    done = op.type == OK or (op.type == FAIL and op.error.lower().startswith("empty"))
                    self.drains.setdefault(op.key, []).append(OK if done else op.type)
                if op.type == OK or (op.type == INFO and isinstance(op.value, (list, tuple))):
                    self._dequeue(op)
            elif f in read_fs:
                self.reads.setdefault(op.key, []).append(op.type)
                if op.type == OK:
                    self._read(op)

    def _clock_fault(self, op: Op) -> None:
        """A clock nemesis start (nemesis/clock.py): {"offset_s"} (bump) or {"offsets"} (strobe)."""
        if op.type != INVOKE:
            return
        self.clock_faults += 1
        v = op.value if isinstance(op.value, dict) else {}
        offsets = [v.get("offset_s")] + list(v.get("offsets") or [])
        for x in offsets:
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                self.clock_skew_ms = max(self.clock_skew_ms, int(abs(x) * 1000))

    def _enqueue_invoke(self, op: Op) -> None:
        v = op.value
        if type(v) is not int:
            v = norm_value(v)
        by_v = self.enq.get(op.key)
        if by_v is None:
            by_v = self.enq[op.key] = {}
        rec = by_v.get(v)
        if rec is None:
            by_v[v] = [op, None, 1]
        else:
            rec[2] += 1
            if rec[1] is None or rec[1].type != OK:
                rec[0], rec[1] = op, None            # the latest attempt, unless one was acknowledged

    def _enqueue_done(self, inv: Op | None, op: Op) -> None:
        v = inv.value if inv is not None else op.value
        if type(v) is not int:
            v = norm_value(v)
        q = inv.key if inv is not None else op.key
        by_v = self.enq.get(q)
        if by_v is None:
            by_v = self.enq[q] = {}
        rec = by_v.get(v)
        if rec is None:                              # a completion whose invoke is not in the history
            rec = by_v[v] = [op, None, 1]
        if rec[1] is not None and rec[1].type == OK:
            return                                   # an earlier attempt was acknowledged
        rec[1] = op
        if op.type == OK and op.message_id is not None:
            pk = position_key(op.message_id)
            mid = mid_tuple(op.message_id)
            # (-1, -1): the broker's receipt for a send it deduplicated (stored before, at the position
            # its deliveries show), not a second position
            if pk is not None and not (mid is not None and mid[0] == -1 and mid[1] == -1):
                self._at(q, v, pk, None)

    def _messages(self, op: Op) -> Any:
        v = op.value
        if isinstance(v, (list, tuple)):
            return v
        if v is None:
            return ()
        return (v,)                                  # one message dict, or a bare value

    def _dequeue(self, op: Op) -> None:
        q = op.key
        counts = firsts = None
        sub_prev = None
        for j, m in enumerate(self._messages(op)):
            if type(m) is dict:
                v = m.get("value")
                if type(v) is not int:
                    v = norm_value(v)
                rc = m.get("redelivery_count") or 0
                if type(rc) is not int:
                    rc = redelivery_count(rc)
                sub = m.get("subscription", "")
                d = m.get("message_id")
                due = m.get("deliver_at")
                if due is not None:
                    self.delayed_deliveries += 1
                    got = m.get("received_ms")
                    if got is not None and got < due:
                        self.early.append((q, v, (op, j, rc), due, got))
            else:
                v, rc, sub, d = norm_value(m), 0, "", None
            if v is None:
                self.malformed += 1
                continue
            self.deliveries += 1
            if rc > 0:
                self.redelivered += 1
            if sub != sub_prev or counts is None:
                k = (q, sub)
                counts = self.count.get(k)
                if counts is None:
                    counts = self.count[k] = {}
                    firsts = self.first[k] = {}
                else:
                    firsts = self.first[k]
                sub_prev = sub
            n = counts.get(v)
            if n is None:
                counts[v] = 1
                firsts[v] = (op, j, rc)
            else:
                counts[v] = n + 1
                extra = self.more.get((q, sub, v))
                if extra is None:
                    self.more[(q, sub, v)] = [(op, j, rc)]
                elif len(extra) < 10:
                    extra.append((op, j, rc))
            if d is not None:
                pk = position_key(d)
                if pk is not None:
                    self._at(q, v, pk, (op, j, rc))

    def _read(self, op: Op) -> None:
        seen = self.read_seen.get(op.key)
        if seen is None:
            seen = self.read_seen[op.key] = {}
        for j, m in enumerate(self._messages(op)):
            v = m.get("value") if type(m) is dict else m
            if type(v) is not int:
                v = norm_value(v)
            if v is not None and v not in seen:
                seen[v] = (op, j, 0)

    def _at(self, q: str, v: Any, pk: Any, where: Deliv | None) -> None:
        pos = self.pos.get(q)
        if pos is None:
            pos = self.pos[q] = {}
        cur = pos.get(v)
        if cur is None:
            pos[v] = (pk, where)
        elif cur[0] != pk:
            d = self.multi.get((q, v))
            if d is None:
                self.multi[(q, v)] = {cur[0]: cur[1], pk: where}
            elif pk not in d:
                d[pk] = where

    # ---------------------------------------------------------------------------------- evidence

    def _enq_json(self, rec: list[Any]) -> dict[str, Any]:
        inv, comp, attempts = rec
        return {"outcome": comp.type if comp is not None else None,
                "invoke": self.ref(inv) if inv.type == INVOKE else None,
                "completion": self.ref(comp),
                "message_id": mid_json(mid_tuple(comp.message_id)) if comp is not None else None,
                "attempts": attempts}

    def _deliv_json(self, d: Deliv) -> dict[str, Any]:
        op, j, rc = d
        msgs = self._messages(op)
        m = msgs[j] if j < len(msgs) else None
        out = {"op": self.ref(op), "slot": j, "redelivery_count": rc, "message_id": None}
        if isinstance(m, dict):
            out["message_id"] = mid_json(mid_tuple(m.get("message_id")))
            if "subscription" in m:
                out["subscription"] = m["subscription"]
        return out

    # ------------------------------------------------------------------------------------ verdict

    def result(self) -> CheckResult:
        """The verdict: every finder's cases, the stats, and the queues whose completion decides "unknown"."""
        cap = self.o.get("max_anomalies")
        subs_of: dict[str, list[Any]] = {}
        for (q, sub) in self.count:
            subs_of.setdefault(q, []).append(sub)
        queues = sorted(set(self.enq) | set(self.drains) | set(self.reads) | set(subs_of), key=str)
        drained, incomplete = self.completion(queues)
        per_q, hist, unacked = self.enqueue_stats(queues, subs_of)
        lost, lost_by_q = self.lost_cases(cap, queues, subs_of, drained)
        recovered, recovered_by_q = self.recovered_cases(cap, subs_of, unacked)
        cases = {"lost": lost, "unexpected": self.unexpected_cases(cap), "duplicated": self.duplicated_cases(cap),
                 "recovered": recovered, "duplicate": self.duplicate_cases(cap), "early": self.early_cases(cap)}
        inv_types = invalid_types(self.o, clock_faults=self.clock_faults > 0)

        tot: dict[str, int] = {}
        for q, st in per_q.items():
            st["lost"] = lost_by_q.get(q, 0)
            st["recovered"] = recovered_by_q.get(q, 0)
            for k, n in st.items():
                tot[k] = tot.get(k, 0) + n
        stats = {
            "attempted": tot.get("attempted", 0), "acknowledged": tot.get("acknowledged", 0),
            "failed": tot.get("failed", 0), "indeterminate": tot.get("indeterminate", 0), "lost": lost.count,
            "recovered": recovered.count, "unexpected": cases["unexpected"].count,
            "duplicated": cases["duplicated"].count, "stored_twice": cases["duplicate"].count,
            "deliveries": self.deliveries, "redelivered": self.redelivered,
            "delayed_deliveries": self.delayed_deliveries, "early": cases["early"].count,
            "clock_faults": self.clock_faults, "clock_skew_ms": self.clock_skew_ms,
            "distinct_delivered": sum(len(c) for c in self.count.values()),
            "delivery_counts": {str(k): hist[k] for k in sorted(hist)},
            "exactly_once_ratio": _ratio(tot.get("exactly_once", 0), tot.get("pairs", 0)),
            "queues": {q: dict(per_q[q], drain=drained[q], subscriptions=sorted(map(str, subs_of.get(q, []))),
                               exactly_once_ratio=_ratio(per_q[q]["exactly_once"], per_q[q]["pairs"]))
                       for q in queues},
            "incomplete_queues": incomplete,
            **anomaly_stats(cases, inv_types),
            "history": {"ops": len(self.h), "orphan_completions": self.orphans, "malformed": self.malformed},
        }
        for st in stats["queues"].values():
            st.pop("pairs", None)
            st.pop("exactly_once", None)
        return CheckResult(valid=verdict(cases, inv_types, unknown=bool(incomplete)),
                           anomalies=anomalies_of(cases), stats=stats)

    def completion(self, queues: list[str]) -> tuple[dict[str, str], list[str]]:
        """How each queue was completed: "drained" (a drain emptied it: ok, or fail "empty"), "read" (a
        final read ended ok), "incomplete" (tried, never completed) or "missing"; and the queues with
        acknowledged enqueues left incomplete or missing: their lost values cannot be judged."""
        drained: dict[str, str] = {}
        incomplete: list[str] = []
        for q in queues:
            dr, rd = self.drains.get(q, []), self.reads.get(q, [])
            if OK in dr:
                drained[q] = "drained"
            elif OK in rd:
                drained[q] = "read"
            elif dr or rd:
                drained[q] = "incomplete"
            else:
                drained[q] = "missing"
            if drained[q] in ("incomplete", "missing") and any(
                    r[1] is not None and r[1].type == OK for r in self.enq.get(q, {}).values()):
                incomplete.append(q)
        return drained, incomplete

    def enqueue_stats(self, queues: list[str], subs_of: dict[str, list[Any]]
                      ) -> tuple[dict[str, dict[str, int]], dict[int, int], dict[str, list[Any]]]:
        """Per queue: attempted, acknowledged, failed and indeterminate enqueues (lost and recovered are
        left 0 for their finders to fill), and over (acknowledged value, subscription) pairs those
        delivered exactly once; the histogram of deliveries per such pair; and per queue the values
        whose enqueue was not acknowledged, in enqueue order (recovered_cases looks only at those)."""
        per_q: dict[str, dict[str, int]] = {}
        hist: dict[int, int] = {}
        unacked: dict[str, list[Any]] = {}
        for q in queues:
            cnts = [self.count[(q, s)] for s in subs_of.get(q, [])]
            st = per_q[q] = {"attempted": 0, "acknowledged": 0, "failed": 0, "indeterminate": 0, "lost": 0,
                             "recovered": 0, "exactly_once": 0, "pairs": 0}
            other = unacked[q] = []
            for v, rec in self.enq.get(q, {}).items():
                comp = rec[1]
                t = comp.type if comp is not None else None
                st["attempted"] += rec[2]
                if t != OK:
                    st["failed" if t == FAIL else "indeterminate"] += 1
                    other.append(v)
                    continue
                st["acknowledged"] += 1
                for c in cnts:
                    n = c.get(v, 0)
                    hist[n] = hist.get(n, 0) + 1
                    st["pairs"] += 1
                    if n == 1:
                        st["exactly_once"] += 1
                if not cnts:
                    hist[0] = hist.get(0, 0) + 1
        return per_q, hist, unacked

    # ---------------------------------------------------------------------------------- the finders

    def lost_cases(self, cap: int | None, queues: list[str], subs_of: dict[str, list[Any]],
                   drained: dict[str, str]) -> tuple[Cases, dict[str, int]]:
        """`lost` (Jepsen's total-queue lost): an acknowledged enqueue that no dequeue, drain or final
        read of its queue returned, in queues that a drain emptied or a final read read whole.
        Evidence: queue, value, the enqueue, how the queue was completed. Also the count per queue."""
        cases = Cases(cap)
        by_q: dict[str, int] = {}
        for q in queues:
            by_v = self.enq.get(q)
            if not by_v or drained[q] not in ("drained", "read"):
                continue
            cnts = [self.count[(q, s)] for s in subs_of.get(q, [])]
            reads = self.read_seen.get(q, {})
            for v in [v for v in by_v if v not in reads and not any(v in c for c in cnts)]:
                rec = by_v[v]
                if rec[1] is None or rec[1].type != OK:
                    continue
                by_q[q] = by_q.get(q, 0) + 1
                cases.add(lambda: {"queue": q, "value": jsonable(v), "enqueue": self._enq_json(rec),
                                   "drain": drained[q]})
        return cases, by_q

    def recovered_cases(self, cap: int | None, subs_of: dict[str, list[Any]], unacked: dict[str, list[Any]]
                        ) -> tuple[Cases, dict[str, int]]:
        """`recovered` (informational): an enqueue that failed, ended info or never completed, whose value
        was dequeued or read all the same (the write took effect). Evidence: queue, value, the enqueue
        (its outcome says which), the first delivery. Also the count per queue."""
        cases = Cases(cap)
        by_q: dict[str, int] = {}
        for q, values in unacked.items():
            firsts = [self.first[(q, s)] for s in subs_of.get(q, [])]
            reads = self.read_seen.get(q, {})
            for v in values:
                d = next((f[v] for f in firsts if v in f), None) or reads.get(v)
                if d is None:
                    continue
                by_q[q] = by_q.get(q, 0) + 1
                cases.add(lambda: {"queue": q, "value": jsonable(v), "enqueue": self._enq_json(self.enq[q][v]),
                                   "delivery": self._deliv_json(d)})
        return cases, by_q

    def unexpected_cases(self, cap: int | None) -> Cases:
        """`unexpected`: a value delivered from a queue that no enqueue of that queue ever attempted.
        Evidence: queue, subscription, value, its first delivery and the queues it was enqueued to."""
        cases = Cases(cap)
        sent_to: dict[Any, list[str]] | None = None
        for (q, sub), cnt in self.count.items():
            by_v = self.enq.get(q, {})
            firsts = self.first[(q, sub)]
            for v in [v for v in cnt if v not in by_v]:
                if sent_to is None:                           # built once, at the first case
                    sent_to = {}
                    for q2, d2 in self.enq.items():
                        for v2 in d2:
                            sent_to.setdefault(v2, []).append(q2)
                cases.add(lambda: {"queue": q, "subscription": sub, "value": jsonable(v),
                                   "delivery": self._deliv_json(firsts[v]), "enqueued_to": sent_to.get(v, [])})
        return cases

    def duplicated_cases(self, cap: int | None) -> Cases:
        """`duplicated`: a value delivered to one subscription more often than it was enqueued (attempts,
        at least once). Evidence: queue, subscription, value, deliveries, attempts, how many were
        redeliveries, and the first `max_observations` deliveries."""
        cases = Cases(cap)
        max_obs = int(self.o.get("max_observations") or 5)
        for (q, sub), cnt in self.count.items():
            by_v = self.enq.get(q, {})
            firsts = self.first[(q, sub)]
            for v, n in cnt.items():
                if n < 2:
                    continue
                rec = by_v.get(v)
                if rec is None or n <= rec[2]:
                    continue
                dl = [firsts[v]] + self.more.get((q, sub, v), [])
                cases.add(lambda: {
                    "queue": q, "subscription": sub, "value": jsonable(v), "deliveries": n,
                    "attempts": rec[2], "redelivered": sum(1 for d in dl if d[2] > 0),
                    "observations": [self._deliv_json(d) for d in dl[:max_obs]]})
        return cases

    def duplicate_cases(self, cap: int | None) -> Cases:
        """`duplicate`: one value stored at two or more message ids of a queue (its acknowledged id and
        the delivered ones): a producer's retry written twice. Evidence: queue, value, the message ids
        and where each was seen (a delivery, or the enqueue's acknowledgement)."""
        cases = Cases(cap)
        for (q, v), at in self.multi.items():
            rec = self.enq.get(q, {}).get(v)
            cases.add(lambda: {
                "queue": q, "value": jsonable(v),
                "message_ids": [mid_json(mid_tuple(self._deliv_mid(w, rec))) for w in at.values()],
                "observations": [self._deliv_json(w) if w is not None else
                                 {"op": self.ref(rec[1]) if rec else None, "source": "enqueue"}
                                 for w in at.values()]})
        return cases

    def early_cases(self, cap: int | None) -> Cases:
        """`early`: a delayed message delivered before its deliverAt. Evidence: queue, value, when it
        was due and when it arrived (wall-clock ms), how early, the delivery."""
        cases = Cases(cap)
        for q, v, d, due, got in self.early:
            cases.add(lambda: {"queue": q, "value": jsonable(v), "deliver_at": due, "received_ms": got,
                               "early_ms": due - got, "delivery": self._deliv_json(d)})
        return cases

    @staticmethod
    def _deliv_mid(w: Deliv | None, rec: list[Any] | None) -> Any:
        if w is None:
            return rec[1].message_id if rec is not None and rec[1] is not None else None
        op, j, _ = w
        v = op.value
        m = v[j] if isinstance(v, (list, tuple)) and j < len(v) else v
        return m.get("message_id") if isinstance(m, dict) else None


def _ratio(exactly_once: int, pairs: int) -> float | None:
    """The exactly-once ratio of the stats: the share of pairs delivered exactly once (None: no pairs)."""
    return round(exactly_once / pairs, 6) if pairs else None
