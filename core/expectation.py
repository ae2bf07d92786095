"""A run's expectation: valid, or invalid because something unsafe is on purpose (a bug knob, a
workload's deliberately unsafe option), with the reason; and whether a verdict met it.

The unsafe things are declared where they live (`clusters.bugs.REGISTRY`, each workload module's
`UNSAFE`); this module only combines those declarations, so the runner, `check`, `report`, the
campaign runner and the Spark analysis all judge a run the same way.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

VALID = "valid"
INVALID = "invalid"
EXPECTATIONS = (VALID, INVALID)


@dataclass(frozen=True)
class Unsafe:
    """A workload's deliberately unsafe setting: the options that make it (each a value, or a predicate
    on the option's value), why the run must then be invalid, and a short label (e.g. `cas=unsafe`).
    `given`: options it needs that are part of the scenario rather than of the setting (matched the same
    way; the detection matrix compares the run with the same scenario's runs that have them)."""
    when: Mapping[str, Any]
    reason: str
    label: str = ""
    given: Mapping[str, Any] = field(default_factory=dict)

    def applies(self, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> bool:
        for k, want in {**self.given, **self.when}.items():
            v = options.get(k, defaults.get(k))
            if not (want(v) if callable(want) else v == want):
                return False
        return True

    def name(self) -> str:
        return self.label or ",".join(f"{k}={_text(v)}" for k, v in self.when.items())


@dataclass(frozen=True)
class Cause:
    """One reason a run is expected invalid: `kind` "bug knob", "option" or "unsafe setting" (the cluster's,
    clusters/unsafe_settings.py), `label` its row name in the
    detection table (`broker.recovery_fencing=false`, `register:cas=unsafe`), `reason` the declaration's text."""
    kind: str
    label: str
    reason: str

    def text(self) -> str:
        return f"{self.kind} {self.label}: {self.reason}"


@dataclass(frozen=True)
class Expectation:
    expected: str = VALID                          # "valid" or "invalid"
    causes: tuple[Cause, ...] = field(default_factory=tuple)
    declared: str = ""                             # the spec's own reason when it declared the expectation

    @property
    def reason(self) -> str:
        if self.declared:
            return self.declared
        return "; ".join(c.text() for c in self.causes) or "no bug knob or unsafe option is on"

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.causes]


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def knob_label(key: str, value: Any) -> str:
    """A knob set to a value, as the detection tables name it: `broker.recovery_fencing=false`."""
    return f"{key}={_text(value)}"


def causes(bugs: Mapping[str, Any] | None, knobs: Mapping[str, Any], workload: str,
           options: Mapping[str, Any] | None, unsafe: Iterable[Unsafe],
           option_defaults: Mapping[str, Any]) -> list[Cause]:
    """Every reason a configuration must be invalid: each bug knob set to another value than its safe
    default (`knobs`: name -> an entry with `default` and `help`; an unknown knob counts as unsafe), each
    of the workload's `unsafe` settings that applies."""
    out = []
    for k, v in sorted((bugs or {}).items()):
        entry = knobs.get(k)
        if entry is None or v != entry.default:
            out.append(Cause("bug knob", knob_label(k, v), entry.help if entry is not None else "unknown knob"))
    for u in unsafe:
        if u.applies(options or {}, option_defaults):
            out.append(Cause("option", f"{workload}:{u.name()}", u.reason))
    return out


def expectation(found: list[Cause], declared: str = "", declared_reason: str = "") -> Expectation:
    """The expectation: the spec's own (`declared`, with its reason) when it gives one, else invalid if
    anything unsafe is on."""
    if declared:
        return Expectation(declared, tuple(found), declared_reason or "declared in the test spec")
    return Expectation(INVALID if found else VALID, tuple(found))


def met(expected: str | None, valid: Any) -> bool | None:
    """Whether a verdict met the expectation: None when the verdict is unknown (neither met nor missed)."""
    if valid is True:
        return expected != INVALID
    if valid is False:
        return expected == INVALID
    return None


def met_word(m: bool | None) -> str:
    return "met" if m is True else "NOT met" if m is False else "undecided (verdict unknown)"


Predicate = Callable[[Any], bool]


def nonzero(v: Any) -> bool:
    """A predicate for `Unsafe.when`: the option is set to a non-zero number."""
    return bool(v) and v != 0
