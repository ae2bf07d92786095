"""Client side of the bookie protocol: one pipelined connection per bookie, with reconnect.

Requests are registered with a callback `cb(ctx, status, body)`; responses are matched by
request id and may arrive in any order.  A request that gets no answer within its timeout
is completed with status TIMEOUT; a lost connection completes everything outstanding on it
with CONNECTION_LOST.  Frames are coalesced and written once per event-loop iteration.

Targeted request faults (`ChannelPool.fault`, None normally): a function of (bookie address, op,
flags, ledger, entry) that answers None (send it), DROP (the request is lost on the way: it is never
written, and completes with TIMEOUT like any unanswered request), a delay in seconds (it is
written that much later) or an `Answer` (it is never written, and completes with the Answer's status
after its delay, as a bookie refusing it would answer: a read-only bookie's error to an add). The
harness's ledger workload uses them to lose one fencing request, slow one writer's adds to one bookie
or have a bookie refuse them (one request type to one bookie, as a one-way network fault between two
processes would, which iptables cannot tell apart by request type).
"""
from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import Any, Callable

from clusters.bookie import protocol as P

log = logging.getLogger(__name__)

Callback = Callable[[Any, int, bytes], None]
CONNECT_TIMEOUT = 3.0
DROP = "drop"


@dataclass(frozen=True)
class Answer:
    """A targeted fault's answer in the bookie's stead: the request is not written, and its callback gets
    `status` (a protocol status, e.g. P.ERROR) `delay` seconds later."""
    status: int
    delay: float = 0.0


# (bookie address, op, flags, ledger, entry) -> None (send) | DROP (lost) | seconds of delay | Answer
RequestFault = Callable[[str, int, int, int, int], "float | str | Answer | None"]


class _Conn(asyncio.Protocol):
    def __init__(self, channel: "BookieChannel"):
        self.channel = channel
        self.reader = P.FrameReader()
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except P.FrameError as e:
            log.warning("bookie %s sent a bad frame: %s", self.channel.addr, e)
            self.transport.abort()
            return
        pending = self.channel.pending
        for op, status, _ver, rid, _ledger, _entry, body in frames:
            req = pending.pop(rid, None)
            if req is None:
                continue
            cb, ctx = req[0], req[1]
            try:
                cb(ctx, status, body)
            except Exception:
                log.exception("bookie response callback failed")

    def connection_lost(self, exc) -> None:
        self.lost = True
        self.channel._lost(self, exc)


class BookieChannel:
    def __init__(self, pool: "ChannelPool", addr: str):
        self.pool = pool
        self.addr = addr
        host, _, port = addr.rpartition(":")
        self.host, self.port = host, int(port)
        self.pending: dict[int, tuple] = {}     # rid -> (cb, ctx, issued, timeout, conn_gen)
        self._rid = 0
        self._conn: _Conn | None = None
        self._connecting: asyncio.Task | None = None
        self._out: list = []
        self._flush_scheduled = False
        self._gen = 0
        self.closed = False

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def request(self, op: int, flags: int, ledger: int, entry: int, parts: list, cb: Callback,
                ctx: Any, timeout: float) -> None:
        """Send a request; cb(ctx, status, body) runs exactly once, later (never inside this call)."""
        fault = self.pool.fault
        if fault is not None:
            act = fault(self.addr, op, flags, ledger, entry)
            if isinstance(act, Answer):
                self.pool.loop.call_later(max(0.0, act.delay), cb, ctx, act.status, b"")
                return
            if act == DROP:
                self._rid += 1      # lost on the way: only its timeout (or a lost connection) answers
                self.pending[self._rid] = (cb, ctx, self.pool.loop.time(), timeout)
                return
            if act:
                self.pool.loop.call_later(float(act), self._send, op, flags, ledger, entry, parts,
                                          cb, ctx, timeout)
                return
        self._send(op, flags, ledger, entry, parts, cb, ctx, timeout)

    def _send(self, op: int, flags: int, ledger: int, entry: int, parts: list, cb: Callback,
              ctx: Any, timeout: float) -> None:
        loop = self.pool.loop
        if self.closed:
            loop.call_soon(cb, ctx, P.CONNECTION_LOST, b"")
            return
        self._rid += 1
        rid = self._rid
        size = P.HEADER_SIZE
        for p in parts:
            size += len(p)
        head = P.FRAME_HEADER.pack(size, op, flags, P.VERSION, rid, ledger, entry)
        self.pending[rid] = (cb, ctx, loop.time(), timeout)
        self._out.append(head)
        self._out.extend(parts)
        if self._conn is not None:
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
        elif self._connecting is None:
            self._connecting = loop.create_task(self._connect())

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._conn is None or not self._out:
            return
        out, self._out = self._out, []
        self._conn.transport.writelines(out)

    async def _connect(self) -> None:
        loop = self.pool.loop
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self), self.host, self.port),
                CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as e:
            log.debug("connecting to bookie %s: %r", self.addr, e)
            self._connecting = None
            self._out = []
            self._fail_all(P.CONNECTION_LOST)
            return
        except asyncio.CancelledError:
            self._connecting = None
            raise
        self._connecting = None
        if self.closed:
            conn.transport.close()
            return
        if conn.lost:   # closed again before we got to use it
            self._out = []
            self._fail_all(P.CONNECTION_LOST)
            return
        self._conn = conn
        self._flush()

    def _lost(self, conn: _Conn, exc) -> None:
        if conn is not self._conn:
            return
        self._conn = None
        self._out = []
        if exc is not None:
            log.info("connection to bookie %s lost: %r", self.addr, exc)
        self._fail_all(P.CONNECTION_LOST)

    def _fail_all(self, status: int) -> None:
        pending, self.pending = self.pending, {}
        for cb, ctx, _, _ in pending.values():
            try:
                cb(ctx, status, b"")
            except Exception:
                log.exception("bookie failure callback failed")

    def sweep(self, now: float, min_timeout: float) -> None:
        """Complete timed-out requests with TIMEOUT (requests are in issue order)."""
        expired = []
        horizon = now - min_timeout
        for rid, (cb, ctx, issued, timeout) in self.pending.items():
            if issued > horizon:
                break
            if now - issued >= timeout:
                expired.append(rid)
        for rid in expired:
            req = self.pending.pop(rid, None)
            if req is not None:
                try:
                    req[0](req[1], P.TIMEOUT, b"")
                except Exception:
                    log.exception("bookie timeout callback failed")

    def close(self) -> None:
        self.closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.close()
        self._fail_all(P.CONNECTION_LOST)


class ChannelPool:
    """All connections of one BookKeeper client."""

    def __init__(self, loop: asyncio.AbstractEventLoop, min_timeout: float):
        self.loop = loop
        self.min_timeout = max(0.05, min_timeout)
        self.channels: dict[str, BookieChannel] = {}
        self._sweeper: asyncio.Task | None = None
        self.fault: RequestFault | None = None      # targeted request faults (module docstring)

    def start(self) -> None:
        self._sweeper = self.loop.create_task(self._sweep_loop(), name="bk-timeouts")

    def channel(self, addr: str) -> BookieChannel:
        ch = self.channels.get(addr)
        if ch is None:
            ch = self.channels[addr] = BookieChannel(self, addr)
        return ch

    async def _sweep_loop(self) -> None:
        interval = min(0.25, self.min_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            now = self.loop.time()
            for ch in list(self.channels.values()):
                if ch.pending:
                    ch.sweep(now, self.min_timeout)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
