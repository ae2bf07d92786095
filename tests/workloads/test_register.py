"""The register workload: the plan (pure), the op mapping on a real ZooKeeper over loopback (versioned
cas keeps the history linearizable; `cas=unsafe` loses updates and the linear checker says so), and
whole runs on a netns cluster with 3 ZooKeeper nodes under partitions."""
from __future__ import annotations

import json
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from core.history import FAIL, OK, Journal
from core.spec import TestSpec as Spec
from core.store import merge_journals
from workloads import base, register
from workloads.base import Context
from tests.workloads import runs
from harness.catalog import CATALOG


def spec(**kw) -> Spec:
    d = dict(workload="register", test_name="rt", seed=11, concurrency=6, rate=200.0, time_limit=5.0,
             topics=2, nemesis=[], final_read_timeout=20.0)
    d.update(kw)
    return Spec(**d).validate(catalog=CATALOG)


def linear(history, **opts):
    from checkers import linear as lin
    return lin.check(history, {"model": "cas-register", "time_limit_s": 60, **opts})


# ------------------------------------------------------------------------------------ the plan

def test_plan_is_jepsens_mix_on_small_values():
    s = spec()
    assert register.keys(s, "x") == [] and register.registers(s) == ["r0", "r1"]
    assert register.worker_count(s) == 2 and register.worker_count(spec(concurrency=1)) == 1
    assert [t.worker for t in register.threads(s)] == [0, 1, 0, 1, 0, 1]
    g = register.generator(s, 3)
    ops = [next(g) for _ in range(600)]
    again = register.generator(s, 3)
    assert ops == [next(again) for _ in range(600)]
    fs = Counter(p.f for p in ops)
    assert set(fs) == {"read", "write", "cas"} and min(fs.values()) > 150
    assert {p.key for p in ops} == {"r0", "r1"}
    for p in ops:
        if p.f == "read":
            assert p.value is None
        elif p.f == "write":
            assert p.value in range(register.VALUES)
        else:
            assert len(p.value) == 2 and all(v in range(register.VALUES) for v in p.value)
    assert 0.02 < sum(p.delay for p in ops) / len(ops) < 0.04       # 200/s over 6 threads


def test_options_and_values():
    from core.spec import SpecError
    with pytest.raises(SpecError, match="cas must be one of versioned, unsafe"):
        spec(options={"cas": "sloppy"})
    with pytest.raises(SpecError, match="sync_reads must be true or false"):
        spec(options={"sync_reads": "yes please"})
    assert register.decode(b"") is None and register.decode(b"3") == 3 and register.encode(3) == b"3"


def test_checkers_are_linear_cas_register_and_perf():
    from checkers import REGISTRY
    got = register.checkers(spec())
    assert set(got) <= {"linear", "perf"}
    if "linear" in REGISTRY:
        assert got["linear"][1]["model"] == "cas-register"
    if "perf" in REGISTRY:
        assert got["perf"][1] == {"write_fs": ("write", "cas")}


# ------------------------------------------------------------------------------------ real ZooKeeper

def test_op_mapping_on_a_real_zookeeper(zk):
    reg = register.Register(zk, "/reg", sync_reads=True)
    try:
        reg.ensure(["a"])
        assert reg.perform("read", "a", None)[:1] == (OK,) and reg.perform("read", "a", None)[1]["value"] is None
        t, ch = reg.perform("cas", "a", [0, 1])
        assert t == FAIL and "not 0" in ch["error"]               # empty register: None, not 0
        assert reg.perform("write", "a", 2)[0] == OK
        assert reg.perform("read", "a", None)[1]["value"] == 2
        assert reg.perform("cas", "a", [2, 4])[0] == OK
        assert reg.perform("cas", "a", [2, 3])[0] == FAIL
        assert reg.perform("read", "a", None)[1]["value"] == 4
        assert reg.perform("write", "missing", 1)[0] == FAIL        # NoNode: certainly not written
        # a versioned set that loses the race is a fail (BadVersion), never info
        cur, version = reg._get("a")
        reg.perform("write", "a", 1)
        from kazoo.exceptions import BadVersionError
        with pytest.raises(BadVersionError):
            reg._set("a", 3, version)
    finally:
        reg.close()


def test_closed_session_fails_reads_and_leaves_writes_indeterminate(zk):
    reg = register.Register(zk, "/reg2")
    try:
        reg.ensure(["a"])
        reg.zk.stop()                                              # the session is gone: nothing is sent
        assert reg.perform("read", "a", None)[0] == FAIL
        assert reg.perform("write", "a", 1)[0] == FAIL
    finally:
        reg.close()


def _run_workload(tmp_path: Path, zk: str, s: Spec) -> list:
    run_dir = tmp_path / f"2026{uuid.uuid4().hex[:8]}"
    (run_dir / "journals").mkdir(parents=True)
    t0 = time.monotonic_ns()
    cluster = {"zk_connect": zk, "nodes": []}
    ctxs = [Context(run_dir=run_dir, spec=s, cluster=cluster, keys=[], worker=w, workers=2, name=f"worker-{w}",
                    journal=Journal(run_dir / "journals" / f"worker-{w}.jsonl", t0),
                    deadline=time.monotonic() + s.time_limit, out=sys.stdout) for w in range(2)]
    threads = [t for ctx in ctxs for t in register.start(ctx)]
    for t in threads:
        t.join(s.time_limit + 60)
    fctx = Context(run_dir=run_dir, spec=s, cluster=cluster, keys=[], name="final-reads",
                   journal=Journal(run_dir / "journals" / "final-reads.jsonl", t0), out=sys.stdout)
    for t in register.start_final(fctx):
        t.join(60)
    for ctx in (*ctxs, fctx):
        assert not ctx.crashed, ctx.crashed
        ctx.journal.close()
        for fn in ctx.cleanups:
            fn()
    return merge_journals(sorted((run_dir / "journals").glob("*.jsonl")))


@pytest.mark.timeout(180)
def test_versioned_cas_is_linearizable_on_a_real_zookeeper(zk, tmp_path):
    h = _run_workload(tmp_path, zk, spec())
    kinds = Counter((op.f, op.type) for op in h)
    assert kinds[("cas", OK)] > 10 and kinds[("cas", FAIL)] > 10 and kinds[("write", OK)] > 100
    finals = [op for op in h if op.process >= base.FINAL_PROCESS and op.type == OK]
    assert sorted(op.key for op in finals) == ["r0", "r1"]
    res = linear(h)
    assert res.valid is True, json.dumps(res.anomalies, default=str)[:2000]


@pytest.mark.timeout(180)
def test_unsafe_cas_loses_updates_and_is_not_linearizable(zk, tmp_path):
    # one register, many processes: concurrent cas from the same value both succeed
    h = _run_workload(tmp_path, zk, spec(options={"cas": "unsafe"}, topics=1, concurrency=16, rate=800.0))
    res = linear(h)
    assert res.valid is False, res.stats


# ------------------------------------------------------------------------------------ whole runs

def _run(tmp_path: Path, **kw) -> tuple[int, dict, str]:
    return runs.run(tmp_path, "rw", workload="register", **kw)[:3]


@pytest.mark.integration
def test_run_on_three_zookeepers_under_partitions_is_linearizable(tmp_path):
    # partitions that reach ZooKeeper (ring and bridge shapes over every server); a fault holds 6 s, longer
    # than the ensemble's syncLimit (10 ticks of 0.5 s), so a cut-off follower drops its sessions
    code, res, out = _run(tmp_path, time_limit=20.0, zookeepers=3, concurrency=8, rate=100.0,
                          nemesis=["partition-ring", "partition-bridge"], nemesis_interval=6.0)
    assert "linear" in res["checkers"], f"the linear checker is not registered: {list(res['checkers'])}"
    assert code == 0 and res["valid"] is True, (out, {k: c["anomalies"] for k, c in res["checkers"].items()})
    assert res["checkers"]["linear"]["valid"] is True


# The must-fail run of this workload is made once in tests/spark_analysis/test_real_runs.py, which
# asserts what this file did and uses the same run for the campaign analysis's expectations.
