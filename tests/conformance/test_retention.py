"""Retention, message TTL and ledger trimming, through the official client and the admin API.

A cluster of its own (1 broker, 3 bookies, E/Qw/Qa 3/2/2, ledgers of 20 entries) whose broker
checks retention and TTL every second (Pulsar: retentionCheckIntervalInSeconds=120,
messageExpiryCheckIntervalInMinutes=5), so the effects show within a test. Each test sets its own
namespace's policies through the admin API (POST /admin/v2/namespaces/{tenant}/{ns}/retention,
/messageTTL, /persistence).
"""
from __future__ import annotations

import time
import uuid

import pulsar
import pytest
from kazoo.client import KazooClient

from clusters.bookkeeper.metadata import ledger_path
from tests.conformance.conftest import Admin, rest_path, wait_for
from tests.netns import netns_cluster, pulsar_client

PER_LEDGER = 20


@pytest.fixture(scope="module")
def rcluster():
    with netns_cluster("rt", brokers=1, bookies=3, zookeepers=1, ensemble=3, write_quorum=2, ack_quorum=2,
                       broker_config={"max_entries_per_ledger": PER_LEDGER, "retention_check_interval_s": 1.0,
                                      "message_expiry_check_interval_s": 1.0}) as c:
        yield c


@pytest.fixture
def radmin(rcluster) -> Admin:
    return Admin(rcluster)


@pytest.fixture
def rclient(rcluster):
    with pulsar_client(rcluster.service_url) as c:
        yield c


def _namespace(admin: Admin, **policies) -> str:
    ns = f"public/rt-{uuid.uuid4().hex[:8]}"
    admin.ok("PUT", f"/admin/v2/namespaces/{ns}")
    for what, body in policies.items():
        admin.ok("POST", f"/admin/v2/namespaces/{ns}/{what}", body)
    return ns


def _stats(admin: Admin, topic: str) -> dict:
    return admin.ok("GET", f"/admin/v2/{rest_path(topic)}/internalStats")


def _pos(mid) -> str:
    return f"{mid.ledger_id()}:{mid.entry_id()}"


def _produce(client, topic: str, n: int, first: int = 0) -> list:
    p = client.create_producer(topic, batching_enabled=False)
    try:
        return [p.send(f"m-{i}".encode()) for i in range(first, first + n)]
    finally:
        p.close()


def _consume_and_ack(client, topic: str, n: int) -> None:
    c = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    try:
        for _ in range(n):
            c.acknowledge(c.receive(10000))
    finally:
        c.close()


def _read_all(client, topic: str) -> list[int]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    try:
        while True:
            try:
                got.append(int(reader.read_next(3000).data().decode().split("-", 1)[1]))
            except pulsar.Timeout:
                return got
    finally:
        reader.close()


def test_message_ttl_expires_the_backlog(rclient, radmin):
    """With a namespace message TTL, messages older than it are expired from every subscription's
    backlog: the subscription's mark-delete position moves past them and a consumer never gets them;
    messages published afterwards are delivered.
    https://pulsar.apache.org/docs/cookbooks-retention-expiry/#time-to-live-ttl"""
    ns = _namespace(radmin, messageTTL=2)
    topic = f"persistent://{ns}/ttl"
    rclient.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest).close()
    ids = _produce(rclient, topic, 30)                 # a backlog of 30 over 2 ledgers
    wait_for(lambda: _stats(radmin, topic)["cursors"]["sub"]["markDeletePosition"] == _pos(ids[-1]),
             timeout=30, what="the TTL to expire the backlog")
    consumer = rclient.subscribe(topic, "sub")
    with pytest.raises(pulsar.Timeout):
        consumer.receive(2000)
    fresh = _produce(rclient, topic, 1, first=100)
    msg = consumer.receive(10000)
    assert msg.data() == b"m-100" and _pos(msg.message_id()) == _pos(fresh[0])
    consumer.acknowledge(msg)
    consumer.close()


def test_retention_keeps_consumed_messages_readable(rclient, radmin):
    """With retention (time and size), ledgers every subscription has consumed are kept: a Reader
    from the earliest message still reads everything.
    https://pulsar.apache.org/docs/concepts-messaging/#message-retention-and-expiry"""
    ns = _namespace(radmin, retention={"retentionTimeInMinutes": 60, "retentionSizeInMB": 100})
    topic = f"persistent://{ns}/kept"
    rclient.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest).close()
    ids = _produce(rclient, topic, 70)                     # ledgers of 20, 20, 20 and 10
    _consume_and_ack(rclient, topic, 70)
    wait_for(lambda: _stats(radmin, topic)["cursors"]["sub"]["markDeletePosition"] == _pos(ids[-1]),
             timeout=20, what="the acknowledgements")
    time.sleep(3)                                          # three retention checks
    ledgers = [i["ledgerId"] for i in _stats(radmin, topic)["ledgers"]]
    assert {m.ledger_id() for m in ids} <= set(ledgers)
    assert _read_all(rclient, topic) == list(range(70))


def test_without_retention_consumed_ledgers_are_deleted(rcluster, rclient, radmin):
    """Retention 0 (Pulsar's default): once every subscription consumed a ledger it is deleted, from
    the topic's ledger list and from BookKeeper's metadata; the current ledger stays, so a Reader
    from the earliest message reads only what the current ledger holds. New ledgers follow the
    namespace's persistence policy (E/Qw/Qa 2/2/2 here, the cluster's default being 3/2/2).
    https://pulsar.apache.org/docs/concepts-messaging/#message-retention-and-expiry"""
    ns = _namespace(radmin, retention={"retentionTimeInMinutes": 0, "retentionSizeInMB": 0},
                    persistence={"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2,
                                 "bookkeeperAckQuorum": 2, "managedLedgerMaxMarkDeleteRate": 0})
    topic = f"persistent://{ns}/trimmed"
    rclient.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest).close()
    ids = _produce(rclient, topic, 70)
    by_ledger = sorted({m.ledger_id() for m in ids})
    assert len(by_ledger) == 4
    current = by_ledger[-1]
    st = _stats(radmin, topic)
    assert all(i["metadata"]["ensembleSize"] == 2 and i["metadata"]["writeQuorumSize"] == 2
               for i in st["ledgers"]), st["ledgers"]
    _consume_and_ack(rclient, topic, 70)
    wait_for(lambda: [i["ledgerId"] for i in _stats(radmin, topic)["ledgers"]] == [current],
             timeout=30, what="the consumed ledgers to be trimmed")
    zk = KazooClient(hosts=rcluster.zk_connect)
    zk.start(15)
    try:
        # the ledger list is updated first, then each ledger is deleted from BookKeeper
        wait_for(lambda: all(zk.exists(ledger_path(lid)) is None for lid in by_ledger[:-1]),
                 timeout=15, what="the trimmed ledgers' BookKeeper metadata to be deleted")
        assert zk.exists(ledger_path(current)) is not None
    finally:
        zk.stop()
        zk.close()
    expected = [i for i, m in enumerate(ids) if m.ledger_id() == current]
    assert _read_all(rclient, topic) == expected
