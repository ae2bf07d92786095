"""The bookie process: asyncio TCP server over the journal and the ledger storage.

`serve(cfg, stop)` is what `python -m clusters.node CONFIG.json` runs for role "bookie".

Startup: connect to ZooKeeper and check the cookies (cookie.py; a mismatch or a wiped disk makes
the process exit with code 3 and one log line naming the fix), load the storage index, replay the
journal above the last checkpoint (adds, fences, deletes), start the journal writer and the
checkpointer; a new bookie then writes its cookies; listen on host:port, then register
`/ledgers/available/<host:port>` (ephemeral, re-created whenever a new session is established).

Limbo (BookKeeper's BP-46 limbo state): a new bookie (no cookie anywhere, e.g. just formatted)
whose id the ledger metadata already lists held those ledgers in an earlier life and lost them. It
fences each of them locally, records them in `<data_dir>/current/limbo.json` before writing its
cookies, and marks them under-replicated naming itself as `formatted` (urmanager.py) so that
auto-recovery copies its fragments elsewhere although it is registered. For a ledger in limbo it
never answers NO_SUCH_ENTRY / NO_SUCH_LEDGER (ledger recovery would take that for "never
written" and truncate acknowledged entries, apache/bookkeeper#4812): it answers ERROR, which a
recovery read counts as unknown. Entries it does store are served as usual. The bug knob
`bookie.no_limbo` (apache/bookkeeper#2612) turns this off: the formatted bookie is trusted at once.

Deleted ledgers: a ledger leaves the bookie by a client's DELETE request or by garbage collection of
the ledgers whose metadata is gone (gc.py, every `gcWaitTime`). A ledger that was fenced when it was
deleted stays fenced (BookKeeper's recentlyFencedAndDeletedLedgers, apache/bookkeeper#4462): a later
add to it, normal or recovery, is refused with FENCED instead of starting a new, unfenced ledger of
that id. Without that, the owner whose ledger another client recovered and deleted (a broker whose
ZooKeeper session expired, its empty last ledger deleted by the topic's new owner,
apache/pulsar#20094) gets its adds acknowledged in a ledger nobody will read. The bug knob
`bookie.write_after_delete_accepted` restores that.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from pathlib import Path

import crc32c

from clusters.bugs import Knobs
from clusters.config import BookieConfig
from clusters.metadata.store import MetadataStore, NodeExists, NoNode
from clusters.metrics import REGISTRY

from . import cookie as cookies
from . import protocol as P
from .gc import GarbageCollector
from .http import BookieHttpServer
from .journal import T_ADD, T_DELETE, T_FENCE, Journal
from .storage import CorruptEntry, LedgerStorage

log = logging.getLogger(__name__)

AVAILABLE = "/ledgers/available"
# pause reading a connection while this many of its adds wait for the journal
MAX_INFLIGHT_PER_CONN = 20000
RESUME_INFLIGHT = 10000
COOKIE_EXIT = 3          # the exit code of a bookie whose cookies refuse its disks
ZK_CONNECT_S = 60.0      # how long start() tries to reach ZooKeeper for the cookie check
LIMBO_FILE = "limbo.json"
# how long a fenced and deleted ledger stays refused after its last access (BookKeeper: 7 days)
FENCED_DELETED_KEEP_S = 7 * 24 * 3600.0




class _Conn(asyncio.Protocol):
    """One client connection: frames in, responses out (coalesced per loop iteration)."""

    def __init__(self, bookie: "Bookie"):
        self.bookie = bookie
        self.reader = P.FrameReader()
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.closed = False
        self.inflight = 0
        self.paused = False
        self.peer = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.bookie.conns.add(self)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.bookie.conns.discard(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except P.FrameError as e:
            log.warning("closing connection from %s: %s", self.peer, e)
            self.closed = True
            self.transport.abort()
            return
        handle = self.bookie.handle
        for f in frames:
            handle(self, *f)

    def send(self, frame: bytes) -> None:
        if self.closed:
            return
        self.out.append(frame)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.bookie.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        out, self.out = self.out, []
        if not self.closed and out:
            self.transport.writelines(out)

    def add_inflight(self) -> None:
        self.inflight += 1
        if self.inflight >= MAX_INFLIGHT_PER_CONN and not self.paused and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def done_inflight(self) -> None:
        self.inflight -= 1
        if self.paused and self.inflight <= RESUME_INFLIGHT and not self.closed:
            self.paused = False
            self.transport.resume_reading()


class Bookie:
    def __init__(self, cfg: BookieConfig):
        self.cfg = cfg
        self.data_dir = Path(cfg.data_dir)
        self.conns: set[_Conn] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.knobs = Knobs(cfg.bugs, "bookie")      # bug knobs (clusters/bugs.py)
        ack_early = self.knobs.on("bookie.ack_before_fsync")
        self.ignore_fence = self.knobs.on("bookie.ignore_fence")
        self.no_cookie = self.knobs.on("bookie.no_cookie")
        self.no_limbo = self.knobs.on("bookie.no_limbo")
        self.write_after_delete = self.knobs.on("bookie.write_after_delete_accepted")
        # ledgers deleted while fenced -> monotonic time of their last access (adds to them are refused)
        self.fenced_deleted: dict[int, float] = {}
        self.gc = GarbageCollector(self, max(0.05, cfg.gc_wait_time_ms / 1000.0))
        # apache/bookkeeper#2908: an entry the index lists but the entry log cannot give back answered
        # as "no such entry" (recovery counts it as absent) instead of an error
        self.corrupt_says_nosuchentry = self.knobs.on("bk.corrupt_log_says_nosuchentry")
        self.limbo: set[int] = set()       # ledgers this bookie lost in an earlier life
        self.cookie_state: str | None = None   # "new" / "ok" after the check; None: not checked
        self.journal = Journal(self.data_dir / "journal", sync_data=cfg.journal_sync_data,
                               ack_before_fsync=ack_early,
                               max_group_wait_ms=cfg.journal_max_group_wait_ms,
                               max_group_bytes=cfg.journal_max_group_bytes)
        self.storage = LedgerStorage(self.data_dir, write_cache_bytes=cfg.write_cache_mb << 20,
                                     read_cache_bytes=cfg.read_cache_mb << 20)
        self.server: asyncio.AbstractServer | None = None
        self.http: BookieHttpServer | None = None
        self.store: MetadataStore | None = None
        self._tasks: list[asyncio.Task] = []
        self._ckpt_wake = asyncio.Event()
        self._zk_wake = asyncio.Event()
        self._stopping = False
        self.stats = {"adds": 0, "reads": 0, "fences": 0}

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> "Bookie":
        self.loop = asyncio.get_running_loop()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cookie = None
        if not self.no_cookie:
            await self._connect(ZK_CONNECT_S)
            how = ("python -m clusters.bookie.cookie format <its config.json>, or "
                   "Cluster.format(name), with the bookie stopped")
            self.cookie_state, cookie = await cookies.check(self.store, self.cfg.bookie_id,
                                                            self.data_dir, how)
            if self.cookie_state == "ok":
                self.limbo = await asyncio.to_thread(self._read_limbo)
        ckpt = await asyncio.to_thread(self.storage.open)
        counts = {T_ADD: 0, T_FENCE: 0, T_DELETE: 0}
        st = self.storage

        def apply(rec: tuple) -> None:
            rtype, _seq, ledger, entry, lac, length, crc, payload = rec
            counts[rtype] += 1
            if rtype == T_ADD:
                st.add_entry(ledger, entry, lac, length, crc, payload)
            elif rtype == T_FENCE:
                st.set_fenced(ledger)
            elif rtype == T_DELETE:
                self._forget_state(ledger)
        n = await asyncio.to_thread(self.journal.replay, ckpt, apply)
        log.info("bookie %s: checkpoint seq %d, replayed %d journal records (%d adds, %d fences, "
                 "%d deletes), %d ledgers", self.cfg.bookie_id, ckpt, n, counts[T_ADD],
                 counts[T_FENCE], counts[T_DELETE], len(st.ledgers))
        await self.journal.start()
        if n:
            await self._checkpoint()
        else:
            self.journal.gc(st.checkpoint_seq)
        if self.cookie_state == "new":
            await self._become_new(cookie)
        elif self.limbo:
            log.info("bookie %s: %d ledger(s) in limbo (lost before it was formatted)",
                     self.cfg.bookie_id, len(self.limbo))
        self.server = await self.loop.create_server(lambda: _Conn(self), self.cfg.host,
                                                    self.cfg.port, reuse_address=True,
                                                    backlog=1024)
        log.info("bookie %s listening (journal_sync_data=%s ack_before_fsync=%s)",
                 self.cfg.bookie_id, self.cfg.journal_sync_data, self.journal.ack_before_fsync)
        self._tasks.append(self.loop.create_task(self._checkpointer(), name="checkpointer"))
        self._tasks.append(self.loop.create_task(self._registration(), name="registration"))
        self._tasks.append(self.loop.create_task(self.gc.run(), name="garbage-collector"))
        if self.cfg.http_port:
            self.http = await BookieHttpServer(self).start()    # /metrics, /heartbeat, state
        return self

    async def stop(self) -> None:
        self._stopping = True
        if self.store is not None:
            try:
                await asyncio.wait_for(self.store.delete(self._zk_path()), 5)
            except Exception:
                pass
        if self.server is not None:
            self.server.close()
        if self.http is not None:
            await self.http.close()
        for c in list(self.conns):
            c.closed = True
            c.transport.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        await self.journal.close()
        try:
            await self._checkpoint()
        except Exception:
            log.exception("final checkpoint failed")
        await self.storage.close()
        if self.store is not None:
            await self.store.close()
        log.info("bookie %s stopped", self.cfg.bookie_id)

    # -- checkpointing -----------------------------------------------------------
    async def _checkpoint(self) -> None:
        mark = self.journal.last_seq
        if await self.storage.checkpoint(mark):
            removed = self.journal.gc(self.storage.checkpoint_seq)
            if removed:
                log.debug("checkpoint %d: removed %d journal files", mark, removed)

    async def _checkpointer(self) -> None:
        interval = max(0.01, self.cfg.flush_interval_ms / 1000.0)
        while True:
            try:
                await asyncio.wait_for(self._ckpt_wake.wait(), interval)
            except asyncio.TimeoutError:
                pass
            self._ckpt_wake.clear()
            try:
                await self._checkpoint()
            except Exception:
                log.exception("checkpoint failed")
                await asyncio.sleep(1)

    # -- cookies and limbo ---------------------------------------------------------
    def _limbo_path(self) -> Path:
        return self.data_dir / "current" / LIMBO_FILE

    def _read_limbo(self) -> set[int]:
        try:
            return {int(x) for x in json.loads(self._limbo_path().read_text())["ledgers"]}
        except FileNotFoundError:
            return set()
        except (ValueError, KeyError, TypeError) as e:
            raise cookies.CookieError(f"bookie {self.cfg.bookie_id}: {self._limbo_path()} is "
                                      f"corrupt ({e}); format it as a new bookie") from None

    def _write_limbo(self) -> None:
        p = self._limbo_path()
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"ledgers": sorted(self.limbo)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        for d in (p.parent, p.parent.parent):
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    async def _become_new(self, cookie: "cookies.Cookie") -> None:
        """A new bookie: put the ledgers the metadata lists it in (and it does not hold) in limbo,
        fence them, have auto-recovery move them off it, then write its cookies."""
        from clusters.autorecovery.urmanager import UnderreplicationManager
        from clusters.bookkeeper.client import BookKeeper
        me = self.cfg.bookie_id
        bk = BookKeeper(self.store, name=f"cookie-{me}")    # metadata reads only: never started
        held = await bk.all_ledger_metadata()
        lost = {lid for lid, md in held.items() if me in md.bookies()} - set(self.storage.ledgers)
        if lost and self.no_limbo:
            # BookKeeper before BP-46 (apache/bookkeeper#2612): a formatted bookie rejoins under its id
            # and is trusted at once: it answers "no such ledger/entry" for what it lost, nothing is
            # fenced here, and nothing is marked under-replicated (the auditor sees a live bookie)
            log.warning("bookie %s: new bookie under an id the ledger metadata already lists: %d "
                        "ledger(s) %s lost, NOT in limbo (bookie.no_limbo)", me, len(lost),
                        sorted(lost)[:20])
            lost = set()
        if lost:
            self.limbo = lost
            for lid in lost:
                self.storage.set_fenced(lid)
            await self._checkpoint()
            await asyncio.to_thread(self._write_limbo)

            async def zk(fn, *a, **kw):
                return await fn(*a, **kw)
            urm = UnderreplicationManager(self.store, zk)
            await urm.ensure_paths()
            for lid in sorted(lost):
                await urm.mark(lid, {me}, me, formatted={me})
            log.warning("bookie %s: new bookie under an id the ledger metadata already lists: %d "
                        "ledger(s) %s in limbo (fenced here, never answered 'no such entry'), "
                        "marked under-replicated for auto-recovery", me, len(lost),
                        sorted(lost)[:20])
        await cookies.stamp(self.store, cookie)
        log.info("bookie %s: new bookie; cookie written to %s and %s", me,
                 cookies.metadata_path(me), ", ".join(str(cookies.cookie_path(d)) for d in
                                                     [cookie.journal_dir, *cookie.ledger_dirs]))

    # -- ZooKeeper registration --------------------------------------------------
    def _zk_path(self) -> str:
        return f"{AVAILABLE}/{self.cfg.bookie_id}"

    async def _connect(self, limit_s: float | None) -> None:
        """Connect the metadata store, retrying every second; with limit_s, for at most that long (then the
        last error), else until it connects."""
        deadline = None if limit_s is None else self.loop.time() + limit_s
        while self.store is None:
            store = MetadataStore(self.cfg.zk, session_timeout=self.cfg.zk_session_timeout,
                                  name=self.cfg.name)
            try:
                await store.start(timeout=15)
                self.store = store
            except Exception as e:
                try:
                    await store.close()
                except Exception:
                    pass
                if deadline is not None and self.loop.time() >= deadline:
                    raise cookies.CookieError(f"bookie {self.cfg.bookie_id}: ZooKeeper at "
                                              f"{self.cfg.zk} not reachable for {limit_s:.0f}s "
                                              f"({e!r}); the cookies cannot be checked") from None
                log.warning("bookie %s: ZooKeeper not reachable yet: %r", self.cfg.bookie_id, e)
                await asyncio.sleep(1)

    async def _registration(self) -> None:
        await self._connect(None)
        self.store.add_listener(self._on_zk_state)
        data = json.dumps({"host": self.cfg.host, "port": self.cfg.port,
                           "pid": os.getpid()}).encode()
        while True:
            try:
                await self._ensure_registered(data)
            except Exception as e:
                log.warning("bookie %s: registration: %r", self.cfg.bookie_id, e)
                await asyncio.sleep(0.5)
                continue
            try:   # re-check on every session event, and every few seconds anyway
                await asyncio.wait_for(self._zk_wake.wait(), 3.0)
            except asyncio.TimeoutError:
                pass
            self._zk_wake.clear()

    def _on_zk_state(self, state: str) -> None:
        self._zk_wake.set()

    async def _ensure_registered(self, data: bytes) -> None:
        store = self.store
        if not store.connected or self._stopping:
            return
        path = self._zk_path()
        owner = await store.owner_session(path)
        if owner is not None and owner == store.session_id:
            return
        if owner is not None:
            # a previous incarnation of this bookie (same host:port) whose session has not
            # expired yet: it cannot be alive since we hold the port, so take over.
            log.info("bookie %s: removing stale registration of session %x", self.cfg.bookie_id,
                     owner)
            try:
                await store.delete(path)
            except NoNode:
                pass
        try:
            await store.create(path, data, ephemeral=True, makepath=True)
            log.info("bookie %s registered at %s", self.cfg.bookie_id, path)
        except NodeExists:
            self._zk_wake.set()

    # -- request handling ----------------------------------------------------------
    def handle(self, conn: _Conn, op: int, flags: int, ver: int, rid: int, ledger: int,
               entry: int, body: bytes) -> None:
        try:
            if op == P.ADD:
                self._add(conn, flags, rid, ledger, entry, body)
            elif op == P.READ:
                if entry == P.INVALID_ENTRY:
                    self._read_lac(conn, op, flags & P.FLAG_DO_FENCING, rid, ledger)
                elif entry < 0:
                    conn.send(P.encode_response(op, P.BAD_REQUEST, rid, ledger, entry))
                else:
                    self._read(conn, flags, rid, ledger, entry)
            elif op == P.READ_LAC:
                self._read_lac(conn, op, flags & P.FLAG_DO_FENCING, rid, ledger)
            elif op == P.FENCE:
                self._read_lac(conn, op, True, rid, ledger)
            elif op == P.DELETE:
                self._delete(conn, rid, ledger)
            else:
                conn.send(P.encode_response(op & 0xFF, P.BAD_REQUEST, rid, ledger, entry))
        except Exception:
            log.exception("request op=%d ledger=%d entry=%d failed", op, ledger, entry)
            conn.send(P.encode_response(op & 0xFF, P.ERROR, rid, ledger, entry))

    def _add(self, conn: _Conn, flags: int, rid: int, ledger: int, entry: int,
             body: bytes) -> None:
        if len(body) < P.ADD_BODY.size or entry < 0:
            conn.send(P.encode_response(P.ADD, P.BAD_REQUEST, rid, ledger, entry))
            return
        st = self.storage.ledgers.get(ledger)
        if st is not None and st.fenced and not (flags & P.FLAG_RECOVERY_ADD) and not self.ignore_fence:
            conn.send(P.encode_response(P.ADD, P.FENCED, rid, ledger, entry))
            return
        if st is None and self._fenced_and_deleted(ledger):
            # deleted while fenced: not a new ledger (apache/bookkeeper#4462); no flag bypasses it
            conn.send(P.encode_response(P.ADD, P.FENCED, rid, ledger, entry))
            return
        lac, length, crc = P.ADD_BODY.unpack_from(body, 0)
        payload = body[P.ADD_BODY.size:]
        if crc32c.crc32c(payload) != crc:
            conn.send(P.encode_response(P.ADD, P.BAD_REQUEST, rid, ledger, entry))
            return
        if self.journal.failed is not None:
            conn.send(P.encode_response(P.ADD, P.ERROR, rid, ledger, entry))
            return
        # ledger storage first, then the journal; the ack is the journal's callback
        self.storage.add_entry(ledger, entry, lac, length, crc, payload)
        conn.add_inflight()

        def done(exc: BaseException | None) -> None:
            conn.done_inflight()
            conn.send(P.encode_response(P.ADD, P.OK if exc is None else P.ERROR, rid, ledger,
                                        entry))
        self.journal.log_add(ledger, entry, lac, length, crc, payload, done)
        self.stats["adds"] += 1
        if self.storage.cache_full:
            self._ckpt_wake.set()

    def _fence(self, ledger: int) -> asyncio.Future | None:
        """Fence the ledger (creating it if unknown); a future that completes once the fence is
        durable, or None if it already is."""
        st = self.storage.ledgers.get(ledger)
        if st is not None and st.fenced:
            return st.fence_fut
        st = self.storage.set_fenced(ledger)
        fut = self.loop.create_future()
        st.fence_fut = fut
        self.stats["fences"] += 1

        def done(exc: BaseException | None) -> None:
            if st.fence_fut is fut:
                st.fence_fut = None
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)
        self.journal.log_fence(ledger, done)
        return fut

    def _after_fence(self, fencing: bool, ledger: int, conn: _Conn, op: int, rid: int,
                     entry: int, then) -> bool:
        """If fencing, run `then()` once the fence is durable; returns True if deferred."""
        if not fencing:
            return False
        fut = self._fence(ledger)
        if fut is None:
            return False

        def go(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                conn.send(P.encode_response(op, P.ERROR, rid, ledger, entry))
                return
            then()
        fut.add_done_callback(go)
        return True

    def _read_lac(self, conn: _Conn, op: int, fencing: bool, rid: int, ledger: int) -> None:
        def respond() -> None:
            st = self.storage.ledgers.get(ledger)
            if st is None:
                conn.send(P.encode_response(op, self._absent(ledger, P.NO_SUCH_LEDGER), rid,
                                            ledger, P.INVALID_ENTRY))
                return
            conn.send(P.encode_response(op, P.OK, rid, ledger, P.INVALID_ENTRY,
                                        P.read_body(-1, -1, 0, st.max_lac, st.last_entry)))
        if not self._after_fence(fencing, ledger, conn, op, rid, P.INVALID_ENTRY, respond):
            respond()

    def _read(self, conn: _Conn, flags: int, rid: int, ledger: int, entry: int) -> None:
        self.stats["reads"] += 1

        def respond() -> None:
            st = self.storage.ledgers.get(ledger)
            if st is None:
                conn.send(P.encode_response(P.READ, self._absent(ledger, P.NO_SUCH_LEDGER), rid,
                                            ledger, entry))
                return
            e = self.storage.cached(ledger, entry)
            if e is not None:
                self._send_entry(conn, rid, ledger, entry, st, e)
            elif entry > st.last_entry:
                conn.send(P.encode_response(P.READ, self._absent(ledger, P.NO_SUCH_ENTRY), rid,
                                            ledger, entry))
            else:
                self.loop.create_task(self._read_slow(conn, rid, ledger, entry))
        if not self._after_fence(bool(flags & P.FLAG_DO_FENCING), ledger, conn, P.READ, rid,
                                 entry, respond):
            respond()

    def _absent(self, ledger: int, status: int) -> int:
        """What to answer for something this bookie does not store: the negative `status`, or
        ERROR (unknown) for a ledger in limbo, whose entries it may have acknowledged and lost."""
        return P.ERROR if ledger in self.limbo else status

    def _send_entry(self, conn: _Conn, rid: int, ledger: int, entry: int, st, e) -> None:
        lac, length, crc, payload = e
        conn.send(P.encode_response(P.READ, P.OK, rid, ledger, entry,
                                    P.read_body(lac, length, crc, st.max_lac, st.last_entry)
                                    + payload))

    async def _read_slow(self, conn: _Conn, rid: int, ledger: int, entry: int) -> None:
        try:
            e = await self.storage.read(ledger, entry)
        except CorruptEntry as ex:
            # the index says this bookie stores the entry and the log cannot give it back: an I/O error
            # (ERROR, "unknown" to a recovery), never "no such entry" (apache/bookkeeper#2908), unless
            # the knob restores the bug
            log.error("read %d:%d: %s", ledger, entry, ex)
            status = P.NO_SUCH_ENTRY if self.corrupt_says_nosuchentry else P.ERROR
            conn.send(P.encode_response(P.READ, status, rid, ledger, entry))
            return
        except Exception:
            log.exception("read %d:%d failed", ledger, entry)
            conn.send(P.encode_response(P.READ, P.ERROR, rid, ledger, entry))
            return
        st = self.storage.ledgers.get(ledger)
        if st is None:
            conn.send(P.encode_response(P.READ, self._absent(ledger, P.NO_SUCH_LEDGER), rid,
                                        ledger, entry))
        elif e is None:
            conn.send(P.encode_response(P.READ, self._absent(ledger, P.NO_SUCH_ENTRY), rid,
                                        ledger, entry))
        else:
            self._send_entry(conn, rid, ledger, entry, st, e)

    def _delete(self, conn: _Conn, rid: int, ledger: int) -> None:
        if ledger not in self.storage.ledgers:
            conn.send(P.encode_response(P.DELETE, P.NO_SUCH_LEDGER, rid, ledger, P.INVALID_ENTRY))
            return

        def done(exc: BaseException | None) -> None:
            conn.send(P.encode_response(P.DELETE, P.OK if exc is None else P.ERROR, rid, ledger,
                                        P.INVALID_ENTRY))
        self.forget(ledger, "deleted by a client", done)

    # -- deleted ledgers (a client's DELETE, garbage collection) ---------------------------
    def forget(self, ledger: int, why: str, done=None) -> None:
        """Drop a deleted ledger: its entries and state, its limbo mark; a journal record so that a
        replay does not bring its entries back. A fenced ledger is remembered as fenced and deleted."""
        fenced = self._forget_state(ledger)
        log.info("bookie %s: ledger %d %s%s", self.cfg.bookie_id, ledger, why,
                 "" if not fenced else (" (it was fenced: its fence is forgotten, bug knob)"
                                        if self.write_after_delete else " (it was fenced: it stays fenced)"))
        if ledger in self.limbo:
            self.limbo.discard(ledger)
            self._write_limbo()
        self.journal.log_delete(ledger, done or (lambda exc: None))

    def _forget_state(self, ledger: int) -> bool:
        """Drop the ledger from storage; remember it if it was fenced (unless the knob). Whether it was."""
        st = self.storage.ledgers.get(ledger)
        fenced = st is not None and st.fenced
        if fenced and not self.write_after_delete:
            self.fenced_deleted[ledger] = time.monotonic()
        self.storage.delete(ledger)
        return fenced

    def _fenced_and_deleted(self, ledger: int) -> bool:
        """Whether the ledger was deleted while fenced (and not long ago); touches its entry."""
        seen = self.fenced_deleted.get(ledger)
        if seen is None:
            return False
        now = time.monotonic()
        if now - seen > FENCED_DELETED_KEEP_S:
            del self.fenced_deleted[ledger]
            return False
        self.fenced_deleted[ledger] = now      # expire after access, as BookKeeper's cache
        return True


async def serve(cfg: BookieConfig, stop: asyncio.Event) -> None:
    bookie = Bookie(cfg)
    try:
        await bookie.start()
    except cookies.CookieError as e:
        if bookie.store is not None:
            await bookie.store.close()
        # one line, the log's last: the deployment reports it with the exit code
        log.error("%s", e)
        raise SystemExit(COOKIE_EXIT) from None
    # auto-recovery (auditor candidate + replication worker) in this process, as BookKeeper's
    # autoRecoveryDaemonEnabled; it connects in the background and stops before the bookie
    from clusters.autorecovery import start_in_bookie
    recovery = await start_in_bookie(cfg, bookie.knobs)
    try:
        await stop.wait()
    finally:
        if recovery is not None:
            await recovery.stop()
        await bookie.stop()
