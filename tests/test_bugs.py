import pytest

from clusters import bugs


def test_bare_key_means_true_and_values_parse():
    got = bugs.parse(["bookie.ack_before_fsync", "broker.recovery_fencing=false"])
    assert got == {"bookie.ack_before_fsync": True, "broker.recovery_fencing": False}


def test_defaults_are_safe():
    assert bugs.value({}, "bookie.ack_before_fsync") is False
    assert bugs.value(None, "broker.recovery_fencing") is True
    assert bugs.value({"broker.recovery_fencing": False}, "broker.recovery_fencing") is False


def test_unknown_knob_names_the_known_ones():
    with pytest.raises(bugs.UnknownBugKnob, match="known knobs: .*bookie.ack_before_fsync"):
        bugs.parse(["bookie.ack_befor_fsync"])
