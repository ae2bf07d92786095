"""The extensible load manager's bug knobs, on the pure core (a toy channel: one ordered topic, every broker
with its own ChannelView running the handlers on what its view accepts; a clock the test sets):
- lb.no_version_check (apache/pulsar#19620): a delayed forced transfer of an older version is accepted
  and moves a bundle its current owner is never told to close: two brokers serve it;
- lb.tombstone_split_parent (apache/pulsar#19490): the split parent tombstoned at once, so a transfer
  step computed before the split re-owns the parent beside its children;
- lb.ignore_existing_assigning (apache/pulsar#25379): a restarted destination skips an Assigning to
  itself found in the history; the bundle stays Assigning until the ownership monitor's override.
Each with the knob off, the same sequence is safe."""
from __future__ import annotations

from clusters.bugs import REGISTRY, Knobs
from clusters.loadbalancer.extensible.handlers import (BundleOwned, CloseServiceUnit, Publish, Tombstone,
                                                       handle_event, handle_existing, handle_skipped, split_event,
                                                       unload_event)
from clusters.loadbalancer.extensible.monitor import MetadataState, monitor_ownerships, plan_overrides
from clusters.loadbalancer.extensible.state import (S, VERSION_NOT_NEWER, ChannelView, ServiceUnitStateData,
                                                    resolve)
from clusters.loadbalancer.settings import LoadBalancerSettings

KEY = "t/ns/0x00000000_0xffffffff"
LEFT, RIGHT = "t/ns/0x00000000_0x7fffffff", "t/ns/0x7fffffff_0xffffffff"
CHILDREN = {"0x00000000_0x7fffffff": None, "0x7fffffff_0xffffffff": None}


class Channel:
    """The topic and its readers; `run` delivers every message to every live broker, in order, and
    publishes what the handlers publish, until quiet. `serving[b]`: the bundles broker b serves (its
    BundleOwned minus its CloseServiceUnit and the split parents it saw Deleted)."""

    def __init__(self, brokers, *, check_version=True, tombstone_deleted=False):
        self.topic: list[tuple[str, ServiceUnitStateData | None]] = []
        self.views = {b: ChannelView(check_version=check_version) for b in brokers}
        self.offsets = {b: 0 for b in brokers}
        self.serving: dict[str, set[str]] = {b: set() for b in brokers}
        self.tombstone_deleted = tombstone_deleted
        self.now = 1_000

    def publish(self, key, data):
        self.topic.append((key, data))

    def run(self):
        for _ in range(1000):
            moved = False
            for b in sorted(self.views):
                while self.offsets[b] < len(self.topic):
                    key, data = self.topic[self.offsets[b]]
                    self.offsets[b] += 1
                    moved = True
                    r = self.views[b].apply(key, data)
                    if r.accepted and data is not None and data.state == S.Deleted:
                        self.serving[b].discard(key)           # a split parent: its children replace it
                    acts = (handle_event(key, r.previous, data, b, view=self.views[b], now_ms=self.now,
                                         tombstone_deleted=self.tombstone_deleted)
                            if r.accepted else handle_skipped(key, r.current))
                    self.act(b, acts)
            if not moved:
                return
        raise AssertionError("the channel did not settle")

    def act(self, b, acts):
        for a in acts:
            if isinstance(a, Publish):
                self.publish(a.key, a.data)
            elif isinstance(a, Tombstone):
                self.publish(a.key, None)
            elif isinstance(a, BundleOwned):
                self.serving[b].add(a.key)
            elif isinstance(a, CloseServiceUnit):
                self.serving[b].discard(a.key)

    def servers(self, key):
        return sorted(b for b, keys in self.serving.items() if key in keys)


def _owned_by(ch: Channel, broker: str, key: str = KEY) -> None:
    ch.publish(key, ServiceUnitStateData(S.Assigning, broker, None, None, False, ch.now, 1))
    ch.run()


def _knobs(**on: bool) -> Knobs:
    return Knobs({k: v for k, v in on.items()}, "load-balancer")


def test_the_three_knobs_are_registered_off_with_their_issue():
    for name, issue in (("lb.no_version_check", "apache/pulsar#19620"),
                        ("lb.tombstone_split_parent", "apache/pulsar#19490"),
                        ("lb.ignore_existing_assigning", "apache/pulsar#25379")):
        k = REGISTRY[name]
        assert k.default is False and k.component == "load-balancer" and k.issues == (issue,)
        assert "--load-manager extensible" in k.scenario
        assert _knobs().on(name) is False and _knobs(**{name: True}).on(name) is True


# -------------------------------------------------------------------- lb.no_version_check (#19620)

def _moved_a_b_c(ch: Channel) -> ServiceUnitStateData:
    """a owns KEY; a leaves gracefully (its forced transfer to b); later the leader transfers it to c.
    Returns the forced record, which a partitioned broker's producer delivers again later."""
    _owned_by(ch, "a")
    ch.now = 2_000
    forced = ServiceUnitStateData(S.Releasing, "b", "a", None, True, ch.now, 3)
    ch.publish(KEY, forced)
    ch.run()
    ch.now = 3_000
    ch.publish(KEY, unload_event(ch.views["b"], KEY, "b", "c", now_ms=ch.now))
    ch.run()
    return forced


def test_without_the_version_rule_a_delayed_forced_transfer_gives_the_bundle_two_servers():
    ch = Channel(["a", "b", "c"], check_version=False)
    forced = _moved_a_b_c(ch)
    assert ch.servers(KEY) == ["c"] and ch.views["c"].get(KEY).versionId == 8
    ch.now = 4_000
    ch.publish(KEY, forced)                    # the same bytes, late
    ch.run()
    # every view took the stale v3, then a's Assigning(b) v4 and b's Owned v5: the version went back
    assert all(v.get(KEY).state == S.Owned and v.get(KEY).dstBroker == "b" and v.get(KEY).versionId == 5
               for v in ch.views.values())
    assert ch.servers(KEY) == ["b", "c"]       # c was never told to close it


def test_with_the_version_rule_the_delayed_transfer_is_rejected_everywhere():
    ch = Channel(["a", "b", "c"])
    forced = _moved_a_b_c(ch)
    ch.now = 4_000
    ch.publish(KEY, forced)
    ch.run()
    assert resolve(ch.views["a"].get(KEY), forced) == VERSION_NOT_NEWER
    assert all(v.get(KEY).dstBroker == "c" and v.get(KEY).versionId == 8 for v in ch.views.values())
    assert ch.servers(KEY) == ["c"]


def test_without_the_version_rule_an_older_version_is_accepted_only_when_the_transition_allows_it():
    old = ServiceUnitStateData(S.Releasing, "c", "a", None, False, 0, 3)
    owned_a = ServiceUnitStateData(S.Owned, "a", None, None, False, 0, 9)
    owned_b = ServiceUnitStateData(S.Owned, "b", None, None, False, 0, 9)
    assert resolve(owned_a, old, check_version=False) is None              # Owned(a) -> Releasing(src=a)
    assert resolve(owned_b, old, check_version=False) == "broker-mismatch"  # the broker check still holds
    assert resolve(owned_a, old) == VERSION_NOT_NEWER


# -------------------------------------------------------------------- lb.tombstone_split_parent (#19490)

def _split_racing_a_transfer(ch: Channel) -> None:
    """a owns KEY; the leader decides to move KEY to b (computed from Owned v2), while a splits it; the
    leader's transfer reaches the topic after the split."""
    _owned_by(ch, "a")
    ch.now = 2_000
    stale_transfer = unload_event(ch.views["leader"], KEY, "a", "b", now_ms=ch.now)   # v3, from Owned(a) v2
    ch.publish(KEY, split_event(ch.views["a"], KEY, "a", CHILDREN, now_ms=ch.now))  # v3 too: first wins
    ch.run()
    ch.now = 2_500
    ch.publish(KEY, stale_transfer)
    ch.run()


def test_a_parent_tombstoned_at_once_is_re_owned_by_a_transfer_that_raced_the_split():
    ch = Channel(["a", "b", "leader"], tombstone_deleted=True)
    _split_racing_a_transfer(ch)
    v = ch.views["b"]
    assert v.get(KEY).state == S.Owned and v.get(KEY).dstBroker == "b"      # the parent again, on b
    assert v.get(LEFT).dstBroker == "a" and v.get(RIGHT).dstBroker == "a"    # its children on a
    assert ch.servers(KEY) == ["b"] and ch.servers(LEFT) == ["a"]


def test_a_parent_kept_deleted_rejects_the_late_transfer():
    ch = Channel(["a", "b", "leader"])
    _split_racing_a_transfer(ch)
    for v in ch.views.values():
        assert v.get(KEY).state == S.Deleted and v.get(KEY).versionId == 4
        assert v.get(LEFT).dstBroker == "a" and v.get(RIGHT).dstBroker == "a"
    assert ch.servers(KEY) == [] and ch.servers(LEFT) == ["a"]
    # the leader's monitor tombstones the Deleted parent only after the tombstone delay
    s = LoadBalancerSettings()
    delay = s.loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds * 1000
    v = ch.views["leader"]
    assert monitor_ownerships(v, 2_000 + delay, {"a", "b"}, MetadataState.Stable, s).tombstones == []
    assert monitor_ownerships(v, 2_001 + delay, {"a", "b"}, MetadataState.Stable, s).tombstones == [KEY]


# -------------------------------------------------------------------- lb.ignore_existing_assigning (#25379)

def _restarted(ch: Channel, broker: str, ignore: bool) -> list:
    """`broker` comes back: a fresh view reads the whole history (no handlers), then handleExisting."""
    v = ChannelView()
    for key, data in ch.topic:
        v.apply(key, data)
    ch.views[broker], ch.offsets[broker] = v, len(ch.topic)
    acts = [a for key, d in v.items() for a in handle_existing(key, d, broker, now_ms=ch.now,
                                                                 ignore_assigning=ignore)]
    ch.act(broker, acts)
    ch.run()
    return acts


def _assigned_while_down(ch: Channel) -> None:
    """a owns KEY; b is down (still registered); the leader transfers KEY to b: Assigning(dst=b) stays."""
    _owned_by(ch, "a")
    del ch.views["b"]
    ch.now = 2_000
    ch.publish(KEY, unload_event(ch.views["a"], KEY, "a", "b", now_ms=ch.now))
    ch.run()
    assert ch.views["a"].get(KEY).state == S.Assigning and ch.views["a"].get(KEY).dstBroker == "b"
    ch.now = 3_000


def test_a_restarted_destination_completes_an_existing_assigning():
    ch = Channel(["a", "b"])
    _assigned_while_down(ch)
    acts = _restarted(ch, "b", ignore=False)
    assert [type(a) for a in acts] == [Publish] and acts[0].data.state == S.Owned
    assert all(v.get(KEY).state == S.Owned and v.get(KEY).dstBroker == "b" for v in ch.views.values())
    assert ch.servers(KEY) == ["b"]


def test_a_restarted_destination_that_skips_it_leaves_the_bundle_assigning_until_the_monitor():
    ch = Channel(["a", "b"])
    _assigned_while_down(ch)
    assert _restarted(ch, "b", ignore=True) == []
    assert all(v.get(KEY).state == S.Assigning for v in ch.views.values()) and ch.servers(KEY) == []
    # the leader's monitor overrides it only once older than the in-flight wait (then at its next pass)
    s = LoadBalancerSettings()
    wait = s.loadBalancerInFlightServiceUnitStateWaitingTimeInMillis
    v = ch.views["a"]
    assert monitor_ownerships(v, 2_000 + wait, {"a", "b"}, MetadataState.Stable, s).overrides == []
    d = monitor_ownerships(v, 2_001 + wait, {"a", "b"}, MetadataState.Stable, s)
    assert [k for k, _, _ in d.overrides] == [KEY]
    rec = plan_overrides(d, lambda key, excl: "a", {"a", "b"}, 2_001 + wait)
    assert rec[0][1].state == S.Owned and rec[0][1].force


def test_handle_existing_owned_is_the_brokers_and_other_records_are_left_alone():
    owned = ServiceUnitStateData(S.Owned, "b", None, None, False, 0, 2)
    assert handle_existing(KEY, owned, "b") == [BundleOwned(KEY)]
    assert handle_existing(KEY, owned, "b", ignore_assigning=True) == [BundleOwned(KEY)]
    assert handle_existing(KEY, owned, "a") == []
    other = ServiceUnitStateData(S.Assigning, "c", None, None, False, 0, 3)
    assert handle_existing(KEY, other, "b") == []
    releasing = ServiceUnitStateData(S.Releasing, "c", "b", None, False, 0, 3)
    assert handle_existing(KEY, releasing, "b") == []


# -------------------------------------------------------------------- the faults of their scenarios

def _m(key: str, rec: ServiceUnitStateData | None, n: int) -> tuple[str, list[int], bytes]:
    return key, [9, n, -1], rec.encode() if rec is not None else b""


def test_replay_picks_one_earlier_message_per_bundle_split_parents_first():
    import json

    from nemesis.balance import choose_replays
    a1 = ServiceUnitStateData(S.Assigning, "a", None, None, False, 1, 1)
    o2 = ServiceUnitStateData(S.Owned, "a", None, None, False, 2, 2)
    forced = ServiceUnitStateData(S.Releasing, "b", "a", None, True, 3, 3)
    transfer = ServiceUnitStateData(S.Releasing, "c", "a", None, False, 3, 3)
    msgs = [_m(KEY, a1, 1), _m(KEY, o2, 2),
            _m(KEY, ServiceUnitStateData(S.Splitting, None, "a", CHILDREN, False, 4, 3), 3),
            _m(KEY, ServiceUnitStateData(S.Deleted, None, "a", None, False, 5, 4), 4),
            _m(LEFT, a1, 5), _m(LEFT, o2, 6), _m(LEFT, forced, 7), _m(LEFT, o2.with_(dstBroker="b", versionId=5), 8),
            _m(RIGHT, a1, 9), _m(RIGHT, o2, 10), _m(RIGHT, transfer, 11),
            _m(RIGHT, o2.with_(dstBroker="c", versionId=5), 12),
            _m("t/ns/0x10000000_0x20000000", a1, 13)]                      # one message only: nothing earlier
    got = choose_replays(msgs, 0.5)
    assert [(k, json.loads(d)["state"], json.loads(d)["versionId"]) for k, _, d, _ in got] == [
        (KEY, "Assigning", 1), (LEFT, "Releasing", 3), (RIGHT, "Releasing", 3)]   # in the channel's order
    assert [k for k, _, _, _ in choose_replays(msgs, 0.5, limit=1)] == [KEY]      # the split parent first
    assert [k for k, _, _, _ in choose_replays(msgs, 0.5, limit=2)] == [KEY, LEFT]  # then a forced record
    assert choose_replays([], 0.5) == []


def test_unload_to_restarted_and_replay_parse_and_bad_names_are_refused():
    import pytest

    from nemesis.base import FaultNameError
    from nemesis.registry import make
    assert make("unload:to-restarted").to_restarted and not make("unload:to-restarted").dest
    assert not make("unload").to_restarted and make("replay").name == "replay"
    for bad in ("unload:to-", "unload:to-broker-3"):
        with pytest.raises(FaultNameError):
            make(bad)
    with pytest.raises(FaultNameError):
        make("replay:now")
