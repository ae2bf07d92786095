"""Incremental analysis: analyse a night's runs, add the next night's, analyse again: the second call
reads only the new runs' histories (the job's own count of the files it read) and its tables equal a
full analysis of all four; `redo` reads them all again."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from spark_analysis import main as analysis
from spark_analysis import reuse
from tests.spark_analysis.helpers import write_run
from tests.spark_analysis.test_checks import log_history, queue_history
from tests.spark_analysis.test_inputs import small_history

pytestmark = pytest.mark.spark


def _tables(out_dir: str) -> dict[str, pd.DataFrame]:
    out = {}
    for p in sorted(Path(out_dir).glob("*.parquet")):
        df = pd.read_parquet(p)
        if len(df):
            key = df.astype(str).apply(lambda r: "\x00".join(r), axis=1)
            df = df.loc[key.sort_values(kind="stable").index].reset_index(drop=True)
        out[p.stem] = df
    return out


def _manifest(res) -> dict:
    return json.loads((Path(res.out_dir) / "manifest.json").read_text())


def test_a_second_analysis_reads_only_the_new_runs_and_equals_a_full_one(spark, tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    # night 1: a log run with a kill and a lost message, a clean small run
    write_run(results, "log-kill", "20261101T220000", log_history("lost"), workload="log", nemesis=["kill"])
    write_run(results, "small", "20261101T230000", small_history(), workload="log", nemesis=[])
    first = analysis.analyze([str(results)], str(out), spark=spark, echo=None)
    assert (first.runs_read, first.runs_reused, first.history_files_read) == (2, 0, 2)

    # night 2: two more runs (a queue run, a run losing a message)
    write_run(results, "queue", "20261102T220000", queue_history(), workload="queue", nemesis=[])
    write_run(results, "small", "20261102T230000", small_history(lose=True), workload="log", nemesis=[])
    second = analysis.analyze([str(results)], str(out), spark=spark, echo=None)
    assert len(second.runs) == 4
    assert (second.runs_read, second.runs_reused, second.history_files_read) == (2, 2, 2)
    m = _manifest(second)
    assert (m["runs_read"], m["runs_reused"], m["history_files_read"]) == (2, 2, 2)
    store = reuse.RunStore(str(out))
    assert sorted(v["run_id"] for v in store.index().values()) == sorted(r.run_id for r in second.runs)

    # a full analysis of the four runs, without the store: the same tables
    full = analysis.analyze([str(results)], str(tmp_path / "full"), spark=spark, echo=None, reuse=False)
    assert full.runs_read is None and full.history_files_read == 4
    assert not (tmp_path / "full" / "analysis" / reuse.DIR).exists()
    mine, theirs = _tables(second.out_dir), _tables(full.out_dir)
    assert set(mine) == set(theirs) and {"anomalies", "runs", "perf_by_state", "recovery", "trends"} <= set(mine)
    for name in theirs:
        pd.testing.assert_frame_equal(mine[name], theirs[name], check_dtype=False, obj=name)
    # not vacuous: both nights' anomalies and fault states are in them
    lost = theirs["anomalies"][theirs["anomalies"]["type"] == "lost"]
    assert {"log-kill/20261101T220000", "small/20261102T230000", "queue/20261102T220000"} <= set(lost["run_id"])
    assert "kill" in set(theirs["perf_by_state"]["state"]) and list(theirs["trends"]["runs"]) == [2, 2]

    # redo analyses every run again, into the same tables
    redo = analysis.analyze([str(results)], str(out), spark=spark, echo=None, redo=True)
    assert (redo.runs_read, redo.runs_reused, redo.history_files_read) == (4, 0, 4)
    for name, df in _tables(redo.out_dir).items():
        pd.testing.assert_frame_equal(df, theirs[name], check_dtype=False, obj=name)


def test_a_changed_run_folder_gets_a_new_key(tmp_path):
    """A run folder rewritten (a rerun into the same folder, a history merged later) is analysed again:
    its key changes with its history's or deliveries' size or time, or its test.toml."""
    from spark_analysis.inputs import Run
    d = write_run(tmp_path, "small", "20261101T230000", small_history(), workload="log", nemesis=[])
    run = Run(run_id="small/20261101T230000", path=str(d), local=True, spec={}, results=None)
    k = reuse.run_key(run)
    assert k == reuse.run_key(run) and k.startswith("r")
    os.utime(d / "history.parquet", ns=(1, 1))
    k2 = reuse.run_key(run)
    assert k2 != k
    (d / "test.toml").write_text((d / "test.toml").read_text() + "\n# edited\n")
    assert reuse.run_key(run) != k2
    other = Run(run_id="elsewhere/20261101T230000", path=str(d), local=True, spec={}, results=None)
    assert reuse.run_key(other) != reuse.run_key(run)
