"""Topic compaction through the admin API and the official client: on demand and by threshold, the
latest value per key with tombstones applied, `is_read_compacted` readers and table views reading
the compacted ledger (also after the topic moved and after retention trimmed what was compacted),
the status endpoint.

References: https://pulsar.apache.org/docs/concepts-topic-compaction/ and cookbooks-compaction/
(readCompacted, tombstones, compactionThreshold), TwoPhaseCompactor and RawBatchConverter (the two
phases, batches), PersistentTopic.subscribe ("readCompacted only allowed on failover or exclusive
subscriptions"), https://pulsar.apache.org/admin-rest-api/ (PUT/GET .../compaction,
LongRunningProcessStatus).
"""
from __future__ import annotations

import time

import pulsar
import pytest

from tests.conformance.conftest import rest_path, wait_for


def _compact(admin, topic: str) -> None:
    path = f"/admin/v2/{rest_path(topic)}/compaction"
    status, body = admin.put(path)
    assert status == 204, (status, body)
    wait_for(lambda: admin.ok("GET", path)["status"] == "SUCCESS", 30, what="compaction to succeed")


def _read_all(client, topic: str, compacted: bool) -> list[tuple[str | None, bytes]]:
    r = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
    out = []
    while r.has_message_available():
        m = r.read_next(10000)
        out.append((m.partition_key() or None, m.data()))
    r.close()
    return out


def _publish(client, topic: str, rounds: int) -> dict[str, bytes]:
    """Keys k0..k9 `rounds` times (batched and unbatched producers alternating), a tombstone for k3,
    a message without a key; returns the latest value per key."""
    batched = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5)
    single = client.create_producer(topic, batching_enabled=False)
    latest = {}
    for r in range(rounds):
        p = batched if r % 2 == 0 else single
        for k in range(10):
            v = b"v%d-%d" % (k, r)
            p.send_async(v, None, partition_key=f"k{k}")
            latest[f"k{k}"] = v
        p.flush()
    single.send(b"", partition_key="k3")                      # a tombstone
    del latest["k3"]
    single.send(b"no key")
    batched.close()
    single.close()
    return latest


def test_compaction_keeps_the_last_value_per_key_with_tombstones(client, admin, topic):
    """On demand: the compacted view holds the latest value of each key once, the tombstoned key not
    at all, nothing without a key; a plain reader still sees every message; messages published after
    the compaction follow the compacted ones; status NOT_RUN, then SUCCESS."""
    path = f"/admin/v2/{rest_path(topic)}/compaction"
    latest = _publish(client, topic, 25)           # 252 entries or more: three ledgers of 100
    assert admin.ok("GET", path) == {"status": "NOT_RUN", "lastError": ""}
    _compact(admin, topic)
    got = _read_all(client, topic, compacted=True)
    assert dict(got) == latest and len(got) == len(latest), got
    assert len(_read_all(client, topic, compacted=False)) == 25 * 10 + 2
    p = client.create_producer(topic, batching_enabled=False)
    p.send(b"after", partition_key="k1")
    p.send(b"back", partition_key="k3")
    p.close()
    got = _read_all(client, topic, compacted=True)
    assert got[-2:] == [("k1", b"after"), ("k3", b"back")] and len(got) == len(latest) + 2, got
    stats = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/internalStats")
    assert stats["compactedLedger"]["entries"] > 0 and "__compaction" in stats["cursors"], stats
    # a second run compacts the previous view and the new messages
    _compact(admin, topic)
    got = dict(_read_all(client, topic, compacted=True))
    assert got == {**latest, "k1": b"after", "k3": b"back"}


def test_table_view_and_a_new_owner_read_the_compacted_ledger(client, admin, namespace):
    """A table view reads the compacted topic; after retention (0/0 here) trimmed the ledgers the
    compaction consumed (the `__compaction` cursor held them until then) and the topic was unloaded
    (its next owner loads the view from the compacted ledger), the compacted reader still gets every
    key's latest value."""
    topic = f"persistent://{namespace}/tv"
    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/retention",
             {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    latest = _publish(client, topic, 30)
    _compact(admin, topic)
    tv = client.create_table_view(topic)
    wait_for(lambda: len(tv) == len(latest), 20, what="the table view to load")
    assert {k: tv.get(k) for k in latest} == latest and tv.get("k3") is None
    tv.close()
    wait_for(lambda: len(admin.ok("GET", f"/admin/v2/{rest_path(topic)}/internalStats")["ledgers"]) == 1, 20,
             what="retention to trim the compacted ledgers")
    admin.ok("PUT", f"/admin/v2/{rest_path(topic)}/unload")
    assert len(_read_all(client, topic, compacted=False)) < 30 * 10
    assert dict(_read_all(client, topic, compacted=True)) == latest


def test_compaction_by_threshold(client, admin, namespace):
    """compactionThreshold: once the backlog after the compaction horizon exceeds it, the broker
    compacts on its own (the monitor runs every brokerServiceCompactionMonitorIntervalInSeconds)."""
    topic = f"persistent://{namespace}/thr"
    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/compactionThreshold", 2000)
    assert admin.ok("GET", f"/admin/v2/namespaces/{namespace}/compactionThreshold") == 2000
    p = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        p.send(b"x" * 10, partition_key="a")            # well under 2000 bytes
    time.sleep(2.5)                                     # a monitor cycle (every 2 s here) passes
    assert admin.ok("GET", f"/admin/v2/{rest_path(topic)}/compaction")["status"] == "NOT_RUN"
    for i in range(40):
        p.send(b"y%d" % i + b"y" * 100, partition_key=f"k{i % 4}")
    p.close()
    wait_for(lambda: admin.ok("GET", f"/admin/v2/{rest_path(topic)}/compaction")["status"] == "SUCCESS", 20,
             what="a compaction by threshold")
    # (a run may have started mid-way: what came after its horizon is read as it is, so the count of
    # messages is not fixed, the latest value of each key is)
    got = _read_all(client, topic, compacted=True)
    assert dict(got) == {"a": b"x" * 10, **{f"k{i}": b"y%d" % (36 + i) + b"y" * 100 for i in range(4)}}
    assert len(got) < 50


def test_read_compacted_is_refused_on_shared_subscriptions(client, topic):
    with pytest.raises(pulsar.PulsarException):
        client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, is_read_compacted=True)
    client.subscribe(topic, "f", consumer_type=pulsar.ConsumerType.Failover, is_read_compacted=True).close()
