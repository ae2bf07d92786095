"""Fake wall clocks for node processes: Debian's libfaketime (package `faketime`) preloaded, reading
a per-node offset file that `NetnsCluster.set_clock` rewrites while the node runs.

What the environment of a fake-clocked node sets, and why:

- `LD_PRELOAD=.../libfaketimeMT.so.1`: the thread-safe build (our nodes run an event loop thread
  and kazoo's threads); `libfaketime.so.1` if only that one is installed.
- `FAKETIME_TIMESTAMP_FILE=<node dir>/faketime.rc`: one line, the offset from true time (`+0`,
  `-12.5`); the library re-reads it, so a change reaches the running process.
- `FAKETIME_CACHE_DURATION=0`: the file is read again at the first clock call of every new
  second (libfaketime re-reads once the cache is *more than* this many seconds old), so a
  change applies within about a second, and there is no file read on every clock call.
- `FAKETIME_DONT_FAKE_MONOTONIC=1`: a real wall-clock step does not move CLOCK_MONOTONIC, and
  every timer of ours (asyncio, kazoo, retries) runs on it.
- `FAKETIME_FORCE_MONOTONIC_FIX=0`: with the fix on (libfaketime's default on glibc), the
  library rewrites the deadline of every pthread_cond_timedwait on a monotonic condition
  variable, and CPython's GIL waits on one: a thread waiting for the GIL then times out at once
  or far too late (measured: GIL hand-overs every 0.2 ms or every 250 ms instead of 5 ms).
- `NO_FAKE_STAT=1`: file times stay true (a real clock step does not rewrite the times of files
  written before it; CPython compares source and bytecode times on import).
- `PYTHONPATH=<this package>/faketime_site`: its `sitecustomize` works around libfaketime 0.9.10's
  clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) bug (wolfcw/libfaketime#426), which makes
  every `time.sleep()` of Python 3.11 fail with EINVAL when monotonic time is not faked.
"""
from __future__ import annotations

import glob
import math
import os
import sysconfig
from pathlib import Path

from clusters.deploy.backend import Unsupported

LIBRARIES = ("libfaketimeMT.so.1", "libfaketime.so.1")
SITE_DIR = Path(__file__).resolve().parent / "faketime_site"
CLOCK_FILE = "faketime.rc"          # in the node's directory
MAX_OFFSET_S = 10 * 365 * 86400.0   # ten years either way
ENV_OVERRIDE = "PULSAR_CHAOS_LIBFAKETIME"   # a libfaketime .so to use instead of the search


def _candidates() -> list[str]:
    dirs = []
    arch = sysconfig.get_config_var("MULTIARCH")
    for base in ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib"):
        if arch:
            dirs.append(f"{base}/{arch}/faketime")
        dirs.append(f"{base}/faketime")
    dirs.extend(sorted(glob.glob("/usr/lib/*/faketime")))
    return [os.path.join(d, lib) for lib in LIBRARIES for d in dict.fromkeys(dirs)]


def library() -> str:
    """The path of the libfaketime shared object to preload; Unsupported when none is installed."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        if not os.path.isfile(override):
            raise Unsupported(f"{ENV_OVERRIDE}={override} is not a file",
                              f"unset {ENV_OVERRIDE}, or point it at libfaketimeMT.so.1")
        return override
    for path in _candidates():
        if os.path.isfile(path):
            return path
    raise Unsupported("libfaketime not found: nodes with fake clocks (fake_clocks) run under it",
                      "apt-get install faketime")


def format_offset(offset_s: float) -> str:
    """The timestamp-file line for an offset: '+12.500000' / '-3.000000' (seconds, libfaketime's '+N')."""
    return f"{offset_s:+.6f}"


def check_offset(offset_s: float) -> float:
    try:
        value = float(offset_s)
    except (TypeError, ValueError):
        raise Unsupported(f"clock offset {offset_s!r} is not a number", "give seconds, e.g. 120 or -30.5") from None
    if not math.isfinite(value) or abs(value) > MAX_OFFSET_S:
        raise Unsupported(f"clock offset {offset_s!r} s is out of range",
                          f"give a finite number of seconds within +/- {MAX_OFFSET_S:.0f}")
    return value


def write_offset(path: Path, offset_s: float) -> None:
    """Replace the timestamp file atomically: the library never reads a half-written line (a file
    it cannot open would send it to ~/.faketimerc or /etc/faketimerc)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(format_offset(check_offset(offset_s)) + "\n")
    os.replace(tmp, path)


def ensure_file(node_dir: Path, offset_s: float = 0.0) -> Path:
    """The node's timestamp file, written with `offset_s` if it does not exist yet (a restarted
    node keeps the offset its clock had, as a machine's clock survives a process restart)."""
    path = Path(node_dir) / CLOCK_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_offset(path, offset_s)
    return path


def read_offset(path: Path) -> float | None:
    try:
        return float(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def environment(base: dict[str, str], clock_file: Path) -> dict[str, str]:
    """`base` plus what runs a process on the fake clock of `clock_file` (which must exist)."""
    lib = library()
    env = dict(base)
    env["LD_PRELOAD"] = lib + (" " + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env["FAKETIME_TIMESTAMP_FILE"] = str(clock_file)
    env["FAKETIME_CACHE_DURATION"] = "0"
    env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    env["FAKETIME_FORCE_MONOTONIC_FIX"] = "0"
    env["NO_FAKE_STAT"] = "1"
    env.pop("FAKETIME", None)                # would take precedence over the file
    env["PYTHONPATH"] = str(SITE_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
