"""bench/campaign_gen.py: the planted anomalies of a generated run are exactly what checkers/log.py finds.

Small and fast (a few seconds): a handful of campaign runs with every bug knob's rates raised to 1, and
one streamed "single" run read back from its Parquet files."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench import campaign_gen as cg
from checkers.log import check
from core import store


def _types(planted: dict) -> set[str]:
    return {k for k, v in planted.items() if v}


def test_campaign_runs_hold_exactly_the_planted_anomalies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every knob plants every type in every fault window, so that each type shows up in a few runs
    monkeypatch.setattr(cg, "KNOB_EFFECTS", {k: {t: 1.0 for t in cg.TYPES} for k in cg.KNOB_EFFECTS})
    monkeypatch.setattr(cg, "NEMESES", (("partition", "kill"), ()))
    monkeypatch.setattr(cg, "BUG_SETTINGS", (("broker.recovery_fencing",), ()))
    m = cg.campaign(tmp_path, runs=4, seed=3, days=2, start=None, jsonl=True)
    runs = {e["run"]: e for e in m["runs"]}
    assert len(runs) == 4 and json.loads((tmp_path / cg.MANIFEST).read_text())["runs"] == m["runs"]
    bugged = [e for e in runs.values() if e["bugs"] and e["nemesis"]]
    clean = [e for e in runs.values() if not e["bugs"]]
    assert bugged and clean
    for e in bugged:                     # 1 per window and type; the 30 s runs have one window
        assert _types(e["planted"]) == set(cg.TYPES), e["counts"]
        assert e["expected_valid"] is False
    for e in clean:
        assert e["counts"] == {t: 0 for t in cg.TYPES} and e["expected_valid"] is True
    for rel, e in runs.items():
        run_dir = tmp_path / rel
        for name in (store.TEST_TOML, store.HISTORY_JSONL, store.HISTORY_PARQUET, store.DELIVERIES_PARQUET,
                     store.RESULTS_JSON):
            assert (run_dir / name).is_file(), name
        spec = store.load_spec(run_dir, catalog=None)
        assert spec.nemesis == e["nemesis"] and spec.bugs == e["bugs"]
        # the checker run afresh on the history as `pulsar-chaos check` reads it
        history = store.load_history(run_dir)
        assert len(history) == e["ops"] == pq.ParquetFile(run_dir / store.HISTORY_PARQUET).metadata.num_rows
        assert [op.index for op in history] == list(range(len(history)))
        assert all(a.time_ns <= b.time_ns for a, b in zip(history, history[1:]))
        result = check(history, cg.log_opts(spec))
        assert cg.found_by_checker(result) == cg.normalized(e["planted"])
        assert {k: v for k, v in result.stats["anomaly_counts"].items() if k in cg.TYPES} == \
            {k: n for k, n in e["counts"].items() if n}
        assert result.valid is e["expected_valid"]
        assert e["python"]["matches_planted"] is True
        saved = store.read_results(run_dir)
        assert saved["valid"] == result.valid and saved["checkers"]["log"]["stats"]["anomaly_counts"] == \
            result.stats["anomaly_counts"]
        # fault windows exist where the spec has faults: start/stop ops of process -1, then a heal
        nem = [op.f for op in history if op.process == -1]
        if e["nemesis"]:
            assert nem[0].startswith("start-") and nem[-2:] == ["heal", "heal"]
            assert len(e["fault_windows"]) >= 1
        else:
            assert nem == []


def test_single_run_streams_and_matches(tmp_path: Path) -> None:
    plants = {"lost": 3, "duplicate": 2, "divergence": 2, "nonmonotonic-send": 2, "unexpected": 1}
    m = cg.single(tmp_path, 60_000, seed=5, plants=plants, name="single", jsonl=False)
    e = m["runs"][0]
    assert e["counts"] == plants
    run_dir = tmp_path / e["run"]
    assert not (run_dir / store.HISTORY_JSONL).exists()
    assert store.read_results(run_dir)["valid"] == "unknown"
    history = cg.ops_from_parquet(run_dir / store.HISTORY_PARQUET)
    assert len(history) == e["ops"] and [op.index for op in history] == list(range(len(history)))
    deliveries = pq.ParquetFile(run_dir / store.DELIVERIES_PARQUET).metadata.num_rows
    assert deliveries == e["deliveries"] == len(store.deliveries(history))
    out = cg.check_run(run_dir, tmp_path / cg.MANIFEST)
    assert out["matches_planted"] is True and out["valid"] is False
    assert store.read_results(run_dir)["valid"] is False


def test_check_fails_when_the_checker_misses_a_plant(tmp_path: Path) -> None:
    m = cg.single(tmp_path, 20_000, seed=6, plants={t: 1 for t in cg.TYPES}, name="single", jsonl=False)
    # a manifest that claims one more lost value than the history holds: the comparison must say no
    path = tmp_path / cg.MANIFEST
    doc = json.loads(path.read_text())
    doc["runs"][0]["planted"]["lost"].append({"topic": "t", "value": 123456789})
    doc["runs"][0]["counts"]["lost"] += 1
    path.write_text(json.dumps(doc))
    assert cg.check_run(tmp_path / m["runs"][0]["run"], path)["matches_planted"] is False
