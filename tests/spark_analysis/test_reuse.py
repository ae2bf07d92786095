"""Incremental analysis: analyse a night's runs, add the next night's, analyse again: the second call
reads only the new runs' histories (the job's own count of the files it read) and its tables equal a
full analysis of all of them without the store; a changed run folder gets a new key; `redo` reads all."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from spark_analysis import main as analysis
from spark_analysis import reuse
from spark_analysis.inputs import Run
from tests.spark_analysis.helpers import analysis_tables, assert_same_tables, write_run
from tests.spark_analysis.test_inputs import small_history

pytestmark = pytest.mark.spark

NIGHT_1 = ("cli/20261106T101010", "planted/20261107T101010")
NIGHT_2 = ("cli/20261106T111111", "queue/20261108T101010", "cli/20261106T121212")     # the last is corrupt


def _copy(src: Path, dst: Path, runs: tuple[str, ...]) -> None:
    for r in runs:
        shutil.copytree(src / r, dst / r)


def test_a_second_analysis_reads_only_the_new_runs_and_equals_a_full_one(spark, small_campaign,
                                                                         small_campaign_tables, tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    _copy(small_campaign, results, NIGHT_1)
    first = analysis.analyze([str(results)], str(out), spark=spark, echo=None)
    assert (first.runs_read, first.runs_reused, first.history_files_read) == (2, 0, 2)

    _copy(small_campaign, results, NIGHT_2)
    second = analysis.analyze([str(results)], str(out), spark=spark, echo=None)
    assert len(second.runs) == 4 and len(second.skipped) == 1
    assert (second.runs_read, second.runs_reused, second.history_files_read) == (2, 2, 2)
    m = json.loads((Path(second.out_dir) / "manifest.json").read_text())
    assert (m["runs_read"], m["runs_reused"], m["history_files_read"]) == (2, 2, 2)
    assert sorted(v["run_id"] for v in reuse.RunStore(str(out)).index().values()) == sorted(
        r.run_id for r in second.runs)

    # the tables of a full analysis of the same runs without the store (small_campaign_tables)
    theirs = small_campaign_tables
    assert_same_tables(analysis_tables(second.out_dir, results), theirs)
    assert {"anomalies", "runs", "perf_by_state", "recovery", "trends"} <= set(theirs)
    # not vacuous: both nights' anomalies and the kill's fault state are in them
    lost = theirs["anomalies"][theirs["anomalies"]["type"] == "lost"]
    assert {"planted/20261107T101010", "cli/20261106T111111", "queue/20261108T101010"} <= set(lost["run_id"])
    assert "kill" in set(theirs["perf_by_state"]["state"])


def test_redo_and_a_changed_run_folder_read_the_run_again(tmp_path):
    """A run folder rewritten (a rerun into the same folder, a history merged later) is analysed again:
    its key changes with its history's or deliveries' size or time, or its test.toml; --redo (split
    with redo) reads every run whatever the index says."""
    d = write_run(tmp_path / "results", "small", "20261101T230000", small_history(), workload="log", nemesis=[])
    run = Run(run_id="small/20261101T230000", path=str(d), local=True, spec={}, results=None)
    k = reuse.run_key(run)
    assert k == reuse.run_key(run) and k.startswith("r")
    store = reuse.RunStore(str(tmp_path / "out"))
    store.root.mkdir(parents=True)
    store.index_path.write_text(json.dumps({k: {"run_id": run.run_id}}))
    assert store.split([run]) == ([], [run])
    assert store.split([run], redo=True) == ([run], [])
    os.utime(d / "history.parquet", ns=(1, 1))
    k2 = reuse.run_key(run)
    assert k2 != k and store.split([run]) == ([run], [])
    (d / "test.toml").write_text((d / "test.toml").read_text() + "\n# edited\n")
    assert reuse.run_key(run) != k2
    other = Run(run_id="elsewhere/20261101T230000", path=str(d), local=True, spec={}, results=None)
    assert reuse.run_key(other) != reuse.run_key(run)
