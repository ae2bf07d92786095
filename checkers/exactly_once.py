"""The exactly-once checker: a checkpointing stream processor counts every input once in its state, and
writes every output at least once, duplicates only after a restart.

The claim is the Flink Pulsar connector's: an exactly-once source (the processor checkpoints its state
together with the message id it reached, and after a crash restores the checkpoint and replays the
input from that id by seek) and an at-least-once sink (outputs are flushed before a checkpoint is
taken). The `exactly-once` workload (workloads/exactly_once.py) writes histories of this shape, one
*pipeline* per input topic A with its output topic B:

- `send` (key A, value v): an input; its key and amount are the message's partition key and
  `amount_of(v)`.
- `restore` (key A, invoke value {incarnation, output, checkpoint, message_id, seek}): a processor
  incarnation restored the checkpoint `checkpoint` (null: none) and resumes after `message_id`.
- `checkpoint` (key A, invoke value {seq, incarnation, message_id, count, sums, counts}): the state
  after the input at `message_id` (sums and counts per key); `ok` once it is durable.
- `crash-processor`, `restart-processor`, `processor-exit`, ...: the controller's kills (stats only).
- final `read` of A and of B (process >= final_process): every message from the earliest. A message
  of B is a JSON object {"k": key, "sum": running sum, "n": running count, "in": input message id
  [ledger, entry, partition, batch_index], "v": input value, "inc": incarnation}.
- `final-checkpoint` (key A, ok value {input, output, checkpoint}): the latest durable checkpoint.

Positions are message ids (ledger, entry, batch_index), batch_index -1 read as 0 (as the log checker).
Inputs are A's messages (a value stored twice in A is two inputs). Anomalies (all invalidate):

- `double-counted` / `missed`: a checkpoint (every journaled one, and the final one) whose sum or count
  for a key differs from the sum over A's messages up to and including its message id; `amount` is
  what the state has too much (positive) or too little (negative).
- `checkpoint-not-in-input`: a checkpoint's message id is not a message of A's final read.
- `lost-output`: an input at or before the latest durable checkpoint (an ok `checkpoint` or the final
  one) with no output in B: flush-on-checkpoint was not kept.
- `duplicate-without-restart`: an input with more outputs in B than processor incarnations that
  resumed from before it (each incarnation outputs an input at most once; the first resumes from the
  start). Only with opts["dedup_output"] (the default; the workload turns broker deduplication on for
  B so that a producer's own resends are dropped); without it these are counted in stats only.
- `wrong-output`: an output whose running sum or count is not the exactly-once prefix sum of its key
  at its input, or whose key or value is not its input's.
- `unexpected-output`: an output naming an input id that A does not hold, or that cannot be parsed.
- `lost-input`: an acknowledged send to A missing from A's final read.

A pipeline whose final reads did not complete, or with no final checkpoint, is unknown unless an
anomaly was found. Cost: O(n log n) in the messages of A and B (per-key prefix sums and bisection).
"""
from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from typing import Any

from core.history import INVOKE, OK, CheckResult, Op

ANOMALY_TYPES = ("double-counted", "missed", "checkpoint-not-in-input", "lost-output",
                 "duplicate-without-restart", "wrong-output", "unexpected-output", "lost-input")
DEFAULTS: dict[str, Any] = {
    "dedup_output": True,            # duplicates beyond the restarts invalidate (False: stats only)
    "final_process": 1_000_000,      # final reads and the final checkpoint run at or above this
    "max_anomalies": 1000,           # evidence entries kept per type (None: all); counts stay exact
}

Pos = tuple[int, int, int]


def amount_of(value: int) -> int:
    """The amount an input value carries (1..97), a pure function of the value."""
    return value % 97 + 1


def pos_of(mid: Any) -> Pos | None:
    """(ledger, entry, batch_index >= 0) of a message id given as a dict or a list/tuple."""
    if mid is None:
        return None
    try:
        if isinstance(mid, dict):
            return (int(mid["ledger_id"]), int(mid["entry_id"]), max(0, int(mid.get("batch_index", -1))))
        if isinstance(mid, (list, tuple)):
            b = int(mid[3]) if len(mid) > 3 else -1
            return (int(mid[0]), int(mid[1]), max(0, b))
        if hasattr(mid, "ledger_id"):
            return (int(mid.ledger_id), int(mid.entry_id), max(0, int(mid.batch_index)))
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return None


class _Pipeline:
    def __init__(self, input_topic: str):
        self.input = input_topic
        self.output = ""
        self.checkpoints: list[tuple[Op, str | None]] = []     # (invoke, completion type)
        self.restores: list[Op] = []
        self.final: Op | None = None
        self.read_a: list[Any] | None = None
        self.read_b: list[Any] | None = None
        self.read_a_op: Op | None = None
        self.read_b_op: Op | None = None
        self.acked: dict[Any, Op] = {}
        self.controller: Counter = Counter()


class _Anomalies:
    def __init__(self, cap: int | None):
        self.cap = cap
        self.lists: dict[str, list[Any]] = {}
        self.counts: Counter = Counter()

    def add(self, kind: str, ev: dict[str, Any]) -> None:
        self.counts[kind] += 1
        lst = self.lists.setdefault(kind, [])
        if self.cap is None or len(lst) < self.cap:
            lst.append(ev)


def check(history: list[Op], opts: dict[str, Any] | None = None) -> CheckResult:
    """Check an exactly-once history; see the module docstring."""
    o = dict(DEFAULTS)
    o.update(opts or {})
    final_process = int(o["final_process"])
    pipes: dict[str, _Pipeline] = {}
    outputs_of: dict[str, str] = {}       # output topic -> input topic

    def pipe(topic: str) -> _Pipeline:
        if topic not in pipes:
            pipes[topic] = _Pipeline(topic)
        return pipes[topic]

    open_ckpt: dict[int, Op] = {}
    reads: dict[str, Op] = {}
    sends: dict[int, Op] = {}
    for op in history:
        f = op.f
        if f == "checkpoint":
            if op.type == INVOKE:
                open_ckpt[op.process] = op
                pipe(op.key).checkpoints.append((op, None))
            else:
                inv = open_ckpt.pop(op.process, None)
                if inv is not None:
                    p = pipe(inv.key)
                    p.checkpoints = [(i, op.type if i is inv else t) for i, t in p.checkpoints]
        elif f == "restore" and op.type == INVOKE:
            p = pipe(op.key)
            p.restores.append(op)
            if isinstance(op.value, dict) and op.value.get("output"):
                p.output = str(op.value["output"])
        elif f == "final-checkpoint" and op.type == OK:
            p = pipe(op.key)
            p.final = op
            if isinstance(op.value, dict) and op.value.get("output"):
                p.output = str(op.value["output"])
        elif f == "read" and op.process >= final_process and op.type != INVOKE:
            reads[op.key] = op
        elif f == "send":
            if op.type == INVOKE:
                sends[op.process] = op
            else:
                inv = sends.pop(op.process, None)
                if op.type == OK and inv is not None:
                    pipe(op.key).acked[inv.value] = op
        elif f.endswith("-processor") or f == "processor-exit":
            if op.type == INVOKE:
                pipe(op.key).controller[f] += 1
    for p in list(pipes.values()):
        if p.output:
            outputs_of[p.output] = p.input
    # pipelines are those with a processor or a final checkpoint (not output topics seen as keys)
    for name in list(pipes):
        p = pipes[name]
        if name in outputs_of or not (p.restores or p.checkpoints or p.final or p.acked):
            del pipes[name]
    for topic, op in reads.items():
        if topic in pipes:
            pipes[topic].read_a_op = op
            pipes[topic].read_a = op.value if op.type == OK and isinstance(op.value, list) else None
        elif topic in outputs_of and outputs_of[topic] in pipes:
            p = pipes[outputs_of[topic]]
            p.read_b_op = op
            p.read_b = op.value if op.type == OK and isinstance(op.value, list) else None

    an = _Anomalies(o["max_anomalies"])
    stats: dict[str, Any] = {"pipelines": {}}
    unknown: list[str] = []
    for name in sorted(pipes):
        st, why = _check_pipeline(pipes[name], an, bool(o["dedup_output"]))
        stats["pipelines"][name] = st
        unknown += why
    invalid = any(an.counts.values())
    totals = Counter()
    for st in stats["pipelines"].values():
        for k in ("inputs", "outputs", "duplicates", "restarts", "crashes", "checkpoints", "checkpoints_ok",
                  "resend_duplicates"):
            totals[k] += int(st.get(k) or 0)
    stats.update(totals)
    stats["anomaly_counts"] = dict(an.counts)
    if unknown:
        stats["unknown"] = unknown
    if not pipes:
        unknown.append("no pipeline in the history (no restore, checkpoint or final-checkpoint op)")
        stats["unknown"] = unknown
    valid: bool | str = False if invalid else ("unknown" if unknown else True)
    return CheckResult(valid, {k: v for k, v in an.lists.items()}, stats)


def _check_pipeline(p: _Pipeline, an: _Anomalies, dedup_output: bool) -> tuple[dict[str, Any], list[str]]:
    why: list[str] = []
    st: dict[str, Any] = {
        "output_topic": p.output, "checkpoints": len(p.checkpoints),
        "checkpoints_ok": sum(1 for _, t in p.checkpoints if t == OK),
        "restarts": max(0, len(p.restores) - 1), "incarnations": len(p.restores),
        "crashes": p.controller.get("crash-processor", 0), "exits": p.controller.get("processor-exit", 0)}
    final_ckpt = p.final.value.get("checkpoint") if p.final is not None and isinstance(p.final.value, dict) else None
    if p.final is None:
        why.append(f"{p.input}: no final-checkpoint op")
    if p.read_a is None:
        why.append(f"{p.input}: the final read of the input topic did not complete"
                   + (f" ({p.read_a_op.error})" if p.read_a_op is not None and p.read_a_op.error else ""))
        return st, why

    # the inputs: A's messages in log order, with per-key prefix sums
    inputs: dict[Pos, tuple[str, int, Any]] = {}          # pos -> (key, amount, value)
    order: list[Pos] = []
    values_in_a: Counter = Counter()
    for m in p.read_a:
        if not isinstance(m, dict):
            continue
        pos = pos_of(m.get("message_id"))
        if pos is None or pos in inputs:
            continue
        v = m.get("value")
        amount = amount_of(v) if isinstance(v, int) and not isinstance(v, bool) else 0
        inputs[pos] = (str(m.get("key") or ""), amount, v)
        order.append(pos)
        values_in_a[v] += 1
    order.sort()
    per_key_pos: dict[str, list[Pos]] = defaultdict(list)
    per_key_sum: dict[str, list[int]] = defaultdict(list)
    for pos in order:
        k, amount, _ = inputs[pos]
        sums = per_key_sum[k]
        per_key_pos[k].append(pos)
        sums.append((sums[-1] if sums else 0) + amount)

    def expected_at(pos: Pos | None) -> dict[str, tuple[int, int]]:
        """{key: (sum, count)} over the inputs at or before pos."""
        out = {}
        for k, plist in per_key_pos.items():
            n = 0 if pos is None else bisect_right(plist, pos)
            if n:
                out[k] = (per_key_sum[k][n - 1], n)
        return out

    st["inputs"] = len(order)
    st["input_values_stored_twice"] = sum(1 for c in values_in_a.values() if c > 1)
    for v, op in p.acked.items():
        if values_in_a.get(v, 0) == 0:
            an.add("lost-input", {"input": p.input, "value": v, "op": op.index, "message_id": _mid(op)})

    # (1) every checkpoint counts each input up to its message id exactly once
    def check_ckpt(c: dict[str, Any], op: Op, final: bool) -> None:
        pos = pos_of(c.get("message_id"))
        if pos is not None and pos not in inputs:
            an.add("checkpoint-not-in-input", {"input": p.input, "checkpoint": c.get("seq"), "final": final,
                                               "incarnation": c.get("incarnation"),
                                               "message_id": c.get("message_id"), "op": op.index})
        want = expected_at(pos)
        sums = c.get("sums") or {}
        counts = c.get("counts") or {}
        for k in sorted(set(want) | set(sums) | set(counts)):
            ws, wc = want.get(k, (0, 0))
            hs, hc = int(sums.get(k, 0)), int(counts.get(k, 0))
            if (hs, hc) == (ws, wc):
                continue
            kind = "double-counted" if hc > wc or (hc == wc and hs > ws) else "missed"
            an.add(kind, {"input": p.input, "key": k, "checkpoint": c.get("seq"), "final": final,
                          "incarnation": c.get("incarnation"), "message_id": c.get("message_id"),
                          "expected_sum": ws, "actual_sum": hs, "expected_count": wc, "actual_count": hc,
                          "amount": hs - ws, "op": op.index})
    seen = set()
    for inv, _ in p.checkpoints:
        if isinstance(inv.value, dict):
            check_ckpt(inv.value, inv, False)
            seen.add((inv.value.get("incarnation"), inv.value.get("seq")))
    if isinstance(final_ckpt, dict) and p.final is not None:
        if (final_ckpt.get("incarnation"), final_ckpt.get("seq")) not in seen:
            check_ckpt(final_ckpt, p.final, True)
        fpos = pos_of(final_ckpt.get("message_id"))
        st["final_checkpoint"] = {"seq": final_ckpt.get("seq"), "count": final_ckpt.get("count"),
                                  "incarnation": final_ckpt.get("incarnation"),
                                  "message_id": final_ckpt.get("message_id")}
        st["inputs_covered"] = bisect_right(order, fpos) if fpos is not None else 0

    if p.read_b is None:
        why.append(f"{p.input}: the final read of the output topic {p.output or '?'} did not complete"
                   + (f" ({p.read_b_op.error})" if p.read_b_op is not None and p.read_b_op.error else ""))
        return st, why

    # the outputs
    copies: Counter = Counter()
    n_out = 0
    for m in p.read_b:
        if not isinstance(m, dict):
            continue
        n_out += 1
        raw = m.get("value")
        try:
            out = json.loads(raw) if isinstance(raw, str) else raw
            ipos = pos_of(out["in"])
            key, total, count = str(out["k"]), int(out["sum"]), int(out["n"])
        except (TypeError, ValueError, KeyError):
            an.add("unexpected-output", {"output": p.output, "value": raw, "message_id": m.get("message_id"),
                                         "why": "not an output record"})
            continue
        if ipos is None or ipos not in inputs:
            an.add("unexpected-output", {"output": p.output, "value": out, "message_id": m.get("message_id"),
                                         "why": "its input is not in the input topic"})
            continue
        copies[ipos] += 1
        ikey, _, ivalue = inputs[ipos]
        plist = per_key_pos.get(key, [])
        n = bisect_right(plist, ipos)
        ws, wc = (per_key_sum[key][n - 1], n) if n else (0, 0)
        if key != ikey or out.get("v") != ivalue or (total, count) != (ws, wc):
            an.add("wrong-output", {"output": p.output, "input_message_id": out.get("in"), "key": key,
                                    "input_key": ikey, "value": out.get("v"), "input_value": ivalue,
                                    "expected_sum": ws, "actual_sum": total, "expected_count": wc,
                                    "actual_count": count, "incarnation": out.get("inc"),
                                    "message_id": m.get("message_id")})
    st["outputs"] = n_out
    st["inputs_with_output"] = len(copies)
    st["duplicates"] = sum(c - 1 for c in copies.values() if c > 1)

    # (2) every input at or before the latest durable checkpoint has an output
    durable = [pos_of(inv.value.get("message_id")) for inv, t in p.checkpoints
               if t == OK and isinstance(inv.value, dict)]
    if isinstance(final_ckpt, dict):
        durable.append(pos_of(final_ckpt.get("message_id")))
    durable_pos = [x for x in durable if x is not None]
    bound = max(durable_pos) if durable_pos else None
    if bound is not None:
        for pos in order[:bisect_right(order, bound)]:
            if not copies.get(pos):
                k, amount, v = inputs[pos]
                an.add("lost-output", {"input": p.input, "output": p.output, "message_id": list(pos),
                                       "value": v, "key": k, "durable_checkpoint_message_id": list(bound)})

    # (3) duplicates only for inputs after the position a restart resumed from
    resumes = sorted((pos_of(r.value.get("message_id")) if isinstance(r.value, dict) else None) or (-1, -1, -1)
                     for r in p.restores)
    resend = 0
    for pos, c in copies.items():
        if c < 2:
            continue
        allowed = bisect_left(resumes, pos)         # incarnations that resumed strictly before pos
        if c > allowed:
            if dedup_output:
                k, amount, v = inputs[pos]
                an.add("duplicate-without-restart", {"input": p.input, "output": p.output, "message_id": list(pos),
                                                     "value": v, "copies": c, "incarnations_resumed_before": allowed})
            else:
                resend += c - max(allowed, 1)
    st["resend_duplicates"] = resend
    return st, why


def _mid(op: Op) -> Any:
    m = op.message_id
    if m is None:
        return None
    return [m.ledger_id, m.entry_id, m.partition, m.batch_index]
