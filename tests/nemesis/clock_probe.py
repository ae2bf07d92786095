"""A stand-in node process for the clock tests: started by the netns backend exactly as a bookie
(same `_spawn`, so under libfaketime when the role has a fake clock), it reports its clocks over
HTTP and keeps threads, sleeps, an asyncio (uvloop) loop and a kazoo session busy, so a test sees
whether a skewed clock breaks any of them.

    python tests/nemesis/clock_probe.py HOST PORT ZK_CONNECT
    GET /  ->  {"time", "datetime", "monotonic", "sleeps", "loop_ticks", "zk_state", "zk_ok",
                "zk_errors", "ld_preload", "sleep_func"}
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

counts = {"sleeps": 0, "loop_ticks": 0, "zk_ok": 0, "zk_errors": 0}
zk = None


def sleeper() -> None:
    while True:
        time.sleep(0.05)
        counts["sleeps"] += 1


def looper() -> None:
    import uvloop

    async def tick() -> None:
        while True:
            await asyncio.wait_for(asyncio.sleep(0.05), 5)
            counts["loop_ticks"] += 1
    uvloop.run(tick())


def zk_user(hosts: str) -> None:
    global zk
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=hosts, timeout=6.0)
    zk.start(20)
    while True:
        try:
            zk.exists("/")
            counts["zk_ok"] += 1
        except Exception:  # noqa: BLE001 - counted
            counts["zk_errors"] += 1
        time.sleep(0.2)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"time": time.time(), "datetime": datetime.now(timezone.utc).timestamp(),
                           "monotonic": time.monotonic(), **counts,
                           "zk_state": str(zk.state) if zk is not None else None,
                           "ld_preload": os.environ.get("LD_PRELOAD", ""),
                           "sleep_func": getattr(time.sleep, "__name__", "?")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    host, port, hosts = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    for target, args in ((sleeper, ()), (looper, ()), (zk_user, (hosts,))):
        threading.Thread(target=target, args=args, daemon=True).start()
    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main()
