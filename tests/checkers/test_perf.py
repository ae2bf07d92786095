"""The perf checker on hand-made histories: fault states, per-state counts/latency/throughput,
availability windows, time to recover, the optional unavailability bound."""
from __future__ import annotations

import json
import random

import pytest

from checkers import REGISTRY
from checkers.perf import check
from core.history import Op

S = 1_000_000_000


class H:
    """A history builder; times in seconds; `ops` is the history in time order (ties: call order)."""

    def __init__(self):
        self._ops: list[Op] = []

    def add(self, op: Op, at: float) -> Op:
        op.time_ns = round(at * S)
        self._ops.append(op)
        return op

    @property
    def ops(self) -> list[Op]:
        out = sorted(self._ops, key=lambda o: o.time_ns)
        for i, o in enumerate(out):
            o.index = i
        return out

    def op(self, p, f, start, end, type="ok", key="t", value=None):
        self.add(Op(process=p, type="invoke", f=f, key=key, value=value), start)
        if end is not None:
            self.add(Op(process=p, type=type, f=f, key=key, value=value), end)

    def nemesis(self, f, at, type="ok", value=None):
        self.add(Op(process=-1, type="invoke", f=f, value=value), at)
        self.add(Op(process=-1, type=type, f=f, value=value), at)


def rows(r) -> dict[tuple[str, str], dict]:
    return {(x["state"], x["f"]): x for x in r.stats["by_state"]}


def test_registered():
    assert REGISTRY["perf"].check is check


def test_healthy_only_counts_latency_and_throughput():
    h = H()
    for i in range(100):                       # latencies 1..100 ms, one op every 0.1 s
        h.op(i % 3, "send", i * 0.1, i * 0.1 + (i + 1) / 1000)
    h.op(5, "send", 1.0, 1.5, type="fail")
    h.op(6, "send", 2.0, 2.5, type="info")
    h.op(7, "receive", 3.0, 3.002)
    h.op(8, "send", 9.0, None)                 # never completed
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}
    st = rows(r)
    s = st[("healthy", "send")]
    assert (s["ok"], s["fail"], s["info"], s["unfinished"]) == (100, 1, 1, 1)
    assert (s["p50_ms"], s["p90_ms"], s["p99_ms"], s["max_ms"]) == (50.0, 90.0, 99.0, 100.0)
    assert s["time_s"] == pytest.approx(10.0, abs=0.01)       # window 0 .. 9.999 s
    assert s["ok_per_s"] == pytest.approx(10.0, rel=0.01)
    assert st[("healthy", "receive")]["ok"] == 1
    assert r.stats["states"]["healthy"]["ok"] == 101
    assert set(r.stats["tables"]) == {"by_state", "availability", "recovery"}
    json.dumps(r.to_json())


def test_ops_belong_to_the_state_at_their_invocation():
    h = H()
    h.op(0, "send", 1.0, 12.0)                 # invoked healthy, completes during the kill
    h.nemesis("start-kill", 10.0)
    h.op(1, "send", 11.0, 11.5)
    h.op(2, "send", 19.0, 21.0)                # invoked during, completes after
    h.nemesis("stop-kill", 20.0)
    h.op(3, "send", 20.0, 20.1)                # invoked at the instant of the stop's ok, after it
    h.op(4, "send", 29.0, 30.0)
    r = check(h.ops)
    st = rows(r)
    assert st[("healthy", "send")]["ok"] == 3 and st[("kill", "send")]["ok"] == 2
    assert st[("kill", "send")]["time_s"] == pytest.approx(10.0)
    assert st[("healthy", "send")]["time_s"] == pytest.approx(19.0)          # 1..10 and 20..30
    assert st[("kill", "send")]["max_ms"] == pytest.approx(2000.0)
    assert st[("kill", "send")]["ok_per_s"] == pytest.approx(0.2)
    assert r.stats["timeline"] == [[None, "healthy"], [10.0, "kill"], [20.0, "healthy"]]


def test_overlapping_faults_form_combined_states():
    h = H()
    h.op(0, "send", 0.0, 0.1)
    h.nemesis("start-partition", 10.0)
    h.nemesis("start-kill", 15.0)
    h.op(0, "send", 16.0, 16.1)
    h.nemesis("stop-partition", 20.0)
    h.op(0, "send", 21.0, 21.1)
    h.nemesis("stop-kill", 25.0)
    h.op(0, "send", 29.0, 30.0)
    r = check(h.ops)
    t = {k: v["time_s"] for k, v in r.stats["states"].items()}
    assert t == pytest.approx({"healthy": 15.0, "partition": 5.0, "kill+partition": 5.0, "kill": 5.0})
    st = rows(r)
    assert st[("kill+partition", "send")]["ok"] == 1 and st[("kill", "send")]["ok"] == 1
    assert r.stats["states"]["partition"]["ok"] == 0 and r.stats["states"]["partition"]["ok_per_s"] == 0.0


def test_failed_start_failed_stop_heal_and_info_start():
    h = H()
    h.op(0, "send", 0.0, 0.1)
    h.nemesis("start-pause", 2.0, type="fail")       # never started
    h.nemesis("start-kill", 4.0)
    h.nemesis("stop-kill", 6.0, type="fail")         # still on
    h.nemesis("start-partition", 7.0, type="info")   # may be on: counted as on
    h.nemesis("heal", 9.0)                           # everything off
    h.op(0, "send", 9.5, 10.0)
    r = check(h.ops)
    assert r.stats["timeline"] == [[None, "healthy"], [4.0, "kill"], [7.0, "kill+partition"],
                                   [9.0, "healthy"]]
    f = r.stats["faults"]
    assert [(x["fault"], x["start_s"], x["stop_s"]) for x in f] == [("kill", 4.0, 9.0),
                                                                     ("partition", 7.0, 9.0)]


def test_availability_longest_window_and_its_states():
    h = H()
    for i, t in enumerate([1.0, 2.0, 3.0, 10.0, 11.0, 12.0]):
        h.op(0, "send", t - 0.01, t, key="a")
    h.op(1, "send", 4.0, 9.0, type="info", key="a")  # attempted during the outage
    h.nemesis("start-partition", 5.0)
    h.nemesis("stop-partition", 8.0)
    h.op(2, "send", 0.5, 0.6, key="b")
    h.op(2, "send", 11.0, 11.2, key="b")            # b: gap 0.6 .. 11.2
    h.op(3, "receive", 6.0, 6.1, key="a")           # not a write: does not make a available
    r = check(h.ops)
    av = {x["topic"]: x for x in r.stats["availability"]}
    a = av["a"]
    assert (a["longest_unavailable_s"], a["from_s"], a["to_s"]) == (7.0, 3.0, 10.0)
    assert a["states"] == {"healthy": 4.0, "partition": 3.0}
    assert a["ok_writes"] == 6 and a["edge"] is None
    assert av["b"]["longest_unavailable_s"] == pytest.approx(10.6)
    assert r.valid is True                        # no bound set


def test_availability_edges_count():
    h = H()
    h.op(0, "send", 0.0, 0.1)
    h.op(0, "send", 1.0, 1.1)
    for i in range(5):
        h.op(0, "send", 2.0 + i, 2.5 + i, type="fail")   # writes keep failing until 6.5
    r = check(h.ops)
    [a] = r.stats["availability"]
    assert (a["from_s"], a["to_s"], a["edge"]) == (1.1, 6.5, "end")
    h2 = H()
    h2.op(0, "send", 0.0, 3.0, type="fail")
    h2.op(0, "send", 3.0, 3.5)
    h2.op(0, "send", 4.0, 4.1)
    [b] = check(h2.ops).stats["availability"]
    assert (b["from_s"], b["to_s"], b["edge"]) == (0.0, 3.5, "start")
    h3 = H()
    h3.op(0, "send", 0.0, 3.0, type="fail")        # never available
    [c] = check(h3.ops).stats["availability"]
    assert c["ok_writes"] == 0 and c["longest_unavailable_s"] == 3.0


def test_time_to_recover_after_each_stop():
    h = H()
    h.op(0, "send", 0.0, 0.1, key="a")
    h.op(1, "send", 0.0, 0.1, key="b")
    h.nemesis("start-kill", 1.0)
    h.nemesis("stop-kill", 4.0)
    h.op(0, "send", 3.5, 4.5, key="a")            # invoked before the stop, ok 0.5 s after it
    h.op(1, "send", 4.2, 6.0, type="fail", key="b")
    h.op(1, "send", 6.0, 7.0, key="b")            # b recovers 3 s after
    h.nemesis("start-pause", 8.0)
    h.op(0, "send", 8.5, 9.0, type="info", key="a")
    h.op(2, "send", 8.5, 9.5, type="fail", key="b")
    h.nemesis("stop-pause", 9.0)                  # nothing acked after it
    h.nemesis("start-partition", 9.8)             # never stopped
    h.op(3, "send", 9.9, 10.0, type="fail", key="a")
    r = check(h.ops)
    rec = {(x["n"], x["topic"]): x["recovery_s"] for x in r.stats["recovery"]}
    assert rec == {(1, "a"): 0.5, (1, "b"): 3.0, (2, "a"): None, (2, "b"): None}
    f = r.stats["faults"]
    assert (f[0]["fault"], f[0]["max_recovery_s"], f[0]["not_recovered"]) == ("kill", 3.0, [])
    assert f[1]["not_recovered"] == ["a", "b"]
    assert f[2]["stop_s"] is None and f[2]["max_recovery_s"] is None


def test_max_unavailable_is_an_anomaly_only_when_exceeded():
    def hist():
        h = H()
        h.op(0, "send", 0.0, 1.0)
        h.nemesis("start-kill", 1.5)
        h.op(0, "send", 1.0, 4.0, type="info")
        h.op(1, "send", 4.0, 5.0)                 # gap 1 .. 5 s
        h.nemesis("stop-kill", 4.5)
        h.op(1, "send", 5.0, 5.5)
        return h.ops
    assert check(hist(), {"max_unavailable_s": 4.0}).valid is True     # exactly the bound: fine
    r = check(hist(), {"max_unavailable_s": 3.5})
    assert r.valid is False
    [e] = r.anomalies["unavailable"]
    assert (e["topic"], e["start_s"], e["end_s"], e["duration_s"]) == ("t", 1.0, 5.0, 4.0)
    assert e["states"] == {"healthy": 1.0, "kill": 3.0}
    assert e["last_ok_before"]["time_ns"] == 1 * S and e["first_ok_after"]["time_ns"] == 5 * S
    assert r.stats["anomaly_counts"] == {"unavailable": 1}
    json.dumps(r.to_json())


def test_final_reads_are_left_out_and_write_fs_is_configurable():
    h = H()
    h.op(0, "put", 0.0, 0.1, key="k")
    h.op(0, "get", 0.2, 0.3, key="k")
    h.op(0, "put", 5.0, 5.1, key="k")
    h.op(1_000_000, "read", 20.0, 21.0, key="k")      # after the workload
    r = check(h.ops)
    assert r.stats["window_s"] == [0.0, 5.1]
    assert r.stats["history"]["final_ops_excluded"] == 2
    assert [a["topic"] for a in r.stats["availability"]] == ["k"]
    r2 = check(h.ops, {"write_fs": ["get"]})
    [a] = r2.stats["availability"]
    assert a["ok_writes"] == 1 and a["window_s"] == [0.2, 0.3]


def test_unsorted_history_is_sorted_once():
    h = H()
    h.nemesis("start-kill", 2.0)
    h.op(0, "send", 2.5, 2.6)
    h.nemesis("stop-kill", 3.0)
    h.op(0, "send", 3.5, 3.6)
    ops = h.ops
    shuffled = ops[:]
    random.Random(1).shuffle(shuffled)
    assert check(shuffled).stats["by_state"] == check(ops).stats["by_state"]
    assert rows(check(shuffled))[("kill", "send")]["ok"] == 1


def test_empty_history():
    r = check([])
    assert r.valid is True and r.stats["by_state"] == [] and r.stats["availability"] == []
