"""Ledger storage of a bookie: write cache -> entry logs + SQLite index, with checkpoints.

Layout under `<data_dir>`:
    entrylogs/<log_id:010d>.log   append-only entry logs; each record is
        u32 payload_len | u64 ledger | i64 entry | i64 lac | i64 length | u32 crc32c(payload) | payload
    index.sqlite (WAL mode)
        entries(ledger, entry, log, offset, size)        -- location of each flushed entry
        ledgers(ledger, fenced, max_lac, last_entry)     -- ledger metadata index (the fenced bit)
        meta(k='checkpoint', v=<journal seq>)           -- journal records <= v are durable here

Adds go to the in-memory write cache first (so they are readable at once).  A checkpoint
swaps the cache out, appends it to the current entry log, fsyncs it, then commits the index
rows, the ledger states and the checkpoint mark in one SQLite transaction; the journal can
then drop files below the mark.  Reads look in the write cache, the cache being flushed,
an LRU read cache, then the index + entry log (in a reader thread).

Deleting a ledger drops it from memory at once (reads answer NoSuchLedger) and its index rows at
the next checkpoint; after a checkpoint that deleted ledgers, entry logs (other than the one being
written) that no index row points into any more are removed from disk, as BookKeeper's
GarbageCollectorThread does for logs whose ledgers are all deleted. (Not done: compaction of logs
that still hold some live entries.)
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sqlite3
import struct
import threading
from collections import OrderedDict
from pathlib import Path

import crc32c

from clusters.metrics import REGISTRY

log = logging.getLogger(__name__)

CACHE_HITS = REGISTRY.counter("bookie_read_cache_hits_total",
                              "reads answered from the write cache or the read cache")
CACHE_MISSES = REGISTRY.counter("bookie_read_cache_misses_total", "reads that went to the entry logs")


ELOG_HEAD = struct.Struct(">IQqqqI")   # payload_len, ledger, entry, lac, length, crc
ELOG_MAGIC = b"PCELOG01"
READ_AHEAD = 64          # entries fetched from disk per read miss

# Entry tuple used everywhere in memory: (lac, length, crc, payload)
Entry = tuple


class CorruptEntry(Exception):
    """An index row points at bytes that are not the expected entry (never answer NoSuchEntry)."""


class LedgerState:
    __slots__ = ("fenced", "max_lac", "last_entry", "fence_fut")

    def __init__(self, fenced: bool = False, max_lac: int = -1, last_entry: int = -1):
        self.fenced = fenced
        self.max_lac = max_lac
        self.last_entry = last_entry
        self.fence_fut: asyncio.Future | None = None   # set while the fence record is unsynced


class _LRU:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._d: OrderedDict = OrderedDict()

    def get(self, key):
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def put(self, key, value) -> None:
        if self.max_bytes <= 0:
            return
        old = self._d.pop(key, None)
        if old is not None:
            self.bytes -= len(old[3]) + 64
        self._d[key] = value
        self.bytes += len(value[3]) + 64
        while self.bytes > self.max_bytes and self._d:
            _, v = self._d.popitem(last=False)
            self.bytes -= len(v[3]) + 64

    def drop_ledger(self, ledger: int) -> None:
        for k in [k for k in self._d if k[0] == ledger]:
            v = self._d.pop(k)
            self.bytes -= len(v[3]) + 64


class LedgerStorage:
    def __init__(self, directory: str | Path, *, write_cache_bytes: int = 64 << 20,
                 read_cache_bytes: int = 64 << 20, max_log_bytes: int = 256 << 20):
        self.dir = Path(directory)
        self.log_dir = self.dir / "entrylogs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.write_cache_bytes = write_cache_bytes
        self.max_log_bytes = max_log_bytes
        self.ledgers: dict[int, LedgerState] = {}
        self._cache: dict[int, dict[int, Entry]] = {}
        self._cache_bytes = 0
        self._flushing: dict[int, dict[int, Entry]] | None = None
        self._dirty: set[int] = set()            # ledgers whose state changed since the last swap
        self._deleted: set[int] = set()          # ledgers deleted since the last swap
        self._read_cache = _LRU(read_cache_bytes)
        self._inflight: dict[int, list[tuple]] = {}   # ledger -> disk reads in progress
        self._flush_exec = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="flush")
        self._read_exec = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="read")
        self._db: sqlite3.Connection | None = None           # used by the flush thread
        self._rdb: sqlite3.Connection | None = None          # used by the read thread
        self._log_id = 0
        self._log_fd: int | None = None
        self._log_size = 0
        self._read_fds: dict[int, int] = {}
        self._read_lock = threading.Lock()
        self.checkpoint_seq = 0
        self._ckpt_lock = asyncio.Lock()
        self.gc_removed_logs: list[int] = []      # entry logs garbage-collected since start

    # -- open / close --------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.dir / "index.sqlite", check_same_thread=False,
                             isolation_level=None, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def open(self) -> int:
        """Load the index (synchronously, at startup); returns the checkpoint journal seq."""
        db = self._connect()
        db.executescript("""
            CREATE TABLE IF NOT EXISTS entries(ledger INTEGER NOT NULL, entry INTEGER NOT NULL,
                log INTEGER NOT NULL, offset INTEGER NOT NULL, size INTEGER NOT NULL,
                PRIMARY KEY(ledger, entry)) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS ledgers(ledger INTEGER PRIMARY KEY, fenced INTEGER NOT NULL,
                max_lac INTEGER NOT NULL, last_entry INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v INTEGER NOT NULL);
        """)
        self._db = db
        self._rdb = self._connect()
        row = db.execute("SELECT v FROM meta WHERE k='checkpoint'").fetchone()
        self.checkpoint_seq = row[0] if row else 0
        for ledger, fenced, max_lac, last_entry in db.execute(
                "SELECT ledger, fenced, max_lac, last_entry FROM ledgers"):
            self.ledgers[ledger] = LedgerState(bool(fenced), max_lac, last_entry)
        logs = sorted(int(p.stem) for p in self.log_dir.glob("*.log") if p.stem.isdigit())
        self._log_id = logs[-1] if logs else 0
        self._open_log(self._log_id + 1)
        return self.checkpoint_seq

    def _open_log(self, log_id: int) -> None:
        if self._log_fd is not None:
            os.fsync(self._log_fd)
            os.close(self._log_fd)
        path = self.log_dir / f"{log_id:010d}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(fd).st_size
        if size == 0:
            os.write(fd, ELOG_MAGIC)
            size = len(ELOG_MAGIC)
            os.fsync(fd)
            dfd = os.open(self.log_dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        self._log_id, self._log_fd, self._log_size = log_id, fd, size

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._read_exec, self._close_readers)
        await loop.run_in_executor(self._flush_exec, self._close_writer)
        self._flush_exec.shutdown(wait=True)
        self._read_exec.shutdown(wait=True)

    def _close_readers(self) -> None:
        with self._read_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
        if self._rdb is not None:
            self._rdb.close()
            self._rdb = None

    def _close_writer(self) -> None:
        if self._log_fd is not None:
            os.fsync(self._log_fd)
            os.close(self._log_fd)
            self._log_fd = None
        if self._db is not None:
            self._db.close()
            self._db = None

    # -- in-memory mutations (event loop) ----------------------------------------
    def state(self, ledger: int, create: bool = False) -> LedgerState | None:
        st = self.ledgers.get(ledger)
        if st is None and create:
            st = self.ledgers[ledger] = LedgerState()
            self._dirty.add(ledger)
        return st

    def add_entry(self, ledger: int, entry: int, lac: int, length: int, crc: int,
                  payload: bytes) -> None:
        st = self.ledgers.get(ledger)
        if st is None:
            st = self.state(ledger, create=True)
        per = self._cache.get(ledger)
        if per is None:
            per = self._cache[ledger] = {}
        old = per.get(entry)
        if old is not None:
            self._cache_bytes -= len(old[3])
        per[entry] = (lac, length, crc, payload)
        self._cache_bytes += len(payload) + 64
        if entry > st.last_entry:
            st.last_entry = entry
        if lac > st.max_lac:
            st.max_lac = lac
        self._dirty.add(ledger)

    def set_fenced(self, ledger: int) -> LedgerState:
        st = self.state(ledger, create=True)
        st.fenced = True
        self._dirty.add(ledger)
        return st

    def delete(self, ledger: int) -> None:
        self.ledgers.pop(ledger, None)
        self._cache.pop(ledger, None)
        self._dirty.discard(ledger)
        self._deleted.add(ledger)
        self._read_cache.drop_ledger(ledger)

    @property
    def cache_full(self) -> bool:
        return self._cache_bytes >= self.write_cache_bytes

    @property
    def needs_checkpoint(self) -> bool:
        return bool(self._cache or self._dirty or self._deleted)

    # -- reads -------------------------------------------------------------------
    def cached(self, ledger: int, entry: int) -> Entry | None:
        """The entry from the write cache, the cache being flushed or the read cache (counted as a hit)."""
        e = self._cached(ledger, entry)
        if e is not None:
            CACHE_HITS.inc()
        return e

    def _cached(self, ledger: int, entry: int) -> Entry | None:
        per = self._cache.get(ledger)
        if per is not None:
            e = per.get(entry)
            if e is not None:
                return e
        fl = self._flushing
        if fl is not None:
            per = fl.get(ledger)
            if per is not None:
                e = per.get(entry)
                if e is not None:
                    return e
        return self._read_cache.get((ledger, entry))

    async def read(self, ledger: int, entry: int) -> Entry | None:
        """The entry, or None if this bookie does not have it; raises CorruptEntry."""
        e = self.cached(ledger, entry)
        if e is not None:
            return e
        # join a disk read (with read-ahead) already covering this entry
        for lo, hi, fut in self._inflight.get(ledger, ()):
            if lo <= entry < hi:
                try:
                    found = await asyncio.shield(fut)
                except Exception:
                    break
                e = found.get(entry)
                if e is not None:
                    return e
                break     # not found by the read-ahead: look it up on its own
        return await self._read_from_disk(ledger, entry)

    async def _read_from_disk(self, ledger: int, entry: int) -> Entry | None:
        CACHE_MISSES.inc()
        loop = asyncio.get_running_loop()
        hi = entry + READ_AHEAD
        fut = loop.run_in_executor(self._read_exec, self._read_disk, ledger, entry, READ_AHEAD)
        slot = (entry, hi, fut)
        self._inflight.setdefault(ledger, []).append(slot)
        try:
            found = await fut
        finally:
            lst = self._inflight.get(ledger)
            if lst is not None:
                lst.remove(slot)
                if not lst:
                    del self._inflight[ledger]
        if ledger not in self.ledgers:   # deleted meanwhile
            return None
        for eid, ent in found.items():
            self._read_cache.put((ledger, eid), ent)
        return found.get(entry)

    def _read_fd(self, log_id: int) -> int:
        fd = self._read_fds.get(log_id)
        if fd is None:
            fd = os.open(self.log_dir / f"{log_id:010d}.log", os.O_RDONLY)
            self._read_fds[log_id] = fd
        return fd

    def _read_disk(self, ledger: int, entry: int, read_ahead: int) -> dict[int, Entry]:
        """Runs in the read thread: the entry (and a few following ones) from the entry logs."""
        rows = self._rdb.execute(
            "SELECT entry, log, offset, size FROM entries WHERE ledger=? AND entry>=? AND entry<?"
            " ORDER BY entry", (ledger, entry, entry + read_ahead)).fetchall()
        out = {}
        for eid, log_id, off, size in rows:
            try:
                out[eid] = self._read_at(ledger, eid, log_id, off, size)
            except CorruptEntry:
                if eid == entry:
                    raise
                break
        return out

    def _read_at(self, ledger: int, entry: int, log_id: int, off: int, size: int) -> Entry:
        with self._read_lock:
            fd = self._read_fd(log_id)
        data = os.pread(fd, size, off)
        if len(data) != size or size < ELOG_HEAD.size:
            raise CorruptEntry(f"short read of {ledger}:{entry} in log {log_id}@{off}")
        plen, l2, e2, lac, length, crc = ELOG_HEAD.unpack_from(data, 0)
        payload = data[ELOG_HEAD.size:]
        if l2 != ledger or e2 != entry or plen != len(payload) or crc32c.crc32c(payload) != crc:
            raise CorruptEntry(f"entry {ledger}:{entry} in log {log_id}@{off} is corrupt")
        return (lac, length, crc, payload)

    # -- checkpoint ----------------------------------------------------------------
    async def checkpoint(self, mark: int) -> bool:
        """Flush the write cache and ledger states; on return journal seq <= mark is durable here.
        `mark` must be the journal's last seq at the time of the call (everything enqueued so far
        is already in the cache, since adds hit the cache before the journal)."""
        async with self._ckpt_lock:
            if not self.needs_checkpoint and mark <= self.checkpoint_seq:
                return False
            cache, self._cache = self._cache, {}
            self._cache_bytes = 0
            self._flushing = cache
            states = {lid: (int(st.fenced), st.max_lac, st.last_entry)
                      for lid in self._dirty if (st := self.ledgers.get(lid)) is not None}
            deleted = set(self._deleted)
            self._dirty.clear()
            self._deleted.clear()
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._flush_exec, self._flush, cache, states, deleted,
                                           mark)
            except BaseException:
                # put everything back so that a later checkpoint retries it
                for lid, per in cache.items():
                    if lid in self.ledgers:
                        cur = self._cache.setdefault(lid, {})
                        for eid, ent in per.items():
                            if eid not in cur:
                                cur[eid] = ent
                                self._cache_bytes += len(ent[3]) + 64
                self._dirty.update(lid for lid in states if lid in self.ledgers)
                self._deleted.update(deleted)
                raise
            finally:
                self._flushing = None
            self.checkpoint_seq = max(self.checkpoint_seq, mark)
            if deleted:
                try:
                    removed = await loop.run_in_executor(self._read_exec, self._gc_logs, self._log_id)
                except Exception:  # noqa: BLE001 - space is reclaimed at a later checkpoint
                    log.warning("entry log garbage collection failed", exc_info=True)
                else:
                    if removed:
                        self.gc_removed_logs.extend(removed)
                        log.info("garbage-collected entry logs %s (all their ledgers deleted)", removed)
            return True

    def _gc_logs(self, current: int) -> list[int]:
        """Runs in the read thread (so no read holds a descriptor being closed): remove the entry
        logs below `current` (the one being written) that no index row refers to."""
        live = {r[0] for r in self._rdb.execute("SELECT DISTINCT log FROM entries")}
        removed = []
        for p in sorted(self.log_dir.glob("*.log")):
            if not p.stem.isdigit():
                continue
            log_id = int(p.stem)
            if log_id >= current or log_id in live:
                continue
            with self._read_lock:
                fd = self._read_fds.pop(log_id, None)
            if fd is not None:
                os.close(fd)
            try:
                p.unlink()
            except FileNotFoundError:
                continue
            removed.append(log_id)
        return removed

    def _flush(self, cache: dict, states: dict, deleted: set, mark: int) -> None:
        """Runs in the flush thread."""
        rows = []
        chunks: list[bytes] = []
        chunk_bytes = 0
        for ledger in sorted(cache):
            per = cache[ledger]
            for entry in sorted(per):
                lac, length, crc, payload = per[entry]
                rec = ELOG_HEAD.pack(len(payload), ledger, entry, lac, length, crc) + payload
                if self._log_size + chunk_bytes + len(rec) > self.max_log_bytes and \
                        (self._log_size + chunk_bytes) > len(ELOG_MAGIC):
                    self._write_log(chunks)
                    chunks, chunk_bytes = [], 0
                    self._open_log(self._log_id + 1)
                rows.append((ledger, entry, self._log_id, self._log_size + chunk_bytes, len(rec)))
                chunks.append(rec)
                chunk_bytes += len(rec)
        if chunks:
            self._write_log(chunks)
        if rows:
            os.fsync(self._log_fd)
        db = self._db
        db.execute("BEGIN")
        try:
            for ledger in deleted:   # first: a ledger re-created since has only newer rows below
                db.execute("DELETE FROM entries WHERE ledger=?", (ledger,))
                db.execute("DELETE FROM ledgers WHERE ledger=?", (ledger,))
            db.executemany("INSERT OR REPLACE INTO entries(ledger, entry, log, offset, size)"
                           " VALUES (?,?,?,?,?)", rows)
            db.executemany("INSERT OR REPLACE INTO ledgers(ledger, fenced, max_lac, last_entry)"
                           " VALUES (?,?,?,?)", [(lid, *v) for lid, v in states.items()])
            db.execute("INSERT OR REPLACE INTO meta(k, v) VALUES ('checkpoint', ?)", (mark,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _write_log(self, chunks: list[bytes]) -> None:
        data = memoryview(b"".join(chunks))
        while data:
            n = os.write(self._log_fd, data)
            data = data[n:]
            self._log_size += n
