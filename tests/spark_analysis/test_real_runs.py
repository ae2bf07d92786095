"""Acceptance 1: over real runs (`pulsar-chaos run` on network-namespace clusters, some correct, some
with a bug knob on) the Spark checks equal the Python checkers' anomalies exactly: same types, same
counts (results.json) and the same values (the checkers rerun on the history with no evidence cap).

The same runs judge expectations (issue 18): the deliberately unsafe ones (a bug knob caught by the
fencing checker only, `register` with `cas=unsafe`, `exactly-once` with `seek=false`, a queue that
claims exactly-once while nacking) are detection rows, not false alarms, and the Spark columns say
"not re-checked" where Spark has no equivalent checker. Those three runs are the workloads' own
must-fail runs, made here once (their assertions moved here from tests/workloads/), and so is the log
workload's run with recovery fencing off."""
from __future__ import annotations

import subprocess
import sys

import pytest

from spark_analysis import checks
from spark_analysis import main as analysis
from tests.spark_analysis.helpers import python_keys, read_json, rerun_python, spark_keys
from tests.workloads import runs as workload_runs

# seven real runs (about 110 s on this machine, each ~6 s of cluster start and stop and 2 s of settling
# besides its time limit) and their analysis in the first test's setup
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(1500)]

# (name, TestSpec fields): short runs, ~1.8 minutes in all. The recovery-fencing run is the one of
# tests/workloads/test_pulsar_workloads_run.py (it loses acknowledged messages); the nack run makes
# the queue deliver messages twice.
REAL_RUNS = [
    ("log-valid", dict(workload="log", time_limit=6.0, nemesis=["kill"], nemesis_interval=2.0, seed=11)),
    # zk-isolate from 10 s to 20 s: the owner's ZooKeeper session (6 s) expires at ~16 s, a new owner
    # recovers the ledger without fencing it and the old one acknowledges on it until 20 s (measured:
    # 58 and 113 lost with seeds 12 and 21; with the fault held from 8 to 16 s only 18 to 56)
    ("log-fencing-off", dict(workload="log", time_limit=22.0, nemesis=["zk-isolate"], nemesis_interval=10.0,
                             bugs={"broker.recovery_fencing": False}, seed=12)),
    ("subs-failover", dict(workload="subscriptions", options={"subscription": "failover"}, time_limit=6.0,
                           nemesis=["partition"], nemesis_interval=2.0, seed=13)),
    ("queue-nack", dict(workload="queue", options={"exactly_once": True, "nack_every": 5}, time_limit=6.0,
                        nemesis=[], seed=14)),
    # Certain, not lucky: one register, 16 processes at 800 ops/s for 6 s: ~800 unconditional-set cas,
    # each with a get-to-set window of a round trip or two, so hundreds of pairs overlap and some two
    # succeed from the same value (a lost update); measured: every run on loopback had one (at 10 s
    # and at 6 s)
    ("register-unsafe", dict(workload="register", time_limit=6.0, zookeepers=3, topics=1, concurrency=16,
                             rate=800.0, nemesis=[], options={"cas": "unsafe"})),
    # seek=false: the state is restored but the input resumes after what was acknowledged, so the inputs
    # processed between the checkpoint and each (mid-interval) kill are never counted again. No cluster
    # faults: the workload's own kills are the fault that matters (three kills in 8 s; measured: 72 missed)
    ("eo-no-seek", dict(workload="exactly-once", topics=1, concurrency=4, rate=100.0, time_limit=8.0, nemesis=[],
                        options={"checkpoint_every": 50, "kill_interval": 2.5, "seek": False})),
    # Certain, not lucky: no faults, so the writer adds all along; the first recovery comes within
    # 1.5 * recover_interval = 1.5 s; with the knob the bookies keep accepting the writer's adds (it never
    # learns of the fence, and ledger_max_entries=0 keeps it on that ledger), so every add after the
    # recovery completes is acknowledged beyond the recovered last entry (measured: 724 in 5 s)
    ("ledger-ignore-fence", dict(workload="ledger", time_limit=5.0, nemesis=[], bugs={"bookie.ignore_fence": True},
                                 options={"recover_interval": 1.0, "ledger_max_entries": 0})),
]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    results = tmp_path_factory.mktemp("real-results")
    made = {}
    for name, kw in REAL_RUNS:
        code, res, out, run_dir = workload_runs.run(results, prefix=name, **kw)
        assert res["run"].get("final_reads") is not False, out
        made[name] = (code, res, run_dir, out)
    return results, made


@pytest.fixture(scope="module")
def analysed(real_runs, spark, tmp_path_factory):
    results, made = real_runs
    res = analysis.analyze([str(results)], str(tmp_path_factory.mktemp("real-out")), spark=spark, echo=None,
                           reuse=False)       # the store's path is tested equal to this one in test_reuse.py
    rows = [r.asDict(recursive=True) for r in spark.read.parquet(f"{res.out_dir}/anomalies.parquet").collect()]
    return res, rows


def test_spark_checks_equal_python_checkers_on_real_runs(real_runs, analysed):
    results, made = real_runs
    res, rows = analysed
    assert not res.skipped and len(res.runs) == len(REAL_RUNS)
    compared = []
    for name, (code, recorded, run_dir, _) in made.items():
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
    assert len(compared) == 4 + 1       # the log and queue runs; subscriptions: log and queue


def test_real_campaign_tables(analysed, real_runs):
    res, _ = analysed
    runs = res.tables["runs"].set_index("workload", append=True)
    # Spark compares only the runs with a log or queue checker; the others are "n/a", not agreements
    agrees = res.tables["runs"].set_index("test_name")["agrees"]
    assert sorted(agrees) == ["n/a"] * 3 + ["yes"] * 4
    det = res.tables["detection"].set_index("cause")
    assert det.loc["broker.recovery_fencing=false", "python_invalid"] == 1
    assert det.loc["broker.recovery_fencing=false", "spark_invalid"] == 1
    # every deliberately unsafe run is a detection row (expected invalid, caught), none a false alarm
    for cause in ("queue:exactly_once+nack_every", "register:cas=unsafe", "exactly-once:seek=false",
                  "bookie.ignore_fence=true"):
        assert det.loc[cause, "expected"] == "invalid" and det.loc[cause, "runs"] == 1, det
        assert det.loc[cause, "python_invalid"] == 1 and det.loc[cause, "python_rate"] == 1.0, det
    assert det.loc["queue:exactly_once+nack_every", "spark_invalid"] == 1
    # ... and Spark, which has no fencing, linear or exactly-once checker, says so instead of 0/1
    for cause, by in (("register:cas=unsafe", "linear"), ("exactly-once:seek=false", "exactly-once"),
                      ("bookie.ignore_fence=true", "fencing")):
        assert det.loc[cause, "spark"] == "not re-checked" and det.loc[cause, "spark_rechecked"] == 0, det
        assert by in det.loc[cause, "decided_by"].split(",")
    assert det.loc["none", "runs"] == 2 and det.loc["none", "python_invalid"] == 0     # 0 false alarms
    assert det.loc["none", "spark_invalid"] == 0
    assert set(res.tables["runs"]["expectation_met"]) == {"yes"}
    tr = res.tables["trends"]
    assert tr["false_alarms"].sum() == 0 and tr["expected_invalid"].sum() == 5 and tr["detected"].sum() == 5
    perf = res.tables["perf_by_state"]
    log_sends = perf[(perf["workload"] == "log") & (perf["f"] == "send")]
    assert {"healthy", "zk-isolate"} <= set(log_sends["state"]) and (log_sends["ok"] > 0).all()
    assert len(runs) == len(REAL_RUNS)


def test_the_summary_and_page_say_what_spark_could_compare(analysed):
    import io
    res, _ = analysed
    out = io.StringIO()
    analysis.print_summary(res, out)
    text = out.getvalue()
    assert "on 4/4 runs they could compare (3 of 7 not comparable" in text, text
    assert "detected register:cas=unsafe: 1/1 by the checkers, not re-checked by Spark" in text, text
    assert "false alarms (runs expected valid): 0/2 by the checkers, 0/2 by the Spark checks" in text, text
    assert "detected broker.recovery_fencing=false: 1/1 by the checkers, 1/1 by the Spark checks" in text, text
    assert "expectations met by 7/7 runs" in text, text
    page = open(res.html, encoding="utf-8").read()
    assert "not re-checked" in page and "register:cas=unsafe" in page


def test_each_run_records_its_expectation_and_check_and_report_show_it(real_runs):
    import tomllib
    _, made = real_runs
    for name, (code, res, run_dir, out) in made.items():
        spec = tomllib.loads((run_dir / "test.toml").read_text())
        want = "valid" if name in ("log-valid", "subs-failover") else "invalid"
        assert spec["expected"] == res["expected"] == want, name
        assert res["expectation_met"] is True, (name, res["valid"])
        assert f"expected {want}" in out and ": met;" in out, out
    _, res, run_dir, _ = made["register-unsafe"]
    assert "register:cas=unsafe" in res["expected_reason"]
    cli = [sys.executable, "-m", "harness.cli"]
    chk = subprocess.run([*cli, "check", str(run_dir)], capture_output=True, text=True, timeout=300)
    assert chk.returncode == 1 and "expected invalid (option register:cas=unsafe" in chk.stdout, chk
    assert chk.stdout.rstrip().endswith(": met; exit code 1"), chk.stdout
    rep = subprocess.run([*cli, "report", str(run_dir)], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    html = (run_dir / "report.html").read_text()
    assert "expected invalid (option register:cas=unsafe" in html and "expectation met" in html


# ------------------------------------------------------------------ the workloads' must-fail runs (moved here)

def test_register_with_unsafe_cas_is_not_linearizable(real_runs):
    code, res, run_dir, out = real_runs[1]["register-unsafe"]
    assert "linear" in res["checkers"], f"the linear checker is not registered: {list(res['checkers'])}"
    lin = res["checkers"]["linear"]
    assert code == 1 and res["valid"] is False and lin["valid"] is False, out
    assert lin["anomalies"], lin["stats"]


def test_exactly_once_resuming_from_the_subscription_misses_inputs(real_runs):
    from tests.workloads.test_exactly_once import _no_processor_left
    code, res, run_dir, out = real_runs[1]["eo-no-seek"]
    c = res["checkers"]["exactly-once"]
    assert code == 1 and c["valid"] is False, (out, c["stats"])
    assert c["anomalies"].get("missed"), c["anomalies"].keys()
    assert all(a["amount"] < 0 for a in c["anomalies"]["missed"])
    assert not c["anomalies"].get("double-counted") and not c["anomalies"].get("duplicate-without-restart")
    # three kills are planned in the 8 s; under a loaded machine the processors start late and only one
    # may land (seen once under load 5-6): one is enough to show the resume missing inputs (asserted above)
    assert c["stats"]["crashes"] >= 1
    assert _no_processor_left(run_dir)


def test_log_with_recovery_fencing_off_loses_acknowledged_messages(real_runs):
    # tests/workloads/test_pulsar_workloads_run.py's scenario for the log workload: the old owner, cut from
    # ZooKeeper only, keeps acknowledging on a ledger the new owner closed
    code, res, run_dir, out = real_runs[1]["log-fencing-off"]
    assert code == 1 and res["valid"] is False, out
    assert res["checkers"]["log"]["anomalies"].get("lost"), res["checkers"]["log"]["anomalies"].keys()
    # the stale owner's acknowledgements lie beyond the last entry its ledger was closed at
    fencing = res["checkers"]["fencing"]["anomalies"]
    assert fencing.get("beyond-close") or fencing.get("split-brain"), fencing.keys()


def test_ledger_with_bookies_ignoring_the_fence_is_invalid(real_runs):
    code, res, run_dir, out = real_runs[1]["ledger-ignore-fence"]
    f = res["checkers"]["fencing"]
    assert code == 1 and res["valid"] is False and f["valid"] is False, out
    assert f["stats"]["anomaly_counts"].get("ack-after-fence", 0) > 10, f["stats"]["anomaly_counts"]
    ev = f["anomalies"]["ack-after-fence"][0]
    assert ev["entry_id"] > ev["recovered_last_entry"]
