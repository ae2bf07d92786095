"""Test doubles for the broker's protocol side: an in-memory ManagedLedger and a one-broker service.

`MemoryStorage` outlives ManagedLedger handles the way BookKeeper + ZooKeeper outlive a broker's:
reopening a topic (after an unload) gets a new handle on the same data, writing to a new ledger,
so the tests also cross ledger boundaries. Test-only: the real ones live in clusters/broker/.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any

from clusters.broker.managed_ledger import (ManagedLedgerError, ManagedLedgerFenced, Position,
                                            ml_name)
from clusters.loadbalancer.api import LookupResult
from clusters.broker.topic import ServiceUnitNotReady, Topic
from clusters.config import BrokerConfig


class MemoryStorage:
    """The durable part: ledgers (id -> entries) and cursor positions, per managed-ledger name."""

    def __init__(self) -> None:
        self.ledgers: dict[str, list[tuple[int, list[bytes]]]] = {}
        self.cursors: dict[str, dict[str, Position | None]] = {}
        self.next_ledger_id = 3


class MemoryCursor:
    def __init__(self, ml: "MemoryManagedLedger", name: str, md: Position | None):
        self.ml = ml
        self.name = name
        self.mark_delete_position = md
        self.persisted: list[Position | None] = []

    async def mark_delete(self, pos: Position) -> None:
        if self.mark_delete_position is not None and pos <= self.mark_delete_position:
            return
        self.mark_delete_position = pos
        self._save()

    async def reset(self, pos: Position | None) -> None:
        self.mark_delete_position = None if pos is None else Position(pos.ledger_id, pos.entry_id - 1)
        self._save()

    async def flush(self) -> None:
        return None

    def _save(self) -> None:
        self.persisted.append(self.mark_delete_position)
        self.ml.storage.cursors.setdefault(self.ml.name, {})[self.name] = self.mark_delete_position


class MemoryManagedLedger:
    """The ManagedLedger interface over MemoryStorage. Knobs: fail_adds (next n adds raise
    ManagedLedgerError), fenced (adds raise ManagedLedgerFenced), add_delay (seconds),
    entries_per_ledger (roll over after so many entries)."""

    def __init__(self, name: str, storage: MemoryStorage, *, entries_per_ledger: int | None = None):
        self.name = name
        self.storage = storage
        self.entries_per_ledger = entries_per_ledger
        self.ledgers = storage.ledgers.setdefault(name, [])
        self.ledgers[:] = [(lid, es) for lid, es in self.ledgers if es]   # empty ledgers vanish
        self._new_ledger()
        self.cursors: dict[str, MemoryCursor] = {}
        self.closed = False
        self.fenced = False
        self.fail_adds = 0
        self.add_delay = 0.0
        self.adds = 0
        self._waiters: list[asyncio.Future] = []

    def _new_ledger(self) -> None:
        lid = self.storage.next_ledger_id
        self.storage.next_ledger_id += 1
        self.ledgers.append((lid, []))

    @property
    def last_confirmed(self) -> Position | None:
        for lid, es in reversed(self.ledgers):
            if es:
                return Position(lid, len(es) - 1)
        return None

    def first_position(self) -> Position | None:
        for lid, es in self.ledgers:
            if es:
                return Position(lid, 0)
        return None

    def next_position(self, pos: Position) -> Position:
        return Position(pos.ledger_id, pos.entry_id + 1)

    def previous_position(self, pos: Position) -> Position:
        """The last existing entry before `pos` ((ledger, -1) when there is none in the list)."""
        if pos.entry_id > 0:
            return Position(pos.ledger_id, pos.entry_id - 1)
        prev = None
        for lid, es in self.ledgers:
            if lid >= pos.ledger_id:
                break
            if es:
                prev = Position(lid, len(es) - 1)
        return prev if prev is not None else Position(pos.ledger_id, -1)

    def positions_in(self, after: Position | None, upto: Position):
        """Every existing entry position p with after < p <= upto (after None: from the start)."""
        for lid, es in self.ledgers:
            if lid > upto.ledger_id:
                return
            if after is not None and lid < after.ledger_id:
                continue
            first = after.entry_id + 1 if after is not None and lid == after.ledger_id else 0
            last = len(es) - 1
            if lid == upto.ledger_id:
                last = min(last, upto.entry_id)
            for e in range(max(first, 0), last + 1):
                yield Position(lid, e)

    @property
    def state(self) -> str:
        return "fenced" if self.fenced else "closed" if self.closed else "open"

    async def add_entry(self, data: bytes) -> Position:
        if self.fenced:
            raise ManagedLedgerFenced(f"{self.name} fenced")
        if self.closed:
            raise ManagedLedgerError(f"{self.name} closed")
        if self.fail_adds:
            self.fail_adds -= 1
            raise ManagedLedgerError("injected persistence failure")
        lid, es = self.ledgers[-1]
        if self.entries_per_ledger and len(es) >= self.entries_per_ledger:
            self._new_ledger()
            lid, es = self.ledgers[-1]
        es.append(data)
        pos = Position(lid, len(es) - 1)
        self.adds += 1
        if self.add_delay:
            await asyncio.sleep(self.add_delay)     # equal delays keep completions in call order
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)
        return pos

    async def read_entries(self, start: Position, max_entries: int) -> list[tuple[Position, bytes]]:
        out: list[tuple[Position, bytes]] = []
        for lid, es in self.ledgers:
            if lid < start.ledger_id:
                continue
            first = max(start.entry_id, 0) if lid == start.ledger_id else 0
            for eid in range(first, len(es)):
                if len(out) >= max_entries:
                    return out
                out.append((Position(lid, eid), es[eid]))
        return out

    async def wait_for_entries(self, after: Position | None) -> None:
        while not (self.closed or self.fenced):
            lc = self.last_confirmed
            if lc is not None and (after is None or lc > after):
                return
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    async def open_cursor(self, name: str, initial_position: str = "latest") -> MemoryCursor:
        cur = self.cursors.get(name)
        if cur is not None:
            return cur
        saved = self.storage.cursors.setdefault(self.name, {})
        if name in saved:
            md = saved[name]
        else:
            md = self.last_confirmed if initial_position == "latest" else None
            saved[name] = md
        cur = self.cursors[name] = MemoryCursor(self, name, md)
        return cur

    async def delete_cursor(self, name: str) -> None:
        self.cursors.pop(name, None)
        self.storage.cursors.get(self.name, {}).pop(name, None)

    async def close(self) -> None:
        self.closed = True


class MemoryBrokerService:
    """A single broker owning every topic, over MemoryStorage."""

    def __init__(self, host: str = "127.0.0.1", port: int = 6650, *, entries_per_ledger: int | None = None):
        self.config = BrokerConfig(name="test-broker", host=host, port=port, zk="", data_dir="/tmp")
        self.storage = MemoryStorage()
        self.entries_per_ledger = entries_per_ledger
        self.topics: dict[str, Topic] = {}
        self.mls: dict[str, MemoryManagedLedger] = {}
        self.connections: set[Any] = set()
        self.serving = True
        self.fenced_topics: list[str] = []

    async def lookup(self, topic: str, authoritative: bool) -> LookupResult:
        return LookupResult("connect", self.config.service_url, True)

    async def partitions(self, topic: str) -> int:
        return 0

    async def get_topic(self, topic: str) -> Topic:
        t = self.topics.get(topic)
        if t is not None and not t.closed:
            return t
        if not self.serving:
            raise ServiceUnitNotReady(f"Topic {topic} not served by this instance. Please redo the lookup")
        ml = MemoryManagedLedger(ml_name(topic), self.storage, entries_per_ledger=self.entries_per_ledger)
        self.mls[topic] = ml
        t = self.topics[topic] = Topic(topic, ml, self)
        return t

    def register_connection(self, cnx: Any) -> None:
        self.connections.add(cnx)

    def unregister_connection(self, cnx: Any) -> None:
        self.connections.discard(cnx)

    def topic_fenced(self, topic: str) -> None:
        self.fenced_topics.append(topic)
        self.topics.pop(topic, None)

    async def unload(self, topic: str) -> None:
        t = self.topics.pop(topic, None)
        if t is not None:
            await t.close("unloading")

    async def topics_of_namespace(self, namespace: str) -> list[str]:
        return sorted(t for t in self.topics if t.split("://", 1)[-1].startswith(namespace + "/"))


class BrokerThread:
    """The broker on its own event loop (uvloop) in a daemon thread, on 127.0.0.1:<free port>."""

    def __init__(self, *, keepalive_interval: float = 30.0, **service_kwargs: Any):
        import uvloop
        self.keepalive_interval = keepalive_interval
        self.loop = uvloop.new_event_loop()
        self.service_kwargs = service_kwargs
        self.service: MemoryBrokerService | None = None
        self.server: asyncio.AbstractServer | None = None
        self.thread = threading.Thread(target=self._run, name="test-broker", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> "BrokerThread":
        self.thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        from clusters.broker.connection import serve_connections
        self.service = MemoryBrokerService(port=0, **self.service_kwargs)
        self.server = await serve_connections(self.service, "127.0.0.1", 0,
                                              keepalive_interval=self.keepalive_interval)
        port = self.server.sockets[0].getsockname()[1]
        self.service.config.port = port

    @property
    def url(self) -> str:
        assert self.service is not None
        return self.service.config.service_url

    def call(self, coro: Any, timeout: float = 20.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, fn: Any, *args: Any, timeout: float = 20.0) -> Any:
        """Run a plain function on the broker's loop and return its result."""
        async def go():
            return fn(*args)
        return self.call(go(), timeout)

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        async def shutdown():
            if self.server is not None:
                self.server.close()
            for cnx in list(self.service.connections if self.service else []):
                cnx.abort()
            for t in list(self.service.topics.values() if self.service else []):
                try:
                    await asyncio.wait_for(t.close("shutdown"), 5)
                except Exception:
                    pass
        try:
            self.call(shutdown(), timeout=15)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
