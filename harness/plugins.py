"""Plugins: modules named in PULSAR_CHAOS_PLUGINS (comma-separated) are imported before a command
runs, in the CLI and in every worker process, so that a fault, workload or checker registered by a
module outside this tree is known by name (docs/extending.md)."""
from __future__ import annotations

import importlib
import os
import traceback

ENV = "PULSAR_CHAOS_PLUGINS"


class PluginError(Exception):
    """A plugin module that cannot be imported: the message names it, the cause and the fix."""


def names(value: str | None = None) -> list[str]:
    """The module names listed in `value` (default: the environment variable)."""
    raw = os.environ.get(ENV, "") if value is None else value
    return [n.strip() for n in raw.split(",") if n.strip()]


def load(value: str | None = None) -> list[str]:
    """Import every plugin module (once); returns their names. PluginError for one that fails."""
    loaded = []
    for name in names(value):
        try:
            importlib.import_module(name)
        except Exception as e:
            where = traceback.extract_tb(e.__traceback__)[-1]
            raise PluginError(f"{ENV} names {name!r}, which cannot be imported ({type(e).__name__}: {e}, at "
                              f"{where.filename}:{where.lineno}) (fix: put its folder on PYTHONPATH, correct "
                              f"the module, or drop it from {ENV})") from None
        loaded.append(name)
    return loaded
