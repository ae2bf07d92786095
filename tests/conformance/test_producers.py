"""Producers and the managed ledger behind a topic, through the official client and the admin API:
access modes, ledger rollover, and the bookies' metrics moving with the traffic."""
from __future__ import annotations

import time

import pulsar
import pytest

from clusters import metrics
from tests.conformance.conftest import BROKER_SETTINGS, rest_path


def test_exclusive_access_mode_refuses_a_second_producer(client, topic):
    """ProducerAccessMode.Exclusive: while an exclusive producer is connected, any other producer
    (shared or exclusive) is refused; once it closes, another can take the topic
    (https://pulsar.apache.org/docs/concepts-messaging/#access-mode)."""
    first = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    first.send(b"a")
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(topic)                        # Shared next to an exclusive one
    first.close()
    second = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    second.send(b"b")
    second.close()


def test_shared_producers_exclude_an_exclusive_one(client, topic):
    """Shared producers (the default) may be many; an Exclusive producer is refused while any is
    connected (https://pulsar.apache.org/docs/concepts-messaging/#access-mode)."""
    a, b = client.create_producer(topic), client.create_producer(topic)
    a.send(b"1")
    b.send(b"2")
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    a.close()
    b.close()


def test_ledgers_roll_over_by_entry_count(client, topic, admin):
    """A managed ledger closes its ledger and opens a new one after
    managedLedgerMaxEntriesPerLedger entries (here 100); internalStats lists the closed ledgers
    with their entry counts and the current one
    (https://pulsar.apache.org/docs/concepts-architecture-overview/#managed-ledgers,
    ManagedLedgerImpl.currentLedgerIsFull)."""
    per = BROKER_SETTINGS["max_entries_per_ledger"]
    p = client.create_producer(topic, batching_enabled=False)
    for i in range(per * 2 + 30):
        p.send(b"m%d" % i)
    st = admin.ok("GET", f"/admin/v2/{rest_path(topic)}/internalStats")
    ledgers = st["ledgers"]
    assert [lg["entries"] for lg in ledgers[:2]] == [per, per], ledgers
    assert len(ledgers) == 3 and st["numberOfEntries"] == per * 2 + 30, st
    # every message is still there, in order, across the ledgers
    r = client.create_reader(topic, pulsar.MessageId.earliest)
    got = [r.read_next(10000).data() for _ in range(per * 2 + 30)]
    assert got == [b"m%d" % i for i in range(per * 2 + 30)]
    r.close()
    p.close()


def test_bookie_metrics_count_the_adds_of_a_topic(client, topic, cluster):
    """Each bookie serves Prometheus metrics on its HTTP port (BookKeeper's httpServerPort,
    https://bookkeeper.apache.org/docs/admin/http#endpoint-metrics); with E/Qw/Qa 3/2/2 every entry
    is added on Qw=2 bookies, so the cluster's bookie_adds_total grows by at least 2 per entry, and the
    journal sync histogram counts the fsyncs behind them."""
    def scrape() -> dict[str, float]:
        total: dict[str, float] = {}
        for n in cluster.nodes("bookie"):
            for k, v in metrics.scrape(f"http://{n.host}:{n.ports['http']}").items():
                total[k] = total.get(k, 0.0) + v
        return total
    before = scrape()
    p = client.create_producer(topic, batching_enabled=False)
    for i in range(50):
        p.send(b"x")
    p.close()
    time.sleep(0.5)
    after = scrape()
    assert after["bookie_adds_total"] - before["bookie_adds_total"] >= 2 * 50
    assert after["bookie_journal_sync_seconds_count"] > before["bookie_journal_sync_seconds_count"]
