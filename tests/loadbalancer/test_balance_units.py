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


def test_scale_takes_n_brokers_away_at_once_and_brings_them_back():
    import random
    from nemesis.base import NemesisContext
    from tests.nemesis.fakes import FakeCluster
    assert (make("scale:3").mode, make("scale:3").count) == ("stop", 3)
    assert (make("scale:kill:2").mode, make("scale:kill:2").count) == ("kill", 2)
    for bad in ("scale:0", "scale:3:x", "scale:-1"):
        with pytest.raises(FaultNameError):
            make(bad)
    cluster = FakeCluster(brokers=6)
    ctx = NemesisContext(cluster=cluster, rng=random.Random(3), topics=["t"])
    nem = make("scale:3")
    value = nem.start(ctx)
    gone = value["nodes"]
    assert len(gone) == 3 and value["brokers_left"] == 3
    assert sorted(n.name for n in cluster.nodes("broker") if not n.alive) == gone
    back = nem.stop(ctx)
    assert back["joined"] and back["joined_nodes"] == gone and all(n.alive for n in cluster.nodes("broker"))
    with pytest.raises(Exception, match="no running broker"):
        make("scale:6").start(ctx)


def test_unload_lost_answer_arms_a_one_way_cut_on_the_owners_lock_delete(monkeypatch):
    import random
    import struct
    from nemesis import balance as nb
    from nemesis.base import NemesisContext
    from tests.nemesis.fakes import FakeCluster
    cluster = FakeCluster(brokers=3, zookeepers=3)
    calls = []
    monkeypatch.setattr(nb, "topic_bundle", lambda ctx, topic: "public/default/0x40000000_0x80000000")
    monkeypatch.setattr(nb, "admin_call", lambda ctx, method, path: calls.append((method, path)) or (500, None, "b1"))
    ctx = NemesisContext(cluster=cluster, rng=random.Random(1), topics=["persistent://public/default/t"],
                         lookup=lambda topic: "broker-2")
    nem = make("unload:lost-answer")
    value = nem.start(ctx)                      # an error answer is what the fault expects: recorded, not raised
    path = b"/namespace/public/default/0x40000000_0x80000000"
    trigger = struct.pack(">ii", 2, len(path)) + path
    assert cluster.calls[-1] == ("deafen", ("broker-2", ["zk-1", "zk-2", "zk-3"], trigger))
    assert calls == [("PUT", "/admin/v2/namespaces/public/default/0x40000000_0x80000000/unload")]
    assert value["owner"] == "broker-2" and value["status"] == 500 and value["lock"] == path.decode()
    assert nem.stop(ctx) == {"disarmed": "broker-2"}
    assert cluster.calls[-1] == ("undeafen", ("broker-2", ["zk-1", "zk-2", "zk-3"], trigger))
    # a plain unload raises on an error answer, and arms nothing
    plain = make("unload")
    with pytest.raises(Exception, match="HTTP 500"):
        plain.start(ctx)
    assert cluster.calls[-1][0] == "undeafen"
