"""Acceptance 3 and 4: bad run folders are skipped with their reason while the others are analysed, an
analyze call starts Spark once whatever the number of runs (none when nothing is left to analyse), and
the campaign page is offline with working links to the run reports."""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import unquote

import pytest

from core import store
from spark_analysis import inputs
from spark_analysis import main as analysis
from spark_analysis import session as spark_session
from tests.spark_analysis.conftest import counting_shared_session
from tests.spark_analysis.helpers import FINAL, H, as_written_before_pairing, write_run

pytestmark = pytest.mark.spark

T = "persistent://public/default/in-0"


def small_history(lose: bool = False) -> list:
    h = H()
    for v in range(1, 6):
        h.send(1, T, v, (7, v, -1, -1))
    h.recv(2, T, [(v, (7, v, -1, -1)) for v in range(1, 6)])
    h.recv(FINAL, T, [(v, (7, v, -1, -1)) for v in range(1, 6) if not (lose and v == 2)], f="read")
    return h.ops


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """Two good runs (written without the invoke columns) and one run folder per way of being broken."""
    root = tmp_path_factory.mktemp("inputs")
    # the two good runs as histories were written before core.store recorded each completion's invoke
    good = as_written_before_pairing(write_run(root, "good", "20261105T101010", small_history(), workload="log",
                                               nemesis=[]))
    as_written_before_pairing(write_run(root, "good", "20261105T111111", small_history(lose=True), workload="log",
                                        nemesis=[]))
    trunc = write_run(root, "truncated", "20261105T121212", small_history(), workload="log", nemesis=[])
    data = (trunc / store.HISTORY_PARQUET).read_bytes()
    (trunc / store.HISTORY_PARQUET).write_bytes(data[: len(data) // 2])
    nohist = root / "no-history" / "20261105T131313"
    nohist.mkdir(parents=True)
    shutil.copy(good / store.TEST_TOML, nohist / store.TEST_TOML)
    badtoml = write_run(root, "bad-toml", "20261105T141414", small_history(), workload="log", nemesis=[])
    (badtoml / store.TEST_TOML).write_text("workload = [unclosed\n")
    badres = write_run(root, "bad-results", "20261105T151515", small_history(), workload="log", nemesis=[])
    (badres / store.RESULTS_JSON).write_text('{"valid": tru')
    nodeliv = write_run(root, "no-deliveries", "20261105T161616", small_history(), workload="log", nemesis=[])
    (nodeliv / store.DELIVERIES_PARQUET).unlink()
    (root / store.LATEST).symlink_to(good.relative_to(root))       # results/latest is not a second run
    return root


@pytest.fixture(scope="module")
def analysed(campaign, spark, tmp_path_factory):
    """The campaign analysed once, as the CLI does (analyze() starting its own session, counted), into
    an out dir elsewhere than the results: (result, sessions started by the call)."""
    before = spark_session.SESSIONS_STARTED
    with counting_shared_session(spark) as calls:
        res = analysis.analyze([str(campaign)], str(tmp_path_factory.mktemp("elsewhere")), echo=None)
    return res, calls, spark_session.SESSIONS_STARTED - before


def test_bad_runs_are_skipped_with_reasons_and_the_rest_is_analysed(analysed):
    res, calls, started = analysed
    assert started == 1 and len(calls) == 1
    assert res.sessions_started == 1
    assert sorted(r.run_id for r in res.runs) == ["good/20261105T101010", "good/20261105T111111"]
    reasons = {Path(s.path).parent.name: s.reason for s in res.skipped}
    assert set(reasons) == {"truncated", "no-history", "bad-toml", "bad-results", "no-deliveries"}
    assert "history.parquet: corrupt or truncated Parquet" in reasons["truncated"]
    assert reasons["no-history"].startswith("no history.parquet")
    assert "test.toml: not valid TOML" in reasons["bad-toml"]
    assert "results.json: corrupt" in reasons["bad-results"]
    assert reasons["no-deliveries"].startswith("no deliveries.parquet")
    runs = res.tables["runs"].set_index("run_id")
    assert runs.loc["good/20261105T111111", "log.lost"] == 1 and runs.loc["good/20261105T101010", "log.lost"] == 0
    out = Path(res.out_dir)
    for name in analysis.TABLES:
        assert (out / f"{name}.parquet").exists(), name
    assert len(res.tables["skipped"]) == 5


def test_histories_written_before_the_invoke_columns_are_paired_by_the_analysis(analysed):
    """The good runs' history.parquet lacks the invoke_* columns: the analysis pairs each completion
    with its invoke itself (a window), and its counts equal the Python checker's (the lost value too)."""
    res, _, _ = analysed
    assert [r.paired for r in res.runs] == [False, False]
    runs = res.tables["runs"].set_index("run_id")
    assert set(runs["agrees"]) == {"yes"} and runs["log.lost"].sum() == 1


def test_only_bad_runs_need_no_spark(campaign, tmp_path, shared_session_as_new):
    root = tmp_path / "bad"
    shutil.copytree(campaign / "truncated", root / "truncated")
    res = analysis.analyze([str(root)], str(tmp_path / "out"), echo=None)
    assert shared_session_as_new == [] and res.sessions_started == 0
    assert not res.runs and len(res.skipped) == 1 and Path(res.html).exists()


def test_missing_results_dir_is_a_one_line_error(tmp_path):
    with pytest.raises(inputs.InputError, match=r"no such results directory .*\(fix: "):
        analysis.analyze([str(tmp_path / "nope")], str(tmp_path), echo=None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(inputs.InputError, match=r"no run folders under"):
        analysis.analyze([str(tmp_path / "empty")], str(tmp_path), echo=None)


def test_campaign_page_is_offline_and_links_to_every_report(analysed):
    res = analysed[0]
    page = Path(res.html).read_text()
    urls = re.findall(r"(?i)\b(?:https?|ftp)://[^\s\"'<>)]*", page)
    assert set(urls) <= {"http://www.w3.org/2000/svg"}, set(urls)
    assert not re.search(r"(?i)<(script|link|img|iframe)[^>]+(src|href)=", page)
    hrefs = re.findall(r'href="([^"]+)"', page)
    assert len(hrefs) == 2
    for h in hrefs:
        assert not h.startswith("/") and (Path(res.html).parent / unquote(h)).resolve().is_file(), h
    assert "<svg" in page and "sortTable" in page


def test_hadoop_uri_inputs_are_listed_and_read_through_spark(campaign, tmp_path, spark):
    """A file:// URI takes the path of hdfs:// and s3a:// inputs: Hadoop's FileSystem lists the run
    folders and Spark reads their files (no local vetting of Parquet footers there)."""
    res = analysis.analyze([f"file://{campaign}"], str(tmp_path), spark=spark, echo=None)
    runs = res.tables["runs"].set_index("run_id")
    assert runs.loc["good/20261105T101010", "log.lost"] == 0 and runs.loc["good/20261105T111111", "log.lost"] == 1
    reasons = {s.path.rstrip("/").split("/")[-2]: s.reason for s in res.skipped}
    assert {"no-history", "bad-toml", "bad-results", "no-deliveries"} <= set(reasons)
    if "truncated" not in reasons:           # read with ignoreCorruptFiles: analysed with no ops, and said so
        assert "no ops read" in runs.loc["truncated/20261105T121212", "notes"]
