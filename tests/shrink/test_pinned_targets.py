"""A replay's pinned plans, on the in-memory cluster of tests/nemesis: a plan with `pinned` nodes hits
those nodes whatever its selector would resolve to now; without `pinned` the target is resolved again;
a schedule entry with a plan starts its fault with that plan (no new draws), and the journal names the
whole fault (`kill:owner`) so that the run can be replayed."""
from __future__ import annotations

import random
import threading
import time

from core.history import Journal, read_jsonl
from nemesis.base import NemesisContext
from nemesis.combine import NemesisRunner, Scheduled
from nemesis.targets import resolve
from tests.nemesis.fakes import FakeCluster

T = "persistent://public/default/t0"


def ctx(cluster, owner="broker-1"):
    return NemesisContext(cluster=cluster, rng=random.Random(1), topics=[T], lookup=lambda topic: owner)


def test_a_pinned_plan_resolves_to_its_nodes_and_an_unpinned_one_asks_again():
    c = ctx(FakeCluster())
    assert resolve(c, "owner", plan={"selector": "owner", "topic": T})["nodes"] == ["broker-1"]
    found = resolve(c, "owner", plan={"selector": "owner", "topic": T, "pinned": ["broker-2"]})
    assert found["nodes"] == ["broker-2"] and found["pinned"] is True and found["topic"] == T


def test_a_scheduled_plan_is_used_and_the_whole_fault_name_journaled(tmp_path):
    cluster = FakeCluster()
    journal = Journal(tmp_path / "nemesis.jsonl", 0)
    sched = [Scheduled(at=0.0, name="kill:owner", hold=0.05,
                       plan={"selector": "owner", "topic": T, "pinned": ["broker-2"]}),
             Scheduled(at=0.1, name="kill:owner", hold=0.05)]
    runner = NemesisRunner(cluster, [], 1.0, random.Random(1), journal, [T], schedule=sched)
    runner.ctx.lookup = lambda topic: "broker-1"
    stop = threading.Event()
    t = threading.Thread(target=runner.run, args=(stop,))
    t.start()
    end = time.monotonic() + 10
    while time.monotonic() < end and sum(1 for op in read_jsonl(tmp_path / "nemesis.jsonl")
                                         if op.f == "stop-kill" and op.type == "ok") < 2:
        time.sleep(0.05)
    stop.set()                       # the schedule waits for the end of the run once it is done
    t.join(10)
    journal.close()
    ops = list(read_jsonl(tmp_path / "nemesis.jsonl"))
    starts = [op for op in ops if op.f == "start-kill" and op.type == "ok"]
    invokes = [op for op in ops if op.f == "start-kill" and op.type == "invoke"]
    assert [op.value["node"] for op in starts] == ["broker-2", "broker-1"]     # pinned, then resolved
    assert all(op.value["fault"] == "kill:owner" for op in invokes)
    assert invokes[0].value["pinned"] == ["broker-2"] and "pinned" not in invokes[1].value
