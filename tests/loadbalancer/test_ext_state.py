"""The extensible load manager's channel: states, transitions, JSON, the conflict resolver, ChannelView."""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from clusters.loadbalancer.extensible.state import (BROKER_MISMATCH, INVALID_TRANSITION, JAVA_LONG_MAX, JAVA_LONG_MIN,
                                                    VERSION_GAP, VERSION_NOT_INITIAL, VERSION_NOT_NEWER, S,
                                                    ChannelDecodeError, ChannelView, ServiceUnitStateData,
                                                    StorageType, is_active, is_in_flight, is_valid_transition,
                                                    next_version_id, resolve, should_keep_left)

ST, MS = StorageType.SystemTopic, StorageType.MetadataStore


def d(state, dst=None, src=None, v=1, force=False, split=None):
    return ServiceUnitStateData(state, dst, src, split, force, 0, v)


def test_in_flight_and_active():
    assert {s for s in S if is_in_flight(s)} == {S.Assigning, S.Releasing, S.Splitting}
    assert {s for s in S if is_active(s)} == {S.Assigning, S.Releasing, S.Splitting, S.Owned}


SYSTEM_TOPIC_VALID = {(S.Init, t) for t in (S.Free, S.Owned, S.Assigning, S.Releasing, S.Splitting, S.Deleted)} | {
    (S.Free, S.Assigning), (S.Free, S.Init), (S.Owned, S.Splitting), (S.Owned, S.Releasing), (S.Assigning, S.Owned),
    (S.Releasing, S.Assigning), (S.Releasing, S.Free), (S.Splitting, S.Deleted), (S.Deleted, S.Init)}
METADATA_VALID = {(S.Init, S.Assigning), (S.Free, S.Assigning), (S.Owned, S.Splitting), (S.Owned, S.Releasing),
                  (S.Assigning, S.Owned), (S.Releasing, S.Assigning), (S.Releasing, S.Free),
                  (S.Splitting, S.Deleted), (S.Deleted, S.Init)}


@pytest.mark.parametrize("storage,valid", [(ST, SYSTEM_TOPIC_VALID), (MS, METADATA_VALID)])
def test_transition_tables_exactly(storage, valid):
    got = {(a, b) for a in S for b in S if is_valid_transition(a, b, storage)}
    assert got == valid


# -- JSON ------------------------------------------------------------------------------------------------

def test_json_uses_pulsars_field_names_and_enum_spelling():
    data = ServiceUnitStateData(S.Splitting, None, "b1:8080", {"0x00000000_0x7fffffff": None,
                                                              "0x7fffffff_0xffffffff": "b2:8080"}, False, 17, 5)
    raw = json.loads(data.encode())
    assert raw == {"state": "Splitting", "sourceBroker": "b1:8080",
                   "splitServiceUnitToDestBroker": {"0x00000000_0x7fffffff": None, "0x7fffffff_0xffffffff": "b2:8080"},
                   "force": False, "timestamp": 17, "versionId": 5}
    assert ServiceUnitStateData.decode(data.encode()) == data
    owned = d(S.Owned, "b1", "b0", v=3, force=True)
    assert ServiceUnitStateData.decode(owned.encode()) == owned


@pytest.mark.parametrize("payload,match", [
    (b"\xff\xfe", "not JSON"), (b"[1]", "JSON object"), (b'{"state":"owned","dstBroker":"b"}', "unknown service-unit"),
    (b'{"state":"Owned"}', "Empty broker"), (b'{"state":"Owned","dstBroker":"b","versionId":"x"}', "versionId"),
    (b'{"state":"Owned","dstBroker":"b","versionId":9223372036854775808}', "Java long"),
    (b'{"state":"Owned","dstBroker":7}', "dstBroker"), (b'{"state":"Free","force":"yes"}', "force"),
    (b'{"state":"Splitting","sourceBroker":"a","splitServiceUnitToDestBroker":[1]}', "splitServiceUnitToDestBroker"),
])
def test_decode_refuses_bad_bytes_with_one_error_type(payload, match):
    with pytest.raises(ChannelDecodeError, match=match) as e:
        ServiceUnitStateData.decode(payload)
    assert "\n" not in str(e.value)


def test_free_needs_no_broker_others_do():
    ServiceUnitStateData(S.Free)
    with pytest.raises(ValueError, match="Empty broker"):
        ServiceUnitStateData(S.Assigning, " ", None)


def test_next_version_id_overflows_like_a_java_long():
    assert next_version_id(None) == 1
    assert next_version_id(d(S.Owned, "a", v=4)) == 5
    assert next_version_id(d(S.Owned, "a", v=JAVA_LONG_MAX)) == JAVA_LONG_MIN


# -- the resolver ------------------------------------------------------------------------------------------

def test_tombstone_always_accepted():
    assert resolve(d(S.Owned, "a", v=9), None) is None
    assert resolve(None, None, MS) is None


@pytest.mark.parametrize("storage", [ST, MS])
def test_version_not_newer_rejected(storage):
    frm = d(S.Assigning, "a", v=5)
    assert resolve(frm, d(S.Owned, "a", v=5), storage) == VERSION_NOT_NEWER
    assert resolve(frm, d(S.Owned, "a", v=4), storage) == VERSION_NOT_NEWER
    assert resolve(frm, d(S.Owned, "a", v=6), storage) is None
    # force does not skip the version check
    assert resolve(frm, d(S.Owned, "b", v=5, force=True), storage) == VERSION_NOT_NEWER


def test_version_overflow_continues_to_the_other_rules():
    frm = d(S.Assigning, "a", v=JAVA_LONG_MAX)
    assert resolve(frm, d(S.Owned, "a", v=JAVA_LONG_MIN)) is None
    # ... the transition is still checked after an overflow
    assert resolve(frm, d(S.Splitting, None, "a", v=JAVA_LONG_MIN)) == INVALID_TRANSITION
    # MIN after anything else is simply older
    assert resolve(d(S.Assigning, "a", v=7), d(S.Owned, "a", v=JAVA_LONG_MIN)) == VERSION_NOT_NEWER


def test_compacted_gap_accepted_on_system_topic_only():
    frm = d(S.Owned, "a", v=1)
    gap = d(S.Owned, "b", v=3)      # Owned -> Owned is not a valid transition: the gap skips the check
    assert resolve(frm, gap, ST) is None
    assert resolve(frm, gap, MS) == VERSION_GAP
    # without the gap the same record is an invalid transition
    assert resolve(frm, d(S.Owned, "b", v=2), ST) == INVALID_TRANSITION


def test_first_record_on_metadata_store_must_be_version_one():
    assert resolve(None, d(S.Assigning, "a", v=2), MS) == VERSION_NOT_INITIAL
    assert resolve(None, d(S.Assigning, "a", v=1), MS) is None
    assert resolve(None, d(S.Owned, "a", v=7), ST) is None          # compacted: Init -> anything


def test_force_skips_transition_and_broker_checks():
    frm = d(S.Owned, "a", v=3)
    assert resolve(frm, d(S.Owned, "b", "a", v=4)) == INVALID_TRANSITION
    assert resolve(frm, d(S.Owned, "b", "a", v=4, force=True)) is None


def test_invalid_transition_rejected():
    assert resolve(d(S.Assigning, "a", v=1), d(S.Releasing, None, "a", v=2)) == INVALID_TRANSITION
    assert resolve(d(S.Deleted, None, "a", v=1), d(S.Assigning, "b", v=2)) == INVALID_TRANSITION
    assert resolve(d(S.Free, None, "a", v=1), d(S.Owned, "a", v=2), MS) == INVALID_TRANSITION
    assert resolve(None, d(S.Owned, "a", v=1), MS) == INVALID_TRANSITION


# (from, to, accepted) per broker rule
BROKER_CASES = [
    # Owned -> Splitting: no dst, src == owner
    (d(S.Owned, "a"), d(S.Splitting, None, "a", v=2), True),
    (d(S.Owned, "a"), d(S.Splitting, "b", "a", v=2), False),
    (d(S.Owned, "a"), d(S.Splitting, None, "b", v=2), False),
    # Owned -> Releasing: src == owner, dst != owner
    (d(S.Owned, "a"), d(S.Releasing, "b", "a", v=2), True),
    (d(S.Owned, "a"), d(S.Releasing, None, "a", v=2), True),
    (d(S.Owned, "a"), d(S.Releasing, "b", None, v=2), False),
    (d(S.Owned, "a"), d(S.Releasing, "b", "c", v=2), False),
    (d(S.Owned, "a"), d(S.Releasing, "a", "a", v=2), False),
    # Assigning -> Owned: same brokers
    (d(S.Assigning, "b", "a"), d(S.Owned, "b", "a", v=2), True),
    (d(S.Assigning, "b", "a"), d(S.Owned, "c", "a", v=2), False),
    (d(S.Assigning, "b", "a"), d(S.Owned, "b", None, v=2), False),
    # Releasing -> Assigning: dst non-blank, same brokers
    (d(S.Releasing, "b", "a"), d(S.Assigning, "b", "a", v=2), True),
    (d(S.Releasing, None, "a"), d(S.Assigning, None, "a", v=2), False),
    (d(S.Releasing, "b", "a"), d(S.Assigning, "c", "a", v=2), False),
    # Releasing -> Free: same brokers
    (d(S.Releasing, None, "a"), d(S.Free, None, "a", v=2), True),
    (d(S.Releasing, None, "a"), d(S.Free, None, "b", v=2), False),
    # Splitting -> Deleted: same brokers
    (d(S.Splitting, None, "a"), d(S.Deleted, None, "a", v=2), True),
    (d(S.Splitting, None, "a"), d(S.Deleted, None, "b", v=2), False),
    # Free -> Assigning: no src, a dst
    (d(S.Free, None, "a"), d(S.Assigning, "b", None, v=2), True),
    (d(S.Free, None, "a"), d(S.Assigning, "b", "a", v=2), False),
    (d(S.Free, None, None), d(S.Assigning, None, "a", v=2), False),
]


@pytest.mark.parametrize("frm,to,accepted", BROKER_CASES)
def test_broker_checks(frm, to, accepted):
    assert should_keep_left(frm, to) is (not accepted)
    if not accepted:
        assert resolve(frm, to) == BROKER_MISMATCH
        assert resolve(frm, to, check_brokers=False) is None


# -- ChannelView -------------------------------------------------------------------------------------------

def test_view_apply_reports_and_keeps_data():
    v = ChannelView()
    r = v.apply("t/ns/0x00000000_0xffffffff", d(S.Assigning, "a", v=1))
    assert r.accepted and r.previous is None
    r = v.apply("t/ns/0x00000000_0xffffffff", d(S.Owned, "b", v=2))
    assert not r.accepted and r.reason == BROKER_MISMATCH and r.current.state == S.Assigning
    assert v.apply("t/ns/0x00000000_0xffffffff", d(S.Owned, "a", v=2)).accepted
    assert v.is_owner("t/ns/0x00000000_0xffffffff", "a") and v.owned_by("a") == ["t/ns/0x00000000_0xffffffff"]
    assert v.apply("t/ns/0x00000000_0xffffffff", None).accepted
    assert "t/ns/0x00000000_0xffffffff" not in v and len(v) == 0
    with pytest.raises(ChannelDecodeError):
        v.apply_encoded("k", b"nope")


KEYS = ["t/ns/0x00000000_0x80000000", "t/ns/0x80000000_0xffffffff"]
BROKERS = ["a", "b", "c", None]


@st.composite
def messages(draw):
    out = []
    for _ in range(draw(st.integers(0, 60))):
        key = draw(st.sampled_from(KEYS))
        if draw(st.integers(0, 15)) == 0:
            out.append((key, None))
            continue
        state = draw(st.sampled_from([s for s in S if s != S.Init]))
        dst, src = draw(st.sampled_from(BROKERS)), draw(st.sampled_from(BROKERS))
        if state != S.Free and dst is None and src is None:
            dst = "a"
        out.append((key, ServiceUnitStateData(state, dst, src, None, draw(st.booleans()), 0,
                                              draw(st.integers(-1, 8)))))
    return out


@hsettings(max_examples=150, deadline=None)
@given(messages(), st.sampled_from([ST, MS]))
def test_views_fed_the_same_sequence_converge_and_versions_increase(msgs, storage):
    v1, v2 = ChannelView(storage), ChannelView(storage)
    last: dict[str, int] = {}
    for key, value in msgs:
        r1, r2 = v1.apply(key, value), v2.apply(key, value)
        assert r1 == r2
        if r1.accepted and value is not None:
            if key in last and r1.previous is not None:
                assert value.versionId > last[key]
                if storage == MS:
                    assert value.versionId == last[key] + 1
            last[key] = value.versionId
        elif r1.accepted:
            last.pop(key, None)
        # at most one Owned owner per key, trivially: one record per key; the record is the last accepted
        assert v1.get(key) == (value if r1.accepted else r1.previous)
    assert v1 == v2


def test_a_view_that_skipped_a_rejection_differs():
    """The convergence test above can fail: a view that applies a message the resolver rejects
    (e.g. a broker with checks off) ends elsewhere."""
    msgs = [("k", d(S.Assigning, "a", v=1)), ("k", d(S.Owned, "b", v=2))]
    v1, v2 = ChannelView(), ChannelView(check_brokers=False)
    for k, m in msgs:
        v1.apply(k, m)
        v2.apply(k, m)
    assert v1.data != v2.data


def test_random_walk_proper_events_accepted_bogus_owned_rejected():
    rng = random.Random(7)
    v = ChannelView()
    key = KEYS[0]
    v.apply(key, d(S.Assigning, "a", v=1))
    for _ in range(200):
        cur = v.get(key)
        nxt = next_version_id(cur)
        cands = [d(S.Owned, cur.dstBroker, cur.sourceBroker, v=nxt)] if cur.state == S.Assigning else []
        if cur.state == S.Owned:
            dest = rng.choice([b for b in "abc" if b != cur.dstBroker] + [None])
            cands = [d(S.Releasing, dest, cur.dstBroker, v=nxt)]
        if cur.state == S.Releasing:
            cands = [d(S.Assigning, cur.dstBroker, cur.sourceBroker, v=nxt) if cur.dstBroker
                     else d(S.Free, None, cur.sourceBroker, v=nxt)]
        if cur.state == S.Free:
            cands = [d(S.Assigning, rng.choice("abc"), None, v=nxt)]
        bogus = d(S.Owned, "z", v=nxt)
        if rng.random() < 0.3:
            assert not v.apply(key, bogus).accepted or cur.state == S.Assigning and cur.dstBroker == "z"
        assert v.apply(key, cands[0]).accepted
