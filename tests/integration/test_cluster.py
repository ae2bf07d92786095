"""The reference cluster end to end: real ZooKeeper, bookies and brokers in network namespaces,
driven by the official pulsar-client from the host."""
from __future__ import annotations

import threading
import time
import uuid

import pulsar
import pytest

from tests.netns import netns_cluster, owner_node, pulsar_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    # 4 bookies for E=3: an ensemble change needs a live bookie outside the ensemble (as in BookKeeper)
    with netns_cluster("it", brokers=2, bookies=4, zookeepers=1, ensemble=3, write_quorum=2, ack_quorum=2) as c:
        yield c


@pytest.fixture
def client(cluster):
    with pulsar_client(cluster.service_url, operation_timeout_seconds=45) as c:
        yield c


def new_topic() -> str:
    return f"persistent://public/default/t-{uuid.uuid4().hex[:8]}"


def drain(consumer, expect: int, timeout_ms: int = 15000) -> list[int]:
    got = []
    while len(got) < expect:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            break
        got.append(int(msg.data()))
        consumer.acknowledge(msg)
    return got


def read_all(client, topic: str, timeout_ms: int = 5000) -> list[int]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    try:
        while True:
            try:
                got.append(int(reader.read_next(timeout_millis=timeout_ms).data()))
            except pulsar.Timeout:
                return got
    finally:
        reader.close()


def test_batched_and_unbatched_all_received_in_order(client):
    topic = new_topic()
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest)
    batched = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5,
                                     max_pending_messages=20000)
    results = []
    for i in range(10_000):
        batched.send_async(str(i).encode(), lambda res, mid: results.append(res))
    batched.flush()
    assert len(results) == 10_000 and all(r == pulsar.Result.Ok for r in results)
    plain = client.create_producer(topic)
    ids = [plain.send(str(i).encode()) for i in range(10_000, 11_000)]
    assert all(ids[k] < ids[k + 1] for k in range(len(ids) - 1)), "message ids must increase"
    expected = list(range(11_000))
    assert drain(consumer, len(expected)) == expected
    assert read_all(client, topic) == expected


class Sender(threading.Thread):
    """Sends 0,1,2,... synchronously until stopped; records what was acknowledged."""

    def __init__(self, client, topic: str):
        super().__init__(daemon=True)
        self.producer = client.create_producer(topic, send_timeout_millis=60000)
        self.acked: list[int] = []
        self.failed: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                self.producer.send(str(i).encode())
                self.acked.append(i)
            except pulsar.PulsarException:
                self.failed.append(i)          # indeterminate: may or may not be stored
            i += 1
            time.sleep(0.002)


def assert_no_loss_in_order(acked: list[int], got: list[int]) -> None:
    seen = set(got)
    lost = [i for i in acked if i not in seen]
    assert not lost, f"{len(lost)} acknowledged messages lost, first {lost[:10]}"
    firsts = []
    dedup = set()
    for v in got:
        if v not in dedup:
            dedup.add(v)
            firsts.append(v)
    acked_set = set(acked)
    order = [v for v in firsts if v in acked_set]
    assert order == sorted(order), "acknowledged messages delivered out of order"


def test_owner_broker_killed_mid_stream(cluster, client):
    topic = new_topic()
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest)
    sender = Sender(client, topic)
    sender.start()
    received: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while len(sender.acked) < 300 and time.monotonic() < deadline:
            received += drain(consumer, 50, timeout_ms=500)
        victim = owner_node(cluster, topic)
        cluster.kill(victim)
        before = len(sender.acked)
        deadline = time.monotonic() + 60
        while len(sender.acked) < before + 300 and time.monotonic() < deadline:
            received += drain(consumer, 50, timeout_ms=500)
        assert len(sender.acked) >= before + 300, "producer did not carry on through the other broker"
        assert owner_node(cluster, topic) != victim
    finally:
        sender.stop.set()
        sender.join(90)
        cluster.start(victim) if "victim" in locals() else None
    received += drain(consumer, len(sender.acked) + len(sender.failed) - len(set(received)), timeout_ms=5000)
    assert_no_loss_in_order(sender.acked, received)
    assert_no_loss_in_order(sender.acked, read_all(client, topic))


def test_bookie_killed_mid_stream_and_restarted(cluster, client):
    topic = new_topic()
    sender = Sender(client, topic)
    sender.start()
    try:
        deadline = time.monotonic() + 20
        while len(sender.acked) < 300 and time.monotonic() < deadline:
            time.sleep(0.1)
        cluster.kill("bookie-2")
        before = len(sender.acked)
        deadline = time.monotonic() + 40
        while len(sender.acked) < before + 500 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(sender.acked) >= before + 500, "writes did not continue after a bookie died"
    finally:
        sender.stop.set()
        sender.join(90)
    assert_no_loss_in_order(sender.acked, read_all(client, topic))
    cluster.start("bookie-2")
    assert_no_loss_in_order(sender.acked, read_all(client, topic))


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x10\x00\x00\x00\x0c" + b"\xff" * 12,          # frame with an unparseable command
    b"\x7f\xff\xff\xff" + b"\x00" * 64,                           # a 2 GiB frame length
    b"\x00\x00\x00\x08\x00\x00\x00\x04\x08\xe7\x07\x00",          # well-formed, unknown command type 999
    bytes(range(256)) * 4,                                        # noise (announces a 66 KB frame)
], ids=["bad-command", "huge-length", "unknown-type", "noise"])
def test_broker_survives_garbage(cluster, client, garbage):
    import socket
    for broker in cluster.nodes("broker"):
        with socket.create_connection((broker.host, 6650), timeout=5) as s:
            s.sendall(garbage)
            s.settimeout(2)
            try:
                while s.recv(4096):     # the broker answers with an error or closes; never hangs us
                    pass
            except (socket.timeout, ConnectionResetError):
                pass
    topic = new_topic()
    producer = client.create_producer(topic)
    for i in range(20):
        producer.send(str(i).encode())
    assert read_all(client, topic, timeout_ms=3000) == list(range(20))
