"""The broker's admin HTTP API against a real ZooKeeper: lookups (following redirects), health,
internal stats, and malformed requests answered with 4xx instead of a crash."""
from __future__ import annotations

import asyncio
import json
import socket

from clusters.broker.http import AdminHttpServer, http_get, parse_request_head
from clusters.broker.service import BrokerService
from clusters.config import BrokerConfig


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def make_broker(zk: str, i: int) -> tuple[BrokerService, AdminHttpServer]:
    """Ownership, the load manager (the broker's registration) and the admin API of a broker (no
    BookKeeper: lookups need only ZooKeeper)."""
    host = f"127.0.0.{i + 2}"
    cfg = BrokerConfig(name=f"broker-{i + 1}", host=host, port=free_port(host), http_port=free_port(host),
                       zk=zk, data_dir="/tmp",
                       # load reports every 0.1 s (Pulsar: 5 s), so placement sees each new bundle
                       load_balancer={"loadBalancerReportUpdateMinIntervalMillis": 100})
    svc = BrokerService(cfg)
    await svc.store.start()
    await svc.load_manager.start()
    return svc, await AdminHttpServer(svc).start()


async def get(url: str) -> tuple[int, object]:
    status, body = await http_get(url, 10.0)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode()


async def raw(host: str, port: int, data: bytes, eof: bool = False) -> bytes:
    """Send bytes (then half-close if eof) and read until the server closes."""
    r, w = await asyncio.open_connection(host, port)
    try:
        w.write(data)
        await w.drain()
        if eof:
            w.write_eof()
        return await asyncio.wait_for(r.read(), 10)
    finally:
        w.close()


def topic_in_other_bundle(svc: BrokerService, topic: str) -> str:
    return next(f"persistent://public/default/h{i}" for i in range(1000)
                if svc.ownership.bundle(f"persistent://public/default/h{i}") != svc.ownership.bundle(topic))


def test_lookup_health_and_redirects(zk):
    async def scenario():
        (a, ha), (b, hb) = [await make_broker(zk, i) for i in range(2)]
        try:
            base_a, base_b = a.config.web_url, b.config.web_url
            assert await get(f"{base_a}/admin/v2/brokers/health") == (200, "ok")
            assert await get(f"{base_b}/admin/v2/brokers/ready") == (200, "ok")

            # An authoritative lookup on A makes A the owner; every broker then answers A.
            t1 = "persistent://public/default/http-one"
            st, ans = await get(f"{base_a}/lookup/v2/topic/persistent/public/default/http-one?authoritative=true")
            assert st == 200
            assert ans == {"brokerUrl": a.config.service_url, "brokerUrlTls": "", "httpUrl": base_a,
                           "httpUrlTls": "", "nativeUrl": a.config.service_url}
            assert a.ownership.owns(t1)
            st, ans_b = await get(f"{base_b}/lookup/v2/topic/persistent/public/default/http-one")
            assert st == 200 and ans_b["brokerUrl"] == a.config.service_url and ans_b["httpUrl"] == base_a

            # An unowned bundle asked of A goes to the broker with the fewest bundles of the namespace
            # (B, once A's load report shows t1's bundle): the redirect is followed over HTTP, B
            # takes the bundle, and the answer names B.
            await asyncio.sleep(0.6)
            t2 = topic_in_other_bundle(a, t1)
            local = t2.rsplit("/", 1)[1]
            st, ans = await get(f"{base_a}/lookup/v2/topic/persistent/public/default/{local}")
            assert st == 200, ans
            assert ans["brokerUrl"] == b.config.service_url and ans["httpUrl"] == base_b
            assert b.ownership.owns(t2) and not a.ownership.owns(t2)

            # Partitioned-topic metadata (what the C++ client's HTTP lookup asks first).
            assert await get(f"{base_a}/admin/v2/persistent/public/default/{local}/partitions") == \
                (200, {"partitions": 0})

            # The redirect target is down: 503 with a reason, not a hang or a crash. (A takes a third
            # bundle first, so that B has the fewest bundles of the namespace for the fourth: the
            # placement's loadBalancerDistributeBundlesEvenlyEnabled.)
            await hb.close()

            def fresh(prefix: str) -> str:
                taken = set(a.ownership.owned) | set(b.ownership.owned)
                return next(f"{prefix}{i}" for i in range(1000)
                            if a.ownership.bundle(f"persistent://public/default/{prefix}{i}") not in taken)
            t3 = fresh("x")
            assert (await get(f"{base_a}/lookup/v2/topic/persistent/public/default/{t3}?authoritative=true"))[0] == 200
            await asyncio.sleep(0.6)              # A's report shows its second bundle
            t4 = fresh("y")
            st, ans = await get(f"{base_a}/lookup/v2/topic/persistent/public/default/{t4}")
            assert st == 503 and "did not answer" in ans["reason"], ans
            assert (await get(f"{base_a}/admin/v2/brokers/health"))[0] == 200
        finally:
            await ha.close()
            await hb.close()
            for s in (a, b):
                await s.load_manager.stop()
                await s.store.close()
    asyncio.run(scenario())


def test_internal_stats_from_zookeeper(zk):
    async def scenario():
        a, ha = await make_broker(zk, 0)
        try:
            base = a.config.web_url
            st, ans = await get(f"{base}/admin/v2/persistent/public/default/nothing/internalStats")
            assert st == 404 and ans["reason"] == "Topic persistent://public/default/nothing not found"
            path = "/managed-ledgers/public/default/persistent/stats-t"
            await a.store.create(path, json.dumps({"ledgers": [
                {"ledger_id": 3, "entries": 10, "size": 100, "timestamp": 1.0},
                {"ledger_id": 7, "entries": None, "size": 0, "timestamp": 2.0}]}).encode(), makepath=True)
            await a.store.create(f"{path}/sub", json.dumps({"mark_delete": [3, 4]}).encode())
            await a.store.create(f"{path}/sub2", json.dumps({
                "cursors_ledger_id": 9, "mark_delete": [3, 1], "individual_deleted": [[3, 2, 3, 4]]}).encode())
            st, ans = await get(f"{base}/admin/v2/persistent/public/default/stats-t/internalStats")
            assert st == 200
            assert [(l["ledgerId"], l["entries"]) for l in ans["ledgers"]] == [(3, 10), (7, None)]
            assert [l["metadata"] for l in ans["ledgers"]] == [None, None]      # no BookKeeper client here
            assert ans["numberOfEntries"] == 10 and ans["totalSize"] == 100
            assert ans["cursors"] == {
                "sub": {"markDeletePosition": "3:4", "individuallyDeletedMessages": "[]", "cursorLedger": -1},
                "sub2": {"markDeletePosition": "3:1", "individuallyDeletedMessages": "[(3:2..3:4]]",
                         "cursorLedger": 9}}
            assert ans["source"] == "zookeeper"
        finally:
            await ha.close()
            await a.load_manager.stop()
            await a.store.close()
    asyncio.run(scenario())


def test_malformed_requests_get_4xx_and_the_server_survives(zk):
    async def scenario():
        a, ha = await make_broker(zk, 0)
        host, port = a.config.host, a.config.http_port
        try:
            def status(resp: bytes) -> int:
                return int(resp.split(b" ", 2)[1])
            assert status(await raw(host, port, b"GARBAGE\r\n\r\n")) == 400
            assert status(await raw(host, port, b"GET /x HTTP/2.0\r\n\r\n")) == 505
            assert status(await raw(host, port, b"GET /x HTTP/1.1\r\nno colon here\r\n\r\n")) == 400
            assert status(await raw(host, port, b"GET /a%ff%fe HTTP/1.1\r\n\r\n")) == 400
            assert status(await raw(host, port, b"GET /x HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")) == 431
            assert status(await raw(host, port, b"POST /admin/v2/brokers/health HTTP/1.1\r\n"
                                                b"Connection: close\r\nContent-Length: 2\r\n\r\nhi")) == 405
            assert status(await raw(host, port, b"GET / HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n")) == 413
            assert status(await raw(host, port, b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")) == 501
            assert status(await raw(host, port, b"GET /nope HTTP/1.0\r\n\r\n")) == 404
            assert status(await raw(host, port, b"GET /lookup/v2/topic/no-such-domain/a/b/c HTTP/1.0\r\n\r\n")) == 404
            assert status(await raw(host, port, b"GET /lookup/v2/topic/persistent/a//c HTTP/1.0\r\n\r\n")) == 400
            assert status(await raw(host, port, b"GET /admin/v2/bro", eof=True)) == 400   # torn request
            assert await raw(host, port, b"", eof=True) == b""                          # no request at all
            # Two requests on one kept-alive connection, then an explicit close.
            both = await raw(host, port, b"GET /admin/v2/brokers/health HTTP/1.1\r\n\r\n"
                                         b"HEAD /admin/v2/brokers/health HTTP/1.1\r\nConnection: close\r\n\r\n")
            assert both.count(b"HTTP/1.1 200 OK") == 2 and both.endswith(b"\r\n\r\n")
            assert await get(f"{a.config.web_url}/admin/v2/brokers/health") == (200, "ok")
        finally:
            await ha.close()
            await a.load_manager.stop()
            await a.store.close()
    asyncio.run(scenario())


def test_request_head_parser():
    req = parse_request_head(b"GET /lookup/v2/topic/persistent/p/d/a%2Fb?authoritative=true HTTP/1.0\r\n"
                             b"Connection: keep-alive\r\nHost: x\r\n\r\n")
    assert req.segments == ["lookup", "v2", "topic", "persistent", "p", "d", "a/b"]
    assert req.flag("authoritative") and req.keep_alive and req.headers["host"] == "x"
    assert not parse_request_head(b"GET / HTTP/1.0\r\n\r\n").keep_alive
