"""Linearizability checker benchmark: generated cas-register histories, checked by `pulsar-chaos lin`.

A history is made by simulating a real linearizable register (Jepsen's cas-register test: read,
write v and cas [old new] with v in 0..4, equally likely): `--concurrency` client threads issue
operations back to back with random latencies; each operation takes effect at a random instant
inside its interval, in that order, on one register; a cas whose old value does not match fails.
A fraction `--info` of the operations time out (`info`): their effect is applied or not at random.
As in Jepsen, a process whose operation timed out is retired and its thread goes on as a new
process. Seeded: the same flags give the same history.

Variants checked (each written as a Jepsen EDN history and checked through the CLI, as a user
would, and also through `checkers.linear.check` in process):
- valid: the simulated history as is;
- stale: one ok read changed to a value it cannot have seen: the latest read for which some ok
  write of another value finished before the read began and no operation that writes the new
  value (ok or indeterminate) overlaps the stretch from that write to the read;
- impossible: a read in the middle of the history returns a value no operation ever writes;
- kv: the same load spread over `--keys` keys as jepsen.independent [key value] tuples, with a
  stale read injected in the middle of one key (P-compositionality, two worker processes).

    .venv/bin/python -m bench.lin [--ops 5000] [--concurrency 10] [--info 0.1] [--seed 1] [--json FILE]
"""
from __future__ import annotations

import argparse
import heapq
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.history import Op  # noqa: E402


# ------------------------------------------------------------------------------------------ generator

def simulate(n_ops: int, concurrency: int, info: float, values: int, seed: int, keys: int = 0
             ) -> list[dict[str, Any]]:
    """Operations of a simulated linearizable cas-register (one per key when keys > 0), as dicts:
    process, f, value (invoke), key, t_inv, t_ret, t_lin, type, out (completion value)."""
    rng = random.Random(seed)
    heap = [(rng.uniform(0, 1.0), t) for t in range(concurrency)]
    proc = list(range(concurrency))
    ops = []
    for _ in range(n_ops):
        t0, th = heapq.heappop(heap)
        f = rng.choice(("read", "write", "cas"))
        v: Any = None
        if f == "write":
            v = rng.randrange(values)
        elif f == "cas":
            v = [rng.randrange(values), rng.randrange(values)]
        lat = 0.05 + rng.expovariate(1 / 1.5)
        if rng.random() < 0.05:
            lat *= 10                                 # a slow one now and then
        crashed = rng.random() < info
        op = {"process": proc[th], "f": f, "value": v, "key": rng.randrange(keys) if keys else None,
              "t_inv": t0, "t_ret": t0 + lat, "t_lin": rng.uniform(t0, t0 + lat),
              "crashed": crashed, "applied": (not crashed) or rng.random() < 0.5}
        ops.append(op)
        if crashed:
            proc[th] += concurrency                   # a crashed process never comes back
        heapq.heappush(heap, (t0 + lat + rng.uniform(0, 0.2), th))
    reg: dict[Any, Any] = {}
    for op in sorted(ops, key=lambda o: o["t_lin"]):
        cur = reg.get(op["key"])
        f, v = op["f"], op["value"]
        if f == "read":
            op["out"] = cur
            ok = True
        elif f == "write":
            if op["applied"]:
                reg[op["key"]] = v
            op["out"] = v
            ok = True
        else:
            ok = cur == v[0]
            if ok and op["applied"]:
                reg[op["key"]] = v[1]
            op["out"] = v
        op["type"] = "info" if op["crashed"] else "ok" if ok else "fail"
    return ops


def producers(op: dict[str, Any]) -> Any:
    """The value an op writes, if any."""
    if op["f"] == "write":
        return op["value"]
    if op["f"] == "cas":
        return op["value"][1]
    return None


def inject_stale(ops: list[dict[str, Any]], values: int, key: Any = None, near: float = 1.0) -> dict | None:
    """Change the latest ok read (at or before fraction `near` of the key's ops) whose new value is
    provably impossible (see the module docstring); returns what was changed."""
    mine = [o for o in ops if o["key"] == key]
    writes = [o for o in mine if o["type"] == "ok" and producers(o) is not None]
    limit = mine[int(near * (len(mine) - 1))]["t_inv"] if mine else 0
    reads = [o for o in mine if o["f"] == "read" and o["type"] == "ok" and o["t_inv"] <= limit]
    for r in sorted(reads, key=lambda o: -o["t_inv"]):
        before = [w for w in writes if w["t_ret"] < r["t_inv"]]
        if not before:
            continue
        w = max(before, key=lambda o: o["t_ret"])
        for v2 in range(values):
            if v2 == r["out"] or v2 == producers(w):
                continue
            blocked = False
            for p in mine:
                if producers(p) != v2 or p["type"] == "fail" or p["t_inv"] > r["t_ret"]:
                    continue
                if p["type"] == "info" or p["t_ret"] >= w["t_inv"]:
                    blocked = True
                    break
            if not blocked:
                old = r["out"]
                r["out"] = v2
                return {"read_process": r["process"], "was": old, "now": v2, "at_s": round(r["t_inv"], 3),
                        "fraction": round(sum(1 for o in mine if o["t_inv"] <= r["t_inv"]) / len(mine), 3)}
    return None


def inject_impossible(ops: list[dict[str, Any]], values: int) -> dict | None:
    reads = [o for o in ops if o["f"] == "read" and o["type"] == "ok"]
    r = reads[len(reads) // 2]
    old, r["out"] = r["out"], values + 1
    return {"read_process": r["process"], "was": old, "now": values + 1, "at_s": round(r["t_inv"], 3),
            "fraction": 0.5}


def to_history(ops: list[dict[str, Any]], independent: bool = False) -> list[Op]:
    """The invoke/completion events in time order, as Ops (time in ns from the start)."""
    ev = []
    for n, o in enumerate(ops):
        iv = o["value"]
        cv = o["out"] if o["type"] == "ok" else o["value"]
        if independent:
            iv, cv = [o["key"], iv], [o["key"], cv]
        ev.append((o["t_inv"], 0, n, Op(process=o["process"], type="invoke", f=o["f"], value=iv)))
        ev.append((o["t_ret"], 1, n, Op(process=o["process"], type=o["type"], f=o["f"], value=cv)))
    ev.sort(key=lambda e: (e[0], e[1], e[2]))
    out = []
    for i, (t, _, _, op) in enumerate(ev):
        op.index = i
        op.time_ns = int(t * 1e6)
        out.append(op)
    return out


def edn(v: Any) -> str:
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + " ".join(edn(x) for x in v) + "]"
    return str(v)


def write_edn(history: list[Op], path: Path) -> None:
    with open(path, "w") as f:
        for op in history:
            f.write(f"{{:process {op.process}, :type :{op.type}, :f :{op.f}, :value {edn(op.value)}, "
                    f":time {op.time_ns}, :index {op.index}}}\n")


# ------------------------------------------------------------------------------------------ measuring

def run_cli(path: Path, model: str, time_limit: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "harness.cli", "lin", "--model", model, "--format", "jepsen-edn",
           "--time-limit", str(time_limit), "--json", str(path)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    try:
        res = json.loads(p.stdout)
    except ValueError:
        res = {"valid": None, "stderr": p.stderr[-500:]}
    return {"seconds": dt, "exit": p.returncode, "valid": res.get("valid"),
            "search_s": (res.get("stats") or {}).get("seconds")}


def run_inproc(history: list[Op], model: str, time_limit: float) -> dict[str, Any]:
    from checkers import linear
    t0 = time.perf_counter()
    r = linear.check(history, {"model": model, "time_limit_s": time_limit})
    return {"seconds": time.perf_counter() - t0, "valid": r.valid, "cache": r.stats.get("cache_entries"),
            "steps": r.stats.get("search_steps"), "prefix": (r.anomalies.get("nonlinearizable") or [{}])[0]
            .get("prefix_length")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--info", type=float, default=0.1)
    ap.add_argument("--values", type=int, default=5)
    ap.add_argument("--keys", type=int, default=20, help="keys of the kv variant")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--variants", default="valid,stale,impossible,kv")
    ap.add_argument("--sweep", type=int, default=10, metavar="N",
                    help="also check the valid variant for seeds 1..N in process (0: skip)")
    ap.add_argument("--json", metavar="FILE", default=None)
    a = ap.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in a.variants.split(","):
            keys = a.keys if variant == "kv" else 0
            ops = simulate(a.ops, a.concurrency, a.info, a.values, a.seed, keys=keys)
            injected = None
            if variant == "stale":
                injected = inject_stale(ops, a.values)
            elif variant == "impossible":
                injected = inject_impossible(ops, a.values)
            elif variant == "kv":
                injected = inject_stale(ops, a.values, key=keys // 2, near=0.5)
            h = to_history(ops, independent=bool(keys))
            path = Path(tmp) / f"{variant}.edn"
            write_edn(h, path)
            cli = run_cli(path, "cas-register", a.time_limit)
            inproc = run_inproc(h, "cas-register", a.time_limit)
            n_info = sum(1 for o in ops if o["type"] == "info")
            rows.append({"variant": variant, "ops": len(ops), "info": n_info, "keys": keys or 1,
                         "injected": injected, "cli": cli, "inproc": inproc})
            print(f"{variant:10s} ops={len(ops)} info={n_info} keys={keys or 1} "
                  f"cli: {cli['seconds']:.2f}s exit={cli['exit']} valid={cli['valid']}   "
                  f"in-process: {inproc['seconds']:.2f}s valid={inproc['valid']} "
                  f"steps={inproc['steps']} cache={inproc['cache']}"
                  + (f"   injected={injected}" if injected else ""), flush=True)
        sweep = []
        for seed in range(1, a.sweep + 1):
            h = to_history(simulate(a.ops, a.concurrency, a.info, a.values, seed))
            sweep.append(run_inproc(h, "cas-register", a.time_limit))
            print(f"sweep seed {seed}: {sweep[-1]['seconds']:.2f}s valid={sweep[-1]['valid']}", flush=True)
    print()
    print("| variant | ops | info ops | keys | `pulsar-chaos lin` wall time | exit (verdict) | check alone |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['ops']} | {r['info']} | {r['keys']} | {r['cli']['seconds']:.2f} s | "
              f"{r['cli']['exit']} ({r['cli']['valid']}) | {r['inproc']['seconds']:.2f} s |")
    if sweep:
        ts = sorted(x["seconds"] for x in sweep)
        verdicts = sorted({str(x["valid"]) for x in sweep})
        print(f"\nvalid variant, seeds 1..{a.sweep}: check alone min {ts[0]:.2f} s, median "
              f"{ts[len(ts) // 2]:.2f} s, max {ts[-1]:.2f} s; verdicts {', '.join(verdicts)}")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "sweep": sweep}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
