"""Histories from the wild, written by us: a corpus of hand-made files in every shape Jepsen and
Knossos write (tests/checkers/data/corpus/), each with its known verdict through `pulsar-chaos lin`;
generated histories round-tripped through each shape keep their verdict; multi-register and
--initial."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkers.jepsen_format import read_history
from checkers.linear import check
from checkers.models import freeze
from core.history import Op
from tests.checkers.test_jepsen_format import lin
from tests.checkers.test_linear import H
from tests.checkers.test_linear_property import histories

CORPUS = Path(__file__).parent / "data" / "corpus"


# ------------------------------------------------------------------------------------------ the corpus

@pytest.mark.parametrize("name,model,initial,code,named", [
    ("kv-key-valid.edn", "kv", None, 0, None),
    ("kv-key-stale.edn", "kv", None, 1, "key 'a': get 2  by process 1 cannot be linearized"),
    ("knossos-vector-valid.edn", "cas-register", None, 0, None),
    ("knossos-list-invalid.edn", "register", None, 1, "read 1 by process 1 cannot be linearized"),
    ("records-valid.edn", "fifo-queue", None, 0, None),
    ("independent-invalid.edn", "cas-register", None, 1, "key 2: cas [2, [5, 8]] by process 1"),
    ("multi-register-valid.edn", "multi-register", None, 0, None),
    ("multi-register-torn.edn", "multi-register", None, 1, "txn [['read', 'x', 1], ['read', 'y', 0]] by process 1"),
    ("multi-register-initial.edn", "multi-register", '{"x": 0, "y": 0}', 0, None),
    ("multi-register-initial.edn", "multi-register", None, 1, "by process 0 cannot be linearized"),
    ("spaced-invalid.log", "cas-register", None, 1, "read 1 by process 0 cannot be linearized"),
])
def test_corpus_verdicts(capsys, name, model, initial, code, named):
    argv = ["--model", model] + (["--initial", initial] if initial else []) + [str(CORPUS / name)]
    rc, out, err = lin(capsys, *argv)
    assert rc == code, (out, err)
    assert err == ""
    assert out.startswith("valid: linearizable" if code == 0 else "INVALID: not linearizable"), out
    assert " ops checked: " in out                        # every verdict says how many ops it checked
    if named:
        assert named in out, out


def test_kv_stale_read_names_the_op(capsys):
    rc, out, _ = lin(capsys, "--model", "kv", "--json", str(CORPUS / "kv-key-stale.edn"))
    r = json.loads(out)
    assert rc == 1 and r["stats"]["partitions"] == 2 and r["stats"]["independent"] is False
    [ce] = r["anomalies"]["nonlinearizable"]
    assert ce["key"] == "a" and ce["op"]["process"] == 1 and ce["op"]["value"] == "2 " and ce["state"] == "2 1 "


def test_a_correct_key_field_history_is_valid_and_one_stale_read_makes_it_invalid(tmp_path):
    """A 20-client key-value store simulated by the bench's generator, written with :key fields."""
    from bench.lin_kv import plant_stale, simulate, write_kv_edn
    for seed in (1, 2, 3):
        ops = simulate(20, 600, keys=5, seed=seed)
        p = tmp_path / f"ok-{seed}.txt"
        write_kv_edn(ops, p)
        r = check(read_history(p), {"model": "kv"})
        assert r.valid is True and r.stats["partitions"] == 5, r.stats
        planted = plant_stale(ops)
        write_kv_edn(ops, p)
        r = check(read_history(p), {"model": "kv"})
        assert r.valid is False, (seed, planted)
        [ce] = r.anomalies["nonlinearizable"]                 # the stale read is the op named
        assert ce["key"] == planted["key"] and ce["op"]["f"] == "get", ce["op"]
        assert (ce["op"]["process"], ce["op"]["value"]) == (planted["process"], planted["now"])


# ------------------------------------------------------------------------------------------ shapes

def edn(v) -> str:
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + " ".join(edn(x) for x in v) + "]"
    if isinstance(v, (set, frozenset)):
        return "#{" + " ".join(edn(x) for x in sorted(v, key=repr)) + "}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{edn(k)} {edn(x)}" for k, x in v.items()) + "}"
    return str(v)


def op_map(o: Op, independent: bool, rng: random.Random, spread: bool) -> str:
    fields = [(":process", str(o.process)), (":type", ":" + o.type), (":f", ":" + o.f)]
    if o.key != "" and not independent:
        fields.append((":key", edn(o.key)))
    fields.append((":value", edn([o.key, o.value] if independent else o.value)))
    rng.shuffle(fields)                                   # EDN maps have no order
    sep = (",\n  " if spread else ", ")
    return "{" + sep.join(f"{k} {v}" for k, v in fields) + "}"


SHAPES = ("lines", "records", "spread", "vector", "list")


def write_shape(ops: list[Op], shape: str, path: Path, independent: bool, seed: int) -> None:
    rng = random.Random(seed)
    maps = [op_map(o, independent, rng, shape in ("spread", "vector", "list")) for o in ops]
    if shape == "lines":
        text = "\n".join(maps) + "\n"
    elif shape == "records":
        text = "\n".join("#jepsen.history.Op" + m for m in maps) + "\n"
    elif shape == "spread":
        text = "; maps over several lines\n" + "\n\n".join(maps) + "\n"
    else:
        o, c = ("[", "]") if shape == "vector" else ("(", ")")
        body = ""
        for n, m in enumerate(maps):
            body += ("; a comment\n\n " if n % 3 == 2 else "") + m + "\n "
        text = f"; the whole history, one {shape}\n{o}{body.rstrip()}{c}\n"
    path.write_text(text)


def _untimed(ops: list[Op]) -> list[Op]:
    """The ops as a text history carries them: no clock, list order is time."""
    return [Op(process=o.process, type=o.type, f=o.f, key=o.key, value=o.value, index=i) for i, o in enumerate(ops)]


@pytest.mark.parametrize("model", ["kv", "cas-register", "set"])
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_shape_round_trips_with_the_same_verdict(tmp_path, model, data):
    ops = _untimed(data.draw(histories(model, data.draw(st.booleans()))))
    if not ops:
        return
    want = check(ops, {"model": model}).valid
    for shape in SHAPES:
        for independent in ((False, True) if model == "kv" else (False,)):
            p = tmp_path / f"h-{shape}-{independent}.edn"
            write_shape(ops, shape, p, independent, seed=len(ops))
            got = read_history(p)
            want_ops = [(o.process, o.type, o.f, "" if independent else o.key,
                         freeze([o.key, o.value] if independent else o.value)) for o in ops]
            assert [(o.process, o.type, o.f, o.key, freeze(o.value)) for o in got] == want_ops, shape
            assert check(got, {"model": model}).valid == want, (shape, independent, p.read_text())


# ------------------------------------------------------------------------------------------ multi-register

def txn(*mops):
    return [list(m) for m in mops]


def test_multi_register_hand_made_valid_and_invalid():
    h = H()
    h.inv(0, "txn", txn(("write", "x", 1), ("write", "y", 1)))
    h.inv(1, "txn", txn(("read", "x", None), ("read", "y", None)))
    h.ok(0, "txn", txn(("write", "x", 1), ("write", "y", 1)))
    h.ok(1, "txn", txn(("read", "x", None), ("read", "y", 1)))       # nil: unknown, always legal
    h.op(2, "txn", txn(("write", "x", 2), ("read", "x", None)), txn(("write", "x", 2), ("read", "x", 2)))
    assert check(h.ops, {"model": "multi-register"}).valid is True
    # a txn reads its own writes: reading the old value after writing is invalid
    bad = H()
    bad.op(0, "txn", txn(("write", "x", 1)))
    bad.op(1, "txn", txn(("write", "x", 2), ("read", "x", None)), txn(("write", "x", 2), ("read", "x", 1)))
    assert check(bad.ops, {"model": "multi-register"}).valid is False
    # a read of a register never written must be nil
    never = H()
    never.op(0, "txn", txn(("read", "z", None)), txn(("read", "z", 0)))
    assert check(never.ops, {"model": "multi-register"}).valid is False
    assert check(never.ops, {"model": "multi-register", "initial": {"z": 0}}).valid is True
    assert check(never.ops, {"model": "multi-register", "initial": [["z", 0]]}).valid is True


def test_multi_register_sequential_order_and_indeterminate_txn():
    h = H()
    h.op(0, "txn", txn(("write", "x", 1), ("write", "y", 1)))
    h.inv(1, "txn", txn(("write", "x", 5), ("write", "y", 5)))
    h.info(1, "txn", txn(("write", "x", 5), ("write", "y", 5)))     # timed out: may take effect later
    h.op(2, "txn", txn(("read", "x", None), ("read", "y", None)), txn(("read", "x", 1), ("read", "y", 1)))
    h.op(2, "txn", txn(("read", "x", None), ("read", "y", None)), txn(("read", "x", 5), ("read", "y", 5)))
    assert check(h.ops, {"model": "multi-register"}).valid is True
    h.op(2, "txn", txn(("read", "x", None)), txn(("read", "x", 1)))  # back to 1: nobody wrote it again
    r = check(h.ops, {"model": "multi-register"})
    assert r.valid is False
    [ce] = r.anomalies["nonlinearizable"]
    assert ce["op"]["value"] == [["read", "x", 1]] and ce["state"] == {"x": 5, "y": 5}


def test_multi_register_independent_keys_and_a_two_micro_op_txn():
    h = H()
    h.op(0, "txn", ["k1", txn(("write", "x", 1))])
    h.op(1, "txn", ["k2", txn(("write", "x", 2))])
    h.op(0, "txn", ["k1", txn(("read", "x", None))], ["k1", txn(("read", "x", 1))])
    r = check(h.ops, {"model": "multi-register"})
    assert r.valid is True and r.stats["independent"] is True and r.stats["partitions"] == 2
    two = H()                                # [[:write :x 1] [:read :x nil]] is a txn, not [key value]
    two.op(0, "txn", txn(("write", "x", 1), ("read", "x", None)), txn(("write", "x", 1), ("read", "x", 1)))
    r = check(two.ops, {"model": "multi-register"})
    assert r.valid is True and r.stats["independent"] is False


@pytest.mark.parametrize("value,why", [(5, "list of [f k v]"), ([["cas", "x", 1]], "micro-op")])
def test_multi_register_malformed_txn_is_an_input_error(value, why):
    h = H()
    h.op(0, "txn", value)
    r = check(h.ops, {"model": "multi-register"})
    assert r.valid == "unknown" and r.stats["input_error"] and why in r.stats["error"]


@pytest.mark.parametrize("model,initial,ok", [
    ("cas-register", 0, True), ("register", "a", True), ("kv", "p", True), ("fifo-queue", [1, 2], True),
    ("fifo-queue", 1, False), ("set", [1], True), ("set", "x", False), ("mutex", "held", True),
    ("mutex", 3, False), ("multi-register", {"x": 0}, True), ("multi-register", 7, False)])
def test_initial_states_per_model(model, initial, ok):
    r = check([Op(0, "invoke", {"kv": "get", "fifo-queue": "dequeue", "set": "read", "mutex": "release",
                                "multi-register": "txn"}.get(model, "read"),
                  value=[] if model == "multi-register" else None)], {"model": model, "initial": initial})
    assert (r.stats.get("input_error") is None) is ok, r.stats


def test_initial_state_changes_the_verdict():
    h = H()
    h.op(0, "cas", [0, 1])
    assert check(h.ops, {"model": "cas-register"}).valid is False
    assert check(h.ops, {"model": "cas-register", "initial": 0}).valid is True
    q = H()
    q.op(0, "dequeue", None, 7)
    assert check(q.ops, {"model": "fifo-queue"}).valid is False
    assert check(q.ops, {"model": "fifo-queue", "initial": [7]}).valid is True


@pytest.mark.parametrize("argv,message", [
    (["--initial", "{x"], "is not JSON"),
    (["--initial", "5", "--model", "fifo-queue"], "a fifo-queue's initial state is a list"),
])
def test_lin_bad_initial_is_one_line_and_254(capsys, argv, message):
    if "--model" not in argv:
        argv = argv + ["--model", "cas-register"]
    rc, out, err = lin(capsys, *argv, str(CORPUS / "knossos-vector-valid.edn"))
    assert rc == 254 and out == "" and err.count("\n") == 1 and message in err, err
