"""`pulsar-chaos shrink` on a real cluster, against the plugin bug of tests/shrink/bug_plugin.py (acked
appends lost only when a `gust` starts while a `beam` is in force): from a run with four faults of three
kinds (a gust alone, a beam, a glint and a gust during the beam), the search returns exactly the beam and
the gust, in that order, in a shorter run, and the minimal spec reproduces the loss.

The test is the short version (an 8-s original with four faults, one try per candidate, the fault and
time-limit reductions; with six faults in 10 s it took 4 min 3 s, over the suite's share); the 60-s
original with eight faults through every reduction is bench/shrink_bug.py."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from core import store
from harness import shrink
from harness.replay import recorded_faults

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXE = os.path.join(os.path.dirname(sys.executable), "pulsar-chaos")
PLUGIN = "tests.shrink.bug_plugin"
SMALL = ["--brokers", "1", "--bookies", "1", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1",
         "--rate", "50", "--concurrency", "2", "--settle", "0", "--final-read-timeout", "10"]
# (at, name, hold): only the gust at 3.5 s starts while a beam is in force
FOUR = [(0.5, "gust", 1.0), (2.0, "beam", 3.0), (2.5, "glint", 1.0), (3.5, "gust", 1.0)]
ORIGINAL_S = 8


def schedule_file(path: Path, faults) -> Path:
    path.write_text("".join(f'[[fault]]\nat = {at}\nname = "{name}"\nhold = {hold}\n\n' for at, name, hold in faults))
    return path


@pytest.fixture
def plugin(monkeypatch):
    import importlib
    monkeypatch.setenv("PULSAR_CHAOS_PLUGINS", PLUGIN)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.chdir(REPO)
    mod = importlib.import_module(PLUGIN)
    if "beam" not in __import__("nemesis").REGISTRY:
        mod.register()
    yield mod
    mod.unregister()


def drop_kept_clusters(root: Path) -> None:
    """The cluster folders the runner keeps for runs that were not valid (every candidate that failed)."""
    for res in root.rglob(store.RESULTS_JSON):
        try:
            kept = json.loads(res.read_text())["run"].get("cluster_dir")
        except (OSError, ValueError, KeyError, AttributeError):
            continue
        if kept:
            shutil.rmtree(kept, ignore_errors=True)


@pytest.fixture
def results(tmp_path):
    yield tmp_path / "results"
    drop_kept_clusters(tmp_path)


def test_shrink_finds_the_two_faults_of_the_bug_in_their_order(tmp_path, plugin, results):
    name = f"sb-{uuid.uuid4().hex[:6]}"
    sched = schedule_file(tmp_path / "four.toml", FOUR)
    out = subprocess.run([EXE, "run", "--workload", "zk-log", "--nemesis-schedule", str(sched), "--time-limit", str(ORIGINAL_S),
                          *SMALL, "--results-dir", str(tmp_path / "results"), "--test-name", name],
                         capture_output=True, text=True, timeout=300)
    run_dir = next((tmp_path / "results" / name).iterdir())
    assert out.returncode == 1, out.stdout + out.stderr
    assert [f.name for f in recorded_faults(run_dir)] == [n for _, n, _ in FOUR]

    text = io.StringIO()
    code = shrink.run(shrink.Options(run=str(run_dir), tries=1, results_dir=str(tmp_path / "results"),
                                     reductions=("faults", "time limit")), text)
    assert code == 0, text.getvalue()
    sdir = next((tmp_path / "results" / "shrinks" / name).iterdir())
    state = json.loads((sdir / shrink.SHRINK_JSON).read_text())
    best = shrink.Candidate.from_json(state["best"])
    assert [f.name for f in best.faults] == ["beam", "gust"], text.getvalue()
    beam, gust = best.faults
    assert beam.at < gust.at < beam.at + beam.hold
    assert best.time_limit < ORIGINAL_S
    # the search saw runs that did not lose data (a gust alone, a beam during a gust): real negatives
    negatives = [s for s in state["steps"] if not s["outcome"]["fails"]]
    assert negatives and all(json.loads((Path(s["outcome"]["runs"][0]) / store.RESULTS_JSON).read_text())["valid"]
                             is True for s in negatives)
    assert state["verification"]["reproduced"] == 1
    assert "reproduced the failure in 1 of 1 tries" in (sdir / shrink.MINIMAL_TOML).read_text()
    assert (sdir / shrink.SHRINK_HTML).is_file()
