"""The broker's tail caches of recently added entries (the managed ledger's and the topic's, one
class): bounded in bytes and count and, as Pulsar's managed-ledger cache (managedLedgerCacheEvictionTimeThresholdMillis, https://pulsar.apache.org/reference/#/next/config/reference-configuration-broker),
in age, so that a read of an older entry goes to the bookies."""
from __future__ import annotations

import time

from clusters.broker.managed_ledger import EntryCache, Position


def test_entries_older_than_the_threshold_are_evicted():
    c = EntryCache(1 << 20, max_age_s=0.2)
    c.put(Position(1, 0), b"a")
    assert c.get(Position(1, 0)) == b"a"
    time.sleep(0.3)
    c.put(Position(1, 1), b"b")
    assert c.get(Position(1, 0)) is None and c.get(Position(1, 1)) == b"b"
    assert c.bytes == 1
    time.sleep(0.3)
    assert c.get(Position(1, 1)) is None and c.bytes == 0


def test_without_an_age_limit_only_size_evicts():
    c = EntryCache(3)
    for i in range(5):
        c.put(Position(1, i), b"x")
    assert [c.get(Position(1, i)) for i in range(5)] == [None, None, b"x", b"x", b"x"] and c.bytes == 3
    c.drop_ledger(1)
    assert c.bytes == 0 and c.get(Position(1, 4)) is None


def test_count_bound_and_opaque_values_with_their_own_size():
    c = EntryCache(1 << 20, max_entries=2)
    for i in range(3):
        c.put(Position(2, i), {"i": i}, size=10)
    assert c.get(Position(2, 0)) is None and c.get(Position(2, 2)) == {"i": 2}
    assert len(c) == 2 and c.bytes == 20
    c.put(Position(2, 2), {"i": 22}, size=5)          # replacing an entry does not count it twice
    assert c.bytes == 15 and c.get(Position(2, 2)) == {"i": 22}
    c.clear()
    assert len(c) == 0 and c.bytes == 0


def test_the_topic_cache_ages_out_like_the_managed_ledgers():
    """The topic's own cache (what dispatch reads first) takes the managed ledger's age limit, so an
    entry older than it is read from the bookies: a broker must not serve from memory what the bookies
    lost (the power-loss finding in docs/architecture.md)."""
    import asyncio
    from types import SimpleNamespace
    from clusters.broker.topic import Topic
    ml = SimpleNamespace(cfg=SimpleNamespace(cache_eviction_s=0.2))

    async def made() -> Topic:
        return Topic("persistent://public/default/t", ml, SimpleNamespace())
    t = asyncio.run(made())
    t._cache_put(Position(3, 0), b"a", None)
    t._cache_put(Position(3, 1), b"b", None)
    assert [p for p, _, _ in t.cached_run(Position(3, 0), 10)] == [Position(3, 0), Position(3, 1)]
    time.sleep(0.3)
    assert t.cached_run(Position(3, 0), 10) == [] and t.cached(Position(3, 1)) is None
