"""Unit tests of the distribution schedule and the quorum-coverage rule (no processes)."""
from itertools import combinations

import pytest

from clusters.bookkeeper import quorum


def test_write_sets_stripe_round_robin():
    assert quorum.write_set(0, 3, 2) == [0, 1]
    assert quorum.write_set(2, 3, 2) == [2, 0]
    assert quorum.write_set(7, 5, 3) == [2, 3, 4]
    assert quorum.write_quorums(3, 2) == [[0, 1], [1, 2], [2, 0]]
    # Qw == E: no striping, every entry on every bookie
    assert {tuple(sorted(w)) for w in quorum.write_quorums(3, 3)} == {(0, 1, 2)}


@pytest.mark.parametrize("known,covered", [
    # E=3, Qw=2, Qa=2: each write quorum {0,1},{1,2},{2,0} needs Qw-Qa+1 = 1 known bookie
    ((), False),
    ((0,), False),        # {1,2} entirely unknown: an ack quorum may still be unfenced
    ((1,), False),
    ((2,), False),
    ((0, 1), True),
    ((1, 2), True),
    ((0, 2), True),
    ((0, 1, 2), True),
])
def test_coverage_e3_qw2_qa2(known, covered):
    assert quorum.is_covered(3, 2, 2, known) is covered


@pytest.mark.parametrize("known,covered", [
    # E=5, Qw=3, Qa=2: quorums {0,1,2},{1,2,3},{2,3,4},{3,4,0},{4,0,1}; each needs 2 known
    ((0, 1, 2, 3, 4), True),
    ((0, 1, 2, 3), True),          # only bookie 4 unknown: at most 1 unknown per quorum
    ((1, 2, 3, 4), True),
    ((0, 2, 4), False),            # {1,2,3} has 2 unknown (1 and 3) = Qa -> not covered
    ((0, 1, 3), False),            # {2,3,4}: 2 and 4 unknown
    ((0, 1, 2), False),            # {3,4,0}: 3 and 4 unknown
    ((0, 2, 3), False),            # {4,0,1}: 4 and 1 unknown
    ((1, 3, 4), False),            # {0,1,2}? 0 and 2 unknown
    ((), False),
])
def test_coverage_e5_qw3_qa2(known, covered):
    assert quorum.is_covered(5, 3, 2, known) is covered


def test_coverage_matches_the_no_unfenced_ack_quorum_definition():
    """Brute force: covered iff no ack quorum (Qa bookies inside one write quorum) is entirely
    unknown - the TLA+ formulation."""
    for E, Qw, Qa in [(3, 2, 2), (5, 3, 2), (4, 3, 2), (3, 3, 2), (5, 5, 3), (4, 2, 1)]:
        for r in range(E + 1):
            for known in combinations(range(E), r):
                ks = set(known)
                expect = not any(
                    all(b not in ks for b in aq)
                    for wq in quorum.write_quorums(E, Qw)
                    for aq in combinations(wq, Qa))
                assert quorum.is_covered(E, Qw, Qa, ks) is expect, (E, Qw, Qa, known)


def test_coverage_set_incremental():
    cs = quorum.CoverageSet(3, 2, 2)
    cs.add_known(0)
    assert not cs.covered()
    cs.add_unknown(1)                 # an error answer does not count
    assert not cs.covered() and not cs.all_answered()
    cs.add_known(2)
    assert cs.covered() and cs.all_answered()


def test_recovery_read_outcome():
    # Qw=2, Qa=2: a single NoSuchEntry is enough for a negative (Qw - Qa + 1 = 1)
    assert quorum.recovery_read_outcome(2, 2, ok=0, missing=1, answered=1) == "negative"
    # Qw=3, Qa=2: need 2 NoSuchEntry; one NoSuchEntry + one error from all 3 -> unknown
    assert quorum.recovery_read_outcome(3, 2, ok=0, missing=1, answered=1) == "pending"
    assert quorum.recovery_read_outcome(3, 2, ok=0, missing=1, answered=3) == "unknown"
    assert quorum.recovery_read_outcome(3, 2, ok=0, missing=2, answered=2) == "negative"
    assert quorum.recovery_read_outcome(3, 2, ok=1, missing=1, answered=2) == "positive"
    assert quorum.recovery_read_outcome(3, 3, ok=0, missing=1, answered=1) == "negative"
