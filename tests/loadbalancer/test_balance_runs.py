"""The balance workload under `pulsar-chaos run` on a real 3-broker cluster while load moves: valid on the
default configuration under every load-moving fault, with either load manager, and the ownership and log
checkers catch the split bug knob (concurrent splits without compare-and-set, apache/pulsar#1117)."""
from __future__ import annotations

import pytest

from tests.workloads import runs

pytestmark = pytest.mark.integration

# shortened load-balancer timers (Pulsar's names; Pulsar: 5000 ms and 1 min)
LB = {"loadBalancerReportUpdateMinIntervalMillis": 1000, "loadBalancerSheddingIntervalMinutes": 0.25}


def anomalies(res: dict) -> dict:
    return {k: {a: len(v) if isinstance(v, list) else v for a, v in c["anomalies"].items()}
            for k, c in res["checkers"].items()}


def test_balance_under_every_load_moving_fault_is_valid(tmp_path):
    code, res, out, run_dir = runs.run(
        tmp_path, prefix="bal", workload="balance", brokers=3, topics=40, time_limit=30.0, seed=7,
        nemesis_schedule=[{"at": 3, "name": "split", "hold": 1}, {"at": 6, "name": "unload:dest", "hold": 1},
                          {"at": 9, "name": "kill:lb-leader", "hold": 6}, {"at": 17, "name": "scale", "hold": 5},
                          {"at": 24, "name": "unload", "hold": 1}],
        nemesis=[], lb_settings=dict(LB), options={"hot_topics": 2})
    assert code == 0 and res["valid"] is True, (out[-3000:], anomalies(res))
    own = res["checkers"]["ownership"]["stats"]
    assert own["observed"] and own["lock_rows"] > 4          # the recorder saw the locks move
    assert (run_dir / "journals" / "lb-events.jsonl").exists()


def test_the_extensible_load_manager_under_the_load_moving_faults_is_valid(tmp_path):
    """The same faults against the extensible load manager: `lb-leader` is its leader, the channel owner
    (/loadbalance/extension/leader); the channel checker judges the channel topic read after the run."""
    code, res, out, run_dir = runs.run(
        tmp_path, prefix="xbal", workload="balance", load_manager="extensible", brokers=3, topics=40,
        time_limit=30.0, seed=7,
        nemesis_schedule=[{"at": 3, "name": "split", "hold": 1}, {"at": 6, "name": "unload:dest", "hold": 1},
                          {"at": 9, "name": "kill:lb-leader", "hold": 6}, {"at": 17, "name": "scale", "hold": 5},
                          {"at": 24, "name": "unload", "hold": 1}],
        nemesis=[], lb_settings={"loadBalancerReportUpdateMinIntervalMillis": 1000})
    assert code == 0 and res["valid"] is True, (out[-3000:], anomalies(res))
    faults = res["run"]["faults"]
    assert faults["failed"] == {}, faults                    # every fault took effect, the channel owner's kill too
    assert faults["took_effect"] == {"split": 1, "unload": 2, "kill": 1, "scale": 1}, faults
    assert "warning:" not in out
    ch = res["checkers"]["channel"]
    assert ch["valid"] is True and ch["stats"]["messages"] >= 6 and ch["stats"]["views"]
    assert res["checkers"]["ownership"]["valid"] is True and res["checkers"]["log"]["valid"] is True


def test_concurrent_splits_without_cas_are_caught(tmp_path):
    # two bundles split at once every 1 s: with the knob, one split's boundaries are overwritten, its
    # parent range is assigned again while the children's owner serves them: two owners, or (when the
    # overwritten boundaries no longer name the children's locks) a broker serving a topic of a bundle
    # whose lock it does not hold; either is the ownership checker catching it. bench/lb_detection.py's
    # scenario splits every 2 s (caught 4 of 5, bench/README.md): 10 splits in 40 s, and under a loaded
    # `make test` seeds 1 and 2 once both ended valid. Every 1 s gives 19 splits: by hand under load,
    # seeds 1 and 2 gave 20 and 612 double owners (every 2 s: 2 and 2), and without the knob seed 1 is
    # valid. Up to three seeds, stopping at the first caught: an ineffective knob leaves all three valid
    # and fails the test.
    seen = []
    for seed in (1, 2, 3):
        code, res, out, _ = runs.run(
            tmp_path / f"s{seed}", prefix="balk", workload="balance", brokers=3, topics=40, time_limit=40.0,
            seed=seed, nemesis=["split"], nemesis_interval=1.0,
            lb_settings={"loadBalancerReportUpdateMinIntervalMillis": 1000}, bugs={"broker.split_without_cas": True})
        own = res["checkers"]["ownership"]
        seen.append((seed, code, anomalies(res)))
        if code == 1 and res["valid"] is False and own["valid"] is False and (
                own["anomalies"].get("double-owner") or own["anomalies"].get("served-without-lock")):
            return
    raise AssertionError(f"broker.split_without_cas not caught by the ownership checker in 3 runs: {seen}")
