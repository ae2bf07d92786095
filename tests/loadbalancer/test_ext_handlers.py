"""The extensible load manager's event handlers, get_owner, the event builders and the ownership
monitor, driven through a toy channel: one ordered topic, every broker with its own ChannelView,
every broker running handle_event on every message its view accepts."""
from __future__ import annotations

import pytest

from clusters.loadbalancer.extensible.handlers import (BundleOwned, CloseServiceUnit, CompleteLookups, FailLookups,
                                                       Publish, Tombstone, TransferToSameBrokerError,
                                                       UpdateNamespaceBundles, assign_event, get_owner, handle_event,
                                                       handle_skipped, split_event, unload_event)
from clusters.loadbalancer.extensible.monitor import (MetadataState, broker_deletion_cleanup_delay_ms, cleanup_targets,
                                                      excluded_for_override, monitor_ownerships, override_in_flight,
                                                      override_ownership, plan_overrides)
from clusters.loadbalancer.extensible.state import S, ChannelView, ServiceUnitStateData
from clusters.loadbalancer.settings import LoadBalancerSettings

KEY = "t/ns/0x00000000_0xffffffff"
LEFT, RIGHT = "t/ns/0x00000000_0x7fffffff", "t/ns/0x7fffffff_0xffffffff"


class Channel:
    """The topic and the brokers reading it. `publish` appends; `run` delivers every message to every
    live broker's view in topic order and appends what the handlers publish, until quiet."""

    def __init__(self, brokers, multi_phase=True):
        self.topic: list[tuple[str, ServiceUnitStateData | None]] = []
        self.views = {b: ChannelView() for b in brokers}
        self.offsets = {b: 0 for b in brokers}
        self.actions: dict[str, list] = {b: [] for b in brokers}
        self.alive = set(brokers)
        self.multi_phase = multi_phase
        self.now = 1000

    def publish(self, key, data):
        self.topic.append((key, data))

    def run(self, max_steps=1000):
        for _ in range(max_steps):
            progressed = False
            for b in sorted(self.alive):
                while self.offsets[b] < len(self.topic):
                    key, data = self.topic[self.offsets[b]]
                    self.offsets[b] += 1
                    progressed = True
                    r = self.views[b].apply(key, data)
                    acts = (handle_event(key, r.previous, data, b, view=self.views[b], multi_phase=self.multi_phase,
                                         now_ms=self.now) if r.accepted else handle_skipped(key, r.current))
                    self.actions[b].extend(acts)
                    for a in acts:
                        if isinstance(a, Publish):
                            self.publish(a.key, a.data)
                        elif isinstance(a, Tombstone):
                            self.publish(a.key, None)
            if not progressed:
                return
        raise AssertionError("the channel did not settle")

    def settled_view(self):
        views = [self.views[b] for b in sorted(self.alive)]
        assert all(v == views[0] for v in views), "the brokers' views differ"
        return views[0]


def owners(view, key):
    d = view.get(key)
    return [d.dstBroker] if d is not None and d.state == S.Owned else []


def test_assign_reaches_owned_at_the_destination():
    ch = Channel(["a", "b"])
    ch.publish(KEY, assign_event(ch.views["b"], KEY, "a", now_ms=5))
    ch.run()
    v = ch.settled_view()
    assert v.get(KEY).state == S.Owned and owners(v, KEY) == ["a"] and v.get(KEY).versionId == 2
    assert BundleOwned(KEY) in ch.actions["a"] and BundleOwned(KEY) not in ch.actions["b"]
    assert CompleteLookups(KEY, "a") in ch.actions["b"]


def test_concurrent_assigns_first_wins():
    ch = Channel(["a", "b"])
    e1, e2 = assign_event(ch.views["a"], KEY, "a", 1), assign_event(ch.views["b"], KEY, "b", 1)
    ch.publish(KEY, e1)
    ch.publish(KEY, e2)             # same versionId: rejected by every view
    ch.run()
    v = ch.settled_view()
    assert owners(v, KEY) == ["a"]
    assert not any(isinstance(x, BundleOwned) for x in ch.actions["b"])


def owned_by_a(ch):
    ch.publish(KEY, assign_event(ch.views["a"], KEY, "a", 1))
    ch.run()


def test_plain_unload_frees_and_closes_at_the_source():
    ch = Channel(["a", "b"])
    owned_by_a(ch)
    ch.publish(KEY, unload_event(ch.views["a"], KEY, "a", now_ms=2))
    ch.run()
    v = ch.settled_view()
    assert v.get(KEY).state == S.Free and v.get(KEY).sourceBroker == "a" and owners(v, KEY) == []
    assert CloseServiceUnit(KEY, True) in ch.actions["a"]
    assert CompleteLookups(KEY, None) in ch.actions["b"]
    # the next lookup assigns it again
    assert get_owner(v, KEY, "b", {"a", "b"}).kind == "none"
    ch.publish(KEY, assign_event(v, KEY, "b", 3))
    ch.run()
    assert owners(ch.settled_view(), KEY) == ["b"]


@pytest.mark.parametrize("multi_phase", [True, False])
def test_transfer_moves_ownership_and_closes_the_source(multi_phase):
    ch = Channel(["a", "b", "c"], multi_phase=multi_phase)
    owned_by_a(ch)
    ch.publish(KEY, unload_event(ch.views["a"], KEY, "a", "b", now_ms=2))
    ch.run()
    v = ch.settled_view()
    d = v.get(KEY)
    assert (d.state, d.dstBroker, d.sourceBroker) == (S.Owned, "b", "a")
    # Owned(v2) -> Releasing(v3) -> Assigning(v4) -> Owned(v5)
    assert d.versionId == 5
    closes = [x for x in ch.actions["a"] if isinstance(x, CloseServiceUnit)]
    # multi-phase: the release keeps the clients; the final Owned disconnects them at the source
    assert closes == ([CloseServiceUnit(KEY, False), CloseServiceUnit(KEY, True)] if multi_phase
                      else [CloseServiceUnit(KEY, True)])
    assert BundleOwned(KEY) in ch.actions["b"] and not any(isinstance(x, CloseServiceUnit) for x in ch.actions["c"])


def test_transfer_to_the_owner_is_refused():
    ch = Channel(["a"])
    owned_by_a(ch)
    with pytest.raises(TransferToSameBrokerError, match="cannot be transfer to same broker"):
        unload_event(ch.views["a"], KEY, "a", "a", now_ms=2)
    # the owner per the view counts, whoever is named as the source
    with pytest.raises(TransferToSameBrokerError):
        unload_event(ch.views["a"], KEY, "b", "a", now_ms=2)
    assert unload_event(ch.views["a"], KEY, "a", "b", now_ms=2).versionId == 3


def test_unload_by_a_non_owner_is_rejected_everywhere():
    ch = Channel(["a", "b", "c"])
    owned_by_a(ch)
    ch.publish(KEY, unload_event(ch.views["b"], KEY, "b", "c", now_ms=2))
    ch.run()
    v = ch.settled_view()
    assert owners(v, KEY) == ["a"] and v.get(KEY).versionId == 2


def test_split_creates_children_on_the_owner_then_deletes_the_parent_and_keeps_it_deleted():
    ch = Channel(["a", "b"])
    owned_by_a(ch)
    ch.publish(KEY, split_event(ch.views["a"], KEY, "a", {"0x00000000_0x7fffffff": None,
                                                          "0x7fffffff_0xffffffff": None}, now_ms=3))
    ch.run()
    v = ch.settled_view()
    # Splitting -> Deleted, which stays (the monitor tombstones it after the tombstone delay)
    assert v.get(KEY).state == S.Deleted
    assert owners(v, LEFT) == ["a"] and owners(v, RIGHT) == ["a"]
    assert v.get(LEFT).versionId == 1
    acts = ch.actions["a"]
    upd = acts.index(UpdateNamespaceBundles(KEY, (LEFT, RIGHT)))
    deleted = next(i for i, x in enumerate(acts) if isinstance(x, Publish) and x.data.state == S.Deleted)
    children = [i for i, x in enumerate(acts) if isinstance(x, Publish) and x.key in (LEFT, RIGHT)
                and x.data.state == S.Owned]
    assert max(children) < upd < deleted
    assert Tombstone(KEY) not in acts and FailLookups in {type(x) for x in ch.actions["b"]}
    assert not any(isinstance(x, (Publish, Tombstone)) for x in ch.actions["b"])


def test_split_handler_skips_children_already_present():
    v = ChannelView()
    v.apply(LEFT, ServiceUnitStateData(S.Owned, "a", None, None, False, 0, 4))
    split = ServiceUnitStateData(S.Splitting, None, "a", {"0x00000000_0x7fffffff": None,
                                                          "0x7fffffff_0xffffffff": "b"}, False, 0, 3)
    acts = handle_event(KEY, None, split, "a", view=v)
    published = [(x.key, x.data.state, x.data.dstBroker, x.data.versionId) for x in acts if isinstance(x, Publish)]
    # the child's named destination is not used: children stay on the parent's owner
    assert published == [(RIGHT, S.Owned, "a", 1), (KEY, S.Deleted, None, 4)]
    assert handle_event(KEY, None, split, "b", view=v) == []


def test_split_needs_two_children():
    with pytest.raises(ValueError, match="two child ranges"):
        split_event(ChannelView(), KEY, "a", {"0x00000000_0xffffffff": None}, 1)


def test_get_owner_semantics():
    v = ChannelView()
    assert get_owner(v, KEY, "a", {"a"}).kind == "none"
    v.apply(KEY, ServiceUnitStateData(S.Assigning, "b", None, None, False, 0, 1))
    assert get_owner(v, KEY, "a", {"a", "b"}) == get_owner(v, KEY, "a", {"a", "b"})
    assert get_owner(v, KEY, "a", {"a", "b"}).broker == "b" and get_owner(v, KEY, "a", {"a"}).kind == "owner"
    assert get_owner(v, KEY, "b", {"a", "b"}).kind == "wait"
    v.apply(KEY, ServiceUnitStateData(S.Owned, "b", None, None, False, 0, 2))
    assert get_owner(v, KEY, "a", {"a", "b"}).broker == "b"
    assert get_owner(v, KEY, "a", {"a"}).kind == "wait"              # owner not registered: deferred
    v.apply(KEY, ServiceUnitStateData(S.Splitting, None, "b", {}, False, 0, 3))
    assert get_owner(v, KEY, "a", {"a", "b"}) .broker == "b"
    v.apply(KEY, ServiceUnitStateData(S.Deleted, None, "b", None, False, 0, 4))
    assert get_owner(v, KEY, "a", {"a", "b"}).kind == "error"
    v2 = ChannelView()
    v2.apply(KEY, ServiceUnitStateData(S.Releasing, None, "b", None, False, 0, 3))
    assert get_owner(v2, KEY, "a", {"a", "b"}).kind == "none"


def test_skipped_message_completes_lookups_with_the_owner():
    assert handle_skipped(KEY, ServiceUnitStateData(S.Owned, "a", None, None, False, 0, 2)) == [
        CompleteLookups(KEY, "a")]
    assert handle_skipped(KEY, ServiceUnitStateData(S.Assigning, "a", None, None, False, 0, 1)) == []


def test_forced_free_at_the_source_closes_and_tombstones():
    free = ServiceUnitStateData(S.Free, None, "a", None, True, 0, 4)
    assert handle_event(KEY, None, free, "a") == [CompleteLookups(KEY, None), CloseServiceUnit(KEY, True),
                                                  Tombstone(KEY)]
    assert handle_event(KEY, None, free.with_(force=False), "a") == [CompleteLookups(KEY, None)]


# -- orphans ---------------------------------------------------------------------------------------------

S60 = LoadBalancerSettings()
WAIT = S60.loadBalancerInFlightServiceUnitStateWaitingTimeInMillis
TOMB = S60.loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds * 1000


def test_orphan_of_a_dead_owner_is_overridden_to_one_owner():
    ch = Channel(["a", "b", "c"])
    owned_by_a(ch)
    ch.alive.discard("a")                         # a dies
    dec = monitor_ownerships(ch.views["b"], 10_000, {"b", "c"}, MetadataState.Stable, S60)
    assert dec.inactive_brokers == ["a"] and [k for k, _, _ in dec.overrides] == [KEY]
    key, orphan, why = dec.overrides[0]
    assert why == "inactive-broker:a"
    ch.publish(key, override_ownership(key, orphan, "c", graceful=False, now_ms=10_000))
    ch.run()
    v = ch.settled_view()
    assert owners(v, KEY) == ["c"] and v.get(KEY).force and v.get(KEY).versionId == 3
    assert BundleOwned(KEY) in ch.actions["c"]


def test_graceful_override_releases_through_the_old_owner():
    ch = Channel(["a", "b"])
    owned_by_a(ch)
    orphan = ch.views["a"].get(KEY)
    ch.publish(KEY, override_ownership(KEY, orphan, "b", graceful=True, now_ms=5))
    ch.run()
    v = ch.settled_view()
    assert owners(v, KEY) == ["b"]
    assert any(isinstance(x, CloseServiceUnit) for x in ch.actions["a"])


def test_override_shapes():
    own = ServiceUnitStateData(S.Owned, "a", None, None, False, 0, 7)
    assert override_ownership(KEY, own, None, False, 1) == ServiceUnitStateData(S.Free, None, "a", None, True, 1, 8)
    assert override_ownership(KEY, own, "a", False, 1).sourceBroker is None
    spl = ServiceUnitStateData(S.Splitting, None, "a", {"x": None}, False, 0, 3)
    o = override_ownership(KEY, spl, "b", False, 1)
    assert (o.state, o.sourceBroker, o.splitServiceUnitToDestBroker, o.force) == (S.Splitting, "b", {"x": None}, True)
    rel = ServiceUnitStateData(S.Releasing, "b", "a", None, False, 0, 3)
    o = override_ownership(KEY, rel, "c", True, 1)
    assert (o.state, o.dstBroker, o.sourceBroker) == (S.Owned, "c", "a")


@pytest.mark.parametrize("state", [S.Assigning, S.Releasing, S.Splitting])
def test_in_flight_timeout_one_ms_either_side(state):
    v = ChannelView()
    v.apply(KEY, ServiceUnitStateData(state, "a" if state != S.Splitting else None, "a" if state != S.Assigning
                                      else None, {} if state == S.Splitting else None, False, 1000, 1))
    at = 1000 + WAIT
    assert monitor_ownerships(v, at, {"a"}, MetadataState.Stable, S60).overrides == []
    assert monitor_ownerships(v, at - 1, {"a"}, MetadataState.Stable, S60).overrides == []
    dec = monitor_ownerships(v, at + 1, {"a"}, MetadataState.Stable, S60)
    assert [(k, why) for k, _, why in dec.overrides] == [(KEY, "in-flight-timeout")]


@pytest.mark.parametrize("state", [S.Free, S.Deleted])
def test_tombstone_delay_one_ms_either_side(state):
    v = ChannelView()
    v.apply(KEY, ServiceUnitStateData(state, None, "a", None, False, 1000, 1))
    assert monitor_ownerships(v, 1000 + TOMB, {"a"}, MetadataState.Stable, S60).tombstones == []
    assert monitor_ownerships(v, 1000 + TOMB + 1, {"a"}, MetadataState.Stable, S60).tombstones == [KEY]


def test_owned_records_are_neither_timed_out_nor_tombstoned():
    v = ChannelView()
    v.apply(KEY, ServiceUnitStateData(S.Owned, "a", None, None, False, 0, 1))
    dec = monitor_ownerships(v, 10 ** 9, {"a"}, MetadataState.Stable, S60)
    assert dec.overrides == [] and dec.tombstones == []


@pytest.mark.parametrize("state", [MetadataState.Jittery, MetadataState.Unstable])
def test_monitor_runs_only_when_stable_and_owner(state):
    v = ChannelView()
    v.apply(KEY, ServiceUnitStateData(S.Owned, "dead", None, None, False, 0, 1))
    assert monitor_ownerships(v, 1, {"a"}, state, S60).skipped
    assert monitor_ownerships(v, 1, {"a"}, MetadataState.Stable, S60, is_channel_owner=False).skipped
    assert monitor_ownerships(v, 1, {"a"}, MetadataState.Stable, S60).overrides


def test_broker_deletion_delays():
    assert broker_deletion_cleanup_delay_ms(MetadataState.Stable) == 0
    assert broker_deletion_cleanup_delay_ms(MetadataState.Jittery) == 180_000
    assert broker_deletion_cleanup_delay_ms(MetadataState.Unstable) is None


def test_cleanup_targets():
    v = ChannelView()
    rows = {"t/ns/0x00000000_0x40000000": (S.Owned, "a", None), "t/ns/0x40000000_0x80000000": (S.Releasing, "b", "a"),
            "t/ns/0x80000000_0xc0000000": (S.Assigning, "a", "b"), "t/ns/0xc0000000_0xffffffff": (S.Free, None, "a"),
            "pulsar/system/0x00000000_0xffffffff": (S.Owned, "a", None),
            "t/ns2/0x00000000_0xffffffff": (S.Owned, "b", "a")}
    for k, (st, dst, src) in rows.items():
        v.apply(k, ServiceUnitStateData(st, dst, src, None, False, 0, 1))
    assert cleanup_targets(v, "a") == ["t/ns/0x00000000_0x40000000", "t/ns/0x40000000_0x80000000",
                                       "t/ns/0x80000000_0xc0000000", "pulsar/system/0x00000000_0xffffffff"]


def test_settings_refuse_tombstone_delay_below_in_flight_wait():
    with pytest.raises(ValueError, match="loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds"):
        LoadBalancerSettings.from_mapping({"loadBalancerServiceUnitStateTombstoneDelayTimeInSeconds": 10,
                                           "loadBalancerInFlightServiceUnitStateWaitingTimeInMillis": 30000})


# -- random operations through the toy channel ------------------------------------------------------------

from hypothesis import given, settings as hsettings, strategies as hst  # noqa: E402

from clusters.loadbalancer.data import bundle_bounds, namespace_of  # noqa: E402
from clusters.loadbalancer.extensible.state import is_in_flight  # noqa: E402
from clusters.loadbalancer.splitting import can_split  # noqa: E402

BROKERS3 = ["a", "b", "c"]
OPS = hst.lists(hst.tuples(hst.sampled_from(["assign", "unload", "transfer", "split", "kill", "monitor"]),
                           hst.integers(0, 1000)), max_size=25)


class TrackedChannel(Channel):
    """A Channel that also keeps the namespace's bundles (updated when a split's owner says so)."""

    def __init__(self, brokers):
        super().__init__(brokers)
        self.bundles = {KEY}

    def select(self, key, excluded):
        return min(self.alive - excluded, default=None)

    def run(self, max_steps=1000):
        seen = {b: len(self.actions[b]) for b in self.actions}
        super().run(max_steps)
        for b, acts in self.actions.items():
            for a in acts[seen[b]:]:
                if isinstance(a, UpdateNamespaceBundles) and a.parent in self.bundles:
                    self.bundles = (self.bundles - {a.parent}) | set(a.children)


def _owned_ranges_disjoint(view):
    ranges = sorted(bundle_bounds(k) for k, d in view.items() if d.state == S.Owned and namespace_of(k) == "t/ns")
    return all(r1[1] <= r2[0] for r1, r2 in zip(ranges, ranges[1:]))


@hsettings(max_examples=120, deadline=None)
@given(OPS)
def test_random_operations_keep_one_owner_and_views_equal(ops):
    ch = TrackedChannel(BROKERS3)
    for op, n in ops:
        live = sorted(ch.alive)
        me = live[n % len(live)]
        v = ch.views[me]
        key = sorted(ch.bundles)[n % len(ch.bundles)]
        d = v.get(key)
        ch.now += 1000
        if op == "assign" and (d is None or d.state == S.Free):
            ch.publish(key, assign_event(v, key, live[(n // 7) % len(live)], ch.now))
        elif op in ("unload", "transfer") and d is not None and d.state == S.Owned:
            dest = None if op == "unload" else BROKERS3[(n // 7) % 3]
            if dest != d.dstBroker:
                ch.publish(key, unload_event(v, key, d.dstBroker, dest, now_ms=ch.now))
        elif op == "split" and d is not None and d.state == S.Owned and can_split(*bundle_bounds(key)):
            lo, hi = bundle_bounds(key)
            mid = lo + (hi - lo) // 2
            ch.publish(key, split_event(v, key, d.dstBroker, {f"0x{lo:08x}_0x{mid:08x}": None,
                                                              f"0x{mid:08x}_0x{hi:08x}": None}, ch.now))
        elif op == "kill" and len(live) > 1:
            ch.alive.discard(me)
        elif op == "monitor":
            ch.now += WAIT + 1
            dec = monitor_ownerships(v, ch.now, ch.alive, MetadataState.Stable, S60)
            for k, rec in plan_overrides(dec, ch.select, ch.alive, ch.now):
                ch.publish(k, rec)
        ch.run()
        view = ch.settled_view()
        assert _owned_ranges_disjoint(view)
        for k, rec in view.items():
            if rec.state == S.Owned:
                assert rec.dstBroker in BROKERS3
    # the leader's monitor brings every bundle out of flight onto a live broker
    live = sorted(ch.alive)
    for _ in range(4):
        ch.now += WAIT + 1
        dec = monitor_ownerships(ch.views[live[0]], ch.now, ch.alive, MetadataState.Stable, S60)
        for k, rec in plan_overrides(dec, ch.select, ch.alive, ch.now):
            ch.publish(k, rec)
        ch.run()
    view = ch.settled_view()
    assert _owned_ranges_disjoint(view)
    for k, rec in view.items():
        assert not is_in_flight(rec.state), (k, rec)
        if rec.state == S.Owned:
            assert rec.dstBroker in ch.alive, (k, rec)


def test_owned_overlap_detector_can_fail():
    v = ChannelView()
    v.apply(KEY, ServiceUnitStateData(S.Owned, "a", None, None, False, 0, 1))
    v.apply(LEFT, ServiceUnitStateData(S.Owned, "b", None, None, False, 0, 1))
    assert not _owned_ranges_disjoint(v)


def _rec(state, dst=None, src=None, ts=0, v=5, split=None):
    return ServiceUnitStateData(state, dst, src, split, False, ts, v)


def test_override_in_flight_shapes():
    assign = _rec(S.Assigning, "b", None)
    assert override_in_flight(KEY, assign, "c", {"a", "c"}, 9) == ServiceUnitStateData(S.Owned, "c", None, None, True,
                                                                                        9, 6)
    assert override_in_flight(KEY, assign, None, {"a"}, 9) is None
    rel = _rec(S.Releasing, "b", "a")
    assert override_in_flight(KEY, rel, "c", {"a", "b", "c"}, 9).dstBroker == "a"     # rolled back to the source
    assert override_in_flight(KEY, rel, "c", {"b", "c"}, 9).dstBroker == "c"          # rolled forward
    spl = _rec(S.Splitting, None, "a", split={"x": None})
    again = override_in_flight(KEY, spl, "c", {"a"}, 9)
    assert (again.state, again.sourceBroker, again.force, again.versionId) == (S.Splitting, "a", True, 6)
    with pytest.raises(ValueError, match="not an in-flight state"):
        override_in_flight(KEY, _rec(S.Owned, "a"), "c", {"a"}, 9)
    assert excluded_for_override(assign, "in-flight-timeout") == {"b"}
    assert excluded_for_override(rel, "in-flight-timeout") == {"a"}
    assert excluded_for_override(rel, "inactive-broker:b") == {"b"}


def test_a_dead_source_of_an_owned_record_does_not_block_timeouts_but_a_dead_owner_counts():
    """Pulsar's newest monitorOwnerships: an Owned record depends on its owner only (a finished transfer's
    dead source is not an inactive broker, which would defer every in-flight timeout while it stays
    dead); an in-flight record on both of its brokers."""
    v = ChannelView()
    v.apply(KEY, _rec(S.Owned, "b", "a"))                       # a transferred it to b, then died
    v.apply(LEFT, _rec(S.Assigning, "b", None, ts=0))           # stuck in flight
    dec = monitor_ownerships(v, WAIT + 1, {"b"}, MetadataState.Stable, S60)
    assert dec.inactive_brokers == []
    assert [(k, why) for k, _, why in dec.overrides] == [(LEFT, "in-flight-timeout")]
    recs = plan_overrides(dec, lambda key, excl: min({"a", "b"} - excl), {"a", "b"}, WAIT + 1)
    assert [(k, r.state, r.dstBroker, r.force) for k, r in recs] == [(LEFT, S.Owned, "a", True)]
    dec = monitor_ownerships(v, WAIT + 1, {"a"}, MetadataState.Stable, S60)     # the owner b is dead
    assert dec.inactive_brokers == ["b"]
    assert sorted(k for k, _, _ in dec.overrides) == sorted([KEY, LEFT])


def test_monitor_needs_active_brokers():
    assert monitor_ownerships(ChannelView(), 1, set(), MetadataState.Stable, S60).skipped == "no active brokers"
