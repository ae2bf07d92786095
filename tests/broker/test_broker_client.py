"""The broker's own asyncio Pulsar client (clusters/protocol/client.py): malformed and missing answers
from tiny servers on loopback give one clear error each (never a hang); produce and read back on the
in-memory broker, also across a topic unload. Against a real cluster:
tests/conformance/test_broker_client.py."""
from __future__ import annotations

import asyncio
import time
import uuid

import pulsar
import pytest

from clusters.protocol.client import (ClientTimeout, MessageId, ProtocolViolation, PulsarClient,
                                    PulsarClientError, ServerError, UnsupportedMessage)
from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames
from tests.broker.memory import BrokerThread
from tests.netns import pulsar_client

T = pb.BaseCommand


async def fake_server(answer):
    """A loopback server; `answer(frames_seen: list[BaseCommand]) -> bytes | None` is asked after
    each frame read (None: say nothing)."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = frames.FrameDecoder()
        seen: list = []
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for cmd, _ in dec.feed(data):
                    seen.append(cmd)
                    out = answer(seen)
                    if out:
                        writer.write(out)
        finally:
            writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def connected() -> bytes:
    c = T(type=T.CONNECTED)
    c.connected.server_version = "fake"
    c.connected.protocol_version = 20
    return frames.encode_command(c)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_malformed_frame_answering_connect_is_a_protocol_violation():
    async def go():
        server, port = await fake_server(lambda seen: b"\x00\x00\x00\x08\x00\x00\x00\x04garb")
        client = PulsarClient(f"pulsar://127.0.0.1:{port}", operation_timeout=3)
        try:
            with pytest.raises(ProtocolViolation, match="malformed answer from 127.0.0.1"):
                await client.create_producer("persistent://public/default/x")
        finally:
            await client.close()
            server.close()
    run(go())


def test_a_lookup_answer_without_a_broker_url_is_a_protocol_violation():
    def answer(seen):
        cmd = seen[-1]
        if cmd.type == T.CONNECT:
            return connected()
        if cmd.type == T.LOOKUP:
            r = T(type=T.LOOKUP_RESPONSE)
            r.lookupTopicResponse.request_id = cmd.lookupTopic.request_id
            r.lookupTopicResponse.response = pb.CommandLookupTopicResponse.Connect
            return frames.encode_command(r)
        return None

    async def go():
        server, port = await fake_server(answer)
        client = PulsarClient(f"pulsar://127.0.0.1:{port}", operation_timeout=3)
        try:
            with pytest.raises(ProtocolViolation, match="without a brokerServiceUrl"):
                await client.create_reader("persistent://public/default/x")
        finally:
            await client.close()
            server.close()
    run(go())


def test_an_unanswered_handshake_and_a_silent_lookup_time_out_with_a_clear_error():
    async def go():
        server, port = await fake_server(lambda seen: None)
        client = PulsarClient(f"pulsar://127.0.0.1:{port}", operation_timeout=1.5, connect_timeout=0.5)
        t0 = time.monotonic()
        try:
            with pytest.raises(ClientTimeout, match="lookup of persistent://public/default/x"):
                await client.create_producer("persistent://public/default/x")
        finally:
            await client.close()
            server.close()
        assert time.monotonic() - t0 < 5
        silent, port2 = await fake_server(lambda seen: connected() if seen[-1].type == T.CONNECT else None)
        client = PulsarClient(f"pulsar://127.0.0.1:{port2}", operation_timeout=1.0)
        try:
            with pytest.raises(ClientTimeout, match="no answer from 127.0.0.1"):
                await client.lookup("persistent://public/default/x")
        finally:
            await client.close()
            silent.close()
    run(go())


def test_a_refusal_is_a_server_error_naming_the_code():
    def answer(seen):
        cmd = seen[-1]
        if cmd.type == T.CONNECT:
            return connected()
        if cmd.type == T.LOOKUP:
            r = T(type=T.LOOKUP_RESPONSE)
            r.lookupTopicResponse.request_id = cmd.lookupTopic.request_id
            r.lookupTopicResponse.response = pb.CommandLookupTopicResponse.Failed
            r.lookupTopicResponse.error = pb.NotAllowedError
            r.lookupTopicResponse.message = "no"
            return frames.encode_command(r)
        return None

    async def go():
        server, port = await fake_server(answer)
        client = PulsarClient(f"pulsar://127.0.0.1:{port}", operation_timeout=3)
        try:
            with pytest.raises(ServerError, match="NotAllowedError: no"):
                await client.lookup("persistent://public/default/x")
        finally:
            await client.close()
            server.close()
    run(go())


def test_keep_alive_closes_a_silent_connection_and_keeps_one_that_answers_pings():
    """A broker that crashed or is cut off sends no FIN: the keep-alive PINGs a silent connection and
    gives it up after twice the interval; a broker that answers the PINGs keeps it."""
    def answer(pong: bool):
        def reply(seen):
            cmd = seen[-1]
            if cmd.type == T.CONNECT:
                return connected()
            if cmd.type == T.PING and pong:
                p = T(type=T.PONG)
                p.pong.SetInParent()
                return frames.encode_command(p)
            return None
        return reply

    async def go(pong: bool) -> tuple[bool, str, bool]:
        server, port = await fake_server(answer(pong))
        client = PulsarClient(f"pulsar://127.0.0.1:{port}", operation_timeout=3, keepalive_interval=0.2)
        try:
            conn = await client.connection("127.0.0.1", port)
            await asyncio.sleep(1.0)                       # five intervals
            return conn.closed, str(conn.error or ""), conn in client._conns.values()
        finally:
            await client.close()
            server.close()
    closed, why, kept = run(go(pong=False))
    assert closed and "nothing received" in why and not kept
    closed, why, kept = run(go(pong=True))
    assert not closed and kept, why


def test_a_reset_during_the_handshake_is_a_client_error_not_an_oserror():
    """A broker going down resets the connection in the middle of the handshake: the client's own error
    (which its lookup and reconnect loops retry), never a bare OSError that would end those loops."""
    import socket
    import struct

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)                                  # the CONNECT
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()                                  # RST

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = PulsarClient(f"pulsar://127.0.0.1:{port}", operation_timeout=1)
        try:
            with pytest.raises(PulsarClientError) as e:
                await client.create_producer("persistent://public/default/x")
            assert not isinstance(e.value, OSError)
        finally:
            await client.close()
            server.close()
    run(go())


def test_bad_arguments_are_refused():
    with pytest.raises(PulsarClientError, match="invalid service URL"):
        PulsarClient("nonsense")

    async def go():
        client = PulsarClient("pulsar://127.0.0.1:1")
        with pytest.raises(PulsarClientError, match="invalid reader start"):
            await client.create_reader("persistent://public/default/x", start="middle")
    run(go())


def test_a_message_failing_its_checksum_fails_the_reader_after_the_good_ones():
    """MESSAGE frames from a fake broker: one good, one whose payload fails its CRC-32C; read_next
    gives the good one, then raises ProtocolViolation (it does not skip the bad one silently)."""
    port_box: list[int] = []

    def message(payload: bytes, entry: int, corrupt: bool) -> bytes:
        md = pb.MessageMetadata(producer_name="x", sequence_id=entry, publish_time=1)
        body = frames.build_entry(md, payload)
        if corrupt:
            body = body[:-1] + bytes([body[-1] ^ 0xFF])
        cmd = T(type=T.MESSAGE)
        cmd.message.consumer_id = consumer_id[0]
        cmd.message.message_id.ledgerId = 5
        cmd.message.message_id.entryId = entry
        return frames.encode_payload_command(cmd, body)

    consumer_id = [0]

    def answer(seen):
        cmd = seen[-1]
        if cmd.type == T.CONNECT:
            return connected()
        if cmd.type == T.LOOKUP:
            r = T(type=T.LOOKUP_RESPONSE)
            r.lookupTopicResponse.request_id = cmd.lookupTopic.request_id
            r.lookupTopicResponse.response = pb.CommandLookupTopicResponse.Connect
            r.lookupTopicResponse.brokerServiceUrl = f"pulsar://127.0.0.1:{port_box[0]}"
            return frames.encode_command(r)
        if cmd.type == T.SUBSCRIBE:
            consumer_id[0] = cmd.subscribe.consumer_id
            r = T(type=T.SUCCESS)
            r.success.request_id = cmd.subscribe.request_id
            return frames.encode_command(r)
        if cmd.type == T.FLOW:
            return message(b"good", 0, False) + message(b"bad", 1, True)
        if cmd.type == T.CLOSE_CONSUMER:
            r = T(type=T.SUCCESS)
            r.success.request_id = cmd.close_consumer.request_id
            return frames.encode_command(r)
        return None

    async def go():
        server, port = await fake_server(answer)
        port_box.append(port)
        client = PulsarClient(f"pulsar://127.0.0.1:{port}", operation_timeout=3)
        try:
            r = await client.create_reader("persistent://public/default/x")
            assert await r.read_next(3) == (MessageId(5, 0, -1, -1), None, b"good")
            with pytest.raises(ProtocolViolation, match="checksum mismatch"):
                await r.read_next(3)
        finally:
            await client.close()
            server.close()
    run(go())


@pytest.fixture(scope="module")
def broker():
    b = BrokerThread().start()
    try:
        yield b
    finally:
        b.stop()


def test_write_keyed_messages_and_read_them_back_across_an_unload(broker):
    """N keyed messages written by our producer: the official client reads them in order with their
    keys; our reader too, and it goes on after an unload of the topic (CLOSE_CONSUMER) without a gap
    or a repeat; the producer resends what the unload interrupted."""
    topic = f"persistent://public/default/bc-{uuid.uuid4().hex[:8]}"

    async def go():
        client = PulsarClient(broker.url, operation_timeout=10, reconnect_timeout=15)
        try:
            p = await client.create_producer(topic)
            ids = [await p.send(b"m%d" % i, key=f"k{i % 3}") for i in range(30)]
            assert len({(m.ledger_id, m.entry_id) for m in ids}) == 30
            r = await client.create_reader(topic, start="earliest", receiver_queue_size=7)
            got = [await r.read_next(5) for _ in range(15)]
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(broker.service.unload(topic), broker.loop))
            ids += [await p.send(b"m%d" % i, key=f"k{i % 3}") for i in range(30, 40)]
            got += [await r.read_next(10) for _ in range(25)]
            assert r.reconnects == 1 and p.reconnects == 1
            assert [g[2] for g in got] == [b"m%d" % i for i in range(40)]
            assert [g[1] for g in got] == [f"k{i % 3}" for i in range(40)]
            assert [g[0] for g in got] == ids
            with pytest.raises(ClientTimeout):
                await r.read_next(0.5)
            last = await r.last_message_id()             # GET_LAST_MESSAGE_ID: the last one written
            assert (last.ledger_id, last.entry_id) == (ids[-1].ledger_id, ids[-1].entry_id)
            latest = await client.create_reader(topic, start="latest")
            mid = await p.send(b"tail")
            assert await latest.read_next(5) == (mid, None, b"tail")
            last = await latest.last_message_id()
            assert (last.ledger_id, last.entry_id) == (mid.ledger_id, mid.entry_id)
        finally:
            await client.close()
    run(go())
    with pulsar_client(broker.url) as c:
        rd = c.create_reader(topic, pulsar.MessageId.earliest)
        got = [rd.read_next(5000) for _ in range(40)]
        assert [m.data() for m in got] == [b"m%d" % i for i in range(40)]
        assert [m.partition_key() for m in got] == [f"k{i % 3}" for i in range(40)]


def test_a_compressed_message_is_refused_clearly(broker):
    topic = f"persistent://public/default/bz-{uuid.uuid4().hex[:8]}"
    with pulsar_client(broker.url) as c:
        c.create_producer(topic, compression_type=pulsar.CompressionType.LZ4).send(b"z" * 100)

    async def go():
        client = PulsarClient(broker.url, operation_timeout=10)
        try:
            r = await client.create_reader(topic)
            with pytest.raises(UnsupportedMessage, match="compressed with LZ4"):
                await r.read_next(5)
        finally:
            await client.close()
    run(go())


def test_reads_uncompressed_batches_written_by_the_official_client(broker):
    topic = f"persistent://public/default/bb-{uuid.uuid4().hex[:8]}"
    with pulsar_client(broker.url) as c:
        p = c.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
        for i in range(10):
            p.send_async(b"b%d" % i, None, partition_key=f"k{i}")
        p.flush()

    async def go():
        client = PulsarClient(broker.url, operation_timeout=10)
        try:
            r = await client.create_reader(topic)
            got = [await r.read_next(5) for _ in range(10)]
            assert [(g[1], g[2]) for g in got] == [(f"k{i}", b"b%d" % i) for i in range(10)]
            assert any(g[0].batch_index > 0 for g in got)
            assert isinstance(got[0][0], MessageId)
        finally:
            await client.close()
    run(go())
