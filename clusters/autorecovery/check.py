"""Checks of a cluster's replication state from outside, for tests, benchmarks and operators:
which ledgers still have a fragment on given bookies, which are marked under-replicated, and an
exhaustive copy check (every entry of every closed ledger read from each bookie of its write set).

    async with connect(zk) as (store, bk, urm):
        st = await replication_state(bk, urm, {"10.213.1.21:3181"})
        report = await check_all_copies(bk, live)
"""
from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

from clusters.bookkeeper.admin import BookKeeperAdmin
from clusters.bookkeeper.client import BookKeeper
from clusters.bookkeeper.metadata import CLOSED
from clusters.metadata.store import MetadataStore

from .urmanager import UnderreplicationManager


@contextlib.asynccontextmanager
async def connect(zk: str, name: str = "autorecovery-check"
                  ) -> AsyncIterator[tuple[MetadataStore, BookKeeper, UnderreplicationManager]]:
    store = await MetadataStore(zk, name=name).start()
    bk = None
    try:
        bk = await BookKeeper(store, name=name).start()
        yield store, bk, UnderreplicationManager(store, bk._zk)
    finally:
        if bk is not None:
            await bk.close()
        await store.close()


async def replication_state(bk: BookKeeper, urm: UnderreplicationManager,
                            lost: set[str]) -> dict[str, Any]:
    """{"ledgers": n, "on_lost": [ledger ids with a fragment on a `lost` bookie],
    "marked": [under-replicated ledger ids], "open": [ids not closed]}."""
    mds = await bk.all_ledger_metadata()
    return {"ledgers": len(mds),
            "on_lost": sorted(lid for lid, md in mds.items() if md.bookies() & lost),
            "marked": await urm.list(),
            "open": sorted(lid for lid, md in mds.items() if md.state != CLOSED)}


async def check_all_copies(bk: BookKeeper, live: set[str]) -> dict[str, Any]:
    """check_copies over every closed ledger: {"ledgers", "entries", "copies", "problems"}."""
    admin = BookKeeperAdmin(bk)
    total = {"ledgers": 0, "entries": 0, "copies": 0, "problems": []}
    for md in (await bk.all_ledger_metadata()).values():
        if md.state != CLOSED:
            continue
        got = await admin.check_copies(md, live)
        total["ledgers"] += 1
        total["entries"] += got["entries"]
        total["copies"] += got["copies"]
        total["problems"].extend(got["problems"])
    return total
