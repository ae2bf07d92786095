"""The ownership recorder: watches the cluster's ZooKeeper through kazoo during a run and journals every
change of the bundle locks, the namespaces' boundaries, the load-balancer leader and the brokers'
registrations (core/observations.py).

It runs in the runner, on the host side (the nemesis cuts brokers from ZooKeeper, not the runner), with its
own kazoo session and one thread. Watches only set a flag for a path; the thread re-reads the path and
journals what differs from what it saw last, so the journal follows ZooKeeper's order of notifications.
When the connection is suspended or the session lost, it journals the start of an unobserved gap; once
connected again it re-reads every root in full (fresh watches), journals what changed meanwhile, and
then the end of the gap. It never writes to ZooKeeper.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from core.history import OBSERVER_PROCESS, OK, Journal, Op
from core.observations import (BOUNDARIES, BROKER_REGISTRATION, BROKERS_PATH, BUNDLE_OWNER, CHANGED, CREATED, DELETED, GAP_END, GAP_START,
                               LB_LEADER, LB_LEADER_PATH, LOCAL_POLICIES_ROOT, NAMESPACE_ROOT, OBSERVE_START,
                               OBSERVE_STOP, PRESENT, broker_of, namespace_of_policies, parse_boundaries,
                               parse_bundle_path, range_name)

log = logging.getLogger("pulsar_chaos.recorder")

JOURNAL_NAME = "ownership.jsonl"
SESSION_TIMEOUT_S = 10.0
OP_TIMEOUT_S = 5.0                  # one ZooKeeper read; a slower one ends in a gap and a re-read
MAX_EVENTS = 1_000_000              # journal rows; past this the observer stops (a gap to the end)
MAX_ZNODES = 100_000                # znodes watched at once
MAX_DATA = 4096                     # characters of a znode's value kept in a row
START_TIMEOUT_S = 15.0
STOP_JOIN_S = 10.0

# (root, depth of the znodes journaled below it, f); depth 0: the root itself
ROOTS: tuple[tuple[str, int, str], ...] = (
    (NAMESPACE_ROOT, 3, BUNDLE_OWNER),
    (LOCAL_POLICIES_ROOT, 2, BOUNDARIES),
    (LB_LEADER_PATH, 0, LB_LEADER),
    (BROKERS_PATH, 1, BROKER_REGISTRATION),       # existence only: the value is a load report
)


class RecorderError(RuntimeError):
    """The recorder could not start (ZooKeeper unreachable); the message says what and the fix."""


class _Overflow(RuntimeError):
    """More znodes than the recorder watches: it stops, leaving a gap to the end of the run."""


def _depth(root: str, path: str) -> int:
    return 0 if path == root else len(path[len(root):].strip("/").split("/"))


class OwnershipRecorder:
    """`start()`, then `stop()` (always: it closes the session and the journal's last rows)."""

    def __init__(self, zk_connect: str, journal: Journal, *, nodes: dict[str, Any] | None = None,
                 session_timeout_s: float = SESSION_TIMEOUT_S, max_events: int = MAX_EVENTS,
                 max_znodes: int = MAX_ZNODES, roots: tuple[tuple[str, int, str], ...] = ROOTS):
        self.zk_connect = zk_connect
        self.journal = journal
        self.nodes = nodes or {}
        self.session_timeout_s = session_timeout_s
        self.max_events = max_events
        self.max_znodes = max_znodes
        self.roots = roots
        self.events = 0
        self.gaps = 0
        self._zk: Any = None
        self._q: queue.Queue[tuple[str, str]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[str, dict[str, Any]] = {}      # path -> the last row value journaled for it
        self._children: dict[str, set[str]] = {}        # watched directory -> its children last read
        self._blind = False                             # in a gap: waiting for a full re-read
        self._full = True                               # the next pass re-reads every root
        self._overflow = False
        self._last_contact = time.monotonic()
        self._lock = threading.Lock()
        self._stopped = False

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = START_TIMEOUT_S) -> "OwnershipRecorder":
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry
        zk = KazooClient(hosts=self.zk_connect, timeout=self.session_timeout_s,
                         connection_retry=KazooRetry(max_tries=-1, delay=0.2, max_delay=2.0),
                         command_retry=KazooRetry(max_tries=0))
        try:
            zk.start(timeout)
        except Exception as e:
            _close(zk)
            raise RecorderError(f"ZooKeeper at {self.zk_connect} unreachable ({type(e).__name__}: {e}); fix: "
                                f"check the cluster's ZooKeeper (cluster.json: zk_connect)") from None
        self._zk = zk
        zk.add_listener(self._on_state)
        self._row("", OBSERVE_START, {"zk_connect": self.zk_connect, "roots": [r[0] for r in self.roots],
                                      "nodes": self.nodes.get("nodes", {}), "ports": self.nodes.get("ports", {}),
                                      "session_timeout_s": self.session_timeout_s,
                                      "session": _hex(zk.client_id[0] if zk.client_id else None)})
        self._thread = threading.Thread(target=self._loop, name="ownership-recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self, reason: str = "run ended") -> None:
        """Stop watching, journal `observe-stop`, close the session. Idempotent; never raises."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop.set()
        self._q.put(("stop", ""))
        if self._thread is not None:
            self._thread.join(STOP_JOIN_S)
            if self._thread.is_alive():
                log.warning("ownership recorder: its thread still runs after %.0fs", STOP_JOIN_S)
        try:
            self._row("", OBSERVE_STOP, {"events": self.events, "gaps": self.gaps, "reason": reason})
            self.journal.sync()
        except Exception as e:          # a closed journal: nothing more to write
            log.warning("ownership recorder: final row: %s", e)
        if self._zk is not None:
            _close(self._zk)
            self._zk = None

    # ------------------------------------------------------------------------------------ journal

    def _row(self, key: str, f: str, value: dict[str, Any]) -> None:
        if f == BUNDLE_OWNER and value.get("namespace") and value.get("range"):
            key = f"{value['namespace']}/{range_name(*value['range'])}"     # the bundle, not the lock's path
        if self.events >= self.max_events and f not in (OBSERVE_STOP,):
            if not self._overflow:
                self._overflow = True
                self.journal.append(Op(process=OBSERVER_PROCESS, type=OK, f=GAP_START, value={
                    "reason": f"more than {self.max_events} rows: recording stopped", "detected_s": self._now_s(),
                    "may_start_s": self._now_s()}))
            return
        self.events += 1
        self.journal.append(Op(process=OBSERVER_PROCESS, type=OK, f=f, key=key, value=value))

    def _now_s(self) -> float:
        return round((time.monotonic_ns() - self.journal.t0_ns) / 1e9, 6)

    # ------------------------------------------------------------------------------------ session

    def _on_state(self, state: str) -> None:
        # kazoo's event thread: never block it
        if state in ("SUSPENDED", "LOST"):
            self._q.put(("gap", state.lower()))
        elif state == "CONNECTED":
            self._q.put(("connected", ""))

    def _watch(self, event: Any) -> None:
        self._last_contact = time.monotonic()
        self._q.put(("path", event.path if event is not None else ""))

    # ------------------------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        try:
            self._rescan()
            while not self._stop.is_set():
                try:
                    kind, arg = self._q.get(timeout=0.5)
                except queue.Empty:
                    if self._full and not self._blind_wait():
                        self._rescan()
                    continue
                if kind == "stop":
                    break
                if kind == "gap":
                    self._gap(arg)
                elif kind == "connected":
                    self._full = True
                    self._rescan()
                elif kind == "path" and not self._full:
                    self._refresh(arg)
        except _Overflow as e:
            self._gap(str(e))
        except Exception as e:            # the loop must never take the runner down
            log.error("ownership recorder failed: %s: %s", type(e).__name__, e, exc_info=True)
            try:
                self._gap(f"recorder error {type(e).__name__}: {e}")
            except Exception:
                pass

    def _blind_wait(self) -> bool:
        """True while there is no connection to re-read through."""
        return self._zk is None or not self._zk.connected

    def _gap(self, reason: str) -> None:
        self._full = True
        if self._blind:
            return
        self._blind = True
        self.gaps += 1
        now = self._now_s()
        # kazoo notices a dead connection only after its read timeout (2/3 of the session timeout):
        # what happened since the last contact may be missed or seen late.
        # A conservative start: the later of the last contact we know of and a session timeout ago.
        since = (self._last_contact * 1e9 - self.journal.t0_ns) / 1e9
        may = max(since, now - self.session_timeout_s)
        self._row("", GAP_START, {"reason": reason, "detected_s": now, "may_start_s": round(min(now, may), 6)})

    def _rescan(self) -> None:
        """Re-read every root in full; journal what differs; end the gap if in one."""
        if self._blind_wait():
            return
        try:
            present: set[str] = set()
            for root, depth, f in self.roots:
                self._scan(root, root, depth, f, present)
        except _Overflow:
            raise
        except Exception as e:      # lost the connection midway: stay in (or open) a gap, try again later
            log.info("ownership recorder: re-read interrupted: %s: %s", type(e).__name__, e)
            self._gap(f"re-read failed: {type(e).__name__}")
            return
        for path in sorted(set(self._seen) - present):
            self._gone(path)
        self._full = False
        self._last_contact = time.monotonic()
        if self._blind:
            self._blind = False
            zk = self._zk
            self._row("", GAP_END, {"session": _hex(zk.client_id[0] if zk and zk.client_id else None)})

    def _scan(self, root: str, path: str, depth: int, f: str, present: set[str], rescan: bool = True) -> None:
        """Read the subtree at `path` with watches. `rescan`: a read of the whole tree (rows `present`),
        else a directory a watch just showed (its znodes are new: rows `created`)."""
        d = _depth(root, path)
        if d == depth:
            if self._read(root, path, f, rescan=rescan):
                present.add(path)
            return
        kids = self._list(path)
        if kids is None:
            return
        for k in sorted(kids):
            self._scan(root, f"{path.rstrip('/')}/{k}", depth, f, present, rescan)

    def _root_of(self, path: str) -> tuple[str, int, str] | None:
        for root, depth, f in self.roots:
            if path == root or path.startswith(root.rstrip("/") + "/"):
                return root, depth, f
        return None

    def _refresh(self, path: str) -> None:
        """A watch fired for `path`: re-read it (a leaf) or its children (a directory)."""
        r = self._root_of(path)
        if r is None:
            return
        root, depth, f = r
        try:
            d = _depth(root, path)
            if d == depth:
                if not self._read(root, path, f, rescan=False) and path in self._seen:
                    self._gone(path)
            elif d < depth:
                before = self._children.get(path, set())
                kids = self._list(path)
                now = kids or set()
                for k in sorted(before - now):          # deletions before creations, as ZooKeeper ordered them
                    self._vanished(root, f"{path.rstrip('/')}/{k}", depth)
                # new children, and children seen gone whose name came back (deleted and created again
                # between two listings: the listing alone shows no difference)
                back = {k for k in now & before if f"{path.rstrip('/')}/{k}" not in self._seen
                        and _depth(root, f"{path.rstrip('/')}/{k}") == depth}
                for k in sorted((now - before) | back):
                    child = f"{path.rstrip('/')}/{k}"
                    if _depth(root, child) == depth:
                        self._read(root, child, f, rescan=False)
                    else:
                        self._scan(root, child, depth, f, set(), rescan=False)
        except _Overflow:
            raise
        except Exception as e:
            log.info("ownership recorder: reading %s: %s: %s", path, type(e).__name__, e)
            self._gap(f"read failed: {type(e).__name__}")

    def _vanished(self, root: str, path: str, depth: int) -> None:
        for p in [p for p in self._seen if p == path or p.startswith(path + "/")]:
            self._gone(p)
        for p in [p for p in self._children if p == path or p.startswith(path + "/")]:
            self._children.pop(p, None)

    # ------------------------------------------------------------------------------------ reads

    def _list(self, path: str) -> set[str] | None:
        """The children of `path` with a watch (None and an exists-watch when it does not exist)."""
        from kazoo.exceptions import NoNodeError
        zk = self._zk
        try:
            kids = set(zk.get_children_async(path, watch=self._watch).get(timeout=OP_TIMEOUT_S))
        except NoNodeError:
            self._children.pop(path, None)
            zk.exists_async(path, watch=self._watch).get(timeout=OP_TIMEOUT_S)
            return None
        if len(self._children) + len(self._seen) > self.max_znodes:
            raise _Overflow(f"more than {self.max_znodes} znodes to watch: recording stopped")
        self._children[path] = kids
        return kids

    def _read(self, root: str, path: str, f: str, *, rescan: bool) -> bool:
        """Read a journaled znode with a watch; journal it if new or changed. False if it does not exist."""
        from kazoo.exceptions import NoNodeError
        zk = self._zk
        if f == BROKER_REGISTRATION:        # existence only: its value (a load report) changes all the time
            stat = zk.exists_async(path, watch=self._watch).get(timeout=OP_TIMEOUT_S)
            if stat is None:
                return False
            data = None
        else:
            for attempt in range(3):
                try:
                    data, stat = zk.get_async(path, watch=self._watch).get(timeout=OP_TIMEOUT_S)
                    break
                except NoNodeError:
                    # a leaf that may come; created between the get and this exists, it has a watch on
                    # its changes only (no creation event will come): read it again
                    if zk.exists_async(path, watch=self._watch).get(timeout=OP_TIMEOUT_S) is None or attempt == 2:
                        return False
        old = self._seen.get(path)
        if old is not None and old["czxid"] == stat.czxid and (old["mzxid"] == stat.mzxid
                                                                 or f == BROKER_REGISTRATION):
            return True
        if old is None:
            event = PRESENT if rescan else CREATED
        elif old["czxid"] != stat.czxid:
            # another incarnation: the old one was deleted (unseen, or within a gap) and this one created
            self._gone(path)
            event = PRESENT if rescan else CREATED
        else:
            event = CHANGED
        value = self._value(path, f, event, data, stat)
        self._seen[path] = value
        self._row(path, f, value)
        return True

    def _gone(self, path: str) -> None:
        old = self._seen.pop(path, None)
        if old is None:
            return
        value = {k: old.get(k) for k in ("source", "namespace", "range", "broker", "incarnation", "path",
                                          "boundaries", "num_bundles", "czxid", "mzxid", "version", "session")
                 if k in old}
        value["event"] = DELETED
        value["zxid"] = self._zxid()
        r = self._root_of(path)
        self._row(path, r[2] if r else BUNDLE_OWNER, value)

    def _zxid(self) -> int | None:
        zk = self._zk
        return getattr(zk, "last_zxid", None) if zk is not None else None

    def _value(self, path: str, f: str, event: str, data: bytes | None, stat: Any) -> dict[str, Any]:
        text = (data or b"").decode("utf-8", "replace")
        v: dict[str, Any] = {"event": event}
        if f == BUNDLE_OWNER:
            parsed = parse_bundle_path(path)
            v["source"] = "zk-lock"
            v["namespace"] = parsed[0] if parsed else None
            v["range"] = list(parsed[1]) if parsed and parsed[1] else None
            v["broker"] = broker_of(text)
            v["incarnation"] = stat.czxid
            v["path"] = path
        elif f == BOUNDARIES:
            v["namespace"] = namespace_of_policies(path)
            b, n = parse_boundaries(text)
            v["boundaries"] = b
            v["num_bundles"] = n
        elif f == BROKER_REGISTRATION:
            v["broker"] = path.rsplit("/", 1)[-1]
        else:
            v["broker"] = broker_of(text)
        v.update(czxid=stat.czxid, mzxid=stat.mzxid, version=stat.version,
                 session=_hex(stat.ephemeralOwner) if stat.ephemeralOwner else None,
                 ctime_ms=stat.ctime, mtime_ms=stat.mtime, wall_ms=time.time_ns() // 1_000_000, zxid=self._zxid(),
                 data=text[:MAX_DATA] + ("…" if len(text) > MAX_DATA else ""))
        return v


def _hex(n: int | None) -> str | None:
    return None if n is None else f"0x{n:x}"


def _close(zk: Any) -> None:
    for step in (zk.stop, zk.close):
        try:
            step()
        except Exception:
            pass


def nodes_of(cluster: dict[str, Any]) -> dict[str, Any]:
    """From cluster.json: {"nodes": {name: host}, "ports": {"host:port": name}}, for the checker to name
    brokers the way client ops do (by node name)."""
    nodes: dict[str, str] = {}
    ports: dict[str, str] = {}
    for n in cluster.get("nodes") or []:
        name, host = n.get("name"), n.get("host")
        if not name or not host:
            continue
        nodes[name] = host
        for p in (n.get("ports") or {}).values():
            if isinstance(p, int):
                ports[f"{host}:{p}"] = name
    return {"nodes": nodes, "ports": ports}


def record(zk_connect: str, journal: Journal, cluster: dict[str, Any] | None = None, *,
           timeout: float = START_TIMEOUT_S, **kw: Any) -> OwnershipRecorder:
    """A started recorder (RecorderError if ZooKeeper cannot be reached within `timeout`)."""
    return OwnershipRecorder(zk_connect, journal, nodes=nodes_of(cluster or {}), **kw).start(timeout)


__all__ = ["JOURNAL_NAME", "OwnershipRecorder", "RecorderError", "nodes_of", "record"]
