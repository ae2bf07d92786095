"""`pulsar-chaos analyze --master spark://...` on a real Spark standalone cluster (a master and two
workers of the installed pyspark, on 127.0.0.1), as `pulsar-chaos campaign --analyze-master` hands it
over: the same tables as local mode, the CLI's exit 0, summary and one session, executors on both
workers; and a master that does not answer is one line (exit 254), not a stack trace."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import campaign_run
from tests.spark_analysis.helpers import analysis_tables, assert_same_tables
from tests.spark_analysis.standalone import StandaloneCluster, free_port

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.run([str(VENV_BIN / "pulsar-chaos"), "analyze", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # each worker: one core and room for one executor of Spark's default 1 GiB
    c = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), workers=2, worker_memory="1200m")
    try:
        yield c.start()
    finally:
        c.stop()


def test_analyze_on_a_standalone_cluster_equals_local_mode(cluster, small_campaign, small_campaign_tables, tmp_path,
                                                           monkeypatch):
    # the campaign's closing analysis (`pulsar-chaos analyze RUNS --out DIR --master URL` in its own
    # process, as `pulsar-chaos campaign --analyze-master URL` runs it) over a campaign folder's runs
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    camp = campaign_run.CampaignRun(campaign_run.Options(file=str(REPO / "tests" / "campaign" / "two_runs.toml"),
                                                         results_dir=str(tmp_path), analyze_master=cluster.url))
    shutil.copytree(small_campaign, camp.dir / "runs")
    (camp.dir / "logs").mkdir()
    page = camp._analyze()
    log = (camp.dir / "logs" / "analyze.log").read_text()
    assert page, log[-3000:]
    assert "Traceback" not in log
    assert "analysed 4 runs (1 skipped)" in log, log
    assert "skipped " in log and "corrupt or truncated Parquet" in log
    assert "Spark checks agree with results.json on 4/4 runs" in log, log
    out_dir = str(Path(page).parent)
    m = json.loads((Path(out_dir) / "manifest.json").read_text())
    assert m["spark_sessions_started"] == 1 and m["runs"] == 4 and m["master"] == cluster.url
    # both workers ran an executor of the application, and the master saw it finish
    used = {d.parent.parent.name for d in cluster.executor_dirs()}
    assert used == {"worker-0", "worker-1"}, cluster.executor_dirs()
    state = cluster.state() or {}
    assert [a["name"] for a in state.get("completedapps", [])] == ["pulsar-chaos analyze"], state

    # every table equals local mode's (one analysis of the same runs per test session)
    theirs = small_campaign_tables
    assert_same_tables(analysis_tables(out_dir, camp.dir / "runs"), theirs)
    assert {"anomalies", "runs", "by_config", "trends"} <= set(theirs)
    # not vacuous: the planted anomalies are in both
    types = set(zip(theirs["anomalies"]["checker"], theirs["anomalies"]["type"]))
    assert {("log", "lost"), ("log", "duplicate"), ("log", "divergence"), ("queue", "duplicated")} <= types


def test_a_master_that_does_not_answer_is_one_line(tmp_path, small_campaign):
    url = f"spark://127.0.0.1:{free_port()}"          # nothing listens there
    t0 = time.monotonic()
    cp = _cli(str(small_campaign), "--out", str(tmp_path), "--master", url, timeout=120)
    assert cp.returncode == 254, (cp.returncode, cp.stderr[-2000:])
    assert cp.stderr.count("\n") == 1, cp.stderr
    assert f"the Spark master {url} does not answer" in cp.stderr and "(fix: " in cp.stderr
    assert "Traceback" not in cp.stderr and "Exception" not in cp.stderr
    assert time.monotonic() - t0 < 60
