"""`pulsar-chaos campaign` end to end on real clusters (tests/campaign/two_runs.toml: a correct ledger run and
a bookie.ignore_fence run, ~10 s each on the smallest cluster): the knob run's invalid verdict counts
as expected; an interrupted campaign resumed runs only what is missing and keeps every finished run;
the JUnit XML validates; and a knob made silently ineffective (a plugin that deploys the clusters
without their bug knobs) makes the campaign exit 1."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

HERE = Path(__file__).parent
REPO = HERE.parent.parent
CAMPAIGN = HERE / "two_runs.toml"
CORRECT, KNOB = "ledger-none-s1", "ledger-ignore_fence-true-s1"


def cli(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "campaign", str(CAMPAIGN), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, **kw)


def entries(folder: Path) -> dict[str, dict]:
    state = json.loads((folder / "campaign.json").read_text())
    return {e["name"]: e for e in state["entries"]}


def junit_cases(path: Path) -> dict[str, ET.Element]:
    xmlschema.XMLSchema(str(HERE / "junit.xsd")).validate(str(path))
    return {tc.get("name"): tc for tc in ET.parse(path).getroot().iter("testcase")}


def test_interrupted_campaign_resumes_only_what_is_missing_and_the_knob_run_is_expected_invalid(tmp_path):
    results = tmp_path / "results"
    p = cli("--results-dir", str(results))
    folder = None
    deadline = time.monotonic() + 240
    # interrupt once the correct run is done and the knob run has started (its run folder exists)
    while time.monotonic() < deadline and p.poll() is None:
        found = list(results.glob("campaigns/two-runs/*/campaign.json"))
        if found:
            folder = found[0].parent
            if entries(folder)[CORRECT]["outcome"] != "pending" and list((folder / "runs").glob(f"{KNOB}/*")):
                break
        time.sleep(0.2)
    assert folder is not None and p.poll() is None, p.communicate()[0]
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 128 + signal.SIGTERM, out
    assert f"--resume {folder}" in out, out
    first = entries(folder)
    assert first[CORRECT]["outcome"] == "valid" and first[CORRECT]["met"] is True
    assert first[KNOB]["outcome"] == "pending", first[KNOB]
    (interrupted,) = (folder / "runs" / KNOB).iterdir()
    assert json.loads((interrupted / "results.json").read_text())["run"]["interrupted"] == "SIGTERM"
    correct_dirs = list((folder / "runs" / CORRECT).iterdir())
    correct_log = (folder / "logs" / f"{CORRECT}.log").read_bytes()

    junit = tmp_path / "out" / "junit.xml"
    p = cli("--resume", str(folder), "--junit", str(junit))
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 0, out
    assert "1 already complete, 1 to run" in out, out
    # only the missing run ran again; the finished one and the interrupted folder are kept as they were
    assert list((folder / "runs" / CORRECT).iterdir()) == correct_dirs
    assert (folder / "logs" / f"{CORRECT}.log").read_bytes() == correct_log
    knob_dirs = sorted((folder / "runs" / KNOB).iterdir())
    assert len(knob_dirs) == 2 and interrupted in knob_dirs
    done = entries(folder)
    assert done[KNOB]["outcome"] == "invalid" and done[KNOB]["expected"] == "invalid" and done[KNOB]["met"] is True
    assert "ack-after-fence" in done[KNOB]["anomalies"]
    cases = junit_cases(junit)
    assert set(cases) == {CORRECT, KNOB}
    assert all(len(tc.findall("failure")) + len(tc.findall("error")) == 0 for tc in cases.values())
    summary = (folder / "summary.txt").read_text()
    assert "2 met their expectation, 0 did not" in summary and "exit code 0" in summary


def test_a_silently_ineffective_knob_fails_the_campaign(tmp_path):
    junit = tmp_path / "junit.xml"
    p = cli("--results-dir", str(tmp_path / "results"), "--only", "bookie.ignore_fence", "--junit", str(junit),
            env={"PYTHONPATH": str(REPO), "PULSAR_CHAOS_PLUGINS": "tests.campaign.ineffective_knob"})
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 1, out
    (case,) = junit_cases(junit).values()
    failure = case.find("failure")
    assert case.get("name") == KNOB and failure is not None and failure.get("type") == "expected-invalid", out
    assert "1 did not" in out


def test_a_run_past_its_time_limit_is_stopped_cleanly_and_is_an_error(tmp_path):
    # run_timeout 3 s: the run is stopped while it deploys or runs; it tears its cluster down, its folder
    # is kept, JUnit has an error, and the campaign exits 2 (nothing failed, something ended unknown)
    camp = tmp_path / "late.toml"
    camp.write_text(CAMPAIGN.read_text().replace('analyze = false', 'analyze = false\nrun_timeout = 3'))
    junit = tmp_path / "junit.xml"
    p = subprocess.run([sys.executable, "-m", "harness.cli", "campaign", str(camp), "--only", CORRECT,
                        "--results-dir", str(tmp_path / "results"), "--junit", str(junit)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    (folder,) = (tmp_path / "results" / "campaigns" / "two-runs").iterdir()
    rec = entries(folder)[CORRECT]
    assert rec["outcome"] == "timeout" and "run limit of 3 s" in rec["why"], rec
    run_dir = Path(rec["run_dir"])
    res = json.loads((run_dir / "results.json").read_text())
    assert res["valid"] == "unknown" and res["run"]["interrupted"] == "SIGTERM"
    name = json.loads((run_dir / "cluster.json").read_text())["name"]
    listed = subprocess.run([sys.executable, "-m", "harness.cli", "cluster", "list"], cwd=REPO,
                            capture_output=True, text=True, timeout=60).stdout
    mine = [c for c in json.loads(listed) if c["name"] == name]
    assert all(c["status"] != "up" for c in mine), mine
    (case,) = junit_cases(junit).values()
    assert case.find("error") is not None and case.find("error").get("type") == "timeout"


def test_crashed_runs_are_errors_and_the_campaign_goes_on(tmp_path):
    junit = tmp_path / "junit.xml"
    p = cli("--results-dir", str(tmp_path / "results"), "--junit", str(junit),
            env={"PYTHONPATH": str(REPO), "PULSAR_CHAOS_PLUGINS": "tests.campaign.crashing_run"})
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 2, out
    (folder,) = (tmp_path / "results" / "campaigns" / "two-runs").iterdir()
    recs = entries(folder)
    assert [r["outcome"] for r in recs.values()] == ["crashed", "crashed"], recs
    assert all("exit 255" in r["why"] for r in recs.values())
    assert "a crash planted" in (folder / "logs" / f"{KNOB}.log").read_text()
    cases = junit_cases(junit)
    assert all(tc.find("error") is not None and tc.find("error").get("type") == "crashed" for tc in cases.values())


def test_max_hours_starts_no_run_that_would_end_after_it(tmp_path):
    junit = tmp_path / "junit.xml"
    p = cli("--results-dir", str(tmp_path / "results"), "--junit", str(junit), "--max-hours", "0.001")
    out = p.communicate(timeout=120)[0]
    assert p.returncode == 2 and "--max-hours 0.001 reached: 2 run(s) not started" in out, out
    (folder,) = (tmp_path / "results" / "campaigns" / "two-runs").iterdir()
    assert not list((folder / "runs").iterdir())
    assert all(tc.find("skipped") is not None for tc in junit_cases(junit).values())
