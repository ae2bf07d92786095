"""The managed ledger's back-off after failed rollovers (no ledger-creation storm while the bookies are
down), over real ZooKeeper and real bookie processes.

Pulsar's ManagedLedgerImpl refuses an add at once ("Waiting for new ledger creation to complete")
for WaitTimeAfterLedgerCreationFailureMs (10 s) after a failed ledger creation, instead of trying
again on every add. Ours: the first retry is at once, then 1, 2, 4, 8 and 10 s (managed_ledger.py,
ManagedLedger._note_broken_rollover); a ledger that broke before any add to it succeeded counts as a
failed rollover too."""
from __future__ import annotations

import asyncio
import time

import pytest

from clusters.bookkeeper.errors import BKNotEnoughBookiesError
from clusters.broker.managed_ledger import ManagedLedger, ManagedLedgerError, ManagedLedgerFenced
from tests.managed_ledger.conftest import broker_cfg, ml_name, run, session

pytestmark = pytest.mark.timeout(120)


async def add_for(ml: ManagedLedger, seconds: float, limit: int = 5000) -> tuple[int, list[BaseException]]:
    """Add entries one after the other for `seconds` (at most `limit`); (successes, errors)."""
    ok, errs = 0, []
    deadline = time.monotonic() + seconds
    for i in range(limit):
        if time.monotonic() >= deadline:
            break
        try:
            await ml.add_entry(b"x%d" % i)
            ok += 1
        except ManagedLedgerError as e:
            errs.append(e)
            await asyncio.sleep(0.005)
    return ok, errs


def test_failed_ledger_creations_back_off(shared_bookies, shared_zk):
    """BookKeeper refuses every ledger creation for a while: the adds fail at once, but the managed
    ledger tries to create a ledger only a few times (without the back-off: once per add)."""
    name = ml_name()

    async def scenario():
        async with session(shared_zk, name="a") as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg(max_entries_per_ledger=3))
            for i in range(3):
                await ml.add_entry(b"%d" % i)
            real_create = bk.create_ledger
            calls: list[float] = []

            async def refusing(*a, **kw):
                calls.append(time.monotonic())
                raise BKNotEnoughBookiesError("injected: every bookie is down")
            bk.create_ledger = refusing
            ok, errs = await add_for(ml, 1.5)
            assert ok == 0 and len(errs) > 50
            assert not any(isinstance(e, ManagedLedgerFenced) for e in errs)
            # attempts: the rollover, the first retry at once, the next after 1 s (not one per add)
            assert len(calls) == 3, f"{len(calls)} ledger creations for {len(errs)} adds"
            assert calls[2] - calls[1] >= 0.95
            assert any("next attempt in" in str(e) for e in errs), errs[-1]
            bk.create_ledger = real_create                    # the bookies are back
            deadline = time.monotonic() + 10
            while True:
                try:
                    await ml.add_entry(b"after")
                    break
                except ManagedLedgerError:
                    assert time.monotonic() < deadline, "never created a ledger again"
                    await asyncio.sleep(0.1)
            assert ml._create_failures == 0
            await ml.close()
    run(scenario())


def test_no_ledger_storm_while_every_bookie_is_down(bookies, zk):
    """Every bookie killed: their registrations outlive them for the ZooKeeper session timeout, so
    ledger creation succeeds and every add to the new ledger fails at once. Each such ledger counts
    as a failed rollover: a handful of ledgers are created in 4 s, not one per add."""
    procs = bookies.start(3, zk_session_timeout=8.0)
    name = ml_name()

    async def scenario():
        async with session(zk, 3, name="a", add_timeout=1.0) as (store, bk):
            ml = await ManagedLedger.open(name, store, bk, broker_cfg())
            await ml.add_entry(b"before")
            real_create = bk.create_ledger
            created: list[int] = []

            async def counting(*a, **kw):
                lh = await real_create(*a, **kw)
                created.append(lh.ledger_id)
                return lh
            bk.create_ledger = counting
            for p in procs:
                p.kill9()
            assert len(await bk.available_bookies()) == 3          # not expired yet
            ok, errs = await add_for(ml, 4.0)
            assert ok == 0 and errs
            assert len(created) <= 5, f"{len(created)} ledgers created for {len(errs)} failed adds"
            await ml.close()
    run(scenario())


@pytest.mark.parametrize("knob", [False, True])
def test_bug_knob_rollover_race_creates_two_ledgers_hides_acknowledged_entries(shared_bookies, shared_zk, knob):
    """broker.rollover_race_creates_two_ledgers (apache/pulsar#12221, #14664): the ledger's maximum
    age (managedLedgerMaxLedgerRolloverTimeMinutes) is reached while the next ledger is being created
    (slowly: BookKeeper takes 0.6 s). With the knob a second ledger is created beside it; it takes the
    writes and its ledger-list update fails, so the adds acknowledged on it are in no listed ledger and
    the next owner reads a log without them. Without it the age check waits for the creation."""
    name = ml_name()
    bugs = {"broker.rollover_race_creates_two_ledgers": True} if knob else {}

    async def scenario():
        async with session(shared_zk, name="a") as (sa, bka), session(shared_zk, name="b") as (sb, bkb):
            ml = await ManagedLedger.open(name, sa, bka, broker_cfg(max_entries_per_ledger=3,
                                                                    max_ledger_age_s=0.3, bugs=bugs))
            real_create = bka.create_ledger
            created: list[int] = []

            async def slow(*a, **kw):                       # bookie or ZooKeeper latency
                await asyncio.sleep(0.6)
                lh = await real_create(*a, **kw)
                created.append(lh.ledger_id)
                return lh
            bka.create_ledger = slow
            acked = []
            for i in range(12):                             # the 4th add starts a rollover (3 per ledger)
                acked.append(b"e%d" % i)
                await ml.add_entry(acked[-1])
            await ml.close()
            ml_b = await ManagedLedger.open(name, sb, bkb, broker_cfg(name="broker-b"))
            first = ml_b.first_position()
            got = [data for _, data in await ml_b.read_entries(first, 100)] if first is not None else []
            await ml_b.close()
            if knob:
                assert len(created) >= 3                      # two ledgers for one rollover
                missing = [e for e in acked if e not in got]
                assert missing, "every acknowledged entry is listed"
                assert all(e in acked for e in got)
            else:
                assert got == acked
    run(scenario())
