"""The Docker backend: one container per node on an internal bridge network, faults by docker and iptables.

Every cluster is a user-defined bridge network `pcd-<name>` (created `--internal`: no route out; the
host reaches every node through the bridge, whose gateway .1 is `host_address`) on a free private
/24, and one container `pcd-<name>-<node>` per node at a fixed address (the netns backend's last
octets: ADDRESS_BASE). Each node's folder <base_dir>/nodes/<node> (config, data, node.log) is
bind-mounted at the same path, so logs and data outlive restarts and `down()`. Every container and
network carries the label `pulsar-chaos.cluster=<name>`: cleanup removes only what is labelled ours.
The state (container ids, addresses, partitions) is <base_dir>/state.json, as in the netns backend,
under /tmp/pulsar-chaos/docker/<name> so that both backends may use the same cluster names.

A node's process is its container's main process (under docker's init, which forwards signals):
`python -m clusters.node config.json` in the image's virtualenv, or ZooKeeper's java command with the
image's java and jars. Before it starts, a small shell wrapper loads the node's iptables rules from
its folder (`pchaos.rules`), so a node restarted during a partition never talks through it. Faults:
start = `docker start` (same container: config, data, address, identity), stop = `docker stop`,
kill = `docker kill`, pause/resume = `docker pause`/`unpause` (the cgroup freezer), partitions and
flaky links = the chain PCHAOS in the container's own filter table, rewritten whole (iptables-restore
from the host inside the container's network namespace with nsenter, which works on paused
containers too) with the netns backend's per-call counting of drop edges.

Clients: client-N containers run `sleep infinity`; `run_client` runs a command in one with `docker
exec` and returns a Popen whose signals (terminate, kill) reach the command inside the container,
since docker exec forwards none: the command runs under `sh -c 'echo $$ > PIDFILE; exec ...'` (a
docker exec'd process leads its own process group) and a signal is sent to that group with `docker
exec <container> kill -SIG -- -PID`. The image has our package, so the host's Python in argv[0] is
replaced by the image's; host folders a client needs (the runner's run folder) are bind-mounted at
the same path: `DockerCluster(spec, mounts=[...])`.

The image is `pulsar-chaos-node:<hash of its inputs>` (clusters/deploy/images/inputs.py): a cluster
always runs the sources as they are now, or says `make setup BACKEND=docker` to build them
(`PULSAR_CHAOS_IMAGE=<image>` picks another image).
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import ipaddress
import json
import os
import re
import shlex
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
from clusters.deploy import hostnet, procs
from clusters.deploy import statefile
from clusters.deploy.backend import HOST, Cluster, ClusterError, Grudge, Node, Unsupported, grudge_edges
from clusters.deploy.netns import ADDRESS_BASE, CHAIN, PORTS, ROLE_STOP_ORDER, short_id
from clusters.deploy.statefile import StateInventory
from clusters.deploy.statefile import flock as _flock
from clusters.deploy.statefile import last_line as _last_line
from clusters.deploy.statefile import now as _now
from clusters.deploy.statefile import write_json_atomic as _write_json_atomic
from clusters.deploy.spec import DEPLOY_BROKER_DEFAULTS, ROOT, ClusterSpec

STATE_VERSION = 1
DOCKER_ROOT = ROOT.parent / "docker"         # /tmp/pulsar-chaos/docker/<name>/{state.json,nodes/}
PREFIX = "pcd-"                              # networks pcd-<name>, bridges pcd-<id>, containers pcd-<name>-<node>
LABEL = "pulsar-chaos.cluster"               # = cluster name, on every container and network we create
IMAGE_REPO = "pulsar-chaos-node"
IMAGE_ENV = "PULSAR_CHAOS_IMAGE"
SETUP_FIX = "run `make setup BACKEND=docker` (installs docker.io, starts dockerd, builds the image)"
VENV_PYTHON = "/opt/pulsar-chaos/venv/bin/python"     # the image's
IMAGE_JAVA = "/usr/bin/java"
IMAGE_CLASSPATH = ":".join(f"/usr/share/java/{jar}.jar" for jar in zookeeper._JARS)
RULES_FILE = "pchaos.rules"                  # in the node folder: the node's filter table, loaded at start
RULES_APPLIED = ".rules-applied"             # the wrapper touches it once the rules are in force
# The container's command: load the node's rules, then exec the node with its output in node.log.
WRAPPER = r"""d="$1"; restore="$2"; container="$3"; shift 3
cd "$d" || exit 70
if ! "$restore" -w 5 < "$d/pchaos.rules" >> "$d/node.log" 2>&1; then
  echo "=== pulsar-chaos: cannot load $d/pchaos.rules with $restore; not starting" >> "$d/node.log"; exit 70
fi
: > "$d/.rules-applied"
echo "=== pulsar-chaos $(date -u +%Y-%m-%dT%H:%M:%S+00:00): starting $(hostname) in container $container" >> "$d/node.log"
exec "$@" >> "$d/node.log" 2>&1"""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/opt", "/dev", "/proc", "/sys", "/run")

Command = Callable[[Node], list[str]]




# ------------------------------------------------------------------------------------ docker and host

def docker(*args: str, check: bool = True, input: str | None = None,
           timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run the docker CLI; a failure is a ClusterError quoting docker's message."""
    try:
        cp = subprocess.run(["docker", *args], input=input, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ClusterError("docker not found", SETUP_FIX) from None
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`docker {' '.join(args[:2])}` did not answer within {timeout:.0f}s",
                           "check the engine with `docker info` (restart dockerd if it hangs)") from None
    if check and cp.returncode != 0:
        msg = (cp.stderr.strip() or cp.stdout.strip()).splitlines()
        raise ClusterError(f"`docker {shlex.join(args[:3])}` failed: {msg[-1] if msg else cp.returncode}")
    return cp


def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterError("the docker backend needs root (docker, nsenter, iptables)",
                           "run as root, e.g. `sudo pulsar-chaos ...`")


def require_engine() -> None:
    if not shutil.which("docker"):
        raise ClusterError("docker not found", SETUP_FIX)
    cp = docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=30)
    if cp.returncode != 0 or not cp.stdout.strip():
        raise ClusterError("no docker engine is running", SETUP_FIX)


def _inputs_module() -> Any | None:
    path = Path(__file__).resolve().parent / "images" / "inputs.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("pulsar_chaos_image_inputs", path)
    mod = importlib.util.module_from_spec(spec)       # type: ignore[arg-type]
    spec.loader.exec_module(mod)                        # type: ignore[union-attr]
    return mod


def current_image() -> str:
    """The image built from the sources as they are now ($PULSAR_CHAOS_IMAGE if set; :latest when
    the sources are not at hand, as in an installed package)."""
    if os.environ.get(IMAGE_ENV):
        return os.environ[IMAGE_ENV]
    mod = _inputs_module()
    return f"{IMAGE_REPO}:{mod.input_hash()}" if mod is not None else f"{IMAGE_REPO}:latest"


def require_image(image: str) -> str:
    """The image's id; a one-line ClusterError if it is not built."""
    cp = docker("image", "inspect", "--format", "{{.Id}}", image, check=False)
    if cp.returncode == 0:
        return cp.stdout.strip()
    stale = image.startswith(IMAGE_REPO + ":") and docker(
        "image", "inspect", f"{IMAGE_REPO}:latest", check=False).returncode == 0
    raise ClusterError(f"docker image {image} is not built"
                       + (" (the sources changed since the last build)" if stale else ""), SETUP_FIX)


def iptables_variant() -> str:
    """'nft' or 'legacy': the host's iptables, which the containers' wrapper must match (both edit
    the same network namespace's rules)."""
    cp = hostnet.run(["iptables", "-V"])
    return "legacy" if "legacy" in cp.stdout else "nft"


def preflight() -> None:
    """Everything `up()` needs before anything is created: root, docker, an engine, the image, iptables."""
    require_root()
    require_engine()
    for tool, pkg in (("iptables-restore", "iptables"), ("nsenter", "util-linux")):
        if not hostnet.have(tool):
            raise ClusterError(f"{tool} not found", f"apt-get install {pkg}")
    require_image(current_image())






def _read_state(path: Path) -> dict[str, Any] | None:
    return statefile.read_state(path, "run `pulsar-chaos cluster down --force --backend docker --name NAME` "
                                      "(it removes what is labelled with the cluster's name)")




def _inspect(containers: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Container name -> docker's State (Running, Paused, Pid, ExitCode...), for those that exist."""
    names = list(containers)
    if not names:
        return {}
    cp = docker("inspect", "--type", "container", "--format", "{{.Name}} {{json .State}}", *names, check=False)
    out = {}
    for line in cp.stdout.splitlines():
        name, _, st = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[name.lstrip("/")] = json.loads(st)
    return out


def _labelled(kind: str, names: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(id, cluster name) of every container or network labelled ours (of these cluster names)."""
    wanted = set(names) if names is not None else None
    args = (["ps", "-a"] if kind == "container" else ["network", "ls"]) + [
        "--filter", f"label={LABEL}", "--format", f'{{{{.ID}}}} {{{{.Label "{LABEL}"}}}}']
    cp = docker(*args, check=False)
    out = []
    for line in cp.stdout.splitlines():
        cid, _, cluster = line.strip().partition(" ")
        if cid and (wanted is None or cluster in wanted):
            out.append((cid, cluster))
    return out


def _docker_subnets() -> list[str]:
    ids = docker("network", "ls", "-q", check=False).stdout.split()
    if not ids:
        return []
    cp = docker("network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *ids, check=False)
    out = []
    for s in cp.stdout.split():
        with contextlib.suppress(ValueError):
            if ipaddress.ip_network(s, strict=False).version == 4:
                out.append(s)
    return out


def _states(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for p in sorted(Path(root).glob("*/state.json")):
        with contextlib.suppress(ClusterError):
            s = _read_state(p)
            if s:
                out.append((p, s))
    return out


# ------------------------------------------------------------------------------------ the cluster

def _default_command(node: Node) -> list[str]:
    return [VENV_PYTHON, "-m", "clusters.node", str(node.config)]


class DockerCluster(StateInventory, Cluster):
    """A cluster whose nodes are containers of the node image on an internal bridge network."""

    python = VENV_PYTHON                  # the Python on the hosts, for commands run with exec()

    def __init__(self, spec: ClusterSpec, *, image: str | None = None, mounts: Iterable[str | Path] = (),
                 commands: dict[str, Command] | None = None,
                 health: dict[str, health_checks.HealthCheck] | None = None,
                 start_timeout: float = 60.0, stop_timeout: float = 10.0):
        if Path(spec.base_dir) == ROOT / spec.name:      # the default: the docker backend's own root
            spec.base_dir = DOCKER_ROOT / spec.name
        self.spec = spec.validate()
        for field_name in ("fake_clocks", "lazy_disks"):
            if getattr(spec, field_name, None):
                raise Unsupported(f"the docker backend cannot deploy {field_name}={getattr(spec, field_name)!r}",
                                  "use --backend netns for clock skew and power loss")
        self.name = spec.name
        self.id = short_id(spec.name)
        self.base_dir = Path(spec.base_dir)
        self.state_path = self.base_dir / "state.json"
        self.image = image
        self.mounts = [str(Path(m).resolve()) for m in mounts]
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
    def attach(cls, name: str, root: Path = DOCKER_ROOT, **kw: Any) -> "DockerCluster":
        """A handle on an existing cluster (started by this or another process) from its state.json."""
        state = _read_state(Path(root) / name / "state.json")
        if state is None:
            raise ClusterError(f"docker cluster {name!r} is not up",
                               "start it with `pulsar-chaos cluster up --backend docker"
                               + ("" if name == "default" else f" --name {name}") + "`")
        kw.setdefault("image", state.get("image"))
        kw.setdefault("mounts", state.get("mounts", []))
        return cls(ClusterSpec.from_json(state["spec"]), **kw)

    @property
    def network(self) -> str:
        return f"{PREFIX}{self.name}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.id}"

    def _container(self, node_name: str) -> str:
        return f"{PREFIX}{self.name}-{node_name}"

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
                    raise self._not_up()
                self._txn_depth, self._txn_state = 1, state
                try:
                    yield state
                finally:
                    self._txn_depth, self._txn_state = 0, None
                    _write_json_atomic(self.state_path, state)

    def _not_up(self) -> ClusterError:
        return ClusterError(f"docker cluster {self.name!r} is not up",
                            "start it with `pulsar-chaos cluster up --backend docker"
                            + ("" if self.name == "default" else f" --name {self.name}") + "`")

    def _state(self) -> dict[str, Any]:
        state = _read_state(self.state_path)
        if state is None:
            raise self._not_up()
        return state

    def _plan(self, subnet: str, image: str, image_id: str) -> dict[str, Any]:
        net = subnet.rsplit(".", 1)[0]
        nodes: dict[str, Any] = {}
        for name, role, index in self.spec.layout():
            node_dir = self.base_dir / "nodes" / name
            nodes[name] = {
                "name": name, "role": role, "index": index,
                "host": f"{net}.{ADDRESS_BASE[role] + index}",
                "container": self._container(name), "container_id": None,
                "ports": dict(PORTS[role]),
                "dir": str(node_dir), "log": str(node_dir / "node.log"), "data_dir": str(node_dir / "data"),
                "config": None, "argv": None, "pid": None, "started_at": None,
            }
        return {
            "version": STATE_VERSION, "backend": "docker", "name": self.name, "id": self.id,
            "status": "starting", "created_at": _now(), "owner_pid": os.getpid(),
            "owner_start": procs.start_time(os.getpid()), "detached": False, "base_dir": str(self.base_dir),
            "spec": self.spec.to_json(), "image": image, "image_id": image_id, "mounts": self.mounts,
            "iptables": iptables_variant(), "subnet": subnet, "host_address": f"{net}.1",
            "network": {"name": self.network, "id": None, "bridge": self.bridge},
            "nodes": nodes, "clients": [], "drops": [], "drop_counts": {}, "flaky": [],
        }

    # ---------------------------------------------------------------- inventory
    def _node_of(self, n: dict[str, Any], st: dict[str, Any] | None) -> Node:
        running = bool(st and st.get("Running"))
        pid = (st.get("Pid") or n["pid"]) if running else n["pid"]     # type: ignore[union-attr]
        return Node(name=n["name"], role=n["role"], host=n["host"], pid=pid, ports=dict(n["ports"]),
                    log=Path(n["log"]), data_dir=Path(n["data_dir"]),
                    config=Path(n["config"]) if n["config"] else None, namespace=n["container"],
                    alive=running, paused=running and bool(st.get("Paused")))   # type: ignore[union-attr]

    def nodes(self, role: str | None = None) -> list[Node]:
        state = self._state()
        entries = [n for n in state["nodes"].values() if role is None or n["role"] == role]
        states = _inspect(n["container"] for n in entries)
        return [self._node_of(n, states.get(n["container"])) for n in entries]

    def status(self) -> dict[str, Any]:
        state = _read_state(self.state_path)
        if state is None:
            return {"name": self.name, "status": "absent", "backend": "docker", "base_dir": str(self.base_dir)}
        states = _inspect(n["container"] for n in state["nodes"].values())
        nodes = []
        for n in state["nodes"].values():
            st = states.get(n["container"])
            node = self._node_of(n, st)
            d = node.to_json()
            d["container"] = n["container"]
            d["state"] = ("paused" if node.paused else "running" if node.alive else
                          "absent" if st is None else "never started" if not n["started_at"] else
                          f"exited ({st.get('ExitCode')})")
            nodes.append(d)
        brokers = [n for n in state["nodes"].values() if n["role"] == "broker"]
        return {
            "name": state["name"], "id": state["id"], "status": state["status"], "backend": "docker",
            "base_dir": state["base_dir"], "state_file": str(self.state_path),
            "image": state["image"], "network": state["network"]["name"],
            "service_url": "pulsar://" + ",".join(f"{n['host']}:{n['ports']['pulsar']}" for n in brokers)
            if brokers else "",
            "admin_urls": [f"http://{n['host']}:{n['ports']['http']}" for n in brokers],
            "zk_connect": ",".join(f"{n['host']}:{n['ports']['client']}" for n in state["nodes"].values()
                                   if n["role"] == "zookeeper"),
            "subnet": state["subnet"], "host_address": state["host_address"],
            "bridge": state["network"]["bridge"], "spec": state["spec"], "nodes": nodes,
            "partitions": state["drops"], "flaky": state["flaky"], "clients": state["clients"],
        }

    # ---------------------------------------------------------------- lifecycle
    def up(self) -> "DockerCluster":
        require_root()
        require_engine()
        image = self.image or current_image()
        image_id = require_image(image)
        self.image = image
        self._claimed = False
        try:
            self._create(image, image_id)
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
            print(f"pulsar-chaos: cleanup of docker cluster {self.name!r} failed: {ex}", file=sys.stderr)

    def _create(self, image: str, image_id: str) -> None:
        """Claim the name, pick a subnet, create the network, write every node's config, create the containers."""
        with _flock(ROOT / ".alloc.lock"):           # the netns backend's lock: subnets are shared
            old = _read_state(self.state_path)
            if old is not None:
                if old.get("status") != "down" and _present(old):
                    raise ClusterError(f"docker cluster {self.name!r} is already up (base dir {self.base_dir})",
                                       "take it down with `pulsar-chaos cluster down --backend docker"
                                       + ("" if self.name == "default" else f" --name {self.name}")
                                       + "`, or choose another --name")
                _teardown(old, force=True)
            _sweep({self.name})                      # leftovers of a killed run of this very name
            if self.base_dir.exists() and not self.base_dir.is_symlink():
                shutil.rmtree(self.base_dir / "nodes", ignore_errors=True)   # a fresh cluster
            self.base_dir.mkdir(parents=True, exist_ok=True)
            home = DOCKER_ROOT / self.name
            if self.base_dir.resolve() != home.resolve() and (home.is_symlink() or not home.exists()):
                home.unlink(missing_ok=True)         # keep every state.json findable for cleanup_all()
                home.parent.mkdir(parents=True, exist_ok=True)
                home.symlink_to(self.base_dir.resolve())
            reserved = [s["subnet"] for root in (ROOT, DOCKER_ROOT) for p, s in _states(root)
                        if s.get("status") != "down" and s.get("subnet") and s.get("name") != self.name]
            reserved += _docker_subnets()
            if self.spec.subnet:
                if not hostnet.subnet_free(self.spec.subnet, reserved):
                    raise ClusterError(f"subnet {self.spec.subnet} is already in use on this host",
                                       "omit --subnet to pick a free one")
                subnet = self.spec.subnet
            else:
                subnet = hostnet.pick_subnet(reserved)
            state = self._plan(subnet, image, image_id)
            _write_json_atomic(self.state_path, state)
            self._claimed = True
            if not self._atexit_registered:
                atexit.register(self._atexit_down)
                self._atexit_registered = True
            cp = docker("network", "create", "--driver", "bridge", "--internal",
                        "--subnet", subnet, "--gateway", state["host_address"],
                        "--opt", f"com.docker.network.bridge.name={self.bridge}",
                        "--label", f"{LABEL}={self.name}", self.network)
            with self._txn() as st:
                st["network"]["id"] = cp.stdout.strip()
        # the network's route now exists: no other cluster can pick this subnet
        self._write_configs()
        for name in self._state()["nodes"]:
            self._create_container(name)

    def _write_configs(self) -> None:
        """Each node's config (zoo.cfg, config.json) in its folder, and its argv inside the container."""
        with self._txn() as state:
            zks = [n for n in state["nodes"].values() if n["role"] == "zookeeper"]
            ensemble = tuple((n["index"], n["host"]) for n in zks) if len(zks) > 1 else ()
            zk_connect = ",".join(f"{n['host']}:{n['ports']['client']}" for n in zks)
            spec = self.spec
            for n in state["nodes"].values():
                Path(n["data_dir"]).mkdir(parents=True, exist_ok=True)
                role = n["role"]
                if role == "client":
                    n["argv"] = ["sleep", "infinity"]
                    continue
                if role == "zookeeper":
                    zkn = zookeeper.ZooKeeperNode(myid=n["index"], host=n["host"], data_dir=Path(n["data_dir"]),
                                                  client_port=n["ports"]["client"], ensemble=ensemble)
                    n["argv"] = zkn.command(java=IMAGE_JAVA, cp=IMAGE_CLASSPATH)   # writes zoo.cfg, myid
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
                                                   ack_quorum=spec.ack_quorum,
                                                   **{**common, **DEPLOY_BROKER_DEFAULTS, **spec.broker_config})
                node_config.write(cfg, Path(config))
                n["config"] = config
                n["argv"] = self.commands[role](self._node_of(n, None))

    def _create_container(self, name: str) -> None:
        with self._txn() as state:
            n = state["nodes"][name]
            self._write_rules(state, name)
            restore = f"iptables-{state['iptables']}-restore"
            mounts = [n["dir"]] + (state["mounts"] if n["role"] == "client" else [])
            argv = ["create", "--name", n["container"], "--hostname", name,
                    "--network", state["network"]["name"], "--ip", n["host"],
                    "--label", f"{LABEL}={self.name}", "--label", f"pulsar-chaos.node={name}",
                    "--init", "--cap-add", "NET_ADMIN", "--env", "PYTHONUNBUFFERED=1",
                    "--stop-timeout", str(int(max(1, self.stop_timeout))),
                    "--log-opt", "max-size=1m", "--workdir", n["dir"]]
            for m in mounts:
                argv += ["--volume", f"{m}:{m}"]
            argv += [state["image"], "sh", "-c", WRAPPER, "sh", n["dir"], restore, n["container"], *n["argv"]]
            n["container_id"] = docker(*argv).stdout.strip()

    def _start_all(self) -> None:
        state = self._state()
        for role in ("zookeeper", "bookie", "broker", "client"):
            names = [n["name"] for n in state["nodes"].values() if n["role"] == role]
            for name in names:
                with self._txn() as st:
                    self._start_container(st, name)
            if role != "client":
                self._wait_healthy(names)

    def _start_container(self, state: dict[str, Any], name: str) -> None:
        """`docker start` under the state lock; returns once the node's rules are in force."""
        n = state["nodes"][name]
        self._write_rules(state, name)
        marker = Path(n["dir"]) / RULES_APPLIED
        marker.unlink(missing_ok=True)
        docker("start", n["container"])
        deadline = time.monotonic() + 15.0
        while not marker.exists():
            st = _inspect([n["container"]]).get(n["container"], {})
            if not st.get("Running") and not marker.exists():
                last = _last_line(n["log"])
                raise ClusterError(f"{name} exited with code {st.get('ExitCode')} while starting"
                                   + (f": {last}" if last else ""), f"read its log: {n['log']}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{name}'s container did not load its iptables rules within 15s",
                                   f"read its log: {n['log']}")
            time.sleep(0.05)
        st = _inspect([n["container"]]).get(n["container"], {})
        n["pid"], n["started_at"] = st.get("Pid") or n["pid"], _now()

    def _wait_healthy(self, names: Iterable[str], timeout: float | None = None) -> None:
        pending = list(names)
        limit = timeout or self.start_timeout
        deadline = time.monotonic() + limit
        while pending:
            state = self._state()
            states = _inspect(state["nodes"][n]["container"] for n in pending)
            for name in list(pending):
                n = state["nodes"][name]
                node = self._node_of(n, states.get(n["container"]))
                if not node.alive:
                    code = (states.get(n["container"]) or {}).get("ExitCode")
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
                raise ClusterError(f"{', '.join(pending)} not healthy within {limit:.0f}s", f"read {logs}")
            time.sleep(0.2)

    def down(self) -> None:
        """Stop every container, remove the containers and the network. Idempotent; logs and data stay."""
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
                    root: Path = DOCKER_ROOT) -> dict[str, Any]:
        """Remove leftovers of killed runs: the clusters of every state.json under root (or only
        `names`), then every container and network labelled `pulsar-chaos.cluster` (with one of
        `names`). Nothing without our label is touched. force=False spares clusters that look alive
        (up and detached, or their owner process still runs). Returns what it removed."""
        require_root()
        require_engine()
        wanted = set(names) if names is not None else None
        report: dict[str, Any] = {"clusters": [], "containers": [], "networks": []}
        spared: set[str] = set()
        for state_path, state in _states(root):
            if wanted is not None and state.get("name") not in wanted:
                continue
            if not force and _looks_alive(state):
                spared.add(state["name"])
                continue
            with _flock(state_path.parent / ".state.lock"):
                state = _read_state(state_path) or state
                if state.get("status") != "down" or _present(state):
                    report["clusters"].append(state["name"])
                    _teardown(state, force=True)
                    _write_json_atomic(state_path, state)
        swept = _sweep(wanted, spare=spared)
        report["containers"], report["networks"] = swept["containers"], swept["networks"]
        return report

    # ---------------------------------------------------------------- process faults
    def _running(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        n = self._entry(self._state(), name)
        if n["role"] == "client":
            raise ClusterError(f"{name} is a client host; it runs no node process")
        st = _inspect([n["container"]]).get(n["container"])
        if st is None:
            raise self._not_up()
        if not st.get("Running"):
            raise ClusterError(f"{name} is not running",
                               f"start it with `pulsar-chaos cluster start --backend docker {name}`")
        return n, st

    def start(self, name: str, wait: bool = True, timeout: float | None = None) -> Node:
        with self._txn() as state:
            n = self._entry(state, name)
            if n["role"] == "client":
                raise ClusterError(f"{name} is a client host; it runs no node process", "use run_client()")
            st = _inspect([n["container"]]).get(n["container"])
            if st is None:
                raise self._not_up()
            if st.get("Running"):
                raise ClusterError(f"{name} is already running (container {n['container']})",
                                   "stop or kill it first, or resume it if paused")
            self._start_container(state, name)
        if wait:
            self._wait_healthy([name], timeout)
        return self.node(name)

    def stop(self, name: str, timeout: float | None = None) -> None:
        """SIGTERM (through docker's init), SIGKILL after the timeout; a paused node is thawed first."""
        n, _ = self._running(name)
        t = timeout if timeout is not None else self.stop_timeout
        docker("stop", "--time", str(int(max(0, round(t)))), n["container"], timeout=t + 60)

    def kill(self, name: str) -> None:
        n, _ = self._running(name)
        docker("kill", n["container"])
        deadline = time.monotonic() + 5.0
        while _inspect([n["container"]]).get(n["container"], {}).get("Running") and time.monotonic() < deadline:
            time.sleep(0.05)

    def pause(self, name: str) -> None:
        n, st = self._running(name)
        if not st.get("Paused"):
            docker("pause", n["container"])

    def resume(self, name: str) -> None:
        n, st = self._running(name)
        if st.get("Paused"):
            docker("unpause", n["container"])

    def wipe(self, name: str) -> dict[str, Any]:
        """Delete everything a stopped node wrote into its data dir, keeping its identity (node folder,
        config.json, node.log; ZooKeeper's zoo.cfg and myid): the next start() begins empty under the
        same name, address and id. Returns what was deleted."""
        with self._txn() as state:
            n = self._entry(state, name)
            if n["role"] == "client":
                raise ClusterError(f"{name} is a client host; it has no data to wipe")
            if _inspect([n["container"]]).get(n["container"], {}).get("Running"):
                raise ClusterError(f"{name} is running; its data cannot be wiped under it",
                                   f"kill or stop it first (`pulsar-chaos cluster kill --backend docker {name}`)")
            wiped = statefile.wipe_data_dir(n)
        return {"node": name, **wiped}

    # ---------------------------------------------------------------- network faults
    def _resolve_edges(self, state: dict[str, Any], edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """Validate names and move `host` to the right: (host, b) becomes (b, host) (drops are symmetric)."""
        known = set(state["nodes"]) | {HOST}
        out = []
        for a, b in edges:
            for x in (a, b):
                if x not in known:
                    raise ClusterError(f"unknown node {x!r} in partition",
                                       "use node names from `pulsar-chaos cluster status --backend docker` "
                                       "(or 'host')")
            if a == HOST:
                a, b = b, a
            if a == HOST:
                continue
            out.append((a, b))
        return out

    def _address(self, state: dict[str, Any], name: str) -> str:
        return state["host_address"] if name == HOST else state["nodes"][name]["host"]

    def _rules(self, state: dict[str, Any], name: str) -> str:
        """The node's whole filter table: PCHAOS jumped from INPUT and OUTPUT, holding its drops and flaky links."""
        lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
                 f":{CHAIN} - [0:0]", f"-A INPUT -j {CHAIN}", f"-A OUTPUT -j {CHAIN}"]
        for a, b in state["drops"]:
            if a == name:
                ip = self._address(state, b)
                lines += [f"-A {CHAIN} -s {ip}/32 -j DROP", f"-A {CHAIN} -d {ip}/32 -j DROP"]
        for a, b, p in state["flaky"]:
            if a == name:
                ip = self._address(state, b)
                stat = f"-m statistic --mode random --probability {p:.6f}"
                lines += [f"-A {CHAIN} -s {ip}/32 {stat} -j DROP", f"-A {CHAIN} -d {ip}/32 {stat} -j DROP"]
        return "\n".join(lines + ["COMMIT", ""])

    def _write_rules(self, state: dict[str, Any], name: str) -> str:
        n = state["nodes"][name]
        text = self._rules(state, name)
        path = Path(n["dir"]) / RULES_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return text

    def _sync_rules(self, state: dict[str, Any], names: Iterable[str]) -> None:
        """Rewrite these nodes' rule files and load them into every running (or paused) container;
        a stopped one loads its file when it starts."""
        names = sorted(set(names))
        states = _inspect(state["nodes"][n]["container"] for n in names)
        for name in names:
            text = self._write_rules(state, name)
            st = states.get(state["nodes"][name]["container"]) or {}
            if st.get("Running") and st.get("Pid"):
                hostnet.run(["nsenter", "-t", str(st["Pid"]), "-n", "iptables-restore", "-w", "5"], input=text)

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

    def _link(self, state: dict[str, Any], src: str, dst: str, what: str) -> tuple[str, str]:
        """One link (a, b) of two different nodes; `host` goes right (its rules live in a's container)."""
        (a, b), = self._resolve_edges(state, {(src, dst)}) or [(None, None)]
        if a is None or a == b:
            raise ClusterError(f"{what} needs two different nodes, got {src!r} and {dst!r}")
        return a, b

    def flaky(self, src: str, dst: str, p: float) -> None:
        if not 0.0 < p <= 1.0:
            raise ClusterError(f"drop probability {p} out of range", "use 0 < p <= 1")
        with self._txn() as state:
            a, b = self._link(state, src, dst, "flaky")
            state["flaky"].append([a, b, p])
            self._sync_rules(state, [a])

    def unflaky(self, src: str, dst: str, p: float) -> None:
        """Undo one earlier flaky(src, dst, p); a no-op when heal() removed it meanwhile."""
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
            self._sync_rules(state, state["nodes"])

    def exec(self, name: str, argv: list[str], timeout: float = 30.0,
             **run_kw: Any) -> subprocess.CompletedProcess:
        """Run a short command in a node's container and wait for it: for probes."""
        n = self._entry(self._state(), name)
        return subprocess.run(["docker", "exec", n["container"], *argv], timeout=timeout,
                              capture_output=True, text=True, **run_kw)

    # ---------------------------------------------------------------- clients
    def run_client(self, argv: list[str], node: str | None = None, **popen_kw: Any) -> subprocess.Popen:
        """Run argv in a client container (client-1 unless `node` names another) with `docker exec`;
        stdout/stderr go to that host's node.log unless popen_kw says otherwise. argv[0] naming a
        Python runs the image's; `cwd` is honoured inside mounted folders; of `env`, what differs
        from this process's environment is passed on. Returns a Popen whose send_signal, terminate
        and kill reach the command's process group inside the container."""
        state = self._state()
        if node is None:
            clients = [n for n in state["nodes"].values() if n["role"] == "client"]
            if not clients:
                raise ClusterError("this cluster has no client host", "create it with clients >= 1")
            n = clients[0]
        else:
            n = self._entry(state, node)
        visible = [n["dir"]] + (state.get("mounts", []) if n["role"] == "client" else [])

        def inside(path: str) -> bool:
            return any(path == m or path.startswith(m.rstrip("/") + "/") for m in visible)

        argv = list(argv)
        if argv and re.fullmatch(r"python3?(\.\d+)?", Path(argv[0]).name):
            argv[0] = VENV_PYTHON
        for arg in argv[1:]:
            if (arg.startswith("/") and not arg.startswith(SYSTEM_DIRS) and os.path.exists(arg)
                    and not inside(os.path.realpath(arg))):
                raise ClusterError(f"{arg} is not visible in {n['name']}'s container",
                                   "deploy the cluster with mounts=[<its folder>] (the runner mounts its run folder)")
        opts = ["--env", "PYTHONUNBUFFERED=1"]
        cwd = popen_kw.pop("cwd", None)
        if cwd is not None and inside(os.path.realpath(str(cwd))):
            opts += ["--workdir", os.path.realpath(str(cwd))]
        env = popen_kw.pop("env", None)
        for k, v in (env or {}).items():
            if os.environ.get(k) != v and k not in ("PATH", "VIRTUAL_ENV", "PYTHONHOME"):
                opts += ["--env", f"{k}={v}"]
        popen_kw.setdefault("start_new_session", True)
        popen_kw.setdefault("stdin", subprocess.DEVNULL)
        execs = Path(n["dir"]) / "exec"
        execs.mkdir(parents=True, exist_ok=True)
        pidfile = execs / f"{os.getpid()}-{time.monotonic_ns()}.pid"
        log = None
        if "stdout" not in popen_kw:
            log = popen_kw["stdout"] = open(n["log"], "ab")
            popen_kw.setdefault("stderr", subprocess.STDOUT)
        try:
            proc = DockerExec(n["container"], pidfile, argv, opts, **popen_kw)
        finally:
            if log is not None:
                log.close()
        with self._txn() as st:
            st["clients"] = st["clients"][-63:] + [{"node": n["name"], "exec_pid": proc.pid,
                                                    "pidfile": str(pidfile), "argv": argv}]
        return proc


class DockerExec(subprocess.Popen):
    """`docker exec` of a command in a container: a Popen of the docker client whose signals reach
    the command inside (docker forwards none). The command writes its pid (it leads its own process
    group there) to `pidfile`, a file in a bind-mounted folder; a signal goes to that group with
    `docker exec <container> kill`. The client exits with the command's status (128+N after signal N)."""

    def __init__(self, container: str, pidfile: Path, argv: list[str], opts: list[str], **popen_kw: Any):
        self.container, self.pidfile = container, Path(pidfile)
        super().__init__(["docker", "exec", *opts, container, "sh", "-c", 'echo $$ > "$0"; exec "$@"',
                          str(pidfile), *argv], **popen_kw)

    def inner_pid(self, wait: float = 5.0) -> int | None:
        """The command's pid inside the container (None once it ended before writing it)."""
        deadline = time.monotonic() + wait
        while True:
            with contextlib.suppress(OSError, ValueError):
                return int(self.pidfile.read_text().strip())
            if self.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        pid = self.inner_pid()
        if pid is not None:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                cp = subprocess.run(["docker", "exec", self.container, "kill", f"-{int(sig)}", "--", f"-{pid}"],
                                    capture_output=True, timeout=20)
                if cp.returncode == 0:
                    return
        if self.poll() is None:                 # the container is gone or frozen: end the client at least
            super().send_signal(sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# -------------------------------------------------------------------- teardown, shared by down and cleanup

def _present(state: dict[str, Any]) -> bool:
    """Does anything labelled with this cluster's name still exist?"""
    return bool(_labelled("container", [state["name"]]) or _labelled("network", [state["name"]]))


def _looks_alive(state: dict[str, Any]) -> bool:
    if state.get("status") == "down":
        return False
    if state.get("detached") and state.get("status") == "up":
        return _present(state)
    return procs.alive(state.get("owner_pid"), state.get("owner_start"))


def _teardown(state: dict[str, Any], force: bool, stop_timeout: float = 10.0) -> None:
    """Stop the containers (brokers and clients, then bookies, then ZooKeeper), remove them and the
    network; mark the state down. Logs and data stay in the node folders."""
    state["status"] = "stopping"
    nodes = state["nodes"]
    existing = _inspect(n["container"] for n in nodes.values())
    for roles in ROLE_STOP_ORDER:
        running = [n["container"] for n in nodes.values()
                   if n["role"] in roles and (existing.get(n["container"]) or {}).get("Running")]
        if running:
            t = 2 if force else int(max(1, round(stop_timeout)))
            docker("stop", "--time", str(t), *running, check=False, timeout=t + 60)
    ours = [n["container"] for n in nodes.values() if n["container"] in existing]
    ours += [cid for cid, _ in _labelled("container", [state["name"]])]
    if ours:
        docker("rm", "--force", "--volumes", *dict.fromkeys(ours), check=False, timeout=120)
    nets = [cid for cid, _ in _labelled("network", [state["name"]])]
    if nets:
        docker("network", "rm", *nets, check=False)
    state["status"] = "down"
    state["down_at"] = _now()
    state["drops"], state["flaky"], state["drop_counts"] = [], [], {}


def _sweep(names: set[str] | None, spare: Iterable[str] = ()) -> dict[str, list[str]]:
    """Remove containers, then networks, labelled ours (with one of `names`, or any but `spare`)."""
    spare = set(spare)
    out: dict[str, list[str]] = {"containers": [], "networks": []}
    for kind in ("container", "network"):
        ids = [cid for cid, cluster in _labelled(kind, names) if cluster not in spare]
        if not ids:
            continue
        if kind == "container":
            docker("rm", "--force", "--volumes", *ids, check=False, timeout=120)
        else:
            docker("network", "rm", *ids, check=False)
        out[kind + "s"] = ids
    return out
