"""The auditor (BookKeeper's Auditor / AuditorBookieCheckTask), run by the elected bookie only.

It follows the registered bookies (/ledgers/available).  A bookie that disappears is *lost* once it
has been gone for `lost_bookie_recovery_delay_s` (a restart within that time costs nothing); then
the auditor reads every ledger's metadata and marks each ledger with a fragment on a lost bookie as
under-replicated, the record listing the lost bookies.  A full audit also runs when the auditor is
elected (after the same delay: bookies that died before, or under a previous auditor, are found
then) and every `audit_interval_s`.  Bookies in ledger metadata that this auditor never saw
registered count as gone since it was elected.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Protocol

from . import stats

log = logging.getLogger(__name__)


class AuditorHost(Protocol):
    """What the auditor uses of the process that elected it (service.AutoRecovery)."""
    bookie_id: str
    lost_bookie_recovery_delay_s: float
    audit_interval_s: float
    bk: Any                      # the BookKeeper client (ledger listing and metadata)
    urm: Any                     # the under-replication manager (urmanager.py)

    def wake_worker(self) -> None: ...


class Auditor:
    def __init__(self, ar: AuditorHost):
        self.ar = ar
        self.delay = max(0.0, ar.lost_bookie_recovery_delay_s)
        self.interval = ar.audit_interval_s
        self.started = time.monotonic()
        self.missing_since: dict[str, float] = {}
        self.wake = asyncio.Event()
        self._due: float | None = self.started + self.delay          # the election audit
        self._next_full = self.started + self.interval if self.interval > 0 else math.inf
        self.audits = 0

    def bookies_changed(self, live: set[str], removed: set[str]) -> None:
        now = time.monotonic()
        for b in removed:
            self.missing_since.setdefault(b, now)
        for b in list(self.missing_since):
            if b in live:
                del self.missing_since[b]
        if removed:
            log.info("auditor %s: bookie(s) %s left; auditing in %.1fs unless they come back",
                     self.ar.bookie_id, sorted(removed), self.delay)
            self._schedule(now + self.delay)

    def _schedule(self, at: float) -> None:
        self._due = at if self._due is None else min(self._due, at)
        self.wake.set()

    async def run(self) -> None:
        while True:
            now = time.monotonic()
            due = min(self._due if self._due is not None else math.inf, self._next_full)
            if now < due:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), min(due - now, 3600.0))
                except asyncio.TimeoutError:
                    pass
                continue
            if self._next_full <= now:
                self._next_full = now + self.interval
            self._due = None
            try:
                await self.audit()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("auditor %s: audit failed: %r; retrying", self.ar.bookie_id, e)
                self._schedule(time.monotonic() + max(1.0, self.delay))

    async def audit(self) -> dict[int, set[str]]:
        """Mark every ledger with a fragment on a lost bookie; {ledger: lost bookies marked}."""
        bk, urm = self.ar.bk, self.ar.urm
        t0 = time.monotonic()
        live = set(await bk.available_bookies())
        for b in list(self.missing_since):
            if b in live:
                del self.missing_since[b]
        marked: dict[int, set[str]] = {}
        newly = 0
        later = math.inf
        ledgers = await bk.all_ledger_metadata()
        for lid, md in ledgers.items():
            eligible = set()
            for b in md.bookies() - live:
                since = self.missing_since.setdefault(b, self.started)
                if t0 - since >= self.delay:
                    eligible.add(b)
                else:
                    later = min(later, since + self.delay)
            if eligible:
                if await urm.mark(lid, eligible, self.ar.bookie_id):
                    newly += 1
                    stats.LEDGERS_MARKED.inc()
                marked[lid] = eligible
        if later < math.inf:
            self._schedule(later)
        self.audits += 1
        stats.AUDITS.inc()
        lost = sorted(set().union(*marked.values())) if marked else []
        log.info("auditor %s: audited %d ledgers in %.2fs: %d on lost bookie(s) %s (%d newly "
                 "marked)", self.ar.bookie_id, len(ledgers), time.monotonic() - t0, len(marked),
                 lost, newly)
        if marked:
            self.ar.wake_worker()
        return marked
