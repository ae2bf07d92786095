"""Non-persistent topics on the shared cluster, through the official client and the admin API.

References: https://pulsar.apache.org/docs/concepts-messaging/#non-persistent-topics and
https://pulsar.apache.org/docs/cookbooks-non-persistent/ (in memory only, at-most-once to the
consumers connected at the time, nothing survives an unload or a broker failure); Pulsar's
NonPersistentTopic (publishMessage, close), NonPersistentSubscription, the
NonPersistentDispatcher* classes, NamespaceService.getListOfNonPersistentTopics (GET_TOPICS_OF_NAMESPACE
lists the active ones the asked broker has loaded) and NonPersistentTopicStats
(GET /admin/v2/non-persistent/{tenant}/{namespace}/{topic}/stats).
"""
from __future__ import annotations

import uuid

import pulsar
import pytest

from tests.conformance.conftest import owner_of, rest_path, wait_for


@pytest.fixture
def np_topic() -> str:
    return f"non-persistent://public/default/np-{uuid.uuid4().hex[:10]}"


def drain(consumer, timeout_ms: int = 500) -> list[bytes]:
    out = []
    get = consumer.read_next if isinstance(consumer, pulsar.Reader) else consumer.receive
    while True:
        try:
            out.append(get(timeout_ms).data())
        except pulsar.Timeout:
            return out


def unload_bundle_of(admin, topic: str, *, move: bool = False) -> str | None:
    """Unload the topic's bundle; `move`: to the other broker (destinationBroker), whose name is
    returned."""
    bundle = admin.ok("GET", f"/lookup/v2/topic/{rest_path(topic)}/bundle")
    query, dest = "", None
    if move:
        names = [n.name for n in admin.cluster.nodes("broker")]
        other = 1 - names.index(owner_of(admin, topic))
        dest = names[other]
        query = "?destinationBroker=" + admin.cluster.admin_urls[other].split("://", 1)[1]
    admin.ok("PUT", f"/admin/v2/namespaces/public/default/{bundle}/unload{query}")
    return dest


def broker_index(admin, topic: str) -> int:
    name = owner_of(admin, topic)
    return [n.name for n in admin.cluster.nodes("broker")].index(name)


def test_exclusive_and_shared_subscriptions_on_the_owner(client, admin, np_topic):
    """NonPersistentDispatcherSingleActiveConsumer / MultipleConsumers on the topic's owner (found by
    the same lookup as a persistent topic): the Exclusive subscription gets every message in order,
    the two Shared consumers split them; receipts carry (0, 0) (NonPersistentTopic.publishMessage)."""
    ex = client.subscribe(np_topic, "ex")
    a = client.subscribe(np_topic, "sh", consumer_type=pulsar.ConsumerType.Shared)
    b = client.subscribe(np_topic, "sh", consumer_type=pulsar.ConsumerType.Shared)
    p = client.create_producer(np_topic, batching_enabled=False)
    sent = [b"%d" % i for i in range(50)]
    ids = [p.send(m) for m in sent]
    assert {(m.ledger_id(), m.entry_id()) for m in ids} == {(0, 0)}
    assert drain(ex) == sent
    got_a, got_b = drain(a), drain(b)
    assert sorted(got_a + got_b) == sorted(sent) and got_a and got_b
    stats = admin.ok("GET", f"/admin/v2/{rest_path(np_topic)}/stats")
    assert stats["msgInCounter"] == 50 and stats["storageSize"] == 0
    assert stats["subscriptions"]["ex"]["msgOutCounter"] == 50
    assert stats["subscriptions"]["sh"]["type"] == "Shared"
    assert len(stats["subscriptions"]["sh"]["consumers"]) == 2 and len(stats["publishers"]) == 1
    listed = admin.ok("GET", "/admin/v2/non-persistent/public/default", broker=broker_index(admin, np_topic))
    assert np_topic in listed
    for x in (ex, a, b, p):
        x.close()


def test_no_replay_for_a_late_subscriber_and_a_disconnected_consumer_misses_messages(client, np_topic):
    """No storage: a subscription created after the sends (Earliest, or a reader from
    MessageId.earliest) gets none of them; a consumer that was closed during the sends gets none on
    its return; all get what is sent afterwards."""
    c = client.subscribe(np_topic, "s")
    p = client.create_producer(np_topic, batching_enabled=False)
    p.send(b"before")
    assert c.receive(5000).data() == b"before"
    c.close()
    for i in range(10):
        p.send(b"gap%d" % i)
    back = client.subscribe(np_topic, "s")
    late = client.subscribe(np_topic, "late", initial_position=pulsar.InitialPosition.Earliest)
    reader = client.create_reader(np_topic, pulsar.MessageId.earliest)
    assert drain(back) == [] and drain(late) == [] and drain(reader) == []
    p.send(b"after")
    assert [drain(x) for x in (back, late, reader)] == [[b"after"]] * 3
    for x in (back, late, reader, p):
        x.close()


@pytest.mark.parametrize("move", [False, True], ids=["unload", "move-to-the-other-broker"])
def test_nothing_is_kept_across_an_unload_of_the_bundle(client, admin, np_topic, move):
    """NonPersistentTopic.close on an unload: the topic and whatever it held are gone; the clients
    look it up again (on the same or, `move`, the other broker) and go on with new messages only; a
    new consumer or reader sees nothing of the old ones, and the stats start from zero."""
    c = client.subscribe(np_topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    p = client.create_producer(np_topic, batching_enabled=False)
    for i in range(20):
        p.send(b"old%d" % i)
    assert len(drain(c)) == 20
    dest = unload_bundle_of(admin, np_topic, move=move)
    fresh = client.subscribe(np_topic, "fresh", initial_position=pulsar.InitialPosition.Earliest)
    reader = client.create_reader(np_topic, pulsar.MessageId.earliest)
    assert drain(fresh) == [] and drain(reader) == []
    p.send(b"new")                      # the producer reconnected to the (new) owner
    assert drain(fresh) == [b"new"] and drain(reader) == [b"new"]
    assert wait_for(lambda: drain(c, 200) == [b"new"] or None, 15, what="the old consumer to get 'new'")
    stats = admin.ok("GET", f"/admin/v2/{rest_path(np_topic)}/stats")
    assert stats["msgInCounter"] == 1, stats["msgInCounter"]
    if move:
        assert owner_of(admin, np_topic) == dest
    for x in (c, fresh, reader, p):
        x.close()


def test_a_consumer_without_permits_drops_and_the_stats_count_it(client, admin, np_topic):
    """NonPersistentDispatcherSingleActiveConsumer.sendMessages: a consumer without permits misses the
    message, counted in the subscription's msgDropCounter (msgDropRate in Pulsar's stats)."""
    c = client.subscribe(np_topic, "slow", receiver_queue_size=1)
    p = client.create_producer(np_topic, batching_enabled=False)
    for i in range(30):
        p.send(b"%d" % i)
    got = drain(c)
    assert 0 < len(got) < 30
    sub = admin.ok("GET", f"/admin/v2/{rest_path(np_topic)}/stats")["subscriptions"]["slow"]
    assert sub["msgDropCounter"] == 30 - len(got) and sub["msgOutCounter"] == len(got)
    c.close()
    p.close()


def test_stats_of_a_topic_not_loaded_is_404(admin):
    t = f"non-persistent://public/default/none-{uuid.uuid4().hex[:8]}"
    status, _ = admin.get(f"/admin/v2/{rest_path(t)}/stats")
    assert status == 404
