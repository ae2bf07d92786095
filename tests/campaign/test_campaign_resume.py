"""`pulsar-chaos campaign --resume` without a cluster: a finished run is reused only when its test.toml has the
settings its entry gives now (a row whose setting changed runs again, and the campaign's first line says so);
an unreadable test.toml runs again; --only, --shard and --seeds default to what campaign.json recorded, and a
different one is a usage error; the interrupted hint resumes the same selection. The finished runs are made
as `pulsar-chaos run` makes them (its run folder and test.toml) with a results.json; the runs a resume starts
use the plugins tests/campaign/crashing_run.py and interrupting_run.py, which deploy nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core import store
from harness.campaign import CampaignError
from harness.campaign_run import CampaignRun, Options
from harness.catalog import CATALOG

HERE = Path(__file__).parent
REPO = HERE.parent.parent

CAMPAIGN = """
name = "rs"
analyze = false
seeds = 2
[defaults]
workload = "ledger"
time_limit = 4
nemesis = "none"
rate = 100
options = {recover_interval = 1, ledger_max_entries = 0}
[axes]
bugs = [{}, {"bookie.ignore_fence" = true}]
"""
KNOB_ROW = "[[override]]\nwhen = {bugs = \"bookie.ignore_fence\"}\nset = {rate = 2000}\n"


def started(tmp_path: Path, text: str = CAMPAIGN, **opts) -> tuple[Path, CampaignRun]:
    """A campaign folder as `pulsar-chaos campaign FILE [opts]` starts it (campaign.json, nothing run yet)."""
    tmp_path.mkdir(exist_ok=True)
    f = tmp_path / "rs.toml"
    f.write_text(text)
    c = CampaignRun(Options(file=str(f), results_dir=str(tmp_path / "results"), **opts))
    c._prepare_dir()
    c._save()
    return f, c


def finish(c: CampaignRun, label: str | None = None) -> dict[str, Path]:
    """Each entry (or the one labelled) finished as `pulsar-chaos run` leaves it: run folder, test.toml (the
    resolved spec), results.json."""
    out = {}
    for e in c.entries:
        if label in (None, e.label):
            spec = e.spec(e.label, str(c.dir / "runs")).validate(catalog=CATALOG).resolved().with_expectation(CATALOG)
            d = store.create_run_dir(spec.results_dir, spec.test_name)
            store.write_test_toml(d, spec)
            store.write_json(d / store.RESULTS_JSON, {"valid": spec.expected != "invalid",
                                                             "expected": spec.expected, "run": {}})
            out[e.label] = d
    return out


def cli(*args: str, plugin: str = "crashing_run", timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "campaign", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "PULSAR_CHAOS_PLUGINS": f"tests.campaign.{plugin}"})


def records(folder: Path) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads((folder / "campaign.json").read_text())["entries"]}


def test_a_row_whose_setting_changed_runs_again_and_the_first_line_names_it(tmp_path):
    f, c = started(tmp_path)
    done = finish(c)
    assert len(done) == 4
    f.write_text(CAMPAIGN + KNOB_ROW)            # the knob row now runs at 2000 ops/s
    p = cli(str(f), "--resume", str(c.dir))
    lines = p.stdout.splitlines()
    assert lines[0] == (f"2 finished runs were made with other settings than {f} gives now (rate 100 -> 2000): "
                        f"they run again"), p.stdout + p.stderr
    assert "(2 already complete, 2 to run)" in lines[1], p.stdout
    recs = records(c.dir)
    knob = sorted(k for k in recs if "ignore_fence" in k)
    same = sorted(k for k in recs if k not in knob)
    assert len(knob) == 2 and len(same) == 2
    for k in knob:                               # ran again (and crashed, as the plugin makes every run)
        assert recs[k]["outcome"] == "crashed", recs[k]
        assert "a crash planted" in (c.dir / "logs" / f"{k}.log").read_text()
        assert done[k].is_dir() and len(list((c.dir / "runs" / k).iterdir())) == 2   # the old folder stays
    for k in same:                               # reused as they were
        assert recs[k]["outcome"] == "valid" and recs[k]["run_dir"] == str(done[k]), recs[k]
        assert not (c.dir / "logs" / f"{k}.log").exists()


def test_an_unchanged_resume_of_a_shard_reruns_nothing_and_keeps_its_shard(tmp_path):
    # the file as written (nemesis "none", rate 100, recover_interval 1) differs from test.toml's
    # representation ([], 100.0, 1.0) only in form; resumed without --shard, the folder's shard 1/2 is kept
    f, c = started(tmp_path, shard="1/2")
    assert len(c.entries) == 2
    done = finish(c)
    p = cli(str(f), "--resume", str(c.dir))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("campaign rs: 2 runs (2 already complete, 0 to run)"), p.stdout
    assert "other settings" not in p.stdout and "cannot be read back" not in p.stdout
    recs = records(c.dir)
    assert set(recs) == set(done) and all(recs[k]["run_dir"] == str(done[k]) for k in done)
    assert not list((c.dir / "logs").iterdir())
    assert json.loads((c.dir / "campaign.json").read_text())["shard"] == "1/2"


def test_a_run_that_drew_its_seed_is_reused(tmp_path):
    # seed = 0 lets each run draw one (its test.toml records it): any drawn seed is the entry's setting
    text = CAMPAIGN.replace("seeds = 2", "seeds = 1") + '[[run]]\ntest_name = "drawn"\nseed = 0\n'
    f, c = started(tmp_path, text)
    done = finish(c)
    assert "ledger-s0" in done
    kept, todo, lines = CampaignRun(Options(file=str(f), resume=str(c.dir))).plan()
    assert (len(kept), todo, lines) == (3, [], [])
    f.write_text(text.replace("rate = 100", "rate = 300"))
    kept, todo, lines = CampaignRun(Options(file=str(f), resume=str(c.dir))).plan()
    assert (len(kept), len(todo)) == (0, 3) and lines == [
        f"3 finished runs were made with other settings than {f} gives now (rate 100 -> 300): they run again"]


def test_an_unreadable_test_toml_runs_again_and_says_so(tmp_path):
    f, c = started(tmp_path)
    done = finish(c)
    labels = sorted(done)
    (done[labels[0]] / "test.toml").write_text("rate = = 3\n")                       # corrupt
    old = done[labels[1]] / "test.toml"
    old.write_text(old.read_text().replace("replay_of = ", "retired_field = 1\nreplay_of = "))   # an older version's
    kept, todo, lines = CampaignRun(Options(file=str(f), resume=str(c.dir))).plan()
    assert sorted(e.label for e in todo) == labels[:2] and len(kept) == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"2 finished runs have a test.toml that cannot be read back "
                               f"({done[labels[0]]}/test.toml is not valid TOML ("), lines
    assert lines[0].endswith("; and 1 more): they run again, as their settings cannot be compared with the "
                             "campaign file's"), lines
    first = lines[0]
    r = CampaignRun(Options(file=str(f), resume=str(c.dir)))
    r.entries = [e for e in r.entries if e.label == labels[1]]
    kept, todo, lines = r.plan()
    assert lines == [f"1 finished run has a test.toml that cannot be read back ({old}: retired_field: unknown field): "
                     f"it runs again, as its settings cannot be compared with the campaign file's"]
    p = cli(str(f), "--resume", str(c.dir))
    assert p.stdout.splitlines()[0] == first, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    recs = records(c.dir)
    assert [recs[k]["outcome"] for k in labels] == ["crashed", "crashed", "valid", "valid"], recs


def test_the_selection_defaults_to_the_record_and_a_different_one_is_a_usage_error(tmp_path):
    f, c = started(tmp_path, shard="2/2", only="bookie.ignore_fence,none", seeds=3)
    want = [e.label for e in c.entries]
    assert len(want) == 3
    r = CampaignRun(Options(file=str(f), resume=str(c.dir)))
    assert [e.label for e in r.entries] == want
    assert (r.opts.shard, r.opts.only, r.opts.seeds) == ("2/2", "bookie.ignore_fence,none", 3)
    # the same values, written otherwise, are no change
    r = CampaignRun(Options(file=str(f), resume=str(c.dir), shard=" 2 / 2", only="none, bookie.ignore_fence", seeds=3))
    assert [e.label for e in r.entries] == want
    for flag, given, recorded in (("--shard", "1/2", "2/2"), ("--only", "none", "bookie.ignore_fence,none"),
                                  ("--seeds", "5", "3")):
        p = cli(str(f), "--resume", str(c.dir), flag, given)
        assert p.returncode == 254 and p.stdout == "", p.stdout + p.stderr
        (line,) = p.stderr.splitlines()
        assert line.startswith(f"error: {flag}: {c.dir} was started with {flag} {recorded}, not {flag} {given} "
                               f"(fix: leave {flag} out"), line
    # a folder started without a shard: --shard on resume would put one slice's runs over the whole campaign
    f2, c2 = started(tmp_path / "b")
    with pytest.raises(CampaignError, match=r"was started with no --shard, not --shard 1/2"):
        CampaignRun(Options(file=str(f2), resume=str(c2.dir), shard="1/2"))
    assert json.loads((c.dir / "campaign.json").read_text())["shard"] == "2/2"    # nothing written


def test_the_interrupted_hint_resumes_the_same_shard(tmp_path):
    f = tmp_path / "rs.toml"
    f.write_text(CAMPAIGN)
    p = cli(str(f), "--shard", "1/2", "--results-dir", str(tmp_path / "results"), plugin="interrupting_run")
    assert p.returncode == 128 + signal.SIGTERM, p.stdout + p.stderr
    (folder,) = (tmp_path / "results" / "campaigns" / "rs").iterdir()
    hint = p.stdout.splitlines()[-1]
    assert hint == (f"interrupted: resume with `pulsar-chaos campaign {f} --resume {folder}` "
                    f"(it keeps --shard 1/2)"), p.stdout
    shard1 = set(records(folder))
    assert len(shard1) == 2
    argv = hint.split("`")[1].split()[2:]           # the command as printed
    p = cli(*argv, "--max-hours", "0.0001")         # starts nothing: shows which runs it would run
    assert "campaign rs: 2 runs in" in p.stdout, p.stdout + p.stderr
    assert set(records(folder)) == shard1
