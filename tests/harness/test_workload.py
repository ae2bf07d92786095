"""The log workload's plan: seeded op streams, thread roles, unique values; the progress tail."""
from __future__ import annotations

import itertools
import json

from harness.progress import JournalTail
from core.spec import TestSpec as Spec
from workloads import log


def _take(spec, thread, n=200):
    return list(itertools.islice(log.generator(spec, thread), n))


def test_same_seed_same_ops_per_thread():
    spec = Spec(seed=42)
    for t in log.threads(spec):
        assert _take(spec, t) == _take(Spec(seed=42), t)
    other = Spec(seed=43)
    sender = next(t for t in log.threads(spec) if t.role == "send")
    assert [p.key for p in _take(spec, sender)] != [p.key for p in _take(other, sender)]


def test_threads_roles_and_workers():
    spec = Spec(concurrency=6, topics=2)
    ts = log.threads(spec, 2)
    assert [t.index for t in ts] == list(range(6))
    recv = [t for t in ts if t.role == "receive"]
    send = [t for t in ts if t.role == "send"]
    assert sorted(x for t in recv for x in t.topics) == [0, 1]        # one Exclusive consumer per topic
    assert {t.batched for t in send} == {True, False}                 # batched and unbatched producers
    assert {t.worker for t in ts} == {0, 1}
    assert all(t.worker == 0 for t in send if t.batched)              # batched senders share producers
    assert [t.role for t in log.threads(Spec(concurrency=1))] == ["send"]
    many = log.threads(Spec(concurrency=3, topics=5), 2)
    assert sorted(x for t in many if t.role == "receive" for x in t.topics) == [0, 1, 2, 3, 4]


def test_values_unique_and_rate_shared():
    spec = Spec(seed=1, concurrency=6, rate=120.0)
    values = []
    for t in log.threads(spec):
        ops = _take(spec, t, 500)
        if t.role == "send":
            values += [p.value for p in ops]
            assert all(p.f == "send" and isinstance(p.value, int) for p in ops)
        else:
            assert all(p.f == "receive" and p.value is None for p in ops)
        mean = sum(p.delay for p in ops) / len(ops)
        assert abs(mean - 6 / 120.0) < 0.01                            # rate / concurrency per thread
    assert len(values) == len(set(values))


def test_topic_names():
    assert log.topic_names("log-chaos", "20260101T000000", 2) == [
        "persistent://public/default/log-chaos-20260101T000000-0",
        "persistent://public/default/log-chaos-20260101T000000-1"]


def test_journal_tail_counts_complete_lines(tmp_path):
    j = tmp_path / "journals"
    j.mkdir()
    f = j / "worker-0.jsonl"
    f.write_text(json.dumps({"f": "send", "type": "invoke", "time_ns": 5}) + "\n"
                 + json.dumps({"f": "send", "type": "ok", "time_ns": 9}) + "\n" + '{"f": "se')
    (j / "nemesis.jsonl").write_text(json.dumps({"f": "start-kill", "type": "invoke", "time_ns": 1}) + "\n")
    tail = JournalTail(j, skip=("nemesis.jsonl",))
    assert tail.poll() == 2 and tail.first_op_ns == 5 and tail.last_op_ns == 9
    with open(f, "a") as fh:
        fh.write('nd", "type": "fail", "time_ns": 12}\n')
    assert tail.poll() == 1
    assert tail.totals() == {"invoke": 1, "ok": 1, "fail": 1, "info": 0}


def test_checkers_resolve_lazily():
    import subprocess
    import sys
    # importing a workload imports no checker module (workers never check)
    probe = "import sys, workloads.log; print(sorted(m for m in sys.modules if m.startswith('checkers.')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    from checkers import log as log_checker
    assert log.checkers(None)["log"][0] is log_checker.check


class _FakeSession:
    name = "fake"

    def producer(self, topic, batched):
        return object()

    def consumer(self, topic):
        return object()


def test_run_thread_journals_pairs_and_retires_info_processes(tmp_path, monkeypatch):
    import threading
    import time

    from core.history import Journal, pairs, read_jsonl
    outcomes = iter(["ok", "fail", "info", "ok", "info", "ok"] + ["ok"] * 1000)

    def fake_send(session, topic, batched, value, pad=0):
        typ = next(outcomes)
        return typ, ({"error": "Timeout"} if typ != "ok" else {"node": "broker-1"})
    monkeypatch.setattr(log, "send", fake_send)
    spec = Spec(seed=3, concurrency=4, rate=400.0, topics=2)
    thread = next(t for t in log.threads(spec) if t.role == "send")
    topics = log.topic_names("t", "r", 2)
    journal = Journal(tmp_path / "w.jsonl", time.monotonic_ns())
    log.run_thread(_FakeSession(), spec, thread, topics, journal, time.monotonic() + 0.3, threading.Event())
    journal.close()
    h = list(read_jsonl(tmp_path / "w.jsonl"))
    for i, op in enumerate(h):
        op.index = i
    ps = list(pairs(h))
    assert len(ps) >= 6 and all(c is not None for _, c in ps)
    procs = [inv.process for inv, _ in ps]
    p0 = thread.index
    assert procs[:6] == [p0, p0, p0, p0 + 4, p0 + 4, p0 + 8]      # a process ends with its info op
    planned = [p.value for p in itertools.islice(log.generator(spec, thread), len(ps))]
    assert [inv.value for inv, _ in ps] == planned                  # the seeded plan, whatever happened
