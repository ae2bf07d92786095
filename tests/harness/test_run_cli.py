"""`pulsar-chaos run/check/report` without a cluster: usage errors exit 254 with one line naming the
field and its fix and create no run folder; flags override the TOML; test.toml re-runs the same spec."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from core import store
from harness import runner
from core.spec import SpecError
from core.spec import TestSpec as Spec
from harness.catalog import CATALOG

EXE = os.path.join(os.path.dirname(sys.executable), "pulsar-chaos")


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def _one_line_error(out: subprocess.CompletedProcess, *words: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    line = lines[0]
    assert line.startswith("error: ") and "fix" in line and "Traceback" not in out.stderr, line
    for w in words:
        assert w in line, line
    return line


@pytest.mark.parametrize("toml, words", [
    ("time_limit = 10\nno_such_field = 3\n", ["no_such_field", "unknown field"]),
    ("time_limit = -5\n", ["time_limit", ">= 1.0"]),
    ("nemesis = \"partition,chaos-monkey\"\n", ["nemesis", "chaos-monkey"]),
    ("concurrency = \"six\"\n", ["concurrency"]),
    ("ensemble = 2\nwrite_quorum = 3\n", ["ack_quorum", "ensemble >= write_quorum"]),
    ("time_limit = = 3\n", ["not valid TOML"]),
    ("[bugs]\n\"no.such\" = true\n", ["bugs", "no.such"]),
    ("workload = \"queue\"\n[options]\nspeed = 3\n", ["options", "no option 'speed'", "dedup"]),
    ("workload = \"queue\"\n[options]\ndedup = \"yes\"\n", ["options", "dedup must be true or false"]),
    ("workload = \"subscriptions\"\n[options]\nsubscription = \"shared\"\n",
     ["options", "failover, key_shared", "shared"]),
])
def test_malformed_spec_file_exits_254_without_run_folder(tmp_path, toml, words):
    spec = tmp_path / "spec.toml"
    spec.write_text(toml + f'results_dir = "{tmp_path / "results"}"\n' if "= =" not in toml else toml)
    out = run("run", "--spec", str(spec), "--results-dir", str(tmp_path / "results"))
    assert out.returncode == 254, out.stderr
    line = _one_line_error(out, *words)
    assert str(spec) in line                      # names the file
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("args, words", [
    (["--time-limit", "soon"], ["--time-limit", "invalid float value"]),
    (["--concurrency", "0"], ["--concurrency", "from 1 to 256"]),
    (["--nemesis", "partition,meteor"], ["--nemesis", "meteor"]),
    (["--bug", "no.such_knob"], ["--bug", "no.such_knob"]),
    (["--zookeepers", "2"], ["--zookeepers", "majority"]),
    (["--workload", "bank"], ["--workload", "bank"]),
    (["--test-name", "a/b"], ["--test-name"]),
    (["--test-name", "latest"], ["test_name", "reserved"]),
    (["--no-such-flag"], ["unrecognized arguments"]),
    (["--option", "dedup"], ["--option", "KEY=VALUE"]),
    (["--workload", "log", "--option", "dedup=true"], ["--option", "no option 'dedup'"]),
    (["--workload", "subscriptions", "--option", "keys=many"], ["--option", "keys must be a whole number"]),
    (["--broker-setting", "managedLedgerMaxLedgerRolloverTime=1"],
     ["--broker-setting", "unknown broker setting", "managedLedgerMaxLedgerRolloverTimeMinutes"]),
    (["--broker-setting", "managedLedgerMaxEntriesPerLedger=lots"], ["--broker-setting", "not a number"]),
    (["--broker-setting", "managedLedgerMaxEntriesPerLedger"], ["--broker-setting", "NAME=VALUE"]),
    (["--bookie-setting", "gcWaitTim=1000"], ["--bookie-setting", "unknown bookie setting", "gcWaitTime"]),
    (["--bookie-setting", "gcWaitTime=0"], ["--bookie-setting", "positive whole number"]),
    (["--bookie-setting", "gcWaitTime"], ["--bookie-setting", "NAME=VALUE"]),
    (["--bookie-setting", "journalSync=false"],
     ["--bookie-setting:", "unknown bookie setting", "journalSyncData"]),
    (["--bookie-setting", "journalSyncData=maybe"], ["--bookie-setting:", "must be true or false"]),
    (["--bookie-setting", "journalSyncData"], ["--bookie-setting", "NAME=VALUE"]),
])
def test_bad_flag_exits_254_without_run_folder(tmp_path, args, words):
    out = run("run", "--results-dir", str(tmp_path / "results"), *args)
    assert out.returncode == 254, (out.returncode, out.stderr)
    _one_line_error(out, *words)
    assert not (tmp_path / "results" / "log-chaos").exists()
    assert not list((tmp_path / "results").glob("*/*")) if (tmp_path / "results").exists() else True


def test_missing_spec_file(tmp_path):
    out = run("run", "--spec", str(tmp_path / "none.toml"))
    assert out.returncode == 254
    _one_line_error(out, "--spec", "does not exist")


def test_flags_override_the_toml_and_only_flags_given(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('test_name = "from-file"\ntime_limit = 30\nrate = 50\nnemesis = ["kill"]\nseed = 7\n'
                    '[bugs]\n"bookie.ack_before_fsync" = true\n')
    s = runner.spec_from_args(spec, {"time_limit": 12.0, "rate": None, "nemesis": "pause,partition",
                                     "bugs": {"broker.recovery_fencing": False}})
    assert s.test_name == "from-file" and s.seed == 7 and s.rate == 50.0          # from the file
    assert s.time_limit == 12.0 and s.nemesis == ["pause", "partition"]            # from the flags
    assert s.bugs == {"bookie.ack_before_fsync": True, "broker.recovery_fencing": False}
    assert runner.spec_from_args(None, {}) == Spec()                           # defaults
    with pytest.raises(SpecError) as e:
        runner.spec_from_args(spec, {"rate": -1.0})
    assert e.value.field == "--rate"
    with pytest.raises(SpecError) as e:
        runner.spec_from_args(None, {"nemesis": "none", "time_limit": 0.5})
    assert e.value.field == "--time-limit"


def test_test_toml_round_trips_to_the_same_resolved_spec(tmp_path):
    spec = Spec(test_name="rt", nemesis=["kill", "pause"], time_limit=12.5, rate=33.0, concurrency=4,
                bugs={"bookie.ack_before_fsync": True}, results_dir=str(tmp_path),
                broker_settings={"managedLedgerMaxLedgerRolloverTimeMinutes": 0.5},
                bookie_settings={"gcWaitTime": 1000}).validate(catalog=CATALOG).resolved()
    assert spec.seed > 0
    run_dir = store.create_run_dir(tmp_path, spec.test_name)
    path = store.write_test_toml(run_dir, spec)
    again = runner.spec_from_args(path, {})
    assert again == spec
    assert again.resolved() == spec                  # the seed is fixed: re-running keeps it
    assert store.load_spec(run_dir, catalog=CATALOG) == spec
    assert runner.spec_from_args(path, {"seed": 5}).seed == 5


def test_workload_options_from_flags_and_toml(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('workload = "subscriptions"\n[options]\nsubscription = "key_shared"\nconsumer_lifetime = 2\n')
    s = runner.spec_from_args(spec, {"options": {"keys": 4}})
    assert s.options == {"subscription": "key_shared", "consumer_lifetime": 2.0, "keys": 4}   # int -> float
    run_dir = store.create_run_dir(tmp_path, "opt")
    again = runner.spec_from_args(store.write_test_toml(run_dir, s.resolved()), {})
    assert again.options == s.options and again.workload == "subscriptions"
    from core.spec import parse_options
    assert parse_options(["dedup=true", "keys=3", "subscription=key_shared", 'name="x y"']) == {
        "dedup": True, "keys": 3, "subscription": "key_shared", "name": "x y"}


def test_check_and_report_bad_run_dir_are_one_line(tmp_path):
    for cmd in ("check", "report"):
        out = run(cmd, str(tmp_path / "missing"))
        assert out.returncode == 254 and out.stdout == ""
        _one_line_error(out, "no such run folder")
        out = run(cmd, str(tmp_path))
        assert out.returncode == 254
        _one_line_error(out, "not a run folder")
    out = run("check")
    assert out.returncode == 254
    _one_line_error(out, "RUN_DIR")


def _journal_line(**d) -> str:
    base = {"process": 0, "type": "invoke", "f": "send", "key": "t", "value": None, "message_id": None,
            "node": "", "error": "", "time_ns": 0}
    base.update(d)
    return json.dumps(base) + "\n"


def test_check_and_report_on_a_killed_run_and_on_a_corrupt_history(tmp_path):
    spec = Spec(test_name="k", results_dir=str(tmp_path)).resolved()
    run_dir = store.create_run_dir(tmp_path, "k")
    store.write_test_toml(run_dir, spec)
    mid = {"ledger_id": 1, "entry_id": 0, "partition": -1, "batch_index": -1}
    (run_dir / "journals" / "worker-0.jsonl").write_text(
        _journal_line(time_ns=1, value=5) + _journal_line(type="ok", time_ns=2, value=5, message_id=mid)
        + _journal_line(time_ns=3, value=6)[:40])          # torn: the runner was SIGKILLed
    out = run("check", str(run_dir))
    assert out.returncode == 2, out.stderr                # journals only, no results.json: unknown
    assert "unknown" in out.stdout and "did not finish" in out.stdout
    assert (run_dir / "history.jsonl").exists() and (run_dir / "history.parquet").exists()
    res = json.loads((run_dir / "results.json").read_text())
    assert res["valid"] == "unknown" and res["exit_code"] == 2 and "log" in res["checkers"]
    out = run("report", str(run_dir))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(run_dir / "report.html") and (run_dir / "report.html").exists()
    (run_dir / "history.jsonl").write_text(_journal_line(time_ns=1) + "{oops\n" + _journal_line(time_ns=2))
    out = run("check", str(run_dir))
    assert out.returncode == 254
    _one_line_error(out, f"{run_dir / 'history.jsonl'}:2")


def test_check_of_a_run_whose_history_is_empty_is_one_line_and_254(tmp_path):
    spec = Spec(test_name="e", results_dir=str(tmp_path)).resolved()
    run_dir = store.create_run_dir(tmp_path, "e")
    store.write_test_toml(run_dir, spec)
    (run_dir / "history.jsonl").write_text("")
    out = run("check", str(run_dir))
    assert out.returncode == 254 and out.stdout == "", out
    _one_line_error(out, f"{run_dir / 'history.jsonl'}: no client op in the history", "fix:")
    assert not (run_dir / "results.json").exists()
    (run_dir / "history.jsonl").write_text(_journal_line(process=-1, f="start", time_ns=1))   # nemesis only
    out = run("check", str(run_dir))
    assert out.returncode == 254
    _one_line_error(out, "no client op")


@pytest.mark.parametrize("flag, example", [
    ("--lb-setting", "loadBalancerSheddingIntervalMinutes=0.1"),
    ("--broker-setting", "managedLedgerMaxLedgerRolloverTimeMinutes=0.02"),
    ("--bookie-setting", "journalSyncData=false"),
])
def test_each_setting_flag_parses_name_value_and_names_itself_in_its_error(flag, example):
    """The three `--*-setting NAME=VALUE` flags: names and values stripped, values kept as text (the
    settings check them), the last of a name wins; a malformed item is a UserError naming that flag, the
    item and the flag's own example."""
    from harness import cli
    table = flag[2:].replace("-setting", "_settings")
    name, _, value = example.partition("=")
    spec = cli.run_spec(cli.build_parser().parse_args(["run", flag, f" {name} = 1 ", flag, f"{name}={value}"]))
    assert getattr(spec, table) == {name: value}
    for bad in (name, f"={value}", f"  ={value}"):
        with pytest.raises(cli.UserError) as e:
            cli.run_spec(cli.build_parser().parse_args(["run", flag, example, flag, bad]))
        assert str(e.value) == f"{flag} {bad!r} is not NAME=VALUE (fix: write e.g. {flag} {example})"


class _SettingsProbe:
    """CATALOG, with its broker/bookie settings checks recording what they are asked and answering
    `answers` (a missing answer: the catalog has no such check)."""

    def __init__(self, answers: dict[str, Any]):
        self.answers, self.asked = answers, []

    def __getattr__(self, name: str) -> Any:
        table = name.removesuffix("_problem")
        if table in ("broker_settings", "bookie_settings"):
            if table not in self.answers:
                raise AttributeError(name)
            return lambda settings: (self.asked.append((table, dict(settings))), self.answers[table])[1]
        return getattr(CATALOG, name)


def test_broker_and_bookie_settings_tables_are_checked_in_that_order_by_the_catalog():
    """core/spec.py: each of broker_settings and bookie_settings must be a table (its own fix), and a
    non-empty one is the catalog's to judge when the catalog has that check; broker_settings first."""
    def problem(spec: Spec, catalog: Any = CATALOG) -> tuple[str, str, str] | None:
        try:
            spec.validate("s.toml", catalog=catalog)
        except SpecError as e:
            return e.field, e.problem, e.fix
        return None

    assert problem(Spec(broker_settings="x", bookie_settings=[1])) == (
        "broker_settings", "must be a table of setting = value",
        "write e.g. [broker_settings] managedLedgerMaxLedgerRolloverTimeMinutes = 0.02")
    assert problem(Spec(bookie_settings=[1])) == (
        "bookie_settings", "must be a table of setting = value",
        "write e.g. [bookie_settings] journalSyncData = false")
    assert problem(Spec(bookie_settings=[1]), None)[0] == "bookie_settings"          # the shape without a catalog
    both = _SettingsProbe({"broker_settings": ("broker bad", "broker fix"), "bookie_settings": ("bookie bad", "fix")})
    assert problem(Spec(broker_settings={"a": 1}, bookie_settings={"b": 2}), both) == (
        "broker_settings", "broker bad", "broker fix")
    assert both.asked == [("broker_settings", {"a": 1})]
    bookie = _SettingsProbe({"broker_settings": None, "bookie_settings": ("bookie bad", "bookie fix")})
    assert problem(Spec(broker_settings={"a": 1}, bookie_settings={"b": 2}), bookie) == (
        "bookie_settings", "bookie bad", "bookie fix")
    assert bookie.asked == [("broker_settings", {"a": 1}), ("bookie_settings", {"b": 2})]
    empty = _SettingsProbe({"broker_settings": ("never", "asked"), "bookie_settings": ("never", "asked")})
    assert problem(Spec(), empty) is None and empty.asked == []                       # empty tables: not asked
    assert problem(Spec(broker_settings={"a": 1}, bookie_settings={"b": 2}), _SettingsProbe({})) is None
    assert problem(Spec(broker_settings={"managedLedgerMaxEntriesPerLedger": "lots"}))[:1] == ("broker_settings",)
    assert problem(Spec(bookie_settings={"journalSyncData": "maybe"}))[:1] == ("bookie_settings",)


def test_a_schedule_without_nemesis_names_runs_only_the_schedule(tmp_path):
    """--nemesis-schedule replaces the random faults (the nemesis runs the schedule alone), so the spec and
    test.toml must not carry the default names as if they ran; names given with it are kept."""
    from harness import cli
    sched = tmp_path / "s.toml"
    sched.write_text('[[fault]]\nat = 5\nname = "kill:owner"\nhold = 3\n')
    spec = cli.run_spec(cli.build_parser().parse_args(["run", "--nemesis-schedule", str(sched)]))
    assert spec.nemesis == [] and [e["name"] for e in spec.nemesis_schedule] == ["kill:owner"]
    spec = cli.run_spec(cli.build_parser().parse_args(["run", "--nemesis", "pause", "--nemesis-schedule", str(sched)]))
    assert spec.nemesis == ["pause"]
