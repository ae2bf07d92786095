"""Bundle ownership through the service-unit state channel, the extensible load manager's
(Pulsar's ServiceUnitStateChannelImpl): the `Ownership` protocol (api.py) over the compacted system
topic `persistent://pulsar/system/loadbalancer-service-unit-state`.

Every broker reads the channel from the earliest message with its own client
(clusters/protocol/client.py) into a `ChannelView` (extensible/state.py, the conflict resolver), runs
`handle_event` (extensible/handlers.py) for every accepted message and `handle_skipped` for every
rejected one, and carries the actions out: it publishes through one producer, closes a service unit
(its topics close, the broker stops owning it), starts owning a bundle on `BundleOwned`, updates a
namespace's boundaries on a split (the compare-and-set zk_ownership.split_plan computes), tombstones.
The actions of one bundle run in the order of its messages; bundles do not wait for each other.

A lookup reads the view (`get_owner`): an unowned bundle gets the least loaded broker
(`select_broker`), published as Assigning, and the lookup waits for the Owned (one assignment per
bundle at a time; bounded by loadBalancerInFlightServiceUnitStateWaitingTimeInMillis). Concurrent
assignments by several brokers race on the topic; its order and the version check decide. The
namespace `pulsar/system` (the channel itself, the load-data topics) is always the channel owner's,
the load-balancer leader's (Pulsar's INTERNAL_TOPICS), outside the channel.

Where the records live is the table view's (loadManagerServiceUnitStateTableViewClassName), behind one
interface (`run`, `put`, `close`): `SystemTopicTableView` (ServiceUnitStateTableViewImpl, the default:
the topic above, its messages into `apply`) or metadata_table_view.MetadataStoreTableView
(ServiceUnitStateMetadataStoreTableViewImpl: one znode per bundle, its changed records into `on_record`,
its fills into `on_existing`, a lost metadata session into `on_invalidated`). The handlers, the lookups
and the waiting are the same for both.

Bundle boundaries, `bundle(topic)` and friends are ZkOwnership's (the namespace's local policies);
only who owns a bundle differs.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from clusters.loadbalancer.api import LookupResult
from clusters.loadbalancer.bundles import (Bundle, BundleError, NamespaceBundles, local_policies_path, parse_range,
                                           topic_namespace)
from clusters.loadbalancer.extensible import handlers as H
from clusters.loadbalancer.extensible.state import (CHANNEL_TOPIC, S, ChannelDecodeError, ChannelView,
                                                    ServiceUnitStateData, StorageType, state_of)
from clusters.loadbalancer.metadata_table_view import MetadataStoreTableView
from clusters.loadbalancer.zk_ownership import BUNDLE_SPLIT_RETRY_LIMIT, ZkOwnership, split_plan
from clusters.metadata.store import BadVersion

log = logging.getLogger(__name__)

SYSTEM_NAMESPACE = "pulsar/system"
MAX_LOOKUP_ROUNDS = 50


def bundle_of_key(key: str) -> Bundle:
    namespace, rng = key.rsplit("/", 1)
    return parse_range(namespace, rng)


def is_system_namespace(namespace: str) -> bool:
    return namespace == SYSTEM_NAMESPACE


class SystemTopicTableView:
    """The channel's records on the system topic (Pulsar's ServiceUnitStateTableViewImpl, the default):
    `run()` reads the topic from the earliest message for ever into the owner's `apply` (the reader
    re-created from the earliest message if it fails; what was applied already is skipped by message id);
    `put(key, record | None)` sends it keyed by the bundle (None: a tombstone) and answers its message
    id; the resolver runs in every reader's view, in the topic's order."""

    name = "ServiceUnitStateTableViewImpl"

    def __init__(self, owner: "ChannelOwnership"):
        self.owner = owner
        self.reader: Any = None
        self.producer: Any = None
        self._producer_lock = asyncio.Lock()
        self.stopped = False

    async def run(self) -> None:
        o = self.owner
        while not self.stopped:
            try:
                if self.reader is None or self.reader.failed is not None:
                    await self._close_reader()
                    self.reader = await o.lm.client.create_reader(CHANNEL_TOPIC, start="earliest")
                    if o.last_applied is None and o.history_end is None:
                        last = await self.reader.last_message_id()
                        o.history_end = (last.ledger_id, last.entry_id)
                mid, key, payload = await self.reader.read_next(timeout=5.0)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a timeout, or the reader failed: go on / re-create
                from clusters.protocol.client import ClientTimeout
                if not isinstance(e, ClientTimeout):
                    log.warning("reading the channel: %s", e)
                    await self._close_reader()
                    await asyncio.sleep(0.5)
                continue
            at = (mid.ledger_id, mid.entry_id)
            if o.last_applied is not None and at <= o.last_applied:
                continue
            o.apply(at, key, payload)

    async def put(self, key: str, data: ServiceUnitStateData | None) -> Any:
        async with self._producer_lock:
            if self.producer is None or self.producer.failed is not None or self.producer.closed:
                self.producer = await self.owner.lm.client.create_producer(CHANNEL_TOPIC)
        return await self.producer.send(data.encode() if data is not None else b"", key=key)

    async def _close_reader(self) -> None:
        r, self.reader = self.reader, None
        if r is not None:
            try:
                await r.close()
            except Exception:  # noqa: BLE001
                pass

    async def close(self) -> None:
        self.stopped = True
        await self._close_reader()
        p, self.producer = self.producer, None
        if p is not None:
            try:
                await p.close()
            except Exception:  # noqa: BLE001
                pass


class ChannelOwnership(ZkOwnership):
    """This broker's view and control of ownership through the channel. `lm` is its load manager
    (extensible_manager.py): the brokers registered, their URLs, the leader, the broker selection and
    the decision log."""

    def __init__(self, store: Any, cfg: Any, lm: Any):
        super().__init__(store, cfg, on_lost=None)
        self.lm = lm
        self.broker_id = lm.broker_id
        # bug knobs (clusters/bugs.py), the load balancer's: the table view without the version rule
        # (apache/pulsar#19620), the split parent tombstoned at once (#19490), a restart that skips an
        # existing Assigning to itself (#25379)
        knobs = lm.knobs
        check_version = not knobs.on("lb.no_version_check")
        self.tombstone_deleted = knobs.on("lb.tombstone_split_parent")
        self.ignore_existing_assigning = knobs.on("lb.ignore_existing_assigning")
        # where the records live (loadManagerServiceUnitStateTableViewClassName): the system topic, or one
        # znode per bundle (metadata_table_view.py; its knob: the table kept across a lost metadata
        # session, apache/pulsar#24478)
        self.metadata_store = bool(lm.settings.metadata_store_table_view)
        self.view = ChannelView(storage=StorageType.MetadataStore if self.metadata_store else StorageType.SystemTopic,
                                check_version=check_version)
        self.table: SystemTopicTableView | MetadataStoreTableView = (
            MetadataStoreTableView(store, self, stale_cache=knobs.on("lb.metadata_table_view_stale_cache"),
                                   check_version=check_version,
                                   session_timeout_s=float(getattr(cfg, "zk_session_timeout", 6.0)))
            if self.metadata_store else SystemTopicTableView(self))
        self.last_applied: tuple[int, int] | None = None
        # the channel's last message when this broker first read it: what comes up to there is history,
        # applied to the view without running its handlers (Pulsar's table view listens to the tail only)
        self.history_end: tuple[int, int] | None = None
        self.stopped = False
        self._waiters: dict[str, list[asyncio.Future]] = {}          # woken by every message of the key
        self._applied_waiters: list[tuple[tuple[int, int], asyncio.Future]] = []
        self._assigning: dict[str, asyncio.Task] = {}                 # one assignment per bundle at a time
        self._chains: dict[str, asyncio.Task] = {}                    # the actions of a key, in order
        # brk_sunit_state_chn_event_publish_ops_total{event, result}
        self.publish_ops: dict[tuple[str, str], int] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        # no re-claiming on a new ZooKeeper session: the channel, not a session, holds ownership
        self.factory.on_change(self._boundaries_changed)

    async def run(self) -> None:
        """The table view's loop (the topic's reader, or the metadata store's fill and watches)."""
        await self.table.run()

    async def close(self) -> None:
        self.stopped = True
        await self.table.close()
        for t in list(self._chains.values()) + list(self._assigning.values()):
            t.cancel()

    # -- applying messages ------------------------------------------------------------------------
    def apply(self, at: tuple[int, int], key: str | None, payload: bytes) -> None:
        """One channel message at message id `at`: into the view, then its actions."""
        self.last_applied = at
        history = self.history_end is not None and at <= self.history_end
        if history and at >= self.history_end:
            # the history is read: what the channel says this broker owns (a previous incarnation under
            # the same brokerId) it owns, as Pulsar's isOwner reads the channel
            self.history_end = None
            history = True
            adopt = True
        else:
            adopt = False
        if key:
            try:
                res = self.view.apply_encoded(key, payload)
            except ChannelDecodeError as e:
                log.warning("channel message %s of %s is not a ServiceUnitStateData: %s", at, key, e)
                res = None
            if not history and res is not None:
                if res.accepted:
                    self._handle(key, res.previous, res.current)
                else:
                    actions = H.handle_skipped(key, res.current)
                    if actions:
                        self._run(key, actions)
            self._wake(key)
        if adopt:
            self._handle_existing()
        still = []
        for target, fut in self._applied_waiters:
            if fut.done():
                continue
            if at >= target:
                fut.set_result(None)
            else:
                still.append((target, fut))
        self._applied_waiters = still

    def _handle(self, key: str, previous: ServiceUnitStateData | None, current: ServiceUnitStateData | None) -> None:
        """handleEvent for an accepted record (a tail message, or a changed znode)."""
        actions = H.handle_event(key, previous, current, self.broker_id, view=self.view,
                                 multi_phase=self.lm.settings.loadBalancerMultiPhaseBundleUnload,
                                 now_ms=_now_ms(), tombstone_deleted=self.tombstone_deleted)
        if current is not None and current.state == S.Deleted:
            self._forget(key)         # split: the children replace it
        if actions:
            self._run(key, actions)

    def _wake(self, key: str) -> None:
        for fut in self._waiters.pop(key, []):
            if not fut.done():
                fut.set_result(None)

    # -- the metadata-store table view's callbacks (metadata_table_view.TableSink) ----------------------
    def on_record(self, key: str, previous: ServiceUnitStateData | None,
                  current: ServiceUnitStateData | None) -> None:
        self._handle(key, previous, current)
        self._wake(key)

    def on_existing(self) -> None:
        self._handle_existing()
        for key in list(self._waiters):
            self._wake(key)

    def on_invalidated(self, keys: list[str]) -> None:
        """The metadata session was lost: the bundles this broker owned by its table are not its own any
        more (apache/pulsar#24478); their service units close."""
        for key in keys:
            try:
                self.owned.discard(bundle_of_key(key))
            except (BundleError, ValueError):
                continue
            self._run(key, [H.CloseServiceUnit(key, True)])

    def _handle_existing(self) -> None:
        """handleExisting, once the history is read: the bundles the channel says this broker owns are
        its own; an Assigning to this broker is completed (its Owned published), unless the knob
        lb.ignore_existing_assigning skips it."""
        now = _now_ms()
        for k, d in self.view.items():
            actions = H.handle_existing(k, d, self.broker_id, now_ms=now,
                                        ignore_assigning=self.ignore_existing_assigning)
            rest = []
            for a in actions:
                if isinstance(a, H.BundleOwned):
                    self.owned.add(bundle_of_key(k))
                    self._load_boundaries(bundle_of_key(k).namespace)
                else:
                    rest.append(a)
            if rest:
                log.info("completing the existing %s of %s", d.state.value, k)
                self._run(k, rest)

    def _load_boundaries(self, namespace: str) -> None:
        """Read a namespace's boundaries (then kept by their watch) if this broker has not yet: a restarted
        broker owns bundles from the channel before any lookup of it loads them, and `owns(topic)` maps a
        topic by them (the initial layout would name a split parent, and refuse the topic)."""
        if self.factory.cached(namespace) is not None or is_system_namespace(namespace):
            return

        async def load() -> None:
            try:
                await self.factory.get(namespace)
            except Exception as e:  # noqa: BLE001 - the next lookup of the namespace loads them
                log.warning("reading the boundaries of %s: %s", namespace, e)
        asyncio.get_running_loop().create_task(load(), name=f"boundaries-{namespace}")

    def _forget(self, key: str) -> None:
        try:
            self.owned.discard(bundle_of_key(key))
        except (BundleError, ValueError):
            pass

    def _run(self, key: str, actions: list[H.Action]) -> None:
        prev = self._chains.get(key)

        async def run() -> None:
            if prev is not None and not prev.done():
                await asyncio.wait([prev])
            for a in actions:
                try:
                    await self._do(a)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - the rest of this message's actions wait for a retry
                    log.warning("channel action %s: %s: %s", a, type(e).__name__, e)
                    return
        task = asyncio.get_running_loop().create_task(run(), name=f"channel-{key}")
        self._chains[key] = task

        def done(t: asyncio.Task, k: str = key) -> None:
            if self._chains.get(k) is t:
                del self._chains[k]
        task.add_done_callback(done)

    async def _do(self, a: H.Action) -> None:
        if isinstance(a, H.Publish):
            await self.publish(a.key, a.data, a.data.state.value)
        elif isinstance(a, H.Tombstone):
            await self.publish(a.key, None, "Tombstone")
        elif isinstance(a, H.BundleOwned):
            bundle = bundle_of_key(a.key)
            if self.factory.cached(bundle.namespace) is None and not is_system_namespace(bundle.namespace):
                await self.factory.get(bundle.namespace)       # owns(topic) maps topics by them
            if bundle not in self.owned:
                self.owned.add(bundle)
                log.info("owning bundle %s", a.key)
        elif isinstance(a, H.CloseServiceUnit):
            bundle = bundle_of_key(a.key)
            self.owned.discard(bundle)
            await self.lm.service.bundle_lost(bundle)
            log.info("closed bundle %s", a.key)
        elif isinstance(a, H.UpdateNamespaceBundles):
            await self.update_boundaries(a.parent, a.children)
        # CompleteLookups / FailLookups: every waiter of the key was woken by the message already

    # -- publishing ----------------------------------------------------------------------------------
    async def publish(self, key: str, data: ServiceUnitStateData | None, event: str) -> Any:
        """Send a record (None: a tombstone) keyed by the bundle: on the topic, its message id once
        written; on the metadata store, whether it was written (a conflict is not an error)."""
        try:
            return await self.table.put(key, data)
        except Exception:
            self._count(event, "Failure")
            raise
        finally:
            self._count(event, "Total")

    def _count(self, event: str, result: str) -> None:
        self.publish_ops[(event, result)] = self.publish_ops.get((event, result), 0) + 1

    # -- waiting ---------------------------------------------------------------------------------------
    async def wait_change(self, key: str, timeout: float) -> bool:
        """Until the next message of `key` is applied; False on timeout."""
        if timeout <= 0:
            return False
        fut = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            lst = self._waiters.get(key)
            if lst and fut in lst:
                lst.remove(fut)

    async def wait_applied(self, mid: Any, timeout: float) -> bool:
        target = (mid.ledger_id, mid.entry_id)
        if self.last_applied is not None and self.last_applied >= target:
            return True
        fut = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((target, fut))
        try:
            await asyncio.wait_for(fut, max(0.01, timeout))
            return True
        except asyncio.TimeoutError:
            return False

    async def wait_until(self, key: str, pred: Any, timeout: float) -> bool:
        """Until `pred(record or None)` holds for the view's record of `key`; False on timeout."""
        deadline = time.monotonic() + timeout
        for _ in range(10_000):
            if pred(self.view.get(key)):
                return True
            if not await self.wait_change(key, deadline - time.monotonic()):
                return pred(self.view.get(key))
        return False

    # -- the Ownership protocol ------------------------------------------------------------------------
    def owns(self, topic: str) -> bool:
        namespace, _ = topic_namespace(topic)
        if is_system_namespace(namespace):
            return self.lm.is_leader() and not self.lm.stopping
        return super().owns(topic)

    def owner_id(self, bundle: Bundle) -> str | None:
        """The bundle's owner as a brokerId, by the view (the leader for pulsar/system)."""
        if is_system_namespace(bundle.namespace):
            return self.lm.election.leader_id()
        d = self.view.get(str(bundle))
        if d is None:
            return None
        if d.state == S.Owned:
            return d.dstBroker
        if d.state == S.Splitting:
            return d.sourceBroker
        return None

    async def owner(self, bundle: Bundle) -> str | None:
        bid = self.owner_id(bundle)
        if bid is None:
            return None
        if bid == self.broker_id:
            return self.me
        url = await self.lm.pulsar_url(bid)
        return url.split("://", 1)[-1] if url else None

    async def release(self, bundle: Bundle) -> bool:
        """Give the bundle up: a plain unload (Releasing -> Free) if the view says it is ours."""
        self.owned.discard(bundle)
        key = str(bundle)
        if self.view.is_owner(key, self.broker_id):
            try:
                await self.publish(key, H.unload_event(self.view, key, self.broker_id, None, now_ms=_now_ms()),
                                   "Unload")
            except Exception as e:  # noqa: BLE001
                log.warning("releasing bundle %s: %s", key, e)
                return False
        return True

    async def release_all(self) -> None:
        return None          # the load manager's graceful stop transfers the bundles (doCleanup)

    async def split(self, bundle: Bundle, cuts: list[int]) -> list[Bundle]:
        raise BundleError("with the extensible load manager a split is a channel event (load_manager.split)")

    async def lookup(self, topic: str, authoritative: bool) -> LookupResult:
        try:
            namespace, _ = topic_namespace(topic)
        except ValueError as e:
            return LookupResult("failed", error="InvalidTopicName", message=str(e))
        if is_system_namespace(namespace):
            leader = self.lm.election.leader_id()
            if leader == self.broker_id and not self.lm.stopping:
                return LookupResult("connect", self.cfg.service_url, True)
            url = await self.lm.pulsar_url(leader) if leader else None
            if not url:
                return LookupResult("failed", error="ServiceNotReady",
                                    message=f"no channel owner (load-balancer leader) for {topic} now; retry")
            return LookupResult("connect", url, True)
        try:
            if self.bundle(topic) in self.owned:
                return LookupResult("connect", self.cfg.service_url, True)
            bundle = await self.bundle_for(topic)
            owner = await self.find_owner(str(bundle))
        except LookupError as e:
            return LookupResult("failed", error="ServiceNotReady", message=str(e))
        except Exception as e:  # noqa: BLE001 - ZooKeeper or the channel unreachable: the client retries
            return LookupResult("failed", error="ServiceNotReady",
                                message=f"Failed to look up the owner of {topic}: {type(e).__name__}: {e}")
        if owner == self.broker_id:
            return LookupResult("connect", self.cfg.service_url, True)
        url = await self.lm.pulsar_url(owner)
        if not url:
            return LookupResult("failed", error="ServiceNotReady",
                                message=f"the owner {owner} of {bundle} is not registered now; retry")
        return LookupResult("connect", url, True)

    async def find_owner(self, key: str) -> str:
        """getOwnerAsync, and an assignment when the bundle has no owner: the owner's brokerId once
        the bundle is Owned (or Splitting). LookupError when there is none within the in-flight wait."""
        wait_s = self.lm.settings.loadBalancerInFlightServiceUnitStateWaitingTimeInMillis / 1000.0
        deadline = time.monotonic() + wait_s
        for _ in range(MAX_LOOKUP_ROUNDS):
            left = deadline - time.monotonic()
            ans = H.get_owner(self.view, key, self.broker_id, self.lm.registered)
            st = self.view.state(key)
            if ans.kind == "owner":
                if st in (S.Assigning, S.Releasing) and left > 0:
                    await self.wait_change(key, left)       # in flight: wait for the Owned
                    continue
                return str(ans.broker)
            if ans.kind == "error":
                raise LookupError(ans.reason)
            if left <= 0:
                break
            if ans.kind == "wait" or st in (S.Assigning, S.Releasing, S.Splitting):
                await self.wait_change(key, left)       # e.g. a plain unload's Releasing: wait for the Free
                continue
            task = self._assigning.get(key)
            if task is None:
                task = asyncio.get_running_loop().create_task(self._assign(key, deadline))
                self._assigning[key] = task
                task.add_done_callback(lambda _t, k=key: self._assigning.pop(k, None))
            await asyncio.wait_for(asyncio.shield(task), max(0.01, left))
        raise LookupError(f"bundle {key} has no owner within {wait_s:.1f} s "
                          f"(now {state_of(self.view.get(key)).value}); retry")

    async def _assign(self, key: str, deadline: float) -> None:
        """publishAssignEventAsync: Assigning(dst = the selected broker), then wait until the view
        has applied it (accepted or not)."""
        broker = self.lm.select(key, set(), reason="lookup")
        if broker is None:
            raise LookupError(f"no broker is available to own {key}")
        mid = await self.publish(key, H.assign_event(self.view, key, broker, _now_ms()), "Assign")
        if not self.metadata_store:           # the metadata store's put has read it back already
            await self.wait_applied(mid, deadline - time.monotonic())

    # -- splits ------------------------------------------------------------------------------------------
    async def update_boundaries(self, parent_key: str, children_keys: tuple[str, ...]) -> None:
        """UpdateNamespaceBundles: the parent replaced by its children in the namespace's local policies
        (compare-and-set, retried on a concurrent change); done already counts as done."""
        parent = bundle_of_key(parent_key)
        children = [bundle_of_key(c) for c in children_keys]
        cuts = sorted(c.lower for c in children if c.lower != parent.lower)
        for _ in range(BUNDLE_SPLIT_RETRY_LIMIT):
            nb = await self.factory.load(parent.namespace)
            if parent not in nb:
                if all(c in nb for c in children):
                    return
                raise BundleError(f"{parent} is no longer a bundle of {parent.namespace} (now {nb})")
            plan = await split_plan(self.store, self.factory, parent, cuts)
            if plan is None:
                continue
            read, bounds, _, data = plan
            try:
                await self.store.set(local_policies_path(parent.namespace), data, version=read.version)
            except BadVersion:
                await asyncio.sleep(0.1)
                continue
            self.factory.note(NamespaceBundles(parent.namespace, bounds, read.version + 1))
            log.info("split bundle %s into %s", parent, [c.range_name for c in children])
            return
        raise BundleError(f"splitting {parent}: the boundaries kept changing ({BUNDLE_SPLIT_RETRY_LIMIT} attempts)")

    # -- the harness's channel checker -----------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {"broker": self.broker_id, "leader": bool(self.lm.is_leader()),
                               "table_view": self.table.name,
                               "records": {k: d.to_json() for k, d in self.view.items()}}
        if not self.metadata_store:          # a position in the topic; znodes have none
            out["last_applied"] = list(self.last_applied) if self.last_applied is not None else None
        return out


def _now_ms() -> int:
    return int(time.time() * 1000)
