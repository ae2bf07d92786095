"""The load-balancer simulator at the seed's scale (clusters/loadbalancer/sim, `pulsar-chaos lb-sim`):

    .venv/bin/python -m bench.lb_sim seed                 # the seed's four scenarios, both load managers
    .venv/bin/python -m bench.lb_sim scale                # the reconnect storm at 1/100, 1/10 and full scale
    .venv/bin/python -m bench.lb_sim validate [--seeds 5] # small-6-3-6, judged as bench/lb_scale.py judges ours
    .venv/bin/python -m bench.lb_sim one SCENARIO LM [--fraction F]   # one run, JSON on stdout
    .venv/bin/python -m bench.lb_sim calibrate RUN_DIR...  # small-6-3-6's measured parameters from real runs

Every run is its own process (so its peak RSS is its own); each prints the wall time, the events run and
the peak RSS beside the outcome. The tables go in bench/README.md ("lb-sim").
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from clusters.loadbalancer.sim import run, scenario


def one(name: str, lm: str, fraction: float, seed: int) -> dict:
    sc = scenario.BUILTIN[name]
    if fraction != 1.0:
        sc = sc.scaled(bundles=max(sc.namespaces, round(sc.bundles * fraction)),
                       topics=max(1, round(sc.topics * fraction)), publishers=max(1, round(sc.publishers * fraction)))
    t0 = time.monotonic()
    c = run.simulate(sc, lm, seed=seed)
    o = run.outcomes(c, time.monotonic() - t0)
    o["headline"] = run.headline(sc, o)
    o["scenario"] = name
    o["fraction"] = fraction
    o["size"] = {"brokers": sc.brokers, "bundles": sc.bundles, "topics": sc.topics, "publishers": sc.publishers}
    o.pop("topics_per_broker", None)
    return o


def sub(name: str, lm: str, fraction: float = 1.0, seed: int = 1) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.lb_sim", "one", name, lm, "--fraction", str(fraction),
                          "--seed", str(seed)], capture_output=True, text=True, timeout=3600, check=True)
    return json.loads(out.stdout)


def judged(lm: str, seed: int) -> dict:
    """small-6-3-6 once, judged as bench/lb_scale.py judges a real run: the balance checker on the
    simulation's history with the "15 s band" options; the shedder's unloads (a stopping broker's
    transfers are not the shedder's: the real runs' table counts them apart)."""
    from checkers import balance

    from bench.lb_scale import MEASURES
    c = run.simulate(scenario.BUILTIN["small-6-3-6"], lm, seed=seed)
    st = balance.check(run.history(c), {"target_topic_spread": float("inf"), **MEASURES["15 s band"]}).stats
    by = {e.get("kind"): e for e in st.get("scale_events") or []}
    shed = sum(n for r, n in (st.get("unloads_by_reason") or {}).items() if r.startswith("shed:"))
    return {"seed": seed, "load_manager": lm, "leave_s": (by.get("leave") or {}).get("balanced_after_s"),
            "join_s": (by.get("join") or {}).get("balanced_after_s"), "unloads": shed}


def calibrate(run_dirs: list[str], start_s: float = 20.0) -> dict:
    """The validation scenario's measured parameters, from real runs of bench/lb_scale.py: the reports of
    the six brokers before the leave (from `start_s` to 2 s before the nemesis starts; the extensible
    leader's left out, its system topics are not the workload's). Per broker, its mean bandwidth out
    against its mean message rate in (least squares): the wire bytes per message (`msg_size`) and a
    broker's bytes without topics (`base_kb_s`); the workload's sends per second (`msg_rate`); the wire
    bytes beyond a message's payload (`system_msg_overhead_bytes`, for the extensible load manager's
    system-topic messages); each report's deviation e from its broker's centred 15-s mean,
    var(e) = D x its KB/s over one report (`report_noise_kb` = D; a Poisson count of D-KB lumps). None of
    these is a settling time or an unload count."""
    from core import store

    from bench.lb_scale import SETTINGS
    link_kb = float(SETTINGS["loadBalancerOverrideBrokerNicSpeedGbps"]) * 1024 * 1024 / 8     # KiB/s
    report_s = float(SETTINGS["loadBalancerReportUpdateMinIntervalMillis"]) / 1000
    points, sends, e2, payload = [], [], [], []
    for d in run_dirs:
        hist = store.load_history(d)
        leave = min((op.time_ns for op in hist if op.f == "start-scale"), default=None)
        if leave is None:
            continue
        lo, hi = start_s * 1e9, leave - 2e9
        sends.append(sum(1 for op in hist if op.f == "send" and op.type == "ok" and lo <= op.time_ns <= hi)
                     / ((hi - lo) / 1e9))
        by: dict[str, list[tuple[float, float, float]]] = {}
        for op in hist:
            v = op.value
            if (op.f == "lb-event" and isinstance(v, dict) and v.get("event") == "load-report"
                    and lo <= op.time_ns <= hi and v.get("leader") != v.get("broker")):
                by.setdefault(v["broker"], []).append((op.time_ns / 1e9, float(v["bandwidthOut"]) / 100 * link_kb,
                                                       float(v.get("msgRateIn") or 0)))
                if v.get("msgRateIn"):
                    payload.append(float(v["msgThroughputIn"]) / float(v["msgRateIn"]))
        for rows in by.values():
            points.append((statistics.mean(r[2] for r in rows), statistics.mean(r[1] for r in rows)))
            for t, kb, _ in rows:
                win = [r[1] for r in rows if abs(r[0] - t) <= 7.5]
                if len(win) >= 12:
                    m = statistics.mean(win)
                    if m > 0:        # the window's mean holds the report itself: n / (n - 1)
                        e2.append((kb - m) ** 2 / m * len(win) / (len(win) - 1))
    if len(points) < 2 or not e2:
        raise ValueError("no reports before a leave in these runs: give run folders of bench/lb_scale.py")
    mx, my = statistics.mean(p[0] for p in points), statistics.mean(p[1] for p in points)
    slope = (sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points))
    return {"runs": len(sends), "brokers_x_runs": len(points), "reports": len(e2),
            "msg_rate": round(statistics.mean(sends), 1), "msg_size": round(slope * 1024),
            "base_kb_s": round(my - slope * mx, 3), "report_noise_kb": round(statistics.mean(e2) * report_s, 3),
            # a system topic's message costs its payload plus what a workload message costs beyond its own
            "system_msg_overhead_bytes": round(slope * 1024 - statistics.mean(payload)),
            "link_kb_s": round(link_kb, 3)}


# Our real cluster's runs of the same scenario (bench/lb_scale.py, judged with its "15 s band"; None: not
# settled before the next event; unloads: the shedder's). modular: /work/lbscale14, 2026-11-27 (its run
# folders were not kept); extensible: /work/lbscale-ext, 2026-11-28 (bench/README.md "Scale-in and
# scale-out"; `calibrate` reads these).
REAL = {
    "modular": {"leave": [91.1, 46.2, 63.7, 14.0, 20.0], "join": [14.0, 61.0, 16.9, 111.5, 125.2],
                "unloads": [52, 60, 47, 47, 53]},
    "extensible": {"leave": [None, None, None, None, None], "join": [None, None, None, None, None],
                   "unloads": [15, 19, 11, 4, 20]},
}


def _q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def tolerance(real: dict, sim: list[dict]) -> list[tuple[str, str, bool]]:
    """bench/README.md's tolerance, per event: (1) the share of events that settled, simulated over many
    seeds, within 0.3 of the real share over five; (2) if both settled in some runs, the real runs'
    median within the simulated runs' 10th to 90th percentile; and for the run, (3) the simulated mean
    of the shedder's unloads within 20 % of the real mean. Seeds of the two are not the same randomness:
    only distributions compare."""
    out = []
    for ev in ("leave", "join"):
        r = [x for x in real[ev] if x is not None]
        s = [o[ev + "_s"] for o in sim if o[ev + "_s"] is not None]
        rs, ss = len(r) / len(real[ev]), len(s) / len(sim)
        out.append((f"{ev}: settled share", f"real {len(r)}/{len(real[ev])}, simulated {len(s)}/{len(sim)}",
                    abs(rs - ss) <= 0.3))
        if r and s:
            med, lo, hi = statistics.median(r), _q(s, 0.1), _q(s, 0.9)
            out.append((f"{ev}: real median in simulated p10-p90",
                        f"real median {med:.0f} s; simulated p10 {lo:.0f}, p50 {_q(s, 0.5):.0f}, p90 {hi:.0f} s",
                        lo <= med <= hi))
    rm, sm = statistics.mean(real["unloads"]), statistics.mean(o["unloads"] for o in sim)
    out.append(("the shedder's unloads: simulated mean within 20 % of real", f"real {rm:.1f} "
                f"({min(real['unloads'])}-{max(real['unloads'])}), simulated {sm:.1f} "
                f"({min(o['unloads'] for o in sim)}-{max(o['unloads'] for o in sim)})", abs(sm - rm) <= 0.2 * rm))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("seed", "scale", "validate", "one", "calibrate"))
    ap.add_argument("args", nargs="*")
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--sim-seeds", type=int, default=20, help="validate: seeds whose distribution is compared")
    a = ap.parse_args()
    if a.what == "calibrate":
        try:
            print(json.dumps(calibrate(a.args)))
        except ValueError as e:          # core.history.HistoryError is one
            print(f"calibrate: {e}", file=sys.stderr)
            return 254
        return 0
    if a.what == "one":
        print(json.dumps(one(a.args[0], a.args[1], a.fraction, a.seed), default=str))
        return 0
    if a.what == "seed":
        print("| scenario | load manager | ours | the seed's | unloads | splits | topics max-min | wall s | peak RSS MB |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name in list(scenario.BUILTIN)[:4]:
            for lm in ("modular", "extensible"):
                o = sub(name, lm)
                print(f"| {name} | {lm} | {o['headline']} | {scenario.BUILTIN[name].seed.get(lm, '-')} | {o['unloads']} | "
                      f"{o['splits']} | {o['topics_per_broker_spread']} | {o['wall_s']} | {o['max_rss_mb']} |", flush=True)
    elif a.what == "scale":
        print("| scale | bundles | publishers | load manager | wall s | events | peak RSS MB | outcome |")
        print("|---|---|---|---|---|---|---|---|")
        for f in (0.01, 0.1, 1.0):
            for lm in ("modular", "extensible"):
                o = sub("reconnect-storm", lm, f)
                print(f"| {f:g} | {o['size']['bundles']} | {o['size']['publishers']} | {lm} | {o['wall_s']} | "
                      f"{o['events']} | {o['max_rss_mb']} | {o['headline']} |", flush=True)
    else:
        n = max(a.seeds, a.sim_seeds)
        runs = {lm: [judged(lm, s) for s in range(1, n + 1)] for lm in ("modular", "extensible")}
        print("| seed | load manager | 6 -> 3 settled after | 3 -> 6 settled after | the shedder's unloads |")
        print("|---|---|---|---|---|")
        for s in range(a.seeds):
            for lm in ("modular", "extensible"):
                o = runs[lm][s]
                fmt = ["not settled" if x is None else f"{x:.0f} s" for x in (o["leave_s"], o["join_s"])]
                print(f"| {s + 1} | {lm} | {fmt[0]} | {fmt[1]} | {o['unloads']} |", flush=True)
        print()
        print(f"| load manager | tolerance (real: five runs; simulated: seeds 1-{a.sim_seeds}) | figures | met |")
        print("|---|---|---|---|")
        for lm in ("modular", "extensible"):
            for what, figures, ok in tolerance(REAL[lm], runs[lm][:a.sim_seeds]):
                print(f"| {lm} | {what} | {figures} | {'yes' if ok else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
