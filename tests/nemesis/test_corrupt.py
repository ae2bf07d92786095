"""The disk-corruption faults (nemesis/corrupt.py): `disk-corrupt` (bit flips) and `disk-truncate` of a
bookie's newest entry log, the bookie killed first and started again at once. The cluster is the fake
of tests/nemesis/fakes.py, whose `corrupt` damages a real entry log written by the bookie's storage."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from clusters.bookie import corrupt
from clusters.deploy.backend import ClusterError
from nemesis.base import NemesisContext, NemesisError
from nemesis.corrupt import FLIPS, DiskCorruptNemesis
from nemesis.registry import make
from tests.bookie.test_corrupt_log import _fill, _read_all
from tests.nemesis.fakes import FakeCluster


class CorruptibleFake(FakeCluster):
    """Each bookie's data dir under `base`, with 40 entries checkpointed; corrupt() refuses a running node."""

    def __init__(self, base: Path, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.base = base
        for n in self.nodes("bookie"):
            asyncio.run(_fill(base / n.name, 40))

    def corrupt(self, name: str, mode: str, draws: list[float], flips: int = 16) -> dict[str, Any]:
        if self._nodes[name].alive:
            raise ClusterError(f"{name} is running")
        self.calls.append(("corrupt", name))
        try:
            return {"node": name, **corrupt.corrupt_entry_log(self.base / name, mode, draws, flips)}
        except corrupt.CorruptError as e:          # as clusters/deploy/lifecycle.py wraps it
            raise ClusterError(f"corrupting {name} failed: {e}") from None


def ctx_of(cluster, seed=3):
    return NemesisContext(cluster=cluster, rng=random.Random(seed), topics=[])


@pytest.mark.parametrize("fault,mode", [("disk-corrupt", "bitflip"), ("disk-truncate", "truncate")])
def test_kills_damages_the_newest_log_and_restarts_the_bookie(tmp_path, fault, mode):
    c = CorruptibleFake(tmp_path, bookies=3)
    nem = make(fault)
    assert isinstance(nem, DiskCorruptNemesis) and nem.name == fault and nem.mode == mode
    plan = nem.choose(ctx_of(c))
    assert plan == make(fault).choose(ctx_of(c)) and len(plan["draws"]) == FLIPS     # seeded
    v = nem.start(ctx_of(c), plan)
    name = v["node"]
    assert c.calls == [("kill", name), ("corrupt", name), ("start", name)]
    assert v["came_up"] is True and c.node(name).alive and v["pid"] == c.node(name).pid != v["old_pid"]
    assert v["corrupted"]["mode"] == mode and v["corrupted"]["file"].endswith("0000000001.log")
    assert mode in nem.describe() and name in nem.describe()
    _, bad = asyncio.run(_read_all(tmp_path / name, 40))
    assert bad                                                   # its reads of the damaged records fail
    out = nem.stop(ctx_of(c))
    assert out == {"node": name, "restarted": False, "came_up": True, "error": None, "pid": c.node(name).pid}
    assert nem.applied is None


def test_a_target_that_is_no_bookie_and_a_bookie_with_nothing_checkpointed(tmp_path):
    c = CorruptibleFake(tmp_path, bookies=2)
    with pytest.raises(NemesisError, match="resolved to \\['broker-1'\\], no bookie"):
        make("disk-truncate:broker-1").start(ctx_of(c))
    c2 = CorruptibleFake(tmp_path / "c2", bookies=1)
    c2.base = tmp_path / "nothing-here"                # no entry log with records: refused, restarted
    nem = make("disk-truncate:bookie-1")
    with pytest.raises(NemesisError, match="disk-truncate: corrupting bookie-1 failed: .*nothing checkpointed"):
        nem.start(ctx_of(c2))
    assert c2.calls[-3:] == [("kill", "bookie-1"), ("corrupt", "bookie-1"), ("start", "bookie-1")]
    assert c2.node("bookie-1").alive and nem.applied is None and nem.stop(ctx_of(c2)) == {}


def test_stop_starts_a_bookie_that_went_down_again_and_records_a_start_that_fails(tmp_path):
    """stop() after the damaged bookie died (or was killed by another fault): started again and recorded;
    a start that fails is recorded (error, pid None), not raised; a bookie that runs is left alone."""
    class RefusingFake(CorruptibleFake):
        refuse = False

        def start(self, name: str):
            if self.refuse:
                raise ClusterError(f"{name} exited with code 1 while starting")
            return super().start(name)

    c = RefusingFake(tmp_path, bookies=3)
    nem = make("disk-corrupt:bookie-2")
    nem.start(ctx_of(c))
    c.kill("bookie-2")
    out = nem.stop(ctx_of(c))
    assert list(out.items()) == [("node", "bookie-2"), ("restarted", True), ("came_up", True), ("error", None),
                                 ("pid", c.node("bookie-2").pid)]
    assert c.calls[-2:] == [("kill", "bookie-2"), ("start", "bookie-2")] and nem.applied is None
    nem.start(ctx_of(c))
    c.kill("bookie-2")
    c.refuse = True
    out = nem.stop(ctx_of(c))
    assert list(out.items()) == [("node", "bookie-2"), ("restarted", True), ("came_up", False),
                                 ("error", "bookie-2 exited with code 1 while starting"), ("pid", None)]
    assert not c.node("bookie-2").alive and nem.applied is None and nem.stop(ctx_of(c)) == {}
