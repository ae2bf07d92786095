"""Fixtures of the auto-recovery tests: real ZooKeeper (a chroot per test) and real bookie
processes (`bookies`), plus helpers to open a BookKeeper client and an AutoRecovery in-process."""
from __future__ import annotations

import asyncio
import contextlib
import time

from clusters.autorecovery import AutoRecovery, UnderreplicationManager
from clusters.bookkeeper.client import BookKeeper
from clusters.metadata.store import MetadataStore
from tests.bookie.cluster import bookies  # noqa: F401  (fixture)

# bookie processes whose auto-recovery the test drives itself, in-process
MANUAL = dict(autorecovery_enabled=False, zk_session_timeout=2.0)


@contextlib.asynccontextmanager
async def client(zk: str, n_bookies: int = 0, name: str = "test"):
    """(store, bk, urm): a BookKeeper client of the test, once n_bookies are registered."""
    store = await MetadataStore(zk, name=name).start()
    bk = None
    try:
        bk = await BookKeeper(store, name=name).start()
        urm = UnderreplicationManager(store, bk._zk)
        await urm.ensure_paths()
        await wait_until(lambda: _count(bk, n_bookies), 20, f"{n_bookies} bookies registered")
        yield store, bk, urm
    finally:
        if bk is not None:
            await bk.close()
        await store.close()


async def _count(bk: BookKeeper, n: int) -> bool:
    return len(await bk.available_bookies()) >= n


@contextlib.asynccontextmanager
async def autorecovery(zk: str, bookie_id: str, **kw):
    ar = await AutoRecovery(zk, bookie_id, session_timeout=2.0, **kw).start()
    try:
        await ar.ready(20)
        yield ar
    finally:
        await ar.stop()


async def wait_until(pred, timeout: float, what: str, interval: float = 0.1):
    """Await pred() (a coroutine function or a plain function) until truthy; fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def gone_from_zk(bk: BookKeeper, addr: str, timeout: float = 20.0) -> None:
    async def gone() -> bool:
        return addr not in await bk.available_bookies()
    await wait_until(gone, timeout, f"{addr} to leave /ledgers/available")


def run(coro, timeout: float = 90.0):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def payload(lid: int, i: int) -> bytes:
    """Entries of varying sizes, so lengths and checksums differ entry to entry."""
    return (b"%d:%06d|" % (lid, i)) + bytes([65 + i % 26]) * (20 + (i * 37) % 300)
