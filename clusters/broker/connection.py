"""The broker's side of a client connection (ServerCnx): the Pulsar binary protocol over asyncio.

One `ServerCnx` per TCP connection. It decodes frames, answers the handshake, lookups and keep-alive
itself, and hands producers, consumers, sends and acks to the Topic. Writes are queued and flushed
once per event-loop iteration (one writev for many frames); SENDs are never awaited per frame.
A malformed frame, an oversized frame or an unknown command closes that connection only.

Entry point for the broker service: `await serve_connections(service, host, port)`.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any

from clusters.broker import schema as schemas
from clusters.broker.managed_ledger import Position
from clusters.broker.selectors import partition_index
from clusters.broker.topic import SUB_TYPE_NAMES, BrokerServiceError, Consumer, Producer
from clusters.protocol import frames
from clusters.protocol import PulsarApi_pb2 as pb

log = logging.getLogger(__name__)

SERVER_VERSION = "Pulsar-Chaos-Broker-0.1"
MAX_PROTOCOL_VERSION = 20
KEEPALIVE_INTERVAL = 30.0           # seconds of silence before the broker pings (Java: 30)
MAX_PENDING_SENDS = 1000            # per connection; reading pauses above it (Java's default)
NO_REQUEST = (1 << 64) - 1          # request_id of broker-initiated closes (Java uses -1)

T = pb.BaseCommand
_SEND = T.SEND

_boot = int(time.time() * 1000) & 0xFFFFFF
_producer_names = itertools.count()


class _Pending:
    """A producer or consumer whose creation is in progress on this connection."""
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False


def _cmd(type_: int) -> pb.BaseCommand:
    return pb.BaseCommand(type=type_)


class ServerCnx(asyncio.Protocol):
    """One client connection."""

    def __init__(self, service: Any, *, keepalive_interval: float = KEEPALIVE_INTERVAL,
                 max_message_size: int | None = None):
        self.service = service
        # the broker's byte counters (its bandwidth in/out, a load-balancer signal), when it has them
        self._io = getattr(service, "io", None)
        cfg = getattr(service, "config", None)
        self.max_message_size = int(max_message_size or getattr(cfg, "max_message_size", 0)
                                    or frames.DEFAULT_MAX_MESSAGE_SIZE)
        self.keepalive_interval = keepalive_interval
        self.decoder = frames.FrameDecoder(frames.max_frame_size(self.max_message_size))
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_event_loop()
        self.remote = "?"
        self.state = "new"                 # new -> connected -> closed
        self.protocol_version = 0
        self.client_version = ""
        self.producers: dict[int, Producer | _Pending] = {}
        self.consumers: dict[int, Consumer | _Pending] = {}
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._writable = True
        self._reading_paused = False
        self._pending_sends = 0
        self._last_read = 0.0
        self._ping_outstanding = False
        self._keepalive_handle: asyncio.TimerHandle | None = None
        self._liveness_waiters: list[asyncio.Future] = []
        self._tasks: set[asyncio.Task] = set()
        self._handlers = {
            T.CONNECT: self._on_connect,
            T.PING: self._on_ping,
            T.PONG: self._on_pong,
            T.PARTITIONED_METADATA: self._on_partitioned_metadata,
            T.LOOKUP: self._on_lookup,
            T.PRODUCER: self._on_producer,
            T.CLOSE_PRODUCER: self._on_close_producer,
            T.SUBSCRIBE: self._on_subscribe,
            T.FLOW: self._on_flow,
            T.ACK: self._on_ack,
            T.REDELIVER_UNACKNOWLEDGED_MESSAGES: self._on_redeliver,
            T.CLOSE_CONSUMER: self._on_close_consumer,
            T.UNSUBSCRIBE: self._on_unsubscribe,
            T.SEEK: self._on_seek,
            T.GET_LAST_MESSAGE_ID: self._on_get_last_message_id,
            T.GET_TOPICS_OF_NAMESPACE: self._on_get_topics_of_namespace,
            T.GET_SCHEMA: self._on_get_schema,
            T.GET_OR_CREATE_SCHEMA: self._on_get_or_create_schema,
            T.CONSUMER_STATS: self._on_consumer_stats,
        }

    def __repr__(self) -> str:
        return f"ServerCnx({self.remote})"

    # ------------------------------------------------------------------ transport callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if peer:
            self.remote = f"{peer[0]}:{peer[1]}"
        self._last_read = self.loop.time()
        try:
            transport.set_write_buffer_limits(high=4 * 1024 * 1024)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001
            pass
        reg = getattr(self.service, "register_connection", None)
        if reg is not None:
            reg(self)
        if self.keepalive_interval > 0:
            self._keepalive_handle = self.loop.call_later(self.keepalive_interval, self._keepalive)

    def data_received(self, data: bytes) -> None:
        if self._io is not None:
            self._io.bytes_in += len(data)
        self._last_read = self.loop.time()
        self._ping_outstanding = False
        if self._liveness_waiters:
            for f in self._liveness_waiters:
                if not f.done():
                    f.set_result(True)
            self._liveness_waiters.clear()
        try:
            for cmd, payload in self.decoder.feed(data):
                t = cmd.type
                if t == _SEND:
                    self._on_send(cmd.send, payload)
                    continue
                if payload is not None:
                    raise frames.ProtocolError(f"unexpected payload on {T.Type.Name(t)}")
                if self.state != "connected":
                    if t != T.CONNECT:
                        raise frames.ProtocolError(f"{T.Type.Name(t)} before CONNECT")
                elif t == T.CONNECT:
                    raise frames.ProtocolError("second CONNECT")
                handler = self._handlers.get(t)
                if handler is None:
                    raise frames.ProtocolError(f"unsupported command {T.Type.Name(t)}")
                handler(cmd)
                if self.state == "closed":
                    return
        except frames.ProtocolError as e:
            log.warning("%s: closing the connection: %s", self, e)
            self.close(str(e))
        except Exception:  # noqa: BLE001 - a bug on one connection must not take the broker down
            log.exception("%s: closing the connection after an internal error", self)
            self.close("internal error")

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._cleanup()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        for c in list(self.consumers.values()):
            if isinstance(c, Consumer):
                c.sub.wake()

    # ------------------------------------------------------------------ state
    @property
    def writable(self) -> bool:
        return self._writable and self.state != "closed"

    @property
    def active(self) -> bool:
        return self.state != "closed"

    def close(self, reason: str = "") -> None:
        """Close the connection and detach its producers and consumers (idempotent)."""
        if self.state == "closed":
            return
        if reason:
            log.debug("%s: closing: %s", self, reason)
        self._flush()
        self._cleanup()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self._cleanup()
        if self.transport is not None:
            self.transport.abort()

    def _cleanup(self) -> None:
        if self.state == "closed":
            return
        self.state = "closed"
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._out.clear()
        for f in self._liveness_waiters:
            if not f.done():
                f.set_result(False)
        self._liveness_waiters.clear()
        producers, self.producers = self.producers, {}
        for p in producers.values():
            if isinstance(p, Producer):
                p.topic.remove_producer(p)
            else:
                p.cancelled = True
        consumers, self.consumers = self.consumers, {}
        for c in consumers.values():
            if isinstance(c, Consumer):
                c.sub.remove_consumer(c)
            else:
                c.cancelled = True
        unreg = getattr(self.service, "unregister_connection", None)
        if unreg is not None:
            try:
                unreg(self)
            except Exception:  # noqa: BLE001
                log.exception("%s: unregister_connection", self)

    # ------------------------------------------------------------------ writing
    def _write(self, data: bytes) -> None:
        if self.state == "closed":
            return
        self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        out = self._out
        if not out or self.transport is None or self.state == "closed":
            return
        self._out = []
        if self._io is not None:
            self._io.bytes_out += sum(len(b) for b in out)
        self.transport.writelines(out)

    def send_command(self, cmd: pb.BaseCommand) -> None:
        self._write(frames.encode_command(cmd))

    def send_message(self, consumer_id: int, ledger_id: int, entry_id: int, redelivery_count: int,
                     entry: bytes, ack_set: list[int] | None = None, partition: int = -1) -> None:
        if self.state == "closed":
            return
        out = self._out
        out.append(frames.message_frame_header(consumer_id, ledger_id, entry_id, redelivery_count,
                                               len(entry), ack_set or (), partition))
        out.append(entry)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def send_receipt(self, producer_id: int, sequence_id: int, ledger_id: int, entry_id: int,
                     highest_sequence_id: int) -> None:
        self._write(frames.encode_send_receipt(producer_id, sequence_id, ledger_id, entry_id,
                                               highest_sequence_id))

    def send_send_error(self, producer_id: int, sequence_id: int, error: int, message: str) -> None:
        c = _cmd(T.SEND_ERROR)
        e = c.send_error
        e.producer_id = producer_id
        e.sequence_id = sequence_id
        e.error = error
        e.message = message
        self.send_command(c)

    def send_success(self, request_id: int) -> None:
        c = _cmd(T.SUCCESS)
        c.success.request_id = request_id
        self.send_command(c)

    def send_error(self, request_id: int, error: int, message: str) -> None:
        c = _cmd(T.ERROR)
        c.error.request_id = request_id
        c.error.error = error
        c.error.message = message
        self.send_command(c)

    def send_active_consumer_change(self, consumer_id: int, is_active: bool) -> None:
        if self.protocol_version < 12:
            return
        c = _cmd(T.ACTIVE_CONSUMER_CHANGE)
        c.active_consumer_change.consumer_id = consumer_id
        c.active_consumer_change.is_active = is_active
        self.send_command(c)

    def add_pending_send(self, delta: int) -> None:
        """Publish back-pressure: stop reading from a client with too many adds in flight."""
        self._pending_sends += delta
        if self.transport is None or self.state == "closed":
            return
        if not self._reading_paused and self._pending_sends >= MAX_PENDING_SENDS:
            self._reading_paused = True
            self.transport.pause_reading()
        elif self._reading_paused and self._pending_sends <= MAX_PENDING_SENDS // 2:
            self._reading_paused = False
            self.transport.resume_reading()

    # ------------------------------------------------------------------ broker-initiated closes
    def broker_close_producer(self, p: Producer, assigned_broker_url: str | None = None) -> None:
        """The topic is going away here: tell the client to reconnect (it redoes the lookup)."""
        if self.producers.get(p.producer_id) is not p:
            return
        del self.producers[p.producer_id]
        c = _cmd(T.CLOSE_PRODUCER)
        c.close_producer.producer_id = p.producer_id
        c.close_producer.request_id = NO_REQUEST
        if assigned_broker_url:
            c.close_producer.assignedBrokerServiceUrl = assigned_broker_url
        self.send_command(c)

    def forget_producer(self, p: Producer) -> None:
        """Drop a registration replaced by the same client's reconnected producer (no message)."""
        if self.producers.get(p.producer_id) is p:
            del self.producers[p.producer_id]

    def broker_close_consumer(self, consumer: Consumer, assigned_broker_url: str | None = None, *,
                              notify: bool = True) -> None:
        if self.consumers.get(consumer.consumer_id) is not consumer:
            return
        del self.consumers[consumer.consumer_id]
        if not notify:
            return
        c = _cmd(T.CLOSE_CONSUMER)
        c.close_consumer.consumer_id = consumer.consumer_id
        c.close_consumer.request_id = NO_REQUEST
        if assigned_broker_url:
            c.close_consumer.assignedBrokerServiceUrl = assigned_broker_url
        self.send_command(c)

    async def check_liveness(self, timeout: float) -> bool:
        """Ping the client; True if anything arrives within `timeout` seconds."""
        if self.state == "closed":
            return False
        fut = self.loop.create_future()
        self._liveness_waiters.append(fut)
        self.send_command(_PING)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            return False

    def _keepalive(self) -> None:
        if self.state == "closed":
            return
        idle = self.loop.time() - self._last_read
        if idle >= self.keepalive_interval:
            if self._ping_outstanding:
                log.warning("%s: no response to ping for %.0f s; closing", self, idle)
                self.close("keep-alive timeout")
                return
            if self.state == "connected" and self.protocol_version >= 1:
                self._ping_outstanding = True
                self.send_command(_PING)
            elif self.state != "connected":
                log.info("%s: no CONNECT within %.0f s; closing", self, idle)
                self.close("handshake timeout")
                return
        self._keepalive_handle = self.loop.call_later(self.keepalive_interval, self._keepalive)

    def _spawn(self, coro) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: request failed", self, exc_info=task.exception())

    # ------------------------------------------------------------------ handshake, keep-alive
    def _on_connect(self, cmd: pb.BaseCommand) -> None:
        c = cmd.connect
        self.client_version = c.client_version
        self.protocol_version = min(c.protocol_version, MAX_PROTOCOL_VERSION)
        r = _cmd(T.CONNECTED)
        r.connected.server_version = SERVER_VERSION
        r.connected.protocol_version = self.protocol_version
        r.connected.max_message_size = self.max_message_size
        self.state = "connected"
        self.send_command(r)
        log.debug("%s: connected %s (protocol %d)", self, self.client_version, self.protocol_version)

    def _on_ping(self, cmd: pb.BaseCommand) -> None:
        self._write(_PONG_FRAME)

    def _on_pong(self, cmd: pb.BaseCommand) -> None:
        pass    # data_received already recorded the activity

    # ------------------------------------------------------------------ lookups
    def _on_partitioned_metadata(self, cmd: pb.BaseCommand) -> None:
        self._spawn(self._partitioned_metadata(cmd.partitionMetadata.topic, cmd.partitionMetadata.request_id))

    async def _partitioned_metadata(self, topic: str, request_id: int) -> None:
        r = _cmd(T.PARTITIONED_METADATA_RESPONSE)
        m = r.partitionMetadataResponse
        m.request_id = request_id
        try:
            m.partitions = int(await self.service.partitions(topic))
            m.response = pb.CommandPartitionedTopicMetadataResponse.Success
        except BrokerServiceError as e:
            m.response = pb.CommandPartitionedTopicMetadataResponse.Failed
            m.error = e.code
            m.message = str(e)
        except Exception as e:  # noqa: BLE001 - in-band, never CommandError (pitfall 3)
            log.warning("%s: partitioned metadata of %s: %s", self, topic, e)
            m.response = pb.CommandPartitionedTopicMetadataResponse.Failed
            m.error = pb.ServiceNotReady
            # the client keeps the connection for this wording and retries
            m.message = f"Failed to acquire ownership for {topic}: {e}"
        self.send_command(r)

    def _on_lookup(self, cmd: pb.BaseCommand) -> None:
        lk = cmd.lookupTopic
        if lk.advertised_listener_name:
            # no advertised listeners are configured: Pulsar's NamespaceService answers this
            r = _cmd(T.LOOKUP_RESPONSE)
            m = r.lookupTopicResponse
            m.request_id = lk.request_id
            m.response = pb.CommandLookupTopicResponse.Failed
            m.error = pb.MetadataError
            m.message = f"the broker do not have {lk.advertised_listener_name} listener"
            self.send_command(r)
            return
        self._spawn(self._lookup(lk.topic, lk.request_id, lk.authoritative))

    async def _lookup(self, topic: str, request_id: int, authoritative: bool) -> None:
        r = _cmd(T.LOOKUP_RESPONSE)
        m = r.lookupTopicResponse
        m.request_id = request_id
        R = pb.CommandLookupTopicResponse
        try:
            res = await self.service.lookup(topic, authoritative)
        except Exception as e:  # noqa: BLE001
            log.warning("%s: lookup of %s: %s", self, topic, e)
            m.response = R.Failed
            m.error = pb.ServiceNotReady
            m.message = f"Failed to acquire ownership for {topic}: {e}"
            self.send_command(r)
            return
        if res.kind == "connect":
            m.response = R.Connect
            m.brokerServiceUrl = res.url
            m.authoritative = True
            m.proxy_through_service_url = False
        elif res.kind == "redirect":
            m.response = R.Redirect
            m.brokerServiceUrl = res.url
            m.authoritative = bool(res.authoritative)
        else:
            m.response = R.Failed
            m.error = _server_error(res.error)
            m.message = res.message or f"lookup of {topic} failed"
        self.send_command(r)

    def _on_get_topics_of_namespace(self, cmd: pb.BaseCommand) -> None:
        self._spawn(self._topics_of_namespace(cmd.getTopicsOfNamespace))

    async def _topics_of_namespace(self, req: pb.CommandGetTopicsOfNamespace) -> None:
        """The namespace's topics (partitions listed one by one, as Pulsar does), filtered by mode;
        not by topics_pattern (filtered=false: the client applies its regex)."""
        topics: list[str] = []
        fn = getattr(self.service, "topics_of_namespace", None)
        if fn is not None:
            try:
                got = fn(req.namespace)
                if asyncio.iscoroutine(got):
                    got = await got
                topics = list(got)
            except Exception as e:  # noqa: BLE001
                log.warning("%s: topics of %s: %s", self, req.namespace, e)
                self.send_error(req.request_id, pb.ServiceNotReady, f"Failed to list topics: {e}")
                return
        M = pb.CommandGetTopicsOfNamespace
        if req.mode == M.PERSISTENT:
            topics = [t for t in topics if t.startswith("persistent://")]
        elif req.mode == M.NON_PERSISTENT:
            topics = [t for t in topics if t.startswith("non-persistent://")]
        r = _cmd(T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
        r.getTopicsOfNamespaceResponse.request_id = req.request_id
        r.getTopicsOfNamespaceResponse.topics.extend(topics)
        r.getTopicsOfNamespaceResponse.filtered = False
        r.getTopicsOfNamespaceResponse.changed = True
        self.send_command(r)

    def _on_get_schema(self, cmd: pb.BaseCommand) -> None:
        self._spawn(self._get_schema(cmd.getSchema))

    async def _get_schema(self, req: pb.CommandGetSchema) -> None:
        """GET_SCHEMA (ServerCnx.handleGetSchema): the latest version, or the one asked for."""
        r = _cmd(T.GET_SCHEMA_RESPONSE)
        g = r.getSchemaResponse
        g.request_id = req.request_id
        registry = getattr(self.service, "schemas", None)
        stored = None
        try:
            if registry is not None:
                sid = schemas.schema_id(req.topic)
                version = None
                if req.HasField("schema_version") and req.schema_version:
                    version = schemas.version_from_bytes(req.schema_version)
                stored = await registry.get(sid, version)
        except Exception as e:  # noqa: BLE001
            log.warning("%s: schema of %s: %s", self, req.topic, e)
            g.error_code = pb.ServiceNotReady
            g.error_message = f"Failed to get the schema of {req.topic}: {e}"
            self.send_command(r)
            return
        if stored is None:
            g.error_code = pb.TopicNotFound
            g.error_message = f"Topic not found or no-schema {req.topic}"
        else:
            schemas.fill_proto(g.schema, schemas.schema_id(req.topic), stored.schema)
            g.schema_version = schemas.version_bytes(stored.version)
        self.send_command(r)

    def _on_get_or_create_schema(self, cmd: pb.BaseCommand) -> None:
        self._spawn(self._get_or_create_schema(cmd.getOrCreateSchema))

    async def _get_or_create_schema(self, req: pb.CommandGetOrCreateSchema) -> None:
        """GET_OR_CREATE_SCHEMA (ServerCnx.handleGetOrCreateSchema): the topic's addSchema."""
        r = _cmd(T.GET_OR_CREATE_SCHEMA_RESPONSE)
        g = r.getOrCreateSchemaResponse
        g.request_id = req.request_id
        try:
            topic = await self.service.get_topic(req.topic)
            version = await self._add_schema(topic, schemas.schema_from_proto(req.schema))
            g.schema_version = schemas.version_bytes(version if version is not None else 0)
        except BrokerServiceError as e:
            g.error_code = e.code
            g.error_message = str(e)
        except Exception as e:  # noqa: BLE001
            g.error_code = pb.ServiceNotReady
            g.error_message = f"Failed to add schema to {req.topic}: {e}"
        self.send_command(r)

    async def _add_schema(self, topic: Any, schema: "schemas.SchemaData | None") -> int | None:
        """The schema version of a producer (None: it publishes without one); a refusal is a
        BrokerServiceError with Pulsar's code (IncompatibleSchema)."""
        if getattr(self.service, "schemas", None) is None:
            return None
        try:
            return await self.service.add_schema(topic.name, schema)
        except schemas.SchemaError as e:
            raise _schema_refusal(e) from None

    # ------------------------------------------------------------------ producers
    def _on_producer(self, cmd: pb.BaseCommand) -> None:
        p = cmd.producer
        existing = self.producers.get(p.producer_id)
        if existing is not None:
            if isinstance(existing, Producer):
                self._producer_success(p.request_id, existing.name,
                                       existing.topic.last_sequence_id(existing.name),
                                       existing.topic_epoch, schema_version=existing.schema_version)
            else:
                self.send_error(p.request_id, pb.ServiceNotReady,
                                "Producer is already present on the connection")
            return
        placeholder = _Pending()
        self.producers[p.producer_id] = placeholder
        self._spawn(self._create_producer(p, placeholder))

    async def _create_producer(self, req: pb.CommandProducer, placeholder: _Pending) -> None:
        pid = req.producer_id
        try:
            topic = await self.service.get_topic(req.topic)
            if placeholder.cancelled or self.state == "closed":
                return
            name = req.producer_name if req.HasField("producer_name") and req.producer_name else \
                self._new_producer_name()
            user_provided = req.user_provided_producer_name if req.HasField("producer_name") else False

            schema_version = await self._add_schema(
                topic, schemas.schema_from_proto(req.schema) if req.HasField("schema") else None)
            if placeholder.cancelled or self.state == "closed":
                return

            def queued() -> None:       # WaitForExclusive: the client parks the request meanwhile
                if not placeholder.cancelled and self.state != "closed":
                    self._producer_success(req.request_id, name, -1, None, ready=False)

            producer = await topic.add_producer(
                self, pid, name, epoch=req.epoch, access_mode=req.producer_access_mode,
                user_provided_name=user_provided,
                topic_epoch=req.topic_epoch if req.HasField("topic_epoch") else None, on_queued=queued)
        except BrokerServiceError as e:
            self._drop_placeholder(self.producers, pid, placeholder)
            log.info("%s: producer %d on %s refused: %s", self, pid, req.topic, e)
            self.send_error(req.request_id, e.code, str(e))
            return
        except Exception as e:  # noqa: BLE001
            self._drop_placeholder(self.producers, pid, placeholder)
            log.warning("%s: creating producer %d on %s: %s", self, pid, req.topic, e)
            self.send_error(req.request_id, pb.ServiceNotReady, f"Failed to create producer: {e}")
            return
        if placeholder.cancelled or self.state == "closed" or self.producers.get(pid) is not placeholder:
            topic.remove_producer(producer)
            return
        self.producers[pid] = producer
        producer.schema_version = schema_version
        self._producer_success(req.request_id, producer.name, topic.last_sequence_id(producer.name),
                               producer.topic_epoch, schema_version=schema_version)

    def _producer_success(self, request_id: int, name: str, last_sequence_id: int = -1,
                          topic_epoch: int | None = None, *, ready: bool = True,
                          schema_version: int | None = None) -> None:
        r = _cmd(T.PRODUCER_SUCCESS)
        s = r.producer_success
        s.request_id = request_id
        s.producer_name = name
        s.last_sequence_id = last_sequence_id
        if topic_epoch is not None:
            s.topic_epoch = topic_epoch
        if schema_version is not None:
            s.schema_version = schemas.version_bytes(schema_version)
        s.producer_ready = ready
        self.send_command(r)

    def _new_producer_name(self) -> str:
        cfg = getattr(self.service, "config", None)
        cluster = getattr(cfg, "cluster", "standalone")
        node = getattr(cfg, "name", None) or f"{os.getpid()}"
        return f"{cluster}-{node}-{_boot:x}-{next(_producer_names)}"

    @staticmethod
    def _drop_placeholder(table: dict, key: int, placeholder: _Pending) -> None:
        if table.get(key) is placeholder:
            del table[key]

    def _on_send(self, send: pb.CommandSend, payload: bytes | None) -> None:
        if self.state != "connected":
            raise frames.ProtocolError("SEND before CONNECT")
        p = self.producers.get(send.producer_id)
        if p is None or p.__class__ is not Producer:
            return        # unknown or recently closed producer: ignore (the client resends)
        if payload is None:
            raise frames.ProtocolError("SEND without a payload")
        try:
            entry, md = frames.send_entry(payload)
        except frames.ChecksumMismatch:
            log.warning("%s: checksum mismatch on %s seq %d", self, p.name, send.sequence_id)
            self.send_send_error(send.producer_id, send.sequence_id, pb.ChecksumError,
                                 "Checksum verification failed")
            return
        seq = send.sequence_id
        n = send.num_messages
        highest = send.highest_sequence_id or seq + (n - 1 if n > 1 else 0)
        p.topic.publish(p, seq, highest, entry, md)

    def _on_close_producer(self, cmd: pb.BaseCommand) -> None:
        cp = cmd.close_producer
        p = self.producers.pop(cp.producer_id, None)
        if isinstance(p, Producer):
            p.topic.remove_producer(p)
        elif isinstance(p, _Pending):
            p.cancelled = True
        self.send_success(cp.request_id)

    # ------------------------------------------------------------------ consumers
    def _on_subscribe(self, cmd: pb.BaseCommand) -> None:
        s = cmd.subscribe
        existing = self.consumers.get(s.consumer_id)
        if existing is not None:
            if isinstance(existing, Consumer):
                self.send_success(s.request_id)
            else:
                self.send_error(s.request_id, pb.ServiceNotReady,
                                "Consumer is already present on the connection")
            return
        placeholder = _Pending()
        self.consumers[s.consumer_id] = placeholder
        self._spawn(self._create_consumer(s, placeholder))

    async def _create_consumer(self, req: pb.CommandSubscribe, placeholder: _Pending) -> None:
        cid = req.consumer_id
        try:
            topic = await self.service.get_topic(req.topic)
            if placeholder.cancelled or self.state == "closed":
                return
            if req.HasField("schema") and getattr(self.service, "schemas", None) is not None:
                try:
                    await self.service.consumer_schema(topic, schemas.schema_from_proto(req.schema))
                except schemas.SchemaError as e:
                    raise _schema_refusal(e) from None
                if placeholder.cancelled or self.state == "closed":
                    return
            consumer = await topic.subscribe(self, req)
        except BrokerServiceError as e:
            self._drop_placeholder(self.consumers, cid, placeholder)
            log.info("%s: subscribe %s/%s refused: %s", self, req.topic, req.subscription, e)
            self.send_error(req.request_id, e.code, str(e))
            return
        except Exception as e:  # noqa: BLE001
            self._drop_placeholder(self.consumers, cid, placeholder)
            log.warning("%s: subscribing %s/%s: %s", self, req.topic, req.subscription, e)
            self.send_error(req.request_id, pb.ServiceNotReady, f"Failed to subscribe: {e}")
            return
        if placeholder.cancelled or self.state == "closed" or self.consumers.get(cid) is not placeholder:
            consumer.sub.remove_consumer(consumer)
            return
        self.consumers[cid] = consumer
        self.send_success(req.request_id)

    def _consumer(self, consumer_id: int) -> Consumer | None:
        c = self.consumers.get(consumer_id)
        return c if isinstance(c, Consumer) else None

    def _on_flow(self, cmd: pb.BaseCommand) -> None:
        c = self._consumer(cmd.flow.consumer_id)
        if c is not None:
            c.sub.flow(c, cmd.flow.messagePermits)

    def _on_ack(self, cmd: pb.BaseCommand) -> None:
        """ACK, as Pulsar's Consumer.messageAcked: a cumulative ack names one id and is ignored on
        Shared and Key_Shared subscriptions (the client refuses it before); an id whose ack_set
        still has bits set is a partial (batch-index) acknowledgement of its batch."""
        a = cmd.ack
        c = self._consumer(a.consumer_id)
        if c is not None:
            sub = c.sub
            if a.ack_type == pb.CommandAck.Cumulative:
                if len(a.message_id) != 1:
                    log.warning("%s: cumulative ack of %d ids from %s, ignoring", self, len(a.message_id), c)
                elif sub.dispatcher.individual_ack:
                    log.warning("%s: cumulative ack on the %s subscription %s, ignoring", self,
                                SUB_TYPE_NAMES.get(sub.sub_type), sub.name)
                else:
                    m = a.message_id[0]
                    pos = Position(frames.to_signed64(m.ledgerId), frames.to_signed64(m.entryId))
                    sub.ack_cumulative(pos, list(m.ack_set) if m.ack_set else None)
            else:
                whole = []
                for m in a.message_id:
                    pos = Position(frames.to_signed64(m.ledgerId), frames.to_signed64(m.entryId))
                    if any(m.ack_set):
                        sub.ack_batch_index(pos, list(m.ack_set))
                    else:
                        whole.append(pos)
                if whole:
                    sub.ack_individual(whole)
        if a.HasField("request_id"):
            r = _cmd(T.ACK_RESPONSE)
            r.ackResponse.consumer_id = a.consumer_id
            r.ackResponse.request_id = a.request_id
            self.send_command(r)

    def _on_redeliver(self, cmd: pb.BaseCommand) -> None:
        rd = cmd.redeliverUnacknowledgedMessages
        c = self._consumer(rd.consumer_id)
        if c is None:
            return
        ids = [Position(frames.to_signed64(m.ledgerId), frames.to_signed64(m.entryId))
               for m in rd.message_ids]
        c.sub.redeliver(c, ids)

    def _on_close_consumer(self, cmd: pb.BaseCommand) -> None:
        cc = cmd.close_consumer
        c = self.consumers.pop(cc.consumer_id, None)
        if isinstance(c, Consumer):
            c.sub.remove_consumer(c)
        elif isinstance(c, _Pending):
            c.cancelled = True
        self.send_success(cc.request_id)

    def _on_unsubscribe(self, cmd: pb.BaseCommand) -> None:
        u = cmd.unsubscribe
        c = self._consumer(u.consumer_id)
        if c is None:
            self.send_error(u.request_id, pb.MetadataError, "Consumer not found")
            return
        self._spawn(self._unsubscribe(c, u.request_id, u.force))

    async def _unsubscribe(self, c: Consumer, request_id: int, force: bool) -> None:
        try:
            await c.sub.topic.unsubscribe(c, force=force)
        except BrokerServiceError as e:
            self.send_error(request_id, e.code, str(e))
            return
        except Exception as e:  # noqa: BLE001
            log.warning("%s: unsubscribe %s: %s", self, c, e)
            self.send_error(request_id, pb.UnknownError, f"Failed to unsubscribe: {e}")
            return
        self.send_success(request_id)

    def _on_seek(self, cmd: pb.BaseCommand) -> None:
        sk = cmd.seek
        if not sk.HasField("message_id") and not sk.HasField("message_publish_time"):
            self.send_error(sk.request_id, pb.MetadataError,
                            "Message id and message publish time were not present")
            return
        c = self._consumer(sk.consumer_id)
        if c is None:
            self.send_error(sk.request_id, pb.MetadataError, "Consumer not found")
            return
        self._spawn(self._seek(c, sk))

    async def _seek(self, c: Consumer, sk: pb.CommandSeek) -> None:
        sub = c.sub
        try:
            if sk.HasField("message_id"):
                target = sub.topic.seek_target(frames.to_signed64(sk.message_id.ledgerId),
                                               frames.to_signed64(sk.message_id.entryId))
            else:
                target = await sub.topic.find_position_by_publish_time(sk.message_publish_time)
            # Java's order: disconnect the subscription's consumers, reset, then answer
            await sub.reset(target)
        except Exception as e:  # noqa: BLE001
            log.warning("%s: seek on %s: %s", self, sub, e)
            what = ("Error when resetting subscription" if sk.HasField("message_id")
                    else "Reset subscription to publish time error")
            self.send_error(sk.request_id, pb.UnknownError, f"{what}: {e}")
            return
        log.info("%s: %s reset to %s", self, sub, target if target is not None else "earliest")
        self.send_success(sk.request_id)

    def _on_get_last_message_id(self, cmd: pb.BaseCommand) -> None:
        g = cmd.getLastMessageId
        c = self._consumer(g.consumer_id)
        if c is None:
            self.send_error(g.request_id, pb.MetadataError, "Consumer not found")
            return
        self._spawn(self._get_last_message_id(c, g.request_id))

    async def _get_last_message_id(self, c: Consumer, request_id: int) -> None:
        try:
            ledger, entry, batch_index = await c.sub.topic.last_message_id(c.read_compacted)
        except Exception as e:  # noqa: BLE001
            self.send_error(request_id, pb.PersistenceError, f"Failed to read the last entry: {e}")
            return
        r = _cmd(T.GET_LAST_MESSAGE_ID_RESPONSE)
        g = r.getLastMessageIdResponse
        g.request_id = request_id
        g.last_message_id.ledgerId = frames.to_unsigned64(ledger)
        g.last_message_id.entryId = frames.to_unsigned64(entry)
        partition = partition_index(c.sub.topic.name)
        if partition >= 0:
            g.last_message_id.partition = partition
        if batch_index >= 0:
            g.last_message_id.batch_index = batch_index
        md = c.sub.mark_delete
        if md is not None:
            g.consumer_mark_delete_position.ledgerId = frames.to_unsigned64(md.ledger_id)
            g.consumer_mark_delete_position.entryId = frames.to_unsigned64(md.entry_id)
        self.send_command(r)

    def _on_consumer_stats(self, cmd: pb.BaseCommand) -> None:
        st = cmd.consumerStats
        r = _cmd(T.CONSUMER_STATS_RESPONSE)
        s = r.consumerStatsResponse
        s.request_id = st.request_id
        c = self._consumer(st.consumer_id)
        if c is None:
            s.error_code = pb.ConsumerNotFound
            s.error_message = "Consumer not found"
        else:
            s.consumerName = c.name
            s.availablePermits = max(c.permits, 0)
            s.unackedMessages = sum(c.pending.values())
            s.address = self.remote
            s.connectedSince = c.connected_since
            s.type = SUB_TYPE_NAMES.get(c.sub_type, "?")
            s.msgRateOut = 0.0
            s.msgThroughputOut = 0.0
            s.msgRateRedeliver = 0.0
            s.blockedConsumerOnUnackedMsgs = False
            s.msgRateExpired = 0.0
            s.msgBacklog = 0
        self.send_command(r)


def _schema_refusal(e: "schemas.SchemaError") -> BrokerServiceError:
    """Pulsar's codes: IncompatibleSchema for a refused or malformed schema; a storage failure is
    ServiceNotReady (the client retries)."""
    if e.kind == "storage":
        return BrokerServiceError(str(e), pb.ServiceNotReady)
    return BrokerServiceError(str(e), pb.IncompatibleSchema)


def _server_error(name: str | None) -> int:
    if not name:
        return pb.ServiceNotReady
    try:
        return pb.ServerError.Value(name)
    except ValueError:
        return pb.UnknownError


_PING = _cmd(T.PING)
_PING.ping.SetInParent()
_PONG = _cmd(T.PONG)
_PONG.pong.SetInParent()
_PONG_FRAME = frames.encode_command(_PONG)


async def serve_connections(service: Any, host: str, port: int, *,
                            keepalive_interval: float = KEEPALIVE_INTERVAL,
                            **server_kwargs: Any) -> asyncio.AbstractServer:
    """Listen on host:port and serve the Pulsar protocol for `service`; returns the started server."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: ServerCnx(service, keepalive_interval=keepalive_interval),
        host, port, reuse_address=True, **server_kwargs)
    log.info("serving the Pulsar protocol on %s:%d", host, port)
    return server
