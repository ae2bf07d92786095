"""Asyncio facade over kazoo: the one way the reference system reads and writes ZooKeeper.

Every mutation that matters is a versioned compare-and-set; callers get `BadVersion`,
`NoNode`, `NodeExists` and `ConnectionLoss`/`SessionExpired` as kazoo raises them.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError,
                              NotEmptyError, SessionExpiredError)
from kazoo.retry import KazooRetry

log = logging.getLogger(__name__)

BadVersion = BadVersionError
NoNode = NoNodeError
NodeExists = NodeExistsError
NotEmpty = NotEmptyError
# Errors after which the outcome of a write is unknown, or the session is gone.
Disconnected = (ConnectionLoss, SessionExpiredError)

__all__ = ["MetadataStore", "BadVersion", "NoNode", "NodeExists", "NotEmpty", "Disconnected"]


class MetadataStore:
    """A kazoo session whose calls are awaitable on the caller's event loop."""

    def __init__(self, hosts: str, session_timeout: float = 10.0, name: str = "",
                 op_timeout: float | None = None):
        self.hosts = hosts
        # A call on a disconnected session waits for a reconnect; bound it so callers can answer
        # their own clients (a lookup, a topic load) instead of hanging with ZooKeeper.
        self.op_timeout = op_timeout if op_timeout is not None else session_timeout
        self.name = name
        self._zk = KazooClient(hosts=hosts, timeout=session_timeout,
                               connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
                               command_retry=None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[Callable[[str], Any]] = []
        self._zk.add_listener(self._on_state)

    # -- lifecycle ---------------------------------------------------------
    async def start(self, timeout: float = 30.0) -> "MetadataStore":
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._zk.start, timeout)
        return self

    async def close(self) -> None:
        def _stop() -> None:
            try:
                self._zk.stop()
                self._zk.close()
            except Exception:  # closing a dead session must not mask the caller's error
                log.debug("closing ZooKeeper session", exc_info=True)
        await asyncio.to_thread(_stop)

    @property
    def connected(self) -> bool:
        return self._zk.connected

    @property
    def session_id(self) -> int | None:
        sid = self._zk.client_id
        return sid[0] if sid else None

    def add_listener(self, fn: Callable[[str], Any]) -> None:
        """fn(state) runs on the event loop for 'CONNECTED', 'SUSPENDED' and 'LOST'."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[str], Any]) -> None:
        """Undo `add_listener` (nothing if fn is not a listener)."""
        if fn in self._listeners:
            self._listeners.remove(fn)

    def _on_state(self, state: str) -> None:
        log.info("ZooKeeper session %s: %s", self.name, state)
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        for fn in list(self._listeners):
            loop.call_soon_threadsafe(fn, str(state))

    # -- calls -------------------------------------------------------------
    async def _call(self, method: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()

        def done(async_result: Any) -> None:
            def settle() -> None:
                if fut.done():
                    return
                try:
                    fut.set_result(async_result.get_nowait())
                except BaseException as e:  # kazoo delivers errors through the result
                    fut.set_exception(e)
            loop.call_soon_threadsafe(settle)

        try:
            method(*args, **kw).rawlink(done)
        except Exception as e:  # e.g. SessionExpired raised synchronously
            raise e
        try:
            return await asyncio.wait_for(fut, self.op_timeout)
        except asyncio.TimeoutError:
            raise ConnectionLoss(f"no answer from ZooKeeper within {self.op_timeout}s") from None

    async def get(self, path: str) -> tuple[bytes, int]:
        """(data, version); raises NoNode."""
        data, stat = await self._call(self._zk.get_async, path)
        return data, stat.version

    async def get_or_none(self, path: str) -> tuple[bytes, int] | None:
        try:
            return await self.get(path)
        except NoNodeError:
            return None

    async def exists(self, path: str) -> bool:
        return (await self._call(self._zk.exists_async, path)) is not None

    async def children(self, path: str) -> list[str]:
        try:
            return list(await self._call(self._zk.get_children_async, path))
        except NoNodeError:
            return []

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequence: bool = False, makepath: bool = True) -> str:
        """Create a node; returns its path (with the sequence suffix). Raises NodeExists."""
        return await self._call(self._zk.create_async, path, data, ephemeral=ephemeral,
                                sequence=sequence, makepath=makepath)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        """Compare-and-set; returns the new version. Raises BadVersion or NoNode."""
        stat = await self._call(self._zk.set_async, path, data, version)
        return stat.version

    async def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        if recursive:
            await asyncio.to_thread(self._zk.delete, path, version, True)
            return
        await self._call(self._zk.delete_async, path, version)

    async def ensure_path(self, path: str) -> None:
        try:
            await self.create(path, b"", makepath=True)
        except NodeExistsError:
            pass

    async def owner_session(self, path: str) -> int | None:
        """The session id owning an ephemeral node, None if absent or persistent."""
        try:
            stat = await self._call(self._zk.exists_async, path)
        except NoNodeError:
            return None
        if stat is None or not stat.ephemeralOwner:
            return None
        return stat.ephemeralOwner

    def watch_children(self, path: str, fn: Callable[[list[str]], Any]) -> None:
        """fn(children) runs on the event loop now and on every change of path's children."""
        loop = self._loop
        assert loop is not None, "start() first"

        def on_change(children: list[str]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(fn, list(children or []))
        self._zk.ChildrenWatch(path, on_change)

    def watch_data(self, path: str, fn: Callable[..., Any], *, with_version: bool = False) -> None:
        """fn(data or None when the node is absent) runs on the event loop now and on every change;
        with_version, fn(data, version) (version -1 when absent)."""
        loop = self._loop
        assert loop is not None, "start() first"

        def on_change(data: bytes | None, stat: Any, event: Any = None) -> None:
            if loop.is_closed():
                return
            value = data if stat is not None else None
            if with_version:
                loop.call_soon_threadsafe(fn, value, stat.version if stat is not None else -1)
            else:
                loop.call_soon_threadsafe(fn, value)
        self._zk.DataWatch(path, on_change)

    def _once(self, fn: Callable[[str], Any]) -> Callable[[Any], None]:
        """A kazoo one-shot watcher calling fn(event type: CREATED, DELETED, CHANGED, CHILD, or NONE when
        ZooKeeper dropped the watch with the connection) on the event loop."""
        loop = self._loop
        assert loop is not None, "start() first"

        def fire(event: Any) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(fn, str(getattr(event, "type", "NONE")))
        return fire

    async def get_watched(self, path: str, fn: Callable[[str], Any]) -> tuple[bytes, int] | None:
        """(data, version), or None when the node is absent, with a one-shot watch on it (on its
        creation when absent): fn(event type) at its next change. Unlike `watch_data`, nothing re-reads
        the node after a connection loss: a watch dropped with the connection fires fn("NONE") and the
        caller decides whether to read again."""
        for _ in range(3):
            try:
                data, stat = await self._call(self._zk.get_async, path, self._once(fn))
                return data, stat.version
            except NoNodeError:
                if await self._call(self._zk.exists_async, path, self._once(fn)) is None:
                    return None
        return None

    async def children_watched(self, path: str, fn: Callable[[str], Any]) -> list[str] | None:
        """The children of `path` (None when it is absent) with a one-shot watch (see `get_watched`)."""
        try:
            return list(await self._call(self._zk.get_children_async, path, self._once(fn)))
        except NoNodeError:
            await self._call(self._zk.exists_async, path, self._once(fn))
            return None

    async def transaction(self, ops: list[tuple]) -> None:
        """Several writes, all or none (ZooKeeper's multi): ops are ("check", path, version),
        ("create", path, data, ephemeral), ("set", path, data, version), ("delete", path, version).
        Raises the error of the first op that failed (BadVersion, NodeExists, NoNode)."""
        tx = self._zk.transaction()
        for op in ops:
            kind = op[0]
            if kind == "check":
                tx.check(op[1], op[2])
            elif kind == "create":
                tx.create(op[1], op[2], ephemeral=bool(op[3]))
            elif kind == "set":
                tx.set_data(op[1], op[2], op[3])
            elif kind == "delete":
                tx.delete(op[1], op[2])
            else:
                raise ValueError(f"unknown transaction op {kind!r}")
        results = await self._call(tx.commit_async)
        for r in results:
            if isinstance(r, Exception) and not type(r).__name__ == "RolledBackError":
                raise r
        for r in results:
            if isinstance(r, Exception):
                raise r


def is_disconnected(exc: BaseException) -> bool:
    return isinstance(exc, Disconnected)


KazooState = KazooState
