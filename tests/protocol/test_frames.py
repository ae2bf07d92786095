"""Framing, checksums, entry parsing and the hand-rolled encoders of clusters.protocol.frames."""
from __future__ import annotations

import random
import struct

import crc32c
import pytest

from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames as f


def _md(seq: int = 0, **kw) -> pb.MessageMetadata:
    return pb.MessageMetadata(producer_name="p-1", sequence_id=seq, publish_time=1_700_000_000_000, **kw)


def _ping() -> pb.BaseCommand:
    c = pb.BaseCommand(type=pb.BaseCommand.PING)
    c.ping.SetInParent()
    return c


def test_crc32c_is_castagnoli():
    # the standard check value of CRC-32C
    assert crc32c.crc32c(b"123456789") == 0xE3069283


def test_simple_command_layout_and_required_zero_fields():
    c = pb.BaseCommand(type=pb.BaseCommand.SUCCESS)
    c.success.request_id = 0                       # proto2 required fields are emitted even when 0
    raw = f.encode_command(c)
    total, size = struct.unpack(">II", raw[:8])
    assert total == len(raw) - 4 and size == len(raw) - 8
    assert b"\x6a\x02\x08\x00" in raw                # success{request_id=0} present on the wire
    got = list(f.FrameDecoder().feed(raw))
    assert len(got) == 1 and got[0][1] is None
    assert got[0][0].success.request_id == 0 and got[0][0].success.HasField("request_id")


def test_send_round_trip_with_checksum():
    md = _md(7, partition_key="k")
    md.properties.add(key="a", value="b")
    raw = f.encode_send(3, 7, md, b"hello")
    [(cmd, section)] = list(f.FrameDecoder().feed(raw))
    assert cmd.type == pb.BaseCommand.SEND and cmd.send.producer_id == 3 and cmd.send.sequence_id == 7
    assert section[:2] == b"\x0e\x01"
    # the checksum covers everything after the checksum field
    assert struct.unpack(">I", section[2:6])[0] == crc32c.crc32c(section[6:])
    info = f.parse_payload(section)
    assert info.has_checksum and info.checksum_ok and info.broker_entry_metadata is None
    assert info.metadata == md and section[info.payload_offset:] == b"hello"
    entry, md2 = f.send_entry(section)
    assert entry == section and md2 == md
    assert f.verify_checksum(entry) is True
    assert f.entry_metadata(entry) == md
    assert f.entry_num_messages(md) == 1


def test_send_without_checksum_is_stored_as_sent():
    raw = f.encode_send(1, 1, _md(1), b"x", checksum=False)
    [(_, section)] = list(f.FrameDecoder().feed(raw))
    entry, md = f.send_entry(section)
    assert entry == section and entry[:4] == struct.pack(">I", len(_md(1).SerializeToString()))
    assert f.verify_checksum(entry) is None
    assert f.entry_metadata(entry).sequence_id == 1


def test_bad_checksum_is_a_checksum_mismatch():
    raw = bytearray(f.encode_send(1, 1, _md(), b"payload"))
    raw[-1] ^= 0xFF
    [(_, section)] = list(f.FrameDecoder().feed(bytes(raw)))
    with pytest.raises(f.ChecksumMismatch):
        f.send_entry(section)
    assert f.parse_payload(section).checksum_ok is False


def test_broker_entry_metadata_prefix_is_understood():
    entry = f.build_entry(_md(), b"data")
    bem = pb.BrokerEntryMetadata(broker_timestamp=5, index=9).SerializeToString()
    section = b"\x0e\x02" + struct.pack(">I", len(bem)) + bem + entry
    info = f.parse_payload(section)
    assert info.broker_entry_metadata.index == 9 and info.checksum_ok
    assert section[info.payload_offset:] == b"data"
    stored, _ = f.send_entry(section)
    assert stored == entry


def test_message_frame_is_the_entry_verbatim():
    entry = f.build_entry(_md(num_messages_in_batch=3), b"batch-bytes")
    raw = f.encode_message(9, 12, 34, 2, entry)
    [(cmd, section)] = list(f.FrameDecoder().feed(raw))
    assert section == entry
    m = cmd.message
    assert (m.consumer_id, m.message_id.ledgerId, m.message_id.entryId, m.redelivery_count) == (9, 12, 34, 2)


@pytest.mark.parametrize("consumer_id,ledger,entry,redelivery,partition", [
    (0, 0, 0, 0, -1), (1, 2, 3, 1, -1), (2**40, 2**33, 2**20 + 5, 300, -1), (5, -1, -1, 0, -1),
    (0, 0, 0, 0, 0), (1, 2, 3, 1, 2), (2**40, 2**33, 2**20 + 5, 300, 2**31 - 1)])
def test_hand_encoded_message_matches_protobuf(consumer_id, ledger, entry, redelivery, partition):
    c = pb.BaseCommand(type=pb.BaseCommand.MESSAGE)
    c.message.consumer_id = consumer_id
    c.message.message_id.ledgerId = f.to_unsigned64(ledger)
    c.message.message_id.entryId = f.to_unsigned64(entry)
    if partition >= 0:                   # -1 (non-partitioned) is the field's default: left out
        c.message.message_id.partition = partition
    if redelivery:
        c.message.redelivery_count = redelivery
    body = b"\x0e\x01tail"
    raw = f.encode_message(consumer_id, ledger, entry, redelivery, body, partition=partition)
    assert raw == f.encode_payload_command(c, body)
    [(cmd, _)] = list(f.FrameDecoder().feed(raw))
    assert cmd.message.message_id.partition == partition


@pytest.mark.parametrize("pid,seq,ledger,entry,highest", [
    (0, 0, 0, 0, 0), (1, 2, 3, 4, 5), (7, 2**50, 2**31, 127, 2**50 + 999), (0, 0, -1, -1, 0)])
def test_hand_encoded_receipt_matches_protobuf(pid, seq, ledger, entry, highest):
    c = pb.BaseCommand(type=pb.BaseCommand.SEND_RECEIPT)
    r = c.send_receipt
    r.producer_id, r.sequence_id = pid, seq
    r.message_id.ledgerId = f.to_unsigned64(ledger)
    r.message_id.entryId = f.to_unsigned64(entry)
    if highest:
        r.highest_sequence_id = highest
    assert f.encode_send_receipt(pid, seq, ledger, entry, highest) == f.encode_command(c)


def test_signed_ids():
    assert f.to_signed64(2**64 - 1) == -1 and f.to_unsigned64(-1) == 2**64 - 1
    assert f.to_signed64(5) == 5


def test_incremental_decoding_byte_by_byte():
    frames_ = [f.encode_command(_ping()), f.encode_send(1, 2, _md(2), b"abc"), f.encode_command(_ping())]
    stream = b"".join(frames_)
    d = f.FrameDecoder()
    got = []
    for i in range(len(stream)):
        got.extend(d.feed(stream[i:i + 1]))
    assert [c.type for c, _ in got] == [pb.BaseCommand.PING, pb.BaseCommand.SEND, pb.BaseCommand.PING]
    assert d.buffered == 0
    d.eof()


def test_many_frames_in_one_chunk():
    raw = b"".join(f.encode_send(1, i, _md(i), bytes([i % 256]) * 10) for i in range(500))
    got = list(f.FrameDecoder().feed(raw))
    assert [c.send.sequence_id for c, _ in got] == list(range(500))


def test_batch_split():
    msgs = [(pb.SingleMessageMetadata(sequence_id=i, partition_key=f"k{i}"), f"m{i}".encode() * (i + 1))
            for i in range(5)]
    payload = f.build_batch_payload(msgs)
    md = _md(0, num_messages_in_batch=5)
    entry = f.build_entry(md, payload)
    info = f.parse_payload(entry)
    assert f.entry_num_messages(info.metadata) == 5
    parts = f.split_batch(entry[info.payload_offset:], info.metadata.num_messages_in_batch)
    assert [(m.sequence_id, m.partition_key, m.payload_size, d) for m, d in parts] == \
        [(i, f"k{i}", len(d), d) for i, (_, d) in enumerate(msgs)]
    with pytest.raises(f.ProtocolError):
        f.split_batch(payload[:-1], 5)
    with pytest.raises(f.ProtocolError):
        f.split_batch(payload, 6)


# ---------------------------------------------------------------- malformed input

def _decode_all(data: bytes, chunk: int | None = None, max_frame: int = 64 * 1024) -> list:
    d = f.FrameDecoder(max_frame)
    out = []
    if chunk is None:
        out.extend(d.feed(data))
    else:
        for i in range(0, len(data), chunk):
            out.extend(d.feed(data[i:i + chunk]))
    d.eof()
    for cmd, section in out:
        if section is not None:       # payload parsing must fail cleanly too
            try:
                f.parse_payload(section)
            except f.ProtocolError:
                pass
    return out


def _assert_only_protocol_errors(data: bytes, **kw) -> None:
    try:
        _decode_all(data, **kw)
    except f.ProtocolError:
        pass            # any other exception type fails the test


def test_oversized_frame_is_refused_before_buffering():
    d = f.FrameDecoder(1024)
    with pytest.raises(f.ProtocolError, match="exceeds"):
        list(d.feed(struct.pack(">I", 10 * 1024 * 1024)))
    with pytest.raises(f.ProtocolError):
        list(d.feed(b"more"))       # a failed decoder stays failed


def test_default_limit_is_max_message_size_plus_padding():
    assert f.FrameDecoder().max_frame_size == 5 * 1024 * 1024 + 10 * 1024


@pytest.mark.parametrize("raw", [
    struct.pack(">II", 2, 0),                                  # frame smaller than its command size
    struct.pack(">II", 8, 100) + b"\0" * 4,                    # command size larger than the frame
    struct.pack(">II", 4, 0),                                  # empty BaseCommand: no type
    struct.pack(">II", 6, 2) + b"\x08\x63",                    # unknown command type 99
    struct.pack(">II", 6, 2) + b"\x08\x12",                    # PING without its sub-message
    struct.pack(">II", 7, 3) + b"\x08\x02\x12",                # CONNECT, truncated sub-message
    struct.pack(">II", 6, 2) + b"\x08\x0d" + b"",              # SUCCESS without request_id
    struct.pack(">II", 9, 5) + b"\x08\x06\x32\x02\x08",        # SEND missing required fields
])
def test_malformed_frames(raw):
    with pytest.raises(f.ProtocolError):
        _decode_all(raw)


def test_truncated_stream_is_an_error_at_eof():
    raw = f.encode_send(1, 1, _md(), b"abc")
    for cut in range(1, len(raw)):
        with pytest.raises(f.ProtocolError):
            _decode_all(raw[:cut])


def test_truncated_payload_sections():
    entry = f.build_entry(_md(), b"payload")
    for cut in range(0, len(entry) - len(b"payload")):
        with pytest.raises(f.ProtocolError):
            f.send_entry(entry[:cut])


def test_random_garbage_only_raises_protocol_error():
    rng = random.Random(1234)
    valid = [f.encode_command(_ping()), f.encode_send(1, 2, _md(2), b"x" * 20),
             f.encode_message(1, 2, 3, 0, f.build_entry(_md(), b"y"))]
    for i in range(3000):
        kind = i % 4
        if kind == 0:
            data = rng.randbytes(rng.randrange(1, 200))
        elif kind == 1:                       # a plausible header, random body
            body = rng.randbytes(rng.randrange(0, 100))
            data = struct.pack(">II", len(body) + 4, rng.randrange(0, len(body) + 2)) + body
        elif kind == 2:                       # valid frames with bytes flipped
            data = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        else:                                 # valid frames, truncated or extended
            data = rng.choice(valid)
            data = data[:rng.randrange(len(data))] + rng.randbytes(rng.randrange(0, 8))
        _assert_only_protocol_errors(data, chunk=rng.choice([None, 1, 7]))
