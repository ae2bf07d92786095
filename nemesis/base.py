"""What a nemesis is: a fault the harness's nemesis process starts and stops on a live cluster.

Targets are resolved when the fault starts (random draws from the context's rng, a topic's owner
asked of the brokers right now), and each start/stop returns exactly what it did, for the history.
"""
from __future__ import annotations

import abc
import json
import random
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from clusters.deploy.backend import Cluster
from clusters.protocol.topics import normalize_topic

SERVER_ROLES = ("zookeeper", "bookie", "broker")
LOOKUP_TIMEOUT = 3.0          # seconds per broker asked
# Brokers are on the cluster's private network: never go through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NemesisError(RuntimeError):
    """A fault that could not be performed (or undone); journaled as `info` with this message."""


class FaultNameError(ValueError):
    """A fault name that names no fault: `problem` and `fix` for a one-line usage error."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem} (fix: {fix})")
        self.problem, self.fix = problem, fix


def lookup_url(admin_url: str, topic: str, authoritative: bool = False) -> str:
    """The REST lookup URL of `topic` on a broker's admin URL (Pulsar's /lookup/v2/topic/...)."""
    topic = normalize_topic(topic)
    domain, rest = topic.split("://", 1)
    path = "/".join(quote(p, safe="") for p in rest.split("/"))
    return f"{admin_url.rstrip('/')}/lookup/v2/topic/{domain}/{path}" + ("?authoritative=true" if authoritative else "")


def http_lookup(admin_url: str, topic: str, timeout: float = LOOKUP_TIMEOUT) -> dict[str, Any]:
    """GET a broker's lookup of `topic`: its JSON answer ({"brokerUrl": ..., ...}); raises on any failure."""
    url = lookup_url(admin_url, topic)
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            body = resp.read(1 << 20)
    except urllib.error.HTTPError as e:
        try:
            reason = json.loads(e.read(1 << 16)).get("reason", "")
        except Exception:
            reason = ""
        raise NemesisError(f"HTTP {e.code}" + (f": {reason}" if reason else "")) from None
    data = json.loads(body)
    if not isinstance(data, dict) or not isinstance(data.get("brokerUrl"), str):
        raise NemesisError(f"malformed lookup answer {body[:200]!r}")
    return data


@dataclass
class NemesisContext:
    """What a nemesis acts on: the cluster, the run's random source, the workload's topics."""
    cluster: Cluster
    rng: random.Random
    topics: list[str] = field(default_factory=list)
    lookup_timeout: float = LOOKUP_TIMEOUT
    # Replaces the HTTP lookup (topic -> owning broker's node name): for systems without the REST API
    # and for unit tests without brokers.
    lookup: Callable[[str], str] | None = None
    # the spec's explicit grudge ({node: [nodes it drops]}) for the `grudge` nemesis
    grudge: dict[str, list[str]] = field(default_factory=dict)

    def names(self, *roles: str) -> list[str]:
        """Node names of these roles, sorted: the stable pool random choices draw from."""
        return sorted(n.name for n in self.cluster.nodes() if n.role in roles)

    def owner_of(self, topic: str) -> str:
        """The node name of the broker owning `topic` now, by asking the live brokers in name order
        (the first that answers wins). Raises NemesisError if none answers."""
        if self.lookup is not None:
            return self.lookup(topic)
        brokers = sorted(self.cluster.nodes("broker"), key=lambda n: n.name)
        if not brokers:
            raise NemesisError("the cluster has no brokers")
        by_host = {n.host: n.name for n in brokers}
        errors = []
        for b in brokers:
            if not b.alive or b.paused:
                errors.append(f"{b.name}: {'paused' if b.paused else 'not running'}")
                continue
            admin = f"http://{b.host}:{b.ports.get('http', 8080)}"
            try:
                answer = http_lookup(admin, topic, self.lookup_timeout)
            except Exception as e:
                errors.append(f"{b.name}: {type(e).__name__}: {e}")
                continue
            host = urlsplit(answer["brokerUrl"]).hostname
            if host in by_host:
                return by_host[host]
            errors.append(f"{b.name}: answered {answer['brokerUrl']}, not a broker of this cluster")
        raise NemesisError(f"no broker answered the lookup of {normalize_topic(topic)}: " + "; ".join(errors))


class Nemesis(abc.ABC):
    """One fault family. `start` performs the fault and returns its exact targets; `stop` undoes it.

    `choose` makes the fault's random draws (and nothing else), so the runner can journal the intended
    targets before acting; `start(ctx)` without a plan chooses itself. A nemesis remembers what it
    applied (`applied`, set before its first side effect) until `stop` succeeds."""

    name: str = ""

    def __init__(self) -> None:
        self.applied: dict[str, Any] | None = None

    def choose(self, ctx: NemesisContext) -> dict[str, Any]:
        return {}

    @abc.abstractmethod
    def start(self, ctx: NemesisContext, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        """Perform the fault; return its exact targets (JSON-serializable)."""

    @abc.abstractmethod
    def stop(self, ctx: NemesisContext) -> dict[str, Any]:
        """Undo the fault; return what was undone. A no-op (returning {}) when nothing is applied."""

    def is_active(self) -> bool:
        return self.applied is not None

    def describe(self) -> str:
        """One line for a progress display."""
        return f"{self.name} {json.dumps(self.applied, sort_keys=True)}" if self.applied else self.name

    def _check_idle(self) -> None:
        if self.applied is not None:
            raise NemesisError(f"{self.name} is already active ({self.describe()}); stop it first")
