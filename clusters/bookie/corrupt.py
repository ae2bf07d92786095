"""Disk corruption of a stopped bookie's entry logs, for the `disk-corrupt` and `disk-truncate` faults
(nemesis/corrupt.py; `Cluster.corrupt`): bit flips in, or truncation of, its newest entry log
(storage.py's `entrylogs/<id>.log`), as a failing disk or a lost tail of a file would leave it.

The index (index.sqlite) is left as it is, so the bookie still believes it stores every entry of the
damaged region: its reads of them find short or checksum-failing records (`storage.CorruptEntry`),
which a correct bookie answers with an error, never "no such entry" (apache/bookkeeper#2908; the knob
`bk.corrupt_log_says_nosuchentry` restores the bug).

Bounded: one file, at most `MAX_FLIPS` bits; the damage lies in the tail (the newest records, those a
ledger recovery reads), drawn from the caller's numbers in [0, 1) so that a seeded fault is repeatable.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .storage import ELOG_MAGIC

MODES = ("bitflip", "truncate")
MAX_FLIPS = 64
TAIL_FRACTION = 0.25      # the damage lies in the last quarter of the file's records


class CorruptError(ValueError):
    """Nothing to corrupt (no entry log with records), or a bad argument."""


def newest_log(data_dir: str | Path) -> Path:
    """The newest entry log of a bookie's data dir that holds at least one record."""
    logs = sorted((p for p in (Path(data_dir) / "entrylogs").glob("*.log") if p.stem.isdigit()),
                  key=lambda p: int(p.stem), reverse=True)
    for p in logs:
        if p.stat().st_size > len(ELOG_MAGIC):
            return p
    raise CorruptError(f"no entry log with records under {Path(data_dir) / 'entrylogs'} (nothing checkpointed yet)")


def corrupt_entry_log(data_dir: str | Path, mode: str, draws: list[float], flips: int = 16) -> dict[str, Any]:
    """Damage the newest entry log of a stopped bookie: `truncate` cuts it at a point drawn (draws[0])
    in its last quarter; `bitflip` flips `flips` bits (at most MAX_FLIPS) at points drawn in its last
    quarter (draws[i] for flip i: at most one flip per draw). Returns {file, mode, size_before, size_after,
    offsets (truncate: [the cut]; bitflip: each flipped byte's offset and bit)}."""
    if mode not in MODES:
        raise CorruptError(f"unknown corruption mode {mode!r}; use one of {', '.join(MODES)}")
    if not draws or not all(0.0 <= d < 1.0 for d in draws):
        raise CorruptError("draws must be numbers in [0, 1)")
    path = newest_log(data_dir)
    size = path.stat().st_size
    body = size - len(ELOG_MAGIC)
    start = len(ELOG_MAGIC) + int(body * (1.0 - TAIL_FRACTION))
    span = max(1, size - start)
    out: dict[str, Any] = {"file": str(path), "mode": mode, "size_before": size}
    if mode == "truncate":
        cut = start + int(draws[0] * span)
        os.truncate(path, cut)
        out["offsets"] = [cut]
    else:
        n = max(1, min(int(flips), MAX_FLIPS, len(draws)))
        done = []
        with open(path, "r+b") as f:
            for d in draws[:n]:
                off = start + int(d * span)
                bit = int(d * 1_000_003) % 8
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ (1 << bit)]))
                done.append([off, bit])
            f.flush()
            os.fsync(f.fileno())
        out["offsets"] = done
    out["size_after"] = path.stat().st_size
    return out
