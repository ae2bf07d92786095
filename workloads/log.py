"""The log workload: producers append unique ints to topics, Exclusive consumers receive and
acknowledge them, and final reads replay every topic from the earliest message to its end.

It owns the op generator (seeded, one stream per logical client thread), the client code that
performs one op with `pulsar-client` and maps its outcome to ok/fail/info, and its checkers.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from core.history import Journal, Op
from core.spec import TestSpec
from workloads import base
from workloads.base import MAX_WORKERS, Context, Planned
from workloads.pulsar_client import Session, final_reads, receive, send, session_for, topic_names

DESCRIPTION = "producers append unique ints to topics, Exclusive consumers read them, final reads replay each topic"
OPTIONS: dict[str, tuple[Any, str]] = {}
VALUE_STRIDE = base.VALUE_STRIDE
FINAL_READ_PROCESS = base.FINAL_PROCESS   # process ids of the final reads: FINAL_READ_PROCESS + topic index
# the checkers every Pulsar log-shaped history gets (those registered)
CHECKER_NAMES = ("log", "elle", "fencing", "perf")


def checkers(spec: TestSpec | None = None, extra: dict[str, dict[str, Any]] | None = None
             ) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """{name: (check, opts)}: the log-shaped checkers, with `extra` opts."""
    from checkers import select
    extra = extra or {}
    return select({n: extra.get(n, {}) for n in CHECKER_NAMES})


# ------------------------------------------------------------------------------------ the plan

@dataclass(frozen=True)
class Thread:
    """A logical client thread: its role, its topics and the worker process that runs it."""
    index: int
    role: str                      # "send" or "receive"
    batched: bool                  # senders: a batching producer or not
    topics: tuple[int, ...]        # topic indexes it picks from
    worker: int


def worker_count(spec: TestSpec) -> int:
    return max(1, min(MAX_WORKERS, spec.concurrency))


def threads(spec: TestSpec, workers: int | None = None) -> list[Thread]:
    """The `concurrency` logical threads: up to one consumer per topic (at most a third of the threads,
    none with a single thread), then senders alternating batched and unbatched.

    Consumers go round-robin over the workers; batched senders to worker 0 and unbatched ones to the
    last worker, so that the batched senders of a worker share one batching producer per topic and
    their concurrent sends land in the same batch."""
    w = workers or worker_count(spec)
    c = spec.concurrency
    n_recv = 0 if c < 2 else min(spec.topics, max(1, c // 3))
    out = []
    for i in range(n_recv):
        out.append(Thread(i, "receive", False, tuple(t for t in range(spec.topics) if t % n_recv == i), i % w))
    for j in range(c - n_recv):
        batched = j % 2 == 0
        out.append(Thread(n_recv + j, "send", batched, tuple(range(spec.topics)), 0 if batched else w - 1))
    return out


def keys(spec: TestSpec, run_id: str) -> list[str]:
    return topic_names(spec.test_name, run_id, spec.topics)


def generator(spec: TestSpec, thread: Thread, topics: list[str] | None = None) -> Iterator[Planned]:
    """The thread's ops (`base.send_or_receive`); `key` is the topic name (its index when `topics` is
    not given)."""
    keys = [topics[t] for t in thread.topics] if topics else list(thread.topics)
    return base.send_or_receive(spec, "log", thread.index, thread.role == "send", keys)


# ------------------------------------------------------------------------------------ running threads

def run_thread(session: Session, spec: TestSpec, thread: Thread, topics: list[str], journal: Journal,
               deadline: float, stop: threading.Event,
               on_op: Callable[[Op], None] | None = None, *,
               plan: Iterator[Planned] | None = None, warm: bool = True) -> None:
    """Perform the thread's ops (`plan`, this workload's `generator` by default) until `deadline`
    (time.monotonic()) or `stop`. A process whose op ended info is retired; the thread continues as
    process + concurrency. `warm`: make the thread's producers/consumers before its first op, so the
    first ops measure the system, not set-up (a workload of hundreds of topics makes them on first use)."""
    for t in thread.topics if warm else ():
        if stop.is_set() or time.monotonic() >= deadline:
            break
        try:
            if thread.role == "send":
                session.producer(topics[t], thread.batched)
            else:
                session.consumer(topics[t])
        except Exception:
            pass                # made again (and the failure recorded) by the first op that needs it

    pad = int(spec.options.get("payload", 0) or 0)      # the balance workload's option

    def perform(planned: Planned, process: int) -> tuple[str, dict[str, Any]]:
        if planned.f == "send":
            return send(session, planned.key, thread.batched, planned.value, pad=pad)
        return receive(session, planned.key)[:2]
    ctx = Context(run_dir=None, spec=spec, cluster={}, keys=topics, journal=journal,  # type: ignore[arg-type]
                  stop=stop, deadline=deadline)
    base.drive(ctx, thread.index, spec.concurrency, plan if plan is not None else generator(spec, thread, topics),
               perform, on_op)


def start(ctx: Context, plan_for: Callable[[Thread], Iterator[Planned]] | None = None,
          warm: bool = True) -> list[threading.Thread]:
    """This worker's threads; `plan_for(thread)` replaces the generator (the balance workload's)."""
    session = session_for(ctx)
    mine = [t for t in threads(ctx.spec, ctx.workers) if t.worker == ctx.worker]
    return base.start_threads(ctx, [(f"thread-{t.index}", lambda t=t: run_thread(
        session, ctx.spec, t, ctx.keys, ctx.journal, ctx.deadline, ctx.stop,
        plan=plan_for(t) if plan_for is not None else None, warm=warm)) for t in mine])


def start_final(ctx: Context) -> list[threading.Thread]:
    return base.start_threads(ctx, final_reads(ctx, session_for(ctx)))
