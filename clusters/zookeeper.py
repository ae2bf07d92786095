"""Apache ZooKeeper from Debian's `zookeeper` package, configured and started by us.

Builds the zoo.cfg, myid and java command line for one ensemble member; a backend runs
that command on its host (a network namespace, a container, or plain loopback in tests).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Jars of Debian's zookeeper package (and its dependencies) that the server needs.
_JARS = (
    "zookeeper", "zookeeper-jute", "slf4j-api", "slf4j-simple", "netty-handler", "netty-common",
    "netty-buffer", "netty-transport", "netty-codec", "netty-resolver",
    "netty-transport-native-epoll", "netty-transport-native-unix-common", "metrics-core",
    "commons-cli", "snappy-java", "commons-io",
)
JAVA_DIR = Path("/usr/share/java")
CLIENT_PORT = 2181
PEER_PORT = 2888
ELECTION_PORT = 3888


class ZooKeeperMissing(RuntimeError):
    """Java or Debian's zookeeper package is not installed."""


def classpath() -> str:
    missing = [j for j in _JARS if not (JAVA_DIR / f"{j}.jar").exists()]
    if missing:
        raise ZooKeeperMissing(
            f"ZooKeeper jars missing from {JAVA_DIR}: {', '.join(missing)}; "
            "install them with `apt-get install zookeeper` (or run `make setup`)")
    return ":".join(str(JAVA_DIR / f"{j}.jar") for j in _JARS)


def java_binary() -> str:
    java = shutil.which("java")
    if not java:
        raise ZooKeeperMissing("java not found; install it with `apt-get install default-jre-headless`")
    return java


@dataclass
class ZooKeeperNode:
    """One member of a ZooKeeper ensemble: id, address, and where its files go."""
    myid: int
    host: str
    data_dir: Path
    client_port: int = CLIENT_PORT
    # (myid, host) of every member, this one included; empty or one entry means standalone
    ensemble: tuple[tuple[int, str], ...] = ()
    heap_mb: int = 192

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.client_port}"

    def write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            "tickTime=500",            # short ticks: sessions of 1-10 s, quick failure detection
            "initLimit=20",
            "syncLimit=10",
            "minSessionTimeout=1000",
            "maxSessionTimeout=30000",
            f"dataDir={self.data_dir}",
            f"clientPort={self.client_port}",
            f"clientPortAddress={self.host}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,stat,srvr,mntr",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
            "maxClientCnxns=0",
        ]
        if len(self.ensemble) > 1:
            lines.append("standaloneEnabled=false")
            for sid, host in self.ensemble:
                lines.append(f"server.{sid}={host}:{PEER_PORT}:{ELECTION_PORT}")
            (self.data_dir / "myid").write_text(f"{self.myid}\n")
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def command(self, java: str | None = None, cp: str | None = None) -> list[str]:
        """The argv that runs this member in the foreground (logs go to stdout/stderr). `java` and
        `cp`: the java binary and classpath where it will run (default: this host's, checked)."""
        cfg = self.write_config()
        return [java or java_binary(), f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Dzookeeper.jmx.log4j.disable=true", "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-cp", cp or classpath(), "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)]


def four_letter(host: str, port: int, word: str = "ruok", timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command and return the reply ('' if unreachable)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(word.encode())
            s.shutdown(socket.SHUT_WR)
            chunks = []
            while True:
                b = s.recv(4096)
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def is_serving(host: str, port: int) -> bool:
    """True once the member answers `srvr` as leader, follower or standalone."""
    reply = four_letter(host, port, "srvr")
    return "Mode:" in reply


def mode(host: str, port: int) -> str | None:
    for line in four_letter(host, port, "srvr").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


class LocalZooKeeper:
    """A standalone ZooKeeper on loopback in the current network namespace (tests, tools)."""

    def __init__(self, data_dir: Path, port: int | None = None, host: str = "127.0.0.1"):
        self.node = ZooKeeperNode(myid=1, host=host, data_dir=Path(data_dir), client_port=port or free_port(host))
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(data_dir) / "zookeeper.log"

    @property
    def connect_string(self) -> str:
        return self.node.connect_string

    def start(self, timeout: float = 30.0) -> "LocalZooKeeper":
        argv = self.node.command()
        self.node.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode}; see {self.log_path}")
            if is_serving(self.node.host, self.node.client_port):
                return self
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"ZooKeeper did not start within {timeout}s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def __enter__(self) -> "LocalZooKeeper":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def installed() -> bool:
    try:
        classpath()
        java_binary()
        return True
    except ZooKeeperMissing:
        return False


if __name__ == "__main__":  # pragma: no cover - manual check
    import tempfile
    with LocalZooKeeper(Path(tempfile.mkdtemp())) as zk:
        print("serving at", zk.connect_string, mode(zk.node.host, zk.node.client_port))
        os.system("sleep 1")
