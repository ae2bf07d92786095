"""The bookie settings a test run may set (`pulsar-chaos run --bookie-setting NAME=VALUE`), under
BookKeeper's ServerConfiguration names, and the BookieConfig fields (clusters/config.py) they set.

Only the settings a targeted scenario needs shorter than their defaults are here: `gcWaitTime`, the
interval of the bookie's garbage collection of deleted ledgers (clusters/bookie/gc.py; BookKeeper's
default, 10 minutes, would never run within a test).
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

# BookKeeper name -> (BookieConfig field, factor from BookKeeper's unit to the field's, type)
SETTINGS: dict[str, tuple[str, float, type]] = {
    "gcWaitTime": ("gc_wait_time_ms", 1.0, int),
}


def bookie_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`{BookKeeperName: value}` -> `{BookieConfig field: value}`. ValueError naming an unknown setting
    (and the nearest known one) or a value that is not a positive number."""
    out: dict[str, Any] = {}
    for name, raw in settings.items():
        if name not in SETTINGS:
            near = difflib.get_close_matches(name, SETTINGS, n=1, cutoff=0.0)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"unknown bookie setting {name!r}{hint} (known: {', '.join(SETTINGS)})")
        field, factor, kind = SETTINGS[name]
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"bookie setting {name}={raw!r} is not a number") from None
        if isinstance(raw, bool) or value <= 0 or (kind is int and value != int(value)):
            raise ValueError(f"bookie setting {name}={raw!r} must be a positive "
                             f"{'whole number' if kind is int else 'number'}")
        out[field] = kind(value * factor) if kind is int else value * factor
    return out
