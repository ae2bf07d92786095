"""Acceptance of the broker.recovery_fencing knob: an old owner cut off from ZooKeeper only.

With fencing (the default) the new owner fences the old owner's ledger, so nothing the old owner
acknowledges afterwards can be lost. With `broker.recovery_fencing=false` the old owner keeps getting
adds acknowledged on a ledger the new owner closed: acknowledged messages nobody can read.
"""
from __future__ import annotations

import time
import uuid

import pulsar
import pytest

from clusters.deploy.netns import ClusterSpec, NetnsCluster
from tests.integration.test_cluster import read_all
from tests.netns import owner_node

pytestmark = pytest.mark.integration


def lost_after_takeover(recovery_fencing: bool) -> tuple[list[int], list[int]]:
    """Returns (acknowledged, lost) for the split-brain scenario."""
    bugs = {} if recovery_fencing else {"broker.recovery_fencing": False}
    spec = ClusterSpec(name=f"fe{uuid.uuid4().hex[:4]}", brokers=2, bookies=3, zookeepers=1, bugs=bugs)
    cluster = NetnsCluster(spec)
    try:
        cluster.up()
        topic = f"persistent://public/default/split-{uuid.uuid4().hex[:6]}"
        log = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        old_client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30, logger=log)
        producer = old_client.create_producer(topic, send_timeout_millis=20000)
        acked = []
        for i in range(50):
            producer.send(str(i).encode())
            acked.append(i)
        old = owner_node(cluster, topic)
        other = next(n for n in cluster.nodes("broker") if n.name != old)
        zk_nodes = [n.name for n in cluster.nodes("zookeeper")]
        # Cut the owner from ZooKeeper only; clients and bookies still reach it.
        grudge = {old: set(zk_nodes)}
        for z in zk_nodes:
            grudge[z] = {old}
        cluster.partition(grudge)
        time.sleep(spec_session_timeout(cluster) + 4)   # the old owner's session expires
        # A client of the other broker takes the topic over (lookup -> acquire -> recover the ledger).
        new_client = pulsar.Client(f"pulsar://{other.host}:6650", operation_timeout_seconds=30, logger=log)
        try:
            reader = new_client.create_reader(topic, pulsar.MessageId.earliest)
            reader.read_next(timeout_millis=20000)
            reader.close()
            assert owner_node(cluster, topic) == other.name, "the other broker did not take the topic over"
            # The old owner still has the producer: keep sending through it.
            deadline = time.monotonic() + 45
            for i in range(50, 100):
                if time.monotonic() > deadline:
                    break
                try:
                    producer.send(str(i).encode())
                    acked.append(i)
                except pulsar.PulsarException:
                    pass
            cluster.heal()
            got = set(read_all(new_client, topic, timeout_ms=5000))
        finally:
            new_client.close()
            old_client.close()
        return acked, [i for i in acked if i not in got]
    finally:
        cluster.down()


def spec_session_timeout(cluster) -> float:
    return 6.0


def test_default_fencing_loses_nothing_acknowledged():
    acked, lost = lost_after_takeover(recovery_fencing=True)
    assert len(acked) >= 50
    assert lost == []


def test_without_recovery_fencing_the_old_owner_loses_acknowledged_messages():
    acked, lost = lost_after_takeover(recovery_fencing=False)
    assert lost, "the old owner's acknowledged writes should be unreadable without fencing"
    assert min(lost) >= 50, "only writes acknowledged after the takeover can be lost"
