"""Imported at start-up by Python processes that clusters/deploy/faketime.py runs on a fake clock
(this folder is first on their PYTHONPATH; a process without libfaketime is left alone).

libfaketime 0.9.10 (Debian's) rewrites the deadline of clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME, ...) as if it were a wall-clock time even when monotonic time is not faked, so the
kernel gets a negative time and every `time.sleep()` of Python 3.11 (which sleeps that way) fails
with EINVAL (wolfcw/libfaketime#426). When that is the case, `time.sleep` becomes a select()
with a relative timeout, which libfaketime passes through untouched: the same monotonic sleep.
It is replaced here, before any module binds `time.sleep` (kazoo's handlers and retries do).
"""
import os
import select
import time


def _select_sleep(secs):
    if secs < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], secs)       # PEP 475: resumed with the remaining time after a signal


def _broken_sleep():
    try:
        time.sleep(0)
    except OSError:
        return True
    return False


if "faketime" in os.environ.get("LD_PRELOAD", "") and _broken_sleep():
    _select_sleep.__doc__ = time.sleep.__doc__
    time.sleep = _select_sleep
