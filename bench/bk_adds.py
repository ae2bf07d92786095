"""Throughput of pipelined adds through the BookKeeper client (not a pytest test).

    .venv/bin/python -m bench.bk_adds [--seconds 10] [--window 1000] [--size 100]

Starts a local ZooKeeper and 3 bookie processes on loopback, creates a 3/2/2 ledger and keeps
`window` adds in flight from one client (uvloop), like a broker does.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from clusters import zookeeper
from clusters.bookkeeper.client import BookKeeper
from clusters.metadata.store import MetadataStore
from tests.bookie.cluster import Bookies


async def run(zk: str, args) -> None:
    store = await MetadataStore(zk).start()
    bk = await BookKeeper(store).start()
    while len(await bk.available_bookies()) < args.bookies:
        await asyncio.sleep(0.05)
    lh = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
    payload = b"x" * args.size
    sem = asyncio.Semaphore(args.window)
    lat: list[float] = []
    done = 0

    def finished(fut: asyncio.Future, t0: float) -> None:
        nonlocal done
        sem.release()
        fut.result()
        done += 1
        if done % 10 == 0:
            lat.append(time.perf_counter() - t0)

    t_start = time.monotonic()
    deadline = t_start + args.seconds
    while time.monotonic() < deadline:
        await sem.acquire()
        t0 = time.perf_counter()
        lh.add_entry_async(payload).add_done_callback(lambda f, t0=t0: finished(f, t0))
    for _ in range(args.window):
        await sem.acquire()
    elapsed = time.monotonic() - t_start
    lat.sort()
    print(f"{done} adds of {args.size} B, E/Qw/Qa {args.ensemble}/{args.write_quorum}/"
          f"{args.ack_quorum}, window {args.window}: {done / elapsed:,.0f} adds/s; latency p50 "
          f"{lat[len(lat) // 2] * 1000:.1f} ms p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms")
    await lh.close()
    md = await bk.ledger_metadata(lh.ledger_id)
    rh = await bk.open_ledger(lh.ledger_id, recovery=False)
    t0 = time.monotonic()
    back = await rh.read(0, md.last_entry_id)
    print(f"closed at {md.last_entry_id} ({md.length} B); read back {len(back)} entries in "
          f"{time.monotonic() - t0:.1f}s, all intact: {all(b == payload for b in back)}")
    await bk.close()
    await store.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--bookies", type=int, default=3)
    p.add_argument("--ensemble", type=int, default=3)
    p.add_argument("--write-quorum", type=int, default=2)
    p.add_argument("--ack-quorum", type=int, default=2)
    args = p.parse_args()
    import uvloop
    with tempfile.TemporaryDirectory() as tmp:
        zk = zookeeper.LocalZooKeeper(Path(tmp) / "zk")
        zk.start()
        cluster = Bookies(zk.connect_string, Path(tmp))
        try:
            cluster.start(args.bookies)
            uvloop.run(run(zk.connect_string, args))
        finally:
            cluster.kill_all()
            zk.stop()


if __name__ == "__main__":
    main()
