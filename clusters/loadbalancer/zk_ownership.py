"""Topic ownership through ZooKeeper locks, the modular load manager's (Pulsar's OwnershipCache over
ResourceLocks): a bundle (a hash range of topic names) is owned through an ephemeral znode
`/namespace/<tenant>/<ns>/<range>`; the bundles themselves come from the namespace's boundaries
(bundles.py). Who gets an unowned bundle is the load manager's decision (`assign`); taking the lock,
releasing it, and splitting a bundle this broker owns are done here.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

from clusters.bugs import Knobs
from clusters.config import BrokerConfig
from clusters.loadbalancer.bundles import (NAMESPACE_ROOT, Bundle, BundleError, BundleFactory,  # noqa: F401
                                           NamespaceBundles, bundle_of, bundles_data, default_bundles,
                                           local_policies_path, parse_bundles_data,
                                           topic_namespace)
from clusters.loadbalancer.api import Assignment, LookupResult
from clusters.metadata.brokers import BrokerRegistry
from clusters.metadata.codec import decode_json_object
from clusters.metadata.store import BadVersion, MetadataStore, NodeExists, NoNode

log = logging.getLogger(__name__)

BUNDLE_SPLIT_RETRY_LIMIT = 7            # NamespaceService.BUNDLE_SPLIT_RETRY_LIMIT


async def split_plan(store: MetadataStore, factory: BundleFactory, bundle: Bundle, cuts: list[int]
                     ) -> tuple[NamespaceBundles, list[int], list[Bundle], bytes] | None:
    """A split of `bundle` at `cuts` in its namespace's local policies, as read now: (the boundaries
    read, with their znode version; the new boundaries; the children; the new local policies JSON, their
    other fields kept). None when the local policies were never written (they are now, from the
    namespace's policies: read again). BundleError when `bundle` is not one of the boundaries read."""
    got = await store.get_or_none(local_policies_path(bundle.namespace))
    if got is None:
        await factory.load(bundle.namespace)
        return None
    body = decode_json_object(got[0])
    nb = NamespaceBundles(bundle.namespace, parse_bundles_data(body.get("bundles")), got[1])
    bounds = nb.with_split(bundle, cuts)
    children = [b for b in NamespaceBundles(bundle.namespace, bounds).bundles
                if bundle.lower <= b.lower and b.upper <= bundle.upper]
    body["bundles"] = bundles_data(bounds)
    return nb, bounds, children, json.dumps(body, sort_keys=True).encode()


def _lock_broker(data: bytes | None) -> str | None:
    """The broker a lock's value names (None when it names none)."""
    try:
        return json.loads(data or b"{}").get("broker")
    except (ValueError, AttributeError):
        return None


class ZkOwnership:
    """This broker's view and control of bundle ownership through ZooKeeper locks (the `Ownership`
    protocol of manager.py)."""

    def __init__(self, store: MetadataStore, cfg: BrokerConfig,
                 on_lost: Callable[[Bundle], Any] | None = None):
        self.store = store
        self.cfg = cfg
        self.knobs = Knobs(cfg.bugs, "broker")     # bug knobs (clusters/bugs.py)
        self.me = f"{cfg.host}:{cfg.port}"
        self.owned: set[Bundle] = set()
        # bundles being unloaded (Pulsar's OwnedBundle made inactive before its topics close): from the
        # moment an unload starts until its lock is deleted nothing here adds them to `owned` again,
        # whatever a lookup or an acquire that began earlier reads from ZooKeeper meanwhile
        self.unloading: set[Bundle] = set()
        self.on_lost = on_lost
        self.factory = BundleFactory(store, int(cfg.bundles))
        # the load manager's choice for an unowned bundle (clusters/loadbalancer/manager.py)
        self.assign: Callable[[Bundle], Awaitable[Assignment]] | None = None
        self._session_lost = False
        self._recheck: asyncio.Task | None = None
        self._expired: set[Bundle] = set()     # bug knob broker.release_reacquired_lock

    def _my_data(self) -> bytes:
        """The lock's value: Pulsar's NamespaceEphemeralData (nativeUrl, httpUrl, disabled) and ours."""
        return json.dumps({"broker": self.me, "service_url": self.cfg.service_url,
                           "web_url": self.cfg.web_url, "name": self.cfg.name,
                           "nativeUrl": self.cfg.service_url, "httpUrl": self.cfg.web_url,
                           "disabled": False}).encode()

    async def start(self) -> None:
        self.store.add_listener(self._on_session)
        self.factory.on_change(self._boundaries_changed)

    def _on_session(self, state: str) -> None:
        # Pulsar's default: keep serving what we own while the session is gone; fencing of the
        # ledgers, not the session, protects the data. On a new session, re-claim or give up.
        if state == "LOST":
            self._session_lost = True
            if self.knobs.on("broker.release_reacquired_lock"):
                self._expired.update(self.owned)      # forgotten now, unloaded once the session is back
                self.owned.difference_update(self._expired)
        elif state == "CONNECTED" and self._session_lost:
            self._session_lost = False
            if self._expired:
                self._expire_locks()
            if self._recheck is None or self._recheck.done():
                self._recheck = asyncio.get_running_loop().create_task(self._reclaim())

    # -- bug knob broker.release_reacquired_lock (apache/pulsar#26197) --------------------------------
    # Pulsar's OwnershipCache before #26197: a bundle lock that expired with the session fires an unload
    # of the bundle in the background (its future dropped) and forgets the bundle locally at once; a
    # lookup meanwhile may acquire the bundle again (a new lock, a new generation), and the stale unload,
    # when it ends, removes "the bundle's lock" without asking which generation it was unloading: it
    # deletes the new lock's znode while this broker goes on serving the bundle, so the next lookup
    # elsewhere hands the bundle to a second broker.
    def _expire_locks(self) -> None:
        expired, self._expired = self._expired, set()
        for bundle in expired:
            log.warning("the lock of bundle %s expired with the session; unloading it (bug knob)", bundle)
            asyncio.get_running_loop().create_task(self._stale_unload(bundle))

    async def _stale_unload(self, bundle: Bundle) -> None:
        try:
            if self.on_lost:
                res = self.on_lost(bundle)
                if asyncio.iscoroutine(res):
                    await res
        except Exception as e:  # noqa: BLE001
            log.warning("unloading bundle %s after its lock expired: %s", bundle, e)
        for _ in range(10):                       # the session may still be coming back
            try:
                if await self.owner(bundle) == self.me:
                    await self.store.delete(bundle.path)       # whichever generation it is now
                    log.warning("removed the lock of bundle %s (bug knob); serving it: %s", bundle,
                                bundle in self.owned)
                return
            except NoNode:
                return
            except Exception:  # noqa: BLE001 - ZooKeeper not back yet
                await asyncio.sleep(0.5)

    async def _reclaim(self) -> None:
        for bundle in list(self.owned):
            if bundle not in self.owned or bundle in self.unloading:
                continue                          # unloaded meanwhile: not to be locked again
            try:
                await self.store.create(bundle.path, self._my_data(), ephemeral=True, makepath=True)
                log.info("re-claimed bundle %s", bundle)
            except NodeExists:
                owner = await self.owner(bundle)
                if owner != self.me:
                    log.warning("bundle %s is now owned by %s; unloading it", bundle, owner)
                    self.owned.discard(bundle)
                    if self.on_lost:
                        res = self.on_lost(bundle)
                        if asyncio.iscoroutine(res):
                            await res
            except Exception as e:
                log.warning("re-claiming bundle %s: %s", bundle, e)

    def _boundaries_changed(self, namespace: str, new: NamespaceBundles, old: NamespaceBundles | None) -> None:
        stale = [b for b in self.owned if b.namespace == namespace and b not in new]
        if stale:
            log.warning("bundles %s of %s are no longer bundles after a boundary change (now %s)",
                        [b.range_name for b in stale], namespace, [b.range_name for b in new.bundles])

    # -- which bundle ------------------------------------------------------------------
    def bundle(self, topic: str) -> Bundle:
        """The topic's bundle by this broker's current view of its namespace's boundaries (the initial
        layout before the namespace was first read)."""
        namespace, _ = topic_namespace(topic)
        nb = self.factory.cached(namespace)
        return nb.bundle_of(topic) if nb is not None else bundle_of(topic, int(self.cfg.bundles))

    async def bundle_for(self, topic: str) -> Bundle:
        namespace, _ = topic_namespace(topic)
        return (await self.factory.get(namespace)).bundle_of(topic)

    def bundles(self, namespace: str) -> list[Bundle]:
        """The namespace's bundles by this broker's current view, in hash order."""
        nb = self.factory.cached(namespace)
        if nb is not None:
            return list(nb.bundles)
        return list(default_bundles(namespace, int(self.cfg.bundles)).bundles)

    async def namespace_bundles(self, namespace: str, *, fresh: bool = False) -> NamespaceBundles:
        if fresh:
            return await self.factory.load(namespace)
        return await self.factory.get(namespace)

    def owns(self, topic: str) -> bool:
        return self.bundle(topic) in self.owned

    async def owner(self, bundle: Bundle) -> str | None:
        got = await self.store.get_or_none(bundle.path)
        if got is None:
            return None
        try:
            return json.loads(got[0])["broker"]
        except (ValueError, KeyError):
            return None

    async def live_brokers(self) -> list[str]:
        return await BrokerRegistry(self.store).ids()

    # -- taking and giving up ------------------------------------------------------------
    async def acquire(self, bundle: Bundle) -> str:
        """Try to own the bundle; returns the owner afterwards (us, whoever won, or "" when the bundle
        is no longer a bundle of its namespace: the caller looks up again). The lock is created in one
        transaction with a check of the namespace's boundaries version, so a range a split just
        replaced is never locked again."""
        nb = await self.factory.get(bundle.namespace)
        for _ in range(3):
            if bundle not in nb or bundle in self.unloading:
                return ""
            try:
                await self.store.transaction([("check", local_policies_path(bundle.namespace), nb.version),
                                              ("create", bundle.path, self._my_data(), True)])
            except NodeExists:
                owner = await self.owner(bundle)
                if owner == self.me:
                    if bundle in self.unloading:
                        return ""             # our lock, about to be deleted: not ours to serve
                    if await self.store.owner_session(bundle.path) != self.store.session_id:
                        return await self._retake(bundle)
                    if bundle in self.unloading:
                        return ""
                    self.owned.add(bundle)
                return owner or ""
            except NoNode:
                await self.store.ensure_path(bundle.path.rsplit("/", 1)[0])
                continue
            except BadVersion:
                nb = await self.factory.load(bundle.namespace)
                continue
            if bundle in self.unloading:
                # an unload of this bundle began while the lock was being created (its release may have
                # deleted the previous lock already): give the new one up, do not serve the bundle
                await self._drop_new_lock(bundle)
                return ""
            self.owned.add(bundle)
            log.info("acquired bundle %s", bundle)
            return self.me
        return await self.owner(bundle) or ""

    async def _drop_new_lock(self, bundle: Bundle) -> None:
        """Delete the lock this session just created for a bundle that is being unloaded."""
        try:
            got = await self.store.get_or_none(bundle.path)
            if got is not None and await self.store.owner_session(bundle.path) == self.store.session_id:
                await self.store.delete(bundle.path, version=got[1])
        except Exception as e:  # noqa: BLE001 - the session's end removes it anyway
            log.warning("giving up the new lock of bundle %s (being unloaded): %s", bundle, e)

    async def _retake(self, bundle: Bundle) -> str:
        """The lock names us but another session holds it: the one of this broker's previous
        incarnation (restarted before that session expired). Re-create it under our session, as Pulsar's
        ResourceLockImpl revalidates a lock it finds with its own value; adopting it as it is would let
        the old session's expiry delete it and hand the bundle to another broker while we serve it."""
        got = await self.store.get_or_none(bundle.path)
        if got is not None and _lock_broker(got[0]) != self.me:
            return _lock_broker(got[0]) or ""          # another broker's lock now: never delete it
        try:
            if got is not None:
                await self.store.delete(bundle.path, version=got[1])
            await self.store.create(bundle.path, self._my_data(), ephemeral=True, makepath=True)
        except (NoNode, NodeExists, BadVersion):
            return await self.owner(bundle) or ""      # changed under us: whoever holds it now
        if bundle in self.unloading:
            await self._drop_new_lock(bundle)
            return ""
        self.owned.add(bundle)
        log.info("acquired bundle %s (its lock was held by a previous session of this broker)", bundle)
        return self.me

    async def release(self, bundle: Bundle) -> bool:
        """Give up the bundle's lock; True when it is gone (or was not ours)."""
        self.owned.discard(bundle)
        try:
            if await self.owner(bundle) == self.me:
                await self.store.delete(bundle.path)
            return True
        except Exception as e:
            if self.knobs.on("broker.reactivate_on_release_failure"):
                # bug knob broker.reactivate_on_release_failure (apache/pulsar#7517; #24478 family):
                # the delete failed (its outcome unknown: the lock may be gone), and the broker
                # re-activates the bundle and serves it again, while another broker may take it
                log.warning("releasing bundle %s failed (%s: %s); re-activating it (bug knob)", bundle,
                            type(e).__name__, e)
                self.owned.add(bundle)
                return False
            log.warning("releasing bundle %s: %s: %s", bundle, type(e).__name__, e)
            return False

    async def release_all(self) -> None:
        for b in list(self.owned):
            await self.release(b)

    # -- splitting ------------------------------------------------------------------------
    async def split(self, bundle: Bundle, cuts: list[int]) -> list[Bundle]:
        """Split a bundle this broker owns at `cuts`: the namespace's boundaries gain the cuts, the
        children's locks are taken and the parent's released, all in one ZooKeeper transaction that
        checks the boundaries' version (retried on a concurrent change, as Pulsar retries BadVersion
        up to BUNDLE_SPLIT_RETRY_LIMIT times). Topics stay loaded: they now belong to the children.

        The bug knob `broker.split_without_cas` (apache/pulsar#1117): the boundaries are read, then
        written back without a version check, in separate steps, so two concurrent splits of one
        namespace overwrite each other's boundaries."""
        cas = not self.knobs.on("broker.split_without_cas")
        if bundle not in self.owned:
            raise BundleError(f"{bundle} is not owned by this broker")
        path = local_policies_path(bundle.namespace)
        for _ in range(BUNDLE_SPLIT_RETRY_LIMIT):
            plan = await split_plan(self.store, self.factory, bundle, cuts)
            if plan is None:                      # never read yet: written from the namespace's policies
                continue
            nb, bounds, children, data = plan
            lock = await self.store.get_or_none(bundle.path)
            if lock is None or self.me != json.loads(lock[0] or b"{}").get("broker"):
                self.owned.discard(bundle)
                raise BundleError(f"{bundle} is no longer owned by this broker")
            if not cas:
                for c in children:
                    try:
                        await self.store.create(c.path, self._my_data(), ephemeral=True, makepath=True)
                    except NodeExists:
                        pass
                await self.store.set(path, data, version=-1)
                await self.store.delete(bundle.path)
            else:
                ops: list[tuple] = [("set", path, data, nb.version)]
                ops += [("create", c.path, self._my_data(), True) for c in children]
                ops.append(("delete", bundle.path, lock[1]))
                try:
                    await self.store.transaction(ops)
                except BadVersion:
                    continue
            self.owned.discard(bundle)
            self.owned.update(children)
            self.factory.note(NamespaceBundles(bundle.namespace, bounds,
                                               nb.version + 1 if cas else -1))
            log.info("split bundle %s into %s", bundle, [c.range_name for c in children])
            return children
        raise BundleError(f"splitting {bundle}: the boundaries kept changing "
                          f"({BUNDLE_SPLIT_RETRY_LIMIT} attempts)")

    # -- lookups ----------------------------------------------------------------------------
    async def lookup(self, topic: str, authoritative: bool) -> LookupResult:
        try:
            namespace, _ = topic_namespace(topic)
        except ValueError as e:
            return LookupResult("failed", error="InvalidTopicName", message=str(e))
        bundle = self.bundle(topic)
        if bundle in self.unloading:
            return self._unloading_answer(bundle)
        if bundle in self.owned:
            # a bundle this broker owns is answered from its own ownership cache, not ZooKeeper (Pulsar's
            # OwnershipCache.getOwnerAsync), also while the session is gone (Pulsar keeps serving)
            return LookupResult("connect", self.cfg.service_url, True)
        try:
            bundle = await self.bundle_for(topic)
            owner = await self.owner(bundle)
            if owner is None:
                if not authoritative and self.assign is not None:
                    choice = await self.assign(bundle)
                    if choice.error:
                        return LookupResult("failed", error=choice.error, message=choice.message)
                    if choice.url and choice.url != self.cfg.service_url:
                        return LookupResult("redirect", choice.url, choice.authoritative)
                owner = await self.acquire(bundle)
                if not owner:
                    return LookupResult("failed", error="ServiceNotReady",
                                        message=f"bundle {bundle} was split meanwhile; look up again")
            elif owner == self.me and bundle not in self.owned:
                owner = await self.acquire(bundle)     # a lock left by our previous incarnation
            if bundle in self.unloading:
                # the unload began while this lookup read ZooKeeper: whatever it read (our lock, not
                # deleted yet), this broker does not serve the bundle any more
                return self._unloading_answer(bundle)
            if not owner:
                return LookupResult("failed", error="ServiceNotReady",
                                    message=f"bundle {bundle} changed hands meanwhile; look up again")
            if owner == self.me:
                self.owned.add(bundle)
                return LookupResult("connect", self.cfg.service_url, True)
            return LookupResult("connect", f"pulsar://{owner}", True)
        except Exception as e:   # ZooKeeper unreachable: the client retries the lookup
            if bundle in self.owned and bundle not in self.unloading:
                return LookupResult("connect", self.cfg.service_url, True)
            return LookupResult("failed", error="ServiceNotReady",
                                message=f"Failed to acquire ownership for {bundle}: {e}")

    @staticmethod
    def _unloading_answer(bundle: Bundle) -> LookupResult:
        return LookupResult("failed", error="ServiceNotReady",
                            message=f"Namespace bundle {bundle} is being unloaded; retry")
