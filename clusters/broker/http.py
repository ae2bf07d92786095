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
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger(__name__)

MAX_HEAD = 16 * 1024                 # request line + headers
MAX_BODY = 64 * 1024
MAX_RESPONSE = 1024 * 1024           # what we read back when following a redirect
MAX_CONNECTIONS = 256
HEAD_TIMEOUT = 10.0                  # to receive a request's head once it started
IDLE_TIMEOUT = 30.0                  # a kept-alive connection with no new request
HOP_TIMEOUT = 8.0                    # asking the broker a lookup was redirected to
ZK_READ_TIMEOUT = 3.0
MAX_REDIRECTS = 2
BROKERS_PATH = "/loadbalance/brokers"
ML_ROOT = "/managed-ledgers"


class HttpError(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Request:
    __slots__ = ("method", "path", "segments", "query", "version", "headers", "keep_alive")

    def __init__(self, method: str, path: str, segments: list[str], query: dict[str, list[str]],
                 version: str, headers: dict[str, str], keep_alive: bool):
        self.method = method
        self.path = path
        self.segments = segments
        self.query = query
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive

    def flag(self, name: str) -> bool:
        values = self.query.get(name)
        return bool(values) and values[-1].strip().lower() in ("true", "1", "yes")


class _Response:
    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int, body: Any, content_type: str | None = None,
                 headers: dict[str, str] | None = None):
        self.status = status
        if isinstance(body, (bytes, bytearray)):
            self.body = bytes(body)
            self.content_type = content_type or "application/octet-stream"
        elif isinstance(body, str):
            self.body = body.encode()
            self.content_type = content_type or "text/plain; charset=utf-8"
        else:
            self.body = json.dumps(body).encode()
            self.content_type = content_type or "application/json"
        self.headers = headers or {}


def _error(status: int, reason: str) -> _Response:
    return _Response(status, {"reason": reason})


def parse_request_head(head: bytes) -> _Request:
    """Parse `METHOD target HTTP/1.x` and headers; HttpError(400...) on anything malformed."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise HttpError(400, "undecodable request") from None
    lines = text.split("\r\n")
    while lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise HttpError(400, "empty request")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not all(parts):
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise HttpError(505 if version.startswith("HTTP/") else 400, f"unsupported version {version[:16]!r}")
    if not method.isalpha() or not method.isupper():
        raise HttpError(400, "malformed method")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise HttpError(400, "malformed header line")
        headers[name.lower()] = value.strip()
    if any(ord(c) < 0x21 or ord(c) > 0x7e for c in target):
        raise HttpError(400, "malformed request target")
    try:
        split = urlsplit(target)
    except ValueError:
        raise HttpError(400, "malformed request target") from None
    path = split.path
    if not path.startswith("/"):
        raise HttpError(400, "request target must be an absolute path")
    try:
        segments = [unquote(s, errors="strict") if "%" in s else s for s in path.split("/")[1:]]
    except UnicodeDecodeError:
        raise HttpError(400, "malformed percent-encoding in path") from None
    try:
        query = parse_qs(split.query, keep_blank_values=True, max_num_fields=32)
    except ValueError:
        raise HttpError(400, "malformed query string") from None
    conn = headers.get("connection", "").lower()
    if version == "HTTP/1.1":
        keep_alive = "close" not in conn
    else:
        keep_alive = "keep-alive" in conn
    return _Request(method, path, segments, query, version, headers, keep_alive)


class AdminHttpServer:
    """The admin HTTP server of one broker (a BrokerService: config, store, lookup(), topics)."""

    def __init__(self, service: Any):
        self.service = service
        self.cfg = service.config
        self.server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self.server is not None and self.server.sockets
        return self.server.sockets[0].getsockname()[1]

    async def start(self, host: str | None = None, port: int | None = None) -> "AdminHttpServer":
        host = self.cfg.host if host is None else host
        port = self.cfg.http_port if port is None else port
        self.server = await asyncio.start_server(self._serve_connection, host, port, limit=MAX_HEAD,
                                                 reuse_address=True)
        log.info("admin HTTP on %s:%d", host, self.port)
        return self

    async def close(self) -> None:
        if self.server is None:
            return
        self.server.close()
        for w in list(self._connections):
            w.close()
        try:
            await asyncio.wait_for(self.server.wait_closed(), 2.0)
        except (asyncio.TimeoutError, Exception):
            pass
        self.server = None

    # -- connections ----------------------------------------------------------------
    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= MAX_CONNECTIONS:
            try:
                await self._send(writer, _error(503, "too many connections"), keep_alive=False, head_only=False)
            except ConnectionError:
                pass
            writer.close()
            return
        self._connections.add(writer)
        try:
            first = True
            while True:
                req, resp = await self._read_request(reader, first)
                first = False
                if req is None and resp is None:
                    return                          # the client closed (or idled out) between requests
                if resp is None:
                    assert req is not None
                    resp = await self._respond(req)
                keep = req is not None and req.keep_alive
                await self._send(writer, resp, keep_alive=keep,
                                 head_only=req is not None and req.method == "HEAD")
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception:  # never let one connection take the server down
            log.warning("admin HTTP connection failed", exc_info=True)
        finally:
            self._connections.discard(writer)
            try:
                writer.close()
            except Exception:
                pass

    async def _read_request(self, reader: asyncio.StreamReader,
                            first: bool) -> tuple[_Request | None, _Response | None]:
        """(request, None) to dispatch, (None/request, response) to answer at once, (None, None) to close."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                          HEAD_TIMEOUT if first else IDLE_TIMEOUT)
        except asyncio.IncompleteReadError as e:
            if not e.partial.strip():
                return None, None
            return None, _error(400, "incomplete request")
        except asyncio.LimitOverrunError:
            return None, _error(431, f"request head larger than {MAX_HEAD} bytes")
        except asyncio.TimeoutError:
            return None, None if not first else _error(408, "request not received in time")
        except ValueError:          # the limit was hit inside readuntil
            return None, _error(431, f"request head larger than {MAX_HEAD} bytes")
        try:
            req = parse_request_head(head)
        except HttpError as e:
            return None, _error(e.status, e.reason)
        if "transfer-encoding" in req.headers:
            return None, _error(501, "chunked request bodies are not supported")
        length_s = req.headers.get("content-length", "0") or "0"
        if not length_s.isdigit():
            return None, _error(400, "malformed Content-Length")
        length = int(length_s)
        if length > MAX_BODY:
            return None, _error(413, f"request body larger than {MAX_BODY} bytes")
        if length:
            try:
                await asyncio.wait_for(reader.readexactly(length), HEAD_TIMEOUT)
            except asyncio.IncompleteReadError:
                return None, _error(400, "incomplete request body")
            except asyncio.TimeoutError:
                return None, _error(408, "request body not received in time")
        return req, None

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, resp: _Response, *, keep_alive: bool, head_only: bool) -> None:
        try:
            phrase = HTTPStatus(resp.status).phrase
        except ValueError:
            phrase = "Status"
        lines = [f"HTTP/1.1 {resp.status} {phrase}", f"Content-Type: {resp.content_type}",
                 f"Content-Length: {len(resp.body)}", "Connection: " + ("keep-alive" if keep_alive else "close")]
        lines.extend(f"{k}: {v}" for k, v in resp.headers.items())
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(resp.body)
        await writer.drain()

    # -- routing ----------------------------------------------------------------------
    async def _respond(self, req: _Request) -> _Response:
        if req.method not in ("GET", "HEAD"):
            return _Response(405, {"reason": f"method {req.method} not allowed"}, headers={"Allow": "GET, HEAD"})
        try:
            return await self._route(req)
        except HttpError as e:
            return _error(e.status, e.reason)
        except Exception as e:
            log.warning("admin HTTP %s failed", req.path, exc_info=True)
            return _error(500, f"{type(e).__name__}: {e}")

    async def _route(self, req: _Request) -> _Response:
        s = req.segments
        if s[:3] == ["admin", "v2", "brokers"] and len(s) == 4:
            if s[3] == "health":
                return _Response(200, "ok")
            if s[3] == "ready":
                if self.service.store.connected:
                    return _Response(200, "ok")
                return _error(503, "no ZooKeeper session")
        if s[:3] == ["lookup", "v2", "topic"] and len(s) >= 7:
            topic = self._topic(s[3], s[4:])
            return _Response(200, await self.lookup(topic, req.flag("authoritative")))
        if s[:2] == ["admin", "v2"] and len(s) >= 7 and s[-1] in ("partitions", "internalStats"):
            topic = self._topic(s[2], s[3:-1])
            if s[-1] == "partitions":
                return _Response(200, {"partitions": 0})
            return _Response(200, await self.internal_stats(topic))
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


async def http_get(url: str, timeout: float) -> tuple[int, bytes]:
    """A minimal HTTP/1.1 GET (one request, Connection: close): (status, body). Bounded in time and size."""
    async def go() -> tuple[int, bytes]:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"not an http URL: {url!r}")
        reader, writer = await asyncio.open_connection(u.hostname, u.port or 80, limit=MAX_RESPONSE)
        try:
            target = u.path + (f"?{u.query}" if u.query else "")
            writer.write(f"GET {target} HTTP/1.1\r\nHost: {u.netloc}\r\nAccept: application/json\r\n"
                         f"Connection: close\r\n\r\n".encode("latin-1"))
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise ValueError(f"malformed status line {status_line[:80]!r}")
            length = None
            for line in header_lines:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length" and v.strip().isdigit():
                    length = int(v.strip())
            if length is not None:
                if length > MAX_RESPONSE:
                    raise ValueError("response too large")
                body = await reader.readexactly(length)
            else:
                body = await reader.read(MAX_RESPONSE)
            return int(parts[1]), body
        finally:
            writer.close()
    return await asyncio.wait_for(go(), timeout)


async def serve_http(service: Any) -> AdminHttpServer:
    """Start the admin HTTP server of a BrokerService on its config's host:http_port."""
    return await AdminHttpServer(service).start()
