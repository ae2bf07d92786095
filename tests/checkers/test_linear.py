"""The linearizability checker on hand-made histories: every model valid and invalid, indeterminate
ops, preprocessing rules, keys (P-compositionality), budgets and the counterexample."""
from __future__ import annotations

import json
import random

from checkers import REGISTRY
from checkers.linear import ANOMALY, check
from checkers.models import ILLEGAL, UNKNOWN, get
from core.history import Op


class H:
    """A history builder: each event gets the next index and time (1 ms apart unless `at` is given)."""

    def __init__(self):
        self.ops: list[Op] = []
        self.t = 0

    def ev(self, p, type, f, value=None, key="", at=None) -> Op:
        self.t = at if at is not None else self.t + 1_000_000
        op = Op(process=p, type=type, f=f, key=key, value=value, time_ns=self.t, index=len(self.ops))
        self.ops.append(op)
        return op

    def inv(self, p, f, value=None, key="", at=None) -> Op:
        return self.ev(p, "invoke", f, value, key, at)

    def ok(self, p, f, value=None, key="", at=None) -> Op:
        return self.ev(p, "ok", f, value, key, at)

    def info(self, p, f, value=None, key="", at=None) -> Op:
        return self.ev(p, "info", f, value, key, at)

    def fail(self, p, f, value=None, key="", at=None) -> Op:
        return self.ev(p, "fail", f, value, key, at)

    def op(self, p, f, value=None, out=None, key="") -> None:
        """A whole op, invoked and completed ok right away (out: the completion's value)."""
        self.inv(p, f, value, key)
        self.ok(p, f, out if out is not None else value, key)


def verdict(h: H, model: str, **opts) -> object:
    r = check(h.ops, {"model": model, **opts})
    json.dumps(r.to_json())                       # always serialisable
    return r.valid


def test_registered_and_default_model():
    assert REGISTRY["linear"].check is check
    h = H()
    h.op(0, "cas", [None, 1])
    h.op(0, "read", None, 1)
    assert check(h.ops).valid is True                     # cas-register by default
    assert check(h.ops).stats["model"] == "cas-register"


# ------------------------------------------------------------------------------------------ register

def test_register_sequential_valid_and_stale_read_invalid():
    h = H()
    h.op(0, "write", 1)
    h.op(1, "read", None, 1)
    h.op(0, "write", 2)
    h.op(1, "read", None, 2)
    assert verdict(h, "register") is True
    h.op(1, "read", None, 1)                              # 1 was overwritten before this began
    assert verdict(h, "register") is False


def test_concurrent_write_and_read_either_order():
    for seen in (0, 5):
        h = H()
        h.op(0, "write", 0)
        h.inv(0, "write", 5)
        h.inv(1, "read")
        h.ok(1, "read", seen)
        h.ok(0, "write", 5)
        assert verdict(h, "register") is True, seen
    h = H()
    h.op(0, "write", 0)
    h.inv(0, "write", 5)
    h.inv(1, "read")
    h.ok(1, "read", 7)
    h.ok(0, "write", 5)
    assert verdict(h, "register") is False


def test_read_of_nil_is_unknown_and_always_legal():
    h = H()
    h.op(0, "write", 3)
    h.op(1, "read", None, None)                           # ok read with no value: value unknown
    assert verdict(h, "register") is True


def test_failed_ops_are_removed():
    h = H()
    h.op(0, "write", 1)
    h.inv(1, "write", 9)
    h.fail(1, "write", 9)                                 # certainly did not happen
    h.op(0, "read", None, 1)
    assert verdict(h, "register") is True
    h.op(0, "read", None, 9)
    assert verdict(h, "register") is False


def test_info_write_may_take_effect_late_or_never():
    # took effect late: after a later ok write
    h = H()
    h.op(0, "write", 1)
    h.inv(1, "write", 2)
    h.info(1, "write", 2)
    h.op(0, "write", 3)
    h.op(0, "read", None, 3)
    h.op(0, "read", None, 2)                              # the indeterminate write landed now
    assert verdict(h, "register") is True
    # ... but only once
    h.op(0, "write", 4)
    h.op(0, "read", None, 2)
    assert verdict(h, "register") is False
    # never took effect
    h = H()
    h.op(0, "write", 1)
    h.inv(1, "write", 2)
    h.info(1, "write", 2)
    h.op(0, "read", None, 1)
    assert verdict(h, "register") is True


def test_info_op_takes_effect_only_after_its_invocation():
    h = H()
    h.op(0, "write", 1)
    h.op(0, "read", None, 2)                              # 2 is written only later
    h.inv(1, "write", 2)
    h.info(1, "write", 2)
    assert verdict(h, "register") is False


def test_invocation_without_completion_is_indeterminate():
    h = H()
    h.op(0, "write", 1)
    h.inv(1, "write", 2)                                  # never completes
    h.op(0, "read", None, 2)
    assert verdict(h, "register") is True
    r = check(h.ops, {"model": "register"})
    assert r.stats["ops"]["unfinished"] == 1


def test_crashed_reads_are_dropped():
    h = H()
    h.op(0, "write", 1)
    h.inv(1, "read")
    h.info(1, "read")
    h.op(0, "read", None, 1)
    r = check(h.ops, {"model": "register"})
    assert r.valid is True and r.stats["ops"]["crashed_reads_dropped"] == 1


def test_equal_timestamps_are_concurrent_closed_intervals():
    # write [1, 2] and read [2, 3] share t=2: the read may go first
    h = H()
    h.inv(0, "write", 0, at=0)
    h.ok(0, "write", 0, at=0)
    h.inv(0, "write", 5, at=1)
    h.inv(1, "read", at=2)
    h.ok(0, "write", 5, at=2)
    h.ok(1, "read", 0, at=3)
    assert verdict(h, "register") is True
    # with the read starting strictly after the write returned, it is a stale read
    h.ops[3].time_ns = 2
    h.ops[4].time_ns = 1
    h.ops[4], h.ops[3] = h.ops[3], h.ops[4]
    assert verdict(h, "register") is False


def test_history_order_is_time_when_there_are_no_times():
    ops = [Op(0, "invoke", "write", value=1), Op(0, "ok", "write", value=1),
           Op(1, "invoke", "read"), Op(1, "ok", "read", value=2)]
    r = check(ops, {"model": "register"})
    assert r.valid is False and r.stats["time_order"] == "history order"
    ops[3].value = 1
    assert check(ops, {"model": "register"}).valid is True


def test_nemesis_ops_are_ignored():
    h = H()
    h.inv(-1, "start-partition", ["a"])
    h.op(0, "write", 1)
    h.ev(-1, "info", "start-partition", ["a"])
    h.op(0, "read", None, 1)
    assert verdict(h, "register") is True


# ------------------------------------------------------------------------------------------ cas-register

def test_cas_register():
    h = H()
    h.op(0, "write", 1)
    h.op(1, "cas", [1, 2])
    h.op(0, "read", None, 2)
    h.inv(1, "cas", [1, 3])
    h.fail(1, "cas", [1, 3])                              # a failed cas did nothing
    h.op(0, "read", None, 2)
    assert verdict(h, "cas-register") is True
    h.op(1, "cas", [1, 4])                                # the value is 2: this cas cannot succeed
    assert verdict(h, "cas-register") is False


def test_indeterminate_cas_needs_its_old_value():
    h = H()
    h.op(0, "write", 1)
    h.inv(1, "cas", [1, 2])
    h.info(1, "cas", [1, 2])
    h.op(0, "read", None, 2)
    assert verdict(h, "cas-register") is True
    h = H()
    h.op(0, "write", 5)
    h.inv(1, "cas", [1, 2])
    h.info(1, "cas", [1, 2])
    h.op(0, "read", None, 2)                              # the cas could not have applied to 5
    assert verdict(h, "cas-register") is False


def test_malformed_cas_value_is_an_input_error():
    h = H()
    h.op(0, "cas", 3)
    r = check(h.ops, {"model": "cas-register"})
    assert r.valid == "unknown" and r.stats["input_error"]
    assert "cas needs the value [old new]" in r.stats["error"] and "#0" in r.stats["error"]


def test_unknown_f_and_model_are_input_errors():
    h = H()
    h.op(0, "enqueue", 1)
    r = check(h.ops, {"model": "register"})
    assert r.valid == "unknown" and "not an operation of the register model" in r.stats["error"]
    r = check(h.ops, {"model": "nope"})
    assert r.valid == "unknown" and "unknown model 'nope'" in r.stats["error"]


# ------------------------------------------------------------------------------------------ kv

def test_kv_is_partitioned_by_key():
    h = H()
    h.op(0, "put", "a", key="x")
    h.op(1, "put", "b", key="y")
    h.op(0, "append", "c", key="x")
    h.op(1, "get", None, "ac", key="x")
    h.op(0, "get", None, "b", key="y")
    h.op(0, "get", None, None, key="z")                   # an absent key
    r = check(h.ops, {"model": "kv"})
    assert r.valid is True and r.stats["partitions"] == 3
    h.op(1, "get", None, "a", key="x")                    # lost the append
    r = check(h.ops, {"model": "kv"})
    assert r.valid is False
    [ce] = r.anomalies[ANOMALY]
    assert ce["key"] == "x" and ce["op"]["value"] == "a" and ce["state"] == "ac"
    assert r.stats["invalid_keys"] == ["x"]


def test_kv_absent_key_reads_as_empty_and_lists_append():
    h = H()
    h.op(0, "get", None, "", key="k")
    h.op(0, "append", [1, 2], key="l")
    h.op(0, "append", 3, key="l")
    h.op(1, "get", None, [1, 2, 3], key="l")
    assert verdict(h, "kv") is True
    h.op(1, "get", None, [1, 3], key="l")
    assert verdict(h, "kv") is False


def test_independent_tuples_select_the_key():
    h = H()
    for k in ("a", "b"):
        h.inv(0, "write", [k, 1])
        h.ok(0, "write", [k, 1])
    h.inv(1, "read", ["a", None])
    h.ok(1, "read", ["a", 1])
    h.inv(1, "read", ["b", None])
    h.ok(1, "read", ["b", 1])
    r = check(h.ops, {"model": "register"})
    assert r.valid is True and r.stats["independent"] is True and r.stats["partitions"] == 2
    h.inv(1, "read", ["b", None])
    h.ok(1, "read", ["b", 2])
    r = check(h.ops, {"model": "register"})
    assert r.valid is False and r.anomalies[ANOMALY][0]["key"] == "b"


def test_parallel_partitions_agree_with_sequential():
    rng = random.Random(4)
    h = H()
    state = {}
    for n in range(400):
        k = f"k{rng.randrange(8)}"
        if rng.random() < 0.5:
            v = rng.randrange(3)
            state[k] = v
            h.op(n % 5, "put", v, key=k)
        else:
            h.op(n % 5, "get", None, state.get(k, ""), key=k)
    seq = check(h.ops, {"model": "kv", "parallel": False})
    par = check(h.ops, {"model": "kv", "parallel_min_ops": 0})
    assert seq.valid is True and par.valid is True and par.stats["parallel"] is True
    h.op(0, "get", None, 99, key="k3")
    par = check(h.ops, {"model": "kv", "parallel_min_ops": 0})
    assert par.valid is False and par.anomalies[ANOMALY][0]["key"] == "k3"


# ------------------------------------------------------------------------------------------ queue, set, mutex

def test_fifo_queue():
    h = H()
    h.op(0, "enqueue", 1)
    h.op(0, "enqueue", 2)
    h.op(1, "dequeue", None, 1)
    h.op(1, "dequeue", None, 2)
    h.op(1, "dequeue", None, None)                        # empty
    assert verdict(h, "fifo-queue") is True
    h = H()
    h.op(0, "enqueue", 1)
    h.op(0, "enqueue", 2)
    h.op(1, "dequeue", None, 2)                           # out of order
    assert verdict(h, "queue") is False


def test_queue_indeterminate_dequeue_may_have_taken_the_head():
    h = H()
    h.op(0, "enqueue", 1)
    h.op(0, "enqueue", 2)
    h.inv(1, "dequeue")
    h.info(1, "dequeue")
    h.op(0, "dequeue", None, 2)
    assert verdict(h, "fifo-queue") is True
    h.op(0, "dequeue", None, 1)                           # 1 was taken by the crashed dequeue
    assert verdict(h, "fifo-queue") is False


def test_queue_dequeue_of_empty():
    h = H()
    h.op(0, "enqueue", 1)
    h.op(1, "dequeue", None, None)                        # empty after an ok enqueue
    assert verdict(h, "fifo-queue") is False


def test_set():
    h = H()
    h.op(0, "add", 1)
    h.inv(1, "add", 2)
    h.inv(2, "read")
    h.ok(2, "read", [1])                                  # the concurrent add not yet in
    h.ok(1, "add", 2)
    h.op(2, "read", None, [2, 1])
    assert verdict(h, "set") is True
    h.op(2, "read", None, [1])                            # 2 vanished
    assert verdict(h, "set") is False


def test_set_read_must_be_a_collection():
    h = H()
    h.op(0, "read", None, 5)
    r = check(h.ops, {"model": "set"})
    assert r.valid == "unknown" and "whole set" in r.stats["error"]


def test_mutex():
    h = H()
    h.op(0, "acquire")
    h.op(0, "release")
    h.op(1, "acquire")
    assert verdict(h, "mutex") is True
    h.op(0, "acquire")                                    # held by 1
    assert verdict(h, "lease") is False
    h = H()
    h.op(0, "acquire")
    h.inv(1, "release")
    h.info(1, "release")                                  # a crashed release may have freed it
    h.op(2, "acquire")
    assert verdict(h, "mutex") is True


# ------------------------------------------------------------------------------------------ models

def test_models_describe_and_unknown_state():
    reg = get("cas-register")
    assert reg.step("cas")(UNKNOWN, (1, 2)) == 2
    assert reg.step("read")(UNKNOWN, 3) == 3
    assert reg.step("read")(4, 3) is ILLEGAL
    kv = get("kv")
    s = kv.step("append")(UNKNOWN, "ab")
    assert kv.step("get")(s, "xab") == "xab" and kv.step("get")(s, "xa") is ILLEGAL
    assert kv.describe(s) == {"ends_with": "ab"}
    assert get("queue").unknown() is None
    assert get("mutex").describe(True) == "held"


# ------------------------------------------------------------------------------------------ counterexample

def simulated(n: int, procs: int = 6, info: float = 0.1, values: int = 4, seed: int = 1) -> list[Op]:
    """A cas-register history from a real register: each op takes effect at a random instant inside
    its interval; an indeterminate op's effect is applied or not at random."""
    rng = random.Random(seed)
    free = [(rng.random(), p) for p in range(procs)]
    pid = list(range(procs))
    recs = []
    for _ in range(n):
        free.sort()
        t, th = free.pop(0)
        f = rng.choice(("read", "write", "cas"))
        v = None if f == "read" else rng.randrange(values) if f == "write" else [rng.randrange(values),
                                                                                 rng.randrange(values)]
        d = 0.05 + rng.expovariate(1)
        crash = rng.random() < info
        recs.append({"p": pid[th], "f": f, "v": v, "a": t, "b": t + d, "lin": rng.uniform(t, t + d),
                     "crash": crash, "apply": not crash or rng.random() < 0.5})
        if crash:
            pid[th] += procs
        free.append((t + d + rng.random() * 0.1, th))
    reg = None
    for r in sorted(recs, key=lambda r: r["lin"]):
        ok = True
        if r["f"] == "read":
            r["out"] = reg
        elif r["f"] == "write":
            reg = r["v"] if r["apply"] else reg
            r["out"] = r["v"]
        else:
            ok = reg == r["v"][0]
            if ok and r["apply"]:
                reg = r["v"][1]
            r["out"] = r["v"]
        r["type"] = "info" if r["crash"] else "ok" if ok else "fail"
    ev = []
    for n_, r in enumerate(recs):
        ev.append((r["a"], 0, n_, Op(process=r["p"], type="invoke", f=r["f"], value=r["v"])))
        ev.append((r["b"], 1, n_, Op(process=r["p"], type=r["type"], f=r["f"],
                                     value=r["out"] if r["type"] == "ok" else r["v"])))
    ev.sort(key=lambda e: e[:3])
    out = []
    for i, e in enumerate(ev):
        e[3].index, e[3].time_ns = i, int(e[0] * 1e6)
        out.append(e[3])
    return out


def with_bad_read(ops: list[Op], at: float, value: object = 99) -> list[Op]:
    """The same history with the ok read nearest fraction `at` of it returning `value`."""
    reads = [o for o in ops if o.type == "ok" and o.f == "read"]
    reads[int(at * (len(reads) - 1))].value = value
    return ops


def test_counterexample_prefix_op_state_and_bounds():
    h = H()
    h.op(0, "write", 1)
    h.inv(1, "write", 2)
    h.info(1, "write", 2)
    h.op(0, "read", None, 2)
    h.op(0, "write", 3)
    h.op(2, "read", None, 2)                              # the crashed write was used already
    r = check(h.ops, {"model": "register"})
    assert r.valid is False
    [ce] = r.anomalies[ANOMALY]
    assert [(p["op"]["f"], p["op"]["value"], p["state"], p["indeterminate"]) for p in ce["prefix"]] == [
        ("write", 1, 1, False), ("write", 2, 2, True), ("read", 2, 2, False), ("write", 3, 3, False)]
    assert ce["op"]["process"] == 2 and ce["op"]["value"] == 2 and ce["state"] == 3
    assert ce["op"]["invoke_index"] == 8 and ce["op"]["index"] == 9
    assert ce["prefix_length"] == 4 and ce["prefix_omitted"] == 0 and ce["state_before_prefix"] is None
    assert [c["process"] for c in ce["cannot_place"]] == [2]
    assert "read 2 by process 2 cannot be linearized" in ce["message"]
    r = check(h.ops, {"model": "register", "max_prefix": 2})
    ce = r.anomalies[ANOMALY][0]
    assert len(ce["prefix"]) == 2 and ce["prefix_omitted"] == 2 and ce["state_before_prefix"] == 2


def test_the_first_invalid_key_decides():
    h = H()
    for k in "abc":
        h.op(0, "put", 1, key=k)
        h.op(0, "get", None, 2, key=k)
    r = check(h.ops, {"model": "kv", "parallel": False})
    assert r.valid is False and len(r.anomalies[ANOMALY]) == 1
    assert r.stats["invalid_count"] == 1 and r.stats["unchecked_partitions"] == 2


def test_simulated_histories_are_valid():
    for seed in range(5):
        r = check(simulated(1500, seed=seed), {"model": "cas-register"})
        assert r.valid is True, (seed, r.stats)


def test_a_violation_late_in_a_long_history_is_found_and_refuted_locally():
    ops = with_bad_read(simulated(1500, seed=3), 0.8)
    r = check(ops, {"model": "cas-register", "stall_steps": 200})
    assert r.valid is False
    ce = r.anomalies[ANOMALY][0]
    assert ce["op"]["f"] == "read" and ce["op"]["value"] == 99
    assert ce["refuted_window"]["ops"] >= 1 and r.stats["refutations_tried"] >= 1
    assert ce["prefix_length"] > 600                    # it got that far before it stuck


# ------------------------------------------------------------------------------------------ budgets

def _hard() -> list[Op]:
    """A violation the search cannot refute locally (window refutation off), late in a long
    history with indeterminate ops: deciding it means ruling out a great many orders."""
    return with_bad_read(simulated(3000, procs=10, info=0.2, seed=5), 0.9)


def test_time_limit_gives_unknown_with_the_reason():
    r = check(_hard(), {"model": "cas-register", "time_limit_s": 0.5, "refute": False,
                        "stall_steps": 10 ** 9})
    assert r.valid == "unknown" and r.stats["reason"] == "time limit"
    assert r.anomalies == {}
    assert r.stats["unknown_keys"] == {"": "time limit"}


def test_cache_limit_gives_unknown_with_the_reason():
    r = check(_hard(), {"model": "cas-register", "max_cache": 5000, "refute": False,
                        "stall_steps": 10 ** 9})
    assert r.valid == "unknown" and r.stats["reason"] == "cache limit"


def test_hard_history_is_decided_with_refutation():
    assert check(_hard(), {"model": "cas-register", "time_limit_s": 60}).valid is False


def _appends_before_a_put(long_call: int) -> H:
    """Five long appends that no read ever sees, concurrent with a put that hides them (when they go
    before it), then 30 short appends each seen by a read, and a last read of them all."""
    h = H()
    for p in range(5):
        h.inv(10 + p, "append", f"x{p}", key="k", at=long_call + p)
    h.inv(1, "put", "p", key="k", at=50)
    h.ok(1, "put", "p", key="k", at=60)
    seen = "p"
    t = 100
    for n in range(30):
        h.inv(2, "append", f"q{n}", key="k", at=t)
        h.ok(2, "append", f"q{n}", key="k", at=t + 1)
        seen += f"q{n}"
        h.inv(3, "get", key="k", at=t + 2)
        h.ok(3, "get", seen, key="k", at=t + 3)
        t += 10
    for p in range(5):
        h.ok(10 + p, "append", f"x{p}", key="k", at=t + p)
    h.inv(3, "get", key="k", at=t + 10)
    h.ok(3, "get", seen, key="k", at=t + 11)
    return h


def test_kv_appends_no_read_sees_go_before_the_put_without_trying_every_order():
    r = check(_appends_before_a_put(long_call=10).ops, {"model": "kv"})
    assert r.valid is True
    assert r.stats["search_steps"] < 2000, r.stats       # not every order of 5 appends x 30 places
    bad = _appends_before_a_put(long_call=70)             # the appends begin after the put: seen or not
    r = check(bad.ops, {"model": "kv"})
    assert r.valid is False
    assert r.stats["search_steps"] < 5000, r.stats
