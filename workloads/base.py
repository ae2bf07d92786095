"""What every workload shares: its contract (`Workload`), the context a worker process hands it,
journaling that survives a closing journal, and the loop that paces one logical client thread's ops
and retires crashed processes.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from core.history import INFO, INVOKE, Journal, Op
from core.spec import TestSpec

FINAL_PROCESS = 1_000_000         # process ids of final reads / drains: FINAL_PROCESS + n
LEDGERS_OFFSET = 500_000          # ... and of the ledger listings after them: FINAL_PROCESS + this + n
MAX_WORKERS = 2                   # worker processes (the machine has 2 cores; each runs threads)


@dataclass
class Context:
    """What a workload gets in a worker process (or in the runner, for `prepare`)."""
    run_dir: Path
    spec: TestSpec
    cluster: dict[str, Any]            # cluster.json: service_url, zk_connect, nodes [{name, role, host, ports}]
    keys: list[str]                    # the workload's topics (znodes, ledgers), from its keys()
    journal: Journal | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    deadline: float = 0.0              # time.monotonic() after which no op starts
    worker: int = 0
    workers: int = 1
    name: str = "worker-0"
    out: TextIO | None = None
    cleanups: list[Callable[[], None]] = field(default_factory=list)   # run by the worker at exit
    crashed: list[str] = field(default_factory=list)                   # tracebacks of crashed threads

    @property
    def service_url(self) -> str:
        """This worker's home broker as its service URL (worker w: broker w mod n), as Jepsen binds each
        client to a node. The client looks topics up through the one broker it first connected to and
        keeps that connection; with the whole list, every worker may end up asking the same broker, and
        a broker cut from ZooKeeper then answers every lookup: no client ever asks a healthy broker,
        which is what takes a topic over. The cost: while its home broker is down, a worker cannot look
        topics up (connections it already has to other brokers keep working). A workload with the option
        `lookup=all` (balance) gets every broker instead, its home first: the client takes the hosts in
        turn for its lookups, so a worker whose home broker left the cluster still finds owners."""
        brokers = [n for n in self.nodes("broker") if n.get("host")]
        if len(brokers) < 2:
            return self.cluster.get("service_url", "")
        w = self.worker % len(brokers)
        hosts = brokers[w:] + brokers[:w] if self.spec.options.get("lookup") == "all" else [brokers[w]]
        return "pulsar://" + ",".join(f"{n['host']}:{(n.get('ports') or {}).get('pulsar', 6650)}" for n in hosts)

    def nodes(self, role: str | None = None) -> list[dict[str, Any]]:
        return [n for n in self.cluster.get("nodes", []) if role is None or n.get("role") == role]

    def nodes_by_host(self) -> dict[str, str]:
        return {n["host"]: n["name"] for n in self.nodes() if n.get("host")}

    def admin_urls(self) -> list[str]:
        """The brokers' admin HTTP base URLs."""
        return [f"http://{n['host']}:{(n.get('ports') or {}).get('http', 8080)}" for n in self.nodes("broker")]

    def rng(self, *parts: Any) -> random.Random:
        return random.Random(":".join(str(p) for p in (self.spec.seed, self.spec.workload, *parts)))


class Workload(Protocol):
    """The contract of a workload module (workloads/log.py is the plainest one that meets it).

    Optional members: `CHOICES` ({option: allowed values}), `UNSAFE` (`core.expectation.Unsafe`
    settings that are unsafe on purpose: a run with one is expected invalid) and `prepare(ctx)`, run in the runner after
    deploy (namespace policies and the like)."""

    DESCRIPTION: str                                  # one line for `pulsar-chaos run --help`
    OPTIONS: dict[str, tuple[Any, str]]               # {name: (default, help)}; spec.options sets them

    def keys(self, spec: TestSpec, run_id: str) -> list[str]:
        """The topics (znodes, ledgers) it uses; topic-targeted faults pick from them."""

    def worker_count(self, spec: TestSpec) -> int:
        """How many worker processes run its client threads."""

    def start(self, ctx: Context) -> list[threading.Thread]:
        """In worker process ctx.worker: start its client threads, return them."""

    def start_final(self, ctx: Context) -> list[threading.Thread]:
        """In the final-reads process: start the final reads / drains, return the threads."""

    def checkers(self, spec: TestSpec | None) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
        """{checker name: (check function, opts)} run over the history (`checkers.select`)."""


REQUIRED = ("DESCRIPTION", "OPTIONS", "keys", "worker_count", "start", "start_final", "checkers")


class Retired(Exception):
    """The journal was closed under a thread (the worker is stopping)."""


def append(journal: Journal, op: Op) -> Op:
    try:
        return journal.append(op)
    except ValueError:          # I/O on a closed file: the worker is shutting down
        raise Retired() from None


@dataclass(frozen=True)
class Planned:
    """One op a thread will perform: its f, key and invoke value, and the pause before it starts."""
    f: str
    key: str
    value: Any
    delay: float


VALUE_STRIDE = 10_000_000         # sent value = (thread + 1) * VALUE_STRIDE + n: unique across the run


def decode_value(payload: bytes) -> Any:
    """A payload as the int the workloads write, or as text if it is not one."""
    s = payload.decode("utf-8", "replace")
    try:
        return int(s)
    except ValueError:
        return s


def paced(rng: random.Random, per_thread_rate: float) -> Iterator[float]:
    """Uniform delays in [0, 2/r): starts staggered around the rate without lock-step."""
    while True:
        yield rng.uniform(0.0, 2.0 / max(per_thread_rate, 1e-6))


def send_or_receive(spec: TestSpec, workload: str, thread: int, sends: bool, keys: list[Any],
                    send_f: str = "send", receive_f: str = "receive") -> Iterator[Planned]:
    """A Pulsar client thread's ops, a pure function of (seed, workload, thread): a sender sends unique
    ints, a receiver receives, each time from a seeded choice of `keys`; starts paced at
    rate / concurrency per thread."""
    rng = random.Random(f"{spec.seed}:{workload}:{thread}")
    delays = paced(rng, spec.rate / spec.concurrency)
    n = 0
    while True:
        delay = next(delays)
        key = rng.choice(keys)
        if sends:
            n += 1
            yield Planned(send_f, key, (thread + 1) * VALUE_STRIDE + n, delay)
        else:
            yield Planned(receive_f, key, None, delay)


def drive(ctx: Context, process: int, step: int, plan: Iterator[Planned],
          perform: Callable[[Planned, int], tuple[str, dict[str, Any]]],
          on_op: Callable[[Op], None] | None = None) -> None:
    """Perform the planned ops until the deadline or stop: invoke, perform, complete, all journaled.

    `perform(planned, process)` returns (type, changes for the completion). A process whose op ended
    info is retired, as Jepsen does; the thread goes on as process + step."""
    assert ctx.journal is not None
    next_start = time.monotonic()
    try:
        for planned in plan:
            next_start = max(next_start + planned.delay, time.monotonic())
            if next_start >= ctx.deadline:
                return
            if ctx.stop.wait(max(0.0, next_start - time.monotonic())):
                return
            inv = append(ctx.journal, Op(process=process, type=INVOKE, f=planned.f, key=planned.key,
                                         value=planned.value))
            type_, changes = perform(planned, process)
            done = append(ctx.journal, inv.complete(type_, **changes))
            if on_op:
                on_op(done)
            if type_ == INFO:
                process += step
    except Retired:
        return


def once(ctx: Context, process: int, f: str, key: str, value: Any,
         perform: Callable[[], tuple[str, dict[str, Any]]]) -> None:
    """One journaled op (a final read or drain)."""
    assert ctx.journal is not None
    try:
        inv = append(ctx.journal, Op(process=process, type=INVOKE, f=f, key=key, value=value))
        type_, changes = perform()
        append(ctx.journal, inv.complete(type_, **changes))
    except Retired:
        pass


def start_threads(ctx: Context, targets: list[tuple[str, Callable[[], None]]]) -> list[threading.Thread]:
    """Start one daemon thread per (name, fn); an exception is printed and noted in ctx.crashed."""
    import traceback

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            text = traceback.format_exc()
            ctx.crashed.append(text)
            print(text, flush=True)
    out = []
    for name, fn in targets:
        t = threading.Thread(target=guarded, args=(fn,), name=name, daemon=True)
        t.start()
        out.append(t)
    return out
