"""Deleted ledgers on a bookie: garbage collection of the ledgers whose metadata is gone (gcWaitTime,
clusters/bookie/gc.py), and the fence of a ledger deleted while fenced, kept by default and forgotten by
the bug knob `bookie.write_after_delete_accepted` (apache/bookkeeper#4462, apache/pulsar#20094).

One in-process bookie (real ZooKeeper, real TCP), the real BookKeeper client as writer and as the
recoverer that fences, closes and deletes the writer's empty ledger, as a topic's new owner does.
"""
from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from clusters.bookie.server import Bookie
from clusters.bookkeeper.client import BookKeeper
from clusters.bookkeeper.errors import BKLedgerFencedError, BKNoSuchLedgerError
from clusters.bookkeeper.metadata import CLOSED, ledger_path
from clusters.config import BookieConfig
from clusters.metadata.store import MetadataStore
from tests.bookie.cluster import free_port

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def bookie_and_clients(zk: str, tmp_path, bugs: dict | None = None, gc_ms: int = 600_000):
    """A started bookie and two BookKeeper clients (writer, recoverer) once the bookie registered."""
    cfg = BookieConfig(name="bookie-1", host="127.0.0.1", port=free_port(), http_port=0, zk=zk,
                       data_dir=str(tmp_path / "bookie"), gc_wait_time_ms=gc_ms, bugs=dict(bugs or {}))
    bookie = await Bookie(cfg).start()
    stores, clients = [], []
    try:
        for name in ("writer", "recoverer"):
            store = await MetadataStore(zk, name=name).start()
            stores.append(store)
            clients.append(await BookKeeper(store, name=name).start())
        deadline = time.monotonic() + 20
        while not await clients[0].available_bookies():
            assert time.monotonic() < deadline, "the bookie did not register"
            await asyncio.sleep(0.05)
        yield bookie, clients[0], clients[1]
    finally:
        for c in clients:
            await c.close()
        for s in stores:
            await s.close()
        await bookie.stop()


async def until(cond, what: str, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def _add(lh, data: bytes) -> object:
    try:
        return await asyncio.wait_for(lh.add_entry(data), 10)
    except Exception as e:       # noqa: BLE001 - the outcome is what the test compares
        return e


@pytest.mark.parametrize("knob", [False, True], ids=["fixed", "write_after_delete_accepted"])
def test_an_add_to_a_ledger_deleted_while_fenced(zk, tmp_path, knob):
    """The writer's ledger is empty when another client recovers it (fenced, closed at -1) and deletes
    it (metadata and the bookie's copy, as a topic's new owner deletes the old owner's empty last
    ledger). The writer's next add: refused as fenced; with the knob the bookie takes it for a new
    ledger and acknowledges it, and nobody can read it (the metadata is gone)."""
    bugs = {"bookie.write_after_delete_accepted": True} if knob else None

    async def go():
        async with bookie_and_clients(zk, tmp_path, bugs) as (bookie, writer, recoverer):
            lh = await writer.create_ledger(1, 1, 1)
            lid = lh.ledger_id
            rh = await recoverer.open_ledger(lid, recovery=True)
            assert rh.metadata.state == CLOSED and rh.last_entry_id == -1
            assert bookie.storage.ledgers[lid].fenced
            await recoverer.delete_ledger(lid)
            await until(lambda: lid not in bookie.storage.ledgers, "the bookie did not drop the ledger")
            got = await _add(lh, b"after the delete")
            with pytest.raises(BKNoSuchLedgerError):
                await recoverer.open_ledger(lid, recovery=True)
            return got, lid in bookie.fenced_deleted, lid in bookie.storage.ledgers

    got, remembered, stored = asyncio.run(go())
    if knob:
        assert got == 0 and not remembered and stored        # acknowledged as entry 0 of a "new" ledger
    else:
        assert isinstance(got, BKLedgerFencedError) and remembered and not stored


@pytest.mark.parametrize("knob", [False, True], ids=["fixed", "write_after_delete_accepted"])
def test_garbage_collection_drops_ledgers_whose_metadata_is_gone(zk, tmp_path, knob):
    """BookKeeper deletes metadata only; the bookie's collector (every gcWaitTime, here 0.2 s) drops what
    the metadata no longer names and keeps the rest. A ledger fenced before its metadata went stays
    fenced (the knob forgets it); one that was never fenced is an ordinary deleted ledger (an add
    makes it anew, as in BookKeeper), and the next pass drops that again."""
    bugs = {"bookie.write_after_delete_accepted": True} if knob else None

    async def go():
        async with bookie_and_clients(zk, tmp_path, bugs, gc_ms=200) as (bookie, writer, recoverer):
            live = await writer.create_ledger(1, 1, 1)
            await live.add_entry(b"kept")
            plain = await writer.create_ledger(1, 1, 1)
            await plain.add_entry(b"unfenced")
            fenced = await writer.create_ledger(1, 1, 1)
            await recoverer.open_ledger(fenced.ledger_id, recovery=True)
            store = recoverer.store
            for lid in (plain.ledger_id, fenced.ledger_id):     # BookKeeper's delete: the metadata only
                await store.delete(ledger_path(lid))
            await until(lambda: {plain.ledger_id, fenced.ledger_id}.isdisjoint(bookie.storage.ledgers),
                        "the collector did not drop the deleted ledgers")
            assert live.ledger_id in bookie.storage.ledgers and bookie.gc.passes >= 1
            assert sorted(bookie.gc.deleted) == sorted([plain.ledger_id, fenced.ledger_id])
            assert await live.read(0, 0) == [b"kept"]
            fenced_add = await _add(fenced, b"late")
            plain_add = await _add(plain, b"more")
            # a pass run now drops the "new" ledgers the accepted adds made
            await bookie.gc.collect()
            return fenced_add, plain_add, set(bookie.storage.ledgers)

    fenced_add, plain_add, left = asyncio.run(go())
    assert plain_add == 1 and len(left) == 1                 # the live ledger only
    if knob:
        assert fenced_add == 0
    else:
        assert isinstance(fenced_add, BKLedgerFencedError)


def test_collection_keeps_everything_when_the_metadata_cannot_be_listed(zk, tmp_path):
    """No connected metadata store: a pass drops nothing (a failed scan is not an empty one)."""
    async def go():
        async with bookie_and_clients(zk, tmp_path) as (bookie, writer, _):
            lh = await writer.create_ledger(1, 1, 1)
            await lh.add_entry(b"x")
            await bookie.store.close()
            dropped = await bookie.gc.collect()
            bookie.store = None       # closed above; stop() must not close it again
            return dropped, lh.ledger_id in bookie.storage.ledgers

    dropped, kept = asyncio.run(go())
    assert dropped == [] and kept


def test_gc_wait_time_is_a_bookie_setting_under_bookkeepers_name():
    """`pulsar-chaos run --bookie-setting gcWaitTime=MS` (clusters/bookie/settings.py) sets the interval."""
    from clusters.bookie.settings import bookie_config
    assert bookie_config({"gcWaitTime": "1000"}) == {"gc_wait_time_ms": 1000}
    assert BookieConfig(name="b", host="127.0.0.1", zk="", data_dir="/x").gc_wait_time_ms == 600_000
    for bad, words in (({"gcWaitTim": 1}, "did you mean 'gcWaitTime'"), ({"gcWaitTime": "soon"}, "not a number"),
                       ({"gcWaitTime": 0}, "positive whole number"), ({"gcWaitTime": 1.5}, "positive whole number")):
        with pytest.raises(ValueError, match=words):
            bookie_config(bad)
