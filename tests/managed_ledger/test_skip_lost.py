"""autoSkipNonRecoverableData (BrokerConfig.auto_skip_non_recoverable_data): a read of a closed ledger
skips the entries that no bookie has any more, instead of failing at them for ever; off (Pulsar's
default) the read fails. Pulsar: "autoSkipNonRecoverableData: Skip reading non-recoverable/unreadable
data-ledger under managed-ledger's list. It helps when data-ledgers gets corrupted at bookkeeper and
managed-cursor is stuck at that ledger" (https://pulsar.apache.org/reference/#/next/config/reference-configuration-broker).
Our broker skips exactly the missing entries (Pulsar skips the rest of the ledger)."""
from __future__ import annotations

import asyncio
import shutil

import pytest

from clusters.broker.managed_ledger import ManagedLedger, ManagedLedgerError
from tests.managed_ledger.conftest import broker_cfg, ml_name, run, session

pytestmark = pytest.mark.integration


def _cfg(**kw):
    return broker_cfg(ensemble=1, write_quorum=1, ack_quorum=1, max_entries_per_ledger=5, **kw)


@pytest.mark.parametrize("skip", [True, False])
def test_entries_no_bookie_has_are_skipped_only_when_asked(bookies, zk, skip):
    """Ledger 1 holds entries 0-4 on the only bookie; the bookie's disk is wiped and it comes back
    empty, then 5 more entries go to the next ledger. A new owner reads from the first entry: with
    the setting it gets the 5 that exist and counts 5 skipped; without it the read fails. (The
    bookie runs without cookies, `bookie.no_cookie`, so that it comes back on its wiped disk and
    says "no such entry"; with cookies it would refuse to start until formatted.)"""
    (bookie,) = bookies.start(1, bugs={"bookie.no_cookie": True})
    name = ml_name()
    payload = [b"entry-%d" % i for i in range(10)]

    async def write_then_read():
        async with session(zk, n_bookies=1, name="w") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, _cfg(name="broker-w"))
            first = [await ml.add_entry(p) for p in payload[:5]]
            bookie.stop()
            shutil.rmtree(bookie.dir / "data")
            bookie.start()
            for _ in range(200):                       # registered again (a rollover may have failed)
                if await bk.available_bookies():
                    break
                await asyncio.sleep(0.05)
            rest = [await ml.add_entry(p) for p in payload[5:]]
            assert len({p.ledger_id for p in first}) == 1
            assert {p.ledger_id for p in rest}.isdisjoint({first[0].ledger_id})
            await ml.close()
        async with session(zk, n_bookies=1, name="r") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, _cfg(name="broker-r", auto_skip_non_recoverable_data=skip))
            try:
                if not skip:
                    with pytest.raises(ManagedLedgerError, match="has it"):
                        await ml.read_entries(ml.first_position(), 20)
                    return
                got = await ml.read_entries(ml.first_position(), 20)
                assert [p for p, _ in got] == rest
                assert [d for _, d in got] == payload[5:]
                assert ml.skipped_entries == 5
            finally:
                await ml.close()
    run(write_then_read(), timeout=120)
