"""Broker-side message deduplication across a broker crash, through the official client.

Each test: a producer with a fixed name sends messages numbered 0.. (message i has sequence id i),
the owner broker is killed with SIGKILL mid-stream, the client reconnects to the other broker (the
new owner, which rebuilt the deduplication state from the snapshot and the entries after it) and
resends what was not acknowledged; then a second session with the same producer name resends the
last RESEND messages with their original sequence ids, as a client that lost its acknowledgements
would. A Reader from the earliest message reads the topic back.

With deduplication on, no message is in the topic twice and every resend is acknowledged with the
message id (-1, -1). With it off, the explicit resends are written again, so duplicates appear.

The client's own resends after the crash only duplicate messages the old owner persisted but had
not acknowledged when it died, which depends on timing; so with deduplication on, the second
session runs after a second crash (of the new owner, with nothing in flight): the broker that loads
the topic then knows the producer's last sequence id only from the snapshot and the entries after
it, which makes the check deterministic (a broker that skipped the replay fails it).
"""
from __future__ import annotations

import threading
import time

import pulsar

from tests.conformance.conftest import owner_of, rest_path, restarted, wait_for  # noqa: F401

BEFORE = 1200           # sent and acknowledged before the kill (the broker snapshots every 1000 entries)
DURING = 2500           # sent while the owner is killed
RESEND = 50             # re-sent by a second session with explicit sequence ids
NAME = "dedup-producer"


def _payload(i: int) -> bytes:
    return f"m-{i}".encode()


def _keep_everything(admin, namespace: str) -> None:
    """Infinite retention: the topic has no subscription, and without retention Pulsar deletes
    the ledgers nobody needs (https://pulsar.apache.org/docs/cookbooks-retention-expiry/)."""
    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/retention",
             {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})


def _read_all(client, topic: str, expect_at_least: int) -> list[int]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got: list[int] = []
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            try:
                msg = reader.read_next(3000)
            except pulsar.Timeout:
                if len(got) >= expect_at_least:
                    break
                continue
            got.append(int(msg.data().decode().split("-", 1)[1]))
    finally:
        reader.close()
    return got


def _owner_asking(admin, topic: str, avoid: str) -> str:
    """owner_of, asked of a broker other than `avoid` (which is down)."""
    names = [n.name for n in admin.cluster.nodes("broker")]
    idx = next(i for i, n in enumerate(names) if n != avoid)
    got = admin.ok("GET", f"/lookup/v2/topic/{rest_path(topic)}", broker=idx)
    host = got["brokerUrl"].split("://", 1)[1].rsplit(":", 1)[0]
    return next(n.name for n in admin.cluster.nodes("broker") if n.host == host)


def _produce_through_a_crash(client, cluster, admin, topic: str) -> tuple[str, str, list, int]:
    """Send BEFORE + DURING messages, killing the owner after the first ones of DURING. Returns the
    old owner, the new owner, the send results (message ids or exceptions) and the producer's
    last sequence id."""
    producer = client.create_producer(topic, producer_name=NAME, batching_enabled=False,
                                      send_timeout_millis=0, block_if_queue_full=True,
                                      max_pending_messages=DURING + 100)
    for i in range(BEFORE):
        producer.send_async(_payload(i), None)
    producer.flush()
    old = owner_of(admin, topic)
    results: dict[int, object] = {}
    lock = threading.Lock()

    def callback(i: int):
        def done(res, msg_id):
            with lock:
                results[i] = msg_id if res == pulsar.Result.Ok else res
        return done

    def sender():
        for i in range(BEFORE, BEFORE + DURING):
            producer.send_async(_payload(i), callback(i))
            if i % 25 == 0:
                time.sleep(0.01)            # ~2500 messages/s: the kill lands mid-stream

    th = threading.Thread(target=sender)
    th.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    with restarted(cluster, old):
        th.join(60)
        wait_for(lambda: len(results) == DURING, timeout=120, what="every send to complete after the crash")
        print(f"all sends completed {time.monotonic() - t0:.1f}s after the kill of {old}")
        new = _owner_asking(admin, topic, avoid=old)
    last = producer.last_sequence_id()
    producer.close()
    return old, new, [results[i] for i in range(BEFORE, BEFORE + DURING)], last


def _resend_last(client, topic: str, total: int) -> tuple[int, list]:
    """A second session under the same name resends the last RESEND messages with their ids."""
    p2 = client.create_producer(topic, producer_name=NAME, batching_enabled=False)
    try:
        resumed = p2.last_sequence_id()
        ids = [p2.send(_payload(i), sequence_id=i) for i in range(total - RESEND, total)]
    finally:
        p2.close()
    return resumed, ids


def test_with_deduplication_a_producer_resending_after_a_broker_kill_leaves_no_duplicates(
        client, cluster, admin, namespace):
    """https://pulsar.apache.org/docs/cookbooks-deduplication/ and
    https://pulsar.apache.org/docs/concepts-messaging/#message-deduplication: with deduplication
    enabled (namespace policy), a message whose sequence id the broker already persisted for that
    producer name is not stored again; the state survives a change of owner (MessageDeduplication
    snapshots it in the `pulsar.dedup` cursor and replays the entries after it on topic load), and
    PRODUCER_SUCCESS.last_sequence_id lets a producer resume (PulsarApi.proto).
    The duplicate is acknowledged with message id (-1, -1) (PersistentTopic.publishMessage)."""
    admin.ok("PUT", f"/admin/v2/namespaces/{namespace}")
    _keep_everything(admin, namespace)
    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/deduplication", True)
    assert admin.ok("GET", f"/admin/v2/namespaces/{namespace}/deduplication") is True
    topic = f"persistent://{namespace}/dedup-on"
    total = BEFORE + DURING
    old, new, results, last = _produce_through_a_crash(client, cluster, admin, topic)
    assert old != new, "the topic did not move to the other broker"
    assert all(not isinstance(r, pulsar.Result) for r in results), \
        f"sends failed: {[r for r in results if isinstance(r, pulsar.Result)][:5]}"
    assert last == total - 1

    stats = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/stats")
    assert stats["deduplicationStatus"] == "Enabled", stats["deduplication"]
    assert stats["broker"] == new

    with restarted(cluster, new):          # the topic moves back to `old`, which replays the log
        resumed, ids = _resend_last(client, topic, total)
        third = _owner_asking(admin, topic, avoid=new)
        names = [n.name for n in cluster.nodes("broker")]
        stats = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/stats", broker=names.index(third))
    assert third == old
    assert stats["deduplication"]["replayedEntries"] > 0 and stats["deduplication"]["snapshotPosition"]
    assert resumed == total - 1, "PRODUCER_SUCCESS.last_sequence_id did not carry the persisted state"
    assert [(m.ledger_id(), m.entry_id()) for m in ids] == [(-1, -1)] * RESEND

    got = _read_all(client, topic, total)
    counts: dict[int, int] = {}
    for v in got:
        counts[v] = counts.get(v, 0) + 1
    dups = sorted(v for v, n in counts.items() if n > 1)
    assert dups == [], f"{len(dups)} values stored more than once, e.g. {dups[:10]}"
    assert sorted(counts) == list(range(total)), "acknowledged messages missing from the topic"
    assert got == sorted(got), "a producer's messages are out of order in the topic"


def test_without_deduplication_resends_after_a_broker_kill_are_stored_twice(client, cluster, admin, namespace):
    """https://pulsar.apache.org/docs/concepts-messaging/#message-deduplication: deduplication is
    off by default (brokerDeduplicationEnabled=false), and then a resent message is stored again
    (at-least-once): the resends of the second session get real message ids and the topic holds
    those messages twice."""
    topic = f"persistent://{namespace}/dedup-off"
    _keep_everything(admin, namespace)
    assert admin.ok("GET", f"/admin/v2/namespaces/{namespace}/deduplication") is None
    total = BEFORE + DURING
    old, new, results, last = _produce_through_a_crash(client, cluster, admin, topic)
    assert old != new
    assert all(not isinstance(r, pulsar.Result) for r in results)
    stats = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/stats")
    assert stats["deduplicationStatus"] == "Disabled"

    resumed, ids = _resend_last(client, topic, total)
    assert resumed == -1
    assert all(m.ledger_id() >= 0 and m.entry_id() >= 0 for m in ids)

    got = _read_all(client, topic, total + RESEND)
    counts: dict[int, int] = {}
    for v in got:
        counts[v] = counts.get(v, 0) + 1
    assert sorted(counts) == list(range(total))
    resent_twice = [v for v in range(total - RESEND, total) if counts[v] >= 2]
    assert resent_twice == list(range(total - RESEND, total)), "the resent messages were not stored again"
    natural = sorted(v for v, n in counts.items() if n > 1 and v < total - RESEND)
    print(f"duplicates from the client's own resends after the crash: {len(natural)}")
