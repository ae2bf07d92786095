"""The one interface a broker calls on its load manager (manager.py registers the load managers), as Pulsar's `ExtensibleLoadManager` has it: the
load manager owns bundle ownership (lookups, who owns a bundle, unloading with or without a
destination, splitting), the broker's registration and load report, and the leader.

The arrow runs one way: clusters/broker imports this package; nothing here imports clusters/broker. What
a load manager needs of its broker is the `BrokerServices` protocol below (the service passes itself).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from clusters.loadbalancer.bundles import Bundle, NamespaceBundles


@dataclass
class LookupResult:
    """A lookup's answer, as the broker sends it in LOOKUP_RESPONSE."""
    kind: str                 # connect | redirect | failed
    url: str = ""
    authoritative: bool = False
    error: str | None = None  # a ServerError name
    message: str | None = None


@dataclass
class Assignment:
    """The load manager's answer for an unowned bundle: take it here (`url` empty), or send the client
    to `url` (`authoritative`: that broker must take it, as the leader's choice)."""
    url: str = ""
    authoritative: bool = False
    error: str | None = None
    message: str | None = None


class UnloadRefused(Exception):
    """An unload the load manager will not do: `status` is the admin API's answer (4xx: the request is
    wrong, e.g. a transfer to the current owner; 503: retry later)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Route:
    """Where an admin unload must go on from this broker: `to` the leader (the same request; `url` its
    web URL) or the owner (a plain unload; `url` its <host>:<pulsar port>)."""
    to: str
    url: str


class Ownership(Protocol):
    """This broker's view and control of bundle ownership, whatever keeps it (ZooKeeper locks for the
    modular load manager; the service-unit state channel for the extensible one)."""

    me: str                        # this broker as owners are named: <host>:<pulsar port>
    owned: set[Bundle]             # the bundles this broker serves now

    def bundle(self, topic: str) -> Bundle:
        """The topic's bundle by this broker's current view of its namespace's boundaries."""

    async def bundle_for(self, topic: str) -> Bundle:
        """The same, with the namespace's boundaries read first if they never were."""

    def bundles(self, namespace: str) -> list[Bundle]: ...

    async def namespace_bundles(self, namespace: str, *, fresh: bool = False) -> NamespaceBundles: ...

    def owns(self, topic: str) -> bool: ...

    async def owner(self, bundle: Bundle) -> str | None:
        """The bundle's owner (<host>:<pulsar port>), None when nobody owns it."""

    async def lookup(self, topic: str, authoritative: bool) -> LookupResult: ...

    async def release(self, bundle: Bundle) -> bool:
        """Give the bundle up (its topics are already closed); True when it is released."""

    async def release_all(self) -> None: ...


class BrokerServices(Protocol):
    """What a load manager may use of its broker (clusters/broker/service.py's BrokerService)."""

    config: Any                    # clusters.config.BrokerConfig
    store: Any                     # clusters.metadata.store.MetadataStore
    io: Any                        # clusters.loadbalancer.signals.IoCounters
    topics: Mapping[str, Any]      # the topics this broker serves, by name

    knobs: Any                     # the broker's bug knobs (clusters.bugs.Knobs); `.of(component)` for another

    def rate(self, *key: Any) -> tuple[float, float]: ...

    async def topics_of_namespace(self, namespace: str) -> list[str]: ...

    async def unload_bundle(self, bundle: Bundle) -> list[str]:
        """Close the bundle's topics (clients look them up again), then release it."""

    async def bundle_lost(self, bundle: Bundle) -> None:
        """Ownership of the bundle was lost behind this broker's back: close its topics."""


class LoadManager(Protocol):
    """What BrokerService calls."""

    name: str
    broker_id: str                 # Pulsar's brokerId: <advertisedAddress>:<webServicePort>
    ownership: Ownership
    counters: dict[str, int]       # unload_broker, unload_bundle, split, assign: the pulsar_lb_* counters

    async def start(self) -> None:
        """Register this broker, join the leader election, start the timers."""

    async def stop(self) -> None:
        """A graceful shutdown: leave the election, stop the timers, give up the bundles, unregister."""

    async def assign(self, bundle: Bundle) -> Assignment:
        """Where an unowned bundle goes, for a lookup that is not authoritative."""

    def is_leader(self) -> bool: ...

    async def leader(self) -> dict[str, Any] | None:
        """The leader's LeaderBroker JSON ({"brokerId", "serviceUrl"}), None when there is none."""

    async def available_brokers(self) -> dict[str, dict[str, Any]]:
        """brokerId -> its registration for every live broker."""

    def load_report(self) -> dict[str, Any]:
        """This broker's current load report (GET /admin/v2/broker-stats/load-report)."""

    def resource_usage(self) -> dict[str, float]:
        """This broker's latest resource usage in percent: cpu, memory, directMemory, bandwidthIn,
        bandwidthOut (the pulsar_lb_*_usage gauges)."""

    async def unload(self, bundle: Bundle, destination: str | None) -> Route | None:
        """The admin unload of `bundle`, a transfer to `destination` (a brokerId) when one is given: done
        here (None), or the Route the request must take (the modular load manager sets a destination on
        its leader, and only the owner closes a bundle's topics); UnloadRefused when it will not be done."""

    async def split(self, bundle: Bundle, algorithm: str | None, positions: list[int] | None,
                    unload: bool) -> list[Bundle]:
        """Split a bundle this broker owns (admin split or the leader's split task)."""
