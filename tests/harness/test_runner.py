"""The runner's promise without a cluster: a failing step still tears down, merges what was journaled,
writes results.json (unknown, with the error) and the report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core import store
from harness import runner
from core.history import HistoryError, Journal, Op
from core.spec import TestSpec as Spec


class _FakeCluster:
    def __init__(self, base: Path):
        self.base_dir = base
        self.downs = 0
        (base / "nodes" / "zk-1" / "data" / "version-2").mkdir(parents=True)
        (base / "nodes" / "zk-1" / "node.log").write_text("zk says hi\n")
        (base / "nodes" / "zk-1" / "data" / "version-2" / "log.1").write_bytes(b"x" * 10)

    def down(self):
        self.downs += 1


def _run(tmp_path, fail_in: str) -> tuple[int, Path, _FakeCluster | None]:
    spec = Spec(test_name="fake", results_dir=str(tmp_path), nemesis=[]).resolved()
    run_dir = store.create_run_dir(tmp_path, spec.test_name)
    store.write_test_toml(run_dir, spec)
    r = runner.Run(spec, run_dir, out=open(run_dir / "out.txt", "w"))
    fake = _FakeCluster(tmp_path / "cluster")

    def deploy():
        if fail_in == "deploy":
            raise RuntimeError("no namespaces today")
        r.cluster = fake

    def workload():
        r.t0_ns = 0
        j = Journal(store.worker_journal(run_dir, 0), 0)
        inv = j.append(Op(process=0, type="invoke", f="send", key="t", value=1))
        j.append(inv.complete("info", error="Timeout"))
        j.close()
        raise RuntimeError("boom")

    r._deploy, r._workload = deploy, workload
    code = r.execute()
    return code, run_dir, (fake if fail_in != "deploy" else None)


def test_failed_step_still_tears_down_merges_and_reports(tmp_path):
    code, run_dir, fake = _run(tmp_path, "workload")
    assert code == 2
    assert fake is not None and fake.downs == 1
    res = json.loads((run_dir / "results.json").read_text())
    assert res["valid"] == "unknown" and res["exit_code"] == 2
    assert res["error"] == "workload: RuntimeError: boom" and res["run"]["step"] == "workload"
    assert "log" in res["checkers"]
    assert [op.f for op in store.load_history(run_dir)] == ["send", "send"]
    assert (run_dir / "history.parquet").exists() and (run_dir / "report.html").exists()
    assert (run_dir / "nodes" / "zk-1" / "node.log").read_text() == "zk says hi\n"
    assert "version-2/log.1" in (run_dir / "nodes" / "zk-1" / "data-listing.txt").read_text()
    assert "verdict: unknown" in (run_dir / "out.txt").read_text()
    assert "boom" in (run_dir / "runner.log").read_text()


def test_failed_deploy_records_the_error(tmp_path):
    code, run_dir, _ = _run(tmp_path, "deploy")
    assert code == 2
    res = json.loads((run_dir / "results.json").read_text())
    assert res["error"] == "deploy: RuntimeError: no namespaces today"
    assert (run_dir / "history.jsonl").read_text() == "" and (run_dir / "report.html").exists()
    # check of a run that recorded no op is an error naming the history and the run's own error, and
    # leaves results.json as the run wrote it (unknown)
    with pytest.raises(HistoryError, match=r"history\.jsonl: no client op in the history \(the run recorded: "
                                           r"deploy: RuntimeError: no namespaces today\); expected .*fix:"):
        runner.recheck(run_dir, out=None)
    assert json.loads((run_dir / "results.json").read_text())["error"] == "deploy: RuntimeError: no namespaces today"
    assert runner.rereport(run_dir).exists()          # the report is still made


def _history_losing_a_send_after_a_partition(run_dir: Path) -> None:
    """A partition from 5 s; a send acknowledged at 6.1 s (invoked at 6.0 s) that the final read misses."""
    from core.history import NEMESIS_PROCESS, MessageId, write_jsonl
    S = 1_000_000_000
    ops = [Op(process=0, type="invoke", f="send", key="t", value=1, time_ns=1 * S),
           Op(process=0, type="ok", f="send", key="t", value=1, time_ns=S + S // 10, message_id=MessageId(3, 0)),
           Op(process=NEMESIS_PROCESS, type="invoke", f="start-partition", time_ns=5 * S),
           Op(process=NEMESIS_PROCESS, type="ok", f="start-partition", time_ns=5 * S + S // 5),
           Op(process=0, type="invoke", f="send", key="t", value=2, time_ns=6 * S),
           Op(process=0, type="ok", f="send", key="t", value=2, time_ns=6 * S + S // 10, message_id=MessageId(3, 1)),
           Op(process=NEMESIS_PROCESS, type="invoke", f="stop-partition", time_ns=15 * S),
           Op(process=NEMESIS_PROCESS, type="ok", f="stop-partition", time_ns=15 * S + S // 10),
           Op(process=1_000_000, type="invoke", f="read", key="t", time_ns=20 * S),
           Op(process=1_000_000, type="ok", f="read", key="t", time_ns=21 * S,
              value=[{"value": 1, "message_id": {"ledger_id": 3, "entry_id": 0}}])]
    write_jsonl([Op(**{**vars(op), "index": i}) for i, op in enumerate(ops)], run_dir / store.HISTORY_JSONL)


def test_check_writes_the_time_to_first_detection_of_an_invalid_run(tmp_path):
    spec = Spec(test_name="lossy", results_dir=str(tmp_path), nemesis=["partition"]).resolved()
    run_dir = store.create_run_dir(tmp_path, spec.test_name)
    store.write_test_toml(run_dir, spec)
    _history_losing_a_send_after_a_partition(run_dir)
    store.write_results(run_dir, valid="unknown", exit_code=2, error=None,       # as a finished run left it
                        run={"dir": str(run_dir), "test_name": "lossy", "errors": []}, checkers={})
    assert runner.recheck(run_dir, out=None) == 1
    res = json.loads((run_dir / "results.json").read_text())
    assert res["valid"] is False
    d = res["detection"]
    assert (d["checker"], d["type"], d["fault"], d["first_fault_s"], d["first_op_s"], d["seconds"]) == \
        ("log", "lost", "partition", 5.0, 6.0, 1.0)
    # the report shows it under the verdict
    assert "time to first detection: 1.0 s (log: lost at t = 6.0 s" in runner.rereport(run_dir).read_text()


def test_a_valid_run_has_no_detection(tmp_path):
    code, run_dir, _ = _run(tmp_path, "workload")          # unknown: not judged invalid
    assert code == 2 and json.loads((run_dir / "results.json").read_text())["detection"] is None
