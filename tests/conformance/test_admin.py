"""The brokers' admin HTTP API (Pulsar's /admin/v2 and /lookup/v2 paths), through HTTP only.

A table sends a bad request to every endpoint (unknown topic, bad JSON, wrong type, wrong method,
unknown path) and checks the 4xx status and that the JSON error body names the problem; the other
tests exercise each endpoint's positive answer against the cluster's real state.
Reference: https://pulsar.apache.org/admin-rest-api/ (paths and bodies)."""
from __future__ import annotations

import time
import uuid

import pulsar
import pytest

from clusters import metrics
from tests.conformance.conftest import owner_of, rest_path, wait_for
from tests.netns import pulsar_client

BAD_NS = "public/no-such-ns-for-admin-tests"
MISSING = f"persistent/{BAD_NS}/missing-topic"


@pytest.fixture(scope="module")
def existing(cluster):
    """A topic with a message (so it exists) and a namespace, shared by the bad-request table."""
    ns = f"public/adm-{uuid.uuid4().hex[:6]}"
    topic = f"persistent://{ns}/exists"
    with pulsar_client(cluster.service_url) as c:
        p = c.create_producer(topic)
        p.send(b"x")
        p.close()
    return ns, topic


# (method, path template, body: JSON value | bytes (raw) | None, status, words the reason must contain)
# {ns} is an existing namespace, {t} an existing topic's rest path.
BAD_REQUESTS = [
    ("POST", "/metrics", None, 405, ["POST", "not allowed"]),
    ("POST", "/admin/v2/brokers/health", None, 405, ["not allowed"]),
    ("DELETE", "/admin/v2/brokers/ready", None, 405, ["not allowed"]),
    ("GET", "/admin/v2/brokers/no-such-cluster", None, 404, ["unknown cluster", "no-such-cluster"]),
    ("GET", "/admin/v2/brokers/standalone/10.9.9.9:1/ownedNamespaces", None, 404, ["10.9.9.9:1", "not a live broker"]),
    ("GET", "/admin/v2/brokers/standalone/x/nope", None, 404, ["no such resource"]),
    ("GET", "/lookup/v2/topic/persistent/public//x", None, 400, ["expected"]),
    ("GET", "/lookup/v2/topic/no-such-domain/public/default/x", None, 404, ["unknown topic domain"]),
    ("GET", "/lookup/v2/topic/persistent/bad%20tenant/default/x", None, 400, ["invalid tenant"]),
    ("POST", "/lookup/v2/topic/persistent/public/default/x", None, 405, ["not allowed"]),
    ("DELETE", "/lookup/v2/topic/persistent/public/default/x/bundle", None, 405, ["not allowed"]),
    ("GET", "/admin/v2/persistent/public/bad%21ns", None, 400, ["invalid namespace"]),
    ("DELETE", "/admin/v2/persistent/{ns}", None, 405, ["not allowed"]),
    ("GET", "/admin/v2/{t}", None, 405, ["not allowed", "PUT"]),
    ("PUT", "/admin/v2/{t}", None, 409, ["already exists"]),
    ("GET", "/admin/v2/{t}/no-such-action", None, 404, ["no such topic resource", "no-such-action"]),
    ("PUT", "/admin/v2/persistent/{ns}/p1/partitions", b"{not json", 400, ["malformed JSON"]),
    ("PUT", "/admin/v2/persistent/{ns}/p2/partitions", b"", 400, ["JSON body"]),
    ("PUT", "/admin/v2/persistent/{ns}/p3/partitions", "4", 400, ["integer", '"4"']),
    ("PUT", "/admin/v2/persistent/{ns}/p4/partitions", 0, 400, ["more than 0"]),
    ("PUT", "/admin/v2/persistent/{ns}/p5/partitions", -3, 400, ["more than 0"]),
    ("PUT", "/admin/v2/persistent/{ns}/p6/partitions", True, 400, ["integer"]),
    ("PUT", "/admin/v2/{t}/partitions", 2, 409, ["already exists", "non-partitioned"]),
    ("POST", f"/admin/v2/{MISSING}/partitions", 4, 404, ["does not exist"]),
    ("DELETE", f"/admin/v2/{MISSING}/partitions", None, 404, ["does not exist"]),
    ("GET", f"/admin/v2/{MISSING}/stats", None, 404, ["missing-topic", "not found"]),
    ("POST", "/admin/v2/{t}/stats", None, 405, ["not allowed"]),
    ("GET", f"/admin/v2/{MISSING}/internalStats", None, 404, ["missing-topic", "not found"]),
    ("GET", f"/admin/v2/{MISSING}/partitioned-stats", None, 404, ["missing-topic", "not found"]),
    ("GET", "/admin/v2/{t}/partitioned-stats", None, 404, ["Partitioned topic", "not found"]),
    ("PUT", f"/admin/v2/{MISSING}/unload", None, 404, ["missing-topic", "not found"]),
    ("GET", "/admin/v2/{t}/unload", None, 405, ["not allowed", "PUT"]),
    ("GET", f"/admin/v2/{MISSING}/deduplicationEnabled", None, 404, ["not found"]),
    ("POST", "/admin/v2/{t}/deduplicationEnabled", "yes", 400, ["true or false"]),
    ("POST", "/admin/v2/{t}/deduplicationEnabled", b"tru", 400, ["malformed JSON"]),
    ("PUT", "/admin/v2/{t}/deduplicationEnabled", True, 405, ["not allowed"]),
    ("GET", "/admin/v2/namespaces/bad%20tenant", None, 400, ["invalid tenant"]),
    ("DELETE", "/admin/v2/namespaces/{ns}", None, 405, ["not allowed"]),
    ("POST", "/admin/v2/namespaces/{ns}/policies", None, 405, ["not allowed"]),
    ("DELETE", "/admin/v2/namespaces/{ns}/topics", None, 405, ["not allowed"]),
    ("PUT", "/admin/v2/namespaces/{ns}/bundles", None, 405, ["not allowed"]),
    ("GET", "/admin/v2/namespaces/{ns}/0xzz_0x12", None, 400, ["malformed bundle"]),
    ("GET", "/admin/v2/namespaces/{ns}/0x00000000_0x00000001", None, 404, ["no bundle", "its bundles are"]),
    ("GET", "/admin/v2/namespaces/{ns}/0x00000000_0x40000000/unload", None, 405, ["not allowed"]),
    ("PUT", "/admin/v2/namespaces/{ns}/0x0_0x1/unload", None, 400, ["malformed bundle"]),
    ("GET", "/admin/v2/namespaces/{ns}/unload", None, 405, ["not allowed"]),
    ("GET", "/admin/v2/namespaces/{ns}/no-such-thing", None, 404, ["no such namespace resource"]),
    ("POST", "/admin/v2/namespaces/{ns}/retention", b"{", 400, ["malformed JSON"]),
    ("POST", "/admin/v2/namespaces/{ns}/retention", "10", 400, ["JSON object"]),
    ("POST", "/admin/v2/namespaces/{ns}/retention", {"retentionTimeInMinutes": "10"}, 400,
     ["retentionTimeInMinutes", "integer"]),
    ("POST", "/admin/v2/namespaces/{ns}/retention", {"retentionTimeInMinutes": -2}, 400, [">= -1"]),
    ("POST", "/admin/v2/namespaces/{ns}/retention", {"retentionMinutes": 5}, 400, ["unknown field", "retentionMinutes"]),
    ("PUT", "/admin/v2/namespaces/{ns}/retention", {}, 405, ["not allowed"]),
    ("POST", "/admin/v2/namespaces/{ns}/messageTTL", "abc", 400, ["messageTTL", "integer"]),
    ("POST", "/admin/v2/namespaces/{ns}/messageTTL", -1, 400, [">= 0"]),
    ("POST", "/admin/v2/namespaces/{ns}/messageTTL", b"", 400, ["JSON body"]),
    ("POST", "/admin/v2/namespaces/{ns}/deduplication", 1, 400, ["true or false"]),
    ("POST", "/admin/v2/namespaces/{ns}/deduplication", b"maybe", 400, ["malformed JSON"]),
    ("POST", "/admin/v2/namespaces/{ns}/persistence",
     {"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 2}, 400,
     ["bookkeeperEnsemble >= bookkeeperWriteQuorum", "2/3/2"]),
    ("POST", "/admin/v2/namespaces/{ns}/persistence", {"bookkeeperEnsemble": 3}, 400,
     ["needs", "bookkeeperWriteQuorum"]),
    ("POST", "/admin/v2/namespaces/{ns}/persistence",
     {"bookkeeperEnsemble": "3", "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2}, 400,
     ["bookkeeperEnsemble", "integer"]),
    ("POST", "/admin/v2/namespaces/{ns}/persistence", [3, 2, 2], 400, ["JSON object"]),
    ("GET", "/admin/v2/no-such-api", None, 404, ["no such resource"]),
    ("GET", "/admin/v3/persistent/public/default/x/stats", None, 404, ["no such resource"]),
    ("PATCH", "/admin/v2/namespaces/{ns}/retention", {}, 405, ["PATCH", "not allowed"]),
]


@pytest.mark.parametrize("method,path,body,status,words", BAD_REQUESTS,
                         ids=[f"{m} {p}" for m, p, *_ in BAD_REQUESTS])
def test_every_endpoint_answers_a_bad_request_with_4xx_naming_the_problem(admin, existing, method, path,
                                                                            body, status, words):
    """Pulsar's admin API answers client errors with 4xx and a JSON body {"reason": ...}
    (https://pulsar.apache.org/admin-rest-api/; RestException)."""
    ns, topic = existing
    path = path.replace("{ns}", ns).replace("{t}", rest_path(topic))
    kw = {"raw": body} if isinstance(body, bytes) else {"body": body}
    for broker in (0, 1):                   # the owner and a broker that forwards
        got_status, got = admin.call(method, path, broker=broker, **kw)
        assert got_status == status, (broker, got_status, got)
        assert isinstance(got, dict) and isinstance(got.get("reason"), str), got
        for w in words:
            assert w in got["reason"], (w, got["reason"])


def test_health_ready_brokers_and_metrics(admin, client, topic, cluster):
    """/admin/v2/brokers/health, /ready, /admin/v2/brokers/{cluster} (active brokers) and /metrics
    (Prometheus text: https://pulsar.apache.org/docs/reference-metrics/)."""
    assert admin.ok("GET", "/admin/v2/brokers/health") == "ok"
    assert admin.ok("GET", "/admin/v2/brokers/ready", broker=1) == "ok"
    expected = sorted(u.split("://", 1)[1] for u in cluster.admin_urls)
    assert admin.ok("GET", "/admin/v2/brokers/standalone") == expected
    p = client.create_producer(topic)
    for _ in range(5):
        p.send(b"m")
    owner = owner_of(admin, topic)
    idx = [n.name for n in cluster.nodes("broker")].index(owner)
    status, text = admin.get("/metrics", broker=idx)
    assert status == 200 and isinstance(text, str)
    samples = metrics.parse(text)
    ns, local = topic.split("://", 1)[1].rsplit("/", 1)
    key = f'pulsar_in_messages_total{{cluster="standalone",namespace="{ns}",topic="{topic}"}}'
    assert samples[key] == 5
    assert samples[f'pulsar_producers_count{{cluster="standalone",namespace="{ns}",topic="{topic}"}}'] == 1
    assert samples['pulsar_broker_topics_count{cluster="standalone"}'] >= 1
    p.close()


def test_topic_stats_publishers_subscriptions_backlog_and_rates(admin, client, topic):
    """GET /admin/v2/persistent/{t}/{ns}/{topic}/stats (TopicStats: rates, publishers,
    subscriptions with msgBacklog/type/consumers/unackedMessages, storageSize), from any broker."""
    consumer = client.subscribe(topic, "sub-a", consumer_type=pulsar.ConsumerType.Shared,
                                receiver_queue_size=5)
    idle = client.subscribe(topic, "sub-idle")
    idle.close()                       # a durable subscription with no consumer: all backlog
    producer = client.create_producer(topic, producer_name="stats-prod", batching_enabled=False)
    for i in range(30):
        producer.send(f"m{i}".encode())
    for _ in range(10):
        consumer.acknowledge(consumer.receive(5000))
    held = consumer.receive(5000)      # received, not acknowledged

    def stats(broker: int) -> dict:
        return admin.ok("GET", f"/admin/v2/{rest_path(topic)}/stats", broker=broker)
    st = wait_for(lambda: (lambda s: s if s["subscriptions"]["sub-a"]["msgBacklog"] == 20 else None)(stats(0)),
                  timeout=20, what="the backlog to settle")
    assert stats(1)["broker"] == st["broker"] == owner_of(admin, topic)
    assert st["msgInCounter"] == 30 and st["bytesInCounter"] > 0 and st["storageSize"] > 0
    [pub] = st["publishers"]
    assert pub["producerName"] == "stats-prod" and pub["accessMode"] == "Shared" and pub["msgInCounter"] == 30
    a = st["subscriptions"]["sub-a"]
    assert a["type"] == "Shared" and a["isDurable"] and len(a["consumers"]) == 1
    assert a["msgBacklog"] == 20           # 30 - 10 acknowledged; `held` and the queued ones count
    assert a["unackedMessages"] >= 1 and a["consumers"][0]["unackedMessages"] == a["unackedMessages"]
    assert st["subscriptions"]["sub-idle"]["msgBacklog"] == 30
    assert st["subscriptions"]["sub-idle"]["consumers"] == []
    assert st["deduplicationStatus"] == "Disabled"
    consumer.acknowledge(held)
    # rates are recomputed every few seconds (Pulsar: statsUpdateFrequencyInSecs)
    deadline = time.monotonic() + 20
    rate = pub_rate = 0.0
    while time.monotonic() < deadline and (rate <= 0 or pub_rate <= 0):
        for i in range(20):
            producer.send(b"r")
        time.sleep(0.5)
        st = stats(0)           # the topic's and the publisher's rates from one answer
        rate, pub_rate = st["msgRateIn"], st["publishers"][0]["msgRateIn"]
    assert rate > 0 and pub_rate > 0
    producer.close()
    consumer.close()


def test_internal_stats_ledgers_with_ensembles_and_cursors(admin, client, topic, cluster):
    """GET .../internalStats (PersistentTopicInternalStats): the managed ledger's ledgers with their
    BookKeeper metadata (ensembles by first entry, state, last entry), cursors with
    markDeletePosition and individuallyDeletedMessages. The harness resolves "the bookies of this
    topic's open ledger" from it."""
    consumer = client.subscribe(topic, "c", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(150)]     # 100 entries per ledger: 2 ledgers
    msgs = [consumer.receive(5000) for _ in range(150)]
    consumer.acknowledge_cumulative(msgs[49])      # the first ledger stays (it is not fully consumed)
    bookies = {f"{n.host}:{n.ports['bookie']}" for n in cluster.nodes("bookie")}
    st = wait_for(lambda: (lambda s: s if s["cursors"]["c"]["markDeletePosition"] == f"{ids[49].ledger_id()}:"
                                          f"{ids[49].entry_id()}" else None)(
        admin.ok("GET", f"/admin/v2/{rest_path(topic)}/internalStats", broker=1)),
        timeout=20, what="the mark-delete position")
    assert st["source"] == "memory" and st["state"] == "LedgerOpened"
    ledgers = st["ledgers"]
    assert [l["ledgerId"] for l in ledgers][:2] == [ids[0].ledger_id(), ids[100].ledger_id()]
    first = ledgers[0]
    assert first["entries"] == 100 and first["metadata"]["state"] == "CLOSED"
    assert first["metadata"]["lastEntryId"] == 99
    current = ledgers[-1]
    assert current["entries"] is None and current["metadata"]["state"] == "OPEN"
    for l in ledgers:
        md = l["metadata"]
        assert (md["ensembleSize"], md["writeQuorumSize"], md["ackQuorumSize"]) == (3, 2, 2)
        assert "0" in md["ensembles"] and all(len(e) == 3 for e in md["ensembles"].values())
        assert all(set(e) <= bookies for e in md["ensembles"].values())
    assert st["lastConfirmedEntry"] == f"{ids[149].ledger_id()}:{ids[149].entry_id()}"
    assert st["numberOfEntries"] == 150
    assert st["cursors"]["c"]["individuallyDeletedMessages"].startswith("[")
    producer.close()
    consumer.close()


def test_create_topic_partitions_and_partitioned_topic_lifecycle(admin, namespace):
    """PUT /admin/v2/persistent/{t}/{ns}/{topic} (createNonPartitionedTopic), PUT/GET/POST/DELETE
    .../partitions (createPartitionedTopic, getPartitionedMetadata, updatePartitionedTopic,
    deletePartitionedTopic) and the namespace's topic lists."""
    plain = f"persistent://{namespace}/plain"
    assert admin.call("PUT", f"/admin/v2/{rest_path(plain)}")[0] == 204
    assert admin.call("PUT", f"/admin/v2/{rest_path(plain)}", broker=1)[0] == 409
    assert admin.ok("GET", f"/admin/v2/{rest_path(plain)}/partitions") == {"partitions": 0}
    part = f"persistent://{namespace}/parted"
    assert admin.put(f"/admin/v2/{rest_path(part)}/partitions", 2)[0] == 204
    status, body = admin.put(f"/admin/v2/{rest_path(part)}/partitions", 2, broker=1)
    assert status == 409 and "already exists" in body["reason"]
    assert admin.call("POST", f"/admin/v2/{rest_path(part)}/partitions", 3)[0] == 204
    assert admin.ok("GET", f"/admin/v2/{rest_path(part)}/partitions", broker=1) == {"partitions": 3}
    status, body = admin.call("POST", f"/admin/v2/{rest_path(part)}/partitions", 2)
    assert status == 409 and "only be increased" in body["reason"]
    assert admin.ok("GET", f"/admin/v2/persistent/{namespace}/partitioned") == [part]
    assert admin.ok("GET", f"/admin/v2/namespaces/{namespace}/topics") == sorted(
        [plain] + [f"{part}-partition-{i}" for i in range(3)])
    assert admin.ok("GET", f"/admin/v2/{rest_path(part)}-partition-1/stats")["msgInCounter"] == 0
    assert admin.call("DELETE", f"/admin/v2/{rest_path(part)}/partitions")[0] == 204
    assert admin.ok("GET", f"/admin/v2/{rest_path(part)}/partitions") == {"partitions": 0}


def test_namespace_policies_set_read_and_removed(admin, namespace):
    """Namespace policies (https://pulsar.apache.org/admin-rest-api/#tag/namespaces): retention,
    messageTTL, deduplication, persistence set with POST, read back (the namespace's own setting;
    .../policies gives the effective values) and removed with DELETE."""
    base = f"/admin/v2/namespaces/{namespace}"
    assert admin.call("PUT", base)[0] == 204
    assert admin.call("PUT", base)[0] == 409
    assert namespace in admin.ok("GET", f"/admin/v2/namespaces/{namespace.split('/')[0]}")
    settings = {
        "retention": {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
        "messageTTL": 120,
        "deduplication": True,
        "persistence": {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 2},
    }
    for what, value in settings.items():
        assert admin.call("GET", f"{base}/{what}")[1] is None
        assert admin.call("POST", f"{base}/{what}", value, broker=1)[0] == 204
        assert admin.ok("GET", f"{base}/{what}") == value
    pol = admin.ok("GET", f"{base}/policies")
    assert pol["retention_policies"] == settings["retention"]
    assert pol["message_ttl_in_seconds"] == 120 and pol["deduplicationEnabled"] is True
    assert pol["persistence"] == settings["persistence"]
    assert pol["bundles"]["numBundles"] == 4 and len(pol["bundles"]["boundaries"]) == 5
    assert admin.ok("GET", base) == pol
    for what in settings:
        assert admin.call("DELETE", f"{base}/{what}")[0] == 204
        assert admin.call("GET", f"{base}/{what}", broker=1)[1] is None
    pol = admin.ok("GET", f"{base}/policies")
    assert pol["deduplicationEnabled"] is False and pol["message_ttl_in_seconds"] == 0
    assert pol["persistence"] == {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2}


def test_topic_level_deduplication_override(admin, client, namespace):
    """Topic policy deduplicationEnabled (POST/GET/DELETE /admin/v2/persistent/{t}/{ns}/{topic}/
    deduplicationEnabled) overrides the namespace's; the owner applies it to the loaded topic."""
    topic = f"persistent://{namespace}/topic-dedup"
    p = client.create_producer(topic, producer_name="td")
    p.send(b"0")
    path = f"/admin/v2/{rest_path(topic)}"
    assert admin.ok("GET", f"{path}/deduplicationEnabled") is None
    assert admin.call("POST", f"{path}/deduplicationEnabled", True, broker=1)[0] == 204
    # written through broker 1, read through broker 0: its policy cache follows the znode's watch
    wait_for(lambda: admin.ok("GET", f"{path}/deduplicationEnabled") is True, timeout=10,
             what="the topic policy seen through the other broker")
    wait_for(lambda: admin.ok("GET", f"{path}/stats")["deduplicationStatus"] == "Enabled",
             timeout=20, what="deduplication to be enabled on the owner")
    p.send(b"1")
    p.close()
    p2 = client.create_producer(topic, producer_name="td")
    assert p2.last_sequence_id() == 1
    assert p2.send(b"1", sequence_id=1).ledger_id() == -1
    assert admin.call("DELETE", f"{path}/deduplicationEnabled")[0] == 204
    wait_for(lambda: admin.ok("GET", f"{path}/stats")["deduplicationStatus"] == "Disabled",
             timeout=20, what="deduplication to be disabled on the owner")
    assert admin.ok("GET", f"{path}/internalStats")["cursors"].get("pulsar.dedup") is None
    p2.close()


def test_bundles_owners_and_unloading(admin, client, namespace, cluster):
    """Bundles (GET /admin/v2/namespaces/{t}/{ns}/bundles, a bundle's owner and topics, the topic's
    bundle from /lookup/v2/topic/.../bundle), a broker's owned bundles
    (GET /admin/v2/brokers/{cluster}/{broker}/ownedNamespaces), and unloading a topic
    (PUT .../{topic}/unload) and a bundle (PUT /admin/v2/namespaces/{t}/{ns}/{bundle}/unload): the
    clients reconnect and keep working."""
    topic = f"persistent://{namespace}/bundled"
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, "s")
    producer.send(b"before")

    seen: list[bytes] = []

    def received(timeout_ms: int) -> bytes:
        """The next new message (an unload may redeliver what was acknowledged just before it, as
        acknowledgements are sent asynchronously: at-least-once)."""
        while True:
            m = consumer.receive(timeout_ms)
            consumer.acknowledge(m)
            if m.data() not in seen:
                seen.append(m.data())
                return m.data()
    assert received(5000) == b"before"
    owner = owner_of(admin, topic)
    node = next(n for n in cluster.nodes("broker") if n.name == owner)
    web = cluster.admin_urls[[n.name for n in cluster.nodes("broker")].index(owner)].split("://", 1)[1]
    bundle = admin.ok("GET", f"/lookup/v2/topic/{rest_path(topic)}/bundle")
    bundles = admin.ok("GET", f"/admin/v2/namespaces/{namespace}/bundles")
    assert bundles["numBundles"] == 4 and bundles["boundaries"][0] == "0x00000000"
    assert bundles["boundaries"][-1] == "0xffffffff"
    assert bundles["owners"][bundle].split(":")[0] == node.host
    info = admin.ok("GET", f"/admin/v2/namespaces/{namespace}/{bundle}", broker=1)
    assert topic in info["topics"] and info["brokerName"] == owner
    for b in (0, 1):
        owned = admin.ok("GET", f"/admin/v2/brokers/standalone/{web}/ownedNamespaces", broker=b)
        assert f"{namespace}/{bundle}" in owned and owned[f"{namespace}/{bundle}"]["is_active"] is True

    # unload the topic (asked of either broker): the clients reconnect
    for b in (0, 1):
        assert admin.call("PUT", f"/admin/v2/{rest_path(topic)}/unload", broker=b)[0] == 204
        producer.send(f"after-topic-unload-{b}".encode())
        assert received(15000) == f"after-topic-unload-{b}".encode()

    # unload the bundle: nobody owns it, then the next lookup assigns it again
    assert admin.call("PUT", f"/admin/v2/namespaces/{namespace}/{bundle}/unload", broker=1)[0] == 204
    producer.send(b"after-bundle-unload")
    assert received(20000) == b"after-bundle-unload"
    assert admin.ok("GET", f"/admin/v2/namespaces/{namespace}/bundles")["owners"][bundle] is not None
    assert admin.call("PUT", f"/admin/v2/namespaces/{namespace}/unload")[0] == 204
    producer.send(b"after-namespace-unload")
    assert received(20000) == b"after-namespace-unload"
    producer.close()
    consumer.close()
