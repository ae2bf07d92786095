"""A plugin (PULSAR_CHAOS_PLUGINS) under which every `pulsar-chaos run` interrupts the campaign that started it
(SIGTERM to its parent, as `kill` or a CI job's timeout would) right after making its run folder, deploying
nothing: the campaign stops the run, saves its folder and prints how to resume it. Not SIGINT: a campaign
started in the background by a non-interactive shell (as `make test` under CI may be) inherits SIGINT
ignored, and Python then keeps ignoring it."""
from __future__ import annotations

import os
import signal
import time

from harness import runner


def _interrupt(self) -> int:
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(30)                     # the campaign stops this run (SIGTERM) before it ends
    return 2


runner.Run.execute = _interrupt  # type: ignore[method-assign]
