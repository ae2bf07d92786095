"""The balance workload's plan and the load-moving faults' declarations (no cluster)."""
from __future__ import annotations

import collections
import itertools

import pytest

from core.spec import TestSpec as Spec
from nemesis.base import FaultNameError
from nemesis.registry import make
from workloads import balance


def _sends(spec: Spec, n: int) -> list:
    sender = next(t for t in balance.threads(spec) if t.role == "send")
    return list(itertools.islice(balance.generator(spec, sender, list(range(spec.topics))), n))


def test_sends_follow_a_zipf_law_and_the_plan_is_a_function_of_the_seed():
    spec = Spec(topics=50, concurrency=6, seed=3, rate=300.0, time_limit=60.0)
    ops = _sends(spec, 4000)
    counts = collections.Counter(p.key for p in ops)
    # weight 1/(i+1): topic 0 gets about twice topic 1's share and ten times topic 9's
    assert counts[0] > 1.6 * counts[1] and counts[0] > 6 * counts[9]
    assert len(counts) > 40                                  # the long tail is used
    assert [p.key for p in ops[:200]] == [p.key for p in _sends(spec, 200)]
    uniform = collections.Counter(p.key for p in _sends(Spec(topics=50, concurrency=6, seed=3,
                                                                 options={"skew": 0.0}), 4000))
    assert max(uniform.values()) < 3 * min(uniform.values())


def test_the_hot_spot_phase_sends_most_traffic_to_the_hot_topics():
    spec = Spec(topics=50, concurrency=6, seed=5, rate=60.0, time_limit=60.0,
                    options={"hot_topics": 2, "hot_share": 0.9, "hot_from": 0.5, "hot_until": 1.0, "skew": 0.0})
    t = 0.0
    before, during = collections.Counter(), collections.Counter()
    for p in _sends(spec, 3000):
        t += p.delay
        if t >= 60.0:
            break
        (during if t >= 30.0 else before)[p.key < 2] += 1
    assert during[True] > 0.85 * sum(during.values())
    assert before[True] < 0.2 * sum(before.values())


def test_load_moving_faults_are_declared_with_their_params():
    assert make("scale").mode == "stop" and make("scale:kill").mode == "kill"
    assert make("unload:dest").dest and not make("unload").dest
    assert make("split").algorithm == "range_equally_divide"
    assert make("split:topic_count_equally_divide").algorithm == "topic_count_equally_divide"
    for bad in ("scale:sideways", "unload:nowhere", "split:by_magic"):
        with pytest.raises(FaultNameError):
            make(bad)
