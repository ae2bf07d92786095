"""The queue checker on hand-made histories: each anomaly with and without it, stats, vocabularies."""
from __future__ import annotations

import json

import pytest

from checkers import REGISTRY
from checkers.queue import check
from core.history import MessageId, Op

MS = 1_000_000


class Q:
    """A queue history builder: each op gets the next index and a time 1 ms after the previous one."""

    def __init__(self, enqueue="enqueue", dequeue="dequeue", drain="drain"):
        self.ops: list[Op] = []
        self.fs = {"enqueue": enqueue, "dequeue": dequeue, "drain": drain}
        self.entry = 0
        self.acked_at: dict = {}          # value -> the entry its ok enqueue was acknowledged at

    def add(self, op: Op) -> Op:
        op.time_ns = (len(self.ops) + 1) * MS
        op.index = len(self.ops)
        self.ops.append(op)
        return op

    def enqueue(self, p, value, type="ok", q="q", entry=None) -> Op:
        f = self.fs["enqueue"]
        self.add(Op(process=p, type="invoke", f=f, key=q, value=value))
        mid = None
        if type == "ok":
            mid = MessageId(7, self.entry if entry is None else entry)
            self.acked_at.setdefault(value, mid.entry_id)
            self.entry += 1
        return self.add(Op(process=p, type=type, f=f, key=q, value=value, message_id=mid,
                           error="" if type == "ok" else "Timeout"))

    def dequeue(self, p, values, q="q", type="ok", f=None, error="") -> Op:
        """values: ints (at the entry their enqueue was acknowledged at, else entry = value), or
        (value, entry[, redelivery[, subscription]]) tuples."""
        f = f or self.fs["dequeue"]
        self.add(Op(process=p, type="invoke", f=f, key=q))
        msgs = None
        if values is not None:
            msgs = []
            for x in values:
                x = x if isinstance(x, tuple) else (x, self.acked_at.get(x, x))
                m = {"value": x[0], "message_id": {"ledger_id": 7, "entry_id": x[1], "partition": -1,
                                                   "batch_index": -1},
                     "redelivery_count": x[2] if len(x) > 2 else 0}
                if len(x) > 3:
                    m["subscription"] = x[3]
                msgs.append(m)
        return self.add(Op(process=p, type=type, f=f, key=q, value=msgs, error=error))

    def drain(self, values, q="q", type="ok", error=""):
        return self.dequeue(1_000_000, values, q, type, f=self.fs["drain"], error=error)


def clean() -> Q:
    h = Q()
    for v in range(4):
        h.enqueue(v % 2, v)
    h.dequeue(5, [0, 1])
    h.dequeue(6, [2])
    h.drain([3])
    return h


def test_registered():
    assert REGISTRY["queue"].check is check


def test_clean_queue_is_valid_with_exact_stats():
    r = check(clean().ops)
    assert r.valid is True and r.anomalies == {}
    s = r.stats
    assert (s["attempted"], s["acknowledged"], s["lost"], s["recovered"]) == (4, 4, 0, 0)
    assert s["delivery_counts"] == {"1": 4}
    assert s["exactly_once_ratio"] == 1.0
    assert s["queues"]["q"]["drain"] == "drained" and s["incomplete_queues"] == []
    json.dumps(r.to_json())


def test_lost():
    h = Q()
    h.enqueue(0, 1)
    inv_ok = h.enqueue(0, 2)
    h.dequeue(5, [1])
    h.drain([], type="fail", error="empty")        # nothing left
    r = check(h.ops)
    assert r.valid is False
    [a] = r.anomalies["lost"]
    assert a["value"] == 2 and a["queue"] == "q" and a["drain"] == "drained"
    assert a["enqueue"]["completion"]["index"] == inv_ok.index and a["enqueue"]["outcome"] == "ok"
    assert a["enqueue"]["message_id"]["entry_id"] == 1
    assert r.stats["lost"] == 1 and r.stats["delivery_counts"] == {"0": 1, "1": 1}
    assert r.stats["exactly_once_ratio"] == 0.5
    # the close history where the drain got it
    h2 = Q()
    h2.enqueue(0, 1)
    h2.enqueue(0, 2)
    h2.dequeue(5, [1])
    h2.drain([2])
    assert check(h2.ops).valid is True


def test_lost_needs_a_completed_drain():
    h = Q()
    h.enqueue(0, 1)
    h.drain([], type="info")                     # cut short
    r = check(h.ops)
    assert r.valid == "unknown" and "lost" not in r.anomalies
    assert r.stats["incomplete_queues"] == ["q"] and r.stats["queues"]["q"]["drain"] == "incomplete"
    h2 = Q()
    h2.enqueue(0, 1)
    h2.drain([], type="fail", error="subscribe: ConnectError")   # failed, not empty
    assert check(h2.ops).valid == "unknown"
    h3 = Q()
    h3.enqueue(0, 1)                             # no drain at all
    assert check(h3.ops).valid == "unknown"


def test_unexpected():
    h = Q()
    h.enqueue(0, 1)
    h.enqueue(0, 2, q="other")
    d = h.dequeue(5, [1, (99, 5), (2, 6)])         # 99 never enqueued; 2 went to another queue
    h.drain([], type="fail", error="empty")
    r = check(h.ops)
    assert r.valid is False
    un = {a["value"]: a for a in r.anomalies["unexpected"]}
    assert set(un) == {99, 2}
    assert un[99]["delivery"]["op"]["index"] == d.index and un[99]["delivery"]["slot"] == 1
    assert un[2]["enqueued_to"] == ["other"]
    h2 = Q()
    h2.enqueue(0, 1)
    h2.enqueue(0, 99, type="info")               # attempted: not unexpected (recovered)
    h2.dequeue(5, [1, (99, 5)])
    h2.drain([], type="fail", error="empty")
    assert "unexpected" not in check(h2.ops).anomalies


def test_duplicated_is_informational_unless_exactly_once():
    h = Q()
    h.enqueue(0, 1)
    h.enqueue(0, 2)
    a = h.dequeue(5, [1, 2])
    b = h.dequeue(6, [(2, 1, 1)])                # redelivered to another consumer
    c = h.dequeue(6, [(2, 1, 0)])                # and again, count 0 (a new owner)
    h.drain([], type="fail", error="empty")
    r = check(h.ops)
    assert r.valid is True
    [d] = r.anomalies["duplicated"]
    assert d["value"] == 2 and d["deliveries"] == 3 and d["attempts"] == 1 and d["redelivered"] == 1
    assert [o["op"]["index"] for o in d["observations"]] == [a.index, b.index, c.index]
    assert r.stats["delivery_counts"] == {"1": 1, "3": 1} and r.stats["exactly_once_ratio"] == 0.5
    assert r.stats["redelivered"] == 1
    r2 = check(h.ops, {"exactly_once": True})
    assert r2.valid is False and "duplicated" in r2.stats["invalid_types"]
    # enqueued twice (a retry with the same value), delivered twice: not duplicated
    h2 = Q()
    h2.enqueue(0, 1, type="info")
    h2.enqueue(1, 1, entry=1)
    h2.dequeue(5, [(1, 0), (1, 1)])
    h2.drain([], type="fail", error="empty")
    r3 = check(h2.ops, {"exactly_once": True})
    assert "duplicated" not in r3.anomalies
    assert [a["value"] for a in r3.anomalies["duplicate"]] == [1]     # but stored twice
    assert r3.valid is True


def test_duplicates_per_subscription():
    h = Q()
    h.enqueue(0, 1)
    h.dequeue(5, [(1, 0, 0, "a")])
    h.dequeue(6, [(1, 0, 0, "b")])               # two subscriptions each get it once
    h.drain([], type="fail", error="empty")
    r = check(h.ops, {"exactly_once": True})
    assert r.valid is True and r.anomalies == {}
    assert r.stats["queues"]["q"]["subscriptions"] == ["a", "b"]
    assert r.stats["delivery_counts"] == {"1": 2}


def test_recovered():
    h = Q()
    h.enqueue(0, 1, type="info")
    h.enqueue(1, 2, type="fail")
    h.enqueue(2, 3, type="info")                 # never arrives
    d = h.dequeue(5, [(1, 0), (2, 1)])
    h.drain([], type="fail", error="empty")
    r = check(h.ops)
    assert r.valid is True
    rec = {a["value"]: a for a in r.anomalies["recovered"]}
    assert set(rec) == {1, 2}
    assert rec[1]["enqueue"]["outcome"] == "info" and rec[2]["enqueue"]["outcome"] == "fail"
    assert rec[1]["delivery"]["op"]["index"] == d.index
    s = r.stats
    assert (s["attempted"], s["acknowledged"], s["failed"], s["indeterminate"], s["recovered"]) == (3, 0, 1, 2, 2)
    assert s["exactly_once_ratio"] is None


def test_duplicate_stored_invalid_with_dedup():
    h = Q()
    h.enqueue(0, 1, entry=0)
    h.dequeue(5, [(1, 0), (1, 3)])               # the same value at entries 0 and 3
    h.drain([], type="fail", error="empty")
    r = check(h.ops)
    assert r.valid is True
    [d] = r.anomalies["duplicate"]
    assert [m["entry_id"] for m in d["message_ids"]] == [0, 3]
    assert d["observations"][0]["source"] == "enqueue"
    assert check(h.ops, {"dedup": True}).valid is False
    h2 = Q()
    h2.enqueue(0, 1, entry=0)
    h2.dequeue(5, [(1, 0), (1, 0, 1)])           # redelivered at the same id: not stored twice
    h2.drain([], type="fail", error="empty")
    assert check(h2.ops, {"dedup": True}).valid is True


def test_a_deduplicated_resend_acknowledged_minus_one_is_no_second_position():
    """A deduplicating broker answers a resend of a stored message with message id (-1, -1): the value
    is stored once (at the position its delivery shows), so no `duplicate`, also with dedup on; the
    same resend stored again (a second real position) is one."""
    def history(resend_at):
        h = Q()
        h.add(Op(process=0, type="invoke", f="enqueue", key="q", value=1))
        h.add(Op(process=0, type="ok", f="enqueue", key="q", value=1, message_id=resend_at))
        h.dequeue(5, [(1, 0)])                    # delivered from where the first attempt stored it
        h.drain([], type="fail", error="empty")
        return h.ops
    ok = check(history(MessageId(-1, -1)), {"dedup": True})
    assert ok.valid is True and "duplicate" not in ok.anomalies
    twice = check(history(MessageId(7, 4)), {"dedup": True})
    assert twice.valid is False and [m["entry_id"] for m in twice.anomalies["duplicate"][0]["message_ids"]] == [4, 0]


def test_log_vocabulary_and_reads_observe_without_consuming():
    h = Q(enqueue="send", dequeue="receive", drain="drain")
    h.enqueue(0, 1)
    h.enqueue(0, 2)
    h.dequeue(5, [1])
    h.add(Op(process=1_000_000, type="invoke", f="read", key="q"))
    h.add(Op(process=1_000_000, type="ok", f="read", key="q",
             value=[{"value": 1, "message_id": None}, {"value": 2, "message_id": None}]))
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}
    assert r.stats["queues"]["q"]["drain"] == "read"
    assert r.stats["delivery_counts"] == {"0": 1, "1": 1}     # the read is no delivery
    r2 = check(h.ops, {"enqueue": ("enqueue",)})              # sends not taken as enqueues
    assert [a["value"] for a in r2.anomalies["unexpected"]] == [1]


def test_single_value_dequeues_and_caps():
    h = Q()
    for v in range(5):
        h.enqueue(0, v)
    for v in range(5):
        h.add(Op(process=5, type="invoke", f="dequeue", key="q"))
        h.add(Op(process=5, type="ok", f="dequeue", key="q", value=v + 100))   # a bare value
    h.drain([], type="fail", error="empty")
    r = check(h.ops, {"max_anomalies": 2})
    assert r.stats["anomaly_counts"] == {"lost": 5, "unexpected": 5}
    assert len(r.anomalies["lost"]) == 2 and r.stats["anomalies_truncated"] == {"lost": 5, "unexpected": 5}


@pytest.mark.parametrize("kind", ["lost", "unexpected", "duplicated", "recovered", "duplicate"])
def test_each_type_serialises(kind):
    h = Q()
    h.enqueue(0, 1)
    h.enqueue(0, 2)
    h.enqueue(0, 3, type="info")
    h.dequeue(5, [1, (1, 9), 3, (77, 8)])
    h.drain([], type="fail", error="empty")
    r = check(h.ops)
    assert kind in r.anomalies
    json.dumps(r.to_json())


def _delayed(q: Q, p: int, value: int, due: int, got: int) -> Op:
    """A dequeue of one delayed message, due at `due` and received at `got` (wall-clock ms)."""
    q.add(Op(process=p, type="invoke", f="dequeue", key="q"))
    m = {"value": value, "message_id": {"ledger_id": 7, "entry_id": q.acked_at.get(value, value),
                                        "partition": -1, "batch_index": -1},
         "redelivery_count": 0, "deliver_at": due, "received_ms": got}
    return q.add(Op(process=p, type="ok", f="dequeue", key="q", value=[m]))


def test_delayed_message_delivered_early_is_invalid_on_time_is_valid():
    """`early`: a delayed message (deliver_at) received before its time; at or after it is fine."""
    q = Q()
    q.enqueue(0, 1)
    q.enqueue(0, 2)
    _delayed(q, 1, 1, due=5000, got=5000)
    _delayed(q, 1, 2, due=5000, got=7000)
    q.drain([], type="fail", error="empty")
    r = check(q.ops)
    assert r.valid is True and r.stats["delayed_deliveries"] == 2 and r.stats["early"] == 0
    q2 = Q()
    q2.enqueue(0, 1)
    _delayed(q2, 1, 1, due=5000, got=4200)
    q2.drain([], type="fail", error="empty")
    r = check(q2.ops)
    assert r.valid is False and r.anomalies["early"][0]["early_ms"] == 800, r.anomalies


def test_delayed_message_never_delivered_is_lost():
    q = Q()
    q.enqueue(0, 1)
    q.enqueue(0, 2)
    _delayed(q, 1, 1, due=5000, got=6000)
    q.drain([], type="fail", error="empty")
    r = check(q.ops)
    assert r.valid is False and [c["value"] for c in r.anomalies["lost"]] == [2]


def test_early_is_informational_when_the_history_holds_clock_faults():
    """The broker decides with its own wall clock, which the clock nemesis moves: an early delivery
    under skew is Pulsar's behaviour too (docs/architecture.md, Clock skew)."""
    q = Q()
    q.add(Op(process=-1, type="invoke", f="start-clock", key="",
             value={"node": "broker-1", "mode": "strobe", "offsets": [0.0, -42.5], "period_ms": 1000}))
    q.add(Op(process=-1, type="ok", f="start-clock", key="", value={"node": "broker-1", "mode": "strobe"}))
    q.enqueue(0, 1)
    _delayed(q, 1, 1, due=5000, got=4200)
    q.drain([], type="fail", error="empty")
    r = check(q.ops)
    assert r.valid is True, r.anomalies
    assert r.anomalies["early"][0]["early_ms"] == 800
    assert r.stats["clock_faults"] == 1 and r.stats["clock_skew_ms"] == 42500
    assert "early" not in r.stats["invalid_types"]
    # a run that asks for it explicitly still gets it judged
    assert check(q.ops, {"invalid": ("lost", "early")}).valid is False
