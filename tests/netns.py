"""Helpers shared by the tests' fixtures: a throwaway network-namespace cluster, and an official
`pulsar-client` that logs only errors (for netns clusters and the in-memory broker alike)."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from clusters.deploy.netns import ClusterSpec, NetnsCluster


@contextmanager
def netns_cluster(prefix: str, **spec_kw: Any) -> Iterator[NetnsCluster]:
    """A NetnsCluster named `prefix` + 4 random hex digits, built from ClusterSpec(**spec_kw), up for
    the block and always torn down afterwards (also when bringing it up fails)."""
    c = NetnsCluster(ClusterSpec(name=f"{prefix}{uuid.uuid4().hex[:4]}", **spec_kw))
    try:
        c.up()
        yield c
    finally:
        c.down()


@contextmanager
def pulsar_client(url: str, operation_timeout_seconds: int = 30, **kw: Any) -> Iterator[Any]:
    """A pulsar.Client on `url` with an error-level console logger, closed on exit."""
    import pulsar
    c = pulsar.Client(url, operation_timeout_seconds=operation_timeout_seconds,
                      logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **kw)
    try:
        yield c
    finally:
        c.close()
