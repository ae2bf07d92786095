"""A subscription created by the admin API before any consumer (Pulsar's createSubscription: PUT
.../{topic}/subscription/{name}, at the latest position by default), without a network: the in-memory
broker of tests/broker/memory.py behind the real admin router."""
from __future__ import annotations

from clusters.broker.http import AdminHttpServer
from clusters.httpd import HttpError, Request
from tests.broker.helpers import FakeCnx, run
from tests.broker.memory import MemoryBrokerService
from tests.broker.test_topic import _send, _settle, _subscribe_cmd

T = "persistent://public/default/t"
PATH = "/admin/v2/persistent/public/default/t/subscription/"


async def _put(srv: AdminHttpServer, sub: str, body: bytes = b"") -> int:
    path = PATH + sub
    req = Request("PUT", path, path.strip("/").split("/"), {}, "HTTP/1.1", {}, False, body)
    try:
        return (await srv.route(req)).status
    except HttpError as e:
        return e.status


async def _server() -> tuple[AdminHttpServer, MemoryBrokerService]:
    svc = MemoryBrokerService()
    await svc.get_topic(T)
    srv = AdminHttpServer(svc)

    async def owner_is_here(req, topic):
        return None
    srv._forward_to_owner = owner_is_here
    return srv, svc


def test_create_subscription_at_latest_then_conflict_and_positions():
    async def scenario():
        srv, svc = await _server()
        topic = svc.topics[T]
        cnx = FakeCnx()
        p = await topic.add_producer(cnx, 0, "p")
        for i in range(3):
            _send(topic, p, i)
        await _settle()
        before = [r[2] for r in cnx.receipts]
        assert await _put(srv, "ahead") == 204
        assert await _put(srv, "ahead") == 409                 # exists: Pulsar's 409 Conflict
        assert await _put(srv, "from-start", b'{"ledgerId": -1, "entryId": -1}') == 204
        assert await _put(srv, "elsewhere", b'{"ledgerId": 3, "entryId": 4}') == 400
        assert await _put(srv, "bad", b'[1]') == 400
        assert "elsewhere" not in topic.subscriptions and "bad" not in topic.subscriptions
        for i in range(3, 5):
            _send(topic, p, i)
        await _settle()
        after = [r[2] for r in cnx.receipts][3:]
        # a consumer that comes later (asking for the earliest) gets what was sent after the creation
        for name, want in (("ahead", after), ("from-start", before + after)):
            c = await topic.subscribe(cnx, _subscribe_cmd(name, 10 + len(name), earliest=True))
            c.sub.flow(c, 100)
            await _settle()
            got = [m[1] for m in cnx.messages if m[0] == c.consumer_id]
            assert got == want, (name, got, want)
    run(scenario())

