"""Observers: what the runner watches in the cluster beside the workload, for the checkers that read
observations (core/observations.py). A checker names the observers it needs (`checkers.Checker.observers`);
the runner starts each by its entry here, never by the checker's name.

- `bundle-owner`: who owns each bundle, the namespace boundaries, the brokers' registrations and the
  load-balancer leader, from the source of the brokers' load manager (`OWNER_SOURCES`, one per load
  manager: the modular one's ZooKeeper locks, harness/recorder.py; the extensible one's service-unit state
  channel and the brokers' table views, harness/channel_recorder.py). The brokers' logged decisions
  (`LB_EVENT` lines) are imported after a run that ran it.

A plugin adds an observer with `OBSERVERS.register(name, Observer(...))`, or a source for its own load
manager with `OWNER_SOURCES.register(load_manager, source)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from core.history import Journal
from core.registry import Registry


class Running(Protocol):
    def stop(self, reason: str) -> Any: ...


@dataclass(frozen=True)
class ObserverContext:
    """What an observer starts from: the run's cluster.json document, the spec, and its journal."""
    cluster: dict[str, Any]
    load_manager: str
    journal: Journal
    run_dir: Path


class ObserverError(RuntimeError):
    """An observer could not start (the message names why); the run records it as an error."""


@dataclass(frozen=True)
class Observer:
    help: str
    journal: str                                   # its journal's file name under journals/
    start: Callable[[ObserverContext], Running]
    imports_lb_events: bool = False                # the brokers' LB_EVENT lines join the history after it


def _zk_locks(ctx: ObserverContext) -> Running:
    from harness import recorder
    if not ctx.cluster.get("zk_connect"):
        raise ObserverError("cluster.json names no zk_connect")
    try:
        return recorder.record(ctx.cluster["zk_connect"], ctx.journal, ctx.cluster)
    except recorder.RecorderError as e:
        raise ObserverError(str(e)) from None


def _channel(ctx: ObserverContext) -> Running:
    from harness import channel_recorder
    try:
        return channel_recorder.record(ctx.cluster, ctx.journal)
    except channel_recorder.ChannelRecorderError as e:
        raise ObserverError(str(e)) from None


# load manager -> how bundle ownership is observed under it
OWNER_SOURCES: Registry[Callable[[ObserverContext], Running]] = Registry("bundle-owner source", {
    "modular": _zk_locks,
    "extensible": _channel,
})


def _bundle_owner(ctx: ObserverContext) -> Running:
    from clusters.config import DEFAULT_LOAD_MANAGER
    name = ctx.load_manager or DEFAULT_LOAD_MANAGER
    if name not in OWNER_SOURCES:
        raise ObserverError(f"no bundle-owner source for load manager {name!r} "
                            f"(sources: {', '.join(OWNER_SOURCES)})")
    return OWNER_SOURCES[name](ctx)


OBSERVERS: Registry[Observer] = Registry("observer", {
    "bundle-owner": Observer("bundle owners, boundaries, broker registrations and the load-balancer leader, "
                             "from the brokers' load manager's source", "ownership.jsonl", _bundle_owner,
                             imports_lb_events=True),
})
