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
- `duplicate`: one value stored at two message ids (the acknowledged id and the delivered ones):
  a producer retry written twice. Invalid when opts["dedup"] is true (broker deduplication on).

Stats: attempted / acknowledged / failed / indeterminate / lost / recovered counts, deliveries and
redeliveries, the delivery-count histogram of acknowledged enqueues per subscription and the
exactly-once ratio (the share of those delivered exactly once), per queue and in all.

The run's `subscriptions` and `log` workloads name their ops send/receive/read: the defaults accept
both vocabularies (opts["enqueue"] = ("enqueue", "send"), ...), so this checker runs on any of them.
One pass; memory linear in distinct values.
"""
from __future__ import annotations

from typing import Any

from checkers.toolkit import (OpRefs, gc_paused, jsonable, mid_json, mid_tuple, norm_value, op_names,
                              position_key, redelivery_count)
from core.history import FAIL, INFO, INVOKE, NEMESIS_PROCESS, OK, CheckResult, Op

ANOMALY_TYPES = ("lost", "unexpected", "duplicated", "recovered", "duplicate")

DEFAULTS: dict[str, Any] = {
    "enqueue": ("enqueue", "send"),       # f names of enqueues
    "dequeue": ("dequeue", "receive"),    # f names of dequeues (consume)
    "drain": ("drain",),                  # f names of final drains (consume; ok/fail: emptied)
    "read": ("read",),                    # f names of final reads (observe, do not consume)
    "exactly_once": False,                # duplicated deliveries make the history invalid
    "dedup": False,                       # a value stored at two message ids makes it invalid
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


def invalid_types(opts: dict[str, Any]) -> set[str]:
    if opts.get("invalid") is not None:
        return set(opts["invalid"])
    out = {"lost", "unexpected"}
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
        self.malformed = 0
        self.orphans = 0

    # ------------------------------------------------------------------------------------ the pass

    def scan(self) -> None:
        open_ = self.open
        enq_fs, deq_fs, drain_fs, read_fs = self.enq_fs, self.deq_fs, self.drain_fs, self.read_fs
        for op in self.h:
            p = op.process
            if p == NEMESIS_PROCESS:
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
            if pk is not None:
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
        cap = self.o.get("max_anomalies")
        max_obs = int(self.o.get("max_observations") or 5)
        found: dict[str, list[Any]] = {t: [] for t in ANOMALY_TYPES}
        counts = {t: 0 for t in ANOMALY_TYPES}

        def add(kind: str, make) -> None:
            counts[kind] += 1
            if cap is None or len(found[kind]) < cap:
                found[kind].append(make())

        subs_of: dict[str, list[Any]] = {}
        for (q, sub) in self.count:
            subs_of.setdefault(q, []).append(sub)
        queues = sorted(set(self.enq) | set(self.drains) | set(self.reads) | set(subs_of), key=str)
        # a queue is complete when a drain emptied it (ok, or fail: nothing left) or a final read ended ok
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

        hist: dict[int, int] = {}
        per_q: dict[str, dict[str, Any]] = {}
        tot = {"attempted": 0, "acknowledged": 0, "failed": 0, "indeterminate": 0, "lost": 0,
               "recovered": 0, "exactly_once": 0, "pairs": 0}
        no_reads: dict[Any, Deliv] = {}
        for q in queues:
            by_v = self.enq.get(q, {})
            subs = subs_of.get(q, [])
            cnts = [self.count[(q, s)] for s in subs]
            firsts = [self.first[(q, s)] for s in subs]
            reads = self.read_seen.get(q, no_reads)
            complete = drained[q] in ("drained", "read")
            st = {"attempted": 0, "acknowledged": 0, "failed": 0, "indeterminate": 0, "lost": 0,
                  "recovered": 0, "exactly_once": 0, "pairs": 0}
            for v, rec in by_v.items():
                comp = rec[1]
                t = comp.type if comp is not None else None
                st["attempted"] += rec[2]
                if t == OK:
                    st["acknowledged"] += 1
                    got = False
                    for c in cnts:
                        n = c.get(v, 0)
                        hist[n] = hist.get(n, 0) + 1
                        st["pairs"] += 1
                        if n:
                            got = True
                            if n == 1:
                                st["exactly_once"] += 1
                    if not cnts:
                        hist[0] = hist.get(0, 0) + 1
                    if not got and complete and v not in reads:
                        st["lost"] += 1
                        add("lost", lambda: {"queue": q, "value": jsonable(v), "enqueue": self._enq_json(rec),
                                             "drain": drained[q]})
                    continue
                if t == FAIL:
                    st["failed"] += 1
                else:
                    st["indeterminate"] += 1
                d = next((f[v] for f in firsts if v in f), None) or reads.get(v)
                if d is not None:
                    st["recovered"] += 1
                    add("recovered", lambda: {"queue": q, "value": jsonable(v), "enqueue": self._enq_json(rec),
                                              "delivery": self._deliv_json(d)})
            per_q[q] = st
            for k in tot:
                tot[k] += st[k]

        sent_to: dict[Any, list[str]] | None = None
        for (q, sub), cnt in self.count.items():
            by_v = self.enq.get(q, {})
            firsts = self.first[(q, sub)]
            for v, n in cnt.items():
                rec = by_v.get(v)
                if rec is None:
                    if sent_to is None:
                        sent_to = {}
                        for q2, d2 in self.enq.items():
                            for v2 in d2:
                                sent_to.setdefault(v2, []).append(q2)
                    add("unexpected", lambda: {"queue": q, "subscription": sub, "value": jsonable(v),
                                               "delivery": self._deliv_json(firsts[v]),
                                               "enqueued_to": sent_to.get(v, [])})
                    continue
                if n > max(1, rec[2]):
                    dl = [firsts[v]] + self.more.get((q, sub, v), [])
                    add("duplicated", lambda: {
                        "queue": q, "subscription": sub, "value": jsonable(v), "deliveries": n,
                        "attempts": rec[2], "redelivered": sum(1 for d in dl if d[2] > 0),
                        "observations": [self._deliv_json(d) for d in dl[:max_obs]]})
        dup_n = counts["duplicated"]

        for (q, v), at in self.multi.items():
            rec = self.enq.get(q, {}).get(v)
            add("duplicate", lambda: {
                "queue": q, "value": jsonable(v),
                "message_ids": [mid_json(mid_tuple(self._deliv_mid(w, rec))) for w in at.values()],
                "observations": [self._deliv_json(w) if w is not None else
                                 {"op": self.ref(rec[1]) if rec else None, "source": "enqueue"}
                                 for w in at.values()]})

        anomalies = {k: v for k, v in found.items() if counts[k]}
        inv_types = invalid_types(self.o)
        if any(counts.get(k) for k in inv_types):
            valid: bool | str = False
        elif incomplete:
            valid = "unknown"
        else:
            valid = True
        delivered_values = sum(len(c) for c in self.count.values())
        stats = {
            "attempted": tot["attempted"], "acknowledged": tot["acknowledged"], "failed": tot["failed"],
            "indeterminate": tot["indeterminate"], "lost": tot["lost"], "recovered": tot["recovered"],
            "unexpected": counts["unexpected"], "duplicated": dup_n, "stored_twice": counts["duplicate"],
            "deliveries": self.deliveries, "redelivered": self.redelivered,
            "distinct_delivered": delivered_values,
            "delivery_counts": {str(k): hist[k] for k in sorted(hist)},
            "exactly_once_ratio": (round(tot["exactly_once"] / tot["pairs"], 6) if tot["pairs"] else None),
            "queues": {q: dict(per_q.get(q, {}), drain=drained[q],
                               subscriptions=sorted(map(str, subs_of.get(q, []))),
                               exactly_once_ratio=(round(per_q[q]["exactly_once"] / per_q[q]["pairs"], 6)
                                                   if per_q.get(q, {}).get("pairs") else None))
                       for q in queues},
            "incomplete_queues": incomplete,
            "anomaly_counts": {k: n for k, n in counts.items() if n},
            "anomalies_truncated": {k: n for k, n in counts.items() if n > len(found[k])},
            "invalid_types": sorted(inv_types),
            "history": {"ops": len(self.h), "orphan_completions": self.orphans, "malformed": self.malformed},
        }
        for st in stats["queues"].values():
            st.pop("pairs", None)
            st.pop("exactly_once", None)
        return CheckResult(valid=valid, anomalies=anomalies, stats=stats)

    @staticmethod
    def _deliv_mid(w: Deliv | None, rec: list[Any] | None) -> Any:
        if w is None:
            return rec[1].message_id if rec is not None and rec[1] is not None else None
        op, j, _ = w
        v = op.value
        m = v[j] if isinstance(v, (list, tuple)) and j < len(v) else v
        return m.get("message_id") if isinstance(m, dict) else None
