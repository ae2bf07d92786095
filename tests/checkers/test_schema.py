"""The schema checker on hand-made histories: each anomaly with and without it, indeterminate ops that
must not raise an alarm, the strategy table; and the schema workload's labels against the client's
JsonSchema and the broker's compatibility check (no cluster)."""
from __future__ import annotations

import json

import pytest

from checkers import REGISTRY
from checkers.schema import ANOMALY_TYPES, check, must_refuse
from core.history import Op

MS = 1_000_000
T = "persistent://public/default/s-0"


class H:
    """A schema-workload history builder: each op gets the next index, 1 ms after the previous one."""

    def __init__(self):
        self.ops: list[Op] = []
        self.next_process = 0

    def add(self, op: Op) -> Op:
        op.index = len(self.ops)
        op.time_ns = (op.index + 1) * MS
        self.ops.append(op)
        return op

    def op(self, f, value=None, type="ok", out=None, key=T, node="", error=""):
        p = self.next_process
        self.next_process += 1
        self.add(Op(process=p, type="invoke", f=f, key=key, value=value))
        return self.add(Op(process=p, type=type, f=f, key=key, value=out, node=node,
                           error=error or ("" if type == "ok" else "Timeout")))

    def create(self, label, role="producer", change="compatible", type="ok", key=T):
        return self.op(f"create-{role}", {"schema": label, "change": change}, type, key=key)

    def register(self, label, version=None, change="compatible", type="ok", key=T):
        return self.op("register", {"schema": label, "change": change, "broker": "broker-1"}, type,
                       {"version": version} if type == "ok" else None, key=key)

    def deliver(self, *msgs, f="receive", key=T):
        """msgs: (value, label, version) triples."""
        return self.op(f, None, "ok", [{"value": v, "schema": lab, "version": ver,
                                        "message_id": {"ledger_id": 3, "entry_id": v, "partition": -1,
                                                       "batch_index": -1}} for v, lab, ver in msgs], key=key)

    def registry(self, broker, versions, type="ok", key=T, round=None):
        """versions: {version: label}; round: the workload's final round (None: not recorded)"""
        out = [{"version": v, "schema": lab, "type": "JSON"} for v, lab in sorted((versions or {}).items())]
        value = {"broker": broker} if round is None else {"broker": broker, "round": round}
        return self.op("registry", value, type, out if type == "ok" else None, key=key, node=broker)

    def finals(self, versions, brokers=("broker-1", "broker-2")):
        for b in brokers:
            self.registry(b, versions)


def healthy() -> H:
    """base (version 0, stored by the workload's preparation), t0.1 registered as 1, t1.1 made by a
    producer as 2; messages of each; incompatible attempts refused; both brokers agree."""
    h = H()
    h.create("base")
    h.create("base", role="consumer")
    h.deliver((1, "base", 0))
    h.register("t0.1", 1)
    h.create("t0.1")
    h.create("t1.1")
    h.create("t1.1!type", change="type", type="fail")
    h.create("t1.1!type", role="consumer", change="type", type="fail")
    h.register("t0.1!drop", change="drop", type="fail")
    h.create("t1.1!drop", role="consumer", change="drop")       # BACKWARD against the latest: accepted
    h.deliver((2, "t0.1", 1), (3, "t1.1", 2))
    h.deliver((1, "base", 0), (2, "t0.1", 1), (3, "t1.1", 2), f="read")
    h.finals({0: "base", 1: "t0.1", 2: "t1.1"})
    return h


def kinds(r) -> set[str]:
    return set(r.anomalies)


def test_a_healthy_history_is_valid():
    r = check(healthy().ops)
    assert r.valid is True, r.anomalies
    assert r.stats["messages"] == 6 and r.stats["versions"] == {T: 3}
    assert r.stats["creations"]["create-producer:type:fail"] == 1


def test_lost_version():
    h = healthy()
    h.create("t2.1")
    h.deliver((9, "t2.1", 3))                 # given version 3, which the registry no longer has
    h.finals({0: "base", 1: "t0.1", 2: "t1.1"})
    r = check(h.ops)
    assert r.valid is False and kinds(r) == {"lost-version"}, r.anomalies
    ev = r.anomalies["lost-version"][0]
    assert ev["version"] == 3 and ev["schema"] == "t2.1" and ev["final_versions"] == [0, 1, 2]


def test_unaccepted_version_other_than_the_registration_answered():
    h = healthy()
    h.register("t2.1", 3)
    h.create("t2.1")
    h.deliver((9, "t2.1", 4))                 # its producer was given 4, the registration answered 3
    h.finals({0: "base", 1: "t0.1", 2: "t1.1", 3: "t2.1", 4: "t2.1"})
    r = check(h.ops)
    assert "unaccepted-version" in kinds(r) and r.valid is False
    ev = r.anomalies["unaccepted-version"][0]
    assert ev["version"] == 4 and ev["answered_versions"] == [3]


def test_unaccepted_version_of_a_schema_never_accepted():
    h = healthy()
    h.create("t2.1", type="fail")
    h.deliver((9, "t2.1", 2))
    r = check(h.ops)
    assert "unaccepted-version" in kinds(r)
    assert r.anomalies["unaccepted-version"][0]["why"].startswith("no creation")


def test_divergence_between_brokers():
    h = healthy()
    h.registry("broker-2", {0: "base", 1: "t0.1"})      # broker-2's last answer lacks version 2
    r = check(h.ops)
    assert kinds(r) == {"divergence"}, r.anomalies
    ev = r.anomalies["divergence"][0]
    assert set(ev["answers"]) == {"broker-1", "broker-2"}


def test_divergence_judged_on_each_brokers_last_answer():
    h = H()
    h.create("base")
    h.deliver((1, "base", 0))
    h.registry("broker-1", {0: "base"})
    h.registry("broker-2", {})                           # a first round still catching up
    h.registry("broker-1", {0: "base"})
    h.registry("broker-2", {0: "base"})
    assert check(h.ops).valid is True


def test_divergence_judged_only_on_a_round_where_every_broker_answered():
    h = H()
    h.create("base")
    h.register("t0.1", 1)
    h.deliver((1, "base", 0))
    # round 0: broker-2 gave no answer; round 1: broker-1 gave none, and t0.1 had finished meanwhile
    h.registry("broker-1", {0: "base"}, round=0)
    h.registry("broker-2", None, type="info", round=0)
    h.registry("broker-1", None, type="info", round=1)
    h.registry("broker-2", {0: "base", 1: "t0.1"}, round=1)
    r = check(h.ops)
    assert r.valid is True, r.anomalies
    assert r.stats["topics_without_complete_round"] == [T]
    # a complete round that differs is a divergence; a later complete one that agrees clears it
    h.registry("broker-1", {0: "base"}, round=2)
    h.registry("broker-2", {0: "base", 1: "t0.1"}, round=2)
    r = check(h.ops)
    assert kinds(r) == {"divergence"} and r.anomalies["divergence"][0]["round"] == 2
    h.registry("broker-1", {0: "base", 1: "t0.1"}, round=3)
    h.registry("broker-2", {0: "base", 1: "t0.1"}, round=3)
    assert check(h.ops).valid is True


@pytest.mark.parametrize("role, change, strategy, flagged", [
    ("producer", "type", "FULL", True), ("register", "drop", "FULL", True),
    ("consumer", "type", "FULL", True), ("consumer", "drop", "FULL", False),
    ("producer", "drop", "BACKWARD", False), ("producer", "drop", "FORWARD", True),
    ("producer", "type", "ALWAYS_COMPATIBLE", False)])
def test_incompatible_accepted(role, change, strategy, flagged):
    h = healthy()
    if role == "register":
        h.register("t1.1!" + change, 3, change=change)
    else:
        h.create("t1.1!" + change, role=role, change=change)
    if role == "register":
        h.finals({0: "base", 1: "t0.1", 2: "t1.1", 3: "t1.1!" + change})
    r = check(h.ops, {"strategy": strategy})
    assert ("incompatible-accepted" in kinds(r)) is flagged, r.anomalies
    if flagged:
        ev = r.anomalies["incompatible-accepted"][0]
        assert ev["change"] == change and ev["strategy"] == strategy and ev["topic_had_schema_since"]


def test_an_incompatible_first_schema_is_not_flagged():
    h = H()
    h.create("t0.1!type", change="type")        # nothing stored yet: a topic's first schema is accepted
    h.create("base")
    assert "incompatible-accepted" not in kinds(check(h.ops))


def test_version_conflict_between_messages_and_the_registry():
    h = healthy()
    h.register("t2.1", 3)
    h.register("t3.1", 3)                        # two brokers both stored version 3 (no compare-and-set)
    h.create("t2.1")
    h.create("t3.1")
    h.deliver((8, "t2.1", 3), (9, "t3.1", 3))
    h.finals({0: "base", 1: "t0.1", 2: "t1.1", 3: "t3.1"})
    r = check(h.ops)
    assert kinds(r) == {"version-conflict"}, r.anomalies
    ev = r.anomalies["version-conflict"][0]
    assert ev["version"] == 3 and set(ev["schemas"]) == {"t2.1", "t3.1"}


def test_indeterminate_ops_raise_no_alarm():
    h = healthy()
    h.create("t2.1!type", change="type", type="info")         # may or may not have been refused
    h.register("t2.1", type="info")                            # may have been stored: its messages are fine
    h.create("t2.1")
    h.deliver((9, "t2.1", 3))
    h.registry("broker-1", None, type="info")                  # an unanswered registry query is left out
    h.registry("broker-1", {0: "base", 1: "t0.1", 2: "t1.1", 3: "t2.1"})
    h.registry("broker-2", {0: "base", 1: "t0.1", 2: "t1.1", 3: "t2.1"})
    h.op("receive", type="info")
    r = check(h.ops)
    assert r.valid is True, r.anomalies
    assert r.stats["final_answers_indeterminate"] == {T: 1}


def test_no_final_answer_is_unknown_not_invalid():
    h = H()
    h.create("base")
    h.deliver((1, "base", 0))
    h.registry("broker-1", None, type="info")
    r = check(h.ops)
    assert r.valid == "unknown" and not r.anomalies
    assert r.stats["topics_without_final_answer"] == [T]


def test_messages_without_version_or_label_are_counted_not_judged():
    h = healthy()
    h.deliver((7, "base", None), (8, None, 5))
    r = check(h.ops)
    assert r.valid is True and r.stats["unversioned"] == 1 and r.stats["unlabelled"] == 1


def test_strategy_table_and_bad_input():
    assert must_refuse("FULL", "producer", "drop") and not must_refuse("FULL", "consumer", "drop")
    assert must_refuse("FULL_TRANSITIVE", "consumer", "drop")
    assert must_refuse("ALWAYS_INCOMPATIBLE", "consumer", "drop")
    assert not must_refuse("BACKWARD_TRANSITIVE", "producer", "drop")
    with pytest.raises(ValueError, match="unknown schema compatibility strategy 'SOMETIMES'"):
        check(healthy().ops, {"strategy": "SOMETIMES"})


def test_registered_with_the_workload():
    import workloads
    from core.spec import TestSpec
    assert REGISTRY["schema"].check is check
    wanted = workloads.get("schema").checkers(TestSpec(workload="schema", options={"strategy": "BACKWARD"}))
    assert wanted["schema"][1] == {"strategy": "BACKWARD"}
    assert set(ANOMALY_TYPES) == {"lost-version", "unaccepted-version", "divergence", "incompatible-accepted",
                                  "version-conflict"}


# ------------------------------------------------------------------ the workload's schemas (no cluster)

LABELS = ["base", "t0.1", "t4.3", "t4.3!type", "t0.2!drop", "base!type"]


@pytest.mark.parametrize("label", LABELS)
def test_labels_round_trip_through_the_clients_json_schema(label):
    from workloads.schema import definition, json_schema, label_of
    sent = json_schema(label).schema_info().schema()          # what the client sends for a producer
    assert json.loads(sent) == json.loads(definition(label))
    assert label_of(sent) == label_of(definition(label)) == label
    assert label_of('{"type": "string"}').startswith("?")


def test_the_brokers_check_agrees_with_the_checkers_table():
    """The series and its incompatible variants, through the reference broker's compatibility check
    (as a library): any two series schemas are compatible in any order; each variant is refused
    exactly where `must_refuse` says."""
    from clusters.broker import schema as b
    from workloads.schema import definition

    def accepted(latest, new, strategy, role):
        stored = [b.SchemaData("JSON", definition(latest).encode())]
        new_s = b.SchemaData("JSON", definition(new).encode())
        try:
            if role == "consumer":
                if strategy in ("BACKWARD", "FORWARD", "FULL"):
                    b.check_compatible(stored, new_s, "BACKWARD")
                else:
                    b.check_compatible(stored, new_s, strategy)
            else:
                b.check_compatible(stored, new_s, strategy)
        except b.IncompatibleSchema:
            return False
        return True
    for strategy in ("FULL", "BACKWARD", "FORWARD", "ALWAYS_COMPATIBLE"):
        assert accepted("t1.2", "t3.1", strategy, "producer") and accepted("t3.1", "t1.3", strategy, "producer")
        for role in ("producer", "consumer"):
            for change in ("type", "drop"):
                assert accepted("t2.2", "t1.1!" + change, strategy, role) is not must_refuse(strategy, role, change), \
                    (strategy, role, change)
