"""A run's expectation (core/expectation.py) from the registries' declarations: bug knobs off their safe
default and each workload's deliberately unsafe options make a run expected invalid; a spec may declare
its own; test.toml records the resolved one; a verdict meets it or not."""
from __future__ import annotations

import tomllib

import pytest

from core.expectation import INVALID, VALID, met
from core.spec import SpecError, from_mapping
from core.spec import TestSpec as Spec
from harness import runner
from harness.catalog import CATALOG


def exp(**kw):
    return Spec(**kw).validate(catalog=CATALOG).expectation(CATALOG)


@pytest.mark.parametrize("kw,label", [
    (dict(bugs={"broker.recovery_fencing": False}), "broker.recovery_fencing=false"),
    (dict(bugs={"bookie.ignore_fence": True}), "bookie.ignore_fence=true"),
    (dict(workload="register", options={"cas": "unsafe"}), "register:cas=unsafe"),
    (dict(workload="exactly-once", options={"seek": False}), "exactly-once:seek=false"),
    (dict(workload="exactly-once", options={"pin_sequence_ids": False}), "exactly-once:pin_sequence_ids=false"),
    (dict(workload="queue", options={"exactly_once": True, "nack_every": 5}), "queue:exactly_once+nack_every"),
    (dict(workload="queue", options={"dedup": True, "pin_sequence_ids": False}), "queue:pin_sequence_ids=false"),
])
def test_unsafe_things_make_a_run_expected_invalid(kw, label):
    e = exp(**kw)
    assert e.expected == INVALID and e.labels == [label]
    assert label in e.reason


@pytest.mark.parametrize("kw", [
    dict(), dict(bugs={"broker.recovery_fencing": True}),            # a knob at its safe default
    dict(workload="register", options={"cas": "versioned"}),
    dict(workload="queue", options={"exactly_once": True}),          # claimed, but no nacks
    dict(workload="queue", options={"nack_every": 5}),               # nacks, but no claim
    dict(workload="queue", options={"pin_sequence_ids": False}),     # the client's reset, but no dedup
    dict(workload="queue", options={"dedup": True}),                 # pinned by default
    dict(workload="exactly-once", options={"pin_sequence_ids": False, "dedup_output": False}),
])
def test_safe_configurations_are_expected_valid(kw):
    assert exp(**kw).expected == VALID and exp(**kw).labels == []


def test_a_spec_may_declare_its_expectation_with_a_reason():
    e = exp(bugs={"bookie.ack_before_fsync": True}, expected="valid", expected_reason="no power loss: no loss")
    assert e.expected == VALID and e.reason == "no power loss: no loss"
    assert e.labels == ["bookie.ack_before_fsync=true"]
    with pytest.raises(SpecError, match="expected: must be valid or invalid"):
        from_mapping({"expected": "maybe"}, "x.toml", catalog=CATALOG)


def test_met_judges_a_verdict_against_the_expectation():
    assert met(VALID, True) is True and met(VALID, False) is False
    assert met(INVALID, False) is True and met(INVALID, True) is False       # a knob silently ignored
    assert met(INVALID, "unknown") is None and met(VALID, "unknown") is None


def test_test_toml_records_the_resolved_expectation_and_flags_derive_it_again(tmp_path):
    spec = Spec(workload="register", options={"cas": "unsafe"}).validate(catalog=CATALOG)
    resolved = spec.resolved().with_expectation(CATALOG)
    path = tmp_path / "test.toml"
    path.write_text(resolved.to_toml())
    raw = tomllib.loads(path.read_text())
    assert raw["expected"] == "invalid" and "cas=unsafe" in raw["expected_reason"]
    again = runner.spec_from_args(path, {})
    assert again.expectation(CATALOG).expected == INVALID
    # the same file with the option made safe from the command line: the file's expectation was for
    # its own configuration, so it is derived again
    safe = runner.spec_from_args(path, {"options": {"cas": "versioned"}})
    assert safe.expected == "" and safe.expectation(CATALOG).expected == VALID
