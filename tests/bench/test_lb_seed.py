"""bench/lb_seed.py: the pure figures of the seed's four scenarios, on small hand-made histories (no cluster)."""
from __future__ import annotations

from bench import lb_seed as ls
from core.history import FAIL, INVOKE, OK, Op

S = 1_000_000_000


def _send(process: int, topic: str, t_inv: float, t_done: float, typ: str = OK) -> list[Op]:
    return [Op(process=process, type=INVOKE, f="send", key=topic, time_ns=int(t_inv * S)),
            Op(process=process, type=typ, f="send", key=topic, time_ns=int(t_done * S))]


def _history(spec: dict[str, list[tuple[float, float, str]]]) -> list[Op]:
    ops = []
    for p, (topic, sends) in enumerate(spec.items()):
        for a, b, t in sends:
            ops += _send(p, topic, a, b, t)
    return sorted(ops, key=lambda o: o.time_ns)


def _steady(t0: float, t1: float, every: float = 0.5, lat: float = 0.01) -> list[tuple[float, float, str]]:
    n = int((t1 - t0) / every)
    return [(t0 + i * every, t0 + i * every + lat, OK) for i in range(n)]


def test_reconnect_time_is_the_last_interrupted_topic_back() -> None:
    h = _history({
        "a": _steady(0, 30) + [(30, 31, FAIL)] + _steady(34, 60),        # interrupted 29.5 -> 34.01
        "b": _steady(0, 32) + _steady(41, 60),                             # 31.5 -> 41.01: the last back
        "c": _steady(0, 60),                                               # never interrupted
    })
    r = ls.reconnect_time(ls.sends_by_topic(h), 30 * S, 45 * S)
    assert r["interrupted"] == 2 and r["never_back"] == []
    assert abs(r["all_back_s"] - 11.01) < 1e-6 and abs(r["after_last_join_s"] - (41.01 - 45)) < 1e-6


def test_reconnect_time_names_a_topic_that_never_came_back() -> None:
    h = _history({"a": _steady(0, 30) + [(31, 40, FAIL), (41, 50, FAIL)], "b": _steady(0, 60)})
    r = ls.reconnect_time(ls.sends_by_topic(h), 30 * S, 45 * S)
    assert r["never_back"] == ["a"] and r["all_back_s"] is None


def test_latency_percentiles_gap_and_failures_within_the_window() -> None:
    sends = [(i * 0.1, i * 0.1 + 0.005, OK) for i in range(1000)]          # 0..100 s, 5 ms each
    sends[500] = (50.0, 52.0, OK)                                          # one 2-s send at 50 s ...
    del sends[501:520]                                                     # ... its process idle meanwhile
    sends[700 - 19] = (70.0, 70.1, FAIL)
    h = _history({"a": sends, "b": _steady(0, 20) + _steady(27, 100)})     # b: a 7.5-s gap
    r = ls.latency(ls.sends_by_topic(h), 40 * S, 80 * S)
    assert r["failed"] == 1 and r["p9999_ms"] == 2000.0 and r["p99_ms"] == 10.0   # b sends at 10 ms
    # b's gap (19.5 -> 27) lies before the window: only a's gaps count
    assert r["longest_gap_topic"] == "a" and abs(r["longest_gap_s"] - 2.095) < 1e-6
    r2 = ls.latency(ls.sends_by_topic(h), 0, 30 * S)
    assert r2["longest_gap_topic"] == "b" and abs(r2["longest_gap_s"] - 7.5) < 1e-6


def _load(series: dict[str, list[tuple[float, float, int]]]) -> dict:
    return {b: {"t": [t for t, _, _ in pts], "usage": [u for _, u, _ in pts], "topics": [n for _, _, n in pts]}
            for b, pts in series.items()}


def test_band_settled_from_the_streak_that_lasts() -> None:
    # b2 at 0.6 against b1 at 0.2 until 40 s, then both at 0.4: the 15-s means meet the band once b2's
    # old reports leave the window (after 40 + ~15 s)
    load = _load({"b1": [(t, 0.2 if t < 40 else 0.4, 10) for t in range(0, 100)],
                  "b2": [(t + 0.5, 0.6 if t < 40 else 0.4, 14) for t in range(0, 100)]})
    t = ls.band_settled(load, 0.0, 99.5)
    assert t is not None and 45 <= t <= 56
    assert ls.topic_spread(load, 99.5) == 4
    # never balanced: b2 stays 0.4 above b1
    load2 = _load({"b1": [(t, 0.2, 10) for t in range(100)], "b2": [(t + 0.5, 0.6, 10) for t in range(100)]})
    assert ls.band_settled(load2, 0.0, 99.5) is None
    # balanced only for the last ~11 s: shorter than the 15-s hold
    load3 = _load({"b1": [(t, 0.2 if t < 88 else 0.4, 10) for t in range(100)],
                   "b2": [(t + 0.5, 0.6 if t < 88 else 0.4, 10) for t in range(100)]})
    assert ls.band_settled(load3, 0.0, 99.5, smooth_s=1.0) is None


def test_table_puts_both_load_managers_and_the_seed_figure_in_one_row() -> None:
    rows = [{"scenario": "rolling", "load_manager": lm, "seed": s, "load_before": 4.0, "load_after": 5.5,
             "figures": {"p99_ms": 10.0 * s, "p9999_ms": 50.0 + s, "longest_gap_s": 1.0, "failed": 0}}
            for lm in ls.LOAD_MANAGERS for s in (1, 2)]
    rows[-1]["figures"] = {"error": "boom"}
    t = ls.table(rows)
    line = next(x for x in t.splitlines() if "p99.99 publish latency" in x)
    assert "51 / 52 (median 51.5)" in line and "1,841" not in line
    first = next(x for x in t.splitlines() if "p99 publish" in x)
    assert "1,841" in first and first.count("not run") == 0
    assert "4.0 to 5.5" in t
