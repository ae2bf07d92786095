"""Campaign tables over every analysed run: verdicts and anomaly counts by configuration, detection
and false-alarm rates (per cause, and per cause and scenario: the detection matrix), performance by fault
state, unavailability, recovery, and trends by day.

Each is a Spark DataFrame (written as Parquet by spark_analysis.main); the run table joins each run's
configuration (test.toml), Python verdict (results.json) and Spark anomaly counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from core import store
from core.detection import MATRIX_COLUMNS
from spark_analysis import checks
from spark_analysis import detection as det_facts
from spark_analysis.inputs import Run, Skipped
from spark_analysis.perf import PerfTables

TYPE_COLUMNS = [f"{c}.{t}" for c, ts in checks.CHECKED.items() for t in ts]    # "log.lost", ...
CONFIG = ["workload", "nemesis", "quorum", "bugs", "backend", "options"]


def decided_by(r: Run) -> dict[str, set[str]]:
    """{checker: anomaly types it found} for each of the run's checkers that judged it invalid
    (results.json)."""
    return {name: {t for t, n in store.anomaly_counts(c).items() if n > 0}
            for name, c in ((r.results or {}).get("checkers") or {}).items()
            if isinstance(c, dict) and c.get("valid") is False}


def rechecked(r: Run, inv: dict[str, set[str]]) -> bool:
    """Whether the Spark checks can judge this run: it has Spark-checked types, and if its own checkers
    found it invalid, at least one anomaly type they found is one Spark re-checks (a run decided by the
    fencing, elle, linear, exactly-once or perf checker alone is not re-checked)."""
    if not any(inv.values()):
        return False
    if r.python_valid != "false":
        return True
    return any(t in inv.get(c, ()) for c, ts in decided_by(r).items() for t in ts)


def met(expected: str, python_valid: str) -> str:
    """"yes", "NO", or "n/a" (no verdict) for a run's expectation against its checkers' verdict."""
    if python_valid not in ("true", "false"):
        return "n/a"
    return "yes" if (python_valid == "false") == (expected == "invalid") else "NO"


def run_rows(runs: list[Run], counts: dict[str, dict[str, int]], stats: dict[str, dict[str, Any]]) -> list[dict]:
    """One dict per run: configuration, expectation, verdicts, Spark counts per "checker.type" (None: not
    checked)."""
    rows = []
    for r in runs:
        inv = checks.invalid_types(r)
        spark_c = counts.get(r.run_id, {})
        py = checks.python_counts(r)
        exp = r.expectation
        facts = det_facts.facts(r)
        row: dict[str, Any] = {
            "run_id": r.run_id, "path": r.path, "test_name": r.test_name, "workload": r.workload,
            "nemesis": r.nemesis, "quorum": r.quorum, "bugs": r.bugs_label, "bug_knobs": r.bug_knobs,
            "backend": r.backend, "options": r.options_label,
            "started_at": r.started_at, "python_valid": r.python_valid,
            "expected": exp.expected, "causes": r.causes, "expectation_met": met(exp.expected, r.python_valid),
            "decided_by": ",".join(sorted(decided_by(r))) or "",
            "scenario": facts["scenario"], "scenario_key": facts["scenario_key"],
            "detection_s": facts["detection_s"],
            "spark_rechecked": rechecked(r, inv),
            "checked": ",".join(sorted(inv)) or "none",
            "ops": int(stats.get(r.run_id, {}).get("ops") or 0),
            "non_int_values": int(stats.get(r.run_id, {}).get("non_int_values") or 0),
            "notes": "; ".join(r.notes + ([] if stats.get(r.run_id, {}).get("ops") else
                                          ["no ops read: history.parquet empty or unreadable"])),
        }
        invalid = False
        agree: bool | None = None if not py else True
        for col in TYPE_COLUMNS:
            c, t = col.split(".", 1)
            n = spark_c.get(col, 0) if c in inv else None
            row[col] = n
            if n and t in inv.get(c, ()):
                invalid = True
            if c in py and c in inv and py[c].get(t, 0) != (n or 0):
                agree = False
        if agree is not None and not any(c in inv for c in py):
            agree = None
        row["spark_valid"] = ("false" if invalid else "true") if inv else "n/a"
        row["agrees"] = "n/a" if agree is None else "yes" if agree else "NO"
        rows.append(row)
    return rows


RUN_SCHEMA = T.StructType(
    [T.StructField(n, T.StringType()) for n in ("run_id", "path", "test_name", "workload", "nemesis", "quorum",
                                                  "bugs")]
    + [T.StructField("bug_knobs", T.ArrayType(T.StringType()))]
    + [T.StructField(n, T.StringType()) for n in ("backend", "options")]
    + [T.StructField("started_at", T.TimestampType()), T.StructField("python_valid", T.StringType()),
       T.StructField("expected", T.StringType()), T.StructField("causes", T.ArrayType(T.StringType())),
       T.StructField("expectation_met", T.StringType()), T.StructField("decided_by", T.StringType()),
       T.StructField("scenario", T.StringType()), T.StructField("scenario_key", T.StringType()),
       T.StructField("detection_s", T.DoubleType()),
       T.StructField("spark_rechecked", T.BooleanType()),
       T.StructField("checked", T.StringType()), T.StructField("ops", T.LongType()),
       T.StructField("non_int_values", T.LongType()), T.StructField("notes", T.StringType())]
    + [T.StructField(c, T.LongType()) for c in TYPE_COLUMNS]
    + [T.StructField("spark_valid", T.StringType()), T.StructField("agrees", T.StringType())])


MATRIX_SCHEMA = T.StructType(
    [T.StructField(n, T.StringType()) for n in ("cause", "scenario", "scenario_key", "kind")]
    + [T.StructField(n, T.LongType()) for n in ("runs", "with_verdict", "invalid")]
    + [T.StructField("rate", T.DoubleType()), T.StructField("meets_target", T.BooleanType()),
       T.StructField("anomaly_types", T.StringType()), T.StructField("detection_runs", T.LongType()),
       T.StructField("mean_detection_s", T.DoubleType()), T.StructField("false_alarm_runs", T.LongType()),
       T.StructField("false_alarms", T.LongType())])


@dataclass
class Campaign:
    runs: DataFrame
    skipped: DataFrame
    anomaly_counts: DataFrame
    by_config: DataFrame
    detection: DataFrame
    detection_matrix: DataFrame
    perf_by_state: DataFrame
    unavailability: DataFrame
    recovery: DataFrame
    trends: DataFrame

    def tables(self) -> dict[str, DataFrame]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _sum_types(df: DataFrame) -> list[Any]:
    return [F.sum(F.col(f"`{c}`")).alias(c) for c in TYPE_COLUMNS]


def build(spark: SparkSession, runs: list[Run], skipped: list[Skipped], anomalies: DataFrame,
          stats: DataFrame, perf: PerfTables) -> Campaign:
    counts_df = anomalies.groupBy("run_id", "checker", "type").agg(F.count(F.lit(1)).alias("count"))
    counts_rows = counts_df.collect()
    counts: dict[str, dict[str, int]] = {}
    for r in counts_rows:
        counts.setdefault(r["run_id"], {})[f"{r['checker']}.{r['type']}"] = r["count"]
    stat = {r["run_id"]: r.asDict() for r in stats.collect()}
    rows = run_rows(runs, counts, stat)
    longest = {r["run_id"]: r["g"] for r in perf.gaps.groupBy("run_id").agg(F.max("gap_s").alias("g")).collect()}
    for row in rows:
        row["longest_gap_s"] = round(longest[row["run_id"]], 3) if longest.get(row["run_id"]) is not None else None
    schema = T.StructType(RUN_SCHEMA.fields + [T.StructField("longest_gap_s", T.DoubleType())])
    runs_df = spark.createDataFrame([tuple(row[f.name] for f in schema.fields) for row in rows], schema)
    runs_df = runs_df.withColumn("day", F.to_date("started_at")).cache()
    skipped_df = spark.createDataFrame([(s.path, s.reason) for s in skipped], "path string, reason string")

    py = F.col("python_valid")
    by_config = (runs_df.groupBy(*CONFIG).agg(
        F.count(F.lit(1)).alias("runs"),
        F.sum((py == "true").cast("int")).alias("valid"), F.sum((py == "false").cast("int")).alias("invalid"),
        F.sum((py == "unknown").cast("int")).alias("unknown"),
        F.sum((~py.isin("true", "false", "unknown")).cast("int")).alias("no_verdict"),
        F.sum((F.col("spark_valid") == "false").cast("int")).alias("spark_invalid"),
        *_sum_types(runs_df)).orderBy(*CONFIG))

    # detection by expectation: one row per cause (a bug knob, a workload's unsafe option), "none" for
    # the runs expected valid (their invalid verdicts are the false alarms); the Spark columns count only
    # the runs Spark re-checks, and say "not re-checked" where it re-checks none of them
    cause = runs_df.withColumn("cause", F.explode("causes"))
    sp_inv = (F.col("spark_valid") == "false") & F.col("spark_rechecked")
    detection = (cause.groupBy("cause").agg(
        F.first("expected").alias("expected"),
        F.count(F.lit(1)).alias("runs"),
        F.sum((py == "false").cast("int")).alias("python_invalid"),
        F.sum(py.isin("true", "false").cast("int")).alias("with_verdict"),
        F.sum(F.col("spark_rechecked").cast("int")).alias("spark_rechecked"),
        F.sum(sp_inv.cast("int")).alias("spark_invalid_"),
        F.concat_ws(",", F.array_sort(F.array_remove(F.array_distinct(F.flatten(F.collect_list(
            F.split(F.col("decided_by"), ",")))), ""))).alias("decided_by"),
        F.round(F.avg("detection_s"), 2).alias("mean_detection_s"))
        .withColumn("kind", F.when(F.col("cause") == "none", F.lit("false alarm (expected valid)"))
                    .otherwise(F.lit("detection (expected invalid)")))
        .withColumn("python_rate", F.round(F.try_divide(F.col("python_invalid"), F.col("runs")), 4))
        .withColumn("spark_invalid", F.when(F.col("spark_rechecked") > 0, F.col("spark_invalid_")))
        .withColumn("spark_rate", F.round(F.try_divide(F.col("spark_invalid"), F.col("spark_rechecked")), 4))
        .withColumn("spark", F.when(F.col("spark_rechecked") == 0, F.lit("not re-checked"))
                    .otherwise(F.format_string("%d/%d re-checked runs", F.col("spark_invalid"),
                                               F.col("spark_rechecked"))))
        .select("cause", "kind", "expected", "runs", "with_verdict", "python_invalid", "python_rate",
                "spark_rechecked", "spark_invalid", "spark_rate", "spark", "decided_by", "mean_detection_s")
        .orderBy(F.col("cause") == "none", "cause"))

    # the detection matrix: per (cause, scenario), the same rows as `pulsar-chaos detection` prints
    # (core/detection.py over the same runs), with the false alarms of the scenario's runs expected valid
    matrix_rows = det_facts.matrix(runs)
    detection_matrix = spark.createDataFrame([tuple(r[c] for c in MATRIX_COLUMNS) for r in matrix_rows],
                                             MATRIX_SCHEMA)

    wl = F.broadcast(runs_df.select("run_id", "workload", "day"))
    # the completions counted by (run, f, type, state, latency in microseconds): exact percentiles,
    # each latency weighted by its count (interpolated between neighbours, as `percentile` does)
    ops = perf.lat.join(wl, "run_id").withColumn("latency_ms", F.col("latency_us") / 1000.0)
    q = F.percentile("latency_ms", F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99)), F.col("n"))
    ok = ops.where(F.col("type") == "ok")
    lat = ok.groupBy("workload", "state", "f").agg(q.alias("q"), F.max("latency_ms").alias("max_ms"))
    cnt = ops.groupBy("workload", "state", "f").agg(
        F.sum(F.when(F.col("type") == "ok", F.col("n")).otherwise(0)).cast("long").alias("ok"),
        F.sum(F.when(F.col("type") == "fail", F.col("n")).otherwise(0)).cast("long").alias("fail"),
        F.sum(F.when(F.col("type") == "info", F.col("n")).otherwise(0)).cast("long").alias("info"),
        F.countDistinct("run_id").alias("runs"))
    wl_of = {r.run_id: r.workload for r in runs}
    secs: dict[tuple[str, str], float] = {}
    for rid, by_state in perf.state_seconds.items():
        for st, s in by_state.items():
            k = (wl_of.get(rid, "?"), st)
            secs[k] = secs.get(k, 0.0) + s
    secs_df = spark.createDataFrame([(w, s, v) for (w, s), v in secs.items()] or [("", "", 0.0)],
                                    "workload string, state string, seconds double")
    perf_by_state = (cnt.join(lat, ["workload", "state", "f"], "left").join(secs_df, ["workload", "state"], "left")
                     .select("workload", "state", "f", "runs", "ok", "fail", "info",
                             F.round("seconds", 3).alias("seconds"),
                             F.round(F.try_divide(F.col("ok"), F.col("seconds")), 2).alias("ok_per_s"),
                             F.round(F.col("q")[0], 3).alias("p50_ms"), F.round(F.col("q")[1], 3).alias("p95_ms"),
                             F.round(F.col("q")[2], 3).alias("p99_ms"), F.round("max_ms", 3).alias("max_ms"))
                     .orderBy("workload", "f", "state"))

    gaps = perf.gaps.join(wl, "run_id")
    unavailability = (gaps.groupBy("workload", "state").agg(
        F.countDistinct("run_id").alias("runs"),
        F.sum((F.col("gap_s") > 1.0).cast("long")).alias("gaps_over_1s"),
        F.round(F.max("gap_s"), 3).alias("longest_gap_s"),
        F.round(F.sum(F.when(F.col("gap_s") > 1.0, F.col("gap_s"))), 3).alias("unavailable_s"))
        .orderBy("workload", "state"))

    rec = perf.recovery.join(wl, "run_id")
    rq = F.percentile_approx("recover_s", F.array(F.lit(0.5), F.lit(0.95)), 10000)
    recovery = (rec.groupBy("workload", "fault").agg(
        F.count(F.lit(1)).alias("stops"), F.sum(F.col("recover_s").isNull().cast("int")).alias("never"),
        rq.alias("q"), F.max("recover_s").alias("max_s"))
        .select("workload", "fault", "stops", "never", F.round(F.col("q")[0], 3).alias("p50_s"),
                F.round(F.col("q")[1], 3).alias("p95_s"), F.round("max_s", 3).alias("max_s"))
        .orderBy("workload", "fault"))

    has_bug = F.col("expected") == "invalid"        # a false alarm is an invalid run expected valid
    anomalies_total = sum((F.coalesce(F.col(f"`{c}`"), F.lit(0)) for c in TYPE_COLUMNS), F.lit(0))
    day_runs = runs_df.groupBy("day").agg(
        F.count(F.lit(1)).alias("runs"),
        F.sum((py == "false").cast("int")).alias("python_invalid"),
        F.sum((F.col("spark_valid") == "false").cast("int")).alias("spark_invalid"),
        F.sum(anomalies_total).alias("anomalies"),
        F.sum(has_bug.cast("int")).alias("expected_invalid"),
        F.sum((has_bug & (py == "false")).cast("int")).alias("detected"),
        F.sum((~has_bug).cast("int")).alias("expected_valid"),
        F.sum((~has_bug & (py == "false")).cast("int")).alias("false_alarms"))
    wfs = ok.where(F.col("f").isin("send", "enqueue", "add", "put", "write", "cas"))
    day_lat = wfs.groupBy("day").agg(F.percentile("latency_ms", F.array(F.lit(0.5), F.lit(0.99)), F.col("n"))
                                     .alias("q"))
    trends = (day_runs.join(day_lat, "day", "left")
              .select(F.date_format("day", "yyyy-MM-dd").alias("day"), "runs", "python_invalid", "spark_invalid",
                      "anomalies", "expected_invalid", "detected",
                      F.round(F.try_divide(F.col("detected"), F.col("expected_invalid")), 4).alias("detection_rate"),
                      "expected_valid", "false_alarms",
                      F.round(F.try_divide(F.col("false_alarms"), F.col("expected_valid")), 4).alias("false_alarm_rate"),
                      F.round(F.col("q")[0], 3).alias("write_p50_ms"), F.round(F.col("q")[1], 3).alias("write_p99_ms"))
              .orderBy("day"))
    return Campaign(runs=runs_df.drop("day"), skipped=skipped_df, anomaly_counts=counts_df, by_config=by_config,
                    detection=detection, detection_matrix=detection_matrix, perf_by_state=perf_by_state,
                    unavailability=unavailability, recovery=recovery, trends=trends)
