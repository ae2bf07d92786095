"""Losses proven from disk wipes: which acknowledged entries had every copy on a bookie wiped after their
acknowledgement, by the ledgers' metadata at the end of the run.

A topic's final read stalls at the first entry no bookie can serve (a bookie formatted after a disk wipe
answers ERROR for the ledgers it lost, BP-46's limbo), so what it lost cannot be read. This proves it
instead, from what the run recorded: the topic's `ledgers` op (after the final reads) carries each
ledger's metadata as it stands at the end (its fragments' bookies, E and Qw), from which an entry's write
set follows (BookKeeper's round robin: bookies (entry + i) mod E of its fragment's ensemble, i < Qw); the
nemesis's ok `start-disk-wipe` ops say which bookie was wiped when (their invoke time). When every bookie
of the write set was wiped after the send was acknowledged and the final metadata still names it there
(auto-recovery swaps a bookie out once it copied the fragment elsewhere), no copy of the entry is left.
The log checker (checkers/log.py) feeds this its ops and reports the result as `lost`.
"""
from __future__ import annotations

from typing import Any

from checkers.toolkit import mid_tuple
from core.history import INVOKE, OK, Op

WIPE_F = "start-disk-wipe"               # the nemesis's disk wipe (nemesis/lifecycle.py), value {"node", ...}
LEDGERS_F = "ledgers"                    # a topic's ledger listing after its final read (workloads/pulsar_client)
WHY = "every bookie of the entry's write set (the ledger's metadata at the end) was wiped after the send was " \
      "acknowledged: no copy is left"


def write_set(md: Any, entry: int) -> list[str] | None:
    """The bookies holding `entry` by a ledger's metadata ({"ensemble_size", "write_quorum", "fragments":
    [[first entry, [bookies]]]}): its fragment's ensemble at (entry + i) mod E, i < Qw; None if unknown."""
    try:
        frags = sorted((int(k), list(ens)) for k, ens in md["fragments"])
        e_size, qw = int(md["ensemble_size"]), int(md["write_quorum"])
    except (KeyError, TypeError, ValueError):
        return None
    ens = next((ens for k, ens in reversed(frags) if k <= entry), None)
    if ens is None or len(ens) != e_size or not 0 < qw <= e_size or entry < 0:
        return None
    return [ens[(entry + i) % e_size] for i in range(qw)]


class Wipes:
    """The disk wipes and final ledger listings of a history, fed op by op."""

    def __init__(self) -> None:
        self.invoked: int | None = None
        self.at: dict[str, list[int]] = {}          # bookie node -> times its disk wipe began
        self.ledger_ops: dict[str, Op] = {}          # topic -> its last ok `ledgers` op

    def nemesis(self, op: Op) -> None:
        """A nemesis op: a disk wipe's invoke starts it; its ok names the bookie (a failed one wiped nothing)."""
        if op.f != WIPE_F:
            return
        if op.type == INVOKE:
            self.invoked = op.time_ns
        elif op.type == OK and self.invoked is not None:
            v = op.value if isinstance(op.value, dict) else {}
            if isinstance(v.get("node"), str):
                self.at.setdefault(v["node"], []).append(self.invoked)
            self.invoked = None

    def ledgers(self, op: Op) -> None:
        """A client's completed op: keeps the last ok `ledgers` op of each topic."""
        if op.f == LEDGERS_F and op.type == OK:
            self.ledger_ops[op.key] = op

    def proofs(self, topic: str, acked: list[tuple[Any, Op]]) -> list[tuple[Any, Op, dict[str, Any]]]:
        """(value, ack, proof) of the acknowledged sends `acked` ((value, ok completion) pairs) of `topic`
        whose entry's every copy was wiped after the ack; proof: ledger, entry, write set, wipes, and the
        `ledgers_op` (the op itself: the caller refers to it)."""
        if not self.at:
            return []
        lop = self.ledger_ops.get(topic)
        lv = lop.value if lop is not None and isinstance(lop.value, dict) else {}
        mds = {x.get("ledger_id"): x.get("metadata") for x in lv.get("ledgers") or [] if isinstance(x, dict)}
        out = []
        for v, comp in acked:
            mid = mid_tuple(comp.message_id)
            md = mds.get(mid[0]) if mid is not None else None
            ws = write_set(md, mid[1]) if md else None
            if not ws:
                continue
            wiped_at = {b: next((t for t in self.at.get(b, ()) if t > comp.time_ns), None) for b in ws}
            if any(t is None for t in wiped_at.values()):
                continue
            out.append((v, comp, {"ledger": mid[0], "entry": mid[1], "write_set": ws,
                                  "wiped": [{"node": b, "time_s": round(t / 1e9, 6)} for b, t in wiped_at.items()],
                                  "ledgers_op": lop, "why": WHY}))
        return out
