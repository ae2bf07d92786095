"""The ownership recorder against a real ZooKeeper (the `zk_server` fixture), with bundle locks made and
dropped by two kazoo sessions as two brokers would; and the ownership checker's verdict on what it
recorded, both ways. Also: the recorder through the runner, and across a lost session.

This module is also a tiny workload (`ownership-probe`, registered by the runner test only) whose
checkers are the ownership checker, so the runner starts the recorder for it."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from checkers import select
from checkers.ownership import check
from core import store
from core.history import OBSERVER_PROCESS, Journal, Op, read_jsonl
from core.observations import BUNDLE_OWNER, GAP_END, GAP_START, OBSERVE_START, OBSERVE_STOP
from core.spec import TestSpec as Spec
from harness import recorder, runner
from tests.conftest import fresh_chroot

NS = "public/default"
LOW = f"/namespace/{NS}/0x00000000_0x80000000"
QUARTER = f"/namespace/{NS}/0x00000000_0x40000000"
CLUSTER = {"zk_connect": "", "nodes": [
    {"name": "broker-1", "role": "broker", "host": "127.0.0.1", "ports": {"pulsar": 6650, "http": 8080}},
    {"name": "broker-2", "role": "broker", "host": "127.0.0.2", "ports": {"pulsar": 6650, "http": 8080}}]}


def _broker(zk: str, n: int) -> KazooClient:
    c = KazooClient(hosts=zk, timeout=10.0)
    c.start(15)
    return c


def _lock(c: KazooClient, path: str, n: int) -> None:
    c.create(path, json.dumps({"broker": f"127.0.0.{n}:6650", "name": f"broker-{n}"}).encode(),
             ephemeral=True, makepath=True)


def _until(pred, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _rows(path: Path, f: str | None = None) -> list[Op]:
    return [op for op in read_jsonl(path) if f is None or op.f == f]


class _Recording:
    """A recorder journaling into tmp/journals/ownership.jsonl from t0, stopped (always) at exit."""

    def __init__(self, zk: str, tmp: Path, **kw: Any):
        self.t0 = time.monotonic_ns()
        self.path = tmp / "journals" / recorder.JOURNAL_NAME
        self.journal = Journal(self.path, self.t0)
        self.rec = recorder.record(zk, self.journal, CLUSTER, **kw)

    def __enter__(self) -> "_Recording":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.rec.stop()
        self.journal.close()

    def seen(self, path: str, event: str) -> bool:
        return any(op.value.get("path") == path and op.value.get("event") == event
                   for op in _rows(self.path, BUNDLE_OWNER))


def _scenario(zk: str, tmp: Path, overlapping: bool) -> list[Op]:
    """broker-1 holds LOW; broker-2 takes QUARTER (a split child of LOW) either while broker-1 still
    holds LOW (overlapping) or after broker-1 released it; a client's send to a topic in QUARTER is
    served by broker-2 in between. Returns the merged history (recorder + client journal)."""
    b1, b2 = _broker(zk, 1), _broker(zk, 2)
    try:
        _lock(b1, LOW, 1)             # before the recorder starts: found by its first read
        with _Recording(zk, tmp) as r:
            _until(lambda: r.seen(LOW, "present"), "the first read")
            if not overlapping:
                b1.delete(LOW)
                _until(lambda: r.seen(LOW, "deleted"), "LOW released")
            _lock(b2, QUARTER, 2)
            _until(lambda: r.seen(QUARTER, "created"), "QUARTER taken")
            client = Journal(tmp / "journals" / "worker-0.jsonl", r.t0)
            topic = _topic_in_quarter()
            inv = client.append(Op(process=0, type="invoke", f="send", key=topic, value=1))
            time.sleep(0.05)
            client.append(inv.complete("ok", node="broker-2"))
            client.close()
            time.sleep(0.3)
            if overlapping:
                b1.delete(LOW)
                _until(lambda: r.seen(LOW, "deleted"), "LOW released")
            b2.stop()                 # a broker's session ends: its ephemeral lock goes
            _until(lambda: r.seen(QUARTER, "deleted"), "QUARTER released with its session")
    finally:
        for c in (b1, b2):
            c.stop()
            c.close()
    return store.merge_journals(store.journal_paths(tmp))


def _topic_in_quarter() -> str:
    import zlib
    return next(t for t in (f"persistent://{NS}/t{i}" for i in range(1000))
                if zlib.crc32(t.encode()) < 0x40000000)


def test_sequential_owners_are_valid(zk_server, tmp_path):
    zk = fresh_chroot(zk_server)
    h = _scenario(zk, tmp_path, overlapping=False)
    starts = [op for op in h if op.f == OBSERVE_START]
    assert len(starts) == 1 and starts[0].process == OBSERVER_PROCESS
    locks = [(op.value["path"], op.value["event"], op.value["broker"]) for op in h if op.f == BUNDLE_OWNER]
    assert locks == [(LOW, "present", "127.0.0.1:6650"), (LOW, "deleted", "127.0.0.1:6650"),
                     (QUARTER, "created", "127.0.0.2:6650"), (QUARTER, "deleted", "127.0.0.2:6650")]
    created = next(op for op in h if op.f == BUNDLE_OWNER and op.value["event"] == "created")
    assert created.value["czxid"] > 0 and created.value["session"].startswith("0x")
    # neutral rows: keyed by the bundle, the lock's czxid its incarnation
    assert created.key == QUARTER.split("/", 2)[2] and created.value["source"] == "zk-lock"
    assert created.value["incarnation"] == created.value["czxid"]
    assert h[-1].f == OBSERVE_STOP
    r = check(h, {"tolerance_s": 0.02})
    assert r.valid is True, r.anomalies
    assert r.stats["served_judged"] == 1
    assert [s["broker"] for s in r.stats["timeline"]] == ["broker-1", "broker-2"]


def test_overlapping_owners_are_a_double_owner(zk_server, tmp_path):
    zk = fresh_chroot(zk_server)
    h = _scenario(zk, tmp_path, overlapping=True)
    r = check(h, {"tolerance_s": 0.02})
    assert r.valid is False
    kinds = sorted(c["kind"] for c in r.anomalies["double-owner"])
    assert kinds == ["lock/lock", "lock/serve"]
    lock_lock = next(c for c in r.anomalies["double-owner"] if c["kind"] == "lock/lock")
    assert lock_lock["brokers"] == ["broker-1", "broker-2"]
    assert lock_lock["bundles"] == ["0x00000000_0x80000000", "0x00000000_0x40000000"]
    assert lock_lock["to_s"] - lock_lock["from_s"] > 0.3
    assert "served-without-lock" not in r.anomalies      # broker-2 held QUARTER when it served


def test_the_recorder_watches_again_after_its_session_is_lost(zk_server, tmp_path):
    zk = fresh_chroot(zk_server)
    b1 = _broker(zk, 1)
    try:
        with _Recording(zk, tmp_path, session_timeout_s=4.0) as r:
            _until(lambda: any(op.f == OBSERVE_START for op in _rows(r.path)), "the start")
            # expire the recorder's session from outside, as ZooKeeper does after a long cut
            sid, pw = r.rec._zk.client_id
            twin = KazooClient(hosts=zk, client_id=(sid, pw), timeout=4.0)
            twin.start(15)
            twin.stop()
            twin.close()
            _lock(b1, LOW, 1)         # made while the recorder has no session (or just after)
            _until(lambda: bool(_rows(r.path, GAP_END)), "the end of the gap", 20.0)
            _until(lambda: r.seen(LOW, "present") or r.seen(LOW, "created"), "LOW after the gap")
            b1.delete(LOW)
            _until(lambda: r.seen(LOW, "deleted"), "LOW released after the gap")
    finally:
        b1.stop()
        b1.close()
    rows = _rows(r.path)
    gap_start = next(op for op in rows if op.f == GAP_START)
    gap_end = next(op for op in rows if op.f == GAP_END)
    assert gap_start.value["reason"]           # lost, suspended, or the read that failed first
    assert gap_start.value["may_start_s"] <= gap_start.value["detected_s"] <= gap_end.time_ns / 1e9
    assert gap_end.value["session"] != rows[0].value["session"]          # a new session
    r2 = check(list(read_jsonl(r.path)))
    assert r2.valid is True and len(r2.stats["gaps"]) == 1


def test_an_unreachable_zookeeper_is_one_line(tmp_path):
    j = Journal(tmp_path / "j.jsonl", time.monotonic_ns())
    with pytest.raises(recorder.RecorderError) as e:
        recorder.record("127.0.0.1:1", j, timeout=1.0)
    assert "unreachable" in str(e.value) and "fix:" in str(e.value) and "\n" not in str(e.value)
    j.close()


def test_the_recorder_never_writes_to_zookeeper(zk_server, tmp_path):
    """Watching a root that does not exist (no leader yet) must not create it: a persistent
    /loadbalance/leader would stop every broker from ever being elected."""
    zk = fresh_chroot(zk_server)
    with _Recording(zk, tmp_path):
        time.sleep(0.5)
    c = _broker(zk, 1)
    try:
        assert c.exists("/loadbalance/leader") is None and c.exists("/namespace") is None
    finally:
        c.stop()
        c.close()


# ------------------------------------------------------------------------------------ through the runner

DESCRIPTION = "ownership-probe (tests only): the ownership checker on locks made by the test"
OPTIONS: dict[str, tuple[Any, str]] = {}


def keys(spec: Spec, run_id: str) -> list[str]:
    return []


def worker_count(spec: Spec) -> int:
    return 0


def start(ctx: Any) -> list[threading.Thread]:
    return []


def start_final(ctx: Any) -> list[threading.Thread]:
    return []


def checkers(spec: Spec | None = None):
    return select({"ownership": {"tolerance_s": 0.02}})


class _FakeCluster:
    def __init__(self, base: Path):
        self.base_dir = base
        base.mkdir(parents=True, exist_ok=True)

    def down(self) -> None:
        pass


def test_the_runner_records_for_the_ownership_checker(zk_server, tmp_path):
    import workloads
    from workloads import WorkloadEntry
    zk = fresh_chroot(zk_server)
    workloads.REGISTRY.register("ownership-probe", WorkloadEntry(__name__), replace=True)
    b1, b2 = _broker(zk, 1), _broker(zk, 2)
    try:
        spec = Spec(test_name="probe", workload="ownership-probe", results_dir=str(tmp_path), nemesis=[],
                        settle=0).resolved()
        run_dir = store.create_run_dir(tmp_path, spec.test_name)
        store.write_test_toml(run_dir, spec)
        r = runner.Run(spec, run_dir, out=open(run_dir / "out.txt", "w"))

        def deploy():
            r.cluster = _FakeCluster(tmp_path / "cluster")
            store.write_json(run_dir / store.CLUSTER_JSON, {**CLUSTER, "zk_connect": zk})

        def workload():
            r.t0_ns = time.monotonic_ns()
            r._start_observers()
            path = run_dir / "journals" / recorder.JOURNAL_NAME
            _lock(b1, LOW, 1)
            _lock(b2, QUARTER, 2)                     # a child owned by another broker: double owner
            _until(lambda: sum(op.f == BUNDLE_OWNER for op in _rows(path)) == 2, "both locks")
            time.sleep(0.2)
            raise RuntimeError("the workload stops here")   # the runner must still stop the recorder

        r._deploy, r._workload = deploy, workload
        code = r.execute()
    finally:
        workloads.REGISTRY.unregister("ownership-probe")
        for c in (b1, b2):
            c.stop()
            c.close()
    assert code == 2                                   # the error makes the run unknown ...
    res = json.loads((run_dir / "results.json").read_text())
    own = res["checkers"]["ownership"]
    assert own["valid"] is False                        # ... and the checker still found the double owner
    assert own["anomalies"]["double-owner"][0]["kind"] == "lock/lock"
    assert [op.f for op in store.load_history(run_dir)][-1] == OBSERVE_STOP
    assert r.observers == []


def test_brokers_lb_events_become_history_rows(tmp_path):
    from harness.lb_events import JOURNAL_NAME, import_lb_events
    t0 = 5_000_000_000
    b = f"{NS}/0x00000000_0x80000000"
    logs = {"broker-1": ["12:00:01 INFO lb: LB_EVENT " + json.dumps(
                {"event": "unload", "bundle": b, "source": "127.0.0.1:6650", "destination": "127.0.0.1:6650",
                 "reason": "shed:ThresholdShedder", "leader": "127.0.0.1:6650", "mono_ns": t0 + 2_000_000_000}),
                         "12:00:02 INFO something else", "12:00:03 INFO lb: LB_EVENT {not json",
                         "12:00:04 INFO lb: LB_EVENT " + json.dumps({"event": "unload", "bundle": b})],
            # the same leader's decision, logged by another broker's process (the checker compares the unloads
            # of one leader process: broker or leader, and incarnation)
            "broker-2": ["LB_EVENT " + json.dumps({"event": "unload", "bundle": b, "source": "127.0.0.2:6650",
                                                   "destination": "127.0.0.1:6650", "reason": "shed:ThresholdShedder",
                                                   "leader": "127.0.0.1:6650", "mono_ns": t0 + 1_000_000_000})]}
    for name, lines in logs.items():
        (tmp_path / "nodes" / name).mkdir(parents=True)
        (tmp_path / "nodes" / name / "node.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "journals").mkdir()
    assert import_lb_events(tmp_path, t0) == {"events": 2, "untimed": 1, "malformed": 1}
    rows = list(read_jsonl(tmp_path / "journals" / JOURNAL_NAME))
    assert [(op.time_ns, op.value["logged_by"], op.process) for op in rows] == [
        (1_000_000_000, "broker-2", OBSERVER_PROCESS), (2_000_000_000, "broker-1", OBSERVER_PROCESS)]
    start = Op(process=OBSERVER_PROCESS, type="ok", f=OBSERVE_START, value={"nodes": {}, "ports": {}})
    r = check([start] + rows, {"grace_s": 60})
    assert r.valid is False
    assert r.stats["anomaly_counts"] == {"shed-to-owner": 1, "unload-within-grace": 1}


def test_registrations_are_recorded_without_their_load_reports(zk_server, tmp_path):
    """A broker's /loadbalance/brokers/<id> znode (its session) is journaled when it comes and goes;
    its value, a load report rewritten all the time, is not."""
    from core.observations import BROKER_REGISTRATION
    zk = fresh_chroot(zk_server)
    b1 = _broker(zk, 1)
    reg = "/loadbalance/brokers/127.0.0.1:6650"
    try:
        b1.create(reg, b'{"cpu": 1}', ephemeral=True, makepath=True)
        with _Recording(zk, tmp_path) as r:
            _until(lambda: any(op.f == BROKER_REGISTRATION for op in _rows(r.path)), "the registration")
            for i in range(5):
                b1.set(reg, json.dumps({"cpu": i}).encode())
            time.sleep(0.3)
            b1.stop()                 # the session ends: the registration goes
            _until(lambda: any(op.f == BROKER_REGISTRATION and op.value["event"] == "deleted"
                               for op in _rows(r.path)), "the registration's end")
    finally:
        b1.stop()
        b1.close()
    rows = [(op.value["event"], op.value["broker"]) for op in _rows(r.path, BROKER_REGISTRATION)]
    assert rows == [("present", "127.0.0.1:6650"), ("deleted", "127.0.0.1:6650")]


def test_locks_under_a_namespace_made_while_watching_are_created_not_present(zk_server, tmp_path):
    """/namespace did not exist when the recorder started; the first lock makes its whole path: a
    creation seen as it happened, not a lock found by a read of the whole tree."""
    zk = fresh_chroot(zk_server)
    b1 = _broker(zk, 1)
    try:
        with _Recording(zk, tmp_path) as r:
            _until(lambda: any(op.f == OBSERVE_START for op in _rows(r.path)), "the start")
            time.sleep(0.3)
            _lock(b1, LOW, 1)
            _until(lambda: r.seen(LOW, "created") or r.seen(LOW, "present"), "LOW")
    finally:
        b1.stop()
        b1.close()
    assert r.seen(LOW, "created") and not r.seen(LOW, "present")


def test_a_lock_seen_gone_whose_name_is_listed_again_is_read_again(zk_server, tmp_path):
    """A lock deleted and created again between two listings of its namespace (a broker's session expires,
    another broker locks the bundle at once) shows no difference in the listing; the recorder must still
    read the name it last saw gone, or the new owner's lock goes unrecorded and its ops look served
    without a lock."""
    zk = fresh_chroot(zk_server)
    b1 = _broker(zk, 1)
    try:
        _lock(b1, LOW, 1)
        with _Recording(zk, tmp_path) as r:
            _until(lambda: r.seen(LOW, "present"), "the first read")
            # what the recorder is left with when its read of the deleted lock raced the new creation
            # (NoNode, then the lock back before the exists-watch): the name seen gone, still listed
            r.rec._gone(LOW)
            r.rec._q.put(("path", f"/namespace/{NS}"))
            _until(lambda: r.seen(LOW, "created"), "the lock read again from the listing")
    finally:
        b1.stop()
        b1.close()
