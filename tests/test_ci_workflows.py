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


def test_weekly_detection_runs_the_campaign_in_shards_then_the_matrix_and_the_analysis():
    wf = yaml.safe_load((WF / "detection.yml").read_text())
    assert wf[True]["schedule"][0]["cron"] == "0 2 * * 0" and "workflow_dispatch" in wf[True]
    shard, matrix = wf["jobs"]["shard"], wf["jobs"]["matrix"]
    assert "self-hosted" in shard["runs-on"] and "self-hosted" in matrix["runs-on"]
    n = len(shard["strategy"]["matrix"]["shard"])
    assert shard["strategy"]["matrix"]["shard"] == list(range(1, n + 1)) and shard["strategy"]["fail-fast"] is False
    runs = "\n".join(s.get("run", "") for s in shard["steps"])
    assert "make setup" in runs and "campaigns/detection.toml" in runs and f'--shard "$SHARD/{n}"' in runs
    assert "--junit" in runs and "|| true" not in [l for l in runs.splitlines() if "pulsar-chaos campaign" in l][0]
    uploads = {s["with"]["name"]: s["with"]["path"] for s in shard["steps"]
               if s.get("uses", "").startswith("actions/upload-artifact")}
    assert uploads == {"detection-junit-${{ matrix.shard }}": "detection-junit-${{ matrix.shard }}.xml",
                       "detection-campaign-${{ matrix.shard }}": "detection-results/campaigns/"}
    # the last job gathers every shard, whatever they ended with, and keeps the table and the analysis
    assert matrix["needs"] == "shard" and matrix["if"] == "always()"
    [down] = [s for s in matrix["steps"] if s.get("uses", "").startswith("actions/download-artifact")]
    assert down["with"]["pattern"] == "detection-campaign-*"
    mruns = "\n".join(s.get("run", "") for s in matrix["steps"])
    assert "pulsar-chaos detection shards/" in mruns and "pulsar-chaos analyze shards" in mruns
    [up] = [s for s in matrix["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert up["with"]["path"].split() == ["detection-matrix.md", "detection-analysis/"]
    entries = load(WF.parents[1] / "campaigns" / "detection.toml").entries
    assert len(entries) >= n
