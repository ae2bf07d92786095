"""The deployment backends by name: the table the CLI and the runner choose a cluster class from.

Each entry names its class as "module:Class", imported on first use, so that reading this table (the
CLI's --help, a test spec's validation) loads no backend's code.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from clusters.deploy.backend import ClusterError

DEFAULT = "netns"


@dataclass(frozen=True)
class BackendEntry:
    """One backend: its cluster class (a `StateFileCluster`), and a line of help for --backend."""
    name: str
    cluster: str        # "module:Class"
    help: str

    def cluster_class(self) -> type[Any]:
        """The backend's `clusters.deploy.lifecycle.StateFileCluster` subclass (lifecycle.py reads this
        table, so it is not imported here, even for typing)."""
        module, _, attr = self.cluster.partition(":")
        return getattr(importlib.import_module(module), attr)

    def preflight(self) -> None:
        """What a run on this backend needs before anything is created (root, tools, engine, image);
        a ClusterError naming the fix."""
        self.cluster_class().preflight()


BACKENDS: dict[str, BackendEntry] = {e.name: e for e in (
    BackendEntry("netns", "clusters.deploy.netns:NetnsCluster",
                 "network namespaces on a bridge of this host (the default)"),
    BackendEntry("docker", "clusters.deploy.docker:DockerCluster",
                 "docker containers on an internal network (`make setup BACKEND=docker`)"),
)}


def get(name: str) -> BackendEntry:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ClusterError(f"unknown backend {name!r}", f"use one of: {', '.join(BACKENDS)}") from None


def list_clusters() -> list[dict[str, Any]]:
    """Every cluster every backend knows on this host, one row each: name, backend, status (`gone`:
    its state says it exists but nothing of it is left), subnet, base_dir."""
    return [row for entry in BACKENDS.values() for row in entry.cluster_class().known()]


def all_states() -> list[tuple[str, dict[str, Any]]]:
    """(backend, state) of every cluster state on this host, whatever its status."""
    return [(name, state) for name, entry in BACKENDS.items() for _, state in entry.cluster_class().states()]
