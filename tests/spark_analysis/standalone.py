"""A Spark standalone cluster on this machine for the tests: a master and workers started from the
installed pyspark's own classes (org.apache.spark.deploy.master.Master / worker.Worker through its
bin/spark-class), bound to 127.0.0.1, each in its own work folder; stopped by pid, with the executors
they started, and their folders removed, whatever happened."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

START_S = 90.0              # how long the master and its workers may take to come up (JVMs, 2 cores)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).resolve().parent


def children(pid: int) -> list[int]:
    """Every descendant of pid (an executor JVM a worker started), from /proc."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _is_executor(pid: int) -> bool:
    try:
        return b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class StandaloneCluster:
    def __init__(self, root: Path, workers: int = 2, worker_cores: int = 1, worker_memory: str = "1g"):
        self.root = Path(root)
        self.n_workers = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.port = free_port()
        self.ui_port = free_port()
        self.procs: list[subprocess.Popen] = []
        self.work_dirs: list[Path] = []
        self.logs: list[Path] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_DAEMON_MEMORY="256m", PYSPARK_PYTHON=sys.executable)
        env.pop("PYSPARK_GATEWAY_PORT", None)
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = self.root / f"{name}.log"
        self.logs.append(log)
        with open(log, "wb") as f:
            self.procs.append(subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=env,
                                               stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True))

    def start(self) -> "StandaloneCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        env = self._env()
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)], env)
        for i in range(self.n_workers):
            work = self.root / f"worker-{i}"
            local = work / "local"
            local.mkdir(parents=True)
            self.work_dirs.append(work)
            wenv = dict(env, SPARK_LOCAL_DIRS=str(local))
            self._spawn(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                                        "--port", str(free_port()), "--webui-port", str(free_port()),
                                        "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                                        "--work-dir", str(work)], wenv)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            for p, log in zip(self.procs, self.logs):
                if p.poll() is not None:
                    raise RuntimeError(f"{log.stem} exited with {p.returncode}: {self.tail(log)}")
            state = self.state()
            if state and state.get("aliveworkers", 0) >= self.n_workers:
                return self
            time.sleep(0.5)
        raise RuntimeError(f"the standalone cluster did not have {self.n_workers} workers in {START_S:g} s: "
                           f"{self.state()}; {self.tail(self.logs[0])}")

    def state(self) -> dict | None:
        """The master's JSON status (workers, applications), None if it does not answer yet."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def executor_dirs(self) -> list[Path]:
        """<work dir>/<app id>/<executor id> of every executor a worker ran."""
        return sorted(p for w in self.work_dirs if w.exists() for app in w.glob("app-*") for p in app.iterdir()
                      if p.is_dir())

    @staticmethod
    def tail(log: Path, n: int = 2000) -> str:
        try:
            return log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Workers first (with the executors they started), then the master, by pid: SIGTERM, then
        SIGKILL after 20 s; then their folders."""
        for p in reversed(self.procs):
            if p.poll() is not None:
                continue
            kids = [k for k in children(p.pid) if _is_executor(k)]
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=20)
            for k in kids:
                if not _is_executor(k):          # gone with its worker (its pid not yet reused)
                    continue
                try:
                    os.kill(k, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for w in self.work_dirs:
            shutil.rmtree(w, ignore_errors=True)
