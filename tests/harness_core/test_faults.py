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
