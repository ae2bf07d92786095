"""The load managers a broker can run: `--load-manager` (Pulsar's `loadManagerClassName`) names an entry
of LOAD_MANAGERS, each meeting api.LoadManager: `modular` (`ModularLoadManagerImpl`, Pulsar's default;
ownership by ZooKeeper locks, zk_ownership.py) and `extensible` (`ExtensibleLoadManagerImpl`, PIP-192;
ownership by the service-unit state channel, channel_ownership.py; extensible_manager.py). The default is written once, as clusters/config.py's
DEFAULT_LOAD_MANAGER.
"""
from __future__ import annotations

from typing import Any

from clusters.config import DEFAULT_LOAD_MANAGER
from clusters.loadbalancer.api import BrokerServices, LoadManager
from core.registry import Registry


def _modular() -> Any:
    from clusters.loadbalancer.modular import ModularLoadManager
    return ModularLoadManager


def _extensible() -> Any:
    from clusters.loadbalancer.extensible_manager import ExtensibleLoadManager
    return ExtensibleLoadManager


LOAD_MANAGERS: Registry = Registry("load manager")
LOAD_MANAGERS.register("modular", _modular)
LOAD_MANAGERS.register("extensible", _extensible)


def create(name: str | None, service: BrokerServices) -> LoadManager:
    return LOAD_MANAGERS[name or DEFAULT_LOAD_MANAGER]()(service)
