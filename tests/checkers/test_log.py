"""The log checker on hand-made histories: each anomaly is found with its evidence; clean runs pass."""
from __future__ import annotations

import json

import pytest

from checkers import REGISTRY
from checkers.log import INVALID_BY_DEFAULT, check
from core.history import MessageId, Op

MS = 1_000_000


class H:
    """A history builder: every op gets the next index and a time `step` after the previous one."""

    def __init__(self, step_ms: float = 1.0):
        self.ops: list[Op] = []
        self.t = 0
        self.step = int(step_ms * MS)

    def add(self, op: Op, at_ms: float | None = None) -> Op:
        self.t = int(at_ms * MS) if at_ms is not None else self.t + self.step
        op.time_ns = self.t
        op.index = len(self.ops)
        self.ops.append(op)
        return op

    def invoke(self, p, f, topic="t", value=None, at_ms=None) -> Op:
        return self.add(Op(process=p, type="invoke", f=f, key=topic, value=value), at_ms)

    def done(self, p, f, type, topic="t", value=None, mid=None, node="broker-1", error="",
             at_ms=None) -> Op:
        return self.add(Op(process=p, type=type, f=f, key=topic, value=value, message_id=mid,
                           node=node, error=error), at_ms)

    def send(self, p, value, mid=None, type="ok", topic="t", node="broker-1", error="") -> tuple[Op, Op]:
        inv = self.invoke(p, "send", topic, value)
        m = mid_of(mid) if isinstance(mid, tuple) else mid
        comp = self.done(p, "send", type, topic, value, m if type == "ok" else None, node,
                         error or ("" if type == "ok" else "Timeout"))
        return inv, comp

    def receive(self, p, msgs, topic="t", type="ok") -> Op:
        self.invoke(p, "receive", topic)
        return self.done(p, "receive", type, topic, [msg(*m) for m in msgs] if type == "ok" else None)

    def read(self, msgs, topic="t", type="ok", p=100) -> Op:
        self.invoke(p, "read", topic)
        return self.done(p, "read", type, topic, [msg(*m) for m in msgs] if type == "ok" else None,
                         node="")

    def nemesis(self, f, value=None, done_value=None, type="info") -> tuple[Op, Op]:
        inv = self.add(Op(process=-1, type="invoke", f=f, value=value))
        comp = self.add(Op(process=-1, type=type, f=f, value=done_value if done_value is not None else value))
        return inv, comp


def mid_of(t: tuple) -> MessageId:
    """(ledger, entry[, batch_index[, partition]]) as a MessageId."""
    return MessageId(t[0], t[1], t[3] if len(t) > 3 else -1, t[2] if len(t) > 2 else -1)


def msg(value, mid, redelivery=0):
    d = {"value": value, "message_id": {"ledger_id": mid[0], "entry_id": mid[1],
                                        "partition": mid[3] if len(mid) > 3 else -1,
                                        "batch_index": mid[2] if len(mid) > 2 else -1}}
    d["redelivery_count"] = redelivery
    return d


def serializable(r) -> dict:
    return json.loads(json.dumps(r.to_json()))


def clean_history() -> H:
    """Two producers, a consumer and the final read of one topic; nothing wrong."""
    h = H()
    for i in range(6):
        h.send(i % 2, i, (7, i))
    h.receive(5, [(0, (7, 0)), (1, (7, 1))])
    h.receive(5, [(2, (7, 2))])
    h.receive(5, [(3, (7, 3)), (4, (7, 4)), (5, (7, 5))])
    h.read([(i, (7, i)) for i in range(6)])
    return h


# ------------------------------------------------------------------------------------ clean runs

def test_registered():
    assert REGISTRY["log"].check is check


def test_clean_history_is_valid():
    r = check(clean_history().ops)
    assert r.valid is True, r.anomalies
    assert r.anomalies == {}
    s = r.stats
    assert s["ops"]["send"] == {"invoke": 6, "ok": 6}
    assert s["ops"]["read"] == {"invoke": 1, "ok": 1}
    assert s["sends"]["ok"] == 6
    assert s["final_reads"]["t"]["status"] == "ok"
    assert s["final_reads"]["t"]["messages"] == 6
    assert s["topics"]["t"]["final_read_messages"] == 6
    assert s["lost_count"] == 0 and s["duplicate_count"] == 0
    assert s["incomplete_topics"] == []
    serializable(r)


def test_fail_and_info_sends_are_clean():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, type="fail", error="ProducerQueueIsFull")     # definitely not written
    h.send(0, 3, type="info")                                   # indeterminate, turns out written
    h.send(1, 4, type="info")                                   # indeterminate, not written
    h.invoke(2, "send", "t", 5)                                 # never completed
    h.send(3, 6, (3, 2))
    h.read([(1, (3, 0)), (3, (3, 1)), (6, (3, 2))])
    r = check(h.ops)
    assert r.valid is True, r.anomalies
    assert r.stats["info_sends"] == {"total": 3, "found": 1, "not_found": 2, "unknown": 0}
    assert r.stats["sends"]["fail"] == 1 and r.stats["sends"]["unfinished"] == 1
    assert r.stats["sends"]["info"] == 2


def test_duplicates_are_reported_but_allowed():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, (3, 2))
    h.receive(5, [(1, (3, 0))])
    h.receive(5, [(1, (3, 1))])                                  # a producer retry wrote 1 twice
    h.read([(1, (3, 0)), (1, (3, 1)), (2, (3, 2))])
    r = check(h.ops)
    assert r.valid is True
    [d] = r.anomalies["duplicate"]
    assert d["topic"] == "t" and d["value"] == 1
    assert [(m["ledger_id"], m["entry_id"]) for m in d["message_ids"]] == [(3, 0), (3, 1)]
    assert {o["source"] for o in d["observations"]} == {"receive"}
    assert d["send"]["message_id"]["entry_id"] == 0
    assert r.stats["duplicate_count"] == 1


def test_redeliveries_are_not_duplicates():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, (3, 1))
    h.receive(5, [(1, (3, 0)), (2, (3, 1))])
    h.receive(5, [(1, (3, 0), 1), (2, (3, 1), 1)])                # redelivered after a reconnect
    h.read([(1, (3, 0)), (2, (3, 1))])
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}
    assert r.stats["receives"]["redelivered"] == 2
    assert r.stats["receives"]["received_again"] == 2
    assert r.stats["receives"]["messages"] == 4


def test_batches_and_plain_entry_spellings():
    h = H()
    # one batch of three in entry (4, 0), then a plain message acked as batch -1 but read as index 0
    h.send(0, 10, (4, 0, 0))
    h.send(0, 11, (4, 0, 1))
    h.send(0, 12, (4, 0, 2))
    h.send(0, 13, (4, 1, -1))
    h.read([(10, (4, 0, 0)), (11, (4, 0, 1)), (12, (4, 0, 2)), (13, (4, 1, 0))])
    r = check(h.ops)
    assert r.valid is True, r.anomalies
    assert r.anomalies == {}


def test_multiple_topics_interleaved_processes():
    h = H()
    h.invoke(0, "send", "a", 1)
    h.invoke(1, "send", "b", 2)
    h.invoke(2, "send", "a", 3)
    h.done(1, "send", "ok", "b", 2, MessageId(9, 0))
    h.done(2, "send", "ok", "a", 3, MessageId(8, 1))
    h.done(0, "send", "ok", "a", 1, MessageId(8, 0))
    h.send(1, 4, (9, 1), topic="b")
    h.read([(1, (8, 0)), (3, (8, 1))], topic="a")
    h.read([(2, (9, 0)), (4, (9, 1))], topic="b")
    r = check(h.ops)
    assert r.valid is True, r.anomalies
    assert set(r.stats["topics"]) == {"a", "b"}
    assert r.stats["topics"]["a"]["ok"] == 2 and r.stats["topics"]["b"]["ok"] == 2


def test_values_as_strings():
    h = H()
    h.send(0, "1", (3, 0))
    h.send(0, 2, (3, 1))
    h.receive(5, [("1", (3, 0)), (" 2", (3, 1))])
    h.read([(1, (3, 0)), ("2", (3, 1))])
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}


def test_indexes_missing_use_list_positions():
    h = H()
    h.send(0, 1, (3, 0))
    h.read([])
    for op in h.ops:
        op.index = -1
    r = check(h.ops)
    [lost] = r.anomalies["lost"]
    assert lost["send"]["invoke"]["index"] == 0
    assert lost["send"]["completion"]["index"] == 1
    assert lost["missing_from_reads"][0]["index"] == 3


# ------------------------------------------------------------------------------------- anomalies

def test_lost_acknowledged_send():
    h = H()
    h.send(0, 1, (3, 0))
    inv, ok = h.send(1, 2, (3, 1), node="broker-2")
    h.send(0, 3, (3, 2))
    rcv = h.receive(5, [(1, (3, 0)), (2, (3, 1))])
    rd = h.read([(1, (3, 0)), (3, (3, 2))])
    r = check(h.ops)
    assert r.valid is False
    [lost] = r.anomalies["lost"]
    assert lost["topic"] == "t" and lost["value"] == 2
    assert lost["message_id"] == {"ledger_id": 3, "entry_id": 1, "partition": -1, "batch_index": -1}
    send = lost["send"]
    assert send["outcome"] == "ok"
    assert send["invoke"]["index"] == inv.index and send["completion"]["index"] == ok.index
    assert send["completion"]["process"] == 1 and send["completion"]["node"] == "broker-2"
    assert send["invoke"]["time_s"] == pytest.approx(inv.time_ns / 1e9)
    assert [x["index"] for x in lost["missing_from_reads"]] == [rd.index]
    assert lost["received_during_run"]["op"]["index"] == rcv.index
    assert r.stats["lost_count"] == 1 and r.stats["topics"]["t"]["lost"] == 1
    serializable(r)


def test_lost_from_any_of_two_complete_reads():
    h = H()
    h.send(0, 1, (3, 0))
    h.read([(1, (3, 0))])
    rd2 = h.read([])
    r = check(h.ops)
    assert r.valid is False
    [lost] = r.anomalies["lost"]
    assert [x["index"] for x in lost["missing_from_reads"]] == [rd2.index]
    assert lost["read_by"]["source"] == "read"


def test_missing_final_read_is_unknown_not_lost():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, (3, 1), topic="u")
    h.read([], topic="t", type="info")           # the reader timed out
    r = check(h.ops)
    assert r.valid == "unknown"
    assert "lost" not in r.anomalies
    assert r.stats["incomplete_topics"] == ["t", "u"]
    assert r.stats["final_reads"]["t"]["status"] == "info"
    assert r.stats["final_reads"]["u"]["status"] == "missing"


def _ledgers(h, topic, e_size, qw, fragments, ledger=3, p=500_100):
    """The final `ledgers` op of a topic with one ledger's metadata at the end (workloads/pulsar_client)."""
    h.invoke(p, "ledgers", topic)
    md = {"ensemble_size": e_size, "write_quorum": qw, "ack_quorum": qw, "state": "CLOSED", "fragments": fragments}
    return h.done(p, "ledgers", "ok", topic, {"ledgers": [{"ledger_id": ledger, "entries": 9, "metadata": md}]},
                  node="")


def _wipe(h, node):
    return h.nemesis("start-disk-wipe", {"selector": "ledger-bookies"}, {"node": node, "role": "bookie"}, type="ok")


def test_a_stalled_final_read_with_every_copy_wiped_after_the_ack_is_lost():
    """E/Qw = 3/1: entries 0..5 round robin on b1, b2, b3; b2 wiped after entries 0..3 were acknowledged
    (1 is on b2) and before 4 (on b2 too, its send acknowledged only after the wipe began: it went to the
    formatted bookie, and may be there); the final read stalls. Entry 1 alone is proven lost."""
    h = H()
    for i in range(4):
        h.send(0, i, (3, i))
    _wipe(h, "b2")
    for i in range(4, 6):
        h.send(0, i, (3, i))
    h.read([], type="info")
    _ledgers(h, "t", 3, 1, [[0, ["b1", "b2", "b3"]]])
    r = check(h.ops)
    assert r.valid is False
    (case,) = r.anomalies["lost"]
    assert case["value"] == 1 and case["proof"]["write_set"] == ["b2"] and case["proof"]["entry"] == 1
    assert case["proof"]["wiped"][0]["node"] == "b2" and case["proof"]["ledgers_op"]["f"] == "ledgers"
    assert r.stats["topics"]["t"]["lost"] == 1 and r.stats["incomplete_topics"] == ["t"]
    json.dumps(r.to_json())


@pytest.mark.parametrize("case", ["qw2-one-wiped", "replaced", "no-metadata", "wipe-failed", "no-wipe", "read-ok"])
def test_no_loss_is_claimed_while_a_copy_may_be_left(case):
    """Qw = 2 with one copy wiped; the wiped bookie replaced in the final metadata (auto-recovery copied
    the fragment); no metadata; a wipe that failed; no wipe; a final read that ended ok (then the read
    decides, and it holds every value)."""
    h = H()
    for i in range(4):
        h.send(0, i, (3, i))
    if case == "wipe-failed":
        h.nemesis("start-disk-wipe", {"selector": "ledger-bookies"}, {"error": "no bookie"}, type="fail")
    elif case != "no-wipe":
        _wipe(h, "b2")
    if case == "read-ok":
        h.read([(i, (3, i)) for i in range(4)])
    else:
        h.read([], type="info")
    if case == "qw2-one-wiped":
        _ledgers(h, "t", 3, 2, [[0, ["b1", "b2", "b3"]]])
    elif case == "replaced":
        _ledgers(h, "t", 3, 1, [[0, ["b1", "b4", "b3"]]])
    elif case != "no-metadata":
        _ledgers(h, "t", 3, 1, [[0, ["b1", "b2", "b3"]]])
    r = check(h.ops)
    assert "lost" not in r.anomalies
    assert r.valid is (True if case == "read-ok" else "unknown")


def test_write_sets_follow_the_fragments():
    """A later fragment (an ensemble change at entry 2 replaced b2 with b4): entry 1 (b2) is lost, entry 4
    (4 mod 3 = 1: b4) is not; Qw = 2 with both copies wiped is lost."""
    h = H()
    for i in range(6):
        h.send(0, i, (3, i))
    _wipe(h, "b2")
    _wipe(h, "b3")
    h.read([], type="info")
    _ledgers(h, "t", 3, 1, [[0, ["b1", "b2", "b3"]], [2, ["b1", "b4", "b3"]]])
    r = check(h.ops)
    assert sorted(c["value"] for c in r.anomalies["lost"]) == [1, 2, 5]       # b2, b3, b3
    h2 = H()
    h2.send(0, 0, (3, 0))
    h2.send(0, 1, (3, 1))
    _wipe(h2, "b2")
    _wipe(h2, "b3")
    h2.read([], type="info")
    _ledgers(h2, "t", 3, 2, [[0, ["b1", "b2", "b3"]]])
    r2 = check(h2.ops)
    assert [c["value"] for c in r2.anomalies["lost"]] == [1]                   # entry 1 on b2, b3; 0 on b1, b2


def test_failed_read_then_ok_read_is_complete():
    h = H()
    h.send(0, 1, (3, 0))
    h.read([], type="fail")
    h.read([(1, (3, 0))])
    r = check(h.ops)
    assert r.valid is True
    assert r.stats["final_reads"]["t"] == {"status": "ok", "reads": 2, "ok_reads": 1, "messages": 1,
                                           "distinct_values": 1}


def test_invalid_beats_unknown():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, (3, 1), topic="u")
    h.read([], topic="t")
    r = check(h.ops)
    assert r.valid is False
    assert r.stats["incomplete_topics"] == ["u"]


def test_unexpected_value():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, (5, 0), topic="other")
    rcv = h.receive(5, [(99, (3, 7))])
    h.read([(1, (3, 0)), (2, (3, 1))])                          # 2 was sent to another topic
    h.read([(2, (5, 0))], topic="other")
    r = check(h.ops)
    assert r.valid is False
    un = {a["value"]: a for a in r.anomalies["unexpected"]}
    assert set(un) == {99, 2}
    assert un[99]["observation"]["source"] == "receive"
    assert un[99]["observation"]["op"]["index"] == rcv.index
    assert un[99]["message_id"]["entry_id"] == 7
    assert un[2]["topic"] == "t" and un[2]["sent_to_topics"] == ["other"]
    assert un[2]["observation"]["source"] == "read" and un[2]["observation"]["slot"] == 1


def test_divergence_between_readers():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, type="info")
    rcv = h.receive(5, [(1, (3, 0))])
    rd = h.read([(2, (3, 0))])                                  # the reader sees another value there
    r = check(h.ops)
    assert r.valid is False
    [d] = r.anomalies["divergence"]
    assert d["topic"] == "t" and d["values"] == [1, 2]
    assert d["message_id"]["ledger_id"] == 3 and d["message_id"]["entry_id"] == 0
    assert d["sources"] == ["read", "send"]
    by_src = {o["source"]: o for o in d["observations"]}
    assert by_src["send"]["value"] == 1 and by_src["send"]["invoke"]["index"] == 0
    assert by_src["read"]["op"]["index"] == rd.index
    assert rcv.index not in {o["op"]["index"] for o in d["observations"]}   # first observation per value
    # the acked value is also gone from the final read
    assert [a["value"] for a in r.anomalies["lost"]] == [1]


def test_divergence_receive_vs_receive_without_acks():
    h = H()
    h.send(0, 1, type="info")
    h.send(1, 2, type="info")
    h.receive(5, [(1, (3, 0))])
    h.receive(6, [(2, (3, 0))], topic="t")
    h.read([(1, (3, 0))])
    r = check(h.ops)
    assert r.valid is False
    [d] = r.anomalies["divergence"]
    assert d["sources"] == ["receive"] and sorted(d["values"]) == [1, 2]
    assert [o["op"]["process"] for o in d["observations"]] == [5, 6]


def test_divergence_ack_vs_final_read_on_batch_index():
    h = H()
    h.send(0, 1, (3, 0, 0))
    h.send(0, 2, (3, 0, 1))
    h.read([(2, (3, 0, 0)), (1, (3, 0, 1))])                   # batch order swapped
    r = check(h.ops)
    assert r.valid is False
    assert len(r.anomalies["divergence"]) == 2
    assert {d["message_id"]["batch_index"] for d in r.anomalies["divergence"]} == {0, 1}
    assert "lost" not in r.anomalies


def test_nonmonotonic_send():
    h = H()
    h.send(0, 1, (3, 5))
    inv, ok = h.send(0, 2, (3, 4))          # later ack, lower position
    h.send(1, 3, (3, 3))                    # another process: not compared with process 0
    h.send(0, 4, (2, 9), topic="u")         # another topic: not compared
    h.read([(3, (3, 3)), (2, (3, 4)), (1, (3, 5))])
    h.read([(4, (2, 9))], topic="u")
    r = check(h.ops)
    assert r.valid is False
    [a] = r.anomalies["nonmonotonic-send"]
    assert a["topic"] == "t" and a["process"] == 0
    assert a["earlier"]["value"] == 1 and a["earlier"]["message_id"]["entry_id"] == 5
    assert a["later"]["value"] == 2 and a["later"]["completion"]["index"] == ok.index
    assert set(r.anomalies) == {"nonmonotonic-send"}


def test_nonmonotonic_send_across_ledgers():
    h = H()
    h.send(0, 1, (8, 0))
    h.send(0, 2, (7, 100))                  # a lower ledger after a higher one
    h.read([(2, (7, 100)), (1, (8, 0))])
    r = check(h.ops)
    assert [a["later"]["value"] for a in r.anomalies["nonmonotonic-send"]] == [2]


def test_aborted_read_is_reported_and_optionally_invalid():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, type="fail", error="ProducerBlockedQuotaExceeded")
    h.read([(1, (3, 0)), (2, (3, 1))])
    r = check(h.ops)
    assert r.valid is True
    [a] = r.anomalies["aborted-read"]
    assert a["value"] == 2 and a["send"]["outcome"] == "fail"
    assert a["send"]["completion"]["error"] == "ProducerBlockedQuotaExceeded"
    r2 = check(h.ops, {"invalid": ("lost", "aborted-read")})
    assert r2.valid is False


def test_unseen_is_informational():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, (3, 1))
    h.receive(5, [(1, (3, 0))])
    h.read([(1, (3, 0)), (2, (3, 1))])
    r = check(h.ops)
    assert r.valid is True
    assert [a["value"] for a in r.anomalies["unseen"]] == [2]
    assert r.stats["unseen_count"] == 1


def test_no_unseen_without_consumers():
    h = H()
    h.send(0, 1, (3, 0))
    h.read([(1, (3, 0))])
    assert "unseen" not in check(h.ops).anomalies


def test_misplaced_and_nonmonotonic_read_are_informational():
    h = H()
    h.send(0, 1, (3, 0))
    h.send(0, 2, (3, 1))
    h.read([(2, (3, 1)), (1, (3, 5))])      # 1 acked at (3,0) but read at (3,5), nothing at (3,0)
    h.read([(1, (3, 5)), (2, (3, 1))])      # this read goes backwards in the log
    r = check(h.ops)
    assert r.valid is True
    [m] = r.anomalies["misplaced"]
    assert m["value"] == 1 and m["acked_message_id"]["entry_id"] == 0
    assert [x["entry_id"] for x in m["read_message_ids"]] == [5]
    [nr] = r.anomalies["nonmonotonic-read"]
    assert nr["previous"]["value"] == 1 and nr["next"]["value"] == 2


def test_max_anomalies_caps_evidence_not_counts():
    h = H()
    for i in range(10):
        h.send(0, i, (3, i))
    h.read([])
    r = check(h.ops, {"max_anomalies": 3})
    assert len(r.anomalies["lost"]) == 3
    assert r.stats["anomaly_counts"]["lost"] == 10 and r.stats["lost_count"] == 10
    assert r.stats["anomalies_truncated"] == {"lost": 10}


# ----------------------------------------------------------------------------------------- stats

def test_nemesis_fault_periods_and_clean_verdict():
    h = H(step_ms=100)
    h.send(0, 1, (3, 0))
    h.nemesis("start-partition", "halves", {"n1": ["n2"]})
    h.send(0, 2, (3, 1))
    h.nemesis("stop-partition")
    h.nemesis("start-kill", ["bookie-1"], type="fail")           # never took effect
    h.nemesis("kill", ["broker-2"])                              # instantaneous
    h.nemesis("start-pause", ["broker-1"])
    h.nemesis("start-zk-isolate", None, ["zk-1"])
    h.nemesis("heal")
    h.nemesis("start-pause", ["bookie-2"])                       # still on at the end
    h.send(0, 3, (3, 2))
    h.read([(1, (3, 0)), (2, (3, 1)), (3, (3, 2))])
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}
    fp = r.stats["fault_periods"]
    names = [p[2] for p in fp]
    assert names == ["partition", "kill", "pause", "zk-isolate", "pause"]
    part = fp[0]
    assert part[0] == pytest.approx(0.3) and part[1] == pytest.approx(0.8)
    assert part[3] == {"n1": ["n2"]}
    assert fp[3][3] == ["zk-1"]
    assert fp[2][1] == fp[3][1]                                  # heal closed both
    assert fp[4][1] == pytest.approx(r.stats["duration_s"] + h.ops[0].time_ns / 1e9)
    assert r.stats["faults_open_at_end"] == 1
    assert r.stats["ops"]["start-kill"] == {"invoke": 1, "fail": 1}
    json.dumps(r.to_json())


def test_failed_stop_keeps_the_fault_open():
    h = H(step_ms=1000)
    h.nemesis("start-kill", ["bookie-1"])                        # 1 s .. 2 s
    h.nemesis("stop-kill", type="fail")                          # 3 s .. 4 s: did not restart it
    h.nemesis("stop-kill")                                       # 5 s .. 6 s
    r = check(h.ops)
    assert r.stats["fault_periods"] == [[1.0, 6.0, "kill", ["bookie-1"]]]
    assert r.valid is True


ANOMALOUS_SHAPES = {
    "lost": {"topic", "value", "message_id", "send", "missing_from_reads", "read_by",
             "received_during_run"},
    "unexpected": {"topic", "value", "message_id", "observation", "sent_to_topics"},
    "divergence": {"topic", "message_id", "values", "sources", "observations"},
    "nonmonotonic-send": {"topic", "process", "partition", "earlier", "later"},
    "duplicate": {"topic", "value", "message_ids", "observations", "send"},
    "aborted-read": {"topic", "value", "send", "observation"},
    "misplaced": {"topic", "value", "acked_message_id", "read_message_ids", "send", "observations"},
    "nonmonotonic-read": {"topic", "partition", "read", "previous", "next"},
    "unseen": {"topic", "value", "message_id", "send"},
    "nonmonotonic-poll": {"topic", "partition", "subscription", "consumer", "previous", "next", "log_order"},
    "poll-skip": {"topic", "partition", "subscription", "consumer", "previous", "next", "log_order",
                  "skipped", "skipped_values"},
}


def test_every_anomaly_type_has_its_documented_shape_and_serializes():
    h = H()
    h.send(0, 1, (3, 5))
    h.send(0, 2, (3, 4))                                  # nonmonotonic-send
    h.send(0, 3, (3, 6))                                  # lost
    h.send(0, 4, type="fail")                             # aborted-read
    h.send(0, 5, (3, 9))                                  # misplaced: read at (3,10)
    h.send(0, 6, (3, 11))                                 # unseen by the consumer
    h.receive(5, [(1, (3, 5)), (2, (3, 4)), (3, (3, 6)), (5, (3, 10))])
    h.receive(5, [(2, (3, 7))])                           # duplicate of 2
    h.read([(2, (3, 4)), (1, (3, 5)), (77, (3, 6)), (4, (3, 8)), (5, (3, 10)), (6, (3, 11)),
            (9, (3, 1))])                                 # 77 unexpected + divergence; 9 goes back
    # and the consumer went back from 1 to 2 (nonmonotonic-poll), then past 77 and 4 (poll-skip)
    r = check(h.ops)
    assert r.valid is False
    assert set(r.anomalies) == set(ANOMALOUS_SHAPES)
    for kind, entries in r.anomalies.items():
        for e in entries:
            assert set(e) == ANOMALOUS_SHAPES[kind], kind
    out = serializable(r)
    assert out["valid"] is False and set(out) == {"valid", "anomalies", "stats"}
    assert set(out["stats"]["anomaly_counts"]) == set(ANOMALOUS_SHAPES)


def test_latency_throughput_and_unavailability_stats():
    h = H()
    # ok sends at 1 ms latency in second 0, a 3 s outage, then 10 ms latency in second 4
    t = 0.0
    v = 0
    for lat in (1, 1, 1, 1):
        h.invoke(0, "send", "t", v, at_ms=t)
        h.done(0, "send", "ok", "t", v, MessageId(1, v), at_ms=t + lat)
        v += 1
        t += 100
    h.invoke(1, "send", "t", v, at_ms=500)
    h.done(1, "send", "info", "t", v, error="Timeout", at_ms=3500)
    v += 1
    for lat in (10, 10):
        h.invoke(2, "send", "t", v, at_ms=4000 + 100 * (v - 5))
        h.done(2, "send", "ok", "t", v, MessageId(1, v), at_ms=4000 + 100 * (v - 5) + lat)
        v += 1
    h.read([(i, (1, i)) for i in range(7) if i != 4])
    r = check(h.ops)
    assert r.valid is True
    lat = r.stats["send_latency_ms"]
    assert lat["count"] == 6 and lat["p50"] == pytest.approx(1) and lat["max"] == pytest.approx(10)
    assert lat["p95"] == pytest.approx(10) and lat["p99"] == pytest.approx(10)
    tp = r.stats["throughput"]
    assert tp["bucket_s"] == 1.0 and tp["start_s"] == 0
    assert tp["per_bucket"] == [4, 0, 0, 0, 2]
    lot = r.stats["latency_over_time"]
    assert lot["p50_ms"][0] == pytest.approx(1) and lot["p50_ms"][1] is None
    assert lot["p99_ms"][4] == pytest.approx(10)
    assert [p[2] for p in lot["points"]].count("info") == 1 and len(lot["points"]) == 7
    un = r.stats["unavailable"]
    assert un["longest_gap_s"] == pytest.approx(3.709) and un["total_s"] == pytest.approx(3.709)
    assert un["longest_gap_at"] == [pytest.approx(0.301), pytest.approx(4.01)]
    assert r.stats["info_sends"]["not_found"] == 1


def test_points_are_downsampled():
    h = H()
    for i in range(3000):
        h.send(i % 4, i, (1, i))
    h.read([(i, (1, i)) for i in range(3000)])
    r = check(h.ops, {"max_points": 500})
    pts = r.stats["latency_over_time"]["points"]
    assert len(pts) == 500
    assert pts == sorted(pts)


def test_malformed_deliveries_are_counted_not_fatal():
    h = H()
    h.send(0, 1, (3, 0))
    h.invoke(5, "receive", "t")
    h.done(5, "receive", "ok", "t", "garbage")
    h.invoke(100, "read", "t")
    h.done(100, "read", "ok", "t", [{"value": 1, "message_id": None}, {"message_id": None}])
    r = check(h.ops)
    assert r.valid is True
    assert r.stats["history"]["malformed"] == 2


# ------------------------------------------------------------------- consumer order (Kafka taxonomy)

def kmsg(value, entry, key=None, redelivery=0, ledger=3, partition=-1, sub=None) -> dict:
    """A delivered message at (ledger, entry) with an optional key and subscription."""
    d = msg(value, (ledger, entry, -1, partition), redelivery)
    if key is not None:
        d["key"] = key
    if sub is not None:
        d["subscription"] = sub
    return d


def deliver(h: H, p: int, msgs: list[dict], topic="t", at_ms=None, done_ms=None, f="receive") -> Op:
    """One receive of ready-made messages, invoked at at_ms and completed at done_ms when given."""
    h.add(Op(process=p, type="invoke", f=f, key=topic), at_ms)
    return h.add(Op(process=p, type="ok", f=f, key=topic, value=msgs, node="broker-1"), done_ms)


def log_of(h: H, n: int, topic="t") -> None:
    """n acknowledged sends 1..n at (3, 0..n-1)."""
    for v in range(1, n + 1):
        h.send(0, v, (3, v - 1), topic=topic)


def final(h: H, n: int, topic="t") -> Op:
    """The final read of log_of's n values, in order."""
    return h.read([(v, (3, v - 1)) for v in range(1, n + 1)], topic=topic)


def kinds(r) -> set[str]:
    return set(r.anomalies)


def test_consumer_going_forward_with_a_rewind_is_clean():
    h = H()
    log_of(h, 6)
    deliver(h, 5, [kmsg(1, 0), kmsg(2, 1), kmsg(3, 2)])
    # a reconnect replays 2 and 3 (unacknowledged); the first replays with redelivery count 0
    # (a new owner does not know the count), then the stream goes on from there
    deliver(h, 5, [kmsg(2, 1), kmsg(3, 2, redelivery=1), kmsg(4, 3)])
    deliver(h, 5, [kmsg(5, 4), kmsg(6, 5)])
    final(h, 6)
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}, r.anomalies
    co = r.stats["consumer_order"]
    assert co["log_order"] == {"t": "final-read"} and co["subscription_types"] == {"t": "Exclusive"}
    assert co["deliveries"] == 8 and co["first_deliveries"] == 6 and co["redeliveries"] == 2
    assert r.stats["invalid_types"] == sorted(set(INVALID_BY_DEFAULT) | {
        "nonmonotonic-poll", "poll-skip", "nonmonotonic-subscription"})


def test_nonmonotonic_poll_and_a_redelivery_that_is_not():
    h = H()
    log_of(h, 4)
    deliver(h, 5, [kmsg(1, 0), kmsg(2, 1), kmsg(4, 3)])
    back = deliver(h, 5, [kmsg(3, 2)])                        # first delivery of 3, after 4
    final(h, 4)
    r = check(h.ops)
    assert r.valid is False
    [a] = r.anomalies["nonmonotonic-poll"]
    assert a["consumer"] == 5 and a["topic"] == "t" and a["subscription"] == ""
    assert (a["previous"]["value"], a["previous"]["log_index"]) == (4, 3)
    assert (a["next"]["value"], a["next"]["log_index"]) == (3, 2)
    assert a["next"]["op"]["index"] == back.index and a["next"]["message_id"]["entry_id"] == 2
    assert "poll-skip" not in r.anomalies                     # 3 did reach the subscription
    serializable(r)
    # the same history where 3 comes back as a redelivery: allowed
    h2 = H()
    log_of(h2, 4)
    deliver(h2, 5, [kmsg(1, 0), kmsg(2, 1), kmsg(4, 3)])
    deliver(h2, 5, [kmsg(3, 2, redelivery=1)])
    final(h2, 4)
    r2 = check(h2.ops)
    assert r2.valid is True and r2.anomalies == {}, r2.anomalies


def test_poll_skip_only_when_the_subscription_never_got_it():
    h = H()
    log_of(h, 5)
    a = deliver(h, 5, [kmsg(1, 0), kmsg(2, 1)])
    b = deliver(h, 5, [kmsg(4, 3), kmsg(5, 4)])               # 3 never delivered to anyone
    final(h, 5)
    r = check(h.ops)
    assert r.valid is False
    [s] = r.anomalies["poll-skip"]
    assert s["skipped"] == 1 and s["skipped_values"] == [3]
    assert s["previous"]["value"] == 2 and s["previous"]["op"]["index"] == a.index
    assert s["next"]["value"] == 4 and s["next"]["op"]["index"] == b.index
    assert [u["value"] for u in r.anomalies["unseen"]] == [3]
    # Failover: another consumer got 3 while process 5 was not the active one -> no skip
    h2 = H()
    log_of(h2, 5)
    deliver(h2, 5, [kmsg(1, 0), kmsg(2, 1)])
    deliver(h2, 6, [kmsg(3, 2)])
    deliver(h2, 5, [kmsg(4, 3), kmsg(5, 4)])
    final(h2, 5)
    r2 = check(h2.ops, {"subscription_type": "Failover"})
    assert r2.valid is True and r2.anomalies == {}, r2.anomalies
    # ... and a Shared subscription makes no order claim at all
    r3 = check(h.ops, {"subscription_type": "Shared"})
    assert "poll-skip" not in r3.anomalies and r3.valid is True
    assert r3.stats["consumer_order"]["log_order"] == {}


def test_nonmonotonic_subscription_across_a_failover():
    h = H()
    log_of(h, 4)
    a = deliver(h, 5, [kmsg(1, 0), kmsg(2, 1), kmsg(4, 3)], at_ms=100, done_ms=110)
    b = deliver(h, 6, [kmsg(3, 2)], at_ms=120, done_ms=130)    # after A's receive ended: goes back
    final(h, 4)
    r = check(h.ops, {"subscription_type": "Failover"})
    assert r.valid is False
    [s] = r.anomalies["nonmonotonic-subscription"]
    assert s["earlier"]["value"] == 4 and s["earlier"]["op"]["index"] == a.index
    assert s["later"]["value"] == 3 and s["later"]["op"]["index"] == b.index
    assert s["later"]["op"]["process"] == 6
    assert "nonmonotonic-poll" not in r.anomalies and "poll-skip" not in r.anomalies
    # concurrent receives (B invoked before A completed): their order is unknown, nothing reported
    h2 = H()
    log_of(h2, 4)
    h2.add(Op(process=5, type="invoke", f="receive", key="t"), 100)
    h2.add(Op(process=6, type="invoke", f="receive", key="t"), 105)
    h2.add(Op(process=5, type="ok", f="receive", key="t", value=[kmsg(1, 0), kmsg(2, 1), kmsg(4, 3)]), 110)
    h2.add(Op(process=6, type="ok", f="receive", key="t", value=[kmsg(3, 2)]), 130)
    final(h2, 4)
    r2 = check(h2.ops, {"subscription_type": "Failover"})
    assert r2.valid is True and r2.anomalies == {}, r2.anomalies


def key_log(h: H) -> None:
    """1..6 alternating keys a, b: 1a 2b 3a 4b 5a 6b."""
    log_of(h, 6)


def K(v: int, **kw) -> dict:
    return kmsg(v, v - 1, key="ab"[(v - 1) % 2], **kw)


def test_key_shared_reorders_across_keys_but_not_within_one():
    h = H()
    key_log(h)
    deliver(h, 5, [K(1), K(3)], at_ms=100, done_ms=110)
    deliver(h, 6, [K(4)], at_ms=120, done_ms=130)              # b: 4 before 2
    late = deliver(h, 6, [K(2)], at_ms=140, done_ms=150)
    deliver(h, 5, [K(5)], at_ms=160, done_ms=170)
    deliver(h, 6, [K(6)], at_ms=180, done_ms=190)
    final(h, 6)
    r = check(h.ops, {"subscription_type": "Key_Shared"})
    assert r.valid is False
    assert kinds(r) == {"nonmonotonic-key"}, r.anomalies
    [a] = r.anomalies["nonmonotonic-key"]
    assert a["key"] == "b" and a["earlier"]["value"] == 4 and a["later"]["value"] == 2
    assert a["later"]["op"]["index"] == late.index
    assert r.stats["consumer_order"]["keys"] == 2
    # the same deliveries with b in order: each consumer skips the other's keys, nothing is reported
    h2 = H()
    key_log(h2)
    deliver(h2, 5, [K(1), K(3)], at_ms=100, done_ms=110)
    deliver(h2, 6, [K(2), K(4)], at_ms=120, done_ms=130)
    deliver(h2, 5, [K(5)], at_ms=160, done_ms=170)
    deliver(h2, 6, [K(6)], at_ms=180, done_ms=190)
    final(h2, 6)
    r2 = check(h2.ops, {"subscription_type": "key_shared"})      # spelling is forgiven
    assert r2.valid is True and r2.anomalies == {}, r2.anomalies
    assert "poll-skip" not in r2.stats["invalid_types"] and "key-overlap" in r2.stats["invalid_types"]
    # under Exclusive the same history goes back in the subscription (4 was out before 2 came)
    assert set(check(h2.ops).anomalies) == {"nonmonotonic-subscription"}


def test_nonmonotonic_key_inside_one_receive_and_redelivery_allowed():
    h = H()
    key_log(h)
    deliver(h, 5, [K(3), K(1)])                                   # a: 3 then 1 in one receive
    final(h, 6)
    r = check(h.ops, {"subscription_type": "Key_Shared"})
    [a] = r.anomalies["nonmonotonic-key"]
    assert (a["earlier"]["value"], a["later"]["value"]) == (3, 1) and a["key"] == "a"
    h2 = H()
    key_log(h2)
    deliver(h2, 5, [K(1), K(3)])
    deliver(h2, 6, [K(1, redelivery=1), K(5)])                    # consumer 5 left; 1 comes again
    final(h2, 6)
    r2 = check(h2.ops, {"subscription_type": "Key_Shared"})
    assert "nonmonotonic-key" not in r2.anomalies and "key-overlap" not in r2.anomalies


def test_key_overlap_when_one_receive_runs_inside_another():
    h = H()
    key_log(h)
    a = deliver(h, 5, [K(1)], at_ms=100, done_ms=200)
    h.add(Op(process=6, type="invoke", f="receive", key="t"), 120)
    b = h.add(Op(process=6, type="ok", f="receive", key="t", value=[K(3)]), 150)   # a, inside A's receive
    h.ops.sort(key=lambda op: op.time_ns)
    for i, op in enumerate(h.ops):
        op.index = i
    final(h, 6)
    r = check(h.ops, {"subscription_type": "Key_Shared"})
    assert r.valid is False
    [o] = r.anomalies["key-overlap"]
    assert o["key"] == "a" and o["first"]["consumer"] == 5 and o["second"]["consumer"] == 6
    assert o["first"]["value"] == 1 and o["second"]["value"] == 3
    assert (o["first"]["log_index"], o["second"]["log_index"]) == (0, 2)
    assert o["first"]["op"]["index"] == a.index and o["second"]["op"]["index"] == b.index
    assert o["second"]["complete_s"] < o["first"]["complete_s"]
    serializable(r)


def test_no_key_overlap_when_the_second_receive_outlasts_the_first_or_keys_differ():
    def run(b_key_value: int, b_done_ms: float, a_value: int = 1):
        h = H()
        key_log(h)
        h.add(Op(process=5, type="invoke", f="receive", key="t"), 100)
        h.add(Op(process=6, type="invoke", f="receive", key="t"), 120)
        ops = [(200, Op(process=5, type="ok", f="receive", key="t", value=[K(a_value)])),
               (b_done_ms, Op(process=6, type="ok", f="receive", key="t", value=[K(b_key_value)]))]
        for t, op in sorted(ops, key=lambda x: x[0]):
            h.add(op, t)
        final(h, 6)
        return check(h.ops, {"subscription_type": "Key_Shared"})
    assert "key-overlap" not in run(3, 250).anomalies  # B was still waiting when A acknowledged
    assert "key-overlap" not in run(2, 150).anomalies  # key b: no claim between different keys
    # A, waiting in its receive, got 3 only after B had 1 and acknowledged it (a rebalance moved
    # key a): B's receive ran inside A's, yet the key was never held twice
    assert "key-overlap" not in run(1, 150, a_value=3).anomalies
    r = run(3, 150)                                    # the positive control of the same shape
    assert "key-overlap" in r.anomalies and r.valid is False
    assert run(3, 250).valid is True and run(2, 150).valid is True


def test_order_checks_without_a_final_read_use_positions():
    h = H()
    log_of(h, 4)
    deliver(h, 5, [kmsg(1, 0), kmsg(3, 2)])
    deliver(h, 5, [kmsg(4, 3)])
    r = check(h.ops)                       # no final read: the positions known give the order
    assert r.valid is False                # invalid beats unknown (the final read is missing)
    assert r.stats["incomplete_topics"] == ["t"]
    assert r.stats["consumer_order"]["log_order"] == {"t": "positions"}
    [s] = r.anomalies["poll-skip"]
    assert s["skipped_values"] == [2] and s["log_order"] == "positions"


def test_partitions_are_separate_logs():
    h = H()
    # partition 0 holds 1, 3; partition 1 holds 2, 4; the final read interleaves them
    for v, part, entry in ((1, 0, 0), (2, 1, 0), (3, 0, 1), (4, 1, 1)):
        h.send(0, v, (10 + part, entry, -1, part))
    deliver(h, 5, [kmsg(1, 0, ledger=10, partition=0), kmsg(3, 1, ledger=10, partition=0)])
    deliver(h, 5, [kmsg(2, 0, ledger=11, partition=1), kmsg(4, 1, ledger=11, partition=1)])
    h.read([(1, (10, 0, -1, 0)), (2, (11, 0, -1, 1)), (3, (10, 1, -1, 0)), (4, (11, 1, -1, 1))])
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}, r.anomalies


def test_subscriptions_are_separate_streams_and_drains_count_as_deliveries():
    h = H()
    log_of(h, 3)
    deliver(h, 5, [kmsg(1, 0, sub="s1"), kmsg(2, 1, sub="s1"), kmsg(3, 2, sub="s1")])
    deliver(h, 6, [kmsg(1, 0, sub="s2")])
    deliver(h, 1_000_000, [kmsg(2, 1, sub="s2"), kmsg(3, 2, sub="s2")], f="drain")
    final(h, 3)
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}, r.anomalies
    assert r.stats["consumer_order"]["first_deliveries"] == 6
    # a drain that went back is caught like any consumer
    h2 = H()
    log_of(h2, 3)
    deliver(h2, 5, [kmsg(1, 0), kmsg(3, 2)])
    deliver(h2, 1_000_000, [kmsg(2, 1)], f="drain")
    final(h2, 3)
    r2 = check(h2.ops, {"subscription_type": "Failover"})
    assert [a["later"]["op"]["f"] for a in r2.anomalies["nonmonotonic-subscription"]] == ["drain"]


def test_subscription_type_per_topic_and_explicit_invalid():
    h = H()
    log_of(h, 3, topic="t")
    deliver(h, 5, [kmsg(1, 0), kmsg(3, 2)], topic="t")
    final(h, 3, topic="t")
    assert check(h.ops, {"subscription_type": {"t": "Shared"}}).valid is True
    assert check(h.ops, {"subscription_type": {"*": "Failover"}}).valid is False
    r = check(h.ops, {"invalid": ("lost",)})
    assert "poll-skip" in r.anomalies and r.valid is True


def test_unknown_subscription_type_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown subscription_type 'Exclusiv'; fix: use one of Exclusive"):
        check([], {"subscription_type": "Exclusiv"})


ORDER_SHAPES = {
    "nonmonotonic-subscription": {"topic", "partition", "subscription", "earlier", "later", "log_order"},
    "nonmonotonic-key": {"topic", "partition", "subscription", "key", "earlier", "later", "log_order"},
    "key-overlap": {"topic", "partition", "subscription", "key", "first", "second"},
}


def timeline(h: H, receives: list[tuple[int, list[dict], float, float]]) -> None:
    """Receives (process, messages, invoke ms, completion ms) added in time order."""
    events = []
    for p, msgs, t0, t1 in receives:
        events.append((t0, Op(process=p, type="invoke", f="receive", key="t")))
        events.append((t1, Op(process=p, type="ok", f="receive", key="t", value=msgs)))
    for t, op in sorted(events, key=lambda e: e[0]):
        h.add(op, t)


def test_order_anomaly_shapes():
    h = H()
    key_log(h)
    timeline(h, [(5, [K(1), K(5)], 100, 200), (6, [K(3)], 120, 150),     # a: 3 inside 5's receive
                 (6, [K(4), K(6)], 300, 310), (6, [K(2)], 320, 330)])    # b: 2 after 4
    final(h, 6)
    r = check(h.ops, {"subscription_type": "Key_Shared"})
    assert set(r.anomalies) == {"nonmonotonic-key", "key-overlap"}, r.anomalies
    h2 = H()
    log_of(h2, 3)
    deliver(h2, 5, [kmsg(1, 0), kmsg(3, 2)])
    deliver(h2, 6, [kmsg(2, 1)])
    final(h2, 3)
    r2 = check(h2.ops, {"subscription_type": "Failover"})
    assert set(r2.anomalies) == {"nonmonotonic-subscription"}
    for res in (r, r2):
        for kind, entries in res.anomalies.items():
            for e in entries:
                assert set(e) == ORDER_SHAPES[kind], kind
        serializable(res)
