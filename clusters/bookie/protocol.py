"""Wire protocol between the BookKeeper client and a bookie (shared by both sides).

Every message is a frame: a big-endian u32 length of what follows, then a fixed header,
then an op-specific body.  Requests and responses share the same header layout:

    request : u32 len | u8 op | u8 flags  | u16 version | u64 request_id | u64 ledger | i64 entry | body
    response: u32 len | u8 op | u8 status | u16 version | u64 request_id | u64 ledger | i64 entry | body

Request bodies:
    ADD       i64 lac (piggy-backed) | i64 length (ledger length through this entry) | u32 crc32c(payload) | payload
    READ      (none)  entry >= 0 reads that entry; entry == -1 reads the LAC (like READ_LAC);
                      FLAG_DO_FENCING fences the ledger first (recovery reads / fence+LAC read)
    READ_LAC  (none)
    FENCE     (none)  same as READ of entry -1 with FLAG_DO_FENCING
    DELETE    (none)

Response bodies (only with status OK, except ADD which has no body):
    READ / READ_LAC / FENCE:
              i64 entry_lac | i64 entry_length | u32 crc32c(payload) | i64 max_lac | i64 last_entry | payload
              entry_lac/entry_length/crc describe the entry read (-1/-1/0 and no payload for LAC reads);
              max_lac is the highest piggy-backed LAC the bookie has seen for the ledger and
              last_entry the highest entry id it stores (-1 when none).

Responses may come back in any order; clients match them by request id.  A frame whose
length is below the header size or above MAX_FRAME makes the bookie close the connection;
a well-framed request it cannot understand gets BAD_REQUEST.
"""
from __future__ import annotations

import struct

VERSION = 1
MAX_FRAME = 16 * 1024 * 1024 + 1024   # header + 16 MiB of payload

# op codes
ADD = 1
READ = 2
READ_LAC = 3
FENCE = 4
DELETE = 5
OPS = {ADD: "ADD", READ: "READ", READ_LAC: "READ_LAC", FENCE: "FENCE", DELETE: "DELETE"}

# request flags
FLAG_NONE = 0
FLAG_RECOVERY_ADD = 0x01   # add that bypasses the fence (recovery write-back)
FLAG_DO_FENCING = 0x02     # fence the ledger before answering a read
FLAG_HIGH_PRIORITY = 0x04  # informational (recovery traffic)

# status codes (on the wire)
OK = 0
NO_SUCH_LEDGER = 1
NO_SUCH_ENTRY = 2
FENCED = 3
BAD_REQUEST = 4
ERROR = 5
# client-side only: never sent by a bookie
TIMEOUT = 100
CONNECTION_LOST = 101
STATUS = {OK: "OK", NO_SUCH_LEDGER: "NO_SUCH_LEDGER", NO_SUCH_ENTRY: "NO_SUCH_ENTRY",
          FENCED: "FENCED", BAD_REQUEST: "BAD_REQUEST", ERROR: "ERROR", TIMEOUT: "TIMEOUT",
          CONNECTION_LOST: "CONNECTION_LOST"}

INVALID_ENTRY = -1

LEN = struct.Struct(">I")
# op, flags/status, version, request id, ledger id, entry id
HEADER = struct.Struct(">BBHQQq")
FRAME_HEADER = struct.Struct(">IBBHQQq")      # LEN + HEADER in one pack
ADD_BODY = struct.Struct(">qqI")               # lac, length, crc
READ_BODY = struct.Struct(">qqIqq")            # entry_lac, entry_length, crc, max_lac, last_entry

HEADER_SIZE = HEADER.size
MIN_FRAME = HEADER_SIZE


def encode_request(op: int, flags: int, request_id: int, ledger: int, entry: int,
                   body: bytes = b"") -> bytes:
    return FRAME_HEADER.pack(HEADER_SIZE + len(body), op, flags, VERSION, request_id,
                             ledger, entry) + body


def encode_response(op: int, status: int, request_id: int, ledger: int, entry: int,
                    body: bytes = b"") -> bytes:
    return FRAME_HEADER.pack(HEADER_SIZE + len(body), op, status, VERSION, request_id,
                             ledger, entry) + body


def encode_add(request_id: int, ledger: int, entry: int, lac: int, length: int, payload: bytes,
               crc: int, flags: int = FLAG_NONE) -> list[bytes]:
    """An ADD frame as a list of buffers (for writelines, avoiding a copy of the payload)."""
    head = FRAME_HEADER.pack(HEADER_SIZE + ADD_BODY.size + len(payload), ADD, flags, VERSION,
                             request_id, ledger, entry)
    return [head, ADD_BODY.pack(lac, length, crc), payload]


def read_body(entry_lac: int, entry_length: int, crc: int, max_lac: int, last_entry: int) -> bytes:
    return READ_BODY.pack(entry_lac, entry_length, crc, max_lac, last_entry)


def decode_read_body(body: bytes | memoryview) -> tuple[int, int, int, int, int, bytes]:
    """(entry_lac, entry_length, crc, max_lac, last_entry, payload); raises ValueError if short."""
    if len(body) < READ_BODY.size:
        raise ValueError("short READ response body")
    entry_lac, entry_length, crc, max_lac, last_entry = READ_BODY.unpack_from(body, 0)
    return entry_lac, entry_length, crc, max_lac, last_entry, bytes(body[READ_BODY.size:])


class FrameError(Exception):
    """The byte stream is not a valid frame sequence; the connection must be closed."""


class FrameReader:
    """Incremental frame splitter: feed bytes, get (op, flags_or_status, version, req_id,
    ledger, entry, body) tuples.  Raises FrameError on an impossible length."""

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME):
        self._buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[tuple]:
        buf = self._buf
        buf += data
        out = []
        pos = 0
        n = len(buf)
        unpack_len = LEN.unpack_from
        unpack_hdr = HEADER.unpack_from
        error = None
        with memoryview(buf) as mv:
            while n - pos >= 4:
                (flen,) = unpack_len(mv, pos)
                if flen < MIN_FRAME or flen > self.max_frame:
                    error = FrameError(f"bad frame length {flen}")
                    break
                end = pos + 4 + flen
                if end > n:
                    break
                op, fs, ver, rid, ledger, entry = unpack_hdr(mv, pos + 4)
                out.append((op, fs, ver, rid, ledger, entry, bytes(mv[pos + 4 + HEADER_SIZE:end])))
                pos = end
        if error is not None:
            del buf[:]
            raise error
        if pos:
            del buf[:pos]
        return out
