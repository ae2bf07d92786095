"""The balance workload: the log workload over many topics with skewed rates, for the load balancer.

Hundreds of topics spread over the namespace's bundles; senders pick topics by a Zipf law (a few hot
topics, a long tail), consumers read every topic, final reads replay them all, so the log checker
judges loss and order while bundles move. Every op records the broker that served it (`node`), and
the `ownership` checker judges the bundles' owners from the ZooKeeper recorder's journal, and the
`balance` checker the load per broker, the time to balance after brokers leave or join and the
unavailability of the topics of each unloaded bundle. Under the extensible load manager the owners come
from its service-unit state channel, and the `channel` checker judges the channel itself (its in-flight
limit from the run's lb settings). An optional
hot-spot phase sends most of the traffic to a few topics, so that their bundles split.
"""
from __future__ import annotations

import bisect
import itertools
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

from core.spec import TestSpec
from workloads import base, log
from workloads.base import Context, Planned

DESCRIPTION = ("many topics with Zipf-skewed rates (an optional hot-spot phase), a producer and consumer per "
               "topic, final reads; judged by the log and ownership checkers while load moves")
OPTIONS: dict[str, tuple[Any, str]] = {
    "skew": (1.0, "Zipf exponent of the topics' send rates (0: uniform)"),
    "hot_topics": (0, "topics that get hot_share of the sends during the hot-spot phase (0: no phase)"),
    "hot_share": (0.8, "share of the sends that go to the hot topics during the hot-spot phase"),
    "hot_from": (0.2, "start of the hot-spot phase, as a fraction of the time limit"),
    "hot_until": (0.7, "end of the hot-spot phase, as a fraction of the time limit"),
    "payload": (0, "bytes of a send's payload: its value padded with spaces to this length (0: the value's "
                   "digits only, ~8 bytes), so that the workload's bytes, not the brokers' own, dominate their load"),
    "lookup": ("home", "home: each worker looks topics up through its home broker only (as every workload; "
                       "while that broker is away the worker cannot); all: through every broker, home first"),
}
CHOICES = {"lookup": ("home", "all")}
# a payload's bytes at most: below Pulsar's maxMessageSize (5 MB by default) with room for its metadata
MAX_PAYLOAD = 4 * 1024 * 1024


def option_problem(spec: TestSpec) -> tuple[str, str] | None:
    """`payload` from 0 to MAX_PAYLOAD bytes (larger sends are refused by the brokers: every send fails)."""
    p = spec.options.get("payload", 0)
    if isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= MAX_PAYLOAD:
        return None
    return (f"payload must be a whole number of bytes from 0 to {MAX_PAYLOAD}, not {p!r}",
            "use e.g. --option payload=4096 (0: the value's digits only)")
CHECKER_NAMES = ("log", "ownership", "perf", "balance")
EXTENSIBLE_CHECKER_NAMES = CHECKER_NAMES + ("channel",)      # when the spec's load manager is extensible

keys = log.keys
worker_count = log.worker_count
threads = log.threads


def checkers(spec: TestSpec | None = None, extra: dict[str, dict[str, Any]] | None = None
             ) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    from checkers import select
    extra = {k: dict(v) for k, v in (extra or {}).items()}
    names = CHECKER_NAMES
    if spec is not None:
        # the grace period the brokers ran with (Pulsar: 30 min), so that a shortened one is not reported
        grace_min = float(spec.lb_settings.get("loadBalancerSheddingGracePeriodMinutes", 30))
        extra.setdefault("ownership", {}).setdefault("grace_s", grace_min * 60.0)
        if spec.load_manager == "extensible":
            names = EXTENSIBLE_CHECKER_NAMES
            # an in-flight state is overridden by the leader's monitor once older than the waiting time,
            # at its next pass: the two settings the brokers ran with (Pulsar: 30 s + 60 s)
            wait_ms = float(spec.lb_settings.get("loadBalancerInFlightServiceUnitStateWaitingTimeInMillis", 30000))
            monitor_s = float(spec.lb_settings.get("loadBalancerServiceUnitStateMonitorIntervalInSeconds", 60))
            extra.setdefault("channel", {}).setdefault("in_flight_limit_s", wait_ms / 1000.0 + monitor_s)
            # a running destination completes an Assigning at once: within the waiting time
            extra["channel"].setdefault("assign_limit_s", wait_ms / 1000.0)
    return select({n: extra.get(n, {}) for n in names})


def _cumulative(weights: list[float]) -> list[float]:
    return list(itertools.accumulate(weights))


def generator(spec: TestSpec, thread: log.Thread, topics: list[Any]) -> Iterator[Planned]:
    """A sender's ops pick topics by Zipf weights (hot-spot phase: hot_share of them among the first
    hot_topics); a receiver's pick uniformly among its topics. A pure function of (seed, thread);
    the phase follows the planned time (the sum of the delays)."""
    opts = {k: spec.options.get(k, d) for k, (d, _) in OPTIONS.items()}
    rng = random.Random(f"{spec.seed}:balance:{thread.index}")
    delays = base.paced(rng, spec.rate / spec.concurrency)
    keys_ = [topics[t] for t in thread.topics]
    zipf = _cumulative([1.0 / (i + 1) ** float(opts["skew"]) for i in range(len(keys_))])
    hot = max(0, min(int(opts["hot_topics"]), len(keys_)))
    start, end = float(opts["hot_from"]) * spec.time_limit, float(opts["hot_until"]) * spec.time_limit
    planned, n = 0.0, 0
    while True:
        delay = next(delays)
        planned += delay
        if thread.role != "send":
            yield Planned("receive", rng.choice(keys_), None, delay)
            continue
        if hot and start <= planned < end and rng.random() < float(opts["hot_share"]):
            key = keys_[rng.randrange(hot)]
        else:
            key = keys_[min(bisect.bisect_left(zipf, rng.random() * zipf[-1]), len(keys_) - 1)]
        n += 1
        yield Planned("send", key, (thread.index + 1) * base.VALUE_STRIDE + n, delay)


def start(ctx: Context) -> list[threading.Thread]:
    """The log workload's threads on this plan; producers and consumers made on first use (one per
    topic and thread), not up front: there are hundreds of topics."""
    return log.start(ctx, plan_for=lambda t: generator(ctx.spec, t, ctx.keys), warm=False)


start_final = log.start_final
