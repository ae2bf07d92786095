"""The channel checker's time on a synthetic channel: assignments, transfers, splits and stale messages over
three brokers, with view samples of every broker.

    .venv/bin/python -m bench.channel_checker [--messages 100000] [--samples 300] [--seed 1]

Prints the messages, samples, time to check and the verdict (valid: the history follows the rules)."""
from __future__ import annotations

import argparse
import random
import time
from typing import Any

from checkers.channel import Oracle, check
from core.history import OBSERVER_PROCESS, Op
from core.observations import CHANNEL_MESSAGE, CHANNEL_VIEW, OBSERVE_START, OBSERVE_STOP, range_name

BROKERS = ("10.0.0.11:8080", "10.0.0.12:8080", "10.0.0.13:8080")
NS = "public/bench"


def _rec(state: str, dst: str | None, src: str | None, v: int, split: dict | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"state": state, "force": False, "timestamp": 0, "versionId": v}
    if dst:
        out["dstBroker"] = dst
    if src:
        out["sourceBroker"] = src
    if split:
        out["splitServiceUnitToDestBroker"] = split
    return out


def history(messages: int, samples: int, seed: int) -> list[Op]:
    rng = random.Random(seed)
    ops: list[Op] = []
    t_ms = 0
    oracle = Oracle()

    def row(f: str, key: str, value: Any) -> None:
        ops.append(Op(process=OBSERVER_PROCESS, type="ok", f=f, key=key, value=value, time_ns=t_ms * 1_000_000,
                      index=len(ops)))

    row(OBSERVE_START, "", {"source": "channel", "ports": {b: f"broker-{i}" for i, b in enumerate(BROKERS)}})
    entry = 0
    last: list[int] | None = None

    def send(key: str, value: dict | None) -> None:
        nonlocal entry, last, t_ms
        t_ms += 10
        entry += 1
        last = [1, entry]
        row(CHANNEL_MESSAGE, key, {"message_id": [1, entry, -1], "publish_ms": t_ms, "wall_ms": t_ms, "value": value})
        oracle.apply(key, value, value is None)

    step = 1 << 26
    bundles = {f"{NS}/{range_name(lo, lo + step if lo + step < 1 << 32 else 0xFFFFFFFF)}": None
               for lo in range(0, 1 << 32, step)}
    for key in bundles:
        send(key, _rec("Assigning", rng.choice(BROKERS), None, 1))
        send(key, _rec("Owned", oracle.table[key]["dstBroker"], None, 2))
    every = max(1, messages // max(1, samples))
    next_sample = every
    while entry < messages:
        key = rng.choice(sorted(k for k, r in oracle.table.items() if r["state"] == "Owned"))
        r = oracle.table[key]
        owner, v = r["dstBroker"], r["versionId"]
        p = rng.random()
        lo, hi = (int(x, 16) for x in key.rsplit("/", 1)[1].split("_"))
        if p < 0.1 and hi - lo > 4:
            mid = lo + (hi - lo) // 2
            kids = [range_name(lo, mid), range_name(mid, hi)]
            send(key, _rec("Splitting", None, owner, v + 1, {k: None for k in kids}))
            for k in kids:
                send(f"{NS}/{k}", _rec("Owned", owner, None, 1))
            send(key, _rec("Deleted", None, owner, v + 2))
            send(key, None)
        elif p < 0.9:
            dst = rng.choice([b for b in BROKERS if b != owner])
            send(key, _rec("Releasing", dst, owner, v + 1))
            send(key, _rec("Assigning", dst, owner, v + 2))
            send(key, _rec("Owned", dst, owner, v + 3))
        else:
            send(key, _rec("Releasing", owner, rng.choice(BROKERS), v))       # stale: rejected
        if entry >= next_sample:
            next_sample += every
            for b in BROKERS:
                t_ms += 1
                row(CHANNEL_VIEW, b, {"broker": b, "last_applied": last, "records": dict(oracle.table)})
    row(OBSERVE_STOP, "", {"wall_ms": t_ms + 1})
    return ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    t = time.monotonic()
    h = history(a.messages, a.samples, a.seed)
    made = time.monotonic() - t
    t = time.monotonic()
    r = check(h)
    took = time.monotonic() - t
    s = r.stats
    print(f"messages {s['messages']} (rejected {sum(s['rejected_by_reason'].values())}), bundles {s['bundles']}, "
          f"final records {s['final_records']}, view samples {sum(v['samples'] for v in s['views'].values())}, "
          f"splits {s['splits']['completed']}")
    print(f"history made in {made:.1f}s; checked in {took:.2f}s; valid {r.valid}; anomalies {s['anomaly_counts']}")


if __name__ == "__main__":
    main()
