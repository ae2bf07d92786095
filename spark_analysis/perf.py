"""Latency, throughput, unavailability and recovery per fault state over every run, as Spark jobs.

Fault states follow core/faults.py, as checkers/perf.py does: a fault X is active from the ok or
info completion of its `start-X` to the ok or info completion of its `stop-X` (or of a `heal` /
`stop-all`, which ends every fault); faults active at once form the state "a+b", none is "healthy". The nemesis ops are few, so the
timeline of each run is built on the driver; the ops (millions) are matched to it in Spark by an
equality join on (run, time bucket) plus a range filter, never a cross join.

- latency and throughput: client ops (processes 0..final_process-1; not the final reads) by the
  state at their invocation; throughput is ok completions per second spent in that state inside
  the run's workload window (first client invocation to last client event).
- unavailability: per (run, topic) the gaps between consecutive ok writes (with the topic's first
  write invocation and last write event as the edges), attributed to the state at each gap's middle.
- time to recover: per stopped fault occurrence, from the stop's completion to the first ok write
  completed after it in that run (any topic).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from checkers.perf import DEFAULTS as PERF_DEFAULTS
from checkers.perf import WRITE_FS
from core.faults import HEALTHY, FaultTimeline
from spark_analysis.inputs import Run, run_names, with_run_names

NEG = -(1 << 62)
POS = 1 << 62
GAP_S = 1.0                 # a gap between ok writes longer than this counts as unavailable (log checker's)


@dataclass
class Timeline:
    run_id: str
    segments: list[tuple[int, int, str]]           # [from, to) ns, state
    occurrences: list[tuple[str, int, int | None]]  # fault, start ns, stop ns (None: still on)


def timelines(nemesis_ops: list[Any]) -> dict[str, Timeline]:
    """Per run, the fault-state timeline from its nemesis ops (rows: run_id, index, time_ns, type, f)."""
    by_run: dict[str, list[Any]] = {}
    for r in nemesis_ops:
        by_run.setdefault(r["run_id"], []).append(r)
    out: dict[str, Timeline] = {}
    for run_id, ops in by_run.items():
        ops.sort(key=lambda r: (r["time_ns"], r["index"]))
        tl = FaultTimeline(NEG)
        for r in ops:
            tl.feed(r["time_ns"], r["type"], r["f"])
        seg_t, seg_s = tl.seg_t, tl.seg_s
        segs = [(seg_t[i], seg_t[i + 1] if i + 1 < len(seg_t) else POS, seg_s[i]) for i in range(len(seg_t))]
        out[run_id] = Timeline(run_id, segs, [(o.name, o.started_ns, o.stop_ns) for o in tl.occurrences()])
    return out


def _bucket_ns(span_ns: int) -> int:
    """Bucket width for the state join: 1 s, wider for very long runs (at most ~100,000 buckets)."""
    return max(1_000_000_000, span_ns // 100_000 + 1)


def write_fs(run: Run) -> list[str]:
    try:
        import workloads
        from spark_analysis.inputs import _spec_object
        wanted = workloads.get(run.workload).checkers(_spec_object(run.spec))
        fs = (wanted.get("perf") or (None, {}))[1].get("write_fs")
    except Exception:
        fs = None
    return list(fs or WRITE_FS)


LATENCY_UNIT_NS = 1000      # latencies are kept to the microsecond (the tables print milliseconds to 3 places)


@dataclass
class PerfTables:
    # client completions by latency: run_id, f, type, state, latency_us, n (how many completions of
    # that run, f, type and state took that many microseconds): a few hundred thousand rows for ten
    # million ops, from which the campaign's counts and exact percentiles are computed (the per-op
    # table, written and read back, was the biggest table the job stored)
    lat: DataFrame
    state_seconds: dict[str, dict[str, float]]   # run -> state -> seconds inside the workload window
    gaps: DataFrame             # run_id, topic, gap_s, state
    recovery: DataFrame         # run_id, fault, stop_ns, recover_s (null: no ok write after)
    windows: dict[str, tuple[int, int]]


def compute(spark: SparkSession, history: DataFrame, ops: DataFrame, runs: list[Run]) -> PerfTables:
    """The perf tables of these runs from checks.prepare's op table (`ops`: every op, the nemesis'
    too); `history` is not read again."""
    final = int(PERF_DEFAULTS["final_process"])
    # the nemesis ops from the persisted op table (checks.prepare keeps them): no second pass over the history
    nem = (ops.where(F.col("process") == -1).select("run_id", "index", "time_ns", "type", "f").collect())
    tl = timelines(nem)
    client = ops.where((F.col("process") >= 0) & (F.col("process") < final))
    win_rows = client.groupBy("run_id").agg(
        F.min(F.when(F.col("type") == "invoke", F.col("time_ns"))).alias("w0"), F.max("time_ns").alias("w1")).collect()
    windows = {r["run_id"]: (r["w0"], r["w1"]) for r in win_rows if r["w0"] is not None}
    seg_rows, state_seconds = [], {}
    for run in runs:
        if run.num not in windows:
            continue
        w0, w1 = windows[run.num]
        b = _bucket_ns(w1 - w0)
        segs = tl[run.num].segments if run.num in tl else [(NEG, POS, HEALTHY)]
        secs: dict[str, float] = {}
        for s, e, name in segs:
            lo, hi = max(s, w0), min(e, w1 + 1)
            if hi <= lo:
                continue
            secs[name] = secs.get(name, 0.0) + (hi - lo) / 1e9
            for k in range(lo // b, (hi - 1) // b + 1):
                seg_rows.append((run.num, k, b, s, e, name))
        state_seconds[run.run_id] = secs
    segs_df = F.broadcast(spark.createDataFrame(
        seg_rows, "run_id int, bucket long, bucket_ns long, s long, e long, state string"))
    widths = F.broadcast(segs_df.select("run_id", "bucket_ns").distinct())

    def with_state(df: DataFrame, tcol: str) -> DataFrame:
        """df with the fault state at time column tcol (the segment holding it)."""
        d = df.join(widths, "run_id").withColumn("bucket", F.floor(F.col(tcol) / F.col("bucket_ns")).cast("long"))
        j = d.join(segs_df.drop("bucket_ns"), ["run_id", "bucket"], "left") \
             .where(F.col("s").isNull() | ((F.col(tcol) >= F.col("s")) & (F.col(tcol) < F.col("e"))))
        return j.drop("bucket", "bucket_ns", "s", "e").fillna({"state": HEALTHY})

    done = (client.where(F.col("matched"))
            .select("run_id", "f", "type", "time_ns", "inv_time"))
    perf_ops = with_state(done, "inv_time")
    lat = (perf_ops.groupBy("run_id", "f", "type", "state",
                            F.round((F.col("time_ns") - F.col("inv_time")) / LATENCY_UNIT_NS).cast("long")
                            .alias("latency_us"))
           .agg(F.count(F.lit(1)).alias("n")))

    # ok writes: the ones whose completions make a topic available
    wf = [(r.num, f) for r in runs for f in write_fs(r)]
    wf_df = F.broadcast(spark.createDataFrame(wf, "run_id int, f string"))
    writes = client.join(wf_df, ["run_id", "f"])
    ok_w = writes.where(F.col("type") == "ok").select("run_id", F.col("key").alias("topic"), F.col("time_ns").alias("t"))
    edges = writes.groupBy("run_id", F.col("key").alias("topic")).agg(
        F.min(F.when(F.col("type") == "invoke", F.col("time_ns"))).alias("a"), F.max("time_ns").alias("z"))
    pts = ok_w.unionByName(edges.select("run_id", "topic", F.col("a").alias("t")).where(F.col("t").isNotNull())) \
              .unionByName(edges.select("run_id", "topic", F.col("z").alias("t")))
    w = Window.partitionBy("run_id", "topic").orderBy("t")
    gaps = (pts.withColumn("prev", F.lag("t").over(w)).where(F.col("prev").isNotNull())
            .select("run_id", "topic", ((F.col("t") - F.col("prev")) / 1e9).alias("gap_s"),
                    ((F.col("t") + F.col("prev")) / 2).cast("long").alias("mid")))
    longest = Window.partitionBy("run_id", "topic")
    gaps = (gaps.withColumn("longest", F.max("gap_s").over(longest))
            .where((F.col("gap_s") > GAP_S) | (F.col("gap_s") == F.col("longest"))).drop("longest"))
    gaps = with_state(gaps, "mid").drop("mid")

    occ_rows = [(rid, i, name, stop) for rid, t in tl.items() for i, (name, _, stop) in enumerate(t.occurrences)
                if stop is not None and rid in windows]
    occ = spark.createDataFrame(occ_rows, "run_id int, occ long, fault string, stop_ns long")
    occ = occ.join(widths, "run_id").withColumn("bucket", F.floor(F.col("stop_ns") / F.col("bucket_ns")).cast("long"))
    okb = ok_w.join(widths, "run_id").withColumn("bucket", F.floor(F.col("t") / F.col("bucket_ns")).cast("long"))
    bmin = okb.groupBy("run_id", "bucket").agg(F.min("t").alias("t"))
    same = (F.broadcast(occ).join(okb.select("run_id", "bucket", "t"), ["run_id", "bucket"])
            .where(F.col("t") >= F.col("stop_ns")).groupBy("run_id", "occ").agg(F.min("t").alias("t1")))
    later = (F.broadcast(occ.select("run_id", "occ", F.col("bucket").alias("ob")))
             .join(bmin, "run_id").where(F.col("bucket") > F.col("ob"))
             .groupBy("run_id", "occ").agg(F.min("t").alias("t2")))
    recovery = (occ.join(same, ["run_id", "occ"], "left").join(later, ["run_id", "occ"], "left")
                .select("run_id", "fault", "stop_ns",
                        ((F.coalesce("t1", "t2") - F.col("stop_ns")) / 1e9).alias("recover_s")))
    names = run_names(spark, runs)
    return PerfTables(lat=with_run_names(lat, names), state_seconds=state_seconds,
                      gaps=with_run_names(gaps, names), recovery=with_run_names(recovery, names),
                      windows={r.run_id: windows[r.num] for r in runs if r.num in windows})
