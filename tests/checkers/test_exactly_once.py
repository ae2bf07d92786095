"""The exactly-once checker on hand-made histories: a correct processor with restarts is valid, and each
anomaly it names is found (with and without it)."""
from __future__ import annotations

import json

from checkers.exactly_once import amount_of, check, pos_of
from core.history import INFO, INVOKE, OK, MessageId, Op

A, B = "persistent://public/default/t-in0", "persistent://public/default/t-out0"
FINAL = 1_000_000


class H:
    """A history builder: inputs in A, a processor simulated step by step, final reads."""

    def __init__(self, n: int = 12, keys: int = 3, batch: bool = False):
        # inputs: entries 0..n-1 of ledger 5 (batch_index 0 when `batch`, else -1)
        self.inputs = [{"value": 100 + i, "key": f"k{(100 + i) % keys}",
                        "message_id": {"ledger_id": 5, "entry_id": i, "partition": -1,
                                       "batch_index": 0 if batch else -1}} for i in range(n)]
        self.ops: list[Op] = []
        self.outputs: list[dict] = []
        self.incarnation = -1
        self.state: dict = {}
        self.seq = 0
        self.last_ckpt: dict | None = None

    def op(self, process: int, type_: str, f: str, key: str = A, value=None, **kw) -> Op:
        o = Op(process=process, type=type_, f=f, key=key, value=value, **kw)
        self.ops.append(o)
        return o

    def sends(self, skip: int | None = None) -> "H":
        for i, m in enumerate(self.inputs):
            self.op(i, INVOKE, "send", value=m["value"])
            self.op(i, OK, "send", value=m["value"], message_id=MessageId.from_json(m["message_id"]))
        return self

    def start(self, resume: dict | None = None) -> "H":
        """A new incarnation restoring `resume` (default: the last durable checkpoint)."""
        self.incarnation += 1
        ck = self.last_ckpt if resume is None else resume
        self.state = {"sums": dict(ck["sums"]) if ck else {}, "counts": dict(ck["counts"]) if ck else {},
                      "count": ck["count"] if ck else 0, "mid": ck["message_id"] if ck else None}
        self.op(800_000 + self.incarnation, INVOKE, "restore",
                value={"incarnation": self.incarnation, "output": B, "checkpoint": ck["seq"] if ck else None,
                       "message_id": ck["message_id"] if ck else None, "seek": True})
        self.op(800_000 + self.incarnation, OK, "restore")
        return self

    def process(self, upto: int, emit: bool = True) -> "H":
        """Process the inputs after the state's position up to index `upto` (exclusive)."""
        start = 0 if self.state["mid"] is None else self.state["mid"]["entry_id"] + 1
        for m in self.inputs[start:upto]:
            k = m["key"]
            self.state["sums"][k] = self.state["sums"].get(k, 0) + amount_of(m["value"])
            self.state["counts"][k] = self.state["counts"].get(k, 0) + 1
            self.state["count"] += 1
            self.state["mid"] = m["message_id"]
            mid = m["message_id"]
            if emit:
                self.outputs.append({"k": k, "sum": self.state["sums"][k], "n": self.state["counts"][k],
                                     "in": [mid["ledger_id"], mid["entry_id"], mid["partition"], mid["batch_index"]],
                                     "v": m["value"], "inc": self.incarnation})
        return self

    def checkpoint(self, durable: bool = True, **override) -> "H":
        self.seq += 1
        c = {"seq": self.seq, "incarnation": self.incarnation, "message_id": self.state["mid"],
             "count": self.state["count"], "sums": dict(self.state["sums"]), "counts": dict(self.state["counts"])}
        c.update(override)
        self.op(800_000 + self.incarnation, INVOKE, "checkpoint", value=c)
        if durable:
            self.op(800_000 + self.incarnation, OK, "checkpoint", value=c)
            self.last_ckpt = c
        return self

    def crash(self) -> "H":
        self.op(700_000, INVOKE, "crash-processor", value={"incarnation": self.incarnation})
        self.op(700_000, OK, "crash-processor", value={"incarnation": self.incarnation})
        return self

    def finish(self, read_a: bool = True, read_b: bool = True, final: bool = True) -> list[Op]:
        if read_a:
            self.op(FINAL, INVOKE, "read")
            self.op(FINAL, OK, "read", value=list(self.inputs))
        if read_b:
            out = [{"value": json.dumps(o), "message_id": {"ledger_id": 9, "entry_id": i, "partition": -1,
                                                           "batch_index": -1}} for i, o in enumerate(self.outputs)]
            self.op(FINAL + 1, INVOKE, "read", key=B)
            self.op(FINAL + 1, OK, "read", key=B, value=out)
        if final:
            self.op(FINAL + 2, INVOKE, "final-checkpoint")
            self.op(FINAL + 2, OK, "final-checkpoint", value={"input": A, "output": B, "checkpoint": self.last_ckpt})
        for i, o in enumerate(self.ops):
            o.index = i
        return self.ops


def correct() -> H:
    """Two incarnations: the first processes 0..6, checkpoints after 4, is killed; the second resumes
    after input 3 and re-outputs 4..6 (duplicates after a restart), then finishes."""
    return (H().sends().start().process(4).checkpoint().process(7).crash()
            .start().process(8).checkpoint().process(12).checkpoint())


def kinds(res) -> set[str]:
    return set(res.anomalies)


def test_a_correct_processor_with_a_restart_is_valid():
    res = check(correct().finish())
    assert res.valid is True, res.anomalies
    st = res.stats["pipelines"][A]
    assert st["inputs"] == 12 and st["inputs_covered"] == 12
    assert st["restarts"] == 1 and st["crashes"] == 1 and st["checkpoints"] == 3 and st["checkpoints_ok"] == 3
    assert st["duplicates"] == 3 and st["outputs"] == 15 and st["inputs_with_output"] == 12
    assert res.stats["duplicates"] == 3 and res.stats["anomaly_counts"] == {}


def test_double_counted_input_in_a_checkpoint():
    h = H().sends().start().process(6)
    m = h.inputs[2]
    k = m["key"]
    sums = dict(h.state["sums"])
    counts = dict(h.state["counts"])
    sums[k] += amount_of(m["value"])
    counts[k] += 1
    h.checkpoint(sums=sums, counts=counts)
    res = check(h.finish())
    assert res.valid is False and kinds(res) == {"double-counted"}
    (a,) = res.anomalies["double-counted"]
    assert a["key"] == k and a["amount"] == amount_of(m["value"]) and a["actual_count"] == a["expected_count"] + 1
    assert a["final"] is False and a["checkpoint"] == 1


def test_missed_input_in_a_checkpoint_and_the_final_one():
    h = H().sends().start().process(6)
    m = h.inputs[5]
    sums = dict(h.state["sums"])
    counts = dict(h.state["counts"])
    sums[m["key"]] -= amount_of(m["value"])
    counts[m["key"]] -= 1
    h.checkpoint(sums=sums, counts=counts)
    res = check(h.finish())
    assert res.valid is False and kinds(res) == {"missed"}
    assert [a["amount"] for a in res.anomalies["missed"]] == [-amount_of(m["value"])]
    # the final checkpoint alone (not journaled) is checked too
    h2 = H().sends().start().process(6)
    h2.last_ckpt = {"seq": 7, "incarnation": 0, "message_id": h2.state["mid"], "count": 6, "sums": sums,
                    "counts": counts}
    res = check(h2.finish())
    assert kinds(res) == {"missed"} and res.anomalies["missed"][0]["final"] is True


def test_checkpoint_not_in_input():
    h = H().sends().start().process(4).checkpoint(message_id={"ledger_id": 5, "entry_id": 99, "partition": -1,
                                                              "batch_index": -1})
    res = check(h.finish())
    assert res.valid is False and "checkpoint-not-in-input" in kinds(res)


def test_lost_output_only_up_to_the_durable_checkpoint():
    # outputs of 0..5 never reached B, but a checkpoint after 5 is durable: flush-on-checkpoint broken
    h = H().sends().start().process(6, emit=False).checkpoint().process(10)
    res = check(h.finish())
    assert res.valid is False and kinds(res) == {"lost-output"}
    assert sorted(a["message_id"][1] for a in res.anomalies["lost-output"]) == list(range(6))
    # outputs missing only after the last durable checkpoint: fine (they are replayed after a restart)
    h = H().sends().start().process(6).checkpoint().process(10, emit=False)
    res = check(h.finish())
    assert res.valid is True, res.anomalies
    # a checkpoint that never completed does not promise its outputs
    h = H().sends().start().process(6, emit=False).checkpoint(durable=False)
    h.last_ckpt = None
    assert check(h.finish()).valid is True


def test_duplicate_without_restart():
    h = H().sends().start().process(6).checkpoint()
    h.outputs.append(dict(h.outputs[2]))
    res = check(h.finish())
    assert res.valid is False and kinds(res) == {"duplicate-without-restart"}
    (a,) = res.anomalies["duplicate-without-restart"]
    assert a["copies"] == 2 and a["incarnations_resumed_before"] == 1 and a["message_id"] == [5, 2, 0]
    # without deduplication on the output topic the producer's resends may duplicate: stats only
    h = H().sends().start().process(6).checkpoint()
    h.outputs.append(dict(h.outputs[2]))
    res = check(h.finish(), {"dedup_output": False})
    assert res.valid is True and res.stats["resend_duplicates"] == 1


def test_duplicate_of_an_input_before_the_restarts_resume_point():
    # the second incarnation resumed after input 3: a second output of input 2 is not a replay
    h = correct()
    h.outputs.append(dict(h.outputs[2]))
    res = check(h.finish())
    assert kinds(res) == {"duplicate-without-restart"}
    assert res.anomalies["duplicate-without-restart"][0]["message_id"] == [5, 2, 0]
    # a third copy of a replayed input (4) is one more than the two incarnations that resumed before it
    h = correct()
    h.outputs.append(dict(h.outputs[4]))
    res = check(h.finish())
    assert kinds(res) == {"duplicate-without-restart"}
    assert res.anomalies["duplicate-without-restart"][0]["copies"] == 3


def test_wrong_output():
    h = correct()
    h.outputs[5] = dict(h.outputs[5], sum=h.outputs[5]["sum"] + 1)
    res = check(h.finish())
    assert kinds(res) == {"wrong-output"}
    (a,) = res.anomalies["wrong-output"]
    assert a["actual_sum"] == a["expected_sum"] + 1
    h = correct()
    h.outputs[5] = dict(h.outputs[5], v=12345)
    assert kinds(check(h.finish())) == {"wrong-output"}


def test_unexpected_output():
    h = correct()
    h.outputs.append({"k": "k0", "sum": 1, "n": 1, "in": [5, 77, -1, -1], "v": 1, "inc": 0})
    res = check(h.finish())
    assert kinds(res) == {"unexpected-output"}
    h = correct()
    ops = h.finish()
    read_b = next(o for o in ops if o.f == "read" and o.key == B and o.type == OK)
    read_b.value.append({"value": "garbage", "message_id": {"ledger_id": 9, "entry_id": 99}})
    res = check(ops)
    assert kinds(res) == {"unexpected-output"} and res.anomalies["unexpected-output"][0]["why"]


def test_lost_input():
    h = H().sends().start().process(11).checkpoint()
    ops = h.finish()
    read_a = next(o for o in ops if o.f == "read" and o.key == A and o.type == OK)
    lost = read_a.value.pop()            # acknowledged, not in A; the processor never saw it either
    res = check(ops)
    assert kinds(res) == {"lost-input"}
    assert res.anomalies["lost-input"][0]["value"] == lost["value"]


def test_unknown_when_a_final_read_or_the_final_checkpoint_is_missing():
    res = check(correct().finish(read_b=False))
    assert res.valid == "unknown" and "output topic" in res.stats["unknown"][0]
    h = correct()
    ops = h.finish(read_a=False)
    ops.insert(0, Op(process=FINAL, type=INVOKE, f="read", key=A))
    ops.insert(1, Op(process=FINAL, type=INFO, f="read", key=A, error="final read unfinished"))
    res = check(ops)
    assert res.valid == "unknown" and "input topic" in res.stats["unknown"][0]
    assert check(correct().finish(final=False)).valid == "unknown"
    assert check([]).valid == "unknown"
    # an anomaly still makes it invalid
    h = correct()
    h.outputs[5] = dict(h.outputs[5], sum=0)
    assert check(h.finish(final=False)).valid is False


def test_batch_index_minus_one_and_zero_are_the_same_position():
    h = H(batch=True).sends().start().process(5).checkpoint()
    # the processor recorded the checkpoint's id with batch_index -1, the read has 0
    h.last_ckpt = dict(h.last_ckpt, message_id=dict(h.last_ckpt["message_id"], batch_index=-1))
    res = check(h.finish())
    assert res.valid is True, res.anomalies
    assert pos_of({"ledger_id": 1, "entry_id": 2, "batch_index": -1}) == pos_of([1, 2, -1, 0]) == (1, 2, 0)
    assert pos_of(None) is None and pos_of("x") is None


def test_evidence_is_capped_counts_are_exact():
    h = H(n=40).sends().start().process(40, emit=False).checkpoint()
    res = check(h.finish(), {"max_anomalies": 5})
    assert len(res.anomalies["lost-output"]) == 5 and res.stats["anomaly_counts"]["lost-output"] == 40
