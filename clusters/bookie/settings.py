"""The bookie settings a test run may set (`pulsar-chaos run --bookie-setting NAME=VALUE`), under
BookKeeper's ServerConfiguration names, and the BookieConfig fields (clusters/config.py) they set.

`journalSyncData` (default true: the journal is fsync'ed before an add is acknowledged) is the one a
scenario needs: false acknowledges after the journal write, before fsync, so a power loss can lose
acknowledged entries (BookKeeper's `setJournalSyncData` doc: "the possibility of data loss"). It is
therefore an unsafe setting: a run that sets it false is expected invalid and counts on its own row of
the detection matrix, `journalSyncData=false` (clusters/unsafe_settings.py). The bug knob
`bookie.ack_before_fsync` has the same effect under a knob's name.

`gcWaitTime` (ms; BookKeeper's default 10 minutes, which would never run within a test) is the interval of
the bookie's garbage collection of deleted ledgers (clusters/bookie/gc.py); any positive value is safe.
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

# BookKeeper name -> (BookieConfig field, type, safe value; None: every valid value is safe)
SETTINGS: dict[str, tuple[str, type, Any]] = {
    "journalSyncData": ("journal_sync_data", bool, True),
    "gcWaitTime": ("gc_wait_time_ms", int, None),
}
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def value(name: str, raw: Any) -> Any:
    """A setting's value from the spec or the flag (text or TOML), checked: ValueError if unknown or bad."""
    if name not in SETTINGS:
        near = difflib.get_close_matches(name, SETTINGS, n=1, cutoff=0.0)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ValueError(f"unknown bookie setting {name!r}{hint} (known: {', '.join(SETTINGS)})")
    _field, kind, _safe = SETTINGS[name]
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        low = str(raw).strip().lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError(f"bookie setting {name}={raw!r} must be true or false")
    try:
        number = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"bookie setting {name}={raw!r} is not a number") from None
    if isinstance(raw, bool) or number <= 0 or (kind is int and number != int(number)):
        raise ValueError(f"bookie setting {name}={raw!r} must be a positive "
                         f"{'whole number' if kind is int else 'number'}")
    return kind(number)


def bookie_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`{BookKeeperName: value}` -> `{BookieConfig field: value}`; ValueError naming a bad one."""
    out = {}
    for name, raw in (settings or {}).items():
        v = value(name, raw)                  # checks the name first
        out[SETTINGS[name][0]] = v
    return out


def unsafe(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings given off their safe value ({name: value}); unknown or bad ones are left out (the
    spec's validation names them)."""
    out = {}
    for name, raw in (settings or {}).items():
        try:
            v = value(name, raw)
        except ValueError:
            continue
        safe = SETTINGS[name][2]
        if safe is not None and v != safe:
            out[name] = v
    return out
