"""The schema admin paths go to the topic's owner, as Pulsar's SchemasResourceBase validates topic
ownership (validateTopicOwnershipAsync) before each operation: a broker that does not own the topic
forwards the request instead of answering from the registry itself (no cluster)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from clusters.broker.http import AdminHttpServer
from clusters.httpd import Request, Response

T = "persistent://public/default/s-0"


class _Registry:
    def __getattr__(self, name):
        raise AssertionError(f"the registry was asked ({name}) by a broker that does not own the topic")


def _server(owns: bool):
    svc = SimpleNamespace(config=SimpleNamespace(host="127.0.0.1", http_port=0), schemas=_Registry(),
                          ownership=SimpleNamespace(owns=lambda topic: owns))
    srv = AdminHttpServer(svc)
    sent = []

    async def forward(req, topic):
        sent.append((req.method, req.path, topic))
        return None if owns else Response(200, {"from": "owner"})
    srv._forward_to_owner = forward
    return srv, sent


@pytest.mark.parametrize("method, what", [("GET", "schema"), ("POST", "schema"), ("DELETE", "schema"),
                                          ("GET", "schema/3"), ("GET", "schemas"), ("POST", "compatibility"),
                                          ("POST", "version")])
def test_a_non_owner_forwards_every_schema_operation(method, what):
    srv, sent = _server(owns=False)
    path = f"/admin/v2/schemas/public/default/s-0/{what}"
    req = Request(method, path, path.strip("/").split("/"), {}, "HTTP/1.1", {}, False,
                  b'{"type": "JSON", "schema": "{}"}' if method == "POST" else b"")
    resp = asyncio.run(srv.route(req))
    assert resp.status == 200 and sent == [(method, path, T)]
