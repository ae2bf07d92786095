"""Process entry point of one reference-system node: `python -m clusters.node CONFIG.json`.

Reads the node's config, sets up logging and uvloop, and runs the role's server until SIGTERM.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal
import sys

from clusters import config as node_config

# role -> module whose `async def serve(cfg, stop: asyncio.Event)` runs the node
SERVERS = {"bookie": "clusters.bookie.server", "broker": "clusters.broker.service"}


async def _main(cfg: node_config.NodeConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    module = importlib.import_module(SERVERS[cfg.role])
    await module.serve(cfg, stop)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clusters.node", description=__doc__)
    p.add_argument("config", help="the node's config.json")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    try:
        cfg = node_config.load(args.config)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format=f"%(asctime)s {cfg.name} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        pass
    asyncio.run(_main(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
