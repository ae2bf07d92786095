"""Non-persistent topics (clusters/broker/nonpersistent.py) on the in-memory broker, through the
official `pulsar-client`. Each test names the Pulsar class it follows: NonPersistentTopic
(publishMessage: receipt (0, 0), a copy to every subscription's dispatcher), NonPersistentSubscription
(resetCursor, acknowledgements: no-ops), NonPersistentDispatcherSingleActiveConsumer and
NonPersistentDispatcherMultipleConsumers (no permits: the message is dropped and counted), and
BrokerService with enableNonPersistentTopics=false (NotAllowedError). The cluster-level behaviour
(unloads, owners, admin API) is in tests/conformance/test_non_persistent.py."""
from __future__ import annotations

import uuid
from typing import Any

import pulsar
import pytest

from clusters.broker.nonpersistent import NonPersistentTopics, is_non_persistent
from tests.broker.memory import BrokerThread, MemoryBrokerService
from tests.netns import pulsar_client


class _OwnsAll:
    """The in-memory broker owns every bundle."""

    @staticmethod
    def owns(topic: str) -> bool:
        return True

    @staticmethod
    def bundle(topic: str) -> str:
        return "all"


class NpService(MemoryBrokerService):
    """The in-memory broker with the real non-persistent registry in front of get_topic."""

    def __init__(self, *a: Any, enabled: bool = True, **kw: Any):
        super().__init__(*a, **kw)
        self.ownership = _OwnsAll()
        self.config.enable_non_persistent_topics = enabled
        self.non_persistent = NonPersistentTopics(self, enabled)

    async def get_topic(self, topic: str) -> Any:
        if is_non_persistent(topic):
            return self.non_persistent.get(topic)
        return await super().get_topic(topic)

    async def topics_of_namespace(self, namespace: str) -> list[str]:
        return await super().topics_of_namespace(namespace) + self.non_persistent.names(namespace)


class NpBroker(BrokerThread):
    def __init__(self, enabled: bool = True):
        super().__init__()
        self.enabled = enabled

    async def _start(self) -> None:
        from clusters.broker.connection import serve_connections
        self.service = NpService(port=0, enabled=self.enabled)
        self.server = await serve_connections(self.service, "127.0.0.1", 0)
        self.service.config.port = self.server.sockets[0].getsockname()[1]


@pytest.fixture(scope="module")
def np_broker():
    b = NpBroker().start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def client(np_broker):
    with pulsar_client(np_broker.url, operation_timeout_seconds=10) as c:
        yield c


@pytest.fixture
def topic() -> str:
    return f"non-persistent://public/default/np-{uuid.uuid4().hex[:10]}"


def drain(consumer, timeout_ms: int = 300) -> list[bytes]:
    out = []
    get = consumer.read_next if isinstance(consumer, pulsar.Reader) else consumer.receive
    while True:
        try:
            out.append(get(timeout_ms).data())
        except pulsar.Timeout:
            return out


def test_receipt_is_message_id_0_0_and_the_connected_consumer_gets_every_message(client, topic):
    """NonPersistentTopic.publishMessage: the producer's receipt is (0, 0) (nothing stored), the
    consumer connected at the time gets each message, also with id (0, 0)."""
    c = client.subscribe(topic, "s")
    p = client.create_producer(topic, batching_enabled=False)
    ids = [p.send(b"m%d" % i) for i in range(20)]
    assert {(m.ledger_id(), m.entry_id()) for m in ids} == {(0, 0)}
    got = [c.receive(5000) for _ in range(20)]
    assert [m.data() for m in got] == [b"m%d" % i for i in range(20)]
    assert {(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got} == {(0, 0)}
    c.acknowledge(got[-1])            # a no-op on the broker (NonPersistentSubscription.acknowledgeMessage)
    p.close()
    c.close()


def test_a_late_subscriber_gets_no_replay_and_a_closed_consumer_misses_messages(client, topic):
    """No backlog: a subscription made after the sends (even from Earliest, even a reader from
    MessageId.earliest) gets nothing of them; a consumer that left gets nothing on its return."""
    early = client.subscribe(topic, "early")
    p = client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        p.send(b"a%d" % i)
    assert len([early.receive(5000) for _ in range(5)]) == 5
    early.close()
    for i in range(5):
        p.send(b"b%d" % i)                                  # nobody on "early" now
    late = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    back = client.subscribe(topic, "early")
    assert drain(late) == [] and drain(reader) == [] and drain(back) == []
    p.send(b"c")
    assert late.receive(5000).data() == b"c" and reader.read_next(5000).data() == b"c"
    assert back.receive(5000).data() == b"c"
    for x in (late, reader, back, p):
        x.close()


def test_shared_subscription_splits_messages_and_every_subscription_gets_a_copy(client, topic):
    """NonPersistentDispatcherMultipleConsumers: round robin among the Shared consumers with permits;
    each subscription (here also an Exclusive one) gets its own copy."""
    a = client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared, consumer_name="a")
    b = client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared, consumer_name="b")
    ex = client.subscribe(topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
    p = client.create_producer(topic, batching_enabled=False)
    sent = [b"%d" % i for i in range(40)]
    for m in sent:
        p.send(m)
    got_a, got_b = drain(a, 1000), drain(b, 1000)
    assert sorted(got_a + got_b) == sorted(sent) and got_a and got_b
    assert drain(ex, 1000) == sent
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Exclusive)
    for x in (a, b, ex, p):
        x.close()


def test_a_consumer_without_permits_drops_messages_and_they_are_counted(np_broker, client, topic):
    """NonPersistentDispatcherSingleActiveConsumer.sendMessages: no permits, the message is dropped
    (msgDrop); the consumer never gets it later. receiver_queue_size=1 leaves one permit."""
    c = client.subscribe(topic, "slow", receiver_queue_size=1)
    p = client.create_producer(topic, batching_enabled=False)
    for i in range(30):
        p.send(b"%d" % i)
    got = drain(c, 500)
    assert 0 < len(got) < 30, got
    t = np_broker.service.non_persistent.topics[topic]
    dropped = np_broker.run(lambda: t.subscriptions["slow"].msg_drop)
    assert dropped == 30 - len(got) and t.msg_drop == dropped
    c.close()
    p.close()


def test_seek_succeeds_and_changes_nothing_last_message_id_is_refused(client, topic):
    """NonPersistentSubscription.resetCursor: success, nothing replayed; NonPersistentTopic
    getLastMessageId: "not supported on non-persistent topic" (an error, not an id)."""
    c = client.subscribe(topic, "s")
    p = client.create_producer(topic, batching_enabled=False)
    p.send(b"x")
    assert c.receive(5000).data() == b"x"
    c.seek(pulsar.MessageId.earliest)
    assert drain(c, 500) == []
    with pytest.raises(pulsar.PulsarException):
        c.get_last_message_id()
    p.send(b"y")
    assert c.receive(5000).data() == b"y"
    c.close()
    p.close()


def test_read_compacted_is_refused(client, topic):
    """NonPersistentTopic.subscribe: "readCompacted only valid on persistent topics"."""
    with pytest.raises(pulsar.PulsarException):
        client.subscribe(topic, "s", is_read_compacted=True)


def test_batches_are_delivered_whole(client, topic):
    """A batch is one entry; its messages come out in order, ids (0, 0, i)."""
    c = client.subscribe(topic, "s")
    p = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    for i in range(10):
        p.send_async(b"%d" % i, None)
    p.flush()
    got = [c.receive(5000) for _ in range(10)]
    assert [m.data() for m in got] == [b"%d" % i for i in range(10)]
    p.close()
    c.close()


def test_topics_of_namespace_lists_the_active_non_persistent_topics(np_broker, client, topic):
    """GET_TOPICS_OF_NAMESPACE, mode NON_PERSISTENT/ALL (Pulsar's getListOfNonPersistentTopics:
    the loaded, active ones); a regex consumer in mode NonPersistentOnly finds the topic."""
    import re
    p = client.create_producer(topic)
    persistent = f"persistent://public/default/p-{uuid.uuid4().hex[:8]}"
    client.create_producer(persistent).close()
    names = np_broker.call(np_broker.service.topics_of_namespace("public/default"))
    assert topic in names and persistent in names
    c = client.subscribe(re.compile(topic), "re",
                         regex_subscription_mode=pulsar.RegexSubscriptionMode.NonPersistentOnly)
    p.send(b"r")
    assert c.receive(5000).data() == b"r"
    c.close()
    p.close()


def test_disabled_non_persistent_topics_are_refused_with_not_allowed():
    """enableNonPersistentTopics=false (BrokerService.createNonPersistentTopic): producers and
    consumers get NotAllowedError; persistent topics work."""
    b = NpBroker(enabled=False).start()
    try:
        with pulsar_client(b.url, operation_timeout_seconds=5) as c:
            t = f"non-persistent://public/default/off-{uuid.uuid4().hex[:8]}"
            with pytest.raises(pulsar.NotAllowedError):
                c.create_producer(t)
            with pytest.raises(pulsar.NotAllowedError):
                c.subscribe(t, "s")
            c.create_producer(f"persistent://public/default/on-{uuid.uuid4().hex[:8]}").close()
    finally:
        b.stop()
