"""Run folders for the Spark tests (synthetic histories with planted anomalies, written as the harness
writes them), and the anomalies of the Python checkers and of the Spark checks as comparable keys."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core import store
from core.history import MessageId, Op
from core.spec import TestSpec

FINAL = 1_000_000


def pos(m: Any) -> tuple[int, int, int] | None:
    """(ledger, entry, batch index with -1 as 0) of a message id (dict, Row or MessageId)."""
    if m is None:
        return None
    if hasattr(m, "asDict"):
        m = m.asDict()
    if isinstance(m, MessageId):
        m = {"ledger_id": m.ledger_id, "entry_id": m.entry_id, "batch_index": m.batch_index}
    return (int(m["ledger_id"]), int(m["entry_id"]), max(int(m.get("batch_index", -1)), 0))


def python_keys(checker: str, anomalies: dict[str, list[Any]], types: tuple[str, ...]) -> dict[str, list]:
    """{type: sorted keys} of a Python checker's anomaly evidence."""
    out: dict[str, list] = {}
    for t in types:
        keys = []
        for a in anomalies.get(t, []):
            if checker == "log":
                if t in ("lost", "unexpected"):
                    k = (a["topic"], a["value"])
                elif t == "divergence":
                    k = (a["topic"], pos(a["message_id"]), tuple(sorted(a["values"])))
                elif t == "duplicate":
                    k = (a["topic"], a["value"], tuple(sorted(pos(m) for m in a["message_ids"])))
                else:   # nonmonotonic-send
                    e, l = a["earlier"], a["later"]
                    k = (a["topic"], a["process"], a["partition"], e["value"], l["value"],
                         pos(e["message_id"]), pos(l["message_id"]))
            else:
                if t in ("lost", "unexpected"):
                    k = (a["queue"], a["value"])
                elif t == "duplicated":
                    k = (a["queue"], a["value"], a["deliveries"], a["attempts"])
                else:   # duplicate
                    k = (a["queue"], a["value"], tuple(sorted(pos(m) for m in a["message_ids"])))
            keys.append(k)
        out[t] = sorted(keys, key=repr)
    return out


def spark_keys(rows: list[Any], checker: str, types: tuple[str, ...]) -> dict[str, list]:
    """The same keys from the Spark anomaly rows (ANOMALY_SCHEMA) of one run and checker."""
    out: dict[str, list] = {t: [] for t in types}
    for r in rows:
        if r["checker"] != checker or r["type"] not in out:
            continue
        t = r["type"]
        mids = [pos(m) for m in (r["message_ids"] or [])]
        if checker == "log":
            if t in ("lost", "unexpected"):
                k = (r["topic"], r["value"])
            elif t == "divergence":
                k = (r["topic"], mids[0], tuple(sorted(r["values"])))
            elif t == "duplicate":
                k = (r["topic"], r["value"], tuple(sorted(mids)))
            else:
                k = (r["topic"], r["process"], r["partition"], r["values"][0], r["values"][1], mids[0], mids[1])
        else:
            if t in ("lost", "unexpected"):
                k = (r["topic"], r["value"])
            elif t == "duplicated":
                k = (r["topic"], r["value"], r["deliveries"], r["attempts"])
            else:
                k = (r["topic"], r["value"], tuple(sorted(mids)))
        out[t].append(k)
    return {t: sorted(v, key=repr) for t, v in out.items()}


# ------------------------------------------------------------------------------------ synthetic runs

class H:
    """A history under construction: ops with increasing times and indexes."""

    def __init__(self):
        self.ops: list[Op] = []
        self.t = 1_000_000

    def op(self, process: int, type_: str, f: str, key: str = "", value: Any = None,
           mid: tuple | None = None, error: str = "") -> Op:
        self.t += 1_000_000
        m = MessageId(*mid) if mid is not None else None
        o = Op(process=process, type=type_, f=f, key=key, value=value, message_id=m, error=error,
               time_ns=self.t, index=len(self.ops))
        self.ops.append(o)
        return o

    def send(self, p: int, topic: str, v: Any, mid: tuple | None, outcome: str = "ok") -> None:
        self.op(p, "invoke", "send", topic, v)
        self.op(p, outcome, "send", topic, v, mid if outcome == "ok" else None)

    def recv(self, p: int, topic: str, msgs: list[tuple[Any, tuple | None]], f: str = "receive",
             outcome: str = "ok") -> None:
        self.op(p, "invoke", f, topic)
        self.op(p, outcome, f, topic, [msg(v, m) for v, m in msgs])

    def pause(self, seconds: float) -> None:
        self.t += int(seconds * 1e9)


def msg(v: Any, m: tuple | None) -> dict[str, Any]:
    d: dict[str, Any] = {"value": v}
    if m is not None:
        d["message_id"] = dict(zip(("ledger_id", "entry_id", "partition", "batch_index"), m))
    return d


def write_run(results: Path, name: str, stamp: str, history: list[Op], **spec_kw: Any) -> Path:
    """A run folder as the harness leaves it: test.toml, history.jsonl/.parquet, deliveries.parquet,
    results.json from the workload's own checkers, and a report.html stand-in."""
    from workloads import get
    spec = TestSpec(test_name=name, results_dir=str(results), seed=1, **spec_kw)
    d = results / name / stamp
    d.mkdir(parents=True)
    store.write_test_toml(d, spec)
    from core.history import write_jsonl
    write_jsonl(history, d / store.HISTORY_JSONL)
    store.write_parquet(history, d)
    checked = {n: fn(history, opts) for n, (fn, opts) in get(spec.workload).checkers(spec).items()
               if n in ("log", "queue")}
    valid = store.verdict(list(checked.values()))
    from core.detection import detection_of
    store.write_results(d, valid=valid, exit_code=store.exit_code_for(valid), error=None,
                        run={"dir": str(d), "test_name": name}, checkers=checked,
                        detection=detection_of(history, checked, valid))
    (d / store.REPORT_HTML).write_text("<html><body>report</body></html>")
    return d


def as_written_before_pairing(run_dir: Path) -> Path:
    """The run's history.parquet rewritten without the invoke_* columns, as histories were written
    before core.store recorded each completion's invoke (the analysis pairs those itself)."""
    import pyarrow.parquet as pq
    from spark_analysis.inputs import INVOKE_COLUMNS
    path = Path(run_dir) / store.HISTORY_PARQUET
    t = pq.read_table(path)
    assert all(c in t.column_names for c in INVOKE_COLUMNS), path
    pq.write_table(t.drop_columns(list(INVOKE_COLUMNS)), path)
    return Path(run_dir)


def rerun_python(run_dir: Path) -> dict[str, Any]:
    """The Python checkers' results for a run folder, rerun with every anomaly kept (no cap)."""
    from workloads import get
    spec = store.load_spec(run_dir, catalog=None)
    history = store.load_history(run_dir)
    out = {}
    for n, (fn, opts) in get(spec.workload).checkers(spec).items():
        if n in ("log", "queue"):
            out[n] = fn(history, dict(opts, max_anomalies=None)).to_json()
    return out


def read_json(p: Path) -> Any:
    return json.loads(Path(p).read_text())


def analysis_tables(out_dir: str | Path, root: str | Path | None = None) -> dict[str, Any]:
    """Every Parquet table of an analysis as pandas, rows in a canonical order (their text), the results
    dir `root` in path columns written as "<root>" (to compare analyses of copies of the same runs)."""
    import pandas as pd
    out = {}
    for p in sorted(Path(out_dir).glob("*.parquet")):
        df = pd.read_parquet(p)
        if root is not None and "path" in df.columns:
            df["path"] = df["path"].str.replace(str(root), "<root>", regex=False)
        if len(df):
            key = df.astype(str).apply(lambda r: "\x00".join(r), axis=1)
            df = df.loc[key.sort_values(kind="stable").index].reset_index(drop=True)
        out[p.stem] = df
    return out


def assert_same_tables(mine: dict[str, Any], theirs: dict[str, Any]) -> None:
    import pandas as pd
    assert set(mine) == set(theirs), (set(mine) ^ set(theirs))
    for name in theirs:
        pd.testing.assert_frame_equal(mine[name], theirs[name], check_dtype=False, obj=name)
