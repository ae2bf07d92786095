"""Pulsar binary-protocol framing: encode commands, decode a byte stream into commands, and read entries.

Hot-path rule: a SEND's bytes from the 0x0e01 magic onward are stored verbatim as the entry
and forwarded verbatim inside MESSAGE frames, so nothing on that path re-serializes metadata.

Frame layouts (all integers big-endian):

    simple:   [totalSize u32][commandSize u32][BaseCommand]
    payload:  [totalSize u32][commandSize u32][BaseCommand]
              ([0x0e02 u16][size u32][BrokerEntryMetadata])     broker -> client only, optional
              [0x0e01 u16][crc32c u32]                          optional (present from protocol v6)
              [metadataSize u32][MessageMetadata][payload]
    totalSize counts everything after itself; the CRC covers everything after the CRC field.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, Sequence

from crc32c import crc32c
from google.protobuf.message import DecodeError

from clusters.protocol import PulsarApi_pb2 as pb

__all__ = [
    "ProtocolError", "ChecksumMismatch", "FrameDecoder", "PayloadInfo",
    "MAGIC_CRC32C", "MAGIC_BROKER_ENTRY_METADATA", "DEFAULT_MAX_MESSAGE_SIZE", "FRAME_PADDING",
    "max_frame_size", "encode_command", "encode_payload_command", "build_entry", "encode_send",
    "parse_payload", "send_entry", "entry_metadata", "entry_metadata_bytes", "entry_num_messages",
    "verify_checksum", "split_batch", "build_batch_payload",
    "message_frame_header", "encode_message", "encode_send_receipt", "to_signed64", "to_unsigned64",
]

MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02
_MAGIC_CRC_BYTES = b"\x0e\x01"
_MAGIC_BEM_BYTES = b"\x0e\x02"

DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
FRAME_PADDING = 10 * 1024          # the Java broker allows maxMessageSize + 10 KiB per frame

_U32 = struct.Struct(">I")
_HDR = struct.Struct(">II")
_u32_from = _U32.unpack_from
_hdr_pack = _HDR.pack

_U64 = 1 << 64


class ProtocolError(Exception):
    """Malformed or unacceptable input on the wire; the connection that sent it should be closed."""


class ChecksumMismatch(ProtocolError):
    """The CRC-32C of a payload command does not match its content (answer SendError ChecksumError)."""


def max_frame_size(max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> int:
    return max_message_size + FRAME_PADDING


def to_signed64(v: int) -> int:
    """MessageIdData ids are uint64 on the wire but int64 in meaning (earliest is (-1, -1))."""
    return v - _U64 if v >= 1 << 63 else v


def to_unsigned64(v: int) -> int:
    return v + _U64 if v < 0 else v


# field number of the sub-message that must accompany each BaseCommand type
_TYPE_FIELD: dict[int, str] = {
    f.number: f.name for f in pb.BaseCommand.DESCRIPTOR.fields if f.number >= 2
}


# ----------------------------------------------------------------------------- encoding

def encode_command(cmd: pb.BaseCommand) -> bytes:
    """A simple frame: [totalSize][commandSize][BaseCommand]."""
    body = cmd.SerializeToString()
    n = len(body)
    return _hdr_pack(n + 4, n) + body


def encode_payload_command(cmd: pb.BaseCommand, entry: bytes) -> bytes:
    """A payload frame whose tail (`entry`: magic+crc+metadata+payload, or metadataSize+...) is given."""
    body = cmd.SerializeToString()
    n = len(body)
    return _hdr_pack(n + 4 + len(entry), n) + body + entry


def build_entry(metadata: pb.MessageMetadata | bytes, payload: bytes, *, checksum: bool = True) -> bytes:
    """[0x0e01][crc32c][metadataSize][metadata][payload], as a client puts after a SEND command."""
    meta = metadata if isinstance(metadata, (bytes, bytearray)) else metadata.SerializeToString()
    body = _U32.pack(len(meta)) + bytes(meta) + bytes(payload)
    if not checksum:
        return body
    return _MAGIC_CRC_BYTES + _U32.pack(crc32c(body)) + body


def encode_send(producer_id: int, sequence_id: int, metadata: pb.MessageMetadata, payload: bytes,
                *, num_messages: int | None = None, checksum: bool = True) -> bytes:
    """A client-side SEND frame (used by tests and tools; the broker never sends one)."""
    cmd = pb.BaseCommand(type=pb.BaseCommand.SEND)
    cmd.send.producer_id = producer_id
    cmd.send.sequence_id = sequence_id
    if num_messages is not None:
        cmd.send.num_messages = num_messages
    return encode_payload_command(cmd, build_entry(metadata, payload, checksum=checksum))


def build_batch_payload(messages: list[tuple[pb.SingleMessageMetadata, bytes]]) -> bytes:
    """N x [u32 size][SingleMessageMetadata][payload]; payload_size is filled in when unset."""
    out = []
    for smm, data in messages:
        if not smm.HasField("payload_size"):
            smm.payload_size = len(data)
        raw = smm.SerializeToString()
        out.append(_U32.pack(len(raw)))
        out.append(raw)
        out.append(bytes(data))
    return b"".join(out)


# Hand-rolled encoders for the two commands the broker emits per message. They produce exactly
# the bytes protobuf would (fields in number order; tests compare against SerializeToString),
# without building message objects on the hot path.

_VARINT_SMALL = [bytes((i,)) for i in range(128)]


def _varint(v: int) -> bytes:
    if 0 <= v < 128:
        return _VARINT_SMALL[v]
    if v < 0:
        v += _U64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _message_id_bytes(ledger_id: int, entry_id: int) -> bytes:
    return b"\x08" + _varint(ledger_id) + b"\x10" + _varint(entry_id)


def message_frame_header(consumer_id: int, ledger_id: int, entry_id: int, redelivery_count: int,
                         entry_len: int, ack_set: Sequence[int] = (), partition: int = -1) -> bytes:
    """Everything of a MESSAGE frame that precedes the stored entry bytes. `ack_set`: the batch's
    still-unacknowledged indexes (CommandMessage.ack_set, int64 words) on a redelivery. `partition`:
    the topic's partition index (MessageIdData.partition, which the client reports as the message
    id's partition); -1, a non-partitioned topic, is left out: the client reads the field's default,
    -1, just as when Pulsar's broker writes it."""
    mid = _message_id_bytes(ledger_id, entry_id)
    if partition >= 0:
        mid += b"\x18" + _varint(partition)
    body = b"\x08" + _varint(consumer_id) + b"\x12" + _VARINT_SMALL[len(mid)] + mid
    if redelivery_count:
        body += b"\x18" + _varint(redelivery_count)
    for w in ack_set:
        body += b"\x20" + _varint(w)
    cmd = b"\x08\x09\x4a" + _varint(len(body)) + body      # type=MESSAGE, field 9
    n = len(cmd)
    return _hdr_pack(n + 4 + entry_len, n) + cmd


def encode_message(consumer_id: int, ledger_id: int, entry_id: int, redelivery_count: int,
                   entry: bytes, ack_set: Sequence[int] = (), partition: int = -1) -> bytes:
    return message_frame_header(consumer_id, ledger_id, entry_id, redelivery_count, len(entry),
                                ack_set, partition) + entry


def encode_send_receipt(producer_id: int, sequence_id: int, ledger_id: int, entry_id: int,
                        highest_sequence_id: int = 0) -> bytes:
    mid = _message_id_bytes(ledger_id, entry_id)
    body = (b"\x08" + _varint(producer_id) + b"\x10" + _varint(sequence_id)
            + b"\x1a" + _VARINT_SMALL[len(mid)] + mid)
    if highest_sequence_id:
        body += b"\x20" + _varint(highest_sequence_id)
    cmd = b"\x08\x07\x3a" + _VARINT_SMALL[len(body)] + body       # type=SEND_RECEIPT, field 7
    n = len(cmd)
    return _hdr_pack(n + 4, n) + cmd


# ----------------------------------------------------------------------------- decoding

def _parse_command(buf, start: int, end: int) -> pb.BaseCommand:
    cmd = pb.BaseCommand()
    try:
        cmd.ParseFromString(buf[start:end])
    except DecodeError as e:
        raise ProtocolError(f"undecodable BaseCommand: {e}") from None
    except Exception as e:  # noqa: BLE001 - any parser failure is bad input, never a crash
        raise ProtocolError(f"undecodable BaseCommand: {type(e).__name__}: {e}") from None
    if not cmd.IsInitialized():
        raise ProtocolError("BaseCommand lacks required fields: "
                            + ", ".join(cmd.FindInitializationErrors()))
    field = _TYPE_FIELD.get(cmd.type)
    if field is not None and not cmd.HasField(field):
        raise ProtocolError(f"{pb.BaseCommand.Type.Name(cmd.type)} without its '{field}' sub-command")
    return cmd


class FrameDecoder:
    """Incremental frame decoder: `feed(bytes)` yields (BaseCommand, payload_section | None).

    The payload section is every byte after the command (broker-entry metadata, magic, CRC,
    metadata, payload), as an immutable `bytes`. Any malformed input raises ProtocolError; after
    that the decoder is unusable (the stream has lost framing). `eof()` raises if a partial frame
    is pending.
    """

    __slots__ = ("max_frame_size", "_buf", "_broken")

    def __init__(self, max_frame_size: int = max_frame_size()) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._broken = False

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> Iterator[tuple[pb.BaseCommand, bytes | None]]:
        """Append `data` and yield every complete frame. Iterate to the end (or close the generator)."""
        if self._broken:
            raise ProtocolError("decoder already failed")
        buf = self._buf
        buf += data
        n = len(buf)
        pos = 0
        limit = self.max_frame_size
        try:
            while n - pos >= 4:
                (total,) = _u32_from(buf, pos)
                if total > limit:
                    raise ProtocolError(f"frame of {total} bytes exceeds the limit of {limit}")
                if total < 4:
                    raise ProtocolError(f"frame size {total} is smaller than a command size field")
                end = pos + 4 + total
                if end > n:
                    break
                (cmd_size,) = _u32_from(buf, pos + 4)
                if cmd_size > total - 4:
                    raise ProtocolError(f"command size {cmd_size} exceeds frame size {total}")
                cmd_end = pos + 8 + cmd_size
                cmd = _parse_command(buf, pos + 8, cmd_end)
                payload = bytes(buf[cmd_end:end]) if end > cmd_end else None
                pos = end
                yield cmd, payload
        except ProtocolError:
            self._broken = True
            raise
        finally:
            if self._broken:
                buf.clear()
            elif pos:
                del buf[:pos]

    def eof(self) -> None:
        """Call at end of stream: a partially received frame is a truncation error."""
        if self._buf:
            n = len(self._buf)
            self._buf = bytearray()
            raise ProtocolError(f"stream ended inside a frame ({n} bytes pending)")


@dataclass(slots=True)
class PayloadInfo:
    broker_entry_metadata: pb.BrokerEntryMetadata | None
    has_checksum: bool
    checksum_ok: bool | None          # None without a checksum
    entry_offset: int                 # where the stored entry (magic or metadataSize) starts
    metadata: pb.MessageMetadata
    payload_offset: int               # start of the message payload in the section


def _skip_broker_entry_metadata(section) -> tuple[pb.BrokerEntryMetadata | None, int]:
    if section[:2] != _MAGIC_BEM_BYTES:
        return None, 0
    if len(section) < 6:
        raise ProtocolError("truncated broker-entry metadata")
    (size,) = _u32_from(section, 2)
    end = 6 + size
    if end > len(section):
        raise ProtocolError("broker-entry metadata size exceeds the frame")
    bem = pb.BrokerEntryMetadata()
    try:
        bem.ParseFromString(bytes(section[6:end]))
    except Exception as e:  # noqa: BLE001
        raise ProtocolError(f"undecodable BrokerEntryMetadata: {e}") from None
    return bem, end


def _metadata_span(entry, start: int = 0) -> tuple[bool, int, int, int]:
    """(has_checksum, checksum, metadata_start, metadata_end) of an entry beginning at `start`."""
    n = len(entry)
    has_crc = entry[start:start + 2] == _MAGIC_CRC_BYTES
    crc = 0
    off = start
    if has_crc:
        if n - start < 10:
            raise ProtocolError("truncated checksum header")
        (crc,) = _u32_from(entry, start + 2)
        off = start + 6
    if n - off < 4:
        raise ProtocolError("payload section too short for a metadata size")
    (msize,) = _u32_from(entry, off)
    mstart = off + 4
    mend = mstart + msize
    if mend > n:
        raise ProtocolError(f"metadata size {msize} exceeds the frame")
    return has_crc, crc, mstart, mend


def _parse_metadata(raw) -> pb.MessageMetadata:
    md = pb.MessageMetadata()
    try:
        md.ParseFromString(raw)
    except Exception as e:  # noqa: BLE001
        raise ProtocolError(f"undecodable MessageMetadata: {e}") from None
    if not md.IsInitialized():
        raise ProtocolError("MessageMetadata lacks required fields: "
                            + ", ".join(md.FindInitializationErrors()))
    return md


def parse_payload(section: bytes, *, check_crc: bool = True) -> PayloadInfo:
    """Parse a payload section (the bytes after a SEND/MESSAGE command) without copying the payload."""
    bem, off = _skip_broker_entry_metadata(section)
    has_crc, crc, mstart, mend = _metadata_span(section, off)
    ok = None
    if has_crc and check_crc:
        ok = crc32c(memoryview(section)[off + 6:]) == crc
    md = _parse_metadata(section[mstart:mend])
    return PayloadInfo(bem, has_crc, ok, off, md, mend)


def send_entry(section: bytes) -> tuple[bytes, pb.MessageMetadata]:
    """Broker side of SEND: validate the payload section and return (entry to store, metadata).

    The entry is the section from the 0x0e01 magic on (or from metadataSize when the client sent
    no checksum), byte for byte. Raises ChecksumMismatch on a bad CRC, ProtocolError otherwise.
    """
    off = 0
    if section[:2] == _MAGIC_BEM_BYTES:       # clients never send it; tolerate and strip
        _, off = _skip_broker_entry_metadata(section)
    has_crc, crc, mstart, mend = _metadata_span(section, off)
    if has_crc and crc32c(memoryview(section)[off + 6:]) != crc:
        raise ChecksumMismatch("payload checksum mismatch")
    md = _parse_metadata(section[mstart:mend])
    return (section[off:] if off else section), md


def entry_metadata_bytes(entry: bytes) -> bytes:
    _, _, mstart, mend = _metadata_span(entry)
    return entry[mstart:mend]


def entry_metadata(entry: bytes) -> pb.MessageMetadata:
    """The MessageMetadata of a stored entry (with or without the checksum prefix)."""
    _, _, mstart, mend = _metadata_span(entry)
    return _parse_metadata(entry[mstart:mend])


def entry_num_messages(md: pb.MessageMetadata) -> int:
    """Permits an entry consumes: num_messages_in_batch when it is a batch, else 1."""
    return md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1


def verify_checksum(entry: bytes) -> bool | None:
    """True/False for an entry with a checksum, None for one without."""
    has_crc, crc, _, _ = _metadata_span(entry)
    if not has_crc:
        return None
    return crc32c(memoryview(entry)[6:]) == crc


def split_batch(payload: bytes, count: int) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    """Split an (uncompressed) batch payload into its `count` (SingleMessageMetadata, data) entries."""
    out = []
    n = len(payload)
    off = 0
    for i in range(count):
        if n - off < 4:
            raise ProtocolError(f"batch truncated before message {i}")
        (size,) = _u32_from(payload, off)
        off += 4
        if size > n - off:
            raise ProtocolError(f"batch message {i}: metadata size {size} exceeds the payload")
        smm = pb.SingleMessageMetadata()
        try:
            smm.ParseFromString(payload[off:off + size])
        except Exception as e:  # noqa: BLE001
            raise ProtocolError(f"batch message {i}: undecodable metadata: {e}") from None
        if not smm.IsInitialized():
            raise ProtocolError(f"batch message {i}: metadata lacks payload_size")
        off += size
        psize = smm.payload_size
        if psize < 0 or psize > n - off:
            raise ProtocolError(f"batch message {i}: payload size {psize} exceeds the payload")
        out.append((smm, payload[off:off + psize]))
        off += psize
    return out
