"""The channel recorder's gaps and view samples, with a fake client whose reader can be disconnected or made
to fail (killing the shared cluster's broker under a reader costs a restart); the reader against a real
cluster is tests/conformance/test_channel_recorder.py."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pulsar

from checkers import channel
from core import store
from core.history import Journal, read_jsonl
from core.observations import (BUNDLE_OWNER, CHANNEL_MESSAGE, CHANNEL_VIEW, GAP_END, GAP_START, OBSERVE_STOP)
from harness import channel_recorder

A, B = "10.0.0.11:8080", "10.0.0.12:8080"
PARENT = "public/default/0x00000000_0xffffffff"
CLUSTER = {"service_url": "pulsar://fake:6650", "nodes": [
    {"name": "broker-1", "role": "broker", "host": "10.0.0.11", "ports": {"pulsar": 6650, "http": 8080}},
    {"name": "broker-2", "role": "broker", "host": "10.0.0.12", "ports": {"pulsar": 6650, "http": 8080}}]}


class FakeId:
    def __init__(self, entry: int):
        self.entry = entry

    def ledger_id(self) -> int:
        return 3

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return -1


class FakeMsg:
    def __init__(self, entry: int, key: str, data: bytes):
        self.entry, self.key, self.payload = entry, key, data

    def message_id(self) -> FakeId:
        return FakeId(self.entry)

    def data(self) -> bytes:
        return self.payload

    def publish_timestamp(self) -> int:
        return time.time_ns() // 1_000_000

    def partition_key(self) -> str:
        return self.key

    def has_null_value(self) -> bool:
        return not self.payload


class Topic:
    def __init__(self):
        self.msgs: list[FakeMsg] = []
        self.connected = True
        self.fail_next = False
        self.starts: list[Any] = []
        self.lock = threading.Lock()

    def send(self, key: str, value: dict | None) -> None:
        with self.lock:
            self.msgs.append(FakeMsg(len(self.msgs), key, b"" if value is None else json.dumps(value).encode()))


class FakeReader:
    def __init__(self, topic: Topic, pos: int):
        self.t, self.pos = topic, pos

    def read_next(self, timeout_ms: int) -> FakeMsg:
        if self.t.fail_next:
            self.t.fail_next = False
            raise pulsar.ConnectError("connection lost")
        with self.t.lock:
            if self.t.connected and self.pos < len(self.t.msgs):
                self.pos += 1
                return self.t.msgs[self.pos - 1]
        time.sleep(min(timeout_ms, 50) / 1000)
        raise pulsar.Timeout("no message")

    def has_message_available(self) -> bool:
        return self.t.connected and self.pos < len(self.t.msgs)

    def is_connected(self) -> bool:
        return self.t.connected

    def close(self) -> None:
        pass


class FakeClient:
    def __init__(self, topic: Topic):
        self.t = topic

    def create_reader(self, name: str, start: Any, **kw: Any) -> FakeReader:
        self.t.starts.append(start)
        return FakeReader(self.t, start.entry_id() + 1 if isinstance(start, FakeId) else 0)

    def close(self) -> None:
        pass


def _rec(state: str, dst: str | None = None, src: str | None = None, v: int = 1) -> dict:
    out: dict[str, Any] = {"state": state, "force": False, "timestamp": 0, "versionId": v}
    if dst:
        out["dstBroker"] = dst
    if src:
        out["sourceBroker"] = src
    return out


def _until(pred, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _start(topic: Topic, tmp: Path, **kw: Any) -> tuple[channel_recorder.ChannelRecorder, Journal, Path]:
    path = tmp / "journals" / channel_recorder.JOURNAL_NAME
    journal = Journal(path, time.monotonic_ns())
    kw.setdefault("view_interval_s", 0)
    rec = channel_recorder.record(CLUSTER, journal, client_factory=lambda url: FakeClient(topic), timeout=2.0,
                                  drain_s=2.0, final_views_s=1.0, **kw)
    return rec, journal, path


def _fs(path: Path, f: str) -> list:
    return [op for op in read_jsonl(path) if op.f == f]


def test_a_disconnected_reader_is_a_gap_and_a_failed_read_a_new_reader_from_the_last_id(tmp_path):
    topic = Topic()
    topic.send(PARENT, _rec("Assigning", A, v=1))
    rec, journal, path = _start(topic, tmp_path)
    try:
        _until(lambda: len(_fs(path, CHANNEL_MESSAGE)) == 1, "the first read")
        topic.connected = False
        _until(lambda: _fs(path, GAP_START), "a gap")
        assert _fs(path, GAP_START)[0].value["reason"] == "reader disconnected"
        topic.send(PARENT, _rec("Owned", A, v=2))
        time.sleep(0.2)
        assert len(_fs(path, CHANNEL_MESSAGE)) == 1 and not _fs(path, GAP_END)
        topic.connected = True
        _until(lambda: _fs(path, GAP_END), "the gap's end")
        assert len(_fs(path, CHANNEL_MESSAGE)) == 2
        topic.fail_next = True
        _until(lambda: len(_fs(path, GAP_START)) == 2, "a failed read")
        _until(lambda: len(topic.starts) == 2, "a new reader")
        assert isinstance(topic.starts[1], FakeId) and topic.starts[1].entry_id() == 1    # from the last read
        topic.send(PARENT, _rec("Releasing", B, A, v=3))
        _until(lambda: len(_fs(path, GAP_END)) == 2 and len(_fs(path, CHANNEL_MESSAGE)) == 3, "the read resumed")
    finally:
        rec.stop()
        journal.close()
    msgs = _fs(path, CHANNEL_MESSAGE)
    assert [m.value["message_id"][1] for m in msgs] == [0, 1, 2]                   # each once, in order
    owners = [(o.value["event"], o.value["broker"]) for o in _fs(path, BUNDLE_OWNER)]
    assert owners == [("created", A), ("deleted", A)]
    stop = _fs(path, OBSERVE_STOP)[0].value
    assert stop["gaps"] == 2 and stop["reconnects"] == 1 and stop["messages"] == 3


def test_reconnections_are_bounded(tmp_path):
    topic = Topic()

    class Failing(FakeClient):
        def create_reader(self, name, start, **kw):
            if topic.starts:
                topic.starts.append(start)
                raise pulsar.ConnectError("refused")
            return super().create_reader(name, start, **kw)

    path = tmp_path / "journals" / channel_recorder.JOURNAL_NAME
    journal = Journal(path, time.monotonic_ns())
    rec = channel_recorder.ChannelRecorder("pulsar://fake:6650", journal, client_factory=lambda url: Failing(topic),
                                           max_reconnects=3, drain_s=0.5, final_views_s=0, view_interval_s=0).start(2.0)
    try:
        topic.fail_next = True
        _until(lambda: len(topic.starts) >= 4, "the reconnections")
        time.sleep(1.0)
    finally:
        rec.stop()
        journal.close()
    assert len(topic.starts) == 4 and rec.reconnects == 3          # the first reader and three more, no more


def test_view_samples_judged_by_the_checker(tmp_path):
    """Two brokers' views sampled while the channel moves: A's view follows the resolver, B's applied a
    stale message; the final rounds wait for both to apply the last message."""
    topic = Topic()
    state = {"last": None}
    good = {PARENT: _rec("Owned", A, v=2)}

    def view(url: str) -> dict:
        broker = url.split("//", 1)[1]
        last = state["last"]
        records = dict(good) if last is not None else {}
        if broker == B and last is not None and last[1] >= 2:
            records = {PARENT: _rec("Releasing", A, B, v=2)}              # applied the stale message
        return {"broker": broker, "leader": broker == A, "last_applied": last, "records": records}

    rec, journal, path = _start(topic, tmp_path, view_interval_s=0.05, view_fetch=view)
    try:
        topic.send(PARENT, _rec("Assigning", A, v=1))
        topic.send(PARENT, _rec("Owned", A, v=2))
        _until(lambda: len(_fs(path, CHANNEL_MESSAGE)) == 2, "the messages")
        state["last"] = [3, 1]
        topic.send(PARENT, _rec("Releasing", A, B, v=2))                   # stale: the resolver rejects it
        _until(lambda: len(_fs(path, CHANNEL_MESSAGE)) == 3, "the stale message")
        state["last"] = [3, 2]
        _until(lambda: len(_fs(path, CHANNEL_VIEW)) >= 6, "view samples")
    finally:
        rec.stop()
        journal.close()
    views = _fs(path, CHANNEL_VIEW)
    assert {v.key for v in views} == {A, B} and any(v.value.get("final") for v in views)
    r = channel.check(store.merge_journals(store.journal_paths(tmp_path)))
    assert r.valid is False and set(r.anomalies) == {"view-divergence", "view-not-converged"}, r.anomalies
    assert {c["broker"] for c in r.anomalies["view-divergence"]} == {B}
    assert r.stats["convergence"] == {A: "converged", B: "not converged"}


def test_the_extensible_source_is_the_channel_recorder(tmp_path):
    import pytest

    from harness import observers
    assert observers.OWNER_SOURCES["extensible"] is not observers.OWNER_SOURCES["modular"]
    j = Journal(tmp_path / "o.jsonl", 0)
    try:
        with pytest.raises(observers.ObserverError, match="names no service_url"):
            observers.OBSERVERS["bundle-owner"].start(observers.ObserverContext({}, "extensible", j, tmp_path))
    finally:
        j.close()
    assert channel_recorder.brokers_of(CLUSTER) == [(A, f"http://{A}"), (B, f"http://{B}")]


def test_the_metadata_store_recorder_journals_records_and_views_from_zookeeper(zk, tmp_path):
    """The recorder of a channel kept in znodes (ServiceUnitStateMetadataStoreTableViewImpl), on a real
    ZooKeeper: a record written, then rewritten with another owner, is two channel-message rows (the same
    value written again is none), the bundle-owner rows follow its owner, and the brokers' views (here answered by the test)
    are sampled until the final rounds find them equal to the store's records; a view left behind is
    judged by the checker."""
    from kazoo.client import KazooClient

    kz = KazooClient(hosts=zk)
    kz.start(30)
    node = f"{channel_recorder.METADATA_PATH_PREFIX}/{PARENT}"
    stale = {"on": True}

    def view(url: str) -> dict:
        broker = url.split("//", 1)[1]
        try:
            data, _ = kz.get(node)
            records = {PARENT: json.loads(data)}
        except Exception:
            records = {}
        if broker == B and stale["on"]:
            records = {PARENT: _rec("Owned", B, v=9)}         # a view that never follows the store
        return {"broker": broker, "leader": broker == A, "records": records, "table_view":
                "ServiceUnitStateMetadataStoreTableViewImpl"}

    path = tmp_path / "journals" / channel_recorder.JOURNAL_NAME
    journal = Journal(path, time.monotonic_ns())
    rec = channel_recorder.MetadataChannelRecorder(zk, journal, brokers=[(A, f"http://{A}"), (B, f"http://{B}")],
                                                   view_interval_s=0.05, final_views_s=1.0, view_fetch=view)
    try:
        rec.start(10)
        kz.create(node, json.dumps(_rec("Owned", A, v=1)).encode(), makepath=True)
        _until(lambda: len(_fs(path, CHANNEL_MESSAGE)) == 1, "the record")
        kz.set(node, json.dumps(_rec("Owned", A, v=1)).encode())                    # the same value again
        kz.set(node, json.dumps(_rec("Owned", B, A, v=2)).encode())
        _until(lambda: len(_fs(path, CHANNEL_MESSAGE)) == 2, "the new owner's record")
        _until(lambda: len(_fs(path, CHANNEL_VIEW)) >= 4, "view samples")
    finally:
        rec.stop()
        journal.close()
        kz.stop()
        kz.close()
    msgs = _fs(path, CHANNEL_MESSAGE)
    assert [m.value["value"]["dstBroker"] for m in msgs] == [A, B]
    assert [(o.value["event"], o.value["broker"]) for o in _fs(path, BUNDLE_OWNER)] == [
        ("created", A), ("deleted", A), ("created", B)]
    views = _fs(path, CHANNEL_VIEW)
    assert {v.key for v in views} == {A, B} and any(v.value.get("final") for v in views)
    r = channel.check(store.merge_journals(store.journal_paths(tmp_path)))
    assert r.stats["convergence"].get(A) == "converged", r.stats["convergence"]
    assert r.stats["convergence"].get(B) != "converged" and "view-not-converged" in r.anomalies, r.anomalies


def test_final_rounds_last_until_no_answering_broker_is_behind_or_the_time_is_up(tmp_path):
    """`_final_views` of both recorders, without a channel: rounds marked final until no broker that
    answers is behind (the topic recorder: its last_applied is not the last message read, and it reads
    the topic again between rounds; the metadata recorder: its records are not the store's), and one
    round only when `final_views_s` is 0. A broker that answers an error is never waited for."""
    answers: dict[str, list[dict]] = {}

    def view(url: str) -> dict:
        broker = url.split("//", 1)[1]
        queue = answers[broker]
        return dict(queue.pop(0) if len(queue) > 1 else queue[0])

    brokers = [(A, f"http://{A}"), (B, f"http://{B}")]

    def final_rows(path: Path) -> list[tuple[str, dict]]:
        rows = [(v.key, v.value) for v in _fs(path, CHANNEL_VIEW)]
        assert all(value["final"] is True for _, value in rows)
        return rows

    def topic_recorder(name: str, final_views_s: float, last_mid: list[int] | None):
        path = tmp_path / name / "channel.jsonl"
        journal = Journal(path, time.monotonic_ns())
        rec = channel_recorder.ChannelRecorder("pulsar://fake:6650", journal, brokers=brokers, view_fetch=view,
                                               final_views_s=final_views_s)
        rec._last_mid = last_mid
        rec._drain = lambda: drains.append(len(_fs(path, CHANNEL_VIEW)))      # the read between rounds
        return rec, journal, path

    # the topic recorder: A applies the last message read ([3, 2, -1]; ledger and entry count) in the
    # second round; B errs
    drains: list[int] = []
    answers.update({A: [{"last_applied": [3, 1, -1]}, {"last_applied": [3, 2, 7]}],
                    B: [{"error": "HTTP 503"}]})
    rec, journal, path = topic_recorder("topic", 10.0, [3, 2, -1])
    rec._final_views()
    journal.close()
    assert [(k, v.get("last_applied", v.get("error"))) for k, v in final_rows(path)] == [
        (A, [3, 1, -1]), (B, "HTTP 503"), (A, [3, 2, 7]), (B, "HTTP 503")]
    assert drains == [2]
    # behind for good: one round when final_views_s is 0; a last_applied that is no list is behind too
    drains = []
    answers.update({A: [{"last_applied": (3, 2)}], B: [{"last_applied": [3, 2]}]})
    rec, journal, path = topic_recorder("bounded", 0.0, [3, 2, -1])
    rec._final_views()
    journal.close()
    assert len(final_rows(path)) == 2 and drains == []
    # nothing read and nothing applied: not behind; no brokers: no rounds
    answers.update({A: [{"last_applied": None}], B: [{}]})
    rec, journal, path = topic_recorder("empty", 10.0, None)
    rec._final_views()
    rec.brokers = []
    rec._final_views()
    journal.close()
    assert len(final_rows(path)) == 2 and drains == []

    # the metadata recorder: its table without the records found gone; B converges in the second round
    table = {PARENT: _rec("Owned", A, v=2), "public/default/0x80000000_0xffffffff": None}
    store_records = {PARENT: _rec("Owned", A, v=2)}
    answers.update({A: [{"records": store_records}], B: [{"records": {}}, {"records": store_records}]})
    path = tmp_path / "metadata" / "channel.jsonl"
    journal = Journal(path, time.monotonic_ns())
    meta = channel_recorder.MetadataChannelRecorder("127.0.0.1:1", journal, brokers=brokers, view_fetch=view,
                                                    final_views_s=10.0)
    meta._table = dict(table)
    meta._final_views()
    answers.update({B: [{"records": {}}]})
    meta.final_views_s = 0.0
    meta._final_views()                                   # B behind for good: one round
    journal.close()
    assert [(k, bool(v["records"])) for k, v in final_rows(path)] == [
        (A, True), (B, False), (A, True), (B, True), (A, True), (B, False)]
