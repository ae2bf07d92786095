"""The broker's admin HTTP API: topic lookup, health, readiness and internal stats on `http_port`.

A small asyncio HTTP/1.1 server (no dependencies) with Pulsar's REST paths, so operators and the
harness reach a broker the way they would reach a real one.

Routes (GET or HEAD):

    /lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}[?authoritative=true]
        200 {"brokerUrl", "brokerUrlTls", "httpUrl", "httpUrlTls", "nativeUrl"}: the owner, found by
        the same lookup as the binary protocol. A redirect is followed here (the target broker is
        asked with authoritative=true, so it takes the bundle), so the answer is the final owner.
        400 bad topic name, 404 non-persistent, 503 {"reason"} when no owner can be found now.
    /admin/v2/brokers/health          200 "ok" while the process serves
    /admin/v2/brokers/ready           200 "ok" with a ZooKeeper session, else 503
    /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions      {"partitions": 0}
    /admin/v2/persistent/{tenant}/{namespace}/{topic}/internalStats   the managed ledger's ledgers
        and cursors (this broker's in-memory view when it serves the topic, else ZooKeeper's)

Requests are bounded (16 KiB of head, 64 KiB of body, timeouts); malformed ones get 400, never a
crash. Connections are kept alive unless the client asks otherwise.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from clusters.httpd import (HttpError, HttpServer, Request, Response, error, http_get, http_request,  # noqa: F401
                            parse_request_head)

log = logging.getLogger(__name__)

HOP_TIMEOUT = 8.0                    # asking the broker a lookup was redirected to
ZK_READ_TIMEOUT = 3.0
MAX_REDIRECTS = 2
BROKERS_PATH = "/loadbalance/brokers"
ML_ROOT = "/managed-ledgers"


class AdminHttpServer(HttpServer):
    """The admin HTTP server of one broker (a BrokerService: config, store, lookup(), topics)."""

    NAME = "admin HTTP"

    def __init__(self, service: Any):
        super().__init__(service.config.host, service.config.http_port)
        self.service = service
        self.cfg = service.config

    # -- routing ----------------------------------------------------------------------
    async def route(self, req: Request) -> Response:
        s = req.segments
        if s[:3] == ["admin", "v2", "brokers"] and len(s) == 4:
            if s[3] == "health":
                return Response(200, "ok")
            if s[3] == "ready":
                if self.service.store.connected:
                    return Response(200, "ok")
                return error(503, "no ZooKeeper session")
        if s[:3] == ["lookup", "v2", "topic"] and len(s) >= 7:
            topic = self._topic(s[3], s[4:])
            return Response(200, await self.lookup(topic, req.flag("authoritative")))
        if s[:2] == ["admin", "v2"] and len(s) >= 7 and s[-1] in ("partitions", "internalStats"):
            topic = self._topic(s[2], s[3:-1])
            if s[-1] == "partitions":
                return Response(200, {"partitions": 0})
            return Response(200, await self.internal_stats(topic))
        raise HttpError(404, f"no such resource: {req.path[:200]}")

    @staticmethod
    def _topic(domain: str, parts: list[str]) -> str:
        if domain == "non-persistent":
            raise HttpError(404, "non-persistent topics are not supported by this broker")
        if domain != "persistent":
            raise HttpError(404, f"unknown topic domain {domain[:40]!r}")
        if len(parts) < 3 or not all(parts):
            raise HttpError(400, "expected {tenant}/{namespace}/{topic}")
        return f"persistent://{'/'.join(parts)}"

    # -- lookup -----------------------------------------------------------------------
    async def lookup(self, topic: str, authoritative: bool = False) -> dict[str, str]:
        res = await self.service.lookup(topic, authoritative)
        if res.kind == "connect":
            return {"brokerUrl": res.url, "brokerUrlTls": "", "httpUrl": await self.web_url_of(res.url),
                    "httpUrlTls": "", "nativeUrl": res.url}
        if res.kind == "redirect":
            return await self._follow(topic, res.url)
        status = 400 if res.error == "InvalidTopicName" else 503
        raise HttpError(status, res.message or res.error or "lookup failed")

    async def _follow(self, topic: str, service_url: str) -> dict[str, str]:
        """Ask the broker a lookup was redirected to, authoritatively: it takes the bundle and answers."""
        web = await self.web_url_of(service_url)
        rest = topic.split("://", 1)[1]
        url = f"{web}/lookup/v2/topic/persistent/{rest}?authoritative=true"
        try:
            status, body = await http_get(url, HOP_TIMEOUT)
        except Exception as e:
            raise HttpError(503, f"lookup redirected to {service_url}, which did not answer: "
                                 f"{type(e).__name__}: {e}") from None
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if status == 200 and isinstance(data, dict) and isinstance(data.get("brokerUrl"), str):
            return data
        reason = data.get("reason") if isinstance(data, dict) else body[:200].decode(errors="replace")
        raise HttpError(503, f"lookup redirected to {service_url}, which answered {status}: {reason}")

    async def web_url_of(self, service_url: str) -> str:
        """The admin URL of the broker serving `pulsar://host:port` (from its registration znode)."""
        if service_url == self.cfg.service_url:
            return self.cfg.web_url
        hostport = service_url.split("://", 1)[-1].rstrip("/")
        try:
            got = await asyncio.wait_for(self.service.store.get_or_none(f"{BROKERS_PATH}/{hostport}"),
                                         ZK_READ_TIMEOUT)
            if got is not None:
                web = json.loads(got[0]).get("web_url")
                if isinstance(web, str) and web.startswith("http"):
                    return web
        except Exception:
            pass                   # no ZooKeeper now: every broker of a cluster shares the port
        host = hostport.rsplit(":", 1)[0]
        return f"http://{host}:{self.cfg.http_port}"

    # -- internal stats ----------------------------------------------------------------
    async def internal_stats(self, topic: str) -> dict[str, Any]:
        rest = topic.split("://", 1)[1]
        tenant, namespace, local = rest.split("/", 2)
        ml_name = f"{tenant}/{namespace}/persistent/{local}"
        loaded = self.service.topics.get(topic)
        ml = getattr(loaded, "ml", None)
        if ml is not None:
            ledgers = [_ledger_json(i.to_json()) for i in ml.ledgers]
            lc = ml.last_confirmed
            cursors = {name: {"markDeletePosition": _pos(c.mark_delete_position)}
                       for name, c in ml.cursors.items()}
            state = getattr(ml, "_state", "unknown")
            source = "memory"
        else:
            path = f"{ML_ROOT}/{ml_name}"
            try:
                got = await asyncio.wait_for(self.service.store.get_or_none(path), ZK_READ_TIMEOUT)
                if got is None:
                    raise HttpError(404, f"topic {topic} has no managed ledger")
                raw = json.loads(got[0] or b"{}")
                ledgers = [_ledger_json(i) for i in raw.get("ledgers", [])]
                cursors = {}
                for name in await asyncio.wait_for(self.service.store.children(path), ZK_READ_TIMEOUT):
                    c = await asyncio.wait_for(self.service.store.get_or_none(f"{path}/{name}"), ZK_READ_TIMEOUT)
                    if c is not None:
                        md = json.loads(c[0] or b"{}").get("mark_delete")
                        cursors[name] = {"markDeletePosition": f"{md[0]}:{md[1]}" if md else "-1:-1"}
            except HttpError:
                raise
            except Exception as e:
                raise HttpError(503, f"cannot read {path} from ZooKeeper: {type(e).__name__}: {e}") from None
            lc = None
            state = "not loaded on this broker"
            source = "zookeeper"
        known = [i for i in ledgers if i["entries"] is not None]
        return {
            "topic": topic, "broker": self.cfg.name, "source": source, "state": state,
            "lastConfirmedEntry": _pos(lc),
            "numberOfEntries": sum(i["entries"] for i in known),
            "totalSize": sum(i["size"] for i in ledgers),
            "ledgers": ledgers, "cursors": cursors,
        }


def _pos(p: Any) -> str:
    return f"{p.ledger_id}:{p.entry_id}" if p is not None else "-1:-1"


def _ledger_json(i: dict[str, Any]) -> dict[str, Any]:
    return {"ledgerId": int(i["ledger_id"]), "entries": i.get("entries"), "size": int(i.get("size") or 0),
            "timestamp": i.get("timestamp", 0)}


async def serve_http(service: Any) -> AdminHttpServer:
    """Start the admin HTTP server of a BrokerService on its config's host:http_port."""
    return await AdminHttpServer(service).start()
