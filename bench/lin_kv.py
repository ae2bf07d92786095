"""Key-value histories checked side by side by `pulsar-chaos lin --model kv` and by Porcupine (Go).

A seeded simulation of a linearizable key-value store (`simulate`): `clients` processes issue get,
append and put ops back to back on `keys` keys (about 47% append, 47% get, 6% put, as in the
key-value histories Porcupine's tests use); an op's latency is exponential (mean 1 ms) and one in
ten is a slow one (x 10..60, a leader change); each op takes effect at a random instant inside its
interval, in that order, on one store. Every append value and put value is unique (`x C N y`:
client C's N-th op), so a get's value names the appends it saw. Every op completes (ok), as in
Porcupine's own kv files. The **bad** variant plants one stale read (`plant_stale`): a get in the
middle of the history returns the value its key had just before a write that finished before
the get began.

Each history is written once (`write_kv_edn`), as one EDN map a line with a `:key` field, which is
both the format Porcupine's kv test reads (`parseKvLog` in its porcupine_test.go) and one of ours,
and the same file is checked by both:

- ours: `checkers.linear.check` in process, after `read_history` (*check alone*, the median of
  `--repeat` runs), and `pulsar-chaos lin --model kv FILE` in a subprocess (*CLI wall time*:
  interpreter start, imports, parsing, the check);
- Porcupine: `CheckEvents(kvModel, events)` after `parseKvLog`, timed by a Go test of ours
  (`bench/porcupine/pulsarchaos_bench_test.go`) copied into a Porcupine checkout given with
  `--porcupine DIR` and run with `go test` (the median of `--repeat` runs).

    .venv/bin/python -m bench.lin_kv --porcupine /tmp/porcupine [--repeat 5] [--json FILE]
    .venv/bin/python -m bench.lin_kv --write-only DIR       # just the files
    .venv/bin/python -m bench.lin_kv --profile FILE         # cProfile of our check of a history file

With `--etcd` it also times both on the etcd logs of Porcupine's test data (`test_data/jepsen`,
checked with our `cas-register` model and Porcupine's `etcdModel`): the sum over all logs of each
log's median check time, and whether both verdicts agree with the ones Porcupine's tests expect.
"""
from __future__ import annotations

import argparse
import heapq
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GO_TEST = ROOT / "bench" / "porcupine" / "pulsarchaos_bench_test.go"

# (name, clients, ops): the rows of the table
SIZES = [("c01", 1, 100), ("c10", 10, 1000), ("c50", 50, 5000)]


# ------------------------------------------------------------------------------------------ generator

def simulate(clients: int, n_ops: int, keys: int = 10, seed: int = 1) -> list[dict[str, Any]]:
    """Ops of a simulated linearizable kv store: process, f, key, value (invoke), out (the ok
    value), t_inv, t_ret, t_lin; every op completes ok."""
    rng = random.Random(seed)
    heap = [(rng.uniform(0, 1.0), c) for c in range(clients)]
    count = [0] * clients
    ops = []
    for _ in range(n_ops):
        t0, c = heapq.heappop(heap)
        x = rng.random()
        f = "get" if x < 0.47 else "append" if x < 0.94 else "put"
        key = str(rng.randrange(keys))
        value = None if f == "get" else f"x {c} {count[c]} y"
        count[c] += 1
        lat = 0.05 + rng.expovariate(1.0)
        if rng.random() < 0.1:
            lat *= rng.uniform(10, 60)
        ops.append({"process": c, "f": f, "key": key, "value": value, "t_inv": t0, "t_ret": t0 + lat,
                    "t_lin": rng.uniform(t0, t0 + lat)})
        heapq.heappush(heap, (t0 + lat + rng.uniform(0, 0.2), c))
    store: dict[str, str] = {}
    for op in sorted(ops, key=lambda o: o["t_lin"]):
        cur = store.get(op["key"], "")
        op["before"] = cur
        if op["f"] == "get":
            op["out"] = cur
        elif op["f"] == "append":
            store[op["key"]] = cur + op["value"]
            op["out"] = op["value"]
        else:
            store[op["key"]] = op["value"]
            op["out"] = op["value"]
    return ops


def plant_stale(ops: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Make the first get at or after the middle of the history, of a key written before it began
    (by an op whose previous value was not empty), return the value the key had just before the
    latest such write: a stale read (values are unique, so no order of the ops explains it)."""
    by_inv = sorted(ops, key=lambda o: o["t_inv"])
    for g in by_inv[len(by_inv) // 2:]:
        if g["f"] != "get":
            continue
        done = [w for w in ops if w["key"] == g["key"] and w["f"] != "get" and w["t_ret"] < g["t_inv"]]
        if not done:
            continue
        w = max(done, key=lambda o: o["t_lin"])
        if not w["before"] or w["before"] == g["out"]:
            continue
        old, g["out"] = g["out"], w["before"]
        return {"process": g["process"], "key": g["key"], "was": old, "now": g["out"]}
    return None


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_kv_edn(ops: list[dict[str, Any]], path: Path) -> None:
    """The invoke/ok events in time order, one EDN map a line with the key in `:key` (Porcupine's
    kv test format: `{:process 0, :type :invoke, :f :get, :key "4", :value nil}`)."""
    ev = []
    for n, o in enumerate(ops):
        iv = "nil" if o["value"] is None else _q(o["value"])
        ev.append((o["t_inv"], 0, n, f'{{:process {o["process"]}, :type :invoke, :f :{o["f"]}, '
                                     f':key {_q(o["key"])}, :value {iv}}}'))
        ev.append((o["t_ret"], 1, n, f'{{:process {o["process"]}, :type :ok, :f :{o["f"]}, '
                                     f':key {_q(o["key"])}, :value {_q(o["out"])}}}'))
    ev.sort(key=lambda e: (e[0], e[1], e[2]))
    path.write_text("".join(line + "\n" for _, _, _, line in ev))


def write_files(out: Path, seed: int = 1) -> list[dict[str, Any]]:
    """The ok and bad history of every size in SIZES, in `out`; what was written."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, clients, n in SIZES:
        for variant in ("ok", "bad"):
            ops = simulate(clients, n, seed=seed)
            planted = plant_stale(ops) if variant == "bad" else None
            path = out / f"{name}-{variant}.txt"
            write_kv_edn(ops, path)
            rows.append({"file": path, "name": f"{name}-{variant}", "clients": clients, "ops": n,
                         "expect": variant == "ok", "planted": planted})
    return rows


# ------------------------------------------------------------------------------------------ measuring

def ours(path: Path, model: str, repeat: int, fmt: str = "auto") -> dict[str, Any]:
    from checkers import jepsen_format, linear
    h = jepsen_format.read_history(path, fmt)
    times, r = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = linear.check(h, {"model": model})
        times.append(time.perf_counter() - t0)
    return {"valid": r.valid, "median_s": statistics.median(times), "times": times,
            "steps": r.stats.get("search_steps")}


def ours_cli(path: Path, model: str, repeat: int) -> dict[str, Any]:
    times, code = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "harness.cli", "lin", "--model", model, str(path)],
                           cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        code = p.returncode
    return {"exit": code, "median_s": statistics.median(times)}


def porcupine(pdir: Path, kv: list[Path], etcd: list[Path], repeat: int) -> dict[str, dict[str, Any]]:
    """Porcupine's check times (ns) per file, by our Go test inside its checkout."""
    dst = pdir / GO_TEST.name
    shutil.copy(GO_TEST, dst)
    try:
        env = {"PATH": "/usr/local/go/bin:/usr/lib/go/bin:/usr/bin:/bin", "HOME": tempfile.gettempdir(),
               "GOPROXY": "off", "GOFLAGS": "-mod=mod", "GOCACHE": str(Path(tempfile.gettempdir()) / "go-cache"),
               "PC_KV_FILES": ",".join(str(p) for p in kv), "PC_ETCD_FILES": ",".join(str(p) for p in etcd),
               "PC_REPEAT": str(repeat)}
        p = subprocess.run(["go", "test", "-count=1", "-run", "TestPulsarChaosTimes", "-v", "."], cwd=pdir,
                           env=env, capture_output=True, text=True)
    finally:
        dst.unlink()
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("PCBENCH "):
            d = json.loads(line[len("PCBENCH "):])
            out[d["file"]] = d
    if p.returncode != 0 or not out:
        raise SystemExit(f"go test failed in {pdir}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return out


def etcd_expectations(pdir: Path) -> dict[int, bool]:
    src = (pdir / "porcupine_test.go").read_text()
    return {int(n): b == "true" for n, b in re.findall(r"checkJepsen\(t, (\d+), (true|false)\)", src)}


def profile(path: Path) -> int:
    """cProfile of `linear.check` on one file (keys one after another, so the profile sees them),
    the top functions by own time, and the search's work per key."""
    import cProfile
    import pstats
    from checkers import jepsen_format, linear
    h = jepsen_format.read_history(path)
    prof = cProfile.Profile()
    prof.enable()
    r = linear.check(h, {"model": "kv", "parallel": False})
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    st = r.stats
    print(f"verdict {r.valid}; {st['search_steps']} search steps, {st['cache_entries']} cache entries, "
          f"{st['refutations_tried']} refutations tried, {st['rewinds']} rewinds; per key:")
    for k, v in (st.get("per_key") or {}).items():
        print(f"  {k}: {v}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--porcupine", metavar="DIR", help="a Porcupine checkout (its porcupine_test.go is used)")
    ap.add_argument("--write-only", metavar="DIR", help="write the histories to DIR and stop")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--etcd", action="store_true", help="also time both on Porcupine's etcd logs")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI wall times")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--profile", metavar="FILE", help="profile our check of this kv history (sequential, "
                                                       "in process) and print where the time goes")
    a = ap.parse_args(argv)
    if a.profile:
        return profile(Path(a.profile))
    if a.write_only:
        for r in write_files(Path(a.write_only), a.seed):
            print(r["file"], r["planted"] or "")
        return 0
    if not a.porcupine:
        ap.error("give --porcupine DIR (a checkout of github.com/anishathalye/porcupine) or --write-only DIR")
    pdir = Path(a.porcupine)
    with tempfile.TemporaryDirectory() as tmp:
        rows = write_files(Path(tmp), a.seed)
        etcd_exp = etcd_expectations(pdir) if a.etcd else {}
        etcd_files = [pdir / "test_data" / "jepsen" / f"etcd_{n:03d}.log" for n in sorted(etcd_exp)]
        pc = porcupine(pdir, [r["file"] for r in rows], etcd_files, a.repeat)
        print("| history | clients | ops | verdict (ours / Porcupine) | Porcupine check | ours, check alone | "
              "ours, `pulsar-chaos lin` wall time |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            o = ours(r["file"], "kv", a.repeat)
            c = None if a.no_cli else ours_cli(r["file"], "kv", max(3, a.repeat // 2))
            p = pc[str(r["file"])]
            r.update(ours=o, cli=c, porcupine=p)
            ok = "valid" if o["valid"] is True else "INVALID" if o["valid"] is False else str(o["valid"])
            pv = "valid" if p["ok"] else "INVALID"
            mismatch = "" if (o["valid"] is r["expect"] and p["ok"] is r["expect"]) else " (unexpected!)"
            print(f"| {r['name']} | {r['clients']} | {r['ops']} | {ok} / {pv}{mismatch} | "
                  f"{p['median_ns'] / 1e6:.1f} ms | {o['median_s'] * 1e3:.1f} ms | "
                  + ("-" if c is None else f"{c['median_s'] * 1e3:.0f} ms (exit {c['exit']})") + " |", flush=True)
        if etcd_exp:
            tot_o = tot_p = 0.0
            wrong_o, wrong_p = [], []
            for n, path in zip(sorted(etcd_exp), etcd_files):
                o = ours(path, "cas-register", a.repeat, "jepsen-log")
                p = pc[str(path)]
                tot_o += o["median_s"]
                tot_p += p["median_ns"] / 1e9
                if o["valid"] is not etcd_exp[n]:
                    wrong_o.append(n)
                if p["ok"] is not etcd_exp[n]:
                    wrong_p.append(n)
            print(f"\netcd logs: {len(etcd_exp)}; sum of median check times: Porcupine {tot_p * 1e3:.0f} ms, "
                  f"ours {tot_o * 1e3:.0f} ms; verdicts off the expected: ours {wrong_o or 'none'}, "
                  f"Porcupine {wrong_p or 'none'}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
