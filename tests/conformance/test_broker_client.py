"""The broker's own asyncio client (clusters/protocol/client.py) against the shared cluster, as a
Pulsar broker uses its PulsarClient for system topics (the extensible load manager's
loadbalancer-service-unit-state and loadbalancer-broker-load-data topics): keyed writes read back by
the official client and by our reader in order; our reader and producer follow the topic to its new
owner after an admin unload of its bundle (Pulsar's ConsumerImpl/ProducerImpl reconnection: lookup
again, resubscribe from the last message received, resend what was not acknowledged); a
non-persistent topic through our client."""
from __future__ import annotations

import asyncio
import logging
import uuid

import pulsar

from clusters.protocol.client import PulsarClient
from tests.conformance.conftest import owner_of, rest_path


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def unload_bundle_of(admin, topic: str, *, move: bool = False) -> str | None:
    """Unload the topic's bundle; `move`: to the other broker (destinationBroker), whose name is
    returned."""
    bundle = admin.ok("GET", f"/lookup/v2/topic/{rest_path(topic)}/bundle")
    query, dest = "", None
    if move:
        names = [n.name for n in admin.cluster.nodes("broker")]
        other = 1 - names.index(owner_of(admin, topic))
        dest = names[other]
        query = "?destinationBroker=" + admin.cluster.admin_urls[other].split("://", 1)[1]
    admin.ok("PUT", f"/admin/v2/namespaces/public/default/{bundle}/unload{query}")
    return dest


def test_keyed_writes_read_back_in_order_and_the_reader_follows_an_unload(cluster, admin, client, topic):
    n = 200

    async def go():
        c = PulsarClient(cluster.service_url, operation_timeout=15, reconnect_timeout=30)
        try:
            p = await c.create_producer(topic)
            ids = [await p.send(b"v%d" % i, key=f"k{i % 7}") for i in range(n)]
            r = await c.create_reader(topic, start="earliest", receiver_queue_size=50)
            got = [await r.read_next(10) for _ in range(n // 2)]
            dest = unload_bundle_of(admin, topic, move=True)   # the bundle moves to the other broker
            ids += [await p.send(b"v%d" % i, key=f"k{i % 7}") for i in range(n, n + 50)]
            got += [await r.read_next(15) for _ in range(n // 2 + 50)]
            assert r.reconnects >= 1 and p.reconnects >= 1, (r.reconnects, p.reconnects)
            assert owner_of(admin, topic) == dest
            return ids, got
        finally:
            await c.close()

    ids, got = run(go())
    assert [g[2] for g in got] == [b"v%d" % i for i in range(n + 50)]        # no gap, no repeat
    assert [g[1] for g in got] == [f"k{i % 7}" for i in range(n + 50)]
    assert [g[0] for g in got] == ids
    rd = client.create_reader(topic, pulsar.MessageId.earliest)
    official = [rd.read_next(10000) for _ in range(n + 50)]
    assert [(m.partition_key(), m.data()) for m in official] == [(f"k{i % 7}", b"v%d" % i) for i in range(n + 50)]
    assert [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in official] == \
        [(i.ledger_id, i.entry_id) for i in ids]
    rd.close()


def _subscribe_retrying(client, topic: str, name: str):
    """The official client's subscribe, tried a second time when the first ends in its operation timeout
    (30 s): once in a CI run (1 of ~1800 tests; not reproduced in 65 runs of this test, 40 of them beside
    the whole conformance suite under load) the official client's first subscribe right after an unload
    timed out while our reader and producer had already reconnected. A second timeout fails the test."""
    try:
        return client.subscribe(topic, name)
    except pulsar.Timeout:
        logging.getLogger(__name__).warning("the official subscribe to %s timed out; once more", topic)
        return client.subscribe(topic, name)


def test_a_non_persistent_topic_through_our_client(cluster, admin, client):
    """Our reader gets what is published while it is connected (ids (0, 0)); after an unload it
    resubscribes at the new owner and gets the later messages only (nothing was kept)."""
    t = f"non-persistent://public/default/bcnp-{uuid.uuid4().hex[:8]}"

    async def go():
        c = PulsarClient(cluster.service_url, operation_timeout=15, reconnect_timeout=30)
        try:
            r = await c.create_reader(t, start="latest")
            p = await c.create_producer(t)
            ids = [await p.send(b"a%d" % i, key="k") for i in range(10)]
            assert {(m.ledger_id, m.entry_id) for m in ids} == {(0, 0)}
            first = [await r.read_next(10) for _ in range(10)]
            assert [g[2] for g in first] == [b"a%d" % i for i in range(10)] and first[0][1] == "k"
            unload_bundle_of(admin, t)
            loop = asyncio.get_running_loop()
            official = await loop.run_in_executor(None, lambda: _subscribe_retrying(client, t, "official"))
            # both readers are back once a message sent now reaches them
            for attempt in range(50):
                await p.send(b"probe%d" % attempt)
                try:
                    got = await r.read_next(0.3)
                    break
                except Exception:  # noqa: BLE001 - ClientTimeout: not resubscribed yet
                    continue
            else:
                raise AssertionError("our reader did not come back after the unload")
            assert got[2].startswith(b"probe") and r.reconnects >= 1 and p.reconnects >= 1
            await p.send(b"last")
            rest = []
            while not rest or rest[-1] != b"last":
                rest.append((await r.read_next(10))[2])
            assert all(x.startswith(b"probe") for x in rest[:-1])
            m = await loop.run_in_executor(None, lambda: official.receive(10000))
            while m.data() != b"last":
                assert m.data().startswith(b"probe")
                m = await loop.run_in_executor(None, lambda: official.receive(10000))
            official.close()
        finally:
            await c.close()

    run(go())
