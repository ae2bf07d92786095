"""The log, queue and subscriptions workloads under `pulsar-chaos run` on a real cluster: valid on the
default (correct) configuration, and their checkers report the expected anomaly when a bug knob or an
unsafe setting is on."""
from __future__ import annotations

import pytest

from tests.workloads import runs

pytestmark = pytest.mark.integration


def run(tmp_path, **kw) -> tuple[int, dict, str]:
    return runs.run(tmp_path, **kw)[:3]


def test_queue_with_dedup_under_kills_is_valid(tmp_path):
    code, res, out = run(tmp_path, workload="queue", options={"dedup": True}, time_limit=15.0,
                         nemesis=["kill", "partition"], nemesis_interval=4.0)
    q = res["checkers"]["queue"]
    assert code == 0 and res["valid"] is True, (out, {k: c["anomalies"] for k, c in res["checkers"].items()})
    assert q["valid"] is True and not q["anomalies"].get("lost")
    assert q["stats"]["acknowledged"] > 100


def test_queue_claiming_exactly_once_with_redeliveries_is_invalid(tmp_path):
    # every 5th message is negatively acknowledged after it was recorded: Pulsar redelivers it, so it is
    # delivered twice, which a queue that claims exactly-once delivery must report
    code, res, out = run(tmp_path, workload="queue", options={"exactly_once": True, "nack_every": 5},
                         time_limit=8.0, nemesis=[])
    q = res["checkers"]["queue"]
    assert code == 1 and q["valid"] is False, out
    assert q["anomalies"].get("duplicated"), q["anomalies"].keys()
    assert not q["anomalies"].get("lost")


def test_key_shared_under_faults_is_valid(tmp_path):
    code, res, out = run(tmp_path, workload="subscriptions", options={"subscription": "key_shared"},
                         time_limit=15.0, nemesis=["kill", "partition"], nemesis_interval=4.0)
    assert code == 0 and res["valid"] is True, (out, {k: c["anomalies"] for k, c in res["checkers"].items()})
    assert res["checkers"]["log"]["stats"].get("subscription_type", "Key_Shared") == "Key_Shared"


# the log workload's run of the same scenario is tests/spark_analysis/test_real_runs.py's "log-fencing-off",
# made once there for both purposes (test_log_with_recovery_fencing_off_loses_acknowledged_messages)
@pytest.mark.parametrize("workload, options", [("subscriptions", {"subscription": "failover"})])
def test_recovery_fencing_off_loses_acknowledged_messages(tmp_path, workload, options):
    # the old owner, cut from ZooKeeper only, keeps acknowledging on a ledger the new owner closed. The
    # cut lasts 15 s: the owner's session (6 s) expires on the server well before the heal; producers
    # replaced every 3 s look the topic up through the other broker, which then takes it over, while
    # the producers already on the old owner go on sending there until their replacement is made
    code, res, out = run(tmp_path, workload=workload, options=options,
                         time_limit=35.0, nemesis=["zk-isolate"], nemesis_interval=15.0,
                         bugs={"broker.recovery_fencing": False})
    assert code == 1 and res["valid"] is False, out
    assert res["checkers"]["log"]["anomalies"].get("lost"), res["checkers"]["log"]["anomalies"].keys()
    # the stale owner's acknowledgements lie beyond the last entry its ledger was closed at
    fencing = res["checkers"]["fencing"]["anomalies"]
    assert fencing.get("beyond-close") or fencing.get("split-brain"), fencing.keys()


def test_schema_workload_under_kills_is_valid(tmp_path):
    # the one real-cluster run of the schema workload: evolutions through producers, consumers and the
    # admin API of either broker while brokers and bookies are killed; incompatible schemas refused,
    # and every broker answering the same versions at the end
    code, res, out = run(tmp_path, workload="schema", time_limit=12.0, nemesis=["kill"], nemesis_interval=4.0,
                         rate=100)
    s = res["checkers"]["schema"]
    assert code == 0 and res["valid"] is True, (out, {k: c["anomalies"] for k, c in res["checkers"].items()})
    created = s["stats"]["creations"]
    assert any(k.startswith("register:compatible:ok") for k in created), created
    assert any(k.endswith(":fail") and ":compatible:" not in k for k in created), created
    assert s["stats"]["messages"] > 100 and sum(s["stats"]["versions"].values()) > 2, s["stats"]


def test_schema_versions_written_without_compare_and_set_are_caught(tmp_path):
    # broker.schema_no_cas: producers and registrations bringing new schemas to one owner at once both
    # write version k; the checker sees two schemas answered with one version, or a producer given a
    # version no registration was answered with (bench/README.md: caught in 5 of 5 60-s runs). More
    # evolutions than the default so that a short run without faults has races to lose
    code, res, out = run(tmp_path, workload="schema", time_limit=12.0, nemesis=[], rate=100,
                         options={"evolve_share": 0.3}, bugs={"broker.schema_no_cas": True})
    s = res["checkers"]["schema"]
    assert code == 1 and s["valid"] is False, out
    assert set(s["anomalies"]) & {"version-conflict", "unaccepted-version"}, s["anomalies"].keys()


def test_a_delayed_index_kept_in_memory_loses_delayed_messages_on_a_kill(tmp_path):
    # broker.delayed_index_in_memory: the subscription's position passes delayed messages still waiting
    # in the owner's memory, so a killed owner's successor never delivers them
    # (kill:owner: a plain kill picks any node, and a run whose kills hit only bookies loses nothing)
    code, res, out = run(tmp_path, workload="queue", options={"delay_max_ms": 3000}, time_limit=12.0,
                         nemesis=["kill:owner"], nemesis_interval=4.0, bugs={"broker.delayed_index_in_memory": True})
    q = res["checkers"]["queue"]
    assert code == 1 and q["valid"] is False, out
    assert q["anomalies"].get("lost"), q["anomalies"].keys()
    assert not q["anomalies"].get("early"), q["anomalies"]["early"][:3]
