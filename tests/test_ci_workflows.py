"""The CI workflow files (.github/workflows/) parse as YAML and run what the README says: `make setup`
then `make test` with the slowest tests listed on every push; `make setup` then the nightly campaign with
its JUnit XML and campaign folder as artifacts, failing the job on the campaign's exit code."""
from __future__ import annotations

from pathlib import Path

import yaml

from harness.campaign import load

WF = Path(__file__).resolve().parents[1] / ".github" / "workflows"


def steps(name: str) -> tuple[dict, list[dict]]:
    wf = yaml.safe_load((WF / name).read_text())
    (job,) = wf["jobs"].values()
    assert "self-hosted" in job["runs-on"]
    return wf, job["steps"]


def test_every_push_runs_make_test_with_durations():
    wf, st = steps("test.yml")
    assert "push" in wf[True]                       # YAML 1.1 reads the key `on` as true
    runs = [s.get("run", "") for s in st]
    assert "make setup" in runs
    assert any(r.startswith("make test") and "--durations=10" in r for r in runs)


def test_nightly_runs_the_campaign_and_keeps_junit_and_the_folder():
    wf, st = steps("nightly.yml")
    assert wf[True]["schedule"][0]["cron"]
    runs = "\n".join(s.get("run", "") for s in st)
    assert "make setup" in runs and "campaigns/nightly.toml" in runs and "--junit nightly-junit.xml" in runs
    assert "|| true" not in [l for l in runs.splitlines() if "campaign" in l and "pulsar-chaos" in l][0]
    uploads = {s["with"]["path"] for s in st if s.get("uses", "").startswith("actions/upload-artifact")}
    assert uploads == {"nightly-junit.xml", "nightly-results/campaigns/"}
    assert all(s.get("if") == "always()" for s in st if s.get("uses", "").startswith("actions/upload-artifact"))
    assert load(WF.parents[1] / "campaigns" / "nightly.toml").entries
