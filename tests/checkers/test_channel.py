"""The channel checker on synthetic histories (each anomaly present and absent), and its oracle's
transition and version rules against Pulsar's ServiceUnitState / ServiceUnitStateDataConflictResolver."""
from __future__ import annotations

from typing import Any

import pytest

from checkers import REGISTRY
from checkers.channel import (ASSIGNING, DELETED, FREE, INIT, OWNED, RELEASING, SPLITTING, STATES, Oracle, check,
                              record, reject_reason, valid_transition)
from core.history import NEMESIS_PROCESS, OBSERVER_PROCESS, Op
from core.observations import CHANNEL_MESSAGE, CHANNEL_VIEW, OBSERVE_START, OBSERVE_STOP

A, B = "10.0.0.11:8080", "10.0.0.12:8080"
NS = "public/default"
PARENT = f"{NS}/0x00000000_0xffffffff"
LOW, HIGH = f"{NS}/0x00000000_0x7fffffff", f"{NS}/0x7fffffff_0xffffffff"
WALL0 = 1_700_000_000_000
LONG_MAX, LONG_MIN = 2 ** 63 - 1, -(2 ** 63)


def rec(state: str, dst: str | None = None, src: str | None = None, v: int = 1, split: dict | None = None,
        force: bool = False, ts: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"state": state, "force": force, "timestamp": ts, "versionId": v}
    if dst is not None:
        out["dstBroker"] = dst
    if src is not None:
        out["sourceBroker"] = src
    if split is not None:
        out["splitServiceUnitToDestBroker"] = split
    return out


class Hist:
    """A channel observer's rows (and nemesis ops), one a second unless told."""

    def __init__(self, start: bool = True):
        self.ops: list[Op] = []
        self.t = 0.0
        self.entry = 0
        if start:
            self.row(OBSERVE_START, "", {"source": "channel", "nodes": {"broker-1": "10.0.0.11", "broker-2": "10.0.0.12"},
                                         "ports": {A: "broker-1", B: "broker-2"}})

    def row(self, f: str, key: str, value: Any, process: int = OBSERVER_PROCESS, type_: str = "ok",
            dt: float = 1.0) -> Op:
        self.t += dt
        op = Op(process=process, type=type_, f=f, key=key, value=value, time_ns=int(self.t * 1e9),
                index=len(self.ops))
        self.ops.append(op)
        return op

    def msg(self, key: str, value: dict | None, dt: float = 1.0) -> list[int]:
        self.entry += 1
        mid = [7, self.entry, -1]
        self.row(CHANNEL_MESSAGE, key, {"message_id": mid, "publish_ms": WALL0 + int((self.t + dt) * 1000),
                                        "wall_ms": WALL0 + int((self.t + dt) * 1000), "value": value}, dt=dt)
        return mid[:2]

    def view(self, broker: str, last: list[int] | None, records: dict[str, dict], final: bool = False) -> None:
        v = {"broker": broker, "leader": broker == A, "last_applied": last, "records": records,
             "wall_ms": WALL0 + int(self.t * 1000)}
        if final:
            v["final"] = True
        self.row(CHANNEL_VIEW, broker, v)

    def fault(self, f: str, type_: str) -> None:
        self.row(f, "", None, process=NEMESIS_PROCESS, type_=type_, dt=0.1)

    def stop(self) -> list[Op]:
        self.row(OBSERVE_STOP, "", {"reason": "run ended", "wall_ms": WALL0 + int((self.t + 1) * 1000)})
        return self.ops


def assign(h: Hist, key: str, broker: str, v0: int = 0) -> list[int]:
    h.msg(key, rec(ASSIGNING, broker, v=v0 + 1))
    return h.msg(key, rec(OWNED, broker, v=v0 + 2))


def _types(r) -> set[str]:
    return set(r.anomalies)


# ------------------------------------------------------------------------------------------- oracle

def test_the_transition_table_is_pulsars_for_the_system_topic():
    allowed = {(a, b) for a in STATES for b in STATES if valid_transition(a, b)}
    assert allowed == {
        (INIT, FREE), (INIT, OWNED), (INIT, ASSIGNING), (INIT, RELEASING), (INIT, SPLITTING), (INIT, DELETED),
        (FREE, ASSIGNING), (FREE, INIT), (OWNED, SPLITTING), (OWNED, RELEASING), (ASSIGNING, OWNED),
        (RELEASING, ASSIGNING), (RELEASING, FREE), (SPLITTING, DELETED), (DELETED, INIT)}


@pytest.mark.parametrize("frm,to,why", [
    (None, rec(ASSIGNING, A, v=1), None),                                         # Init -> anything
    (rec(OWNED, A, v=3), rec(RELEASING, B, A, v=3), "version-not-newer"),          # equal version
    (rec(OWNED, A, v=3), rec(RELEASING, B, A, v=2), "version-not-newer"),          # stale
    (rec(OWNED, A, v=3), rec(RELEASING, B, A, v=9), None),                        # a gap: compaction
    (rec(OWNED, A, v=LONG_MAX), rec(RELEASING, B, A, v=LONG_MIN), None),          # overflow goes on
    (rec(OWNED, A, v=3), rec(OWNED, B, v=4), "invalid-transition"),
    (rec(OWNED, A, v=3), rec(OWNED, B, v=4, force=True), None),                   # an override
    (rec(OWNED, A, v=3), rec(OWNED, B, v=3, force=True), "version-not-newer"),    # ... not past the version
    (rec(ASSIGNING, A, v=1), rec(OWNED, B, v=2), "broker-mismatch"),
    (rec(ASSIGNING, A, v=1), rec(OWNED, A, v=2), None),
    (rec(OWNED, A, v=2), rec(SPLITTING, None, A, v=3), None),
    (rec(OWNED, A, v=2), rec(SPLITTING, None, B, v=3), "broker-mismatch"),        # not the owner's split
    (rec(OWNED, A, v=2), rec(SPLITTING, B, A, v=3), "broker-mismatch"),           # a split names no dst
    (rec(OWNED, A, v=2), rec(RELEASING, A, A, v=3), "broker-mismatch"),           # to itself
    (rec(OWNED, A, v=2), rec(RELEASING, B, A, v=3), None),
    (rec(OWNED, A, v=2), rec(RELEASING, None, A, v=3), None),                     # a plain unload
    (rec(RELEASING, B, A, v=3), rec(ASSIGNING, B, A, v=4), None),
    (rec(RELEASING, None, A, v=3), rec(ASSIGNING, None, A, v=4), "broker-mismatch"),
    (rec(RELEASING, None, A, v=3), rec(FREE, None, A, v=4), None),
    (rec(FREE, None, A, v=4), rec(ASSIGNING, B, A, v=5), "broker-mismatch"),      # Free -> Assigning: no src
    (rec(FREE, None, A, v=4), rec(ASSIGNING, B, v=5), None),
    (rec(SPLITTING, None, A, v=3), rec(DELETED, None, A, v=4), None),
    (rec(DELETED, None, A, v=4), rec(OWNED, A, v=5), "invalid-transition"),
    (rec(OWNED, A, v=3), None, None),                                             # a tombstone
])
def test_the_resolver(frm, to, why):
    assert reject_reason(None if frm is None else record(frm), None if to is None else record(to)) == why


def test_records_pulsar_would_not_decode_are_rejected():
    o = Oracle()
    assert o.apply(PARENT, {"state": "Owned", "versionId": 1}, False)[:2] == (False, "undecodable")   # no broker
    assert o.apply(PARENT, {"state": "Gone", "dstBroker": A}, False)[:2] == (False, "undecodable")
    assert o.apply(PARENT, "not json", False)[:2] == (False, "undecodable")
    assert o.apply(PARENT, rec(FREE, v=1), False)[:2] == (True, None)                 # Free needs no broker
    assert o.apply(PARENT, None, True)[:2] == (True, None) and PARENT not in o.table


# -------------------------------------------------------------------------------------- the checker

def _valid_life() -> tuple[Hist, list[int]]:
    """Assign to A, transfer to B, split on B, a forced override of the low child back to A."""
    h = Hist()
    assign(h, PARENT, A)
    h.msg(PARENT, rec(RELEASING, B, A, v=3))
    h.msg(PARENT, rec(ASSIGNING, B, A, v=4))
    h.msg(PARENT, rec(OWNED, B, A, v=5))
    h.msg(PARENT, rec(SPLITTING, None, B, v=6, split={"0x00000000_0x7fffffff": None, "0x7fffffff_0xffffffff": None}))
    h.msg(LOW, rec(OWNED, B, v=1))
    h.msg(HIGH, rec(OWNED, B, v=1))
    h.msg(PARENT, rec(DELETED, None, B, v=7))
    h.msg(PARENT, None)
    last = h.msg(LOW, rec(OWNED, A, B, v=2, force=True))
    return h, last


def test_a_valid_assign_transfer_split_override_sequence():
    h, last = _valid_life()
    table = {LOW: rec(OWNED, A, B, v=2, force=True), HIGH: rec(OWNED, B, v=1)}
    h.view(A, last, table, final=True)
    h.view(B, last, table, final=True)
    r = check(h.stop())
    assert r.valid is True, r.anomalies
    assert r.stats["accepted"] == r.stats["messages"] == 11
    assert r.stats["splits"]["completed"] == 1 and r.stats["tombstones"] == 1
    assert r.stats["convergence"] == {A: "converged", B: "converged"}
    assert REGISTRY["channel"].observers == ("bundle-owner",)


def test_no_channel_rows_is_unknown():
    h = Hist(start=False)
    r = check(h.stop())
    assert r.valid == "unknown" and "channel observer" in r.stats["unknown_because"]


def test_a_rejected_stale_message_is_valid_but_a_view_that_shows_it_diverges():
    h = Hist()
    assign(h, PARENT, A)                                       # v2 Owned by A
    h.msg(PARENT, rec(RELEASING, B, A, v=3))
    h.msg(PARENT, rec(ASSIGNING, B, A, v=4))
    last = h.msg(PARENT, rec(OWNED, B, A, v=5))
    stale = h.msg(PARENT, rec(RELEASING, A, B, v=5))         # a partitioned broker's late command: rejected
    good = {PARENT: rec(OWNED, B, A, v=5)}
    h.view(A, stale, good)
    ok = check(list(h.ops))
    assert ok.valid is True and ok.stats["rejected_by_reason"] == {"version-not-newer": 1}
    h.view(B, stale, {PARENT: rec(RELEASING, A, B, v=5)})       # B applied the rejected message
    r = check(h.stop())
    assert r.valid is False and _types(r) == {"view-divergence"}
    case = r.anomalies["view-divergence"][0]
    assert case["broker"] == B and case["node"] == "broker-2" and case["bundles"] == [PARENT]
    d = case["differences"][0]
    assert d["view_message"]["reason"] == "version-not-newer" and d["view_message"]["message_id"][:2] == stale
    assert d["oracle_message"]["message_id"][:2] == last


def test_a_stale_message_after_a_tombstone_resurrects_the_bundle():
    h = Hist()
    assign(h, PARENT, A)
    h.msg(PARENT, rec(RELEASING, None, A, v=3))
    h.msg(PARENT, rec(FREE, None, A, v=4))
    h.msg(PARENT, None)
    h.msg(PARENT, rec(OWNED, B, v=2))                          # accepted (Init), but older than v4
    r = check(h.stop())
    assert _types(r) == {"version-not-increasing"} and r.valid is False
    assert "resurrected" in r.anomalies["version-not-increasing"][0]["why"]
    h2 = Hist()
    assign(h2, PARENT, A)
    h2.msg(PARENT, rec(RELEASING, None, A, v=3))
    h2.msg(PARENT, rec(FREE, None, A, v=4))
    h2.msg(PARENT, None)
    assign(h2, PARENT, B)                                      # a fresh assignment restarts at 1
    assert check(h2.stop()).valid is True


def test_view_version_regressed_unless_a_tombstone_came_between():
    h = Hist()
    p1 = assign(h, PARENT, A)
    h.view(A, p1, {PARENT: rec(OWNED, A, v=2)})
    h.view(A, p1, {PARENT: rec(ASSIGNING, A, v=1)})               # went back with nothing between
    r = check(h.stop())
    assert "view-version-regressed" in _types(r) and r.valid is False
    assert r.anomalies["view-version-regressed"][0]["bundle"] == PARENT
    h2 = Hist()
    p1 = assign(h2, PARENT, A)
    h2.view(A, p1, {PARENT: rec(OWNED, A, v=2)})
    h2.msg(PARENT, rec(RELEASING, None, A, v=3))
    h2.msg(PARENT, rec(FREE, None, A, v=4))
    h2.msg(PARENT, None)
    p2 = h2.msg(PARENT, rec(ASSIGNING, B, v=1))
    h2.view(A, p2, {PARENT: rec(ASSIGNING, B, v=1)})
    r2 = check(h2.stop())
    assert r2.valid is True, r2.anomalies


def test_view_invalid_transition():
    h = Hist()
    p1 = assign(h, PARENT, A)
    h.view(B, p1, {PARENT: rec(OWNED, A, v=2)})
    p2 = h.msg(PARENT, rec(OWNED, B, A, v=3))                    # rejected: Owned -> Owned
    h.view(B, p2, {PARENT: rec(OWNED, B, A, v=3)})               # B applied it anyway
    r = check(h.stop())
    assert {"view-invalid-transition", "view-divergence"} <= _types(r)
    assert "Owned -> Owned" in r.anomalies["view-invalid-transition"][0]["why"]
    h2 = Hist()
    p1 = assign(h2, PARENT, A)
    h2.view(B, p1, {PARENT: rec(OWNED, A, v=2)})
    p2 = h2.msg(PARENT, rec(OWNED, B, A, v=3, force=True))       # an override: any transition
    h2.view(B, p2, {PARENT: rec(OWNED, B, A, v=3, force=True)})
    assert check(h2.stop()).valid is True


def test_views_must_converge_after_the_run_unless_down():
    h, last = _valid_life()
    table = {LOW: rec(OWNED, A, B, v=2, force=True), HIGH: rec(OWNED, B, v=1)}
    behind = [last[0], last[1] - 1]
    h.view(A, behind, {LOW: rec(OWNED, B, v=1), HIGH: rec(OWNED, B, v=1)}, final=True)
    h.row(CHANNEL_VIEW, B, {"error": "connection refused", "final": True, "wall_ms": WALL0})
    r = check(h.stop())
    assert _types(r) == {"view-not-converged"} and r.valid is False
    assert r.anomalies["view-not-converged"][0]["broker"] == A
    assert r.stats["convergence"][B].startswith("not judged: down")
    h2, last = _valid_life()
    h2.view(A, last, table, final=True)
    assert check(h2.stop()).valid is True


def test_double_owned_split_child_elsewhere():
    h = Hist()
    assign(h, PARENT, A)
    h.msg(PARENT, rec(SPLITTING, None, A, v=3, split={"0x00000000_0x7fffffff": None, "0x7fffffff_0xffffffff": None}))
    h.msg(LOW, rec(OWNED, A, v=1))
    h.msg(HIGH, rec(OWNED, B, v=1))                              # a child on another broker while A splits
    h.msg(PARENT, rec(DELETED, None, A, v=4))
    r = check(h.stop())
    assert _types(r) == {"double-owned", "split-child-elsewhere"} and r.valid is False
    d = r.anomalies["double-owned"][0]
    assert {d["bundle"], d["other_bundle"]} == {PARENT, HIGH}
    assert d["owners"][HIGH] == [B, "broker-2"] and d["other_message"]["message_id"][:2] == [7, 3]
    assert r.anomalies["split-child-elsewhere"][0]["bundle"] == HIGH


def test_double_owned_by_a_forced_override_over_a_child():
    h = Hist()
    assign(h, LOW, A)
    h.msg(PARENT, rec(OWNED, B, v=1))                            # Init -> Owned: accepted, overlapping LOW
    r = check(h.stop())
    assert _types(r) == {"double-owned"}


def test_split_incomplete():
    h = Hist()
    assign(h, PARENT, A)
    h.msg(PARENT, rec(SPLITTING, None, A, v=3, split={"0x00000000_0x7fffffff": None, "0x7fffffff_0xffffffff": None}))
    h.msg(LOW, rec(OWNED, A, v=1))
    h.msg(PARENT, rec(DELETED, None, A, v=4))                    # HIGH never created: a hole in the namespace
    r = check(h.stop())
    assert _types(r) == {"split-incomplete"}
    assert HIGH in r.anomalies["split-incomplete"][0]["why"]
    h2 = Hist()
    assign(h2, PARENT, A)
    h2.msg(PARENT, rec(SPLITTING, None, A, v=3, split={"0x00000000_0x7fffffff": None}))
    h2.msg(PARENT, rec(OWNED, B, A, v=4, force=True))            # the split abandoned by an override
    r2 = check(h2.stop())
    assert _types(r2) == {"split-incomplete"} and "left Splitting for Owned" in r2.anomalies["split-incomplete"][0]["why"]


def test_stuck_in_flight_outside_and_under_faults():
    h = Hist()
    h.msg(PARENT, rec(ASSIGNING, A, v=1))
    h.msg(PARENT, rec(OWNED, A, v=2), dt=100.0)                   # 100 s in Assigning
    r = check(h.stop())
    assert _types(r) == {"stuck-in-flight"} and r.valid is False
    assert r.anomalies["stuck-in-flight"][0]["in_flight_s"] == pytest.approx(100, abs=0.01)
    assert check(h.ops, {"in_flight_limit_s": 120}).valid is True
    h2 = Hist()
    h2.fault("start-partition", "invoke")
    h2.fault("start-partition", "ok")
    h2.msg(PARENT, rec(ASSIGNING, A, v=1))
    h2.fault("stop-partition", "invoke")
    h2.fault("stop-partition", "ok")
    h2.msg(PARENT, rec(OWNED, A, v=2), dt=100.0)
    r2 = check(h2.stop())
    assert _types(r2) == {"stuck-in-flight-under-fault"} and r2.valid is True
    assert r2.anomalies["stuck-in-flight-under-fault"][0]["faults"][0]["fault"] == "partition"
    h3 = Hist()
    h3.msg(PARENT, rec(ASSIGNING, A, v=1))
    h3.msg(PARENT, rec(OWNED, A, v=2), dt=10.0)
    h3.msg(LOW, rec(RELEASING, None, A, v=1))                   # still in flight at the end, briefly
    r3 = check(h3.stop())
    assert r3.valid is True and r3.stats["in_flight_s"]["count"] == 1
    assert [x["bundle"] for x in r3.stats["in_flight_open_at_end"]] == [LOW]
    h4 = Hist()
    h4.msg(PARENT, rec(ASSIGNING, A, v=1))
    h4.row("noop", "", None, dt=200.0)                         # the observation goes on 200 s
    assert _types(check(h4.stop())) == {"stuck-in-flight"}


def _assigned_to_b_while_b_holds_it(resolved_after: float | None, fault: bool = False) -> list:
    """Assigning(dst=B), B's view holding it 1 s later, replaced by B's Owned `resolved_after` s after
    that (None: never)."""
    h = Hist()
    assign(h, LOW, A)
    at = h.msg(HIGH, rec(ASSIGNING, B, v=1))
    h.view(B, at, {LOW: rec(OWNED, A, v=2), HIGH: rec(ASSIGNING, B, v=1)})
    if fault:
        h.fault("start-kill", "invoke")
        h.fault("start-kill", "ok")
    if resolved_after is not None:
        h.msg(HIGH, rec(OWNED, B, v=2), dt=resolved_after)
    else:
        h.row("noop", "", None, dt=20.0)
    return h.stop()


def test_stuck_at_destination_an_assigning_its_running_destination_holds_and_leaves():
    o = {"assign_limit_s": 5.0}
    r = check(_assigned_to_b_while_b_holds_it(10.0), o)
    assert _types(r) == {"stuck-at-destination"} and r.valid is False
    case = r.anomalies["stuck-at-destination"][0]
    assert case["bundle"] == HIGH and case["destination"] == [B, "broker-2"]
    assert case["resolved_by"]["value"]["state"] == OWNED
    assert _types(check(_assigned_to_b_while_b_holds_it(None), o)) == {"stuck-at-destination"}
    assert check(_assigned_to_b_while_b_holds_it(3.0), o).valid is True           # completed in time
    assert check(_assigned_to_b_while_b_holds_it(10.0, fault=True), o).valid is True   # a fault in between
    assert check(_assigned_to_b_while_b_holds_it(10.0), {"assign_limit_s": 20.0}).valid is True
    # a destination whose view never held it (down) is the monitor's business (stuck-in-flight)
    h = Hist()
    h.msg(HIGH, rec(ASSIGNING, B, v=1))
    h.msg(HIGH, rec(OWNED, B, v=2), dt=10.0)
    assert check(h.stop(), o).valid is True


def test_split_parent_reowned_after_its_split_completed():
    h = Hist()
    assign(h, PARENT, A)
    h.msg(PARENT, rec(SPLITTING, None, A, v=3, split={"0x00000000_0x7fffffff": None, "0x7fffffff_0xffffffff": None}))
    h.msg(LOW, rec(OWNED, A, v=1))
    h.msg(HIGH, rec(OWNED, A, v=1))
    h.msg(PARENT, rec(DELETED, None, A, v=4))
    h.msg(PARENT, None)                                           # tombstoned at once: Init accepts anything
    h.msg(PARENT, rec(ASSIGNING, A, v=1))                         # a late message of the parent
    h.msg(PARENT, rec(OWNED, A, v=2))
    r = check(h.stop())
    assert _types(r) == {"split-parent-reowned"} and r.valid is False    # same owner: not double-owned
    assert r.anomalies["split-parent-reowned"][0]["deleted"]["value"]["state"] == DELETED
    h2 = Hist()
    assign(h2, PARENT, A)
    h2.msg(PARENT, rec(SPLITTING, None, A, v=3, split={"0x00000000_0x7fffffff": None, "0x7fffffff_0xffffffff": None}))
    h2.msg(LOW, rec(OWNED, A, v=1))
    h2.msg(HIGH, rec(OWNED, A, v=1))
    h2.msg(PARENT, rec(DELETED, None, A, v=4))
    h2.msg(PARENT, rec(ASSIGNING, B, v=1))                        # kept Deleted: rejected
    r2 = check(h2.stop())
    assert r2.valid is True and r2.stats["rejected_by_reason"] == {"version-not-newer": 1}


def test_messages_read_twice_count_once():
    h = Hist()
    assign(h, PARENT, A)
    again = h.ops[-1]
    h.ops.append(Op(process=again.process, type="ok", f=again.f, key=again.key, value=dict(again.value),
                    time_ns=again.time_ns + 10**9, index=len(h.ops)))
    r = check(h.stop())
    assert r.valid is True and r.stats["messages"] == 2 and r.stats["messages_read_twice"] == 1


def test_the_balance_workload_asks_for_it_under_the_extensible_load_manager():
    from core.spec import TestSpec
    from workloads import balance
    modular = balance.checkers(TestSpec(workload="balance", load_manager="modular"))
    assert "channel" not in modular and "ownership" in modular
    spec = TestSpec(workload="balance", load_manager="extensible",
                    lb_settings={"loadBalancerInFlightServiceUnitStateWaitingTimeInMillis": 5000,
                                 "loadBalancerServiceUnitStateMonitorIntervalInSeconds": 10})
    got = balance.checkers(spec)
    assert got["channel"][0] is check and got["channel"][1]["in_flight_limit_s"] == 15.0
    assert got["channel"][1]["assign_limit_s"] == 5.0
    assert balance.checkers(TestSpec(workload="balance", load_manager="extensible"))["channel"][1] == {
        "in_flight_limit_s": 90.0, "assign_limit_s": 30.0}


def test_views_the_checker_cannot_place_are_not_judged():
    h, last = _valid_life()
    h.row(CHANNEL_VIEW, A, {"broker": A, "records": {PARENT: rec(OWNED, B, v=9)}, "wall_ms": WALL0})   # no last_applied
    h.view(B, [99, 1], {PARENT: rec(OWNED, B, v=9)})                         # a message the observer never read
    h.view(A, [99, 2], {}, final=True)
    r = check(h.stop())
    assert r.valid is True, r.anomalies
    assert r.stats["views"][A]["unjudged"] == 2 and r.stats["views"][B]["unjudged"] == 1
    assert r.stats["convergence"][A].startswith("not judged: the observer did not read")


def test_view_records_that_are_not_records_diverge():
    h = Hist()
    p1 = assign(h, PARENT, A)
    h.view(B, p1, {PARENT: {"state": "Owned", "dstBroker": [A], "versionId": 2}})
    h.view(A, p1, {PARENT: {"state": "Owned", "dstBroker": A, "versionId": "2", "force": False, "timestamp": 0}})
    r = check(h.stop())
    assert _types(r) == {"view-divergence"} and {c["broker"] for c in r.anomalies["view-divergence"]} == {A, B}
    assert r.stats["views"][B]["undecodable_records"] == 1
