"""The channel recorder (harness/channel_recorder.py) against the shared cluster: JSON channel records
written with the official client to a topic of its own (the recorder's topic is a parameter; this
cluster's brokers run the modular load manager, so their view endpoint does not answer), and the rows it
journals: the owners present when it started, one `channel-message` per message in order, the
`bundle-owner` rows its oracle derives (a stale message makes none), `channel-view` error rows, the
messages written just before `stop()` (drained), and the channel and ownership checkers on the result."""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from checkers import channel, ownership
from core import store
from core.history import Journal, read_jsonl
from core.observations import (BUNDLE_OWNER, CHANNEL_MESSAGE, CHANNEL_VIEW, OBSERVE_START, OBSERVE_STOP)
from harness import channel_recorder
from tests.netns import pulsar_client

NS = "public/default"
PARENT = f"{NS}/0x00000000_0xffffffff"
LOW = f"{NS}/0x00000000_0x7fffffff"


def _rec(state, dst=None, src=None, v=1, force=False):
    out = {"state": state, "force": force, "timestamp": int(time.time() * 1000), "versionId": v}
    if dst:
        out["dstBroker"] = dst
    if src:
        out["sourceBroker"] = src
    return json.dumps(out).encode()


def _cluster_doc(cluster) -> dict:
    st = cluster.status()
    return {"service_url": st["service_url"],
            "nodes": [{k: n.get(k) for k in ("name", "role", "host", "ports")} for n in st["nodes"]]}


def _wait(pred, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_recorder_journals_messages_owners_and_views(cluster, tmp_path: Path):
    doc = _cluster_doc(cluster)
    brokers = channel_recorder.brokers_of(doc)
    a, b = brokers[0][0], brokers[1][0]                       # brokerIds host:http port
    topic = f"persistent://{NS}/channel-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "journals" / channel_recorder.JOURNAL_NAME
    journal = Journal(path, time.monotonic_ns())
    with pulsar_client(doc["service_url"]) as client:
        prod = client.create_producer(topic, batching_enabled=False)
        prod.send(_rec("Assigning", a, v=1), partition_key=PARENT)
        prod.send(_rec("Owned", a, v=2), partition_key=PARENT)       # before the recorder: present
        rec = channel_recorder.record(doc, journal, topic=topic, view_interval_s=0.5, final_views_s=1.0)
        try:
            def rows(f):
                return [op for op in read_jsonl(path) if op.f == f]
            _wait(lambda: len(rows(CHANNEL_MESSAGE)) == 2, "the first read")
            prod.send(_rec("Releasing", b, a, v=3), partition_key=PARENT)
            prod.send(_rec("Assigning", b, a, v=4), partition_key=PARENT)
            prod.send(_rec("Owned", b, a, v=5), partition_key=PARENT)
            prod.send(_rec("Releasing", a, b, v=5), partition_key=PARENT)      # stale: rejected
            prod.send(b"not a record", partition_key=LOW)                      # undecodable
            prod.send(_rec("Owned", a, v=1), partition_key=LOW)                # overlaps PARENT on b
            _wait(lambda: len(rows(CHANNEL_MESSAGE)) == 8, "the live messages")
            _wait(lambda: rows(CHANNEL_VIEW), "a view sample")
            prod.send(b"", partition_key=LOW)                                  # a tombstone, just before stop
        finally:
            rec.stop()
            journal.close()
    ops = list(read_jsonl(path))
    start = [op for op in ops if op.f == OBSERVE_START][0]
    assert start.value["source"] == "channel"
    assert start.value["ports"][a].startswith("broker") and start.value["brokers"] == [a, b]
    assert ops[-1].f == OBSERVE_STOP and ops[-1].value["messages"] == 9
    msgs = [op for op in ops if op.f == CHANNEL_MESSAGE]
    assert [m.key for m in msgs] == [PARENT] * 6 + [LOW] * 3
    ids = [tuple(m.value["message_id"]) for m in msgs]
    assert ids == sorted(ids) and len(set(ids)) == 9
    assert msgs[5].value["value"]["versionId"] == 5 and "undecodable" in msgs[6].value
    assert msgs[8].value["value"] is None                                     # the tombstone, drained
    owners = [(op.key, op.value["event"], op.value["broker"], op.value["incarnation"])
              for op in ops if op.f == BUNDLE_OWNER]
    assert owners == [(PARENT, "present", a, 2), (PARENT, "deleted", a, 2), (PARENT, "created", b, 5),
                      (LOW, "created", a, 1), (LOW, "deleted", a, 1)]
    views = [op for op in ops if op.f == CHANNEL_VIEW]
    assert views and all("error" in v.value for v in views) and {v.key for v in views} == {a, b}
    assert any(v.value.get("final") for v in views)
    history = store.merge_journals(store.journal_paths(tmp_path))
    r = channel.check(history)
    assert r.valid is False and set(r.anomalies) == {"double-owned"}, r.anomalies
    assert r.stats["rejected_by_reason"] == {"undecodable": 1, "version-not-newer": 1}
    assert r.stats["convergence"] == {a: "not judged: down (HTTP 404)", b: "not judged: down (HTTP 404)"}
    o = ownership.check(history)
    assert "double-owner" in o.anomalies                                      # the same rows, the other checker


def test_batched_messages_keep_their_batch_index(cluster, tmp_path: Path):
    """Pulsar's channel producer batches: the rows keep [ledger, entry, batch index], in order, and a view
    naming [ledger, entry] is judged after the whole entry."""
    doc = _cluster_doc(cluster)
    a = channel_recorder.brokers_of(doc)[0][0]
    topic = f"persistent://{NS}/channel-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "journals" / channel_recorder.JOURNAL_NAME
    journal = Journal(path, time.monotonic_ns())
    with pulsar_client(doc["service_url"]) as client:
        prod = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                      batching_max_publish_delay_ms=50)
        rec = channel_recorder.record(doc, journal, topic=topic, view_interval_s=0, final_views_s=0)
        try:
            for v, state in enumerate(("Assigning", "Owned"), start=1):
                prod.send_async(_rec(state, a, v=v), None, partition_key=PARENT)
            prod.flush()
            _wait(lambda: len([op for op in read_jsonl(path) if op.f == CHANNEL_MESSAGE]) == 2, "the batch")
        finally:
            rec.stop()
            journal.close()
    msgs = [op for op in read_jsonl(path) if op.f == CHANNEL_MESSAGE]
    ids = [m.value["message_id"] for m in msgs]
    assert ids[0][:2] == ids[1][:2] and [i[2] for i in ids] == [0, 1]              # one entry, two messages
    entry = ids[1][:2]
    view = {"broker": a, "last_applied": entry, "records": {PARENT: msgs[1].value["value"]}}
    history = store.merge_journals(store.journal_paths(tmp_path))
    from core.history import Op
    history.append(Op(process=-2, type="ok", f=CHANNEL_VIEW, key=a, value=view, time_ns=history[-1].time_ns + 1,
                      index=len(history)))
    r = channel.check(history)
    assert r.valid is True and r.stats["views"][a]["judged"] == 1, r.anomalies
    o = ownership.check(history)
    assert o.valid is True and not o.anomalies                       # one owner: the ownership checker agrees
