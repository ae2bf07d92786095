"""`pulsar-chaos lb-sim`: run a load-balancer simulation (clusters/loadbalancer/sim) for one or both load
managers, optionally sweeping one setting, judge its history with the balance checker, print one line per
run beside the seed's figure, and write JSON + an offline HTML page with `--out`."""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from clusters.loadbalancer.settings import LoadBalancerSettings
from clusters.loadbalancer.sim import run as simrun
from clusters.loadbalancer.sim import scenario as scn


class LbSimError(ValueError):
    """A mistake in the command line: one line with the fix."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message, self.fix = message, fix


def list_lines() -> list[str]:
    w = max(len(n) for n in scn.BUILTIN)
    return [f"{n:{w}}  {s.description}" for n, s in scn.BUILTIN.items()]


def resolve(name: str) -> scn.Scenario:
    if name in scn.BUILTIN:
        return scn.BUILTIN[name]
    p = Path(name)
    if p.exists() or name.endswith(".toml"):
        return scn.load(p)
    raise LbSimError(f"no scenario {name!r}", f"name one of `pulsar-chaos lb-sim --list` or a scenario file (.toml)")


def sweep_values(items: list[str] | None) -> tuple[dict[str, str], str | None, list[str]]:
    """--lb-setting NAME=VALUE items -> (fixed settings, the swept name or None, its values). A comma
    list sweeps (except for a list-valued setting, whose value is the comma list)."""
    fields = {f.name: f for f in dataclasses.fields(LoadBalancerSettings)}
    fixed: dict[str, str] = {}
    swept, values = None, [""]
    for item in items or []:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise LbSimError(f"--lb-setting {item!r} is not NAME=VALUE",
                             "write e.g. --lb-setting loadBalancerSheddingIntervalMinutes=0.5 or NAME=v1,v2,v3")
        is_list = name in fields and str(fields[name].type).startswith("tuple")
        if "," in value and not is_list:
            if swept is not None:
                raise LbSimError(f"--lb-setting sweeps both {swept} and {name}", "sweep one setting at a time")
            swept, values = name, [v.strip() for v in value.split(",") if v.strip()]
        else:
            fixed[name] = value
    if swept is None:
        return fixed, None, [""]
    return fixed, swept, values


def judge(hist: list[Any]) -> dict[str, Any]:
    """The balance checker on a simulation's history (the same checker as a real run's)."""
    from checkers import balance
    r = balance.check(hist, {"settled": True, "hold_s": 15.0, "spread_measure": "band", "scale_faults": ("scale",),
                             "topic_spread_fraction": 10.0})
    ttb = r.stats.get("time_to_balanced_s") or {}
    return {"verdict": r.valid, "events": [{"what": e.get("what"), "balanced_after_s": e.get("balanced_after_s")}
                                           for e in r.stats.get("scale_events") or []],
            "balanced": ttb.get("balanced"), "unloads": r.stats.get("unloads")}


def main(args: Any) -> int:
    if args.list:
        for line in list_lines():
            print(line)
        return 0
    if not args.scenario:
        raise LbSimError("no scenario named", "give a scenario name (`pulsar-chaos lb-sim --list`) or a file")
    sc = resolve(args.scenario)
    if any(v is not None for v in (args.brokers, args.bundles, args.topics, args.publishers)):
        for k in ("brokers", "bundles", "topics", "publishers"):
            v = getattr(args, k)
            if v is not None and v <= 0:
                raise LbSimError(f"--{k} {v} is not positive", f"give --{k} a positive number")
        sc = sc.scaled(brokers=args.brokers, bundles=args.bundles, topics=args.topics, publishers=args.publishers)
    lms = ["modular", "extensible"] if args.load_manager == "both" else [args.load_manager]
    fixed, swept, values = sweep_values(args.lb_setting)
    runs = []
    for v in values:
        overrides = dict(fixed)
        if swept:
            overrides[swept] = v
        sc.lb_settings(overrides)            # a bad setting fails here, before any run
        runs.append((v, overrides))
    quiet = args.quiet

    def progress(msg: str) -> None:
        if not quiet:
            print(f"  ... {msg}", file=sys.stderr, flush=True)
    results, plots, histories = [], {}, {}
    for v, overrides in runs:
        for lm in lms:
            t0 = time.monotonic()
            c = simrun.simulate(sc, lm, settings=overrides, seed=args.seed, progress=progress)
            o = simrun.outcomes(c, time.monotonic() - t0)
            hist = simrun.history(c)
            if sc.metric in ("balance", "split") or any(e.kind in ("leave", "join") for e in sc.events):
                o["balance_checker"] = judge(hist)
            o["headline"] = simrun.headline(sc, o)
            o["sweep"] = f"{swept}={v}" if swept else None
            o["settings"] = overrides
            results.append(o)
            label = lm + (f"-{swept}={v}" if swept else "")
            if args.out:
                plots.update(simrun.plots_of(c, label))
                histories[label] = hist
            seed_fig = sc.seed.get(lm, "-")
            sweep = f"  {swept}={v}" if swept else ""
            print(f"{sc.name}  {lm}{sweep}: {o['headline']}  (the seed's: {seed_fig}); {o['unloads']} unloads, "
                  f"{o['splits']} splits, topics per broker max-min {o['topics_per_broker_spread']}; "
                  f"wall {o['wall_s']} s, {o['events']} events", flush=True)
    if args.out:
        simrun.write(Path(args.out), sc, results, plots, histories)
        print(f"wrote {Path(args.out) / 'lb-sim.json'} and {Path(args.out) / 'index.html'}")
    return 0
