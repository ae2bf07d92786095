"""Helpers for tests that run real bookie processes (`python -m clusters.node cfg.json`)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusters import config as node_config
from clusters.config import BookieConfig

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    return free_ports(1)[0]


_HANDED_OUT: set[int] = set()


def free_ports(n: int) -> list[int]:
    """n free ports on 127.0.0.1, distinct from each other and from every port handed out before in
    this process (a bookie binds its ports only when it starts, after its neighbours chose theirs)."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:      # every socket stays bound until the end, so none repeats
            if len(socks) > n + 64:
                raise RuntimeError("no free ports on 127.0.0.1")
            sock = socket.socket()
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if port not in _HANDED_OUT:
                ports.append(port)
        _HANDED_OUT.update(ports)
        return ports
    finally:
        for s in socks:
            s.close()


class BookieProc:
    """One bookie OS process; keeps its data dir and port across restarts."""

    def __init__(self, zk: str, base: Path, name: str, **settings):
        self.name = name
        self.dir = base / name
        self.dir.mkdir(parents=True, exist_ok=True)
        port, http_port = free_ports(2)
        self.cfg = BookieConfig(name=name, host="127.0.0.1", zk=zk, data_dir=str(self.dir / "data"),
                                port=port, **{"http_port": http_port, **settings})
        self.cfg_path = node_config.write(self.cfg, self.dir / "config.json")
        self.proc: subprocess.Popen | None = None
        self.log_path = self.dir / "bookie.log"

    @property
    def addr(self) -> str:
        return self.cfg.bookie_id

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, wait: bool = True) -> "BookieProc":
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "clusters.node", str(self.cfg_path)],
                                     cwd=str(REPO), env=env, stdout=log, stderr=log)
        log.close()
        if wait:
            self.wait_listening()
        return self

    def wait_listening(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bookie {self.name} exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                with socket.create_connection(("127.0.0.1", self.cfg.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"bookie {self.name} not listening:\n" + self.log_tail())

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Bookies:
    """Factory fixture value: start bookies; all are killed at teardown."""

    def __init__(self, zk: str, base: Path):
        self.zk = zk
        self.base = base
        self.procs: list[BookieProc] = []

    def start(self, n: int = 1, **settings) -> list[BookieProc]:
        new = [BookieProc(self.zk, self.base, f"bookie{len(self.procs) + i}", **settings)
               for i in range(n)]
        self.procs.extend(new)
        for b in new:
            b.start(wait=False)
        for b in new:
            b.wait_listening()
        return new

    def kill_all(self) -> None:
        for b in self.procs:
            try:
                b.kill9()
            except Exception:
                pass


@pytest.fixture
def bookies(zk, tmp_path):
    cluster = Bookies(zk, tmp_path)
    try:
        yield cluster
    finally:
        cluster.kill_all()
