"""Incremental analysis: the per-run tables of earlier analyses, kept under <out>/analysis/by-run/ and
reused, so that a nightly campaign's analysis reads only the runs it has not analysed yet.

Each table is a Parquet dataset partitioned by `run_key`, a fingerprint of the run (its id and folder,
its test.toml, the size and modification time of its history and deliveries files, and TABLES_VERSION):
a run whose files changed gets a new key and is analysed again; `--redo` analyses every run again and
replaces its partitions. `index.json` lists the keys whose tables were all written (it is written
last), so a run is reused only when the analysis that made its tables finished. The campaign tables
(by configuration, by fault state, trends...) are then built from these per-run tables of every run
the call covers, the new and the reused alike, exactly as from a full analysis.

Only local run folders and a local --out are reused this way; remote inputs or output are analysed in
full each time.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import store

# bump when the checks or the per-run tables change: every stored run is analysed again
TABLES_VERSION = 2          # 2: perf_lat (completions counted by latency) replaces the per-op perf_ops
DIR = "by-run"
INDEX = "index.json"
KEY = "run_key"


def _schemas():
    from pyspark.sql import types as T

    from spark_analysis.checks import ANOMALY_SCHEMA
    key = [T.StructField(KEY, T.StringType())]
    return {
        "anomalies": T.StructType(ANOMALY_SCHEMA.fields + key),
        "stats": T.StructType([T.StructField("run_id", T.StringType()), T.StructField("ops", T.LongType()),
                               T.StructField("non_int_values", T.LongType())] + key),
        "perf_lat": T.StructType([T.StructField("run_id", T.StringType()), T.StructField("f", T.StringType()),
                                  T.StructField("type", T.StringType()), T.StructField("state", T.StringType()),
                                  T.StructField("latency_us", T.LongType()), T.StructField("n", T.LongType())]
                                 + key),
        "gaps": T.StructType([T.StructField("run_id", T.StringType()), T.StructField("topic", T.StringType()),
                              T.StructField("gap_s", T.DoubleType()), T.StructField("state", T.StringType())] + key),
        "recovery": T.StructType([T.StructField("run_id", T.StringType()), T.StructField("fault", T.StringType()),
                                  T.StructField("stop_ns", T.LongType()), T.StructField("recover_s", T.DoubleType())]
                                 + key),
        "state_seconds": T.StructType([T.StructField("run_id", T.StringType()), T.StructField("state", T.StringType()),
                                       T.StructField("seconds", T.DoubleType())] + key),
    }


def run_key(run: Any) -> str:
    """The run's fingerprint (see the module docstring); "r" + hex, so never read back as a number."""
    h = hashlib.sha256(f"v{TABLES_VERSION}\0{run.run_id}\0{Path(run.path).resolve()}".encode())
    d = Path(run.path)
    try:
        h.update((d / store.TEST_TOML).read_bytes())
    except OSError:
        pass
    for name in (store.HISTORY_PARQUET, store.DELIVERIES_PARQUET):
        try:
            st = (d / name).stat()
            h.update(f"\0{name}:{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            h.update(f"\0{name}:-".encode())
    return "r" + h.hexdigest()[:24]


@dataclass
class Reused:
    """The per-run tables of the runs of one call, read back from the store."""
    anomalies: Any
    stats: Any
    perf: Any          # perf.PerfTables (lat, gaps, recovery, state_seconds)


class RunStore:
    def __init__(self, out: str):
        self.root = Path(out) / "analysis" / DIR
        self.index_path = self.root / INDEX

    def index(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.index_path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def split(self, runs: list[Any], redo: bool = False) -> tuple[list[Any], list[Any]]:
        """(runs to analyse, runs whose stored tables are reused); sets each run's key."""
        known = {} if redo else self.index()
        todo, reuse = [], []
        for r in runs:
            r.key = run_key(r)
            (reuse if r.key in known else todo).append(r)
        return todo, reuse

    def write(self, spark: Any, runs: list[Any], anomalies: Any, stats: Any, p: Any) -> None:
        """The per-run tables of freshly analysed runs, each run's partition replaced, then the index."""
        from pyspark.sql import functions as F
        keys = F.broadcast(spark.createDataFrame([(r.run_id, r.key) for r in runs], f"rid string, {KEY} string"))
        schemas = _schemas()
        secs = [(rid, st, s) for rid, by in p.state_seconds.items() for st, s in by.items()]
        frames = {
            "anomalies": anomalies, "stats": stats,
            "perf_lat": p.lat,
            "gaps": p.gaps.select("run_id", "topic", "gap_s", "state"),
            "recovery": p.recovery.select("run_id", "fault", "stop_ns", "recover_s"),
            "state_seconds": spark.createDataFrame(secs, "run_id string, state string, seconds double"),
        }
        self.root.mkdir(parents=True, exist_ok=True)
        for name, df in frames.items():
            cols = [F.col(f.name).cast(f.dataType) for f in schemas[name].fields if f.name != KEY]
            (df.join(keys, df["run_id"] == keys["rid"]).select(*cols, KEY)
             .write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy(KEY)
             .parquet(str(self.root / name)))
        index = self.index()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for r in runs:
            index[r.key] = {"run_id": r.run_id, "path": r.path, "analysed_at": now}
        tmp = self.index_path.with_name(f".{INDEX}.{os.getpid()}")
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.index_path)

    def read(self, spark: Any, runs: list[Any]) -> Reused:
        """The stored tables of these runs (partition-pruned to their keys), as the job's tables."""
        from pyspark.sql import functions as F

        from spark_analysis.perf import PerfTables
        schemas = _schemas()
        keys = [r.key for r in runs]

        def table(name: str):
            path = self.root / name
            schema = schemas[name]
            if not path.is_dir() or not any(path.glob(f"{KEY}=*")):
                df = spark.createDataFrame([], schema)
            else:
                df = spark.read.schema(schema).parquet(str(path))
            return df.where(F.col(KEY).isin(keys)).drop(KEY)
        got: dict[str, dict[str, float]] = {}
        for row in table("state_seconds").collect():
            got.setdefault(row["run_id"], {})[row["state"]] = row["seconds"]
        # in the runs' order, as a full analysis sums them
        secs = {r.run_id: got[r.run_id] for r in runs if r.run_id in got}
        p = PerfTables(lat=table("perf_lat"), state_seconds=secs, gaps=table("gaps"), recovery=table("recovery"),
                       windows={})
        return Reused(anomalies=table("anomalies"), stats=table("stats"), perf=p)
