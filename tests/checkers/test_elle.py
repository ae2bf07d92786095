"""The Elle-style cycle checker on hand-made log histories: each cycle type with and without it."""
from __future__ import annotations

import json

import pytest

from checkers import REGISTRY
from checkers.elle import ANOMALY_TYPES, PROC, RT_IN, RW, WR, WW, _Graph, check
from core.history import MessageId, Op

MS = 1_000_000


class E:
    """Ops with explicit times (ms); `ops()` sorts them by time (stable) and numbers them."""

    def __init__(self):
        self._ops: list[tuple[float, int, Op]] = []
        self.entry: dict[str, int] = {}

    def _add(self, t: float, op: Op) -> Op:
        op.time_ns = int(t * MS)
        self._ops.append((t, len(self._ops), op))
        return op

    def send(self, p, v, t0, t1, topic="t", type="ok", entry=None) -> Op:
        self._add(t0, Op(process=p, type="invoke", f="send", key=topic, value=v))
        mid = None
        if type == "ok":
            e = self.entry.get(topic, 0) if entry is None else entry
            self.entry[topic] = e + 1
            mid = MessageId(1, e)
        return self._add(t1, Op(process=p, type=type, f="send", key=topic, value=v, message_id=mid,
                                node="broker-1"))

    def recv(self, p, values, t0, t1, topic="t", f="receive", partition=-1) -> Op:
        self._add(t0, Op(process=p, type="invoke", f=f, key=topic))
        msgs = [{"value": v, "message_id": {"ledger_id": 1, "entry_id": i, "partition": partition,
                                            "batch_index": -1}, "redelivery_count": 0}
                for i, v in enumerate(values)]
        return self._add(t1, Op(process=p, type="ok", f=f, key=topic, value=msgs))

    def read(self, values, t0, t1, topic="t", p=1_000_000, parts=None) -> Op:
        """A Reader's read (f "read"); parts: the partition of each value."""
        self._add(t0, Op(process=p, type="invoke", f="read", key=topic))
        msgs = [{"value": v, "message_id": {"ledger_id": 1, "entry_id": i,
                                            "partition": parts[i] if parts else -1, "batch_index": -1}}
                for i, v in enumerate(values)]
        return self._add(t1, Op(process=p, type="ok", f="read", key=topic, value=msgs))

    def ops(self) -> list[Op]:
        out = [op for _, _, op in sorted(self._ops, key=lambda x: (x[0], x[1]))]
        for i, op in enumerate(out):
            op.index = i
        return out


def types(r) -> set[str]:
    return set(r.anomalies)


def kinds_of(cycle: dict) -> list[str]:
    return [s["kind"] for s in cycle["steps"]]


def test_registered_and_clean_history_with_exact_edges():
    assert REGISTRY["elle"].check is check
    h = E()
    h.send(0, 1, 0, 1)
    h.send(0, 2, 2, 3)
    h.send(1, 3, 4, 5)
    h.recv(5, [1, 2], 6, 7)
    h.recv(5, [3], 8, 9)
    h.read([1, 2, 3], 20, 21)
    r = check(h.ops())
    assert r.valid is True and r.anomalies == {}
    s = r.stats
    assert s["nodes"] == {"ops": 6, "time": 6, "sends": 3, "reads": 3}
    # ww 1->2->3; wr 1,2 -> first receive (3 -> the second receive and the final read are left
    # out: both ended after the last send began and lead only to later ops, so they are on no
    # cycle; the first receive leads on to the second through its process); process: the two
    # sends of p0 and the two receives of p5; realtime: one time node per completion here (each
    # is followed by an invocation), chained; every op after the first invoked after some completion
    assert s["edges"] == {"ww": 2, "wr": 2, "rw": 0, "process": 2,
                          "realtime": {"to_time": 6, "chain": 5, "from_time": 5}}
    assert s["log_order"] == {"t": "final-read"} and s["components"] == 0
    assert s["invalid_types"] == sorted(ANOMALY_TYPES)


def test_g0_realtime_acknowledged_order_reversed():
    h = E()
    a = h.send(0, 1, 0, 1)
    h.send(2, 9, 1.5, 2.5, topic="other")          # an unrelated op: the realtime edge spans 2 time nodes
    b = h.send(1, 2, 3, 4)                          # invoked after 1 was acknowledged
    h.read([9], 10, 11, topic="other", p=1_000_001)
    h.read([2, 1], 10, 11)                          # ... yet before it in the log
    r = check(h.ops())
    assert r.valid is False
    assert types(r) == {"G0-realtime"}
    [c] = r.anomalies["G0-realtime"]
    assert {o["op"]["index"] for o in c["ops"]} == {a.index, b.index}
    assert sorted(kinds_of(c)) == ["realtime", "ww"]
    step = {s["kind"]: s for s in c["steps"]}
    assert "completed at 0.001000 s, before send was invoked at 0.003000 s" in step["realtime"]["why"]
    assert "2 precedes 1 in the log of t (positions 0 and 1)" == step["ww"]["why"]
    assert c["explanation"].startswith("T0 -") and "a cycle where T0 = send" in c["explanation"]
    json.dumps(r.to_json())
    # concurrent sends may land in either order
    h2 = E()
    h2.send(0, 1, 0, 1)
    h2.send(1, 2, 0.5, 4)
    h2.read([2, 1], 10, 11)
    assert check(h2.ops()).valid is True


def test_an_info_send_may_take_effect_any_time_after_its_invocation():
    h = E()
    h.send(0, 1, 0, 1, type="info")                 # indeterminate: no realtime edge out of it
    h.send(1, 2, 3, 4)
    h.read([2, 1], 10, 11)
    r = check(h.ops())
    assert r.valid is True and r.anomalies == {}
    assert r.stats["nodes"]["sends"] == 2


def test_g0_process_a_producer_reordered():
    h = E()
    h.send(0, 1, 0, 1)
    h.send(0, 2, 2, 3)
    h.read([2, 1], 10, 11)
    r = check(h.ops())
    assert types(r) == {"G0-process"}              # the realtime cycle on the same ops is not repeated
    [c] = r.anomalies["G0-process"]
    assert sorted(kinds_of(c)) == ["process", "ww"]
    assert r.stats["components"] == 1 and r.stats["largest_component_ops"] == 2
    h2 = E()
    h2.send(0, 1, 0, 1)
    h2.send(0, 2, 2, 3)
    h2.read([1, 2], 10, 11)
    assert check(h2.ops()).valid is True


def test_g1c_realtime_a_write_into_the_past():
    h = E()
    x = h.send(0, 1, 0, 10)                         # acknowledged late
    rcv = h.recv(5, [1], 2, 3)                      # but a consumer had it at 3
    y = h.send(1, 2, 4, 5)                          # sent after that
    h.read([2, 1], 20, 21)                          # and placed before it
    r = check(h.ops())
    assert r.valid is False and types(r) == {"G1c-realtime"}
    [c] = r.anomalies["G1c-realtime"]
    assert {o["op"]["index"] for o in c["ops"]} == {x.index, rcv.index, y.index}
    assert sorted(kinds_of(c)) == ["realtime", "wr", "ww"]
    by_kind = {s["kind"]: s for s in c["steps"]}
    assert by_kind["wr"]["why"] == "the receive returned 1, which the send wrote"
    rec = next(o for o in c["ops"] if o["op"]["f"] == "receive")
    assert rec["values"] == [1] and rec["messages"] == 1
    # the receive ending after the second send began: no order is violated
    h2 = E()
    h2.send(0, 1, 0, 10)
    h2.recv(5, [1], 2, 4.5)
    h2.send(1, 2, 4, 5)
    h2.read([2, 1], 20, 21)
    assert check(h2.ops()).valid is True


def test_g1c_process_a_consumer_that_then_sends():
    h = E()
    h.send(0, 1, 0, 10)
    h.recv(7, [1], 2, 3)
    h.send(7, 2, 4, 5, topic="t")                   # the same process sends after receiving 1
    h.read([2, 1], 20, 21)
    r = check(h.ops())
    assert types(r) == {"G1c-process"}
    assert sorted(kinds_of(r.anomalies["G1c-process"][0])) == ["process", "wr", "ww"]
    h2 = E()
    h2.send(0, 1, 0, 10)
    h2.recv(7, [1], 2, 3)
    h2.send(7, 2, 4, 5)
    h2.read([1, 2], 20, 21)
    assert check(h2.ops()).valid is True


def test_g_single_realtime_a_stale_reader():
    h = E()
    h.send(0, 1, 0, 1)
    b = h.send(0, 2, 2, 3)
    stale = h.read([1], 4, 5, p=9)                  # a Reader to the end, after 2 was acknowledged
    h.read([1, 2], 20, 21)
    r = check(h.ops())
    assert types(r) == {"G-single-realtime"}
    [c] = r.anomalies["G-single-realtime"]
    assert {o["op"]["index"] for o in c["ops"]} == {b.index, stale.index}
    assert sorted(kinds_of(c)) == ["realtime", "rw"]
    assert r.stats["edges"]["rw"] == 1
    assert "read t up to a value before 2 and did not see it" in {s["kind"]: s for s in c["steps"]}["rw"]["why"]
    # rw edges come only from opts["rw_from"]: without them there is nothing to see
    assert check(h.ops(), {"rw_from": ()}).valid is True
    # a Reader that began before 2 was acknowledged may miss it
    h2 = E()
    h2.send(0, 1, 0, 1)
    h2.send(0, 2, 2, 3)
    h2.read([1], 2.5, 5, p=9)
    h2.read([1, 2], 20, 21)
    assert check(h2.ops()).valid is True


def test_consumer_lag_is_no_anomaly_unless_receives_give_rw_edges():
    h = E()
    h.send(0, 1, 0, 1)
    h.send(0, 2, 2, 3)
    h.recv(5, [1], 4, 5)                            # a consumer behind the head of the log
    h.read([1, 2], 20, 21)
    assert check(h.ops()).valid is True
    r = check(h.ops(), {"rw_from": ("read", "receive")})      # Jepsen's Kafka reading
    assert types(r) == {"G-single-realtime"}


def test_g_single_process_non_monotonic_reads():
    h = E()
    h.send(0, 1, 0, 1)
    h.send(0, 2, 2, 100)                            # visible at 5, acknowledged only at 100
    h.read([1, 2], 4, 5, p=9)
    h.read([1], 6, 7, p=9)                          # the same Reader process then misses 2
    h.read([1, 2], 200, 201)
    r = check(h.ops())
    assert types(r) == {"G-single-process"}
    assert sorted(kinds_of(r.anomalies["G-single-process"][0])) == ["process", "rw", "wr"]
    h2 = E()
    h2.send(0, 1, 0, 1)
    h2.send(0, 2, 2, 100)
    h2.read([1], 4, 5, p=9)                         # the other way round is fine
    h2.read([1, 2], 6, 7, p=9)
    h2.read([1, 2], 200, 201)
    assert check(h2.ops()).valid is True


def write_skew(r1_sees_b1: bool) -> list[Op]:
    """P writes b2 to u then reads t; Q writes b1 to t then reads u; each read misses the other's write."""
    h = E()
    h.send(0, 1, 0, 1, topic="t")
    h.send(0, 2, 0, 1, topic="u")
    h.send(5, 12, 2, 3, topic="u")                  # P: b2
    h.send(6, 11, 2, 3, topic="t")                  # Q: b1
    h.read([1, 11] if r1_sees_b1 else [1], 4, 5, topic="t", p=5)
    h.read([2], 4, 5, topic="u", p=6)
    h.read([1, 11], 20, 21, topic="t", p=1_000_000)
    h.read([2, 12], 20, 21, topic="u", p=1_000_001)
    return h.ops()


def test_g2_process_write_skew():
    r = check(write_skew(False), {"realtime": False})
    assert types(r) == {"G2-process"}
    [c] = r.anomalies["G2-process"]
    assert sorted(kinds_of(c)) == ["process", "process", "rw", "rw"]
    assert check(write_skew(True), {"realtime": False}).valid is True


def test_g2_across_partitions_of_one_topic():
    # partition 0: 1, 2; partition 1: 3, 4. Reader A saw p0 up to 2 but p1 only up to 3; Reader B the
    # reverse: no single state of the topic is what both saw (a partitioned topic promises no such state)
    h = E()
    for v, part in ((1, 0), (2, 0), (3, 1), (4, 1)):
        h.send(0, v, v, v + 0.5)
    h.read([1, 2, 3], 10, 11, p=9, parts=[0, 0, 1])
    h.read([1, 3, 4], 10, 11, p=10, parts=[0, 1, 1])
    h.read([1, 2, 3, 4], 20, 21, parts=[0, 0, 1, 1])
    ops = h.ops()
    for op in ops:                                  # the sends' acks name their partitions too
        if op.f == "send" and op.type == "ok":
            op.message_id = MessageId(1, op.value, 0 if op.value <= 2 else 1)
    r = check(ops, {"realtime": False, "process": False})
    assert types(r) == {"G2"}
    assert sorted(kinds_of(r.anomalies["G2"][0])) == ["rw", "rw", "wr", "wr"]
    assert r.stats["log_order"] == {"t": "final-read"}
    h2 = E()
    for v in (1, 2, 3, 4):
        h2.send(0, v, v, v + 0.5)
    h2.read([1, 2, 3], 10, 11, p=9, parts=[0, 0, 1])
    h2.read([1, 2, 3, 4], 10, 11, p=10, parts=[0, 0, 1, 1])
    h2.read([1, 2, 3, 4], 20, 21, parts=[0, 0, 1, 1])
    assert check(h2.ops(), {"realtime": False, "process": False}).valid is True


def test_without_a_final_read_the_acknowledged_positions_order_the_log():
    h = E()
    h.send(0, 1, 0, 1, entry=5)
    h.send(1, 2, 2, 3, entry=4)                     # acknowledged later at a lower position
    r = check(h.ops())
    assert r.stats["log_order"] == {"t": "positions"}
    assert types(r) == {"G0-realtime"}


@pytest.mark.parametrize("model,valid", [("strict-serializable", False), ("serializable", True),
                                         ("strong-session-serializable", True), ("read-committed", True)])
def test_models_choose_what_invalidates(model, valid):
    h = E()
    h.send(0, 1, 0, 1)
    h.send(1, 2, 3, 4)
    h.read([2, 1], 10, 11)
    r = check(h.ops(), {"model": model})
    assert r.valid is valid and "G0-realtime" in r.anomalies


def test_explicit_invalid_and_unknown_model():
    h = E()
    h.send(0, 1, 0, 1)
    h.send(1, 2, 3, 4)
    h.read([2, 1], 10, 11)
    assert check(h.ops(), {"invalid": ("G1c-realtime",)}).valid is True
    with pytest.raises(ValueError, match="unknown model 'linearizable'; fix: use one of read-uncommitted"):
        check(h.ops(), {"model": "linearizable"})


def test_classification_table():
    # G0, G1c and G-single without process or realtime edges cannot come out of single-op
    # transactions over one log order (see the module docstring); the table still names them
    c = _Graph._classify
    assert c([(0, 1, WW), (1, 0, WW)]) == "G0"
    assert c([(0, 1, WW), (1, 2, WR), (2, 0, WW)]) == "G1c"
    assert c([(0, 1, RW), (1, 2, WR), (2, 0, WW)]) == "G-single"
    assert c([(0, 1, RW), (1, 0, RW)]) == "G2"
    assert c([(0, 1, WW), (1, 0, PROC)]) == "G0-process"
    assert c([(0, 1, WR), (1, 0, PROC)]) == "G1c-process"
    assert c([(0, 1, RW), (1, 0, RT_IN)]) == "G-single-realtime"
    assert c([(0, 1, RW), (1, 2, PROC), (2, 0, RT_IN)]) == "G-single-realtime"
    assert c([(0, 1, RW), (1, 2, RW), (2, 0, PROC)]) == "G2-process"
    assert c([(0, 1, RW), (1, 2, RT_IN), (2, 3, RW), (3, 0, WR)]) == "G2-realtime"
    assert c([(0, 1, WW), (1, 2, PROC), (2, 0, RT_IN)]) == "G0-realtime"


def test_many_components_and_evidence_cap():
    h = E()
    for k in range(5):                              # five independent reversed pairs on five topics
        t = f"t{k}"
        h.send(2 * k, 1, 10 * k, 10 * k + 1, topic=t)
        h.send(2 * k + 1, 2, 10 * k + 2, 10 * k + 3, topic=t)
        h.read([2, 1], 100, 101, topic=t, p=1_000_000 + k)
    r = check(h.ops(), {"max_anomalies": 2})
    assert r.stats["components"] == 5
    assert r.stats["anomaly_counts"] == {"G0-realtime": 5}
    assert len(r.anomalies["G0-realtime"]) == 2 and r.stats["anomalies_truncated"] == {"G0-realtime": 5}


def test_a_spent_search_budget_still_reports_a_cycle_per_component():
    h = E()
    h.send(0, 1, 0, 1)
    h.send(1, 2, 3, 4)
    h.read([2, 1], 10, 11)
    r = check(h.ops(), {"search_budget": 1})
    assert r.valid is False and r.stats["searches_cut_short"] == 1
    assert set(r.anomalies) == {"G0-realtime"}                  # found by the fallback, then classified
