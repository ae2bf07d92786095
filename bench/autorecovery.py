"""Time from a bookie's death to full re-replication by auto-recovery (not a pytest test).

    .venv/bin/python -m bench.autorecovery [--ledgers 40] [--entries 1000] [--size 1024]
                                           [--bookies 4] [--session-timeout 2] [--delay 0]

Starts a local ZooKeeper and `--bookies` bookie processes on loopback with auto-recovery inside
them (as deployed), writes `--ledgers` closed ledgers (E/Qw/Qa 3/2/2) through the BookKeeper
client, kills -9 the bookie that holds the most ledgers, and measures from the kill:

  * unregistered: the bookie's ZooKeeper session expired (its /ledgers/available znode is gone);
  * marked:       the auditor marked the first ledger under-replicated (+ lostBookieRecoveryDelay);
  * done:         no ledger has a fragment on the dead bookie and nothing is marked any more;

then checks every entry of every ledger on each bookie of its write set (2 identical copies on live
bookies) and reports entries copied per second over the replication phase (marked -> done), from
the bookies' own bookkeeper_autorecovery_* counters.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from clusters import zookeeper
from clusters.autorecovery.check import check_all_copies, connect, replication_state
from clusters.bookkeeper.admin import fragments
from clusters.metrics import scrape
from tests.bookie.cluster import Bookies


def metrics(proc) -> dict[str, float]:
    return scrape(f"http://127.0.0.1:{proc.cfg.http_port}")


async def run(zk: str, cluster: Bookies, args) -> dict:
    procs = cluster.procs
    async with connect(zk, "bench") as (_store, bk, urm):
        while len(await bk.available_bookies()) < args.bookies:
            await asyncio.sleep(0.05)
        payload = b"x" * args.size
        t0 = time.monotonic()
        sem = asyncio.Semaphore(args.ledgers_in_flight)

        async def one_ledger() -> int:
            async with sem:
                lh = await bk.create_ledger(3, 2, 2)
                await asyncio.gather(*[lh.add_entry_async(payload) for _ in range(args.entries)])
                await lh.close()
                return lh.ledger_id
        lids = await asyncio.gather(*[one_ledger() for _ in range(args.ledgers)])
        print(f"wrote {len(lids)} ledgers x {args.entries} entries x {args.size} B in "
              f"{time.monotonic() - t0:.1f}s")
        mds = {lid: await bk.ledger_metadata(lid) for lid in lids}
        victim = max(procs, key=lambda p: sum(p.addr in md.bookies() for md in mds.values()))
        held = [md for md in mds.values() if victim.addr in md.bookies()]
        to_copy = sum(len(f.entries_of(f.ensemble.index(victim.addr), md.ensemble_size, md.write_quorum))
                      for md in held for f in fragments(md) if victim.addr in f.ensemble)
        live_procs = [p for p in procs if p is not victim]
        before = sum(metrics(p).get("bookkeeper_autorecovery_entries_copied_total", 0)
                     for p in live_procs)
        print(f"killing {victim.name} ({victim.addr}): {len(held)} ledgers, {to_copy} entries "
              f"({to_copy * args.size / 1e6:.1f} MB) to re-replicate")
        victim.kill9()
        t_kill = time.monotonic()
        t_unreg = t_marked = None
        while True:
            now = time.monotonic() - t_kill
            if t_unreg is None and victim.addr not in await bk.available_bookies():
                t_unreg = now
            st = await replication_state(bk, urm, {victim.addr})
            if t_marked is None and st["marked"]:
                t_marked = now
            if not st["on_lost"] and not st["marked"]:
                t_done = time.monotonic() - t_kill
                break
            if now > args.timeout:
                raise SystemExit(f"not re-replicated after {args.timeout}s: {st}")
            await asyncio.sleep(0.05)
        copied = sum(metrics(p).get("bookkeeper_autorecovery_entries_copied_total", 0)
                     for p in live_procs) - before
        t_marked = t_marked if t_marked is not None else t_done
        phase = max(1e-6, t_done - t_marked)
        live = {p.addr for p in live_procs}
        t1 = time.monotonic()
        report = await check_all_copies(bk, live)
        result = {
            "ledgers": len(lids), "entries_per_ledger": args.entries, "entry_size": args.size,
            "bookies": args.bookies, "session_timeout_s": args.session_timeout,
            "lost_bookie_recovery_delay_s": args.delay, "ledgers_on_victim": len(held),
            "entries_to_copy": to_copy, "entries_copied": int(copied),
            "unregistered_s": round(t_unreg or 0, 2), "first_marked_s": round(t_marked, 2),
            "done_s": round(t_done, 2), "replication_phase_s": round(phase, 2),
            "entries_per_s": round(copied / phase), "mb_per_s": round(copied * args.size / phase / 1e6, 1),
            "check": {"ledgers": report["ledgers"], "entries": report["entries"],
                      "copies": report["copies"], "problems": len(report["problems"])},
        }
        print(f"kill -> unregistered {result['unregistered_s']}s -> first ledger marked "
              f"{result['first_marked_s']}s -> all {len(held)} ledgers re-replicated "
              f"{result['done_s']}s; copied {int(copied)} entries in {phase:.2f}s = "
              f"{result['entries_per_s']:,} entries/s ({result['mb_per_s']} MB/s)")
        print(f"check ({time.monotonic() - t1:.1f}s): {report['entries']} entries of "
              f"{report['ledgers']} ledgers, {report['copies']} copies on live bookies, "
              f"{len(report['problems'])} problems {report['problems'][:3]}")
        return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ledgers", type=int, default=40)
    p.add_argument("--entries", type=int, default=1000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--bookies", type=int, default=4)
    p.add_argument("--session-timeout", type=float, default=2.0, help="bookies' ZooKeeper session")
    p.add_argument("--delay", type=float, default=0.0, help="lost_bookie_recovery_delay_s")
    p.add_argument("--ledgers-in-flight", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args()
    import uvloop
    with tempfile.TemporaryDirectory() as tmp:
        zk = zookeeper.LocalZooKeeper(Path(tmp) / "zk")
        zk.start()
        cluster = Bookies(zk.connect_string, Path(tmp))
        try:
            cluster.start(args.bookies, zk_session_timeout=args.session_timeout,
                          lost_bookie_recovery_delay_s=args.delay, rereplication_backoff_s=0.5)
            result = uvloop.run(run(zk.connect_string, cluster, args))
        finally:
            cluster.kill_all()
            zk.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if result["check"]["problems"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
