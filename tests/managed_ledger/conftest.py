"""Fixtures for the ManagedLedger tests: a module-wide ZooKeeper chroot with 3 real bookie processes
(shared by the tests that do not harm bookies), plus helpers to open BookKeeper clients and MLs."""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest

from clusters.bookkeeper.client import BookKeeper
from clusters.config import BrokerConfig
from clusters.metadata.store import MetadataStore
from tests.conftest import fresh_chroot
from tests.bookie.cluster import Bookies, bookies  # noqa: F401  (`bookies`: per-test cluster fixture)


@pytest.fixture(scope="module")
def shared_zk(zk_server):
    """A ZooKeeper chroot for the whole module (the per-test `zk` fixture is function scoped)."""
    return fresh_chroot(zk_server, "test-ml")


@pytest.fixture(scope="module")
def shared_bookies(shared_zk, tmp_path_factory):
    """Three bookie processes for the module; killed at teardown even when tests fail."""
    cluster = Bookies(shared_zk, tmp_path_factory.mktemp("ml-bookies"))
    try:
        cluster.start(3)
        yield cluster
    finally:
        cluster.kill_all()


def broker_cfg(name: str = "broker-a", **kw) -> BrokerConfig:
    """A broker's settings for an ML under test. Retention is infinite unless a test sets it (the
    tests that read everything back must not race the trimmer); cursors persist without a rate
    limit unless a test sets one."""
    base = dict(name=name, host="127.0.0.1", zk="unused", data_dir="/nonexistent",
                ensemble=3, write_quorum=2, ack_quorum=2,
                default_retention_minutes=-1, default_retention_size_mb=-1, cursor_mark_delete_rate=0)
    base.update(kw)
    return BrokerConfig(**base)


def ml_name() -> str:
    return f"public/default/persistent/t-{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def session(zk: str, n_bookies: int = 3, name: str = "s", add_timeout: float = 5.0):
    """One broker's view of the world: its own ZooKeeper session and BookKeeper client."""
    store = await MetadataStore(zk, name=name).start()
    bk = None
    try:
        bk = await BookKeeper(store, name=name, add_timeout=add_timeout).start()
        deadline = time.monotonic() + 20
        while len(await bk.available_bookies()) < n_bookies:
            assert time.monotonic() < deadline, "bookies did not register"
            await asyncio.sleep(0.05)
        yield store, bk
    finally:
        if bk is not None:
            await bk.close()
        await store.close()


def run(coro, timeout: float = 60.0):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())
