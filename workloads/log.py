"""The log workload: producers append unique ints to topics, Exclusive consumers receive and
acknowledge them, and final reads replay every topic from the earliest message to its end.

It owns the op generator (seeded, one stream per logical client thread), the client code that
performs one op with `pulsar-client` and maps its outcome to ok/fail/info, and its checkers.
"""
from __future__ import annotations

import logging
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from harness.history import FAIL, INFO, INVOKE, OK, Journal, MessageId, Op
from harness.spec import TestSpec

SUBSCRIPTION = "chaos"
SEND_TIMEOUT_MS = 10_000          # a send that takes longer is indeterminate (info)
OPERATION_TIMEOUT_S = 10          # lookups, producer/consumer creation
RECEIVE_WAIT_MS = 100             # a receive op waits this long for its first message
RECEIVE_MAX = 16                  # ... then takes what is already there, up to this many
BATCH_DELAY_MS = 20               # batched producers: a wider window so concurrent sends share a batch
READ_NEXT_MS = 2_000
VALUE_STRIDE = 10_000_000         # value = (thread + 1) * VALUE_STRIDE + n: unique across the run
FINAL_READ_PROCESS = 1_000_000    # process ids of the final reads: FINAL_READ_PROCESS + topic index
MAX_WORKERS = 2                   # worker processes (the machine has 2 cores; each runs threads)

# exceptions whose send certainly never reached the broker
_SEND_FAILS = ("ProducerQueueIsFull", "MemoryBufferIsFull", "MessageTooBig", "InvalidMessage", "ChecksumError",
               "NotConnected", "ProducerFenced", "TopicTerminated", "ProducerBlockedQuotaExceededError",
               "ProducerBlockedQuotaExceededException", "InvalidTopicName")
# exceptions after which a producer or consumer is unusable and is made again
_BROKEN = ("AlreadyClosed", "NotConnected", "ProducerFenced", "TopicTerminated", "ConsumerNotInitialized",
           "ProducerNotInitialized")


def __getattr__(name: str) -> Any:
    # CHECKERS is resolved on first use so that workers (which never check) don't import checkers
    if name == "CHECKERS":
        from checkers import log as log_checker
        return {"log": log_checker.check}
    raise AttributeError(name)


# ------------------------------------------------------------------------------------ the plan

@dataclass(frozen=True)
class Thread:
    """A logical client thread: its role, its topics and the worker process that runs it."""
    index: int
    role: str                      # "send" or "receive"
    batched: bool                  # senders: a batching producer or not
    topics: tuple[int, ...]        # topic indexes it picks from
    worker: int


@dataclass(frozen=True)
class Planned:
    f: str
    topic: int
    value: int | None
    delay: float                   # seconds after the previous op's start


def topic_names(test_name: str, run_id: str, n: int) -> list[str]:
    return [f"persistent://public/default/{test_name}-{run_id}-{i}" for i in range(n)]


def worker_count(spec: TestSpec) -> int:
    return max(1, min(MAX_WORKERS, spec.concurrency))


def threads(spec: TestSpec, workers: int | None = None) -> list[Thread]:
    """The `concurrency` logical threads: up to one consumer per topic (at most a third of the threads,
    none with a single thread), then senders alternating batched and unbatched.

    Consumers go round-robin over the workers; batched senders to worker 0 and unbatched ones to the
    last worker, so that the batched senders of a worker share one batching producer per topic and
    their concurrent sends land in the same batch."""
    w = workers or worker_count(spec)
    c = spec.concurrency
    n_recv = 0 if c < 2 else min(spec.topics, max(1, c // 3))
    out = []
    for i in range(n_recv):
        out.append(Thread(i, "receive", False, tuple(t for t in range(spec.topics) if t % n_recv == i), i % w))
    for j in range(c - n_recv):
        batched = j % 2 == 0
        out.append(Thread(n_recv + j, "send", batched, tuple(range(spec.topics)), 0 if batched else w - 1))
    return out


def generator(spec: TestSpec, thread: Thread) -> Iterator[Planned]:
    """The thread's ops, a pure function of (seed, thread): same seed, same values, topics and kinds.

    Ops are staggered: a uniform delay in [0, 2/r) between starts, r = rate / concurrency."""
    rng = random.Random(f"{spec.seed}:log:{thread.index}")
    per_thread = spec.rate / spec.concurrency
    n = 0
    while True:
        delay = rng.uniform(0.0, 2.0 / per_thread)
        topic = rng.choice(thread.topics)
        if thread.role == "send":
            n += 1
            yield Planned("send", topic, (thread.index + 1) * VALUE_STRIDE + n, delay)
        else:
            yield Planned("receive", topic, None, delay)


# ------------------------------------------------------------------------------------ the client

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
                 out: TextIO = sys.stdout, producer_lifetime: float = 0.0):
        import pulsar
        self.name = name
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
        self._consumers: dict[str, Any] = {}
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
        key = (topic, batched)
        p = self._producers.get(key)
        if p is not None and not self._expired(key):
            return p
        with self._maker_lock(key):             # one creation at a time per producer
            p = self._producers.get(key)
            if p is not None and self._expired(key):
                try:
                    p = self._make_producer(topic, batched)
                except Exception:
                    self._born[key] = time.monotonic()     # keep the old one; try again later
                    return p
                old, self._producers[key] = self._producers.get(key), p
                if old is not None:
                    _close_later(old, SEND_TIMEOUT_MS / 1000 + 5)   # its sends end on their own first
                return p
            if p is None:
                p = self._make_producer(topic, batched)
                self._producers[key] = p
            return p

    def _make_producer(self, topic: str, batched: bool) -> Any:
        key = (topic, batched)
        with self._lock:
            self._generation += 1
            gen = self._generation
        name = f"{self.name}-{topic.rsplit('-', 1)[-1]}-{'b' if batched else 'u'}{gen}"
        kw: dict[str, Any] = dict(producer_name=name, send_timeout_millis=SEND_TIMEOUT_MS,
                                  block_if_queue_full=False)
        if batched:
            kw.update(batching_enabled=True, batching_max_publish_delay_ms=BATCH_DELAY_MS)
        p = self.client.create_producer(topic, **kw)
        # lifetimes spread over 0.75-1.25x so producers are not all replaced at once
        self._born[key] = time.monotonic() - self.producer_lifetime * (self._jitter.random() - 0.5) / 2
        return p

    def drop_producer(self, topic: str, batched: bool, p: Any) -> None:
        with self._lock:
            if self._producers.get((topic, batched)) is p:
                del self._producers[(topic, batched)]
        _close_in_background(p)

    def consumer(self, topic: str) -> Any:
        import pulsar
        c = self._consumers.get(topic)
        if c is not None:
            return c
        with self._maker_lock(("consumer", topic)):
            c = self._consumers.get(topic)
            if c is None:
                c = self.client.subscribe(topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Exclusive,
                                          initial_position=pulsar.InitialPosition.Earliest,
                                          consumer_name=f"{self.name}-c")
                self._consumers[topic] = c
            return c

    def drop_consumer(self, topic: str, c: Any) -> None:
        with self._lock:
            if self._consumers.get(topic) is c:
                del self._consumers[topic]
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


def _decode(msg: Any, with_redelivery: bool) -> dict[str, Any]:
    data = msg.data()
    try:
        value: Any = int(data.decode())
    except (UnicodeDecodeError, ValueError):
        value = data.decode("utf-8", "replace")
    d: dict[str, Any] = {"value": value, "message_id": asdict(MessageId.from_pulsar(msg.message_id()))}
    if with_redelivery:
        d["redelivery_count"] = msg.redelivery_count()
    return d


def send(session: Session, topic: str, batched: bool, value: int) -> tuple[str, dict[str, Any]]:
    """One send: ok with the message id and broker; fail if it certainly was not written; info if unsure."""
    import pulsar
    try:
        p = session.producer(topic, batched)
    except Exception as e:      # no producer: the message never left this process
        return FAIL, {"error": f"create_producer: {_err(e)}"}
    try:
        mid = p.send(str(value).encode())
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


def receive(session: Session, topic: str) -> tuple[str, dict[str, Any]]:
    """One receive: ok with the messages that arrived (acknowledged one by one), fail if none did."""
    import pulsar
    try:
        c = session.consumer(topic)
    except Exception as e:
        return FAIL, {"error": f"subscribe: {_err(e)}"}
    msgs: list[Any] = []
    error = f"Timeout: no message within {RECEIVE_WAIT_MS} ms"
    try:
        msgs.append(c.receive(RECEIVE_WAIT_MS))
        while len(msgs) < RECEIVE_MAX:
            msgs.append(c.receive(1))
    except pulsar.Timeout:
        pass
    except Exception as e:
        error = _err(e)
        if type(e).__name__ in _BROKEN:
            session.drop_consumer(topic, c)
    value = [_decode(m, True) for m in msgs]
    for m in msgs:
        try:
            c.acknowledge(m)          # fire-and-forget in the client; checked through redeliveries
        except Exception:
            pass
    node = session.node_of(topic, SUBSCRIPTION)
    if not value:
        return FAIL, {"error": error, "node": node}
    return OK, {"value": value, "node": node}


def read_topic(session: Session, topic: str, timeout_s: float) -> tuple[str, dict[str, Any]]:
    """A final read: every message of the topic from the earliest, in order, until the reader has no
    more (the broker's last message id is reached). info if that does not happen within timeout_s;
    a broken reader starts over from the earliest."""
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
            out.append(_decode(msg, False))
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


# ------------------------------------------------------------------------------------ running threads

class Retired(Exception):
    """The journal was closed under a thread (the worker is stopping)."""


def _append(journal: Journal, op: Op) -> Op:
    try:
        return journal.append(op)
    except ValueError:          # I/O on a closed file: the worker is shutting down
        raise Retired() from None


def run_thread(session: Session, spec: TestSpec, thread: Thread, topics: list[str], journal: Journal,
               deadline: float, stop: threading.Event,
               on_op: Callable[[Op], None] | None = None) -> None:
    """Perform the thread's ops until `deadline` (time.monotonic()) or `stop`. A process whose op ended
    info is retired; the thread continues as process + concurrency."""
    process = thread.index
    # make producers/consumers before the first op, so the first ops measure the system, not set-up
    for t in thread.topics:
        if stop.is_set() or time.monotonic() >= deadline:
            break
        try:
            if thread.role == "send":
                session.producer(topics[t], thread.batched)
            else:
                session.consumer(topics[t])
        except Exception:
            pass                # made again (and the failure recorded) by the first op that needs it
    next_start = time.monotonic()
    try:
        for planned in generator(spec, thread):
            next_start = max(next_start + planned.delay, time.monotonic())
            if next_start >= deadline:
                return
            if stop.wait(max(0.0, next_start - time.monotonic())):
                return
            topic = topics[planned.topic]
            inv = _append(journal, Op(process=process, type=INVOKE, f=planned.f, key=topic, value=planned.value))
            if planned.f == "send":
                type_, changes = send(session, topic, thread.batched, planned.value)  # type: ignore[arg-type]
            else:
                type_, changes = receive(session, topic)
            done = _append(journal, inv.complete(type_, **changes))
            if on_op:
                on_op(done)
            if type_ == INFO:
                process += spec.concurrency
    except Retired:
        return


def run_final_reads(session: Session, spec: TestSpec, topics: list[str], journal: Journal,
                    stop: threading.Event) -> list[threading.Thread]:
    """One thread per topic, each reading it from the earliest; returns the started threads."""
    def one(i: int, topic: str) -> None:
        try:
            inv = _append(journal, Op(process=FINAL_READ_PROCESS + i, type=INVOKE, f="read", key=topic))
            type_, changes = read_topic(session, topic, spec.final_read_timeout)
            _append(journal, inv.complete(type_, **changes))
        except Retired:
            pass
    out = []
    for i, topic in enumerate(topics):
        t = threading.Thread(target=one, args=(i, topic), name=f"read-{i}", daemon=True)
        t.start()
        out.append(t)
    return out
