"""Namespace policies in ZooKeeper: Pulsar-shaped JSON, validation, broker defaults, watches."""
from __future__ import annotations

import asyncio

import pytest

from clusters.broker.policies import NamespacePolicies, PolicyCache, PolicyError
from clusters.config import BrokerConfig
from clusters.metadata.store import MetadataStore


def cfg(zk: str = "x", **kw) -> BrokerConfig:
    return BrokerConfig(name="b", host="127.0.0.1", zk=zk, data_dir="/tmp", **kw)


def test_defaults_come_from_broker_config():
    p = NamespacePolicies.defaults(cfg(default_retention_minutes=5, deduplication_enabled=True))
    assert (p.retention_time_minutes, p.deduplication, p.ensemble) == (5, True, 3)


@pytest.mark.parametrize("raw, problem", [
    ({"retention_policies": {"retentionTimeInMinutes": "x"}}, "retentionTimeInMinutes"),
    ({"retention_policies": {"retentionSizeInMB": -2}}, "retentionSizeInMB"),
    ({"message_ttl_in_seconds": -1}, "message_ttl_in_seconds"),
    ({"deduplicationEnabled": "yes"}, "deduplicationEnabled"),
    ({"persistence": {"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 3}}, "bookkeeperEnsemble"),
    ([], "object"),
])
def test_bad_policies_are_refused_with_the_field(raw, problem):
    with pytest.raises(PolicyError, match=problem):
        NamespacePolicies.from_json(raw, NamespacePolicies())


def test_update_merges_persists_and_reaches_other_brokers(zk):
    async def go():
        a, b = MetadataStore(zk), MetadataStore(zk)
        await a.start()
        await b.start()
        try:
            ca, cb = PolicyCache(a, cfg(zk)), PolicyCache(b, cfg(zk))
            assert (await cb.get("t/ns")).message_ttl_seconds == 0
            seen = []
            cb.on_change(lambda ns, p: seen.append((ns, p.message_ttl_seconds)))
            await ca.update("t/ns", {"message_ttl_in_seconds": 30})
            await ca.update("t/ns", {"deduplicationEnabled": True})
            for _ in range(100):
                if cb.cached("t/ns").deduplication:
                    break
                await asyncio.sleep(0.05)
            got = cb.cached("t/ns")
            assert (got.message_ttl_seconds, got.deduplication) == (30, True)
            assert ("t/ns", 30) in seen
            await ca.update("t/ns", {"message_ttl_in_seconds": None})       # remove: back to default
            assert (await ca.get("t/ns")).message_ttl_seconds == 0
            with pytest.raises(PolicyError):
                await ca.update("t/ns", {"message_ttl_in_seconds": "soon"})
        finally:
            await a.close()
            await b.close()
    asyncio.run(go())
