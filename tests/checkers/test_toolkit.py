"""The checkers' shared toolkit, one test per public helper; and the rule that checkers share only through it.

The rule: no module of checkers/ imports another checker module's underscore names, no two modules
of checkers/ import each other, and checkers.toolkit imports no checker.
"""
from __future__ import annotations

import ast
import gc
from pathlib import Path

import pytest

from checkers.toolkit import (BATCH_LIMIT, ENTRY_LIMIT, Cases, OpRefs, anomalies_of, anomaly_stats, full_op,
                              gc_paused, jsonable, mid_json, mid_tuple, norm_value, op_names, partition_of,
                              percentile, position_key, redelivery_count, rounded, unpack_position, verdict)
from core.history import MessageId, Op

CHECKERS = Path(__file__).resolve().parents[2] / "checkers"


def test_gc_paused_restores_the_collector():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("the collector comes back on errors too")
    assert gc.isenabled()


def test_norm_value_makes_int_spellings_one_key():
    assert norm_value(7) == norm_value(" 7 ") == norm_value(b"7") == norm_value(7.0) == 7
    assert norm_value("x") == "x"
    assert norm_value(None) is None and norm_value(True) is True
    assert norm_value(2.5) == 2.5
    assert norm_value([1, 2]) == "[1, 2]"            # unhashable: its text


def test_redelivery_count_reads_any_spelling():
    assert redelivery_count(3) == 3
    assert redelivery_count("2") == 2
    assert redelivery_count(None) == redelivery_count("") == redelivery_count("x") == 0


def test_mid_tuple_and_mid_json():
    want = (5, 9, 1, 0)
    assert mid_tuple({"ledger_id": 5, "entry_id": 9, "partition": 1, "batch_index": 0}) == want
    assert mid_tuple(MessageId(5, 9, 1, 0)) == want
    assert mid_tuple("(5,9,1,0)") == mid_tuple("5:9:1:0") == mid_tuple([5, 9, 1, 0]) == want
    assert mid_tuple([5, 9]) == (5, 9, -1, -1)
    assert mid_tuple(None) is None and mid_tuple({"ledger_id": 1}) is None and mid_tuple("x") is None
    assert mid_json(want) == {"ledger_id": 5, "entry_id": 9, "partition": 1, "batch_index": 0}
    assert mid_json(None) is None


def test_partition_of():
    assert partition_of({"ledger_id": 1, "entry_id": 2, "partition": 3}) == 3
    assert partition_of({"ledger_id": 1, "entry_id": 2, "partition": "3"}) == 3     # read as the int
    assert partition_of({"ledger_id": 1, "entry_id": 2}) == -1
    assert partition_of(MessageId(1, 2, 4)) == 4
    assert partition_of([1, 2, 5, -1]) == 5
    assert partition_of(None) == partition_of("junk") == -1


def test_position_key_orders_as_the_log_and_ignores_the_partition():
    a = position_key({"ledger_id": 1, "entry_id": 2, "partition": 0, "batch_index": -1})
    assert a == position_key(MessageId(1, 2, 7, 0)) == position_key([1, 2])        # batch -1 is 0
    assert type(a) is int and unpack_position(a) == (1, 2, 0)
    b = position_key({"ledger_id": 1, "entry_id": 3})
    c = position_key({"ledger_id": 2, "entry_id": 0})
    assert a < b < c
    big = position_key({"ledger_id": 1, "entry_id": ENTRY_LIMIT, "batch_index": BATCH_LIMIT})
    assert big == (1, ENTRY_LIMIT, BATCH_LIMIT) == unpack_position(big)          # too big to pack: a tuple
    assert position_key({"ledger_id": "1", "entry_id": "2"}) == a
    assert position_key(None) is None and position_key({"entry_id": 1}) is None


def test_jsonable_and_full_op():
    assert jsonable({1: {3, 1}, "m": MessageId(1, 2), "b": b"x", "t": (1, None)}) == {
        "1": [1, 3], "m": {"ledger_id": 1, "entry_id": 2, "partition": -1, "batch_index": -1},
        "b": "x", "t": [1, None]}
    assert jsonable({1, "a"}) in ([1, "a"], ["a", 1])    # unsortable set: a list all the same
    assert jsonable(Path("/x")) == "/x"                  # anything else: its text
    op = Op(process=1, type="ok", f="send", key="t", value={"v": {2}}, message_id=MessageId(1, 2))
    got = full_op(op)
    assert got["value"] == {"v": [2]} and got["message_id"]["entry_id"] == 2 and got["f"] == "send"
    assert full_op(None) is None


def test_op_refs_find_an_op_without_an_index_by_identity():
    class Refs(OpRefs):
        def __init__(self, h: list[Op]):
            self.h = h

    a = Op(process=1, type="invoke", f="send", key="t", time_ns=1_500_000_000)
    b = Op(process=1, type="info", f="send", key="t", node="n1", error="timeout", time_ns=2_000_000_000)
    refs = Refs([a, b])
    assert refs.op_index(b) == 1 and refs.op_index(Op(process=2, type="ok", f="x")) == -1
    assert refs.ref(a) == {"index": 0, "time_s": 1.5, "process": 1, "type": "invoke", "f": "send", "node": None}
    assert refs.ref(b)["error"] == "timeout" and refs.ref(None) is None
    refs.ref_key = True
    assert list(refs.ref(b)) == ["index", "time_s", "process", "type", "f", "key", "node", "error"]


def test_percentile_and_rounded():
    vals = [1.0, 2.0, 3.0, 4.0]
    assert percentile(vals, 0.5) == 2.0 and percentile(vals, 0.99) == 4.0 and percentile(vals, 0) == 1.0
    assert percentile([], 0.5) is None
    assert rounded(1.23456) == 1.235 and rounded(1.23456, 1) == 1.2 and rounded(None) is None


def test_op_names_gives_each_name_to_the_first_option_listing_it():
    send, recv, read = op_names({"send": ["send"], "receive": ["receive", "send"], "read": ["read", "receive"]})
    assert (send, recv, read) == ({"send"}, {"receive"}, {"read"})
    enq, drain, deq = op_names({"enqueue": ("enqueue",), "drain": None, "dequeue": ("dequeue",)},
                               "enqueue", "drain", "dequeue")
    assert (enq, drain, deq) == ({"enqueue"}, frozenset(), {"dequeue"})


def test_cases_cap_the_evidence_not_the_count():
    made = []
    lost, dup = Cases(2), Cases(None)
    for i in range(3):
        lost.add(lambda: made.append(i) or {"i": i})
    dup.add(lambda: "d")
    assert lost.count == 3 and lost.evidence == [{"i": 0}, {"i": 1}] and made == [0, 1]
    cases = {"lost": lost, "none": Cases(5), "dup": dup}
    assert anomalies_of(cases) == {"lost": [{"i": 0}, {"i": 1}], "dup": ["d"]}
    assert list(anomalies_of(cases)) == ["lost", "dup"]                      # the order of `cases`
    assert anomaly_stats(cases) == {"anomaly_counts": {"lost": 3, "dup": 1},
                                    "anomalies_truncated": {"lost": 3}}
    assert verdict(cases, {"lost"}) is False
    assert verdict(cases, {"none", "other"}) is True
    assert verdict(cases, {"none"}, unknown=True) == "unknown"
    assert verdict(cases, {"dup"}, unknown=True) is False


# --------------------------------------------------------------------------- how checkers share code

def _imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) of every name a file takes from a module: `from m import name`, and `import m`
    (as `a`) followed by `a.name`. Relative imports are resolved."""
    pkg = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, str | None]] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((a.name, None))
                if a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out += [(base, a.name) for a in node.names]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            out.append((aliases[node.value.id], node.attr))
    return out


def _module(path: Path) -> str:
    parts = path.relative_to(CHECKERS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _checker_modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted(CHECKERS.rglob("*.py"))}


def test_no_checker_imports_another_checkers_private_names():
    mods = _checker_modules()
    bad = [f"{mod} imports {name} from {src}" for mod, path in mods.items()
           for src, name in _imports(path)
           if src in mods and src != mod and name is not None and name.startswith("_")]
    assert not bad, bad


def test_checker_modules_do_not_import_each_other():
    mods = _checker_modules()
    deps = {mod: {f"{src}.{name}" if f"{src}.{name}" in mods else src for src, name in _imports(path)}
            & set(mods) - {mod} for mod, path in mods.items()}
    assert not deps["checkers.toolkit"], "checkers.toolkit imports a checker"
    pairs = sorted((a, b) for a in deps for b in deps[a] if a < b and a in deps.get(b, set()))
    assert not pairs, pairs
    assert "checkers.toolkit" in deps["checkers.log"]         # the test sees the imports at all


def test_anomaly_stats_names_the_invalidating_types_when_given():
    cases = {"lost": Cases(10), "unseen": Cases(10)}
    cases["lost"].add(lambda: {"index": 1})
    cases["unseen"].add(lambda: {"index": 0})
    assert "invalid_types" not in anomaly_stats(cases)
    assert anomaly_stats(cases, {"lost"})["invalid_types"] == ["lost"]
