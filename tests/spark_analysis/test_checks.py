"""The Spark checks against the Python checkers on small synthetic histories: one clean, and one per
planted anomaly (and per tricky definition: batch index -1 vs 0, partitions, retried and reused values,
info receives carrying messages, empty final reads, drains that end "empty"). Every run must give the
Spark checks exactly the Python checker's anomalies, and each planted one must be found."""
from __future__ import annotations

import pytest

from spark_analysis import checks
from spark_analysis import main as analysis
from tests.spark_analysis.helpers import FINAL, H, python_keys, read_json, rerun_python, spark_keys, write_run

pytestmark = pytest.mark.spark

T0 = "persistent://public/default/sx-0"
T1 = "persistent://public/default/sx-1"
Q0 = "persistent://public/default/sq-0"
Q1 = "persistent://public/default/sq-1"
Q2 = "persistent://public/default/sq-2"


def log_history(*variants: str) -> list:
    """The log workload's shape: two producers, two consumers, final reads; each variant plants one thing."""
    h = H()
    has = set(variants).__contains__
    h.op(-1, "invoke", "start-kill")
    h.op(-1, "ok", "start-kill", value={"node": "broker-1"})
    t0 = [(v, (10, v - 1, -1, -1)) for v in range(1, 9)]                 # plain entries
    t1 = [(v, (20, (v - 101) // 3, -1, (v - 101) % 3)) for v in range(101, 107)]   # batches of 3
    if has("nonmonotonic-send"):
        t0.append((9, (9, 0, -1, -1)))                                     # acked on an older ledger
    for v, m in t0:
        h.send(1, T0, v, m)
    for v, m in t1:
        h.send(2, T1, v, m)
    if has("retries"):
        h.send(1, T0, 50, None, "fail")
        h.send(1, T0, 50, (10, 20, -1, -1))              # retried after a fail: acknowledged
        h.send(5, T0, "51", (10, 21, -1, -1))            # a value spelled as a string
        h.send(1, T0, 52, (10, 22, -1, -1))
        h.send(1, T0, 52, None, "fail")                  # reused after its ack: the ack is kept
        h.op(6, "invoke", "send", T0, 53)
        h.op(6, "info", "send", T0, 53, error="Timeout")
        h.op(7, "ok", "send", T0, 54, (10, 23, -1, -1))  # a completion without an invoke: an attempt
        t0 += [(51, (10, 21, -1, -1)), (52, (10, 22, -1, -1)), (54, (10, 23, -1, -1))]   # 50 never read: lost
    h.pause(2.0)
    h.op(-1, "invoke", "stop-kill")
    h.op(-1, "ok", "stop-kill")
    h.send(1, T0, 60, (10, 30, -1, -1))
    t0.append((60, (10, 30, -1, -1)))
    # consumers: the partition and batch index spelled differently (0 for -1): the same positions
    recv0 = [(v, (m[0], m[1], 0, 0)) for v, m in t0]
    if has("vanish"):
        recv0 = [x for x in recv0 if x[0] != 8]
    h.recv(3, T0, recv0[:4])
    extra0: list = []
    if has("duplicate"):
        extra0.append((2, (11, 0, -1, -1)))                                # value 2 at a second position
    if has("unexpected"):
        extra0.append((4242, (12, 0, -1, -1)))
    h.recv(3, T0, recv0[4:] + extra0)
    recv1 = list(t1)
    if has("divergence"):
        recv1.append((555, (20, 0, -1, 0)))                                # 101's position, another value
    h.recv(4, T1, recv1)
    if has("info-receive"):
        h.recv(7, T0, [(4343, (13, 0, -1, -1)), (1, (10, 0, -1, -1))], outcome="info")
    h.op(-1, "invoke", "heal")
    h.op(-1, "ok", "heal")
    # final reads
    read0 = list(t0)
    if has("lost"):
        read0 = [x for x in read0 if x[0] != 3]
    if has("vanish"):                  # 8: acknowledged, never received nor read
        read0 = [x for x in read0 if x[0] != 8]
    if has("divergence"):
        read0.append((7, (10, 5, -1, -1)))                                 # 7 also at 6's position
    h.recv(FINAL, T0, read0, f="read")
    if has("empty-read"):
        h.recv(FINAL + 1, T1, [], f="read")
    else:
        h.recv(FINAL + 1, T1, t1, f="read")
    if has("lost"):
        h.recv(FINAL + 2, T1, [x for x in t1 if x[0] != 104], f="read")   # one of two reads lacks 104
    if has("read-without-key"):
        h.op(FINAL + 3, "invoke", "read", T1)
        h.op(FINAL + 3, "ok", "read", "", [{"value": 999, "message_id": {"ledger_id": 21, "entry_id": 0}}])
    return h.ops


def queue_history() -> list:
    """The queue workload's shape with every queue anomaly planted once, and the drain outcomes."""
    h = H()
    for v in range(1, 7):
        h.op(1, "invoke", "enqueue", Q0, v)
        h.op(1, "ok", "enqueue", Q0, v, (30, v - 1, -1, -1))
    h.op(1, "invoke", "enqueue", Q0, 7)
    h.op(1, "fail", "enqueue", Q0, 7, error="ProducerBusy")
    h.op(1, "invoke", "enqueue", Q0, 7)
    h.op(1, "ok", "enqueue", Q0, 7, (30, 6, -1, -1))
    h.recv(2, Q0, [(1, (30, 0, -1, -1)), (2, (30, 1, -1, -1)), (3, (31, 0, -1, -1))], f="dequeue")  # 3 moved
    h.recv(2, Q0, [(2, (30, 1, -1, 0)), (99, (32, 0, -1, -1)), (7, (30, 6, -1, -1))], f="dequeue")  # 2 again, 99
    h.recv(3, Q0, [(7, (30, 6, -1, -1))], f="dequeue", outcome="info")     # 7 twice, but 2 attempts
    h.recv(FINAL, Q0, [(4, (30, 3, -1, -1)), (5, (30, 4, -1, -1))], f="drain")     # 6 never: lost
    h.op(1, "invoke", "enqueue", Q1, 201)
    h.op(1, "ok", "enqueue", Q1, 201, (40, 0, -1, -1))
    h.op(FINAL + 1, "invoke", "drain", Q1)
    h.op(FINAL + 1, "fail", "drain", Q1, error="empty: nothing left")      # emptied: 201 lost
    h.op(1, "invoke", "enqueue", Q2, 301)
    h.op(1, "ok", "enqueue", Q2, 301, (50, 0, -1, -1))
    h.op(FINAL + 2, "invoke", "drain", Q2)
    h.op(FINAL + 2, "info", "drain", Q2, error="Timeout")                  # incomplete: 301 unknown
    return h.ops


LOG_VARIANTS = ("clean", "lost", "duplicate", "divergence", "nonmonotonic-send", "unexpected", "retries",
                "info-receive", "empty-read", "read-without-key")
# what each variant must make the Spark checks find (checker, type) -> at least one
PLANTED = {
    "lost": {("log", "lost")}, "duplicate": {("log", "duplicate")},
    "divergence": {("log", "divergence"), ("log", "unexpected"), ("log", "duplicate")},
    "nonmonotonic-send": {("log", "nonmonotonic-send")}, "unexpected": {("log", "unexpected")},
    "retries": {("log", "lost")}, "info-receive": {("log", "unexpected")}, "empty-read": {("log", "lost")},
    "read-without-key": {("log", "unexpected")},
    "queue": {("queue", "lost"), ("queue", "unexpected"), ("queue", "duplicated"), ("queue", "duplicate")},
    "subscriptions": {("log", "lost"), ("queue", "lost"), ("log", "duplicate"), ("queue", "duplicate"),
                      ("queue", "duplicated")},
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory, spark):
    """The synthetic runs under one results dir, analysed once: (results dir, analysis result, rows)."""
    results = tmp_path_factory.mktemp("synthetic-results")
    for i, v in enumerate(LOG_VARIANTS):
        write_run(results, f"syn-{v}", f"2026110{1 + i % 3}T12{i:02d}00", log_history(v),
                  workload="log", nemesis=["kill"], bugs={} if v == "clean" else {"bookie.ignore_fence": True})
    write_run(results, "syn-queue", "20261102T120000", queue_history(), workload="queue", nemesis=[])
    # the subscriptions workload runs the log and the queue checkers over the same send/receive ops
    write_run(results, "syn-subscriptions", "20261103T120000", log_history("duplicate", "vanish"),
              workload="subscriptions", options={"subscription": "failover"}, nemesis=[])
    out = tmp_path_factory.mktemp("synthetic-out")
    # without the store of per-run tables (reuse.py): its tables equal these (test_reuse.py, test_standalone.py)
    res = analysis.analyze([str(results)], str(out), spark=spark, echo=None, reuse=False)
    rows = [r.asDict(recursive=True) for r in spark.read.parquet(f"{res.out_dir}/anomalies.parquet").collect()]
    return results, res, rows


def _run_dirs(results):
    return sorted(p.parent for p in results.glob("*/*/test.toml"))


def test_spark_checks_equal_the_python_checkers_on_every_synthetic_run(synthetic):
    results, res, rows = synthetic
    dirs = _run_dirs(results)
    assert len(res.runs) == len(dirs) == len(LOG_VARIANTS) + 2 and not res.skipped
    by_run = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append(r)
    compared = 0
    for d in dirs:
        run_id = f"{d.parent.name}/{d.name}"
        python = rerun_python(d)
        assert python, d
        recorded = read_json(d / "results.json")["checkers"]
        for checker, result in python.items():
            types = checks.CHECKED[checker]
            want = python_keys(checker, result["anomalies"], types)
            got = spark_keys(by_run.get(run_id, []), checker, types)
            assert got == want, (run_id, checker)
            counts = recorded[checker]["stats"]["anomaly_counts"]
            assert {t: len(got[t]) for t in types} == {t: counts.get(t, 0) for t in types}, (run_id, checker)
            compared += 1
    assert compared == len(dirs) + 1          # subscriptions: both checkers


def test_the_synthetic_histories_record_each_completions_invoke(synthetic):
    """The runs above are read as the store writes them now (each completion's invoke recorded: the op
    table a projection); histories written before are paired by a window (test_inputs.py's runs)."""
    _, res, _ = synthetic
    assert res.runs and all(r.paired for r in res.runs)


def test_each_planted_anomaly_is_found_and_the_clean_run_has_none(synthetic):
    _, _, rows = synthetic
    found: dict[str, set] = {}
    for r in rows:
        found.setdefault(r["run_id"].split("/")[0].removeprefix("syn-"), set()).add((r["checker"], r["type"]))
    assert "clean" not in found
    for variant, want in PLANTED.items():
        assert want <= found.get(variant, set()), (variant, found.get(variant))


def test_exact_evidence_of_planted_anomalies(synthetic):
    _, _, rows = synthetic
    def of(run, checker, type_):
        return [r for r in rows if r["run_id"].startswith(f"syn-{run}/") and r["checker"] == checker
                and r["type"] == type_]
    assert sorted((r["topic"], r["value"]) for r in of("lost", "log", "lost")) == [(T0, 3), (T1, 104)]
    assert sorted(r["value"] for r in of("retries", "log", "lost")) == [50]
    assert len(of("empty-read", "log", "lost")) == 6
    [nm] = of("nonmonotonic-send", "log", "nonmonotonic-send")
    assert (nm["process"], nm["values"], nm["partition"]) == (1, [8, 9], -1)
    [dv] = [r for r in of("divergence", "log", "divergence") if r["topic"] == T1]
    assert dv["values"] == [101, 555] and dv["message_ids"][0] == {"ledger_id": 20, "entry_id": 0, "batch_index": 0}
    [dup] = of("duplicate", "log", "duplicate")
    assert dup["value"] == 2 and len(dup["message_ids"]) == 2
    q = {t: sorted(r["value"] for r in of("queue", "queue", t)) for t in checks.QUEUE_TYPES}
    assert q == {"lost": [6, 201], "unexpected": [99], "duplicated": [2], "duplicate": [3]}


def test_runs_table_verdicts_and_agreement(synthetic):
    _, res, _ = synthetic
    runs = res.tables["runs"].set_index("test_name")
    assert set(runs["agrees"]) == {"yes"}
    assert runs.loc["syn-clean", "spark_valid"] == "true" and runs.loc["syn-clean", "python_valid"] == "true"
    assert runs.loc["syn-lost", "spark_valid"] == "false" and runs.loc["syn-lost", "python_valid"] == "false"
    assert runs.loc["syn-lost", "log.lost"] == 2
    det = res.tables["detection"].set_index("cause")
    assert det.loc["none", "runs"] == 3 and det.loc["bookie.ignore_fence=true", "runs"] == len(LOG_VARIANTS) - 1
    # time to first detection: a run column from results.json, its mean per detection row
    runs = res.tables["runs"].set_index("run_id")
    secs = runs[(runs["python_valid"] == "false") & runs["causes"].map(lambda c: "bookie.ignore_fence=true" in c)]
    assert runs.loc[runs["python_valid"] == "true", "detection_s"].isna().all() and secs["detection_s"].notna().all()
    assert det.loc["bookie.ignore_fence=true", "mean_detection_s"] == pytest.approx(secs["detection_s"].mean(), abs=0.005)


def test_the_detection_matrix_equals_the_table_command(synthetic):
    """The analysis's per-(cause, scenario) table holds the figures `pulsar-chaos detection` prints for the
    same results dir (read without Spark): row for row."""
    from harness import detection_table
    results, res, _ = synthetic
    mine = res.tables["detection_matrix"]
    cli_rows, _ = detection_table.rows([str(results)])
    assert len(mine) == len(cli_rows) > 0
    got = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in mine.to_dict("records")]
    assert got == cli_rows
    # the knob's row: the log runs under a kill; the clean log run is its scenario's false-alarm count
    runs = res.tables["runs"]
    [row] = [r for r in cli_rows if r["cause"] == "bookie.ignore_fence=true"]
    log_kill = runs[(runs["workload"] == "log")]
    assert row["runs"] == len(LOG_VARIANTS) - 1 and row["scenario"] == "log / kill"
    assert row["invalid"] == int(((log_kill["python_valid"] == "false") & (log_kill["bugs"] != "none")).sum())
    assert (row["false_alarm_runs"], row["false_alarms"]) == (1, 0)
    assert {r["scenario_key"] for r in cli_rows if r["cause"] == "none"} >= {row["scenario_key"]}


def test_fault_state_tables(synthetic):
    """The kill is on for 2 s in every log run; the first ok send after its stop completes 2 ms later."""
    _, res, _ = synthetic
    perf = res.tables["perf_by_state"]
    sends = perf[(perf["workload"] == "log") & (perf["f"] == "send")]
    assert set(sends["state"]) == {"kill", "healthy"}
    # the latencies are counted per (run, f, type, state, microsecond) and the percentiles weighted by
    # those counts: every synthetic op is 1 ms after the one before, so each ok send took exactly 1 ms,
    # and the ok sends of every state add up to the log runs' ok sends that follow their invoke
    assert set(sends["p50_ms"]) == set(sends["p99_ms"]) == set(sends["max_ms"]) == {1.0}
    want_ok = 0
    for v in LOG_VARIANTS:
        last: dict[int, object] = {}
        for o in log_history(v):
            p = last.get(o.process)
            want_ok += (o.f == "send" and o.type == "ok" and p is not None and p.type == "invoke" and p.f == "send")
            last[o.process] = o
    assert int(sends["ok"].sum()) == want_ok > 0
    rec = res.tables["recovery"].set_index(["workload", "fault"])
    assert rec.loc[("log", "kill"), "stops"] == len(LOG_VARIANTS)
    assert rec.loc[("log", "kill"), "max_s"] == pytest.approx(0.002, abs=1e-6)
    un = res.tables["unavailability"]
    kill = un[(un["workload"] == "log") & (un["state"] == "kill")]
    assert len(kill) == 1 and kill["longest_gap_s"].iloc[0] > 2.0
    assert list(res.tables["trends"]["day"]) == ["2026-11-01", "2026-11-02", "2026-11-03"]


def test_losses_proven_from_a_disk_wipe_are_left_out_of_the_comparison():
    """The log checker's losses proven from a wipe and the ledgers' metadata (its final read stalled) are
    not what the Spark checks count (they read the final reads only): results.json's lost minus them."""
    from spark_analysis.checks import python_counts
    from spark_analysis.inputs import Run
    res = {"checkers": {"log": {"valid": False, "anomalies": {"lost": [{}] * 3},
                                "stats": {"anomaly_counts": {"lost": 7, "duplicate": 2}, "lost_wiped_count": 5}}}}
    run = Run(run_id="r", path="/x", local=True, spec={}, results=res)
    got = python_counts(run)["log"]
    assert got["lost"] == 2 and got["duplicate"] == 2
    res["checkers"]["log"]["stats"].pop("lost_wiped_count")           # a checker before the proof
    assert python_counts(run)["log"]["lost"] == 7
