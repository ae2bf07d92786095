"""Topic ownership through ZooKeeper: bundles (hash ranges of topic names) owned by one broker at a time.

A bundle is owned through an ephemeral znode `/namespace/<tenant>/<ns>/<range>`, as in Pulsar; lookups
answer with the owner, or assign an unowned bundle to the broker owning the fewest bundles.
"""
from __future__ import annotations

import asyncio
import json
import logging
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from clusters.config import BrokerConfig
from clusters.metadata.store import BadVersion, MetadataStore, NodeExists, NoNode

log = logging.getLogger(__name__)

BROKERS_PATH = "/loadbalance/brokers"
NAMESPACE_ROOT = "/namespace"
FULL_RANGE = 1 << 32


@dataclass(frozen=True)
class Bundle:
    namespace: str     # tenant/namespace
    lower: int
    upper: int

    @property
    def range_name(self) -> str:
        return f"0x{self.lower:08x}_0x{min(self.upper, FULL_RANGE - 1):08x}"

    @property
    def path(self) -> str:
        return f"{NAMESPACE_ROOT}/{self.namespace}/{self.range_name}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.range_name}"


@dataclass
class LookupResult:
    kind: str                 # connect | redirect | failed
    url: str = ""
    authoritative: bool = False
    error: str | None = None  # a ServerError name
    message: str | None = None


def topic_namespace(topic: str) -> tuple[str, str]:
    """`persistent://public/default/t` -> ('public/default', 't')."""
    rest = topic.split("://", 1)[1] if "://" in topic else topic
    parts = rest.split("/")
    if len(parts) < 3 or not all(parts[:3]):
        raise ValueError(f"invalid topic name {topic!r}; expected persistent://tenant/namespace/topic")
    return f"{parts[0]}/{parts[1]}", "/".join(parts[2:])


def _nth_bundle(namespace: str, idx: int, bundles: int) -> Bundle:
    """The idx-th of `bundles` equal hash ranges (the last one takes the remainder)."""
    width = FULL_RANGE // bundles
    lower = idx * width
    upper = FULL_RANGE if idx == bundles - 1 else lower + width
    return Bundle(namespace, lower, upper)


def namespace_bundles(namespace: str, bundles: int) -> list[Bundle]:
    """Every bundle of a namespace split into `bundles` ranges, in hash order."""
    n = max(1, bundles)
    return [_nth_bundle(namespace, i, n) for i in range(n)]


def bundle_of(topic: str, bundles: int) -> Bundle:
    """Pulsar hashes the full topic name (CRC-32 by default) into the namespace's bundle ranges."""
    namespace, _ = topic_namespace(topic)
    h = zlib.crc32(topic.encode()) & 0xFFFFFFFF
    return _nth_bundle(namespace, min(h // (FULL_RANGE // bundles), bundles - 1), bundles)


class Ownership:
    """This broker's view and control of bundle ownership."""

    def __init__(self, store: MetadataStore, cfg: BrokerConfig,
                 on_lost: Callable[[Bundle], Any] | None = None):
        self.store = store
        self.cfg = cfg
        self.me = f"{cfg.host}:{cfg.port}"
        self.owned: set[Bundle] = set()
        self.on_lost = on_lost
        self._session_lost = False
        self._recheck: asyncio.Task | None = None

    def _my_data(self) -> bytes:
        return json.dumps({"broker": self.me, "service_url": self.cfg.service_url,
                           "web_url": self.cfg.web_url, "name": self.cfg.name}).encode()

    async def start(self) -> None:
        self.store.add_listener(self._on_session)
        await self._register()

    async def _register(self) -> None:
        path = f"{BROKERS_PATH}/{self.me}"
        try:
            await self.store.create(path, self._my_data(), ephemeral=True, makepath=True)
        except NodeExists:
            # a previous incarnation's session may still be alive; replace its node
            try:
                await self.store.delete(path)
            except NoNode:
                pass
            await self.store.create(path, self._my_data(), ephemeral=True, makepath=True)

    def _on_session(self, state: str) -> None:
        # Pulsar's default: keep serving what we own while the session is gone; fencing of the
        # ledgers, not the session, protects the data. On a new session, re-claim or give up.
        if state == "LOST":
            self._session_lost = True
        elif state == "CONNECTED" and self._session_lost:
            self._session_lost = False
            if self._recheck is None or self._recheck.done():
                self._recheck = asyncio.get_running_loop().create_task(self._reclaim())

    async def _reclaim(self) -> None:
        try:
            await self._register()
        except Exception as e:
            log.warning("re-registering broker: %s", e)
        for bundle in list(self.owned):
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

    def bundle(self, topic: str) -> Bundle:
        return bundle_of(topic, self.cfg.bundles)

    def bundles(self, namespace: str) -> list[Bundle]:
        """The namespace's bundles (`cfg.bundles` of them), in hash order."""
        return namespace_bundles(namespace, int(self.cfg.bundles))

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
        return sorted(await self.store.children(BROKERS_PATH))

    async def acquire(self, bundle: Bundle) -> str:
        """Try to own the bundle; returns the owner afterwards (us or whoever won)."""
        try:
            await self.store.create(bundle.path, self._my_data(), ephemeral=True, makepath=True)
        except NodeExists:
            owner = await self.owner(bundle)
            if owner == self.me:
                if await self.store.owner_session(bundle.path) != self.store.session_id:
                    return await self._retake(bundle)
                self.owned.add(bundle)
            return owner or ""
        self.owned.add(bundle)
        log.info("acquired bundle %s", bundle)
        return self.me

    async def _retake(self, bundle: Bundle) -> str:
        """The lock names us but another session holds it: the one of this broker's previous
        incarnation (restarted before that session expired). Re-create it under our session, as Pulsar's
        ResourceLockImpl revalidates a lock it finds with its own value; adopting it as it is would let
        the old session's expiry delete it and hand the bundle to another broker while we serve it."""
        got = await self.store.get_or_none(bundle.path)
        try:
            if got is not None:
                await self.store.delete(bundle.path, version=got[1])
            await self.store.create(bundle.path, self._my_data(), ephemeral=True, makepath=True)
        except (NoNode, NodeExists, BadVersion):
            return await self.owner(bundle) or ""      # changed under us: whoever holds it now
        self.owned.add(bundle)
        log.info("acquired bundle %s (its lock was held by a previous session of this broker)", bundle)
        return self.me

    async def release(self, bundle: Bundle) -> None:
        self.owned.discard(bundle)
        try:
            if await self.owner(bundle) == self.me:
                await self.store.delete(bundle.path)
        except Exception as e:
            log.warning("releasing bundle %s: %s", bundle, e)

    async def release_all(self) -> None:
        for b in list(self.owned):
            await self.release(b)

    async def _candidate(self) -> str:
        """The live broker owning the fewest bundles (ties broken by name): where a new bundle goes."""
        brokers = await self.live_brokers()
        if not brokers:
            return self.me
        counts = {b: 0 for b in brokers}
        for ns in await self.store.children(NAMESPACE_ROOT):
            for sub in await self.store.children(f"{NAMESPACE_ROOT}/{ns}"):
                for rng in await self.store.children(f"{NAMESPACE_ROOT}/{ns}/{sub}"):
                    got = await self.store.get_or_none(f"{NAMESPACE_ROOT}/{ns}/{sub}/{rng}")
                    if got:
                        try:
                            owner = json.loads(got[0])["broker"]
                        except (ValueError, KeyError):
                            continue
                        if owner in counts:
                            counts[owner] += 1
        return min(brokers, key=lambda b: (counts[b], b))

    async def lookup(self, topic: str, authoritative: bool) -> LookupResult:
        try:
            bundle = self.bundle(topic)
        except ValueError as e:
            return LookupResult("failed", error="InvalidTopicName", message=str(e))
        if bundle in self.owned and (self._session_lost or not self.store.connected):
            return LookupResult("connect", self.cfg.service_url, True)
        try:
            owner = await self.owner(bundle)
            if owner is None:
                target = self.me if authoritative else await self._candidate()
                if target != self.me:
                    return LookupResult("redirect", f"pulsar://{target}", True)
                owner = await self.acquire(bundle)
            elif owner == self.me and bundle not in self.owned:
                owner = await self.acquire(bundle)     # a lock left by our previous incarnation
            if owner == self.me:
                self.owned.add(bundle)
                return LookupResult("connect", self.cfg.service_url, True)
            return LookupResult("connect", f"pulsar://{owner}", True)
        except Exception as e:   # ZooKeeper unreachable: the client retries the lookup
            if bundle in self.owned:
                return LookupResult("connect", self.cfg.service_url, True)
            return LookupResult("failed", error="ServiceNotReady",
                                message=f"Failed to acquire ownership for {bundle}: {e}")
