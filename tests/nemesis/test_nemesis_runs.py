"""Nemesis features end to end through `pulsar-chaos run`: a schedule file whose faults cannot all be
applied (the run records them as failed fault ops with the reason and goes on to a valid verdict),
and overlapping faults."""
from __future__ import annotations

import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

from core.history import FAIL, OK
from core.store import load_history

pytestmark = pytest.mark.integration

SCHEDULE = """
# faults at fixed times (seconds from the workload's first op)
[[fault]]
at = 2
name = "kill:owner"
hold = 8

[[fault]]
at = 3
name = "pause:owner"        # the owner is dead (and was not replaced yet, or is the new owner)

[[fault]]
at = 4
name = "kill:broker-9"      # no such node in a 2-broker cluster

[[fault]]
at = 5
name = "zk-isolate:zk-1"    # a ZooKeeper node cannot be cut from ZooKeeper

[[fault]]
at = 6
name = "grudge"
hold = 4
grudge = {"bookie-1" = ["broker-1", "broker-2"]}
"""


def _run(tmp_path: Path, *args: str) -> tuple[int, Path, str]:
    name = f"nr-{uuid.uuid4().hex[:6]}"
    p = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--test-name", name,
                        "--results-dir", str(tmp_path), "--settle", "2", "--seed", "3", *args],
                       capture_output=True, text=True, timeout=600)
    run_dir = next((tmp_path / name).glob("2*"))
    return p.returncode, run_dir, p.stdout + p.stderr


def test_schedule_with_faults_that_cannot_be_applied_records_them_and_the_run_goes_on(tmp_path):
    sched = tmp_path / "faults.toml"
    sched.write_text(SCHEDULE)
    code, run_dir, out = _run(tmp_path, "--time-limit", "20", "--nemesis", "none", "--nemesis-schedule", str(sched))
    assert code == 0, out
    nem = [o for o in load_history(run_dir) if o.process == -1]
    done = [o for o in nem if o.type != "invoke"]
    fails = {o.f: o.error for o in done if o.type == FAIL}
    oks = {o.f for o in done if o.type == OK}
    assert {"start-kill", "stop-kill", "start-grudge", "stop-grudge", "heal"} <= oks, done
    assert "broker-9" in fails["start-kill"]
    assert "ZooKeeper node" in fails["start-zk-isolate"]
    grudge = next(o for o in done if o.f == "start-grudge" and o.type == OK)
    assert grudge.value["grudge"]["bookie-1"] == ["broker-1", "broker-2"]
    # the saved spec replays the same schedule
    saved = tomllib.loads((run_dir / "test.toml").read_text())
    assert [e["name"] for e in saved["nemesis_schedule"]] == ["kill:owner", "pause:owner", "kill:broker-9",
                                                              "zk-isolate:zk-1", "grudge"]
    assert saved["nemesis_schedule"][4]["grudge"] == {"bookie-1": ["broker-1", "broker-2"]}


def test_bad_schedule_file_is_a_one_line_usage_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[fault]]\nat = -1\nname = "kill"\n')
    p = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--nemesis-schedule", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 254 and p.stderr.count("\n") == 1, p.stderr
    assert "entry 1: at must be seconds >= 0" in p.stderr and "Traceback" not in p.stderr
    bad.write_text('[[fault]]\nat = 1\nname = "kill:nobody"\n')
    p = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--nemesis-schedule", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 254 and "unknown target 'nobody'" in p.stderr, p.stderr


# (the netns case without fencing is tests/workloads/test_pulsar_workloads_run.py)
@pytest.mark.parametrize("backend, fencing", [("netns", True), pytest.param("docker", True, marks=pytest.mark.docker),
                                              pytest.param("docker", False, marks=pytest.mark.docker)])
def test_zk_isolate_of_the_owner_is_valid_with_fencing_and_invalid_without(tmp_path, backend, fencing):
    """The harness issue's split brain on both backends: the owner cut from ZooKeeper only (15 s, so
    its 6 s session expires and the other broker takes the topic over). With recovery fencing the
    new owner fences the old ledger and the run is valid; without it the old owner keeps
    acknowledging writes nobody will read."""
    from tests.workloads.runs import run
    code, res, out, _ = run(tmp_path, f"zk{backend[0]}", backend=backend, time_limit=35.0,
                            nemesis=["zk-isolate"], nemesis_interval=15.0,
                            bugs={} if fencing else {"broker.recovery_fencing": False})
    if fencing:
        assert code == 0 and res["valid"] is True, (out, {k: c["anomalies"] for k, c in res["checkers"].items()})
    else:
        assert code == 1 and res["valid"] is False, out
        assert res["checkers"]["log"]["anomalies"].get("lost"), res["checkers"]["log"]["anomalies"].keys()
