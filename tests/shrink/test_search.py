"""The shrink search with a fake runner: delta debugging keeps exactly the faults a failure needs, in
their order; the times, holds, run and load shrink as far as the failure allows; flaky failures count
when one try of `tries` shows them; a resumed search reruns nothing it knows."""
from __future__ import annotations

import pytest

from harness.replay import RecordedFault
from harness.shrink import Candidate, Outcome, Search, signature_of


def f(name, at, hold=4.0, nodes=("broker-1",), plan=None):
    return RecordedFault(at=at, name=name, hold=hold, plan=plan or {"node": nodes[0]}, nodes=list(nodes))


def overlap_bug(c: Candidate) -> bool:
    """Fails when a `pause` starts while a `kill` is in force, both inside the run, with some load."""
    for a in c.faults:
        for b in c.faults:
            if a.name == "kill" and b.name == "pause" and a.at <= b.at < a.at + (a.hold or c.time_limit) \
                    and b.at < c.time_limit and c.rate >= 20:
                return True
    return False


class Fake:
    def __init__(self, fails, flaky_every: int = 1):
        self.fails, self.flaky_every, self.calls, self.runs = fails, flaky_every, [], 0

    def __call__(self, cand: Candidate, tries: int) -> Outcome:
        self.calls.append(cand)
        out = Outcome(False)
        for _ in range(tries):
            self.runs += 1
            out.tries += 1
            if self.fails(cand) and self.runs % self.flaky_every == 0:
                out.fails, out.reproduced = True, 1
                break
        return out


SIX = [f("partition", 3.0), f("kill", 12.0, hold=8.0, nodes=("bookie-2",)), f("zk-isolate", 22.0),
       f("pause", 16.0, nodes=("broker-2",)), f("kill", 33.0, nodes=("broker-1",)), f("pause", 45.0)]


def start(faults=SIX):
    return Candidate(sorted(faults, key=lambda x: x.at), 60.0, 200.0, 6, 2)


def test_the_search_keeps_exactly_the_two_faults_in_their_order_in_a_short_run():
    fake = Fake(overlap_bug)
    s = Search(start(), fake, tries=3)
    best = s.run()
    assert [x.name for x in best.faults] == ["kill", "pause"]
    assert best.faults[0].nodes == ["bookie-2"] and best.faults[1].nodes == ["broker-2"]
    assert best.faults[0].at < best.faults[1].at < best.faults[0].at + best.faults[0].hold
    assert best.faults[0].at == pytest.approx(1.0)               # moved to the start
    assert best.time_limit <= 20 and overlap_bug(best)
    assert best.rate < 200 and best.rate >= 20 and best.concurrency == 1 and best.topics == 1
    assert s.steps[0].step == "replay" and s.steps[0].outcome.fails
    assert any(st.step == "faults" and not st.kept for st in s.steps)       # it tried what does not fail
    assert all(overlap_bug(st.candidate) == st.outcome.fails for st in s.steps)
    assert not s.stopped


def test_without_the_overlap_nothing_is_lost_and_the_search_stops_at_the_replay():
    faults = [f("kill", 3.0, hold=2.0), f("pause", 10.0)]      # the pause starts after the kill ended
    fake = Fake(overlap_bug)
    s = Search(start(faults), fake)
    s.run()
    assert len(s.steps) == 1 and s.stopped.startswith("the replay") and s.best.faults == start(faults).faults


def test_a_knob_alone_shrinks_to_no_fault():
    s = Search(start(), Fake(lambda c: True))
    assert s.run().faults == [] and s.steps[1].change == "no fault at all" and s.steps[1].kept


def test_a_flaky_failure_counts_when_one_of_the_tries_shows_it():
    fake = Fake(overlap_bug, flaky_every=3)         # every third run fails (if the faults allow it)
    best = Search(start(), fake, tries=3).run()
    assert [x.name for x in best.faults] == ["kill", "pause"]
    one = Search(start(), Fake(overlap_bug, flaky_every=3), tries=1)
    one.run()
    assert one.stopped.startswith("the replay")     # one try is not enough to see it


def test_a_symbolic_target_is_kept_when_it_still_fails_else_the_concrete_node():
    owner = {"selector": "owner", "topic": "persistent://public/default/t"}
    faults = [f("kill:owner", 5.0, hold=8.0, nodes=("broker-2",), plan=owner), f("pause", 8.0)]

    def needs_broker_2(c):                # only the concrete node reproduces
        return overlap_bug_named(c) and c.faults[0].pinned

    def overlap_bug_named(c):
        names = [x.name for x in c.faults]
        return names == ["kill:owner", "pause"] and c.faults[0].at <= c.faults[1].at < c.faults[0].at + c.faults[0].hold

    best = Search(start(faults), Fake(needs_broker_2)).run()
    assert best.faults[0].pinned and best.faults[0].entry()["plan"]["pinned"] == ["broker-2"]
    best = Search(start(faults), Fake(overlap_bug_named)).run()
    assert not best.faults[0].pinned and "pinned" not in best.faults[0].entry()["plan"]
    assert "target resolved again" in best.faults[0].label()


def test_a_resumed_search_runs_no_candidate_it_knows():
    first = Fake(overlap_bug)
    s = Search(start(), first)
    s.run()
    cache = {st.candidate.key(): st.outcome for st in s.steps}
    again = Fake(overlap_bug)
    s2 = Search(start(), again, cache=cache)
    assert s2.run().key() == s.best.key() and again.calls == []
    half = dict(list(cache.items())[: len(cache) // 2])       # interrupted halfway
    third = Fake(overlap_bug)
    assert Search(start(), third, cache=half).run().key() == s.best.key()
    assert 0 < len(third.calls) < len(first.calls)


def test_the_deadline_ends_the_search_with_the_best_so_far():
    import time
    s = Search(start(), Fake(overlap_bug), deadline=time.monotonic() + 100, estimate_s=lambda: 1000)
    best = s.run()
    assert s.stopped.startswith("the time limit") and best.key() == start().key() and s.steps == []


def test_the_signature_is_the_invalid_checkers_anomaly_types():
    res = {"checkers": {"log": {"valid": False, "anomalies": {"lost": [{}], "duplicated": []}},
                        "perf": {"valid": True, "anomalies": {}}}}
    assert signature_of(res) == {("log", "lost")}
    assert signature_of({"checkers": {"log": {"valid": True}}}) == frozenset()


def test_only_the_reductions_asked_for_are_tried():
    s = Search(start(), Fake(overlap_bug), reductions=("faults",))
    best = s.run()
    assert [x.name for x in best.faults] == ["kill", "pause"] and best.time_limit == 60.0 and best.rate == 200.0
    assert {st.step for st in s.steps} == {"replay", "faults"}
