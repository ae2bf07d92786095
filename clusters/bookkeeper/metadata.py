"""Ledger metadata: the JSON znode of one ledger, and its ZooKeeper paths.

Layout (BookKeeper's short hierarchical form, 10-digit zero-padded id):
    /ledgers/<id[0:2]>/<id[2:6]>/L<id[6:10]>     e.g. ledger 42 -> /ledgers/00/0000/L0042
    /ledgers/idgen/ID-<seq>                       persistent-sequential id generator
    /ledgers/available/<host:port>                ephemeral bookie registrations

Znode data (JSON):
    {"format": 1, "ledger_id": 42, "ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2,
     "state": "OPEN" | "IN_RECOVERY" | "CLOSED", "last_entry_id": -1, "length": 0,
     "ctime": <ms since epoch>, "ensembles": {"0": ["h:p", ...], "57": [...]}, "custom": {...}}
"""
from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, replace
from typing import Any

LEDGERS = "/ledgers"
AVAILABLE = "/ledgers/available"
IDGEN = "/ledgers/idgen"
OPEN = "OPEN"
IN_RECOVERY = "IN_RECOVERY"
CLOSED = "CLOSED"
STATES = (OPEN, IN_RECOVERY, CLOSED)
MAX_LEDGER_ID = 9_999_999_999


def ledger_path(ledger_id: int) -> str:
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise ValueError(f"ledger id {ledger_id} out of range")
    s = f"{ledger_id:010d}"
    return f"{LEDGERS}/{s[0:2]}/{s[2:6]}/L{s[6:10]}"


def parse_ledger_path(path: str) -> int | None:
    """The ledger id of a path made by ledger_path (None if it is not one)."""
    parts = path.rstrip("/").split("/")
    if len(parts) < 3 or not parts[-1].startswith("L"):
        return None
    s = parts[-3] + parts[-2] + parts[-1][1:]
    if len(s) != 10 or not s.isdigit():
        return None
    return int(s)


@dataclass
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: str = OPEN
    last_entry_id: int = -1
    length: int = 0
    ctime: int = 0
    ensembles: dict[int, list[str]] = field(default_factory=dict)   # first entry id -> bookies
    custom: dict[str, Any] = field(default_factory=dict)
    version: int = -1        # znode version this value was read at / written as (not serialized)

    # -- fragments ---------------------------------------------------------------
    def keys(self) -> list[int]:
        return sorted(self.ensembles)

    def last_ensemble_key(self) -> int:
        return max(self.ensembles)

    @property
    def current_ensemble(self) -> list[str]:
        return self.ensembles[self.last_ensemble_key()]

    def ensemble_for(self, entry_id: int) -> list[str]:
        """The ensemble of the fragment that contains entry_id."""
        keys = self.keys()
        i = bisect.bisect_right(keys, entry_id) - 1
        return self.ensembles[keys[max(i, 0)]]

    def fragment_range(self, key: int) -> tuple[int, int | None]:
        """(first, last) entry ids of the fragment starting at key; last None if open-ended."""
        keys = self.keys()
        i = keys.index(key)
        if i + 1 < len(keys):
            return key, keys[i + 1] - 1
        return key, (self.last_entry_id if self.state == CLOSED else None)

    def bookies(self) -> set[str]:
        return {b for ens in self.ensembles.values() for b in ens}

    @property
    def is_closed(self) -> bool:
        return self.state == CLOSED

    def copy(self, **changes: Any) -> "LedgerMetadata":
        c = replace(self, ensembles={k: list(v) for k, v in self.ensembles.items()},
                    custom=dict(self.custom))
        for k, v in changes.items():
            setattr(c, k, v)
        return c

    # -- serialization -------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": 1, "ledger_id": self.ledger_id, "ensemble_size": self.ensemble_size,
                "write_quorum": self.write_quorum, "ack_quorum": self.ack_quorum,
                "state": self.state, "last_entry_id": self.last_entry_id, "length": self.length,
                "ctime": self.ctime,
                "ensembles": {str(k): list(v) for k, v in sorted(self.ensembles.items())},
                "custom": self.custom}

    def serialize(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    @classmethod
    def deserialize(cls, data: bytes, version: int = -1) -> "LedgerMetadata":
        d = json.loads(data)
        state = d["state"]
        if state not in STATES:
            raise ValueError(f"bad ledger state {state!r}")
        return cls(ledger_id=int(d["ledger_id"]), ensemble_size=int(d["ensemble_size"]),
                   write_quorum=int(d["write_quorum"]), ack_quorum=int(d["ack_quorum"]),
                   state=state, last_entry_id=int(d.get("last_entry_id", -1)),
                   length=int(d.get("length", 0)), ctime=int(d.get("ctime", 0)),
                   ensembles={int(k): list(v) for k, v in d["ensembles"].items()},
                   custom=dict(d.get("custom") or {}), version=version)
