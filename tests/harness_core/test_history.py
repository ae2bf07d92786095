"""The history schema: journals, reading back, invoke/completion pairing."""
import json
import threading
import time

import pytest

from core.history import (HistoryError, Journal, MessageId, Op, pairs, read_jsonl, write_jsonl)


def test_journal_round_trip_and_monotonic_times(tmp_path):
    t0 = time.monotonic_ns()
    j = Journal(tmp_path / "w.jsonl", t0)
    inv = j.append(Op(process=1, type="invoke", f="send", key="t", value=7))
    j.append(inv.complete("ok", message_id=MessageId(3, 4), node="broker-1"))
    j.close()
    ops = list(read_jsonl(tmp_path / "w.jsonl"))
    assert [o.type for o in ops] == ["invoke", "ok"]
    assert ops[1].message_id == MessageId(3, 4) and ops[1].value == 7 and ops[1].node == "broker-1"
    assert 0 <= ops[0].time_ns <= ops[1].time_ns


def test_concurrent_appends_are_whole_lines(tmp_path):
    j = Journal(tmp_path / "w.jsonl", time.monotonic_ns())

    def writer(p):
        for i in range(500):
            j.append(Op(process=p, type="invoke", f="send", value=i))
    threads = [threading.Thread(target=writer, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    j.close()
    ops = list(read_jsonl(tmp_path / "w.jsonl"))
    assert len(ops) == 2000
    for p in range(4):
        assert [o.value for o in ops if o.process == p] == list(range(500))


def test_torn_tail_is_skipped_but_corruption_in_the_middle_is_named(tmp_path):
    good = json.dumps(Op(process=0, type="invoke", f="send", value=1).to_json())
    (tmp_path / "torn.jsonl").write_text(good + "\n" + good[:20])
    assert len(list(read_jsonl(tmp_path / "torn.jsonl"))) == 1
    (tmp_path / "bad.jsonl").write_text(good + "\n{not json\n" + good + "\n")
    with pytest.raises(HistoryError, match=r"bad.jsonl:2: malformed"):
        list(read_jsonl(tmp_path / "bad.jsonl"))
    (tmp_path / "badtype.jsonl").write_text(good.replace('"invoke"', '"maybe"') + "\n" + good + "\n")
    with pytest.raises(HistoryError, match=r"badtype.jsonl:1"):
        list(read_jsonl(tmp_path / "badtype.jsonl"))


def test_pairs_match_completions_to_invocations(tmp_path):
    h = [Op(process=0, type="invoke", f="send", value=1, index=0),
         Op(process=1, type="invoke", f="send", value=2, index=1),
         Op(process=1, type="ok", f="send", value=2, index=2),
         Op(process=0, type="info", f="send", value=1, index=3),
         Op(process=2, type="invoke", f="send", value=3, index=4)]
    write_jsonl(h, tmp_path / "h.jsonl")
    got = [(i.value, c.type if c else None) for i, c in pairs(list(read_jsonl(tmp_path / "h.jsonl")))]
    assert got == [(1, "info"), (2, "ok"), (3, None)]
