"""A small asyncio HTTP/1.1 server and client (no dependencies), shared by every node's HTTP port.

Brokers serve their admin API on it (`clusters/broker/http.py`), bookies their `/metrics` and
status (`clusters/bookie/http.py`). Requests are bounded (16 KiB of head, 1 MiB of body,
timeouts); malformed ones get a 4xx with a JSON body `{"reason": ...}`, never a crash.
Connections are kept alive unless the client asks otherwise.

A server subclasses `HttpServer` and implements `route(req) -> Response`, raising `HttpError`
for anything the client got wrong.
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
MAX_BODY = 1024 * 1024
MAX_RESPONSE = 8 * 1024 * 1024       # what the client reads back
MAX_CONNECTIONS = 256
HEAD_TIMEOUT = 10.0                  # to receive a request's head once it started
IDLE_TIMEOUT = 30.0                  # a kept-alive connection with no new request


class HttpError(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Request:
    __slots__ = ("method", "path", "segments", "query", "version", "headers", "keep_alive", "body")

    def __init__(self, method: str, path: str, segments: list[str], query: dict[str, list[str]],
                 version: str, headers: dict[str, str], keep_alive: bool, body: bytes = b""):
        self.method = method
        self.path = path
        self.segments = segments
        self.query = query
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive
        self.body = body

    def flag(self, name: str) -> bool:
        values = self.query.get(name)
        return bool(values) and values[-1].strip().lower() in ("true", "1", "yes")

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default

    def int_arg(self, name: str, default: int) -> int:
        v = self.arg(name)
        if v is None:
            return default
        try:
            return int(v)
        except ValueError:
            raise HttpError(400, f"query parameter {name!r} must be an integer, got {v[:40]!r}") from None

    def json(self) -> Any:
        """The body as JSON; 400 naming the problem when it is missing or malformed."""
        if not self.body.strip():
            raise HttpError(400, "this request needs a JSON body")
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as e:
            raise HttpError(400, f"malformed JSON body: {e}") from None


class Response:
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


def error(status: int, reason: str) -> Response:
    return Response(status, {"reason": reason})


def parse_request_head(head: bytes) -> Request:
    """Parse `METHOD target HTTP/1.x` and headers; HttpError(400...) on anything malformed."""
    text = head.decode("latin-1")
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
    if segments and segments[-1] == "":
        segments.pop()                 # a trailing slash names the same resource
    try:
        query = parse_qs(split.query, keep_blank_values=True, max_num_fields=32)
    except ValueError:
        raise HttpError(400, "malformed query string") from None
    conn = headers.get("connection", "").lower()
    if version == "HTTP/1.1":
        keep_alive = "close" not in conn
    else:
        keep_alive = "keep-alive" in conn
    return Request(method, path, segments, query, version, headers, keep_alive)


class HttpServer:
    """Connection handling; subclasses implement `route`. `METHODS` are the methods it accepts."""

    METHODS: tuple[str, ...] = ("GET", "HEAD")
    NAME = "HTTP"

    def __init__(self, host: str, port: int):
        self.host = host
        self.bind_port = port
        self.server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self.server is not None and self.server.sockets
        return self.server.sockets[0].getsockname()[1]

    async def start(self, host: str | None = None, port: int | None = None) -> "HttpServer":
        host = self.host if host is None else host
        port = self.bind_port if port is None else port
        self.server = await asyncio.start_server(self._serve_connection, host, port, limit=MAX_HEAD,
                                                 reuse_address=True)
        log.info("%s on %s:%d", self.NAME, host, self.port)
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

    async def route(self, req: Request) -> Response:
        raise HttpError(404, f"no such resource: {req.path[:200]}")

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= MAX_CONNECTIONS:
            try:
                await self._send(writer, error(503, "too many connections"), keep_alive=False, head_only=False)
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
            log.warning("%s connection failed", self.NAME, exc_info=True)
        finally:
            self._connections.discard(writer)
            try:
                writer.close()
            except Exception:
                pass

    async def _read_request(self, reader: asyncio.StreamReader,
                            first: bool) -> tuple[Request | None, Response | None]:
        """(request, None) to dispatch, (None/request, response) to answer at once, (None, None) to close."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                          HEAD_TIMEOUT if first else IDLE_TIMEOUT)
        except asyncio.IncompleteReadError as e:
            if not e.partial.strip():
                return None, None
            return None, error(400, "incomplete request")
        except asyncio.LimitOverrunError:
            return None, error(431, f"request head larger than {MAX_HEAD} bytes")
        except asyncio.TimeoutError:
            return None, None if not first else error(408, "request not received in time")
        except ValueError:          # the limit was hit inside readuntil
            return None, error(431, f"request head larger than {MAX_HEAD} bytes")
        try:
            req = parse_request_head(head)
        except HttpError as e:
            return None, error(e.status, e.reason)
        if "transfer-encoding" in req.headers:
            return None, error(501, "chunked request bodies are not supported")
        length_s = req.headers.get("content-length", "0") or "0"
        if not length_s.isdigit():
            return None, error(400, "malformed Content-Length")
        length = int(length_s)
        if length > MAX_BODY:
            return None, error(413, f"request body larger than {MAX_BODY} bytes")
        if length:
            try:
                req.body = await asyncio.wait_for(reader.readexactly(length), HEAD_TIMEOUT)
            except asyncio.IncompleteReadError:
                return None, error(400, "incomplete request body")
            except asyncio.TimeoutError:
                return None, error(408, "request body not received in time")
        return req, None

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, resp: Response, *, keep_alive: bool, head_only: bool) -> None:
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

    async def _respond(self, req: Request) -> Response:
        if req.method not in self.METHODS:
            allowed = ", ".join(self.METHODS)
            return Response(405, {"reason": f"method {req.method} not allowed; use one of {allowed}"},
                            headers={"Allow": allowed})
        try:
            return await self.route(req)
        except HttpError as e:
            return error(e.status, e.reason)
        except Exception as e:
            log.warning("%s %s %s failed", self.NAME, req.method, req.path, exc_info=True)
            return error(500, f"{type(e).__name__}: {e}")


async def http_request(method: str, url: str, timeout: float, body: Any = None) -> tuple[int, bytes]:
    """One HTTP/1.1 request (Connection: close): (status, body). `body` is sent as JSON unless it is
    bytes. Bounded in time and size."""
    async def go() -> tuple[int, bytes]:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"not an http URL: {url!r}")
        payload = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        reader, writer = await asyncio.open_connection(u.hostname, u.port or 80, limit=MAX_RESPONSE)
        try:
            target = u.path + (f"?{u.query}" if u.query else "")
            head = (f"{method} {target} HTTP/1.1\r\nHost: {u.netloc}\r\nAccept: application/json\r\n"
                    f"Connection: close\r\n")
            if payload or method in ("POST", "PUT"):
                head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            writer.write(head.encode("latin-1") + b"\r\n" + payload)
            await writer.drain()
            resp_head = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = resp_head.decode("latin-1").split("\r\n")
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
                data = await reader.readexactly(length)
            else:
                data = await reader.read(MAX_RESPONSE)
            return int(parts[1]), data
        finally:
            writer.close()
    return await asyncio.wait_for(go(), timeout)


async def http_get(url: str, timeout: float) -> tuple[int, bytes]:
    return await http_request("GET", url, timeout)
