"""`pulsar-chaos analyze`: every run under the results dirs, checked and tabulated in one Spark session.

    pulsar-chaos analyze [RESULTS_DIR...] [--out DIR] [--master URL]
    spark-submit spark_analysis/main.py [RESULTS_DIR...] [--out DIR]      (or python -m spark_analysis.main)

Writes Parquet tables and campaign.html under <out>/analysis/<YYYYmmddTHHMMSS>/ and prints a summary.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

if __package__ in (None, ""):            # spark-submit spark_analysis/main.py: the repo on sys.path,
    _here = str(Path(__file__).resolve().parent)      # not this folder (its modules are the package's)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _here]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.store import EXIT_CRASH, EXIT_USAGE, EXIT_VALID  # noqa: E402
from spark_analysis import session as spark_session  # noqa: E402
from spark_analysis.inputs import InputError, Run, Skipped, has_scheme  # noqa: E402

# the project's one exit-code scheme: 254 bad input, 255 Spark itself failed (out of memory, a lost
# cluster: one line, no traceback)
EXIT_OK, EXIT_USER_ERROR, EXIT_SPARK_FAILED = EXIT_VALID, EXIT_USAGE, EXIT_CRASH
MAX_SUMMARY_ROWS = 15          # configurations printed as they are; more are rolled up
TABLES = ("runs", "skipped", "anomalies", "anomaly_counts", "by_config", "detection", "detection_matrix",
          "perf_by_state", "unavailability", "recovery", "trends")


@dataclass
class Result:
    out_dir: str
    runs: list[Run]
    skipped: list[Skipped]
    tables: dict[str, Any] = field(default_factory=dict)     # name -> pandas DataFrame (small tables)
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)     # phase -> seconds (manifest.json)
    driver_memory: str | None = None
    sessions_started: int = 0
    html: str = ""
    runs_read: int | None = None        # runs whose histories this call read (None: no reuse, all of them)
    runs_reused: int = 0                # runs whose stored per-run tables were reused (reuse.py)
    history_files_read: int = 0         # history.parquet files in the job's read


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results_dirs", nargs="*", metavar="RESULTS_DIR", default=None,
                   help="results directories (or run folders) to analyse; any Hadoop-readable URI works "
                        "(hdfs://, s3a://, file://); default: results")
    p.add_argument("--out", default="results", metavar="DIR",
                   help="write <DIR>/analysis/<timestamp>/ (Parquet tables, campaign.html); default: results")
    p.add_argument("--master", default=None, metavar="URL",
                   help="Spark master: local[*] (default; under spark-submit, its --master), local[N], "
                        "spark://host:7077, yarn, k8s://https://host:443")
    p.add_argument("--driver-memory", default=None, metavar="SIZE",
                   help="driver JVM heap, all of Spark's memory in local mode (default: 2g, 4g from 128 MiB "
                        "of input Parquet, 8g from 1 GiB)")
    p.add_argument("--shuffle-partitions", type=int, default=None, metavar="N",
                   help="Spark shuffle partitions (default: sized from the input)")
    p.add_argument("--spark-ui", action="store_true", help="keep Spark's web UI on (off by default)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="any other spark.* setting (repeatable)")
    p.add_argument("--redo", action="store_true",
                   help="analyse every run again (default: the per-run tables of earlier analyses under "
                        "<out>/analysis/by-run/ are reused for the runs whose files have not changed)")


def settings_from_args(args: argparse.Namespace) -> spark_session.Settings:
    extra = {}
    for kv in args.conf or []:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            raise InputError(f"--conf {kv!r}: not KEY=VALUE (fix: e.g. --conf spark.executor.memory=8g)")
        extra[k.strip()] = v
    if args.shuffle_partitions is not None and args.shuffle_partitions < 1:
        raise InputError("--shuffle-partitions must be at least 1 (fix: leave it out to size it from the input)")
    return spark_session.Settings(master=args.master, driver_memory=args.driver_memory, ui=args.spark_ui,
                                  shuffle_partitions=args.shuffle_partitions, extra=extra)


# ------------------------------------------------------------------------------------ output paths

class Out:
    """The output folder, local or through Hadoop's FileSystem (for an hdfs:// --out)."""

    def __init__(self, base: str, spark: Any = None):
        self.base = base.rstrip("/")
        self.local = not has_scheme(base)
        self.spark = spark

    def path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def write_text(self, name: str, text: str) -> None:
        if self.local:
            p = Path(self.path(name))
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(f".{p.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, p)
            return
        jvm = self.spark.sparkContext._jvm
        jp = jvm.org.apache.hadoop.fs.Path(self.path(name))
        fs = jp.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration())
        stream = fs.create(jp, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()


def new_out_dir(out: str) -> str:
    """<out>/analysis/<YYYYmmddTHHMMSS>[-N] (made, for a local out)."""
    from core.store import RUN_FOLDER_FORMAT
    stamp = time.strftime(RUN_FOLDER_FORMAT)
    base = f"{out.rstrip('/')}/analysis"
    if has_scheme(out):
        return f"{base}/{stamp}"
    try:
        Path(base).mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            d = Path(base) / (stamp if n == 1 else f"{stamp}-{n}")
            try:
                d.mkdir()
                return str(d)
            except FileExistsError:
                continue
    except OSError as e:
        raise InputError(f"--out {out}: cannot create {base} ({e.strerror}) (fix: give a writable --out)") from None
    raise InputError(f"--out {out}: no free folder under {base} (fix: wait a second)")


# ------------------------------------------------------------------------------------ the job

def analyze(roots: list[str] | None = None, out: str = "results", settings: spark_session.Settings | None = None,
            spark: Any = None, echo: TextIO | None = sys.stdout, redo: bool = False, reuse: bool = True) -> Result:
    """Analyse every run under `roots` in one Spark session (started here unless `spark` is given).

    With a local `out` and local run folders, the per-run tables of earlier analyses are reused
    (reuse.py) unless `redo` (analyse all again, replacing them) or not `reuse` (no store at all).

    Raises InputError / spark_session.SparkUnavailable with one line naming the problem and the fix."""
    from spark_analysis import inputs
    t0 = time.monotonic()
    roots = list(roots or ["results"])
    settings = settings or spark_session.Settings()
    inputs.check_local_roots(roots)
    out_skip = set()
    if not has_scheme(out):
        out_skip.add(str((Path(out) / "analysis").resolve()))
    by_root: list[tuple[str, list[str]]] = []
    for r in roots:
        if not has_scheme(r):
            by_root.append((r, inputs.discover_local(r, out_skip)))
    local_found = sum(len(p) for _, p in by_root)
    if local_found == 0 and not any(has_scheme(r) for r in roots):
        raise InputError(f"no run folders under {', '.join(roots)} (a run folder holds test.toml or "
                         f"history.parquet) (fix: give the results directory of `pulsar-chaos run`)")
    local_paths = [p for _, ps in by_root for p in ps]
    pre_ids = inputs.run_ids(by_root)
    runs, skipped = inputs.vet(local_paths, pre_ids)
    started_here = spark is None
    before = spark_session.SESSIONS_STARTED
    if not runs and not any(has_scheme(r) for r in roots):
        # every run folder was skipped: nothing for Spark to do, so it is not started
        out_dir = new_out_dir(out)
        res = Result(out_dir=out_dir, runs=[], skipped=skipped)
        _run(None, [], skipped, out_dir)
        res.html = f"{out_dir}/campaign.html"
        res.tables = {"skipped": _pandas_skipped(skipped)}
        res.seconds = round(time.monotonic() - t0, 1)
        _write_manifest(res, settings, spark_version=_spark_version())
        if echo is not None:
            print_summary(res, echo)
        return res
    store_ = None
    if reuse and not has_scheme(out) and not any(has_scheme(r) for r in roots):
        from spark_analysis import reuse as reuse_mod
        store_ = reuse_mod.RunStore(out)
    # every run's bytes, reused or not: the campaign tables are built from all of their per-run tables
    input_bytes = sum(r.history_bytes for r in runs)
    if spark is None:
        spark = spark_session.start(settings, input_bytes)
    try:
        if any(has_scheme(r) for r in roots):
            remote = [(r, inputs.discover_remote(spark, r)) for r in roots if has_scheme(r)]
            ids = inputs.run_ids(by_root + remote)
            for r in runs:
                r.run_id = ids[r.path]
            rpaths = [p for _, ps in remote for p in ps]
            if not rpaths and not local_paths:
                raise InputError(f"no run folders under {', '.join(roots)} (fix: give the results directory "
                                 f"of `pulsar-chaos run`)")
            rruns, rskipped = inputs.vet(rpaths, ids, spark)
            runs += rruns
            skipped += rskipped
            # remote files are not vetted one by one: Spark skips unreadable ones
            spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true")
        if settings.shuffle_partitions is None:
            spark_session.set_shuffle_partitions(spark, sum(r.history_bytes for r in runs) or 0)
        out_dir = new_out_dir(out)
        started_s = round(time.monotonic() - t0, 1)
        res = _run(spark, runs, skipped, out_dir, store_, redo)
        res.phases = {"discover_and_start": started_s, **res.phases}
        res.driver_memory = spark.sparkContext.getConf().get("spark.driver.memory", None)
    finally:
        if started_here:
            spark.stop()
    res.sessions_started = spark_session.SESSIONS_STARTED - before
    res.seconds = round(time.monotonic() - t0, 1)
    _write_manifest(res, settings, spark_version=_spark_version())
    if echo is not None:
        print_summary(res, echo)
    return res


def _spark_version() -> str:
    try:
        import pyspark
        return pyspark.__version__
    except ImportError:  # pragma: no cover
        return "?"


def _run(spark: Any, runs: list[Run], skipped: list[Skipped], out_dir: str, store_: Any = None,
         redo: bool = False) -> Result:
    from spark_analysis import campaign_page
    res = Result(out_dir=out_dir, runs=runs, skipped=skipped)
    t0 = [time.monotonic()]

    def lap(name: str, following: str | None = None) -> None:
        now = time.monotonic()
        res.phases[name] = round(now - t0[0], 1)
        t0[0] = now
        if following and spark is not None:
            # names the next phase's Spark jobs (the UI, the event log: bench/README's per-phase table)
            spark.sparkContext.setJobDescription(f"analyze: {following}")
    out = Out(out_dir, spark)
    res.html = out.path("campaign.html")
    if not runs:
        res.tables = {"skipped": _pandas_skipped(skipped)}
        _write_small(spark, out, "skipped", res.tables["skipped"], None)
        out.write_text("campaign.html", campaign_page.page(res, Path(out_dir) if out.local else None))
        return res
    from spark_analysis import campaign, checks, inputs, perf
    cached: list[Any] = []
    spark.sparkContext.setJobDescription("analyze: checks")
    if store_ is not None:
        # only the runs not analysed before are read; their per-run tables are stored, then the
        # tables of every run of this call are read back from the store
        todo, reused = store_.split(runs, redo)
        res.runs_read, res.runs_reused = len(todo), len(reused)
        if todo:
            history, deliveries = inputs.load_tables(spark, todo)
            res.history_files_read = len(history.inputFiles())
            t = checks.prepare(spark, history, deliveries, todo)
            fresh = checks.anomalies(t)
            spark.sparkContext.setJobDescription("analyze: fault_timelines")
            p = perf.compute(spark, history, t.ops, todo)
            spark.sparkContext.setJobDescription("analyze: checks_and_timelines_stored")
            # the writes compute the anomalies and the fault-state tables of the new runs
            store_.write(spark, todo, fresh, t.stats, p)
            cached += [t.ops, t.msgs, *t.cached]
            lap("checks_and_timelines_stored", "anomalies_of_every_run")
        back = store_.read(spark, runs)
        back.anomalies.write.mode("overwrite").parquet(out.path("anomalies.parquet"))
        anomalies = spark.read.parquet(out.path("anomalies.parquet"))
        stats, p = back.stats, back.perf
        lap("anomalies_of_every_run", "campaign_tables")
    else:
        history, deliveries = inputs.load_tables(spark, runs)
        res.history_files_read = len(history.inputFiles())
        t = checks.prepare(spark, history, deliveries, runs)
        anomalies = checks.anomalies(t)
        anomalies.write.mode("overwrite").parquet(out.path("anomalies.parquet"))
        anomalies = spark.read.parquet(out.path("anomalies.parquet"))
        lap("checks", "fault_timelines")
        p = perf.compute(spark, history, t.ops, runs)
        cached += [t.ops, t.msgs, *t.cached]
        stats = t.stats
        lap("fault_timelines", "campaign_tables")
    p.lat = p.lat.persist()
    p.gaps = p.gaps.persist()
    cached += [p.lat, p.gaps]
    c = campaign.build(spark, runs, skipped, anomalies, stats, p)
    # the campaign tables are small: collected once (Arrow), then written from the driver
    small = {name: df.toPandas() for name, df in c.tables().items()}
    for name, pdf in small.items():
        _write_small(spark, out, name, pdf, c.tables()[name].schema)
    lap("campaign_tables", "page")
    # the anomaly evidence shown on the page: the first few per (run, checker, type)
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    w = Window.partitionBy("run_id", "checker", "type").orderBy("topic", "value", "message_ids")
    small["anomaly_examples"] = (anomalies.withColumn("n", F.row_number().over(w)).where(F.col("n") <= 5)
                                 .drop("n").toPandas())
    res.tables = small
    for df in cached:
        df.unpersist()
    out.write_text("campaign.html", campaign_page.page(res, Path(out_dir) if out.local else None))
    lap("page")
    spark.sparkContext.setJobDescription(None)
    return res


def _write_small(spark: Any, out: Out, name: str, pdf: Any, schema: Any) -> None:
    """One small table as <name>.parquet: a single file written by pyarrow for a local out, Spark's
    writer (a folder of part files) for a remote one."""
    if out.local:
        import pyarrow as pa
        import pyarrow.parquet as pq
        try:
            from pyspark.sql.pandas.types import to_arrow_schema
            table = pa.Table.from_pandas(pdf, schema=to_arrow_schema(schema), preserve_index=False, safe=False)
        except Exception:                    # no Spark schema (nothing was analysed), or an odd column
            table = pa.Table.from_pandas(pdf, preserve_index=False)
        pq.write_table(table, out.path(f"{name}.parquet"))
        return
    spark.createDataFrame(pdf, schema).coalesce(1).write.mode("overwrite").parquet(out.path(f"{name}.parquet"))


def _pandas_skipped(skipped: list[Skipped]):
    import pandas as pd
    return pd.DataFrame({"path": [s.path for s in skipped], "reason": [s.reason for s in skipped]})


def _write_manifest(res: Result, settings: spark_session.Settings, spark_version: str) -> None:
    data = {"out_dir": res.out_dir, "runs": len(res.runs), "skipped": [vars(s) for s in res.skipped],
            "seconds": res.seconds, "phases_s": res.phases, "spark_version": spark_version, "master": spark_session.effective_master(settings) or "spark-submit",
            "driver_memory": res.driver_memory,
            "spark_sessions_started": res.sessions_started,
            "runs_read": len(res.runs) if res.runs_read is None else res.runs_read, "runs_reused": res.runs_reused,
            "history_files_read": res.history_files_read, "tables": [f"{t}.parquet" for t in TABLES
                                                                       if t in res.tables or t == "anomalies"],
            "html": "campaign.html"}
    try:
        Out(res.out_dir).write_text("manifest.json", json.dumps(data, indent=2) + "\n") \
            if not has_scheme(res.out_dir) else None
    except OSError:
        pass


# ------------------------------------------------------------------------------------ summary

def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    try:
        import math
        if isinstance(v, float) and math.isnan(v):
            return "-"
    except Exception:
        pass
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def table_text(rows: list[dict[str, Any]], cols: list[str]) -> str:
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(x[i]) for x in cells]) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.ljust(w) for x, w in zip(xs, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(x) for x in cells])


def _records(df: Any) -> list[dict[str, Any]]:
    if df is None:
        return []
    return [{k: (None if _is_na(v) else v) for k, v in r.items()} for r in df.to_dict("records")]


def _is_na(v: Any) -> bool:
    try:
        import pandas as pd
        r = pd.isna(v)
        return bool(r) if not hasattr(r, "__len__") else False
    except Exception:
        return v is None


def print_summary(res: Result, out: TextIO) -> None:
    from spark_analysis.campaign import TYPE_COLUMNS
    n, k = len(res.runs), len(res.skipped)
    reused = f", {res.runs_reused} of them reused from earlier analyses" if res.runs_reused else ""
    print(f"analysed {n} run{'s' if n != 1 else ''}" + (f" ({k} skipped)" if k else "")
          + f" in {res.seconds} s with Spark {_spark_version()}{reused}", file=out)
    cfg = _records(res.tables.get("by_config"))
    if cfg:
        keys = ["workload", "nemesis", "quorum", "bugs"]
        if len(cfg) > MAX_SUMMARY_ROWS:          # a big campaign: rolled up by workload and bug knobs
            keys = ["workload", "bugs"]
            roll: dict[tuple, dict[str, Any]] = {}
            for r in cfg:
                k = tuple(r[c] for c in keys)
                acc = roll.setdefault(k, dict(zip(keys, k)))
                for c in ["runs", "valid", "invalid", "unknown", "spark_invalid"] + TYPE_COLUMNS:
                    acc[c] = (acc.get(c) or 0) + (r.get(c) or 0)
            cfg = [roll[k] for k in sorted(roll)]
        used = [c for c in TYPE_COLUMNS if any((r.get(c) or 0) > 0 for r in cfg)]
        cols = keys + ["runs", "valid", "invalid", "unknown", "spark_invalid"] + used
        print(table_text(cfg[:MAX_SUMMARY_ROWS * 2], cols), file=out)
        if len(cfg) > MAX_SUMMARY_ROWS * 2:
            print(f"... {len(cfg) - MAX_SUMMARY_ROWS * 2} more rows in by_config.parquet and campaign.html", file=out)
    det = _records(res.tables.get("detection"))
    if det:
        parts = []
        for r in det:
            label = "false alarms (runs expected valid)" if r["cause"] == "none" else f"detected {r['cause']}"
            spark = ("not re-checked by Spark" if not r.get("spark_rechecked") else
                     f"{int(r['spark_invalid'])}/{int(r['spark_rechecked'])} by the Spark checks")
            parts.append(f"{label}: {r['python_invalid']}/{r['runs']} by the checkers, {spark}")
        print("; ".join(parts), file=out)
    runs = _records(res.tables.get("runs"))
    agree = [r for r in runs if r.get("agrees") in ("yes", "NO")]
    if runs:
        bad = [r["run_id"] for r in agree if r["agrees"] == "NO"]
        print(f"Spark checks agree with results.json on {len(agree) - len(bad)}/{len(agree)} runs they could "
              f"compare ({len(runs) - len(agree)} of {len(runs)} not comparable: no log or queue checker)"
              + (f"; differ on: {', '.join(bad)}" if bad else ""), file=out)
        unmet = [r["run_id"] for r in runs if r.get("expectation_met") == "NO"]
        judged = [r for r in runs if r.get("expectation_met") in ("yes", "NO")]
        print(f"expectations met by {len(judged) - len(unmet)}/{len(judged)} runs with a verdict"
              + (f"; not met: {', '.join(unmet)}" if unmet else ""), file=out)
    for s in res.skipped:
        print(f"skipped {s.path}: {s.reason}", file=out)
    print(f"tables: {res.out_dir}/*.parquet", file=out)
    print(f"page: {res.html}", file=out)


# ------------------------------------------------------------------------------------ entry points

def run_args(args: argparse.Namespace, echo: TextIO = sys.stdout) -> int:
    """The CLI's handler: 0 on success (skipped runs included), 254 with one line on bad input, 255
    when Spark failed."""
    try:
        settings = settings_from_args(args)
        analyze(args.results_dirs or ["results"], args.out, settings, echo=echo, redo=args.redo)
    except (InputError, spark_session.SparkUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as e:
        if not type(e).__module__.startswith(("pyspark", "py4j")):
            raise                          # a bug of ours: the CLI prints its traceback
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        print(f"error: the Spark job failed: {first} (fix: give it more memory with --driver-memory, "
              f"or run it on a cluster with --master)", file=sys.stderr)
        return EXIT_SPARK_FAILED
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:           # a bad flag is a usage error: 254, one line
        print(f"error: {message} (fix: see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="spark_analysis.main", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
