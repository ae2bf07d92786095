"""One deployment lifecycle for every backend: a cluster recorded in its state.json, with the steps all
backends share (claim, up and undo, down, cleanup, faults) and the hooks each implements for its hosts.

A backend subclasses `StateFileCluster` and fills in the hooks (marked "hook" below): create the network
and the hosts, spawn and signal a node's process, load a host's drop rules, stop and remove what it
created, sweep what a killed run left, and say whether anything of a cluster is still there.
"""
from __future__ import annotations

import abc
import atexit
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from clusters import config as node_config
from clusters import zookeeper
from clusters.deploy import health as health_checks
from clusters.deploy import backends, hostnet, procs, statefile
from clusters.deploy.backend import HOST, Cluster, ClusterError, Grudge, Node, grudge_edges
from clusters.deploy.spec import DEPLOY_BROKER_DEFAULTS, ROOT, ClusterSpec
from clusters.deploy.statefile import StateInventory

STATE_VERSION = 1
CHAIN = "PCHAOS"                       # iptables chain in each node's network namespace, jumped from INPUT and OUTPUT
ALLOC_LOCK = ROOT / ".alloc.lock"      # one lock for every backend: their subnets come from one pool
# a label kept in each cluster's state.json: whoever set it (the test suite) finds the folders it made
OWNER_TAG_ENV = "PULSAR_CHAOS_OWNER_TAG"
# last octet of each role's first address (host .1); ClusterSpec caps the counts so blocks never overlap
ADDRESS_BASE = {"zookeeper": 10, "bookie": 20, "broker": 60, "client": 100}
START_ORDER = ("zookeeper", "bookie", "broker", "client")
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
    """<= 6 chars of [a-z0-9] naming a cluster's links, namespaces and bridge (pc-<id>-..., pcd-<id>)."""
    alnum = re.sub(r"[^a-z0-9]", "", name.lower())
    if len(name) <= 6 and name == alnum:
        return name
    return alnum[:3] + hashlib.sha1(name.encode()).hexdigest()[:3]


@dataclass
class Seen:
    """What a backend sees of one node now (hook `_seen`)."""
    alive: bool = False             # its process exists and has not exited (a paused one is alive)
    paused: bool = False
    pid: int | None = None          # the process as the backend knows it; None: never started
    exit_code: int | None = None    # once it has exited, when known
    host: bool = True               # the node's host (namespace, container) exists
    word: str = "dead"              # what `status()` says of it when it is not alive


def _connmark(peer: str, trigger_hex: str) -> str:
    """The connection mark of one armed one-way cut (nonzero, 32 bits, from the peer and the trigger)."""
    return f"{int(hashlib.sha1(f'{peer}|{trigger_hex}'.encode()).hexdigest()[:8], 16) | 1:#x}"


class StateFileCluster(StateInventory, Cluster):
    """A cluster whose every host, process and fault is recorded in <base_dir>/state.json before it is
    created, so that `down()` from any process, or `cleanup_all()` after a killed run, removes it all."""

    backend: ClassVar[str]          # its name in the registry (clusters/deploy/backends.py)
    root: ClassVar[Path]            # <root>/<name>/state.json for every cluster of the backend
    host_key: ClassVar[str]         # the node entry's field naming its host (also `Node.namespace`)
    root_needed_for: ClassVar[str]  # said when not root
    python: ClassVar[str] = sys.executable     # the Python on the hosts (node commands, exec probes)
    java: ClassVar[str | None] = None          # ZooKeeper's java and classpath on the hosts (None: this host's)
    zk_classpath: ClassVar[str | None] = None
    client_argv: ClassVar[list[str] | None] = None     # what a client host runs (None: nothing)

    def __init__(self, spec: ClusterSpec, *, commands: dict[str, Command] | None = None,
                 health: dict[str, health_checks.HealthCheck] | None = None,
                 start_timeout: float = 60.0, stop_timeout: float = 10.0):
        if Path(spec.base_dir) == ROOT / spec.name:      # the default: the backend's own root
            spec.base_dir = self.root / spec.name
        self.spec = spec.validate()
        self.name = spec.name
        self.id = short_id(spec.name)
        self.base_dir = Path(spec.base_dir)
        self.state_path = self.base_dir / "state.json"
        self.commands: dict[str, Command] = {"bookie": self._default_command, "broker": self._default_command,
                                             **(commands or {})}
        self.health = {**health_checks.DEFAULT, **(health or {})}
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._txn_depth = 0
        self._txn_state: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._atexit_registered = False
        self._claimed = False

    def _default_command(self, node: Node) -> list[str]:
        return [self.python, "-m", "clusters.node", str(node.config)]

    # ---------------------------------------------------------------- prerequisites
    @classmethod
    def require(cls) -> None:
        """What any command on this backend's hosts needs (root; a backend may add, e.g. its engine)."""
        if os.geteuid() != 0:
            raise ClusterError(f"the {cls.backend} backend needs root ({cls.root_needed_for})",
                               "run as root, e.g. `sudo pulsar-chaos ...`")

    @classmethod
    def preflight(cls) -> None:
        """Everything `up()` needs that no cluster creates (root, tools, ZooKeeper's jars...), checked
        before anything is created; a ClusterError naming the fix."""
        cls.require()

    def _prepare(self) -> None:
        """The first step of `up()`: this cluster's prerequisites (the backend's preflight by default)."""
        self.preflight()

    @classmethod
    def for_run(cls, spec: ClusterSpec, run_dir: Path) -> "StateFileCluster":
        """A cluster for a harness run whose client processes read and write `run_dir`."""
        return cls(spec)

    # ---------------------------------------------------------------- naming, messages, attaching
    @classmethod
    def _cli(cls, verb: str, name: str = "default", *args: str) -> str:
        """The `pulsar-chaos cluster VERB` command line for this backend and cluster, for fix hints."""
        flags = ("" if cls.backend == backends.DEFAULT else f" --backend {cls.backend}") + (
            "" if name == "default" else f" --name {name}")
        return f"`pulsar-chaos cluster {verb}{flags}{''.join(' ' + a for a in args)}`"

    @classmethod
    def _label(cls) -> str:
        return "cluster" if cls.backend == backends.DEFAULT else f"{cls.backend} cluster"

    @classmethod
    def _not_up_error(cls, name: str, detail: str = "") -> ClusterError:
        return ClusterError(f"{cls._label()} {name!r} is not up" + (f" ({detail})" if detail else ""),
                            f"start it with {cls._cli('up', name)}")

    @classmethod
    def _read(cls, path: Path) -> dict[str, Any] | None:
        return statefile.read_state(path, f"run {cls._cli('down --force')} to remove what is marked ours")

    @classmethod
    def attach(cls, name: str, root: Path | None = None, **kw: Any) -> "StateFileCluster":
        """A handle on an existing cluster (started by this or another process) from its state.json."""
        state = cls._read(Path(root or cls.root) / name / "state.json")
        if state is None:
            raise cls._not_up_error(name)
        return cls(ClusterSpec.from_json(state["spec"]), **{**cls._attach_kwargs(state), **kw})

    @classmethod
    def _attach_kwargs(cls, state: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments `attach` takes from the state (e.g. the image it runs)."""
        return {}

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
            with statefile.flock(self.base_dir / ".state.lock"):
                state = self._read(self.state_path)
                if state is None:
                    raise self._not_up_error(self.name)
                self._txn_depth, self._txn_state = 1, state
                try:
                    yield state
                finally:
                    self._txn_depth, self._txn_state = 0, None
                    statefile.write_json_atomic(self.state_path, state)

    def _state(self) -> dict[str, Any]:
        state = self._read(self.state_path)
        if state is None:
            raise self._not_up_error(self.name)
        return state

    @classmethod
    def states(cls, root: Path | None = None) -> list[tuple[Path, dict[str, Any]]]:
        """(path, state) of every readable state.json under the backend's root (corrupt ones skipped)."""
        out = []
        for p in sorted(Path(root or cls.root).glob("*/state.json")):
            with contextlib.suppress(ClusterError):
                if (s := cls._read(p)) is not None:
                    out.append((p, s))
        return out

    @classmethod
    def status_of(cls, state: dict[str, Any]) -> str:
        """The state's status (starting, up, stopping, down), or `gone` when it says the cluster exists
        but nothing of it is on the host any more (a killed run's state)."""
        status = state.get("status", "?")
        return status if status == "down" or cls.is_present(state) else "gone"

    @classmethod
    def known(cls, root: Path | None = None) -> list[dict[str, Any]]:
        """One row per cluster of this backend on this host: name, backend, status, subnet, base_dir."""
        rows = []
        for _, s in cls.states(root):
            try:
                status = cls.status_of(s)
            except ClusterError:          # the backend cannot look (e.g. no docker): say so, list the rest
                status = "unknown"
            rows.append({"name": s["name"], "backend": cls.backend, "status": status,
                         "subnet": s.get("subnet"), "base_dir": s.get("base_dir")})
        return rows

    def state_status(self) -> str:
        """This cluster's `status_of` its state."""
        return self.status_of(self._state())

    def _plan(self, subnet: str) -> dict[str, Any]:
        net = subnet.rsplit(".", 1)[0]
        nodes: dict[str, Any] = {}
        for name, role, index in self.spec.layout():
            node_dir = self.base_dir / "nodes" / name
            nodes[name] = {
                "name": name, "role": role, "index": index, "host": f"{net}.{ADDRESS_BASE[role] + index}",
                **self._plan_node(name, role, index), "ports": dict(PORTS[role]),
                "dir": str(node_dir), "log": str(node_dir / "node.log"), "data_dir": str(node_dir / "data"),
                "config": None, "argv": None, "pid": None, "started_at": None,
            }
        return {
            "version": STATE_VERSION, "backend": self.backend, "name": self.name, "id": self.id,
            "status": "starting", "created_at": statefile.now(), "owner_pid": os.getpid(),
            "owner_start": procs.start_time(os.getpid()), "owner_tag": os.environ.get(OWNER_TAG_ENV),
            "detached": False, "base_dir": str(self.base_dir),
            "spec": self.spec.to_json(), "subnet": subnet, "host_address": f"{net}.1",
            **self._plan_cluster(subnet), "nodes": nodes, "clients": [], "drops": [], "drop_counts": {},
            "flaky": [],
        }

    # ---------------------------------------------------------------- inventory
    def _node_of(self, n: dict[str, Any], seen: Seen) -> Node:
        return Node(name=n["name"], role=n["role"], host=n["host"], pid=seen.pid, ports=dict(n["ports"]),
                    log=Path(n["log"]), data_dir=Path(n["data_dir"]),
                    config=Path(n["config"]) if n["config"] else None, namespace=n[self.host_key],
                    alive=seen.alive, paused=seen.paused)

    def nodes(self, role: str | None = None) -> list[Node]:
        entries = [n for n in self._state()["nodes"].values() if role is None or n["role"] == role]
        seen = self._seen(entries)
        return [self._node_of(n, seen[n["name"]]) for n in entries]

    def status(self) -> dict[str, Any]:
        state = self._read(self.state_path)
        if state is None:
            return {"name": self.name, "status": "absent", "backend": self.backend, "base_dir": str(self.base_dir)}
        entries = list(state["nodes"].values())
        seen = self._seen(entries)
        nodes = []
        for n in entries:
            node = self._node_of(n, seen[n["name"]])
            d = node.to_json()
            d[self.host_key] = n[self.host_key]       # by its own name too: "container" on docker
            d["state"] = "paused" if node.paused else "running" if node.alive else seen[n["name"]].word
            nodes.append(d)
        pulsar = self._addresses("broker", "pulsar", state)
        return {
            "name": state["name"], "id": state["id"], "status": state["status"], "backend": self.backend,
            "base_dir": state["base_dir"], "state_file": str(self.state_path),
            "service_url": "pulsar://" + ",".join(pulsar) if pulsar else "",
            "admin_urls": [f"http://{a}" for a in self._addresses("broker", "http", state)],
            "zk_connect": ",".join(self._addresses("zookeeper", "client", state)),
            "subnet": state["subnet"], "host_address": state["host_address"], "spec": state["spec"],
            "nodes": nodes, "partitions": state["drops"], "one_way": state.get("inbound", []), "flaky": state["flaky"],
            "clients": state["clients"],
            **self._status_extra(state),
        }

    # ---------------------------------------------------------------- lifecycle
    def up(self) -> "StateFileCluster":
        """Create the network and the hosts, start ZooKeeper, bookies, brokers (and clients), each role
        healthy before the next. On any failure or interrupt, everything this call created is removed."""
        self._prepare()
        self._claimed = False
        try:
            self._claim()
            self._write_configs()
            for name in self._state()["nodes"]:
                self._create_host(name)
            self._start_all()
            with self._txn() as state:
                state["status"] = "up"
                state["up_at"] = statefile.now()
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
            print(f"pulsar-chaos: cleanup of {self._label()} {self.name!r} failed: {ex}", file=sys.stderr)

    def _claim(self) -> None:
        """Under the allocation lock: refuse a name that is up, clear what a dead run of it left, pick a
        subnet no cluster of any backend holds, write the state (from then on `down()` undoes it all)
        and create the network, whose route then keeps the subnet taken."""
        with statefile.flock(ALLOC_LOCK):
            old = self._read(self.state_path)
            if old is not None:
                if old.get("status") != "down" and self.is_present(old):
                    raise ClusterError(f"{self._label()} {self.name!r} is already up (base dir {self.base_dir})",
                                       f"take it down with {self._cli('down', self.name)}, or choose another --name")
                self._teardown(old, force=True)
            others = [(b, s) for b, s in backends.all_states() if (b, s.get("name")) != (self.backend, self.name)]
            for b, s in others:
                if b == self.backend and s.get("id") == self.id and s.get("status") != "down" and self.is_present(s):
                    raise ClusterError(f"cluster {s['name']!r} uses the same short id {self.id!r}",
                                       "choose another --name")
            self._sweep({self.name})                 # leftovers of a killed run of this very name
            if self.base_dir.exists() and not self.base_dir.is_symlink():
                shutil.rmtree(self.base_dir / "nodes", ignore_errors=True)    # a fresh cluster: old logs go now
            self.base_dir.mkdir(parents=True, exist_ok=True)
            home = self.root / self.name
            if self.base_dir.resolve() != home.resolve() and (home.is_symlink() or not home.exists()):
                home.unlink(missing_ok=True)         # keep every state.json findable for cleanup_all()
                home.parent.mkdir(parents=True, exist_ok=True)
                home.symlink_to(self.base_dir.resolve())
            reserved = [s["subnet"] for _, s in others if s.get("status") != "down" and s.get("subnet")]
            reserved += self._taken_subnets()
            if self.spec.subnet:
                if not hostnet.subnet_free(self.spec.subnet, reserved):
                    raise ClusterError(f"subnet {self.spec.subnet} is already in use on this host",
                                       "omit --subnet to pick a free one")
                subnet = self.spec.subnet
            else:
                subnet = hostnet.pick_subnet(reserved)
            state = self._plan(subnet)
            statefile.write_json_atomic(self.state_path, state)
            self._claimed = True
            if not self._atexit_registered:
                atexit.register(self._atexit_down)
                self._atexit_registered = True
            self._create_network(state)

    def _write_configs(self) -> None:
        """Each node's config in its folder (ZooKeeper's zoo.cfg and myid, a bookie's or broker's
        config.json) and its argv on its host."""
        with self._txn() as state:
            zks = [n for n in state["nodes"].values() if n["role"] == "zookeeper"]
            ensemble = tuple((n["index"], n["host"]) for n in zks) if len(zks) > 1 else ()
            zk_connect = ",".join(f"{n['host']}:{n['ports']['client']}" for n in zks)
            spec = self.spec
            for n in state["nodes"].values():
                Path(n["data_dir"]).mkdir(parents=True, exist_ok=True)
                role = n["role"]
                if role == "client":
                    n["argv"] = self.client_argv
                    continue
                if role == "zookeeper":
                    zkn = zookeeper.ZooKeeperNode(myid=n["index"], host=n["host"], data_dir=Path(n["data_dir"]),
                                                  client_port=n["ports"]["client"], ensemble=ensemble)
                    n["argv"] = zkn.command(java=self.java, cp=self.zk_classpath)   # writes zoo.cfg, myid
                    n["config"] = str(Path(n["data_dir"]) / "zoo.cfg")
                    continue
                config = str(Path(n["dir"]) / "config.json")
                common = dict(name=n["name"], host=n["host"], zk=zk_connect, data_dir=n["data_dir"],
                              bugs=dict(spec.bugs))
                if role == "bookie":
                    cfg: node_config.NodeConfig = node_config.BookieConfig(
                        port=n["ports"]["bookie"], http_port=n["ports"]["http"], **{**common, **spec.bookie_config})
                else:
                    cfg = node_config.BrokerConfig(port=n["ports"]["pulsar"], http_port=n["ports"]["http"],
                                                   ensemble=spec.ensemble, write_quorum=spec.write_quorum,
                                                   ack_quorum=spec.ack_quorum, load_manager=spec.load_manager,
                                                   load_balancer=dict(spec.lb_settings),
                                                   **{**common, **DEPLOY_BROKER_DEFAULTS, **spec.broker_config,
                                                      **spec.broker_overrides.get(n["name"], {})})
                node_config.write(cfg, Path(config))
                n["config"] = config
                n["argv"] = self.commands[role](self._node_of(n, Seen()))

    def _start_all(self) -> None:
        state = self._state()
        for role in START_ORDER:
            names = [n["name"] for n in state["nodes"].values() if n["role"] == role and n["argv"]]
            for name in names:
                with self._txn() as st:
                    self._spawn(st, st["nodes"][name])
            if role != "client":
                self._wait_healthy(names)

    def _wait_healthy(self, names: Iterable[str], timeout: float | None = None) -> None:
        pending = list(names)
        limit = timeout or self.start_timeout
        deadline = time.monotonic() + limit
        while pending:
            state = self._state()
            seen = self._seen([state["nodes"][n] for n in pending])
            for name in list(pending):
                node = self._node_of(state["nodes"][name], seen[name])
                if not node.alive:
                    code = seen[name].exit_code
                    last = statefile.last_line(node.log)
                    raise ClusterError(f"{name} exited" + (f" with code {code}" if code is not None else "")
                                       + " while starting" + (f": {last}" if last else ""),
                                       f"read its log: {node.log}")
                if self.health[node.role](node):
                    pending.remove(name)
            if not pending:
                return
            if time.monotonic() > deadline:
                logs = ", ".join(state["nodes"][n]["log"] for n in pending)
                raise ClusterError(f"{', '.join(pending)} not healthy within {limit:.0f}s", f"read {logs}")
            time.sleep(0.2)

    def down(self) -> None:
        """Stop every process, remove every host and the network. Idempotent; logs and data stay."""
        if self._atexit_registered:
            atexit.unregister(self._atexit_down)
            self._atexit_registered = False
        if not self.state_path.exists():
            return
        with self._lock:
            try:
                with statefile.flock(self.base_dir / ".state.lock"):
                    state = self._read(self.state_path)
                    if state is None:
                        return
                    self._teardown(state, force=False, stop_timeout=self.stop_timeout)
                    statefile.write_json_atomic(self.state_path, state)
            except FileNotFoundError:
                return

    @classmethod
    def _teardown(cls, state: dict[str, Any], force: bool, stop_timeout: float = 10.0) -> dict[str, list[int]]:
        """Stop the recorded processes (brokers and clients, then bookies, then ZooKeeper), remove the
        hosts and the network, and mark the state down. Returns processes found running in our hosts
        that we did not start (host -> pids); they are left alone."""
        state["status"] = "stopping"
        timeout = 3.0 if force else stop_timeout
        for roles in ROLE_STOP_ORDER:
            cls._stop_roles(state, roles, timeout)
        left = cls._remove(state, timeout)
        state["status"] = "down"
        state["down_at"] = statefile.now()
        state["drops"], state["flaky"], state["drop_counts"] = [], [], {}
        state["inbound"], state["inbound_counts"], state["inbound_on"] = [], {}, []
        if left:
            state["left_running"] = left
        return left

    @classmethod
    def _looks_alive(cls, state: dict[str, Any]) -> bool:
        if state.get("status") == "down":
            return False
        if state.get("detached") and state.get("status") == "up":
            return cls.is_present(state)
        return procs.alive(state.get("owner_pid"), state.get("owner_start"))

    @classmethod
    def cleanup_all(cls, force: bool = True, names: Iterable[str] | None = None,
                    root: Path | None = None) -> dict[str, Any]:
        """Remove leftovers of killed runs: tear down the cluster of every state.json under root (or
        only `names`), then sweep what carries our mark though no state records it (of those names).

        force=False spares clusters that look alive (up and detached, or their owner still runs).
        Kills only recorded processes. Returns what it removed."""
        cls.require()
        wanted = set(names) if names is not None else None
        report: dict[str, Any] = {"clusters": []}
        left: dict[str, list[int]] = {}
        spared: set[str] = set()
        for state_path, state in cls.states(root):
            if wanted is not None and state.get("name") not in wanted:
                continue
            if not force and cls._looks_alive(state):
                spared.add(state["name"])
                continue
            with statefile.flock(state_path.parent / ".state.lock"):
                state = cls._read(state_path) or state
                if state.get("status") != "down" or cls.is_present(state):
                    report["clusters"].append(state["name"])
                    left.update(cls._teardown(state, force=True))
                    statefile.write_json_atomic(state_path, state)
        report.update(cls._sweep(wanted, spared))
        if left:
            report["left_running"] = {**left, **report.get("left_running", {})}
        return report

    # ---------------------------------------------------------------- process faults
    def start(self, name: str, wait: bool = True, timeout: float | None = None) -> Node:
        with self._txn() as state:
            n = self._entry(state, name)
            if n["role"] == "client":
                raise ClusterError(f"{name} is a client host; it runs no node process", "use run_client()")
            seen = self._seen([n])[name]
            if not seen.host:
                raise self._not_up_error(self.name, f"no {self.host_key} {n[self.host_key]}")
            if seen.alive:
                raise ClusterError(f"{name} is already running (pid {seen.pid})",
                                   "stop or kill it first, or resume it if paused")
            self._spawn(state, n)
        if wait:
            self._wait_healthy([name], timeout)
        return self.node(name)

    def _running(self, name: str) -> tuple[dict[str, Any], Seen]:
        n = self._entry(self._state(), name)
        if n["role"] == "client":
            raise ClusterError(f"{name} is a client host; it runs no node process")
        seen = self._seen([n])[name]
        if not seen.host:
            raise self._not_up_error(self.name, f"no {self.host_key} {n[self.host_key]}")
        if not seen.alive:
            raise ClusterError(f"{name} is not running", f"start it with {self._cli('start', self.name, name)}")
        return n, seen

    def stop(self, name: str, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL after the timeout (a paused node is thawed first)."""
        n, seen = self._running(name)
        self._signal(n, seen, "stop", self.stop_timeout if timeout is None else timeout)

    def kill(self, name: str) -> None:
        n, seen = self._running(name)
        self._signal(n, seen, "kill")

    def pause(self, name: str) -> None:
        n, seen = self._running(name)
        self._signal(n, seen, "pause")

    def resume(self, name: str) -> None:
        n, seen = self._running(name)
        self._signal(n, seen, "resume")

    def wipe(self, name: str) -> dict[str, Any]:
        """Delete everything a stopped node wrote into its data dir (a bookie's journal, entry logs and
        index; ZooKeeper's snapshots and logs), keeping its identity: the node dir, config.json,
        node.log, and ZooKeeper's zoo.cfg and myid (which live in its data dir). The next start()
        begins empty under the same name, address and id. Returns what was deleted."""
        with self._txn() as state:
            n = self._entry(state, name)
            if n["role"] == "client":
                raise ClusterError(f"{name} is a client host; it has no data to wipe")
            seen = self._seen([n])[name]
            if seen.alive:
                raise ClusterError(f"{name} is running (pid {seen.pid}); its data cannot be wiped under it",
                                   f"kill or stop it first ({self._cli('kill', self.name, name)})")
            wiped = statefile.wipe_data_dir(n)
        return {"node": name, **wiped}

    def corrupt(self, name: str, mode: str, draws: list[float], flips: int = 16) -> dict[str, Any]:
        """Bit flips in or truncation of a stopped bookie's newest entry log (clusters/bookie/corrupt.py),
        its index untouched; records `corrupted_at` in state.json. Returns {node, file, mode,
        size_before, size_after, offsets}."""
        from clusters.bookie import corrupt
        with self._txn() as state:
            n = self._entry(state, name)
            if n["role"] != "bookie":
                raise ClusterError(f"{name} is a {n['role']}, not a bookie; only a bookie's entry logs are "
                                   "corrupted")
            seen = self._seen([n])[name]
            if seen.alive:
                raise ClusterError(f"{name} is running (pid {seen.pid}); its files are corrupted while it is "
                                   "stopped", f"kill or stop it first ({self._cli('kill', self.name, name)})")
            try:
                out = corrupt.corrupt_entry_log(n["data_dir"], mode, draws, flips)
            except corrupt.CorruptError as e:
                raise ClusterError(f"corrupting {name} failed: {e}") from None
            n["corrupted_at"] = statefile.now()
        return {"node": name, **out}

    def format(self, name: str) -> dict[str, Any]:
        """Format a stopped bookie as a new bookie (clusters/bookie/cookie.py): its cookie in the
        metadata store is deleted (through the cluster's ZooKeeper, from this host) and its journal,
        ledger storage and cookie files on disk; records `formatted_at` in state.json. Returns
        {node, bookie, cookie_deleted, removed}."""
        from clusters.bookie import cookie
        with self._txn() as state:
            n = self._entry(state, name)
            if n["role"] != "bookie":
                raise ClusterError(f"{name} is a {n['role']}, not a bookie; only bookies are formatted")
            seen = self._seen([n])[name]
            if seen.alive:
                raise ClusterError(f"{name} is running (pid {seen.pid}); a bookie is formatted while stopped",
                                   f"stop it first ({self._cli('stop', self.name, name)})")
            bookie_id = node_config.load(n["config"]).bookie_id
            data_dir = n["data_dir"]
        try:
            out = cookie.format_bookie_blocking(self.zk_connect, bookie_id, data_dir)
        except cookie.CookieError as e:
            raise ClusterError(f"formatting {name} failed: {e}", "check that ZooKeeper is up") from None
        with self._txn() as state:
            state["nodes"][name]["formatted_at"] = statefile.now()
        return {"node": name, **out}

    def exec(self, name: str, argv: list[str], timeout: float = 30.0,
             **run_kw: Any) -> subprocess.CompletedProcess:
        """Run a short command on a node's host and wait for it: for probes."""
        n = self._entry(self._state(), name)
        return subprocess.run([*self._on_host(n), *argv], timeout=timeout, capture_output=True, text=True,
                              **run_kw)

    def _client_entry(self, state: dict[str, Any], node: str | None) -> dict[str, Any]:
        """The client host `node`, or the first client host."""
        if node is not None:
            return self._entry(state, node)
        clients = [n for n in state["nodes"].values() if n["role"] == "client"]
        if not clients:
            raise ClusterError("this cluster has no client host", "create it with clients >= 1")
        return clients[0]

    # ---------------------------------------------------------------- network faults
    def _resolve_edges(self, state: dict[str, Any], edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """Validate names and move `host` to the right: (host, b) becomes (b, host) (drops are symmetric)."""
        known = set(state["nodes"]) | {HOST}
        out = []
        for a, b in edges:
            for x in (a, b):
                if x not in known:
                    raise ClusterError(f"unknown node {x!r} in partition",
                                       f"use node names from {self._cli('status', self.name)} (or 'host')")
            if a == HOST:
                a, b = b, a
            if a == HOST:
                continue
            out.append((a, b))
        return out

    def _address(self, state: dict[str, Any], name: str) -> str:
        return state["host_address"] if name == HOST else state["nodes"][name]["host"]

    def _link(self, state: dict[str, Any], src: str, dst: str, what: str) -> tuple[str, str]:
        """One link (a, b) of two different nodes; `host` goes right (its rules live on a's host)."""
        (a, b), = self._resolve_edges(state, {(src, dst)}) or [(None, None)]
        if a is None or a == b:
            raise ClusterError(f"{what} needs two different nodes, got {src!r} and {dst!r}")
        return a, b

    def _chain_rules(self, state: dict[str, Any], name: str) -> list[str]:
        """The node's PCHAOS rules as the state records them: each drop edge and flaky link it holds,
        both directions (a flaky link drops at random with its probability), and each one-way cut
        (what b sends a)."""
        out = []
        for a, b, *p in [*state["drops"], *state["flaky"]]:
            if a == name:
                ip = self._address(state, b)
                match = f" -m statistic --mode random --probability {p[0]:.6f}" if p else ""
                out += [f"-A {CHAIN} -s {ip}/32{match} -j DROP", f"-A {CHAIN} -d {ip}/32{match} -j DROP"]
        for a, b in state.get("inbound", []):
            if a == name:
                out.append(f"-A {CHAIN} -s {self._address(state, b)}/32 -j DROP")
        for a, b, trigger in state.get("inbound_on", []):
            if a == name:
                # the connection on which a sends b the trigger's bytes is marked; b's packets on a marked
                # connection are dropped, so that connection hears nothing more (a new one works)
                ip, mark = self._address(state, b), _connmark(b, trigger)
                out += [f"-A {CHAIN} -d {ip}/32 -m string --algo bm --hex-string |{trigger}| "
                        f"-j CONNMARK --set-mark {mark}",
                        f"-A {CHAIN} -s {ip}/32 -m connmark --mark {mark} -j DROP"]
        return out

    def partition(self, grudge: Grudge) -> None:
        """Each drop edge is counted per call (state `drop_counts`), so that `unpartition` of one of
        two overlapping partitions keeps the links the other still cuts."""
        with self._txn() as state:
            edges = sorted(set(self._resolve_edges(state, grudge_edges(grudge))))
            self._sync_rules(state, {a for a, _ in statefile.count_drops(state, edges, +1)})

    def unpartition(self, grudge: Grudge) -> None:
        with self._txn() as state:
            edges = sorted(set(self._resolve_edges(state, grudge_edges(grudge))))
            self._sync_rules(state, {a for a, _ in statefile.count_drops(state, edges, -1)})

    def deafen(self, node: str, peers: Iterable[str], *, trigger: bytes | None = None) -> None:
        self._deaf(node, peers, trigger, +1)

    def undeafen(self, node: str, peers: Iterable[str], *, trigger: bytes | None = None) -> None:
        self._deaf(node, peers, trigger, -1)

    def _deaf(self, node: str, peers: Iterable[str], trigger: bytes | None, delta: int) -> None:
        """One-way cuts, counted per call like partitions (`inbound`); armed ones (`inbound_on`, with a
        trigger) are added or removed as entries."""
        what = "deafen" if delta > 0 else "undeafen"
        edges, entry = self._deaf_edges(node, peers, trigger, what)
        with self._txn() as state:
            edges = sorted({self._link(state, a, b, what) for a, b in edges})
            if entry is None:
                self._sync_rules(state, {a for a, _ in statefile.count_drops(state, edges, delta, "inbound")})
                return
            held = [e for e in state.get("inbound_on", []) if e[2] != entry or tuple(e[:2]) not in edges]
            state["inbound_on"] = held + ([[a, b, entry] for a, b in edges] if delta > 0 else [])
            self._sync_rules(state, {a for a, _ in edges})

    @staticmethod
    def _deaf_edges(node: str, peers: Iterable[str], trigger: bytes | None,
                    what: str) -> tuple[list[tuple[str, str]], str | None]:
        if node == HOST:
            raise ClusterError(f"{what} needs a node of the cluster, not the host", "name a node; the host may be a peer")
        if trigger is not None and not trigger:
            raise ClusterError(f"{what}: the trigger is empty", "give the bytes a request carries, e.g. its path")
        return [(node, peer) for peer in sorted(set(peers))], (trigger.hex() if trigger is not None else None)

    def flaky(self, src: str, dst: str, p: float) -> None:
        if not 0.0 < p <= 1.0:
            raise ClusterError(f"drop probability {p} out of range", "use 0 < p <= 1")
        with self._txn() as state:
            a, b = self._link(state, src, dst, "flaky")
            state["flaky"].append([a, b, p])
            self._sync_rules(state, [a])

    def unflaky(self, src: str, dst: str, p: float) -> None:
        """Undo one earlier flaky(src, dst, p) (two faults on one link are undone independently);
        a no-op when heal() removed it meanwhile."""
        with self._txn() as state:
            a, b = self._link(state, src, dst, "unflaky")
            for i, (x, y, q) in enumerate(state["flaky"]):
                if (x, y) == (a, b) and f"{q:.6f}" == f"{p:.6f}":
                    del state["flaky"][i]
                    self._sync_rules(state, [a])
                    return

    def heal(self) -> None:
        with self._txn() as state:
            state["drops"], state["flaky"], state["drop_counts"] = [], [], {}
            state["inbound"], state["inbound_counts"], state["inbound_on"] = [], {}, []
            self._sync_rules(state, state["nodes"])

    # ================================================================ hooks a backend implements
    @classmethod
    @abc.abstractmethod
    def is_present(cls, state: dict[str, Any]) -> bool:
        """Hook: does anything of this cluster (network, hosts, recorded processes) still exist?"""

    @classmethod
    @abc.abstractmethod
    def _sweep(cls, names: set[str] | None, spare: set[str] = frozenset()) -> dict[str, Any]:
        """Hook: remove what carries our mark though no state may record it (of the clusters `names`,
        or of every cluster but `spare`), never killing a process. Returns what it removed by kind;
        it is merged into `cleanup_all`'s report."""

    @classmethod
    @abc.abstractmethod
    def _stop_roles(cls, state: dict[str, Any], roles: tuple[str, ...], timeout: float) -> None:
        """Hook: stop the recorded processes of these roles (with `client`: whatever else runs on the
        hosts for us), SIGTERM first and SIGKILL after `timeout`; only processes that are ours."""

    @classmethod
    @abc.abstractmethod
    def _remove(cls, state: dict[str, Any], timeout: float) -> dict[str, list[int]]:
        """Hook: once the processes are stopped, remove the hosts, the network and whatever else the
        state records (a helper daemon gets `timeout` to exit). Returns processes running in our
        hosts that we did not start (host -> pids)."""

    def _taken_subnets(self) -> list[str]:
        """Subnets in use that the host's routes do not show (e.g. other networks of an engine)."""
        return []

    @abc.abstractmethod
    def _plan_node(self, name: str, role: str, index: int) -> dict[str, Any]:
        """Hook: the backend's fields of a node's state entry (at least `host_key`)."""

    @abc.abstractmethod
    def _plan_cluster(self, subnet: str) -> dict[str, Any]:
        """Hook: the backend's fields of the cluster's state (its network's names...)."""

    @abc.abstractmethod
    def _create_network(self, state: dict[str, Any]) -> None:
        """Hook: create the cluster's network on `state["subnet"]` with the host at .1, recording each
        object before or as it is created. Runs under the allocation lock."""

    @abc.abstractmethod
    def _create_host(self, name: str) -> None:
        """Hook: create one node's host on the network (its config and argv are written), with no
        drop rule in force; it runs nothing yet."""

    @abc.abstractmethod
    def _seen(self, entries: list[dict[str, Any]]) -> dict[str, Seen]:
        """Hook: node name -> what the backend sees of it now, for these state entries."""

    @abc.abstractmethod
    def _spawn(self, state: dict[str, Any], n: dict[str, Any]) -> None:
        """Hook: start the node's process (`n["argv"]`) on its host with the same config, data and
        address, and record in `n` what identifies it (pid, start time, `started_at`). Called under
        the state lock; returns once it runs, with the host's drop rules in force (not yet healthy)."""

    @abc.abstractmethod
    def _signal(self, n: dict[str, Any], seen: Seen, action: str, timeout: float = 0.0) -> None:
        """Hook: one process fault on a running node: `stop` (SIGTERM, SIGKILL after `timeout`),
        `kill` (SIGKILL; returns once it is dead), `pause` (freeze it) or `resume` (thaw it)."""

    @abc.abstractmethod
    def _sync_rules(self, state: dict[str, Any], names: Iterable[str]) -> None:
        """Hook: make these nodes' drop rules what `_chain_rules` says the state now holds; a node that
        does not run gets them when it starts."""

    @abc.abstractmethod
    def _on_host(self, n: dict[str, Any]) -> list[str]:
        """Hook: the argv prefix that runs a command on the node's host."""

    def _status_extra(self, state: dict[str, Any]) -> dict[str, Any]:
        """The backend's fields of `status()` (network, image...)."""
        return {}
