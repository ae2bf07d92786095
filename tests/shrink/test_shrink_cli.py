"""`pulsar-chaos shrink` without a cluster: what cannot be shrunk exits 254 with one line saying why;
the command around the search (with its runs replaced by a fake) prints its progress, keeps its state,
resumes without rerunning a finished candidate, and writes minimal.toml (a spec `run --spec` takes) and
shrink.html."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core import store
from core.history import INVOKE, NEMESIS_PROCESS, OK, Op, write_jsonl
from core.spec import TestSpec as Spec
from harness import runner, shrink
from harness.replay import recorded_faults, replay_spec

EXE = os.path.join(os.path.dirname(sys.executable), "pulsar-chaos")
LOST = {"log": {"valid": False, "anomalies": {"lost": [{"topic": "t", "id": 3}]}, "stats": {}}}


def make_run(tmp: Path, *, valid=False, faults=(("kill", 3.0, 4.0, "bookie-2"), ("pause", 5.0, 3.0, "broker-1"),
                                                 ("partition", 12.0, 2.0, None))) -> Path:
    """A finished run folder on disk: test.toml, history.jsonl (the faults and one client op), results.json."""
    d = tmp / "results" / "log-chaos" / "20260101T000000"
    (d / "journals").mkdir(parents=True)
    spec = Spec(time_limit=30.0, seed=7, results_dir=str(tmp / "results"))
    store.write_test_toml(d, spec)
    ops = []
    for name, at, hold, node in faults:
        plan = {"node": node} if node else {"shape": "halves", "sides": [["bookie-1"], ["broker-2", "zk-1"]]}
        ops.append((at + 0.5, Op(process=NEMESIS_PROCESS, type=INVOKE, f=f"start-{name}", value=plan)))
        ops.append((at + 0.6, Op(process=NEMESIS_PROCESS, type=OK, f=f"start-{name}", value=plan)))
        ops.append((at + 0.5 + hold, Op(process=NEMESIS_PROCESS, type=INVOKE, f=f"stop-{name}")))
        ops.append((at + 0.7 + hold, Op(process=NEMESIS_PROCESS, type=OK, f=f"stop-{name}")))
    ops.append((0.5, Op(process=0, type=INVOKE, f="send", key="t")))
    hist = []
    for i, (t, op) in enumerate(sorted(ops, key=lambda x: x[0])):
        op.time_ns, op.index = int(t * 1e9), i
        hist.append(op)
    write_jsonl(hist, d / store.HISTORY_JSONL)
    store.write_results(d, valid=valid, exit_code=0 if valid else 1, error=None,
                        run={"timings": {"nemesis_start_s": 0.5}}, checkers={} if valid else {})
    res = json.loads((d / store.RESULTS_JSON).read_text())
    res["checkers"] = {"log": {"valid": True, "anomalies": {}}} if valid else LOST
    (d / store.RESULTS_JSON).write_text(json.dumps(res))
    return d


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=60)


def one_line(out: subprocess.CompletedProcess, *words: str) -> None:
    assert out.returncode == 254, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "fix:" in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_what_cannot_be_shrunk_exits_254_with_one_line(tmp_path):
    valid = make_run(tmp_path / "a", valid=True)
    one_line(cli("shrink", str(valid), "--results-dir", str(tmp_path / "out")), "is valid", "nothing to shrink")
    (tmp_path / "plain").mkdir()
    one_line(cli("shrink", str(tmp_path / "plain")), "not a run folder")
    one_line(cli("shrink", str(tmp_path / "nowhere")), "no such run folder")
    none = make_run(tmp_path / "b", faults=())
    one_line(cli("shrink", str(none), "--results-dir", str(tmp_path / "out")), "had no fault")
    bad = make_run(tmp_path / "c")
    one_line(cli("shrink", str(bad), "--tries", "0"), "--tries")
    one_line(cli("shrink", str(bad), "--verify", "0"), "--verify")
    one_line(cli("shrink", str(bad), "--resume", str(tmp_path / "plain")), "not a shrink folder")
    assert not (tmp_path / "out").exists()
    # and a replay of a run with no fault
    one_line(cli("run", "--replay", str(none)), "no fault to replay")
    one_line(cli("run", "--replay", str(bad), "--nemesis", "kill"), "--nemesis", "--replay")


def test_the_recorded_faults_of_a_run_are_its_times_names_holds_and_nodes(tmp_path):
    d = make_run(tmp_path)
    faults = recorded_faults(d)
    assert [(f.name, f.at, f.hold, f.nodes) for f in faults] == [
        ("kill", 3.0, 4.0, ["bookie-2"]), ("pause", 5.0, 3.0, ["broker-1"]),
        ("partition", 12.0, 2.0, ["bookie-1", "broker-2", "zk-1"])]
    spec = runner.spec_from_args(None, {}, base=dataclasses.asdict(replay_spec(d)))
    assert spec.nemesis == [] and [e["name"] for e in spec.nemesis_schedule] == ["kill", "pause", "partition"]
    assert spec.nemesis_schedule[0] == {"at": 3.0, "name": "kill", "hold": 4.0, "plan": {"node": "bookie-2"}}
    assert spec.replay_of == str(d) and spec.seed == 7


def _fake(calls):
    """Fails when a kill is in force when a pause starts (the fake of a run)."""
    def run_candidate(self, cand, tries, *, stop_at_first=True, label=None):
        calls.append(cand)
        fails = any(a.name == "kill" and b.name == "pause" and a.at <= b.at < a.at + (a.hold or 99)
                    for a in cand.faults for b in cand.faults)
        self.n += 1
        return shrink.Outcome(fails, reproduced=tries if (fails and not stop_at_first) else int(fails),
                              tries=tries if not stop_at_first else 1, found=["log: lost" if fails else "valid"])
    return run_candidate


def test_the_command_prints_progress_resumes_and_writes_a_minimal_spec_and_page(tmp_path, monkeypatch, capsys):
    import io
    d = make_run(tmp_path)
    calls: list = []
    monkeypatch.setattr(shrink.ShrinkRun, "_run_candidate", _fake(calls))
    out = io.StringIO()
    code = shrink.run(shrink.Options(run=str(d), tries=2, results_dir=str(tmp_path / "out")), out)
    text = out.getvalue()
    assert code == 0, text
    assert "log: lost" in text and "best:" in text and "ETA" in text and "(kept)" in text
    sdir = next((tmp_path / "out" / "shrinks" / "log-chaos").iterdir())
    state = json.loads((sdir / shrink.SHRINK_JSON).read_text())
    best = shrink.Candidate.from_json(state["best"])
    assert [f.name for f in best.faults] == ["kill", "pause"] and state["verification"]["reproduced"] == 2
    minimal = sdir / shrink.MINIMAL_TOML
    assert "reproduced the failure in 2 of 2 tries" in minimal.read_text()
    spec = runner.spec_from_args(minimal, {})          # what `run --spec minimal.toml` reads
    assert [e["name"] for e in spec.nemesis_schedule] == ["kill", "pause"] and spec.nemesis == []
    assert spec.time_limit == best.time_limit and spec.replay_of == str(d)
    page = (sdir / shrink.SHRINK_HTML).read_text()
    assert "original" in page and "minimal" in page and "<svg" in page and "2 of 2 tries" in page
    n = len(calls)
    # resumed: nothing the first attempt finished runs again (only the verification of the minimal spec)
    again = io.StringIO()
    assert shrink.run(shrink.Options(run=str(d), tries=2, resume=str(sdir)), again) == 0
    assert len(calls) == n + 1 and calls[-1].key() == best.key()
    assert "candidates already run" in again.getvalue()
