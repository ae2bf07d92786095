"""The broker's own Pulsar client (asyncio, runs on the broker's uvloop): what a broker needs to read
and write topics itself, as Pulsar's brokers use their PulsarClient for system topics (the extensible
load manager's `persistent://pulsar/system/loadbalancer-service-unit-state` and
`non-persistent://pulsar/system/loadbalancer-broker-load-data`).

    client = PulsarClient("pulsar://10.0.0.2:6650")
    producer = await client.create_producer(topic)
    mid = await producer.send(b"payload", key="k")          # MessageId(ledger, entry, partition, batch)
    reader = await client.create_reader(topic, start="earliest")
    async for mid, key, payload in reader: ...               # or: await reader.read_next(timeout)
    last = await reader.last_message_id()                   # GET_LAST_MESSAGE_ID
    await client.close()

What it does, over clusters/protocol/frames.py and PulsarApi_pb2:
- connect + handshake (CONNECT/CONNECTED), PING answered; one connection per broker, shared. Keep-alive
  as the official client's keepAliveIntervalSeconds: a connection silent for `keepalive_interval` is
  PINGed; silent for twice that, it is closed as lost (a crashed broker, or a partition, sends no FIN),
  and its producers and readers reconnect.
- lookup (LOOKUP) from the service URL, following Redirect answers (with the authoritative flag the
  answer carries) to the owner, at most MAX_LOOKUP_REDIRECTS hops; Failed with a retriable error
  (ServiceNotReady, TooManyRequests) is retried with backoff within the operation timeout.
- producer: non-batched sends with an optional key (partition_key); `send` awaits the receipt's
  message id, bounded by `send_timeout`. On CLOSE_PRODUCER or a broken connection it looks the topic
  up again, re-creates the producer under the same name and resends every unacknowledged message in
  order (as the official client's resendMessages); sequence ids continue after PRODUCER_SUCCESS's
  last_sequence_id. A refusal that is not retriable (NotAllowedError, ProducerFenced, ...) fails
  creation, or the pending sends.
- reader: a non-durable Exclusive subscription from `earliest` or `latest`; flow control (FLOW:
  `receiver_queue_size` permits, topped up as messages are taken); `read_next()` and `async for`
  give (MessageId, key, payload). Batched entries written by other clients are read when they are
  uncompressed (one message per batch index); a compressed entry raises UnsupportedMessage. On
  CLOSE_CONSUMER or a broken connection it looks the topic up again and subscribes from the last
  message it received (the broker starts there inclusively; what is not after it is dropped), so it
  goes on after an unload at the new owner without gaps or repeats. On a non-persistent topic there
  is nothing to resume from: it resubscribes and gets what is published from then on.
- Not done: partitioned topics, schemas, acknowledgements (readers need none), batching and
  compression on the producer side, TLS and authentication.

Every wait is bounded: connecting (`connect_timeout`), every request (`operation_timeout`), sends
(`send_timeout`), reconnecting (`reconnect_timeout`: after that the producer or reader fails with
the last error). Errors are PulsarClientError subclasses with one clear line: ServerError (the
broker's code name and message), ProtocolViolation (a malformed answer: the connection is closed;
a MESSAGE whose payload is malformed or fails its checksum fails the reader instead: `read_next`
raises it after the messages before it), ClientTimeout, ConnectionClosed, UnsupportedMessage.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import deque
from typing import Any, NamedTuple

from clusters.protocol import PulsarApi_pb2 as pb
from clusters.protocol import frames

log = logging.getLogger(__name__)

T = pb.BaseCommand
CLIENT_VERSION = "pulsar-chaos-broker-client"
PROTOCOL_VERSION = 20
MAX_LOOKUP_REDIRECTS = 20                 # Pulsar's client: maxLookupRedirects
RETRIABLE = {pb.ServiceNotReady, pb.TooManyRequests, pb.PersistenceError, pb.UnknownError}
INT64_MAX = (1 << 63) - 1
EARLIEST = (-1, -1)
LATEST = (INT64_MAX, INT64_MAX)


class PulsarClientError(Exception):
    pass


class ServerError(PulsarClientError):
    def __init__(self, code: int, message: str, what: str = ""):
        self.code = code
        self.code_name = pb.ServerError.Name(code) if code in pb.ServerError.values() else str(code)
        super().__init__(f"{what + ': ' if what else ''}{self.code_name}: {message}")

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE


class ProtocolViolation(PulsarClientError):
    """The broker answered something that is not valid Pulsar protocol (or not a valid answer)."""


class ClientTimeout(PulsarClientError):
    pass


class ConnectionClosed(PulsarClientError):
    pass


class UnsupportedMessage(PulsarClientError):
    pass


class MessageId(NamedTuple):
    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1

    def key(self) -> tuple[int, int, int]:
        return self.ledger_id, self.entry_id, self.batch_index


def _parse_url(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[1] if "://" in url else url
    rest = rest.split(",", 1)[0].rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise PulsarClientError(f"invalid service URL {url!r}: expected pulsar://host:port")
    return host, int(port)


async def _bounded(coro: Any, timeout: float, what: str) -> Any:
    """`coro`'s result, or ClientTimeout after `timeout` s: the attempt is cancelled and abandoned, not
    awaited (whatever it waits for, the caller goes on); where it was stuck is logged."""
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()                  # the caller gave up (a close): so does the attempt
        raise
    if not done:
        stack = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(task.get_stack(limit=8)))
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())      # retrieved: no warning
        log.warning("%s: no outcome within %.1f s, abandoned (at %s)", what, timeout, stack or "?")
        raise ClientTimeout(f"{what}: no outcome within {timeout:.1f} s")
    return task.result()


def _close_abandoned(attempt: "asyncio.Future") -> None:
    """A connect given up at its timeout that completed after all: close what it opened."""
    if attempt.cancelled() or attempt.exception() is not None:
        return
    _, writer = attempt.result()
    writer.close()


class _Connection:
    """One TCP connection to a broker: requests matched to answers by request id, and the producers
    and consumers registered on it fed their receipts and messages."""

    def __init__(self, client: "PulsarClient", host: str, port: int):
        self.client = client
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.decoder = frames.FrameDecoder()
        self.pending: dict[int, tuple[asyncio.Future, str]] = {}
        self.producers: dict[int, "Producer"] = {}
        self.consumers: dict[int, "Reader"] = {}
        self.closed = False
        self.error: PulsarClientError | None = None
        self.max_message_size = frames.DEFAULT_MAX_MESSAGE_SIZE
        self._task: asyncio.Task | None = None
        self._keepalive: asyncio.Task | None = None
        self.last_read = time.monotonic()
        self._backlog: list[tuple[pb.BaseCommand, bytes | None]] = []   # frames read with CONNECTED

    def __repr__(self) -> str:
        return f"_Connection({self.host}:{self.port})"

    async def open(self) -> None:
        timeout = self.client.connect_timeout
        # not wait_for: a connect to an address that stopped answering (a crashed host) can outlive its
        # cancellation by the kernel's SYN retries; the attempt is abandoned at the timeout instead
        attempt = asyncio.ensure_future(asyncio.open_connection(self.host, self.port))
        done, _ = await asyncio.wait({attempt}, timeout=timeout)
        if not done:
            attempt.cancel()
            attempt.add_done_callback(_close_abandoned)
            raise ClientTimeout(f"connecting to {self.host}:{self.port}: no answer within {timeout} s")
        try:
            self.reader, self.writer = attempt.result()
        except OSError as e:
            raise ConnectionClosed(f"connecting to {self.host}:{self.port}: {e}") from None
        c = T(type=T.CONNECT)
        c.connect.client_version = CLIENT_VERSION
        c.connect.protocol_version = PROTOCOL_VERSION
        self.writer.write(frames.encode_command(c))
        try:
            cmd = await asyncio.wait_for(self._first_command(), timeout)
        except asyncio.TimeoutError:
            self._shutdown(ClientTimeout(f"{self.host}:{self.port}: no CONNECTED within {timeout} s"))
            raise self.error from None  # type: ignore[misc]
        except PulsarClientError as e:
            self._shutdown(e)
            raise
        except OSError as e:               # reset during the handshake (a broker going down)
            self._shutdown(ConnectionClosed(f"{self.host}:{self.port}: connection lost during the handshake: {e}"))
            raise self.error from None  # type: ignore[misc]
        if cmd.type == T.ERROR:
            e = ServerError(cmd.error.error, cmd.error.message, f"handshake with {self.host}:{self.port}")
            self._shutdown(e)
            raise e
        if cmd.type != T.CONNECTED:
            e = ProtocolViolation(f"{self.host}:{self.port} answered CONNECT with {T.Type.Name(cmd.type)}")
            self._shutdown(e)
            raise e
        if cmd.connected.HasField("max_message_size"):
            self.max_message_size = cmd.connected.max_message_size
        self.last_read = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._read_loop())
        if self.client.keepalive_interval > 0:
            self._keepalive = asyncio.get_running_loop().create_task(self._keepalive_loop())

    async def _keepalive_loop(self) -> None:
        interval = self.client.keepalive_interval
        ping = T(type=T.PING)
        ping.ping.SetInParent()
        while not self.closed:
            await asyncio.sleep(interval / 2)
            silent = time.monotonic() - self.last_read
            if silent > 2 * interval:
                self._shutdown(ConnectionClosed(f"connection to {self.host}:{self.port} lost: nothing received "
                                                f"for {silent:.1f} s (keep-alive {interval} s)"))
                return
            if silent > interval:
                try:
                    self._write(frames.encode_command(ping))
                except ConnectionClosed:
                    return

    async def _first_command(self) -> pb.BaseCommand:
        assert self.reader is not None
        while True:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionClosed(f"{self.host}:{self.port} closed the connection during the handshake")
            try:
                got = list(self.decoder.feed(data))
            except frames.ProtocolError as e:
                raise ProtocolViolation(f"malformed answer from {self.host}:{self.port}: {e}") from None
            if got:
                if len(got) > 1:
                    self._backlog = got[1:]
                return got[0][0]

    async def _read_loop(self) -> None:
        assert self.reader is not None
        err: PulsarClientError = ConnectionClosed(f"connection to {self.host}:{self.port} closed")
        try:
            for cmd, payload in self._backlog:
                self._dispatch(cmd, payload)
            while True:
                data = await self.reader.read(262144)
                if not data:
                    break
                self.last_read = time.monotonic()
                for cmd, payload in self.decoder.feed(data):
                    self._dispatch(cmd, payload)
        except frames.ProtocolError as e:
            err = ProtocolViolation(f"malformed answer from {self.host}:{self.port}: {e}")
            log.warning("%s", err)
        except ProtocolViolation as e:
            err = e
            log.warning("%s", err)
        except (ConnectionError, OSError) as e:
            err = ConnectionClosed(f"connection to {self.host}:{self.port} lost: {e}")
        except asyncio.CancelledError:
            pass
        self._shutdown(err)

    def _dispatch(self, cmd: pb.BaseCommand, payload: bytes | None) -> None:
        t = cmd.type
        if t == T.MESSAGE:
            if payload is None:
                raise ProtocolViolation(f"MESSAGE without a payload from {self.host}:{self.port}")
            r = self.consumers.get(cmd.message.consumer_id)
            if r is not None:
                r._on_message(self, cmd.message, payload)
            return
        if t == T.SEND_RECEIPT:
            p = self.producers.get(cmd.send_receipt.producer_id)
            if p is not None:
                p._on_receipt(self, cmd.send_receipt)
            return
        if t == T.SEND_ERROR:
            p = self.producers.get(cmd.send_error.producer_id)
            if p is not None:
                p._on_send_error(self, cmd.send_error)
            return
        if t == T.PING:
            pong = T(type=T.PONG)
            pong.pong.SetInParent()
            self._write(frames.encode_command(pong))
            return
        if t in (T.PONG, T.ACTIVE_CONSUMER_CHANGE, T.REACHED_END_OF_TOPIC):
            return
        if t == T.CLOSE_PRODUCER:
            p = self.producers.pop(cmd.close_producer.producer_id, None)
            if p is not None:
                p._disconnected(self, "the broker closed the producer (CLOSE_PRODUCER)")
            return
        if t == T.CLOSE_CONSUMER:
            r = self.consumers.pop(cmd.close_consumer.consumer_id, None)
            if r is not None:
                r._disconnected(self, "the broker closed the consumer (CLOSE_CONSUMER)")
            return
        field = {T.SUCCESS: "success", T.ERROR: "error", T.PRODUCER_SUCCESS: "producer_success",
                 T.LOOKUP_RESPONSE: "lookupTopicResponse",
                 T.PARTITIONED_METADATA_RESPONSE: "partitionMetadataResponse",
                 T.GET_LAST_MESSAGE_ID_RESPONSE: "getLastMessageIdResponse"}.get(t)
        if field is None:
            raise ProtocolViolation(f"unexpected {T.Type.Name(t)} from {self.host}:{self.port}")
        if not cmd.HasField(field):
            raise ProtocolViolation(f"{T.Type.Name(t)} from {self.host}:{self.port} lacks its {field} body")
        body = getattr(cmd, field)
        waiter = self.pending.pop(body.request_id, None)
        if waiter is None:
            log.debug("%s: answer to an unknown or expired request %d", self, body.request_id)
            return
        fut, what = waiter
        if fut.done():
            return
        if t == T.ERROR:
            fut.set_exception(ServerError(body.error, body.message, what))
        else:
            fut.set_result(cmd)

    def _write(self, data: bytes) -> None:
        if self.closed or self.writer is None:
            raise ConnectionClosed(f"connection to {self.host}:{self.port} is closed")
        self.writer.write(data)

    async def request(self, cmd: pb.BaseCommand, request_id: int, what: str,
                      timeout: float | None = None) -> pb.BaseCommand:
        if self.closed:
            raise self.error or ConnectionClosed(f"connection to {self.host}:{self.port} is closed")
        timeout = self.client.operation_timeout if timeout is None else timeout
        fut = asyncio.get_running_loop().create_future()
        self.pending[request_id] = (fut, what)
        try:
            self._write(frames.encode_command(cmd))
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise ClientTimeout(f"{what}: no answer from {self.host}:{self.port} within {timeout} s") from None
        finally:
            self.pending.pop(request_id, None)

    def _shutdown(self, err: PulsarClientError) -> None:
        if self.closed:
            return
        self.closed = True
        self.error = err
        if self._keepalive is not None and self._keepalive is not asyncio.current_task():
            self._keepalive.cancel()
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001
                pass
        for fut, what in list(self.pending.values()):
            if not fut.done():
                fut.set_exception(type(err)(f"{what}: {err}"))
        self.pending.clear()
        for p in list(self.producers.values()):
            p._disconnected(self, str(err))
        for r in list(self.consumers.values()):
            r._disconnected(self, str(err))
        self.producers.clear()
        self.consumers.clear()
        self.client._forget(self)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: BLE001
                pass
        self._shutdown(ConnectionClosed(f"connection to {self.host}:{self.port} closed by the client"))


class PulsarClient:
    def __init__(self, service_url: str, *, operation_timeout: float = 30.0, connect_timeout: float = 5.0,
                 reconnect_timeout: float = 60.0, keepalive_interval: float = 30.0):
        self.service_url = service_url
        self.keepalive_interval = keepalive_interval      # keepAliveIntervalSeconds; 0: none
        # one attempt to attach a producer or reader: a lookup, a connection, the request
        self.attempt_timeout = 2 * operation_timeout + 2 * connect_timeout
        self.service = _parse_url(service_url)
        self.operation_timeout = operation_timeout
        self.connect_timeout = connect_timeout
        self.reconnect_timeout = reconnect_timeout
        self._conns: dict[tuple[str, int], _Connection] = {}
        self._opening: dict[tuple[str, int], asyncio.Task] = {}
        self._ids = itertools.count()
        self._handles: set[Any] = set()
        self.closed = False

    def next_id(self) -> int:
        return next(self._ids)

    async def connection(self, host: str, port: int) -> _Connection:
        if self.closed:
            raise PulsarClientError("the client is closed")
        key = (host, port)
        c = self._conns.get(key)
        if c is not None and not c.closed:
            return c
        task = self._opening.get(key)
        if task is None:
            async def open_() -> _Connection:
                conn = _Connection(self, host, port)
                await conn.open()
                self._conns[key] = conn
                return conn
            task = asyncio.get_running_loop().create_task(open_())
            self._opening[key] = task
            task.add_done_callback(lambda _t: self._opening.pop(key, None))
        return await asyncio.shield(task)

    def _forget(self, conn: _Connection) -> None:
        if self._conns.get((conn.host, conn.port)) is conn:
            del self._conns[(conn.host, conn.port)]

    async def lookup(self, topic: str) -> tuple[str, int]:
        """The owner of `topic` (host, port): LOOKUP at the service URL, following redirects."""
        deadline = time.monotonic() + self.operation_timeout
        delay = 0.1
        while True:
            try:
                return await self._lookup_once(topic, deadline)
            except OSError as e:
                last_os = ConnectionClosed(f"lookup of {topic}: {type(e).__name__}: {e}")
                if time.monotonic() + delay > deadline:
                    raise last_os from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            except (ServerError, ConnectionClosed, ClientTimeout) as e:
                if isinstance(e, ServerError) and not e.retriable:
                    raise
                if time.monotonic() + delay > deadline:
                    raise ClientTimeout(f"lookup of {topic}: no owner within {self.operation_timeout} s; "
                                        f"last error: {e}") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _lookup_once(self, topic: str, deadline: float) -> tuple[str, int]:
        host, port = self.service
        authoritative = False
        R = pb.CommandLookupTopicResponse
        for _ in range(MAX_LOOKUP_REDIRECTS):
            conn = await self.connection(host, port)
            rid = self.next_id()
            cmd = T(type=T.LOOKUP)
            cmd.lookupTopic.topic = topic
            cmd.lookupTopic.request_id = rid
            cmd.lookupTopic.authoritative = authoritative
            left = max(0.1, deadline - time.monotonic())
            got = (await conn.request(cmd, rid, f"lookup of {topic}", min(left, self.operation_timeout))
                   ).lookupTopicResponse
            if not got.HasField("response"):
                raise ProtocolViolation(f"lookup of {topic}: answer from {host}:{port} without a response type")
            if got.response == R.Failed:
                raise ServerError(got.error, got.message, f"lookup of {topic}")
            if not got.brokerServiceUrl:
                raise ProtocolViolation(f"lookup of {topic}: {R.LookupType.Name(got.response)} answer "
                                        f"from {host}:{port} without a brokerServiceUrl")
            target = _parse_url(got.brokerServiceUrl)
            if got.response == R.Connect:
                return self.service if got.proxy_through_service_url else target
            host, port = target
            authoritative = got.authoritative
        raise ServerError(pb.ServiceNotReady, f"more than {MAX_LOOKUP_REDIRECTS} redirects", f"lookup of {topic}")

    async def create_producer(self, topic: str, *, name: str | None = None,
                              send_timeout: float = 30.0) -> "Producer":
        p = Producer(self, topic, name, send_timeout)
        await _bounded(p._connect(first=True), self.attempt_timeout, f"creating a producer on {topic}")
        self._handles.add(p)
        return p

    async def create_reader(self, topic: str, *, start: str = "earliest",
                            receiver_queue_size: int = 1000) -> "Reader":
        if start not in ("earliest", "latest"):
            raise PulsarClientError(f"invalid reader start {start!r}: 'earliest' or 'latest'")
        if receiver_queue_size < 1:
            raise PulsarClientError(f"invalid receiver_queue_size {receiver_queue_size}: at least 1")
        r = Reader(self, topic, start, receiver_queue_size)
        await _bounded(r._connect(first=True), self.attempt_timeout, f"creating a reader on {topic}")
        self._handles.add(r)
        return r

    async def close(self) -> None:
        for h in list(self._handles):
            try:
                await h.close()
            except Exception:  # noqa: BLE001
                pass
        self.closed = True
        for c in list(self._conns.values()):
            await c.close()


class _Handle:
    """What producers and readers share: the connection they are on and getting back to one."""

    def __init__(self, client: PulsarClient, topic: str):
        self.client = client
        self.topic = topic
        self.id = client.next_id()
        self.conn: _Connection | None = None
        self.closed = False
        self.failed: PulsarClientError | None = None
        self._reconnect: asyncio.Task | None = None
        self.reconnects = 0             # times it got back after a disconnect

    def _disconnected(self, conn: _Connection, why: str) -> None:
        if conn is not self.conn or self.closed:
            return
        self.conn = None
        log.info("%s: disconnected (%s); reconnecting", self, why)
        if self._reconnect is None or self._reconnect.done():
            self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop(why))

    async def _reconnect_loop(self, why: str) -> None:
        deadline = time.monotonic() + self.client.reconnect_timeout
        delay = 0.1
        last: Exception | str = why
        attempt = 0
        while not self.closed and self.conn is None:
            attempt += 1
            started = time.monotonic()
            try:
                await _bounded(self._connect(first=False), self.client.attempt_timeout, f"{self}: reconnecting")
                self.reconnects += 1
                log.info("%s: reconnected (attempt %d)", self, attempt)
                return
            except ServerError as e:
                last = e
                if not e.retriable:
                    break
            except PulsarClientError as e:
                last = e
            except Exception as e:  # noqa: BLE001 - whatever an attempt raises, the loop goes on
                last = ConnectionClosed(f"{type(e).__name__}: {e}")
            log.info("%s: reconnect attempt %d failed after %.1f s: %s", self, attempt, time.monotonic() - started,
                     last)
            if time.monotonic() + delay > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        if not self.closed and self.conn is None:
            self._fail(PulsarClientError(f"{self}: could not reconnect within {self.client.reconnect_timeout} s: "
                                         f"{last}"))

    async def _connect(self, first: bool) -> None:
        raise NotImplementedError

    def _fail(self, err: PulsarClientError) -> None:
        self.failed = err
        log.warning("%s", err)


class Producer(_Handle):
    def __init__(self, client: PulsarClient, topic: str, name: str | None, send_timeout: float):
        super().__init__(client, topic)
        self.name = name
        self._user_named = bool(name)
        self.send_timeout = send_timeout
        self.epoch = 0
        self._seq = 0
        self._pending: dict[int, tuple[bytes, asyncio.Future]] = {}    # seq -> (SEND frame, receipt)

    def __repr__(self) -> str:
        return f"Producer({self.name}, {self.topic})"

    async def _connect(self, first: bool) -> None:
        host, port = await self.client.lookup(self.topic)
        conn = await self.client.connection(host, port)
        rid = self.client.next_id()
        cmd = T(type=T.PRODUCER)
        p = cmd.producer
        p.topic = self.topic
        p.producer_id = self.id
        p.request_id = rid
        p.epoch = self.epoch
        if self.name:      # a reconnect sends the name the broker gave (Pulsar's client does)
            p.producer_name = self.name
            p.user_provided_producer_name = self._user_named
        conn.producers[self.id] = self
        try:
            got = await conn.request(cmd, rid, f"creating a producer on {self.topic}")
        except BaseException:
            conn.producers.pop(self.id, None)
            raise
        if got.type != T.PRODUCER_SUCCESS:
            conn.producers.pop(self.id, None)
            raise ProtocolViolation(f"creating a producer on {self.topic}: answered {T.Type.Name(got.type)}")
        s = got.producer_success
        if not s.producer_ready:
            conn.producers.pop(self.id, None)
            raise ServerError(pb.ServiceNotReady, "the producer is queued for exclusive access (not supported)")
        self.name = s.producer_name
        self.epoch += 1
        if s.last_sequence_id >= self._seq:
            self._seq = s.last_sequence_id + 1
        self.conn = conn
        for seq, (frame, fut) in sorted(self._pending.items()):    # resend, in order
            if not fut.done():
                conn._write(frame)
        log.debug("%s: connected to %s:%d (%d resent)", self, host, port, len(self._pending))

    async def send(self, payload: bytes, key: str | None = None) -> MessageId:
        """Publish one message; returns its id once the broker's receipt arrives."""
        if self.closed:
            raise PulsarClientError(f"{self} is closed")
        if self.failed is not None:
            raise self.failed
        seq = self._seq
        self._seq += 1
        md = pb.MessageMetadata(producer_name=self.name or "", sequence_id=seq,
                                publish_time=int(time.time() * 1000))
        if key is not None:
            md.partition_key = key
        frame = frames.encode_send(self.id, seq, md, payload)
        fut = asyncio.get_running_loop().create_future()
        self._pending[seq] = (frame, fut)
        if self.conn is not None and not self.conn.closed:
            try:
                self.conn._write(frame)
            except ConnectionClosed:
                pass                 # resent after the reconnect
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.send_timeout)
        except asyncio.TimeoutError:
            raise ClientTimeout(f"{self}: message {seq} not acknowledged within {self.send_timeout} s"
                                + (f" ({self.failed})" if self.failed else "")) from None
        finally:
            self._pending.pop(seq, None)

    def _on_receipt(self, conn: _Connection, r: pb.CommandSendReceipt) -> None:
        got = self._pending.get(r.sequence_id)
        if got is None or got[1].done():
            return                     # a receipt for a message already timed out (or a duplicate)
        m = r.message_id
        got[1].set_result(MessageId(frames.to_signed64(m.ledgerId), frames.to_signed64(m.entryId),
                                    m.partition, m.batch_index))

    def _on_send_error(self, conn: _Connection, e: pb.CommandSendError) -> None:
        if e.error == pb.ChecksumError:
            got = self._pending.get(e.sequence_id)
            if got is not None and not got[1].done():
                got[1].set_exception(ServerError(e.error, e.message, f"{self}: message {e.sequence_id}"))
            return
        # the broker refused a write (e.g. a failed bookie write): reconnect and resend, as the
        # official client does on a SendError
        conn.producers.pop(self.id, None)
        self._disconnected(conn, f"send error {pb.ServerError.Name(e.error)}: {e.message}")

    def _fail(self, err: PulsarClientError) -> None:
        super()._fail(err)
        for _, fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.client._handles.discard(self)
        if self._reconnect is not None:
            self._reconnect.cancel()
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            conn.producers.pop(self.id, None)
            rid = self.client.next_id()
            cmd = T(type=T.CLOSE_PRODUCER)
            cmd.close_producer.producer_id = self.id
            cmd.close_producer.request_id = rid
            try:
                await conn.request(cmd, rid, f"closing {self}", min(5.0, self.client.operation_timeout))
            except PulsarClientError:
                pass
        for _, fut in self._pending.values():
            if not fut.done():
                fut.set_exception(PulsarClientError(f"{self} closed before the receipt"))


class Reader(_Handle):
    def __init__(self, client: PulsarClient, topic: str, start: str, receiver_queue_size: int):
        super().__init__(client, topic)
        self.start = start
        self.queue_size = receiver_queue_size
        self.subscription = f"reader-{uuid.uuid4().hex[:10]}"
        self.non_persistent = topic.startswith("non-persistent://")
        self._queue: deque[tuple[MessageId, str | None, bytes]] = deque()
        self._last: tuple[int, int, int] | None = None     # the last message received (resume point)
        self._error: PulsarClientError | None = None
        self._wakeup = asyncio.Event()
        self._taken = 0

    def __repr__(self) -> str:
        return f"Reader({self.subscription}, {self.topic})"

    async def _connect(self, first: bool) -> None:
        host, port = await self.client.lookup(self.topic)
        conn = await self.client.connection(host, port)
        rid = self.client.next_id()
        cmd = T(type=T.SUBSCRIBE)
        s = cmd.subscribe
        s.topic = self.topic
        s.subscription = self.subscription
        s.subType = pb.CommandSubscribe.Exclusive
        s.consumer_id = self.id
        s.request_id = rid
        s.consumer_name = self.subscription
        s.durable = False
        if self._last is not None and not self.non_persistent:
            ledger, entry, _ = self._last
        else:
            ledger, entry = EARLIEST if self.start == "earliest" else LATEST
        s.start_message_id.ledgerId = frames.to_unsigned64(ledger)
        s.start_message_id.entryId = frames.to_unsigned64(entry)
        s.initialPosition = (pb.CommandSubscribe.Earliest if self.start == "earliest"
                             else pb.CommandSubscribe.Latest)
        conn.consumers[self.id] = self
        try:
            got = await conn.request(cmd, rid, f"subscribing to {self.topic}")
        except BaseException:
            conn.consumers.pop(self.id, None)
            raise
        if got.type != T.SUCCESS:
            conn.consumers.pop(self.id, None)
            raise ProtocolViolation(f"subscribing to {self.topic}: answered {T.Type.Name(got.type)}")
        self.conn = conn
        self._taken = 0
        self._flow(max(0, self.queue_size - len(self._queue)) or 1)

    def _flow(self, permits: int) -> None:
        if self.conn is None or permits <= 0:
            return
        cmd = T(type=T.FLOW)
        cmd.flow.consumer_id = self.id
        cmd.flow.messagePermits = permits
        try:
            self.conn._write(frames.encode_command(cmd))
        except ConnectionClosed:
            pass

    def _on_message(self, conn: _Connection, m: pb.CommandMessage, section: bytes) -> None:
        """A MESSAGE whose payload cannot be read fails the reader (read_next raises it): reading on
        would skip it silently, and reconnecting would only get it again."""
        if self._error is not None:
            return
        try:
            self._take(m, section)
        except PulsarClientError as e:
            self._error = e
            log.warning("%s", e)
            self._wakeup.set()

    def _take(self, m: pb.CommandMessage, section: bytes) -> None:
        try:
            info = frames.parse_payload(section)
        except frames.ProtocolError as e:
            raise ProtocolViolation(f"{self}: malformed MESSAGE payload: {e}") from None
        if info.checksum_ok is False:
            raise ProtocolViolation(f"{self}: MESSAGE payload checksum mismatch")
        md = info.metadata
        ledger, entry = frames.to_signed64(m.message_id.ledgerId), frames.to_signed64(m.message_id.entryId)
        partition = m.message_id.partition
        payload = section[info.payload_offset:]
        if md.compression != pb.NONE:
            raise UnsupportedMessage(
                f"{self}: entry ({ledger}, {entry}) is compressed with {pb.CompressionType.Name(md.compression)}; "
                "this client reads uncompressed messages only")
        if md.HasField("num_messages_in_batch"):
            try:
                parts = frames.split_batch(payload, md.num_messages_in_batch)
            except frames.ProtocolError as e:
                raise ProtocolViolation(f"{self}: malformed batch ({ledger}, {entry}): {e}") from None
            items = [(MessageId(ledger, entry, partition, i),
                      smm.partition_key if smm.HasField("partition_key") else None, bytes(data))
                     for i, (smm, data) in enumerate(parts)]
        else:
            items = [(MessageId(ledger, entry, partition, -1),
                      md.partition_key if md.HasField("partition_key") else None, bytes(payload))]
        for item in items:
            k = item[0].key()
            if not self.non_persistent and self._last is not None and k <= self._last:
                continue           # before the resume point (the broker starts inclusively)
            if not self.non_persistent:
                self._last = k
            self._queue.append(item)
        self._wakeup.set()

    async def read_next(self, timeout: float | None = None) -> tuple[MessageId, str | None, bytes]:
        """The next message (id, key, payload); ClientTimeout when none arrives within `timeout`
        (default: the client's operation timeout)."""
        timeout = self.client.operation_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self._queue:
            if self._error is not None:        # after the messages before the bad one
                raise self._error
            if self.failed is not None:
                raise self.failed
            if self.closed:
                raise PulsarClientError(f"{self} is closed")
            self._wakeup.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientTimeout(f"{self}: no message within {timeout} s")
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except asyncio.TimeoutError:
                pass
        item = self._queue.popleft()
        self._taken += 1
        if self._taken >= max(1, self.queue_size // 2):      # top up the permits, as the official client
            self._flow(self._taken)
            self._taken = 0
        return item

    async def last_message_id(self) -> MessageId:
        """GET_LAST_MESSAGE_ID: the id of the topic's last message now ((ledger, -1) or below when it
        has none)."""
        conn = self.conn
        if conn is None or conn.closed:
            raise ConnectionClosed(f"{self}: not connected")
        rid = self.client.next_id()
        cmd = T(type=T.GET_LAST_MESSAGE_ID)
        cmd.getLastMessageId.consumer_id = self.id
        cmd.getLastMessageId.request_id = rid
        got = (await conn.request(cmd, rid, f"the last message id of {self.topic}")).getLastMessageIdResponse
        m = got.last_message_id
        return MessageId(frames.to_signed64(m.ledgerId), frames.to_signed64(m.entryId), m.partition,
                         m.batch_index if m.HasField("batch_index") else -1)

    def __aiter__(self) -> "Reader":
        return self

    async def __anext__(self) -> tuple[MessageId, str | None, bytes]:
        """The next message; the iteration ends when the reader is closed or nothing arrives within
        the client's operation timeout (errors other than that timeout are raised)."""
        if self.closed and not self._queue:
            raise StopAsyncIteration
        try:
            return await self.read_next()
        except ClientTimeout:
            raise StopAsyncIteration from None

    def _fail(self, err: PulsarClientError) -> None:
        super()._fail(err)
        self._wakeup.set()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.client._handles.discard(self)
        self._wakeup.set()
        if self._reconnect is not None:
            self._reconnect.cancel()
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            conn.consumers.pop(self.id, None)
            rid = self.client.next_id()
            cmd = T(type=T.CLOSE_CONSUMER)
            cmd.close_consumer.consumer_id = self.id
            cmd.close_consumer.request_id = rid
            try:
                await conn.request(cmd, rid, f"closing {self}", min(5.0, self.client.operation_timeout))
            except PulsarClientError:
                pass


__all__ = ["PulsarClient", "Producer", "Reader", "MessageId", "PulsarClientError", "ServerError",
           "ProtocolViolation", "ClientTimeout", "ConnectionClosed", "UnsupportedMessage"]
