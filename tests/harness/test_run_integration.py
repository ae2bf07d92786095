"""`pulsar-chaos run` end to end on a real cluster: a short chaos run is valid and leaves a complete run
folder; a run interrupted with SIGINT, or SIGKILLed, leaves a folder that check/report can use and,
after `cluster down --force`, nothing of the run on the host."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from clusters.deploy import hostnet
from clusters.deploy.netns import short_id
from clusters.deploy.spec import ROOT
from core import store

pytestmark = pytest.mark.integration

EXE = os.path.join(os.path.dirname(sys.executable), "pulsar-chaos")


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def _run_dir(results: Path, name: str, timeout: float = 30) -> Path:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        dirs = [d for d in (results / name).glob("*") if d.is_dir()] if (results / name).exists() else []
        if dirs:
            return dirs[0]
        time.sleep(0.1)
    raise AssertionError(f"no run folder under {results / name}")


def _cluster_name(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "cluster.json").read_text())["name"]
    except (OSError, ValueError, KeyError):
        return None


def _processes_of(run_dir: Path, cluster: str) -> list[int]:
    """Processes whose command line names the run folder (workers) or the cluster's folder (nodes)."""
    marks = (str(run_dir.resolve()).encode(), f"/clusters/{cluster}/".encode())
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(m in cmd for m in marks):
            out.append(int(p.name))
    return out


def leftovers(run_dir: Path, cluster: str) -> dict[str, list]:
    cid = short_id(cluster)
    prefix = f"{hostnet.PREFIX}{cid}-"
    return {k: v for k, v in {
        "namespaces": [n for n in hostnet.netns_list() if n.startswith(prefix)],
        "links": [n for n in hostnet.link_names() if n.startswith(prefix)],
        "host_rules": hostnet.tagged_host_rules(cid),
        "processes": _processes_of(run_dir, cluster),
    }.items() if v}


def _wait_clean(run_dir: Path, cluster: str, timeout: float = 10) -> dict[str, list]:
    end = time.monotonic() + timeout
    while True:
        left = leftovers(run_dir, cluster)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.2)


def _force_down(cluster: str | None, remove: bool = False) -> None:
    # --name: other clusters on this host (other tests, other users) are not ours to remove
    if cluster:
        cli("cluster", "down", "--force", "--name", cluster)
        if remove:      # the test's cluster data (a valid run's is removed by the runner itself)
            shutil.rmtree(ROOT / cluster, ignore_errors=True)


def _assert_check_and_report_work(run_dir: Path, expect_check: int) -> None:
    out = cli("check", str(run_dir))
    assert out.returncode == expect_check, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    out = cli("report", str(run_dir))
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == run_dir / "report.html" and (run_dir / "report.html").stat().st_size > 0


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and a process
    # that starts with SIGINT ignored keeps ignoring it (as Python does): when the test suite itself
    # runs in the background, the run under test must still get SIGINT the way a terminal sends it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, name: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([EXE, "run", "--results-dir", str(tmp_path), "--test-name", name, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)


def _wait_for_ops(run_dir: Path, timeout: float = 40) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        js = list((run_dir / "journals").glob("worker-*.jsonl"))
        if js and sum(j.stat().st_size for j in js) > 20_000:
            return
        time.sleep(0.2)
    raise AssertionError("the workers recorded no ops")


def test_short_chaos_run_is_valid_and_complete(tmp_path):
    name = f"it-{uuid.uuid4().hex[:6]}"
    cluster = None
    try:
        out = cli("run", "--time-limit", "15", "--nemesis", "kill", "--nemesis-interval", "4", "--settle", "2",
                  "--results-dir", str(tmp_path), "--test-name", name, timeout=240)
        run_dir = _run_dir(tmp_path, name)
        cluster = _cluster_name(run_dir)
        assert out.returncode == 0, out.stdout + out.stderr + (run_dir / "runner.log").read_text()
        assert f"report: {run_dir / 'report.html'}" in out.stdout and "verdict: valid" in out.stdout
        assert (tmp_path / "latest").resolve() == run_dir.resolve()
        for f in ("test.toml", "history.jsonl", "history.parquet", "deliveries.parquet", "results.json",
                  "report.html", "cluster.json", "journals/worker-0.jsonl", "journals/nemesis.jsonl",
                  "journals/final-reads.jsonl"):
            assert (run_dir / f).is_file(), f
        nodes = {p.parent.name for p in (run_dir / "nodes").glob("*/node.log")}
        assert {"zk-1", "bookie-1", "bookie-2", "bookie-3", "broker-1", "broker-2"} <= nodes

        res = json.loads((run_dir / "results.json").read_text())
        assert res["valid"] is True and res["exit_code"] == 0 and res["error"] is None
        r = res["run"]
        assert r["dir"] == str(run_dir) and r["test_name"] == name and r["service_url"].startswith("pulsar://")
        for k in ("deploy_s", "first_op_s", "workload_s", "final_reads_s", "teardown_s", "check_s", "report_s"):
            assert isinstance(r["timings"][k], (int, float)), k
        assert res["checkers"]["log"]["valid"] is True
        assert r["cluster_dir"] is None and not (ROOT / cluster).exists()   # a valid run's node data goes
        # test.toml is the resolved spec: re-running it replays the same seed
        spec = store.load_spec(run_dir, catalog=None)
        assert spec.seed == r["seed"] and spec.time_limit == 15.0 and spec.nemesis == ["kill"]

        history = store.load_history(run_dir)
        kinds = {(op.f, op.type) for op in history}
        assert {("send", "ok"), ("receive", "ok"), ("read", "ok")} <= kinds
        assert any(op.f == "start-kill" for op in history)
        assert [op.index for op in history] == list(range(len(history)))
        assert all(a.time_ns <= b.time_ns for a, b in zip(history, history[1:]))
        reads = [op for op in history if op.f == "read" and op.type == "ok"]
        assert len(reads) == spec.topics
        deliveries = pq.read_table(run_dir / "deliveries.parquet")
        assert deliveries.num_rows == sum(len(op.value) for op in history
                                          if op.type == "ok" and op.f in ("receive", "read"))
        _assert_check_and_report_work(run_dir, 0)
        assert not _wait_clean(run_dir, cluster)
    finally:
        _force_down(cluster, remove=True)


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_interrupted_run_leaves_usable_folder_and_nothing_running(tmp_path, how):
    name = f"it-{how.lower()}-{uuid.uuid4().hex[:4]}"
    proc = _start(tmp_path, name, "--time-limit", "60", "--nemesis", "kill,pause,partition",
                  "--nemesis-interval", "3")
    cluster = None
    try:
        run_dir = _run_dir(tmp_path, name)
        _wait_for_ops(run_dir)
        time.sleep(3)
        cluster = _cluster_name(run_dir)
        assert cluster
        t = time.monotonic()
        proc.send_signal(getattr(signal, how))
        out, err = proc.communicate(timeout=120)
        if how == "SIGINT":
            # the runner itself tears everything down and finishes the record
            assert proc.returncode == 2, out + err
            assert time.monotonic() - t < 60
            assert "verdict: unknown" in out and "Traceback" not in err
            res = json.loads((run_dir / "results.json").read_text())
            assert res["valid"] == "unknown" and "interrupted by SIGINT" in res["error"]
            for f in ("history.jsonl", "history.parquet", "deliveries.parquet", "report.html"):
                assert (run_dir / f).is_file(), f
            assert list((run_dir / "nodes").glob("*/node.log"))
            assert not _wait_clean(run_dir, cluster), "the runner left something behind"
        else:
            assert proc.returncode == -signal.SIGKILL
            assert not (run_dir / "results.json").exists()
        _force_down(cluster)
        assert not _wait_clean(run_dir, cluster)
        _assert_check_and_report_work(run_dir, 2)           # interrupted: unknown
        res = json.loads((run_dir / "results.json").read_text())
        assert res["valid"] == "unknown" and res["error"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _force_down(cluster, remove=True)


def test_run_whose_parent_died_still_cleans_up(tmp_path):
    """SIGTERM from a parent that died and closed the run's stdout and stderr (a killed benchmark or CI
    step): printing to the broken pipes must not stop the teardown, or the cluster stays behind."""
    name = f"it-orphan-{uuid.uuid4().hex[:4]}"
    proc = _start(tmp_path, name, "--time-limit", "60", "--nemesis-interval", "3")
    cluster = None
    try:
        run_dir = _run_dir(tmp_path, name)
        _wait_for_ops(run_dir)
        cluster = _cluster_name(run_dir)
        assert cluster
        proc.stdout.close()
        proc.stderr.close()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)          # a second signal during cleanup prints a note
        proc.wait(timeout=120)
        assert not _wait_clean(run_dir, cluster, timeout=20), "the runner left something behind"
        res = json.loads((run_dir / "results.json").read_text())
        assert res["valid"] == "unknown" and "interrupted by SIGTERM" in res["error"]
        assert "teardown" not in res["error"], res["error"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _force_down(cluster, remove=True)
