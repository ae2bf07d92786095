"""A plugin (PULSAR_CHAOS_PLUGINS) under which every `pulsar-chaos run` crashes (exit 255) right after
making its run folder and before deploying anything: a campaign must record each as crashed and go on."""
from __future__ import annotations

from harness import runner


def _crash(self) -> int:
    raise RuntimeError("a crash planted by tests/campaign/crashing_run.py")


runner.Run.execute = _crash  # type: ignore[method-assign]
