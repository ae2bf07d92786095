"""The conformance suite's cluster: real ZooKeeper, bookies and brokers in network namespaces,
driven only through the official `pulsar-client` and the brokers' admin HTTP API.

One cluster per test session (2 brokers, 3 bookies, E/Qw/Qa 3/2/2), shared by every test here;
each test uses its own topics (and its own namespace when it sets namespace policies), so tests
do not see each other. A test that kills a node restarts it before it returns (`restarted`).
Small ledgers (100 entries) so rollover, trimming and reads across ledgers happen in every test; the
compaction monitor checks thresholds every 2 s (Pulsar: 60 s) so a threshold test is short.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from typing import Any

import pytest

from clusters.deploy.netns import NetnsCluster
from tests.netns import netns_cluster, pulsar_client

BROKER_SETTINGS = {"max_entries_per_ledger": 100, "compaction_monitor_interval_s": 2.0}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/conformance/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def cluster():
    with netns_cluster("cf", brokers=2, bookies=3, zookeepers=1, ensemble=3, write_quorum=2,
                       ack_quorum=2, broker_config=dict(BROKER_SETTINGS)) as c:
        yield c


@pytest.fixture
def client(cluster):
    with pulsar_client(cluster.service_url) as c:
        yield c


@pytest.fixture
def namespace() -> str:
    """A namespace of its own (for tests that set namespace policies)."""
    return f"public/ns-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def topic() -> str:
    return f"persistent://public/default/c-{uuid.uuid4().hex[:10]}"


class Admin:
    """The admin HTTP API of the cluster's brokers, as Pulsar's REST clients call it.

    `call(method, path, body)` -> (status, parsed JSON or text). Any broker answers (requests for
    a topic another broker owns are forwarded or redirected as in Pulsar); `broker=` picks one."""

    def __init__(self, cluster: NetnsCluster):
        self.cluster = cluster

    def url(self, broker: int = 0) -> str:
        return self.cluster.admin_urls[broker]

    def call(self, method: str, path: str, body: Any = None, *, broker: int = 0,
             raw: bytes | None = None, timeout: float = 30.0) -> tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url(broker) + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text.decode(errors="replace")

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.call("GET", path, **kw)

    def put(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.call("PUT", path, body, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.call("POST", path, body, **kw)

    def delete(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.call("DELETE", path, **kw)

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, got = self.call(method, path, body, **kw)
        assert 200 <= status < 300, f"{method} {path} -> {status} {got}"
        return got


@pytest.fixture
def admin(cluster) -> Admin:
    return Admin(cluster)


def rest_path(topic: str) -> str:
    """persistent://t/ns/x -> persistent/t/ns/x (the topic part of /admin/v2 paths)."""
    domain, rest = topic.split("://", 1)
    return f"{domain}/{rest}"


def owner_of(admin: Admin, topic: str) -> str:
    """The broker node name serving `topic` (lookup through the admin API)."""
    got = admin.ok("GET", f"/lookup/v2/topic/{rest_path(topic)}")
    host = got["brokerUrl"].split("://", 1)[1].rsplit(":", 1)[0]
    for n in admin.cluster.nodes("broker"):
        if n.host == host:
            return n.name
    raise AssertionError(f"lookup answered {got}, not a broker of the cluster")


@contextmanager
def restarted(cluster: NetnsCluster, name: str):
    """Kill -9 `name` on entry (after the block's setup) and always start it again on exit."""
    try:
        cluster.kill(name)
        yield
    finally:
        if not cluster.is_alive(name):
            cluster.start(name)


def wait_for(pred, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
