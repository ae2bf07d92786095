"""The run folder: where a run leaves test.toml, its journals, the merged history (JSON lines and
Parquet), results.json and the report; and how `check`/`report` read it all back from disk.
"""
from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from core.history import CheckResult, HistoryError, MessageId, Op, json_default, read_jsonl, write_jsonl
from core.spec import Catalog, SpecError, TestSpec, from_mapping, load

RUN_FOLDER_FORMAT = "%Y%m%dT%H%M%S"
TEST_TOML = "test.toml"
JOURNALS = "journals"
HISTORY_JSONL = "history.jsonl"
HISTORY_PARQUET = "history.parquet"
DELIVERIES_PARQUET = "deliveries.parquet"
RESULTS_JSON = "results.json"
REPORT_HTML = "report.html"
CLUSTER_JSON = "cluster.json"          # the deployed cluster's nodes, addresses and service URL
NODES = "nodes"
LOGS = "logs"                          # worker processes' own output (the pulsar client's warnings)
RUNNER_LOG = "runner.log"
NEMESIS_JOURNAL = "nemesis.jsonl"
FINAL_READS_JOURNAL = "final-reads.jsonl"
LATEST = "latest"


def now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------ creating a run

def create_run_dir(results_dir: Path | str, test_name: str, when: float | None = None) -> Path:
    """results/<test_name>/<YYYYmmddTHHMMSS>/ (with -2, -3... if that second is taken), and
    results/latest pointing at it."""
    if test_name == LATEST:
        raise SpecError("test_name", f"{LATEST!r} is reserved for the results/{LATEST} link",
                        "choose another test name")
    base = Path(results_dir) / test_name
    stamp = time.strftime(RUN_FOLDER_FORMAT, time.localtime(when if when is not None else time.time()))
    try:
        base.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            run_dir = base / (stamp if n == 1 else f"{stamp}-{n}")
            try:
                run_dir.mkdir()
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - a thousand runs in one second
            raise SpecError("results_dir", f"{base} has no free run folder for {stamp}", "wait a second")
        (run_dir / JOURNALS).mkdir()
    except OSError as e:
        raise SpecError("results_dir", f"cannot create a run folder under {results_dir} ({e.strerror})",
                        "choose a writable --results-dir") from None
    update_latest(results_dir, run_dir)
    return run_dir


def update_latest(results_dir: Path | str, run_dir: Path) -> None:
    """Point results/latest at run_dir (relative link, replaced atomically)."""
    link = Path(results_dir) / LATEST
    target = os.path.relpath(run_dir, Path(results_dir))
    tmp = link.with_name(f".{LATEST}.{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)       # a results dir that refuses links still gets its runs


def write_test_toml(run_dir: Path, spec: TestSpec) -> Path:
    path = run_dir / TEST_TOML
    _write_text_atomic(path, spec.to_toml())
    return path


def load_spec(run_dir: Path, *, catalog: Catalog | None) -> TestSpec:
    """The resolved spec a run was made with (its test.toml); its names checked against `catalog`
    when given (a run folder from another checkout may name what this one lacks)."""
    path = Path(run_dir) / TEST_TOML
    if not path.exists():
        raise HistoryError(f"{path}: missing; fix: give a run folder made by `pulsar-chaos run` "
                           f"(results/<test-name>/<time>/)")
    try:
        return from_mapping(load(path), str(path), catalog=catalog)
    except SpecError as e:
        raise HistoryError(f"{e}") from None


def journal_dir(run_dir: Path) -> Path:
    return Path(run_dir) / JOURNALS


def worker_journal(run_dir: Path, worker: int) -> Path:
    return journal_dir(run_dir) / f"worker-{worker}.jsonl"


def journal_paths(run_dir: Path) -> list[Path]:
    d = journal_dir(run_dir)
    return sorted(d.glob("*.jsonl")) if d.is_dir() else []


def check_run_dir(run_dir: Path | str) -> Path:
    """The run folder, or a HistoryError naming it and the fix."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise HistoryError(f"{run_dir}: no such run folder; fix: give a folder under results/<test-name>/, "
                           f"e.g. results/latest")
    if not any((run_dir / n).exists() for n in (TEST_TOML, HISTORY_JSONL, JOURNALS)):
        raise HistoryError(f"{run_dir}: not a run folder (no {TEST_TOML}, {HISTORY_JSONL} or {JOURNALS}/); "
                           f"fix: give a folder under results/<test-name>/, e.g. results/latest")
    return run_dir


# ------------------------------------------------------------------------------------ merging

def merge_journals(paths: list[Path]) -> list[Op]:
    """Every op of every journal, ordered by (time_ns, journal, position in it), indexed from 0."""
    keyed: list[tuple[int, str, int, Op]] = []
    for path in paths:
        for seq, op in enumerate(read_jsonl(path)):
            keyed.append((op.time_ns, path.name, seq, op))
    keyed.sort(key=lambda k: k[:3])
    history = []
    for i, (_, _, _, op) in enumerate(keyed):
        op.index = i
        history.append(op)
    return history


def merge(run_dir: Path) -> list[Op]:
    """Merge the run's journals into history.jsonl, history.parquet and deliveries.parquet."""
    run_dir = Path(run_dir)
    history = merge_journals(journal_paths(run_dir))
    write_jsonl(history, run_dir / HISTORY_JSONL)
    write_parquet(history, run_dir)
    return history


def load_history(run_dir: Path | str) -> list[Op]:
    """The run's history: history.jsonl if merged, else its journals merged in memory."""
    run_dir = check_run_dir(run_dir)
    path = run_dir / HISTORY_JSONL
    if path.exists():
        history = list(read_jsonl(path))
        for i, op in enumerate(history):
            if op.index < 0:
                op.index = i
        return history
    paths = journal_paths(run_dir)
    if not paths:
        raise HistoryError(f"{run_dir}: no {HISTORY_JSONL} and no journals in {JOURNALS}/; fix: the run "
                           f"recorded no operations, rerun the test")
    return merge_journals(paths)


# ------------------------------------------------------------------------------------ parquet

def _invoke_columns():
    import pyarrow as pa
    return (("invoke_index", pa.int64()), ("invoke_time_ns", pa.int64()), ("invoke_key", pa.string()),
            ("invoke_value", pa.string()))


def _schemas():
    import pyarrow as pa
    mid = pa.struct([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("partition", pa.int64()),
                     ("batch_index", pa.int64())])
    history = pa.schema([("index", pa.int64()), ("time_ns", pa.int64()), ("process", pa.int64()),
                         ("type", pa.string()), ("f", pa.string()), ("key", pa.string()),
                         ("value", pa.string()), ("message_id", mid), ("node", pa.string()),
                         ("error", pa.string()),
                         # a completion's invoke (the previous op of its process, when that is an
                         # invoke of the same f), recorded as the history is written so that an
                         # analysis need not pair them again; null for invokes and orphans
                         *_invoke_columns()])
    deliveries = pa.schema([("index", pa.int64()), ("time_ns", pa.int64()), ("process", pa.int64()),
                            ("f", pa.string()), ("key", pa.string()), ("position", pa.int64()),
                            ("value", pa.int64()), ("message_id", mid), ("redelivery_count", pa.int64())])
    return history, deliveries


def _mid(d: Any) -> dict[str, int] | None:
    try:
        m = MessageId.from_json(d)
    except (KeyError, TypeError, ValueError):
        return None
    return asdict(m) if m is not None else None


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -2**63 <= v < 2**63 else None
    return None


def history_table(history: list[Op], last: dict[int, tuple] | None = None):
    """history.parquet's rows for these ops, in index order. `last` carries, per process, its latest
    op across the chunks of one history written a chunk at a time (pass the same dict, in order)."""
    import pyarrow as pa
    schema, _ = _schemas()
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}
    last = {} if last is None else last
    if any(a.index > b.index for a, b in zip(history, history[1:])):
        history = sorted(history, key=lambda o: o.index)
    for op in history:
        value = None if op.value is None else json.dumps(op.value, separators=(",", ":"), default=_lenient_json)
        cols["index"].append(op.index)
        cols["time_ns"].append(op.time_ns)
        cols["process"].append(op.process)
        cols["type"].append(op.type)
        cols["f"].append(op.f)
        cols["key"].append(op.key)
        cols["value"].append(value)
        cols["message_id"].append(asdict(op.message_id) if op.message_id is not None else None)
        cols["node"].append(op.node)
        cols["error"].append(op.error)
        prev = last.get(op.process)
        paired = op.type != "invoke" and prev is not None and prev[0] == "invoke" and prev[1] == op.f
        cols["invoke_index"].append(prev[2] if paired else None)
        cols["invoke_time_ns"].append(prev[3] if paired else None)
        cols["invoke_key"].append(prev[4] if paired else None)
        cols["invoke_value"].append(prev[5] if paired else None)
        last[op.process] = (op.type, op.f, op.index, op.time_ns, op.key, value)
    return pa.table(cols, schema=schema)


def deliveries(history: list[Op]) -> list[dict[str, Any]]:
    """One row per message delivered by an ok receive or read."""
    rows = []
    for op in history:
        if op.type != "ok" or op.f not in ("receive", "read") or not isinstance(op.value, list):
            continue
        for pos, m in enumerate(op.value):
            if not isinstance(m, dict):
                continue
            rows.append({"index": op.index, "time_ns": op.time_ns, "process": op.process, "f": op.f,
                         "key": op.key, "position": pos, "value": _int_or_none(m.get("value")),
                         "message_id": _mid(m.get("message_id")),
                         "redelivery_count": _int_or_none(m.get("redelivery_count"))})
    return rows


def deliveries_table(history: list[Op]):
    import pyarrow as pa
    _, schema = _schemas()
    rows = deliveries(history)
    return pa.table({name: [r[name] for r in rows] for name in schema.names}, schema=schema)


def write_parquet(history: list[Op], run_dir: Path) -> None:
    import pyarrow.parquet as pq
    for table, name in ((history_table(history), HISTORY_PARQUET), (deliveries_table(history), DELIVERIES_PARQUET)):
        path = Path(run_dir) / name
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)


_lenient_json = functools.partial(json_default, strict=False)


# ------------------------------------------------------------------------------------ results

def verdict(results: list[Any]) -> bool | str:
    """All True -> True; any False -> False; otherwise "unknown"."""
    vals = [r.valid if isinstance(r, CheckResult) else r for r in results]
    if any(v is False for v in vals):
        return False
    if vals and all(v is True for v in vals):
        return True
    return "unknown"


# Exit codes, one scheme for every command (Jepsen's): a verdict, or why there is none.
EXIT_VALID = 0          # valid (and, for other commands, success)
EXIT_INVALID = 1        # invalid: an anomaly was found (doctor: a required check failed)
EXIT_UNKNOWN = 2        # the checkers could not decide
EXIT_USAGE = 254        # a user error: a bad flag, spec, name, file or run folder, or a missing prerequisite
EXIT_CRASH = 255        # the harness (or Spark under it) crashed; the message says where


def exit_code_for(valid: bool | str) -> int:
    return EXIT_VALID if valid is True else EXIT_INVALID if valid is False else EXIT_UNKNOWN


def write_results(run_dir: Path, *, valid: bool | str, exit_code: int, error: str | None,
                  run: dict[str, Any], checkers: dict[str, CheckResult | dict[str, Any]],
                  **extra: Any) -> Path:
    """results.json: {"valid", "exit_code", "error", "run": {...}, "checkers": {name: result}}."""
    data: dict[str, Any] = {
        "valid": valid, "exit_code": exit_code, "error": error, "run": run,
        "checkers": {k: (v.to_json() if isinstance(v, CheckResult) else v) for k, v in checkers.items()},
    }
    data.update(extra)
    path = Path(run_dir) / RESULTS_JSON
    _write_text_atomic(path, json.dumps(data, indent=2, default=_lenient_json) + "\n")
    return path


def read_results(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / RESULTS_JSON
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as e:
        raise HistoryError(f"{path}: unreadable ({e}); fix: delete it and run `pulsar-chaos check "
                           f"{run_dir}` to write it again") from None


def anomaly_counts(checker: Any) -> dict[str, int]:
    """{anomaly type: count} of one checker's entry in results.json: its exact `stats.anomaly_counts`,
    else the length of each evidence list (capped by the checker)."""
    if not isinstance(checker, dict):
        return {}
    counts = (checker.get("stats") or {}).get("anomaly_counts")
    if not isinstance(counts, dict):
        counts = {k: len(v) for k, v in (checker.get("anomalies") or {}).items() if isinstance(v, list)}
    return {str(k): n for k, n in counts.items() if isinstance(n, int) and not isinstance(n, bool)}


def anomalies_text(results: dict[str, Any], invalid_only: bool = False) -> str:
    """`log: lost 3, duplicate 2; fencing: split-brain 1` from results.json (only the checkers that
    judged the run invalid, with `invalid_only`)."""
    parts = []
    for name, c in (results.get("checkers") or {}).items():
        if invalid_only and not (isinstance(c, dict) and c.get("valid") is False):
            continue
        found = [f"{t} {n}" for t, n in anomaly_counts(c).items() if n > 0]
        if found or invalid_only:
            parts.append(f"{name}: {', '.join(found) or 'invalid'}")
    return "; ".join(parts)


def write_json(path: Path, data: Any) -> None:
    _write_text_atomic(Path(path), json.dumps(data, indent=2, default=_lenient_json) + "\n")


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
