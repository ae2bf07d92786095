"""Operator-level operations on top of the BookKeeper client (a subset of BookKeeper's
BookKeeperAdmin / LedgerFragmentReplicator), used by auto-recovery and by tests:

  * `read_entry_from(addr, ...)` / `add_entry_to(addr, ...)`: one entry on ONE bookie, over the
    bookie protocol, with the entry's stored LAC, length and checksum exactly as the writer sent them;
  * `copy_entries(...)`: copy entries of a fragment from surviving bookies onto a new bookie with
    recovery adds (FLAG_RECOVERY_ADD, so a fenced ledger does not refuse them);
  * `replace_bookie(...)`: swap a bookie of one fragment's ensemble with a versioned metadata
    compare-and-set, re-reading and re-checking on every version conflict;
  * `fragments(md)`: the fragments of a ledger with their entry ranges.

Nothing here changes how ledgers are written or read by `BookKeeper` itself.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import crc32c

from clusters.bookie import protocol as P

from . import quorum
from .client import BookKeeper, _status_name
from .errors import (BKDigestError, BKError, BKLedgerFencedError, BKMetadataVersionError,
                     BKNoSuchEntryError, BKReadError, BKTimeoutError)
from .metadata import CLOSED, LedgerMetadata

log = logging.getLogger(__name__)

COPY_WINDOW = 64            # entry copies in flight per copy_entries call
MAX_CAS_ATTEMPTS = 50


@dataclass(frozen=True)
class StoredEntry:
    """One entry as a bookie stores it: the piggy-backed LAC, the ledger length through this
    entry, the crc32c of the payload, and the payload."""
    lac: int
    length: int
    crc: int
    payload: bytes


@dataclass(frozen=True)
class Fragment:
    key: int                 # first entry id (the ensembles map key)
    first: int
    last: int | None         # None: the open-ended last fragment of a ledger that is not closed
    ensemble: tuple[str, ...]

    @property
    def closed(self) -> bool:
        return self.last is not None

    def entries_of(self, index: int, ensemble_size: int, write_quorum: int) -> list[int]:
        """Entry ids of this fragment stored by the bookie at `index` of the ensemble."""
        if self.last is None:
            raise ValueError(f"fragment {self.key} is open: its entries are not known")
        return [e for e in range(self.first, self.last + 1)
                if index in quorum.write_set(e, ensemble_size, write_quorum)]


def fragments(md: LedgerMetadata) -> list[Fragment]:
    """Every fragment of a ledger, in entry order.  A closed ledger's fragments end at its last
    entry (a fragment that starts after it is empty: last < first)."""
    out = []
    for key in md.keys():
        first, last = _fragment_range(md, key)
        out.append(Fragment(key, first, last, tuple(md.ensembles[key])))
    return out


def _fragment_range(md: LedgerMetadata, key: int) -> tuple[int, int | None]:
    """(first, last) entry of the fragment starting at `key`; a closed ledger's end at its last entry."""
    first, last = md.fragment_range(key)
    if last is not None and md.state == CLOSED:
        last = min(last, md.last_entry_id)
    return first, last


class BookKeeperAdmin:
    """Per-bookie entry operations and fragment metadata changes through one BookKeeper client."""

    def __init__(self, bk: BookKeeper):
        if bk.pool is None:
            raise RuntimeError("start the BookKeeper client first (await bk.start())")
        self.bk = bk
        self.metadata_conflicts = 0      # BadVersion answers seen by replace_bookie

    # -- one request to one bookie ---------------------------------------------------------
    def _request(self, addr: str, op: int, flags: int, ledger: int, entry: int, parts: list,
                 timeout: float) -> asyncio.Future:
        fut = self.bk.loop.create_future()

        def cb(_ctx: Any, status: int, body: bytes) -> None:
            if not fut.done():
                fut.set_result((status, body))
        self.bk.pool.channel(addr).request(op, flags, ledger, entry, parts, cb, None, timeout)
        return fut

    async def read_entry_from(self, addr: str, ledger_id: int, entry_id: int) -> StoredEntry:
        """Read one entry from the bookie `addr` only (no fencing).  Raises BKNoSuchEntryError
        (the bookie does not have it), BKDigestError (its checksum does not match),
        BKTimeoutError, or BKReadError."""
        status, body = await self._request(addr, P.READ, P.FLAG_NONE, ledger_id, entry_id, [],
                                           self.bk.read_timeout)
        where = f"ledger {ledger_id} entry {entry_id} on {addr}"
        if status == P.OK:
            try:
                lac, length, crc, _, _, payload = P.decode_read_body(body)
            except ValueError as e:
                raise BKReadError(f"{where}: {e}") from None
            if crc32c.crc32c(payload) != crc:
                raise BKDigestError(f"{where}: checksum mismatch")
            return StoredEntry(lac, length, crc, payload)
        if status in (P.NO_SUCH_ENTRY, P.NO_SUCH_LEDGER):
            raise BKNoSuchEntryError(f"{where}: {_status_name(status)}")
        if status == P.TIMEOUT:
            raise BKTimeoutError(f"{where}: read timed out")
        raise BKReadError(f"{where}: {_status_name(status)}")

    async def add_entry_to(self, addr: str, ledger_id: int, entry_id: int, entry: StoredEntry,
                           recovery: bool = True) -> None:
        """Write one entry to the bookie `addr` only, keeping its LAC, length and checksum.
        A recovery add (the default) is accepted by a bookie that fenced the ledger."""
        flags = (P.FLAG_RECOVERY_ADD | P.FLAG_HIGH_PRIORITY) if recovery else P.FLAG_NONE
        parts = [P.ADD_BODY.pack(entry.lac, entry.length, entry.crc), entry.payload]
        status, _ = await self._request(addr, P.ADD, flags, ledger_id, entry_id, parts,
                                        self.bk.add_timeout)
        if status == P.OK:
            return
        where = f"ledger {ledger_id} entry {entry_id} to {addr}"
        if status == P.FENCED:
            raise BKLedgerFencedError(f"{where}: ledger fenced")
        if status == P.TIMEOUT:
            raise BKTimeoutError(f"{where}: add timed out")
        raise BKError(f"{where}: add failed: {_status_name(status)}")

    async def read_from_any(self, sources: list[str], ledger_id: int,
                            entry_id: int) -> tuple[StoredEntry, str]:
        """The entry from the first of `sources` that has an intact copy."""
        errors: list[BKError] = []
        for addr in sources:
            try:
                return await self.read_entry_from(addr, ledger_id, entry_id), addr
            except BKError as e:
                errors.append(e)
        if not errors or all(isinstance(e, BKNoSuchEntryError) for e in errors):
            raise BKNoSuchEntryError(f"ledger {ledger_id} entry {entry_id}: no copy on {sources}")
        raise BKReadError(f"ledger {ledger_id} entry {entry_id}: no readable copy on {sources}: "
                          f"{[str(e) for e in errors]}")

    async def copy_entries(self, md: LedgerMetadata, entries: list[int], sources_of: Any,
                           target: str) -> tuple[int, int]:
        """Copy `entries` of ledger md onto `target` with recovery adds, reading each from the
        bookies `sources_of(entry_id)` in turn.  Returns (entries copied, payload bytes)."""
        sem = asyncio.Semaphore(COPY_WINDOW)
        totals = [0, 0]

        async def one(eid: int) -> None:
            async with sem:
                entry, _ = await self.read_from_any(sources_of(eid), md.ledger_id, eid)
                await self.add_entry_to(target, md.ledger_id, eid, entry, recovery=True)
                totals[0] += 1
                totals[1] += len(entry.payload)
        tasks = [asyncio.ensure_future(one(e)) for e in entries]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            for t in tasks:
                if t.done() and not t.cancelled():
                    t.exception()      # mark retrieved
        return totals[0], totals[1]

    # -- metadata -------------------------------------------------------------------------
    async def replace_bookie(self, ledger: int | LedgerMetadata, key: int, index: int, old: str,
                             new: str, expected: tuple[int, int | None] | None = None
                             ) -> tuple[LedgerMetadata, bool]:
        """CAS: ensembles[key][index] old -> new, starting from the given metadata (the version
        the caller copied from) or a fresh read.  Re-reads on a version conflict and re-checks:
        returns (metadata, False) without writing if that slot no longer holds `old` (someone
        else replaced it); raises BKMetadataVersionError if the fragment is gone or its entry
        range is no longer `expected` (the copy would not cover it), BKNoSuchLedgerError if the
        ledger was deleted."""
        bk = self.bk
        if isinstance(ledger, LedgerMetadata):
            md, ledger_id = ledger, ledger.ledger_id
        else:
            ledger_id = ledger
            md = await bk._read_metadata(ledger_id)
        attempts = 0

        def still_old(m: LedgerMetadata) -> bool:
            nonlocal attempts
            attempts += 1
            if attempts > MAX_CAS_ATTEMPTS:
                raise BKMetadataVersionError(f"ledger {ledger_id}: gave up replacing {old} in fragment "
                                             f"{key} after {MAX_CAS_ATTEMPTS} version conflicts")
            ens = m.ensembles.get(key)
            if ens is None:
                raise BKMetadataVersionError(f"ledger {ledger_id}: fragment {key} is gone")
            if index >= len(ens) or ens[index] != old:
                return False
            if expected is not None:
                got = _fragment_range(m, key)
                if got != tuple(expected):
                    raise BKMetadataVersionError(
                        f"ledger {ledger_id}: fragment {key} now covers {got}, not {expected}")
            if new in ens:
                raise BKError(f"ledger {ledger_id}: {new} is already in fragment {key}'s ensemble")
            return True

        def swapped(m: LedgerMetadata) -> LedgerMetadata:
            nmd = m.copy()
            nmd.ensembles[key][index] = new
            return nmd

        def conflict(m: LedgerMetadata) -> None:
            self.metadata_conflicts += 1
            log.info("ledger %d: metadata changed under the replacement of %s in fragment %d "
                     "(version %d); re-reading", ledger_id, old, key, m.version)
        return await bk._update_metadata(md, still_old, swapped, conflict)

    # -- checks ---------------------------------------------------------------------------
    async def check_copies(self, md: LedgerMetadata, live: set[str] | None = None,
                           window: int = 128) -> dict[str, Any]:
        """Read every entry of a closed ledger from EACH bookie of its write set, one bookie at a
        time (BookKeeper's LedgerChecker, made exhaustive).  Returns {"entries", "copies",
        "problems": [str]}: a problem is a copy that is missing, unreadable, on a bookie not in
        `live`, or different (length, checksum or payload) from the entry's other copies.  The
        piggy-backed LAC is not compared: recovery writes entries back with its own."""
        if md.state != CLOSED:
            raise ValueError(f"ledger {md.ledger_id} is {md.state}: only closed ledgers have a "
                             f"known set of entries")
        problems: list[str] = []
        copies = 0
        sem = asyncio.Semaphore(window)

        async def one(frag: Fragment, eid: int) -> None:
            nonlocal copies
            ws = [frag.ensemble[i] for i in quorum.write_set(eid, md.ensemble_size,
                                                             md.write_quorum)]
            got: dict[str, StoredEntry] = {}
            async with sem:
                for addr in ws:
                    if live is not None and addr not in live:
                        problems.append(f"ledger {md.ledger_id} entry {eid}: copy on {addr}, "
                                        f"which is not live")
                        continue
                    try:
                        got[addr] = await self.read_entry_from(addr, md.ledger_id, eid)
                    except BKError as e:
                        problems.append(str(e))
            # the piggy-backed LAC may differ: recovery writes entries back with its own LAC
            if len({(g.length, g.crc, g.payload) for g in got.values()}) > 1:
                problems.append(f"ledger {md.ledger_id} entry {eid}: copies differ on "
                                f"{sorted(got)}")
            copies += len(got)
        tasks = [one(f, e) for f in fragments(md) if f.last is not None
                 for e in range(f.first, f.last + 1)]
        await asyncio.gather(*tasks)
        return {"entries": len(tasks), "copies": copies, "problems": problems}
