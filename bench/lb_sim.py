"""The load-balancer simulator at the seed's scale (clusters/loadbalancer/sim, `pulsar-chaos lb-sim`):

    .venv/bin/python -m bench.lb_sim seed                 # the seed's four scenarios, both load managers
    .venv/bin/python -m bench.lb_sim scale                # the reconnect storm at 1/100, 1/10 and full scale
    .venv/bin/python -m bench.lb_sim validate [--seeds 5] # small-6-3-6 against our real cluster's figures
    .venv/bin/python -m bench.lb_sim one SCENARIO LM [--fraction F]   # one run, JSON on stdout

Every run is its own process (so its peak RSS is its own); each prints the wall time, the events run and
the peak RSS beside the outcome. The tables go in bench/README.md ("lb-sim").
"""
from __future__ import annotations

import argparse
import json
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("seed", "scale", "validate", "one"))
    ap.add_argument("args", nargs="*")
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args()
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
        print("| seed | load manager | 6 -> 3 settled after | 3 -> 6 settled after | unloads |")
        print("|---|---|---|---|---|")
        for s in range(1, a.seeds + 1):
            for lm in ("modular", "extensible"):
                o = sub("small-6-3-6", lm, 1.0, s)
                st = [e["settled_after_s"] for e in o["settle"]]
                fmt = ["not settled" if x is None else f"{x:.0f} s" for x in st]
                print(f"| {s} | {lm} | {fmt[0]} | {fmt[1]} | {o['unloads']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
