"""The ownership recorder and checker on a real run: the log workload (2 brokers) under zk-isolate, which
moves a bundle when the isolated broker's session expires. Pulsar's default lets that broker keep
serving for a while (served-after-session-loss, informational); no broker may serve a bundle another
one certainly holds, and the run must be valid."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core import store
from core.history import read_jsonl
from core.observations import BROKER_REGISTRATION, BUNDLE_OWNER, OBSERVE_START, OBSERVE_STOP

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXE = os.path.join(os.path.dirname(sys.executable), "pulsar-chaos")


def test_a_zk_isolate_run_records_ownership_and_is_valid(tmp_path):
    env = {**os.environ, "PULSAR_CHAOS_PLUGINS": "tests.harness.ownership_plugin", "PYTHONPATH": str(REPO)}
    cp = subprocess.run([EXE, "run", "--workload", "log-owned", "--nemesis", "zk-isolate", "--time-limit", "25",
                         "--seed", "7", "--results-dir", str(tmp_path), "--test-name", "owned"],
                        capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    run_dir = next((tmp_path / "owned").iterdir())
    res = json.loads((run_dir / store.RESULTS_JSON).read_text())
    own = res["checkers"]["ownership"]
    assert cp.returncode == 0, (cp.stdout[-2000:], cp.stderr[-2000:], own.get("anomalies"))
    rows = list(read_jsonl(run_dir / store.JOURNALS / "ownership.jsonl"))
    fs = [op.f for op in rows]
    assert fs[0] == OBSERVE_START and fs[-1] == OBSERVE_STOP
    assert fs.count(BUNDLE_OWNER) >= 2 and fs.count(BROKER_REGISTRATION) >= 2
    assert own["valid"] is True
    st = own["stats"]
    assert st["served_judged"] > 100 and set(st["segments_by_broker"]) <= {"broker-1", "broker-2"}
    assert set(st["registrations"]) == {"broker-1", "broker-2"}
    # the other checkers saw the same history and judged it as usual
    assert res["checkers"]["log"]["valid"] is True and res["checkers"]["fencing"]["valid"] is True
