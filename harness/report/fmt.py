"""The report's formatting: HTML escaping, numbers, durations, sizes and compact op values."""
from __future__ import annotations

import html
import json
import math
import re
from typing import Any


def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _is_mid(v: Any) -> bool:
    return isinstance(v, dict) and "ledger_id" in v and "entry_id" in v


def _mid(v: dict) -> str:
    return (f"({v.get('ledger_id')},{v.get('entry_id')},{v.get('partition', -1)},"
            f"{v.get('batch_index', -1)})")


def _is_op(v: Any) -> bool:
    return isinstance(v, dict) and (("f" in v and "type" in v) or ("index" in v and "process" in v))


def _op_text(d: dict, limit: int) -> str:
    parts = []
    if d.get("index") is not None:
        parts.append(f"#{d['index']}")
    if d.get("process") is not None:
        parts.append(f"p{d['process']}")
    for k in ("type", "f", "key"):
        if d.get(k) not in (None, ""):
            parts.append(str(d[k]))
    if d.get("value") is not None:
        parts.append("v=" + _compact(d["value"], limit=80))
    if d.get("message_id") is not None:
        parts.append(_compact(d["message_id"], key="message_id"))
    if isinstance(d.get("time_ns"), (int, float)) and not isinstance(d.get("time_ns"), bool):
        parts.append(f"@{d['time_ns'] / 1e9:.3f}s")
    elif isinstance(d.get("time_s"), (int, float)) and not isinstance(d.get("time_s"), bool):
        parts.append(f"@{d['time_s']:.3f}s")
    if d.get("node"):
        parts.append(f"node={d['node']}")
    if d.get("error"):
        parts.append(f"error={_compact(d['error'], limit=120)}")
    for k, v in d.items():
        if k not in ("index", "process", "type", "f", "key", "value", "message_id", "time_ns", "time_s",
                     "node", "error", "seq"):
            parts.append(f"{k}={_compact(v, limit=80)}")
    return _cut(" ".join(parts), limit)


def _cut(s: str, limit: int) -> str:
    return s if len(s) <= limit else s[:limit - 1] + "…"


def _num(v: float) -> str:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v == int(v) and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.6g}"
    return str(v)


def _compact(v: Any, key: str = "", limit: int = 1000, depth: int = 0) -> str:
    """One readable line (or a few) for any JSON value; message ids as (l,e,p,b), ops as one line."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _num(v)
    if isinstance(v, str):
        return _cut(v, limit)
    if _is_mid(v):
        return _mid(v)
    if (isinstance(v, (list, tuple)) and len(v) == 4 and "message_id" in key
            and all(isinstance(x, int) for x in v)):
        return "(" + ",".join(map(str, v)) + ")"
    if depth > 4:
        return _cut(json.dumps(v, default=str), limit)
    if _is_op(v):
        return _op_text(v, limit)
    if isinstance(v, dict):
        s = "{" + ", ".join(f"{k}: {_compact(x, str(k), limit, depth + 1)}" for k, x in
                            list(v.items())[:30]) + (", …" if len(v) > 30 else "") + "}"
        return _cut(s, limit)
    if isinstance(v, (list, tuple)):
        items = list(v[:20])
        more = f" … ({len(v) - 20} more)" if len(v) > 20 else ""
        if items and all(_is_op(x) for x in items):      # several ops: one a line
            return _cut("\n".join(_op_text(x, 300) for x in items) + more, limit * 4)
        return _cut("[" + ", ".join(_compact(x, key, limit, depth + 1) for x in items) + more + "]", limit)
    return _cut(str(v), limit)


def _anchor(s: str, used: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", s).strip("-") or "x"
    a, n = base, 2
    while a in used:
        a, n = f"{base}-{n}", n + 1
    used.add(a)
    return a


def _verdict(v: Any) -> str:
    if v is True or (isinstance(v, str) and v.lower() in ("true", "valid")):
        return "valid"
    if v is False or (isinstance(v, str) and v.lower() in ("false", "invalid")):
        return "INVALID"
    return "unknown"


def _fmt_s(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _fmt_ms(ms: float) -> str:
    if ms != ms:
        return "—"
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.3g} ms"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _fault_colour(name: str, cache: dict[str, str]) -> str:
    """A fault's band colour, as its registry entry declares it (`nemesis.registry.colour`)."""
    if name not in cache:
        from nemesis.registry import colour
        cache[name] = colour(name)
    return cache[name]
