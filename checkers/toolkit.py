"""What two or more checkers share: value and message-id normalisation, position keys, evidence, op names,
stats helpers, the capped cases of an anomaly type and the verdict from them. It imports no checker.
"""
from __future__ import annotations

import gc
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from core.history import MessageId, Op

# Message ids, as (ledger, entry, partition, batch index).
Mid = tuple[int, int, int, int]

# A position key packs (ledger, entry, batch index) into one int when entry and batch index are below
# these (ledger ids are not bounded); other positions stay tuples.
ENTRY_LIMIT = 1 << 32
BATCH_LIMIT = 1 << 16


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the duration (restored after).

    A check allocates millions of small tuples and dicts next to a history of millions of objects;
    every full collection walks all of them, which doubled the time of a 1,000,000-op check. The
    checkers make no reference cycles worth collecting, so nothing is lost by pausing it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# --------------------------------------------------------------------------------- values and ids

def norm_value(v: Any) -> Any:
    """A message value as a hashable, comparable key: ints stay ints, strings of ints become ints."""
    if type(v) is int:
        return v
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s)
        except ValueError:
            return v
    if isinstance(v, bytes):
        return norm_value(v.decode("utf-8", "replace"))
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, (int, float)):
        return v
    return repr(v)        # unhashable or odd: still comparable as text


def redelivery_count(raw: Any) -> int:
    """A message's redelivery_count field as an int: 0 when absent, empty or not a number."""
    if type(raw) is int:
        return raw
    try:
        return int(raw or 0)
    except (TypeError, ValueError):
        return 0


def mid_tuple(d: Any) -> Mid | None:
    """(ledger, entry, partition, batch_index) from a dict, list, MessageId or "(l,e,p,b)" string."""
    if d is None:
        return None
    try:
        if isinstance(d, dict):
            return (int(d["ledger_id"]), int(d["entry_id"]), int(d.get("partition", -1)),
                    int(d.get("batch_index", -1)))
        if isinstance(d, MessageId):
            return (d.ledger_id, d.entry_id, d.partition, d.batch_index)
        if isinstance(d, str):
            d = [x for x in d.strip("()[] ").replace(":", ",").split(",") if x.strip()]
        if isinstance(d, (list, tuple)) and 2 <= len(d) <= 4:
            t = [int(x) for x in d] + [-1] * (4 - len(d))
            return (t[0], t[1], t[2], t[3])
    except (KeyError, TypeError, ValueError):
        return None
    return None


def mid_json(m: Mid | None) -> dict[str, int] | None:
    """A message id tuple as the history's JSON spelling ({"ledger_id", ...}); None stays None."""
    if m is None:
        return None
    return {"ledger_id": m[0], "entry_id": m[1], "partition": m[2], "batch_index": m[3]}


def partition_of(d: Any) -> int:
    """The partition of a message id in any spelling `mid_tuple` reads; -1 when it has none."""
    if type(d) is dict:
        p = d.get("partition", -1)
        return p if type(p) is int else (mid_tuple(d) or (0, 0, -1))[2]
    if type(d) is MessageId:
        return d.partition
    m = mid_tuple(d)
    return m[2] if m is not None else -1


def position_key(d: Any) -> Any:
    """A position's key, ordered as the log is: one int (ledger, entry, batch index -1 read as 0) when
    the parts fit, else the tuple; None when `d` is not a message id. The partition is left out."""
    if type(d) is dict:
        try:
            l, e = d["ledger_id"], d["entry_id"]
            b = d.get("batch_index", -1)
        except KeyError:
            return None
        if type(l) is not int or type(e) is not int or type(b) is not int:
            m = mid_tuple(d)
            if m is None:
                return None
            l, e, b = m[0], m[1], m[3]
    elif type(d) is MessageId:
        l, e, b = d.ledger_id, d.entry_id, d.batch_index
    else:
        m = mid_tuple(d)
        if m is None:
            return None
        l, e, b = m[0], m[1], m[3]
    if b < 0:
        b = 0
    if l >= 0 and 0 <= e < ENTRY_LIMIT and b < BATCH_LIMIT:
        return ((l << 32) | e) << 16 | b
    return (l, e, b)


def unpack_position(pk: Any) -> tuple[int, int, int]:
    """(ledger, entry, batch index) of a position key, the inverse of `position_key`."""
    if type(pk) is int:
        return (pk >> 48, (pk >> 16) & 0xFFFFFFFF, pk & 0xFFFF)
    return pk


# ---------------------------------------------------------------------------------------- evidence

def jsonable(v: Any) -> Any:
    """v as plain JSON (dicts with str keys, lists, sets sorted when they can be); MessageIds as dicts."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        try:
            return sorted(jsonable(x) for x in v)
        except TypeError:
            return [jsonable(x) for x in v]
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, MessageId):
        return mid_json(mid_tuple(v))
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def full_op(op: Op | None) -> dict[str, Any] | None:
    """An op as evidence in full, its value included, JSON-safe; None for None."""
    return None if op is None else jsonable(op.to_json())


class OpRefs:
    """Evidence references to the ops of history `h`: index (found by identity when an op has none),
    time, process, type, f, the key when `ref_key`, node, and the error when there is one."""
    h: list[Op]
    ref_key = False
    _index_of: dict[int, int] | None = None

    def op_index(self, op: Op) -> int:
        """op's position in the history: its own index, else where it stands in `h` (-1: nowhere)."""
        if op.index >= 0:
            return op.index
        if self._index_of is None:
            self._index_of = {id(x): i for i, x in enumerate(self.h)}
        return self._index_of.get(id(op), -1)

    def ref(self, op: Op | None) -> dict[str, Any] | None:
        """A small reference to op for evidence (its value left out); None for None."""
        if op is None:
            return None
        r = {"index": self.op_index(op), "time_s": round(op.time_ns / 1e9, 6), "process": op.process,
             "type": op.type, "f": op.f}
        if self.ref_key:
            r["key"] = op.key
        r["node"] = op.node or None
        if op.error:
            r["error"] = op.error
        return r


# ------------------------------------------------------------------------------------------- stats

def percentile(sorted_vals: list[float], q: float) -> float | None:
    """Nearest-rank percentile q (0..1) of an ascending list; None for an empty one."""
    n = len(sorted_vals)
    if n == 0:
        return None
    return sorted_vals[min(n - 1, max(0, math.ceil(q * n) - 1))]


def rounded(x: float | None, nd: int = 3) -> float | None:
    """x rounded to nd decimals for stats; None stays None."""
    return None if x is None else round(x, nd)


# ------------------------------------------------------------------------------- options, verdict

def op_names(opts: dict[str, Any], *keys: str) -> tuple[frozenset[str], ...]:
    """The f names each option of `keys` lists (default "send", "receive", "read"), one frozenset per
    key; a name is counted in the first key that lists it."""
    out: list[frozenset[str]] = []
    taken: frozenset[str] = frozenset()
    for k in keys or ("send", "receive", "read"):
        names = frozenset(opts.get(k) or ()) - taken
        out.append(names)
        taken |= names
    return tuple(out)


class Cases:
    """The cases of one anomaly type: how many were found, and the evidence of the first `cap` of
    them (None: all). Evidence is made only while under the cap, so a finder passes a function."""
    __slots__ = ("cap", "count", "evidence")

    def __init__(self, cap: int | None):
        self.cap = cap
        self.count = 0
        self.evidence: list[Any] = []

    def add(self, make: Callable[[], Any]) -> None:
        """One more case; its evidence is make(), called now if the cap leaves room."""
        self.count += 1
        if self.cap is None or len(self.evidence) < self.cap:
            self.evidence.append(make())


def anomalies_of(cases: Mapping[str, Cases]) -> dict[str, list[Any]]:
    """A result's `anomalies`: the evidence of every type with a case, in the order of `cases`."""
    return {k: c.evidence for k, c in cases.items() if c.count}


def anomaly_stats(cases: Mapping[str, Cases], invalid: Collection[str] | None = None) -> dict[str, Any]:
    """The stats every checker reports about its cases: `anomaly_counts` (exact),
    `anomalies_truncated` (the types whose evidence the cap cut short, with their counts) and, given the
    types that make the verdict False (as `verdict` is given them), `invalid_types`: the other types are
    informational, and time to first detection (core/detection.py) looks only at these."""
    out: dict[str, Any] = {
        "anomaly_counts": {k: c.count for k, c in cases.items() if c.count},
        "anomalies_truncated": {k: c.count for k, c in cases.items() if c.count > len(c.evidence)}}
    if invalid is not None:
        out["invalid_types"] = sorted(invalid)
    return out


def verdict(cases: Mapping[str, Cases], invalid: Collection[str], unknown: bool = False) -> bool | str:
    """False when a type in `invalid` has a case, else "unknown" when `unknown` (something needed to
    judge was missing), else True."""
    if any(cases[k].count for k in invalid if k in cases):
        return False
    return "unknown" if unknown else True
