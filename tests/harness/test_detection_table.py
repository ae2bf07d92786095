"""`pulsar-chaos detection`: the detection matrix of a generated campaign (bench/campaign_gen.py detection, no
cluster), from one folder or from its shards' folders, without Spark; bad input is one line and exit 254."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import campaign_gen as cg
from core import store
from harness import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """Three seeds per knob, two per scenario without one: ack_before_fsync loses a send in every fault
    window (detected whenever a window opens), ignore_fence only duplicates (never invalid: a short row),
    recovery_fencing loses one in half of them."""
    out = tmp_path_factory.mktemp("detection-campaign")
    mp = pytest.MonkeyPatch()
    mp.setattr(cg, "KNOB_EFFECTS", {"bookie.ack_before_fsync": {"lost": 1.0}, "bookie.ignore_fence": {"duplicate": 1.0},
                                    "broker.recovery_fencing": {"lost": 0.5}})
    try:
        m = cg.detection_campaign(out, seeds=3, valid_seeds=2, seed=4, jsonl=False)
    finally:
        mp.undo()
    return out, m


def _expected_rows(out: Path, manifest: dict) -> dict[tuple[str, str], tuple[int, int, float | None]]:
    """(knob or "none", nemesis) -> (invalid, runs, mean time to first detection), from the manifest and
    each run's results.json, counted here."""
    acc: dict[tuple[str, str], list] = {}
    for e in manifest["runs"]:
        knob = ",".join(f"{k}={json.dumps(v)}" for k, v in e["bugs"].items()) or "none"
        a = acc.setdefault((knob, ",".join(sorted(e["nemesis"]))), [0, 0, []])
        a[1] += 1
        if e["python"]["valid"] is False:
            a[0] += 1
            d = store.read_results(out / e["run"])["detection"]
            # the first fault is the manifest's first fault window
            assert d["first_fault_s"] == pytest.approx(e["fault_windows"][0]["start_s"], abs=1e-3)
            a[2].append(d["seconds"])
    return {k: (a[0], a[1], round(sum(a[2]) / len(a[2]), 2) if a[2] else None) for k, a in acc.items()}


def _table(capsys, *dirs) -> tuple[int, str, str]:
    code = cli.main(["detection", *map(str, dirs)])
    o = capsys.readouterr()
    return code, o.out, o.err


def test_the_table_counts_what_the_runs_say(campaign, capsys):
    out, m = campaign
    want = _expected_rows(out, m)
    code, text, err = _table(capsys, out)
    assert code == 0 and err == ""
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert len(rows) == 3
    got = {}
    for ln in rows:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        knob = cells[0].strip("`")
        nem = cells[1].split(" / ")[1].split(" (")[0]
        detected = cells[2].split(" ")[0]
        inv, runs = map(int, detected.split("/"))
        mean = None if cells[4] == "n/a" else float(cells[4].split(" ")[0])
        got[(knob, nem)] = (inv, runs, mean)
        none = want[("none", nem)]
        assert cells[5] == f"{none[0]}/{none[1]}"                # false alarms of the scenario without it
        assert ("short of 3/3" in cells[2]) == (inv < runs)     # target 80 % of 3 seeds: 3
        if inv < runs:
            assert f"short of 3/3: {runs - inv} judged valid)" in cells[2]
    assert got == {k: v for k, v in want.items() if k[0] != "none"}
    assert got[("bookie.ignore_fence=true", "kill,partition")][0] == 0        # duplicates alone: never caught
    assert got[("bookie.ack_before_fsync=true", "kill")][:2] == (3, 3)
    assert text.splitlines()[-1].endswith(f"false alarms 0/{2 * len(cg.DETECTION_SCENARIOS)} runs expected valid.")
    # the JSON rows are the same figures
    code, js, _ = _table(capsys, out, "--json")
    assert code == 0 and sum(r["runs"] for r in json.loads(js)) == len(m["runs"])


def test_shard_folders_give_the_same_table(campaign, capsys, tmp_path):
    out, m = campaign
    a, b = tmp_path / "shard-1", tmp_path / "shard-2"
    for i, e in enumerate(m["runs"]):
        dest = (a if i % 2 else b) / e["run"]
        shutil.copytree(out / e["run"], dest)
    assert _table(capsys, a, b)[:2] == _table(capsys, out)[:2]


def test_a_campaigns_interrupted_attempt_is_not_counted_beside_its_rerun(campaign, capsys, tmp_path):
    """A campaign stopped during a run and resumed (or a run over its timeout) leaves the attempt's folder
    beside the rerun's: campaign.json keeps the rerun, and only it counts (it once counted twice, 5/6)."""
    out, m = campaign
    camp = tmp_path / "camp"
    entries = []
    for i, e in enumerate(m["runs"]):
        name = f"entry-{i}"
        kept = camp / "runs" / name / "20261128T120000"
        shutil.copytree(out / e["run"], kept)
        entries.append({"name": name, "run_dir": f"/elsewhere/runs/{name}/{kept.name}"})   # a moved folder
    # entry 0's attempt, interrupted before its rerun: a run of the other outcome than the kept one
    other = next(e for e in m["runs"] if e["python"]["valid"] != m["runs"][0]["python"]["valid"])
    shutil.copytree(out / other["run"], camp / "runs" / "entry-0" / "20261128T110000")
    # an entry not finished yet: nothing of it counts
    shutil.copytree(out / other["run"], camp / "runs" / "entry-x" / "20261128T130000")
    entries.append({"name": "entry-x", "run_dir": None})
    (camp / "campaign.json").write_text(json.dumps({"entries": entries}))
    code, text, err = _table(capsys, camp)
    assert code == 0 and _table(capsys, out)[1] == text
    skipped = sorted(ln for ln in err.splitlines())
    assert len(skipped) == 2, err
    assert "20261128T110000: an interrupted attempt of campaign entry entry-0, rerun as 20261128T120000" in skipped[0]
    assert "entry-x/20261128T130000: an attempt of campaign entry entry-x, which has not finished" in skipped[1]


def test_it_needs_no_spark():
    code = ("import sys; from harness import cli; rc = cli.main(['detection', sys.argv[1]]); "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'; sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, str(REPO / "tests")], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    # tests/ holds no run folder: a clean usage error, and pyspark was never imported on the way
    assert p.returncode == 254 and "pyspark imported" not in p.stderr, p.stderr


@pytest.mark.parametrize("what", ["missing", "file", "empty", "broken"])
def test_bad_input_is_one_line_and_254(what, tmp_path, capsys):
    target = tmp_path / what
    if what == "file":
        target.write_text("x")
    elif what == "empty":
        (target / "runs" / "nothing-here").mkdir(parents=True)
    elif what == "broken":
        run = target / "runs" / "t" / "20261128T000000"
        run.mkdir(parents=True)
        (run / store.TEST_TOML).write_text("workload = 'log'\n")       # no history: skipped, nothing left
    code, out, err = _table(capsys, target)
    assert code == 254 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {target}") and "(fix: " in err
    assert "Traceback" not in err
