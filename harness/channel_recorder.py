"""The channel recorder: the bundle-owner source of the extensible load manager. It reads the service-unit
state channel (`persistent://pulsar/system/loadbalancer-service-unit-state`) with the official
`pulsar-client` Reader from its earliest message, from the runner's host, and samples every broker's
table view; it journals (core/observations.py):

- `observe-start` {"source": "channel", "topic", "service_url", "nodes", "ports" (every "host:port" of
  the cluster, brokers' http ports included: a brokerId `<host>:<http port>` maps to its node), "brokers"};
- `channel-message`, one per message in the topic's order, and the neutral `bundle-owner` rows the
  channel checker's oracle (checkers/channel.py: Pulsar's conflict resolver) derives from them: a bundle's
  owner is the dstBroker of its accepted Owned record, or the sourceBroker of its accepted Splitting
  record (a split parent stays with its owner until Deleted); an ownership starts (`created`,
  incarnation = the versionId of the record that made it) when an accepted record names a new owner and
  ends (`deleted`) when an accepted record names none or another. What the channel held before the
  recorder started is read first and journaled as `present` rows (the table at the end of that read),
  then its messages;
- `channel-view`, every `view_interval_s`, one per broker: its answer to `GET
  /admin/v2/loadbalancer/channel`, or {"error"}; after the run (`stop`), rounds marked `final` until
  every answering broker has applied the channel's last message (or `final_views_s` ran out);
- `observe-gap-start` / `observe-gap-end` while the reader is disconnected (the client reconnects by
  itself) or after a read failed (a new reader from the last message read, exclusive); messages are
  not lost by a gap (the topic keeps them), only learnt late;
- `observe-stop`, after draining the topic to its end.

Two threads (the reader and the view poller); every loop bounded in rows, time and reconnections.
It never writes to the channel.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from checkers.channel import Oracle, RecordError, owner_of
from checkers.channel import record as channel_record
from core.history import OBSERVER_PROCESS, OK, Journal, Op
from core.observations import (BROKER_REGISTRATION, BROKERS_PATH, BUNDLE_OWNER, CHANNEL_MESSAGE, CHANNEL_TOPIC,
                               CHANNEL_VIEW, CREATED, DELETED, GAP_END, GAP_START, OBSERVE_START, OBSERVE_STOP,
                               PRESENT, parse_bundle_name)
from harness.recorder import OwnershipRecorder, RecorderError, nodes_of

# the metadata store's records (clusters/loadbalancer/extensible/metadata_store.py's layout)
METADATA_PATH_PREFIX = "/service_unit_state"


def metadata_key_of(path: str) -> str | None:
    """The bundle of a record's znode `/service_unit_state/<t>/<ns>/<range>`, else None."""
    if not path.startswith(METADATA_PATH_PREFIX + "/"):
        return None
    rest = path[len(METADATA_PATH_PREFIX) + 1:]
    return rest if len(rest.split("/")) == 3 and parse_bundle_name(rest) is not None else None

log = logging.getLogger("pulsar_chaos.channel_recorder")

JOURNAL_NAME = "ownership.jsonl"
VIEW_PATH = "/admin/v2/loadbalancer/channel"
VIEW_INTERVAL_S = 2.0
VIEW_TIMEOUT_S = 2.0
READ_TIMEOUT_MS = 200
START_TIMEOUT_S = 15.0
MAX_EVENTS = 1_000_000            # journal rows; past this the recorder stops journaling (a gap to the end)
MAX_CATCH_UP = 200_000            # messages buffered while reading what the channel held at the start
MAX_RECONNECTS = 50               # new readers after failed reads
MAX_DATA = 4096                   # characters of an undecodable value kept
DRAIN_S = 30.0                    # reading the topic to its end after the run
FINAL_VIEWS_S = 10.0              # the final view rounds
STOP_JOIN_S = 5.0


class ChannelRecorderError(RuntimeError):
    """The recorder could not start (the channel unreadable); the message says what and the fix."""


def brokers_of(cluster: dict[str, Any]) -> list[tuple[str, str]]:
    """(brokerId `<host>:<http port>`, its web URL) of each broker of cluster.json."""
    out = []
    for n in cluster.get("nodes") or []:
        http = (n.get("ports") or {}).get("http")
        if n.get("role") == "broker" and n.get("host") and isinstance(http, int):
            out.append((f"{n['host']}:{http}", f"http://{n['host']}:{http}"))
    return out


def _client(service_url: str) -> Any:
    import pulsar
    return pulsar.Client(service_url, operation_timeout_seconds=10, connection_timeout_ms=5000,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _earliest() -> Any:
    import pulsar
    return pulsar.MessageId.earliest


def _is_timeout(e: BaseException) -> bool:
    import pulsar
    return isinstance(e, pulsar.Timeout)


def fetch_view(url: str, timeout: float = VIEW_TIMEOUT_S) -> dict[str, Any]:
    """One broker's answer to the view endpoint, or {"error"}."""
    try:
        with urllib.request.urlopen(url + VIEW_PATH, timeout=timeout) as r:
            body = json.loads(r.read())
        return body if isinstance(body, dict) else {"error": f"not a JSON object: {str(body)[:200]}"}
    except urllib.error.HTTPError as e:
        return {"error": f"HTTP {e.code}"}
    except Exception as e:                  # refused, timed out, not JSON
        return {"error": f"{type(e).__name__}: {e}"[:300]}


class _ViewSampler:
    """The brokers' table views sampled every `view_interval_s` until `_views_stop` is set, then the final
    rounds (both recorders; each says which brokers are behind, `_behind`)."""
    brokers: list[tuple[str, str]]
    view_interval_s: float
    final_views_s: float
    view_fetch: Callable[[str], dict[str, Any]]
    _views_stop: threading.Event
    _row: Callable[[str, str, dict[str, Any]], None]    # the recorder's journal row

    def _view_loop(self) -> None:
        try:
            while not self._views_stop.wait(self.view_interval_s):
                self._view_round(final=False)
        except Exception as e:              # never the runner's problem; the samples just end
            log.warning("channel recorder: view sampling ended: %s: %s", type(e).__name__, e)

    def _view_round(self, final: bool) -> dict[str, dict[str, Any]]:
        out = {}
        for broker, url in self.brokers:
            if not final and self._views_stop.is_set():
                break
            v = self.view_fetch(url)
            v["wall_ms"] = _wall_ms()
            if final:
                v["final"] = True
            out[broker] = v
            self._row(broker, CHANNEL_VIEW, v)
        return out

    def _final_views(self) -> None:
        """Rounds marked final until no answering broker is behind (`_behind`), or `final_views_s` ran out
        (one round at least); `_between_final_rounds()` after the pause that follows a round with one behind."""
        if not self.brokers:
            return
        end = time.monotonic() + self.final_views_s
        while True:
            behind = self._behind(self._view_round(final=True))
            if not behind or time.monotonic() >= end:
                return
            time.sleep(1.0)
            self._between_final_rounds()

    def _behind(self, views: dict[str, dict[str, Any]]) -> list[str]:
        """The brokers of one final round (broker -> its view) whose view is behind the recorder's."""
        raise NotImplementedError

    def _between_final_rounds(self) -> None:
        """What the recorder does between two final rounds (nothing unless it says)."""


class ChannelRecorder(_ViewSampler):
    """`start()`, then `stop()` (always: it drains the topic, takes the final views, closes the client)."""

    def __init__(self, service_url: str, journal: Journal, *, nodes: dict[str, Any] | None = None,
                 brokers: list[tuple[str, str]] | None = None, topic: str = CHANNEL_TOPIC,
                 view_interval_s: float = VIEW_INTERVAL_S, max_events: int = MAX_EVENTS,
                 max_reconnects: int = MAX_RECONNECTS, drain_s: float = DRAIN_S, final_views_s: float = FINAL_VIEWS_S,
                 client_factory: Callable[[str], Any] = _client,
                 view_fetch: Callable[[str], dict[str, Any]] = fetch_view):
        self.service_url = service_url
        self.journal = journal
        self.nodes = nodes or {}
        self.brokers = list(brokers or [])
        self.topic = topic
        self.view_interval_s = view_interval_s
        self.max_events = max_events
        self.max_reconnects = max_reconnects
        self.drain_s = drain_s
        self.final_views_s = final_views_s
        self.client_factory = client_factory
        self.view_fetch = view_fetch
        self.events = 0
        self.messages = 0
        self.gaps = 0
        self.reconnects = 0
        self._client: Any = None
        self._reader: Any = None
        self._last_id: Any = None             # the client's MessageId of the last message read
        self._last_mid: list[int] | None = None
        self._oracle = Oracle()
        self._owned: dict[str, tuple[str, int]] = {}     # bundle -> (owner, incarnation)
        self._stop = threading.Event()
        self._views_stop = self._stop          # the views' sampling ends with the reader
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._row_lock = threading.Lock()
        self._stopped = False
        self._overflow = False
        self._in_gap = False
        self._last_contact = time.monotonic()
        self._done = threading.Event()

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = START_TIMEOUT_S) -> "ChannelRecorder":
        end = time.monotonic() + timeout
        err: Exception | None = None
        try:
            self._client = self.client_factory(self.service_url)
        except Exception as e:
            raise ChannelRecorderError(f"no client for {self.service_url} ({type(e).__name__}: {e}); fix: check "
                                       f"the cluster's service URL (cluster.json: service_url)") from None
        while time.monotonic() < end:
            try:
                self._reader = self._new_reader(_earliest())
                break
            except Exception as e:
                err = e
                time.sleep(0.5)
        if self._reader is None:
            self._close_client()
            raise ChannelRecorderError(f"cannot read {self.topic} at {self.service_url} ({type(err).__name__}: "
                                       f"{err}); fix: check the cluster's brokers and that its load manager is "
                                       f"the extensible one") from None
        self._row("", OBSERVE_START, {"source": "channel", "topic": self.topic, "service_url": self.service_url,
                                      "nodes": self.nodes.get("nodes", {}), "ports": self.nodes.get("ports", {}),
                                      "brokers": [b for b, _ in self.brokers],
                                      "view_interval_s": self.view_interval_s, "wall_ms": _wall_ms()})
        self._catch_up(end)
        t = threading.Thread(target=self._read_loop, name="channel-recorder", daemon=True)
        self._threads.append(t)
        t.start()
        if self.brokers and self.view_interval_s > 0:
            p = threading.Thread(target=self._view_loop, name="channel-views", daemon=True)
            self._threads.append(p)
            p.start()
        return self

    def stop(self, reason: str = "run ended") -> None:
        """Stop, read the topic to its end, take the final views, journal `observe-stop`. Idempotent;
        never raises."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop.set()
        for t in self._threads:
            t.join(self.drain_s + self.final_views_s + STOP_JOIN_S if t.name == "channel-recorder" else STOP_JOIN_S)
            if t.is_alive():
                log.warning("channel recorder: thread %s still runs", t.name)
        try:
            self._row("", OBSERVE_STOP, {"events": self.events, "messages": self.messages, "gaps": self.gaps,
                                         "reconnects": self.reconnects, "reason": reason, "wall_ms": _wall_ms(),
                                         "last_message_id": self._last_mid})
            self.journal.sync()
        except Exception as e:
            log.warning("channel recorder: final row: %s", e)
        self._close_reader()
        self._close_client()

    # ------------------------------------------------------------------------------------ journal

    def _row(self, key: str, f: str, value: dict[str, Any]) -> None:
        with self._row_lock:                 # the reader and the view poller both journal
            self._row_locked(key, f, value)

    def _row_locked(self, key: str, f: str, value: dict[str, Any]) -> None:
        if self.events >= self.max_events and f != OBSERVE_STOP:
            if not self._overflow:
                self._overflow = True
                now = self._now_s()
                self.journal.append(Op(process=OBSERVER_PROCESS, type=OK, f=GAP_START, value={
                    "reason": f"more than {self.max_events} rows: recording stopped", "detected_s": now,
                    "may_start_s": now}))
            return
        self.events += 1
        self.journal.append(Op(process=OBSERVER_PROCESS, type=OK, f=f, key=key, value=value))

    def _now_s(self) -> float:
        return round((time.monotonic_ns() - self.journal.t0_ns) / 1e9, 6)

    # ------------------------------------------------------------------------------------ reading

    def _new_reader(self, start: Any) -> Any:
        return self._client.create_reader(self.topic, start, reader_name=f"pulsar-chaos-channel-{id(self):x}",
                                          receiver_queue_size=1000)

    def _read_one(self, timeout_ms: int = READ_TIMEOUT_MS) -> Any | None:
        """The next message, or None on a timeout; raises on any other failure."""
        try:
            return self._reader.read_next(timeout_ms)
        except Exception as e:
            if _is_timeout(e):
                return None
            raise

    def _decode(self, msg: Any) -> tuple[str, list[int], dict[str, Any]]:
        mid = msg.message_id()
        m = [mid.ledger_id(), mid.entry_id(), mid.batch_index()]
        data = msg.data() or b""
        value: dict[str, Any] = {"message_id": m, "publish_ms": msg.publish_timestamp(), "wall_ms": _wall_ms()}
        null = bool(msg.has_null_value()) if hasattr(msg, "has_null_value") else False
        if null or not data:
            value["value"] = None
        else:
            try:
                value["value"] = json.loads(data)
            except (UnicodeDecodeError, ValueError):
                value["value"] = None
                value["undecodable"] = data.decode("utf-8", "replace")[:MAX_DATA]
        return msg.partition_key() or "", m, value

    def _catch_up(self, end: float) -> None:
        """What the channel holds now: read to its end (bounded), then the `present` owners, then the
        messages."""
        buf: list[tuple[str, list[int], dict[str, Any]]] = []
        try:
            while len(buf) < MAX_CATCH_UP and time.monotonic() < end + self.drain_s and self._reader.has_message_available():
                msg = self._read_one(1000)
                if msg is None:
                    continue
                self._last_id = msg.message_id()
                buf.append(self._decode(msg))
        except Exception as e:
            log.info("channel recorder: first read interrupted: %s: %s", type(e).__name__, e)
            self._gap(f"first read failed: {type(e).__name__}")
        for key, mid, value in buf:
            self._apply(key, mid, value, journal_owners=False)
        for key in sorted(self._owned):
            broker, inc = self._owned[key]
            self._owner_row(key, PRESENT, broker, inc, self._oracle.table.get(key), None)
        for key, mid, value in buf:
            self._message_row(key, mid, value)

    def _apply(self, key: str, mid: list[int], value: dict[str, Any], journal_owners: bool = True) -> None:
        """The oracle's verdict on one message, and the bundle-owner rows it makes."""
        raw = value.get("undecodable", value.get("value"))
        ok, _, _, rec = self._oracle.apply(key, raw, raw is None)
        if not ok:
            return
        new = owner_of(rec)
        old = self._owned.get(key)
        if old is not None and old[0] != new:
            del self._owned[key]
            if journal_owners:
                self._owner_row(key, DELETED, old[0], old[1], rec, value)
        if new is not None and (old is None or old[0] != new):
            self._owned[key] = (new, rec["versionId"])
            if journal_owners:
                self._owner_row(key, CREATED, new, rec["versionId"], rec, value)

    def _message_row(self, key: str, mid: list[int], value: dict[str, Any]) -> None:
        self.messages += 1
        self._last_mid = mid
        self._row(key, CHANNEL_MESSAGE, value)

    def _owner_row(self, key: str, event: str, broker: str, incarnation: int, rec: dict | None,
                   value: dict[str, Any] | None) -> None:
        parsed = parse_bundle_name(key)
        row = {"event": event, "source": "channel", "namespace": parsed[0] if parsed else None,
               "range": list(parsed[1]) if parsed else None, "broker": broker, "incarnation": incarnation,
               "session": None, "state": rec["state"] if rec else None, "wall_ms": _wall_ms()}
        if value is not None:
            row["message_id"] = value.get("message_id")
            if event == CREATED and isinstance(value.get("publish_ms"), int):
                row["ctime_ms"] = value["publish_ms"]       # when it began, as the ownership checker reads it
        self._row(key, BUNDLE_OWNER, row)

    def _handle(self, msg: Any) -> None:
        self._last_id = msg.message_id()
        key, mid, value = self._decode(msg)
        self._message_row(key, mid, value)
        self._apply(key, mid, value)

    def _read_loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._read_step()
            self._drain()
            self._final_views()
        except Exception as e:              # the loop must never take the runner down
            log.error("channel recorder failed: %s: %s", type(e).__name__, e, exc_info=True)
            try:
                self._gap(f"recorder error {type(e).__name__}: {e}")
            except Exception:
                pass

    def _read_step(self) -> None:
        if self._reader is None:
            self._reopen()
            return
        try:
            msg = self._read_one()
        except Exception as e:
            log.info("channel recorder: read failed: %s: %s", type(e).__name__, e)
            self._gap(f"read failed: {type(e).__name__}: {e}")
            self._close_reader()
            return
        if msg is not None:
            self._last_contact = time.monotonic()
            try:
                self._handle(msg)
            except Exception as e:          # a message we cannot journal: say so, and go on
                log.warning("channel recorder: a message not journaled: %s: %s", type(e).__name__, e)
                self._gap(f"a message not journaled: {type(e).__name__}: {e}")
            return
        if not self._connected():
            self._gap("reader disconnected")
            return
        if self._in_gap:
            try:
                caught_up = not self._reader.has_message_available()
            except Exception as e:
                log.info("channel recorder: has_message_available failed: %s: %s", type(e).__name__, e)
                self._close_reader()
                return
            if caught_up:
                self._gap_end()

    def _connected(self) -> bool:
        try:
            return bool(self._reader.is_connected())
        except Exception:
            return False

    def _reopen(self) -> None:
        """A new reader from the last message read (exclusive), after a failed read; bounded."""
        if self.reconnects >= self.max_reconnects:
            self._stop.wait(1.0)
            time.sleep(0.05)                  # also once stopped (the drain's loop): never spin
            return
        self.reconnects += 1
        try:
            self._reader = self._new_reader(self._last_id if self._last_id is not None else _earliest())
        except Exception as e:
            log.info("channel recorder: new reader failed: %s: %s", type(e).__name__, e)
            self._stop.wait(min(5.0, 0.2 * 2 ** min(self.reconnects, 5)))

    def _gap(self, reason: str) -> None:
        if self._in_gap:
            return
        self._in_gap = True
        self.gaps += 1
        now = self._now_s()
        since = (self._last_contact * 1e9 - self.journal.t0_ns) / 1e9
        self._row("", GAP_START, {"reason": reason, "detected_s": now, "may_start_s": round(min(now, since), 6)})

    def _gap_end(self) -> None:
        self._in_gap = False
        self._last_contact = time.monotonic()
        self._row("", GAP_END, {"session": None, "last_message_id": self._last_mid})

    def _drain(self) -> None:
        """Read the topic to its end (bounded by `drain_s`)."""
        end = time.monotonic() + self.drain_s
        while time.monotonic() < end:
            if self._reader is None:
                self._reopen()
                if self._reader is None:
                    continue
            try:
                if not self._reader.has_message_available():
                    if self._in_gap:
                        self._gap_end()
                    return
                msg = self._read_one(1000)
            except Exception as e:
                self._gap(f"drain failed: {type(e).__name__}: {e}")
                self._close_reader()
                continue
            if msg is not None:
                self._handle(msg)

    # ------------------------------------------------------------------------------------ views

    def _behind(self, views: dict[str, dict[str, Any]]) -> list[str]:
        """The final rounds last until every answering broker applied the last message read."""
        last = self._last_mid[:2] if self._last_mid else None
        return [b for b, v in views.items() if "error" not in v and (
            list(v["last_applied"])[:2] if isinstance(v.get("last_applied"), list) else None) != last]

    def _between_final_rounds(self) -> None:
        self._drain()                       # what was sent meanwhile

    # ------------------------------------------------------------------------------------ closing

    def _close_reader(self) -> None:
        r, self._reader = self._reader, None
        if r is not None:
            try:
                r.close()
            except Exception:
                pass

    def _close_client(self) -> None:
        c, self._client = self._client, None
        if c is not None:
            try:
                c.close()
            except Exception:
                pass


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class MetadataChannelRecorder(_ViewSampler, OwnershipRecorder):
    """The same observations when the channel's records are znodes (the brokers' setting
    `loadManagerServiceUnitStateTableViewClassName=ServiceUnitStateMetadataStoreTableViewImpl`): the ownership
    recorder's ZooKeeper watching (harness/recorder.py: watches, gaps, full re-reads) on
    `/service_unit_state/<tenant>/<ns>/<range>` and on the brokers' registrations. `observe-start` says
    `"source": "metadata-store"`. Every record the recorder reads that differs from the last it read of that
    bundle is a `channel-message` row whose message id is `[mzxid, 0, -1]` (the write's ZooKeeper
    transaction id: the store's order; a deletion is a tombstone at the zxid of the read that found it
    gone) and `publish_ms` the znode's mtime; writes between two reads of one znode are not seen (the store
    keeps only the last), so the channel checker takes these records as they are (the store's resolver
    passed them) instead of replaying a resolver over them. The `bundle-owner` rows follow the records as
    the topic recorder's do (incarnation: the versionId), `broker-registration` rows come from
    `/loadbalance/brokers`, and every broker's table view is sampled as by the topic recorder; the final
    rounds last until every answering broker's records equal the store's (or `final_views_s`)."""

    def __init__(self, zk_connect: str, journal: Journal, *, nodes: dict[str, Any] | None = None,
                 brokers: list[tuple[str, str]] | None = None, view_interval_s: float = VIEW_INTERVAL_S,
                 final_views_s: float = FINAL_VIEWS_S,
                 view_fetch: Callable[[str], dict[str, Any]] = fetch_view, **kw: Any):
        super().__init__(zk_connect, journal, nodes=nodes,
                         roots=((METADATA_PATH_PREFIX, 3, CHANNEL_MESSAGE), (BROKERS_PATH, 1, BROKER_REGISTRATION)),
                         **kw)
        self.brokers = list(brokers or [])
        self.view_interval_s = view_interval_s
        self.final_views_s = final_views_s
        self.view_fetch = view_fetch
        self.messages = 0
        self._table: dict[str, Any] = {}                 # bundle -> the last record read (JSON) 
        self._owned: dict[str, tuple[str, int]] = {}     # bundle -> (owner, incarnation)
        self._row_lock = threading.Lock()
        self._views_stop = threading.Event()
        self._poller: threading.Thread | None = None

    def start(self, timeout: float = START_TIMEOUT_S) -> "MetadataChannelRecorder":
        super().start(timeout)
        if self.brokers and self.view_interval_s > 0:
            self._poller = threading.Thread(target=self._view_loop, name="channel-views", daemon=True)
            self._poller.start()
        return self

    def stop(self, reason: str = "run ended") -> None:
        self._views_stop.set()
        if self._poller is not None:
            self._poller.join(STOP_JOIN_S)
        try:
            self._final_views()
        except Exception as e:              # never the runner's problem
            log.warning("channel recorder: final views: %s: %s", type(e).__name__, e)
        super().stop(reason)

    # -- rows --------------------------------------------------------------------------------------------
    def _row(self, key: str, f: str, value: dict[str, Any]) -> None:
        with self._row_lock:
            if f == OBSERVE_START:
                value = {"source": "metadata-store", "brokers": [b for b, _ in self.brokers],
                         "view_interval_s": self.view_interval_s, **value}
            if f != CHANNEL_MESSAGE:
                super()._row(key, f, value)
                return
            self._record_row(key, value)

    def _value(self, path: str, f: str, event: str, data: bytes | None, stat: Any) -> dict[str, Any]:
        if f != CHANNEL_MESSAGE:
            return super()._value(path, f, event, data, stat)
        text = (data or b"").decode("utf-8", "replace")
        v: dict[str, Any] = {"event": event, "czxid": stat.czxid, "mzxid": stat.mzxid, "version": stat.version,
                             "publish_ms": stat.mtime, "wall_ms": _wall_ms()}
        try:
            v["value"] = json.loads(text)
        except ValueError:
            v["value"] = None
            v["undecodable"] = text[:MAX_DATA]
        return v

    def _record_row(self, path: str, v: dict[str, Any]) -> None:
        """One record read (or found gone) of a bundle's znode: a channel-message row if it differs from the
        last one read, and the bundle-owner rows it makes."""
        key = metadata_key_of(path)
        if key is None:
            return
        gone = v.get("event") == DELETED
        raw = None if gone else v.get("value")
        row: dict[str, Any] = {"message_id": [int(v.get("zxid") or v.get("mzxid") or 0) if gone else int(v["mzxid"]), 0, -1],
                               "publish_ms": v.get("publish_ms") if not gone else _wall_ms(),
                               "wall_ms": _wall_ms(), "value": raw, "path": path, "event": v.get("event")}
        if "undecodable" in v and not gone:
            row["undecodable"] = v["undecodable"]
        if key in self._table and self._table[key] == raw and not gone:
            return
        if gone and key not in self._table:
            return
        self.messages += 1
        super()._row(key, CHANNEL_MESSAGE, row)
        if gone:
            self._table.pop(key, None)
        else:
            self._table[key] = raw
        try:
            rec = channel_record(raw) if raw is not None else None
        except RecordError:
            rec = None
        new = owner_of(rec)
        old = self._owned.get(key)
        event = v.get("event")
        if old is not None and old[0] != new:
            del self._owned[key]
            self._owner_row(key, DELETED, old[0], old[1], rec, row)
        if new is not None and (old is None or old[0] != new):
            self._owned[key] = (new, rec["versionId"])
            self._owner_row(key, PRESENT if event == PRESENT else CREATED, new, rec["versionId"], rec, row)

    def _owner_row(self, key: str, event: str, broker: str, incarnation: int, rec: dict | None,
                   row: dict[str, Any]) -> None:
        parsed = parse_bundle_name(key)
        out = {"event": event, "source": "channel", "namespace": parsed[0] if parsed else None,
               "range": list(parsed[1]) if parsed else None, "broker": broker, "incarnation": incarnation,
               "session": None, "state": rec["state"] if rec else None, "wall_ms": _wall_ms(),
               "message_id": row["message_id"]}
        if event == CREATED and isinstance(row.get("publish_ms"), int):
            out["ctime_ms"] = row["publish_ms"]
        super()._row(key, BUNDLE_OWNER, out)

    # -- views -------------------------------------------------------------------------------------------
    def _behind(self, views: dict[str, dict[str, Any]]) -> list[str]:
        """The final rounds last until every answering broker's records equal the store's."""
        with self._row_lock:
            table = {k: r for k, r in self._table.items() if r is not None}
        return [b for b, v in views.items() if "error" not in v and v.get("records") != table]


def table_view_of(cluster: dict[str, Any], view_fetch: Callable[[str], dict[str, Any]] = fetch_view) -> str:
    """The brokers' table view (`loadManagerServiceUnitStateTableViewClassName`, its short name), as the first
    broker that answers its channel view names it (`table_view`), else by cluster.json's spec, else the
    system topic's."""
    for _, url in brokers_of(cluster):
        v = view_fetch(url)
        if isinstance(v.get("table_view"), str):
            return v["table_view"]
    lb = ((cluster.get("spec") or {}).get("lb_settings") or {})
    return str(lb.get("loadManagerServiceUnitStateTableViewClassName") or "ServiceUnitStateTableViewImpl").rsplit(".", 1)[-1]


def record(cluster: dict[str, Any], journal: Journal, *, timeout: float = START_TIMEOUT_S,
           **kw: Any) -> ChannelRecorder | MetadataChannelRecorder:
    """A started recorder on the cluster of cluster.json (ChannelRecorderError if it cannot read the
    channel within `timeout`): the topic's, or the metadata store's when the brokers keep the channel's
    records there."""
    kw.setdefault("brokers", brokers_of(cluster))
    zk = cluster.get("zk_connect")
    if zk and table_view_of(cluster, kw.get("view_fetch", fetch_view)) == "ServiceUnitStateMetadataStoreTableViewImpl":
        for k in ("client_factory", "drain_s", "topic", "max_reconnects"):      # the topic reader's
            kw.pop(k, None)
        try:
            return MetadataChannelRecorder(zk, journal, nodes=nodes_of(cluster), **kw).start(timeout)
        except RecorderError as e:
            raise ChannelRecorderError(str(e)) from None
    url = cluster.get("service_url")
    if not url:
        raise ChannelRecorderError("cluster.json names no service_url; fix: deploy the cluster through the runner")
    return ChannelRecorder(url, journal, nodes=nodes_of(cluster), **kw).start(timeout)


__all__ = ["ChannelRecorder", "ChannelRecorderError", "JOURNAL_NAME", "MetadataChannelRecorder", "VIEW_PATH",
           "brokers_of", "fetch_view", "record", "table_view_of"]
