"""The schema workload: producers and consumers on a few topics evolve JSON schemas under faults, and at
the end every broker is asked for every topic's schema versions; judged by the schema checker.

Schemas. Every schema is a JSON (Avro-defined) record `Rec` named by a *label*, a pure function both
ways (`definition(label)`, `label_of(definition)`):

  base          id: int (required), w: string (required, the writer's label), x: int or null
  t<T>.<N>      base plus N optional string fields f<T>_1..f<T>_N (each with a default): thread T's
                Nth compatible evolution. Any two of them (of any threads) are FULL-compatible, so the
                namespace's strategy accepts every one, in any order
  <L>!type      L with x a string: no reader of the series can read it, nor it theirs: refused by every
                strategy but ALWAYS_COMPATIBLE, for producers and consumers alike
  <L>!drop      L without its required id: an old reader cannot read it (FORWARD fails), it can read
                old data (BACKWARD holds): refused for a producer under FULL and FORWARD, accepted
                for a consumer (whose check is BACKWARD against the latest under FULL); not tried
                for producers and registrations under BACKWARD, where it would be accepted and, as
                the latest version, refuse every later evolution of the series

`prepare` stores `base` on every topic through the admin API (so an incompatible schema is never a
topic's first one) and sets the namespace's strategy when `strategy` is not FULL (Pulsar's default).

Each logical client thread keeps, per topic, its current label, a producer and a Shared consumer made
with it, and takes seeded steps: send (the message's payload names its writer's label), receive (each
message's schema version from its metadata, its writer's label from its payload), or, now and then,
evolve: register its next label through the admin API of a random broker (one that does not own
the topic forwards `/admin/v2/schemas` to the owner, as Pulsar's SchemasResourceBase validates topic
ownership; the version it answered is recorded), create a producer or a
consumer with it, or try an incompatible schema. The Python client (3.13) does not expose the version
a producer was given (C++ `Producer::getSchemaVersion` is not bound), so that version is read off the
producer's messages, which carry it in their metadata.

After the faults: a final read of each topic from the earliest message (f "read"), then each broker's
answer to GET .../schemas for each topic, asked of that broker (f "registry", node = broker; the
broker forwards it to the topic's owner), in rounds (invoke value {"broker", "round"}).

Ops (f, invoke value -> ok value):
  create-producer / create-consumer  {"schema", "change"}  -> ok | fail (refused) | info
  register     {"schema", "change", "broker"} -> ok {"version"} | fail (409/4xx) | info
  send         {"value", "schema"} -> ok (message_id, node)
  receive      None -> ok [{"value", "schema", "version", "message_id"}]
  read         None -> ok [...] (final; as receive)
  registry     {"broker"} -> ok [{"version", "schema", "type"}] (final; one op per broker and topic)
`change` is "compatible", "type" or "drop".
"""
from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

from core.history import FAIL, INFO, OK, MessageId
from core.spec import TestSpec
from workloads import base
from workloads.base import FINAL_PROCESS, MAX_WORKERS, Context, Planned
from workloads.pulsar_client import SEND_TIMEOUT_MS, read_topic, session_for, topic_names

DESCRIPTION = ("producers and consumers evolve JSON schemas on a few topics (compatible and incompatible "
               "changes) under faults; every broker is asked for every topic's schema versions at the end")
OPTIONS: dict[str, tuple[Any, str]] = {
    "strategy": ("FULL", "the namespace's schema compatibility strategy (Pulsar's default is FULL)"),
    "evolve_share": (0.1, "share of a thread's steps that evolve its schema (the rest send or receive)"),
    "incompatible_share": (0.3, "share of evolutions that try an incompatible schema (a field's type changed, "
                                "or the required field removed)"),
    "register_share": (0.5, "share of compatible evolutions made through the admin API of a random broker "
                            "(then a producer uses the schema) rather than by creating a producer with it"),
}
CHOICES = {"strategy": ("FULL", "BACKWARD", "FORWARD", "ALWAYS_COMPATIBLE")}
SUBSCRIPTION = "schema"
RECEIVE_WAIT_MS = 100
RECEIVE_MAX = 16
ADMIN_TIMEOUT_S = 10.0
REGISTRY_TRIES_S = 30.0          # a final registry query is retried this long (a broker restarting)
REGISTRY_ROUNDS = 3              # final registry rounds at most (see start_final)
CHANGES = ("compatible", "type", "drop")


# ------------------------------------------------------------------------------------- schemas by label

def _fields(label: str) -> list[dict[str, Any]]:
    """The Avro fields of `label`'s record (see the module docstring)."""
    head, _, change = label.partition("!")
    fields: list[dict[str, Any]] = [{"name": "id", "type": "int"}, {"name": "w", "type": "string"},
                                    {"name": "x", "type": ["null", "int"], "default": None}]
    if head != "base":
        try:
            t, n = head[1:].split(".")
            thread, gen = int(t), int(n)
        except ValueError:
            raise ValueError(f"not a schema label: {label!r} (base, t<T>.<N>, with !type or !drop)") from None
        fields += [{"name": f"f{thread}_{k}", "type": ["null", "string"], "default": None}
                   for k in range(1, gen + 1)]
    if change == "type":
        fields[2] = {"name": "x", "type": ["null", "string"], "default": None}
    elif change == "drop":
        fields = fields[1:]
    elif change:
        raise ValueError(f"not a schema label: {label!r} (the change is !type or !drop)")
    return sorted(fields, key=lambda f: f["name"])


def definition(label: str) -> str:
    """The JSON schema definition (Avro record `Rec`) of `label`."""
    return json.dumps({"type": "record", "name": "Rec", "fields": _fields(label)}, sort_keys=True)


def label_of(defn: str | bytes) -> str:
    """The label of a definition this workload made; "?<first 40 chars>" for any other."""
    try:
        d = json.loads(defn)
        names = {f["name"]: f for f in d["fields"]}
        extra = sorted(n for n in names if n[:1] == "f" and "_" in n)
        if extra:
            threads = {n[1:].split("_")[0] for n in extra}
            if len(threads) != 1:
                raise ValueError
            head = f"t{threads.pop()}.{len(extra)}"
        else:
            head = "base"
        change = "!drop" if "id" not in names else ("!type" if "string" in json.dumps(names["x"]["type"]) else "")
        label = head + change
        if json.loads(definition(label)) == {k: d[k] for k in ("type", "name", "fields")} | {
                "fields": sorted(d["fields"], key=lambda f: f["name"])}:
            return label
    except (ValueError, KeyError, TypeError, IndexError):
        pass
    text = defn.decode("utf-8", "replace") if isinstance(defn, bytes) else str(defn)
    return "?" + " ".join(text.split())[:40]


_classes: dict[str, Any] = {}
_classes_lock = threading.Lock()


def record_class(label: str) -> Any:
    """A pulsar.schema.Record class whose JsonSchema has `label`'s definition (made once per label)."""
    from pulsar.schema import Integer, Record, String
    with _classes_lock:
        cls = _classes.get(label)
        if cls is None:
            attrs: dict[str, Any] = {"_sorted_fields": True}
            for f in _fields(label):
                t = f["type"]
                if f["name"] == "id":
                    attrs["id"] = Integer(required=True)
                elif f["name"] == "w":
                    attrs["w"] = String(required=True)
                elif f["name"] == "x":
                    attrs["x"] = String(required_default=True) if "string" in t else Integer(required_default=True)
                else:
                    attrs[f["name"]] = String(required_default=True)
            cls = _classes[label] = type("Rec", (Record,), attrs)
        return cls


def json_schema(label: str) -> Any:
    from pulsar.schema import JsonSchema
    return JsonSchema(record_class(label))


def next_label(thread: int, gen: int) -> str:
    """Thread `thread`'s compatible evolution number `gen` (its chain: base, t<T>.1, t<T>.2, ...)."""
    return f"t{thread}.{gen}"


def incompatible(label: str, change: str) -> str:
    return f"{label.partition('!')[0]}!{change}"


# ----------------------------------------------------------------------------------- the workload contract

def keys(spec: TestSpec, run_id: str) -> list[str]:
    return topic_names(spec.test_name, run_id, spec.topics)


def worker_count(spec: TestSpec) -> int:
    return max(1, min(MAX_WORKERS, spec.concurrency))


def generator(spec: TestSpec, thread: int, topics: list[str]) -> Iterator[Planned]:
    """Thread `thread`'s steps, a pure function of (seed, thread): ("step", topic, kind) where kind is
    send, receive or evolve; what an evolve does is drawn when it runs (it depends on the outcomes)."""
    rng = random.Random(f"{spec.seed}:schema:{thread}")
    delays = base.paced(rng, spec.rate / spec.concurrency)
    evolve = float(spec.options.get("evolve_share", OPTIONS["evolve_share"][0]))
    while True:
        r = rng.random()
        kind = "evolve" if r < evolve else ("send" if r < evolve + (1 - evolve) * 0.6 else "receive")
        yield Planned(kind, rng.choice(topics), None, next(delays))


def _schema_path(topic: str, what: str) -> str:
    tn = topic.split("://", 1)[-1]
    return "/admin/v2/schemas/" + "/".join(urllib.parse.quote(p, safe="") for p in tn.split("/")) + "/" + what


def _http(url: str, method: str = "GET", body: Any = None, timeout: float = ADMIN_TIMEOUT_S) -> tuple[int, Any]:
    """(status, parsed JSON or text); raises OSError (URLError) when no whole answer came: an answer
    cut short (http.client.HTTPException, e.g. IncompleteRead from a broker killed mid-response)
    is raised as ConnectionError, like a reset."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
    except http.client.HTTPException as e:
        raise ConnectionError(f"the answer was cut short: {type(e).__name__}: {e}") from e
    try:
        return status, json.loads(raw) if raw.strip() else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def register(admin_url: str, topic: str, label: str) -> tuple[str, dict[str, Any]]:
    """POST the schema of `label` to one broker: ok with the version it answered; fail when refused
    (4xx) or when the broker could not be reached at all; info otherwise (5xx, timeout: it may be
    stored)."""
    body = {"type": "JSON", "schema": definition(label), "properties": {}}
    try:
        status, got = _http(admin_url + _schema_path(topic, "schema"), "POST", body)
    except urllib.error.URLError as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, ConnectionRefusedError):
            return FAIL, {"error": f"ConnectionRefused: {reason}"}
        return INFO, {"error": f"{type(reason).__name__}: {reason}"}
    except OSError as e:               # a timeout or a reset after the request went out
        return INFO, {"error": f"{type(e).__name__}: {e}"}
    if status == 200 and isinstance(got, dict):
        try:
            return OK, {"value": {"version": int(got["version"]["version"])}}
        except (KeyError, TypeError, ValueError):
            return INFO, {"error": f"unexpected answer {str(got)[:200]}"}
    reason = got.get("reason") if isinstance(got, dict) else got
    if 400 <= status < 500:
        return FAIL, {"error": f"HTTP {status}: {str(reason)[:200]}"}
    return INFO, {"error": f"HTTP {status}: {str(reason)[:200]}"}


def prepare(ctx: Context) -> None:
    """The namespace's strategy (unless FULL), and `base` stored on every topic (retried ~60 s)."""
    strategy = str(ctx.spec.options.get("strategy") or "FULL")
    urls = ctx.admin_urls()
    deadline = time.monotonic() + 60
    todo = [("strategy", None)] if strategy != "FULL" else []
    todo += [("base", t) for t in ctx.keys]
    last = ""
    for what, topic in todo:
        while True:
            url = urls[int(time.monotonic()) % len(urls)]
            try:
                if what == "strategy":
                    status, got = _http(url + "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy",
                                        "POST", strategy)
                    if status in (200, 204):
                        break
                else:
                    type_, ch = register(url, topic, "base")
                    if type_ == OK:
                        break
                    status, got = 0, ch.get("error")
                last = f"{status} {got}"
            except OSError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise RuntimeError(f"schema workload: could not prepare {what} {topic or ''} within 60 s: {last}")
            time.sleep(1.0)


def _version(msg: Any) -> int | None:
    """The message's schema version (None: it has none). Message.schema_version() of the Python client
    (3.13) decodes the 8 bytes as UTF-8 and raises UnicodeDecodeError from version 128 on (a byte of
    0x80 or more); the binding's int_schema_version (C++ getLongSchemaVersion, -1 when absent) has
    no such limit, and is reached through the wrapper's `_message`."""
    raw = getattr(msg, "_message", msg)
    if hasattr(raw, "int_schema_version"):
        v = int(raw.int_schema_version())
        return None if v < 0 else v
    b = msg.schema_version()
    if isinstance(b, str):
        b = b.encode("latin-1")
    if not b or len(b) != 8:
        return None
    return int.from_bytes(b, "big", signed=True)


def decode(msg: Any) -> dict[str, Any]:
    """A received message as the history records it: value (id), its writer's schema label, the schema
    version in its metadata, its message id."""
    try:
        body = json.loads(msg.data())
        value, writer = body.get("id"), body.get("w")
    except (ValueError, AttributeError):
        value, writer = msg.data().decode("utf-8", "replace"), None
    return {"value": value, "schema": writer, "version": _version(msg),
            "message_id": asdict(MessageId.from_pulsar(msg.message_id()))}


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _close(obj: Any) -> None:
    def run() -> None:
        try:
            obj.close()
        except Exception:
            pass
    threading.Thread(target=run, daemon=True).start()


_REFUSED = ("IncompatibleSchema", "InvalidTopicName", "NotAllowedError")


def _creation_outcome(e: BaseException) -> str:
    """A failed create: fail when the broker refused it (nothing made), info otherwise (timeouts,
    lost connections: a producer may exist on the broker and its schema may be stored)."""
    return FAIL if type(e).__name__ in _REFUSED else INFO


class _Thread:
    """One logical client thread's producers, consumers and current labels, per topic."""

    def __init__(self, ctx: Context, session: Any, index: int):
        self.ctx = ctx
        self.session = session
        self.index = index
        o = ctx.spec.options
        self.incompatible_share = float(o.get("incompatible_share", OPTIONS["incompatible_share"][0]))
        self.register_share = float(o.get("register_share", OPTIONS["register_share"][0]))
        self.rng = ctx.rng("schema-evolve", index)
        # under BACKWARD(_TRANSITIVE) a producer's or registration's !drop is accepted and becomes
        # the latest version, which no later series schema (id required) can read: every evolution
        # after it would be refused, so only !type is tried there
        strategy = str(o.get("strategy") or "FULL")
        self.adding_changes = ("type",) if strategy in ("BACKWARD", "BACKWARD_TRANSITIVE") else ("type", "drop")
        self.label: dict[str, str] = {t: "base" for t in ctx.keys}
        self.gen = 0
        self.producers: dict[str, Any] = {}
        self.consumers: dict[str, Any] = {}
        self.sent = 0
        self.made = 0

    def name(self, kind: str, topic: str) -> str:
        return f"{self.ctx.run_dir.name[-6:]}-s{self.index}-{kind}{topic.rsplit('-', 1)[-1]}"

    # the planned step becomes one op: (f, key, value, perform)
    def plan(self, p: Planned) -> tuple[str, Any, Callable[[], tuple[str, dict[str, Any]]]]:
        topic = p.key
        if p.f == "send":
            if topic not in self.producers:
                return self._create("producer", topic, self.label[topic], "compatible")
            self.sent += 1
            value = (self.index + 1) * base.VALUE_STRIDE + self.sent
            label = self.label[topic]
            return "send", {"value": value, "schema": label}, lambda: self._send(topic, label, value)
        if p.f == "receive":
            if topic not in self.consumers:
                return self._create("consumer", topic, self.label[topic], "compatible")
            return "receive", None, lambda: self._receive(topic)
        # evolve
        if self.rng.random() < self.incompatible_share:
            role = self.rng.choice(("producer", "consumer", "register"))
            change = "type" if role == "consumer" else self.rng.choice(self.adding_changes)
            return self._create(role, topic, incompatible(self.label[topic], change), change)
        self.gen += 1
        label = next_label(self.index, self.gen)
        if self.rng.random() < self.register_share:
            return self._create("register", topic, label, "compatible")
        return self._create(self.rng.choice(("producer", "consumer")), topic, label, "compatible")

    def _create(self, role: str, topic: str, label: str, change: str
                ) -> tuple[str, Any, Callable[[], tuple[str, dict[str, Any]]]]:
        if role == "register":
            brokers = self.ctx.nodes("broker")
            b = self.rng.randrange(len(brokers)) if brokers else 0
            url = self.ctx.admin_urls()[b] if brokers else ""
            bname = brokers[b]["name"] if brokers else ""
            value = {"schema": label, "change": change, "broker": bname}

            def perform_register() -> tuple[str, dict[str, Any]]:
                type_, ch = register(url, topic, label)
                if type_ == OK and change == "compatible":
                    self.label[topic] = label
                    old = self.producers.pop(topic, None)        # the next send makes one with it
                    if old is not None:
                        _close(old)
                return type_, {**ch, "node": bname}
            return "register", value, perform_register
        return f"create-{role}", {"schema": label, "change": change}, lambda: self._make(role, topic, label, change)

    def _make(self, role: str, topic: str, label: str, change: str) -> tuple[str, dict[str, Any]]:
        import pulsar
        name = self.name("p" if role == "producer" else "c", topic)
        try:
            if role == "producer":
                obj = self.session.client.create_producer(
                    topic, schema=json_schema(label), producer_name=f"{name}-{self.session_gen()}",
                    send_timeout_millis=SEND_TIMEOUT_MS, batching_enabled=False, block_if_queue_full=False)
            else:
                obj = self.session.client.subscribe(
                    topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared, schema=json_schema(label),
                    initial_position=pulsar.InitialPosition.Earliest, consumer_name=name)
        except Exception as e:
            return _creation_outcome(e), {"error": _err(e)}
        try:        # made: the broker accepted the schema; where it runs is only for the record
            node = self.session.node_of(topic, obj.producer_name() if role == "producer" else SUBSCRIPTION)
        except Exception:
            node = ""
        if change != "compatible":           # refused by the strategy or not: it is not adopted
            _close(obj)
            return OK, {"node": node}
        table = self.producers if role == "producer" else self.consumers
        old, table[topic] = table.get(topic), obj
        if old is not None:
            _close(old)
        if role == "producer":
            self.label[topic] = label
        return OK, {"node": node}

    def session_gen(self) -> int:
        """A new number for a producer name (names are unique per topic)."""
        self.made += 1
        return self.made

    def _send(self, topic: str, label: str, value: int) -> tuple[str, dict[str, Any]]:
        import pulsar
        p = self.producers.get(topic)
        if p is None:
            return FAIL, {"error": "no producer"}
        try:
            mid = p.send(record_class(label)(id=value, w=label))
        except pulsar.PulsarException as e:
            kind = type(e).__name__
            if kind in ("AlreadyClosed", "NotConnected", "ProducerFenced", "TopicTerminated"):
                self.producers.pop(topic, None)
                _close(p)
            if kind in ("ProducerQueueIsFull", "NotConnected", "AlreadyClosed", "ProducerFenced",
                        "TopicTerminated", "InvalidMessage"):
                return FAIL, {"error": _err(e)}
            return INFO, {"error": _err(e)}
        except Exception as e:
            return INFO, {"error": _err(e)}
        return OK, {"message_id": MessageId.from_pulsar(mid), "node": self.session.node_of(topic, p.producer_name())}

    def _receive(self, topic: str) -> tuple[str, dict[str, Any]]:
        import pulsar
        c = self.consumers.get(topic)
        if c is None:
            return FAIL, {"error": "no consumer"}
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
            if type(e).__name__ in ("AlreadyClosed", "NotConnected", "ConsumerNotInitialized"):
                self.consumers.pop(topic, None)
                _close(c)
        value = [decode(m) for m in msgs]
        for m in msgs:
            try:
                c.acknowledge(m)
            except Exception:
                pass
        node = self.session.node_of(topic, SUBSCRIPTION)
        if not value:
            return FAIL, {"error": error, "node": node}
        return OK, {"value": value, "node": node}


def start(ctx: Context) -> list[threading.Thread]:
    session = session_for(ctx)
    mine = [i for i in range(ctx.spec.concurrency) if i % ctx.workers == ctx.worker]

    def run(i: int) -> None:
        th = _Thread(ctx, session, i)
        pending: dict[str, Callable[[], tuple[str, dict[str, Any]]]] = {}

        def planned() -> Iterator[Planned]:
            for p in generator(ctx.spec, i, ctx.keys):
                f, value, perform = th.plan(p)
                pending["perform"] = perform
                yield Planned(f, p.key, value, p.delay)

        base.drive(ctx, i, ctx.spec.concurrency, planned(), lambda p, process: pending["perform"]())
    return base.start_threads(ctx, [(f"thread-{i}", lambda i=i: run(i)) for i in mine])


def ask_registry(admin_url: str, topic: str, tries_s: float = REGISTRY_TRIES_S) -> tuple[str, dict[str, Any]]:
    """One broker's answer to GET .../schemas for `topic`: ok [{"version", "schema", "type"}], or info
    when it gave none within tries_s (a read: nothing to fail)."""
    deadline = time.monotonic() + tries_s
    last = ""
    while True:
        try:
            status, got = _http(admin_url + _schema_path(topic, "schemas"))
            if status == 200 and isinstance(got, dict):
                out = [{"version": int(s["version"]), "schema": label_of(s.get("data", "")),
                        "type": s.get("type")} for s in got.get("getSchemaResponses") or []]
                return OK, {"value": sorted(out, key=lambda s: s["version"])}
            last = f"HTTP {status}: {str(got)[:200]}"
        except OSError as e:
            last = _err(e)
        if time.monotonic() > deadline:
            return INFO, {"error": last}
        time.sleep(1.0)


def start_final(ctx: Context) -> list[threading.Thread]:
    session = session_for(ctx)
    brokers = ctx.nodes("broker")
    urls = ctx.admin_urls()

    def one(i: int, topic: str) -> None:
        base.once(ctx, FINAL_PROCESS + i, "read", topic, None,
                  lambda: read_topic(session, topic, ctx.spec.final_read_timeout, decode=decode))
        # every broker in turn; asked again (up to REGISTRY_ROUNDS) while their answers differ, so
        # that a registration still finishing on a broker is not taken for a divergence: the
        # checker compares each broker's last answer
        for r in range(REGISTRY_ROUNDS):
            answers: list[Any] = []
            for b, (node, url) in enumerate(zip(brokers, urls)):
                def ask(url: str = url, node: str = node["name"]) -> tuple[str, dict[str, Any]]:
                    type_, ch = ask_registry(url, topic)
                    answers.append(ch.get("value") if type_ == OK else None)
                    return type_, {**ch, "node": node}
                base.once(ctx, FINAL_PROCESS + base.LEDGERS_OFFSET + (i * REGISTRY_ROUNDS + r) * 100 + b,
                          "registry", topic, {"broker": node["name"], "round": r}, ask)
            if all(a == answers[0] for a in answers):
                return
            time.sleep(2.0)
    return base.start_threads(ctx, [(f"final-{i}", lambda i=i, t=t: one(i, t)) for i, t in enumerate(ctx.keys)])


def checkers(spec: TestSpec | None = None) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    from checkers import select
    strategy = str((spec.options if spec else {}).get("strategy") or "FULL")
    return select({"schema": {"strategy": strategy}, "perf": {"write_fs": ("send",)}})
