"""Flaky links, slow links and clock skew: the nemeses' draws and bookkeeping on an in-memory
cluster, then the netns backend's mechanisms on real namespaces (iptables statistic, the NFQUEUE
delay daemon, libfaketime) and real bookies and brokers under skew and delay."""
from __future__ import annotations

import calendar
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from clusters.deploy import delay, faketime, procs
from clusters.deploy.backend import ClusterError, SpecError, Unsupported
from clusters.deploy.health import tcp_accepts
from clusters.deploy.netns import NetnsCluster
from clusters.deploy.spec import ClusterSpec
from nemesis.base import NemesisContext, NemesisError
from nemesis.clock import ClockNemesis
from nemesis.registry import make
from nemesis.links import FlakyNemesis, SlowNemesis
from tests.nemesis.fakes import FakeCluster
from tests.netns import netns_cluster

PROBE = Path(__file__).with_name("clock_probe.py")
integration = pytest.mark.integration


# ------------------------------------------------------------------ in-memory: draws and bookkeeping

class RecordingCluster(FakeCluster):
    """FakeCluster plus the clock and link calls, recorded in order; `fail` makes a call raise."""

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.fail: dict[str, int] = {}          # method -> fail from its n-th call on (0-based)
        self.counts: dict[str, int] = {}
        self.clocks: dict[str, float] = {}

    def _call(self, method: str, *args: Any) -> None:
        n = self.counts.get(method, 0)
        self.counts[method] = n + 1
        if method in self.fail and n >= self.fail[method]:
            raise Unsupported(f"{method} refused")
        self.calls.append((method, args))

    def set_clock(self, name: str, offset_s: float) -> None:
        self._call("set_clock", name, offset_s)
        self.clocks[name] = offset_s

    def flaky(self, src: str, dst: str, p: float) -> None:
        self._call("flaky", src, dst, p)

    def unflaky(self, src: str, dst: str, p: float) -> None:
        self._call("unflaky", src, dst, p)

    def slow(self, src: str, dst: str, delay_ms: float) -> None:
        self._call("slow", src, dst, delay_ms)

    def unslow(self, src: str, dst: str, delay_ms: float) -> None:
        self._call("unslow", src, dst, delay_ms)


def ctx_of(cluster: Any, seed: int = 0) -> NemesisContext:
    return NemesisContext(cluster=cluster, rng=random.Random(seed))


@pytest.mark.parametrize("cls", [ClockNemesis, FlakyNemesis, SlowNemesis])
def test_choose_is_a_function_of_the_seed_and_layout(cls):
    cluster = RecordingCluster()
    plans = [[cls().choose(ctx) for _ in range(5)] for ctx in (ctx_of(cluster, 7), ctx_of(cluster, 7))]
    assert plans[0] == plans[1]
    assert json.loads(json.dumps(plans[0])) == plans[0]            # journal-able as is
    others = [cls().choose(ctx_of(cluster, s)) for s in range(40)]
    assert len({json.dumps(p, sort_keys=True) for p in others}) > 30
    assert cluster.calls == []                                    # choose() draws, nothing else


def test_clock_draws_cover_both_modes_within_range():
    cluster = RecordingCluster()
    plans = [ClockNemesis().choose(ctx_of(cluster, s)) for s in range(200)]
    assert {p["mode"] for p in plans} == {"bump", "strobe"}
    assert {p["node"] for p in plans} == {"bookie-1", "bookie-2", "bookie-3", "broker-1", "broker-2"}
    bumps = [p["offset_s"] for p in plans if p["mode"] == "bump"]
    assert all(1.0 <= abs(o) <= 300.0 for o in bumps) and min(bumps) < 0 < max(bumps)
    for p in plans:
        if p["mode"] == "strobe":
            assert p["offsets"][0] == 0.0 and 1.0 <= abs(p["offsets"][1]) <= 300.0
            assert 1000 <= p["period_ms"] <= 3000
    # a fixed mode still makes the same draws: the node sequence is the same
    fixed = [ClockNemesis(mode="bump").choose(ctx_of(cluster, s)) for s in range(200)]
    assert [p["node"] for p in fixed] == [p["node"] for p in plans]
    assert {p["mode"] for p in fixed} == {"bump"}


def test_clock_bump_sets_then_resets():
    cluster = RecordingCluster()
    nem = ClockNemesis()
    ctx = ctx_of(cluster)
    v = nem.start(ctx, {"node": "broker-2", "mode": "bump", "offset_s": -42.5})
    assert v == {"node": "broker-2", "role": "broker", "mode": "bump", "offset_s": -42.5}
    assert cluster.clocks == {"broker-2": -42.5} and nem.is_active()
    assert "broker-2 -42.5 s" in nem.describe()
    out = nem.stop(ctx)
    assert out == {"node": "broker-2", "mode": "bump", "reset": ["broker-2"]}
    assert cluster.clocks == {"broker-2": 0.0} and not nem.is_active()
    assert nem.stop(ctx) == {}


def test_clock_strobe_flips_until_stopped():
    cluster = RecordingCluster()
    nem = ClockNemesis()
    ctx = ctx_of(cluster)
    nem.start(ctx, {"node": "bookie-1", "mode": "strobe", "offsets": [0.0, 30.0], "period_ms": 50})
    time.sleep(0.6)
    out = nem.stop(ctx)
    seen = [a[1] for m, a in cluster.calls if m == "set_clock"]
    assert seen[0] == 30.0 and seen[-1] == 0.0
    flips = seen[1:-1]
    assert out["flips"] == len(flips) >= 4
    assert flips[:4] == [0.0, 30.0, 0.0, 30.0]                    # alternating
    n = len(cluster.calls)
    time.sleep(0.2)
    assert len(cluster.calls) == n                                # the thread is gone


def test_clock_refused_leaves_nothing_applied():
    cluster = RecordingCluster()
    cluster.fail["set_clock"] = 0
    nem = ClockNemesis()
    with pytest.raises(Unsupported):
        nem.start(ctx_of(cluster), {"node": "broker-1", "mode": "bump", "offset_s": 5.0})
    assert nem.applied is None
    with pytest.raises(NemesisError, match="zookeeper"):
        nem.start(ctx_of(cluster), {"node": "zk-1", "mode": "bump", "offset_s": 5.0})
    assert nem.applied is None


def test_flaky_node_shape_touches_every_server_link_of_the_node_and_undoes_only_those():
    cluster = RecordingCluster()
    ctx = ctx_of(cluster)
    nem = FlakyNemesis()
    v = nem.start(ctx, {"shape": "node", "node": "bookie-2", "p": 0.25})
    peers = ["bookie-1", "bookie-3", "broker-1", "broker-2", "zk-1"]
    assert v["links"] == [["bookie-2", p] for p in peers] and v["p"] == 0.25 and v["node"] == "bookie-2"
    assert [c for c in cluster.calls if c[0] == "flaky"] == [("flaky", ("bookie-2", p, 0.25)) for p in peers]
    out = nem.stop(ctx)
    assert out == {"links": v["links"], "p": 0.25, "node": "bookie-2"}
    assert [c for c in cluster.calls if c[0] == "unflaky"] == [("unflaky", ("bookie-2", p, 0.25)) for p in peers]
    assert nem.stop(ctx) == {}


def test_link_fault_half_applied_undoes_what_it_did():
    cluster = RecordingCluster()
    cluster.fail["slow"] = 2                      # the third link fails
    ctx = ctx_of(cluster)
    nem = SlowNemesis()
    with pytest.raises(Unsupported):
        nem.start(ctx, {"shape": "node", "node": "broker-1", "delay_ms": 100.0})
    assert nem.is_active() and nem.applied["applied_links"] == [["broker-1", "bookie-1"], ["broker-1", "bookie-2"]]
    nem.stop(ctx)
    assert [c for c in cluster.calls if c[0] == "unslow"] == [("unslow", ("broker-1", "bookie-1", 100.0)),
                                                            ("unslow", ("broker-1", "bookie-2", 100.0))]
    cluster2 = RecordingCluster()
    cluster2.fail["flaky"] = 0                    # the first link fails: nothing applied
    nem2 = FlakyNemesis()
    with pytest.raises(Unsupported):
        nem2.start(ctx_of(cluster2), {"shape": "pairs", "links": [["zk-1", "broker-1"]], "p": 0.3})
    assert nem2.applied is None


def test_link_pairs_draws():
    cluster = RecordingCluster()
    for s in range(100):
        p = FlakyNemesis(shape="pairs").choose(ctx_of(cluster, s))
        assert p["shape"] == "pairs" and 1 <= len(p["links"]) <= 3 and 0.2 <= p["p"] <= 0.5
        assert all(a < b and a != b for a, b in p["links"]) and len({tuple(x) for x in p["links"]}) == len(p["links"])
        d = SlowNemesis(shape="node").choose(ctx_of(cluster, s))
        assert d["shape"] == "node" and d["node"].startswith(("bookie", "broker")) and 50 <= d["delay_ms"] <= 500


def test_targets_name_the_nodes():
    cluster = RecordingCluster()
    ctx = ctx_of(cluster)
    flaky = make("flaky:broker-1")
    v = flaky.start(ctx, flaky.choose(ctx))
    assert v["node"] == "broker-1" and v["selector"] == "broker-1"
    assert [x for x, _ in v["links"]] == ["broker-1"] * 5
    flaky.stop(ctx)
    clock = make("clock:bookie")
    plan = clock.choose(ctx)
    v = clock.start(ctx, plan)
    assert v["node"] == plan["node"] and v["node"].startswith("bookie-") and cluster.clocks[v["node"]] != 0
    clock.stop(ctx)
    assert cluster.clocks[v["node"]] == 0.0


def test_registry_names():
    assert isinstance(make("clock"), ClockNemesis) and make("clock:broker-2").selector == "broker-2"
    assert isinstance(make("flaky"), FlakyNemesis) and isinstance(make("slow:owner"), SlowNemesis)
    with pytest.raises(ValueError):
        make("clock:nonsense")


def test_spec_fake_clocks_validated():
    assert ClusterSpec(fake_clocks=["bookie", "broker"]).validate().fake_clocks == ["bookie", "broker"]
    assert ClusterSpec().fake_clocks == []
    with pytest.raises(SpecError, match="fake_clocks"):
        ClusterSpec(fake_clocks=["zookeeper"]).validate()
    with pytest.raises(SpecError, match="fake_clocks"):
        ClusterSpec(fake_clocks="broker").validate()
    spec = ClusterSpec(name="x", fake_clocks=["broker"])
    assert ClusterSpec.from_json(spec.to_json()).fake_clocks == ["broker"]


def test_faketime_environment_and_offset_file(tmp_path, monkeypatch):
    path = faketime.ensure_file(tmp_path, 0.0)
    assert path.read_text() == "+0.000000\n"
    faketime.write_offset(path, -12.25)
    assert path.read_text() == "-12.250000\n" and faketime.read_offset(path) == -12.25
    faketime.ensure_file(tmp_path, 99.0)                         # an existing file is kept
    assert faketime.read_offset(path) == -12.25
    for bad in (float("nan"), 1e12, "x"):
        with pytest.raises(Unsupported):
            faketime.write_offset(path, bad)
    fake_lib = tmp_path / "libfaketimeMT.so.1"
    fake_lib.write_bytes(b"")
    monkeypatch.setenv(faketime.ENV_OVERRIDE, str(fake_lib))
    env = faketime.environment({"PYTHONPATH": "/x", "FAKETIME": "+5"}, path)
    assert env["LD_PRELOAD"] == str(fake_lib) and env["FAKETIME_TIMESTAMP_FILE"] == str(path)
    assert env["FAKETIME_DONT_FAKE_MONOTONIC"] == "1" and env["FAKETIME_CACHE_DURATION"] == "0"
    assert env["FAKETIME_FORCE_MONOTONIC_FIX"] == "0" and "FAKETIME" not in env
    assert env["PYTHONPATH"].split(":") == [str(faketime.SITE_DIR), "/x"]
    monkeypatch.setenv(faketime.ENV_OVERRIDE, str(tmp_path / "missing.so"))
    with pytest.raises(Unsupported, match="not a file"):
        faketime.library()
    monkeypatch.delenv(faketime.ENV_OVERRIDE)
    monkeypatch.setattr(faketime, "_candidates", lambda: [str(tmp_path / "nope.so")])
    with pytest.raises(Unsupported, match="apt-get install faketime"):
        faketime.library()


def test_delay_rules_and_netlink_attributes():
    assert delay.rules("10.0.0.5", 7) == [
        "-A PCSLOW -s 10.0.0.5/32 -j NFQUEUE --queue-num 7 --queue-bypass",
        "-A PCSLOW -d 10.0.0.5/32 -j NFQUEUE --queue-num 7 --queue-bypass"]
    assert delay.check_delay("250") == 250.0
    for bad in (0, -1, 10 ** 6, "slow"):
        with pytest.raises(ClusterError):
            delay.check_delay(bad)
    buf = delay._attr(1, b"abcde") + delay._attr(2, b"\x00\x00\x00\x07")
    assert len(buf) % 4 == 0 and delay._attrs(buf, 0, len(buf)) == {1: b"abcde", 2: b"\x00\x00\x00\x07"}


# ------------------------------------------------------------------ namespaces: helpers

def _ns(cluster: NetnsCluster, node: str) -> str:
    return cluster.node(node).namespace


def _in(cluster: NetnsCluster, node: str, code: str, timeout: float = 60.0, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", _ns(cluster, node), sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=timeout, **kw)


RECEIVER = """
import socket, json, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind(({host!r}, {port}))
s.settimeout(0.5)
print("ready", flush=True)
got, start, last = {{}}, time.monotonic(), None
while time.monotonic() - start < 30:
    try:
        data, (ip, _) = s.recvfrom(100)
    except socket.timeout:
        if last is not None and time.monotonic() - last > 2.0:
            break
        continue
    got[ip] = got.get(ip, 0) + 1
    last = time.monotonic()
print(json.dumps(got), flush=True)
"""

SENDER = """
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range({n}):
    try:
        s.sendto(b"%d" % i, ({host!r}, {port}))
    except PermissionError:        # dropped in our own OUTPUT chain: the kernel says EPERM
        pass
    if i % 50 == 49:
        time.sleep(0.01)
"""


def udp_delivery(cluster: NetnsCluster, receiver: str, senders: list[str], n: int = 1000) -> dict[str, int]:
    """Datagrams that reached `receiver` from each sender (each sends n, one after the other)."""
    host = cluster.node(receiver).host
    rx = subprocess.Popen(["ip", "netns", "exec", _ns(cluster, receiver), sys.executable, "-c",
                           RECEIVER.format(host=host, port=9999)], stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "ready"
        for s in senders:
            cp = _in(cluster, s, SENDER.format(n=n, host=host, port=9999))
            assert cp.returncode == 0, cp.stderr
        out, _ = rx.communicate(timeout=60)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    got = json.loads(out.strip().splitlines()[-1])
    return {s: got.get(cluster.node(s).host, 0) for s in senders}


PROBER = """
import socket, sys, time, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(({me!r}, 7000)); srv.listen(50)
def serve():
    while True:
        c, _ = srv.accept()
        threading.Thread(target=lambda c=c: [c.sendall(d) for d in iter(lambda: c.recv(100), b"")],
                         daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
print("ready", flush=True)
conn = None
for line in sys.stdin:
    cmd = line.split()
    t = time.monotonic()
    if cmd[0] == "open":
        conn = socket.create_connection((cmd[1], int(cmd[2])), 10)
    elif cmd[0] == "echo":
        conn.sendall(b"x"); conn.recv(10)
    elif cmd[0] == "connect":
        socket.create_connection((cmd[1], int(cmd[2])), 10).close()
    print(round((time.monotonic() - t) * 1000, 2), flush=True)
"""


class Prober:
    """A process on a node that times TCP round trips: `echo` on a connection opened earlier,
    `connect` (a SYN / SYN-ACK round trip) to any address; it also serves an echo port 7000."""

    def __init__(self, cluster: NetnsCluster, node: str):
        self.proc = subprocess.Popen(["ip", "netns", "exec", _ns(cluster, node), sys.executable, "-c",
                                      PROBER.format(me=cluster.node(node).host)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def ms(self, *cmd: Any) -> float:
        self.proc.stdin.write(" ".join(map(str, cmd)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the prober died"
        return float(line)

    def median(self, *cmd: Any, n: int = 5) -> float:
        return statistics.median(self.ms(*cmd) for _ in range(n))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def bare():
    """ZooKeeper and two client hosts: links between hosts without any node process on them."""
    with netns_cluster("lk", brokers=0, bookies=0, zookeepers=1, clients=2) as c:
        yield c


# ------------------------------------------------------------------ namespaces: flaky links

@integration
def test_flaky_drops_about_p_on_its_link_only(bare):
    p = 0.3
    bare.flaky("client-1", "client-2", p)
    try:
        assert bare.status()["flaky"] == [["client-1", "client-2", p]]
        forward = udp_delivery(bare, "client-2", ["client-1", "zk-1"])
        back = udp_delivery(bare, "client-1", ["client-2", "zk-1"])
        # 1000 datagrams each: the loss is binomial, sd 1.5%; the rule sits in client-1 both ways
        assert abs((1000 - forward["client-1"]) / 1000 - p) < 0.08, forward
        assert abs((1000 - back["client-2"]) / 1000 - p) < 0.08, back
        assert forward["zk-1"] >= 990 and back["zk-1"] >= 990        # other links: no loss
        bare.flaky("client-1", "client-2", 0.9)                       # a second fault on the same link
        bare.unflaky("client-1", "client-2", 0.9)                     # undoes only its own rules
        assert bare.status()["flaky"] == [["client-1", "client-2", p]]
        again = udp_delivery(bare, "client-2", ["client-1"])
        assert abs((1000 - again["client-1"]) / 1000 - p) < 0.08, again
    finally:
        bare.unflaky("client-1", "client-2", p)
    assert bare.status()["flaky"] == []
    assert udp_delivery(bare, "client-2", ["client-1"])["client-1"] >= 990
    bare.unflaky("client-1", "client-2", p)                           # nothing left: a no-op
    with pytest.raises(ClusterError):
        bare.flaky("client-1", "client-1", 0.5)


# ------------------------------------------------------------------ namespaces: slow links

@integration
def test_slow_delays_its_link_both_ways_including_open_connections(bare):
    d = 150.0
    server = Prober(bare, "client-2")
    prober = Prober(bare, "client-1")
    c2 = bare.node("client-2").host
    try:
        prober.ms("open", c2, 7000)
        before = prober.median("echo")
        bare.slow("client-1", "client-2", d)
        entry, = bare.status()["slow"]
        assert (entry["src"], entry["dst"], entry["delay_ms"]) == ("client-1", "client-2", d)
        assert procs.alive(entry["pid"], entry["pid_start"])
        # each way holds a packet d ms: the round trip of the connection opened before gains 2 d
        assert min(prober.ms("echo") for _ in range(5)) >= 2 * d - 1
        assert min(prober.ms("connect", c2, 7000) for _ in range(3)) >= 2 * d - 1
        # ZooKeeper's link is not slowed
        assert prober.median("connect", bare.node("zk-1").host, 2181) < d / 2
        bare.unslow("client-1", "client-2", d)
        assert bare.status()["slow"] == []
        assert procs.wait_dead([(entry["pid"], entry["pid_start"])], 10) == []
        assert prober.median("echo") < d / 2
        # heal() undoes slow links too, and ends their daemons
        bare.slow("client-1", "client-2", d)
        entry, = bare.status()["slow"]
        assert min(prober.ms("echo") for _ in range(3)) >= 2 * d - 1
        bare.heal()
        assert bare.status()["slow"] == [] and not procs.alive(entry["pid"], entry["pid_start"])
        assert prober.median("echo") < d / 2
        assert before < d / 2
    finally:
        prober.close()
        server.close()
        bare.heal()


# ------------------------------------------------------------------ namespaces: fake clocks

def _probe(node: Any) -> dict[str, Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{node.host}:{node.ports['http']}/", timeout=5) as r:
        return json.loads(r.read())


def _skew(node: Any) -> tuple[float, dict[str, Any]]:
    """The node's wall clock minus ours (its clock read between two of ours)."""
    t0 = time.time()
    got = _probe(node)
    t1 = time.time()
    return got["time"] - (t0 + t1) / 2, got


def _wait_skew(node: Any, offset: float, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        skew, got = _skew(node)
        if abs(skew - offset) < 0.5:
            return got
        assert time.monotonic() < deadline, f"skew {skew:.2f}, wanted {offset}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def probed():
    """ZooKeeper and one 'bookie' slot running the clock probe under libfaketime."""
    holder: dict[str, NetnsCluster] = {}

    def command(node: Any) -> list[str]:
        return [sys.executable, str(PROBE), node.host, str(node.ports["http"]), holder["c"].zk_connect]

    c = NetnsCluster(ClusterSpec(name=f"ck{uuid.uuid4().hex[:4]}", brokers=0, bookies=1, zookeepers=1, clients=0,
                                 ensemble=1, write_quorum=1, ack_quorum=1, fake_clocks=["bookie"]),
                     commands={"bookie": command},
                     health={"bookie": lambda n: tcp_accepts(n.host, n.ports["http"])})
    holder["c"] = c
    try:
        c.up()
        yield c
    finally:
        c.down()
        shutil.rmtree(c.base_dir, ignore_errors=True)


@integration
def test_set_clock_moves_the_wall_clock_not_the_monotonic_one(probed):
    node = probed.node("bookie-1")
    got = _wait_skew(node, 0.0)
    assert "faketime" in got["ld_preload"]
    assert got["sleep_func"] == "_select_sleep"          # the libfaketime 0.9.10 time.sleep workaround
    for offset in (120.0, -45.5, 0.0):
        m0, h0 = _probe(node)["monotonic"], time.monotonic()
        probed.set_clock("bookie-1", offset)
        got = _wait_skew(node, offset)
        assert abs(got["datetime"] - got["time"]) < 0.5             # datetime.now() follows
        # the monotonic clock went on as ours did: no jump
        assert abs((got["monotonic"] - m0) - (time.monotonic() - h0)) < 0.5
        entry = json.loads(probed.state_path.read_text())["nodes"]["bookie-1"]
        assert entry["clock_offset"] == offset
        assert faketime.read_offset(Path(entry["clock_file"])) == offset
    # sleeps, the event loop and the ZooKeeper session all kept going through the jumps
    a = _probe(node)
    time.sleep(1.0)
    b = _probe(node)
    assert b["sleeps"] - a["sleeps"] >= 10 and b["loop_ticks"] - a["loop_ticks"] >= 10
    assert b["zk_ok"] - a["zk_ok"] >= 3 and b["zk_state"] == "CONNECTED"
    with pytest.raises(Unsupported, match="true clock"):
        probed.set_clock("zk-1", 10)


@integration
def test_clock_nemesis_strobes_then_resets(probed):
    node = probed.node("bookie-1")
    nem = ClockNemesis()
    ctx = NemesisContext(cluster=probed, rng=random.Random(1))
    v = nem.start(ctx, {"node": "bookie-1", "mode": "strobe", "offsets": [0.0, 90.0], "period_ms": 1000})
    assert v["offsets"] == [0.0, 90.0]
    seen = set()
    try:
        deadline = time.monotonic() + 20
        while seen != {0, 90} and time.monotonic() < deadline:
            skew, _ = _skew(node)
            seen |= {o for o in (0, 90) if abs(skew - o) < 0.5}
            time.sleep(0.25)
    finally:
        out = nem.stop(ctx)
    assert seen == {0, 90}
    assert out["flips"] >= 1 and out["reset"] == ["bookie-1"]
    _wait_skew(node, 0.0)
    # a restarted node keeps its clock's offset (the file stays, as a machine's clock would)
    probed.set_clock("bookie-1", 30.0)
    probed.kill("bookie-1")
    probed.start("bookie-1")
    _wait_skew(probed.node("bookie-1"), 30.0)
    probed.set_clock("bookie-1", 0.0)


# ------------------------------------------------------------------ real bookie and broker

@pytest.fixture(scope="module")
def small():
    c = NetnsCluster(ClusterSpec(name=f"sk{uuid.uuid4().hex[:4]}", brokers=1, bookies=1, zookeepers=1,
                                 ensemble=1, write_quorum=1, ack_quorum=1, fake_clocks=["bookie", "broker"]))
    try:
        c.up()
        yield c
    finally:
        c.down()
        shutil.rmtree(c.base_dir, ignore_errors=True)


def _client(url: str):
    import pulsar
    return pulsar.Client(url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _admin_get(cluster: NetnsCluster, path: str) -> Any:
    b = cluster.node("broker-1")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{b.host}:{b.ports['http']}{path}", timeout=10) as r:
        return json.loads(r.read())


@integration
def test_bookie_and_broker_run_and_serve_under_skew(small):
    for name in ("broker-1", "bookie-1"):
        maps = Path(f"/proc/{small.node(name).pid}/maps").read_text()
        assert "libfaketime" in maps, f"{name} does not run under libfaketime"
    topic = f"persistent://public/default/skew-{uuid.uuid4().hex[:6]}"
    small.set_clock("broker-1", 300.0)
    small.set_clock("bookie-1", -300.0)
    time.sleep(1.5)                                     # read within a second
    client = _client(small.service_url)
    try:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        for i in range(20):
            producer.send(str(i).encode())
        stats = _admin_get(small, f"/admin/v2/persistent/{topic.split('://')[1]}/stats")
        since = stats["publishers"][0]["connectedSince"]     # the broker's wall clock, to the second
        t = calendar.timegm(time.strptime(since, "%Y-%m-%dT%H:%M:%SZ"))
        assert 290 < t - time.time() < 310, since
        nem = ClockNemesis()
        ctx = NemesisContext(cluster=small, rng=random.Random(3))
        nem.start(ctx, {"node": "broker-1", "mode": "strobe", "offsets": [0.0, -200.0], "period_ms": 1000})
        try:
            for i in range(20, 40):
                producer.send(str(i).encode())
                time.sleep(0.1)
        finally:
            nem.stop(ctx)
        got = []
        for _ in range(40):
            m = consumer.receive(20000)
            got.append(int(m.data()))
            consumer.acknowledge(m)
        assert got == list(range(40))
    finally:
        client.close()
        small.set_clock("broker-1", 0.0)
        small.set_clock("bookie-1", 0.0)


@integration
def test_slow_nemesis_delays_a_broker_and_undoes_its_links(small):
    topic = f"persistent://public/default/slow-{uuid.uuid4().hex[:6]}"
    client = _client(small.service_url)
    try:
        producer = client.create_producer(topic)
        producer.send(b"warm")

        def send_ms() -> float:
            t = time.monotonic()
            producer.send(b"x")
            return (time.monotonic() - t) * 1000

        nem = SlowNemesis()
        ctx = NemesisContext(cluster=small, rng=random.Random(5))
        v = nem.start(ctx, {"shape": "node", "node": "broker-1", "delay_ms": 100.0})
        try:
            assert v["links"] == [["broker-1", "bookie-1"], ["broker-1", "zk-1"]]
            assert len(small.status()["slow"]) == 2
            # a send waits for the bookie's add: one broker-bookie round trip, 2 x 100 ms more
            assert min(send_ms() for _ in range(3)) >= 199
        finally:
            out = nem.stop(ctx)
        assert out["links"] == v["links"] and small.status()["slow"] == []
        assert statistics.median(send_ms() for _ in range(5)) < 100
        flaky = FlakyNemesis()
        flaky.start(ctx, {"shape": "pairs", "links": [["broker-1", "bookie-1"]], "p": 0.2})
        assert small.status()["flaky"] == [["broker-1", "bookie-1", 0.2]]
        flaky.stop(ctx)
        assert small.status()["flaky"] == []
    finally:
        client.close()
