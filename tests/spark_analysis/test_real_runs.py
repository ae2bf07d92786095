"""Acceptance 1: over real runs (`pulsar-chaos run` on network-namespace clusters, some correct, some
with a bug knob on) the Spark checks equal the Python checkers' anomalies exactly: same types, same
counts (results.json) and the same values (the checkers rerun on the history with no evidence cap)."""
from __future__ import annotations

import pytest

from spark_analysis import checks
from spark_analysis import main as analysis
from tests.spark_analysis.helpers import python_keys, read_json, rerun_python, spark_keys
from tests.workloads import runs as workload_runs

# four real runs (about three minutes on this machine) and their analysis in the first test's setup
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(1500)]

# (name, TestSpec fields): short runs, ~2.5 minutes in all. The recovery-fencing run is the one of
# tests/workloads/test_pulsar_workloads_run.py (it loses acknowledged messages); the nack run makes
# the queue deliver messages twice.
REAL_RUNS = [
    ("log-valid", dict(workload="log", time_limit=6.0, nemesis=["kill"], nemesis_interval=2.0, seed=11)),
    ("log-fencing-off", dict(workload="log", time_limit=35.0, nemesis=["zk-isolate"], nemesis_interval=15.0,
                             bugs={"broker.recovery_fencing": False}, seed=12)),
    ("subs-failover", dict(workload="subscriptions", options={"subscription": "failover"}, time_limit=8.0,
                           nemesis=["partition"], nemesis_interval=3.0, seed=13)),
    ("queue-nack", dict(workload="queue", options={"exactly_once": True, "nack_every": 5}, time_limit=6.0,
                        nemesis=[], seed=14)),
]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    results = tmp_path_factory.mktemp("real-results")
    made = {}
    for name, kw in REAL_RUNS:
        code, res, out, run_dir = workload_runs.run(results, prefix=name, **kw)
        assert res["run"].get("final_reads") is not False, out
        made[name] = (code, res, run_dir)
    return results, made


@pytest.fixture(scope="module")
def analysed(real_runs, spark, tmp_path_factory):
    results, made = real_runs
    res = analysis.analyze([str(results)], str(tmp_path_factory.mktemp("real-out")), spark=spark, echo=None)
    rows = [r.asDict(recursive=True) for r in spark.read.parquet(f"{res.out_dir}/anomalies.parquet").collect()]
    return res, rows


def test_spark_checks_equal_python_checkers_on_real_runs(real_runs, analysed):
    results, made = real_runs
    res, rows = analysed
    assert not res.skipped and len(res.runs) == len(REAL_RUNS)
    compared = []
    for name, (code, recorded, run_dir) in made.items():
        run_id = f"{run_dir.parent.name}/{run_dir.name}"
        mine = [r for r in rows if r["run_id"] == run_id]
        python = rerun_python(run_dir)
        for checker, result in python.items():
            types = checks.CHECKED[checker]
            want = python_keys(checker, result["anomalies"], types)
            got = spark_keys(mine, checker, types)
            assert got == want, (name, checker)
            counts = read_json(run_dir / "results.json")["checkers"][checker]["stats"]["anomaly_counts"]
            assert {t: len(got[t]) for t in types} == {t: counts.get(t, 0) for t in types}, (name, checker)
            compared.append((name, checker, {t: len(v) for t, v in got.items() if v}))
    # the bug runs did produce what Spark must find, so the comparison above was not vacuous
    found = {(n, c): k for n, c, k in compared}
    assert found[("log-fencing-off", "log")].get("lost"), compared
    assert found[("queue-nack", "queue")].get("duplicated"), compared
    assert len(compared) == len(REAL_RUNS) + 1       # subscriptions: log and queue


def test_real_campaign_tables(analysed, real_runs):
    res, _ = analysed
    runs = res.tables["runs"].set_index("workload", append=True)
    assert set(res.tables["runs"]["agrees"]) == {"yes"}
    det = res.tables["detection"].set_index("knob")
    assert det.loc["broker.recovery_fencing=false", "python_invalid"] == 1
    assert det.loc["broker.recovery_fencing=false", "spark_invalid"] == 1
    # no knob: the queue that claims exactly-once delivery while nacking is invalid, for both
    assert det.loc["none", "runs"] == 3
    assert det.loc["none", "spark_invalid"] == det.loc["none", "python_invalid"] == 1
    perf = res.tables["perf_by_state"]
    log_sends = perf[(perf["workload"] == "log") & (perf["f"] == "send")]
    assert {"healthy", "zk-isolate"} <= set(log_sends["state"]) and (log_sends["ok"] > 0).all()
    assert len(runs) == len(REAL_RUNS)
