"""The campaign file (harness/campaign.py) and its JUnit XML (harness/junit.py), without a cluster: the
product of the axes, exclusions, overrides, extra runs, seeds, --only and --shard, each entry's
expectation, and malformed files as one-line usage errors (exit 254, no traceback)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import xmlschema

from harness import junit
from harness.campaign import CampaignError, load, parse_shard, select
from harness.catalog import CATALOG

HERE = Path(__file__).parent
REPO = HERE.parent.parent
SCHEMA = HERE / "junit.xsd"

BASE = """
name = "t"
seeds = 2
[defaults]
time_limit = 5
[axes]
workload = ["log", "queue", "register"]
nemesis = ["none", "kill", "partition,pause"]
bugs = [{}, {"broker.recovery_fencing" = false}]
[[exclude]]
workload = "register"
bugs = "broker.recovery_fencing"
[[exclude]]
workload = "queue"
nemesis = "pause"
[[override]]
when = {workload = "register"}
set = {zookeepers = 3, options = {cas = "unsafe"}}
[[run]]
workload = "ledger"
bugs = {"bookie.ignore_fence" = true}
seed = 7
"""


def write(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_axes_product_exclusions_overrides_runs_and_seeds(tmp_path):
    c = load(write(tmp_path, BASE))
    # 3 x 3 x 2 = 18, minus register x knob (3) and queue x partition,pause (2) = 13 combos, 2 seeds each,
    # plus the extra run with its own seed
    assert len(c.entries) == 13 * 2 + 1
    labels = [e.label for e in c.entries]
    assert len(set(labels)) == len(labels) and len({e.key for e in c.entries}) == len(labels)
    reg = [e for e in c.entries if e.fields["workload"] == "register"]
    assert reg and all(e.fields["zookeepers"] == 3 and e.fields["options"] == {"cas": "unsafe"} for e in reg)
    assert not any(e.fields["workload"] == "queue" and "pause" in e.fields["nemesis"] for e in c.entries)
    assert {e.fields["seed"] for e in c.entries if e.fields["workload"] == "log"} == {1, 2}
    assert [e.fields["seed"] for e in c.entries if e.fields["workload"] == "ledger"] == [7]
    # expectations come from the registries: the knob, the unsafe cas
    exp = {e.label: e.spec(e.label, "r").expectation(CATALOG).expected for e in c.entries}
    assert exp["log-none-none-s1"] == "valid"
    assert exp["log-none-recovery_fencing-false-s1"] == "invalid"
    assert all(exp[e.label] == "invalid" for e in reg)


def test_seeds_flag_and_date_seed_base(tmp_path):
    c = load(write(tmp_path, BASE), seeds=1)
    assert len(c.entries) == 13 + 1
    d = load(write(tmp_path, BASE.replace("seeds = 2", 'seeds = 1\nseed_base = "date"')))
    today = int(time.strftime("%Y%m%d")) * 1000
    assert d.seed_base == today and d.entries[0].fields["seed"] == today + 1


def test_only_matches_any_axis_value_and_shards_are_disjoint(tmp_path):
    c = load(write(tmp_path, BASE))
    assert {e.fields["workload"] for e in select(c.entries, "queue", None)} == {"queue"}
    knob = select(c.entries, "broker.*", None)
    assert knob and all(e.fields["bugs"] == {"broker.recovery_fencing": False} for e in knob)
    assert {e.fields["workload"] for e in select(c.entries, "bookie.ignore_fence", None)} == {"ledger"}
    assert all("pause" in e.fields["nemesis"] for e in select(c.entries, "pause", None))
    shards = [select(c.entries, None, (k, 3)) for k in (1, 2, 3)]
    keys = [e.key for s in shards for e in s]
    assert sorted(keys) == sorted(e.key for e in c.entries) and len(set(keys)) == len(keys)
    assert parse_shard("2/3") == (2, 3)
    with pytest.raises(CampaignError, match="K/N"):
        parse_shard("4/3")


@pytest.mark.parametrize("text,problem", [
    ("[axes]\nworkload = 'log'", "axis 'workload' must be a non-empty list"),
    ("[axes]\nworkload = ['nope']", "unknown workload 'nope'"),
    ("[axes]\nshape = [3]", "axis 'shape' is not a spec field"),
    ("[defaults]\ntime_limt = 3\n[axes]\nworkload = ['log']", "unknown field(s) time_limt"),
    ("speed = 3", "unknown key(s) speed"),
    ("[axes]\nworkload = ['log']\n[[exclude]]\nbackend = 'x'", "not an axis"),
    ("[axes]\nworkload = ['log']\nbugs = [{'no.such' = true}]", "unknown bug knob 'no.such'"),
    ("[axes\nworkload = ['log']", "not valid TOML"),
    ("seeds = 0\n[axes]\nworkload = ['log']", "seeds must be"),
    ("[axes]\nworkload = ['log']\n[[exclude]]\nworkload = 'log'", "makes no runs"),
])
def test_malformed_files_name_the_problem_and_the_fix(tmp_path, text, problem):
    with pytest.raises(CampaignError) as e:
        load(write(tmp_path, text))
    assert problem in str(e.value) and "(fix: " in str(e.value) and str(tmp_path) in str(e.value)


def test_cli_user_errors_are_one_line_exit_254(tmp_path):
    cli = [sys.executable, "-m", "harness.cli", "campaign"]
    for argv in ([str(write(tmp_path, "[axes]\nworkload = ['nope']"))], [str(tmp_path / "missing.toml")],
                 [str(REPO / "tests/campaign/two_runs.toml"), "--only", "zzz"],
                 [str(REPO / "tests/campaign/two_runs.toml"), "--shard", "0/2"],
                 [str(REPO / "tests/campaign/two_runs.toml"), "--resume", str(tmp_path)]):
        p = subprocess.run([*cli, *argv, "--results-dir", str(tmp_path / "r")], capture_output=True, text=True,
                           cwd=REPO, timeout=120)
        assert p.returncode == 254, (argv, p.stdout, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "(fix: " in lines[0], p.stderr
        assert "Traceback" not in p.stderr


@pytest.mark.parametrize("name", ["smoke", "nightly", "detection"])
def test_shipped_campaigns_are_valid(name):
    c = load(REPO / "campaigns" / f"{name}.toml")
    assert c.entries
    exp = [e.spec(e.label, "r").expectation(CATALOG) for e in c.entries]
    if name != "smoke":
        # every bug knob is in the campaign, expected invalid
        from clusters.bugs import KNOBS
        knobs = {lab.split("=")[0] for x in exp for lab in x.labels}
        assert set(KNOBS) <= knobs, set(KNOBS) - knobs
        assert any(x.expected == "valid" for x in exp) and any(x.expected == "invalid" for x in exp)


def _rec(name, outcome, expected="valid", **kw):
    return {"name": name, "workload": "log", "outcome": outcome, "expected": expected, "seconds": 1.5, **kw}


def test_junit_outcomes_and_schema():
    recs = [_rec("ok", "valid"), _rec("caught", "invalid", "invalid", anomalies="fencing: ack-after-fence 3"),
            _rec("alarm", "invalid", anomalies="log: lost 2"), _rec("missed", "valid", "invalid"),
            _rec("unk", "unknown", why="final reads did not finish"), _rec("boom", "crashed", why="exit 255"),
            _rec("late", "not-run", why="--max-hours 1 reached")]
    kinds = [junit.judge(r)[0] for r in recs]
    assert kinds == ["pass", "pass", "failure", "failure", "error", "error", "skipped"]
    data = junit.xml("c", recs, "20261126T000000", 12.5)
    xmlschema.XMLSchema(str(SCHEMA)).validate(data.decode())
    import xml.etree.ElementTree as ET
    root = ET.fromstring(data)
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("7", "2", "2", "1")
    alarm = suite.find("testcase[@name='alarm']/failure")
    assert alarm.get("type") == "invalid" and alarm.get("message") == "log: lost 2"
    assert suite.find("testcase[@name='missed']/failure").get("type") == "expected-invalid"
    # the schema can fail: a testcase without a name is refused
    bad = data.replace(b' name="ok"', b"")
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        xmlschema.XMLSchema(str(SCHEMA)).validate(bad.decode())
