"""The broker's answers at the frame level (a raw socket client), and its resilience to garbage."""
from __future__ import annotations

import random
import socket
import struct
import time

import pulsar
import pytest

from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames as f
from tests.broker.memory import BrokerThread

T = pb.BaseCommand


class Raw:
    """A minimal protocol client on a blocking socket."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.dec = f.FrameDecoder()
        self.queue: list[tuple[pb.BaseCommand, bytes | None]] = []

    def close(self) -> None:
        self.sock.close()

    def send(self, cmd: pb.BaseCommand) -> None:
        self.sock.sendall(f.encode_command(cmd))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = 5.0, skip_pings: bool = True) -> tuple[pb.BaseCommand, bytes | None]:
        deadline = time.monotonic() + timeout
        while True:
            while self.queue:
                cmd, payload = self.queue.pop(0)
                if skip_pings and cmd.type == T.PING:
                    continue
                return cmd, payload
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("connection closed by the broker")
            self.queue.extend(self.dec.feed(data))

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        try:
            while True:
                self.recv(timeout)
        except EOFError:
            return True
        except (TimeoutError, socket.timeout):
            return False
        except ConnectionResetError:
            return True

    def connect(self, version: int = 20) -> pb.CommandConnected:
        c = T(type=T.CONNECT)
        c.connect.client_version = "raw-test"
        c.connect.protocol_version = version
        self.send(c)
        cmd, _ = self.recv()
        assert cmd.type == T.CONNECTED
        return cmd.connected

    def producer(self, topic: str, producer_id: int = 0, request_id: int = 0, name: str | None = None):
        c = T(type=T.PRODUCER)
        c.producer.topic = topic
        c.producer.producer_id = producer_id
        c.producer.request_id = request_id
        if name:
            c.producer.producer_name = name
        self.send(c)
        cmd, _ = self.recv()
        return cmd


@pytest.fixture
def raw_broker():
    b = BrokerThread(keepalive_interval=0.5).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def raw(raw_broker):
    r = Raw(raw_broker.service.config.port)
    try:
        yield r
    finally:
        r.close()


TOPIC = "persistent://public/default/wire"


def test_handshake(raw):
    connected = raw.connect(version=25)
    assert connected.server_version and connected.protocol_version == 20
    assert connected.max_message_size == 5 * 1024 * 1024


def test_handshake_keeps_an_older_protocol_version(raw):
    assert raw.connect(version=10).protocol_version == 10


def test_ping_pong_and_the_broker_pings_idle_clients(raw):
    raw.connect()
    ping = T(type=T.PING)
    ping.ping.SetInParent()
    raw.send(ping)
    cmd, _ = raw.recv()
    assert cmd.type == T.PONG and cmd.HasField("pong")
    # idle: the broker pings (keepalive 0.5 s in this fixture) ...
    cmd, _ = raw.recv(timeout=3, skip_pings=False)
    assert cmd.type == T.PING
    pong = T(type=T.PONG)
    pong.pong.SetInParent()
    raw.send(pong)
    # ... and a client that stops answering is disconnected
    assert raw.closed_by_peer(timeout=5)


def test_lookup_and_partition_metadata_are_answered_in_band(raw, raw_broker):
    raw.connect()
    c = T(type=T.PARTITIONED_METADATA)
    c.partitionMetadata.topic = TOPIC
    c.partitionMetadata.request_id = 0
    raw.send(c)
    cmd, _ = raw.recv()
    r = cmd.partitionMetadataResponse
    assert cmd.type == T.PARTITIONED_METADATA_RESPONSE and r.HasField("response")
    assert r.response == pb.CommandPartitionedTopicMetadataResponse.Success and r.partitions == 0
    c = T(type=T.LOOKUP)
    c.lookupTopic.topic = TOPIC
    c.lookupTopic.request_id = 1
    raw.send(c)
    cmd, _ = raw.recv()
    r = cmd.lookupTopicResponse
    assert r.response == pb.CommandLookupTopicResponse.Connect and r.request_id == 1
    assert r.brokerServiceUrl == raw_broker.url and r.authoritative


def test_producer_send_receipts_and_checksum_errors(raw, raw_broker):
    raw.connect()
    cmd = raw.producer(TOPIC, producer_id=0, request_id=0)
    assert cmd.type == T.PRODUCER_SUCCESS and cmd.producer_success.producer_name
    assert cmd.producer_success.last_sequence_id == -1
    name = cmd.producer_success.producer_name
    md = pb.MessageMetadata(producer_name=name, sequence_id=0, publish_time=1)
    raw.send_raw(f.encode_send(0, 0, md, b"a"))
    cmd, _ = raw.recv()
    assert cmd.type == T.SEND_RECEIPT
    assert (cmd.send_receipt.producer_id, cmd.send_receipt.sequence_id) == (0, 0)
    assert cmd.send_receipt.message_id.entryId == 0
    # a batch: the receipt echoes the first sequence id, highest is the last
    batch = f.build_batch_payload([(pb.SingleMessageMetadata(), b"x"), (pb.SingleMessageMetadata(), b"y"),
                                   (pb.SingleMessageMetadata(), b"z")])
    md = pb.MessageMetadata(producer_name=name, sequence_id=1, publish_time=1, num_messages_in_batch=3)
    raw.send_raw(f.encode_send(0, 1, md, batch, num_messages=3))
    cmd, _ = raw.recv()
    assert (cmd.send_receipt.sequence_id, cmd.send_receipt.highest_sequence_id) == (1, 3)
    assert cmd.send_receipt.message_id.entryId == 1
    # corrupted payload: SendError(ChecksumError), and the connection stays usable
    bad = bytearray(f.encode_send(0, 4, pb.MessageMetadata(producer_name=name, sequence_id=4,
                                                           publish_time=1), b"payload"))
    bad[-1] ^= 1
    raw.send_raw(bytes(bad))
    cmd, _ = raw.recv()
    assert cmd.type == T.SEND_ERROR and cmd.send_error.error == pb.ChecksumError
    # SEND for an unknown producer id is ignored; the connection still answers
    raw.send_raw(f.encode_send(77, 0, md, b"ignored"))
    ping = T(type=T.PING)
    ping.ping.SetInParent()
    raw.send(ping)
    cmd, _ = raw.recv()
    assert cmd.type == T.PONG
    ml = raw_broker.service.mls[TOPIC]
    assert ml.adds == 2


def test_close_producer_then_sends_are_ignored(raw):
    raw.connect()
    raw.producer(TOPIC, producer_id=5, request_id=0)
    c = T(type=T.CLOSE_PRODUCER)
    c.close_producer.producer_id = 5
    c.close_producer.request_id = 1
    raw.send(c)
    cmd, _ = raw.recv()
    assert cmd.type == T.SUCCESS and cmd.success.request_id == 1
    md = pb.MessageMetadata(producer_name="x", sequence_id=0, publish_time=1)
    raw.send_raw(f.encode_send(5, 0, md, b""))
    assert not raw.closed_by_peer(timeout=0.3)
    # the id can be registered again
    assert raw.producer(TOPIC, producer_id=5, request_id=2).type == T.PRODUCER_SUCCESS


def test_topic_close_sends_close_producer_and_refuses_new_ones(raw, raw_broker):
    raw.connect()
    raw.producer(TOPIC, producer_id=1, request_id=0)
    raw_broker.service.serving = False
    raw_broker.call(raw_broker.service.unload(TOPIC))
    cmd, _ = raw.recv()
    assert cmd.type == T.CLOSE_PRODUCER and cmd.close_producer.producer_id == 1
    cmd = raw.producer(TOPIC, producer_id=1, request_id=3)
    assert cmd.type == T.ERROR and cmd.error.error == pb.ServiceNotReady
    assert "Please redo the lookup" in cmd.error.message and cmd.error.request_id == 3


def _client_works(url: str, topic: str) -> None:
    c = pulsar.Client(url, operation_timeout_seconds=10,
                      logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        p = c.create_producer(topic)
        cons = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        p.send(b"still here")
        assert cons.receive(5000).data() == b"still here"
    finally:
        c.close()


@pytest.mark.parametrize("garbage", [
    pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
    pytest.param(struct.pack(">I", 0x7FFFFFFF) + b"\0" * 16, id="huge-length"),
    pytest.param(struct.pack(">II", 6, 2) + b"\x08\x63", id="unknown-type"),
    pytest.param(struct.pack(">II", 6, 2) + b"\x08\x32", id="unsupported-txn-command"),
    pytest.param(f.encode_send(0, 0, pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1),
                               b"x"), id="send-before-connect"),
])
def test_garbage_closes_only_that_connection(raw_broker, garbage):
    bystander = Raw(raw_broker.service.config.port)
    bystander.connect()
    bad = Raw(raw_broker.service.config.port)
    try:
        bad.send_raw(garbage)
        assert bad.closed_by_peer(timeout=5)
        _client_works(raw_broker.url, f"{TOPIC}-{random.randrange(1 << 30)}")
        ping = T(type=T.PING)
        ping.ping.SetInParent()
        bystander.send(ping)
        assert bystander.recv()[0].type == T.PONG
    finally:
        bad.close()
        bystander.close()


def test_garbage_after_a_handshake_and_random_streams(raw_broker):
    rng = random.Random(7)
    for i in range(20):
        r = Raw(raw_broker.service.config.port)
        try:
            if i % 2:
                r.connect()
            r.send_raw(rng.randbytes(rng.randrange(8, 300)))
            r.sock.shutdown(socket.SHUT_WR)
            r.closed_by_peer(timeout=2)
        finally:
            r.close()
    _client_works(raw_broker.url, f"{TOPIC}-after-garbage")
    # nothing leaked: only the connections still open are registered
    deadline = time.time() + 5
    while time.time() < deadline and len(raw_broker.service.connections) > 0:
        time.sleep(0.05)
    assert len(raw_broker.service.connections) == 0


def _subscribe(r: Raw, sub: str, consumer_id: int, request_id: int, name: str = "c") -> pb.BaseCommand:
    c = T(type=T.SUBSCRIBE)
    s = c.subscribe
    s.topic, s.subscription, s.subType = TOPIC, sub, pb.CommandSubscribe.Exclusive
    s.consumer_id, s.request_id, s.consumer_name = consumer_id, request_id, name
    r.send(c)
    return r.recv(timeout=10)[0]


def test_a_dead_exclusive_consumer_is_evicted_by_a_liveness_check(raw_broker, monkeypatch):
    from clusters.broker import subscription
    monkeypatch.setattr(subscription, "LIVENESS_CHECK_TIMEOUT", 0.5)
    port = raw_broker.service.config.port
    alive, dead, newcomer = Raw(port), Raw(port), Raw(port)
    try:
        for r in (alive, dead, newcomer):
            r.connect()
        assert _subscribe(alive, "live", 0, 0).type == T.SUCCESS
        # a responsive holder keeps its exclusive subscription
        import threading
        stop = threading.Event()

        def answer_pings():
            while not stop.is_set():
                try:
                    cmd, _ = alive.recv(timeout=0.2, skip_pings=False)
                except (TimeoutError, socket.timeout):
                    continue
                except (EOFError, OSError):
                    return
                if cmd.type == T.PING:
                    pong = T(type=T.PONG)
                    pong.pong.SetInParent()
                    alive.send(pong)

        t = threading.Thread(target=answer_pings, daemon=True)
        t.start()
        cmd = _subscribe(newcomer, "live", 1, 1)
        assert cmd.type == T.ERROR and cmd.error.error == pb.ConsumerBusy
        stop.set()
        t.join(2)
        # a holder that never answers (a half-open connection) is evicted
        assert _subscribe(dead, "dead-sub", 0, 0).type == T.SUCCESS
        assert _subscribe(newcomer, "dead-sub", 2, 2).type == T.SUCCESS
        assert dead.closed_by_peer(timeout=5)
    finally:
        for r in (alive, dead, newcomer):
            r.close()
