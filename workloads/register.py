"""The register workload: compare-and-set registers on ZooKeeper znodes, checked for linearizability.

A sanity test of both ZooKeeper and our linearizability checker, as Jepsen's early ZooKeeper test:
`spec.topics` independent registers, each a znode under a run-specific path (`root`), start empty
(read as None, the model's initial nil). Each logical process has its own kazoo session and performs,
on a random register, Jepsen's mix of

  read        ok value = the register's value (None while never written); any error -> fail (a read
              has no effect, so one that did not answer can be left out)
  write v     set(path, v): ok; an error before anything was sent -> fail; connection loss, session
              expiry or a timeout -> info (it may still be applied)
  cas [o n]   get (value, version); value != o -> fail; else set(path, n, version=version): ok;
              BadVersion -> fail (someone wrote in between); loss / timeout of the set -> info

with values in 0..4. ZooKeeper serves a read from whichever server the session is connected to, and a
follower may lag behind the leader: "Read operations in ZooKeeper are not linearizable since they can
return potentially stale data" (https://zookeeper.apache.org/doc/current/zookeeperInternals.html#sc_consistency).
The programmer's guide's remedy is sync() before the read, which makes the server catch up with the
leader first (https://zookeeper.apache.org/doc/current/zookeeperProgrammers.html#ch_zkGuarantees); so
reads do sync()+get unless `sync_reads=false` (then stale reads are expected to show up as
non-linearizable histories under partitions). sync()+get is still not formally linearizable (sync is
not a quorum operation: an old leader cut off from the quorum can answer it until it notices;
jepsen-io/jepsen#399), so a rare invalid verdict right at a leader change deserves a look before it is
called a bug. A cas needs no sync: its set is versioned, so a stale get makes it fail, never lie.

`cas=unsafe` is the deliberately broken variant for the checker's must-fail test: get, compare in the
client, then an unconditional set, so two concurrent cas from the same value both succeed (a lost
update), which no linearization explains.

The registers are znodes, not topics: `keys()` is [] (topic-targeted faults pick random targets) and
the history's keys are the register names `r0`, `r1`, ... The cluster's brokers and bookies are not
used; faults that matter are those that reach ZooKeeper (`--zookeepers 3` with `partition-ring`,
`partition-bridge`).
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from core.expectation import Unsafe
from core.history import FAIL, INFO, OK
from core.spec import TestSpec
from workloads import base
from workloads.base import MAX_WORKERS, Context, Planned

DESCRIPTION = "compare-and-set registers on ZooKeeper znodes (read, write, versioned cas), checked for linearizability"
OPTIONS: dict[str, tuple[Any, str]] = {
    "sync_reads": (True, "sync() before every read, so that a lagging follower cannot answer with a stale "
                         "value (false: plain reads, which ZooKeeper does not promise to be linearizable)"),
    "cas": ("versioned", "versioned: get, then set(version=), safe, or unsafe: get, compare in the client, "
                         "unconditional set (lost updates: the checker must fail the run)"),
}
CHOICES = {"cas": ("versioned", "unsafe")}
# deliberately unsafe: the run must be invalid (core/expectation.py)
UNSAFE = (Unsafe({"cas": "unsafe"}, "cas as get + unconditional set loses updates: the linear checker "
                                    "must report the history not linearizable"),)
VALUES = 5                      # register values are 0..VALUES-1, as Jepsen's cas-register tests
ROOT = "/pulsar-chaos/register"
OP_TIMEOUT_S = 5.0              # one ZooKeeper request; no answer -> info (write, cas) or fail (read)
ZK_SESSION_S = 10.0
START_TIMEOUT_S = 30.0
LINEAR_TIME_LIMIT_S = 120.0


def root(spec: TestSpec, run_id: str) -> str:
    return f"{ROOT}/{spec.test_name}-{run_id}"


def registers(spec: TestSpec) -> list[str]:
    return [f"r{i}" for i in range(spec.topics)]


def keys(spec: TestSpec, run_id: str) -> list[str]:
    return []          # znodes, not topics: topic-targeted faults pick random targets


def worker_count(spec: TestSpec) -> int:
    return max(1, min(MAX_WORKERS, spec.concurrency))


@dataclass(frozen=True)
class Thread:
    index: int
    worker: int


def threads(spec: TestSpec, workers: int | None = None) -> list[Thread]:
    w = workers or worker_count(spec)
    return [Thread(i, i % w) for i in range(spec.concurrency)]


def generator(spec: TestSpec, thread: int) -> Iterator[Planned]:
    """Jepsen's mix of read / write v / cas [old new] over the registers, a pure function of (seed, thread)."""
    rng = random.Random(f"{spec.seed}:register:{thread}")
    delays = base.paced(rng, spec.rate / spec.concurrency)
    regs = registers(spec)
    while True:
        key = rng.choice(regs)
        f = rng.choice(("read", "write", "cas"))
        if f == "read":
            yield Planned("read", key, None, next(delays))
        elif f == "write":
            yield Planned("write", key, rng.randrange(VALUES), next(delays))
        else:
            yield Planned("cas", key, [rng.randrange(VALUES), rng.randrange(VALUES)], next(delays))


def encode(v: Any) -> bytes:
    return str(v).encode()


def decode(data: bytes | None) -> Any:
    """A register's value; an empty znode holds none."""
    return base.decode_value(data) if data else None


# ------------------------------------------------------------------------------------ the client

class Register:
    """One logical process's kazoo session and its ops. `perform` never raises."""

    def __init__(self, zk_connect: str, base_path: str, sync_reads: bool = True, unsafe_cas: bool = False):
        self.hosts = zk_connect
        self.base = base_path
        self.sync_reads = sync_reads
        self.unsafe_cas = unsafe_cas
        self.zk: Any = None

    def path(self, key: str) -> str:
        return f"{self.base}/{key}"

    def connect(self, timeout: float = START_TIMEOUT_S) -> None:
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry
        if self.zk is not None:
            return              # once started, kazoo reconnects (and renews an expired session) by itself
        zk = KazooClient(hosts=self.hosts, timeout=ZK_SESSION_S,
                         connection_retry=KazooRetry(max_tries=-1, max_delay=1.0), command_retry=None)
        zk.start(timeout)       # on a timeout it stops itself and raises: a new client next time
        self.zk = zk

    def close(self) -> None:
        if self.zk is not None:
            try:
                self.zk.stop()
                self.zk.close()
            except Exception:
                pass

    def ensure(self, keys: list[str]) -> None:
        """Create the (empty) register znodes that do not exist yet."""
        from kazoo.exceptions import NodeExistsError
        self.connect()
        for k in keys:
            try:
                self.zk.create(self.path(k), b"", makepath=True)
            except NodeExistsError:
                pass

    # ZooKeeper's request helpers: the async call, bounded
    def _get(self, key: str) -> tuple[Any, int]:
        data, stat = self.zk.get_async(self.path(key)).get(timeout=OP_TIMEOUT_S)
        return decode(data), stat.version

    def _set(self, key: str, value: Any, version: int = -1) -> None:
        self.zk.set_async(self.path(key), encode(value), version).get(timeout=OP_TIMEOUT_S)

    def perform(self, f: str, key: str, value: Any) -> tuple[str, dict[str, Any]]:
        from kazoo.exceptions import BadVersionError, NoNodeError
        try:
            self.connect(OP_TIMEOUT_S)
        except Exception as e:
            return FAIL, {"error": f"not connected: {_error(e)}"}
        if not self.zk.connected:          # kazoo would queue the request until it reconnects
            return FAIL, {"error": "not connected to ZooKeeper"}
        node = _server(self.zk)
        if f == "read":
            try:
                if self.sync_reads:
                    self.zk.sync_async(self.path(key)).get(timeout=OP_TIMEOUT_S)
                v, _ = self._get(key)
            except Exception as e:
                return FAIL, {"error": _error(e), "node": node}
            return OK, {"value": v, "node": node}
        if f == "write":
            try:
                self._set(key, value)
            except NoNodeError as e:
                return FAIL, {"error": _error(e), "node": node}
            except Exception as e:
                return INFO, {"error": _error(e), "node": node}
            return OK, {"node": node}
        if f == "cas":
            old, new = value
            try:
                cur, version = self._get(key)
            except Exception as e:
                return FAIL, {"error": f"get: {_error(e)}", "node": node}
            if cur != old:
                return FAIL, {"error": f"value is {cur!r}, not {old!r}", "node": node}
            try:
                self._set(key, new, -1 if self.unsafe_cas else version)
            except (BadVersionError, NoNodeError) as e:
                return FAIL, {"error": _error(e), "node": node}
            except Exception as e:
                return INFO, {"error": _error(e), "node": node}
            return OK, {"node": node}
        return FAIL, {"error": f"unknown op {f!r}"}


def _error(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _server(zk: Any) -> str:
    """The ZooKeeper server the session is connected to now, as host:port ("" if unknown)."""
    try:
        sock = zk._connection._socket
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except Exception:
        return ""


def _register_for(ctx: Context) -> Register:
    o = ctx.spec.options
    r = Register(ctx.cluster.get("zk_connect", ""), root(ctx.spec, ctx.run_dir.name),
                 sync_reads=bool(o.get("sync_reads", True)), unsafe_cas=o.get("cas", "versioned") == "unsafe")
    ctx.cleanups.append(r.close)
    return r


# ------------------------------------------------------------------------------------ threads

def start(ctx: Context) -> list[threading.Thread]:
    spec = ctx.spec
    mine = [t for t in threads(spec, ctx.workers) if t.worker == ctx.worker]

    def run(t: Thread) -> None:
        reg = _register_for(ctx)
        try:
            reg.ensure(registers(spec))        # both workers may: create is idempotent
        except Exception as e:
            print(f"{time.strftime('%H:%M:%S')} register thread {t.index}: set-up: {_error(e)}",
                  file=ctx.out, flush=True)
        base.drive(ctx, t.index, spec.concurrency, generator(spec, t.index),
                   lambda p, process: reg.perform(p.f, p.key, p.value))
    return base.start_threads(ctx, [(f"register-{t.index}", lambda t=t: run(t)) for t in mine])


def start_final(ctx: Context) -> list[threading.Thread]:
    """One final sync()+get of each register (f "read", process FINAL_PROCESS + i): the state the run
    left, which every linearization must also explain."""
    regs = registers(ctx.spec)

    def one(i: int, key: str) -> None:
        reg = _register_for(ctx)
        reg.sync_reads = True

        def perform() -> tuple[str, dict[str, Any]]:
            end = time.monotonic() + ctx.spec.final_read_timeout
            while True:
                type_, ch = reg.perform("read", key, None)
                if type_ == OK or time.monotonic() + OP_TIMEOUT_S > end or ctx.stop.wait(0.5):
                    return type_, ch
        base.once(ctx, base.FINAL_PROCESS + i, "read", key, None, perform)
    return base.start_threads(ctx, [(f"read-{i}", lambda i=i, k=k: one(i, k)) for i, k in enumerate(regs)])


def checkers(spec: TestSpec | None = None) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    from checkers import select
    # a bounded search: a history it cannot decide in LINEAR_TIME_LIMIT_S is "unknown", never a hang
    want: dict[str, dict[str, Any]] = {"linear": {"model": "cas-register", "time_limit_s": LINEAR_TIME_LIMIT_S},
                                       "perf": {"write_fs": ("write", "cas")}}
    return select(want)
