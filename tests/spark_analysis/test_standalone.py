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

import pandas as pd
import pytest

from core import store
from harness import campaign_run
from spark_analysis import main as analysis
from tests.spark_analysis.helpers import write_run
from tests.spark_analysis.standalone import StandaloneCluster, free_port
from tests.spark_analysis.test_checks import log_history, queue_history
from tests.spark_analysis.test_inputs import small_history

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.run([str(VENV_BIN / "pulsar-chaos"), "analyze", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """Two small log runs (one losing a message), a log run with every planted log anomaly kind that
    the tables count, a queue run, and a corrupt run folder (skipped)."""
    root = tmp_path_factory.mktemp("standalone-results")
    write_run(root, "cli", "20261106T101010", small_history(), workload="log", nemesis=[])
    write_run(root, "cli", "20261106T111111", small_history(lose=True), workload="log", nemesis=[])
    write_run(root, "planted", "20261107T101010", log_history("lost", "duplicate", "divergence"), workload="log",
              nemesis=["kill"], bugs={"bookie.ignore_fence": True})
    write_run(root, "queue", "20261108T101010", queue_history(), workload="queue", nemesis=[])
    bad = write_run(root, "cli", "20261106T121212", small_history(), workload="log", nemesis=[])
    (bad / store.HISTORY_PARQUET).write_bytes(b"PAR1 not really")
    return root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # each worker: one core and room for one executor of Spark's default 1 GiB
    c = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), workers=2, worker_memory="1200m")
    try:
        yield c.start()
    finally:
        c.stop()


def _tables(out_dir: str) -> dict[str, pd.DataFrame]:
    """Every Parquet table of an analysis, rows in a canonical order (their text)."""
    out = {}
    for p in sorted(Path(out_dir).glob("*.parquet")):
        df = pd.read_parquet(p)
        if len(df):
            key = df.astype(str).apply(lambda r: "\x00".join(r), axis=1)
            df = df.loc[key.sort_values(kind="stable").index].reset_index(drop=True)
        out[p.stem] = df
    return out


def test_analyze_on_a_standalone_cluster_equals_local_mode(cluster, campaign, spark, tmp_path, monkeypatch):
    # the campaign's closing analysis (`pulsar-chaos analyze RUNS --out DIR --master URL` in its own
    # process, as `pulsar-chaos campaign --analyze-master URL` runs it) over a campaign folder's runs
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    camp = campaign_run.CampaignRun(campaign_run.Options(file=str(REPO / "tests" / "campaign" / "two_runs.toml"),
                                                         results_dir=str(tmp_path), analyze_master=cluster.url))
    shutil.copytree(campaign, camp.dir / "runs")
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

    local = analysis.analyze([str(camp.dir / "runs")], str(tmp_path / "local"), spark=spark, echo=None)
    mine, theirs = _tables(out_dir), _tables(local.out_dir)
    assert set(mine) == set(theirs) and {"anomalies", "runs", "by_config", "trends"} <= set(mine)
    for name in theirs:
        pd.testing.assert_frame_equal(mine[name], theirs[name], check_dtype=False, obj=name)
    # not vacuous: the planted anomalies are in both
    types = set(zip(theirs["anomalies"]["checker"], theirs["anomalies"]["type"]))
    assert {("log", "lost"), ("log", "duplicate"), ("log", "divergence"), ("queue", "duplicated")} <= types


def test_a_master_that_does_not_answer_is_one_line(tmp_path, campaign):
    url = f"spark://127.0.0.1:{free_port()}"          # nothing listens there
    t0 = time.monotonic()
    cp = _cli(str(campaign), "--out", str(tmp_path), "--master", url, timeout=120)
    assert cp.returncode == 254, (cp.returncode, cp.stderr[-2000:])
    assert cp.stderr.count("\n") == 1, cp.stderr
    assert f"the Spark master {url} does not answer" in cp.stderr and "(fix: " in cp.stderr
    assert "Traceback" not in cp.stderr and "Exception" not in cp.stderr
    assert time.monotonic() - t0 < 60
