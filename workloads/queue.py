"""The queue workload: producers enqueue unique ints, competing consumers on one Shared subscription
dequeue and acknowledge them, and after the faults a drain empties the subscription.

With `delay_max_ms` every other enqueue is a delayed message (deliverAt), and no delivery may come
before its time (`early`). Checked as Jepsen's total-queue: every acknowledged enqueue is dequeued at
least once (lost otherwise),
nothing is dequeued that was never enqueued, and how often each value was delivered (exactly-once
analysis). With the `dedup` option the topics run with broker deduplication, and a value stored twice
(two message ids) is then an anomaly of its own; its producers have an explicit initial sequence id
(`pin_sequence_ids`, workloads/pulsar_client.py: the official C++ client otherwise reuses ids after a
reconnect before its first receipt, and the broker drops the later message as a duplicate). With
`subscribe_ahead_s` the subscription is created through the admin API at the latest position before
anything is sent (apache/pulsar#18236's first step), and the consumers come that many seconds later:
every value sent is still owed to it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from core.expectation import Unsafe, nonzero
from core.spec import TestSpec
from workloads import base
from workloads.base import MAX_WORKERS, Context, Planned
from workloads.pulsar_client import (DRAIN_IDLE_S, create_subscription, final_drains, receive, send, session_for,
                                     set_topic_policy, topic_names)

DESCRIPTION = "producers enqueue unique ints, competing Shared consumers dequeue them, a final drain empties the queue"
OPTIONS: dict[str, tuple[Any, str]] = {
    "dedup": (False, "turn on broker deduplication for the topics (a value stored twice is then an anomaly)"),
    "pin_sequence_ids": (True, "give every producer an explicit initial sequence id (false: the C++ client's "
                               "default, which reuses ids after a reconnect before its first receipt, so that "
                               "with dedup a later message is acknowledged as a duplicate and never stored: "
                               "apache/pulsar#2047, fixed in the Java client only)"),
    "consumers": (0, "competing consumers per topic (0: a third of the concurrency, at least 2)"),
    "exactly_once": (False, "claim exactly-once delivery: a value dequeued twice is then invalid"),
    "nack_every": (0, "negatively acknowledge every Nth dequeued message after recording it (a consumer that "
                      "processed it and then failed): Pulsar redelivers it; 0 never"),
    "delay_max_ms": (0, "delayed delivery: every other enqueue is sent with deliverAt = now + a delay in "
                        "[0, delay_max_ms] (a function of its value); the queue checker's `early` finds a "
                        "delivery before its time, `lost` a delayed message never delivered; 0 off. Below "
                        "(settle + 3 s) x 1000, so the last ones are due before the final drain ends"),
    "subscribe_ahead_s": (0.0, "the subscription is created by the admin API before anything is sent, at the "
                               "latest position (Pulsar's createSubscription default), and the consumers "
                               "start this many seconds into the run: a subscription made ahead of its "
                               "consumers, with no acknowledgement yet while the first faults come; 0: "
                               "consumers subscribe at the earliest position from the start"),
}
# deliberately unsafe: the run must be invalid (core/expectation.py)
UNSAFE = (Unsafe({"exactly_once": True, "nack_every": nonzero},
                 "exactly-once delivery claimed while consumers negatively acknowledge messages they "
                 "recorded: Pulsar redelivers them, so values are dequeued twice",
                 label="exactly_once+nack_every"),
          Unsafe({"pin_sequence_ids": False},
                 "with dedup, the official C++ client numbers a message like the one it resends after a "
                 "reconnect made before its first receipt (a failed first write); the deduplicating broker "
                 "acknowledges it with (-1, -1) and never stores it: `lost`",
                 given={"dedup": True}),)


def option_problem(spec: TestSpec) -> tuple[str, str] | None:
    """delay_max_ms in [0, (settle + DRAIN_IDLE_S) x 1000): a message due later than the final
    drain's end would be reported lost although it was never due."""
    d = spec.options.get("delay_max_ms", 0)
    limit = int((spec.settle + DRAIN_IDLE_S) * 1000)
    if isinstance(d, int) and not isinstance(d, bool) and 0 <= d < limit:
        return None
    return (f"delay_max_ms must be a whole number from 0 to {limit - 1} (below (settle {spec.settle:g} s + "
            f"the final drain's {DRAIN_IDLE_S:g} s idle) x 1000), not {d!r}",
            "lower delay_max_ms or raise --settle: the final drain must outlast the last delay")


NACK_DELAY_MS = 200           # redelivery delay of negatively acknowledged messages (the client's default is 60 s)
SUBSCRIPTION = "queue"


def keys(spec: TestSpec, run_id: str) -> list[str]:
    return topic_names(spec.test_name, run_id, spec.topics)


def worker_count(spec: TestSpec) -> int:
    return max(1, min(MAX_WORKERS, spec.concurrency))


@dataclass(frozen=True)
class Thread:
    index: int
    role: str              # "enqueue" or "dequeue"
    batched: bool
    worker: int


def threads(spec: TestSpec, workers: int | None = None) -> list[Thread]:
    """Consumers first (each one consumer per topic, all on the one Shared subscription: they compete),
    then producers alternating batched and unbatched."""
    w = workers or worker_count(spec)
    c = spec.concurrency
    n_recv = int(spec.options.get("consumers") or 0) or max(2, c // 3)
    n_recv = min(n_recv, max(1, c - 1))
    out = [Thread(i, "dequeue", False, i % w) for i in range(n_recv)]
    out += [Thread(n_recv + j, "enqueue", j % 2 == 0, j % w) for j in range(c - n_recv)]
    return out


def generator(spec: TestSpec, thread: Thread, topics: list[str]) -> Iterator[Planned]:
    return base.send_or_receive(spec, "queue", thread.index, thread.role == "enqueue", topics, "enqueue", "dequeue")


def prepare(ctx: Context) -> None:
    if ctx.spec.options.get("dedup"):
        for t in ctx.keys:
            set_topic_policy(ctx.admin_urls(), t, "deduplication", True)
    if _ahead(ctx.spec):
        for t in ctx.keys:
            create_subscription(ctx.admin_urls(), t, SUBSCRIPTION)


def _ahead(spec: TestSpec) -> float:
    return float(spec.options.get("subscribe_ahead_s") or 0.0)


def _consumer_name(ctx: Context, thread: int) -> str:
    return f"{ctx.run_dir.name[-6:]}-q{thread}"


def start(ctx: Context) -> list[threading.Thread]:
    session = session_for(ctx, pin_sequence_ids=bool(ctx.spec.options.get("pin_sequence_ids", True)))
    mine = [t for t in threads(ctx.spec, ctx.workers) if t.worker == ctx.worker]

    nack_every = int(ctx.spec.options.get("nack_every") or 0)
    delay_max = int(ctx.spec.options.get("delay_max_ms") or 0)

    def deliver_at(value: int) -> int | None:
        if not delay_max or value % 2:
            return None
        return int(time.time() * 1000) + (value * 2654435761) % (delay_max + 1)
    kw = {"negative_ack_redelivery_delay_ms": NACK_DELAY_MS} if nack_every else {}

    def run(t: Thread) -> None:
        name = _consumer_name(ctx, t.index)
        received = 0

        def perform(p: Planned, process: int) -> tuple[str, dict[str, Any]]:
            nonlocal received
            if p.f == "enqueue":
                at = deliver_at(p.value)
                return send(session, p.key, t.batched, p.value, deliver_at=at)
            if not nack_every:
                return receive(session, p.key, SUBSCRIPTION, "Shared", name)[:2]
            type_, changes, msgs, c = receive(session, p.key, SUBSCRIPTION, "Shared", name, ack=False)
            for m in msgs:
                received += 1
                try:
                    (c.negative_acknowledge if received % nack_every == 0 else c.acknowledge)(m)
                except Exception:
                    pass
            return type_, changes
        if t.role == "dequeue" and _ahead(ctx.spec):
            # the subscription exists (prepare); its consumers come later (option subscribe_ahead_s)
            if ctx.stop.wait(max(0.0, min(_ahead(ctx.spec), ctx.deadline - time.monotonic()))):
                return
        for topic in ctx.keys:          # made up front, so that every consumer competes from the start
            try:
                if t.role == "dequeue":
                    session.consumer(topic, SUBSCRIPTION, "Shared", name, **kw)
                else:
                    session.producer(topic, t.batched)
            except Exception:
                pass
        base.drive(ctx, t.index, ctx.spec.concurrency, generator(ctx.spec, t, ctx.keys), perform)
    return base.start_threads(ctx, [(f"thread-{t.index}", lambda t=t: run(t)) for t in mine])


def start_final(ctx: Context) -> list[threading.Thread]:
    return base.start_threads(ctx, final_drains(ctx, session_for(ctx), SUBSCRIPTION, "Shared"))


def checkers(spec: TestSpec | None = None) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    from checkers import select
    o = spec.options if spec else {}
    want = {"queue": {"enqueue": ("enqueue",), "dequeue": ("dequeue", "drain"), "dedup": bool(o.get("dedup")),
                      "delayed": bool(o.get("delay_max_ms")),
                      "exactly_once": bool(o.get("exactly_once"))},
            "perf": {"write_fs": ("enqueue",)}}
    return select(want)
