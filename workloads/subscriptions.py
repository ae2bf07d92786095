"""The subscriptions workload: Failover or Key_Shared consumers that come and go on one subscription
while producers send (keyed, for Key_Shared); a drain and a replay from the earliest message follow.

Claims checked: every acknowledged send reaches the subscription (queue checker, sends as enqueues);
order is kept per consumer and across failovers apart from redelivered unacknowledged messages
(Failover), and per key across consumers, one consumer per key at a time (Key_Shared) (log checker
with the subscription type); the log itself is intact (final reads).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from core.spec import TestSpec
from workloads import base
from workloads.base import MAX_WORKERS, Context, Planned
from workloads.pulsar_client import final_drains, final_reads, receive, send, session_for, topic_names

DESCRIPTION = "Failover or Key_Shared consumers come and go on one subscription; order per consumer / per key"
OPTIONS: dict[str, tuple[Any, str]] = {
    "subscription": ("failover", "the subscription type: failover or key_shared"),
    "keys": (8, "distinct message keys (key_shared)"),
    "consumer_lifetime": (4.0, "seconds a consumer lives before it closes and subscribes again (0: never)"),
}
CHOICES = {"subscription": ("failover", "key_shared")}
SUBSCRIPTION = "subs"
_TYPES = {"failover": ("Failover", "Failover"), "key_shared": ("KeyShared", "Key_Shared")}


def keys(spec: TestSpec, run_id: str) -> list[str]:
    return topic_names(spec.test_name, run_id, spec.topics)


def worker_count(spec: TestSpec) -> int:
    return max(1, min(MAX_WORKERS, spec.concurrency))


def _sub(spec: TestSpec | None) -> str:
    return str((spec.options if spec else {}).get("subscription", "failover"))


@dataclass(frozen=True)
class Thread:
    index: int
    role: str              # "send" or "receive"
    worker: int


def threads(spec: TestSpec, workers: int | None = None) -> list[Thread]:
    """Half the threads (at least 2, so that there is someone to fail over to) are consumers."""
    w = workers or worker_count(spec)
    c = spec.concurrency
    n_recv = min(max(2, c // 2), max(1, c - 1))
    return ([Thread(i, "receive", i % w) for i in range(n_recv)]
            + [Thread(n_recv + j, "send", j % w) for j in range(c - n_recv)])


def message_key(spec: TestSpec, value: int) -> str | None:
    return f"k{value % int(spec.options.get('keys', 8))}" if _sub(spec) == "key_shared" else None


def generator(spec: TestSpec, thread: Thread, topics: list[str]) -> Iterator[Planned]:
    return base.send_or_receive(spec, "subscriptions", thread.index, thread.role == "send", topics)


def start(ctx: Context) -> list[threading.Thread]:
    spec = ctx.spec
    key_shared = _sub(spec) == "key_shared"
    session = session_for(ctx, key_based_batching=key_shared)
    client_type = _TYPES[_sub(spec)][0]
    lifetime = float(spec.options.get("consumer_lifetime", 4.0))
    mine = [t for t in threads(spec, ctx.workers) if t.worker == ctx.worker]

    def run(t: Thread) -> None:
        rng = ctx.rng("lifetime", t.index)
        name = f"{ctx.run_dir.name[-6:]}-s{t.index}"
        born: dict[str, float] = {}

        def perform(p: Planned, process: int) -> tuple[str, dict[str, Any]]:
            if p.f == "send":
                # batched, key-based for Key_Shared: a batch then holds one key, as Pulsar requires
                return send(session, p.key, True, p.value, message_key(spec, p.value))
            if lifetime > 0 and time.monotonic() - born.setdefault(p.key, time.monotonic()) > lifetime:
                session.leave(p.key, SUBSCRIPTION, name)   # the subscription fails over / rebalances keys
                born[p.key] = time.monotonic() + rng.uniform(-lifetime / 4, lifetime / 4)
            return receive(session, p.key, SUBSCRIPTION, client_type, name)[:2]
        for topic in ctx.keys:
            try:
                if t.role == "receive":
                    session.consumer(topic, SUBSCRIPTION, client_type, name)
                else:
                    session.producer(topic, True)
            except Exception:
                pass
        base.drive(ctx, t.index, spec.concurrency, generator(spec, t, ctx.keys), perform)
    return base.start_threads(ctx, [(f"thread-{t.index}", lambda t=t: run(t)) for t in mine])


def start_final(ctx: Context) -> list[threading.Thread]:
    """Drain the subscription (what it still owes), then replay each topic from the earliest."""
    session = session_for(ctx)
    drains = final_drains(ctx, session, SUBSCRIPTION, _TYPES[_sub(ctx.spec)][0])
    reads = final_reads(ctx, session, base.FINAL_PROCESS + len(ctx.keys))

    def both(i: int) -> None:
        drains[i][1]()
        reads[i][1]()
    return base.start_threads(ctx, [(f"final-{i}", lambda i=i: both(i)) for i in range(len(ctx.keys))])


def checkers(spec: TestSpec | None = None) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    from checkers import select
    sub_type = _TYPES[_sub(spec)][1]
    want = {"log": {"subscription_type": sub_type},
            "queue": {"enqueue": ("send",), "dequeue": ("receive", "drain")},
            "fencing": {}, "perf": {}}
    return select(want)
