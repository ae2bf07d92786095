"""The fencing checker on hand-made histories: ownership overlaps, multi-writer ledgers, ledger bounds."""
from __future__ import annotations

import json

from checkers import REGISTRY
from checkers.fencing import check
from core.history import MessageId, Op

S = 1_000_000_000
FINAL = 1_000_000


class H:
    """A history builder; times are given in seconds; `ops` is the history in time order (ties: the
    order of the calls), indexed."""

    def __init__(self):
        self._ops: list[Op] = []

    def add(self, op: Op, at: float) -> Op:
        op.time_ns = int(at * S)
        self._ops.append(op)
        return op

    @property
    def ops(self) -> list[Op]:
        out = sorted(self._ops, key=lambda o: o.time_ns)      # stable: ties keep the call order
        for i, o in enumerate(out):
            o.index = i
        return out

    def op(self, p, f, key, at, value=None, type="ok", mid=None, node="", invoke_at=None, invoke_value=None):
        """An invoke (at invoke_at, default just before) and its completion at `at`."""
        self.add(Op(process=p, type="invoke", f=f, key=key, value=invoke_value),
                 at if invoke_at is None else invoke_at)
        return self.add(Op(process=p, type=type, f=f, key=key, value=value, message_id=mid, node=node), at)

    def send(self, at, value, ledger, entry, broker, topic="t", p=0, batch=-1, partition=-1):
        return self.op(p, "send", topic, at, value, mid=MessageId(ledger, entry, partition, batch),
                       node=broker, invoke_value=value)

    def read(self, at, msgs, topic="t", p=FINAL, type="ok"):
        """msgs: [(value, ledger, entry[, batch])]."""
        v = [{"value": m[0], "message_id": {"ledger_id": m[1], "entry_id": m[2], "partition": -1,
                                            "batch_index": m[3] if len(m) > 3 else -1}} for m in msgs]
        return self.op(p, "read", topic, at, v if type == "ok" else None, type=type)

    def ledgers(self, at, topic, ledgers, trimmed_before=None, p=FINAL + 50):
        v = {"ledgers": [{"ledger_id": l, "entries": n} for l, n in ledgers]}
        if trimmed_before is not None:
            v["trimmed_before"] = trimmed_before
        return self.op(p, "ledgers", topic, at, v)

    # the `ledger` workload
    def bk_add(self, at, ledger, entry, payload, p=0, invoke_at=None, type="ok"):
        return self.op(p, "add", str(ledger), at, payload, type=type,
                       mid=MessageId(ledger, entry) if type == "ok" else None, invoke_at=invoke_at,
                       invoke_value=payload)

    def recover(self, at, ledger, last, p=1, invoke_at=None):
        return self.op(p, "recover", str(ledger), at, {"last_entry": last}, invoke_at=invoke_at)

    def bk_read(self, at, ledger, entries, p=FINAL + 10, type="ok"):
        """entries: [(entry_id, value)]."""
        v = [{"entry_id": e, "value": x} for e, x in entries]
        return self.op(p, "read", str(ledger), at, v if type == "ok" else None, type=type)


def handover(overlap: bool, drop: tuple[int, ...] = (), misplace: int | None = None, read: bool = True) -> H:
    """broker-1 writes ledger 1, broker-2 takes over with ledger 2; with `overlap`, broker-1's last ack
    (value 4) comes after broker-2's first. `drop` removes values from the final read; `misplace` puts a
    value at another entry in it."""
    h = H()
    h.send(1.0, 1, 1, 0, "broker-1")
    h.send(2.0, 2, 1, 1, "broker-1")
    h.send(3.0, 3, 1, 2, "broker-1", p=1)
    h.send(4.0 if not overlap else 5.5, 4, 1, 3, "broker-1", p=2)
    h.send(5.0, 5, 2, 0, "broker-2", p=3)
    h.send(6.0, 6, 2, 1, "broker-2")
    if read:
        msgs = [(1, 1, 0), (2, 1, 1), (3, 1, 2), (4, 1, 3), (5, 2, 0), (6, 2, 1)]
        msgs = [m if m[0] != misplace else (m[0], m[1], m[2] + 10) for m in msgs if m[0] not in drop]
        h.read(10.0, msgs)
    return h


def js(r) -> dict:
    return json.loads(json.dumps(r.to_json()))


# ----------------------------------------------------------------------------------------- ownership

def test_registered():
    assert REGISTRY["fencing"].check is check


def test_clean_handover_is_valid_with_a_timeline():
    r = check(handover(overlap=False).ops)
    assert r.valid is True and r.anomalies == {}
    rows = r.stats["ownership"]
    assert [(x["broker"], x["ledger"], x["acks"]) for x in rows] == [("broker-1", 1, 4), ("broker-2", 2, 2)]
    assert rows[0]["first_ack_s"] == 1.0 and rows[0]["last_ack_s"] == 4.0
    assert rows[1]["first_ack_s"] == 5.0 and rows[1]["last_ack_s"] == 6.0
    assert r.stats["ownership_changes"] == {"t": 1}
    assert r.stats["overlapping_intervals"] == 0
    assert "ownership" in r.stats["tables"]
    js(r)


def test_overlap_with_every_write_in_place_is_benign():
    r = check(handover(overlap=True).ops)
    assert r.valid is True
    assert list(r.anomalies) == ["dual-ownership-benign"]
    [e] = r.anomalies["dual-ownership-benign"]
    assert e["brokers"] == ["broker-1", "broker-2"] and e["ledgers"] == [1, 2]
    assert e["overlap_s"] == [5.0, 5.5]
    assert e["intervals"][0]["last_ack"]["value"] == 4
    assert e["intervals"][1]["first_ack"]["value"] == 5


def test_overlap_with_a_missing_write_is_split_brain():
    r = check(handover(overlap=True, drop=(4,)).ops)
    assert r.valid is False
    assert list(r.anomalies) == ["split-brain"]
    [e] = r.anomalies["split-brain"]
    assert e["topic"] == "t" and e["partition"] == -1
    assert e["conflict_count"] == 1
    [c] = e["conflicts"]
    assert c["reason"] == "missing" and c["broker"] == "broker-1" and c["value"] == 4
    assert c["acked_message_id"]["ledger_id"] == 1 and c["acked_message_id"]["entry_id"] == 3
    assert c["send"][0]["type"] == "invoke" and c["send"][1]["type"] == "ok"
    assert e["final_reads"][0]["f"] == "read" and e["final_reads"][0]["items"] == 5
    js(r)


def test_overlap_with_a_misplaced_write_is_split_brain():
    r = check(handover(overlap=True, misplace=5).ops)
    assert r.valid is False
    [e] = r.anomalies["split-brain"]
    [c] = e["conflicts"]
    assert c["reason"] == "misplaced" and c["broker"] == "broker-2" and c["value"] == 5
    assert c["read_positions"] == [[2, 10, 0]]


def test_missing_write_without_overlap_is_not_split_brain():
    # the loss is the log checker's business; ownership never overlapped
    r = check(handover(overlap=False, drop=(4,)).ops)
    assert r.valid is True and r.anomalies == {}


def test_intervals_that_touch_do_not_overlap():
    h = H()
    h.send(1.0, 1, 1, 0, "broker-1")
    h.send(5.0, 2, 1, 1, "broker-1")
    h.send(5.0, 3, 2, 0, "broker-2", p=1)       # broker-2's first ack at the instant broker-1's last
    h.send(6.0, 4, 2, 1, "broker-2", p=1)
    h.read(9.0, [(1, 1, 0), (3, 2, 0), (4, 2, 1)])   # value 2 lost, but no overlap to blame
    r = check(h.ops)
    assert r.stats["overlapping_intervals"] == 0
    assert "split-brain" not in r.anomalies and r.valid is True


def test_single_ack_inside_another_brokers_interval_overlaps():
    h = H()
    h.send(1.0, 1, 1, 0, "broker-1")
    h.send(3.0, 2, 2, 0, "broker-2", p=1)       # one ack of broker-2 while broker-1 still acks
    h.send(5.0, 3, 1, 1, "broker-1")
    h.read(9.0, [(1, 1, 0), (3, 1, 1)])
    r = check(h.ops)
    [e] = r.anomalies["split-brain"]
    assert e["conflicts"][0]["value"] == 2 and e["conflicts"][0]["broker"] == "broker-2"
    assert e["overlap_s"] == [3.0, 3.0]


def test_overlap_without_final_read_is_unknown():
    r = check(handover(overlap=True, read=False).ops)
    assert r.valid == "unknown"
    [e] = r.anomalies["dual-ownership-unchecked"]
    assert e["final_read_attempted"] is False
    assert r.stats["unknown_because"]


def test_invalid_beats_unknown():
    h = handover(overlap=True, read=False)
    h.send(7.0, 7, 9, 0, "broker-1", topic="u")
    h.send(7.5, 8, 9, 1, "broker-2", topic="u", p=1)      # one ledger, two brokers
    r = check(h.ops)
    assert r.valid is False
    assert set(r.anomalies) == {"dual-ownership-unchecked", "ledger-multi-writer"}


def test_partitions_are_owned_separately():
    h = H()
    h.send(1.0, 1, 1, 0, "broker-1", partition=0)
    h.send(2.0, 2, 2, 0, "broker-2", p=1, partition=1)
    h.send(3.0, 3, 1, 1, "broker-1", partition=0)
    h.send(4.0, 4, 2, 1, "broker-2", p=1, partition=1)
    r = check(h.ops)                              # no final read needed: nothing overlaps
    assert r.valid is True and r.anomalies == {}
    assert len(r.stats["ownership"]) == 2


def test_acks_without_node_are_not_attributed():
    h = H()
    h.send(1.0, 1, 1, 0, "broker-1")
    h.send(2.0, 2, 2, 0, "", p=1)                 # broker unknown
    h.send(3.0, 3, 1, 1, "broker-1")
    h.send(3.5, 4, 1, 2, "", p=1)                 # same ledger, broker unknown: not a second writer
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}
    assert r.stats["acks"]["without_node"] == 2


def test_ledger_multi_writer():
    h = H()
    h.send(1.0, 1, 7, 0, "broker-1")
    h.send(2.0, 2, 7, 1, "broker-2", p=1)
    h.read(9.0, [(1, 7, 0), (2, 7, 1)])
    r = check(h.ops)
    assert r.valid is False
    [e] = r.anomalies["ledger-multi-writer"]
    assert e["ledger"] == 7 and e["brokers"] == ["broker-1", "broker-2"]
    assert [w["first_ack"]["value"] for w in e["writers"]] == [1, 2]
    # the two writers' intervals touch nowhere in time: no ownership overlap is claimed
    assert "split-brain" not in r.anomalies


# -------------------------------------------------------------------------------- topic ledger bounds

def test_acks_within_listed_ledgers_are_clean():
    h = handover(overlap=False)
    h.ledgers(11.0, "t", [(1, 4), (2, 2)])
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}
    assert r.stats["ledger_lists"]["acks_checked"] == 6


def test_ack_above_the_closed_last_entry_is_beyond_close():
    h = handover(overlap=False)
    h.ledgers(11.0, "t", [(1, 3), (2, 2)])        # ledger 1 closed at entry 2; entry 3 was acked
    r = check(h.ops)
    assert r.valid is False
    [e] = r.anomalies["beyond-close"]
    assert e["reason"] == "entry-above-last"
    assert (e["ledger"], e["entry_id"], e["closed_last_entry"], e["value"]) == (1, 3, 2, 4)
    assert e["send"][1]["message_id"]["entry_id"] == 3
    assert e["ledgers_op"]["f"] == "ledgers" and e["ledgers_op"]["items"] == 2


def test_ack_in_an_unlisted_ledger_inside_the_range_is_beyond_close():
    h = H()
    h.send(1.0, 1, 1, 0, "broker-1")
    h.send(2.0, 2, 2, 0, "broker-2", p=1)         # ledger 2 is not in the topic's list
    h.send(3.0, 3, 3, 0, "broker-1")
    h.ledgers(9.0, "t", [(1, 1), (3, 1)])
    r = check(h.ops)
    [e] = r.anomalies["beyond-close"]
    assert e["reason"] == "ledger-not-listed" and e["ledger"] == 2 and e["value"] == 2
    assert e["listed_ledgers"] == [1, 3]


def test_trimmed_and_below_range_ledgers_are_not_judged():
    h = H()
    h.send(1.0, 1, 1, 0, "broker-1", topic="a")
    h.send(2.0, 2, 5, 0, "broker-1", topic="a")
    h.send(1.0 + 2, 3, 2, 0, "broker-1", topic="b", p=1)
    h.send(4.0, 4, 6, 0, "broker-1", topic="b", p=1)
    h.ledgers(9.0, "a", [(5, 1)], trimmed_before=5)   # ledger 1 trimmed by retention
    h.ledgers(9.5, "b", [(6, 1)], p=FINAL + 51)       # ledger 2 below the listed range, no trim mark
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}
    s = r.stats["ledger_lists"]
    assert s["acks_in_trimmed_ledgers"] == 1 and s["acks_below_listed_range"] == 1 and s["acks_checked"] == 2
    # above trimmed_before but unlisted: judged
    h2 = H()
    h2.send(1.0, 1, 6, 0, "broker-1", topic="a")
    h2.ledgers(9.0, "a", [(7, 0)], trimmed_before=5)
    assert check(h2.ops).anomalies["beyond-close"][0]["trimmed_before"] == 5


def test_partitioned_topic_list_by_partition_name():
    h = H()
    h.send(1.0, 1, 4, 0, "broker-1", topic="p", partition=1)
    h.send(2.0, 2, 4, 1, "broker-1", topic="p", partition=1)
    h.ledgers(9.0, "p-partition-1", [(4, 1)])
    r = check(h.ops)
    [e] = r.anomalies["beyond-close"]
    assert e["entry_id"] == 1 and e["closed_last_entry"] == 0


# ---------------------------------------------------------------------------- BookKeeper ledger bounds

def test_ledger_workload_clean_with_late_ack_inside_the_recovery():
    h = H()
    h.bk_add(1.0, 3, 0, 100)
    h.bk_add(2.0, 3, 1, 101)
    h.recover(3.0, 3, 2, invoke_at=2.5)              # fences; the ledger closes at entry 2
    h.bk_add(3.5, 3, 2, 102, invoke_at=2.2)          # acked after the recovery completed, but inside it
    h.bk_add(4.0, 3, 0, 999, type="fail")            # failed adds are not claims
    h.bk_read(9.0, 3, [(0, 100), (1, 101), (2, 102)])
    r = check(h.ops)
    assert r.valid is True and r.anomalies == {}
    s = r.stats["bk_ledgers"]
    assert s["ok_adds"] == 3 and s["ok_recovers"] == 1 and s["final_reads_ok"] == 1
    assert s["adds_after_fence_inside"] == 1
    js(r)


def test_ack_after_fence_beyond_the_recovered_last_entry():
    h = H()
    h.bk_add(1.0, 3, 0, 100)
    h.recover(2.0, 3, 0)
    h.bk_add(2.5, 3, 1, 101, invoke_at=1.5)          # the fenced ledger acked entry 1
    h.bk_read(9.0, 3, [(0, 100)])
    r = check(h.ops)
    assert r.valid is False
    assert list(r.anomalies) == ["ack-after-fence"]      # not also beyond-close or lost-entry
    [e] = r.anomalies["ack-after-fence"]
    assert (e["ledger"], e["entry_id"], e["recovered_last_entry"], e["value"]) == ("3", 1, 0, 101)
    assert e["fenced_at_s"] == 2.0 and e["acked_at_s"] == 2.5
    assert e["recover"]["f"] == "recover" and e["add"][1]["type"] == "ok"


def test_ack_at_the_instant_the_recovery_completes_is_not_after_it():
    h = H()
    h.bk_add(1.0, 3, 0, 100)
    h.recover(2.0, 3, 0)
    h.bk_add(2.0, 3, 1, 101, invoke_at=1.5)          # same instant: not after the fence...
    r = check(h.ops)
    assert "ack-after-fence" not in r.anomalies
    [e] = r.anomalies["beyond-close"]                # ...but the recovery still closed below it
    assert e["reason"] == "acked-before-recovery" and e["entry_id"] == 1


def test_ack_before_recovery_beyond_its_close_is_beyond_close():
    h = H()
    h.bk_add(1.0, 4, 0, 100)
    h.bk_add(1.5, 4, 1, 101)
    h.recover(2.0, 4, 0, invoke_at=1.8)              # closed at 0 although entry 1 was acked
    h.bk_read(9.0, 4, [(0, 100)])
    r = check(h.ops)
    assert r.valid is False and list(r.anomalies) == ["beyond-close"]
    [e] = r.anomalies["beyond-close"]
    assert (e["ledger"], e["entry_id"], e["closed_last_entry"]) == ("4", 1, 0)
    assert e["recover"]["value"] == {"last_entry": 0}


def test_lost_entry_missing_or_different():
    h = H()
    for i in range(4):
        h.bk_add(1.0 + i, 5, i, 100 + i)
    h.recover(6.0, 5, 3)
    h.bk_read(9.0, 5, [(0, 100), (2, 999), (3, 103)])    # 1 missing, 2 different
    r = check(h.ops)
    assert r.valid is False and list(r.anomalies) == ["lost-entry"]
    got = {(e["entry_id"], e["reason"], e["read_value"]) for e in r.anomalies["lost-entry"]}
    assert got == {(1, "missing", None), (2, "different", 999)}
    assert r.anomalies["lost-entry"][0]["final_read"]["items"] == 3


def test_lost_entry_without_any_recovery():
    h = H()
    h.bk_add(1.0, 5, 0, 100)
    h.bk_add(2.0, 5, 1, 101)
    h.bk_read(9.0, 5, [(0, 100)])
    r = check(h.ops)
    [e] = r.anomalies["lost-entry"]
    assert e["entry_id"] == 1 and e["closed_last_entry"] is None


def test_inconsistent_close():
    h = H()
    h.bk_add(1.0, 6, 0, 100)
    h.recover(2.0, 6, 0)
    h.recover(3.0, 6, 1, p=2)                        # a second recovery sees another last entry
    r = check(h.ops)
    [e] = r.anomalies["inconsistent-close"]
    assert e["recovered_last_entries"] == [0, 1]
    h2 = H()
    h2.bk_add(1.0, 6, 0, 100)
    h2.recover(2.0, 6, 0)
    h2.bk_read(9.0, 6, [(0, 100), (1, 555)])         # the closed ledger holds an entry beyond its close
    [e2] = check(h2.ops).anomalies["inconsistent-close"]
    assert e2["read_entries_beyond_close"] == [1]
    h3 = H()
    h3.bk_add(1.0, 6, 0, 100)
    h3.recover(2.0, 6, 0)
    h3.recover(3.0, 6, 0, p=2)
    h3.bk_read(9.0, 6, [(0, 100)])
    assert check(h3.ops).valid is True


def test_ledger_final_read_that_did_not_finish_is_unknown():
    h = H()
    h.bk_add(1.0, 7, 0, 100)
    h.bk_read(9.0, 7, [], type="info")
    r = check(h.ops)
    assert r.valid == "unknown" and r.anomalies == {}
    # never attempted: counted, not unknown
    h2 = H()
    h2.bk_add(1.0, 7, 0, 100)
    r2 = check(h2.ops)
    assert r2.valid is True and r2.stats["bk_ledgers"]["ledgers_without_final_read"] == 1


def test_max_anomalies_caps_evidence_not_counts():
    h = H()
    for i in range(5):
        h.bk_add(1.0 + i, 8, i, 100 + i)
    h.bk_read(9.0, 8, [])
    r = check(h.ops, {"max_anomalies": 2})
    assert len(r.anomalies["lost-entry"]) == 2
    assert r.stats["anomaly_counts"]["lost-entry"] == 5
    assert r.stats["anomalies_truncated"] == {"lost-entry": 5}


def test_every_anomaly_type_serializes():
    h = handover(overlap=True, drop=(4,))
    h.send(7.0, 7, 9, 0, "broker-1", topic="u")
    h.send(7.5, 8, 9, 1, "broker-2", topic="u", p=1)
    h.ledgers(11.0, "t", [(1, 3), (2, 2)])
    h.bk_add(12.0, 3, 0, 100)
    h.recover(13.0, 3, 0)
    h.recover(13.5, 3, 1, p=2)
    h.bk_add(14.0, 3, 1, 101, invoke_at=12.5)
    h.bk_add(14.5, 3, 0, 555, p=3)
    h.bk_read(15.0, 3, [(0, 100)])
    r = check(h.ops)
    assert {"split-brain", "ledger-multi-writer", "beyond-close", "ack-after-fence", "lost-entry",
            "inconsistent-close"} <= set(r.anomalies)
    d = js(r)
    assert d["valid"] is False


def test_a_recovery_that_built_a_fragment_below_the_last_is_invalid_fragment():
    """The `ledger` workload's info recover (or final read) with value {"invalid_fragment": why}: the
    recovery asked for a fragment keyed below the ledger's last one (apache/bookkeeper#2615); any other
    failed recovery is not an anomaly."""
    h = H()
    h.bk_add(1.0, 8, 0, 100)
    h.op(1, "recover", "8", 2.0, {"invalid_fragment": "a new fragment at LAC+1 0 below the last fragment 50"},
         type="info")
    h.op(2, "recover", "8", 3.0, None, type="info")                    # an ordinary failure: no anomaly
    h.bk_read(9.0, 8, [(0, 100)])
    r = check(h.ops)
    assert r.valid is False
    [e] = r.anomalies["invalid-fragment"]
    assert e["ledger"] == "8" and "below the last fragment 50" in e["why"]
    h2 = H()
    h2.bk_add(1.0, 8, 0, 100)
    h2.op(2, "recover", "8", 3.0, None, type="info")
    h2.bk_read(9.0, 8, [(0, 100)])
    assert check(h2.ops).valid is True
