"""Shared fixtures: a real ZooKeeper on loopback (one per test session), chroots per test."""
from __future__ import annotations

import os
import uuid

import pytest

from clusters import zookeeper


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="integration tests need root (network namespaces, iptables)")
        for item in items:
            if "integration" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """A real Apache ZooKeeper (Debian's package), standalone on 127.0.0.1."""
    if not zookeeper.installed():
        pytest.fail("ZooKeeper is not installed; run `make setup`")
    zk = zookeeper.LocalZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    zk.start()
    try:
        yield zk
    finally:
        zk.stop()


def fresh_chroot(zk_server, prefix: str = "test") -> str:
    """A connect string `127.0.0.1:PORT/<prefix>-XXXX` rooted in a new, empty chroot."""
    from kazoo.client import KazooClient
    chroot = f"/{prefix}-{uuid.uuid4().hex[:12]}"
    client = KazooClient(hosts=zk_server.connect_string)
    client.start(30)
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()
        client.close()
    return zk_server.connect_string + chroot


@pytest.fixture
def zk(zk_server):
    """A fresh chroot per test, so tests never share metadata."""
    return fresh_chroot(zk_server)
