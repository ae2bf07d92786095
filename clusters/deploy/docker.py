"""The Docker backend: one container per node on an internal bridge network, faults by docker and iptables.

Every cluster is a user-defined bridge network `pcd-<name>` (created `--internal`: no route out; the
host reaches every node through the bridge, whose gateway .1 is `host_address`) on a free private
/24, and one container `pcd-<name>-<node>` per node at a fixed address (the netns backend's last
octets: ADDRESS_BASE). Each node's folder <base_dir>/nodes/<node> (config, data, node.log) is
bind-mounted at the same path, so logs and data outlive restarts and `down()`. Every container and
network carries the label `pulsar-chaos.cluster=<name>`: cleanup removes only what is labelled ours.
The state (container ids, addresses, partitions) is <base_dir>/state.json, kept by the lifecycle
both backends share (`lifecycle.StateFileCluster`), under /tmp/pulsar-chaos/docker/<name> so that both
backends may use the same cluster names.

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
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from clusters import zookeeper
from clusters.deploy import hostnet
from clusters.deploy.backend import ClusterError, Unsupported
from clusters.deploy.lifecycle import CHAIN, Seen, StateFileCluster
from clusters.deploy.spec import ROOT, ClusterSpec
from clusters.deploy.statefile import last_line as _last_line
from clusters.deploy.statefile import now as _now

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


# ------------------------------------------------------------------------------------ the cluster

class DockerCluster(StateFileCluster):
    """A cluster whose nodes are containers of the node image on an internal bridge network."""

    backend = "docker"
    root = DOCKER_ROOT
    host_key = "container"
    root_needed_for = "docker, nsenter, iptables"
    python = VENV_PYTHON                  # the Python on the hosts, for commands run with exec()
    java, zk_classpath = IMAGE_JAVA, IMAGE_CLASSPATH
    client_argv = ["sleep", "infinity"]

    def __init__(self, spec: ClusterSpec, *, image: str | None = None, mounts: Iterable[str | Path] = (),
                 **kw: Any):
        for field_name in ("fake_clocks", "lazy_disks"):
            if getattr(spec, field_name, None):
                raise Unsupported(f"the docker backend cannot deploy {field_name}={getattr(spec, field_name)!r}",
                                  "use --backend netns for clock skew and power loss")
        super().__init__(spec, **kw)
        self.image, self.image_id = image, None
        self.mounts = [str(Path(m).resolve()) for m in mounts]

    @classmethod
    def require(cls) -> None:
        super().require()
        require_engine()

    @classmethod
    def preflight(cls) -> None:
        """Root, docker, an engine, iptables-restore and nsenter, the image of the sources as they are."""
        cls.require()
        for tool, pkg in (("iptables-restore", "iptables"), ("nsenter", "util-linux")):
            if not hostnet.have(tool):
                raise ClusterError(f"{tool} not found", f"apt-get install {pkg}")
        require_image(current_image())

    def _prepare(self) -> None:
        self.require()
        self.image = self.image or current_image()
        self.image_id = require_image(self.image)

    @classmethod
    def for_run(cls, spec: ClusterSpec, run_dir: Path) -> "DockerCluster":
        return cls(spec, mounts=[run_dir])          # its client container sees the run folder at the same path

    @classmethod
    def _attach_kwargs(cls, state: dict[str, Any]) -> dict[str, Any]:
        return {"image": state.get("image"), "mounts": state.get("mounts", [])}

    @property
    def network(self) -> str:
        return f"{PREFIX}{self.name}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.id}"

    # ---------------------------------------------------------------- state and inventory
    def _plan_node(self, name: str, role: str, index: int) -> dict[str, Any]:
        return {"container": f"{PREFIX}{self.name}-{name}", "container_id": None}

    def _plan_cluster(self, subnet: str) -> dict[str, Any]:
        return {"image": self.image, "image_id": self.image_id, "mounts": self.mounts,
                "iptables": iptables_variant(), "network": {"name": self.network, "id": None, "bridge": self.bridge}}

    def _taken_subnets(self) -> list[str]:
        return _docker_subnets()

    def _seen(self, entries: list[dict[str, Any]]) -> dict[str, Seen]:
        states = _inspect(n["container"] for n in entries)
        out = {}
        for n in entries:
            st = states.get(n["container"])
            running = bool(st and st.get("Running"))
            out[n["name"]] = Seen(
                alive=running, paused=running and bool(st.get("Paused")),     # type: ignore[union-attr]
                pid=(st.get("Pid") or n["pid"]) if running else n["pid"],      # type: ignore[union-attr]
                exit_code=(st or {}).get("ExitCode"), host=st is not None,
                word="absent" if st is None else "never started" if not n["started_at"] else
                f"exited ({st.get('ExitCode')})")
        return out

    def _status_extra(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"image": state["image"], "network": state["network"]["name"], "bridge": state["network"]["bridge"]}

    def _on_host(self, n: dict[str, Any]) -> list[str]:
        return ["docker", "exec", n["container"]]

    # ---------------------------------------------------------------- hosts and processes
    def _create_network(self, state: dict[str, Any]) -> None:
        cp = docker("network", "create", "--driver", "bridge", "--internal",
                    "--subnet", state["subnet"], "--gateway", state["host_address"],
                    "--opt", f"com.docker.network.bridge.name={self.bridge}",
                    "--label", f"{LABEL}={self.name}", self.network)
        with self._txn() as st:
            st["network"]["id"] = cp.stdout.strip()

    def _create_host(self, name: str) -> None:
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

    def _spawn(self, state: dict[str, Any], n: dict[str, Any]) -> None:
        """`docker start` of the same container; returns once the node's rules are in force."""
        name = n["name"]
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

    def _signal(self, n: dict[str, Any], seen: Seen, action: str, timeout: float = 0.0) -> None:
        """stop: docker's init gets SIGTERM (a paused container is thawed first); pause: the cgroup freezer."""
        c = n["container"]
        if action == "stop":
            docker("stop", "--time", str(int(max(0, round(timeout)))), c, timeout=timeout + 60)
        elif action == "kill":
            docker("kill", c)
            deadline = time.monotonic() + 5.0
            while _inspect([c]).get(c, {}).get("Running") and time.monotonic() < deadline:
                time.sleep(0.05)
        elif action == "pause" and not seen.paused:
            docker("pause", c)
        elif action == "resume" and seen.paused:
            docker("unpause", c)

    # ---------------------------------------------------------------- network faults
    def _write_rules(self, state: dict[str, Any], name: str) -> str:
        """The node's whole filter table (PCHAOS jumped from INPUT and OUTPUT) into its folder, where
        the container's wrapper loads it at start."""
        n = state["nodes"][name]
        text = "\n".join(["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
                          f":{CHAIN} - [0:0]", f"-A INPUT -j {CHAIN}", f"-A OUTPUT -j {CHAIN}",
                          *self._chain_rules(state, name), "COMMIT", ""])
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

    # ---------------------------------------------------------------- clients
    def run_client(self, argv: list[str], node: str | None = None, **popen_kw: Any) -> subprocess.Popen:
        """Run argv in a client container (client-1 unless `node` names another) with `docker exec`;
        stdout/stderr go to that host's node.log unless popen_kw says otherwise. argv[0] naming a
        Python runs the image's; `cwd` is honoured inside mounted folders; of `env`, what differs
        from this process's environment is passed on. Returns a Popen whose send_signal, terminate
        and kill reach the command's process group inside the container."""
        state = self._state()
        n = self._client_entry(state, node)
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

    # ---------------------------------------------------------------- teardown and cleanup
    @classmethod
    def is_present(cls, state: dict[str, Any]) -> bool:
        """Is anything labelled with this cluster's name still there?"""
        return bool(_labelled("container", [state["name"]]) or _labelled("network", [state["name"]]))

    @classmethod
    def _stop_roles(cls, state: dict[str, Any], roles: tuple[str, ...], timeout: float) -> None:
        containers = [n["container"] for n in state["nodes"].values() if n["role"] in roles]
        running = [c for c, st in _inspect(containers).items() if st.get("Running")]
        if running:
            t = int(max(1, round(timeout)))
            docker("stop", "--time", str(t), *running, check=False, timeout=t + 60)

    @classmethod
    def _remove(cls, state: dict[str, Any], timeout: float) -> dict[str, list[int]]:
        """The recorded containers and anything else labelled with the cluster's name, then its network."""
        recorded = [n["container"] for n in state["nodes"].values()]
        ours = list(_inspect(recorded)) + [cid for cid, _ in _labelled("container", [state["name"]])]
        if ours:
            docker("rm", "--force", "--volumes", *dict.fromkeys(ours), check=False, timeout=120)
        nets = [cid for cid, _ in _labelled("network", [state["name"]])]
        if nets:
            docker("network", "rm", *nets, check=False)
        return {}

    @classmethod
    def _sweep(cls, names: set[str] | None, spare: set[str] = frozenset()) -> dict[str, Any]:
        """Containers, then networks, labelled ours (with one of `names`, or any but `spare`)."""
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

