"""Producer/consumer benchmark through the official pulsar-client against a reference cluster.

Starts a cluster in network namespaces (E/Qw/Qa 3/2/2 by default), then measures: batched and
unbatched publish throughput (messages/s, acknowledged), end-to-end consume throughput, and publish
latency percentiles at a fixed rate. Prints a table and writes JSON with --json.

    .venv/bin/python bench/pubsub.py [--messages 400000] [--unbatched 40000] [--producers 2] [--rate 500]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import threading
import time
import uuid

import pulsar

from clusters.deploy.netns import ClusterSpec, NetnsCluster


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def _produce(url: str, topic: str, n: int, batched: bool, size: int, start_at: float) -> dict:
    """One producer process: its own client, n messages with send_async; returns counts and end time."""
    client = pulsar.Client(url, operation_timeout_seconds=60,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(
            topic, batching_enabled=batched, batching_max_messages=1000, batching_max_publish_delay_ms=5,
            max_pending_messages=5000, block_if_queue_full=True, send_timeout_millis=60000)
        payload = b"x" * size
        done = threading.Event()
        state = {"ok": 0, "err": 0, "n": 0}

        def cb(res, _mid):
            state["n"] += 1                   # callbacks run one at a time on the client's thread
            state["ok" if res == pulsar.Result.Ok else "err"] += 1
            if state["n"] == n:
                done.set()

        producer.send(payload)                # connected and the topic loaded before the clock starts
        while time.time() < start_at:
            time.sleep(0.001)
        t0 = time.perf_counter()
        for _ in range(n):
            producer.send_async(payload, cb)
        producer.flush()
        done.wait(300)
        return {"acked": state["ok"], "errors": state["err"], "seconds": time.perf_counter() - t0}
    finally:
        client.close()


def publish_throughput(url: str, topic: str, n: int, batched: bool, size: int, producers: int) -> dict:
    """n messages in all from `producers` processes (each its own client), on one topic."""
    ctx = multiprocessing.get_context("spawn")
    start_at = time.time() + 3.0             # time for the processes to start and connect
    with ctx.Pool(producers) as pool:
        parts = pool.starmap(_produce, [(url, topic, n // producers, batched, size, start_at)] * producers)
    acked = sum(p["acked"] for p in parts)
    seconds = max(p["seconds"] for p in parts)
    return {"messages": n // producers * producers, "producers": producers, "acked": acked,
            "errors": sum(p["errors"] for p in parts), "seconds": round(seconds, 3),
            "msg_per_s": round(acked / seconds),
            "per_producer_msg_per_s": [round(p["acked"] / p["seconds"]) for p in parts]}


def read_all(client, topic: str, n: int, size: int, *, reader: bool = False) -> dict:
    """Read n messages of `size` payload bytes from earliest with a Reader, or with a durable
    Exclusive subscription that acknowledges each one: messages, seconds, msg/s, MB/s of payload,
    time to the first message. (The loop touches no payload: it measures the delivery.)"""
    if reader:
        c = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=5000)
    else:
        c = client.subscribe(topic, f"bench-{uuid.uuid4().hex[:4]}", receiver_queue_size=5000,
                             initial_position=pulsar.InitialPosition.Earliest)
    got = 0
    t0 = time.perf_counter()
    first = None
    while got < n:
        try:
            msg = c.read_next(10000) if reader else c.receive(10000)
        except pulsar.Timeout:
            break
        if first is None:
            first = time.perf_counter() - t0
        if not reader:
            c.acknowledge(msg)
        got += 1
    dt = time.perf_counter() - t0
    c.close()
    return {"messages": got, "seconds": round(dt, 3), "msg_per_s": round(got / dt) if dt else 0,
            "mb_per_s": round(got * size / dt / 1e6, 2) if dt else 0,
            "first_message_s": round(first or 0.0, 3)}


def latency_at_rate(client, topic: str, rate: int, seconds: float, size: int) -> dict:
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000)
    payload = b"x" * size
    lat: list[float] = []
    lock = threading.Lock()
    total = int(rate * seconds)
    remaining = threading.Semaphore(0)

    def make_cb(t_send: float):
        def cb(res, _mid):
            if res == pulsar.Result.Ok:
                with lock:
                    lat.append((time.perf_counter() - t_send) * 1000)
            remaining.release()
        return cb

    t0 = time.perf_counter()
    for i in range(total):
        target = t0 + i / rate
        now = time.perf_counter()
        if target > now:
            time.sleep(target - now)
        producer.send_async(payload, make_cb(time.perf_counter()))
    for _ in range(total):
        remaining.acquire(timeout=60)
    producer.close()
    return {"rate": rate, "messages": total, "acked": len(lat),
            "p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2),
            "max_ms": round(max(lat), 2) if lat else None,
            "mean_ms": round(statistics.fmean(lat), 2) if lat else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=400_000, help="batched messages (all producers)")
    ap.add_argument("--unbatched", type=int, default=40_000, help="unbatched messages (all producers)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes")
    ap.add_argument("--producers", type=int, default=2,
                    help="producer processes for the throughput runs (one Python client process tops "
                         "out near 40k msg/s on its own callbacks; default 2)")
    ap.add_argument("--rate", type=int, default=500, help="msg/s for the latency run")
    ap.add_argument("--seconds", type=float, default=20, help="length of the latency run")
    ap.add_argument("--ensemble", type=int, default=3)
    ap.add_argument("--write-quorum", type=int, default=2)
    ap.add_argument("--ack-quorum", type=int, default=2)
    ap.add_argument("--dedup", action="store_true",
                    help="brokers deduplicate every topic (brokerDeduplicationEnabled)")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)

    spec = ClusterSpec(name=f"bn{uuid.uuid4().hex[:4]}", brokers=2, bookies=3, zookeepers=1,
                       ensemble=args.ensemble, write_quorum=args.write_quorum, ack_quorum=args.ack_quorum,
                       broker_config={"deduplication_enabled": True} if args.dedup else {})
    cluster = NetnsCluster(spec)
    results: dict = {"dedup": args.dedup, "ensemble": args.ensemble, "write_quorum": args.write_quorum,
                     "ack_quorum": args.ack_quorum, "payload_bytes": args.size}
    try:
        cluster.up()
        client = pulsar.Client(cluster.service_url, operation_timeout_seconds=60,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            t_b = f"persistent://public/default/bench-b-{uuid.uuid4().hex[:6]}"
            t_u = f"persistent://public/default/bench-u-{uuid.uuid4().hex[:6]}"
            t_l = f"persistent://public/default/bench-l-{uuid.uuid4().hex[:6]}"
            url = cluster.service_url
            results["batched"] = publish_throughput(url, t_b, args.messages, True, args.size, args.producers)
            results["consume_batched"] = read_all(client, t_b, results["batched"]["acked"], args.size)
            results["unbatched"] = publish_throughput(url, t_u, args.unbatched, False, args.size,
                                                      args.producers)
            results["latency"] = latency_at_rate(client, t_l, args.rate, args.seconds, args.size)
        finally:
            client.close()
    finally:
        cluster.down()

    b, u, l, c = results["batched"], results["unbatched"], results["latency"], results["consume_batched"]
    print(f"E/Qw/Qa {args.ensemble}/{args.write_quorum}/{args.ack_quorum}, {args.size}-byte messages"
          f"{', deduplication on' if args.dedup else ''}")
    print(f"  batched publish    {b['msg_per_s']:>8} msg/s  ({b['acked']}/{b['messages']} acked in {b['seconds']} s,"
          f" {b['producers']} producers: {b['per_producer_msg_per_s']})")
    print(f"  consume (batched)  {c['msg_per_s']:>8} msg/s  ({c['messages']} received)")
    print(f"  unbatched publish  {u['msg_per_s']:>8} msg/s  ({u['acked']}/{u['messages']} acked in {u['seconds']} s,"
          f" {u['producers']} producers: {u['per_producer_msg_per_s']})")
    print(f"  latency at {l['rate']} msg/s: p50 {l['p50_ms']} ms, p99 {l['p99_ms']} ms, max {l['max_ms']} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
