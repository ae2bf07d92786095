"""The one registry shape: a plain mapping from a name to a small declared entry.

Workloads (`workloads.REGISTRY`), checkers (`checkers.REGISTRY`) and faults (`nemesis.REGISTRY`) are
each a `Registry` of their own entry dataclass; a plugin adds to one with `register`.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Generic, TypeVar

E = TypeVar("E")


class UnknownName(KeyError):
    """A name no registry entry has; `problem` and `fix` make the one-line usage error."""

    def __init__(self, kind: str, name: object, known: Iterable[str]):
        self.kind, self.name = kind, name
        self.problem = f"unknown {kind} {name!r}"
        self.fix = f"use one of {', '.join(known) or '(none registered)'}"
        super().__init__(f"{self.problem} (fix: {self.fix})")

    def __str__(self) -> str:             # KeyError would quote the whole message
        return str(self.args[0])


class Registry(dict[str, E], Generic[E]):
    """Name -> entry, in registration order (the order of `--help`). Reading an unknown name raises
    `UnknownName` (a KeyError) naming the known ones; `register` refuses to overwrite by accident."""

    def __init__(self, kind: str, entries: Mapping[str, E] | None = None):
        super().__init__()
        self.kind = kind
        for name, entry in (entries or {}).items():
            self.register(name, entry)

    def register(self, name: str, entry: E, *, replace: bool = False) -> E:
        """Add `entry` under `name` (a plugin's way in); ValueError if taken, unless `replace`."""
        if not isinstance(name, str) or not name or any(c in name for c in ":, \t\n"):
            raise ValueError(f"a {self.kind} name must be a word without ':', ',' or spaces, not {name!r}")
        if name in self and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered; pass replace=True to override it")
        self[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove `name` (tests that register an entry take it out again)."""
        self.pop(name, None)

    def __missing__(self, name: str) -> E:
        raise UnknownName(self.kind, name, self)

    def names(self) -> tuple[str, ...]:
        return tuple(self)
