"""The broker process: ZooKeeper session, BookKeeper client, bundle ownership and the topics it serves.

`serve(cfg, stop)` is what `python -m clusters.node` runs for the broker role; the Pulsar protocol side
lives in connection.py / topic.py and reaches storage only through `BrokerService.get_topic`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from clusters import metrics
from clusters.bookkeeper.client import BookKeeper
from clusters.broker import partitions as parts
from clusters.broker.dedup import MessageDeduplication, ZkSnapshots
from clusters.broker.http import serve_http
from clusters.broker.policies import PolicyCache
from clusters.broker import compaction
from clusters.broker import schema as schemas
from clusters.broker.managed_ledger import (ManagedLedger, ManagedLedgerError, ManagedLedgerFenced,
                                            ml_name)
from clusters.broker.nonpersistent import NonPersistentTopics, is_non_persistent
from clusters.broker.topic import ServiceUnitNotReady, Topic
from clusters.bugs import Knobs
from clusters.config import BrokerConfig
from clusters.loadbalancer import manager as load_managers
from clusters.loadbalancer.bundles import Bundle, topic_namespace
from clusters.loadbalancer.api import LookupResult
from clusters.loadbalancer.signals import IoCounters
from clusters.protocol.topics import normalize_topic
from clusters.metadata.store import MetadataStore

log = logging.getLogger(__name__)

TOPIC_POLICIES_ROOT = "/admin/topic-policies"   # topic-level overrides: {"deduplicationEnabled": bool}
RATE_INTERVAL_S = 5.0                           # how often rates (msg/s, bytes/s) are recomputed


def topic_policies_path(topic: str) -> str:
    """`persistent://t/ns/x` -> `/admin/topic-policies/t/ns/persistent/x`."""
    return f"{TOPIC_POLICIES_ROOT}/{ml_name(topic)}"


class BrokerService:
    def __init__(self, cfg: BrokerConfig):
        self.config = cfg
        self.knobs = Knobs(cfg.bugs, "broker")   # bug knobs (clusters/bugs.py), handed to what it builds
        self.store = MetadataStore(cfg.zk, session_timeout=cfg.zk_session_timeout, name=cfg.name)
        self.bk: Any = None
        self.schemas: Any = None                 # the schema registry (clusters/broker/schema.py)
        self.io = IoCounters()                   # bytes in/out on client connections (connection.py)
        # the load manager owns bundle ownership (clusters/loadbalancer/manager.py)
        self.load_manager = load_managers.create(cfg.load_manager, self)
        self.ownership = self.load_manager.ownership
        self.policies = PolicyCache(self.store, cfg)       # namespace policies (clusters/broker/policies.py)
        self.topic_policies = PolicyCache(self.store, cfg, path=topic_policies_path)   # topic overrides
        self.topics: dict[str, Topic] = {}
        # non-persistent:// topics, in memory only (clusters/broker/nonpersistent.py)
        self.non_persistent = NonPersistentTopics(self, cfg.enable_non_persistent_topics)
        self._loading: dict[str, asyncio.Future] = {}
        self.connections: set[Any] = set()
        self.server: asyncio.AbstractServer | None = None
        self.http: Any = None
        self.started = time.time()
        self.rates = Rates()
        self._rate_task: asyncio.Task | None = None
        self._unloading: set[Bundle] = set()
        self.policies.on_change(self._namespace_policies_changed)
        self.topic_policies.on_change(self._topic_policies_changed)

    async def start(self) -> "BrokerService":
        from clusters.broker.connection import serve_connections
        await self.store.start()
        self.bk = await BookKeeper(self.store, add_timeout=self.config.add_timeout_s,
                                   name=self.config.name, knobs=self.knobs).start()
        self.schemas = schemas.SchemaRegistry(self.store, self.bk, persistence=self._schema_persistence,
                                              knobs=self.knobs)
        # Listen before registering: a registered broker must be reachable.
        self.server = await serve_connections(self, self.config.host, self.config.port)
        self.http = await serve_http(self)          # the admin HTTP API (clusters/broker/http.py)
        await self.load_manager.start()
        register_metrics(self)
        self._rate_task = asyncio.get_running_loop().create_task(self._rates_loop())
        self._compaction_task = asyncio.get_running_loop().create_task(self._compaction_monitor())
        log.info("broker %s serving %s", self.config.name, self.config.service_url)
        return self

    async def stop(self) -> None:
        """Graceful shutdown: close topics (their ledgers), release bundles, disconnect. A load manager
        that moves its bundles away itself (`stops_before_topics`) stops first, while they are served."""
        early = getattr(self.load_manager, "stops_before_topics", False)
        if early:
            try:
                await self.load_manager.stop()
            except Exception as e:
                log.warning("stopping the load manager: %s", e)
        if self.server is not None:
            self.server.close()
        if self._rate_task is not None:
            self._rate_task.cancel()
        if getattr(self, "_compaction_task", None) is not None:
            self._compaction_task.cancel()
        if self.http is not None:
            await self.http.close()
        # the bundles still owned stop being served before their topics close (Pulsar unloads each
        # bundle gracefully: inactive first), so a client reconnecting on an open connection or a load
        # under way does not open a topic here again between its close and the lock's release
        stopping = [] if early else list(self.ownership.owned)
        marks = getattr(self.ownership, "unloading", None)
        self._unloading.update(stopping)
        if marks is not None:
            marks.update(stopping)
        for name in list(self.topics):
            await self._unload_topic(name)
        await self.non_persistent.close_all()
        try:
            if not early:
                await self.load_manager.stop()      # gives up the bundles, as disableBroker does
        except Exception as e:
            log.warning("stopping the load manager: %s", e)
        self._unloading.difference_update(stopping)
        if marks is not None:
            marks.difference_update(stopping)
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
        topic = normalize_topic(topic)
        if self._unloading:
            try:
                bundle = await self.ownership.bundle_for(topic)
            except ValueError:
                bundle = None
            if bundle in self._unloading:
                return LookupResult("failed", error="ServiceNotReady",
                                    message=f"Namespace bundle {bundle} is being unloaded; retry")
        return await self.ownership.lookup(topic, authoritative)

    async def partitions(self, topic: str) -> int:
        """PARTITIONED_METADATA: N for a partitioned topic (metadata in ZooKeeper), else 0."""
        return await parts.get_partitions(self.store, normalize_topic(topic))

    async def topics_of_namespace(self, namespace: str) -> list[str]:
        """GET_TOPICS_OF_NAMESPACE: persistent topics with a managed ledger, plus every partition, plus
        the active non-persistent topics loaded here."""
        return await parts.topics_of_namespace(self.store, namespace) + self.non_persistent.names(namespace)

    async def get_topic(self, topic: str) -> Any:
        topic = normalize_topic(topic)
        if is_non_persistent(topic):
            return self.non_persistent.get(topic)      # NotAllowed when enable_non_persistent_topics is off
        loaded = self.topics.get(topic)
        if loaded is not None and not loaded.closed:
            return loaded
        if not self._serves(topic):
            raise ServiceUnitNotReady(
                f"Namespace bundle for topic {topic} not served by this instance. Please redo the lookup")
        pending = self._loading.get(topic)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._load_topic(topic))
            self._loading[topic] = pending
            pending.add_done_callback(lambda _t, n=topic: self._loading.pop(n, None))
        return await asyncio.shield(pending)

    def _serves(self, topic: str) -> bool:
        """This broker owns the topic's bundle and is not unloading it (checkTopicNsOwnership)."""
        if not self.ownership.owns(topic):
            return False
        bundle = self.ownership.bundle(topic)
        return bundle not in self._unloading and bundle not in getattr(self.ownership, "unloading", ())

    async def _load_topic(self, topic: str) -> Topic:
        try:
            topic_namespace(topic)                   # a malformed name is refused here
        except ValueError as e:
            raise ServiceUnitNotReady(str(e)) from e
        try:
            # open reads (and watches) the namespace's policies before it creates a ledger
            ml = await ManagedLedger.open(ml_name(topic), self.store, self.bk, self.config,
                                          policies=self.policies)
        except ManagedLedgerFenced as e:
            raise ServiceUnitNotReady(f"Topic {topic} is being loaded by another broker: {e}") from e
        except ManagedLedgerError as e:
            raise ServiceUnitNotReady(f"Failed to load topic {topic}: {e}") from e
        except Exception as e:  # ZooKeeper unreachable, etc.: the client retries
            raise ServiceUnitNotReady(f"Failed to load topic {topic}: {e}") from e
        t = Topic(topic, ml, self, knobs=self.knobs)

        async def step(what: str, coro: Any) -> Any:
            """A loading step; on failure the ledger is closed and the topic not loaded (the client retries)."""
            try:
                return await coro
            except Exception as e:
                log.warning("%s: %s: %s", topic, what, e)
                try:
                    await ml.close()
                except Exception:
                    pass
                raise ServiceUnitNotReady(f"Failed to load topic {topic}: {what}: {e}") from e
        t.dedup = MessageDeduplication(topic, ml, ZkSnapshots(self.store, ml_name(topic)),
                                       knobs=self.knobs)
        # A topic with topic-level policies has them applied first (Pulsar's initTopicPolicy -> onUpdate ->
        # checkDeduplicationStatus), concurrently with the rest of the load, which checks deduplication
        # itself at its end: MessageDeduplication.apply serialises the two (apache/pulsar#25954 is what
        # happens if not)
        async def topic_level_dedup() -> bool:
            for name in dict.fromkeys((topic, parts.base_name(topic))):
                if isinstance((await self.topic_policy(name)).get("deduplicationEnabled"), bool):
                    return True
            return False
        if await step("topic policies", topic_level_dedup()):
            asyncio.get_running_loop().create_task(self._apply_dedup(t))
        t.compacted = await step("compacted ledger", compaction.load_view(self.store, self.bk, ml_name(topic)))

        # before any producer attaches: rebuild the sequence ids from the snapshot and the entries
        # after it (the state the previous owner had), or drop a stale dedup cursor
        async def dedup_state() -> None:
            await t.dedup.apply(await self.deduplication_enabled(topic))
        await step("deduplication state", dedup_state())
        # Ownership is checked again now that the load is done, with no wait between the check and the
        # topic's registration: an unload of the bundle that began while the topic was loading has
        # closed the bundle's loaded topics and may have released its lock, so a topic registered now
        # would be served by a broker that gave the bundle up (Pulsar's unloadServiceUnit closes the
        # topics still loading too; checkTopicNsOwnership guards the load)
        if not self._serves(topic):
            try:
                await t.close("the bundle was unloaded while the topic loaded")
            except Exception as e:  # noqa: BLE001
                log.warning("closing topic %s loaded after its bundle's unload: %s", topic, e)
            raise ServiceUnitNotReady(
                f"Namespace bundle for topic {topic} not served by this instance. Please redo the lookup")
        self.topics[topic] = t
        log.info("loaded topic %s", topic)
        return t

    # -- schemas (Pulsar's AbstractTopic.addSchema, addSchemaIfIdleOrCheckCompatible) --------------
    def _schema_persistence(self, sid: str) -> tuple[int, int, int]:
        pol = self.policies.cached("/".join(sid.split("/")[:2]))
        return pol.ensemble, pol.write_quorum, pol.ack_quorum

    async def namespace_policies(self, topic: str) -> Any:
        namespace, _ = topic_namespace(topic)
        return await self.policies.get(namespace)

    async def add_schema(self, topic: str, schema: "schemas.SchemaData | None") -> int | None:
        """The version a producer with `schema` publishes under (None: no schema). A producer
        without one is refused on a topic with a schema when the namespace enforces validation."""
        sid = schemas.schema_id(topic)
        pol = await self.namespace_policies(topic)
        if schema is None:
            if pol.schema_validation_enforced and await self.schemas.has_schema(sid):
                raise schemas.IncompatibleSchema(
                    "Producers cannot connect or send message without a schema to topics with a schema "
                    "if SchemaValidationEnforced is enabled")
            return None
        return await self.schemas.put_if_absent(sid, schema, pol.schema_compatibility_strategy,
                                                allow_auto_update=pol.is_allow_auto_update_schema)

    async def consumer_schema(self, topic: Topic, schema: "schemas.SchemaData") -> None:
        """A consumer's schema: stored as the first version if the topic is idle (no schema, no
        producer, no consumer, nothing published since it was loaded), else checked against the
        stored ones."""
        sid = schemas.schema_id(topic.name)
        has = await self.schemas.has_schema(sid)
        busy = bool(topic.producers) or topic.msgs_in > 0 or any(s.consumers for s in topic.subscriptions.values())
        if not has and not busy:
            await self.add_schema(topic.name, schema)
            return
        if not has:
            raise schemas.IncompatibleSchema("Failed to add schema to an active topic with empty(BYTES) "
                                             f"schema: new schema type {schema.type}")
        pol = await self.namespace_policies(topic.name)
        await self.schemas.check_consumer_compatibility(sid, schema, pol.schema_compatibility_strategy)

    # -- deduplication policy ------------------------------------------------------------
    async def topic_policy(self, topic: str) -> dict[str, Any]:
        """The topic-level policy overrides of `topic` (watched; {} when none)."""
        return await self.topic_policies.raw(topic)

    async def set_topic_policy(self, topic: str, key: str, value: Any) -> dict[str, Any]:
        """Set (value None: remove) one topic-level override; returns the topic's overrides."""
        await self.topic_policies.update(topic, {key: value})
        return await self.topic_policies.raw(topic)

    async def deduplication_enabled(self, topic: str) -> bool:
        """The topic's override, else its partitioned topic's, else the namespace policy (whose own
        default is the broker's deduplication_enabled), as Pulsar's hierarchy of policies."""
        for name in dict.fromkeys((topic, parts.base_name(topic))):
            value = (await self.topic_policy(name)).get("deduplicationEnabled")
            if isinstance(value, bool):
                return value
        namespace, _ = topic_namespace(topic)
        return (await self.policies.get(namespace)).deduplication

    def _namespace_policies_changed(self, namespace: str, _policies: Any) -> None:
        self._reapply_dedup(lambda name: topic_namespace(name)[0] == namespace)

    def _topic_policies_changed(self, topic: str, _policies: Any) -> None:
        self._reapply_dedup(lambda name: name == topic or parts.base_name(name) == topic)

    def _reapply_dedup(self, which: Any) -> None:
        for name, t in list(self.topics.items()):
            if which(name) and t.dedup is not None and not t.closed:
                asyncio.get_running_loop().create_task(self._apply_dedup(t))

    async def _apply_dedup(self, t: Topic) -> None:
        try:
            await t.dedup.apply(await self.deduplication_enabled(t.name))
        except Exception as e:  # noqa: BLE001 - publishing goes on without deduplication (Failed)
            log.warning("%s: changing deduplication: %s", t.name, e)

    # -- unloading (admin API) -------------------------------------------------------------
    async def unload_topic(self, topic: str) -> bool:
        """Close a topic served here; its clients look it up again (this broker keeps the bundle)."""
        topic = normalize_topic(topic)
        if is_non_persistent(topic):
            return await self.non_persistent.unload(topic)
        if topic not in self.topics:
            return False
        await self._unload_topic(topic)
        return True

    async def unload_bundle(self, bundle: Bundle) -> list[str]:
        """Stop serving a bundle: close its topics, then give up its ownership znode, so the next
        lookup assigns it afresh (Pulsar's bundle unload). Returns the topics closed."""
        # Pulsar's order: the bundle stops being served here first (no lookup, acquire or topic load
        # that began earlier makes it owned again: zk_ownership's `unloading`, _load_topic's last check),
        # then its topics close (their producers fenced), then the lock is deleted
        self._unloading.add(bundle)           # lookups here answer "retry" until the znode is gone
        marks = getattr(self.ownership, "unloading", None)
        if marks is not None:
            marks.add(bundle)
        try:
            self.ownership.owned.discard(bundle)
            names = [n for n in list(self.topics) if self.ownership.bundle(n) == bundle]
            for name in names:
                await self._unload_topic(name)
            names += await self.non_persistent.unload_bundle(bundle)
            await self.ownership.release(bundle)
        finally:
            self._unloading.discard(bundle)
            if marks is not None:
                marks.discard(bundle)
        return names

    # -- compaction by threshold (brokerServiceCompactionMonitorIntervalInSeconds) ---------------
    async def _compaction_monitor(self) -> None:
        while True:
            await asyncio.sleep(self.config.compaction_monitor_interval_s)
            try:
                self.check_compaction()
            except Exception:  # noqa: BLE001
                log.warning("checking compaction thresholds", exc_info=True)

    def check_compaction(self) -> list[str]:
        """Start a compaction of every topic whose backlog after its compaction horizon exceeds its
        namespace's compaction_threshold (bytes; 0: never). Returns the topics started."""
        started = []
        for name, t in list(self.topics.items()):
            if t.closed or t.compaction.running:
                continue
            threshold = self.policies.cached(topic_namespace(name)[0]).compaction_threshold
            if threshold <= 0:
                continue
            view = t.compacted
            backlog = t.ml.size_after(view.horizon if view is not None else None)
            if backlog > threshold and t.compaction.trigger():
                log.info("%s: backlog %d bytes > compaction threshold %d: compacting", name, backlog, threshold)
                started.append(name)
        return started

    # -- rates ------------------------------------------------------------------------------
    async def _rates_loop(self) -> None:
        while True:
            await asyncio.sleep(RATE_INTERVAL_S)
            try:
                self.update_rates()
            except Exception:  # noqa: BLE001
                log.warning("computing rates", exc_info=True)

    def update_rates(self) -> None:
        self.rates.update({**self.topics, **self.non_persistent.topics})
        self.non_persistent.update_drop_rates()

    def rate(self, *key: Any) -> tuple[float, float]:
        return self.rates.get(*key)

    def topic_fenced(self, topic: str) -> None:
        """Called by a Topic whose ledger was fenced: another broker owns it now."""
        t = self.topics.pop(topic, None)
        if t is not None:
            self._forget_schema(topic)
        # Someone else owns the bundle now, whatever our (possibly stale) ZooKeeper view says: stop
        # answering lookups for it with ourselves, and unload its other topics too. A topic of the
        # bundle left loaded (an idle one: nothing fenced it yet) would go on serving its clients
        # while the new owner serves it as well; its next write would even land in its open ledger
        # before the new owner recovers that ledger, and be lost from the new owner's view.
        bundle = self.ownership.bundle(topic)
        if bundle in self.ownership.owned or any(self.ownership.bundle(n) == bundle for n in self.topics):
            self.ownership.owned.discard(bundle)
            asyncio.get_running_loop().create_task(self.bundle_lost(bundle))
        if t is not None:
            log.warning("topic %s fenced by a new owner; unloaded (with the rest of bundle %s)", topic, bundle)

    def _forget_schema(self, topic: str) -> None:
        """Drop the registry's cached schemas of `topic` unless another loaded partition shares them."""
        sid = schemas.schema_id(topic)
        if self.schemas is not None and not any(schemas.schema_id(n) == sid for n in self.topics):
            self.schemas.forget(sid)

    async def _unload_topic(self, topic: str) -> None:
        t = self.topics.pop(topic, None)
        if t is None:
            return
        self._forget_schema(topic)
        try:
            await t.close("unloading")
        except Exception as e:
            log.warning("closing topic %s: %s", topic, e)

    async def bundle_lost(self, bundle: Bundle) -> None:
        for name in [n for n in self.topics if self.ownership.bundle(n) == bundle]:
            await self._unload_topic(name)
        await self.non_persistent.unload_bundle(bundle)


def _label(topic: str) -> tuple[str, str]:
    return topic_namespace(topic)[0], topic


def register_metrics(svc: "BrokerService") -> None:
    """Broker gauges in clusters.metrics.REGISTRY, evaluated at scrape time (GET /metrics), named as
    Pulsar's topic-level metrics (labels: cluster, namespace, topic)."""
    cluster = svc.config.cluster
    R = metrics.REGISTRY

    def per_topic(fn: Any) -> Any:
        def collect() -> dict[tuple, float]:
            return {(cluster, *_label(name)): float(fn(t)) for name, t in list(svc.topics.items())}
        return collect

    def backlog(t: Topic) -> int:
        from clusters.broker.http import subscription_backlog
        return sum(subscription_backlog(t, s) for s in list(t.subscriptions.values()))

    def out_msgs(t: Topic) -> int:
        return sum(c.msgs_out for s in list(t.subscriptions.values()) for c in list(s.consumers))

    labels = ("cluster", "namespace", "topic")
    R.gauge("pulsar_broker_topics_count", "Topics served by this broker", ("cluster",),
            fn=lambda: {(cluster,): len(svc.topics)})
    R.gauge("pulsar_broker_bundles_count", "Bundles owned by this broker", ("cluster",),
            fn=lambda: {(cluster,): len(svc.ownership.owned)})
    R.gauge("pulsar_broker_connections_count", "Client connections", ("cluster",),
            fn=lambda: {(cluster,): len(svc.connections)})
    R.gauge("pulsar_producers_count", "Producers of the topic", labels, fn=per_topic(lambda t: len(t.producers)))
    R.gauge("pulsar_subscriptions_count", "Subscriptions of the topic", labels,
            fn=per_topic(lambda t: len(t.subscriptions)))
    R.gauge("pulsar_consumers_count", "Consumers of the topic", labels,
            fn=per_topic(lambda t: sum(len(s.consumers) for s in list(t.subscriptions.values()))))
    R.gauge("pulsar_in_messages_total", "Messages persisted since the topic was loaded here", labels,
            fn=per_topic(lambda t: t.msgs_in))
    R.gauge("pulsar_in_bytes_total", "Bytes persisted since the topic was loaded here", labels,
            fn=per_topic(lambda t: t.bytes_in))
    R.gauge("pulsar_out_messages_total", "Messages dispatched to the connected consumers", labels,
            fn=per_topic(out_msgs))
    R.gauge("pulsar_rate_in", "Messages in per second", labels, fn=per_topic(lambda t: svc.rate("in", t.name)[0]))
    R.gauge("pulsar_rate_out", "Messages out per second", labels,
            fn=per_topic(lambda t: svc.rate("out", t.name)[0]))
    R.gauge("pulsar_msg_backlog", "Entries not yet acknowledged, over every subscription", labels,
            fn=per_topic(backlog))
    R.gauge("pulsar_storage_size", "Bytes in the topic's ledgers", labels,
            fn=per_topic(lambda t: t.ml.total_size()))
    # the load manager's inputs and decisions, under Pulsar's names (brk_lb_* in Java, pulsar_lb_* in
    # Prometheus): resource usage in percent of this broker's limits, unloads, splits
    lm = svc.load_manager

    def usage(kind: str) -> Any:
        return lambda: {(cluster,): lm.resource_usage()[kind]}
    for kind, metric in (("cpu", "cpu"), ("memory", "memory"), ("directMemory", "directMemory"),
                         ("bandwidthIn", "bandwidth_in"), ("bandwidthOut", "bandwidth_out")):
        R.gauge(f"pulsar_lb_{metric}_usage", f"{kind} usage, percent of this broker's limit", ("cluster",),
                fn=usage(kind))
    R.gauge("pulsar_lb_leader", "1 on the load-balancer leader", ("cluster",),
            fn=lambda: {(cluster,): 1.0 if lm.is_leader() else 0.0})
    R.gauge("pulsar_lb_unload_broker_total", "Brokers unloaded by shedding (leader)", ("cluster",),
            fn=lambda: {(cluster,): float(lm.counters["unload_broker"])})
    R.gauge("pulsar_lb_unload_bundle_total", "Bundles unloaded by shedding (leader)", ("cluster",),
            fn=lambda: {(cluster,): float(lm.counters["unload_bundle"])})
    R.gauge("pulsar_lb_bundles_split_total", "Bundles split by the split task (leader)", ("cluster",),
            fn=lambda: {(cluster,): float(lm.counters["split"])})
    R.gauge("pulsar_lb_assign_broker_total", "Bundle assignments decided here", ("cluster",),
            fn=lambda: {(cluster,): float(lm.counters["assign"])})
    R.gauge("pulsar_broker_dedup_duplicates_total", "Sends answered as duplicates (deduplication)", labels,
            fn=per_topic(lambda t: t.dedup.duplicates if t.dedup is not None else 0))


async def serve(cfg: BrokerConfig, stop: asyncio.Event) -> None:
    svc = BrokerService(cfg)
    try:
        await svc.start()
        await stop.wait()
    finally:
        await svc.stop()


class Rates:
    """Msg/s and bytes/s of every topic, producer, subscription and consumer, each over the time since
    the previous `update` (Pulsar recomputes its stats every statsUpdateFrequencyInSecs). A topic,
    producer or consumer first seen in a pass was created since the previous one, its counters at zero
    then: what it carried since counts (else a burst sent right after creation, before the first pass,
    would never show as a rate, and a broker's load report would never change for it)."""

    def __init__(self) -> None:
        self.values: dict[tuple, tuple[float, float]] = {}        # key -> (msg/s, bytes/s)
        self._last: dict[tuple, tuple[float, float, float]] = {}  # key -> (when, msgs, bytes)
        self._pass: float | None = None                            # when the previous pass ran

    def get(self, *key: Any) -> tuple[float, float]:
        return self.values.get(tuple(key), (0.0, 0.0))

    def update(self, topics: Mapping[str, Any], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        since = self._pass if self._pass is not None else now - RATE_INTERVAL_S
        self._pass = now
        seen: set[tuple] = set()

        def sample(key: tuple, msgs: float, nbytes: float) -> None:
            seen.add(key)
            last = self._last.get(key) or (since, 0, 0)
            self._last[key] = (now, msgs, nbytes)
            if now <= last[0]:
                self.values.setdefault(key, (0.0, 0.0))
                return
            dt = now - last[0]
            self.values[key] = (max(0.0, msgs - last[1]) / dt, max(0.0, nbytes - last[2]) / dt)

        for name, t in list(topics.items()):
            sample(("in", name), t.msgs_in, t.bytes_in)
            out_m = out_b = 0
            for p in list(t.producers.values()):
                sample(("producer", name, p.name, p.producer_id), p.msgs_in, p.bytes_in)
            for sname, sub in list(t.subscriptions.items()):
                sm = sb = 0
                for c in list(sub.consumers):
                    sample(("consumer", name, sname, c.name, c.consumer_id), c.msgs_out, c.bytes_out)
                    sm += c.msgs_out
                    sb += c.bytes_out
                sample(("sub", name, sname), sm, sb)
                out_m += sm
                out_b += sb
            sample(("out", name), out_m, out_b)
        for key in list(self._last):
            if key not in seen:
                self._last.pop(key, None)
                self.values.pop(key, None)
