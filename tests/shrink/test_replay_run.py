"""`pulsar-chaos run --replay RUN` on a real cluster: a 20-s log run under overlapping partition, kill,
pause and zk-isolate faults, replayed; both runs' fault timelines have the same faults in the same
order on the same nodes, each start within `REPLAY_TOLERANCE_S` of the original's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from core import store
from harness.replay import REPLAY_TOLERANCE_S, recorded_faults

pytestmark = pytest.mark.integration

EXE = os.path.join(os.path.dirname(sys.executable), "pulsar-chaos")


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def _only_run(results, name):
    dirs = sorted(d for d in (results / name).iterdir() if d.is_dir())
    assert len(dirs) == 1, dirs
    return dirs[0]


def _force_down(run_dir) -> None:
    try:
        c = json.loads((run_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return
    if not (run_dir / "results.json").exists():
        cli("cluster", "down", "--force", "--name", c["name"], timeout=300)


def _drop_kept_cluster(run_dir) -> None:
    """The cluster folder the runner keeps for a run that was not valid."""
    try:
        kept = json.loads((run_dir / "results.json").read_text())["run"].get("cluster_dir")
    except (OSError, ValueError, KeyError, AttributeError):
        return
    if kept:
        shutil.rmtree(kept, ignore_errors=True)


def test_a_replay_has_the_same_faults_times_and_nodes(tmp_path):
    name, again = f"rp-{uuid.uuid4().hex[:6]}", f"rq-{uuid.uuid4().hex[:6]}"
    first = second = None
    try:
        out = cli("run", "--workload", "log", "--nemesis", "partition,kill,pause,zk-isolate",
                  "--nemesis-interval", "2.5", "--nemesis-overlap", "2", "--time-limit", "20", "--settle", "2",
                  "--results-dir", str(tmp_path), "--test-name", name)
        first = _only_run(tmp_path, name)
        assert out.returncode in (0, 1, 2), out.stdout + out.stderr
        original = recorded_faults(first)
        # several faults (usually 4 to 6 in 20 s; on a loaded machine a kill's restart takes longer and as
        # few as two fit): what matters is that the replay has them all, at their times, on their nodes
        assert len(original) >= 2, original
        assert all(f.nodes for f in original), original

        out = cli("run", "--replay", str(first), "--results-dir", str(tmp_path), "--test-name", again)
        second = _only_run(tmp_path, again)
        assert out.returncode in (0, 1, 2), out.stdout + out.stderr
        spec = store.load_spec(second, catalog=None)
        assert spec.replay_of == str(first) and spec.nemesis == [] and spec.nemesis_schedule
        assert spec.seed == store.load_spec(first, catalog=None).seed
        replayed = recorded_faults(second)
        assert [f.name for f in replayed] == [f.name for f in original]
        assert [f.nodes for f in replayed] == [f.nodes for f in original]
        for a, b in zip(original, replayed):
            assert abs(a.at - b.at) <= REPLAY_TOLERANCE_S, (a, b)
            if a.hold is not None and b.hold is not None:
                assert abs(a.hold - b.hold) <= REPLAY_TOLERANCE_S, (a, b)
    finally:
        for d in (first, second):
            if d is not None:
                _force_down(d)
                _drop_kept_cluster(d)
