"""The channel's records in ZooKeeper: Pulsar's ServiceUnitStateMetadataStoreTableViewImpl (PIP-378), selected
with `loadManagerServiceUnitStateTableViewClassName=ServiceUnitStateMetadataStoreTableViewImpl`. The rules
are extensible/metadata_store.py's; this is the I/O.

- `put(key, record | None)`: read the bundle's znode, resolve the write against it with the metadata
  store's rules, write at the version read (create it, or delete it for a tombstone); a rejection or a
  lost compare-and-set is a conflict: logged and swallowed, as Pulsar's put swallows
  MetadataStoreTableView.ConflictException. After a write the znode is read back into this broker's
  table at once (Pulsar's put notifies its own table view).
- The table (the owner's `ChannelView`) is fed by ZooKeeper's watches: every directory under
  /service_unit_state and every record's znode is watched; a watch that fires is re-armed by reading
  the node, whose value replaces the cached record (no resolver on reads); a changed record runs the
  owner's handlers (`on_record`), as a tail message does on the topic. Reads of one znode run one at a
  time, so the last read is the newest value.
- `run()` fills the table from every znode (the owner's `on_existing` then runs handleExisting on it) and
  watches from then on.
- Watches and sessions. The session counts as lost when ZooKeeper says so, or once the connection has
  been gone for the session timeout (Pulsar's ZKSessionWatcher). A watch dropped with the connection is armed again once connected. Within the
  same session the read that re-arms it counts as a notification (ZooKeeper's client re-registers its
  watches and is told of what changed meanwhile). After a session loss it does not: a new session hears
  of nothing that changed while the old one was lost (Pulsar's persistent watch is added again, with no
  events for the gap). What the table does about that is apache/pulsar#24478's fix: on the session's
  loss the records are untrusted, the bundles this broker owned by them stop being its own
  (`on_invalidated`) and the records are dropped; on the new session every znode is read again (a fill,
  then `on_existing`). With the bug knob lb.metadata_table_view_stale_cache (`stale_cache`), the table
  view before #24478: the records stay as they were, the watches come back without a read of what they
  missed, and a bundle the leader moved meanwhile is still this broker's by its table.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from clusters.loadbalancer.extensible.metadata_store import (KEY_DEPTH, PATH_PREFIX, key_of, path_of, resolve_put,
                                                             session_lost_invalidations)
from clusters.loadbalancer.extensible.state import ChannelDecodeError, ChannelView, ServiceUnitStateData
from clusters.metadata.store import BadVersion, NodeExists, NoNode

log = logging.getLogger(__name__)

MAX_WATCHED = 100_000          # znodes watched at once (directories and records)


class TableSink(Protocol):
    """What the table view feeds (ChannelOwnership): its `view`, its brokerId and three callbacks."""
    view: ChannelView
    broker_id: str

    def on_record(self, key: str, previous: ServiceUnitStateData | None,
                  current: ServiceUnitStateData | None) -> None: ...

    def on_existing(self) -> None: ...

    def on_invalidated(self, keys: list[str]) -> None: ...


def _depth(path: str) -> int:
    return 0 if path == PATH_PREFIX else len(path[len(PATH_PREFIX):].strip("/").split("/"))


class MetadataStoreTableView:
    """The owner's table over the znodes of /service_unit_state (see the module)."""

    name = "ServiceUnitStateMetadataStoreTableViewImpl"

    def __init__(self, store: Any, sink: TableSink, *, stale_cache: bool = False, check_version: bool = True,
                 session_timeout_s: float = 6.0):
        self.store = store
        # Pulsar's ZKSessionWatcher: a connection gone for longer than the session timeout is SessionLost
        # (the client does not wait for the server to say so when it reconnects)
        self.session_timeout_s = session_timeout_s
        self._loss_timer: asyncio.TimerHandle | None = None
        self.sink = sink
        self.stale_cache = stale_cache
        self.check_version = check_version
        self.conflicts: dict[str, int] = {}           # why a put was not written -> count
        self.session_events: list[str] = []           # SessionLost / SessionReestablished, in order
        self._locks: dict[str, asyncio.Lock] = {}
        self._children: dict[str, set[str]] = {}      # watched directory -> its children last read
        self._leaves: set[str] = set()                # watched record znodes
        self._disarmed: set[str] = set()              # watches dropped with the connection, to arm again
        self._lost = False                            # the session was lost since the last connection
        self._filled = False
        self._tasks: set[asyncio.Task] = set()
        self._rearming: asyncio.Task | None = None    # the re-arm under way (one at a time)
        self._rearming_new_session = False
        self._stopped = False

    # -- lifecycle ------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Fill the table and watch; returns when closed (the watches do the rest)."""
        self.store.add_listener(self._on_session)
        await self._fill_retrying("filling the channel's table from the metadata store")
        while not self._stopped:
            await asyncio.sleep(3600)

    async def _fill_retrying(self, what: str) -> bool:
        """`_fill` until it succeeds or the table view is closed (ZooKeeper may be away for long: a
        broker whose table stayed empty would serve nothing): True once filled."""
        i = 0
        while not self._stopped:
            try:
                await self._fill()
                return True
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - ZooKeeper away: try again, a warning every 10th try
                if i % 10 == 0:
                    log.warning("%s (try %d): %s", what, i + 1, e)
                i += 1
                await asyncio.sleep(min(2.0, 0.2 * i))
        return False

    async def close(self) -> None:
        self._stopped = True
        self.store.remove_listener(self._on_session)
        if self._loss_timer is not None:
            self._loss_timer.cancel()
        for t in list(self._tasks):
            t.cancel()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task | None:
        if self._stopped:
            coro.close()
            return None
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def _fill(self) -> None:
        """Every znode read into the table without handlers, then the owner's handleExisting."""
        await self.store.ensure_path(PATH_PREFIX)
        await self._scan(PATH_PREFIX, "fill")
        self._filled = True
        self.sink.on_existing()

    # -- sessions -------------------------------------------------------------------------------------
    def _on_session(self, state: str) -> None:
        if self._stopped:
            return
        if state == "SUSPENDED":
            if self._loss_timer is None and not self._lost:
                self._loss_timer = asyncio.get_running_loop().call_later(self.session_timeout_s, self._session_lost)
        elif state == "LOST":
            self._session_lost()
        elif state == "CONNECTED":
            if self._loss_timer is not None:
                self._loss_timer.cancel()
                self._loss_timer = None
            new_session, self._lost = self._lost, False
            if new_session:
                self.session_events.append("SessionReestablished")
            if self._rearming is not None and not self._rearming.done():
                if not new_session:
                    new_session = self._rearming_new_session   # a refill under way is not downgraded
                self._rearming.cancel()           # a flapping connection: one re-arm at a time, the last
            self._rearming_new_session = new_session
            self._rearming = self._spawn(self._rearm(new_session), "channel-table-rearm")

    def _session_lost(self) -> None:
        if self._loss_timer is not None:
            self._loss_timer.cancel()          # ZooKeeper said so first: the timer is not needed
            self._loss_timer = None
        if self._lost or self._stopped:
            return
        self._lost = True
        self.session_events.append("SessionLost")
        if not self.stale_cache:
            # #24478: the records are untrusted now; this broker's bundles by them are not its own
            keys = session_lost_invalidations(self.sink.view, self.sink.broker_id)
            log.warning("metadata session lost: dropping the channel's table (%d records); this broker's %d "
                        "bundles by it are closed", len(self.sink.view), len(keys))
            self.sink.view.clear()
            self.sink.on_invalidated(keys)
        else:
            log.warning("metadata session lost: the channel's table kept as it is (bug knob "
                        "lb.metadata_table_view_stale_cache)")

    async def _rearm(self, new_session: bool) -> None:
        """The watches dropped with the connection, armed again. Same session: what changed meanwhile is
        delivered. New session: #24478's refill, or (stale_cache) nothing of what was missed."""
        if new_session and not self.stale_cache:
            self._disarmed.clear()
            if await self._fill_retrying("refilling the channel's table after a new metadata session"):
                log.info("refilled the channel's table after a new metadata session")
            return
        mode = "silent" if new_session else "tail"
        paths, self._disarmed = sorted(self._disarmed, key=_depth), set()
        for i, p in enumerate(paths):
            try:
                if p in self._children or _depth(p) < KEY_DEPTH:
                    await self._scan(p, mode)
                else:
                    await self._read(p, mode)
            except asyncio.CancelledError:        # a newer re-arm replaces this one: it arms the rest
                self._disarmed.update(paths[i:])
                raise
            except Exception as e:  # noqa: BLE001 - dropped again: the next connection arms it
                log.info("re-arming the watch of %s: %s", p, e)
                self._disarmed.add(p)

    # -- watches --------------------------------------------------------------------------------------
    def _watcher(self, path: str) -> Any:
        def fired(kind: str) -> None:
            if self._stopped:
                return
            if kind == "NONE":
                self._disarmed.add(path)          # dropped with the connection
                return
            self._spawn(self._fired(path), f"channel-table-{path}")
        return fired

    async def _fired(self, path: str) -> None:
        try:
            if _depth(path) < KEY_DEPTH:
                await self._scan(path, "tail")
            else:
                await self._read(path, "tail")
        except Exception as e:  # noqa: BLE001 - the connection went: re-armed once connected
            log.info("reading %s after its watch: %s", path, e)
            self._disarmed.add(path)

    async def _scan(self, path: str, mode: str) -> None:
        """A directory's children with a watch, and below them down to the records (read in `mode`)."""
        kids = await self.store.children_watched(path, self._watcher(path))
        before = self._children.get(path, set())
        now = set(kids or [])
        if kids is None:
            self._children.pop(path, None)
        else:
            self._children[path] = now
        for k in sorted(before - now):
            child = f"{path}/{k}"
            if _depth(child) == KEY_DEPTH and mode != "fill":
                await self._read(child, mode)           # deleted: its watch has told, or tells now
        if len(self._children) + len(self._leaves) > MAX_WATCHED:
            raise RuntimeError(f"more than {MAX_WATCHED} znodes under {PATH_PREFIX}")
        for k in sorted(now):
            child = f"{path}/{k}"
            if _depth(child) < KEY_DEPTH:
                if child not in self._children or mode == "fill":
                    await self._scan(child, mode)
            elif child not in self._leaves or mode == "fill":
                await self._read(child, mode)

    async def _read(self, path: str, mode: str) -> None:
        """Read a record's znode with a watch. fill: into the table without handlers; tail: into the table,
        the handlers for a change; silent: the watch only."""
        key = key_of(path)
        if key is None:
            return
        lock = self._locks.setdefault(path, asyncio.Lock())
        async with lock:
            got = await self.store.get_watched(path, self._watcher(path))
            self._leaves.add(path)
            if got is None:
                self._leaves.discard(path)
            if mode == "silent":
                return
            try:
                value = ServiceUnitStateData.decode(got[0]) if got is not None else None
            except ChannelDecodeError as e:
                log.warning("channel record %s is not a ServiceUnitStateData: %s", path, e)
                return
            res = self.sink.view.replace(key, value)
            if res is not None and mode == "tail":
                self.sink.on_record(key, res.previous, res.current)

    # -- writes -------------------------------------------------------------------------------------------
    async def put(self, key: str, data: ServiceUnitStateData | None) -> bool:
        """Write a record (None: delete it) over what the store holds, by the resolver and a compare-and-set;
        False on a conflict (swallowed). Then the znode is read back into this broker's table."""
        path = path_of(key)
        got = await self.store.get_or_none(path)
        try:
            current = ServiceUnitStateData.decode(got[0]) if got is not None else None
        except ChannelDecodeError:
            current = None
        why = resolve_put(current, data, check_version=self.check_version)
        written = why is None
        if written:
            try:
                if data is None:
                    if got is not None:
                        await self.store.delete(path, version=got[1])
                elif got is None:
                    await self.store.create(path, data.encode(), makepath=True)
                else:
                    await self.store.set(path, data.encode(), version=got[1])
            except (BadVersion, NodeExists, NoNode) as e:
                why = f"concurrent write ({type(e).__name__})"
                written = False
        if not written:
            self.conflicts[str(why)] = self.conflicts.get(str(why), 0) + 1
            log.info("channel put of %s conflicts: %s (%s over %s)", key, why,
                     data.state.value if data else "tombstone", current.state.value if current else "nothing")
        if self._filled:
            try:
                await self._read(path, "tail")            # notify the local table view at once
            except Exception as e:  # noqa: BLE001 - its watch delivers it later
                log.info("reading back %s: %s", path, e)
        return written


__all__ = ["MetadataStoreTableView", "TableSink"]
