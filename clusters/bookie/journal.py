"""The bookie's journal (write-ahead log) with group commit.

File layout: `<data_dir>/journal/<file_id:010d>.jnl`, each starting with the 8-byte magic
`PCJRNL01`, followed by records:

    u32 body_len | u32 crc32c(body) | body
    body = u8 type | u64 seq | fields
        ADD    : u64 ledger | i64 entry | i64 lac | i64 length | u32 payload_crc | payload
        FENCE  : u64 ledger
        DELETE : u64 ledger

`seq` grows by one per record across files and restarts.  Ledger storage records in its
checkpoint the highest seq whose effect it has made durable; replay applies only records
above it, and journal files whose records are all at or below it are deleted.

A single writer task takes everything queued (up to `max_group_bytes`), writes it with one
write() and fsyncs it in a dedicated thread, then runs the callbacks (group commit).  With
`sync_data=False` or `ack_before_fsync=True`, add callbacks run right after write() and the
file is fsynced every `page_cache_flush_ms` instead.  Fence records are always fsynced
before their callback runs.  Replay stops at the first torn or corrupt record of a file.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import struct
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

import crc32c

from clusters.metrics import REGISTRY

log = logging.getLogger(__name__)

FSYNC_SECONDS = REGISTRY.histogram("bookie_journal_sync_seconds", "journal fdatasync latency")


MAGIC = b"PCJRNL01"
REC_HEAD = struct.Struct(">II")            # body length, crc32c(body)
BODY_HEAD = struct.Struct(">BQ")            # type, seq
ADD_FIELDS = struct.Struct(">QqqqI")        # ledger, entry, lac, length, payload crc
LEDGER_FIELD = struct.Struct(">Q")
MAX_RECORD = 64 * 1024 * 1024

T_ADD = 1
T_FENCE = 2
T_DELETE = 3

Callback = Callable[[BaseException | None], None]


class JournalError(Exception):
    pass


def _record(rtype: int, seq: int, fields: bytes, payload: bytes = b"") -> bytes:
    body = BODY_HEAD.pack(rtype, seq) + fields + payload
    return REC_HEAD.pack(len(body), crc32c.crc32c(body)) + body


def parse_records(data: bytes) -> tuple[list[tuple], int, bool]:
    """Parse one journal file's bytes: (records, valid_length, torn).  Each record is
    (type, seq, ledger, entry, lac, length, crc, payload) with unused fields None."""
    out: list[tuple] = []
    if len(data) < len(MAGIC) or data[:len(MAGIC)] != MAGIC:
        return out, 0, len(data) > 0
    pos = len(MAGIC)
    n = len(data)
    while pos < n:
        if n - pos < REC_HEAD.size:
            return out, pos, True
        blen, crc = REC_HEAD.unpack_from(data, pos)
        start = pos + REC_HEAD.size
        end = start + blen
        if blen < BODY_HEAD.size or blen > MAX_RECORD or end > n:
            return out, pos, True
        body = data[start:end]
        if crc32c.crc32c(body) != crc:
            return out, pos, True
        rtype, seq = BODY_HEAD.unpack_from(body, 0)
        off = BODY_HEAD.size
        if rtype == T_ADD:
            if blen < off + ADD_FIELDS.size:
                return out, pos, True
            ledger, entry, lac, length, pcrc = ADD_FIELDS.unpack_from(body, off)
            out.append((T_ADD, seq, ledger, entry, lac, length, pcrc, body[off + ADD_FIELDS.size:]))
        elif rtype in (T_FENCE, T_DELETE):
            if blen < off + LEDGER_FIELD.size:
                return out, pos, True
            (ledger,) = LEDGER_FIELD.unpack_from(body, off)
            out.append((rtype, seq, ledger, None, None, None, None, None))
        else:
            return out, pos, True
        pos = end
    return out, pos, False


class Journal:
    def __init__(self, directory: str | Path, *, sync_data: bool = True,
                 ack_before_fsync: bool = False, max_group_wait_ms: float = 2.0,
                 max_group_bytes: int = 512 * 1024, max_file_bytes: int = 64 * 1024 * 1024,
                 page_cache_flush_ms: float = 1000.0):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sync_data = sync_data
        self.ack_before_fsync = ack_before_fsync
        self.early_ack = (not sync_data) or ack_before_fsync
        self.max_group_wait = max(0.0, max_group_wait_ms) / 1000.0
        self.max_group_bytes = max(1, int(max_group_bytes))
        self.max_file_bytes = max_file_bytes
        self.page_cache_flush = page_cache_flush_ms / 1000.0
        self.last_seq = 0
        # (file_id, max_seq) of every journal file on disk; the last one is being written
        self._files: list[list[int]] = []
        self._files_lock = threading.Lock()
        self._fd: int | None = None
        self._file_bytes = 0
        self._queue: deque = deque()          # (record, callback, forced)
        self._queue_bytes = 0
        self._oldest = 0.0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._flusher: asyncio.Task | None = None
        self._exec = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="journal")
        self._unsynced = False
        self._closing = False
        self.failed: BaseException | None = None
        self.stats = {"batches": 0, "records": 0, "fsyncs": 0, "bytes": 0}

    # -- startup -----------------------------------------------------------
    def _file_ids(self) -> list[int]:
        ids = []
        for p in self.dir.glob("*.jnl"):
            try:
                ids.append(int(p.stem))
            except ValueError:
                continue
        return sorted(ids)

    def _path(self, fid: int) -> Path:
        return self.dir / f"{fid:010d}.jnl"

    def replay(self, after_seq: int, apply: Callable[[tuple], None]) -> int:
        """Apply every intact record with seq > after_seq, in order.  Returns how many."""
        applied = 0
        max_seq = after_seq
        for fid in self._file_ids():
            data = self._path(fid).read_bytes()
            records, valid, torn = parse_records(data)
            if torn:
                log.warning("journal %s: torn/corrupt tail at byte %d of %d ignored",
                            self._path(fid).name, valid, len(data))
            fmax = 0
            for rec in records:
                seq = rec[1]
                fmax = max(fmax, seq)
                if seq > after_seq:
                    apply(rec)
                    applied += 1
                max_seq = max(max_seq, seq)
            self._files.append([fid, fmax])
        self.last_seq = max_seq
        return applied

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        await loop.run_in_executor(self._exec, self._open_new_file)
        self._task = loop.create_task(self._run(), name="journal-writer")
        if self.early_ack:
            self._flusher = loop.create_task(self._periodic_sync(), name="journal-sync")

    def _open_new_file(self) -> None:
        """Runs in the journal thread."""
        with self._files_lock:
            fid = (self._files[-1][0] + 1) if self._files else 1
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
            fd = os.open(self._path(fid), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, MAGIC)
            os.fsync(fd)
            dfd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            self._fd = fd
            self._file_bytes = len(MAGIC)
            self._files.append([fid, 0])

    # -- appending ---------------------------------------------------------
    def _enqueue(self, rec: bytes, cb: Callback, forced: bool) -> None:
        if self.failed is not None or self._closing:
            err = self.failed or JournalError("journal closed")
            asyncio.get_running_loop().call_soon(cb, err)
            return
        if not self._queue:
            self._oldest = time.monotonic()
            self._wake.set()
        self._queue.append((rec, cb, forced))
        self._queue_bytes += len(rec)

    def log_add(self, ledger: int, entry: int, lac: int, length: int, crc: int, payload: bytes,
                cb: Callback) -> int:
        self.last_seq += 1
        seq = self.last_seq
        self._enqueue(_record(T_ADD, seq, ADD_FIELDS.pack(ledger, entry, lac, length, crc), payload),
                      cb, False)
        return seq

    def log_fence(self, ledger: int, cb: Callback) -> int:
        self.last_seq += 1
        seq = self.last_seq
        self._enqueue(_record(T_FENCE, seq, LEDGER_FIELD.pack(ledger)), cb, True)
        return seq

    def log_delete(self, ledger: int, cb: Callback) -> int:
        self.last_seq += 1
        seq = self.last_seq
        self._enqueue(_record(T_DELETE, seq, LEDGER_FIELD.pack(ledger)), cb, False)
        return seq

    @property
    def queued(self) -> int:
        return len(self._queue)

    # -- the writer ----------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        q = self._queue
        while True:
            if not q:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            # Let requests already read off the sockets in this loop iteration join the group,
            # unless the group is already big or its oldest record has waited long enough.
            if self._queue_bytes < self.max_group_bytes and \
                    time.monotonic() - self._oldest < self.max_group_wait:
                await asyncio.sleep(0)
            recs = []
            cbs = []
            nbytes = 0
            forced = False
            while q and (nbytes < self.max_group_bytes or not recs):
                rec, cb, f = q.popleft()
                recs.append(rec)
                cbs.append((cb, f))
                nbytes += len(rec)
                forced = forced or f
            self._queue_bytes -= nbytes
            if q:
                self._oldest = time.monotonic()
            seq_hi = self.last_seq - len(q)
            sync = forced or not self.early_ack
            try:
                await loop.run_in_executor(self._exec, self._write, b"".join(recs), sync, seq_hi)
            except BaseException as e:  # disk error: the journal can take no more
                log.error("journal write failed: %r", e)
                self.failed = e if isinstance(e, Exception) else JournalError(repr(e))
                for cb, _ in cbs:
                    cb(self.failed)
                while q:
                    _, cb, _ = q.popleft()
                    cb(self.failed)
                self._queue_bytes = 0
                continue
            self.stats["batches"] += 1
            self.stats["records"] += len(recs)
            self.stats["bytes"] += nbytes
            if sync:
                self._unsynced = False
            else:
                self._unsynced = True
            for cb, _ in cbs:
                try:
                    cb(None)
                except Exception:
                    log.exception("journal callback failed")

    def _write(self, data: bytes, sync: bool, seq_hi: int) -> None:
        """Runs in the journal thread: append (rolling the file if full), maybe fsync."""
        if self._file_bytes + len(data) > self.max_file_bytes and self._file_bytes > len(MAGIC):
            self._open_new_file()
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._file_bytes += len(data)
        with self._files_lock:
            self._files[-1][1] = max(self._files[-1][1], seq_hi)
        if sync:
            t0 = time.perf_counter()
            os.fdatasync(self._fd)
            FSYNC_SECONDS.observe(time.perf_counter() - t0)
            self.stats["fsyncs"] += 1

    def _sync(self) -> None:
        if self._fd is not None:
            t0 = time.perf_counter()
            os.fdatasync(self._fd)
            FSYNC_SECONDS.observe(time.perf_counter() - t0)
            self.stats["fsyncs"] += 1

    async def _periodic_sync(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            await asyncio.sleep(self.page_cache_flush)
            if self._unsynced:
                self._unsynced = False
                try:
                    await loop.run_in_executor(self._exec, self._sync)
                except OSError as e:
                    log.error("journal fsync failed: %r", e)

    # -- garbage collection ----------------------------------------------------
    def gc(self, checkpoint_seq: int) -> int:
        """Delete journal files (other than the current one) entirely covered by a checkpoint."""
        removed = 0
        with self._files_lock:
            keep = []
            for i, (fid, fmax) in enumerate(self._files):
                if i < len(self._files) - 1 and fmax <= checkpoint_seq:
                    try:
                        self._path(fid).unlink()
                        removed += 1
                    except FileNotFoundError:
                        pass
                else:
                    keep.append([fid, fmax])
            self._files = keep
        return removed

    async def close(self) -> None:
        self._closing = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                log.exception("journal writer")
        if self._flusher is not None:
            self._flusher.cancel()
        loop = asyncio.get_running_loop()

        def _close() -> None:
            if self._fd is not None:
                try:
                    os.fsync(self._fd)
                finally:
                    os.close(self._fd)
                    self._fd = None
        try:
            await loop.run_in_executor(self._exec, _close)
        finally:
            self._exec.shutdown(wait=True)
