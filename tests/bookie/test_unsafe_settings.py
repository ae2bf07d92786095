"""The unsafe settings as rows of the detection matrix (clusters/unsafe_settings.py): journalSyncData=false
(a bookie setting under BookKeeper's name, clusters/bookie/settings.py, `--bookie-setting`) and an ack
quorum of 1 (`E/Qw/Qa=3/1/1`). Each makes a run expected invalid like a bug knob, and counts on its own
row, named by the setting, whose false alarms are the same scenario's runs with the safe value."""
from __future__ import annotations

import pytest

from clusters import unsafe_settings
from clusters.bookie import settings as bookie_settings
from core import detection
from harness import cli
from harness.catalog import CATALOG
from spark_analysis import detection as run_detection
from spark_analysis.inputs import Run

SCHEDULE = [{"at": 5, "name": "disk-wipe:ledger-bookies", "hold": 3}]


def _spec(*flags: str):
    return cli.run_spec(cli.build_parser().parse_args(["run", "--workload", "log", "--nemesis", "power-loss",
                                                       *flags]))


def test_journal_sync_data_is_a_bookie_setting_under_bookkeepers_name():
    assert bookie_settings.bookie_config({"journalSyncData": "false"}) == {"journal_sync_data": False}
    assert bookie_settings.bookie_config({"journalSyncData": True}) == {"journal_sync_data": True}
    with pytest.raises(ValueError, match="unknown bookie setting 'journalSync'; did you mean 'journalSyncData'"):
        bookie_settings.bookie_config({"journalSync": False})
    with pytest.raises(ValueError, match="must be true or false"):
        bookie_settings.bookie_config({"journalSyncData": "sometimes"})
    assert bookie_settings.unsafe({"journalSyncData": "off"}) == {"journalSyncData": False}
    assert bookie_settings.unsafe({"journalSyncData": "true"}) == {}


def test_each_unsafe_setting_makes_the_run_expected_invalid_under_its_own_name():
    e = _spec("--bookie-setting", "journalSyncData=false").expectation(CATALOG)
    assert e.expected == "invalid" and e.labels == ["journalSyncData=false"]
    assert e.causes[0].kind == "unsafe setting" and "fsync" in e.reason
    assert _spec("--bookie-setting", "journalSyncData=true").expectation(CATALOG).expected == "valid"
    e = _spec("--ensemble", "3", "--write-quorum", "1", "--ack-quorum", "1").expectation(CATALOG)
    assert e.expected == "invalid" and e.labels == ["E/Qw/Qa=3/1/1"] and "one copy" in e.reason
    assert _spec("--write-quorum", "2", "--ack-quorum", "2").expectation(CATALOG).expected == "valid"
    # with a bug knob on, the setting is the knob's scenario and the knob alone the cause
    e = _spec("--ack-quorum", "1", "--bug", "bookie.ack_before_fsync").expectation(CATALOG)
    assert e.expected == "invalid" and e.labels == ["bookie.ack_before_fsync=true"]
    bad = cli.main(["run", "--workload", "log", "--bookie-setting", "journalSyncData=perhaps"])
    assert bad == 254


def _run(rid: str, valid: bool, **spec) -> Run:
    spec = {"workload": "log", "nemesis": [], "nemesis_schedule": SCHEDULE, "topics": 1, "bookies": 4, **spec}
    return Run(run_id=rid, path=rid, local=True, spec=spec, results={"valid": valid, "checkers": {}})


def test_a_setting_and_the_safe_runs_of_its_scenario_share_a_row():
    runs = [_run(f"q311/{i}", False, ensemble=3, write_quorum=1, ack_quorum=1) for i in range(4)]
    runs += [_run("q311/4", True, ensemble=3, write_quorum=1, ack_quorum=1)]
    runs += [_run(f"safe/{i}", i == 0, ensemble=3, write_quorum=2, ack_quorum=2) for i in range(3)]
    runs += [_run(f"jsd/{i}", False, bookie_settings={"journalSyncData": False}) for i in range(2)]
    rows = {r["cause"]: r for r in run_detection.matrix(runs)}
    q = rows["E/Qw/Qa=3/1/1"]
    assert (q["runs"], q["invalid"], q["meets_target"]) == (5, 4, True)
    assert (q["false_alarm_runs"], q["false_alarms"]) == (3 + 0, 2)          # the 3/2/2 runs of the scenario
    assert "3/1/1" not in q["scenario"]                                       # the scenario, not the setting
    j = rows["journalSyncData=false"]
    assert (j["runs"], j["invalid"]) == (2, 2) and j["scenario_key"] == q["scenario_key"]
    # without the reset the 3/1/1 runs would form a scenario of their own, with no false-alarm runs
    alone = detection.scenario(runs[0].spec)[1]
    assert alone != q["scenario_key"]
    assert unsafe_settings.scenario_reset({"ack_quorum": 2, "bookie_settings": {"journalSyncData": True}}) == {}


def test_a_knob_whose_scenario_has_an_ack_quorum_of_1_is_credited_alone_and_keeps_its_shape():
    """B12's scenario is BookKeeper's own example at E 2, Qw = Qa = 1: its knob runs count on the knob's row
    only, and their scenario (2/1/1, not reset) is the one of its runs declared valid without the knob."""
    shape = {"ensemble": 2, "write_quorum": 1, "ack_quorum": 1, "workload": "ledger"}
    knob = [_run(f"b12/{i}", i < 4, **shape, bugs={"bk.ack_broken_entry_on_ensemble_change": True})
            for i in range(5)]
    for r in knob:
        r.results["valid"] = not r.results["valid"]                        # 4 invalid, 1 valid
    off = [_run(f"off/{i}", True, **shape, expected="valid", expected_reason="no disk is lost") for i in range(3)]
    assert knob[0].causes == ["bk.ack_broken_entry_on_ensemble_change=true"] and off[0].causes == ["none"]
    rows = run_detection.matrix(knob + off)
    assert {r["cause"] for r in rows} == {"bk.ack_broken_entry_on_ensemble_change=true", "none"}
    k = next(r for r in rows if r["cause"] != "none")
    assert (k["runs"], k["invalid"], k["false_alarm_runs"], k["false_alarms"]) == (5, 4, 3, 0)
    assert "2/1/1" in k["scenario"]
