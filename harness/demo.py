"""`pulsar-chaos demo`: bring a cluster up, produce and consume through it with pulsar-client, tear it down.

The smallest end-to-end proof that the reference system works; `make run` runs it until the chaos
runner exists.
"""
from __future__ import annotations

import argparse
import sys
import time
import uuid

from clusters.deploy.netns import ClusterSpec, NetnsCluster


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--messages", type=int, default=2000, help="messages to send (default 2000)")
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--bookies", type=int, default=3)
    p.add_argument("--zookeepers", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")


def pubsub(service_url: str, n: int, topic: str, out=sys.stdout) -> tuple[int, int]:
    """Send n messages (half batched), read them back; returns (acknowledged, received in order)."""
    import pulsar
    client = pulsar.Client(service_url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        consumer = client.subscribe(topic, "demo", consumer_type=pulsar.ConsumerType.Exclusive,
                                    initial_position=pulsar.InitialPosition.Earliest)
        t0 = time.monotonic()
        acked = 0
        batched = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5)
        plain = client.create_producer(topic)
        half = n // 2
        results: list = []
        for i in range(half):
            batched.send_async(f"{i}".encode(), lambda res, _id: results.append(res))
        batched.flush()
        acked += sum(1 for r in results if r == pulsar.Result.Ok)
        for i in range(half, n):
            plain.send(f"{i}".encode())
            acked += 1
        print(f"sent {acked}/{n} messages in {time.monotonic() - t0:.1f}s", file=out)
        got = []
        while len(got) < n:
            try:
                msg = consumer.receive(timeout_millis=10000)
            except pulsar.Timeout:
                break
            got.append(int(msg.data()))
            consumer.acknowledge(msg)
        in_order = got == list(range(n))
        print(f"received {len(got)}/{n} messages, {'in order' if in_order else 'OUT OF ORDER'}", file=out)
        return acked, len(got) if in_order else -1
    finally:
        client.close()


def run(args: argparse.Namespace) -> int:
    spec = ClusterSpec(name=f"demo{uuid.uuid4().hex[:4]}", brokers=args.brokers, bookies=args.bookies,
                       zookeepers=args.zookeepers)
    cluster = NetnsCluster(spec)
    ok = False
    try:
        print(f"starting cluster {spec.name}: {args.zookeepers} ZooKeeper, {args.bookies} bookies, "
              f"{args.brokers} brokers")
        cluster.up()
        print(f"service URL {cluster.service_url}")
        acked, received = pubsub(cluster.service_url, args.messages,
                                 f"persistent://public/default/demo-{uuid.uuid4().hex[:6]}")
        ok = acked == args.messages and received == args.messages
    finally:
        if args.keep and ok:
            print(f"cluster {spec.name} left up; `pulsar-chaos cluster down --name {spec.name}` removes it")
        else:
            cluster.down()
            print(f"cluster {spec.name} removed; node logs under {spec.base_dir}")
    print("demo: OK" if ok else "demo: FAILED")
    return 0 if ok else 1
