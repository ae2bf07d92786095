"""The broker's tail cache of recently added entries: bounded in bytes and, as Pulsar's managed-ledger
cache (managedLedgerCacheEvictionTimeThresholdMillis, https://pulsar.apache.org/reference/#/next/config/reference-configuration-broker),
in age, so that a read of an older entry goes to the bookies."""
from __future__ import annotations

import time

from clusters.broker.managed_ledger import Position, _TailCache


def test_entries_older_than_the_threshold_are_evicted():
    c = _TailCache(1 << 20, max_age_s=0.2)
    c.put(Position(1, 0), b"a")
    assert c.get(Position(1, 0)) == b"a"
    time.sleep(0.3)
    c.put(Position(1, 1), b"b")
    assert c.get(Position(1, 0)) is None and c.get(Position(1, 1)) == b"b"
    assert c.bytes == 1
    time.sleep(0.3)
    assert c.get(Position(1, 1)) is None and c.bytes == 0


def test_without_an_age_limit_only_size_evicts():
    c = _TailCache(3)
    for i in range(5):
        c.put(Position(1, i), b"x")
    assert [c.get(Position(1, i)) for i in range(5)] == [None, None, b"x", b"x", b"x"] and c.bytes == 3
    c.drop_ledger(1)
    assert c.bytes == 0 and c.get(Position(1, 4)) is None
