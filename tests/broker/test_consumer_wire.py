"""The consumer side at the frame level, where the Python client hides what the broker answers:
cumulative acks on Shared subscriptions, ACTIVE_CONSUMER_CHANGE, ack_set on redelivered batches,
unsubscribe and seek refusals (ServerCnx / Consumer / PersistentSubscription semantics)."""
from __future__ import annotations

import uuid

import pytest

from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames as f
from tests.broker.memory import BrokerThread
from tests.broker.test_wire import Raw

T = pb.BaseCommand


@pytest.fixture
def topic() -> str:
    return f"persistent://public/default/cw-{uuid.uuid4().hex[:8]}"


def _raw(broker) -> Raw:
    r = Raw(broker.service.config.port)
    r.connect()
    return r


def _subscribe(r: Raw, topic: str, sub: str, cid: int, sub_type: int, name: str = "c") -> pb.BaseCommand:
    c = T(type=T.SUBSCRIBE)
    s = c.subscribe
    s.topic, s.subscription, s.subType, s.consumer_id, s.request_id = topic, sub, sub_type, cid, 100 + cid
    s.consumer_name = name
    s.initialPosition = pb.CommandSubscribe.Earliest
    r.send(c)
    return _next(r, lambda x: x.type in (T.SUCCESS, T.ERROR))


def _next(r: Raw, pred, timeout: float = 5.0) -> pb.BaseCommand:
    """The next frame matching `pred` (others are kept for later)."""
    kept = []
    try:
        while True:
            cmd, payload = r.recv(timeout)
            if pred(cmd):
                return cmd
            kept.append((cmd, payload))
    finally:
        r.queue[:0] = kept


def _flow(r: Raw, cid: int, n: int) -> None:
    c = T(type=T.FLOW)
    c.flow.consumer_id, c.flow.messagePermits = cid, n
    r.send(c)


def _produce(r: Raw, topic: str, n: int, batch: int = 0) -> list[tuple[int, int]]:
    cmd = r.producer(topic, producer_id=0, request_id=0)
    name = cmd.producer_success.producer_name
    ids = []
    for i in range(n):
        if batch:
            payload = f.build_batch_payload([(pb.SingleMessageMetadata(), b"m%d" % j) for j in range(batch)])
            md = pb.MessageMetadata(producer_name=name, sequence_id=i, publish_time=1,
                                    num_messages_in_batch=batch)
            r.send_raw(f.encode_send(0, i, md, payload, num_messages=batch))
        else:
            md = pb.MessageMetadata(producer_name=name, sequence_id=i, publish_time=1)
            r.send_raw(f.encode_send(0, i, md, b"m%d" % i))
        rc = _next(r, lambda x: x.type == T.SEND_RECEIPT)
        ids.append((rc.send_receipt.message_id.ledgerId, rc.send_receipt.message_id.entryId))
    return ids


def _ack(r: Raw, cid: int, ids, cumulative: bool = False, request_id: int | None = None, ack_set=None):
    c = T(type=T.ACK)
    c.ack.consumer_id = cid
    c.ack.ack_type = pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual
    for l, e in ids:
        m = c.ack.message_id.add()
        m.ledgerId, m.entryId = l, e
        if ack_set is not None:
            m.ack_set.extend(ack_set)
    if request_id is not None:
        c.ack.request_id = request_id
    r.send(c)


def _mark_delete(r: Raw, cid: int, request_id: int = 900) -> tuple[int, int] | None:
    c = T(type=T.GET_LAST_MESSAGE_ID)
    c.getLastMessageId.consumer_id, c.getLastMessageId.request_id = cid, request_id
    r.send(c)
    got = _next(r, lambda x: x.type in (T.GET_LAST_MESSAGE_ID_RESPONSE, T.ERROR)
                and (x.getLastMessageIdResponse.request_id == request_id or x.error.request_id == request_id))
    if got.type == T.ERROR:
        raise AssertionError(f"error {got.error}")
    g = got.getLastMessageIdResponse
    if not g.HasField("consumer_mark_delete_position"):
        return None
    p = g.consumer_mark_delete_position
    return f.to_signed64(p.ledgerId), f.to_signed64(p.entryId)


def test_cumulative_ack_is_ignored_on_shared_and_honoured_on_exclusive(broker, topic):
    """Consumer.messageAcked: 'Received cumulative ack on shared subscription, ignoring'; the ack
    still gets its (successful) ACK_RESPONSE when it asked for one."""
    r = _raw(broker)
    try:
        ids = _produce(r, topic, 3)
        assert _subscribe(r, topic, "sh", 1, pb.CommandSubscribe.Shared).type == T.SUCCESS
        assert _subscribe(r, topic, "ex", 2, pb.CommandSubscribe.Exclusive).type == T.SUCCESS
        _flow(r, 1, 10)
        _flow(r, 2, 10)
        for _ in range(6):
            _next(r, lambda x: x.type == T.MESSAGE)
        _ack(r, 1, [ids[2]], cumulative=True, request_id=7)
        resp = _next(r, lambda x: x.type == T.ACK_RESPONSE)
        assert resp.ackResponse.request_id == 7 and not resp.ackResponse.HasField("error")
        _ack(r, 2, [ids[1]], cumulative=True)
        assert _mark_delete(r, 1) is None                 # nothing acknowledged on the Shared one
        assert _mark_delete(r, 2, 901) == ids[1]
        # individual acks work on both
        _ack(r, 1, ids[:2])
        assert _mark_delete(r, 1, 902) == ids[1]
    finally:
        r.close()


def test_active_consumer_change_frames(broker, topic):
    """Failover: every consumer learns whether it is the active one (CommandActiveConsumerChange)."""
    r = _raw(broker)
    try:
        name = topic + "-partition-0"                    # index 0 of the consumers sorted by name
        assert _subscribe(r, name, "fo", 1, pb.CommandSubscribe.Failover, "b").type == T.SUCCESS
        ch = _next(r, lambda x: x.type == T.ACTIVE_CONSUMER_CHANGE)
        assert (ch.active_consumer_change.consumer_id, ch.active_consumer_change.is_active) == (1, True)
        assert _subscribe(r, name, "fo", 2, pb.CommandSubscribe.Failover, "a").type == T.SUCCESS
        got = {}
        for _ in range(2):
            ch = _next(r, lambda x: x.type == T.ACTIVE_CONSUMER_CHANGE)
            got[ch.active_consumer_change.consumer_id] = ch.active_consumer_change.is_active
        assert got == {1: False, 2: True}
        # Exclusive subscriptions get none
        assert _subscribe(r, name, "ex", 3, pb.CommandSubscribe.Exclusive, "x").type == T.SUCCESS
        with pytest.raises(TimeoutError):
            _next(r, lambda x: x.type == T.ACTIVE_CONSUMER_CHANGE, timeout=0.5)
    finally:
        r.close()


def test_redelivered_batch_carries_the_ack_set(topic):
    """PIP-54: with acknowledgmentAtBatchIndexLevelEnabled the broker keeps partial batch acks and
    sends them in CommandMessage.ack_set when it redelivers the batch."""
    b = BrokerThread().start()
    try:
        b.service.config.acknowledgment_at_batch_index_level_enabled = True
        r = _raw(b)
        try:
            ids = _produce(r, topic, 1, batch=5)
            assert _subscribe(r, topic, "sh", 1, pb.CommandSubscribe.Shared).type == T.SUCCESS
            _flow(r, 1, 100)
            m = _next(r, lambda x: x.type == T.MESSAGE)
            assert not m.message.ack_set
            _ack(r, 1, ids, ack_set=[0b11010])              # 0, 2 acknowledged
            red = T(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES)
            red.redeliverUnacknowledgedMessages.consumer_id = 1
            mid = red.redeliverUnacknowledgedMessages.message_ids.add()
            mid.ledgerId, mid.entryId = ids[0]
            r.send(red)
            m = _next(r, lambda x: x.type == T.MESSAGE)
            assert list(m.message.ack_set) == [0b11010] and m.message.redelivery_count == 1
        finally:
            r.close()
    finally:
        b.stop()


def test_unsubscribe_and_seek_refusals(broker, topic):
    """doUnsubscribe: 'Unconnected or shared consumer attempting to unsubscribe' (MetadataError);
    unknown consumers: MetadataError 'Consumer not found'."""
    r = _raw(broker)
    try:
        _produce(r, topic, 1)
        assert _subscribe(r, topic, "sh", 1, pb.CommandSubscribe.Shared).type == T.SUCCESS
        assert _subscribe(r, topic, "sh", 2, pb.CommandSubscribe.Shared).type == T.SUCCESS
        u = T(type=T.UNSUBSCRIBE)
        u.unsubscribe.consumer_id, u.unsubscribe.request_id = 1, 50
        r.send(u)
        e = _next(r, lambda x: x.type in (T.ERROR, T.SUCCESS))
        assert e.type == T.ERROR and e.error.error == pb.MetadataError
        assert "Unconnected or shared consumer attempting to unsubscribe" in e.error.message
        u.unsubscribe.consumer_id, u.unsubscribe.request_id = 77, 51
        r.send(u)
        e = _next(r, lambda x: x.type in (T.ERROR, T.SUCCESS))
        assert (e.error.error, e.error.message) == (pb.MetadataError, "Consumer not found")
        sk = T(type=T.SEEK)
        sk.seek.consumer_id, sk.seek.request_id = 1, 52
        r.send(sk)
        e = _next(r, lambda x: x.type in (T.ERROR, T.SUCCESS))
        assert e.error.error == pb.MetadataError and "were not present" in e.error.message
        # the last consumer may unsubscribe
        c = T(type=T.CLOSE_CONSUMER)
        c.close_consumer.consumer_id, c.close_consumer.request_id = 2, 53
        r.send(c)
        assert _next(r, lambda x: x.type in (T.ERROR, T.SUCCESS)).type == T.SUCCESS
        u.unsubscribe.consumer_id, u.unsubscribe.request_id = 1, 54
        r.send(u)
        assert _next(r, lambda x: x.type in (T.ERROR, T.SUCCESS)).type == T.SUCCESS
        assert "sh" not in broker.service.topics[topic].subscriptions
    finally:
        r.close()
