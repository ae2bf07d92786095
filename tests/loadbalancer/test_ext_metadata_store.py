"""The extensible load manager's metadata-store table view (ServiceUnitStateMetadataStoreTableViewImpl,
clusters/loadbalancer/metadata_table_view.py) and its bug knob lb.metadata_table_view_stale_cache
(apache/pulsar#24478).

The pure part: the metadata store's write rules, the table's replace-on-read, the session-loss
invalidation. The rest against a real ZooKeeper (the session's chroot), two brokers' table views driven by
the pure handlers (extensible/handlers.py), broker 0 reaching ZooKeeper through a TCP relay on loopback
that the test cuts: its session expires while the other broker takes its bundle over, then the relay is
restored. With #24478's handling broker 0 gives the bundle up; with the knob its table keeps its own
Owned record and both brokers serve the bundle.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any

import pytest

from clusters.bugs import REGISTRY
from clusters.loadbalancer.extensible import handlers as H
from clusters.loadbalancer.extensible.metadata_store import (PATH_PREFIX, key_of, owns_by_record, path_of,
                                                             resolve_put, session_lost_invalidations)
from clusters.loadbalancer.extensible.state import (INVALID_TRANSITION, VERSION_GAP, VERSION_NOT_INITIAL,
                                                    VERSION_NOT_NEWER, S, ChannelView, ServiceUnitStateData,
                                                    StorageType)
from clusters.loadbalancer.metadata_table_view import MetadataStoreTableView
from clusters.loadbalancer.settings import (METADATA_STORE_TABLE_VIEW, SYSTEM_TOPIC_TABLE_VIEW,
                                            LoadBalancerSettings)
from clusters.metadata.store import MetadataStore

KEY = "public/default/0x00000000_0x40000000"
B0, B1 = "10.0.0.1:8080", "10.0.0.2:8080"


def rec(state: S, dst: str | None = None, src: str | None = None, v: int = 1, force: bool = False):
    return ServiceUnitStateData(state, dst, src, None, force, 1000 + v, v)


# ------------------------------------------------------------------------------------------ pure

def test_the_setting_takes_pulsars_class_names_and_refuses_others():
    s = LoadBalancerSettings.from_mapping({"loadManagerServiceUnitStateTableViewClassName":
                                           "ServiceUnitStateMetadataStoreTableViewImpl"})
    assert s.loadManagerServiceUnitStateTableViewClassName == METADATA_STORE_TABLE_VIEW
    assert s.metadata_store_table_view
    assert LoadBalancerSettings().loadManagerServiceUnitStateTableViewClassName == SYSTEM_TOPIC_TABLE_VIEW
    assert not LoadBalancerSettings().metadata_store_table_view
    with pytest.raises(ValueError, match="ServiceUnitStateMetadataStoreTableViewImpl"):
        LoadBalancerSettings.from_mapping({"loadManagerServiceUnitStateTableViewClassName": "TableView"})


def test_a_write_follows_the_metadata_stores_rules():
    assert resolve_put(None, rec(S.Assigning, B0)) is None
    assert resolve_put(None, rec(S.Assigning, B0, v=2)) == VERSION_NOT_INITIAL
    assert resolve_put(None, rec(S.Owned, B0)) == INVALID_TRANSITION          # Init -> Owned: topic only
    assert resolve_put(rec(S.Assigning, B0), rec(S.Owned, B0, v=2)) is None
    assert resolve_put(rec(S.Assigning, B0), rec(S.Owned, B0, v=3)) == VERSION_GAP  # no compaction here
    assert resolve_put(rec(S.Owned, B0, v=2), rec(S.Owned, B1, B0, v=2, force=True)) == VERSION_NOT_NEWER
    assert resolve_put(rec(S.Owned, B0, v=2), rec(S.Owned, B1, B0, v=3, force=True)) is None
    assert resolve_put(rec(S.Owned, B0, v=2), None) is None                   # a delete
    # the version rule off (lb.no_version_check) applies to the store's writes too
    assert resolve_put(rec(S.Owned, B0, v=2), rec(S.Owned, B1, B0, v=2, force=True), check_version=False) is None


def test_paths_and_keys():
    assert path_of(KEY) == f"{PATH_PREFIX}/{KEY}" and key_of(path_of(KEY)) == KEY
    assert key_of(f"{PATH_PREFIX}/public/default") is None
    assert key_of("/namespace/public/default/0x00000000_0x40000000") is None
    assert key_of(f"{PATH_PREFIX}/public/default/0x0_0x4") is None


def test_the_table_replaces_records_without_the_resolver_and_reports_only_changes():
    view = ChannelView(storage=StorageType.MetadataStore)
    r = view.replace(KEY, rec(S.Assigning, B0))
    assert r is not None and r.previous is None and view.state(KEY) == S.Assigning
    assert view.replace(KEY, rec(S.Assigning, B0)) is None                  # the same record: nothing
    # a notification may skip versions (Assigning v1 -> Releasing v3): the store's record wins
    r = view.replace(KEY, rec(S.Releasing, B1, B0, v=3))
    assert r is not None and r.previous == rec(S.Assigning, B0) and view.get(KEY).versionId == 3
    assert view.replace(KEY, None) is not None and KEY not in view
    view.replace(KEY, rec(S.Splitting, None, B0, v=4))
    assert view.splitting() == [KEY]
    assert view.clear() == [(KEY, rec(S.Splitting, None, B0, v=4))] and len(view) == 0 and view.splitting() == []


def test_session_loss_invalidates_what_the_broker_owns_by_its_records():
    view = ChannelView(storage=StorageType.MetadataStore)
    view.replace("t/ns/0x00000000_0x40000000", rec(S.Owned, B0, v=2))
    view.replace("t/ns/0x40000000_0x80000000", rec(S.Splitting, None, B0, v=3))
    view.replace("t/ns/0x80000000_0xc0000000", rec(S.Owned, B1, v=2))
    view.replace("t/ns/0xc0000000_0xffffffff", rec(S.Assigning, B0))
    assert session_lost_invalidations(view, B0) == ["t/ns/0x00000000_0x40000000", "t/ns/0x40000000_0x80000000"]
    assert owns_by_record(rec(S.Owned, B1, v=2), B1) and not owns_by_record(None, B0)


def test_the_knob_is_registered_off_with_its_issue_and_scenario():
    k = REGISTRY["lb.metadata_table_view_stale_cache"]
    assert k.default is False and k.component == "load-balancer" and k.issues == ("apache/pulsar#24478",)
    assert "ServiceUnitStateMetadataStoreTableViewImpl" in k.scenario and "zk-isolate" in k.scenario


# ------------------------------------------------------------------------------------------ real ZooKeeper

class Relay:
    """A TCP relay on loopback to ZooKeeper that the test cuts (every connection dropped, new ones closed
    at once) and restores. Threads end with `close`."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.cut = False
        self.closed = False
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            if self.cut:
                c.close()
                continue
            try:
                u = socket.create_connection(self.target, timeout=2)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                t = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                t.start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            with self.lock:
                conns, self.conns = self.conns, []
            for s in conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.set_cut(True)
        self.sock.close()
        self.threads[0].join(2)


class Broker:
    """A broker's side of the channel for this test: its table view, and the bundles it serves by the
    pure handlers' actions (BundleOwned / CloseServiceUnit / the session loss's invalidation)."""

    def __init__(self, store: MetadataStore, broker_id: str, *, stale_cache: bool, session_timeout_s: float):
        self.broker_id = broker_id
        self.view = ChannelView(storage=StorageType.MetadataStore)
        self.serving: set[str] = set()
        self.tv = MetadataStoreTableView(store, self, stale_cache=stale_cache, session_timeout_s=session_timeout_s)
        self.tasks: list[asyncio.Task] = []

    def on_record(self, key: str, previous: Any, current: Any) -> None:
        self._act(H.handle_event(key, previous, current, self.broker_id, view=self.view, now_ms=5000))

    def on_existing(self) -> None:
        for k, d in self.view.items():
            self._act(H.handle_existing(k, d, self.broker_id, now_ms=5000))

    def on_invalidated(self, keys: list[str]) -> None:
        self.serving.difference_update(keys)

    def _act(self, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, H.BundleOwned):
                self.serving.add(a.key)
            elif isinstance(a, H.CloseServiceUnit):
                self.serving.discard(a.key)
            elif isinstance(a, H.Publish):
                self.tasks.append(asyncio.get_running_loop().create_task(self.tv.put(a.key, a.data)))


async def until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


@contextlib.asynccontextmanager
async def running_brokers(connects: list[tuple[str, float | None]], stale_cache: bool, session_timeout_s: float):
    """Brokers B0 and B1 on their own metadata stores (connect string, session timeout or None for the
    default), their table views running; everything opened is closed again, also when a store fails to
    start or the body fails."""
    stores: list[MetadataStore] = []
    brokers: list[Broker] = []
    runs: list[asyncio.Task] = []
    try:
        for i, (connect, timeout) in enumerate(connects):
            kw = {"session_timeout": timeout} if timeout is not None else {}
            stores.append(await MetadataStore(connect, name=f"b{i}", **kw).start())
        brokers = [Broker(st, b, stale_cache=stale_cache, session_timeout_s=session_timeout_s)
                   for st, b in zip(stores, (B0, B1))]
        runs = [asyncio.get_running_loop().create_task(b.tv.run()) for b in brokers]
        yield brokers[0], brokers[1], stores
    finally:
        for b in brokers:
            await b.tv.close()
            for t in b.tasks:
                t.cancel()
        for t in runs:
            t.cancel()
        for st in stores:
            await st.close()


def _two_brokers_after_a_lost_session(zk: str, stale_cache: bool) -> tuple[Broker, Broker]:
    """Broker 0 owns KEY (assigned by broker 1, completed by broker 0's handler); broker 0 is cut from
    ZooKeeper past its session; broker 1 (the leader's monitor) overrides the orphan to itself; broker 0
    reaches ZooKeeper again. Both brokers, settled."""
    hostport, chroot = zk.split("/", 1)
    host, port = hostport.rsplit(":", 1)
    relay = Relay((host, int(port)))
    timeout = 1.5

    async def scenario() -> tuple[Broker, Broker]:
        async with running_brokers([(f"127.0.0.1:{relay.port}/{chroot}", timeout), (zk, None)], stale_cache,
                                   timeout) as (b0, b1, (s0, s1)):
            await until(lambda: b0.tv._filled and b1.tv._filled, 10, "both tables filled")
            await s0.create("/reg/b0", b"", ephemeral=True, makepath=True)      # broker 0's registration
            assert await b1.tv.put(KEY, H.assign_event(b1.view, KEY, B0, 1000))
            await until(lambda: KEY in b0.serving and b1.view.is_owner(KEY, B0), 10, "broker 0 owns the bundle")
            relay.set_cut(True)
            await until(lambda: b0.tv.session_events[-1:] == ["SessionLost"], 10, "broker 0's session lost")
            for _ in range(100):                      # the server expires it: the registration goes
                if not await s1.exists("/reg/b0"):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("broker 0's session did not expire")
            # the leader's monitor: the orphan of an inactive broker, forced to broker 1
            orphan = b1.view.get(KEY)
            assert await b1.tv.put(KEY, ServiceUnitStateData(S.Owned, B1, B0, None, True, 2000,
                                                             orphan.versionId + 1))
            await until(lambda: KEY in b1.serving, 10, "broker 1 owns the bundle")
            relay.set_cut(False)
            await until(lambda: b0.tv.session_events[-1:] == ["SessionReestablished"], 20,
                        "broker 0's new session")
            await until(lambda: not b0.tv._tasks, 10, "broker 0's watches armed again")
            await asyncio.sleep(0.5)
            return b0, b1

    try:
        return asyncio.run(scenario())
    finally:
        relay.close()


def test_two_views_share_the_records_and_a_conflicting_write_is_swallowed(zk):
    async def scenario() -> None:
        async with running_brokers([(zk, None), (zk, None)], False, 6.0) as (b0, b1, stores):
            await until(lambda: b0.tv._filled and b1.tv._filled, 10, "both tables filled")
            # two brokers assign the bundle at once: one Assigning v1 is written, the other conflicts
            got = await asyncio.gather(b0.tv.put(KEY, H.assign_event(b0.view, KEY, B0, 1000)),
                                       b1.tv.put(KEY, H.assign_event(b1.view, KEY, B1, 1000)))
            assert sorted(got) == [False, True]
            await until(lambda: b0.view.state(KEY) == b1.view.state(KEY) == S.Owned, 10, "the bundle owned")
            owner = b0.view.get(KEY).dstBroker
            assert b0.view.get(KEY) == b1.view.get(KEY) and b0.view.get(KEY).versionId == 2
            assert [b.broker_id for b in (b0, b1) if KEY in b.serving] == [owner]
            assert sum(b.tv.conflicts.get(r, 0) for b in (b0, b1) for r in b.tv.conflicts) == 1
            # a stale write (an older version) is refused by the store's record, not by the writer's view
            assert not await b0.tv.put(KEY, rec(S.Releasing, None, owner, v=2))
            assert b0.view.get(KEY).versionId == 2
            # a record's znode holds Pulsar's JSON
            data, _ = await stores[0].get(path_of(KEY))
            assert ServiceUnitStateData.decode(data) == b0.view.get(KEY)
    asyncio.run(scenario())


def test_after_a_lost_session_the_table_is_refilled_and_the_moved_bundle_given_up(zk):
    b0, b1 = _two_brokers_after_a_lost_session(zk, stale_cache=False)
    assert b0.tv.session_events == ["SessionLost", "SessionReestablished"]
    assert b0.view.get(KEY) == b1.view.get(KEY) and b0.view.get(KEY).dstBroker == B1
    assert KEY not in b0.serving and KEY in b1.serving          # one owner


def test_knob_a_stale_table_keeps_the_moved_bundle_two_owners(zk):
    b0, b1 = _two_brokers_after_a_lost_session(zk, stale_cache=True)
    assert b0.tv.session_events == ["SessionLost", "SessionReestablished"]
    assert b0.view.get(KEY).dstBroker == B0 and b1.view.get(KEY).dstBroker == B1     # the views disagree
    assert KEY in b0.serving and KEY in b1.serving              # two owners


# ------------------------------------------------------------------------------------------ the channel checker

def _store_history(final_view_of_b0: dict[str, Any]) -> list[Any]:
    """A metadata-store observer's rows: the records as read (versions skipped between two reads: the
    Releasing/Assigning of a move was not seen), B1's final view equal to the store, B0's as given."""
    from core.history import OBSERVER_PROCESS, Op
    from core.observations import CHANNEL_MESSAGE, CHANNEL_VIEW, OBSERVE_START, OBSERVE_STOP
    ops: list[Op] = []

    def row(f: str, key: str, value: Any) -> None:
        ops.append(Op(process=OBSERVER_PROCESS, type="ok", f=f, key=key, value=value,
                      time_ns=(len(ops) + 1) * 10 ** 9, index=len(ops)))
    wall = 1_700_000_000_000
    row(OBSERVE_START, "", {"source": "metadata-store", "ports": {B0: "broker-1", B1: "broker-2"}})
    for zxid, r in ((10, rec(S.Assigning, B0)), (11, rec(S.Owned, B0, v=2)),
                    (20, rec(S.Owned, B1, B0, v=5))):                  # Releasing v3, Assigning v4 unseen
        row(CHANNEL_MESSAGE, KEY, {"message_id": [zxid, 0, -1], "publish_ms": wall + zxid * 1000,
                                   "wall_ms": wall + zxid * 1000, "value": r.to_json()})
    row(CHANNEL_VIEW, B1, {"broker": B1, "records": {KEY: rec(S.Owned, B1, B0, v=5).to_json()}, "final": True})
    row(CHANNEL_VIEW, B0, {"broker": B0, "records": final_view_of_b0, "final": True})
    row(OBSERVE_STOP, "", {"reason": "run ended", "wall_ms": wall + 30_000})
    return ops


def test_the_channel_checker_takes_the_stores_records_as_they_are_and_finds_a_stale_table():
    from checkers.channel import check
    ok = check(_store_history({KEY: rec(S.Owned, B1, B0, v=5).to_json()}))
    assert ok.valid is True, ok.anomalies
    assert ok.stats["convergence"] == {B0: "converged", B1: "converged"}
    stale = check(_store_history({KEY: rec(S.Owned, B0, v=2).to_json()}))        # #24478: B0 kept its record
    assert stale.valid is False and set(stale.anomalies) == {"view-not-converged"}
    assert stale.anomalies["view-not-converged"][0]["broker"] == B0


def test_a_session_loss_zookeeper_reports_before_the_timeout_counts_once(zk):
    """SUSPENDED starts the session-timeout clock (Pulsar's ZKSessionWatcher); a LOST from ZooKeeper before it
    runs out is the loss, and the clock does not declare a second one after the new session."""
    async def scenario() -> list[str]:
        store = await MetadataStore(zk, name="b0").start()
        b = Broker(store, B0, stale_cache=False, session_timeout_s=0.3)
        run = asyncio.get_running_loop().create_task(b.tv.run())
        try:
            await until(lambda: b.tv._filled, 10, "the table filled")
            for state in ("SUSPENDED", "LOST", "CONNECTED"):
                b.tv._on_session(state)
            await asyncio.sleep(0.8)
            return b.tv.session_events
        finally:
            await b.tv.close()
            run.cancel()
            await store.close()
    assert asyncio.run(scenario()) == ["SessionLost", "SessionReestablished"]


def test_the_table_view_keeps_filling_until_zookeeper_answers_and_a_close_stops_it():
    """ZooKeeper away at start: the fill is retried (not given up after a count, which left the table empty
    for good) until it succeeds, or the table view is closed; close removes its session listener."""
    from clusters.loadbalancer.extensible.state import ChannelView

    class Store:
        def __init__(self, fails: int):
            self.fails, self.listeners = fails, []

        def add_listener(self, fn):
            self.listeners.append(fn)

        def remove_listener(self, fn):
            self.listeners.remove(fn)

        async def ensure_path(self, path):
            if self.fails:
                self.fails -= 1
                raise ConnectionError("ZooKeeper not reachable")

    class Sink:
        view, broker_id, existing = ChannelView(), "b1", 0

        def on_existing(self):
            self.existing += 1

    async def scenario():
        ok = MetadataStoreTableView(Store(fails=3), Sink())
        ok._scan = lambda path, mode: asyncio.sleep(0)             # nothing stored yet
        assert await asyncio.wait_for(ok._fill_retrying("fill"), 10) is True
        assert ok._filled and ok.sink.existing == 1
        away = MetadataStoreTableView(Store(fails=10**6), Sink())
        task = asyncio.create_task(away.run())
        await asyncio.sleep(1.5)
        assert not away._filled and away.store.listeners
        await away.close()
        await asyncio.wait_for(task, 5)                            # run returns once closed
        assert not away.store.listeners
    asyncio.run(scenario())
