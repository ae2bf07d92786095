"""core.detection: time to first detection, a run's scenario, and the detection matrix, on small hand-made
histories and results."""
from __future__ import annotations

import pytest

from checkers import log as log_checker
from core import detection as det
from core.expectation import Unsafe
from core.history import FAIL, INFO, INVOKE, NEMESIS_PROCESS, OK, Op

S = 1_000_000_000


def nem(t_s: float, type_: str, f: str) -> Op:
    return Op(process=NEMESIS_PROCESS, type=type_, f=f, time_ns=int(t_s * S))


def ref(index: int, t_s: float, f: str = "send") -> dict:
    return {"index": index, "time_s": t_s, "process": 1, "type": "ok", "f": f, "node": None}


def lost(index: int, t_s: float) -> dict:
    # the log checker's shape: the send's refs, and the final read that misses it (later)
    return {"value": index, "topic": "t", "invoke": ref(index - 1, t_s - 0.01), "completion": ref(index, t_s),
            "missing_from_reads": [ref(9000, 99.0, "read")]}


FAULT = [nem(5.0, INVOKE, "start-partition"), nem(5.2, OK, "start-partition"),
         nem(15.0, INVOKE, "stop-partition"), nem(15.1, OK, "stop-partition")]


def test_first_fault_is_the_first_start_that_did_not_fail():
    failed = [nem(1.0, INVOKE, "start-kill"), nem(1.5, FAIL, "start-kill")]
    heal = [nem(0.5, INVOKE, "heal"), nem(0.6, OK, "heal")]
    client = [Op(process=0, type=INVOKE, f="send", time_ns=S // 10)]
    assert det.first_fault(client + heal + failed + FAULT) == (5.0, "partition")
    assert det.first_fault(client + heal + failed) == (None, None)
    # a one-shot fault (kill) is a fault from its invocation; an indeterminate start still counts
    assert det.first_fault([nem(3.0, INVOKE, "kill"), nem(3.4, OK, "kill")] + FAULT) == (3.0, "kill")
    assert det.first_fault([nem(4.0, INVOKE, "start-pause"), nem(4.5, INFO, "start-pause")]) == (4.0, "pause")


def test_anomaly_after_the_fault():
    checkers = {"log": {"valid": False, "anomalies": {"lost": [lost(300, 17.5), lost(120, 12.25)]},
                        "stats": {"invalid_types": ["lost"], "anomaly_counts": {"lost": 2}}}}
    d = det.first_detection(checkers, 5.0, "partition")
    assert d == {"checker": "log", "type": "lost", "fault": "partition", "first_fault_s": 5.0,
                 "first_op_s": 12.24, "first_op_index": 119, "seconds": 7.24, "evidence_capped": False, "note": ""}
    assert "7.24 s (log: lost at t = 12.24 s, op 119; first fault partition at t = 5.0 s)" in det.text(d)


def test_anomaly_before_the_fault_is_negative_and_said_so():
    checkers = {"log": {"valid": False, "anomalies": {"lost": [lost(10, 2.0)]}, "stats": {}}}
    d = det.first_detection(checkers, 5.0, "partition")
    assert d["seconds"] == -3.01 and "precedes the first fault" in d["note"]


def test_no_fault_measures_from_the_start():
    checkers = {"log": {"valid": False, "anomalies": {"lost": [lost(10, 2.0)]}}}
    d = det.first_detection(checkers, None, None)
    assert (d["fault"], d["first_fault_s"], d["seconds"]) == (None, 0.0, 1.99)
    assert "no fault" in d["note"] and "no fault: from the run's start" in det.text(d)


def test_two_failing_checkers_the_earliest_op_decides_and_valid_ones_are_ignored():
    checkers = {
        "log": {"valid": False, "anomalies": {"lost": [lost(300, 17.5)],
                                              # duplicates do not invalidate a log run: not the decider
                                              "duplicate": [{"reads": [ref(5, 6.0, "read")]}]},
                "stats": {"invalid_types": ["lost", "divergence"]}},
        "fencing": {"valid": False, "anomalies": {"acked-then-lost": [
            {"add": [{"index": 200, "time_ns": 9_500_000_000, "f": "add"}], "final_read": None}]}},
        "perf": {"valid": True, "anomalies": {"slow": [{"op": ref(1, 0.1)}]}},
    }
    d = det.first_detection(checkers, 5.0, "partition")
    assert (d["checker"], d["type"], d["first_op_s"], d["first_op_index"], d["seconds"]) == \
        ("fencing", "acked-then-lost", 9.5, 200, 4.5)
    # the same with only the log checker invalid: its lost send, not its duplicate's read at 6.0
    checkers["fencing"]["valid"] = True
    assert det.first_detection(checkers, 5.0, "partition")["first_op_s"] == 17.49


def test_evidence_without_op_refs_and_a_capped_type():
    checkers = {"balance": {"valid": False, "anomalies": {"double-owner": [{"bundle": "b", "brokers": [1, 2]}]}}}
    d = det.first_detection(checkers, 5.0, "kill")
    assert (d["checker"], d["type"], d["seconds"], d["first_op_s"]) == ("balance", "double-owner", None, None)
    assert "names no operation" in d["note"] and "time to first detection: n/a" in det.text(d)
    capped = {"log": {"valid": False, "anomalies": {"lost": [lost(300, 17.5)]},
                      "stats": {"anomalies_truncated": {"lost": 40}}}}
    d = det.first_detection(capped, 5.0, "kill")
    assert d["evidence_capped"] is True and "upper bound" in d["note"]


def test_valid_or_unknown_runs_have_no_detection():
    checkers = {"log": {"valid": True, "anomalies": {}}}
    assert det.first_detection(checkers, 5.0, "kill") is None
    assert det.detection_of(FAULT, {"log": {"valid": False, "anomalies": {"lost": [lost(3, 6.0)]}}}, "unknown") is None


def test_detection_of_a_real_log_check():
    """The log checker's own evidence over a small history: a send acknowledged at 6.1 s, after a partition
    from 5 s, missing from the final read."""
    def op(i, t, p, type_, f, v=None, mid=None):
        from core.history import MessageId
        return Op(process=p, type=type_, f=f, key="t", value=v, time_ns=int(t * S), index=i,
                  message_id=MessageId(*mid) if mid else None)
    h = [op(0, 1.0, 0, INVOKE, "send", 1), op(1, 1.1, 0, OK, "send", 1, (3, 0, -1, -1)),
         *[Op(**{**vars(o), "index": 2 + i}) for i, o in enumerate(FAULT[:2])],
         op(4, 6.0, 0, INVOKE, "send", 2), op(5, 6.1, 0, OK, "send", 2, (3, 1, -1, -1)),
         *[Op(**{**vars(o), "index": 6 + i}) for i, o in enumerate(FAULT[2:])],
         op(8, 20.0, 1_000_000, INVOKE, "read"),
         op(9, 20.5, 1_000_000, OK, "read", [{"value": 1, "message_id": {"ledger_id": 3, "entry_id": 0}}])]
    res = log_checker.check(h, dict(log_checker.DEFAULTS))
    assert res.valid is False
    d = det.detection_of(h, {"log": res}, False)
    assert (d["checker"], d["type"], d["fault"], d["first_fault_s"]) == ("log", "lost", "partition", 5.0)
    assert d["first_op_s"] == pytest.approx(6.0) and d["seconds"] == pytest.approx(1.0)


def test_an_informational_type_named_earlier_does_not_decide():
    """A checker's stats from checkers.toolkit name its invalidating types: an informational case on an
    earlier op (the ownership checker's served-after-session-loss) is not the detection."""
    from checkers.toolkit import Cases, anomalies_of, anomaly_stats
    cases = {"served-after-session-loss": Cases(10), "served-without-lock": Cases(10)}
    cases["served-after-session-loss"].add(lambda: {"index": 4, "time_s": 6.0})
    cases["served-without-lock"].add(lambda: {"index": 9, "time_s": 8.5})
    checker = {"valid": False, "anomalies": anomalies_of(cases), "stats": anomaly_stats(cases, ["served-without-lock"])}
    d = det.first_detection({"ownership": checker}, 5.0, "zk-isolate")
    assert (d["type"], d["first_op_index"], d["seconds"]) == ("served-without-lock", 9, 3.5)
    checker["stats"] = anomaly_stats(cases)          # without the types named, the earliest op decides
    assert det.first_detection({"ownership": checker}, 5.0, "zk-isolate")["type"] == "served-after-session-loss"


# ------------------------------------------------------------------------------- scenario and matrix

SPEC = {"test_name": "detection-log-zk-isolate-1", "workload": "log", "nemesis": ["zk-isolate"], "seed": 1001,
        "results_dir": "/tmp/x", "time_limit": 35.0, "bugs": {}, "expected": "valid",
        "expected_reason": "no bug knob or unsafe option is on", "options": {}}


def test_a_scenario_is_the_spec_without_knobs_seeds_names_and_expectation():
    label, key = det.scenario(SPEC)
    assert label == "log / zk-isolate" and len(key) == 12
    knob = {**SPEC, "test_name": "other-2", "seed": 7, "bugs": {"broker.recovery_fencing": False},
            "expected": "invalid", "expected_reason": "bug knob", "time_limit": 35}
    assert det.scenario(knob) == (label, key)                      # 35 and 35.0 are one value
    assert det.scenario({**SPEC, "time_limit": 30})[1] != key          # another scenario
    assert det.scenario({**SPEC, "nemesis": "zk-isolate"})[1] == key   # a campaign's comma string
    assert det.scenario({**SPEC, "options": {"delay_max_ms": 3000}, "ensemble": 3, "write_quorum": 1,
                         "ack_quorum": 1})[0] == "log / zk-isolate / 3/1/1 / delay_max_ms=3000"
    sched = {**SPEC, "nemesis": [], "nemesis_schedule": [{"at": 5, "name": "disk-wipe:ledger-bookies", "hold": 3}]}
    assert det.scenario(sched)[0] == "log / scheduled disk-wipe:ledger-bookies"
    # a workload's unsafe setting: its options dropped, so the run with it and without share a scenario
    unsafe = [Unsafe({"cas": "unsafe"}, "loses updates", "cas=unsafe")]
    opts = {**SPEC, "workload": "register", "options": {"cas": "unsafe", "keys": 3}}
    drop = det.unsafe_option_keys(opts["options"], unsafe, {"cas": "safe"})
    assert drop == {"cas"}
    assert det.scenario(opts, drop) == det.scenario({**opts, "options": {"keys": 3}})
    assert det.unsafe_option_keys({"keys": 3}, unsafe, {"cas": "safe"}) == set()
    # a setting that needs another option (`given`): only its own options are dropped, so the run shares
    # the scenario of the runs with that other option and not the setting
    pin = [Unsafe({"pin_sequence_ids": False}, "loses", given={"dedup": True})]
    q = {**SPEC, "workload": "queue", "options": {"dedup": True, "pin_sequence_ids": False}}
    drop = det.unsafe_option_keys(q["options"], pin, {"dedup": False, "pin_sequence_ids": True})
    assert drop == {"pin_sequence_ids"}
    assert det.scenario(q, drop) == det.scenario({**q, "options": {"dedup": True}})
    assert det.unsafe_option_keys({"pin_sequence_ids": False}, pin, {"dedup": False}) == set()


def fact(cause: str, scen: str, valid: str, secs: float | None = None, types=("log:lost",)) -> dict:
    return {"causes": [cause], "expected": "valid" if cause == "none" else "invalid", "scenario": scen,
            "scenario_key": f"k-{scen}", "valid": valid, "types": list(types) if valid == "false" else [],
            "detection_s": secs}


def test_the_matrix_rows_targets_and_false_alarms():
    facts = ([fact("knob=a", "s1", "false", s) for s in (1.0, 2.0, 4.0)] + [fact("knob=a", "s1", "false", None)]
             + [fact("knob=a", "s1", "true")]
             + [fact("knob=b", "s2", "false", 3.0)] + [fact("knob=b", "s2", "true")] * 3
             + [fact("knob=b", "s2", "unknown")]
             + [fact("none", "s1", "true")] * 19 + [fact("none", "s1", "false", 9.0, ("queue:lost",))]
             + [fact("none", "s3", "true")] * 2)
    rows = {(r["cause"], r["scenario"]): r for r in det.matrix(facts)}
    a = rows[("knob=a", "s1")]
    assert (a["runs"], a["invalid"], a["rate"], a["meets_target"]) == (5, 4, 0.8, True)
    assert (a["detection_runs"], a["mean_detection_s"]) == (3, 2.33)
    assert (a["false_alarm_runs"], a["false_alarms"], a["anomaly_types"]) == (20, 1, "log:lost")
    b = rows[("knob=b", "s2")]
    assert (b["invalid"], b["runs"], b["with_verdict"], b["meets_target"]) == (1, 5, 4, False)
    assert (b["false_alarm_runs"], b["false_alarms"]) == (None, None)          # no run without it
    n1 = rows[("none", "s1")]
    assert (n1["invalid"], n1["meets_target"], n1["anomaly_types"]) == (1, False, "queue:lost")
    assert rows[("none", "s3")]["meets_target"] is True
    assert [r["cause"] for r in det.matrix(facts)] == ["knob=a", "knob=b", "none", "none"]
    md = det.markdown(det.matrix(facts))
    lines = md.splitlines()
    assert lines[0].startswith("| knob or unsafe setting | scenario | detected |")
    assert "| `knob=a` | s1 (k-s1) | 4/5 | log:lost | 2.33 (over 3) | 1/20 |" in lines
    assert "| `knob=b` | s2 (k-s2) | 1/5 (short of 4/5: 3 judged valid, 1 without a verdict) | log:lost | 3.00 | no run |" in lines
    assert "| (none) | s3 (k-s3) | — | — | — | 0/2 |" in lines
    assert not any(ln.startswith("| (none) | s1") for ln in lines)           # shown in knob=a's row
    assert lines[-1] == "2 detection rows, 1 short of 80 %; false alarms 1/22 runs expected valid."
