"""The log, queue and Elle checkers on generated 1,000,000-op histories: wall time and peak memory.

A seeded simulation writes what a long `log` run records (producers appending unique ints to several
topics, Exclusive consumers receiving in order with occasional redeliveries, nemesis ops, a final
read per topic) and what a `queue` run records (enqueues, competing Shared consumers, a final drain),
optionally with planted anomalies (lost, duplicated, reordered and skipped messages, a reordered
producer, a message placed before one already consumed). Each checker then runs in a fresh
subprocess that generates its history, calls `check` once and reports the wall time of that call and
the process's peak resident set size (`ru_maxrss`, which includes the history itself).

    .venv/bin/python -m bench.checkers                          # 1,000,000 ops, clean and planted
    .venv/bin/python -m bench.checkers --ops 200000 --only log --planted
    .venv/bin/python -m bench.checkers --profile elle           # cProfile of one check, top 25
"""
from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from core.history import FAIL, INFO, INVOKE, OK, MessageId, Op

MS = 1_000_000
FINAL_READ_PROCESS = 1_000_000
LEDGER_ENTRIES = 20_000          # entries per ledger before the topic rolls over to a new one


def _mid(ledger: int, entry: int, partition: int = -1, batch: int = -1) -> dict[str, int]:
    return {"ledger_id": ledger, "entry_id": entry, "partition": partition, "batch_index": batch}


class _Log:
    """One topic's log: (append time, value, ledger, entry) in log order."""

    def __init__(self, ledger: int):
        self.entries: list[tuple[int, Any, int, int]] = []
        self.ledger = ledger
        self.next_entry = 0

    def append(self, t: int, v: Any) -> tuple[int, int]:
        """v at the end of the log (a new ledger every LEDGER_ENTRIES entries); its (ledger, entry)."""
        if self.next_entry >= LEDGER_ENTRIES:
            self.roll()
        self.entries.append((t, v, self.ledger, self.next_entry))
        self.next_entry += 1
        return (self.ledger, self.next_entry - 1)

    def roll(self) -> None:
        """Later appends go to a new ledger (as when a topic's ledger is closed on a fault)."""
        self.ledger += 1
        self.next_entry = 0


class _Sim:
    """A discrete-event history generator: events on a heap by time, ops appended in time order.

    With a sink, every `chunk` ops are handed to it and dropped (a history longer than memory);
    `n` counts every op emitted, `last_t` is the time of the last one."""

    def __init__(self, sink: Callable[[list[Op]], None] | None = None, chunk: int = 100_000) -> None:
        self.ops: list[Op] = []
        self.heap: list[tuple[int, int, str, Any]] = []
        self.seq = 0
        self.n = 0
        self.last_t = 0
        self.sink = sink
        self.chunk = chunk

    def at(self, t: int, kind: str, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, data))

    def emit(self, t: int, process: int, type_: str, f: str, key: str, value: Any = None,
             message_id: MessageId | None = None, node: str = "", error: str = "") -> Op:
        op = Op(process=process, type=type_, f=f, key=key, value=value, message_id=message_id, node=node,
                error=error, time_ns=t, index=self.n)
        self.ops.append(op)
        self.n += 1
        self.last_t = t
        if self.sink is not None and len(self.ops) >= self.chunk:
            self.flush()
        return op

    def flush(self) -> None:
        if self.sink is not None and self.ops:
            self.sink(self.ops)
            self.ops = []


class LogHooks:
    """Where a caller steers `gen_log` (bench/campaign_gen.py plants anomalies and fault windows
    through these); gen_log sets `sim`, `logs`, `cursor` and `names` before the first event. The
    defaults change nothing: without hooks gen_log draws exactly the same history."""

    sim: _Sim
    logs: list[_Log]
    cursor: list[int]
    names: list[str]

    def start(self) -> None:
        """Schedule the first nemesis event (sim.at(t, "nemesis", data)) or "emit" events."""

    def nemesis(self, t: int, data: Any) -> None:
        """A "nemesis" event: emit fault ops (sim.at(t, "emit", (process, type, f, key, value,
        message_id, node, error)) emits one at t) and schedule the next."""

    def send_topic(self, t: int, thread: int, topic: int) -> int:
        return topic

    def send_outcome(self, t: int, thread: int, topic: int, value: int) -> str | None:
        """None: drawn at random; else OK, FAIL, INFO (never appended) or "info-appended"."""
        return None

    def send_latency(self, t: int, topic: int, lat: int) -> int:
        return lat

    def append(self, t: int, topic: int, value: int) -> tuple[int, int]:
        """Place an acknowledged (or indeterminate) send in the log; its (ledger, entry)."""
        return self.logs[topic].append(t, value)

    def send_done(self, t: int, thread: int, process: int, topic: int, value: int, type_: str) -> None:
        pass

    def receive(self, t: int, topic: int, msgs: list[dict]) -> list[dict]:
        return msgs

    def end(self, t: int) -> int:
        """After the last op at t: heal and settle; the time of the final reads."""
        return t + 10_000 * MS

    def final_read(self, topic: int, msgs: list[dict]) -> None:
        pass


def gen_log(n_ops: int = 1_000_000, seed: int = 1, topics: int = 8, producers: int = 24,
            consumers: int = 4, planted: bool = False, *, hooks: LogHooks | None = None,
            sink: Callable[[list[Op]], None] | None = None, names: list[str] | None = None,
            send_gap_ns: int = 2 * MS, t_stop: int | None = None) -> list[Op]:
    """A `log` workload history of about n_ops ops (see the module docstring).

    hooks steer faults, outcomes and placement (LogHooks); with a sink the ops go to it in chunks and
    the list returned is empty; names are the topics' names; send_gap_ns bounds a producer's pause
    between sends (the rate); t_stop ends the workload at that time even if n_ops is not reached."""
    rng = random.Random(seed)
    sim = _Sim(sink)
    heap, at, emit = sim.heap, sim.at, sim.emit

    names = list(names) if names is not None else [f"persistent://public/default/bench-{i}" for i in range(topics)]
    logs = [_Log(1000 + 10_000 * i) for i in range(topics)]
    budget = n_ops - 2 * topics - 40
    # producer threads: (process id, topics it picks from); info retires the process (+ producers)
    pthreads = [[i, (i % topics, (i + 1) % topics)] for i in range(producers)]
    for i in range(producers):
        at(rng.randrange(0, 5 * MS), "inv-send", i)
    # consumer threads: one Exclusive consumer per topic it owns; cursors per topic
    cthreads = [[producers * 1000 + j, [t for t in range(topics) if t % consumers == j], 0]
                for j in range(consumers)]
    cursor = [0] * topics
    for j in range(consumers):
        at(rng.randrange(0, 5 * MS), "inv-recv", j)
    value = 0
    sent_at: dict[int, tuple[int, int]] = {}        # value -> (ledger, entry) once appended
    if hooks is None:
        nem_t = 10_000 * MS
        at(nem_t, "nemesis", 0)
    else:
        hooks.sim, hooks.logs, hooks.cursor, hooks.names = sim, logs, cursor, names
        hooks.start()
    while heap and sim.n < budget and (t_stop is None or heap[0][0] < t_stop):
        t, _, kind, data = heapq.heappop(heap)
        if kind == "inv-send":
            th = pthreads[data]
            topic = th[1][rng.random() < 0.5]
            if hooks is not None:
                topic = hooks.send_topic(t, data, topic)
            value += 1
            emit(t, th[0], INVOKE, "send", names[topic], value)
            r = rng.random()
            forced = hooks.send_outcome(t, data, topic, value) if hooks is not None else None
            if forced is not None:
                r = 1.0 if forced == OK else 0.0015 if forced == FAIL else 0.0
            if r < 0.001:                                     # indeterminate: a 10 s timeout
                end = t + 10_000 * MS
                if rng.random() < 0.5 if forced is None else forced != INFO:
                    at(t + rng.randrange(MS, 5 * MS), "append", (topic, value))
                at(end, "done-send", (data, topic, value, INFO, None))
            elif r < 0.002:
                at(t + rng.randrange(MS // 10, MS), "done-send", (data, topic, value, FAIL, None))
            else:
                lat = int(rng.lognormvariate(0.8, 0.5) * MS)
                if hooks is not None:
                    lat = hooks.send_latency(t, topic, lat)
                at(t + lat // 2, "append", (topic, value))
                at(t + lat, "done-send", (data, topic, value, OK, None))
        elif kind == "append":
            topic, v = data
            sent_at[v] = logs[topic].append(t, v) if hooks is None else hooks.append(t, topic, v)
        elif kind == "done-send":
            i, topic, v, type_, _ = data
            th = pthreads[i]
            if type_ == OK:
                le = sent_at.pop(v)
                emit(t, th[0], OK, "send", names[topic], v, MessageId(le[0], le[1]), f"broker-{topic % 2 + 1}")
            else:
                emit(t, th[0], type_, "send", names[topic], v, None, f"broker-{topic % 2 + 1}",
                     "Timeout: send timed out" if type_ == INFO else "ProducerQueueIsFull: full")
            if hooks is not None:
                hooks.send_done(t, i, th[0], topic, v, type_)
            if type_ == INFO:
                th[0] += producers                           # the thread continues as a new process
            at(t + rng.randrange(0, send_gap_ns), "inv-send", i)
        elif kind == "inv-recv":
            th = cthreads[data]
            topic = th[1][th[2] % len(th[1])]
            th[2] += 1
            emit(t, th[0], INVOKE, "receive", names[topic])
            at(t + rng.randrange(MS // 2, 2 * MS), "done-recv", (data, topic, t + 100 * MS))
        elif kind == "done-recv":
            # the receive returns once a message is there (checked every 2 ms), or empty after 100 ms
            j, topic, deadline = data
            th = cthreads[j]
            lg = logs[topic].entries
            c = cursor[topic]
            # (a hook may hold a slot of the log open, value None: the consumer waits for it)
            if (c >= len(lg) or (hooks is not None and lg[c][1] is None)) and t < deadline:
                at(min(deadline, t + 2 * MS), "done-recv", data)
                continue
            redeliver = 0
            if c > 4 and rng.random() < 0.002:               # a reconnect: unacknowledged ones again
                redeliver = rng.randrange(1, 4)
                c -= redeliver
            got = lg[c:c + 16]
            if hooks is not None:
                got = list(itertools.takewhile(lambda e: e[1] is not None, got))
            if got:
                msgs = [{"value": v, "message_id": _mid(le, en), "redelivery_count": 1 if k < redeliver else 0}
                        for k, (_, v, le, en) in enumerate(got)]
                cursor[topic] = c + len(got)
                if hooks is not None:
                    msgs = hooks.receive(t, topic, msgs)
                emit(t, th[0], OK, "receive", names[topic], msgs, None, f"broker-{topic % 2 + 1}")
            else:
                emit(t, th[0], FAIL, "receive", names[topic], None, None, f"broker-{topic % 2 + 1}",
                     "Timeout: no message within 100 ms")
            at(t + rng.randrange(0, MS), "inv-recv", j)
        elif kind == "emit":
            emit(t, *data)
        elif kind == "nemesis" and hooks is not None:
            hooks.nemesis(t, data)
        elif kind == "nemesis":
            fault = ("partition", "kill", "pause", "zk-isolate")[(data // 2) % 4]
            name = ("start-" if data % 2 == 0 else "stop-") + fault
            emit(t, -1, INVOKE, name, "", None)
            emit(t + MS, -1, OK, name, "", ["broker-1"])
            at(t + 10_000 * MS, "nemesis", data + 1)
    # close every open op the way a run ends: open sends stay open, open receives are dropped
    t_end = sim.last_t + 10_000 * MS if hooks is None else hooks.end(sim.last_t)
    for ti in range(topics):
        entries = logs[ti].entries
        msgs = [{"value": v, "message_id": _mid(le, en)} for (_, v, le, en) in entries]
        if planted:
            _plant_log(rng, sim.ops, names[ti], msgs, ti)
        if hooks is not None:
            hooks.final_read(ti, msgs)
        emit(t_end, FINAL_READ_PROCESS + ti, INVOKE, "read", names[ti])
        t_end += 200 * MS
        emit(t_end, FINAL_READ_PROCESS + ti, OK, "read", names[ti], msgs)
        del msgs
        sim.flush()                          # with a sink: one final read's messages at a time
    return sim.ops


def _plant_log(rng: random.Random, ops: list[Op], topic: str, msgs: list[dict], ti: int) -> None:
    """Planted anomalies on one topic (only topics 0, 1 and 2 get them)."""
    if ti == 0:
        # lost: three acknowledged messages missing from the final read
        # (positions 1000 ... 5000 of the log; scaled down on a log shorter than 6000, as with --ops 200000)
        at = (lambda k: k) if len(msgs) > 6000 else (lambda k: k * len(msgs) // 6000)
        for k in (3000, 2000, 1000):
            del msgs[at(k)]
        # duplicate: one value written again at the end of the log
        last = msgs[-1]["message_id"]
        msgs.append({"value": msgs[at(5000)]["value"], "message_id": _mid(last["ledger_id"], last["entry_id"] + 1)})
        # a consumer's receive out of order (nonmonotonic-poll) and one skipping a message (poll-skip)
        recv = [op for op in ops if op.f == "receive" and op.type == OK and op.key == topic
                and len(op.value) >= 4 and all(m["redelivery_count"] == 0 for m in op.value)]
        a, b = recv[len(recv) // 3], recv[2 * len(recv) // 3]
        a.value[1], a.value[2] = a.value[2], a.value[1]
        del b.value[1]
    elif ti == 1:
        # a message placed before another that a consumer had received before it was sent: swap two
        # neighbours in the final read whose sends did not overlap (G0-realtime, G1c-realtime)
        sends = {op.value: op for op in ops if op.f == "send" and op.key == topic}
        done = {op.value: op for op in ops if op.f == "send" and op.key == topic and op.type == OK}
        for k in range(len(msgs) // 2, len(msgs) - 1):
            x, y = msgs[k]["value"], msgs[k + 1]["value"]
            if (x in done and y in sends and done[x].time_ns < sends[y].time_ns
                    and done[x].process != sends[y].process):
                msgs[k]["value"], msgs[k + 1]["value"] = y, x
                break
        # a producer whose two consecutive sends to this topic were acknowledged out of order
        by_proc: dict[int, Op] = {}
        for op in ops:
            if op.f == "send" and op.type == OK and op.key == topic:
                prev = by_proc.get(op.process)
                if prev is not None and op.index > len(ops) // 2:
                    prev.message_id, op.message_id = op.message_id, prev.message_id
                    break
                by_proc[op.process] = op
    elif ti == 2:
        # one producer's two sends swapped in the log (G0-process)
        last: dict[int, int] = {}
        proc = {op.value: op.process for op in ops if op.f == "send" and op.type == OK and op.key == topic}
        for k in range(len(msgs) // 2, len(msgs)):
            p = proc.get(msgs[k]["value"])
            if p is not None and p in last and k - last[p] < 50:
                j = last[p]
                msgs[j]["value"], msgs[k]["value"] = msgs[k]["value"], msgs[j]["value"]
                break
            if p is not None:
                last[p] = k


def gen_queue(n_ops: int = 1_000_000, seed: int = 1, queues: int = 4, producers: int = 16,
              consumers: int = 8, planted: bool = False) -> list[Op]:
    """A `queue` workload history of about n_ops ops: enqueues, competing Shared consumers (each takes
    the next messages of its queue; now and then a batch is redelivered to another consumer), a
    final drain per queue."""
    rng = random.Random(seed)
    sim = _Sim()
    ops, heap, at = sim.ops, sim.heap, sim.at

    def emit(t: int, process: int, type_: str, f: str, key: str, value: Any = None,
             message_id: MessageId | None = None, error: str = "") -> Op:
        return sim.emit(t, process, type_, f, key, value, message_id, f"broker-{int(key[-1]) % 2 + 1}", error)

    names = [f"persistent://public/default/queue-{i}" for i in range(queues)]
    logs = [_Log(5000 + 10_000 * i) for i in range(queues)]
    cursor = [0] * queues
    replay: list[list[dict]] = [[] for _ in range(queues)]     # batches waiting to be redelivered
    skip = set()                                               # planted: values never dispatched
    pthreads = [[i] for i in range(producers)]
    cthreads = [[producers * 1000 + j, j % queues] for j in range(consumers)]
    for i in range(producers):
        at(rng.randrange(0, 5 * MS), "inv-enq", i)
    for j in range(consumers):
        at(rng.randrange(0, 5 * MS), "inv-deq", j)
    acked_at: dict[int, tuple[int, int]] = {}
    value = 0
    budget = n_ops - 2 * queues
    while heap and len(ops) < budget:
        t, _, kind, data = heapq.heappop(heap)
        if kind == "inv-enq":
            q = rng.randrange(queues)
            value += 1
            emit(t, pthreads[data][0], INVOKE, "enqueue", names[q], value)
            r = rng.random()
            if r < 0.001:
                if rng.random() < 0.5:
                    at(t + rng.randrange(MS, 5 * MS), "append", (q, value))
                at(t + 10_000 * MS, "done-enq", (data, q, value, INFO))
            elif r < 0.002:
                at(t + rng.randrange(MS // 10, MS), "done-enq", (data, q, value, FAIL))
            else:
                lat = int(rng.lognormvariate(0.8, 0.5) * MS)
                at(t + lat // 2, "append", (q, value))
                at(t + lat, "done-enq", (data, q, value, OK))
        elif kind == "append":
            q, v = data
            lg = logs[q]
            if lg.next_entry >= LEDGER_ENTRIES:
                lg.ledger += 1
                lg.next_entry = 0
            lg.entries.append((t, v, lg.ledger, lg.next_entry))
            acked_at[v] = (lg.ledger, lg.next_entry)
            lg.next_entry += 1
            if planted and v in (5000, 50_000, 150_000):
                skip.add(v)                                    # lost: the broker never hands it out
        elif kind == "done-enq":
            i, q, v, type_ = data
            th = pthreads[i]
            if type_ == OK:
                emit(t, th[0], OK, "enqueue", names[q], v, MessageId(*acked_at[v]))
            else:
                emit(t, th[0], type_, "enqueue", names[q], v, None,
                     "Timeout: send timed out" if type_ == INFO else "ProducerQueueIsFull: full")
                if type_ == INFO:
                    th[0] += producers
            at(t + rng.randrange(0, 2 * MS), "inv-enq", i)
        elif kind == "inv-deq":
            th = cthreads[data]
            q = th[1]
            th[1] = (q + 1) % queues
            emit(t, th[0], INVOKE, "dequeue", names[q])
            at(t + rng.randrange(MS // 2, 2 * MS), "done-deq", (data, q, t + 100 * MS))
        elif kind == "done-deq":
            # as receive: once a message is there (checked every 2 ms), or empty after 100 ms
            j, q, deadline = data
            th = cthreads[j]
            if cursor[q] >= len(logs[q].entries) and not replay[q] and t < deadline:
                at(min(deadline, t + 2 * MS), "done-deq", data)
                continue
            if replay[q]:
                msgs = replay[q].pop()
                for m in msgs:
                    m["redelivery_count"] += 1
            else:
                got = logs[q].entries[cursor[q]:cursor[q] + rng.randrange(1, 9)]
                cursor[q] += len(got)
                msgs = [{"value": v, "message_id": _mid(le, en), "redelivery_count": 0}
                        for (_, v, le, en) in got if v not in skip]
                if msgs and rng.random() < 0.002:               # not acknowledged in time: again later
                    replay[q].append([dict(m) for m in msgs])
            if planted and msgs and len(ops) in range(budget // 2, budget // 2 + 40) and not skip & {-1}:
                skip.add(-1)                                   # once: a duplicate and an unexpected value
                msgs.append(dict(msgs[0]))
                msgs.append({"value": -7, "message_id": _mid(1, 1), "redelivery_count": 0})
            if msgs:
                emit(t, th[0], OK, "dequeue", names[q], msgs)
            else:
                emit(t, th[0], FAIL, "dequeue", names[q], None, None, "Timeout: no message within 100 ms")
            at(t + rng.randrange(0, MS), "inv-deq", j)
    t_end = ops[-1].time_ns + 10_000 * MS
    for qi in range(queues):
        entries = logs[qi].entries[cursor[qi]:]
        msgs = [m for batch in replay[qi] for m in batch]
        msgs += [{"value": v, "message_id": _mid(le, en), "redelivery_count": 0}
                 for (_, v, le, en) in entries if v not in skip]
        emit(t_end, FINAL_READ_PROCESS + qi, INVOKE, "drain", names[qi])
        t_end += 200 * MS
        if msgs:
            emit(t_end, FINAL_READ_PROCESS + qi, OK, "drain", names[qi], msgs)
        else:
            emit(t_end, FINAL_READ_PROCESS + qi, FAIL, "drain", names[qi], None, None, "empty")
    return ops


# ------------------------------------------------------------------------------------ the runs

def _child(checker: str, n_ops: int, seed: int, planted: bool, profile: bool,
           extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """In a fresh process: generate the history, run one checker once, report time and memory."""
    import gc
    h = gen_queue(n_ops, seed, planted=planted) if checker == "queue" else gen_log(n_ops, seed, planted=planted)
    gc.collect()
    rss_history = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if checker == "log":
        from checkers.log import check
        opts: dict[str, Any] = {}
    elif checker == "queue":
        from checkers.queue import check
        opts = {}
    else:
        from checkers.elle import check
        opts = {}
    opts.update(extra or {})
    if profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
    w0, c0 = time.perf_counter(), time.process_time()
    r = check(h, opts)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if profile:
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    json.dumps(r.to_json())                  # the result must serialise (not timed)
    return {"checker": checker, "planted": planted, "ops": len(h), "valid": r.valid,
            "anomalies": r.stats.get("anomaly_counts", {}), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "rss_history_mib": round(rss_history / 2**20), "peak_rss_mib": round(peak / 2**20)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=1_000_000, help="ops per history")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default="log,queue,elle", help="comma list of checkers")
    ap.add_argument("--planted", action="store_true", help="only the histories with planted anomalies")
    ap.add_argument("--clean", action="store_true", help="only the clean histories")
    ap.add_argument("--profile", metavar="CHECKER", help="cProfile one check (to stderr), planted history")
    ap.add_argument("--opts", default="{}", help="checker opts as JSON, e.g. '{\"rw_from\": [\"read\", \"receive\"]}'")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        extra = json.loads(args.opts)
    except ValueError as e:
        ap.error(f"--opts is not JSON ({e}); fix: quote it, e.g. --opts '{{\"max_anomalies\": 10}}'")
    if args.child:
        print(json.dumps(_child(args.child, args.ops, args.seed, args.planted, False, extra)))
        return 0
    if args.profile:
        print(json.dumps(_child(args.profile, args.ops, args.seed, True, True, extra)))
        return 0
    variants = [False, True]
    if args.planted:
        variants = [True]
    elif args.clean:
        variants = [False]
    rows = []
    for name in [x.strip() for x in args.only.split(",") if x.strip()]:
        for planted in variants:
            cmd = [sys.executable, "-m", "bench.checkers", "--child", name, "--ops", str(args.ops),
                   "--seed", str(args.seed), "--opts", args.opts] + (["--planted"] if planted else [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"{name}: the child failed:\n{out.stderr}", file=sys.stderr)
                return 1
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'checker':<7} {'history':<8} {'ops':>9} {'wall s':>7} {'cpu s':>6} {'history MiB':>11} "
          f"{'peak MiB':>8}  verdict, anomalies")
    for r in rows:
        print(f"{r['checker']:<7} {'planted' if r['planted'] else 'clean':<8} {r['ops']:>9,} {r['wall_s']:>7} "
              f"{r['cpu_s']:>6} {r['rss_history_mib']:>11} {r['peak_rss_mib']:>8}  {r['valid']}, {r['anomalies']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    ok = all(r["wall_s"] < 10 and r["peak_rss_mib"] < 2048 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
