"""The broker's admin HTTP API on `http_port`: Pulsar's /admin/v2 and /lookup/v2 paths where they exist.

Every broker answers every request. What only a topic's owner knows (stats, internal stats, unload,
and the schema paths, whose ownership Pulsar's SchemasResourceBase validates too) is forwarded to
the owner and its answer relayed (Pulsar redirects with 307; forwarding serves every HTTP client
the same way, including those that do not follow redirects for PUT/POST). A
forwarded request carries `forwarded=true`; a broker that is not the owner of a forwarded request
answers 503 (ownership is moving) instead of forwarding again. Bodies are JSON.

Routes ({t}/{ns}: tenant/namespace; {topic}: the local name; {bundle}: 0xLLLLLLLL_0xUUUUUUUU):

    GET  /metrics                                      Prometheus text (clusters.metrics.REGISTRY)
    GET  /admin/v2/brokers/health | ready              "ok" (ready: with a ZooKeeper session, else 503)
    GET  /admin/v2/brokers/{cluster}                   ["host:http_port", ...] live brokers
    GET  /admin/v2/brokers/{cluster}/{broker}/ownedNamespaces
    GET  /admin/v2/loadbalancer/channel                the extensible load manager's channel as this broker
                                                       sees it: {"broker", "leader", "last_applied", "records"}
                                                       {"t/ns/{bundle}": {"broker_assignment", "is_active",
                                                        "is_controlled"}} of that broker ({broker}:
                                                        host:http_port, host:port or node name)
    GET  /lookup/v2/topic/persistent/{t}/{ns}/{topic}[?authoritative=true]
                                                       {"brokerUrl", "httpUrl", "nativeUrl", ...}: the
                                                        owner (a redirect is followed here)
    GET  /lookup/v2/topic/persistent/{t}/{ns}/{topic}/bundle   "0xLLLLLLLL_0xUUUUUUUU": its bundle
                                                       (also /lookup/v2/topic/non-persistent/...)
    GET  /admin/v2/non-persistent/{t}/{ns}             the active non-persistent topics loaded here
    GET  /admin/v2/non-persistent/{t}/{ns}/{topic}/stats   NonPersistentTopicStats, from the owner
    PUT  /admin/v2/non-persistent/{t}/{ns}/{topic}/unload  close it on its owner (what it held is gone)
    GET  /admin/v2/persistent/{t}/{ns}                 topics of the namespace (partitions listed)
    GET  /admin/v2/persistent/{t}/{ns}/partitioned     partitioned topics of the namespace
    PUT  /admin/v2/persistent/{t}/{ns}/{topic}         create a non-partitioned topic (409 if it exists)
    GET  .../{topic}/partitions                        {"partitions": N} (0: not partitioned)
    PUT  .../{topic}/partitions   body N               create a partitioned topic (409 exists, 400 N<=0)
    POST .../{topic}/partitions   body N               raise the number of partitions
    DELETE .../{topic}/partitions                      delete the partitioned-topic metadata
    GET  .../{topic}/stats                             rates, publishers, subscriptions, backlog, storage
    GET  .../{topic}/partitioned-stats                 the partitions' stats summed (+ "partitions")
    GET  .../{topic}/internalStats                     ledgers (with BookKeeper metadata: ensembles,
                                                        state, lastEntryId), cursors (markDeletePosition,
                                                        individuallyDeletedMessages, cursorLedger)
    PUT  .../{topic}/unload                            close the topic on its owner (clients reconnect)
    PUT  .../{topic}/subscription/{sub}                a durable subscription with no consumer, at the
                                                        latest position (body: none or MessageId.latest;
                                                        {"ledgerId": -1, "entryId": -1}: earliest; 409 exists)
    GET|PUT .../{topic}/compaction                     compaction status {"status", "lastError"}; start one
                                                        (409 while one runs)
    GET  .../{topic}/lastMessageId                     {"ledgerId", "entryId", "partitionIndex"[, "batchIndex"]}
    GET|POST|DELETE .../{topic}/deduplicationEnabled   topic-level deduplication override (body
                                                        true/false; also .../deduplication)
    GET  /admin/v2/namespaces/{t}                      namespaces of the tenant
    GET  /admin/v2/namespaces/{t}/{ns}                 its policies (also .../policies); PUT creates it
    GET  /admin/v2/namespaces/{t}/{ns}/topics          topics of the namespace
    GET  /admin/v2/namespaces/{t}/{ns}/bundles         {"boundaries", "numBundles", "owners"}
    GET  /admin/v2/namespaces/{t}/{ns}/{bundle}        {"bundle", "owner", "brokerUrl", "httpUrl", "topics"}
    PUT  /admin/v2/namespaces/{t}/{ns}/{bundle}/unload the owner closes the bundle's topics and gives it up
    PUT  /admin/v2/namespaces/{t}/{ns}/unload          every bundle of the namespace
    GET|POST|DELETE /admin/v2/namespaces/{t}/{ns}/retention      {"retentionTimeInMinutes", "retentionSizeInMB"}
    GET|POST|DELETE /admin/v2/namespaces/{t}/{ns}/messageTTL     seconds (integer body)
    GET|POST|DELETE /admin/v2/namespaces/{t}/{ns}/deduplication  true/false
    GET|POST|DELETE /admin/v2/namespaces/{t}/{ns}/persistence    {"bookkeeperEnsemble",
                                                        "bookkeeperWriteQuorum", "bookkeeperAckQuorum"}
    GET|POST|DELETE /admin/v2/namespaces/{t}/{ns}/schemaCompatibilityStrategy   "FULL" ... (unset: "UNDEFINED")
    GET|POST|DELETE /admin/v2/namespaces/{t}/{ns}/isAllowAutoUpdateSchema | schemaValidationEnforced  true/false
    GET|POST|DELETE /admin/v2/namespaces/{t}/{ns}/compactionThreshold   bytes (integer body)
    GET|POST|DELETE /admin/v2/schemas/{t}/{ns}/{topic}/schema   the latest schema (GetSchemaResponse; 404 none);
                                                        POST {"type", "schema", "properties"} adds a version
                                                        (409 incompatible, 422 not a schema); DELETE
                                                        [?force=true] a deleted version (or everything)
    GET  /admin/v2/schemas/{t}/{ns}/{topic}/schema/{version} | /schemas   one version; every live version
    POST /admin/v2/schemas/{t}/{ns}/{topic}/compatibility | /version      {"isCompatibility", "schemaCompatibilityStrategy"};
                                                        {"version"} of an existing schema (-1: none)
        GET of a single policy answers the namespace's own setting (null when unset: the broker
        default applies); .../policies answers the effective values. DELETE removes the setting.

Errors are JSON {"reason": "..."} naming the problem: 400 malformed JSON, a wrong type or value, a
malformed name; 404 unknown path, topic, partitioned topic or bundle; 405 (with Allow) a method the
path does not take; 409 already exists; 503 when ZooKeeper or the owner cannot be reached now.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any
from urllib.parse import quote, urlencode

from clusters.broker import partitions as parts
from clusters.broker.selectors import partition_index as parts_index
from clusters.broker.managed_ledger import (ML_ROOT, Position, _pos_from, _ranges_from, is_system_cursor,
                                            ml_name, ml_path)
from clusters.loadbalancer.bundles import NAMESPACE_ROOT
from clusters.metadata.brokers import BrokerRegistry
from clusters.metadata.codec import decode_json_object
from clusters.broker.policies import (POLICIES_ROOT, NamespacePolicies, PolicyError,
                                      policies_path)
from clusters.httpd import (HttpError, HttpServer, Request, Response, error, http_get, http_request,  # noqa: F401
                            parse_request_head)
from clusters.metadata.store import NodeExists

log = logging.getLogger(__name__)

HOP_TIMEOUT = 8.0                    # asking the broker a lookup was redirected to
FORWARD_TIMEOUT = 30.0               # a request forwarded to a topic's or bundle's owner
ZK_READ_TIMEOUT = 3.0
MAX_REDIRECTS = 2

_NAME_RE = re.compile(r"^[-=:.\w]+$")
_BUNDLE_RE = re.compile(r"^0x([0-9a-fA-F]{8})_0x([0-9a-fA-F]{8})$")
_LATEST_ID = 2 ** 63 - 1        # Pulsar's MessageId.latest: ledgerId and entryId Long.MAX_VALUE
_TOPIC_ACTIONS = {
    "partitions": ("GET", "PUT", "POST", "DELETE"),
    "stats": ("GET",),
    "partitioned-stats": ("GET",),
    "internalStats": ("GET",),
    "unload": ("PUT",),
    "deduplicationEnabled": ("GET", "POST", "DELETE"),
    "deduplication": ("GET", "POST", "DELETE"),
    "compaction": ("GET", "PUT"),
    "lastMessageId": ("GET",),
}
_NS_POLICY_ACTIONS = ("retention", "messageTTL", "deduplication", "persistence", "schemaCompatibilityStrategy",
                      "isAllowAutoUpdateSchema", "schemaValidationEnforced", "compactionThreshold")
_NS_POLICY_KEYS = {"retention": "retention_policies", "messageTTL": "message_ttl_in_seconds",
                   "deduplication": "deduplicationEnabled", "persistence": "persistence",
                   "schemaCompatibilityStrategy": "schema_compatibility_strategy",
                   "isAllowAutoUpdateSchema": "is_allow_auto_update_schema",
                   "schemaValidationEnforced": "schema_validation_enforced",
                   "compactionThreshold": "compaction_threshold"}
# what GET answers for a policy the namespace does not set (Pulsar's Policies defaults)
_NS_POLICY_UNSET = {"schemaCompatibilityStrategy": "UNDEFINED", "isAllowAutoUpdateSchema": True,
                    "schemaValidationEnforced": False}


class MethodNotAllowed(HttpError):
    def __init__(self, method: str, what: str, allowed: tuple[str, ...]):
        allowed = tuple(dict.fromkeys(allowed + (("HEAD",) if "GET" in allowed else ())))
        super().__init__(405, f"method {method} not allowed on {what}; use {', '.join(allowed)}")
        self.allowed = allowed


def _allow(req: Request, what: str, *allowed: str) -> str:
    """The request's method (HEAD counts as GET) if `allowed` takes it, else 405."""
    method = "GET" if req.method == "HEAD" else req.method
    if method not in allowed:
        raise MethodNotAllowed(req.method, what, allowed)
    return method


def _check_name(kind: str, value: str) -> str:
    if not _NAME_RE.match(value):
        raise HttpError(400, f"invalid {kind} name {value[:60]!r}: use letters, digits and -_=:.")
    return value


async def _zk(coro: Any) -> Any:
    try:
        return await asyncio.wait_for(coro, ZK_READ_TIMEOUT)
    except (HttpError, ValueError):       # ValueError: PartitionError, PolicyError (the caller's)
        raise
    except Exception as e:
        raise HttpError(503, f"ZooKeeper is not reachable now: {type(e).__name__}: {e}") from None


class AdminHttpServer(HttpServer):
    """The admin HTTP server of one broker (a BrokerService: config, store, lookup(), topics)."""

    NAME = "admin HTTP"
    METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE")

    def __init__(self, service: Any):
        super().__init__(service.config.host, service.config.http_port)
        self.service = service
        self.cfg = service.config
        # `pulsar://host:port` -> the admin URL of that broker, from the registrations (a broker keeps
        # both addresses for life): one scan of /loadbalance/brokers per broker not yet known
        self._web_urls: dict[str, str] = {}

    # -- routing ----------------------------------------------------------------------
    async def route(self, req: Request) -> Response:
        try:
            return await self._route(req)
        except MethodNotAllowed as e:
            return Response(405, {"reason": e.reason}, headers={"Allow": ", ".join(e.allowed)})

    async def _route(self, req: Request) -> Response:
        s = req.segments
        if s == ["metrics"]:
            _allow(req, "/metrics", "GET")
            from clusters import metrics
            return Response(200, metrics.REGISTRY.render(), content_type=metrics.CONTENT_TYPE)
        if s[:2] == ["lookup", "v2"]:
            if len(s) == 8 and s[2] == "topic" and s[7] == "bundle":
                _allow(req, "a topic's bundle", "GET")
                topic = self._topic(s[3], s[4:7], self.cfg)
                return Response(200, (await _zk(self.service.ownership.bundle_for(topic))).range_name)
            if len(s) >= 7 and s[2] == "topic":
                _allow(req, "a topic lookup", "GET")
                topic = self._topic(s[3], s[4:], self.cfg)
                return Response(200, await self.lookup(topic, req.flag("authoritative")))
        elif s[:3] == ["admin", "v2", "brokers"]:
            return await self._brokers(req, s[3:])
        elif s == ["admin", "v2", "clusters"]:
            _allow(req, "the cluster list", "GET")
            return Response(200, [self.cfg.cluster])
        elif s == ["admin", "v2", "broker-stats", "load-report"]:
            _allow(req, "the load report", "GET")
            return Response(200, self.service.load_manager.load_report())
        elif s == ["admin", "v2", "loadbalancer", "channel"]:
            _allow(req, "the service-unit state channel", "GET")
            snapshot = getattr(self.service.load_manager, "channel_snapshot", None)
            if snapshot is None:
                raise HttpError(404, f"this broker runs the {self.service.load_manager.name} load manager, "
                                     "which has no service-unit state channel (--load-manager extensible)")
            return Response(200, snapshot())
        elif s[:3] == ["admin", "v2", "namespaces"] and len(s) >= 4:
            return await self._namespaces(req, s[3:])
        elif s[:3] == ["admin", "v2", "schemas"] and len(s) >= 7:
            return await self._schemas(req, s[3:])
        elif s[:2] == ["admin", "v2"] and len(s) >= 5 and s[2] in ("persistent", "non-persistent"):
            return await self._topics(req, s[2], s[3:])
        raise HttpError(404, f"no such resource: {req.path[:200]}")

    @staticmethod
    def _topic(domain: str, parts: list[str], cfg: Any = None) -> str:
        if domain == "non-persistent" and not getattr(cfg, "enable_non_persistent_topics", False):
            raise HttpError(404, "non-persistent topics are not enabled on this broker "
                                 "(enable_non_persistent_topics)")
        if domain not in ("persistent", "non-persistent"):
            raise HttpError(404, f"unknown topic domain {domain[:40]!r}")
        if len(parts) < 3 or not all(parts):
            raise HttpError(400, "expected {tenant}/{namespace}/{topic}")
        _check_name("tenant", parts[0])
        _check_name("namespace", parts[1])
        return f"{domain}://{'/'.join(parts)}"

    # -- /admin/v2/brokers -----------------------------------------------------------------
    async def _brokers(self, req: Request, rest: list[str]) -> Response:
        if rest == ["leaderBroker"]:
            _allow(req, "the leader broker", "GET")
            leader = await _zk(self.service.load_manager.leader())
            if leader is None:
                raise HttpError(404, "no broker is the load-balancer leader now")
            return Response(200, leader)
        if len(rest) == 1 and rest[0] in ("health", "ready"):
            _allow(req, f"/admin/v2/brokers/{rest[0]}", "GET")
            if rest[0] == "health" or self.service.store.connected:
                return Response(200, "ok")
            return error(503, "no ZooKeeper session")
        if len(rest) == 1:
            _allow(req, "the broker list", "GET")
            self._check_cluster(rest[0])
            return Response(200, sorted(b["web"] for b in await self._live_brokers()))
        if len(rest) == 3 and rest[2] == "ownedNamespaces":
            _allow(req, "ownedNamespaces", "GET")
            self._check_cluster(rest[0])
            return await self._owned_namespaces(req, rest[1])
        raise HttpError(404, f"no such resource: {req.path[:200]}")

    def _check_cluster(self, cluster: str) -> None:
        if cluster != self.cfg.cluster:
            raise HttpError(404, f"unknown cluster {cluster[:60]!r}; this broker belongs to {self.cfg.cluster!r}")

    async def _live_brokers(self) -> list[dict[str, str]]:
        """Every registered broker: {"id": its brokerId host:http_port, "web": the same, "web_url",
        "service_url", "name"}."""
        return await _zk(BrokerRegistry(self.service.store).live())

    async def _owned_namespaces(self, req: Request, broker: str) -> Response:
        me = {self.service.ownership.me, self.cfg.web_url.split("://", 1)[-1], self.cfg.name}
        if broker in me:
            owned = sorted(str(b) for b in self.service.ownership.owned)
            return Response(200, {b: {"broker_assignment": "shared", "is_controlled": False, "is_active": True}
                                  for b in owned})
        for b in await self._live_brokers():
            if broker in (b["id"], b["web"], b["name"]):
                return await self._forward(req, b["web_url"], f"broker {broker}")
        raise HttpError(404, f"broker {broker[:80]!r} is not a live broker of cluster {self.cfg.cluster!r}")

    # -- /admin/v2/persistent/... -----------------------------------------------------------
    async def _topics(self, req: Request, domain: str, rest: list[str]) -> Response:
        if domain == "non-persistent":
            return await self._non_persistent_topics(req, rest)
        tenant = _check_name("tenant", rest[0])
        ns = _check_name("namespace", rest[1])
        namespace = f"{tenant}/{ns}"
        if len(rest) == 2:
            _allow(req, "the topic list", "GET")
            return Response(200, await self._namespace_topics(namespace))
        if len(rest) == 3 and rest[2] == "partitioned" and req.method in ("GET", "HEAD"):
            return Response(200, list(await _zk(parts.partitioned_topics(self.service.store, namespace))))
        if not rest[2]:
            raise HttpError(400, "empty topic name")
        topic = f"persistent://{namespace}/{rest[2]}"
        if len(rest) == 3:
            _allow(req, "a topic", "PUT")
            return await self._create_topic(req, topic)
        if len(rest) == 5 and rest[3] == "subscription":
            _allow(req, "a subscription", "PUT")
            return await self._create_subscription(req, topic, _check_name("subscription", rest[4]))
        if len(rest) != 4:
            raise HttpError(404, f"no such resource: {req.path[:200]}")
        action = rest[3]
        allowed = _TOPIC_ACTIONS.get(action)
        if allowed is None:
            raise HttpError(404, f"no such topic resource {action[:60]!r}; one of {', '.join(_TOPIC_ACTIONS)}")
        method = _allow(req, f"/{action}", *allowed)
        if action == "partitions":
            return await self._partitions(req, method, topic)
        if action == "partitioned-stats":
            return await self._partitioned_stats(req, topic)
        if action in ("deduplicationEnabled", "deduplication"):
            return await self._topic_dedup(req, method, topic)
        await self._require_topic(topic)
        forwarded = await self._forward_to_owner(req, topic)
        if forwarded is not None:
            return forwarded
        if action == "stats":
            return Response(200, await self.topic_stats(topic))
        if action == "internalStats":
            return Response(200, await self.internal_stats(topic))
        if action == "compaction":
            t = await self._loaded(topic)
            if method == "GET":
                return Response(200, t.compaction.status_json())
            if not t.compaction.trigger():
                raise HttpError(409, "Compaction already in progress")
            return Response(204, b"")
        if action == "lastMessageId":
            t = await self._loaded(topic)
            ledger, entry, batch_index = await t.last_message_id()
            out = {"ledgerId": ledger, "entryId": entry, "partitionIndex": parts_index(topic)}
            if batch_index >= 0:
                out["batchIndex"] = batch_index
            return Response(200, out)
        # unload
        await self.service.unload_topic(topic)
        return Response(204, b"")

    async def _non_persistent_topics(self, req: Request, rest: list[str]) -> Response:
        """/admin/v2/non-persistent/...: the namespace's list (the active non-persistent topics loaded
        on this broker, as Pulsar's getListOfNonPersistentTopics), a topic's stats (Pulsar's
        NonPersistentTopicStats, from its owner; 404 where it is not loaded) and unload."""
        if not self.cfg.enable_non_persistent_topics:
            raise HttpError(404, "non-persistent topics are not enabled on this broker "
                                 "(enable_non_persistent_topics)")
        namespace = f"{_check_name('tenant', rest[0])}/{_check_name('namespace', rest[1])}"
        if len(rest) == 2:
            _allow(req, "the topic list", "GET")
            return Response(200, self.service.non_persistent.names(namespace))
        if len(rest) != 4 or not rest[2] or rest[3] not in ("stats", "unload"):
            raise HttpError(404, f"no such non-persistent topic resource: {req.path[:200]}; "
                                 "one of stats, unload")
        topic = f"non-persistent://{namespace}/{rest[2]}"
        _allow(req, f"/{rest[3]}", *_TOPIC_ACTIONS[rest[3]])
        forwarded = await self._forward_to_owner(req, topic)
        if forwarded is not None:
            return forwarded
        t = self.service.non_persistent.topics.get(topic)
        if t is None or t.closed:
            raise HttpError(404, f"Topic {topic} not found")
        if rest[3] == "stats":
            return Response(200, t.stats(self.service.rate, self.cfg.web_url.split("://", 1)[-1], self.cfg.name))
        await self.service.unload_topic(topic)
        return Response(204, b"")

    # -- /admin/v2/schemas/{t}/{ns}/{topic}/... (Pulsar's SchemasResource) -------------------
    async def _schemas(self, req: Request, rest: list[str]) -> Response:
        """The schema registry, answered by the topic's owner: Pulsar's SchemasResourceBase checks
        validateTopicOwnershipAsync before every operation (get, versions, delete, post,
        compatibility, version), so a broker that does not own the topic sends the request on,
        as the other topic paths here do (forwarded, not redirected: see the module docstring)."""
        from clusters.broker import schema as sch
        tenant = _check_name("tenant", rest[0])
        ns = _check_name("namespace", rest[1])
        if not rest[2]:
            raise HttpError(400, "empty topic name")
        topic = f"persistent://{tenant}/{ns}/{rest[2]}"
        sid = sch.schema_id(topic)
        if rest[3:4] in (["schema"], ["schemas"], ["compatibility"], ["version"]):
            forwarded = await self._forward_to_owner(req, topic)
            if forwarded is not None:
                return forwarded
        registry = self.service.schemas
        what = rest[3:]
        if what == ["schema"]:
            method = _allow(req, "/schema", "GET", "POST", "DELETE")
            if method == "GET":
                stored = await _zk_long(registry.get(sid))
                if stored is None:
                    raise HttpError(404, f"Schema not found for topic {topic}")
                return Response(200, sch.schema_response_json(stored))
            if method == "DELETE":
                version = await _zk_long(registry.delete(sid, force=req.flag("force")))
                return Response(200, {"version": version if version is not None else -1})
            schema = _schema_payload(req.json())
            pol = await _zk(self.service.namespace_policies(topic))
            try:
                version = await _zk_long(registry.put_if_absent(sid, schema, pol.schema_compatibility_strategy))
            except sch.IncompatibleSchema as e:
                raise HttpError(409, str(e)) from None
            except sch.InvalidSchemaData as e:
                raise HttpError(422, str(e)) from None
            return Response(200, {"version": {"version": version}})
        if len(what) == 2 and what[0] == "schema":
            _allow(req, "/schema/{version}", "GET")
            try:
                v = int(what[1])
            except ValueError:
                raise HttpError(400, f"invalid schema version {what[1][:30]!r}: a long integer") from None
            stored = await _zk_long(registry.get(sid, v))
            if stored is None:
                raise HttpError(404, f"Schema version {v} not found for topic {topic}")
            return Response(200, sch.schema_response_json(stored))
        if what == ["schemas"]:
            _allow(req, "/schemas", "GET")
            live = sch.since_last_delete(await _zk_long(registry.get_all(sid)))
            return Response(200, {"getSchemaResponses": [sch.schema_response_json(s) for s in live]})
        if what in (["compatibility"], ["version"]):
            _allow(req, f"/{what[0]}", "POST")
            schema = _schema_payload(req.json())
            if what == ["version"]:
                v = await _zk_long(registry.find_version(sid, schema))
                return Response(200, {"version": v if v is not None else -1})
            pol = await _zk(self.service.namespace_policies(topic))
            strategy = pol.schema_compatibility_strategy
            try:
                await _zk_long(registry.check_compatible(sid, schema, strategy))
                ok = True
            except sch.InvalidSchemaData as e:
                raise HttpError(422, str(e)) from None
            except sch.IncompatibleSchema:
                ok = False
            return Response(200, {"isCompatibility": ok, "schemaCompatibilityStrategy": strategy})
        raise HttpError(404, f"no such schema resource: {req.path[:200]}; one of schema, schema/{{version}}, "
                             "schemas, compatibility, version")

    async def _namespace_topics(self, namespace: str) -> list[str]:
        return await _zk(parts.topics_of_namespace(self.service.store, namespace))

    async def _require_topic(self, topic: str) -> None:
        if topic in self.service.topics:
            return
        if await _zk(parts.topic_exists(self.service.store, topic)):
            return
        n = await _zk(parts.get_partitions(self.service.store, topic))
        if n:
            raise HttpError(404, f"Topic {topic} is a partitioned topic with {n} partitions; ask its "
                                 f"partitions ({topic}-partition-<i>) or .../partitioned-stats")
        raise HttpError(404, f"Topic {topic} not found")

    async def _create_topic(self, req: Request, topic: str) -> Response:
        if await _zk(parts.topic_exists(self.service.store, topic)):
            raise HttpError(409, f"This topic already exists: {topic}")
        if await _zk(parts.get_partitions(self.service.store, topic)):
            raise HttpError(409, f"This topic already exists: {topic} is a partitioned topic")
        forwarded = await self._forward_to_owner(req, topic)
        if forwarded is not None:
            return forwarded
        try:
            await self.service.get_topic(topic)
        except Exception as e:
            raise HttpError(503, f"cannot create {topic} now: {e}") from None
        return Response(204, b"")

    async def _create_subscription(self, req: Request, topic: str, name: str) -> Response:
        """PUT .../{topic}/subscription/{name}: a durable subscription with no consumer (Pulsar's
        createSubscription). The body is a MessageId: none, or Pulsar's MessageId.latest
        (Long.MAX_VALUE both), is the latest position; {"ledgerId": -1, "entryId": -1} the earliest."""
        body = req.json() if req.body.strip() else {}
        if not isinstance(body, dict):
            raise HttpError(400, "the body must be a MessageId object {\"ledgerId\": L, \"entryId\": E} or empty")
        ids = (body.get("ledgerId", _LATEST_ID), body.get("entryId", _LATEST_ID))
        if ids == (_LATEST_ID, _LATEST_ID):
            initial = "latest"
        elif ids == (-1, -1):
            initial = "earliest"
        else:
            raise HttpError(400, f"a subscription is created at the latest or the earliest position here, not at "
                                 f"{ids[0]}:{ids[1]}; send no body (latest) or {{\"ledgerId\": -1, \"entryId\": -1}}")
        await self._require_topic(topic)
        forwarded = await self._forward_to_owner(req, topic)
        if forwarded is not None:
            return forwarded
        t = await self._loaded(topic)
        try:
            created = await t.create_subscription(name, initial)
        except HttpError:
            raise
        except Exception as e:
            raise HttpError(503, f"cannot create subscription {name} on {topic} now: {e}") from None
        if not created:
            raise HttpError(409, f"Subscription {name} already exists on {topic}")
        return Response(204, b"")

    async def _partitions(self, req: Request, method: str, topic: str) -> Response:
        store = self.service.store
        try:
            if method == "GET":
                return Response(200, {"partitions": await _zk(parts.get_partitions(store, topic))})
            if method == "DELETE":
                await _zk(parts.delete_partitioned(store, topic))
                return Response(204, b"")
            n = req.json()
            if method == "PUT":
                await _zk(parts.create_partitioned(store, topic, n))
            else:
                await _zk(parts.update_partitions(store, topic, n))
        except parts.PartitionError as e:
            raise HttpError(e.status, str(e)) from None
        return Response(204, b"")

    async def _topic_dedup(self, req: Request, method: str, topic: str) -> Response:
        if not await _zk(parts.topic_exists(self.service.store, topic)) and \
                not await _zk(parts.get_partitions(self.service.store, topic)):
            raise HttpError(404, f"Topic {topic} not found")
        if method == "GET":
            value = (await _zk(self.service.topic_policy(topic))).get("deduplicationEnabled")
            return Response(200, value if isinstance(value, bool) else None)
        value = None
        if method == "POST":
            value = req.json()
            if not isinstance(value, bool):
                raise HttpError(400, f"deduplication must be true or false, got {json.dumps(value)[:40]}")
        await _zk(self.service.set_topic_policy(topic, "deduplicationEnabled", value))
        return Response(204, b"")

    async def _partitioned_stats(self, req: Request, topic: str) -> Response:
        n = await _zk(parts.get_partitions(self.service.store, topic))
        if not n:
            raise HttpError(404, f"Partitioned topic {topic} not found")
        per = {}
        for i in range(n):
            name = parts.partition_name(topic, i)
            status, body = await self._local_or_forward_json(req, name, "stats")
            if status != 200:
                raise HttpError(503, f"stats of {name}: {status} {body}")
            per[name] = body
        total: dict[str, Any] = {"metadata": {"partitions": n}, "partitions": {}}
        keys = ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "msgInCounter",
                "bytesInCounter", "msgOutCounter", "bytesOutCounter", "storageSize")
        for k in keys:
            total[k] = sum(p.get(k, 0) for p in per.values())
        total["publishers"] = [pub for p in per.values() for pub in p.get("publishers", [])]
        subs: dict[str, Any] = {}
        for p in per.values():
            for sname, st in p.get("subscriptions", {}).items():
                agg = subs.setdefault(sname, {"msgBacklog": 0, "unackedMessages": 0, "msgRateOut": 0.0,
                                              "msgThroughputOut": 0.0, "type": st.get("type"), "consumers": []})
                for k in ("msgBacklog", "unackedMessages", "msgRateOut", "msgThroughputOut"):
                    agg[k] += st.get(k, 0)
                agg["consumers"].extend(st.get("consumers", []))
        total["subscriptions"] = subs
        if req.flag("perPartition") or "perPartition" not in req.query:
            total["partitions"] = per
        return Response(200, total)

    async def _local_or_forward_json(self, req: Request, topic: str, action: str) -> tuple[int, Any]:
        """(status, JSON) of `action` on `topic`, computed here if we own it, else by its owner."""
        sub = Request("GET", f"/admin/v2/{topic.replace('://', '/', 1)}/{action}",
                      ["admin", "v2", *topic.replace("://", "/", 1).split("/"), action],
                      {}, req.version, {}, False)
        resp = await self._forward_to_owner(sub, topic)
        if resp is None:
            return 200, await self.topic_stats(topic)
        try:
            return resp.status, json.loads(resp.body or b"null")
        except ValueError:
            return resp.status, resp.body[:200].decode(errors="replace")

    # -- forwarding to the owner -----------------------------------------------------------
    async def _forward_to_owner(self, req: Request, topic: str) -> Response | None:
        """None when this broker serves `topic` (it takes an unowned bundle if the lookup says so);
        else the owner's answer to the same request."""
        svc = self.service
        if svc.ownership.owns(topic):
            return None
        try:
            res = await svc.lookup(topic, req.flag("authoritative"))
        except Exception as e:
            raise HttpError(503, f"cannot find the owner of {topic} now: {type(e).__name__}: {e}") from None
        if res.kind == "failed":
            raise HttpError(503, res.message or f"cannot find the owner of {topic} now")
        if res.kind == "connect" and res.url == self.cfg.service_url:
            return None
        if req.flag("forwarded"):
            raise HttpError(503, f"{topic} is owned by {res.url}, not this broker (ownership is moving); retry")
        if res.kind == "redirect" and not res.authoritative:
            # sent to the load-balancer leader: follow the lookup to the broker that takes the bundle
            found = await self.lookup(topic)
            if found["brokerUrl"] == self.cfg.service_url:
                return None
            return await self._forward(req, found["httpUrl"], topic)
        web = await self.web_url_of(res.url)
        return await self._forward(req, web, topic, authoritative=res.kind == "redirect")

    async def _forward(self, req: Request, web_url: str, what: str, *, authoritative: bool = False) -> Response:
        query = {k: v[-1] for k, v in req.query.items()}
        query["forwarded"] = "true"
        if authoritative:
            query["authoritative"] = "true"
        path = "/" + "/".join(quote(seg, safe="") for seg in req.segments)
        url = f"{web_url}{path}?{urlencode(query)}"
        method = "GET" if req.method == "HEAD" else req.method
        try:
            status, body = await http_request(method, url, FORWARD_TIMEOUT,
                                              body=req.body if req.body else (b"" if method in ("PUT", "POST") else None))
        except Exception as e:
            raise HttpError(503, f"{what}: its owner at {web_url} did not answer: {type(e).__name__}: {e}") from None
        if not body:
            return Response(status, b"")
        try:
            return Response(status, json.loads(body))
        except ValueError:
            return Response(status, body, content_type="text/plain; charset=utf-8")

    # -- /admin/v2/namespaces/... ------------------------------------------------------------
    async def _namespaces(self, req: Request, rest: list[str]) -> Response:
        tenant = _check_name("tenant", rest[0])
        if len(rest) == 1:
            _allow(req, "the namespace list", "GET")
            return Response(200, await self._tenant_namespaces(tenant))
        ns = _check_name("namespace", rest[1])
        namespace = f"{tenant}/{ns}"
        if len(rest) == 2:
            method = _allow(req, "a namespace", "GET", "PUT")
            if method == "PUT":
                return await self._create_namespace(namespace, req)
            return Response(200, await self._effective_policies(namespace))
        what = rest[2]
        if len(rest) == 3:
            if what == "policies":
                _allow(req, "/policies", "GET")
                return Response(200, await self._effective_policies(namespace))
            if what == "topics":
                _allow(req, "/topics", "GET")
                return Response(200, await self._namespace_topics(namespace))
            if what == "bundles":
                _allow(req, "/bundles", "GET")
                return Response(200, await self._bundles(namespace))
            if what == "unload":
                _allow(req, "/unload", "PUT")
                for b in await self._bundle_list(namespace):
                    await self._unload(req, b, None)
                return Response(204, b"")
            if what in _NS_POLICY_ACTIONS:
                method = _allow(req, f"/{what}", "GET", "POST", "DELETE")
                return await self._ns_policy(req, method, namespace, what)
            if what.startswith("0x"):
                _allow(req, "a bundle", "GET")
                return Response(200, await self._bundle_info(namespace, await self._parse_bundle(namespace, what)))
            raise HttpError(404, f"no such namespace resource {what[:60]!r}")
        if len(rest) == 4 and rest[3] == "unload" and what.startswith("0x"):
            _allow(req, "/unload", "PUT")
            bundle = await self._parse_bundle(namespace, what)
            return await self._unload(req, bundle, req.arg("destinationBroker"))
        if len(rest) == 4 and rest[3] == "split" and what.startswith("0x"):
            _allow(req, "/split", "PUT")
            return await self._split_bundle(req, await self._parse_bundle(namespace, what))
        raise HttpError(404, f"no such resource: {req.path[:200]}")

    async def _tenant_namespaces(self, tenant: str) -> list[str]:
        names: set[str] = set()
        for root in (POLICIES_ROOT, ML_ROOT, NAMESPACE_ROOT, parts.PARTITIONED_ROOT):
            names.update(await _zk(self.service.store.children(f"{root}/{tenant}")))
        return sorted(f"{tenant}/{n}" for n in names)

    async def _create_namespace(self, namespace: str, req: Request) -> Response:
        """PUT /admin/v2/namespaces/{t}/{ns}, optionally with Pulsar's Policies body; its `bundles`
        ({"numBundles": n} or {"boundaries": [...]}, `pulsar-admin namespaces create --bundles n`)
        sets the namespace's initial bundles (defaultNumberOfNamespaceBundles otherwise)."""
        from clusters.loadbalancer.bundles import BundleError, bundles_data, initial_boundaries, parse_bundles_data
        path = policies_path(namespace)
        body = req.json() if req.body.strip() else {}
        if not isinstance(body, dict):
            raise HttpError(400, "the namespace policies must be a JSON object")
        try:
            bounds = (parse_bundles_data(body["bundles"]) if body.get("bundles") is not None
                      else initial_boundaries(int(self.cfg.bundles)))
        except BundleError as e:
            raise HttpError(400, f"invalid bundles: {e}") from None
        policies = {"bundles": bundles_data(bounds)}
        try:
            await asyncio.wait_for(self.service.store.create(path, json.dumps(policies).encode(), makepath=True),
                                   ZK_READ_TIMEOUT)
        except asyncio.TimeoutError:
            raise HttpError(503, "ZooKeeper is not reachable now") from None
        except NodeExists:
            raise HttpError(409, f"Namespace already exists: {namespace}") from None
        except Exception as e:
            raise HttpError(503, f"ZooKeeper is not reachable now: {type(e).__name__}: {e}") from None
        return Response(204, b"")

    async def _stored_policies(self, namespace: str) -> dict[str, Any]:
        """The namespace's policies as stored now (read from ZooKeeper, not this broker's cache, so
        a change made through another broker reads back at once)."""
        got = await _zk(self.service.store.get_or_none(policies_path(namespace)))
        return decode_json_object(got[0] if got else b"")

    async def _effective_policies(self, namespace: str) -> dict[str, Any]:
        cache = self.service.policies
        try:
            pol = NamespacePolicies.from_json(await self._stored_policies(namespace), cache.base)
        except PolicyError:
            pol = cache.base
        out = pol.to_json()
        out["bundles"] = await self._bundles_json(namespace)
        return out

    async def _ns_policy(self, req: Request, method: str, namespace: str, what: str) -> Response:
        key = _NS_POLICY_KEYS[what]
        if method == "GET":
            value = (await self._stored_policies(namespace)).get(key)
            return Response(200, _NS_POLICY_UNSET.get(what) if value is None else value)
        value = None
        if method == "POST":
            value = _policy_body(what, req.json())
        try:
            await _zk(self.service.policies.update(namespace, {key: value}))
        except PolicyError as e:
            raise HttpError(400, f"invalid {what}: {e}") from None
        return Response(204, b"")

    # -- bundles -------------------------------------------------------------------------
    async def _bundle_list(self, namespace: str) -> list[Any]:
        """The namespace's bundles as its local policies say now (read afresh: a split made on
        another broker shows at once)."""
        return list((await _zk(self.service.ownership.namespace_bundles(namespace, fresh=True))).bundles)

    async def _bundles_json(self, namespace: str) -> dict[str, Any]:
        nb = await _zk(self.service.ownership.namespace_bundles(namespace, fresh=True))
        return nb.to_json()

    async def _bundles(self, namespace: str) -> dict[str, Any]:
        out = await self._bundles_json(namespace)
        owners = {}
        for b in await self._bundle_list(namespace):
            owners[b.range_name] = await _zk(self.service.ownership.owner(b))
        out["owners"] = owners
        return out

    async def _parse_bundle(self, namespace: str, name: str) -> Any:
        if not _BUNDLE_RE.match(name):
            raise HttpError(400, f"malformed bundle {name[:60]!r}; expected 0xLLLLLLLL_0xUUUUUUUU")
        bundles = await self._bundle_list(namespace)
        for b in bundles:
            if b.range_name == name.lower():
                return b
        names = ", ".join(b.range_name for b in bundles)
        raise HttpError(404, f"no bundle {name[:60]} in {namespace}; its bundles are {names}")

    async def _unload(self, req: Request, bundle: Any, dest: str | None) -> Response:
        """PUT .../{bundle}/unload[?destinationBroker=<brokerId>]: the load manager unloads (a transfer to
        the destination when one is given) or names where the request goes on (api.Route)."""
        from clusters.loadbalancer.api import UnloadRefused
        if dest:
            live = {b["web"]: b for b in await self._live_brokers()}
            if dest not in live:
                raise HttpError(400, f"destinationBroker {dest[:80]!r} is not a live broker; live brokers: "
                                     f"{', '.join(sorted(live))}")
        try:
            route = await self.service.load_manager.unload(bundle, dest or None)
        except UnloadRefused as e:
            raise HttpError(e.status, str(e)) from None
        except HttpError:
            raise
        except Exception as e:
            raise HttpError(503, f"unloading {bundle}: {type(e).__name__}: {e}") from None
        if route is None:
            return Response(204, b"")
        if route.to == "leader":
            if req.flag("forwarded"):
                raise HttpError(503, "the load-balancer leader is changing; retry")
            return await self._forward(req, route.url, "the load-balancer leader")
        if req.flag("forwarded") and not dest:
            raise HttpError(503, f"bundle {bundle} is owned by {route.url}, not this broker (ownership is moving)")
        web = await self.web_url_of(f"pulsar://{route.url}")
        sub = Request("PUT", f"/admin/v2/namespaces/{bundle}/unload",
                      ["admin", "v2", "namespaces", *str(bundle).split("/"), "unload"],
                      {}, req.version, {}, False)
        resp = await self._forward(sub, web, f"bundle {bundle}")
        if resp.status >= 300:
            raise HttpError(resp.status if resp.status >= 400 else 503,
                            f"unloading {bundle} on {route.url}: {resp.body[:200].decode(errors='replace')}")
        return Response(204, b"")

    async def _split_bundle(self, req: Request, bundle: Any) -> Response:
        """PUT .../{bundle}/split?unload=&splitAlgorithmName= (body: the boundaries, for
        specified_positions_divide), on the bundle's owner."""
        from clusters.loadbalancer.bundles import BundleError, parse_boundary
        svc = self.service
        owner = await _zk(svc.ownership.owner(bundle))
        if owner is None:
            raise HttpError(412, f"bundle {bundle} is not owned by any broker; look a topic of it up first")
        if owner != svc.ownership.me:
            if req.flag("forwarded"):
                raise HttpError(503, f"bundle {bundle} is owned by {owner}, not this broker (ownership is moving)")
            return await self._forward(req, await self.web_url_of(f"pulsar://{owner}"), f"bundle {bundle}")
        algo = req.arg("splitAlgorithmName") or None
        positions = None
        if req.body:
            raw = req.json()
            if isinstance(raw, dict):
                raw = raw.get("boundaries")
            if not isinstance(raw, list):
                raise HttpError(400, "the split body must be a list of boundaries (numbers or 0x........ strings)")
            try:
                positions = [int(p) if isinstance(p, int) else parse_boundary(p) for p in raw]
            except BundleError as e:
                raise HttpError(400, str(e)) from None
        try:
            children = await svc.load_manager.split(bundle, algo, positions, req.flag("unload"))
        except BundleError as e:
            raise HttpError(400 if "unsupported" in str(e) or "position" in str(e) else 412, str(e)) from None
        return Response(200, {"bundle": str(bundle), "children": [c.range_name for c in children]})

    async def _bundle_info(self, namespace: str, bundle: Any) -> dict[str, Any]:
        got = await _zk(self.service.store.get_or_none(bundle.path))
        data = decode_json_object(got[0] if got else b"")
        topics = [t for t in await self._namespace_topics(namespace)
                  if self.service.ownership.bundle(t) == bundle]
        owner = data.get("broker")
        if owner is None and not got:       # no lock: ownership kept elsewhere (the extensible load manager)
            owner = await _zk(self.service.ownership.owner(bundle))
            if owner is not None:
                url = f"pulsar://{owner}"
                data = {"service_url": url, "web_url": await self.web_url_of(url)}
        return {"bundle": str(bundle), "range": bundle.range_name, "owner": owner,
                "brokerUrl": data.get("service_url"), "httpUrl": data.get("web_url"),
                "brokerName": data.get("name"), "topics": topics}

    # -- lookup -----------------------------------------------------------------------
    async def lookup(self, topic: str, authoritative: bool = False) -> dict[str, str]:
        res = await self.service.lookup(topic, authoritative)
        if res.kind == "connect":
            return {"brokerUrl": res.url, "brokerUrlTls": "", "httpUrl": await self.web_url_of(res.url),
                    "httpUrlTls": "", "nativeUrl": res.url}
        if res.kind == "redirect":
            return await self._follow(topic, res.url, res.authoritative)
        status = 400 if res.error == "InvalidTopicName" else 503
        raise HttpError(status, res.message or res.error or "lookup failed")

    async def _follow(self, topic: str, service_url: str, authoritative: bool = True) -> dict[str, str]:
        """Ask the broker a lookup was redirected to: authoritatively, it takes the bundle and answers;
        otherwise (the load-balancer leader) it decides, and follows its own redirect."""
        web = await self.web_url_of(service_url)
        domain, rest = topic.split("://", 1)
        url = f"{web}/lookup/v2/topic/{domain}/{rest}" + ("?authoritative=true" if authoritative else "")
        try:
            status, body = await http_get(url, HOP_TIMEOUT)
        except Exception as e:
            raise HttpError(503, f"lookup redirected to {service_url}, which did not answer: "
                                 f"{type(e).__name__}: {e}") from None
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if status == 200 and isinstance(data, dict) and isinstance(data.get("brokerUrl"), str):
            return data
        reason = data.get("reason") if isinstance(data, dict) else body[:200].decode(errors="replace")
        raise HttpError(503, f"lookup redirected to {service_url}, which answered {status}: {reason}")

    async def web_url_of(self, service_url: str) -> str:
        """The admin URL of the broker serving `pulsar://host:port` (from its registration znode)."""
        if service_url == self.cfg.service_url:
            return self.cfg.web_url
        hostport = service_url.split("://", 1)[-1].rstrip("/")
        known = self._web_urls.get(hostport)
        if known is not None:
            return known
        try:
            for b in await asyncio.wait_for(self._live_brokers(), ZK_READ_TIMEOUT):
                self._web_urls[b["service_url"].split("://", 1)[-1].rstrip("/")] = b["web_url"]
                self._web_urls[b["id"]] = b["web_url"]
            if hostport in self._web_urls:
                return self._web_urls[hostport]
        except Exception:
            pass                   # no ZooKeeper now: every broker of a cluster shares the port
        host = hostport.rsplit(":", 1)[0]
        return f"http://{host}:{self.cfg.http_port}"

    # -- topic stats ---------------------------------------------------------------------
    async def _loaded(self, topic: str) -> Any:
        try:
            return await self.service.get_topic(topic)
        except Exception as e:
            raise HttpError(503, f"cannot load {topic} on this broker now: {e}") from None

    async def topic_stats(self, topic: str) -> dict[str, Any]:
        """Pulsar's TopicStats for a topic this broker serves (loading it if needed)."""
        t = await self._loaded(topic)
        rate = self.service.rate
        r_in, r_out = rate("in", t.name), rate("out", t.name)
        publishers = []
        for p in list(t.producers.values()):
            pr = rate("producer", t.name, p.name, p.producer_id)
            publishers.append({
                "producerId": p.producer_id, "producerName": p.name,
                "accessMode": p.access_mode_name,
                "msgRateIn": pr[0], "msgThroughputIn": pr[1],
                "averageMsgSize": p.bytes_in / p.msgs_in if p.msgs_in else 0.0,
                "msgInCounter": p.msgs_in, "bytesInCounter": p.bytes_in,
                "duplicates": p.duplicates, "topicEpoch": p.topic_epoch,
                "address": p.cnx.remote, "clientVersion": p.cnx.client_version,
                "connectedSince": p.connected_since,
            })
        subs: dict[str, Any] = {}
        msgs_out = bytes_out = 0
        for name, sub in list(t.subscriptions.items()):
            st = _subscription_stats(t, name, sub, rate)
            subs[name] = st
            msgs_out += st["msgOutCounter"]
            bytes_out += st["bytesOutCounter"]
        for name, cur in list(t.ml.cursors.items()):
            if name in subs or is_system_cursor(name) or cur.deleted:
                continue
            md = cur.mark_delete_position
            subs[name] = {"msgRateOut": 0.0, "msgThroughputOut": 0.0,
                          "msgBacklog": t.ml.count_entries(md, t.ml.last_confirmed), "type": "None",
                          "unackedMessages": 0, "msgRateRedeliver": 0.0, "isDurable": True, "consumers": [],
                          "msgOutCounter": 0, "bytesOutCounter": 0, "markDeletePosition": _pos(md)}
        dedup = t.dedup
        return {
            "msgRateIn": r_in[0], "msgThroughputIn": r_in[1], "msgRateOut": r_out[0], "msgThroughputOut": r_out[1],
            "msgInCounter": t.msgs_in, "bytesInCounter": t.bytes_in,
            "msgOutCounter": msgs_out, "bytesOutCounter": bytes_out,
            "averageMsgSize": t.bytes_in / t.msgs_in if t.msgs_in else 0.0,
            "storageSize": t.ml.total_size(),
            "backlogSize": sum(s["msgBacklog"] for s in subs.values()),
            "publishers": publishers,
            "waitingPublishers": len(t._waiting_exclusive),
            "subscriptions": subs,
            "deduplicationStatus": dedup.status if dedup is not None else "Disabled",
            "deduplication": dedup.stats() if dedup is not None else None,
            "topicEpoch": t.topic_epoch,
            "ownerBroker": self.cfg.web_url.split("://", 1)[-1],
            "broker": self.cfg.name,
        }

    # -- internal stats ----------------------------------------------------------------
    async def internal_stats(self, topic: str) -> dict[str, Any]:
        """Pulsar's PersistentTopicInternalStats: this broker's in-memory view when it serves the
        topic, else ZooKeeper's; each ledger with its BookKeeper metadata (ensembles, state)."""
        loaded = self.service.topics.get(topic)
        ml = loaded.ml if loaded is not None else None
        if ml is None and self.service.ownership.owns(topic) and self.service.bk is not None:
            loaded = await self._loaded(topic)
            ml = loaded.ml
        extra: dict[str, Any] = {}
        if ml is not None:
            ledgers = [_ledger_json(i.to_json()) for i in ml.ledgers]
            lc = ml.last_confirmed
            cursors = {name: _cursor_json(c) for name, c in list(ml.cursors.items()) if not c.deleted}
            state = {"open": "LedgerOpened", "rolling": "CreatingLedger", "failed": "WriteFailed",
                     "fenced": "Fenced", "closed": "Closed"}.get(ml.state, "unknown")
            source = "memory"
            current = ledgers[-1] if ledgers else None
            view = getattr(loaded, "compacted", None)
            extra = {"compactedLedger": ({"ledgerId": view.ledger_id, "entries": len(view.entries),
                                          "size": view.size(), "offloaded": False,
                                          "horizon": _pos(view.horizon)} if view is not None else
                                         {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False}),
                     "pendingAddEntriesCount": len(loaded._adds),
                     "currentLedgerEntries": (lc.entry_id + 1 if lc is not None and current is not None
                                              and lc.ledger_id == current["ledgerId"] else 0),
                     "lastLedgerCreatedTimestamp": current["timestamp"] if current else 0}
        else:
            path = ml_path(ml_name(topic))
            store = self.service.store
            got = await _zk(store.get_or_none(path))
            if got is None:
                raise HttpError(404, f"topic {topic} has no managed ledger")
            raw = decode_json_object(got[0])
            ledgers = [_ledger_json(i) for i in raw.get("ledgers", []) if isinstance(i, dict)]
            cursors = {}
            for name in await _zk(store.children(path)):
                c = await _zk(store.get_or_none(f"{path}/{name}"))
                if c is not None:
                    cursors[name] = _cursor_znode_json(decode_json_object(c[0]))
            lc = None
            state = "not loaded on this broker"
            source = "zookeeper"
        await self._add_ledger_metadata(ledgers)
        known = [i for i in ledgers if i["entries"] is not None]
        return {
            "topic": topic, "broker": self.cfg.name, "source": source, "state": state,
            "lastConfirmedEntry": _pos(lc),
            "numberOfEntries": sum(i["entries"] for i in known) + extra.get("currentLedgerEntries", 0),
            "totalSize": sum(i["size"] for i in ledgers),
            "ledgers": ledgers, "cursors": cursors, **extra,
        }

    async def _add_ledger_metadata(self, ledgers: list[dict[str, Any]]) -> None:
        bk = self.service.bk
        for info in ledgers:
            md = None
            if bk is not None:
                try:
                    md = await asyncio.wait_for(bk.ledger_metadata(info["ledgerId"]), ZK_READ_TIMEOUT)
                except Exception as e:  # deleted, or ZooKeeper unreachable
                    info["metadata"] = None
                    info["metadataError"] = f"{type(e).__name__}: {e}"
                    continue
            info["metadata"] = _bk_metadata_json(md) if md is not None else None


# ----------------------------------------------------------------------------- helpers

_POLICY_FIELDS = {     # what -> (fields, required, accepted but not stored), for the object-valued ones
    "retention": (("retentionTimeInMinutes", "retentionSizeInMB"), (), ()),
    "persistence": (("bookkeeperEnsemble", "bookkeeperWriteQuorum", "bookkeeperAckQuorum"),
                    ("bookkeeperEnsemble", "bookkeeperWriteQuorum", "bookkeeperAckQuorum"),
                    ("managedLedgerMaxMarkDeleteRate",)),
}


async def _zk_long(coro: Any) -> Any:
    """A registry call (ZooKeeper and BookKeeper): 503 when they cannot be reached in time."""
    from clusters.broker.schema import SchemaError
    try:
        return await asyncio.wait_for(coro, FORWARD_TIMEOUT)
    except SchemaError as e:
        if e.kind == "storage":
            raise HttpError(503, str(e)) from None
        raise
    except HttpError:
        raise
    except Exception as e:
        raise HttpError(503, f"the schema storage is not reachable now: {type(e).__name__}: {e}") from None


def _schema_payload(body: Any) -> Any:
    """Pulsar's PostSchemaPayload {"type", "schema", "properties"} as SchemaData (400 when malformed)."""
    from clusters.broker.schema import TYPE_VALUES, SchemaData
    if not isinstance(body, dict):
        raise HttpError(400, "the schema payload must be a JSON object {\"type\", \"schema\", \"properties\"}")
    t = body.get("type")
    if not isinstance(t, str) or t.upper() not in TYPE_VALUES:
        raise HttpError(400, f"unknown schema type {json.dumps(t)[:40]}; one of {', '.join(sorted(TYPE_VALUES))}")
    data = body.get("schema", "")
    if not isinstance(data, str):
        raise HttpError(400, "schema must be a string (the schema definition)")
    props = body.get("properties") or {}
    if not isinstance(props, dict) or not all(isinstance(v, str) for v in props.values()):
        raise HttpError(400, "properties must be an object of strings")
    return SchemaData(t.upper(), data.encode(), dict(props))


def _policy_body(what: str, value: Any) -> Any:
    """The stored form of a namespace policy POST body, after the shape checks (400 naming the
    problem) that NamespacePolicies.from_json does not make: no null (to from_json, null means
    unset: DELETE removes a policy), and for an object, no unknown field and every required one.
    A retention field left out is 0. The values themselves are from_json's to judge (through
    PolicyCache.update)."""
    if value is None:
        raise HttpError(400, f"{what} must not be null; DELETE removes it")
    if what not in _POLICY_FIELDS:
        return value
    fields, required, ignored = _POLICY_FIELDS[what]
    if not isinstance(value, dict):
        raise HttpError(400, f"{what} must be a JSON object with {', '.join(fields)}, got {json.dumps(value)[:40]}")
    unknown = sorted(set(value) - set(fields) - set(ignored))
    if unknown:
        raise HttpError(400, f"unknown field {unknown[0]!r} in {what}; expected {', '.join(fields)}")
    missing = [f for f in required if f not in value]
    if missing:
        raise HttpError(400, f"{what} needs {', '.join(missing)}")
    nulls = [f for f in fields if f in value and value[f] is None]
    if nulls:
        raise HttpError(400, f"{nulls[0]} in {what} must not be null")
    return {f: value.get(f, 0) for f in fields}


def _pos(p: Position | None) -> str:
    """Pulsar's "ledger:entry" (Position.__str__); "-1:-1" for no position."""
    return str(p) if p is not None else "-1:-1"


def _ledger_json(i: dict[str, Any]) -> dict[str, Any]:
    return {"ledgerId": int(i["ledger_id"]), "entries": i.get("entries"), "size": int(i.get("size") or 0),
            "timestamp": i.get("timestamp", 0), "offloaded": False}


def _bk_metadata_json(md: Any) -> dict[str, Any]:
    return {"ensembles": {str(k): list(v) for k, v in sorted(md.ensembles.items())},
            "state": md.state, "lastEntryId": md.last_entry_id, "length": md.length,
            "ensembleSize": md.ensemble_size, "writeQuorumSize": md.write_quorum,
            "ackQuorumSize": md.ack_quorum}


def _ranges_str(ranges: Any) -> str:
    """Pulsar's rendering of individually deleted ranges: `[(3:4..3:6],(3:8..3:9]]` (open-closed)."""
    return "[" + ",".join(f"({_pos(a)}..{_pos(b)}]" for a, b in ranges) + "]"


def _cursor_json(c: Any) -> dict[str, Any]:
    try:
        ranges = c.individually_deleted_ranges()
    except Exception:  # noqa: BLE001 - the subscription's ranges; internal stats go on without them
        ranges = []
    md = c.mark_delete_position
    return {"markDeletePosition": _pos(md),
            "readPosition": _pos(Position(md.ledger_id, md.entry_id + 1)) if md is not None else "-1:-1",
            "individuallyDeletedMessages": _ranges_str(ranges),
            "totalNonContiguousDeletedMessagesRange": len(ranges),
            "cursorLedger": c.cursor_ledger_id,
            "state": c.state.capitalize()}


def _cursor_znode_json(raw: dict[str, Any]) -> dict[str, Any]:
    """A cursor znode (ManagedCursorInfo, as managed_ledger writes it) of a topic not loaded here."""
    try:
        md = _pos_from(raw.get("mark_delete"))
    except (IndexError, TypeError, ValueError):
        md = None
    ranges = []
    for r in raw.get("individual_deleted") or []:
        try:
            ranges.extend(_ranges_from([r]))
        except (IndexError, TypeError, ValueError):
            continue
    return {"markDeletePosition": _pos(md), "individuallyDeletedMessages": _ranges_str(ranges),
            "cursorLedger": raw.get("cursors_ledger_id", -1)}


def subscription_backlog(t: Any, sub: Any) -> int:
    """Entries not acknowledged: the unread ones plus those delivered and not acknowledged (Pulsar's
    msgBacklog counts entries, not the messages of a batch)."""
    ml = t.ml
    rp = sub.read_position
    after = sub.mark_delete if rp is None else Position(rp.ledger_id, rp.entry_id - 1)
    return ml.count_entries(after, ml.last_confirmed) + len(sub.outstanding)


def _subscription_stats(t: Any, name: str, sub: Any, rate: Any) -> dict[str, Any]:
    consumers = []
    sub_m = sub_b = 0
    for c in list(sub.consumers):
        cr = rate("consumer", t.name, name, c.name, c.consumer_id)
        consumers.append({
            "consumerName": c.name, "msgRateOut": cr[0], "msgThroughputOut": cr[1],
            "availablePermits": max(c.permits, 0),
            "unackedMessages": sum(c.pending.values()),
            "msgOutCounter": c.msgs_out, "bytesOutCounter": c.bytes_out,
            "redeliveredMessages": c.redelivered,
            "address": c.cnx.remote, "clientVersion": c.cnx.client_version,
            "connectedSince": c.connected_since,
        })
        sub_m += c.msgs_out
        sub_b += c.bytes_out
    sr = rate("sub", t.name, name)
    from clusters.broker.topic import SUB_TYPE_NAMES
    return {"msgRateOut": sr[0], "msgThroughputOut": sr[1],
            "msgBacklog": subscription_backlog(t, sub),
            "type": SUB_TYPE_NAMES.get(sub.sub_type, "?"),
            "unackedMessages": sum(c["unackedMessages"] for c in consumers),
            "msgRateRedeliver": 0.0, "isDurable": sub.durable,
            "msgDelayed": len(getattr(sub, "delayed", ())),
            "consumers": consumers, "msgOutCounter": sub_m, "bytesOutCounter": sub_b,
            "markDeletePosition": _pos(sub.mark_delete)}


async def serve_http(service: Any) -> AdminHttpServer:
    """Start the admin HTTP server of a BrokerService on its config's host:http_port."""
    return await AdminHttpServer(service).start()
