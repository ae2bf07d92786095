"""Round-robin distribution schedule, ack sets and the quorum-coverage rule (section 1.3/1.5).

Bookies are referred to by their index in an ensemble of size E.
"""
from __future__ import annotations

from typing import Iterable


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Indexes of the bookies that store `entry_id`: (entry + i) % E for i < Qw."""
    return [(entry_id + i) % ensemble_size for i in range(write_quorum)]


def write_quorums(ensemble_size: int, write_quorum: int) -> list[list[int]]:
    """The E (possibly repeated when Qw == E) write quorums of an ensemble."""
    return [write_set(i, ensemble_size, write_quorum) for i in range(ensemble_size)]


def is_covered(ensemble_size: int, write_quorum: int, ack_quorum: int,
               known: Iterable[int]) -> bool:
    """Quorum coverage: for every write quorum, fewer than Qa of its bookies are unknown
    (no answer, or an answer other than OK / NoSuchEntry / NoSuchLedger).  Equivalently each
    write quorum has at least Qw - Qa + 1 known bookies, so no ack quorum can remain unfenced."""
    known = set(known)
    for i in range(ensemble_size):
        unknown = 0
        for j in range(write_quorum):
            if (i + j) % ensemble_size not in known:
                unknown += 1
        if unknown >= ack_quorum:
            return False
    return True


class CoverageSet:
    """Incremental form of `is_covered`, fed with each bookie's answer."""

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int):
        self.E, self.Qw, self.Qa = ensemble_size, write_quorum, ack_quorum
        self.known: set[int] = set()
        self.answered: set[int] = set()

    def add_known(self, index: int) -> None:
        self.known.add(index)
        self.answered.add(index)

    def add_unknown(self, index: int) -> None:
        self.answered.add(index)

    def covered(self) -> bool:
        return is_covered(self.E, self.Qw, self.Qa, self.known)

    def all_answered(self) -> bool:
        return len(self.answered) >= self.E


def ack_quorum_reached(acked_mask: int, ack_quorum: int) -> bool:
    return bin(acked_mask).count("1") >= ack_quorum


def recovery_read_outcome(write_quorum: int, ack_quorum: int, ok: int, missing: int,
                          answered: int) -> str:
    """Per-entry decision of a recovery read over the entry's write set:
    "positive" on any OK, "negative" once Qw - Qa + 1 bookies said NoSuchEntry/NoSuchLedger,
    "unknown" if every bookie answered without either, else "pending"."""
    if ok > 0:
        return "positive"
    if missing >= write_quorum - ack_quorum + 1:
        return "negative"
    if answered >= write_quorum:
        return "unknown"
    return "pending"
