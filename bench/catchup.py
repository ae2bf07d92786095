"""Catch-up read benchmark: read 1,000,000 messages of a topic from earliest, with the broker's cache cold.

Starts a cluster in network namespaces (E/Qw/Qa 3/2/2), publishes N batched messages with two
producer processes (as bench/pubsub.py), then restarts every broker so the topic loads on a broker
with an empty tail cache, and reads the whole topic from earliest: once with a Reader (non-durable
cursor) and once with a durable Exclusive subscription that acknowledges every message. Entries
come from the bookies (each entry from one bookie of its write set, through the bookies' read
cache and entry logs). Prints msg/s and MB/s, and the bookies' read-cache hit/miss counters.

    .venv/bin/python bench/catchup.py [--messages 1000000] [--size 100] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import uuid

import pulsar

from bench.pubsub import publish_throughput, read_all
from clusters.deploy.netns import ClusterSpec, NetnsCluster
from clusters.metrics import scrape


def bookie_cache(cluster: NetnsCluster) -> dict:
    hits = misses = 0.0
    for n in cluster.nodes("bookie"):
        m = scrape(f"http://{n.host}:{n.ports['http']}")
        hits += m.get("bookie_read_cache_hits_total", 0.0)
        misses += m.get("bookie_read_cache_misses_total", 0.0)
    return {"hits": int(hits), "misses": int(misses)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100, help="payload bytes")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)

    spec = ClusterSpec(name=f"bc{uuid.uuid4().hex[:4]}", brokers=2, bookies=3, zookeepers=1,
                       ensemble=3, write_quorum=2, ack_quorum=2)
    cluster = NetnsCluster(spec)
    results: dict = {"payload_bytes": args.size}
    try:
        cluster.up()
        topic = f"persistent://public/default/catchup-{uuid.uuid4().hex[:6]}"
        results["publish"] = publish_throughput(cluster.service_url, topic, args.messages, True, args.size,
                                                args.producers)
        n = results["publish"]["acked"]
        for b in cluster.nodes("broker"):          # cold broker caches: the topic loads afresh
            cluster.stop(b.name)
            cluster.start(b.name)
        before = bookie_cache(cluster)
        client = pulsar.Client(cluster.service_url, operation_timeout_seconds=60,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            results["reader"] = read_all(client, topic, n, args.size, reader=True)
            results["subscription"] = read_all(client, topic, n, args.size, reader=False)
        finally:
            client.close()
        after = bookie_cache(cluster)
        results["bookie_read_cache"] = {k: after[k] - before[k] for k in after}
    finally:
        cluster.down()
    p, r, s = results["publish"], results["reader"], results["subscription"]
    print(f"published {p['acked']} x {args.size} B batched at {p['msg_per_s']} msg/s")
    print(f"  reader from earliest        {r['msg_per_s']:>8} msg/s  {r['mb_per_s']} MB/s  "
          f"({r['messages']} in {r['seconds']} s, first after {r['first_message_s']} s)")
    print(f"  subscription, acking each   {s['msg_per_s']:>8} msg/s  {s['mb_per_s']} MB/s  "
          f"({s['messages']} in {s['seconds']} s)")
    print(f"  bookie read cache: {results['bookie_read_cache']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0 if r["messages"] == n and s["messages"] == n else 1


if __name__ == "__main__":
    sys.exit(main())
