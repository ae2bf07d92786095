"""The fencing checker: one writer per topic at a time, and no acknowledged entry outside its closed ledger.

A pure function over a history (the `log` workload's sends and final reads, the `ledgers` ops the
workloads record after the final reads, and the `ledger` workload's direct BookKeeper ops) that
checks the two fencing claims of Pulsar's design, and gathers the topics' ownership timeline.

Part 1, topic ownership. Every ok `send` carries `node` (the broker that acknowledged it; "" when
unknown) and `message_id`. A ledger is written by exactly one broker, the owner that created it, so
the acks of one (topic, partition, broker, ledger) form an *acknowledgement interval* [completion of
its first ok send, completion of its last ok send]. Two intervals overlap when `a.first < b.last` and
`b.first < a.last` (closed intervals that only touch, one ending at the instant the other starts, do
not overlap; an interval of one ack lying strictly inside another does).

- `split-brain` (invalid): two different brokers' intervals of one topic partition overlap AND some
  acknowledged send of either interval is missing from the topic's final log (the union of the ok
  final reads: f "read", process >= `final_process`) or sits there at another position than the one
  acknowledged (ledger, entry, batch index; batch index -1 and 0 are one spelling), i.e. the two
  brokers' acknowledged histories cannot both be prefixes of the one log.
- `dual-ownership-benign` (informational): such an overlap where every acknowledged send of both
  intervals is in the final log at its acknowledged position (e.g. a late ack of a write that the new
  owner's recovery kept).
- `dual-ownership-unchecked` (makes the verdict "unknown" unless something is invalid): such an
  overlap on a topic without an ok final read, so the conflict cannot be judged.
- `ledger-multi-writer` (invalid): one ledger id acknowledged by two different brokers.

Part 2, ledger bounds.

- `beyond-close` (invalid), topics: the `ledgers` op of a topic (f "ledgers", ok, key = topic, value
  `{"ledgers": [{"ledger_id", "entries"}...], "trimmed_before"?}`, entries = the count of the ledger's
  entries, so its last entry id is entries - 1) lists the topic's ledgers after the run. An ok send
  acknowledged at (ledger, entry) is beyond-close when that ledger is listed (by any topic; ledger ids
  are unique in a cluster) with entry > entries - 1, or when the ledger is listed nowhere although the
  topic's list covers it: ledger id >= `trimmed_before` when the op gives it (ids below it were
  trimmed legitimately), else ledger id >= the smallest listed id. Acks in ledgers below the covered
  range are counted in stats, not judged. A partitioned topic's send is looked up under its key and
  under `<key>-partition-<n>`.
- `beyond-close` (invalid), `ledger` workload: an ok `add` (key = ledger id, invoke value = payload,
  ok message_id with entry_id) acknowledged *before* any recovery of that ledger completed, whose entry
  id is above the ledger's close point (the smallest `last_entry` of the ok `recover` ops on it): the
  recovery closed the ledger without an entry already acknowledged to the writer.
- `ack-after-fence` (invalid): an ok `add` whose completion time is after an ok `recover` of that
  ledger completed (recover: another client opened the ledger with recovery, which fences it; ok value
  `{"last_entry": L}`), with entry id > that recovery's L: the fenced ledger acknowledged a write it
  does not hold. An add acknowledged after the recovery with entry id <= L is fine (the entry was
  written before the fence; only its ack arrived late). The two types are exclusive per add.
- `lost-entry` (invalid): an ok `add` at or below the ledger's close point (every ok add when the
  ledger has no ok recover) that is missing from the ledger's final read (f "read", ok, process >=
  `final_process`, key = ledger id, value `[{"entry_id", "value"}...]`) or that the read shows with
  another value. Adds beyond the close point are reported as beyond-close / ack-after-fence instead.
- `invalid-fragment` (invalid): a `recover` or final `read` of the `ledger` workload that did not
  complete because the recovery asked for a fragment keyed below the ledger's last one (value
  `{"invalid_fragment": why}`; TLA+ `OnlyValidFragments`, apache/bookkeeper#2615): such a recovery
  fails the same way every time, so the ledger cannot be closed or read (an availability anomaly).
- `inconsistent-close` (invalid): ok recoveries of one ledger that disagree on its last entry, or a
  final read that holds entries beyond the close point.

The verdict is False when any invalid type occurs, else "unknown" when an overlap could not be
judged or a needed final read (of a topic with an overlap, or of a ledger with acknowledged adds)
was attempted and never completed ok, else True. One pass over the history, then work linear in the
acknowledged sends and adds (plus a sort of the per-ledger intervals).
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Any

from checkers.toolkit import (Cases, anomalies_of, anomaly_stats, full_op, jsonable, mid_json, mid_tuple,
                              norm_value, rounded, verdict)
from core.history import INVOKE, OK, CheckResult, Op

INVALID_BY_DEFAULT = ("split-brain", "ledger-multi-writer", "beyond-close", "ack-after-fence",
                      "lost-entry", "inconsistent-close", "invalid-fragment")
ANOMALY_TYPES = INVALID_BY_DEFAULT + ("dual-ownership-benign", "dual-ownership-unchecked")

DEFAULTS: dict[str, Any] = {
    "invalid": INVALID_BY_DEFAULT,   # anomaly types that make `valid` False
    "max_anomalies": 1000,           # evidence entries kept per type (None: all); counts stay exact
    "final_process": 1_000_000,      # final reads and `ledgers` ops come from processes >= this
    "max_timeline_rows": 2000,       # rows of the ownership timeline kept in stats
    "max_conflicts": 10,             # conflicting sends shown in one split-brain evidence entry
}


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check fencing and topic ownership; see the module docstring and `ANOMALY_TYPES`."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    c = _FencingCheck(history, o)
    c.scan()
    return c.result()


def _ref(op: Op | None) -> dict[str, Any] | None:
    """A big op (a final read, a ledger list) without its value: where it is and how much it held."""
    if op is None:
        return None
    v = op.value
    n = (len(v) if isinstance(v, (list, tuple)) else len(v.get("ledgers") or []) if isinstance(v, dict)
         else None)
    return {"index": op.index, "process": op.process, "type": op.type, "f": op.f, "key": op.key,
            "time_ns": op.time_ns, "items": n}


def _pos(m: tuple[int, int, int, int]) -> tuple[int, int, int]:
    b = m[3]
    return (m[0], m[1], b if b > 0 else 0)


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class _Interval:
    """The acks of one (topic, partition, ledger, broker)."""
    __slots__ = ("topic", "part", "ledger", "broker", "t0", "t1", "n", "max_entry", "first", "last",
                 "acks", "_conflicts")

    def __init__(self, topic: str, part: int, ledger: int, broker: str, t: int, op: Op):
        self.topic, self.part, self.ledger, self.broker = topic, part, ledger, broker
        self.t0 = self.t1 = t
        self.n = 0
        self.max_entry = -1
        self.first = self.last = op
        self.acks: list[tuple[Any, tuple[int, int, int, int], Op, Op | None]] = []   # value, mid, ok, invoke
        self._conflicts: list[dict[str, Any]] | None = None

    def row(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.part, "broker": self.broker or "?",
                "ledger": self.ledger, "first_ack_s": rounded(self.t0 / 1e9),
                "last_ack_s": rounded(self.t1 / 1e9), "acks": self.n}


class _FencingCheck:
    def __init__(self, history: list[Op], opts: dict[str, Any]):
        self.h = history
        self.o = opts
        self.final = int(opts.get("final_process") or 1_000_000)
        self.open: dict[int, Op] = {}
        self.iv: dict[tuple[str, int, int, str], _Interval] = {}
        self.acks = 0
        self.acks_no_node = 0
        self.acks_no_mid = 0
        self.reads: dict[str, list[Op]] = {}            # key -> ok final reads
        self.read_tried: set[str] = set()              # keys with a final read invoked
        self.lists: dict[str, Op] = {}                 # topic -> last ok `ledgers` op
        # ledger -> [(entry, t ack, payload, ok, invoke)]
        self.adds: dict[str, list[tuple[int, int, Any, Op, Op | None]]] = {}
        self.adds_no_entry = 0
        self.recovers: dict[str, list[tuple[int, int, Op]]] = {}              # ledger -> (t, last, ok)
        self.recovers_bad = 0
        self.invalid_fragments: list[Op] = []          # recoveries that built a fragment below the last
        self.cases: dict[str, Cases] = {}              # anomaly type -> its cases (made by result)
        self.unknown: list[str] = []                   # why the verdict can only be "unknown"

    # ------------------------------------------------------------------------------------ the pass

    def scan(self) -> None:
        final = self.final
        for op in self.h:
            p = op.process
            if p < 0:                       # the nemesis and observers are not clients
                continue
            if op.type == INVOKE:
                self.open[p] = op
                if op.f == "read" and p >= final:
                    self.read_tried.add(str(op.key))
                continue
            inv = self.open.pop(p, None)
            if inv is not None and inv.f != op.f:
                inv = None
            if op.type != OK:
                if op.f in ("recover", "read") and isinstance(op.value, dict) and "invalid_fragment" in op.value:
                    self.invalid_fragments.append(op)
                continue
            f = op.f
            if f == "send":
                self._send(inv, op)
            elif f == "add":
                self._add(inv, op)
            elif f == "recover":
                self._recover(inv, op)
            elif f == "read" and p >= final:
                key = str(op.key or (inv.key if inv is not None else ""))
                self.read_tried.add(key)
                self.reads.setdefault(key, []).append(op)
            elif f == "ledgers" and p >= final:
                self.lists[str(op.key or (inv.key if inv is not None else ""))] = op

    def _send(self, inv: Op | None, op: Op) -> None:
        self.acks += 1
        m = mid_tuple(op.message_id)
        if m is None:
            self.acks_no_mid += 1
            return
        node = op.node or ""
        if not node:
            self.acks_no_node += 1
        topic = op.key or (inv.key if inv is not None else "")
        k = (topic, m[2], m[0], node)
        t = op.time_ns
        iv = self.iv.get(k)
        if iv is None:
            iv = self.iv[k] = _Interval(topic, m[2], m[0], node, t, op)
        if t < iv.t0:
            iv.t0, iv.first = t, op
        if t >= iv.t1:
            iv.t1, iv.last = t, op
        iv.n += 1
        if m[1] > iv.max_entry:
            iv.max_entry = m[1]
        iv.acks.append((norm_value(inv.value if inv is not None else op.value), m, op, inv))

    def _add(self, inv: Op | None, op: Op) -> None:
        m = mid_tuple(op.message_id)
        if m is None:
            self.adds_no_entry += 1
            return
        key = str(op.key or (inv.key if inv is not None else ""))
        v = norm_value(inv.value if inv is not None else op.value)
        self.adds.setdefault(key, []).append((m[1], op.time_ns, v, op, inv))

    def _recover(self, inv: Op | None, op: Op) -> None:
        v = op.value
        last = _int(v.get("last_entry", v.get("last_entry_id"))) if isinstance(v, dict) else _int(v)
        if last is None:
            self.recovers_bad += 1
            return
        key = str(op.key or (inv.key if inv is not None else ""))
        self.recovers.setdefault(key, []).append((op.time_ns, last, op))

    # ------------------------------------------------------------------------------------ verdict

    def result(self) -> CheckResult:
        """The verdict: the cases each part finds (into self.cases), its stats, and what was unknown."""
        cap = self.o.get("max_anomalies")
        self.cases = {k: Cases(cap) for k in ANOMALY_TYPES}
        self.unknown = []
        stats: dict[str, Any] = {}
        self._ownership(stats)
        self._multi_writer()
        self._topic_bounds(stats)
        self._ledger_bounds(stats)

        invalid_types = set(self.o.get("invalid") or ())
        stats.update(anomaly_stats(self.cases, invalid_types))
        stats["unknown_because"] = self.unknown[:100]
        stats["tables"] = ["ownership"]
        return CheckResult(valid=verdict(self.cases, invalid_types, unknown=bool(self.unknown)),
                           anomalies=anomalies_of(self.cases), stats=stats)

    # ---------------------------------------------------------------------------------- ownership

    def _final_log(self, topic: str, cache: dict[str, Any]) -> dict[Any, set[tuple[int, int, int]]] | None:
        """value -> positions in the topic's ok final reads; None without one."""
        if topic in cache:
            return cache[topic]
        reads = self.reads.get(topic)
        out: dict[Any, set[tuple[int, int, int]]] | None = None
        if reads:
            out = {}
            for rd in reads:
                if not isinstance(rd.value, (list, tuple)):
                    continue
                for msg in rd.value:
                    if not isinstance(msg, dict):
                        continue
                    m = mid_tuple(msg.get("message_id"))
                    s = out.setdefault(norm_value(msg.get("value")), set())
                    if m is not None:
                        s.add(_pos(m))
        cache[topic] = out
        return out

    def _conflicts(self, iv: _Interval, log: dict[Any, set[tuple[int, int, int]]]) -> list[dict[str, Any]]:
        if iv._conflicts is None:
            out = []
            for v, m, ok, inv in iv.acks:
                at = log.get(v)
                pos = _pos(m)
                if at is None:
                    out.append({"reason": "missing", "broker": iv.broker, "value": v, "mid": m, "ok": ok,
                                "inv": inv, "read": []})
                elif at and pos not in at:
                    out.append({"reason": "misplaced", "broker": iv.broker, "value": v, "mid": m, "ok": ok,
                                "inv": inv, "read": sorted(at)})
            iv._conflicts = out
        return iv._conflicts

    def _ownership(self, stats: dict[str, Any]) -> None:
        """Part 1's overlaps of two brokers' acknowledgement intervals, judged by `_judge` into
        `split-brain`, `dual-ownership-benign` or `dual-ownership-unchecked`; the ownership timeline."""
        by_part: dict[tuple[str, int], list[_Interval]] = {}
        for iv in self.iv.values():
            by_part.setdefault((iv.topic, iv.part), []).append(iv)
        logs: dict[str, Any] = {}
        rows: list[dict[str, Any]] = []
        changes: dict[str, int] = {}
        overlaps = 0
        maxc = int(self.o.get("max_conflicts") or 10)
        for (topic, part), ivs in sorted(by_part.items(), key=lambda x: (str(x[0][0]), x[0][1])):
            ivs.sort(key=lambda x: (x.t0, x.t1, x.ledger))
            prev = None
            for iv in ivs:
                rows.append(iv.row())
                if iv.broker and prev is not None and iv.broker != prev:
                    changes[topic] = changes.get(topic, 0) + 1
                if iv.broker:
                    prev = iv.broker
            active: list[_Interval] = []
            for x in ivs:
                if not x.broker:
                    continue
                active = [a for a in active if a.t1 > x.t0]
                for a in active:
                    if a.broker == x.broker or not (a.t0 < x.t1 and x.t0 < a.t1):
                        continue
                    overlaps += 1
                    self._judge(topic, part, a, x, logs, maxc)
                active.append(x)
        limit = int(self.o.get("max_timeline_rows") or 2000)
        stats["ownership"] = rows[:limit]
        stats["ownership_rows"] = len(rows)
        stats["ownership_changes"] = changes
        stats["overlapping_intervals"] = overlaps
        stats["acks"] = {"ok_sends": self.acks, "without_node": self.acks_no_node,
                         "without_message_id": self.acks_no_mid,
                         "topics": len({t for t, _ in by_part}),
                         "ledgers": len({iv.ledger for iv in self.iv.values()})}

    def _judge(self, topic: str, part: int, a: _Interval, b: _Interval, logs: dict[str, Any],
               maxc: int) -> None:
        """Two brokers' overlapping intervals a (earlier start) and b."""
        def iv_json(iv: _Interval) -> dict[str, Any]:
            d = iv.row()
            d["first_ack"] = full_op(iv.first)
            d["last_ack"] = full_op(iv.last)
            return d

        base = {"topic": topic, "partition": part, "brokers": [a.broker, b.broker],
                "ledgers": [a.ledger, b.ledger],
                "overlap_s": [rounded(max(a.t0, b.t0) / 1e9), rounded(min(a.t1, b.t1) / 1e9)]}
        log = self._final_log(topic, logs)
        if log is None:
            self.unknown.append(f"overlap of {a.broker} and {b.broker} on {topic} without an ok final read")
            self.cases["dual-ownership-unchecked"].add(lambda: dict(
                base, intervals=[iv_json(a), iv_json(b)], final_read_attempted=topic in self.read_tried))
            return
        conflicts = self._conflicts(a, log) + self._conflicts(b, log)
        if not conflicts:
            self.cases["dual-ownership-benign"].add(lambda: dict(base, intervals=[iv_json(a), iv_json(b)]))
            return

        def ev() -> dict[str, Any]:
            cs = []
            for c in conflicts[:maxc]:
                cs.append({"reason": c["reason"], "broker": c["broker"], "value": jsonable(c["value"]),
                           "acked_message_id": mid_json(c["mid"]),
                           "read_positions": [list(p) for p in c["read"]],
                           "send": [full_op(c["inv"]), full_op(c["ok"])]})
            return dict(base, intervals=[iv_json(a), iv_json(b)], conflict_count=len(conflicts),
                        conflicts=cs, final_reads=[_ref(r) for r in self.reads.get(topic, [])])
        self.cases["split-brain"].add(ev)

    def _multi_writer(self) -> None:
        """`ledger-multi-writer`: a ledger acknowledged by two brokers. Evidence: the ledger, its brokers,
        topics and each writer's interval with its first and last acknowledgement."""
        by_ledger: dict[int, list[_Interval]] = {}
        for iv in self.iv.values():
            if iv.broker:
                by_ledger.setdefault(iv.ledger, []).append(iv)
        for ledger, ivs in sorted(by_ledger.items()):
            if len({iv.broker for iv in ivs}) < 2:
                continue
            ivs.sort(key=lambda x: x.t0)
            self.cases["ledger-multi-writer"].add(lambda: {
                "ledger": ledger, "brokers": sorted({iv.broker for iv in ivs}),
                "topics": sorted({str(iv.topic) for iv in ivs}),
                "writers": [dict(iv.row(), first_ack=full_op(iv.first), last_ack=full_op(iv.last))
                            for iv in ivs]})

    # ---------------------------------------------------------------------------------- ledger bounds

    def _topic_bounds(self, stats: dict[str, Any]) -> None:
        """`beyond-close` of topics: acknowledged sends above their ledger's last listed entry, or in a
        ledger the topic's `ledgers` op should list and does not; the ledger lists' stats."""
        listed: dict[int, tuple[int, str, Op]] = {}            # ledger -> (entries, topic, op)
        per_topic: dict[str, tuple[set[int], int | None, Op]] = {}
        malformed = 0
        for topic, op in self.lists.items():
            v = op.value if isinstance(op.value, dict) else {"ledgers": op.value}
            ids: set[int] = set()
            for d in v.get("ledgers") or []:
                lid = _int(d.get("ledger_id")) if isinstance(d, dict) else None
                n = _int(d.get("entries")) if isinstance(d, dict) else None
                if lid is None or n is None:
                    malformed += 1
                    continue
                ids.add(lid)
                listed[lid] = (n, topic, op)
            per_topic[topic] = (ids, _int(v.get("trimmed_before")), op)
        s = {"topics_listed": len(per_topic), "ledgers_listed": len(listed), "malformed_rows": malformed,
             "acks_checked": 0, "acks_in_trimmed_ledgers": 0, "acks_below_listed_range": 0,
             "acks_in_unlisted_topics": 0}
        stats["ledger_lists"] = s
        if not per_topic:
            return
        for iv in sorted(self.iv.values(), key=lambda x: (str(x.topic), x.part, x.ledger, x.broker)):
            got = listed.get(iv.ledger)
            if got is not None:
                n, ltopic, lop = got
                s["acks_checked"] += iv.n
                if iv.max_entry <= n - 1:
                    continue
                for v, m, ok, inv in iv.acks:
                    if m[1] > n - 1:
                        self.cases["beyond-close"].add(lambda: {
                            "topic": iv.topic, "ledger": iv.ledger, "entry_id": m[1],
                            "closed_last_entry": n - 1, "entries": n, "reason": "entry-above-last",
                            "broker": iv.broker,
                            "value": jsonable(v), "send": [full_op(inv), full_op(ok)], "ledgers_op": _ref(lop)})
                continue
            info = per_topic.get(iv.topic)
            if info is None and iv.part >= 0:
                info = per_topic.get(f"{iv.topic}-partition-{iv.part}")
            if info is None:
                s["acks_in_unlisted_topics"] += iv.n
                continue
            ids, trimmed_before, lop = info
            if trimmed_before is not None:
                if iv.ledger < trimmed_before:
                    s["acks_in_trimmed_ledgers"] += iv.n
                    continue
            elif not ids or iv.ledger < min(ids):
                s["acks_below_listed_range"] += iv.n
                continue
            s["acks_checked"] += iv.n
            for v, m, ok, inv in iv.acks:
                self.cases["beyond-close"].add(lambda: {
                    "topic": iv.topic, "ledger": iv.ledger, "entry_id": m[1], "closed_last_entry": None,
                    "entries": None, "reason": "ledger-not-listed", "broker": iv.broker,
                    "listed_ledgers": sorted(ids)[:50], "trimmed_before": trimmed_before,
                    "value": jsonable(v), "send": [full_op(inv), full_op(ok)], "ledgers_op": _ref(lop)})

    def _read_entries(self, ledger: str) -> dict[int, Any] | None:
        reads = self.reads.get(ledger)
        if not reads:
            return None
        out: dict[int, Any] = {}
        for rd in reads:
            if not isinstance(rd.value, (list, tuple)):
                continue
            for e in rd.value:
                if not isinstance(e, dict):
                    continue
                eid = _int(e.get("entry_id"))
                if eid is None:
                    m = mid_tuple(e.get("message_id"))
                    eid = m[1] if m is not None else None
                if eid is not None:
                    out.setdefault(eid, norm_value(e.get("value")))
        return out

    def _ledger_bounds(self, stats: dict[str, Any]) -> None:
        """The `ledger` workload's claims, per ledger: `inconsistent-close`, then per acknowledged add
        the first that applies of `ack-after-fence`, `beyond-close` and `lost-entry` (exclusive)."""
        s = {"ledgers": len(set(self.adds) | set(self.recovers)),
             "ok_adds": sum(len(x) for x in self.adds.values()), "adds_without_entry_id": self.adds_no_entry,
             "ok_recovers": sum(len(x) for x in self.recovers.values()),
             "recovers_malformed": self.recovers_bad,
             "final_reads_ok": 0, "ledgers_without_final_read": 0, "adds_after_fence_inside": 0}
        stats["bk_ledgers"] = s
        for op in self.invalid_fragments:
            self.cases["invalid-fragment"].add(lambda op=op: {
                "ledger": op.key, "why": str(op.value.get("invalid_fragment")), "op": full_op(op)})
        for ledger in sorted(set(self.adds) | set(self.recovers)):
            adds = self.adds.get(ledger, [])
            recs = sorted(self.recovers.get(ledger, []), key=lambda r: r[0])
            close = min((r[1] for r in recs), default=None)
            read = self._read_entries(ledger)
            if read is not None:
                s["final_reads_ok"] += 1
            elif adds:
                if ledger in self.read_tried:
                    self.unknown.append(f"ledger {ledger}: the final read did not complete ok")
                else:
                    s["ledgers_without_final_read"] += 1
            lasts = sorted({r[1] for r in recs})
            beyond_read = (sorted(e for e in read if e > close) if read is not None and close is not None
                           else [])
            if len(lasts) > 1 or beyond_read:
                self.cases["inconsistent-close"].add(lambda: {
                    "ledger": ledger, "recovered_last_entries": lasts,
                    "read_entries_beyond_close": beyond_read[:50],
                    "recovers": [full_op(r[2]) for r in recs[:20]],
                    "final_read": _ref(self.reads[ledger][0]) if beyond_read else None})
            # prefix minimum of last_entry over recoveries in completion order
            times = [r[0] for r in recs]
            pmin: list[tuple[int, Op]] = []
            for t, last, op in recs:
                if not pmin or last < pmin[-1][0]:
                    pmin.append((last, op))
                else:
                    pmin.append(pmin[-1])
            for entry, t, v, ok, inv in adds:
                i = bisect_left(times, t)          # recoveries that completed strictly before the ack
                if i > 0:
                    last, rop = pmin[i - 1]
                    if entry > last:
                        self.cases["ack-after-fence"].add(lambda: {
                            "ledger": ledger, "entry_id": entry, "recovered_last_entry": last,
                            "value": jsonable(v),
                            "fenced_at_s": rounded(rop.time_ns / 1e9), "acked_at_s": rounded(t / 1e9),
                            "add": [full_op(inv), full_op(ok)], "recover": full_op(rop)})
                        continue
                    s["adds_after_fence_inside"] += 1
                if close is not None and entry > close:
                    self.cases["beyond-close"].add(lambda: {
                        "ledger": ledger, "entry_id": entry, "closed_last_entry": close,
                        "value": jsonable(v),
                        "reason": "acked-before-recovery", "acked_at_s": rounded(t / 1e9),
                        "add": [full_op(inv), full_op(ok)],
                        "recover": full_op(next(r[2] for r in recs if r[1] == close))})
                    continue
                if read is None:
                    continue
                if entry not in read:
                    self.cases["lost-entry"].add(lambda: {
                        "ledger": ledger, "entry_id": entry, "value": jsonable(v), "reason": "missing",
                        "read_value": None, "closed_last_entry": close, "add": [full_op(inv), full_op(ok)],
                        "final_read": _ref(self.reads[ledger][0])})
                elif read[entry] != v:
                    self.cases["lost-entry"].add(lambda: {
                        "ledger": ledger, "entry_id": entry, "value": jsonable(v), "reason": "different",
                        "read_value": jsonable(read[entry]), "closed_last_entry": close,
                        "add": [full_op(inv), full_op(ok)], "final_read": _ref(self.reads[ledger][0])})
