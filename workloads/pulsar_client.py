"""The Pulsar client side shared by the Pulsar workloads: a worker's `pulsar.Client` with its producers
and consumers (made lazily, made again when broken), one send, receive or final read mapped to
ok / fail / info with the broker each was served by, and the steps several workloads take (topic
names, a worker's session, final reads, final drains).
"""
from __future__ import annotations

import json
import logging
import random
import re
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TextIO

from core.history import FAIL, INFO, OK, MessageId
from workloads import base
from workloads.base import FINAL_PROCESS, Context, decode_value

SUBSCRIPTION = "chaos"
SEND_TIMEOUT_MS = 10_000          # a send that takes longer is indeterminate (info)
OPERATION_TIMEOUT_S = 10          # lookups, producer/consumer creation
RECEIVE_WAIT_MS = 100             # a receive op waits this long for its first message
RECEIVE_MAX = 16                  # ... then takes what is already there, up to this many
DRAIN_IDLE_S = 3.0                # a final drain ends after this long without a message ...
DRAIN_MAX_S = 60.0                # ... or after this long in all
BATCH_DELAY_MS = 20               # batched producers: a wider window so concurrent sends share a batch
# An explicit initial sequence id (`pin_sequence_ids`): the C++ client under pulsar-client 3.x otherwise
# takes its next sequence id from the broker on every reconnect made before its first receipt
# (ProducerImpl::handleCreateProducer tests lastSequenceIdPublished_ == -1; the Java client was fixed by
# apache/pulsar#2047). After a failed first write the broker answers -1 (what was pushed but not
# persisted is forgotten), the client numbers its next message like the one it is resending, and a
# deduplicating broker acknowledges that next message as a duplicate without storing it. (The Python
# wrapper ignores an initial_sequence_id of 0, hence 1.)
INITIAL_SEQUENCE_ID = 1
READ_NEXT_MS = 2_000
ADMIN_TIMEOUT_S = 10

# exceptions whose send certainly never reached the broker
_SEND_FAILS = ("ProducerQueueIsFull", "MemoryBufferIsFull", "MessageTooBig", "InvalidMessage", "ChecksumError",
               "NotConnected", "ProducerFenced", "TopicTerminated", "ProducerBlockedQuotaExceededError",
               "ProducerBlockedQuotaExceededException", "InvalidTopicName")
# exceptions after which a producer or consumer is unusable and is made again
_BROKEN = ("AlreadyClosed", "NotConnected", "ProducerFenced", "TopicTerminated", "ConsumerNotInitialized",
           "ProducerNotInitialized")



_CREATED = re.compile(r"\[(?P<topic>[^,\]]+), (?P<name>[^,\]]*)(?:, \d+)?\] Created (?:producer|consumer) "
                      r"on broker \[\S+ -> (?P<addr>[^\]\s]+)\s*\]")


class _ClientLog(logging.Handler):
    """Receives the C++ client's log: remembers which broker each producer/consumer was created on,
    and writes warnings and errors to the worker's log."""

    def __init__(self, out: TextIO, nodes_by_host: dict[str, str]):
        super().__init__(logging.INFO)
        self.out = out
        self.nodes_by_host = nodes_by_host
        self.on_broker: dict[tuple[str, str], str] = {}
        self._lock_out = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if "Created " in msg:
                m = _CREATED.search(msg)
                if m:
                    host = m.group("addr").rsplit(":", 1)[0]
                    node = self.nodes_by_host.get(host, host)
                    self.on_broker[(m.group("topic"), m.group("name"))] = node
                    self.on_broker[(m.group("topic"), "")] = node      # the topic's latest, for readers
            if record.levelno >= logging.WARNING:
                with self._lock_out:
                    self.out.write(f"{time.strftime('%H:%M:%S')} {record.levelname} pulsar: {msg}\n")
                    self.out.flush()
        except Exception:   # never let logging break the client
            pass


class Session:
    """One `pulsar.Client` of a worker process with its producers and consumers, made lazily and made
    again when they break, and the broker each was last (re)created on."""

    def __init__(self, service_url: str, name: str, nodes_by_host: dict[str, str] | None = None,
                 out: TextIO = sys.stdout, producer_lifetime: float = 0.0, key_based_batching: bool = False,
                 pin_sequence_ids: bool = True):
        import pulsar
        self.name = name
        self.key_based_batching = key_based_batching
        self.pin_sequence_ids = pin_sequence_ids      # INITIAL_SEQUENCE_ID above
        # Producers are replaced after about this many seconds (0: never). Real clients come and go;
        # each new producer looks its topic up again, through any broker of the service URL, which is
        # how another broker comes to take over a topic whose owner lost its ZooKeeper session.
        self.producer_lifetime = producer_lifetime
        self._born: dict[tuple[str, bool], float] = {}
        self._jitter = random.Random(name)
        self.log = _ClientLog(out, nodes_by_host or {})
        logger = logging.getLogger(f"pulsar-client.{name}")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(self.log)
        self.client = pulsar.Client(service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S,
                                    connection_timeout_ms=5000, logger=logger)
        self._producers: dict[tuple[str, bool], Any] = {}
        self._replacing: set[tuple[str, bool]] = set()
        self._consumers: dict[tuple[str, str, str], Any] = {}
        self._generation = 0
        self._lock = threading.Lock()
        self._making: dict[Any, threading.Lock] = {}

    def _maker_lock(self, key: Any) -> threading.Lock:
        with self._lock:
            return self._making.setdefault(key, threading.Lock())

    def _expired(self, key: tuple[str, bool]) -> bool:
        return (self.producer_lifetime > 0
                and time.monotonic() - self._born.get(key, time.monotonic()) > self.producer_lifetime)

    def producer(self, topic: str, batched: bool) -> Any:
        """The producer for (topic, batched), made on first use. Once expired, its replacement is made
        in the background while sends go on through the old one: a lookup that hangs (its broker is
        cut from ZooKeeper) must not stall the thread, nor take the old producer out of the picture."""
        key = (topic, batched)
        p = self._producers.get(key)
        if p is not None:
            if self._expired(key) and key not in self._replacing:
                self._replacing.add(key)
                threading.Thread(target=self._replace, args=(topic, batched), daemon=True).start()
            return p
        with self._maker_lock(key):             # one creation at a time per producer
            p = self._producers.get(key)
            if p is None:
                p = self._make_producer(topic, batched)
                self._producers[key] = p
            return p

    def _replace(self, topic: str, batched: bool) -> None:
        key = (topic, batched)
        try:
            with self._maker_lock(key):
                try:
                    p = self._make_producer(topic, batched)
                except Exception:
                    self._born[key] = time.monotonic()     # keep the old one; try again later
                    return
                old, self._producers[key] = self._producers.get(key), p
                if old is not None and old is not p:
                    _close_later(old, SEND_TIMEOUT_MS / 1000 + 5)   # its sends end on their own first
        finally:
            self._replacing.discard(key)

    def _make_producer(self, topic: str, batched: bool) -> Any:
        key = (topic, batched)
        with self._lock:
            self._generation += 1
            gen = self._generation
        name = f"{self.name}-{topic.rsplit('-', 1)[-1]}-{'b' if batched else 'u'}{gen}"
        kw: dict[str, Any] = dict(producer_name=name, send_timeout_millis=SEND_TIMEOUT_MS,
                                  block_if_queue_full=False)
        if self.pin_sequence_ids:
            kw["initial_sequence_id"] = INITIAL_SEQUENCE_ID
        if batched:
            kw.update(batching_enabled=True, batching_max_publish_delay_ms=BATCH_DELAY_MS)
            if self.key_based_batching:     # Key_Shared needs batches of one key each
                import pulsar
                kw.update(batching_type=pulsar.BatchingType.KeyBased)
        else:
            kw.update(batching_enabled=False)
        p = self.client.create_producer(topic, **kw)
        # lifetimes spread over 0.75-1.25x so producers are not all replaced at once
        self._born[key] = time.monotonic() - self.producer_lifetime * (self._jitter.random() - 0.5) / 2
        return p

    def drop_producer(self, topic: str, batched: bool, p: Any) -> None:
        with self._lock:
            if self._producers.get((topic, batched)) is p:
                del self._producers[(topic, batched)]
        _close_in_background(p)

    def consumer(self, topic: str, subscription: str = SUBSCRIPTION, type_: str = "Exclusive",
                 name: str | None = None, **kw: Any) -> Any:
        """The consumer (topic, subscription, name), subscribed from the earliest message; `type_` is a
        pulsar.ConsumerType name (Exclusive, Shared, Failover, KeyShared); extra keywords go to subscribe."""
        import pulsar
        name = name or f"{self.name}-c"
        key = (topic, subscription, name)
        c = self._consumers.get(key)
        if c is not None:
            return c
        with self._maker_lock(("consumer", key)):
            c = self._consumers.get(key)
            if c is None:
                c = self.client.subscribe(topic, subscription, consumer_type=getattr(pulsar.ConsumerType, type_),
                                          initial_position=pulsar.InitialPosition.Earliest,
                                          consumer_name=name, **kw)
                self._consumers[key] = c
            return c

    def leave(self, topic: str, subscription: str, name: str) -> None:
        """Close the consumer (topic, subscription, name) if there is one: it leaves the subscription
        (the next `consumer` call subscribes again)."""
        c = self._consumers.get((topic, subscription, name))
        if c is not None:
            self.drop_consumer(c)

    def drop_consumer(self, c: Any) -> None:
        with self._lock:
            for k, v in list(self._consumers.items()):
                if v is c:
                    del self._consumers[k]
        _close_in_background(c)

    def node_of(self, topic: str, name: str) -> str:
        return self.log.on_broker.get((topic, name), "")

    def close(self, timeout: float = 5.0) -> None:
        """Close the client, giving up after `timeout` (a cut-off broker can make close hang)."""
        t = threading.Thread(target=_quiet(self.client.close), daemon=True)
        t.start()
        t.join(timeout)


def _quiet(fn: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception:
            pass
    return run


def _close_in_background(obj: Any) -> None:
    threading.Thread(target=_quiet(obj.close), daemon=True).start()


def _close_later(obj: Any, delay: float) -> None:
    timer = threading.Timer(delay, _quiet(obj.close))
    timer.daemon = True
    timer.start()


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _decode(msg: Any, with_redelivery: bool, received_ms: int | None = None) -> dict[str, Any]:
    data = msg.data()
    deliver_at = None
    if b"@" in data:                    # a delayed message: "value@deliver_at_ms" (send(deliver_at=))
        head, _, tail = data.partition(b"@")
        try:
            deliver_at = int(tail)
            data = head
        except ValueError:
            pass
    d: dict[str, Any] = {"value": decode_value(data), "message_id": asdict(MessageId.from_pulsar(msg.message_id()))}
    if deliver_at is not None:
        d["deliver_at"] = deliver_at
        if received_ms is not None:
            d["received_ms"] = received_ms
    key = msg.partition_key()
    if key:
        d["key"] = key
    if with_redelivery:
        d["redelivery_count"] = msg.redelivery_count()
    return d


def send(session: Session, topic: str, batched: bool, value: int, key: str | None = None,
         deliver_at: int | None = None, pad: int = 0) -> tuple[str, dict[str, Any]]:
    """One send: ok with the message id and broker; fail if it certainly was not written; info if unsure.
    With `deliver_at` (wall-clock ms) the message is delayed and its payload is "value@deliver_at", so
    whoever receives it knows when it was due. `pad`: the payload is padded with spaces to that many
    bytes (`decode_value` reads the value back: int() ignores them)."""
    import pulsar
    try:
        p = session.producer(topic, batched)
    except Exception as e:      # no producer: the message never left this process
        return FAIL, {"error": f"create_producer: {_err(e)}"}
    try:
        kw: dict[str, Any] = {}
        if key:
            kw["partition_key"] = key
        payload = str(value).encode()
        if deliver_at is not None:
            kw["deliver_at"] = int(deliver_at)
            payload += b"@%d" % int(deliver_at)
        if pad > len(payload):
            payload = payload.ljust(pad)
        mid = p.send(payload, **kw)
    except pulsar.PulsarException as e:
        name = type(e).__name__
        if name in _BROKEN:
            session.drop_producer(topic, batched, p)
        if name in _SEND_FAILS:
            return FAIL, {"error": _err(e), "node": session.node_of(topic, p.producer_name())}
        return INFO, {"error": _err(e), "node": session.node_of(topic, p.producer_name())}
    except Exception as e:
        return INFO, {"error": _err(e)}
    return OK, {"message_id": MessageId.from_pulsar(mid), "node": session.node_of(topic, p.producer_name())}


def receive(session: Session, topic: str, subscription: str = SUBSCRIPTION, type_: str = "Exclusive",
            name: str | None = None, max_messages: int = RECEIVE_MAX, ack: bool = True
            ) -> tuple[str, dict[str, Any], list[Any], Any]:
    """One receive: (ok with the messages that arrived, or fail if none did; the pulsar messages; the
    consumer). They are acknowledged one by one unless `ack` is False (the caller then acknowledges)."""
    import pulsar
    try:
        c = session.consumer(topic, subscription, type_, name)
    except Exception as e:
        return FAIL, {"error": f"subscribe: {_err(e)}"}, [], None
    msgs: list[Any] = []
    stamps: list[int] = []              # wall-clock ms of each arrival (checked against deliver_at)
    error = f"Timeout: no message within {RECEIVE_WAIT_MS} ms"
    try:
        msgs.append(c.receive(RECEIVE_WAIT_MS))
        stamps.append(int(time.time() * 1000))
        while len(msgs) < max_messages:
            msgs.append(c.receive(1))
            stamps.append(int(time.time() * 1000))
    except pulsar.Timeout:
        pass
    except Exception as e:
        error = _err(e)
        if type(e).__name__ in _BROKEN:
            session.drop_consumer(c)
    value = [_decode(m, True, stamps[i] if i < len(stamps) else None) for i, m in enumerate(msgs)]
    if ack:
        for m in msgs:
            try:
                c.acknowledge(m)          # fire-and-forget in the client; checked through redeliveries
            except Exception:
                pass
    node = session.node_of(topic, subscription)
    if not value:
        return FAIL, {"error": error, "node": node}, msgs, c
    return OK, {"value": value, "node": node}, msgs, c


def read_topic(session: Session, topic: str, timeout_s: float,
               decode: Callable[[Any], dict[str, Any]] | None = None) -> tuple[str, dict[str, Any]]:
    """A final read: every message of the topic from the earliest, in order, until the reader has no
    more (the broker's last message id is reached), each as `decode` records it (a plain message by
    default). info if that does not happen within timeout_s; a broken reader starts over from the
    earliest. The reader has no schema: nothing it reads is checked against one."""
    import pulsar
    deadline = time.monotonic() + timeout_s
    reader = None
    out: list[dict[str, Any]] = []
    last_error = ""
    attempts = 0
    name = f"{session.name}-r{topic.rsplit('-', 1)[-1]}"
    while time.monotonic() < deadline:
        try:
            if reader is None:
                attempts += 1
                reader = session.client.create_reader(topic, pulsar.MessageId.earliest,
                                                      reader_name=f"{name}-{attempts}")
                out = []
            if not reader.has_message_available():
                return OK, {"value": out, "node": session.node_of(topic, "")}
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            msg = reader.read_next(min(READ_NEXT_MS, left_ms))
            out.append(decode(msg) if decode is not None else _decode(msg, False))
        except pulsar.Timeout as e:
            last_error = _err(e)
        except Exception as e:
            last_error = _err(e)
            if reader is not None:
                _close_in_background(reader)
            reader = None
            time.sleep(0.5)
    return INFO, {"value": None, "error": f"final read unfinished after {timeout_s:.0f}s ({len(out)} messages "
                                          f"read, {attempts} reader(s)); last error: {last_error or 'none'}"}




def _topic_path(topic: str, action: str) -> str:
    tn = topic.split("://", 1)[-1]
    return "/admin/v2/persistent/" + "/".join(urllib.parse.quote(p, safe="") for p in tn.split("/")) + "/" + action


def admin_call(admin_urls: list[str], path: str, body: Any = None, method: str | None = None) -> Any:
    """GET (or POST `body` as JSON; or `method`) `path` on the first broker that answers; the decoded
    JSON reply. Raises RuntimeError naming every broker's error when none does."""
    errors = []
    for url in admin_urls:
        try:
            data = None if body is None else json.dumps(body).encode()
            req = urllib.request.Request(url + path, data=data,
                                         method=method or ("GET" if body is None else "POST"),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=ADMIN_TIMEOUT_S) as r:
                raw = r.read()
            return json.loads(raw) if raw.strip() else None
        except Exception as e:
            errors.append(f"{url}: {_err(e)}")
    raise RuntimeError("; ".join(errors) or "no broker to ask")


def create_topic(admin_urls: list[str], topic: str) -> None:
    """Create a non-partitioned topic (already existing is fine)."""
    try:
        admin_call(admin_urls, _topic_path(topic, "")[:-1], method="PUT")
    except RuntimeError as e:
        if "409" not in str(e):
            raise


def set_topic_policy(admin_urls: list[str], topic: str, action: str, value: Any) -> None:
    """A topic-level policy (e.g. deduplication true) through the admin API; the topic is made first."""
    create_topic(admin_urls, topic)
    admin_call(admin_urls, _topic_path(topic, action), value)


def create_subscription(admin_urls: list[str], topic: str, subscription: str) -> None:
    """A durable subscription with no consumer at the latest position, as Pulsar's admin
    createSubscription makes it (the topic is made first; already existing is fine)."""
    create_topic(admin_urls, topic)
    try:
        admin_call(admin_urls, _topic_path(topic, "subscription/" + urllib.parse.quote(subscription, safe="")),
                   method="PUT")
    except RuntimeError as e:
        if "409" not in str(e):
            raise


ZK_AUDIT_TIMEOUT = 10.0


def ledger_metadata(zk_connect: str, ledger_ids: list[int], bookies: dict[str, str]) -> dict[int, dict[str, Any]]:
    """Each ledger's metadata as the metadata store holds it at the end of the run (the BookKeeper
    client's znode under /ledgers), what the log checker needs to place an entry on its bookies:
    {ledger id: {"ensemble_size", "write_quorum", "ack_quorum", "state", "fragments": [[first entry,
    [bookie node names]]]}} ({"error": ...} for a ledger without readable metadata). `bookies` maps a
    bookie's "host:port" to its node name (an unknown address stays as it is)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    from clusters.bookkeeper.metadata import LedgerMetadata, ledger_path
    zk = KazooClient(hosts=zk_connect, timeout=ZK_AUDIT_TIMEOUT, connection_retry={"max_tries": 3})
    out: dict[int, dict[str, Any]] = {}
    try:
        zk.start(ZK_AUDIT_TIMEOUT)
        for lid in ledger_ids:
            try:
                md = LedgerMetadata.deserialize(zk.get(ledger_path(lid))[0])
            except NoNodeError:
                out[lid] = {"error": "no metadata (deleted)"}
                continue
            except ValueError as e:
                out[lid] = {"error": f"unreadable metadata: {e}"}
                continue
            out[lid] = {"ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum,
                        "ack_quorum": md.ack_quorum, "state": md.state,
                        "fragments": [[k, [bookies.get(b, b) for b in md.ensembles[k]]] for k in md.keys()]}
    finally:
        zk.stop()
        zk.close()
    return out


def ledger_list(admin_urls: list[str], topic: str, zk_connect: str = "",
                bookies: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """The topic's ledgers from a broker's internalStats (forwarded to the owner): ok with
    {"ledgers": [{"ledger_id", "entries"}], "last_confirmed": "L:E"}, or info if no broker answered.
    With `zk_connect`, each ledger also gets its metadata (`ledger_metadata`: its fragments' bookies),
    or the op a "metadata_error" when the metadata store did not answer."""
    try:
        st = admin_call(admin_urls, _topic_path(topic, "internalStats"))
    except RuntimeError as e:
        return INFO, {"error": str(e)}
    lc = str(st.get("lastConfirmedEntry") or "")
    lc_ledger, _, lc_entry = lc.partition(":")
    ledgers = []
    for x in st.get("ledgers", []):
        lid, entries = int(x["ledgerId"]), x.get("entries")
        if entries is None:       # the open ledger: its entries are up to the last confirmed one
            entries = int(lc_entry) + 1 if lc_ledger == str(lid) and lc_entry.lstrip("-").isdigit() else 0
        ledgers.append({"ledger_id": lid, "entries": int(entries)})
    value: dict[str, Any] = {"ledgers": ledgers, "last_confirmed": lc}
    if zk_connect and ledgers:
        try:
            mds = ledger_metadata(zk_connect, [x["ledger_id"] for x in ledgers], bookies or {})
            for x in ledgers:
                x["metadata"] = mds.get(x["ledger_id"])
        except Exception as e:  # noqa: BLE001 - the listing stands without it
            value["metadata_error"] = f"{type(e).__name__}: {e}"[:300]
    return OK, {"value": value}


# ------------------------------------------------------------------------------------ steps the workloads share

def topic_names(test_name: str, run_id: str, n: int) -> list[str]:
    return [f"persistent://public/default/{test_name}-{run_id}-{i}" for i in range(n)]


def session_for(ctx: Context, **kw: Any) -> Session:
    """The worker's Pulsar session (closed by the worker at exit)."""
    final = ctx.name == "final-reads"
    s = Session(ctx.service_url, f"{ctx.run_dir.name[-6:]}-{ctx.name}", ctx.nodes_by_host(), ctx.out or sys.stdout,
                producer_lifetime=0.0 if final else ctx.spec.client_lifetime, **kw)
    ctx.cleanups.append(lambda: s.close(3.0))
    return s


def final_reads(ctx: Context, session: Session, first_process: int = FINAL_PROCESS
                ) -> list[tuple[str, Callable[[], None]]]:
    """One final read per topic from the earliest message, then the topic's ledger list (for the
    fencing checker's ledger bounds, and the log checker's placement of entries on bookies); as
    (name, fn) pairs for base.start_threads."""
    bookies = {f"{n['host']}:{(n.get('ports') or {}).get('bookie', 3181)}": n["name"]
               for n in ctx.nodes("bookie") if n.get("host")}
    def one(i: int, topic: str) -> None:
        base.once(ctx, first_process + i, "read", topic, None,
                  lambda: read_topic(session, topic, ctx.spec.final_read_timeout))
        # another process id: the read's process is retired if the read ended info
        base.once(ctx, first_process + base.LEDGERS_OFFSET + i, "ledgers", topic, None,
                  lambda: ledger_list(ctx.admin_urls(), topic, ctx.cluster.get("zk_connect", ""), bookies))
    return [(f"read-{i}", lambda i=i, t=t: one(i, t)) for i, t in enumerate(ctx.keys)]


def drain(session: Session, topic: str, subscription: str, type_: str, name: str,
          idle_s: float = DRAIN_IDLE_S, max_s: float = DRAIN_MAX_S) -> tuple[str, dict[str, Any]]:
    """Receive and acknowledge until nothing has arrived for idle_s: ok with everything received
    (fail if nothing), info if still receiving after max_s."""
    end = time.monotonic() + max_s
    got: list[dict[str, Any]] = []
    node = ""
    idle_since = time.monotonic()
    while time.monotonic() < end:
        type_r, ch, _, _ = receive(session, topic, subscription, type_, name, max_messages=256)
        if type_r == OK:
            got += ch["value"]
            node = ch.get("node") or node
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= idle_s:
            return (OK, {"value": got, "node": node}) if got else (FAIL, {"error": "empty", "node": node})
        else:
            time.sleep(RECEIVE_WAIT_MS / 1000)
    return INFO, {"value": got, "error": f"drain still receiving after {max_s:.0f}s ({len(got)} messages)"}


def final_drains(ctx: Context, session: Session, subscription: str, type_: str,
                 f: str = "drain") -> list[tuple[str, Callable[[], None]]]:
    """One drain per topic on the workload's subscription, as (name, fn) pairs."""
    def one(i: int, topic: str) -> None:
        base.once(ctx, base.FINAL_PROCESS + i, f, topic, None,
                  lambda: drain(session, topic, subscription, type_, f"{ctx.run_dir.name[-6:]}-drain-{i}"))
    return [(f"drain-{i}", lambda i=i, t=t: one(i, t)) for i, t in enumerate(ctx.keys)]
