"""Throughput of the broker's protocol side over the in-memory ManagedLedger, with the real client.

    PYTHONPATH=. .venv/bin/python -m bench.broker_protocol [--messages N] [--size BYTES]

The broker runs in its own process (uvloop), so the client's Python callbacks don't share its GIL.
Not collected by pytest (no test_ prefix).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time


def _broker_main(port_q) -> None:
    import asyncio
    import logging

    import uvloop

    from clusters.broker.connection import serve_connections
    from tests.broker.memory import MemoryBrokerService

    logging.basicConfig(level=logging.WARNING)

    async def main():
        svc = MemoryBrokerService(port=0)
        server = await serve_connections(svc, "127.0.0.1", 0)
        svc.config.port = server.sockets[0].getsockname()[1]
        port_q.put(svc.config.port)
        await asyncio.Event().wait()

    uvloop.run(main())


def produce(client, topic: str, n: int, size: int, batching: bool) -> float:
    import pulsar
    p = client.create_producer(topic, batching_enabled=batching, block_if_queue_full=True,
                               max_pending_messages=5000 if batching else 1000,
                               batching_max_publish_delay_ms=5)
    payload = b"x" * size
    done = threading.Event()
    count = [0]
    errors = [0]

    def cb(res, _mid):
        if res != pulsar.Result.Ok:
            errors[0] += 1
        count[0] += 1
        if count[0] == n:
            done.set()

    t0 = time.perf_counter()
    for _ in range(n):
        p.send_async(payload, cb)
    p.flush()
    done.wait(300)
    dt = time.perf_counter() - t0
    p.close()
    assert errors[0] == 0, f"{errors[0]} send errors"
    return dt


def consume(client, topic: str, n: int) -> float:
    import pulsar
    c = client.subscribe(topic, "bench", initial_position=pulsar.InitialPosition.Earliest,
                         receiver_queue_size=5000)
    t0 = time.perf_counter()
    for i in range(n):
        m = c.receive(20000)
        if i % 100 == 99:
            c.acknowledge_cumulative(m)
    dt = time.perf_counter() - t0
    c.close()
    return dt


def _cpu(pid: int) -> float:
    """CPU seconds used so far by a process (Linux)."""
    import os
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _producer_proc(url: str, topic: str, n: int, size: int, batching: bool, out) -> None:
    import pulsar
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        out.put(produce(client, topic, n, size, batching))
    finally:
        client.close()


def produce_parallel(url: str, topic: str, n: int, size: int, batching: bool, procs: int) -> float:
    """Several client processes (the Python client's per-message cost is the bottleneck otherwise)."""
    q: mp.Queue = mp.Queue()
    ps = [mp.Process(target=_producer_proc, args=(url, topic, n // procs, size, batching, q))
          for _ in range(procs)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    for _ in ps:
        q.get(timeout=300)
    dt = time.perf_counter() - t0
    for p in ps:
        p.join(10)
    return dt


def main() -> None:
    import pulsar
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--unbatched", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--producers", type=int, default=1, help="client processes producing in parallel")
    args = ap.parse_args()
    q: mp.Queue = mp.Queue()
    proc = mp.Process(target=_broker_main, args=(q,), daemon=True)
    proc.start()
    port = q.get(timeout=20)
    client_url = f"pulsar://127.0.0.1:{port}"
    client = pulsar.Client(client_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        for batching, n in ((True, args.messages), (False, args.unbatched)):
            topic = f"persistent://public/default/bench-{'b' if batching else 'u'}-{time.time_ns()}"
            kind = "batched" if batching else "unbatched"
            c0 = _cpu(proc.pid)
            if args.producers > 1:
                dt = produce_parallel(client_url, topic, n, args.size, batching, args.producers)
            else:
                dt = produce(client, topic, n, args.size, batching)
            c1 = _cpu(proc.pid)
            print(f"{kind}: produce {n} x {args.size} B: {n / dt:,.0f} msg/s "
                  f"(broker CPU {100 * (c1 - c0) / dt:.0f}%)")
            dt = consume(client, topic, n)
            c2 = _cpu(proc.pid)
            print(f"{kind}: consume {n}: {n / dt:,.0f} msg/s (broker CPU {100 * (c2 - c1) / dt:.0f}%)")
    finally:
        client.close()
        proc.terminate()
        proc.join(5)


if __name__ == "__main__":
    main()
