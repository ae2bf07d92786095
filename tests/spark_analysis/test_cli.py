"""`spark-submit spark_analysis/main.py` and `pulsar-chaos analyze` as a user runs them (their own
process and JVM): exit 0 with skipped runs, one Spark session per call, one-line errors. The CLI's
successful analysis in its own process is test_standalone.py's (on a standalone cluster): one JVM
start for both."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _cli(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "pulsar-chaos"), "analyze", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def results(small_campaign):
    return small_campaign


def _manifest(stdout: str) -> dict:
    page = next(line.split(": ", 1)[1] for line in stdout.splitlines() if line.startswith("page: "))
    return json.loads((Path(page).parent / "manifest.json").read_text())


def test_spark_submit_runs_the_module(results, tmp_path):
    submit = VENV_BIN / "spark-submit"
    assert submit.exists(), "pyspark's spark-submit is installed with the venv"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cp = subprocess.run([str(submit), "--master", "local[1]", "--driver-memory", "1g",
                         str(REPO / "spark_analysis" / "main.py"), str(results), "--out", str(tmp_path)],
                        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "analysed 4 runs (1 skipped)" in cp.stdout
    assert "skipped " in cp.stdout and "corrupt or truncated Parquet" in cp.stdout
    assert "Spark checks agree with results.json on 4/4 runs" in cp.stdout
    m = _manifest(cp.stdout)
    assert m["spark_sessions_started"] == 1 and m["master"] == "spark-submit" and m["runs"] == 4


def test_bad_input_is_one_line_without_traceback(tmp_path):
    cp = _cli(str(tmp_path / "missing"))
    assert cp.returncode == 254 and cp.stderr.count("\n") == 1 and "no such results directory" in cp.stderr
    assert "(fix: " in cp.stderr
    cp = _cli("--bogus")
    assert cp.returncode == 254 and cp.stderr.startswith("error:") and "Traceback" not in cp.stderr


def test_missing_java_is_one_line(results, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("env", "sh", "bash", "uname", "dirname", "basename", "ps"):
        p = shutil.which(tool)
        if p:
            (bindir / tool).symlink_to(p)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(bindir)
    cp = _cli(str(results), "--out", str(tmp_path / "out"), env=env)
    assert cp.returncode == 254, cp.stderr
    assert cp.stderr.count("\n") == 1 and "Java 17+" in cp.stderr and "(fix: " in cp.stderr
