"""core.faults.FaultTimeline: a period's start and end as the nemesis ops tell them."""
from __future__ import annotations

from core import faults as fg
from core.history import FAIL, INFO, INVOKE, OK


def test_a_period_keeps_when_the_undo_that_ended_it_began():
    tl = fg.FaultTimeline()
    tl.feed(1.0, INVOKE, "start-scale")
    tl.feed(2.0, OK, "start-scale", value={"nodes": ["broker-2"]})
    tl.feed(10.0, INVOKE, "stop-scale")
    tl.feed(11.0, FAIL, "stop-scale")                 # a failed undo: still on, nothing ended
    (p,) = tl.periods
    assert p.in_force and p.stop_began_ns is None
    tl.feed(12.0, INVOKE, "stop-scale")
    tl.feed(14.5, OK, "stop-scale")
    assert (p.start_ns, p.started_ns, p.stop_began_ns, p.stop_ns) == (1.0, 2.0, 12.0, 14.5)
    # a heal ends every open period, from its invocation on; a completion seen without its invoke
    # began when it completed
    tl.feed(20.0, OK, "start-partition")
    tl.feed(21.0, OK, "start-kill")
    tl.feed(30.0, INVOKE, "heal")
    tl.feed(31.0, INFO, "heal")
    tl.feed(40.0, OK, "start-pause")
    tl.feed(45.0, OK, "stop-pause")
    began = {q.name: (q.stop_began_ns, q.stop_ns) for q in tl.periods[1:]}
    assert began == {"partition": (30.0, 31.0), "kill": (30.0, 31.0), "pause": (45.0, 45.0)}


def test_the_tally_counts_faults_that_took_effect_apart_from_those_that_failed_to_start():
    from core.history import Op
    from harness.runner import faults_line

    def nem(t, type_, f, error=""):
        return Op(process=-1, type=type_, f=f, key="", value=None, time_ns=t, error=error)
    ops = [nem(1, INVOKE, "start-kill"), nem(2, FAIL, "start-kill", "target 'lb-leader': no leader"),
           nem(3, INVOKE, "start-split"), nem(4, OK, "start-split"), nem(5, INVOKE, "stop-split"),
           nem(6, OK, "stop-split"), nem(7, INVOKE, "start-kill"), nem(8, FAIL, "start-kill", "later"),
           nem(9, INVOKE, "start-pause"), nem(10, INFO, "start-pause"),     # indeterminate: may have acted
           Op(process=0, type=INVOKE, f="send", key="t", value=1, time_ns=11)]
    tally = fg.FaultTimeline.of_history(ops).tally()
    assert tally == {"took_effect": {"split": 1, "pause": 1}, "failed": {"kill": 2},
                     "first_error": {"kill": "target 'lb-leader': no leader"}}
    line = faults_line(tally)
    assert line.startswith("warning: 2 fault(s) failed to start") and "kill 2x (target 'lb-leader': no leader)" in line
    assert "took effect: pause 1x, split 1x" in line
    # nothing failed: no warning
    assert faults_line(fg.FaultTimeline.of_history(ops[2:6]).tally()) == ""
    assert faults_line(None) == "" and faults_line({}) == ""
