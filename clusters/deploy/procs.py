"""Process control by recorded pid only: liveness that survives pid reuse, group signals, waiting.

A pid is trusted only together with its start time (field 22 of /proc/PID/stat), recorded at spawn.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable

# Children spawned by this process, so that their exit can be reaped (a zombie still "exists").
_children: dict[int, subprocess.Popen] = {}
_exited: list[subprocess.Popen] = []   # the last few reaped children, for their exit codes


def adopt(proc: subprocess.Popen) -> None:
    for pid in list(_children):      # reap exited children now and then, so no zombies pile up
        _reap(pid)
    _children[proc.pid] = proc


def _reap(pid: int) -> None:
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        _children.pop(pid, None)
        _exited.append(proc)
        del _exited[:-64]


def exit_code(pid: int | None) -> int | None:
    """The exit status of a child of this process that has ended (None if unknown)."""
    proc = _children.get(pid) if pid else None
    if proc is None:
        for p in list(_exited):
            if p.pid == pid:
                return p.returncode
        return None
    return proc.poll()


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'
    rest = raw[raw.rfind(")") + 2:].split()
    return rest  # rest[0] is field 3 (state); field N is rest[N - 3]


def start_time(pid: int) -> int | None:
    st = _stat(pid)
    return int(st[19]) if st else None


def state(pid: int | None, started: int | None = None) -> str:
    """'running', 'paused' (stopped by a signal) or 'dead' (gone, a zombie, or the pid was reused)."""
    if not pid:
        return "dead"
    proc = _children.get(pid)
    if proc is not None:
        # our child: waitpid is authoritative (it returns only once every thread has exited)
        if proc.poll() is not None:
            _reap(pid)
            return "dead"
        st = _stat(pid)
        return "paused" if st and st[0] in ("T", "t") else "running"
    st = _stat(pid)
    if st is None or (started is not None and int(st[19]) != started):
        return "dead"
    if st[0] in ("Z", "X", "x"):
        # a multithreaded process's leader is a zombie while its other threads (and its sockets)
        # are still being torn down: dead only once no other thread remains
        try:
            return "dead" if len(os.listdir(f"/proc/{pid}/task")) <= 1 else "running"
        except OSError:
            return "dead"
    return "paused" if st[0] in ("T", "t") else "running"


def alive(pid: int | None, started: int | None = None) -> bool:
    return state(pid, started) != "dead"


def netns_inode(ns: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{ns}").st_ino
    except OSError:
        return None


def in_netns(pid: int, ns: str) -> bool:
    """True if the process runs in the named network namespace (what `ip netns pids` checks)."""
    ino = netns_inode(ns)
    try:
        return ino is not None and os.stat(f"/proc/{pid}/ns/net").st_ino == ino
    except OSError:
        return False


def netns_pids(ns: str) -> list[int]:
    ino = netns_inode(ns)
    if ino is None:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == ino:
                    out.append(int(entry))
            except OSError:
                pass
    return out


def signal_group(pid: int, sig: int, started: int | None = None) -> bool:
    """Signal the process group led by pid, if that pid is still the process we started."""
    if not alive(pid, started):
        return False
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        os.kill(pid, sig)
        return True


def wait_state(pid: int, started: int | None, states: tuple[str, ...], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while (st := state(pid, started)) not in states and time.monotonic() < deadline:
        time.sleep(0.01)
    return st


def wait_dead(pids: Iterable[tuple[int, int | None]], timeout: float) -> list[tuple[int, int | None]]:
    """Wait until every (pid, start_time) is dead; return those still alive at the deadline."""
    pending = [p for p in pids if p[0]]
    deadline = time.monotonic() + timeout
    while pending:
        pending = [p for p in pending if alive(*p)]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return pending


def terminate(targets: list[tuple[int, int | None]], timeout: float = 10.0) -> None:
    """SIGTERM (and SIGCONT, in case they are paused) each group; SIGKILL the ones left after timeout."""
    for pid, started in targets:
        if signal_group(pid, signal.SIGTERM, started):
            signal_group(pid, signal.SIGCONT, started)
    left = wait_dead(targets, timeout)
    for pid, started in left:
        signal_group(pid, signal.SIGKILL, started)
    wait_dead(left, 5.0)
