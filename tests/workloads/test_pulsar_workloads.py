"""The queue and subscriptions workloads without a cluster: their thread plans, seeded generators,
message keys and the checkers (with opts) they ask for; spec options reach them."""
from __future__ import annotations

import itertools

import pytest

import workloads
from core.spec import SpecError
from core.spec import TestSpec as Spec
from workloads import queue, subscriptions
from harness.catalog import CATALOG

TOPICS = ["persistent://public/default/t-0", "persistent://public/default/t-1"]


def test_registry_lists_every_workload_and_each_has_the_interface():
    assert {"log", "queue", "subscriptions"} <= set(workloads.available())
    for name in workloads.available():
        mod = workloads.get(name)
        for attr in ("DESCRIPTION", "keys", "worker_count", "start", "start_final", "checkers"):
            assert hasattr(mod, attr), (name, attr)
    with pytest.raises(KeyError):
        workloads.get("bank")


@pytest.mark.parametrize("concurrency, consumers", [(2, 1), (3, 2), (6, 2), (12, 4)])
def test_queue_has_competing_consumers(concurrency, consumers):
    spec = Spec(workload="queue", concurrency=concurrency).validate(catalog=CATALOG)
    ts = queue.threads(spec)
    assert len(ts) == concurrency
    assert sum(t.role == "dequeue" for t in ts) == consumers
    assert any(t.role == "enqueue" for t in ts)             # always someone to produce
    assert sorted(t.index for t in ts) == list(range(concurrency))


def test_queue_consumers_option_and_dedup_checker_opts():
    spec = Spec(workload="queue", concurrency=8, options={"consumers": 5, "dedup": True}).validate(catalog=CATALOG)
    assert sum(t.role == "dequeue" for t in queue.threads(spec)) == 5
    opts = {n: o for n, (_, o) in queue.checkers(spec).items()}
    if "queue" in opts:
        assert opts["queue"]["dedup"] is True and opts["queue"]["dequeue"] == ("dequeue", "drain")


def test_queue_generator_is_seeded_and_values_unique():
    spec = Spec(workload="queue", concurrency=6, seed=4).validate(catalog=CATALOG)
    producers = [t for t in queue.threads(spec) if t.role == "enqueue"]
    values = [p.value for t in producers for p in itertools.islice(queue.generator(spec, t, TOPICS), 200)]
    assert len(values) == len(set(values))
    again = [p.value for t in producers for p in itertools.islice(queue.generator(spec, t, TOPICS), 200)]
    assert values == again
    other = Spec(workload="queue", concurrency=6, seed=5).validate(catalog=CATALOG)
    assert [p.key for p in itertools.islice(queue.generator(other, producers[0], TOPICS), 50)] != \
        [p.key for p in itertools.islice(queue.generator(spec, producers[0], TOPICS), 50)]


def test_subscriptions_keys_and_consumer_share():
    ks = Spec(workload="subscriptions", concurrency=6, options={"subscription": "key_shared", "keys": 3}).validate(catalog=CATALOG)
    fo = Spec(workload="subscriptions", concurrency=6).validate(catalog=CATALOG)
    assert {subscriptions.message_key(ks, v) for v in range(100)} == {"k0", "k1", "k2"}
    assert subscriptions.message_key(fo, 7) is None                  # Failover sends unkeyed
    for spec in (ks, fo):
        ts = subscriptions.threads(spec)
        assert sum(t.role == "receive" for t in ts) == 3 and len(ts) == 6


def test_subscriptions_checkers_follow_the_subscription_type():
    from checkers import REGISTRY
    for sub, typ in (("failover", "Failover"), ("key_shared", "Key_Shared")):
        spec = Spec(workload="subscriptions", options={"subscription": sub}).validate(catalog=CATALOG)
        got = subscriptions.checkers(spec)
        assert "log" in got and got["log"][0] is REGISTRY["log"].check
        assert got["log"][1]["subscription_type"] == typ


def test_delay_max_ms_must_end_before_the_final_drain():
    """A delay past settle + the drain's idle time would report never-due messages as lost; a
    negative one would divide by zero in the workload: both are one clear SpecError."""
    def v(d, settle=10.0):
        return Spec(workload="queue", options={"delay_max_ms": d}, settle=settle).validate(catalog=CATALOG)
    v(0)
    v(12_999)
    v(20_000, settle=30.0)
    for bad in (13_000, 60_000, -1):
        with pytest.raises(SpecError, match="delay_max_ms must be a whole number from 0 to 12999"):
            v(bad)
    with pytest.raises(SpecError, match="delay_max_ms must be a whole number"):
        v(1.5)


def test_bad_choice_is_a_spec_error():
    with pytest.raises(SpecError) as e:
        Spec(workload="subscriptions", options={"subscription": "exclusive"}).validate(catalog=CATALOG)
    assert "failover, key_shared" in str(e.value)


def test_a_worker_looks_up_through_its_home_broker_or_every_broker_home_first():
    from pathlib import Path

    from workloads.base import Context
    nodes = [{"name": f"broker-{i}", "role": "broker", "host": f"10.0.0.{i}", "ports": {"pulsar": 6650}}
             for i in (1, 2, 3)] + [{"name": "bookie-1", "role": "bookie", "host": "10.0.0.9"}]
    cluster = {"service_url": "pulsar://10.0.0.1:6650,10.0.0.2:6650,10.0.0.3:6650", "nodes": nodes}

    def url(options, worker):
        spec = Spec(workload="balance", options=options).validate(catalog=CATALOG)
        return Context(run_dir=Path("."), spec=spec, cluster=cluster, keys=[], worker=worker).service_url
    assert url({}, 1) == "pulsar://10.0.0.2:6650"
    assert url({"lookup": "all"}, 1) == "pulsar://10.0.0.2:6650,10.0.0.3:6650,10.0.0.1:6650"
    with pytest.raises(SpecError, match="lookup"):
        url({"lookup": "any"}, 0)


@pytest.mark.parametrize("ahead", [0, 12])
def test_queue_subscribe_ahead_creates_the_subscription_in_prepare(monkeypatch, ahead):
    """subscribe_ahead_s: the queue's subscription is made through the admin API before anything is
    sent (at the latest position, Pulsar's createSubscription default); without it prepare makes none."""
    from pathlib import Path
    from workloads.base import Context
    made = []
    monkeypatch.setattr(queue, "create_subscription", lambda urls, topic, sub: made.append((topic, sub)))
    spec = Spec(workload="queue", options={"subscribe_ahead_s": ahead}).validate(catalog=CATALOG)
    queue.prepare(Context(run_dir=Path("."), spec=spec, cluster={"nodes": []}, keys=TOPICS))
    assert made == ([(t, queue.SUBSCRIPTION) for t in TOPICS] if ahead else [])


def test_the_balance_workloads_payload_pads_the_value_and_reads_back():
    """`payload` pads each send's value with spaces to N bytes (the workload's bytes, not the brokers'
    own, then dominate their load); the value reads back as the same int; the option is a whole number."""
    from workloads.base import decode_value
    spec = Spec(workload="balance", options={"payload": 4096}).validate(catalog=CATALOG)
    assert spec.options["payload"] == 4096
    for v in (10_000_001, 123):
        raw = str(v).encode().ljust(4096)
        assert len(raw) == 4096 and decode_value(raw) == v
    with pytest.raises(SpecError, match="payload"):
        Spec(workload="balance", options={"payload": "big"}).validate(catalog=CATALOG)
    for bad in (-1, 64 * 1024 * 1024):            # nothing to pad to; more than a broker takes in one message
        with pytest.raises(SpecError, match="payload must be a whole number of bytes from 0 to"):
            Spec(workload="balance", options={"payload": bad}).validate(catalog=CATALOG)


@pytest.mark.integration
def test_the_final_ledger_listing_carries_each_ledgers_metadata(zk_server, monkeypatch):
    """ledger_list adds each ledger's metadata as the real ZooKeeper holds it (the BookKeeper client's
    znode): its fragments' bookies by node name, E, Qw; a ledger whose znode is gone says so; a metadata
    store that does not answer leaves the listing ok with `metadata_error`."""
    from kazoo.client import KazooClient

    from clusters.bookkeeper.metadata import LedgerMetadata, ledger_path
    from tests.conftest import fresh_chroot
    from workloads import pulsar_client as pc
    conn = fresh_chroot(zk_server, "test-audit")
    md = LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum=1, ack_quorum=1, state="CLOSED", last_entry_id=9,
                        ensembles={0: ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"],
                                   5: ["10.0.0.1:3181", "10.0.0.9:3181", "10.0.0.3:3181"]})
    zk = KazooClient(hosts=conn)
    zk.start(30)
    try:
        zk.create(ledger_path(7), md.serialize(), makepath=True)
    finally:
        zk.stop()
        zk.close()
    stats = {"lastConfirmedEntry": "8:-1", "ledgers": [{"ledgerId": 7, "entries": 10}, {"ledgerId": 8}]}
    monkeypatch.setattr(pc, "admin_call", lambda urls, path: stats)
    names = {"10.0.0.1:3181": "bookie-1", "10.0.0.2:3181": "bookie-2", "10.0.0.3:3181": "bookie-3"}
    typ, out = pc.ledger_list(["http://x"], "persistent://public/default/t", conn, names)
    assert typ == "ok"
    l7, l8 = out["value"]["ledgers"]
    assert l7["metadata"] == {"ensemble_size": 3, "write_quorum": 1, "ack_quorum": 1, "state": "CLOSED",
                              "fragments": [[0, ["bookie-1", "bookie-2", "bookie-3"]],
                                            [5, ["bookie-1", "10.0.0.9:3181", "bookie-3"]]]}
    assert l8["metadata"] == {"error": "no metadata (deleted)"} and l8["entries"] == 0
    monkeypatch.setattr(pc, "ZK_AUDIT_TIMEOUT", 1.0)
    typ, out = pc.ledger_list(["http://x"], "persistent://public/default/t", "127.0.0.1:1", names)
    assert typ == "ok" and "metadata" not in out["value"]["ledgers"][0] and out["value"]["metadata_error"]
