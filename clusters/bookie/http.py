"""A bookie's HTTP port (BookKeeper's `httpServerPort`): metrics and state for operators and the harness.

    GET /metrics                 Prometheus text format (clusters/metrics.py), bookie_* series
    GET /heartbeat               200 "OK" while the process serves
    GET /api/v1/bookie/state     {"bookieId", "running", "readOnly", "ledgers", "journal": {...},
                                  "writeCacheBytes", "readCacheBytes", "adds", "reads", "fences"}
    GET /api/v1/bookie/list_ledgers   {"ledgers": [ids]} held by this bookie
"""
from __future__ import annotations

from typing import Any

from clusters.httpd import HttpError, HttpServer, Request, Response
from clusters.metrics import CONTENT_TYPE, REGISTRY


class BookieHttpServer(HttpServer):
    NAME = "bookie HTTP"

    def __init__(self, bookie: Any):
        super().__init__(bookie.cfg.host, bookie.cfg.http_port)
        self.bookie = bookie
        b = bookie
        # the bookie counts its requests in `stats` anyway; the series read them at scrape time
        REGISTRY.counter("bookie_adds_total", "entries added (acknowledged or about to be)",
                         fn=lambda: b.stats["adds"])
        REGISTRY.counter("bookie_reads_total", "entry reads served", fn=lambda: b.stats["reads"])
        REGISTRY.counter("bookie_fences_total", "ledgers fenced by recovery reads", fn=lambda: b.stats["fences"])
        REGISTRY.gauge("bookie_ledgers", "ledgers held by this bookie", fn=lambda: len(b.storage.ledgers))
        REGISTRY.gauge("bookie_journal_queue_records", "journal records waiting to be written",
                       fn=lambda: b.journal.queued)
        REGISTRY.gauge("bookie_write_cache_bytes", "bytes in the write cache (not yet checkpointed)",
                       fn=lambda: b.storage._cache_bytes)
        REGISTRY.gauge("bookie_read_cache_bytes", "bytes in the read cache",
                       fn=lambda: b.storage._read_cache.bytes)
        REGISTRY.gauge("bookie_connections", "client connections", fn=lambda: len(b.conns))

    async def route(self, req: Request) -> Response:
        s = req.segments
        if s == ["metrics"]:
            return Response(200, REGISTRY.render(), content_type=CONTENT_TYPE)
        if s == ["heartbeat"]:
            return Response(200, "OK\n")
        if s == ["api", "v1", "bookie", "state"]:
            b = self.bookie
            return Response(200, {
                "bookieId": b.cfg.bookie_id, "running": not b._stopping, "readOnly": False,
                "ledgers": len(b.storage.ledgers), "journal": dict(b.journal.stats),
                "writeCacheBytes": b.storage._cache_bytes, "readCacheBytes": b.storage._read_cache.bytes,
                **b.stats})
        if s == ["api", "v1", "bookie", "list_ledgers"]:
            return Response(200, {"ledgers": sorted(self.bookie.storage.ledgers)})
        raise HttpError(404, f"no such resource: {req.path[:200]}; try /metrics, /heartbeat, "
                             f"/api/v1/bookie/state or /api/v1/bookie/list_ledgers")
