"""docs/extending.md followed once per recipe: the plugin of tests/extending/plugin.py adds a fault, a
workload and a checker by registering one entry each, from outside the tree's registries; the bug knob
recipe is followed in clusters/bugs.py (broker.dedup_pushed_only, tests/broker/test_dedup.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from core.history import INVOKE, OK, Op
from tests.harness.test_run_integration import _cluster_name, _force_down, _run_dir

REPO = Path(__file__).resolve().parents[2]
EXE = os.path.join(os.path.dirname(sys.executable), "pulsar-chaos")
PLUGIN = "tests.extending.plugin"


@pytest.fixture
def plugin():
    """The plugin loaded into this process, and taken out again."""
    import importlib
    mod = importlib.import_module(PLUGIN)
    if "nudge" not in __import__("nemesis").REGISTRY:
        mod.register()
    yield mod
    mod.unregister()


def env_with_plugin() -> dict[str, str]:
    return {**os.environ, "PULSAR_CHAOS_PLUGINS": PLUGIN, "PYTHONPATH": str(REPO)}


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def create(h: list[Op], process: int, start: int, end: int, seq: int | None) -> None:
    h.append(Op(process=process, type=INVOKE, f="create", key="seq", time_ns=start))
    h.append(Op(process=process, type=OK if seq is not None else "info", f="create", key="seq", value=seq,
                time_ns=end))


def indexed(h: list[Op]) -> list[Op]:
    h.sort(key=lambda o: o.time_ns)
    for i, op in enumerate(h):
        op.index = i
    return h


# ------------------------------------------------------------------------------------ the checker recipe

def test_the_sequence_checker_passes_unique_ordered_numbers(plugin):
    h: list[Op] = []
    create(h, 0, 0, 10, 1)
    create(h, 1, 5, 20, 3)                 # concurrent with the first: any order is fine
    create(h, 0, 15, 30, 2)                # concurrent with process 1's
    create(h, 2, 40, 50, None)             # indeterminate: not judged
    r = plugin.check_sequence(indexed(h))
    assert r.valid is True and r.anomalies == {} and r.stats["creates_ok"] == 3


def test_the_sequence_checker_finds_a_duplicate_and_a_real_time_reordering(plugin):
    h: list[Op] = []
    create(h, 0, 0, 10, 5)
    create(h, 1, 20, 30, 4)                # invoked after 5 completed, yet smaller
    create(h, 2, 40, 50, 5)                # 5 again
    r = plugin.check_sequence(indexed(h))
    assert r.valid is False
    assert [a["sequence"] for a in r.anomalies["duplicate-sequence"]] == [5]
    assert r.anomalies["sequence-reordered"][0]["sequence"] == 4
    assert r.anomalies["sequence-reordered"][0]["after_sequence"] == 5


def test_one_entry_each_makes_the_names_known_everywhere(plugin):
    from harness.catalog import CATALOG
    from nemesis.registry import colour, deployment_needs, make
    import workloads
    from checkers import REGISTRY
    assert isinstance(make("nudge"), plugin.NudgeNemesis)
    assert colour("nudge") == plugin.NUDGE_COLOUR
    assert deployment_needs(["kill", "nudge"]) == {"fake_clocks": ["broker"]}
    assert deployment_needs(["clock", "nudge", "power-loss"]) == {"fake_clocks": ["bookie", "broker"],
                                                                  "lazy_disks": ["bookie", "broker"]}
    assert "zk-sequence" in workloads.available() and workloads.get("zk-sequence") is plugin
    assert REGISTRY["sequence"].check is plugin.check_sequence
    assert CATALOG.fault_problem("nudge") is None and CATALOG.fault_problem("nudge:owner") is not None
    assert plugin.checkers(None)["sequence"][0] is plugin.check_sequence


def test_a_plugin_that_cannot_be_imported_is_a_one_line_usage_error():
    out = cli("run", "--help", env={**os.environ, "PULSAR_CHAOS_PLUGINS": "no_such_plugin_module"})
    assert out.returncode == 254 and "Traceback" not in out.stderr
    assert "no_such_plugin_module" in out.stderr and "(fix: " in out.stderr and out.stderr.count("\n") == 1


def test_run_help_lists_what_the_plugin_registered():
    out = cli("run", "--help", env=env_with_plugin())
    assert out.returncode == 0, out.stderr
    assert "zk-sequence" in out.stdout and "nudge" in out.stdout


# ------------------------------------------------------------------------------------ end to end

@pytest.mark.integration
def test_a_plugin_fault_workload_and_checker_run_end_to_end(tmp_path, plugin):
    """`pulsar-chaos run` with nothing but the plugin: the fault's declared deployment need (fake clocks
    on the brokers) is met, so it applies; the workload's checker decides; the report draws the fault
    in its declared colour."""
    name = f"ext-{uuid.uuid4().hex[:6]}"
    cluster = None
    try:
        out = cli("run", "--workload", "zk-sequence", "--nemesis", "nudge", "--nemesis-interval", "3",
                  "--time-limit", "10", "--rate", "40", "--concurrency", "3", "--settle", "1",
                  "--results-dir", str(tmp_path), "--test-name", name, env=env_with_plugin(), timeout=240)
        run_dir = _run_dir(tmp_path, name)
        cluster = _cluster_name(run_dir)
        assert out.returncode == 0, out.stdout + out.stderr + (run_dir / "runner.log").read_text()
        res = json.loads((run_dir / "results.json").read_text())
        assert set(res["checkers"]) == {"sequence", "perf"}
        assert res["checkers"]["sequence"]["valid"] is True
        assert res["checkers"]["sequence"]["stats"]["creates_ok"] > 50
        nem = [json.loads(line) for line in (run_dir / "journals" / "nemesis.jsonl").read_text().splitlines()]
        starts = [o for o in nem if o["f"] == "start-nudge" and o["type"] != "invoke"]
        assert starts and all(o["type"] == "ok" for o in starts), starts
        assert any(o["f"] == "stop-nudge" and o["type"] == "ok" for o in nem)
        page = (run_dir / "report.html").read_text()
        charts = page[page.index('id="charts"'):page.index('id="faults"')]
        assert plugin.NUDGE_COLOUR in charts and "nudge" in charts
    finally:
        _force_down(cluster, remove=True)



def test_a_fault_entry_refuses_a_deployment_need_the_runner_cannot_set():
    from nemesis.registry import Fault
    with pytest.raises(ValueError, match="fake_clock"):
        Fault(lambda _param: None, "a misspelt need", deploy={"fake_clock": ("broker",)})
