"""The ledger workload: the plan (pure), the workload's own threads on real bookies over loopback (the
writer moves on after a recovery fences its ledger; with `bookie.ignore_fence` the fencing checker
catches the acknowledgements beyond the recovered end), and whole runs on a netns cluster."""
from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest

from checkers import fencing
from core.history import Journal
from core.spec import TestSpec as Spec
from core.store import merge_journals
from tests.bookie.cluster import bookies  # noqa: F401  (fixture)
from workloads import base, ledger
from workloads.base import Context
from tests.workloads import runs
from harness.catalog import CATALOG


def spec(**kw) -> Spec:
    d = dict(workload="ledger", test_name="lt", seed=7, concurrency=4, rate=100.0, time_limit=6.0,
             nemesis=[], final_read_timeout=30.0)
    d.update(kw)
    return Spec(**d).validate(catalog=CATALOG)


# ------------------------------------------------------------------------------------ the plan

def test_plan_is_seeded_unique_and_paced():
    s = spec()
    assert ledger.keys(s, "x") == [] and ledger.worker_count(s) == 2
    assert ledger.adders(s) == 3 and ledger.recoverer_process(s) == 3
    assert ledger.recoverer_worker(s, 2) == 1 and ledger.recoverer_worker(s, 1) == 0
    assert ledger.adders(spec(concurrency=1)) == 1
    take = lambda a: [next(g) for g in [ledger.generator(s, a)] for _ in range(200)]   # noqa: E731
    a0, a1 = take(0), take(1)
    assert a0 == take(0)                                      # same seed, same plan
    values = [p.value for p in a0 + a1]
    assert len(set(values)) == len(values)                    # unique across adders
    assert all(p.f == "add" and p.key == "" for p in a0)
    # rate 100 over 3 adders: mean delay 3/100 s
    mean = sum(p.delay for p in a0) / len(a0)
    assert 0.02 < mean < 0.04
    d = ledger.recover_delays(spec(options={"recover_interval": 2.0}))
    ds = [next(d) for _ in range(100)]
    assert all(1.0 <= x <= 3.0 for x in ds) and len(set(ds)) > 50


def test_options_are_validated():
    from core.spec import SpecError
    with pytest.raises(SpecError, match="recover_interval must be a number"):
        spec(options={"recover_interval": "soon"})
    with pytest.raises(SpecError, match="no option 'nope'"):
        spec(options={"nope": 1})
    assert spec(options={"recover_interval": 1}).options["recover_interval"] == 1.0


def test_checkers_are_fencing_and_perf_with_add_as_the_write():
    got = ledger.checkers(spec())
    from checkers import REGISTRY
    if "perf" in REGISTRY:
        assert got["perf"][1] == {"write_fs": ("add",)}
    if "fencing" in REGISTRY:
        assert got["fencing"][0] is REGISTRY["fencing"].check
    assert set(got) <= {"fencing", "perf"}


def test_final_read_payloads_decode_to_ints():
    assert ledger.decode(b"10000001") == 10000001 and ledger.decode(b"x") == "x"
    m = ledger.message_id(5, 7)
    assert (m.ledger_id, m.entry_id, m.partition, m.batch_index) == (5, 7, -1, -1)


def test_targeted_faults_hit_one_request_type_of_one_role():
    """The options' request faults: the recoverer loses its fencing LAC read to the ledger's target
    bookie (index ledger id mod E; the LAC reads go in ensemble order) and its write-backs; the writer's
    adds to that bookie are late, and from `lost_adds_from` on lost; other requests and the final reads'
    client are untouched."""
    from clusters.bookie import protocol as P
    from clusters.bookkeeper.channel import DROP

    class Handle:
        ledger_id, ensemble = 5, ["a:1", "b:1", "c:1"]

    class C:
        writer_handle = Handle()
    s = spec(ensemble=3, write_quorum=2, ack_quorum=2,
             options={"lost_fence": True, "slow_adds_ms": 300, "lost_adds_from": 50, "lost_recovery_adds": True})
    assert ledger.request_fault(spec(), "writer+recoverer", C()) is None          # no option: no fault
    assert ledger.request_fault(s, "final", C()) is None
    rec = ledger.request_fault(s, "recoverer", C())
    fence = (P.READ, P.FLAG_DO_FENCING | P.FLAG_HIGH_PRIORITY)
    assert [rec(a, *fence, 5, P.INVALID_ENTRY) for a in ("a:1", "b:1", "c:1")] == [None, None, DROP]   # 5 % 3
    assert [rec(a, *fence, 6, P.INVALID_ENTRY) for a in ("a:1", "b:1", "c:1")] == [DROP, None, None]   # 6 % 3
    assert rec("c:1", *fence, 5, 3) is None                                      # a recovery read, not the LAC's
    assert rec("a:1", P.ADD, P.FLAG_RECOVERY_ADD | P.FLAG_HIGH_PRIORITY, 5, 3) == DROP
    assert rec("c:1", P.ADD, P.FLAG_NONE, 5, 3) is None                          # not the writer
    w = ledger.request_fault(s, "writer", C())
    assert w("c:1", P.ADD, P.FLAG_NONE, 5, 3) == pytest.approx(0.3) and w("a:1", P.ADD, P.FLAG_NONE, 5, 3) is None
    assert w("c:1", P.ADD, P.FLAG_NONE, 4, 3) is None                            # not its current ledger
    assert w("a:1", P.ADD, P.FLAG_NONE, 5, 50) == DROP
    assert w("c:1", *fence, 5, P.INVALID_ENTRY) is None


def test_refused_adds_move_through_the_first_ensemble():
    """refused_adds_every=N: the writer's adds to the bookie at index i of the ledger's first ensemble are
    answered with an error, REFUSE_LATE_S late, from entry (i + 1) * N on; its replacements, other
    ledgers, other requests and the recoverer are untouched."""
    from clusters.bookie import protocol as P
    from clusters.bookkeeper.channel import Answer

    class W:
        first_ensembles = {5: ["a:1", "b:1", "c:1"]}

    class C:
        writer, writer_handle = W(), None
    s = spec(ensemble=3, write_quorum=3, ack_quorum=2, options={"refused_adds_every": 10})
    w = ledger.request_fault(s, "writer", C())
    refused = Answer(P.ERROR, ledger.REFUSE_LATE_S)
    assert [w(a, P.ADD, P.FLAG_NONE, 5, 9) for a in ("a:1", "b:1", "c:1")] == [None, None, None]
    assert [w(a, P.ADD, P.FLAG_NONE, 5, 10) for a in ("a:1", "b:1", "c:1")] == [refused, None, None]
    assert [w(a, P.ADD, P.FLAG_NONE, 5, 25) for a in ("a:1", "b:1", "c:1")] == [refused, refused, None]
    assert [w(a, P.ADD, P.FLAG_NONE, 5, 30) for a in ("a:1", "b:1", "c:1", "d:1")] == [refused] * 3 + [None]
    assert w("a:1", P.ADD, P.FLAG_NONE, 6, 30) is None                           # another ledger
    assert w("a:1", P.READ, P.FLAG_NONE, 5, 30) is None                          # not an add
    assert ledger.request_fault(s, "recoverer", C()) is None


# ------------------------------------------------------------------------------------ real bookies

def _run_workload(tmp_path: Path, zk: str, s: Spec) -> list:
    """The workload's start() in two 'worker processes' (threads here) and start_final() after, on
    real bookies; returns the merged history."""
    run_dir = tmp_path / f"2026{uuid.uuid4().hex[:8]}"
    (run_dir / "journals").mkdir(parents=True)
    t0 = time.monotonic_ns()
    cluster = {"zk_connect": zk, "nodes": []}
    ctxs = []
    for w in range(2):
        ctx = Context(run_dir=run_dir, spec=s, cluster=cluster, keys=[], worker=w, workers=2, name=f"worker-{w}",
                      journal=Journal(run_dir / "journals" / f"worker-{w}.jsonl", t0),
                      deadline=time.monotonic() + s.time_limit, out=sys.stdout)
        ctxs.append(ctx)
    threads = [t for ctx in ctxs for t in ledger.start(ctx)]
    for t in threads:
        t.join(s.time_limit + 60)
    assert not any(t.is_alive() for t in threads)
    fctx = Context(run_dir=run_dir, spec=s, cluster=cluster, keys=[], name="final-reads",
                   journal=Journal(run_dir / "journals" / "final-reads.jsonl", t0), out=sys.stdout)
    for t in ledger.start_final(fctx):
        t.join(s.final_read_timeout + 30)
    for ctx in (*ctxs, fctx):
        assert not ctx.crashed, ctx.crashed
        ctx.journal.close()
        for fn in ctx.cleanups:
            fn()
    return merge_journals(sorted((run_dir / "journals").glob("*.jsonl")))


def _ops(history, f, type_=None):
    return [op for op in history if op.f == f and (type_ is None or op.type == type_)]


@pytest.mark.timeout(180)
def test_writer_survives_recoveries_and_the_history_is_valid(bookies, zk, tmp_path):
    bookies.start(3)
    s = spec(options={"recover_interval": 1.5, "ledger_max_entries": 150})
    h = _run_workload(tmp_path, zk, s)
    adds = _ops(h, "add", "ok")
    recovers = _ops(h, "recover", "ok")
    reads = [op for op in _ops(h, "read", "ok") if op.process >= base.FINAL_PROCESS]
    assert len(adds) > 100 and len(recovers) >= 2
    ledgers = {op.key for op in adds}
    assert len(ledgers) >= 3                               # fenced and full ledgers were replaced
    assert {op.key for op in reads} >= ledgers             # every ledger used was read back at the end
    for op in adds:
        assert op.message_id.ledger_id == int(op.key) and op.message_id.partition == -1
    # a recovery fenced the ledger the writer was on: its next adds failed and it went on elsewhere
    assert any(op.type == "info" for op in _ops(h, "add"))
    assert all(op.value["last_entry"] >= -1 for op in recovers)
    res = fencing.check(h, {"final_process": base.FINAL_PROCESS})
    assert res.valid is True, json.dumps(res.anomalies, default=str)[:3000]
    assert res.stats["bk_ledgers"]["final_reads_ok"] >= len(ledgers)


@pytest.mark.timeout(180)
def test_ignore_fence_knob_is_caught_as_ack_after_fence(bookies, zk, tmp_path):
    bookies.start(3, bugs={"bookie.ignore_fence": True})
    s = spec(options={"recover_interval": 1.5, "ledger_max_entries": 0}, bugs={"bookie.ignore_fence": True})
    h = _run_workload(tmp_path, zk, s)
    recovers = _ops(h, "recover", "ok")
    assert recovers, "no recovery ran"
    # the writer never noticed: one ledger, adds acknowledged after it was recovered and closed
    assert len({op.key for op in _ops(h, "add", "ok")}) == 1
    res = fencing.check(h, {"final_process": base.FINAL_PROCESS})
    assert res.valid is False
    assert res.stats["anomaly_counts"].get("ack-after-fence", 0) > 0, res.stats["anomaly_counts"]


# ------------------------------------------------------------------------------------ whole runs

def _run(tmp_path: Path, **kw) -> tuple[int, dict, str]:
    return runs.run(tmp_path, "lw", workload="ledger", **kw)[:3]


@pytest.mark.integration
def test_run_under_kills_pauses_and_partitions_is_valid(tmp_path):
    # 4 bookies for E=3: a killed or paused bookie is replaced by an ensemble change
    code, res, out = _run(tmp_path, time_limit=15.0, bookies=4, nemesis=["kill", "pause", "partition", "zk-isolate"],
                          nemesis_interval=3.0)
    assert "fencing" in res["checkers"], f"the fencing checker is not registered: {list(res['checkers'])}"
    f = res["checkers"]["fencing"]
    assert code == 0 and res["valid"] is True, (out, {k: c["anomalies"] for k, c in res["checkers"].items()})
    s = f["stats"]["bk_ledgers"]
    assert s["ok_adds"] > 300 and s["ok_recovers"] >= 2 and s["ledgers"] >= 3
    assert s["final_reads_ok"] >= s["ledgers"] and s["ledgers_without_final_read"] == 0
    assert res["checkers"]["perf"]["valid"] is True


# The must-fail run of this workload is made once in tests/spark_analysis/test_real_runs.py, which
# asserts what this file did and uses the same run for the campaign analysis's expectations.
