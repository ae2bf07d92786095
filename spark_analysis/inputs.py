"""Finding and vetting the run folders of a campaign, and reading their histories as Spark tables.

A run folder is a directory holding test.toml or history.parquet (results/<test>/<YYYYmmddTHHMMSS>/).
Local directories are walked with the OS; any other Hadoop-readable URI (hdfs://, s3a://, file://...)
through Hadoop's FileSystem in the Spark JVM. Each run is vetted before Spark reads it (Parquet
footers, TOML, JSON), so a bad file skips its run, with the reason, instead of failing the union read.
"""
from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from core import store

HISTORY_COLUMNS = ("index", "time_ns", "process", "type", "f", "key", "value", "message_id", "node", "error")
DELIVERY_COLUMNS = ("index", "time_ns", "process", "f", "key", "position", "value", "message_id",
                    "redelivery_count")
INVOKE_COLUMNS = ("invoke_index", "invoke_time_ns", "invoke_key", "invoke_value")   # core.store's
STAMP = re.compile(r"^(\d{8}T\d{6})(?:-\d+)?$")
MAX_DEPTH = 8                       # how deep under a results dir run folders are looked for
# checker f-name options the Spark checks read (checkers/log.py and checkers/queue.py DEFAULTS)
LOG_F_OPTS = ("send", "receive", "read")
QUEUE_F_OPTS = ("enqueue", "dequeue", "drain", "read")


class InputError(ValueError):
    """Bad input the user can fix (a missing results dir); one line naming it and the fix."""


@dataclass
class Run:
    """One run folder that will be analysed, with what its test.toml and results.json say."""
    run_id: str
    path: str                         # local path, or a URI for remote inputs
    local: bool
    spec: dict[str, Any]
    results: dict[str, Any] | None
    history_bytes: int = 0
    history_rows: int | None = None
    notes: list[str] = field(default_factory=list)
    num: int = -1                     # the run's number in Spark's tables (an int key is cheaper to
                                      # shuffle and sort than the run id; mapped back on output)
    key: str = ""                     # its fingerprint in the store of per-run tables (reuse.run_key)
    paired: bool = False              # its history.parquet records each completion's invoke (INVOKE_COLUMNS:
                                      # written so since they were added); else the analysis pairs them

    # -------------------------------------------------------------------- derived, for the tables
    def _get(self, name: str, default: Any = None) -> Any:
        v = self.spec.get(name, self.spec.get(name.replace("_", "-"), default))
        return default if v is None else v

    @property
    def workload(self) -> str:
        return str(self._get("workload", "log"))

    @property
    def test_name(self) -> str:
        return str(self._get("test_name", self.run_id.split("/")[0]))

    @property
    def nemesis(self) -> str:
        n = self._get("nemesis", [])
        if isinstance(n, str):
            n = [x for x in n.split(",") if x.strip()]
        sched = self._get("nemesis_schedule", [])
        if sched and not n:
            n = sorted({str(s.get("name", "?")) for s in sched if isinstance(s, dict)})
        return ",".join(sorted(str(x) for x in n)) or "none"

    @property
    def quorum(self) -> str:
        return f"{self._get('ensemble', 3)}/{self._get('write_quorum', 2)}/{self._get('ack_quorum', 2)}"

    @property
    def backend(self) -> str:
        return str(self._get("backend", "netns"))

    @property
    def bug_knobs(self) -> list[str]:
        """The knobs set to an unsafe value ("key=value"), sorted; [] for a correct configuration."""
        from clusters import bugs
        out = []
        for k, v in sorted((self._get("bugs", {}) or {}).items()):
            knob = bugs.REGISTRY.get(k)
            if knob is None or v != knob.default:
                out.append(f"{k}={json.dumps(v) if not isinstance(v, str) else v}")
        return out

    @property
    def expectation(self):
        """The run's `core.expectation.Expectation`: as its test.toml records it (`expected`), its causes
        from the bug knobs and the workload's unsafe options (derived for runs made before expectations)."""
        import workloads
        from core.expectation import expectation
        found = workloads.unsafe_causes(self.workload, self._get("options", {}) or {}, self._get("bugs", {}) or {},
                                        self.spec)
        declared = self._get("expected", "")
        declared = declared if declared in ("valid", "invalid") else ""
        return expectation(found, declared, str(self._get("expected_reason", "")))

    @property
    def expected(self) -> str:
        return self.expectation.expected

    @property
    def causes(self) -> list[str]:
        """The detection rows this run counts in: its causes' labels if it is expected invalid ("declared"
        when only its spec says so), else ["none"]."""
        e = self.expectation
        if e.expected != "invalid":
            return ["none"]
        return e.labels or ["declared"]

    @property
    def bugs_label(self) -> str:
        return ",".join(self.bug_knobs) or "none"

    @property
    def options_label(self) -> str:
        o = self._get("options", {}) or {}
        return ",".join(f"{k}={v}" for k, v in sorted(o.items())) or ""

    @property
    def started_at(self) -> datetime | None:
        """The run's start: its folder name (YYYYmmddTHHMMSS, local time), else results.json's."""
        m = STAMP.match(self.run_id.rsplit("/", 1)[-1])
        if m:
            try:
                return datetime.strptime(m.group(1), store.RUN_FOLDER_FORMAT).astimezone().astimezone(timezone.utc)
            except ValueError:
                pass
        s = ((self.results or {}).get("run") or {}).get("started_at")
        if isinstance(s, str):
            try:
                return datetime.fromisoformat(s).astimezone(timezone.utc)
            except ValueError:
                return None
        return None

    @property
    def python_valid(self) -> str:
        """results.json's verdict as text: "true", "false", "unknown", or "missing" (no results.json)."""
        if self.results is None:
            return "missing"
        v = self.results.get("valid")
        return "true" if v is True else "false" if v is False else str(v)

    def checker_opts(self) -> dict[str, dict[str, Any]]:
        """{"log": opts, "queue": opts} for the checkers this run's workload runs (those of the two),
        with each checker's defaults filled in: the f names say which ops are sends, reads..."""
        from checkers import log as log_checker
        from checkers import queue as queue_checker
        try:
            import workloads
            mod = workloads.get(self.workload)
            wanted = mod.checkers(_spec_object(self.spec))
        except Exception:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for name, defaults in (("log", log_checker.DEFAULTS), ("queue", queue_checker.DEFAULTS)):
            if name in wanted:
                o = dict(defaults)
                o.update(wanted[name][1] or {})
                out[name] = o
        return out

    def report_path(self) -> str | None:
        if self.local:
            p = Path(self.path) / store.REPORT_HTML
            return str(p) if p.exists() else None
        return self.path.rstrip("/") + "/" + store.REPORT_HTML


@dataclass
class Skipped:
    path: str
    reason: str


def _spec_object(raw: dict[str, Any]):
    """A TestSpec from a test.toml table, leniently: fields this version does not know are dropped."""
    from core.spec import FIELD_TYPES, TestSpec
    d = {k.replace("-", "_"): v for k, v in raw.items()}
    return TestSpec(**{k: v for k, v in d.items() if k in FIELD_TYPES})


def has_scheme(path: str) -> bool:
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:/", path))       # hdfs://, s3a://, file:/ (Hadoop's)


# ------------------------------------------------------------------------------------ discovery

def check_local_roots(roots: list[str]) -> None:
    """Every local results dir exists and is a directory, or InputError naming it."""
    for r in roots:
        if has_scheme(r):
            continue
        p = Path(r)
        if not p.exists():
            raise InputError(f"{r}: no such results directory (fix: give the directory your runs were "
                             f"written to, e.g. results, or the --results-dir of `pulsar-chaos run`)")
        if not p.is_dir():
            raise InputError(f"{r}: not a directory (fix: give a results directory or a run folder)")
        if not os.access(p, os.R_OK | os.X_OK):
            raise InputError(f"{r}: not readable (fix: check its permissions)")


def _is_run_dir(names: set[str]) -> bool:
    return store.TEST_TOML in names or store.HISTORY_PARQUET in names


def discover_local(root: str, skip: set[str]) -> list[str]:
    """Run folders under a local directory (the directory itself if it is one), sorted; symlinks
    (results/latest) and the analysis output are not followed."""
    root_p = Path(root)
    out: list[str] = []
    base_depth = len(root_p.resolve().parts)
    for dirpath, dirnames, filenames in os.walk(root_p, followlinks=False):
        rp = Path(dirpath).resolve()
        if str(rp) in skip:
            dirnames[:] = []
            continue
        if _is_run_dir(set(filenames)):
            out.append(dirpath)
            dirnames[:] = []          # a run folder's subfolders (nodes/, journals/) hold no runs
            continue
        if len(rp.parts) - base_depth >= MAX_DEPTH:
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.endswith(".parquet") and not d.startswith("."))
    return sorted(out)


def discover_remote(spark: Any, root: str) -> list[str]:
    """Run folders under a Hadoop-readable URI, through Hadoop's FileSystem in the Spark JVM, as
    "<qualified root>/<relative path>" strings (remote_rel() splits them again)."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    jpath = jvm.org.apache.hadoop.fs.Path(root)
    try:
        fs = jpath.getFileSystem(conf)
        if not fs.exists(jpath):
            raise InputError(f"{root}: no such results directory (fix: check the URI)")
        if not fs.getFileStatus(jpath).isDirectory():
            raise InputError(f"{root}: not a directory (fix: give a results directory or a run folder)")
    except InputError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{root}: cannot list it ({msg[:200]}) (fix: check the URI and that Spark has "
                         f"the Hadoop connector and credentials for it)") from None
    out: list[str] = []
    top = fs.makeQualified(jpath).toString().rstrip("/")

    def walk(p: Any, depth: int) -> None:
        statuses = fs.listStatus(p)
        names = {s.getPath().getName() for s in statuses}
        if _is_run_dir(names):
            q = p.toString()
            REMOTE_REL[q] = q[len(top):].strip("/") if q.startswith(top) else ""
            out.append(q)
            return
        if depth >= MAX_DEPTH:
            return
        for s in sorted(statuses, key=lambda s: s.getPath().getName()):
            name = s.getPath().getName()
            if s.isDirectory() and not name.endswith(".parquet") and not name.startswith(".") \
                    and not s.isSymlink() and name not in ("analysis", store.LATEST):
                walk(s.getPath(), depth + 1)
    walk(fs.makeQualified(jpath), 0)
    return out


REMOTE_REL: dict[str, str] = {}      # a remote run folder -> its path under the results dir given


def run_ids(paths_by_root: list[tuple[str, list[str]]]) -> dict[str, str]:
    """path -> run id: the folder relative to its results dir (test-name/stamp); unique over roots."""
    ids: dict[str, str] = {}
    used: set[str] = set()
    for root, paths in paths_by_root:
        for p in paths:
            rel = os.path.relpath(p, root) if not has_scheme(p) else REMOTE_REL.get(p, "")
            if rel in (".", ""):
                rel = "/".join(p.rstrip("/").split("/")[-2:])
            rid, n = rel, 2
            while rid in used:
                rid, n = f"{rel}#{n}", n + 1
            used.add(rid)
            ids[p] = rid
    return ids


# ------------------------------------------------------------------------------------ vetting

def _parquet_problem(path: Path, columns: tuple[str, ...]) -> tuple[str | None, int, int | None, set[str]]:
    """(why this Parquet file cannot be read, or None; its size; its row count; its column names)."""
    import pyarrow.parquet as pq
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"no {path.name}", 0, None, set()
    except OSError as e:
        return f"{path.name}: cannot stat ({e.strerror})", 0, None, set()
    try:
        pf = pq.ParquetFile(path)          # reads the footer only: a truncated file fails here
        names = set(pf.schema_arrow.names)
        rows = pf.metadata.num_rows
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"{path.name}: corrupt or truncated Parquet ({first[:160]})", size, None, set()
    missing = [c for c in columns if c not in names]
    if missing:
        return f"{path.name}: not a pulsar-chaos table (no column {', '.join(missing)})", size, None, names
    return None, size, rows, names


def _read_local_text(path: Path) -> tuple[str | None, str | None]:
    try:
        return path.read_text(encoding="utf-8"), None
    except FileNotFoundError:
        return None, "missing"
    except (OSError, UnicodeDecodeError) as e:
        return None, f"unreadable ({getattr(e, 'strerror', None) or e})"


def _read_remote_texts(spark: Any, paths: list[str]) -> dict[str, str]:
    """{path: text} of the small files that exist, in one Spark job (missing ones are absent)."""
    if not paths:
        return {}
    from pyspark.sql import functions as F
    df = (spark.read.option("ignoreMissingFiles", "true").text(paths, wholetext=True)
          .select(F.col("_metadata.file_path").alias("p"), "value"))
    got = {_path_key(r["p"]): r["value"] for r in df.collect()}
    return {p: got[_path_key(p)] for p in paths if _path_key(p) in got}


def _remote_sizes(spark: Any, paths: list[str]) -> dict[str, int | None]:
    """{path: its length in bytes, None if it does not exist}, through Hadoop's FileSystem."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    out: dict[str, int | None] = {}
    for p in paths:
        jp = jvm.org.apache.hadoop.fs.Path(p)
        try:
            out[p] = int(jp.getFileSystem(conf).getFileStatus(jp).getLen())
        except Exception:
            out[p] = None
    return out


CAMPAIGN_JSON = "campaign.json"      # harness.campaign_run's record: <campaign>/runs/<entry>/<time>/ per entry


def superseded_attempts(paths: list[str]) -> dict[str, str]:
    """{path: reason} of the local run folders a campaign did not keep: an attempt it interrupted (a
    stopped campaign, a timeout) and reran on --resume, or one of an entry not finished yet. Counting them
    beside the entry's kept run would count one entry twice. A campaign's kept run is the `run_dir` its
    campaign.json records for the entry, matched by entry and time folder names (a moved or downloaded
    campaign folder keeps them)."""
    kept_of: dict[Path, dict[str, str] | None] = {}
    out: dict[str, str] = {}
    for p in paths:
        if has_scheme(p):
            continue
        run = Path(p)
        camp = run.parent.parent.parent
        if run.parent.parent.name != "runs":
            continue
        if camp not in kept_of:
            try:
                state = json.loads((camp / CAMPAIGN_JSON).read_text())
                kept_of[camp] = {e["name"]: Path(e["run_dir"]).name if e.get("run_dir") else ""
                                 for e in state.get("entries", []) if isinstance(e, dict) and e.get("name")}
            except (OSError, ValueError, TypeError, KeyError):
                kept_of[camp] = None          # not a campaign's run (or an unreadable record): counted
        kept = kept_of[camp]
        if kept is None or run.parent.name not in kept or kept[run.parent.name] == run.name:
            continue
        out[p] = (f"an interrupted attempt of campaign entry {run.parent.name}, rerun as {kept[run.parent.name]}"
                  if kept[run.parent.name] else
                  f"an attempt of campaign entry {run.parent.name}, which has not finished (interrupted or "
                  f"still running)")
    return out


def vet(paths: list[str], ids: dict[str, str], spark: Any = None) -> tuple[list[Run], list[Skipped]]:
    """The runs that can be analysed and those skipped with their reason (a campaign's superseded
    attempts among them: `superseded_attempts`)."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    gone = superseded_attempts(paths)
    skipped += [Skipped(p, why) for p, why in gone.items()]
    paths = [p for p in paths if p not in gone]
    remote = [p for p in paths if has_scheme(p)]
    texts: dict[str, str] = {}
    sizes: dict[str, int | None] = {}
    if remote:
        sizes = _remote_sizes(spark, [f"{p.rstrip('/')}/{n}" for p in remote
                                      for n in (store.HISTORY_PARQUET, store.DELIVERIES_PARQUET,
                                                store.TEST_TOML, store.RESULTS_JSON)])
        want = [f"{p.rstrip('/')}/{n}" for p in remote for n in (store.TEST_TOML, store.RESULTS_JSON)
                if sizes.get(f"{p.rstrip('/')}/{n}") is not None]
        texts = _read_remote_texts(spark, want)     # one Spark job for all of them
    for p in paths:
        local = not has_scheme(p)
        size, rows, paired = 0, None, False
        if local:
            d = Path(p)
            bad = None
            for name, cols in ((store.HISTORY_PARQUET, HISTORY_COLUMNS), (store.DELIVERIES_PARQUET, DELIVERY_COLUMNS)):
                why, n, r, names = _parquet_problem(d / name, cols)
                if why is not None:
                    if why == f"no {store.HISTORY_PARQUET}":
                        why += (" (the run never merged its journals: it crashed or is still running;"
                                " `pulsar-chaos check` on it writes its history)")
                    bad = why
                    break
                size += n
                if name == store.HISTORY_PARQUET:
                    rows = r
                    paired = all(c in names for c in INVOKE_COLUMNS)
            if bad:
                skipped.append(Skipped(p, bad))
                continue
            toml_text, toml_err = _read_local_text(d / store.TEST_TOML)
            res_text, res_err = _read_local_text(d / store.RESULTS_JSON)
        else:
            base = p.rstrip("/")
            missing = [n for n in (store.HISTORY_PARQUET, store.DELIVERIES_PARQUET) if sizes.get(f"{base}/{n}") is None]
            if missing:
                skipped.append(Skipped(p, f"no {missing[0]}"))
                continue
            size = sum(sizes[f"{base}/{n}"] or 0 for n in (store.HISTORY_PARQUET, store.DELIVERIES_PARQUET))
            toml_text = texts.get(f"{base}/{store.TEST_TOML}")
            toml_err = None if toml_text is not None else "missing"
            res_text = texts.get(f"{base}/{store.RESULTS_JSON}")
            res_err = None if res_text is not None else "missing"
        if toml_text is None:
            skipped.append(Skipped(p, f"{store.TEST_TOML} {toml_err}: the run's configuration is unknown"))
            continue
        try:
            spec = tomllib.loads(toml_text)
        except tomllib.TOMLDecodeError as e:
            skipped.append(Skipped(p, f"{store.TEST_TOML}: not valid TOML ({e})"))
            continue
        results = None
        notes = []
        if res_text is None:
            notes.append(f"no {store.RESULTS_JSON}: no Python verdict to compare with")
        else:
            try:
                results = json.loads(res_text)
                if not isinstance(results, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                skipped.append(Skipped(p, f"{store.RESULTS_JSON}: corrupt ({str(e)[:160]})"))
                continue
        runs.append(Run(run_id=ids[p], path=p, local=local, spec=spec, results=results,
                        history_bytes=size, history_rows=rows, notes=notes, paired=paired))
    return runs, skipped


# ------------------------------------------------------------------------------------ Spark tables

def history_schema():
    from pyspark.sql import types as T
    mid = T.StructType([T.StructField(n, T.LongType()) for n in ("ledger_id", "entry_id", "partition",
                                                                  "batch_index")])
    hist = T.StructType([
        T.StructField("index", T.LongType()), T.StructField("time_ns", T.LongType()),
        T.StructField("process", T.LongType()), T.StructField("type", T.StringType()),
        T.StructField("f", T.StringType()), T.StructField("key", T.StringType()),
        T.StructField("value", T.StringType()), T.StructField("message_id", mid),
        T.StructField("node", T.StringType()), T.StructField("error", T.StringType()),
        # null in the histories written before they were recorded (Run.paired is False for those)
        T.StructField("invoke_index", T.LongType()), T.StructField("invoke_time_ns", T.LongType()),
        T.StructField("invoke_key", T.StringType()), T.StructField("invoke_value", T.StringType())])
    deliv = T.StructType([
        T.StructField("index", T.LongType()), T.StructField("time_ns", T.LongType()),
        T.StructField("process", T.LongType()), T.StructField("f", T.StringType()),
        T.StructField("key", T.StringType()), T.StructField("position", T.LongType()),
        T.StructField("value", T.LongType()), T.StructField("message_id", mid),
        T.StructField("redelivery_count", T.LongType())])
    return hist, deliv


def _dir_key(col: Any) -> Any:
    """A file's folder as a comparable string: scheme "file:" and URL escapes removed."""
    from pyspark.sql import functions as F
    d = F.regexp_replace(col, r"/[^/]+$", "")
    d = F.regexp_replace(d, r"^file:(//)?", "")
    return F.url_decode(d)


def _path_key(p: str) -> str:
    """A path as Spark's _metadata.file_path and Hadoop's listings spell it, with "file:" dropped."""
    if has_scheme(p):
        from urllib.parse import unquote
        return re.sub(r"^file:(//)?", "", unquote(p.rstrip("/")))
    return str(Path(p).resolve())


# a run with at least this much Parquet (history and deliveries) is read on its own, its run number a
# constant column; smaller runs share one multi-file read whose rows are mapped to their run through
# each row's file path (two regular expressions and a URL decoding per row: 3 s per million rows on
# two shared cores, paid on every scan of a long history)
OWN_READ_BYTES = 8 << 20
MAX_OWN_READS = 64                  # at most this many separate reads (the biggest runs); the rest share one


def load_tables(spark: Any, runs: list[Run]):
    """(history, deliveries) of every run as two Spark DataFrames with an int run_id column (Run.num;
    run_names() maps it back). Long runs are read one by one with their number as a constant (see
    OWN_READ_BYTES); the many small runs of a campaign in one multi-file read (not one per run),
    each file's folder mapped to its run."""
    from pyspark.sql import functions as F
    hist_schema, deliv_schema = history_schema()
    for i, r in enumerate(runs):
        r.num = i
    big = sorted((r for r in runs if r.history_bytes >= OWN_READ_BYTES), key=lambda r: -r.history_bytes)
    own = {r.num for r in big[:MAX_OWN_READS]}
    shared = [r for r in runs if r.num not in own]
    ids = None
    if shared:
        ids = F.broadcast(spark.createDataFrame([(_path_key(r.path), r.num) for r in shared],
                                                "dir string, run_id int"))

    def read(name: str, schema: Any):
        parts = [spark.read.schema(schema).parquet(f"{_spark_path(r)}/{name}")
                 .withColumn("run_id", F.lit(r.num).cast("int")) for r in runs if r.num in own]
        if shared:
            df = spark.read.schema(schema).parquet(*[f"{_spark_path(r)}/{name}" for r in shared])
            df = df.withColumn("dir", _dir_key(F.col("_metadata.file_path")))
            parts.append(df.join(ids, "dir").drop("dir"))
        out = parts[0]
        for df in parts[1:]:
            out = out.unionByName(df)
        return out
    return read(store.HISTORY_PARQUET, hist_schema), read(store.DELIVERIES_PARQUET, deliv_schema)


def _spark_path(r: Run) -> str:
    return str(Path(r.path).resolve()) if r.local else r.path.rstrip("/")


def run_names(spark: Any, runs: list[Run]):
    """(run_id int -> run_id string), small enough to broadcast."""
    from pyspark.sql import functions as F
    return F.broadcast(spark.createDataFrame([(r.num, r.run_id) for r in runs], "num int, name string"))


def with_run_names(df: Any, names: Any) -> Any:
    """df with its int run_id replaced by the run's id string."""
    from pyspark.sql import functions as F
    cols = [F.col("name").alias("run_id") if c == "run_id" else F.col(c) for c in df.columns]
    return df.join(names, df["run_id"] == names["num"]).select(*cols)
