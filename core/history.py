"""The operation history: one schema for workers, nemeses, checkers, reports and Spark.

An operation is recorded twice, as in Jepsen: `invoke` when a process starts it, and `ok`, `fail` or
`info` (indeterminate) when it ends. Journals are JSON lines appended as ops happen.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
TYPES = (INVOKE, OK, FAIL, INFO)
NEMESIS_PROCESS = -1
OBSERVER_PROCESS = -2          # observers (core/observations.py): what the harness saw, not ops it did


class HistoryError(ValueError):
    """A history file that cannot be read; the message names the file, the line and the fix."""


@dataclass
class MessageId:
    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1

    def key(self) -> tuple[int, int, int, int]:
        return (self.ledger_id, self.entry_id, self.partition, self.batch_index)

    def __lt__(self, other: "MessageId") -> bool:
        return (self.ledger_id, self.entry_id, self.batch_index) < (other.ledger_id, other.entry_id,
                                                                   other.batch_index)

    def __str__(self) -> str:
        return f"({self.ledger_id},{self.entry_id},{self.partition},{self.batch_index})"

    @classmethod
    def from_json(cls, d: Any) -> "MessageId | None":
        if d is None:
            return None
        if isinstance(d, MessageId):
            return d
        if isinstance(d, (list, tuple)):
            return cls(*[int(x) for x in d])
        return cls(int(d["ledger_id"]), int(d["entry_id"]), int(d.get("partition", -1)),
                   int(d.get("batch_index", -1)))

    @classmethod
    def from_pulsar(cls, mid: Any) -> "MessageId":
        return cls(mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index())


@dataclass
class Op:
    """One history row (the schema of ARCHITECTURE.md)."""
    process: int
    type: str
    f: str
    key: str = ""
    value: Any = None
    message_id: MessageId | None = None
    node: str = ""
    error: str = ""
    time_ns: int = 0
    index: int = -1

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if self.message_id is None:
            d["message_id"] = None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Op":
        if d.get("type") not in TYPES:
            raise ValueError(f"type must be one of {TYPES}, not {d.get('type')!r}")
        return cls(process=int(d["process"]), type=d["type"], f=str(d["f"]), key=d.get("key") or "",
                   value=d.get("value"), message_id=MessageId.from_json(d.get("message_id")),
                   node=d.get("node") or "", error=d.get("error") or "",
                   time_ns=int(d.get("time_ns", 0)), index=int(d.get("index", -1)))

    def complete(self, type: str, **changes: Any) -> "Op":
        """The completion of this invocation (same process, f, key)."""
        d = dict(process=self.process, type=type, f=self.f, key=self.key, value=self.value,
                 message_id=self.message_id, node=self.node, error="")
        d.update(changes)
        return Op(**d)


class Journal:
    """Append-only JSON-lines journal of one process (a worker, the nemesis); thread-safe.

    Every line is flushed as it is written, so a crash of the harness loses at most the line in
    progress; `time_ns` is CLOCK_MONOTONIC, the same clock in every process of the machine, minus the
    run's start, so journals of different processes merge by time."""

    def __init__(self, path: Path | str, t0_ns: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.t0_ns = t0_ns
        self._f = open(self.path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self._seq = 0

    def append(self, op: Op) -> Op:
        with self._lock:
            op.time_ns = time.monotonic_ns() - self.t0_ns
            d = op.to_json()
            d["seq"] = self._seq            # tie-breaker for equal times within one journal
            self._seq += 1
            self._f.write(json.dumps(d, separators=(",", ":"), default=json_default) + "\n")
        return op

    def sync(self) -> None:
        with self._lock:
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.flush()
                self._f.close()


def json_default(o: Any, strict: bool = True) -> Any:
    """json.dumps' default= for history values; strict=False writes anything else as str()."""
    if isinstance(o, MessageId):
        return asdict(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if isinstance(o, bytes):
        return o.decode("utf-8", "replace")
    if not strict:
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def read_jsonl(path: Path | str, *, tolerate_torn_tail: bool = True) -> Iterator[Op]:
    """Ops of a journal or history.jsonl. A torn last line (a crash mid-write) is skipped; any other
    malformed line is a HistoryError naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except OSError as e:
        raise HistoryError(f"{path}: cannot read ({e.strerror}); fix: check the run folder") from None
    except UnicodeDecodeError:
        raise HistoryError(f"{path}: not UTF-8 text; fix: restore the file or rerun the test") from None
    last = len(lines) - 1
    while last >= 0 and not lines[last].strip():
        last -= 1
    for n, line in enumerate(lines[:last + 1], start=1):
        if not line.strip():
            continue
        try:
            yield Op.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError) as e:
            if tolerate_torn_tail and n == last + 1:
                return          # the line being written when the process died
            raise HistoryError(f"{path}:{n}: malformed operation ({e}); fix: repair or delete that "
                               f"line, or rerun the test") from None


def write_jsonl(ops: Iterable[Op], path: Path | str) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for op in ops:
            f.write(json.dumps(op.to_json(), separators=(",", ":"), default=json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def pairs(history: list[Op]) -> Iterator[tuple[Op, Op | None]]:
    """(invoke, completion) for every invocation in the history; completion None if it never ended."""
    open_by_process: dict[int, Op] = {}
    out: list[tuple[Op, Op | None]] = []
    for op in history:
        if op.type == INVOKE:
            open_by_process[op.process] = op
        else:
            inv = open_by_process.pop(op.process, None)
            if inv is not None:
                out.append((inv, op))
    for inv in open_by_process.values():
        out.append((inv, None))
    out.sort(key=lambda p: p[0].index)
    return iter(out)


@dataclass
class CheckResult:
    """What every checker returns: a verdict, the anomalies with the ops that prove them, and stats."""
    valid: bool | str                      # True, False or "unknown"
    anomalies: dict[str, list[Any]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "anomalies": self.anomalies, "stats": self.stats}
