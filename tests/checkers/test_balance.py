"""The balance checker on hand-made histories (convergence after scale events, unavailability during
unloads), and its section of the report."""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from checkers import REGISTRY
from checkers.balance import check, covers, topic_hash
from core.history import NEMESIS_PROCESS, OBSERVER_PROCESS, Op
from core.observations import LB_EVENT, OBSERVE_START

S = 1_000_000_000
NS = "public/default"
LOW, HIGH = (0x00000000, 0x80000000), (0x80000000, 0xFFFFFFFF)
IDS = {"broker-1": "10.0.0.1:8080", "broker-2": "10.0.0.2:8080", "broker-3": "10.0.0.3:8080"}


def _topic_in(rng: tuple[int, int], skip: int = 0) -> str:
    for i in range(10_000):
        t = f"persistent://{NS}/t{i}"
        if covers(rng, zlib.crc32(t.encode()) & 0xFFFFFFFF):
            if skip == 0:
                return t
            skip -= 1
    raise AssertionError("no topic")


T_LOW, T_LOW2, T_HIGH = _topic_in(LOW), _topic_in(LOW, 1), _topic_in(HIGH)


class H:
    """A history builder; times in seconds; `ops` sorted by time, indexed."""

    def __init__(self):
        self._ops: list[Op] = []
        self.add(Op(process=OBSERVER_PROCESS, type="ok", f=OBSERVE_START, value={
            "nodes": {n: i.split(":")[0] for n, i in IDS.items()}, "ports": {i: n for n, i in IDS.items()}}), 0.0)

    def add(self, op: Op, at: float) -> Op:
        op.time_ns = int(at * S)
        self._ops.append(op)
        return op

    @property
    def ops(self) -> list[Op]:
        out = sorted(self._ops, key=lambda o: o.time_ns)
        for i, o in enumerate(out):
            o.index = i
        return out

    def event(self, at: float, event: str, broker: str, **fields) -> None:
        v = {"event": event, "broker": IDS[broker], "leader": IDS["broker-1"], "logged_by": broker, **fields}
        self.add(Op(process=OBSERVER_PROCESS, type="ok", f=LB_EVENT, key=str(fields.get("bundle") or ""), value=v),
                 at)

    def report(self, at: float, broker: str, usage: float, topics: int, bundles: int = 2, rate: float = 10.0) -> None:
        self.event(at, "load-report", broker, max_usage_with_weight=usage, numTopics=topics, numBundles=bundles,
                   msgRateIn=rate, msgRateOut=rate)

    def nemesis(self, at: float, f: str, value=None, done: float | None = None, type_: str = "ok") -> None:
        self.add(Op(process=NEMESIS_PROCESS, type="invoke", f=f, value=None), at)
        self.add(Op(process=NEMESIS_PROCESS, type=type_, f=f, value=value), at if done is None else done)

    def send(self, at: float, topic: str, type_: str = "ok", process: int = 0, took: float = 0.01) -> None:
        self.add(Op(process=process, type="invoke", f="send", key=topic, value=1), at)
        self.add(Op(process=process, type=type_, f="send", key=topic, value=1), at + took)


def _scale_history(converge: bool) -> H:
    """Three brokers report every second for 30 s; broker-3 leaves at 10 s (scale start). The two left
    converge (usage and topics even) from 15 s on, or stay apart."""
    h = H()
    h.nemesis(10.0, "start-scale", {"node": "broker-3", "mode": "stop", "brokers_left": 2}, done=10.1)
    for s in range(1, 31):
        t = float(s)
        if t < 10:
            for b, u in (("broker-1", 0.30), ("broker-2", 0.32), ("broker-3", 0.31)):
                h.report(t + 0.01, b, u, 20)
        elif converge and t >= 15:
            h.report(t, "broker-1", 0.40, 30)
            h.report(t, "broker-2", 0.45, 30)
        else:
            h.report(t, "broker-1", 0.70, 45)
            h.report(t, "broker-2", 0.20, 15)
        h.send(t + 0.5, T_HIGH)              # a client op through 31 s: the instants are judged until then
    return h


def test_registered_and_asked_for_by_the_balance_workload():
    from workloads import balance
    assert "balance" in REGISTRY and REGISTRY["balance"].check is check
    assert "balance" in balance.CHECKER_NAMES


def test_topic_hash_is_crc32_of_the_full_name():
    assert topic_hash(T_LOW) == (NS, zlib.crc32(T_LOW.encode()) & 0xFFFFFFFF)
    assert topic_hash(f"persistent://{NS}/p", 2) == (NS, zlib.crc32(f"persistent://{NS}/p-partition-2".encode())
                                                     & 0xFFFFFFFF)
    assert covers(HIGH, 0xFFFFFFFF) and not covers(LOW, 0x80000000)


def test_converges_after_a_broker_leaves():
    r = check(_scale_history(converge=True).ops)
    assert r.valid is True and not r.anomalies
    (e,) = r.stats["scale_events"]
    assert e["event"] == "scale start" and e["kind"] == "leave" and e["brokers"] == ["broker-3"]
    assert e["outcome"] == "balanced"
    # broker-3's last report (9.01 s) is stale after 3 s, but the two left differ until 15 s
    assert e["balanced_after_s"] == pytest.approx(15.0 - 10.1, abs=1e-3)
    assert e["live_brokers"] == ["broker-1", "broker-2"]
    assert e["usage_spread"] == pytest.approx(0.05) and e["topic_spread"] == 0
    assert r.stats["time_to_balanced_s"]["balanced"] == 1
    assert sorted(r.stats["load"]) == ["broker-1", "broker-2", "broker-3"]
    assert r.stats["load"]["broker-1"]["usage"][0] == 0.30


def test_does_not_converge_informational_by_default_invalid_when_required():
    h = _scale_history(converge=False)
    r = check(h.ops)
    (e,) = r.stats["scale_events"]
    assert e["balanced_after_s"] is None and e["outcome"] == "not balanced by the end"
    assert e["last_usage_spread"] == pytest.approx(0.5) and e["last_topic_spread"] == 30
    assert r.valid is True and not r.anomalies            # 60 s runs are short: reported, not an anomaly
    r = check(h.ops, {"require_convergence": True})
    assert r.valid is False
    assert r.anomalies["not-balanced"][0]["brokers"] == ["broker-3"]


def test_a_wider_target_spread_accepts_the_same_history():
    r = check(_scale_history(converge=False).ops, {"target_spread": 0.6, "target_topic_spread": 30})
    (e,) = r.stats["scale_events"]
    assert e["outcome"] == "balanced"


def test_a_joining_broker_must_report_before_the_cluster_counts_as_balanced():
    h = H()
    h.nemesis(5.0, "stop-kill", {"node": "broker-2", "role": "broker", "restarted": True})
    h.nemesis(1.0, "start-kill", {"node": "broker-2", "role": "broker"})
    for s in range(1, 20):
        h.report(float(s), "broker-1", 0.5, 20)
        if s >= 12:                          # broker-2 reports again from 12 s, already even
            h.report(float(s), "broker-2", 0.5, 20)
        h.send(s + 0.5, T_LOW)
    r = check(h.ops)
    leave, join = r.stats["scale_events"]
    assert leave["kind"] == "leave" and leave["balanced_after_s"] == pytest.approx(0.0)
    assert join["kind"] == "join" and join["balanced_after_s"] == pytest.approx(7.0)


def test_no_load_reports_is_unknown_only_when_convergence_is_required():
    h = H()
    h.nemesis(1.0, "start-scale", {"node": "broker-1"})
    assert check(h.ops).valid is True
    r = check(h.ops, {"require_convergence": True})
    assert r.valid == "unknown" and r.stats["unknown_because"]


def test_unavailability_during_a_shedding_unload():
    h = H()
    for t in (1.0, 2.0, 3.0, 4.0):
        h.send(t, T_LOW)
        h.send(t, T_HIGH, process=1)
    h.event(4.5, "unload", "broker-1", bundle=f"{NS}/0x00000000_0x80000000", source=IDS["broker-2"],
            destination=IDS["broker-3"], reason="shed:ThresholdShedder")
    h.send(5.0, T_LOW, type_="fail")        # failed while the bundle moved
    h.send(5.2, T_LOW, type_="info", process=2)
    h.send(7.0, T_LOW, process=3)           # first ok after: completes at 7.01
    for t in (5.0, 6.0):
        h.send(t, T_HIGH, process=1)         # the other bundle is untouched
    r = check(h.ops)
    assert r.valid is True
    assert r.stats["unloads"] == 1 and r.stats["unloads_by_reason"] == {"shed:ThresholdShedder": 1}
    (g,) = r.stats["unavailability_rows"]
    assert g["topic"] == T_LOW and g["bundle"] == f"{NS}/0x00000000_0x80000000"
    assert g["last_ok_before_s"] == pytest.approx(4.01) and g["first_ok_after_s"] == pytest.approx(7.01)
    assert g["gap_s"] == pytest.approx(3.0) and g["usual_gap_s"] == pytest.approx(1.0)
    assert g["excess_s"] == pytest.approx(2.0) and g["failed_sends_between"] == 2
    assert r.stats["unavailability"]["worst_gap_s"] == pytest.approx(3.0)
    (m,) = r.stats["moves"]
    assert m["kind"] == "unload" and m["source"] == "broker-2" and m["destination"] == "broker-3"
    # with a bound on unavailability, the same gap is an anomaly
    r = check(h.ops, {"max_unavailable_s": 2.5})
    assert r.valid is False and r.anomalies["long-unavailability"][0]["topic"] == T_LOW
    assert check(h.ops, {"max_unavailable_s": 3.5}).valid is True


def test_admin_unload_and_split_from_the_nemesis():
    h = H()
    for t in (1.0, 2.0):
        h.send(t, T_LOW)
        h.send(t, T_HIGH, process=1)
    # an admin unload logs no event: the nemesis op is the episode (its instant: the invoke)
    h.nemesis(3.0, "start-unload", {"topic": T_HIGH, "bundle": f"{NS}/0x80000000_0xffffffff"}, done=3.2)
    # an admin split logs split + its children's unloads: those are the episodes, not the op again
    h.nemesis(4.0, "start-split", {"topics": [T_LOW], "bundles": [f"{NS}/0x00000000_0x80000000"]}, done=4.3)
    h.event(4.1, "split", "broker-2", bundle=f"{NS}/0x00000000_0x80000000",
            children=["0x00000000_0x40000000", "0x40000000_0x80000000"], source=IDS["broker-2"], unload=True)
    h.event(4.11, "unload", "broker-2", bundle=f"{NS}/0x00000000_0x40000000", source=IDS["broker-2"],
            destination=None, reason="split")
    h.event(4.12, "unload", "broker-2", bundle=f"{NS}/0x40000000_0x80000000", source=IDS["broker-2"],
            destination=None, reason="split")
    h.send(6.0, T_LOW)
    h.send(5.0, T_HIGH, process=1)
    r = check(h.ops)
    assert r.stats["unloads_by_reason"] == {"admin-unload": 1, "split": 2}
    assert r.stats["splits"] == 1 and r.stats["splits_by_leader"] == 0 and r.stats["admin_splits"] == 1
    gaps = {g["topic"]: g for g in r.stats["unavailability_rows"]}
    assert gaps[T_HIGH]["unload_s"] == 3.0 and gaps[T_HIGH]["gap_s"] == pytest.approx(3.0)
    assert gaps[T_LOW]["reason"] == "split" and gaps[T_LOW]["gap_s"] == pytest.approx(4.0)
    assert len(r.stats["unavailability_rows"]) == 2          # T_LOW once, from its child's unload


def test_a_topic_never_ok_again_is_open_until_its_last_failed_send():
    h = H()
    h.send(1.0, T_LOW)
    h.event(2.0, "unload", "broker-1", bundle=f"{NS}/0x00000000_0x80000000", source=IDS["broker-1"],
            destination=None, reason="shed:OverloadShedder")
    h.send(3.0, T_LOW, type_="fail")
    h.send(9.0, T_LOW, type_="fail", process=1)
    h.send(1.0, T_LOW2, process=2)           # never tried again after the unload: not judged
    (g,) = check(h.ops).stats["unavailability_rows"]
    assert g["topic"] == T_LOW and g["open_until_end"] and g["gap_s"] == pytest.approx(8.0)


# ------------------------------------------------------------------------------------ the report

SPEC = """test_name = "bal"
workload = "balance"
nemesis = ["scale"]
time_limit = 30.0
brokers = 3
"""


def test_the_report_draws_the_load_and_the_table(tmp_path: Path):
    from harness import report
    h = _scale_history(converge=True)
    h.event(16.0, "unload", "broker-1", bundle=f"{NS}/0x00000000_0x80000000", source=IDS["broker-1"],
            destination=IDS["broker-2"], reason="shed:ThresholdShedder")
    ops = h.ops
    r = check(ops)
    (tmp_path / "test.toml").write_text(SPEC)
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(o.to_json()) + "\n" for o in ops))
    (tmp_path / "results.json").write_text(json.dumps({"valid": r.valid, "exit_code": 0, "checkers": {
        "balance": r.to_json()}}))
    page = report.render(tmp_path).read_text()
    sec = page[page.index('<section id="balance"'):]
    sec = sec[:sec.index("</section>")]
    assert '<a href="#balance">' in page
    for series in ("usage", "msg_rate", "topics"):
        assert f'data-series="{series}"' in sec
    assert sec.count("<svg") == 3
    # one line per broker in the legend, the unload as a tick with its bundle, the scale band
    for b in ("broker-1", "broker-2", "broker-3"):
        assert f">{b}</text>" in sec
    assert sec.count('class="move-tick"') == 3 and "shed:ThresholdShedder" in sec
    assert "fault: scale" in sec
    # the time-to-balanced table: the scale start, balanced after 4.9 s
    assert "scale start" in sec and 'data-v="4.9"' in sec
    assert "worst per-topic unavailability" in sec


def test_the_report_has_no_balance_section_without_the_checker(tmp_path: Path):
    from harness import report
    (tmp_path / "test.toml").write_text(SPEC)
    (tmp_path / "results.json").write_text(json.dumps({"valid": True, "exit_code": 0, "checkers": {}}))
    page = report.render(tmp_path).read_text()
    assert 'id="balance"' not in page and '#balance' not in page


def test_the_load_winding_down_after_the_last_send_is_not_balance():
    """The brokers go on reporting after the workload's last send (settle, final reads): their usage falls
    together, which is no balancing; instants after the last send are not judged."""
    h = _scale_history(converge=False)
    for s in range(31, 45):                      # the workload stopped: usage falls to nothing
        h.report(float(s), "broker-1", 0.01, 45)
        h.report(float(s), "broker-2", 0.01, 15)
    h.add(Op(process=0, type="invoke", f="read", key=T_HIGH), 40.0)     # a final read, not a send
    h.add(Op(process=0, type="ok", f="read", key=T_HIGH), 41.0)
    (e,) = check(h.ops, {"target_topic_spread": float("inf")}).stats["scale_events"]
    assert e["balanced_after_s"] is None and e["outcome"] == "not balanced by the end"


def test_smoothing_judges_the_mean_of_recent_reports():
    """One report is one interval's load: noisy. With smooth_s, a broker's score is the mean of its reports
    over the last smooth_s seconds, so one lucky pair of reports is no convergence."""
    h = H()
    h.nemesis(10.0, "start-scale", {"node": "broker-3", "mode": "stop", "brokers_left": 2}, done=10.1)
    for s in range(1, 31):
        t = float(s)
        lucky = s == 20
        h.report(t, "broker-1", 0.45 if lucky else 0.70, 30)
        h.report(t, "broker-2", 0.40 if lucky else 0.20, 30)
        if t < 10:
            h.report(t + 0.01, "broker-3", 0.3, 30)
        h.send(t + 0.5, T_HIGH)
    (raw,) = check(h.ops, {"target_topic_spread": float("inf")}).stats["scale_events"]
    assert raw["balanced_after_s"] is not None and raw["usage_spread"] == pytest.approx(0.05)
    (smooth,) = check(h.ops, {"target_topic_spread": float("inf"), "smooth_s": 5}).stats["scale_events"]
    assert smooth["balanced_after_s"] is None


def test_band_judges_the_distance_from_the_mean_as_threshold_shedder_does():
    """Three brokers at 0.20, 0.30, 0.38: max - min is 0.18 (over 0.10), but each is within 0.10 of the mean
    0.293 (ThresholdShedder sheds none); 0.10, 0.30, 0.41 puts 0.10 out of the band."""
    for usages, band_ok in (((0.20, 0.30, 0.38), True), ((0.10, 0.30, 0.41), False)):
        h = H()
        h.nemesis(1.0, "start-scale", {"node": "broker-3"}, done=1.1)
        for s in range(2, 10):
            for b, u in zip(("broker-1", "broker-2"), usages[:2]):
                h.report(float(s), b, u, 20)
            h.send(s + 0.5, T_LOW)
        h.nemesis(5.0, "stop-scale", {"node": "broker-3"}, done=5.1)
        for s in range(6, 10):
            h.report(s + 0.1, "broker-3", usages[2], 20)
        opts = {"target_topic_spread": float("inf")}
        join = [e for e in check(h.ops, opts).stats["scale_events"] if e["kind"] == "join"][0]
        assert join["outcome"] == "not balanced by the end"
        join = [e for e in check(h.ops, {**opts, "spread_measure": "band"}).stats["scale_events"]
                if e["kind"] == "join"][0]
        assert (join["outcome"] == "balanced") is band_ok


def _shedding(h: H, at: float, avg: dict[str, float]) -> None:
    record = {"strategy": "ThresholdShedder", "avg_usage": sum(avg.values()) / len(avg),
              "brokers": {IDS[b]: {"avg_usage": u, "usage": u} for b, u in avg.items()}}
    h.event(at, "shedding", "broker-1", plan={"strategy": "ThresholdShedder", "unloads": [],
                                              "strategy_record": record})


def test_leader_scores_judge_the_shedders_averages_from_the_cycle_that_sees_the_new_broker():
    h = H()
    h.nemesis(10.0, "start-scale", {"node": "broker-3"}, done=10.1)
    h.nemesis(20.0, "stop-scale", {"node": "broker-3"}, done=20.1)
    for s in range(1, 60):
        h.report(float(s), "broker-1", 0.9 if s % 2 else 0.1, 20)     # noisy reports: never balanced
        h.report(float(s), "broker-2", 0.1 if s % 2 else 0.9, 20)
        h.send(s + 0.5, T_LOW)
    _shedding(h, 5.0, {"broker-1": 0.5, "broker-2": 0.5, "broker-3": 0.3})   # before: not judged
    _shedding(h, 15.0, {"broker-1": 0.5, "broker-2": 0.3})                   # 5 s after leaving
    _shedding(h, 25.0, {"broker-1": 0.5, "broker-2": 0.35})                  # broker-3 not seen yet
    _shedding(h, 35.0, {"broker-1": 0.5, "broker-2": 0.4, "broker-3": 0.1})  # out of the band
    _shedding(h, 45.0, {"broker-1": 0.4, "broker-2": 0.35, "broker-3": 0.25})
    opts = {"scores": "leader", "spread_measure": "band"}
    leave, join = check(h.ops, opts).stats["scale_events"]
    assert leave["balanced_after_s"] == pytest.approx(4.9) and leave["live_brokers"] == ["broker-1", "broker-2"]
    assert join["balanced_after_s"] == pytest.approx(24.9) and join["usage_spread"] == pytest.approx(0.0833, abs=1e-3)
    leave, join = check(h.ops, {"scores": "leader"}).stats["scale_events"]       # range: 0.15 > 0.10
    assert leave["outcome"] == "not balanced by the end" and join["outcome"] == "not balanced by the end"
    assert all(e["outcome"] == "not balanced by the end"
               for e in check(h.ops, {"target_topic_spread": float("inf")}).stats["scale_events"])
    with pytest.raises(ValueError, match="scores='averages'"):
        check(h.ops, {"scores": "averages"})


def test_hold_s_needs_the_band_to_last_a_moment_of_balance_is_not_enough():
    """Two brokers after broker-3 left at 10 s: even for one report at 12 s, apart until 20 s, even from
    20 s on. Without hold_s the first instant counts; with hold_s=5 the streak from 20 s does."""
    h = H()
    h.nemesis(10.0, "start-scale", {"node": "broker-3"}, done=10.1)
    for s in range(1, 40):
        t = float(s)
        for b, u in (("broker-1", 0.4), ("broker-2", 0.4 if s == 12 or s >= 20 else 0.1)):
            h.report(t, b, u, 20)
        if s < 10:
            h.report(t, "broker-3", 0.4, 20)
        h.send(t + 0.5, T_LOW)
    opts = {"target_topic_spread": float("inf")}
    (e,) = check(h.ops, opts).stats["scale_events"]
    assert e["balanced_after_s"] == pytest.approx(12.0 - 10.1)
    (e,) = check(h.ops, {**opts, "hold_s": 5}).stats["scale_events"]
    assert e["balanced_after_s"] == pytest.approx(20.0 - 10.1) and e["usage_spread"] == 0
    (e,) = check(h.ops, {**opts, "hold_s": 30}).stats["scale_events"]      # the run ends first
    assert e["outcome"] == "not balanced by the end"
    leader = H()
    leader.nemesis(10.0, "start-scale", {"node": "broker-3"}, done=10.1)
    for t, u2 in ((15.0, 0.4), (20.0, 0.1), (25.0, 0.4), (30.0, 0.4), (35.0, 0.45)):
        _shedding(leader, t, {"broker-1": 0.4, "broker-2": u2})
        leader.send(t + 1, T_LOW)
    got = [check(leader.ops, {"scores": "leader", "hold_s": x}).stats["scale_events"][0]["balanced_after_s"]
           for x in (0, 10)]
    assert got == [pytest.approx(4.9), pytest.approx(14.9)]


def test_settled_is_the_streak_that_lasts_until_the_phase_ends():
    """broker-3 leaves at 10 s, joins again (invoked at 48 s, reporting from 49 s, done at 50.1 s) and
    leaves again (invoked at 70 s, its reports stop, done at 76 s). After the leave the two brokers
    are even from 12 to 24 s (the load not yet arrived), apart until 30 s, even from 30 to 60 s, apart
    until 63 s, even from 63 s on. hold_s=5 takes each
    first streak; settled the one that lasts until the next event's invocation."""
    h = H()
    h.nemesis(10.0, "start-scale", {"node": "broker-3"}, done=10.1)
    h.nemesis(48.0, "stop-scale", {"node": "broker-3"}, done=50.1)
    h.nemesis(70.0, "start-scale", {"node": "broker-3"}, done=76.0)
    for s in range(1, 100):
        t = float(s)
        even = s < 10 or 12 <= s < 24 or 30 <= s < 60 or s >= 63
        for b, u in (("broker-1", 0.4), ("broker-2", 0.4 if even else 0.1)):
            h.report(t, b, u, 20)
        if s < 10 or 49 <= s < 70:
            h.report(t, "broker-3", 0.4, 20)
        h.send(t + 0.5, T_LOW)
    opts = {"target_topic_spread": float("inf"), "hold_s": 5}
    leave, join, leave2 = check(h.ops, opts).stats["scale_events"]
    assert leave["balanced_after_s"] == pytest.approx(12.0 - 10.1)
    assert join["balanced_after_s"] == pytest.approx(51.0 - 50.1)     # broker-3's first report since
    st = check(h.ops, {**opts, "settled": True}).stats
    leave, join, leave2 = st["scale_events"]
    assert st["settled"] is True
    # up to the join's invocation (48 s), not its completion: broker-3 reports from 49 s
    assert leave["balanced_after_s"] == pytest.approx(30.0 - 10.1) and leave["before_next_event"]
    # up to the second leave's invocation (70 s): broker-3's last report (69 s) goes stale before 76 s
    assert join["balanced_after_s"] == pytest.approx(63.0 - 50.1)
    assert leave2["balanced_after_s"] == pytest.approx(0.0)
    # the streak that reaches the phase's end must still last hold_s: 30 to 48 s is 18 s
    leave, *_ = check(h.ops, {**opts, "hold_s": 20, "settled": True}).stats["scale_events"]
    assert leave["balanced_after_s"] is None and leave["outcome"] == "not balanced before the next event"
    # the leader's averaged scores, the same way: even at 15 s, apart at 20 s, even from 25 s until the
    # join is invoked at 38 s; the cycle at 40 s sees broker-3 again
    leader = H()
    leader.nemesis(10.0, "start-scale", {"node": "broker-3"}, done=10.1)
    leader.nemesis(38.0, "stop-scale", {"node": "broker-3"}, done=41.0)
    for t, u2 in ((15.0, 0.4), (20.0, 0.1), (25.0, 0.4), (30.0, 0.4), (35.0, 0.45)):
        _shedding(leader, t, {"broker-1": 0.4, "broker-2": u2})
        leader.send(t + 1, T_LOW)
    _shedding(leader, 40.0, {"broker-1": 0.4, "broker-2": 0.4, "broker-3": 0.1})
    leader.send(41.0, T_LOW)
    got = [check(leader.ops, {"scores": "leader", "settled": s}).stats["scale_events"][0]["balanced_after_s"]
           for s in (False, True)]
    assert got == [pytest.approx(4.9), pytest.approx(14.9)]
