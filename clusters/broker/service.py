"""The broker process: ZooKeeper session, BookKeeper client, bundle ownership and the topics it serves.

`serve(cfg, stop)` is what `python -m clusters.node` runs for the broker role; the Pulsar protocol side
lives in connection.py / topic.py and reaches storage only through `BrokerService.get_topic`.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from clusters.bookkeeper.client import BookKeeper
from clusters.broker.http import serve_http
from clusters.broker.policies import PolicyCache
from clusters.broker.managed_ledger import (ManagedLedger, ManagedLedgerError, ManagedLedgerFenced,
                                            ml_name)
from clusters.broker.ownership import Bundle, LookupResult, Ownership, topic_namespace
from clusters.broker.topic import ServiceUnitNotReady, Topic
from clusters.config import BrokerConfig
from clusters.protocol.topics import normalize_topic
from clusters.metadata.store import MetadataStore

log = logging.getLogger(__name__)


class BrokerService:
    def __init__(self, cfg: BrokerConfig):
        self.config = cfg
        self.store = MetadataStore(cfg.zk, session_timeout=cfg.zk_session_timeout, name=cfg.name)
        self.bk: Any = None
        self.ownership = Ownership(self.store, cfg, on_lost=self._bundle_lost)
        self.policies = PolicyCache(self.store, cfg)       # namespace policies (clusters/broker/policies.py)
        self.topics: dict[str, Topic] = {}
        self._loading: dict[str, asyncio.Future] = {}
        self.connections: set[Any] = set()
        self.server: asyncio.AbstractServer | None = None
        self.http: Any = None

    async def start(self) -> "BrokerService":
        from clusters.broker.connection import serve_connections
        await self.store.start()
        self.bk = await BookKeeper(self.store, add_timeout=self.config.add_timeout_s,
                                   name=self.config.name).start()
        # Listen before registering: a registered broker must be reachable.
        self.server = await serve_connections(self, self.config.host, self.config.port)
        self.http = await serve_http(self)          # the admin HTTP API (clusters/broker/http.py)
        await self.ownership.start()
        log.info("broker %s serving %s", self.config.name, self.config.service_url)
        return self

    async def stop(self) -> None:
        """Graceful shutdown: close topics (their ledgers), release bundles, disconnect."""
        if self.server is not None:
            self.server.close()
        if self.http is not None:
            await self.http.close()
        for name in list(self.topics):
            await self._unload_topic(name)
        try:
            await self.ownership.release_all()
        except Exception as e:
            log.warning("releasing ownership: %s", e)
        for cnx in list(self.connections):
            try:
                cnx.close()
            except Exception:
                pass
        if self.bk is not None:
            await self.bk.close()
        await self.store.close()

    # -- what the protocol side calls --------------------------------------------
    def register_connection(self, cnx: Any) -> None:
        self.connections.add(cnx)

    def unregister_connection(self, cnx: Any) -> None:
        self.connections.discard(cnx)

    async def lookup(self, topic: str, authoritative: bool) -> LookupResult:
        return await self.ownership.lookup(normalize_topic(topic), authoritative)

    async def partitions(self, topic: str) -> int:
        return 0

    async def get_topic(self, topic: str) -> Topic:
        topic = normalize_topic(topic)
        loaded = self.topics.get(topic)
        if loaded is not None and not loaded.closed:
            return loaded
        if not self.ownership.owns(topic):
            raise ServiceUnitNotReady(
                f"Namespace bundle for topic {topic} not served by this instance. Please redo the lookup")
        pending = self._loading.get(topic)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._load_topic(topic))
            self._loading[topic] = pending
            pending.add_done_callback(lambda _t, n=topic: self._loading.pop(n, None))
        return await asyncio.shield(pending)

    async def _load_topic(self, topic: str) -> Topic:
        try:
            topic_namespace(topic)
        except ValueError as e:
            raise ServiceUnitNotReady(str(e)) from e
        try:
            ml = await ManagedLedger.open(ml_name(topic), self.store, self.bk, self.config)
        except ManagedLedgerFenced as e:
            raise ServiceUnitNotReady(f"Topic {topic} is being loaded by another broker: {e}") from e
        except ManagedLedgerError as e:
            raise ServiceUnitNotReady(f"Failed to load topic {topic}: {e}") from e
        except Exception as e:  # ZooKeeper unreachable, etc.: the client retries
            raise ServiceUnitNotReady(f"Failed to load topic {topic}: {e}") from e
        t = Topic(topic, ml, self)
        self.topics[topic] = t
        log.info("loaded topic %s", topic)
        return t

    def topic_fenced(self, topic: str) -> None:
        """Called by a Topic whose ledger was fenced: another broker owns it now."""
        t = self.topics.pop(topic, None)
        # Someone else owns it now, whatever our (possibly stale) ZooKeeper view says: stop
        # answering lookups for the bundle with ourselves.
        self.ownership.owned.discard(self.ownership.bundle(topic))
        if t is not None:
            log.warning("topic %s fenced by a new owner; unloaded", topic)

    async def _unload_topic(self, topic: str) -> None:
        t = self.topics.pop(topic, None)
        if t is None:
            return
        try:
            await t.close("unloading")
        except Exception as e:
            log.warning("closing topic %s: %s", topic, e)

    async def _bundle_lost(self, bundle: Bundle) -> None:
        for name in [n for n in self.topics if self.ownership.bundle(n) == bundle]:
            await self._unload_topic(name)


async def serve(cfg: BrokerConfig, stop: asyncio.Event) -> None:
    svc = BrokerService(cfg)
    try:
        await svc.start()
        await stop.wait()
    finally:
        await svc.stop()
