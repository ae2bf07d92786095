"""The network-namespace backend: one namespace per node on a private bridge, faults by signal and iptables.

Every pid, namespace, link and host rule is recorded in <base_dir>/state.json before or as it is
created, so `down()` from any process, or `cleanup_all()` after a killed run, can remove it all.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from clusters import config as node_config
from clusters import zookeeper
from clusters.deploy import health as health_checks
from clusters.deploy import delay, faketime, hostnet, procs
from clusters.deploy import statefile
from clusters.deploy.backend import HOST, Cluster, ClusterError, Grudge, Node, Unsupported, grudge_edges
from clusters.deploy.statefile import StateInventory
from clusters.deploy.statefile import flock as _flock
from clusters.deploy.statefile import last_line as _last_line
from clusters.deploy.statefile import now as _now
from clusters.deploy.statefile import write_json_atomic as _write_json_atomic
from clusters.deploy.spec import DEPLOY_BROKER_DEFAULTS, ROOT, ClusterSpec

STATE_VERSION = 1
CHAIN = "PCHAOS"                       # iptables chain inside each node namespace, jumped from INPUT and OUTPUT
# last octet of each role's first address (host .1); ClusterSpec caps the counts so blocks never overlap
ADDRESS_BASE = {"zookeeper": 10, "bookie": 20, "broker": 60, "client": 100}
VETH_CODE = {"zookeeper": "z", "bookie": "k", "broker": "b", "client": "c"}
ROLE_STOP_ORDER = (("broker", "client"), ("bookie",), ("zookeeper",))
PORTS = {
    "zookeeper": {"client": zookeeper.CLIENT_PORT, "peer": zookeeper.PEER_PORT,
                  "election": zookeeper.ELECTION_PORT},
    "bookie": {"bookie": 3181, "http": 8000},
    "broker": {"pulsar": 6650, "http": 8080},
    "client": {},
}

Command = Callable[[Node], list[str]]


def short_id(name: str) -> str:
    """<= 6 chars of [a-z0-9] naming a cluster's links and namespaces (pc-<id>-...)."""
    alnum = re.sub(r"[^a-z0-9]", "", name.lower())
    if len(name) <= 6 and name == alnum:
        return name
    return alnum[:3] + hashlib.sha1(name.encode()).hexdigest()[:3]




def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterError("network namespaces and iptables need root",
                           "run as root, e.g. `sudo pulsar-chaos ...`")


def require_tools() -> None:
    for tool, pkg in (("ip", "iproute2"), ("iptables", "iptables"), ("iptables-restore", "iptables")):
        if not hostnet.have(tool):
            raise ClusterError(f"{tool} not found", f"apt-get install {pkg}")






def _read_state(path: Path) -> dict[str, Any] | None:
    return statefile.read_state(path, "run `pulsar-chaos cluster down --force` to clean up by name prefix")




def _default_command(node: Node) -> list[str]:
    return [sys.executable, "-m", "clusters.node", str(node.config)]


class NetnsCluster(StateInventory, Cluster):
    """A cluster whose nodes are network namespaces on a bridge `pc-<id>-br` of the host."""

    def __init__(self, spec: ClusterSpec, *, commands: dict[str, Command] | None = None,
                 health: dict[str, health_checks.HealthCheck] | None = None,
                 start_timeout: float = 60.0, stop_timeout: float = 10.0):
        self.spec = spec.validate()
        self.name = spec.name
        self.id = short_id(spec.name)
        self.base_dir = Path(spec.base_dir)
        self.state_path = self.base_dir / "state.json"
        self.commands: dict[str, Command] = {"bookie": _default_command, "broker": _default_command,
                                             **(commands or {})}
        self.health = {**health_checks.DEFAULT, **(health or {})}
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._txn_depth = 0
        self._txn_state: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._atexit_registered = False
        self._claimed = False

    # ---------------------------------------------------------------- naming and attaching
    @classmethod
    def attach(cls, name: str, root: Path = ROOT, **kw: Any) -> "NetnsCluster":
        """A handle on an existing cluster (started by this or another process) from its state.json."""
        state = _read_state(Path(root) / name / "state.json")
        if state is None:
            raise ClusterError(f"cluster {name!r} is not up",
                               f"start it with `pulsar-chaos cluster up --name {name}`"
                               if name != "default" else "start it with `pulsar-chaos cluster up`")
        spec = ClusterSpec.from_json(state["spec"])
        return cls(spec, **kw)

    @property
    def bridge(self) -> str:
        return f"{hostnet.PREFIX}{self.id}-br"

    def _namespace(self, node_name: str) -> str:
        return f"{hostnet.PREFIX}{self.id}-{node_name}"

    def _veth(self, role: str, index: int) -> str:
        name = f"{hostnet.PREFIX}{self.id}-{VETH_CODE[role]}{index}"
        assert len(name) <= 15, name
        return name

    # ---------------------------------------------------------------- state
    @contextlib.contextmanager
    def _txn(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write state.json under a file lock (re-entrant within this object)."""
        with self._lock:
            if self._txn_depth:
                self._txn_depth += 1
                try:
                    yield self._txn_state  # type: ignore[misc]
                finally:
                    self._txn_depth -= 1
                return
            with _flock(self.base_dir / ".state.lock"):
                state = _read_state(self.state_path)
                if state is None:
                    raise ClusterError(f"cluster {self.name!r} is not up", "start it with `pulsar-chaos cluster up`")
                self._txn_depth, self._txn_state = 1, state
                try:
                    yield state
                finally:
                    self._txn_depth, self._txn_state = 0, None
                    _write_json_atomic(self.state_path, state)

    def _state(self) -> dict[str, Any]:
        state = _read_state(self.state_path)
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not up", "start it with `pulsar-chaos cluster up`"
                               + ("" if self.name == "default" else f" --name {self.name}"))
        return state

    def _plan(self, subnet: str) -> dict[str, Any]:
        net = subnet.rsplit(".", 1)[0]
        nodes: dict[str, Any] = {}
        for name, role, index in self.spec.layout():
            node_dir = self.base_dir / "nodes" / name
            nodes[name] = {
                "name": name, "role": role, "index": index,
                "host": f"{net}.{ADDRESS_BASE[role] + index}",
                "namespace": self._namespace(name), "veth": self._veth(role, index), "netns_ino": None,
                "ports": dict(PORTS[role]),
                "dir": str(node_dir), "log": str(node_dir / "node.log"), "data_dir": str(node_dir / "data"),
                "config": None, "argv": None, "pid": None, "pid_start": None, "started_at": None,
            }
        return {
            "version": STATE_VERSION, "name": self.name, "id": self.id, "status": "starting",
            "created_at": _now(), "owner_pid": os.getpid(), "owner_start": procs.start_time(os.getpid()),
            "detached": False, "base_dir": str(self.base_dir), "spec": self.spec.to_json(),
            "subnet": subnet, "host_address": f"{net}.1",
            "bridge": {"name": self.bridge, "address": f"{net}.1/24"},
            "host_rules": [], "nodes": nodes, "clients": [], "drops": [], "flaky": [], "slow": [],
        }

    # ---------------------------------------------------------------- inventory
    def _node_of(self, n: dict[str, Any]) -> Node:
        st = procs.state(n["pid"], n["pid_start"]) if n["pid"] else "dead"
        return Node(name=n["name"], role=n["role"], host=n["host"], pid=n["pid"], ports=dict(n["ports"]),
                    log=Path(n["log"]), data_dir=Path(n["data_dir"]),
                    config=Path(n["config"]) if n["config"] else None, namespace=n["namespace"],
                    alive=st != "dead", paused=st == "paused")

    def nodes(self, role: str | None = None) -> list[Node]:
        state = self._state()
        return [self._node_of(n) for n in state["nodes"].values() if role is None or n["role"] == role]

    def status(self) -> dict[str, Any]:
        state = _read_state(self.state_path)
        if state is None:
            return {"name": self.name, "status": "absent", "base_dir": str(self.base_dir)}
        nodes = []
        for n in state["nodes"].values():
            node = self._node_of(n)
            d = node.to_json()
            d["state"] = "paused" if node.paused else "running" if node.alive else (
                "never started" if n["role"] != "client" and not n["pid"] else "dead")
            if n["role"] == "client":
                d["state"] = "no process"
            nodes.append(d)
        brokers = [n for n in state["nodes"].values() if n["role"] == "broker"]
        return {
            "name": state["name"], "id": state["id"], "status": state["status"], "backend": "netns",
            "base_dir": state["base_dir"], "state_file": str(self.state_path),
            "service_url": "pulsar://" + ",".join(f"{n['host']}:{n['ports']['pulsar']}" for n in brokers)
            if brokers else "",
            "admin_urls": [f"http://{n['host']}:{n['ports']['http']}" for n in brokers],
            "zk_connect": ",".join(f"{n['host']}:{n['ports']['client']}" for n in state["nodes"].values()
                                   if n["role"] == "zookeeper"),
            "subnet": state["subnet"], "host_address": state["host_address"], "bridge": state["bridge"]["name"],
            "spec": state["spec"], "nodes": nodes,
            "partitions": state["drops"], "flaky": state["flaky"], "slow": state.get("slow", []),
            "clients": [{**c, "alive": procs.alive(c["pid"], c["pid_start"])} for c in state["clients"]],
        }

    # ---------------------------------------------------------------- lifecycle
    def up(self) -> "NetnsCluster":
        require_root()
        require_tools()
        try:
            zookeeper.classpath()
            zookeeper.java_binary()
        except zookeeper.ZooKeeperMissing as ex:
            raise ClusterError(str(ex)) from None
        self._claimed = False
        try:
            self._create()
            self._start_all()
            with self._txn() as state:
                state["status"] = "up"
                state["up_at"] = _now()
        except BaseException:
            if self._claimed:         # never tear down a cluster this call did not create
                self.down()
            raise
        return self

    def detach(self) -> None:
        """Leave the cluster running after this process exits (the CLI's `cluster up`)."""
        if self._atexit_registered:
            atexit.unregister(self._atexit_down)
            self._atexit_registered = False
        with self._txn() as state:
            state["detached"] = True

    def _atexit_down(self) -> None:
        try:
            self.down()
        except Exception as ex:  # pragma: no cover - best effort at interpreter exit
            print(f"pulsar-chaos: cleanup of cluster {self.name!r} failed: {ex}", file=sys.stderr)

    def _create(self) -> None:
        """Claim the name, pick a subnet, create the bridge, host rules and one namespace per node."""
        with _flock(ROOT / ".alloc.lock"):
            old = _read_state(self.state_path)
            if old is not None:
                if old.get("status") != "down" and _present(old):
                    raise ClusterError(f"cluster {self.name!r} is already up (base dir {self.base_dir})",
                                       "take it down with `pulsar-chaos cluster down"
                                       + ("" if self.name == "default" else f" --name {self.name}")
                                       + "`, or choose another --name")
                _teardown(old, force=True)
            others = [s for s in _all_states() if s["name"] != self.name]
            for s in others:
                if s.get("id") == self.id and s.get("status") != "down" and _present(s):
                    raise ClusterError(f"cluster {s['name']!r} uses the same short id {self.id!r}",
                                       "choose another --name")
            # leftovers of a killed run of this very name (no state, or a state we just tore down)
            _sweep(ids={self.id})
            if self.base_dir.exists() and not self.base_dir.is_symlink():
                # a fresh cluster: the previous run of this name leaves its logs only until now
                shutil.rmtree(self.base_dir / "nodes", ignore_errors=True)
            self.base_dir.mkdir(parents=True, exist_ok=True)
            default_home = ROOT / self.name
            if self.base_dir.resolve() != default_home.resolve():
                # keep every state.json findable from ROOT for cleanup_all()
                if default_home.is_symlink() or not default_home.exists():
                    default_home.unlink(missing_ok=True)
                    default_home.symlink_to(self.base_dir.resolve())
            reserved = [s["subnet"] for s in others if s.get("status") != "down" and s.get("subnet")]
            if self.spec.subnet:
                if not hostnet.subnet_free(self.spec.subnet, reserved):
                    raise ClusterError(f"subnet {self.spec.subnet} is already routed on this host",
                                       "omit --subnet to pick a free one")
                subnet = self.spec.subnet
            else:
                subnet = hostnet.pick_subnet(reserved)
            state = self._plan(subnet)
            _write_json_atomic(self.state_path, state)
            self._claimed = True
            if not self._atexit_registered:
                atexit.register(self._atexit_down)
                self._atexit_registered = True
            br = state["bridge"]
            hostnet.run(["ip", "link", "add", "name", br["name"], "type", "bridge"])
            hostnet.run(["ip", "addr", "add", br["address"], "dev", br["name"]])
            hostnet.run(["ip", "link", "set", br["name"], "up"])
        # From here the route exists, so no other cluster can pick this subnet: release the alloc lock.
        b = state["bridge"]["name"]
        # With br_netfilter on, bridged packets traverse the host's FORWARD chain (Docker sets it to
        # DROP): accept node<->node traffic, forward nothing between the bridge and any other
        # interface, and let nodes reach the host. Inserted at the top, so the accept goes last.
        for chain, args in (("FORWARD", ["-o", b, "-j", "DROP"]), ("FORWARD", ["-i", b, "-j", "DROP"]),
                            ("FORWARD", ["-i", b, "-o", b, "-j", "ACCEPT"]),
                            ("INPUT", ["-i", b, "-j", "ACCEPT"])):
            rule = hostnet.host_rule(chain, args, self.id)
            with self._txn() as st:
                st["host_rules"].append(rule)
            hostnet.add_host_rule(rule)
        for name in state["nodes"]:
            self._create_host(name)

    def _create_host(self, name: str) -> None:
        with self._txn() as state:
            n = state["nodes"][name]
            bridge = state["bridge"]["name"]
        ns, veth = n["namespace"], n["veth"]
        run = hostnet.run
        run(["ip", "netns", "add", ns])
        with self._txn() as state:
            state["nodes"][name]["netns_ino"] = procs.netns_inode(ns)
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(["ip", "link", "set", veth, "master", bridge, "up"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "addr", "add", f"{n['host']}/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        # no default route: a node can reach its peers and the host's bridge address, nothing else
        run(["ip", "netns", "exec", ns, "iptables-restore"], input=(
            "*filter\n"
            f":{CHAIN} - [0:0]\n"
            f"-A INPUT -j {CHAIN}\n"
            f"-A OUTPUT -j {CHAIN}\n"
            "COMMIT\n"))
        Path(n["data_dir"]).mkdir(parents=True, exist_ok=True)
        if n["role"] in self.spec.lazy_disks:
            self._mount_lazy(name)

    def _mount_lazy(self, name: str) -> None:
        """Mount lazyfs (clusters/deploy/lazyfs.py) at the node's data dir, backed by <node dir>/disk;
        its daemon (a child of this process, in the host's namespaces) is recorded in the node's
        state entry under "lazyfs" before we wait for the mount."""
        from clusters.deploy import lazyfs
        with self._txn() as state:
            n = state["nodes"][name]
            node_dir, mnt = Path(n["dir"]), Path(n["data_dir"])
            backing = node_dir / "disk"
            backing.mkdir(parents=True, exist_ok=True)
            sock = node_dir / "lazyfs.sock"
            if len(str(sock)) > 100:          # AF_UNIX paths are limited to 108 bytes
                sock = ROOT.parent / "lazyfs" / f"{self.id}-{name}.sock"
                sock.parent.mkdir(parents=True, exist_ok=True)
            log_path = node_dir / "lazyfs.log"
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(lazyfs.command(backing, mnt, sock, fsname=f"{hostnet.PREFIX}{self.id}-{name}"),
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=str(node_dir), start_new_session=True)
            procs.adopt(proc)
            started = procs.start_time(proc.pid)
            n["lazyfs"] = {"pid": proc.pid, "pid_start": started, "control": str(sock),
                           "mountpoint": str(mnt), "backing": str(backing), "log": str(log_path)}
        try:
            lazyfs.wait_ready(mnt, sock, timeout=30.0, alive=lambda: procs.alive(proc.pid, started))
        except lazyfs.LazyFSError as e:
            last = _last_line(log_path)
            raise ClusterError(f"{name}: {e}" + (f": {last}" if last else ""),
                               f"read {log_path}; lazy disks need /dev/fuse, libfuse2 and fusepy (`make setup`)") from None

    def _start_all(self) -> None:
        state = self._state()
        zks = [n for n in state["nodes"].values() if n["role"] == "zookeeper"]
        ensemble = tuple((n["index"], n["host"]) for n in zks) if len(zks) > 1 else ()
        zk_connect = ",".join(f"{n['host']}:{n['ports']['client']}" for n in zks)
        spec = self.spec
        for role in ("zookeeper", "bookie", "broker"):
            names = [n["name"] for n in state["nodes"].values() if n["role"] == role]
            for name in names:
                n = state["nodes"][name]
                if role == "zookeeper":
                    zkn = zookeeper.ZooKeeperNode(myid=n["index"], host=n["host"], data_dir=Path(n["data_dir"]),
                                                  client_port=n["ports"]["client"], ensemble=ensemble)
                    argv = zkn.command()           # writes zoo.cfg (and myid) into the data dir
                    config = str(Path(n["data_dir"]) / "zoo.cfg")
                else:
                    config = str(Path(n["dir"]) / "config.json")
                    common = dict(name=name, host=n["host"], zk=zk_connect, data_dir=n["data_dir"],
                                  bugs=dict(spec.bugs))
                    if role == "bookie":
                        cfg: node_config.NodeConfig = node_config.BookieConfig(
                            port=n["ports"]["bookie"], http_port=n["ports"]["http"],
                            **{**common, **spec.bookie_config})
                    else:
                        cfg = node_config.BrokerConfig(port=n["ports"]["pulsar"], http_port=n["ports"]["http"],
                                                       ensemble=spec.ensemble, write_quorum=spec.write_quorum,
                                                       ack_quorum=spec.ack_quorum,
                                                       **{**common, **DEPLOY_BROKER_DEFAULTS, **spec.broker_config})
                    node_config.write(cfg, Path(config))
                    n["config"] = config
                    argv = self.commands[role](self._node_of(n))
                with self._txn() as st:
                    st["nodes"][name]["config"] = config
                    st["nodes"][name]["argv"] = argv
                self._spawn(name)
            self._wait_healthy(names)

    def _spawn(self, name: str) -> None:
        with self._txn() as state:
            n = state["nodes"][name]
            if not n["argv"]:
                raise ClusterError(f"{name} runs no process ({n['role']})")
            log_path = Path(n["log"])
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as log:
                log.write(f"=== pulsar-chaos {_now()}: starting {name} in {n['namespace']}\n".encode())
                log.flush()
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                if n["role"] in self.spec.fake_clocks:      # its wall clock follows set_clock()
                    n["clock_offset"] = n.get("clock_offset") or 0.0   # a restart keeps the offset
                    n["clock_file"] = str(faketime.ensure_file(Path(n["dir"]), n["clock_offset"]))
                    env = faketime.environment(env, Path(n["clock_file"]))
                proc = subprocess.Popen(["ip", "netns", "exec", n["namespace"], *n["argv"]],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=n["dir"], env=env, start_new_session=True)
            procs.adopt(proc)
            n["pid"], n["pid_start"], n["started_at"] = proc.pid, procs.start_time(proc.pid), _now()

    def _wait_healthy(self, names: Iterable[str], timeout: float | None = None) -> None:
        pending = list(names)
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while pending:
            state = self._state()
            for name in list(pending):
                node = self._node_of(state["nodes"][name])
                if not node.alive:
                    code = procs.exit_code(node.pid)
                    last = _last_line(node.log)
                    raise ClusterError(f"{name} exited" + (f" with code {code}" if code is not None else "")
                                       + " while starting" + (f": {last}" if last else ""),
                                       f"read its log: {node.log}")
                if self.health[node.role](node):
                    pending.remove(name)
            if not pending:
                return
            if time.monotonic() > deadline:
                logs = ", ".join(state["nodes"][n]["log"] for n in pending)
                raise ClusterError(f"{', '.join(pending)} not healthy within {timeout or self.start_timeout:.0f}s",
                                   f"read {logs}")
            time.sleep(0.2)

    def down(self) -> None:
        """Stop every process, delete namespaces, links and host rules. Idempotent; logs and data stay."""
        if self._atexit_registered:
            atexit.unregister(self._atexit_down)
            self._atexit_registered = False
        if not self.state_path.exists():
            return
        with self._lock:
            try:
                with _flock(self.base_dir / ".state.lock"):
                    state = _read_state(self.state_path)
                    if state is None:
                        return
                    _teardown(state, force=False, stop_timeout=self.stop_timeout)
                    _write_json_atomic(self.state_path, state)
            except FileNotFoundError:
                return

    @classmethod
    def cleanup_all(cls, force: bool = True, names: Iterable[str] | None = None,
                    root: Path = ROOT) -> dict[str, Any]:
        """Remove leftovers of killed runs: clusters from every state.json under root (or only `names`)
        and any namespace, link or host rule carrying our prefix (or those clusters' ids).

        force=False spares clusters that look alive (up and detached, or their owner still runs).
        Kills only recorded pids that still run inside our namespaces. Returns what it removed."""
        require_root()
        wanted = set(names) if names is not None else None
        report: dict[str, Any] = {"clusters": [], "namespaces": [], "links": [], "host_rules": 0,
                                  "left_running": {}}
        spared: set[str] = set()
        ids: set[str] = set()
        for state_path in sorted(Path(root).glob("*/state.json")):
            try:
                state = _read_state(state_path)
            except ClusterError:
                continue
            if not state or (wanted is not None and state.get("name") not in wanted):
                continue
            ids.add(state["id"])
            if not force and _looks_alive(state):
                spared.add(state["id"])
                continue
            with _flock(state_path.parent / ".state.lock"):
                if state.get("status") != "down" or _present(state):
                    report["clusters"].append(state["name"])
                    left = _teardown(state, force=True)
                    report["left_running"].update(left)
                    _write_json_atomic(state_path, state)
        if wanted is not None:
            ids |= {short_id(n) for n in wanted}
            swept = _sweep(ids=ids)
        else:
            swept = _sweep(ids=None, spare=spared)
        for k in ("namespaces", "links"):
            report[k].extend(swept[k])
        report["host_rules"] += swept["host_rules"]
        report["left_running"].update(swept["left_running"])
        return report

    # ---------------------------------------------------------------- process faults
    def start(self, name: str, wait: bool = True, timeout: float | None = None) -> Node:
        with self._txn() as state:
            n = self._entry(state, name)
            if n["role"] == "client":
                raise ClusterError(f"{name} is a client host; it runs no node process", "use run_client()")
            if procs.alive(n["pid"], n["pid_start"]):
                raise ClusterError(f"{name} is already running (pid {n['pid']})",
                                   "stop or kill it first, or resume it if paused")
            if not procs.netns_inode(n["namespace"]):
                raise ClusterError(f"cluster {self.name!r} is not up (no namespace {n['namespace']})",
                                   "start it with `pulsar-chaos cluster up`")
            self._spawn(name)
        if wait:
            self._wait_healthy([name], timeout)
        return self.node(name)

    def _process(self, name: str) -> tuple[int, int | None]:
        n = self._entry(self._state(), name)
        if n["role"] == "client":
            raise ClusterError(f"{name} is a client host; it runs no node process")
        if not procs.alive(n["pid"], n["pid_start"]):
            raise ClusterError(f"{name} is not running", f"start it with `pulsar-chaos cluster start {name}`")
        return n["pid"], n["pid_start"]

    def stop(self, name: str, timeout: float | None = None) -> None:
        procs.terminate([self._process(name)], timeout if timeout is not None else self.stop_timeout)

    def kill(self, name: str) -> None:
        pid, started = self._process(name)
        procs.signal_group(pid, signal.SIGKILL, started)
        procs.wait_dead([(pid, started)], 5.0)

    def power_loss(self, names: Iterable[str]) -> dict[str, Any]:
        """Cut the power of these nodes at once: freeze their lazyfs mounts (writes wait), SIGKILL every
        named node's process group, `crash` each mount (what was not fsync'ed is gone; the held writes
        fail), wait until the processes are dead, thaw the mounts. Nodes already dead lose their
        un-fsync'ed writes too. They stay down until start(). Returns {node: {"dropped_bytes",
        "dropped_files", "removed_files", "pid"}} (pid: the process killed, or None)."""
        from clusters.deploy import lazyfs
        from clusters.deploy.backend import Unsupported
        names = list(dict.fromkeys(names))
        if not names:
            raise ClusterError("power_loss needs at least one node name")
        state = self._state()
        entries = [self._entry(state, name) for name in names]
        bare = [n for n in entries if not (n.get("lazyfs") or {}).get("pid")]
        if bare:
            roles = sorted({n["role"] for n in bare})
            raise Unsupported(f"{', '.join(n['name'] for n in bare)}: no lazy disk, so a power loss cannot drop "
                              "un-fsync'ed writes", f"deploy with ClusterSpec(lazy_disks={roles!r}) (the runner "
                              "does it when the power-loss nemesis is in the run)")
        down = [n["name"] for n in entries if not procs.alive(n["lazyfs"]["pid"], n["lazyfs"]["pid_start"])]
        if down:
            raise ClusterError(f"the lazyfs daemon of {', '.join(down)} is not running",
                               "take the cluster down and up again")
        socks = {n["name"]: n["lazyfs"]["control"] for n in entries}
        victims = {n["name"]: (n["pid"], n["pid_start"]) for n in entries
                   if n["pid"] and procs.alive(n["pid"], n["pid_start"])}
        frozen: list[str] = []
        try:
            for name in names:
                lazyfs.control(socks[name], "freeze")
                frozen.append(name)
        except lazyfs.LazyFSError as e:
            for name in frozen:
                with contextlib.suppress(lazyfs.LazyFSError):
                    lazyfs.control(socks[name], "thaw")
            raise ClusterError(f"power loss not applied: {e}", "check the node's lazyfs.log") from None
        for pid, started in victims.values():            # all at once: nothing runs between the kills
            procs.signal_group(pid, signal.SIGKILL, started)
        out: dict[str, Any] = {}
        errors = []
        for name in names:
            try:
                r = lazyfs.control(socks[name], "crash")
                out[name] = {"dropped_bytes": r["dropped_bytes"], "dropped_files": r["dropped_files"],
                             "removed_files": r["removed_files"], "pid": victims.get(name, (None,))[0]}
            except lazyfs.LazyFSError as e:
                errors.append(f"{name}: {e}")
        left = procs.wait_dead(list(victims.values()), 10.0)
        for name in names:
            with contextlib.suppress(lazyfs.LazyFSError):
                lazyfs.control(socks[name], "thaw")
        if left:
            errors.append(f"pids {[p for p, _ in left]} still alive 10 s after SIGKILL")
        if errors:
            raise ClusterError("power loss incomplete: " + "; ".join(errors), "check the nodes' lazyfs.log")
        return out

    def wipe(self, name: str) -> dict[str, Any]:
        """Delete everything a stopped node wrote into its data dir (a bookie's journal, entry logs
        and index; ZooKeeper's snapshots and logs), keeping its identity: the node dir, config.json,
        node.log, and ZooKeeper's zoo.cfg and myid (which live in its data dir). The next start()
        begins empty under the same name, address and id. Returns what was deleted."""
        with self._txn() as state:
            n = self._entry(state, name)
            if n["role"] == "client":
                raise ClusterError(f"{name} is a client host; it has no data to wipe")
            if n["pid"] and procs.alive(n["pid"], n["pid_start"]):
                raise ClusterError(f"{name} is running (pid {n['pid']}); its data cannot be wiped under it",
                                   f"kill or stop it first (`pulsar-chaos cluster kill {name}`)")
            wiped = statefile.wipe_data_dir(n)
        return {"node": name, **wiped}

    def pause(self, name: str) -> None:
        pid, started = self._process(name)
        procs.signal_group(pid, signal.SIGSTOP, started)
        procs.wait_state(pid, started, ("paused", "dead"), 2.0)   # signal delivery is asynchronous

    def resume(self, name: str) -> None:
        pid, started = self._process(name)
        procs.signal_group(pid, signal.SIGCONT, started)
        procs.wait_state(pid, started, ("running", "dead"), 2.0)

    # ---------------------------------------------------------------- network faults
    def _resolve_edges(self, state: dict[str, Any], edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """Validate names and move `host` to the right: (host, b) becomes (b, host) (drops are symmetric)."""
        known = set(state["nodes"]) | {HOST}
        out = []
        for a, b in edges:
            for x in (a, b):
                if x not in known:
                    raise ClusterError(f"unknown node {x!r} in partition",
                                       "use node names from `pulsar-chaos cluster status` (or 'host')")
            if a == HOST:
                a, b = b, a
            if a == HOST:
                continue
            out.append((a, b))
        return out

    def _address(self, state: dict[str, Any], name: str) -> str:
        return state["host_address"] if name == HOST else state["nodes"][name]["host"]

    def _apply_rules(self, state: dict[str, Any], rules: dict[str, list[str]]) -> None:
        for name, lines in rules.items():
            if not lines:
                continue
            ns = state["nodes"][name]["namespace"]
            hostnet.run(["ip", "netns", "exec", ns, "iptables-restore", "--noflush", "-w", "5"],
                        input="*filter\n" + "".join(line + "\n" for line in lines) + "COMMIT\n")

    @staticmethod
    def _drop_rules(ip: str, op: str = "-A") -> list[str]:
        return [f"{op} {CHAIN} -s {ip}/32 -j DROP", f"{op} {CHAIN} -d {ip}/32 -j DROP"]

    def partition(self, grudge: Grudge) -> None:
        """Each drop edge is counted per call (state `drop_counts`), so that `unpartition` of one of
        two overlapping partitions keeps the links the other still cuts."""
        with self._txn() as state:
            edges = sorted(set(self._resolve_edges(state, grudge_edges(grudge))))
            rules: dict[str, list[str]] = {}
            for a, b in statefile.count_drops(state, edges, +1):
                rules.setdefault(a, []).extend(self._drop_rules(self._address(state, b)))
            self._apply_rules(state, rules)

    def unpartition(self, grudge: Grudge) -> None:
        with self._txn() as state:
            edges = sorted(set(self._resolve_edges(state, grudge_edges(grudge))))
            rules: dict[str, list[str]] = {}
            for a, b in statefile.count_drops(state, edges, -1):
                rules.setdefault(a, []).extend(self._drop_rules(self._address(state, b), "-D"))
            self._apply_rules(state, rules)

    def _link(self, state: dict[str, Any], src: str, dst: str, what: str) -> tuple[str, str]:
        """One link (a, b) of two different nodes; `host` goes right (its rules live in a's namespace)."""
        (a, b), = self._resolve_edges(state, {(src, dst)}) or [(None, None)]
        if a is None or a == b:
            raise ClusterError(f"{what} needs two different nodes, got {src!r} and {dst!r}")
        return a, b

    @staticmethod
    def _flaky_rules(ip: str, p: float, op: str = "-A") -> list[str]:
        stat = f"-m statistic --mode random --probability {p:.6f}"
        return [f"{op} {CHAIN} -s {ip}/32 {stat} -j DROP", f"{op} {CHAIN} -d {ip}/32 {stat} -j DROP"]

    def flaky(self, src: str, dst: str, p: float) -> None:
        if not 0.0 < p <= 1.0:
            raise ClusterError(f"drop probability {p} out of range", "use 0 < p <= 1")
        with self._txn() as state:
            a, b = self._link(state, src, dst, "flaky")
            self._apply_rules(state, {a: self._flaky_rules(self._address(state, b), p)})
            state["flaky"].append([a, b, p])

    def unflaky(self, src: str, dst: str, p: float) -> None:
        """Delete the two rules of one earlier flaky(src, dst, p) (iptables -D: the same rule text);
        a no-op when heal() removed them meanwhile."""
        with self._txn() as state:
            a, b = self._link(state, src, dst, "unflaky")
            for i, (x, y, q) in enumerate(state["flaky"]):
                if (x, y) == (a, b) and f"{q:.6f}" == f"{p:.6f}":
                    self._apply_rules(state, {a: self._flaky_rules(self._address(state, b), q, "-D")})
                    del state["flaky"][i]
                    return

    # slow links: an NFQUEUE delay daemon per slow() call (clusters/deploy/delay.py)
    def slow(self, src: str, dst: str, delay_ms: float) -> None:
        d = delay.check_delay(delay_ms)
        with self._txn() as state:
            a, b = self._link(state, src, dst, "slow")
            n = state["nodes"][a]
            state["slow_seq"] = queue = state.get("slow_seq", 0) + 1      # NFQUEUE numbers, never reused
            base = Path(n["dir"]) / f"delay-q{queue}"
            ready, log_path = base.with_suffix(".ready"), base.with_suffix(".log")
            ready.unlink(missing_ok=True)
            entry = {"src": a, "dst": b, "delay_ms": d, "queue": queue, "namespace": n["namespace"],
                     "netns_ino": n["netns_ino"], "pid": None, "pid_start": None, "log": str(log_path),
                     "rules": delay.rules(self._address(state, b), queue)}
            state.setdefault("slow", []).append(entry)              # recorded before it exists
            delay.ensure_chain(n["namespace"])
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(["ip", "netns", "exec", n["namespace"],
                                         *delay.argv(queue, d, n["namespace"], ready)],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            procs.adopt(proc)
            entry["pid"], entry["pid_start"] = proc.pid, procs.start_time(proc.pid)
            try:
                delay.wait_ready(lambda: procs.alive(entry["pid"], entry["pid_start"]), ready, log_path)
            except BaseException:
                procs.terminate([(entry["pid"], entry["pid_start"])], 2.0)
                state["slow"].remove(entry)
                raise
            ready.unlink(missing_ok=True)
            self._apply_rules(state, {a: entry["rules"]})

    def unslow(self, src: str, dst: str, delay_ms: float) -> None:
        """Undo one earlier slow(src, dst, delay_ms): delete its two rules, end its daemon (which lets
        what it holds go at once); a no-op when heal() undid it meanwhile."""
        with self._txn() as state:
            a, b = self._link(state, src, dst, "unslow")
            links = state.get("slow", [])
            for i, e in enumerate(links):
                if (e["src"], e["dst"]) == (a, b) and float(e["delay_ms"]) == float(delay_ms):
                    self._end_slow(state, [e])
                    del links[i]
                    return

    def _end_slow(self, state: dict[str, Any], links: list[dict[str, Any]]) -> None:
        present = set(hostnet.netns_list())
        for e in links:
            if e["namespace"] in present:
                deletes = [r.replace("-A ", "-D ", 1) for r in e["rules"]]
                hostnet.run(["ip", "netns", "exec", e["namespace"], "iptables-restore", "--noflush", "-w", "5"],
                            input="*filter\n" + "".join(r + "\n" for r in deletes) + "COMMIT\n", check=False)
        procs.terminate([(e["pid"], e["pid_start"]) for e in links
                         if e.get("pid") and _ours(e["pid"], e["pid_start"], e["namespace"], e.get("netns_ino"))],
                        5.0)

    def set_clock(self, name: str, offset_s: float) -> None:
        """Write the node's libfaketime offset file (atomically); its process reads it within ~1 s."""
        with self._txn() as state:
            n = self._entry(state, name)
            if n["role"] not in self.spec.fake_clocks:
                raise Unsupported(f"{name} runs on the true clock: this cluster fakes the clocks of "
                                  f"{', '.join(self.spec.fake_clocks) or 'no role'}",
                                  f"deploy with ClusterSpec(fake_clocks=[..., {n['role']!r}])")
            path = Path(n.get("clock_file") or Path(n["dir"]) / faketime.CLOCK_FILE)
            faketime.write_offset(path, offset_s)
            n["clock_file"], n["clock_offset"] = str(path), float(offset_s)

    def heal(self) -> None:
        with self._txn() as state:
            present = set(hostnet.netns_list())
            for n in state["nodes"].values():
                if n["namespace"] in present:
                    hostnet.run(["ip", "netns", "exec", n["namespace"], "iptables", "-w", "5", "-F", CHAIN])
            state["drops"], state["flaky"], state["drop_counts"] = [], [], {}
            self._end_slow(state, state.get("slow", []))
            state["slow"] = []
            if state.get("slow_seq"):          # also rules a killed slow() call may have left
                for n in state["nodes"].values():
                    if n["namespace"] in present:
                        hostnet.run(["ip", "netns", "exec", n["namespace"], "iptables", "-w", "5", "-F",
                                     delay.CHAIN], check=False)

    def exec(self, name: str, argv: list[str], timeout: float = 30.0,
             **run_kw: Any) -> subprocess.CompletedProcess:
        """Run a short command on a node's host (its namespace) and wait for it: for probes."""
        n = self._entry(self._state(), name)
        return subprocess.run(["ip", "netns", "exec", n["namespace"], *argv], timeout=timeout,
                              capture_output=True, text=True, **run_kw)

    # ---------------------------------------------------------------- clients
    def run_client(self, argv: list[str], node: str | None = None, **popen_kw: Any) -> subprocess.Popen:
        """Run argv in a client host's namespace (client-1 unless `node` names another), in its own
        session; stdout/stderr go to that host's node.log unless popen_kw says otherwise."""
        with self._txn() as state:
            if node is None:
                clients = [n for n in state["nodes"].values() if n["role"] == "client"]
                if not clients:
                    raise ClusterError("this cluster has no client host", "create it with clients >= 1")
                n = clients[0]
            else:
                n = self._entry(state, node)
            popen_kw.setdefault("start_new_session", True)
            popen_kw.setdefault("stdin", subprocess.DEVNULL)
            log = None
            if "stdout" not in popen_kw:       # by default a client's output goes to its host's log
                Path(n["log"]).parent.mkdir(parents=True, exist_ok=True)
                log = popen_kw["stdout"] = open(n["log"], "ab")
                popen_kw.setdefault("stderr", subprocess.STDOUT)
            try:
                proc = subprocess.Popen(["ip", "netns", "exec", n["namespace"], *argv], **popen_kw)
            finally:
                if log is not None:
                    log.close()
            procs.adopt(proc)
            state["clients"] = [c for c in state["clients"] if procs.alive(c["pid"], c["pid_start"])]
            state["clients"].append({"node": n["name"], "pid": proc.pid, "pid_start": procs.start_time(proc.pid),
                                     "argv": list(argv), "namespace": n["namespace"],
                                     "netns_ino": n["netns_ino"]})
        return proc


# -------------------------------------------------------------------- teardown, shared by down and cleanup

def _all_states(root: Path = ROOT) -> list[dict[str, Any]]:
    out = []
    for p in sorted(Path(root).glob("*/state.json")):
        try:
            s = _read_state(p)
        except ClusterError:
            continue
        if s:
            out.append(s)
    return out


def _present(state: dict[str, Any]) -> bool:
    """Does anything of this cluster still exist on the host?"""
    if hostnet.link_exists(state["bridge"]["name"]):
        return True
    spaces = set(hostnet.netns_list())
    for n in state["nodes"].values():
        if n["namespace"] in spaces or (n["pid"] and procs.alive(n["pid"], n["pid_start"])):
            return True
    return False


def _looks_alive(state: dict[str, Any]) -> bool:
    if state.get("status") == "down":
        return False
    if state.get("detached") and state.get("status") == "up":
        return _present(state)
    return procs.alive(state.get("owner_pid"), state.get("owner_start"))


def _ours(pid: int, started: int | None, namespace: str, ino: int | None) -> bool:
    """A recorded pid we may signal: same process (start time) and inside that node's namespace."""
    if not procs.alive(pid, started):
        return False
    if procs.in_netns(pid, namespace):
        return True
    try:
        return ino is not None and os.stat(f"/proc/{pid}/ns/net").st_ino == ino
    except OSError:
        return False


def _stop_lazy_disks(nodes: Iterable[dict[str, Any]], timeout: float) -> None:
    """End the recorded lazyfs daemons (by pid and start time; SIGTERM unmounts) once the node
    processes are stopped, then detach any of their mounts still there."""
    from clusters.deploy import lazyfs
    lazy = [n["lazyfs"] for n in nodes if n.get("lazyfs")]
    daemons = [(d["pid"], d["pid_start"]) for d in lazy if d.get("pid") and procs.alive(d["pid"], d["pid_start"])]
    if daemons:
        procs.terminate(daemons, timeout)
    for d in lazy:
        lazyfs.unmount(d["mountpoint"])


def _teardown(state: dict[str, Any], force: bool, stop_timeout: float = 10.0) -> dict[str, list[int]]:
    """Stop the recorded processes, delete links, namespaces, bridge and host rules; mark the state down.

    Returns processes left running in our namespaces that we did not start (namespace -> pids)."""
    state["status"] = "stopping"
    nodes = state["nodes"]
    for roles in ROLE_STOP_ORDER:
        targets = []
        for n in nodes.values():
            if n["role"] in roles and n["pid"] and _ours(n["pid"], n["pid_start"], n["namespace"], n["netns_ino"]):
                targets.append((n["pid"], n["pid_start"]))
        if "client" in roles:
            targets += [(c["pid"], c["pid_start"]) for c in state.get("clients", [])
                        if _ours(c["pid"], c["pid_start"], c["namespace"], c.get("netns_ino"))]
            targets += [(e["pid"], e["pid_start"]) for e in state.get("slow", [])          # delay daemons
                        if e.get("pid") and _ours(e["pid"], e["pid_start"], e["namespace"], e.get("netns_ino"))]
        if targets:
            procs.terminate(targets, 3.0 if force else stop_timeout)
    _stop_lazy_disks(nodes.values(), 3.0 if force else stop_timeout)
    left: dict[str, list[int]] = {}
    spaces = set(hostnet.netns_list())
    links = set(hostnet.link_names())
    for n in nodes.values():
        if n["veth"] in links:
            hostnet.run(["ip", "link", "del", n["veth"]], check=False)
        if n["namespace"] in spaces:
            stray = procs.netns_pids(n["namespace"])
            if stray:
                left[n["namespace"]] = stray
            hostnet.run(["ip", "netns", "del", n["namespace"]], check=False)
    if state["bridge"]["name"] in links:
        hostnet.run(["ip", "link", "del", state["bridge"]["name"]], check=False)
    for rule in state.get("host_rules", []):
        hostnet.delete_host_rule(rule)
    for rule in hostnet.tagged_host_rules(state["id"]):
        hostnet.delete_host_rule(rule)
    state["status"] = "down"
    state["down_at"] = _now()
    state["drops"], state["flaky"], state["drop_counts"] = [], [], {}
    state["slow"] = []
    if left:
        state["left_running"] = left
    return left


def _sweep(ids: set[str] | None, spare: set[str] = frozenset()) -> dict[str, Any]:
    """Delete namespaces, links and host rules carrying our prefix (of the given cluster ids, or all
    but `spare`). Processes are never killed here: unrecorded pids are only reported."""
    def mine(name: str) -> bool:
        if not name.startswith(hostnet.PREFIX):
            return False
        cid = name[len(hostnet.PREFIX):].split("-", 1)[0]
        return (cid in ids) if ids is not None else (cid not in spare)

    out: dict[str, Any] = {"namespaces": [], "links": [], "host_rules": 0, "left_running": {}}
    for link in hostnet.link_names():
        if mine(link) and not link.endswith("-br"):
            hostnet.run(["ip", "link", "del", link], check=False)
            out["links"].append(link)
    for ns in hostnet.netns_list():
        if mine(ns):
            stray = procs.netns_pids(ns)
            if stray:
                out["left_running"][ns] = stray
            hostnet.run(["ip", "netns", "del", ns], check=False)
            out["namespaces"].append(ns)
    for link in hostnet.link_names():
        if mine(link):
            hostnet.run(["ip", "link", "del", link], check=False)
            out["links"].append(link)
    for rule in hostnet.tagged_host_rules():
        cid = rule[rule.index("--comment") + 1][len(hostnet.RULE_TAG):]
        if (cid in ids) if ids is not None else (cid not in spare):
            hostnet.delete_host_rule(rule)
            out["host_rules"] += 1
    from clusters.deploy import lazyfs
    for m in lazyfs.mounts():             # lazyfs mounts are named pc-<id>-<node>; their daemons
        if mine(m["source"]):             # exit once unmounted
            lazyfs.unmount(m["mountpoint"])
            out.setdefault("mounts", []).append(m["mountpoint"])
    return out
