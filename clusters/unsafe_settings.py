"""The reference system's unsafe settings: configurations a user may choose that BookKeeper documents as
able to lose acknowledged data. Like a bug knob set off its default, such a setting makes a run expected
invalid (`workloads.unsafe_causes`, core/expectation.py), and the detection matrix gives it its own row,
named by the setting (`journalSyncData=false`), whose false alarms are the same scenario's runs with
the safe value.

- `journalSyncData=false` (`pulsar-chaos run --bookie-setting journalSyncData=false`;
  clusters/bookie/settings.py): bookies acknowledge an add once the journal write is issued, before
  fsync; a power loss can lose acknowledged entries.
- an ack quorum of 1 (`--ack-quorum 1`; the row is named by the whole shape, `E/Qw/Qa=3/1/1`): an add is
  acknowledged with one copy on one bookie, so losing that bookie's disk loses acknowledged entries
  (BookKeeper's durability rests on Qa >= 2; its protocol doc: an entry acknowledged is on Qa bookies).
  A run that loses no disk does not expose it, but like a knob the setting makes every run of it
  expected invalid; a scenario that uses Qa = 1 for another purpose (the B12 knob's, BookKeeper's own
  example) declares its runs without the knob valid (`expected = "valid"` with the reason), and a run with
  a bug knob on counts on the knob's row alone (`workloads.unsafe_causes`), its shape kept in its scenario.

The scenario of a run with an unsafe setting is the one of the same run with the safe value
(`scenario_reset`: journalSyncData true, E/Qw/Qa at the spec's defaults), so a row's false alarms are
the runs of that configuration.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clusters.bookie import settings as bookie_settings


def _text(v: Any) -> str:
    return "true" if v is True else "false" if v is False else str(v)


JOURNAL_SYNC_REASON = ("bookies acknowledge an add once the journal write is issued, before fsync "
                       "(BookKeeper's journalSyncData=false: \"the possibility of data loss\"): a power loss "
                       "can lose acknowledged entries")


ACK_QUORUM_REASON = ("an add is acknowledged with one copy (ack quorum 1): losing that bookie's disk loses "
                     "acknowledged entries")
SHAPE = ("ensemble", "write_quorum", "ack_quorum")


def _shape_defaults() -> dict[str, Any]:
    from core.spec import TestSpec
    d = TestSpec()
    return {k: getattr(d, k) for k in SHAPE}


def _shape(spec: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    dflt = _shape_defaults()
    return tuple(spec.get(k, spec.get(k.replace("_", "-"), dflt[k])) for k in SHAPE)  # type: ignore


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def causes(spec: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(label, reason) of each unsafe setting a run's spec (a mapping of its test.toml fields) gives."""
    spec = spec or {}
    out = []
    for name, v in sorted(bookie_settings.unsafe(spec.get("bookie_settings")).items()):
        out.append((f"{name}={_text(v)}", JOURNAL_SYNC_REASON if name == "journalSyncData" else "unsafe setting"))
    e, w, a = _shape(spec)
    if _int(a) == 1:
        out.append((f"E/Qw/Qa={e}/{w}/{a}", ACK_QUORUM_REASON))
    return out


def scenario_reset(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the scenario of a run with unsafe settings takes instead of them, so that it matches the same
    scenario's runs with the safe values: {spec field: its value without the unsafe settings}."""
    spec = spec or {}
    out: dict[str, Any] = {}
    given = dict(spec.get("bookie_settings") or {})
    bad = bookie_settings.unsafe(given)
    if bad:
        out["bookie_settings"] = {k: v for k, v in given.items() if k not in bad}
    if _int(_shape(spec)[2]) == 1:
        out.update(_shape_defaults())
    return out
