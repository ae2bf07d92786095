"""The broker settings a test run may set (`pulsar-chaos run --broker-setting NAME=VALUE`), under
Pulsar's ServiceConfiguration names, and the BrokerConfig fields (clusters/config.py) they set.

Only the managed ledger's rollover and cursor settings are here: the ones a targeted scenario needs
shorter than their defaults (e.g. managedLedgerMaxLedgerRolloverTimeMinutes for the bug knob
broker.rollover_race_creates_two_ledgers). Load-balancer settings have their own table
(clusters/loadbalancer/settings.py, `--lb-setting`).
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

# Pulsar name -> (BrokerConfig field, factor from Pulsar's unit to the field's, type)
SETTINGS: dict[str, tuple[str, float, type]] = {
    "managedLedgerMaxLedgerRolloverTimeMinutes": ("max_ledger_age_s", 60.0, float),
    "managedLedgerMinLedgerRolloverTimeMinutes": ("min_ledger_rollover_s", 60.0, float),
    "managedLedgerMaxEntriesPerLedger": ("max_entries_per_ledger", 1.0, int),
    "managedLedgerMaxSizePerLedgerMbytes": ("max_ledger_size_mb", 1.0, int),
    "managedLedgerDefaultMarkDeleteRateLimit": ("cursor_mark_delete_rate", 1.0, float),
    "managedLedgerCursorMaxEntriesPerLedger": ("cursor_max_entries_per_ledger", 1.0, int),
    "managedLedgerCursorRolloverTimeInSeconds": ("cursor_ledger_rollover_s", 1.0, float),
}


def broker_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`{PulsarName: value}` -> `{BrokerConfig field: value}`. ValueError naming an unknown setting
    (and the nearest known one) or a value that is not a non-negative number."""
    out: dict[str, Any] = {}
    for name, raw in settings.items():
        if name not in SETTINGS:
            near = difflib.get_close_matches(name, SETTINGS, n=1, cutoff=0.0)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"unknown broker setting {name!r}{hint} (known: {', '.join(SETTINGS)})")
        field, factor, kind = SETTINGS[name]
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"broker setting {name}={raw!r} is not a number") from None
        if isinstance(raw, bool) or value < 0 or (kind is int and value != int(value)):
            raise ValueError(f"broker setting {name}={raw!r} must be a non-negative "
                             f"{'whole number' if kind is int else 'number'}")
        out[field] = kind(value * factor) if kind is int else value * factor
    return out
