"""The under-replication records in ZooKeeper (BookKeeper's ZkLedgerUnderreplicationManager layout).

    /ledgers/underreplication/ledgers/<4 hex>/<4 hex>/<4 hex>/<4 hex>/urL<10-digit id>
        persistent: the ledger has a fragment on a lost bookie.  JSON
        {"replicas": ["host:port", ...]   the lost bookies (BookKeeper's `replica` fields),
         "formatted": ["host:port", ...]  of those, bookies formatted as new bookies under the
                                          same id: lost for this ledger although registered,
         "ctime": ms, "auditor": "host:port",
         "failures": n, "last_failure": {"worker", "error", "at"}}   (written by workers)
        The four levels are the ledger id's 64 bits in 16-bit hex groups: ledger 42 ->
        .../0000/0000/0000/002a/urL0000000042.
    /ledgers/underreplication/locks/urL<10-digit id>
        ephemeral: the replication worker (its "host:port") working on that ledger now.
    /ledgers/underreplication/auditorelection/V_<seq>
        ephemeral sequential: auditor candidates; the lowest sequence number is the auditor.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Awaitable, Callable

from clusters.metadata.store import BadVersion, MetadataStore, NodeExists, NoNode, NotEmpty

log = logging.getLogger(__name__)

BASE = "/ledgers/underreplication"
UR_LEDGERS = BASE + "/ledgers"
LOCKS = BASE + "/locks"
ELECTION = BASE + "/auditorelection"
UR_PREFIX = "urL"
MAX_ATTEMPTS = 20


def ur_path(ledger_id: int) -> str:
    if not 0 <= ledger_id < 1 << 64:
        raise ValueError(f"ledger id {ledger_id} out of range")
    h = f"{ledger_id:016x}"
    return f"{UR_LEDGERS}/{h[0:4]}/{h[4:8]}/{h[8:12]}/{h[12:16]}/{UR_PREFIX}{ledger_id:010d}"


def lock_path(ledger_id: int) -> str:
    return f"{LOCKS}/{UR_PREFIX}{ledger_id:010d}"


def parse_ur_name(name: str) -> int | None:
    if not name.startswith(UR_PREFIX) or not name[len(UR_PREFIX):].isdigit():
        return None
    return int(name[len(UR_PREFIX):])


def _now_ms() -> int:
    return int(time.time() * 1000)


class UnderreplicationManager:
    """Mark, list, lock and clear under-replicated ledgers.  `zk(fn, *args)` runs a
    MetadataStore call with the BookKeeper client's connection-trouble retries."""

    def __init__(self, store: MetadataStore, zk: Callable[..., Awaitable[Any]]):
        self.store = store
        self.zk = zk

    async def ensure_paths(self) -> None:
        for p in (UR_LEDGERS, LOCKS, ELECTION):
            await self.zk(self.store.ensure_path, p)

    # -- records -------------------------------------------------------------------------
    async def get(self, ledger_id: int) -> tuple[dict, int] | None:
        got = await self.zk(self.store.get_or_none, ur_path(ledger_id))
        if got is None:
            return None
        data, version = got
        try:
            d = json.loads(data or b"{}")
        except ValueError:
            d = {}
        if not isinstance(d, dict):
            d = {}
        d.setdefault("replicas", [])
        return d, version

    async def mark(self, ledger_id: int, missing: set[str], auditor: str = "",
                   formatted: set[str] = frozenset()) -> bool:
        """Record that the ledger has fragments on the `missing` bookies (merged into an existing
        record); `formatted` of them lost their data though they are registered again.  True if
        the record was created or grew."""
        path = ur_path(ledger_id)
        formatted = set(formatted) & set(missing)
        for _ in range(MAX_ATTEMPTS):
            try:
                body = {"replicas": sorted(missing), "ctime": _now_ms(), "auditor": auditor}
                if formatted:
                    body["formatted"] = sorted(formatted)
                await self.zk(self.store.create, path, json.dumps(body).encode(), makepath=True)
                return True
            except (NodeExists, NoNode):
                pass     # NoNode: a parent was being cleaned up concurrently; try again
            got = await self.get(ledger_id)
            if got is None:
                continue
            d, version = got
            have = set(d["replicas"])
            had_formatted = set(d.get("formatted") or [])
            if missing <= have and formatted <= had_formatted:
                return False
            d["replicas"] = sorted(have | missing)
            if formatted | had_formatted:
                d["formatted"] = sorted(formatted | had_formatted)
            try:
                await self.zk(self.store.set, path, json.dumps(d).encode(), version)
                return True
            except (BadVersion, NoNode):
                continue
        raise RuntimeError(f"could not mark ledger {ledger_id} under-replicated: too much contention")

    async def record_failure(self, ledger_id: int, worker: str, error: str) -> None:
        """Best effort: note the last failed attempt in the record (for operators and tests)."""
        path = ur_path(ledger_id)
        for _ in range(3):
            got = await self.get(ledger_id)
            if got is None:
                return
            d, version = got
            d["failures"] = int(d.get("failures") or 0) + 1
            d["last_failure"] = {"worker": worker, "error": error[:500], "at": _now_ms()}
            try:
                await self.zk(self.store.set, path, json.dumps(d).encode(), version)
                return
            except (BadVersion, NoNode):
                continue

    async def list(self) -> list[int]:
        """Every ledger with an under-replication record."""
        out: list[int] = []
        ch = self.store.children
        for a in await self.zk(ch, UR_LEDGERS):
            for b in await self.zk(ch, f"{UR_LEDGERS}/{a}"):
                for c in await self.zk(ch, f"{UR_LEDGERS}/{a}/{b}"):
                    for d in await self.zk(ch, f"{UR_LEDGERS}/{a}/{b}/{c}"):
                        for name in await self.zk(ch, f"{UR_LEDGERS}/{a}/{b}/{c}/{d}"):
                            lid = parse_ur_name(name)
                            if lid is not None:
                                out.append(lid)
        return sorted(out)

    async def mark_replicated(self, ledger_id: int, version: int = -1) -> bool:
        """Delete the record (only at `version` if given; False on a newer version), then the
        empty hash levels above it."""
        path = ur_path(ledger_id)
        try:
            await self.zk(self.store.delete, path, version)
        except BadVersion:
            return False
        except NoNode:
            return True
        parent = path.rsplit("/", 1)[0]
        while parent != UR_LEDGERS and parent.startswith(UR_LEDGERS + "/"):
            try:     # not through self.zk: NotEmpty is an answer, not connection trouble
                await self.store.delete(parent)
            except NotEmpty:
                break
            except Exception:     # NoNode, or ZooKeeper trouble: the empty level stays
                break
            parent = parent.rsplit("/", 1)[0]
        return True

    # -- locks ---------------------------------------------------------------------------
    async def try_lock(self, ledger_id: int, owner: str) -> bool:
        try:
            await self.zk(self.store.create, lock_path(ledger_id), owner.encode(), ephemeral=True,
                          makepath=True)
            return True
        except NodeExists:
            return False

    async def release(self, ledger_id: int) -> None:
        try:
            await self.zk(self.store.delete, lock_path(ledger_id))
        except NoNode:
            pass

    async def lock_owner(self, ledger_id: int) -> str | None:
        got = await self.zk(self.store.get_or_none, lock_path(ledger_id))
        return None if got is None else got[0].decode(errors="replace")
