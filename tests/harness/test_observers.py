"""The runner finds observers through harness/observers.py's registry, and the bundle-owner observer
picks its source by the brokers' load manager (no checker's name is special)."""
from __future__ import annotations

from pathlib import Path

import pytest

import checkers
from core.history import Journal
from harness import observers


class _Stub:
    def __init__(self) -> None:
        self.stopped: str | None = None

    def stop(self, reason: str) -> None:
        self.stopped = reason


def test_every_observer_a_checker_names_is_registered():
    wanted = {o for c in checkers.REGISTRY.values() for o in c.observers}
    assert wanted and wanted <= set(observers.OBSERVERS)


def test_the_bundle_owner_source_follows_the_load_manager(tmp_path: Path):
    seen = []

    def source(ctx):
        seen.append(ctx.load_manager)
        return _Stub()
    observers.OWNER_SOURCES.register("test-lm", source)
    try:
        j = Journal(tmp_path / "o.jsonl", 0)
        ctx = observers.ObserverContext({"zk_connect": "127.0.0.1:1"}, "test-lm", j, tmp_path)
        running = observers.OBSERVERS["bundle-owner"].start(ctx)
        assert isinstance(running, _Stub) and seen == ["test-lm"]
        ctx = observers.ObserverContext({}, "no-such-lm", j, tmp_path)
        with pytest.raises(observers.ObserverError, match="no bundle-owner source for load manager 'no-such-lm'"):
            observers.OBSERVERS["bundle-owner"].start(ctx)
        j.close()
    finally:
        observers.OWNER_SOURCES.unregister("test-lm")


def test_the_modular_source_needs_a_zookeeper(tmp_path: Path):
    j = Journal(tmp_path / "o.jsonl", 0)
    try:
        with pytest.raises(observers.ObserverError, match="names no zk_connect"):
            observers.OBSERVERS["bundle-owner"].start(observers.ObserverContext({}, "", j, tmp_path))
    finally:
        j.close()
