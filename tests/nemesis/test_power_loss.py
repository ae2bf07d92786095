"""The power-loss nemesis (nemesis/power.py) over lazyfs bookie disks (clusters/deploy/lazyfs.py):
bookies that fsync before they acknowledge (BookKeeper's journalSyncData=true, the default) lose
nothing acknowledged when every bookie loses power at once; with `bookie.ack_before_fsync` a run
reports lost acknowledged messages.

BookKeeper's durability claim: "journalSyncData: Flush journal data to disk before acknowledging
the write" (https://bookkeeper.apache.org/docs/reference/config, Journal settings)."""
from __future__ import annotations

import json
import random
import threading
import time
import uuid

import pulsar
import pytest

from clusters.deploy import lazyfs, procs
from core.history import INVOKE, OK, Journal, read_jsonl
from nemesis.base import NemesisError
from nemesis.combine import NemesisRunner
from nemesis.power import PowerLossNemesis
from tests.netns import netns_cluster, pulsar_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    with netns_cluster("pl", brokers=1, bookies=3, zookeepers=1, lazy_disks=["bookie"]) as c:
        yield c


def produce(client, topic: str, values: range) -> list[int]:
    """Send values (async, then flush); the ones acknowledged."""
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000)
    acked: list[int] = []
    done = threading.Semaphore(0)

    def callback(res, _mid, v):
        if res == pulsar.Result.Ok:
            acked.append(v)
        done.release()
    try:
        for v in values:
            producer.send_async(str(v).encode(), lambda res, mid, v=v: callback(res, mid, v))
        producer.flush()
        for _ in values:                        # every callback has run (they may trail flush())
            assert done.acquire(timeout=60)
    finally:
        producer.close()
    return sorted(acked)


def read_all(client, topic: str, want: set[int], timeout: float = 90.0) -> set[int]:
    """Read the topic from the earliest message until every value in `want` is seen or the topic
    gives nothing for 10 s (or `timeout`)."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got: set[int] = set()
    deadline = time.monotonic() + timeout
    idle = time.monotonic()
    try:
        while not want <= got and time.monotonic() < deadline and time.monotonic() - idle < 10:
            try:
                msg = reader.read_next(1000)
            except pulsar.Timeout:
                continue
            got.add(int(msg.data()))
            idle = time.monotonic()
    finally:
        reader.close()
    return got


def test_bookies_are_on_lazy_disks(cluster):
    for b in cluster.nodes("bookie"):
        assert lazyfs.is_mounted(b.data_dir)
        stats = lazyfs.control(cluster._state()["nodes"][b.name]["lazyfs"]["control"], "stats")
        assert stats["backing"].endswith(f"{b.name}/disk") and stats["totals"]["fsyncs"] > 0
    assert not any(lazyfs.is_mounted(n.data_dir) for n in cluster.nodes() if n.role != "bookie")


def test_power_loss_of_every_bookie_loses_nothing_acknowledged(cluster, tmp_path):
    """Default bookies (journal fsync before the ack): every message acknowledged before the power
    loss is read back after the bookies restart."""
    topic = f"persistent://public/default/power-{uuid.uuid4().hex[:6]}"
    journal = Journal(tmp_path / "nemesis.jsonl", time.monotonic_ns())
    runner = NemesisRunner(cluster, ["power-loss"], 1.0, random.Random(1), journal, [topic],
                           nemeses={"power-loss": PowerLossNemesis()})
    with pulsar_client(cluster.service_url) as client:
        acked = produce(client, topic, range(300))
        assert len(acked) == 300
        nem = runner.start_fault("power-loss")
        v = nem.applied
        assert v["nodes"] == ["bookie-1", "bookie-2", "bookie-3"]
        assert set(v["dropped"]) == set(v["nodes"])
        assert all(not cluster.node(n).alive for n in v["nodes"])
        assert all(not procs.alive(pid) for pid in v["killed"].values() if pid)
        assert runner.stop_faults()
        assert all(cluster.node(n).alive for n in v["nodes"])
        more = produce(client, topic, range(300, 400))        # writable again
        assert more
        want = set(acked) | set(more)
        got = read_all(client, topic, want)
    assert sorted(want - got) == []
    journal.sync()
    ops = list(read_jsonl(journal.path))
    assert [(o.type, o.f) for o in ops] == [(INVOKE, "start-power-loss"), (OK, "start-power-loss"),
                                           (INVOKE, "stop-power-loss"), (OK, "stop-power-loss")]
    assert ops[1].value["nodes"] == v["nodes"] and ops[3].value["nodes"] == v["nodes"]
    journal.close()


def test_power_loss_needs_a_lazy_disk(cluster):
    nem = PowerLossNemesis(["broker-1"])
    from nemesis.base import NemesisContext
    ctx = NemesisContext(cluster=cluster, rng=random.Random(0))
    with pytest.raises(Exception) as ei:
        nem.start(ctx)
    assert "no lazy disk" in str(ei.value) and "lazy_disks=['broker']" in str(ei.value)
    assert nem.applied is None and cluster.node("broker-1").alive
    with pytest.raises(NemesisError):
        PowerLossNemesis(["bookie-9"]).choose(ctx)


# ------------------------------------------------------------------ whole runs (pulsar-chaos run)

WHOLE_CLUSTER = "power-loss:all-bookie+all-broker"


def _run(tmp_path, bugs: dict, nemesis: str = WHOLE_CLUSTER) -> tuple[int, dict, str]:
    from tests.workloads.runs import run
    code, res, out, _ = run(tmp_path, prefix="power", workload="log", nemesis=[nemesis],
                            nemesis_interval=5.0, time_limit=30.0, seed=1, bugs=bugs)
    return code, res, out


def res_dir(tmp_path):
    return next(tmp_path.glob("power-*/2*"))


def test_run_with_ack_before_fsync_reports_lost_messages(tmp_path):
    """Bookies that acknowledge before fsync (bookie.ack_before_fsync: BookKeeper's
    journalSyncData=false) lose acknowledged entries when every bookie and broker loses power: the
    log checker finds acknowledged messages missing from the final reads, the fencing checker
    acknowledged entries above the ends that ledger recovery gave their ledgers."""
    code, res, out = _run(tmp_path, {"bookie.ack_before_fsync": True})
    log, fencing = res["checkers"]["log"], res["checkers"]["fencing"]
    assert code == 1 and res["valid"] is False, out
    # A lost entry below a recovered close is a hole that the final read skips (deployed brokers run
    # with auto_skip_non_recoverable_data): the log checker says lost, not unknown.
    assert log["valid"] is False, out
    lost = len((log.get("anomalies") or {}).get("lost", []))
    beyond = sum(len((fencing.get("anomalies") or {}).get(k, [])) for k in ("beyond-close", "lost-entry"))
    assert lost + beyond > 0 and fencing["valid"] is False, out
    history = [json.loads(line) for line in (res_dir(tmp_path) / "history.jsonl").open()]
    starts = [op for op in history if op["f"] == "start-power-loss" and op["type"] == "ok"]
    assert starts and all(op["value"]["nodes"] == ["bookie-1", "bookie-2", "bookie-3", "broker-1", "broker-2"]
                          for op in starts)
    assert sum(op["value"]["dropped_bytes"] for op in starts) > 0


def test_run_with_ack_before_fsync_and_bookies_only_reports_lost_messages(tmp_path):
    """Only the bookies lose power; the brokers keep running and close each ledger at the last entry
    they saw acknowledged. The entries the bookies had not fsync'ed are on no bookie any more: the
    brokers' caches have aged them out, the final reads skip them (auto_skip_non_recoverable_data,
    on in deployed clusters), and the log checker reports the acknowledged messages they held as
    lost."""
    code, res, out = _run(tmp_path, {"bookie.ack_before_fsync": True}, nemesis="power-loss")
    log = res["checkers"]["log"]
    assert code == 1 and res["valid"] is False and log["valid"] is False, out
    assert (log.get("anomalies") or {}).get("lost"), out
    history = [json.loads(line) for line in (res_dir(tmp_path) / "history.jsonl").open()]
    starts = [op for op in history if op["f"] == "start-power-loss" and op["type"] == "ok"]
    assert starts and all(op["value"]["nodes"] == ["bookie-1", "bookie-2", "bookie-3"] for op in starts)


def test_run_with_default_bookies_loses_nothing(tmp_path):
    code, res, out = _run(tmp_path, {})
    assert code == 0 and res["valid"] is True, out
    assert not res["checkers"]["log"].get("anomalies", {}).get("lost")
