"""Helpers shared by the tests' fixtures: a throwaway network-namespace cluster, an official
`pulsar-client` that logs only errors (for netns clusters and the in-memory broker alike), and the
owner of a topic as ZooKeeper records it."""
from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from contextlib import contextmanager
from typing import Any

from clusters.loadbalancer.bundles import NamespaceBundles, local_policies_path, parse_bundles_data, topic_namespace
from clusters.deploy.netns import ClusterSpec, NetnsCluster


@contextmanager
def netns_cluster(prefix: str, backend: str = "netns", image: str | None = None,
                  **spec_kw: Any) -> Iterator[Any]:
    """A cluster (NetnsCluster, or DockerCluster with backend="docker", on `image` if given) named
    `prefix` + 4 random hex digits, built from ClusterSpec(**spec_kw), up for the block and always torn
    down afterwards (also when bringing it up fails): leftovers of its name are swept and its folder
    is removed (copied first to $PULSAR_CHAOS_KEEP_TEST_CLUSTERS/<name> when that is set)."""
    spec = ClusterSpec(name=f"{prefix}{uuid.uuid4().hex[:4]}", **spec_kw)
    if backend == "docker":
        from clusters.deploy.docker import DockerCluster
        c: Any = DockerCluster(spec, image=image)
        cls: Any = DockerCluster
    else:
        c, cls = NetnsCluster(spec), NetnsCluster
    try:
        c.up()
        yield c
    finally:
        try:
            c.down()
        finally:
            cls.cleanup_all(force=True, names=[c.name])
            keep = os.environ.get("PULSAR_CHAOS_KEEP_TEST_CLUSTERS")
            if keep:                         # the nodes' logs and data, to read after a failure
                shutil.copytree(c.base_dir, Path(keep) / c.name, dirs_exist_ok=True, ignore_dangling_symlinks=True)
            shutil.rmtree(c.base_dir, ignore_errors=True)


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


def owner_node(cluster: Any, topic: str) -> str:
    """The broker node whose ephemeral znode owns the topic's bundle (as an operator would read it)."""
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start(20)
    try:
        namespace, _ = topic_namespace(topic)
        raw, _ = zk.get(local_policies_path(namespace))        # its bundles as they are now (splits)
        nb = NamespaceBundles(namespace, parse_bundles_data(json.loads(raw)["bundles"]))
        data, _ = zk.get(nb.bundle_of(topic).path)
    finally:
        zk.stop()
        zk.close()
    addr = json.loads(data)["broker"].split(":")[0]
    for n in cluster.nodes("broker"):
        if n.host == addr:
            return n.name
    raise AssertionError(f"owner {addr} is not a broker of the cluster")
