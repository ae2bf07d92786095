"""The one interface a broker calls on its load manager, as Pulsar's `LoadManager`: where an unowned
bundle goes (assignment), the broker's registration and load report, shedding, splitting, and the
leader. `--load-manager` names an entry of LOAD_MANAGERS (`modular`, Pulsar's default
`ModularLoadManagerImpl`); the extensible load manager will be a second entry.
"""
from __future__ import annotations

from typing import Any, Protocol

from clusters.broker.ownership import Assignment, Bundle
from core.registry import Registry


class LoadManager(Protocol):
    """What BrokerService calls. `service` is the broker (config, store, ownership, topics, rates)."""

    name: str
    broker_id: str                 # Pulsar's brokerId: <advertisedAddress>:<webServicePort>

    async def start(self) -> None:
        """Register this broker (its load report znode), join the leader election, start the timers."""

    async def stop(self) -> None:
        """Leave the election, stop the timers, unregister (a graceful shutdown)."""

    async def assign(self, bundle: Bundle) -> Assignment:
        """Where an unowned bundle goes, for a lookup that is not authoritative."""

    def is_leader(self) -> bool: ...

    async def leader(self) -> dict[str, Any] | None:
        """The leader's LeaderBroker JSON ({"brokerId", "serviceUrl"}), None when there is none."""

    async def available_brokers(self) -> dict[str, dict[str, Any]]:
        """brokerId -> its registration (LocalBrokerData JSON) for every live broker."""

    def load_report(self) -> dict[str, Any]:
        """This broker's current LocalBrokerData JSON (GET /admin/v2/broker-stats/load-report)."""

    async def set_affinity(self, bundle: Bundle, broker_id: str) -> None:
        """Unload with a destination: the next assignment of `bundle` goes to `broker_id`."""

    async def split(self, bundle: Bundle, algorithm: str | None, positions: list[int] | None,
                    unload: bool) -> list[Bundle]:
        """Split a bundle this broker owns (admin split or the leader's split task)."""


def _modular() -> Any:
    from clusters.loadbalancer.modular import ModularLoadManager
    return ModularLoadManager


LOAD_MANAGERS: Registry = Registry("load manager")
LOAD_MANAGERS.register("modular", _modular)
DEFAULT_LOAD_MANAGER = "modular"


def create(name: str, service: Any) -> LoadManager:
    return LOAD_MANAGERS[name]()(service)
