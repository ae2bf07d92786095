"""The per-run checks as Spark jobs over every run at once: lost, duplicate, divergence,
nonmonotonic-send and unexpected (checkers/log.py), and lost, unexpected, duplicated, duplicate
(checkers/queue.py) for the workloads whose checkers those are, with the same definitions.

Every job groups by run_id (and topic, value or position), so a campaign of many runs and one long
run are the same plan. The definitions, as in the Python checkers (their docstrings are the spec):

- Which ops count comes from each run's own checker options (its workload's `checkers(spec)`): the
  f names of sends / receives / final reads (log), enqueues / dequeues / drains / reads (queue).
- An op's invoke is the previous op of its process when that is an invoke of the same f (else the
  completion is an orphan). A send's topic and value are its invoke's (log and queue alike); a
  receive's or read's topic is the op's key, else its invoke's (log), the op's key (queue).
- A position is (ledger_id, entry_id, batch_index) with batch_index -1 read as 0; the partition is
  ignored. Values are the integers the workloads send (a JSON int, or a string or float holding
  one); other values are left out (counted in the run's `non_int_values`: the Parquet deliveries
  table holds integer values only).
- log `lost`: an acknowledged send (its value's kept attempt completed ok: the first attempt that
  completed ok before the value was sent again, else the last attempt) missing from at least one ok
  final read of its topic; only topics with an ok final read.
- log `divergence`: two values at one position of a topic, from ok sends (their acknowledged id),
  receives (ok, or info carrying messages) and ok final reads.
- log `duplicate`: one value at two positions of a topic among receives and final reads.
- log `nonmonotonic-send`: an ok send whose position lies before the previous ok send's of the
  same (process, topic, partition), in history order.
- log `unexpected`: a value received or read on a topic that no send to that topic attempted.
- queue `lost`: an acknowledged enqueue (any attempt completed ok) of a queue whose drain or final
  read completed, never dequeued, drained or read. `unexpected`: a dequeued value no enqueue of that
  queue attempted. `duplicated`: a value dequeued more often than max(1, its enqueue attempts).
  `duplicate`: one value at two positions (its first ok enqueue's id and the dequeued ones).
  Messages carry no subscription in this harness, so each queue has the one subscription "".
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from core import store
from spark_analysis.inputs import Run, run_names, with_run_names

LOG_TYPES = ("lost", "duplicate", "divergence", "nonmonotonic-send", "unexpected")
QUEUE_TYPES = ("lost", "unexpected", "duplicated", "duplicate")
CHECKED = {"log": LOG_TYPES, "queue": QUEUE_TYPES}

NEMESIS = -1
DELIVERY_FS = ("receive", "read")      # the f names whose ok messages core.store.deliveries() explodes

POS = T.StructType([T.StructField("ledger_id", T.LongType()), T.StructField("entry_id", T.LongType()),
                    T.StructField("batch_index", T.LongType())])
ANOMALY_SCHEMA = T.StructType([
    T.StructField("run_id", T.StringType()), T.StructField("checker", T.StringType()),
    T.StructField("type", T.StringType()), T.StructField("topic", T.StringType()),
    T.StructField("value", T.LongType()), T.StructField("values", T.ArrayType(T.LongType())),
    T.StructField("message_ids", T.ArrayType(POS)), T.StructField("process", T.LongType()),
    T.StructField("partition", T.LongType()), T.StructField("deliveries", T.LongType()),
    T.StructField("attempts", T.LongType())])


# ------------------------------------------------------------------------------------ roles

def roles_rows(runs: list[Run]) -> list[tuple[str, str, str | None, str | None]]:
    """(run_id, f, log role, queue role) for every f a run's checkers name (see module docstring)."""
    rows = []
    for r in runs:
        opts = r.checker_opts()
        roles: dict[str, list[str | None]] = {}
        if "log" in opts:
            o = opts["log"]
            send = set(o.get("send") or ())
            recv = set(o.get("receive") or ()) - send
            read = set(o.get("read") or ()) - send - recv
            for role, fs in (("send", send), ("recv", recv), ("read", read)):
                for f in fs:
                    roles.setdefault(f, [None, None])[0] = role
        if "queue" in opts:
            o = opts["queue"]
            enq = set(o.get("enqueue") or ())
            drain = set(o.get("drain") or ()) - enq
            deq = (set(o.get("dequeue") or ()) | drain) - enq
            read = set(o.get("read") or ()) - enq - deq
            for role, fs in (("enq", enq), ("deq", deq - drain), ("drain", drain), ("read", read)):
                for f in fs:
                    roles.setdefault(f, [None, None])[1] = role
        rows += [(r.num, f, lr, qr) for f, (lr, qr) in sorted(roles.items())]
    return rows


def roles_table(spark: SparkSession, runs: list[Run]) -> DataFrame:
    return spark.createDataFrame(roles_rows(runs), "run_id int, f string, log_role string, queue_role string")


# ------------------------------------------------------------------------------------ columns

def norm_value(col: Any) -> Any:
    """checkers.toolkit.norm_value for the integer values: a JSON int, a JSON string of an int (whitespace
    and sign allowed, as Python's int()), an integral float; anything else is null."""
    s = F.trim(col)
    quoted = F.regexp_extract(s, r'^"\s*([-+]?[0-9]+)\s*"$', 1)
    floaty = F.regexp_extract(s, r"^(-?[0-9]+)\.0*$", 1)
    return (F.when(s.rlike(r"^-?[0-9]+$"), s.try_cast("bigint"))
            .when(quoted != "", quoted.try_cast("bigint"))
            .when(floaty != "", floaty.try_cast("bigint")))


def position(mid: Any) -> Any:
    """A message id's position: (ledger, entry, batch index with -1 as 0), partition left out."""
    return F.when(mid.isNotNull() & mid["ledger_id"].isNotNull() & mid["entry_id"].isNotNull(),
                  F.struct(mid["ledger_id"].alias("ledger_id"), mid["entry_id"].alias("entry_id"),
                           F.greatest(F.coalesce(mid["batch_index"], F.lit(-1)), F.lit(0)).alias("batch_index")))


# ------------------------------------------------------------------------------------ op table

@dataclass
class Tables:
    ops: DataFrame          # every op (the nemesis' too, process -1) with roles, their invoke
                            # (completions) or completion (invokes): the one pass over the history
    msgs: DataFrame         # one row per delivered message (ok receives/reads, info receives' messages)
    stats: DataFrame        # per run: ops, non-integer values
    topics: DataFrame       # (t_run: run number, tk: topic hash, topic_name)
    names: DataFrame        # run number -> run id
    checkers: frozenset = frozenset(CHECKED)   # the checkers (log, queue) some run's workload runs
    cached: list = field(default_factory=list)   # what the checks persisted (unpersist with ops and msgs)


def topic_key(col: Any) -> Any:
    """A topic as a 64-bit hash: the checks group, join and sort on (run, topic, value) millions of
    times, and a long is far cheaper there than a 50-byte topic URI (names are mapped back on output)."""
    return F.xxhash64(col)


def _empty() -> Any:
    """The key of an op without one (a Column: built once a session exists)."""
    return F.xxhash64(F.lit(""))


def prepare(spark: SparkSession, history: DataFrame, deliveries: DataFrame, runs: list[Run]) -> Tables:
    roles = F.broadcast(roles_table(spark, runs).withColumn("run_id", F.col("run_id").cast("int")))
    # the history is read once: the persisted op table below holds every op, the nemesis' too (they
    # have no role, so no check counts them; perf.compute takes its fault timelines from them), and
    # the JSON value of the few ops whose messages only it holds
    h = history.withColumn("key", topic_key(F.col("key"))).join(roles, ["run_id", "f"], "left")
    sendish = (F.col("log_role") == "send") | (F.col("queue_role") == "enq")
    h = (h.withColumn("sv", F.when(sendish, norm_value(F.col("value"))))
          .withColumn("sv_bad", (F.coalesce(sendish, F.lit(False)) & F.col("value").isNotNull()
                                 & (F.col("value") != "null") & F.col("sv").isNull()).cast("int"))
          .withColumn("pk", position(F.col("message_id")))
          .withColumn("partition", F.coalesce(F.col("message_id.partition"), F.lit(-1))))
    # messages that only the history's JSON value holds: deliveries.parquet has the ok receives and
    # reads (f "receive"/"read"); dequeues and drains (other f names), and receives that ended info
    # carrying what they got (a drain cut short), are read from the op's value here
    recvish = (F.col("log_role") == "recv") | F.col("queue_role").isin("deq", "drain")
    msgish = recvish | (F.col("log_role") == "read") | (F.col("queue_role") == "read")
    from_json = (msgish & F.col("value").startswith("[")
                 & (((F.col("type") == "ok") & ~F.col("f").isin(*DELIVERY_FS))
                    | ((F.col("type") == "info") & recvish)))
    h = h.withColumn("mj", F.when(from_json, F.col("value")))
    base = ["run_id", "index", "time_ns", "process", "type", "f", "key",
            F.when(F.col("queue_role") == "drain", F.col("error")).alias("error"),   # only drains need it
            "log_role", "queue_role", "sv", "sv_bad", "pk", "partition", "mj"]
    parts = []
    paired = [r.num for r in runs if r.paired]
    if paired:
        # histories that record each completion's invoke (core.store's invoke_* columns): a projection
        rec = h if len(paired) == len(runs) else h.where(F.col("run_id").isin(paired))
        matched = F.col("invoke_index").isNotNull()
        parts.append(rec.select(
            *base, matched.alias("matched"),
            F.when(matched, topic_key(F.col("invoke_key"))).alias("inv_key"),
            F.when(matched & sendish, norm_value(F.col("invoke_value"))).alias("inv_sv"),
            F.when(matched, F.col("invoke_time_ns")).alias("inv_time"),
            F.col("invoke_index").alias("inv_index")))
    if len(paired) < len(runs):
        # histories written before that: each op's previous op of its process, by a window over the
        # history partitioned by (run, process) in index order (a shuffle and sort of every op)
        old = h if not paired else h.where(~F.col("run_id").isin(paired))
        w = Window.partitionBy("run_id", "process").orderBy("index")
        prev = F.lag(F.struct("type", "f", "key", "sv", "time_ns", "index")).over(w)
        matched = F.coalesce((F.col("type") != "invoke") & (F.col("prev.type") == "invoke")
                             & (F.col("prev.f") == F.col("f")), F.lit(False))
        parts.append(old.select(*base, prev.alias("prev"))
                     .withColumn("matched", matched)
                     .withColumn("inv_key", F.when(F.col("matched"), F.col("prev.key")))
                     .withColumn("inv_sv", F.when(F.col("matched"), F.col("prev.sv")))
                     .withColumn("inv_time", F.when(F.col("matched"), F.col("prev.time_ns")))
                     .withColumn("inv_index", F.when(F.col("matched"), F.col("prev.index")))
                     .drop("prev"))
    ops = parts[0]
    for more in parts[1:]:
        ops = ops.unionByName(more)
    ops = ops.persist()
    info_msgs = (ops.where(F.col("mj").isNotNull())
                 .select("run_id", "index", "f", "key", "log_role", "queue_role", "type",
                         F.posexplode(F.from_json("mj", T.ArrayType(T.StructType([
                             T.StructField("value", T.LongType()),
                             T.StructField("message_id", T.StructType([
                                 T.StructField(n, T.LongType())
                                 for n in ("ledger_id", "entry_id", "partition", "batch_index")]))])))
                         ).alias("position", "m"))
                 .select("run_id", "index", "f", "key", "log_role", "queue_role", "position",
                         F.col("m.value").alias("value"), position(F.col("m.message_id")).alias("pk"), "type"))
    # the deliveries table, with roles and the topic a log checker gives it (op key, else invoke's)
    d = (deliveries.where(F.col("f").isin(*DELIVERY_FS)).withColumn("key", topic_key(F.col("key")))
         .join(roles, ["run_id", "f"])
         .select("run_id", "index", "f", "key", "log_role", "queue_role", "position", "value",
                 position(F.col("message_id")).alias("pk"), F.lit("ok").alias("type")))
    msgs = d.unionByName(info_msgs)
    # only the messages of an op without a key take their topic from its invoke: only those are joined
    # with the op table (joining all of them shuffled and sorted every delivery for a few nemesis ops)
    no_key = ops.where((F.col("key") == _empty()) & (F.col("type") != "invoke")).select("run_id", "index", "inv_key")
    keyed = msgs.where(F.col("key") != _empty()).withColumn("log_topic", F.col("key"))
    unkeyed = (msgs.where(F.col("key") == _empty()).join(no_key, ["run_id", "index"], "left")
               .withColumn("log_topic", F.coalesce(F.col("inv_key"), _empty())).drop("inv_key"))
    msgs = (keyed.unionByName(unkeyed)
            .where(F.col("value").isNotNull())
            .persist())
    stats = ops.groupBy("run_id").agg(F.count(F.lit(1)).alias("ops"),
                                      F.coalesce(F.sum("sv_bad"), F.lit(0)).cast("long").alias("non_int_values"))
    names = run_names(spark, runs)
    stats = with_run_names(stats, names)
    topics = (history.select("run_id", "key").distinct()
              .select(F.col("run_id").alias("t_run"), topic_key(F.col("key")).alias("tk"),
                      F.col("key").alias("topic_name")))
    used = frozenset(c for r in runs for c in r.checker_opts() if c in CHECKED)
    return Tables(ops=ops, msgs=msgs, stats=stats, topics=topics, names=names, checkers=used)


INTERNAL_SCHEMA = T.StructType([T.StructField("run_id", T.IntegerType()) if f.name == "run_id" else
                                T.StructField("topic", T.LongType()) if f.name == "topic" else f
                                for f in ANOMALY_SCHEMA.fields])


def _rows(df: DataFrame, checker: str, kind: str, **cols: Any) -> DataFrame:
    """df as anomaly rows (run number and topic hash until anomalies() maps them), the columns not
    given null."""
    out = []
    for f in INTERNAL_SCHEMA.fields:
        if f.name == "checker":
            out.append(F.lit(checker).alias("checker"))
        elif f.name == "type":
            out.append(F.lit(kind).alias("type"))
        elif f.name in cols:
            out.append(cols[f.name].cast(f.dataType).alias(f.name))
        elif f.name == "run_id":
            out.append(F.col("run_id"))
        else:
            out.append(F.lit(None).cast(f.dataType).alias(f.name))
    return df.select(*out)


# ------------------------------------------------------------------------------------ log checks

def log_anomalies(t: Tables) -> DataFrame:
    ops, msgs = t.ops, t.msgs
    # send attempts: each send invoke opens one, and its completion (matched) closes it; a completion
    # without an invoke is an attempt of its own. One row per send op: the attempt it belongs to
    # (att: its invoke's index), whether it opens one (att_n), and the completion's index and type
    sends = ops.where((F.col("log_role") == "send") & F.col("type").isNotNull())
    inv = F.col("type") == "invoke"
    attempts = (sends.select(
        "run_id", F.when(F.col("matched"), F.col("inv_key")).otherwise(F.col("key")).alias("topic"),
        F.when(F.col("matched"), F.col("inv_sv")).otherwise(F.col("sv")).alias("v"),
        F.when(F.col("matched"), F.col("inv_index")).otherwise(F.col("index")).alias("att"),
        F.when(~inv, F.col("index")).alias("comp_index"), F.when(~inv, F.col("type")).alias("comp_type"),
        (inv | ~F.col("matched")).cast("int").alias("att_n"))
        .where(F.col("v").isNotNull()))
    seen = (msgs.where(F.col("log_role").isin("recv", "read"))
            .select("run_id", F.col("log_topic").alias("topic"), F.col("value").alias("v"), "pk", "index",
                    "log_role"))
    # one aggregate per (run, topic, value) over the send attempts and the messages seen, for the
    # checks that group by value (lost, duplicate, unexpected): one shuffle of both instead of one per
    # check. Per value: attempts and whether one completed ok; the lowest and highest position it was
    # seen at; the rows, lowest and highest op index of the final reads that hold it
    keys = ["run_id", "topic", "v"]
    nul = F.lit(None)
    # (whether a value was seen at two positions is whether some field of its positions has a lowest
    # and a highest value that differ: aggregated field by field, as longs, the aggregate is a hash
    # aggregate; the minimum and maximum of the position struct made it sort 8 million rows twice)
    fields = [n.name for n in POS.fields]
    per_value = (attempts.select(*keys, "att_n", (F.col("comp_type") == "ok").alias("ok"),
                                 *[nul.cast("long").alias(n) for n in fields], nul.cast("long").alias("ri"))
                 .unionByName(seen.select(*keys, F.lit(0).alias("att_n"), nul.cast("boolean").alias("ok"),
                                          *[F.col("pk")[n].alias(n) for n in fields],
                                          F.when(F.col("log_role") == "read", F.col("index")).alias("ri")))
                 .groupBy(*keys)
                 .agg(F.sum("att_n").alias("n"), F.max("ok").alias("any_ok"),
                      *[a for n in fields for a in (F.min(n).alias(f"lo_{n}"), F.max(n).alias(f"hi_{n}"))],
                      F.count("ri").alias("r_rows"), F.min("ri").alias("r_lo"), F.max("ri").alias("r_hi"))
                 .withColumn("placed_twice", functools.reduce(
                     lambda a, b: a | b, [F.col(f"lo_{n}") != F.col(f"hi_{n}") for n in fields]))
                 .drop(*[f"{e}_{n}" for n in fields for e in ("lo", "hi")])
                 .persist())          # five checks read it: computed once
    t.cached.append(per_value)
    # the kept attempt is acknowledged iff some attempt completed ok before the value's next attempt;
    # a value sent once (nearly all) is acknowledged iff that send completed ok: only values sent more
    # than once (few) need their attempts ordered
    again = F.broadcast(per_value.where(F.col("n") > 1).select(*keys))
    retried = (attempts.join(again, keys)
               .groupBy(*keys, "att").agg(F.max("comp_index").alias("comp_index"),   # an invoke and its completion
                                          F.max("comp_type").alias("comp_type"))
               .groupBy(*keys)
               .agg(F.array_sort(F.collect_list(F.struct("att", "comp_index", "comp_type"))).alias("a"))
               .withColumn("r_acked", F.expr(
                   "exists(sequence(0, size(a) - 1), i -> a[i].comp_type = 'ok' AND "
                   "(i = size(a) - 1 OR a[i].comp_index < a[i + 1].att))"))
               .select(*keys, "r_acked"))
    records = (per_value.where(F.col("n") >= 1).join(F.broadcast(retried), keys, "left")
               .withColumn("acked", F.when(F.col("n") == 1, F.coalesce(F.col("any_ok"), F.lit(False)))
                           .otherwise(F.coalesce(F.col("r_acked"), F.lit(False)))))
    ok_sends = (ops.where((F.col("log_role") == "send") & (F.col("type") == "ok"))
                .select("run_id", "process", "index", "pk", "partition",
                        F.when(F.col("matched"), F.col("inv_key")).otherwise(F.col("key")).alias("topic"),
                        F.when(F.col("matched"), F.col("inv_sv")).otherwise(F.col("sv")).alias("v"))
                .where(F.col("pk").isNotNull()))

    # divergence: two values at one position
    at = (ok_sends.where(F.col("v").isNotNull()).select("run_id", "topic", "pk", "v")
          .unionByName(seen.where(F.col("pk").isNotNull()).select("run_id", "topic", "pk", "v")))
    # (min != max finds the few positions or values concerned with a cheap aggregate; only those
    # are grouped again to list what was seen)
    multi = (at.groupBy("run_id", "topic", "pk").agg(F.min("v").alias("lo"), F.max("v").alias("hi"))
             .where(F.col("lo") != F.col("hi")).select("run_id", "topic", "pk"))
    divergence = (at.join(F.broadcast(multi), ["run_id", "topic", "pk"]).groupBy("run_id", "topic", "pk")
                  .agg(F.array_sort(F.collect_set("v")).alias("vs")))
    divergence = _rows(divergence, "log", "divergence", topic=F.col("topic"), values=F.col("vs"),
                       message_ids=F.array(F.col("pk")))

    # duplicate: one value at two positions among receives and reads (the few such values found by
    # the per-value aggregate; only their messages are grouped again to list the positions)
    placed = seen.where(F.col("pk").isNotNull()).select("run_id", "topic", "v", "pk")
    twice = per_value.where(F.col("placed_twice")).select(*keys)
    duplicate = (placed.join(F.broadcast(twice), keys).groupBy(*keys)
                 .agg(F.array_sort(F.collect_set("pk")).alias("pks")))
    duplicate = _rows(duplicate, "log", "duplicate", topic=F.col("topic"), value=F.col("v"),
                      message_ids=F.col("pks"))

    # unexpected: received or read, never sent to that topic
    unexpected = per_value.where(F.col("n") == 0).select(*keys)
    unexpected = _rows(unexpected, "log", "unexpected", topic=F.col("topic"), value=F.col("v"))

    # lost: acknowledged, missing from some ok final read of a topic whose final read completed. The
    # reads holding a value are counted exactly (distinct op indexes) only where the aggregate's rows
    # and lowest/highest index leave it open: at least two different reads of a topic with three or more
    reads = (ops.where((F.col("log_role") == "read") & (F.col("type") == "ok"))
             .select("run_id", F.when(F.col("key") != _empty(), F.col("key"))
                     .otherwise(F.coalesce(F.col("inv_key"), _empty())).alias("topic"), "index")
             .groupBy("run_id", "topic").agg(F.countDistinct("index").alias("n_reads")))
    acked = records.where("acked").join(F.broadcast(reads), ["run_id", "topic"])
    open_ = (F.coalesce(F.col("r_lo") != F.col("r_hi"), F.lit(False)) & (F.col("r_rows") >= F.col("n_reads"))
             & (F.col("n_reads") > 2))
    sure = acked.where(~open_ & ((F.col("r_rows") < F.col("n_reads"))
                                 | ((F.col("r_lo") == F.col("r_hi")) & (F.col("n_reads") > 1))))
    unsure = acked.where(open_).select(*keys, "n_reads")
    hits = (seen.where(F.col("log_role") == "read").select(*keys, "index").join(F.broadcast(unsure), keys)
            .groupBy(*keys, "n_reads").agg(F.countDistinct("index").alias("n_hit"))
            .where(F.col("n_hit") < F.col("n_reads")))
    lost = sure.select(*keys).unionByName(hits.select(*keys))
    lost = _rows(lost, "log", "lost", topic=F.col("topic"), value=F.col("v"))

    # nonmonotonic-send: an ok send before the previous one of its (process, topic, partition)
    w = Window.partitionBy("run_id", "process", "topic", "partition").orderBy("index")
    ns = (ok_sends.withColumn("prev_pk", F.lag("pk").over(w)).withColumn("prev_v", F.lag("v").over(w))
          .where(F.col("prev_pk").isNotNull() & (F.col("pk") < F.col("prev_pk"))))
    nonmono = _rows(ns, "log", "nonmonotonic-send", topic=F.col("topic"), value=F.col("v"),
                    values=F.array("prev_v", "v"), message_ids=F.array("prev_pk", "pk"),
                    process=F.col("process"), partition=F.col("partition"))
    return lost.unionByName(duplicate).unionByName(divergence).unionByName(nonmono).unionByName(unexpected)


# ------------------------------------------------------------------------------------ queue checks

def queue_anomalies(t: Tables) -> DataFrame:
    ops, msgs = t.ops, t.msgs
    enq = ops.where(F.col("queue_role") == "enq")
    inv = enq.where(F.col("type") == "invoke").select("run_id", F.col("key").alias("q"), F.col("sv").alias("v"),
                                                      F.lit(1).alias("is_inv"), F.lit(None).cast("string").alias("ctype"),
                                                      F.lit(None).cast("long").alias("ok_index"),
                                                      F.lit(None).cast(POS).alias("pk"))
    comp = enq.where(F.col("type") != "invoke").select(
        "run_id", F.when(F.col("matched"), F.col("inv_key")).otherwise(F.col("key")).alias("q"),
        F.when(F.col("matched"), F.col("inv_sv")).otherwise(F.col("sv")).alias("v"),
        F.lit(0).alias("is_inv"), F.col("type").alias("ctype"),
        F.when(F.col("type") == "ok", F.col("index")).alias("ok_index"), "pk")
    records = (inv.unionByName(comp).where(F.col("v").isNotNull()).groupBy("run_id", "q", "v")
               .agg(F.greatest(F.sum("is_inv"), F.lit(1)).alias("attempts"),
                    F.max(F.col("ctype") == "ok").alias("acked"),
                    F.min_by("pk", "ok_index").alias("ack_pk")))
    deq = msgs.where(F.col("queue_role").isin("deq", "drain")).select(
        "run_id", F.col("key").alias("q"), F.col("value").alias("v"), "pk")
    delivered = deq.groupBy("run_id", "q", "v").agg(F.count(F.lit(1)).alias("n"))
    done = (ops.where(((F.col("queue_role") == "drain") & (F.col("type") != "invoke")
                       & ((F.col("type") == "ok") | ((F.col("type") == "fail")
                                                     & F.lower(F.coalesce(F.col("error"), F.lit(""))).startswith("empty"))))
                      | ((F.col("queue_role") == "read") & (F.col("type") == "ok")))
            .select("run_id", F.col("key").alias("q")).distinct())
    read_seen = (msgs.where(F.col("queue_role") == "read")
                 .select("run_id", F.col("key").alias("q"), F.col("value").alias("v")).distinct())
    lost = (records.where("acked").join(done, ["run_id", "q"])
            .join(delivered, ["run_id", "q", "v"], "left_anti").join(read_seen, ["run_id", "q", "v"], "left_anti"))
    lost = _rows(lost, "queue", "lost", topic=F.col("q"), value=F.col("v"))
    unexpected = delivered.join(records, ["run_id", "q", "v"], "left_anti")
    unexpected = _rows(unexpected, "queue", "unexpected", topic=F.col("q"), value=F.col("v"),
                       deliveries=F.col("n"))
    duplicated = (delivered.join(records, ["run_id", "q", "v"])
                  .where(F.col("n") > F.greatest(F.lit(1), F.col("attempts"))))
    duplicated = _rows(duplicated, "queue", "duplicated", topic=F.col("q"), value=F.col("v"),
                       deliveries=F.col("n"), attempts=F.col("attempts"))
    at = (records.where(F.col("ack_pk").isNotNull()).select("run_id", "q", "v", F.col("ack_pk").alias("pk"))
          .unionByName(deq.where(F.col("pk").isNotNull())))
    duplicate = (at.groupBy("run_id", "q", "v").agg(F.array_sort(F.collect_set("pk")).alias("pks"))
                 .where(F.size("pks") >= 2))
    duplicate = _rows(duplicate, "queue", "duplicate", topic=F.col("q"), value=F.col("v"),
                      message_ids=F.col("pks"))
    return lost.unionByName(unexpected).unionByName(duplicated).unionByName(duplicate)


def anomalies(t: Tables) -> DataFrame:
    """One row per anomaly of every run (ANOMALY_SCHEMA: run ids and topic names). A checker no run's
    workload runs is not computed (its jobs would only scan the op table for nothing)."""
    parts = [fn(t) for name, fn in (("log", log_anomalies), ("queue", queue_anomalies)) if name in t.checkers]
    a = parts[0] if parts else t.ops.sparkSession.createDataFrame([], INTERNAL_SCHEMA)
    for more in parts[1:]:
        a = a.unionByName(more)
    a = a.join(t.topics, (F.col("run_id") == F.col("t_run")) & (F.col("topic") == F.col("tk")), "left")
    a = a.select(*[F.col("topic_name").alias("topic") if f.name == "topic" else F.col(f.name)
                   for f in ANOMALY_SCHEMA.fields])
    return with_run_names(a, t.names)


# ------------------------------------------------------------------------------------ verdicts

def invalid_types(run: Run) -> dict[str, set[str]]:
    """{checker: the Spark-checked anomaly types that make this run invalid}, as its checker opts say."""
    from checkers import log as log_checker
    from checkers import queue as queue_checker
    out: dict[str, set[str]] = {}
    for name, o in run.checker_opts().items():
        if name == "log":
            inv = set(o["invalid"]) if o.get("invalid") is not None else set(log_checker.INVALID_BY_DEFAULT)
        else:
            inv = queue_checker.invalid_types(o)
        out[name] = inv & set(CHECKED[name])
    return out


def python_counts(run: Run) -> dict[str, dict[str, int]]:
    """{checker: {type: count}} from results.json, for the Spark-checked types (exact counts)."""
    res = (run.results or {}).get("checkers") or {}
    out: dict[str, dict[str, int]] = {}
    for name, types in CHECKED.items():
        c = res.get(name)
        if not isinstance(c, dict):
            continue
        counts = store.anomaly_counts(c)
        out[name] = {k: int(counts.get(k, 0)) for k in types}
    return out
