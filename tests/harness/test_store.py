"""The run folder's store: merging journals, tolerating a torn tail, naming corrupt lines, Parquet schemas."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core import store
from core.history import CheckResult, HistoryError, Journal, MessageId, Op


def _line(**d) -> str:
    base = {"process": 0, "type": "invoke", "f": "send", "key": "t", "value": None, "message_id": None,
            "node": "", "error": "", "time_ns": 0}
    base.update(d)
    return json.dumps(base) + "\n"


def test_create_run_dir_and_latest(tmp_path):
    a = store.create_run_dir(tmp_path, "t1", when=1_700_000_000)
    b = store.create_run_dir(tmp_path, "t1", when=1_700_000_000)      # same second: a suffix
    assert a.parent == b.parent == tmp_path / "t1" and b.name == a.name + "-2"
    assert (a / "journals").is_dir()
    assert (tmp_path / "latest").resolve() == b.resolve()
    assert not os.path.isabs(os.readlink(tmp_path / "latest"))        # relative: the folder can move


def test_merge_orders_across_journals_by_time_then_journal_then_position(tmp_path):
    run = store.create_run_dir(tmp_path, "m")
    j = run / "journals"
    (j / "worker-0.jsonl").write_text(
        _line(process=0, time_ns=10, value=1) + _line(process=0, type="ok", time_ns=30, value=1)
        + _line(process=0, time_ns=50, value=3) + _line(process=0, type="ok", time_ns=50, value=3))
    (j / "worker-1.jsonl").write_text(
        _line(process=1, time_ns=20, value=2) + _line(process=1, type="ok", time_ns=30, value=2))
    (j / "nemesis.jsonl").write_text(
        _line(process=-1, f="start-kill", key="", time_ns=25) + _line(process=-1, type="info", f="start-kill",
                                                                         key="", time_ns=30))
    history = store.merge(run)
    got = [(op.time_ns, op.process, op.type) for op in history]
    assert got == [(10, 0, "invoke"), (20, 1, "invoke"), (25, -1, "invoke"),
                   (30, -1, "info"),            # equal times: by journal name (nemesis < worker-0 < worker-1)
                   (30, 0, "ok"), (30, 1, "ok"),
                   (50, 0, "invoke"), (50, 0, "ok")]   # equal times in one journal: file order
    assert [op.index for op in history] == list(range(8))
    # the merged history on disk is the same, and load_history prefers it
    assert [op.to_json() for op in store.load_history(run)] == [op.to_json() for op in history]


def test_journal_roundtrip_through_merge(tmp_path):
    run = store.create_run_dir(tmp_path, "j")
    jn = Journal(store.worker_journal(run, 0), t0_ns=0)
    inv = jn.append(Op(process=3, type="invoke", f="send", key="t", value=7))
    jn.append(inv.complete("ok", message_id=MessageId(4, 5, -1, 2), node="broker-1"))
    jn.close()
    h = store.load_history(run)             # no history.jsonl yet: merged in memory
    assert [o.type for o in h] == ["invoke", "ok"] and h[1].message_id == MessageId(4, 5, -1, 2)
    assert not (run / "history.jsonl").exists()


def test_torn_last_line_is_tolerated(tmp_path):
    run = store.create_run_dir(tmp_path, "torn")
    (run / "journals" / "worker-0.jsonl").write_text(_line(time_ns=1) + _line(type="ok", time_ns=2)
                                                     + '{"process": 0, "type": "inv')
    history = store.merge(run)
    assert [op.type for op in history] == ["invoke", "ok"]


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    run = store.create_run_dir(tmp_path, "bad")
    path = run / "journals" / "worker-0.jsonl"
    path.write_text(_line(time_ns=1) + "garbage\n" + _line(type="ok", time_ns=2))
    with pytest.raises(HistoryError) as e:
        store.merge(run)
    msg = str(e.value)
    assert f"{path}:2" in msg and "fix:" in msg and "\n" not in msg
    (run / "journals" / "worker-0.jsonl").write_text(_line(time_ns=1))
    store.merge(run)
    (run / "history.jsonl").write_text(_line(time_ns=1) + '{"type": "nonsense"}\n' + _line(time_ns=2))
    with pytest.raises(HistoryError, match=r"history\.jsonl:2"):
        store.load_history(run)


def test_not_a_run_folder(tmp_path):
    with pytest.raises(HistoryError, match="no such run folder"):
        store.load_history(tmp_path / "nope")
    with pytest.raises(HistoryError, match="not a run folder"):
        store.load_history(tmp_path)


def _invokes(table):
    return [(r["index"], r["invoke_index"], r["invoke_time_ns"], r["invoke_key"], r["invoke_value"])
            for r in table.to_pylist()]


def test_each_completion_records_its_invoke_across_chunks():
    """A completion records the previous op of its process when that is an invoke of the same f (the
    checkers' pairing); an invoke, an orphan and a completion after another f's invoke record nothing;
    a history written a chunk at a time pairs across the chunks, and out-of-order ops by index."""
    ops = [Op(process=0, type="invoke", f="send", key="t0", value=1, time_ns=10, index=0),
           Op(process=1, type="invoke", f="send", key="t1", value="2", time_ns=11, index=1),
           Op(process=0, type="ok", f="send", key="", value=None, time_ns=12, index=2),
           Op(process=2, type="ok", f="send", key="t0", value=3, time_ns=13, index=3),       # orphan
           Op(process=1, type="info", f="send", key="t1", value="2", time_ns=14, index=4),
           Op(process=3, type="invoke", f="receive", key="t0", time_ns=15, index=5),
           Op(process=3, type="ok", f="read", key="t0", value=[], time_ns=16, index=6),      # another f
           Op(process=0, type="invoke", f="send", key="t0", value=[4, {"a": 1}], time_ns=17, index=7),
           Op(process=0, type="fail", f="send", key="t0", time_ns=18, index=8)]
    want = [(0, None, None, None, None), (1, None, None, None, None), (2, 0, 10, "t0", "1"),
            (3, None, None, None, None), (4, 1, 11, "t1", '"2"'), (5, None, None, None, None),
            (6, None, None, None, None), (7, None, None, None, None), (8, 7, 17, "t0", '[4,{"a":1}]')]
    assert _invokes(store.history_table(ops)) == want
    assert _invokes(store.history_table(list(reversed(ops)))) == want
    last: dict = {}
    chunks = [store.history_table(ops[i:i + 2], last) for i in range(0, len(ops), 2)]
    assert [r for t in chunks for r in _invokes(t)] == want
    # without the carried state the second chunk's completion has no invoke: the state is what pairs
    assert _invokes(store.history_table(ops[2:4]))[0] == (2, None, None, None, None)


def test_parquet_schemas_and_deliveries(tmp_path):
    run = store.create_run_dir(tmp_path, "pq")
    mid = {"ledger_id": 1, "entry_id": 2, "partition": -1, "batch_index": 0}
    mid2 = {"ledger_id": 1, "entry_id": 2, "partition": -1, "batch_index": 1}
    recv = [{"value": 11, "message_id": mid, "redelivery_count": 0},
            {"value": 12, "message_id": mid2, "redelivery_count": 1}]
    read = [{"value": 11, "message_id": mid}, {"value": 12, "message_id": mid2}, {"value": 13, "message_id": mid}]
    (run / "journals" / "worker-0.jsonl").write_text(
        _line(process=0, time_ns=1, value=11)
        + _line(process=0, type="ok", time_ns=2, value=11, message_id=mid, node="broker-1")
        + _line(process=1, f="receive", time_ns=3)
        + _line(process=1, type="ok", f="receive", time_ns=4, value=recv, node="broker-2")
        + _line(process=1, f="receive", time_ns=5)
        + _line(process=1, type="fail", f="receive", time_ns=6, error="Timeout: nothing"))
    (run / "journals" / "final-reads.jsonl").write_text(
        _line(process=1_000_000, f="read", time_ns=7) + _line(process=1_000_000, type="ok", f="read", time_ns=8,
                                                             value=read))
    store.merge(run)
    h = pq.read_table(run / "history.parquet")
    mid_t = pa.struct([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("partition", pa.int64()),
                       ("batch_index", pa.int64())])
    assert h.schema == pa.schema([("index", pa.int64()), ("time_ns", pa.int64()), ("process", pa.int64()),
                                  ("type", pa.string()), ("f", pa.string()), ("key", pa.string()),
                                  ("value", pa.string()), ("message_id", mid_t), ("node", pa.string()),
                                  ("error", pa.string()), ("invoke_index", pa.int64()),
                                  ("invoke_time_ns", pa.int64()), ("invoke_key", pa.string()),
                                  ("invoke_value", pa.string())])
    rows = h.to_pylist()
    assert len(rows) == 8 and rows[1]["message_id"] == mid and rows[0]["message_id"] is None
    assert json.loads(rows[3]["value"]) == recv and rows[2]["value"] is None
    assert rows[5]["error"] == "Timeout: nothing"
    d = pq.read_table(run / "deliveries.parquet")
    assert d.schema == pa.schema([("index", pa.int64()), ("time_ns", pa.int64()), ("process", pa.int64()),
                                  ("f", pa.string()), ("key", pa.string()), ("position", pa.int64()),
                                  ("value", pa.int64()), ("message_id", mid_t),
                                  ("redelivery_count", pa.int64())])
    drows = d.to_pylist()
    assert [(r["f"], r["value"], r["position"], r["redelivery_count"]) for r in drows] == [
        ("receive", 11, 0, 0), ("receive", 12, 1, 1), ("read", 11, 0, None), ("read", 12, 1, None),
        ("read", 13, 2, None)]
    assert drows[0]["index"] == 3 and drows[1]["message_id"] == mid2 and drows[2]["process"] == 1_000_000


def test_results_json_schema(tmp_path):
    run = store.create_run_dir(tmp_path, "r")
    res = CheckResult(False, {"lost": [{"value": 1}]}, {"n": 1})
    store.write_results(run, valid=store.verdict([res, CheckResult(True)]), exit_code=1, error=None,
                        run={"dir": str(run), "timings": {}}, checkers={"log": res})
    data = json.loads((run / "results.json").read_text())
    assert data["valid"] is False and data["exit_code"] == 1 and data["error"] is None
    assert data["checkers"]["log"] == {"valid": False, "anomalies": {"lost": [{"value": 1}]}, "stats": {"n": 1}}
    assert store.verdict([CheckResult(True), CheckResult("unknown")]) == "unknown"
    assert store.verdict([]) == "unknown"
    assert [store.exit_code_for(v) for v in (True, False, "unknown")] == [0, 1, 2]
