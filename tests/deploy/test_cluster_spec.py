"""ClusterSpec validation, naming conventions and grudges: no root needed."""
from __future__ import annotations

import networkx as nx
import pytest

from clusters.deploy.backend import ClusterError, SpecError, grudge_edges, partition_groups
from clusters.deploy.netns import VETH_CODE, NetnsCluster, short_id
from clusters.deploy.spec import MAX_PER_ROLE, ClusterSpec


def test_defaults_are_valid():
    spec = ClusterSpec().validate()
    assert (spec.brokers, spec.bookies, spec.zookeepers) == (2, 3, 1)
    assert str(spec.base_dir) == "/tmp/pulsar-chaos/clusters/default"
    assert [n for n, _, _ in spec.layout()] == ["zk-1", "bookie-1", "bookie-2", "bookie-3",
                                               "broker-1", "broker-2", "client-1"]


@pytest.mark.parametrize("kw, words", [
    (dict(ensemble=3, write_quorum=2, ack_quorum=3), "E >= Qw >= Qa"),
    (dict(ensemble=2, write_quorum=3, ack_quorum=2), "E >= Qw >= Qa"),
    (dict(ack_quorum=0, write_quorum=0, ensemble=0), "E >= Qw >= Qa"),
    (dict(bookies=2), "fewer than ensemble"),
    (dict(zookeepers=2), "odd"),
    (dict(zookeepers=0), "odd"),
    (dict(brokers=-1), ">= 0"),
    (dict(name="Bad Name"), "bad cluster name"),
    (dict(bugs={"nope": True}), "unknown bug knob"),
    (dict(subnet="10.0.0.0/16"), "private /24"),
    (dict(subnet="8.8.8.0/24"), "private /24"),
    (dict(bookies=MAX_PER_ROLE["bookie"] + 1), "too many"),
    (dict(broker_config={"max_entires_per_ledger": 5}), "unknown broker setting"),
    (dict(broker_config={"ensemble": 2}), "unknown broker setting"),      # the spec's own field
    (dict(bookie_config={"port": 1}), "unknown bookie setting"),          # the backend's port
])
def test_invalid_specs_say_why_and_how(kw, words):
    with pytest.raises(SpecError) as ex:
        ClusterSpec(**kw).validate()
    assert words in str(ex.value)
    assert ex.value.fix and str(ex.value).endswith(f"(fix: {ex.value.fix})")


def test_zookeeper_only_spec_allowed():
    ClusterSpec(brokers=0, bookies=0).validate()


def test_interface_names_fit_the_kernel_limit():
    for name in ("default", "a", "abcdef", "a-very-long-cluster-name", "t1234f"):
        cid = short_id(name)
        assert len(cid) <= 6 and cid.isalnum()
        c = NetnsCluster(ClusterSpec(name=name, bookies=MAX_PER_ROLE["bookie"], brokers=MAX_PER_ROLE["broker"],
                                     clients=MAX_PER_ROLE["client"], zookeepers=5))
        assert len(c.bridge) <= 15
        for role in VETH_CODE:
            assert len(c._veth(role, MAX_PER_ROLE[role])) <= 15
    assert short_id("default") != short_id("defaulx")


def test_grudges_from_maps_and_graphs():
    assert grudge_edges({"a": {"b", "c"}, "b": "a"}) == {("a", "b"), ("a", "c"), ("b", "a")}
    g = nx.DiGraph([("a", "b")])
    assert grudge_edges(g) == {("a", "b")}
    assert grudge_edges(nx.Graph([("a", "b")])) == {("a", "b"), ("b", "a")}
    p = partition_groups([["a", "b"], ["c"]])
    assert set(p.edges()) == {("a", "c"), ("b", "c"), ("c", "a"), ("c", "b")}
    with pytest.raises(ClusterError):
        partition_groups([["a"], ["a", "b"]])
