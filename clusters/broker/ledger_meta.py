"""What a managed ledger and its cursors share: positions, the errors, the ZooKeeper paths and the
compare-and-set of a znode (clusters/broker/managed_ledger.py, clusters/broker/managed_cursor.py)."""
from __future__ import annotations

from dataclasses import dataclass

from clusters.metadata.store import BadVersion, MetadataStore

ML_ROOT = "/managed-ledgers"


SYSTEM_CURSOR_PREFIX = "pulsar."   # cursors the broker keeps for itself (pulsar.dedup), not subscriptions


def is_system_cursor(name: str) -> bool:
    """A cursor the broker keeps for itself: no message TTL, not a subscription in the stats."""
    return name.startswith(SYSTEM_CURSOR_PREFIX)


@dataclass(frozen=True, order=True)
class Position:
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


class ManagedLedgerError(Exception):
    """Persistence failed; the add may be retried (the client resends)."""


class ManagedLedgerFenced(ManagedLedgerError):
    """Another broker took the topic over (its ledger was fenced or the list changed under us)."""


def ml_name(topic: str) -> str:
    """`persistent://public/default/t` -> `public/default/persistent/t` (Pulsar's ML naming)."""
    if "://" in topic:
        domain, rest = topic.split("://", 1)
    else:
        domain, rest = "persistent", topic
    tenant, namespace, local = rest.split("/", 2)
    return f"{tenant}/{namespace}/{domain}/{local}"


def ml_path(name: str) -> str:
    """A managed ledger's znode (its ledger list; its cursors are the children)."""
    return f"{ML_ROOT}/{name}"


async def _cas(store: MetadataStore, path: str, data: bytes, version: int, *, fenced: str, failed: str,
               lost: tuple[type[Exception], ...] = (BadVersion,)) -> int:
    """Compare-and-set `path` to `data` over `version`; returns the new version. `lost` (BadVersion:
    another broker wrote it) raises ManagedLedgerFenced(`fenced`). Any other failure leaves the
    outcome unknown (connection loss): if our write did land the znode is ours and its version
    moved (keeping the old version would make our next CAS fail with BadVersion and fence us for
    nothing), so read it back: our data -> its version; another version -> Fenced; else
    ManagedLedgerError(`failed`)."""
    try:
        return await store.set(path, data, version)
    except lost:
        raise ManagedLedgerFenced(fenced) from None
    except Exception as e:
        got = None
        try:
            got = await store.get_or_none(path)
        except Exception:  # noqa: BLE001
            pass
        if got is not None and got[0] == data:
            return got[1]
        if got is not None and got[1] != version:
            raise ManagedLedgerFenced(fenced) from e
        raise ManagedLedgerError(f"{failed}: {e}") from e
