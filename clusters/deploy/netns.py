"""The network-namespace backend: one namespace per node on a private bridge, faults by signal and iptables.

Every pid, namespace, link and host rule is recorded in <base_dir>/state.json before or as it is
created (the lifecycle of `lifecycle.StateFileCluster`), so `down()` from any process, or
`cleanup_all()` after a killed run, can remove it all.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from clusters import zookeeper
from clusters.deploy import delay, faketime, hostnet, procs
from clusters.deploy.backend import ClusterError, Unsupported
from clusters.deploy.lifecycle import CHAIN, Seen, StateFileCluster, short_id
from clusters.deploy.spec import ROOT, ClusterSpec  # noqa: F401  (ClusterSpec: tests and tools import it from here)
from clusters.deploy.statefile import last_line as _last_line
from clusters.deploy.statefile import now as _now

VETH_CODE = {"zookeeper": "z", "bookie": "k", "broker": "b", "client": "c"}


def require_tools() -> None:
    for tool, pkg in (("ip", "iproute2"), ("iptables", "iptables"), ("iptables-restore", "iptables")):
        if not hostnet.have(tool):
            raise ClusterError(f"{tool} not found", f"apt-get install {pkg}")


def _restore(namespace: str, lines: list[str], check: bool = True) -> None:
    """Apply iptables lines to a namespace's filter table in one commit, keeping what is not named."""
    hostnet.run(["ip", "netns", "exec", namespace, "iptables-restore", "--noflush", "-w", "5"],
                input="*filter\n" + "".join(line + "\n" for line in lines) + "COMMIT\n", check=check)


class NetnsCluster(StateFileCluster):
    """A cluster whose nodes are network namespaces on a bridge `pc-<id>-br` of the host."""

    backend = "netns"
    root = ROOT
    host_key = "namespace"
    root_needed_for = "network namespaces and iptables"

    @classmethod
    def preflight(cls) -> None:
        cls.require()
        require_tools()
        try:
            zookeeper.classpath()
            zookeeper.java_binary()
        except zookeeper.ZooKeeperMissing as ex:
            raise ClusterError(str(ex)) from None

    @property
    def bridge(self) -> str:
        return f"{hostnet.PREFIX}{self.id}-br"

    def _namespace(self, node_name: str) -> str:
        return f"{hostnet.PREFIX}{self.id}-{node_name}"

    def _veth(self, role: str, index: int) -> str:
        name = f"{hostnet.PREFIX}{self.id}-{VETH_CODE[role]}{index}"
        assert len(name) <= 15, name
        return name

    # ---------------------------------------------------------------- state and inventory
    def _plan_node(self, name: str, role: str, index: int) -> dict[str, Any]:
        return {"namespace": self._namespace(name), "veth": self._veth(role, index), "netns_ino": None,
                "pid_start": None}

    def _plan_cluster(self, subnet: str) -> dict[str, Any]:
        return {"bridge": {"name": self.bridge, "address": subnet.rsplit(".", 1)[0] + ".1/24"},
                "host_rules": [], "slow": []}

    def _seen(self, entries: list[dict[str, Any]]) -> dict[str, Seen]:
        out = {}
        for n in entries:
            st = procs.state(n["pid"], n["pid_start"]) if n["pid"] else "dead"
            word = "no process" if n["role"] == "client" else "dead" if n["pid"] else "never started"
            out[n["name"]] = Seen(alive=st != "dead", paused=st == "paused", pid=n["pid"],
                                  exit_code=procs.exit_code(n["pid"]),
                                  host=procs.netns_inode(n["namespace"]) is not None, word=word)
        return out

    def _status_extra(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"bridge": state["bridge"]["name"], "slow": state.get("slow", []),
                "clients": [{**c, "alive": procs.alive(c["pid"], c["pid_start"])} for c in state["clients"]]}

    def _on_host(self, n: dict[str, Any]) -> list[str]:
        return ["ip", "netns", "exec", n["namespace"]]

    # ---------------------------------------------------------------- hosts and processes
    def _create_network(self, state: dict[str, Any]) -> None:
        """The bridge, with the host's address on it, and tagged host rules for its traffic."""
        br = state["bridge"]
        hostnet.run(["ip", "link", "add", "name", br["name"], "type", "bridge"])
        hostnet.run(["ip", "addr", "add", br["address"], "dev", br["name"]])
        hostnet.run(["ip", "link", "set", br["name"], "up"])
        b = br["name"]
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

    def _spawn(self, state: dict[str, Any], n: dict[str, Any]) -> None:
        log_path = Path(n["log"])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(f"=== pulsar-chaos {_now()}: starting {n['name']} in {n['namespace']}\n".encode())
            log.flush()
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            if n["role"] in self.spec.fake_clocks:      # its wall clock follows set_clock()
                n["clock_offset"] = n.get("clock_offset") or 0.0   # a restart keeps the offset
                n["clock_file"] = str(faketime.ensure_file(Path(n["dir"]), n["clock_offset"]))
                env = faketime.environment(env, Path(n["clock_file"]))
            proc = subprocess.Popen([*self._on_host(n), *n["argv"]],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=n["dir"], env=env, start_new_session=True)
        procs.adopt(proc)
        n["pid"], n["pid_start"], n["started_at"] = proc.pid, procs.start_time(proc.pid), _now()

    def _signal(self, n: dict[str, Any], seen: Seen, action: str, timeout: float = 0.0) -> None:
        pid, started = n["pid"], n["pid_start"]
        if action == "stop":
            procs.terminate([(pid, started)], timeout)
        elif action == "kill":
            procs.signal_group(pid, signal.SIGKILL, started)
            procs.wait_dead([(pid, started)], 5.0)
        else:
            sig, until = (signal.SIGSTOP, "paused") if action == "pause" else (signal.SIGCONT, "running")
            procs.signal_group(pid, sig, started)
            procs.wait_state(pid, started, (until, "dead"), 2.0)   # signal delivery is asynchronous

    def power_loss(self, names: Iterable[str]) -> dict[str, Any]:
        """Cut the power of these nodes at once: freeze their lazyfs mounts (writes wait), SIGKILL every
        named node's process group, `crash` each mount (what was not fsync'ed is gone; the held writes
        fail), wait until the processes are dead, thaw the mounts. Nodes already dead lose their
        un-fsync'ed writes too. They stay down until start(). Returns {node: {"dropped_bytes",
        "dropped_files", "removed_files", "pid"}} (pid: the process killed, or None)."""
        from clusters.deploy import lazyfs
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

    # ---------------------------------------------------------------- network faults
    def _sync_rules(self, state: dict[str, Any], names: Iterable[str]) -> None:
        """Rewrite each node's PCHAOS chain in one commit (a namespace that is gone is skipped)."""
        for name in sorted(set(names)):
            ns = state["nodes"][name]["namespace"]
            if procs.netns_inode(ns):
                _restore(ns, [f"-F {CHAIN}", *self._chain_rules(state, name)])

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
                proc = subprocess.Popen([*self._on_host(n), *delay.argv(queue, d, n["namespace"], ready)],
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
            _restore(n["namespace"], entry["rules"])

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
                _restore(e["namespace"], [r.replace("-A ", "-D ", 1) for r in e["rules"]], check=False)
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
        """Also ends every slow link (and flushes what a killed slow() call may have left)."""
        with self._txn() as state:
            super().heal()
            self._end_slow(state, state.get("slow", []))
            state["slow"] = []
            if state.get("slow_seq"):
                for n in state["nodes"].values():
                    if procs.netns_inode(n["namespace"]):
                        hostnet.run([*self._on_host(n), "iptables", "-w", "5", "-F", delay.CHAIN], check=False)

    # ---------------------------------------------------------------- clients
    def run_client(self, argv: list[str], node: str | None = None, **popen_kw: Any) -> subprocess.Popen:
        """Run argv in a client host's namespace (client-1 unless `node` names another), in its own
        session; stdout/stderr go to that host's node.log unless popen_kw says otherwise."""
        with self._txn() as state:
            n = self._client_entry(state, node)
            popen_kw.setdefault("start_new_session", True)
            popen_kw.setdefault("stdin", subprocess.DEVNULL)
            log = None
            if "stdout" not in popen_kw:       # by default a client's output goes to its host's log
                Path(n["log"]).parent.mkdir(parents=True, exist_ok=True)
                log = popen_kw["stdout"] = open(n["log"], "ab")
                popen_kw.setdefault("stderr", subprocess.STDOUT)
            try:
                proc = subprocess.Popen([*self._on_host(n), *argv], **popen_kw)
            finally:
                if log is not None:
                    log.close()
            procs.adopt(proc)
            state["clients"] = [c for c in state["clients"] if procs.alive(c["pid"], c["pid_start"])]
            state["clients"].append({"node": n["name"], "pid": proc.pid, "pid_start": procs.start_time(proc.pid),
                                     "argv": list(argv), "namespace": n["namespace"],
                                     "netns_ino": n["netns_ino"]})
        return proc

    # ---------------------------------------------------------------- teardown and cleanup
    @classmethod
    def is_present(cls, state: dict[str, Any]) -> bool:
        if hostnet.link_exists(state["bridge"]["name"]):
            return True
        spaces = set(hostnet.netns_list())
        for n in state["nodes"].values():
            if n["namespace"] in spaces or (n["pid"] and procs.alive(n["pid"], n["pid_start"])):
                return True
        return False

    @classmethod
    def _stop_roles(cls, state: dict[str, Any], roles: tuple[str, ...], timeout: float) -> None:
        """Only pids that still run inside the node's namespace; with clients, run_client's processes
        and the slow links' delay daemons."""
        entries = [n for n in state["nodes"].values() if n["role"] in roles and n["pid"]]
        if "client" in roles:
            entries += state.get("clients", []) + [e for e in state.get("slow", []) if e.get("pid")]
        targets = [(e["pid"], e["pid_start"]) for e in entries
                   if _ours(e["pid"], e["pid_start"], e["namespace"], e.get("netns_ino"))]
        if targets:
            procs.terminate(targets, timeout)

    @classmethod
    def _remove(cls, state: dict[str, Any], timeout: float) -> dict[str, list[int]]:
        """Lazy disks' daemons and mounts, links, namespaces, the bridge and the host rules."""
        nodes = state["nodes"]
        _stop_lazy_disks(nodes.values(), timeout)
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
        state["slow"] = []
        return left

    @classmethod
    def _sweep(cls, names: set[str] | None, spare: set[str] = frozenset()) -> dict[str, Any]:
        """Namespaces, links, host rules and lazyfs mounts carrying our prefix and the clusters' short
        ids. Processes are never killed here: unrecorded pids are only reported."""
        ids = {short_id(n) for n in names} if names is not None else None
        spare = {short_id(n) for n in spare}

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

