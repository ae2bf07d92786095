"""Which consumer gets what, as Pulsar's brokers decide it.

- `AutoSplitSelector`: Key_Shared AUTO_SPLIT with Pulsar's HashRangeAutoSplitStickyKeyConsumerSelector.
  The hash space is 65536 slots; a consumer owns the slots up to (and including) its range's upper
  bound. The first consumer owns [0, 65536]; each new one takes the lower half of the largest range
  (the first largest in slot order on a tie); a leaving consumer's range goes to the consumer above
  it, or, for the topmost range, to the consumer below.
- `ConsistentHashSelector`: Key_Shared AUTO_SPLIT with Pulsar's default (subscriptionKeySharedUse
  ConsistentHashing=true) ConsistentHashingStickyKeyConsumerSelector: each consumer puts 100 points
  (subscriptionKeySharedConsistentHashingReplicaPoints) on a ring at the sticky-key hash of
  `name NUL nameIndex NUL i` (nameIndex tells apart consumers of the same name); a key hash goes to
  the first point at or after it, wrapping around; a point two consumers share keeps the first one
  and passes to the next when it leaves.
- `StickySelector`: Key_Shared STICKY with HashRangeExclusiveStickyKeyConsumerSelector: each consumer
  declares its ranges; overlapping declarations are refused; a hash nobody declared has no consumer.
- `pick_active`: the active consumer of a Failover subscription, as
  AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer does it: consumers sorted by
  priority level then name; only the best priority level competes; a partition of a partitioned
  topic goes to index `partition % n`, a non-partitioned topic to the consumer whose point on a
  consistent-hash ring (100 points per consumer, Murmur3 of name + i) follows the topic name's hash.

Selectors work on any objects with `name` and `priority` attributes (the broker's Consumer).
"""
from __future__ import annotations

import bisect
from typing import Any, Iterable, Sequence

from clusters.broker.murmur3 import KEY_HASH_RANGE, pulsar_hash
from clusters.protocol import topics

CONSUMER_CONSISTENT_HASH_REPLICAS = 100


class ConsistentHashSelector:
    def __init__(self, points: int = CONSUMER_CONSISTENT_HASH_REPLICAS):
        self.points = points
        self._ring: dict[int, list[Any]] = {}       # point -> consumers (the first is selected)
        self._keys: list[int] = []                  # sorted points
        self._index: dict[Any, int] = {}            # consumer -> its name index

    def __len__(self) -> int:
        return len(self._index)

    def _points(self, c: Any, idx: int) -> list[int]:
        from clusters.broker.murmur3 import sticky_key_hash
        return [sticky_key_hash(f"{c.name}\0{idx}\0{i}".encode()) for i in range(self.points)]

    def add(self, c: Any) -> None:
        used = {i for o, i in self._index.items() if o.name == c.name}
        idx = next(i for i in range(len(used) + 1) if i not in used)
        self._index[c] = idx
        for h in self._points(c, idx):
            owners = self._ring.get(h)
            if owners is None:
                self._ring[h] = [c]
                bisect.insort(self._keys, h)
            elif c not in owners:
                owners.append(c)

    def remove(self, c: Any) -> None:
        idx = self._index.pop(c, None)
        if idx is None:
            return
        for h in self._points(c, idx):
            owners = self._ring.get(h)
            if owners is None:
                continue
            owners[:] = [o for o in owners if o is not c]
            if not owners:
                del self._ring[h]
                i = bisect.bisect_left(self._keys, h)
                if i < len(self._keys) and self._keys[i] == h:
                    del self._keys[i]

    def select(self, h: int) -> Any:
        keys = self._keys
        if not keys:
            return None
        i = bisect.bisect_left(keys, h)
        return self._ring[keys[i if i < len(keys) else 0]][0]


class ConsumerAssignError(Exception):
    """A Key_Shared consumer that cannot be given hash ranges (Pulsar's ConsumerAssignException)."""


class AutoSplitSelector:
    def __init__(self, range_size: int = KEY_HASH_RANGE):
        self.range_size = range_size
        self._bounds: list[int] = []            # ascending upper bounds
        self._owner: dict[int, Any] = {}        # upper bound -> consumer
        self._bound_of: dict[Any, int] = {}     # consumer -> its upper bound

    def __len__(self) -> int:
        return len(self._bounds)

    def add(self, c: Any) -> None:
        if not self._bounds:
            self._put(self.range_size, c)
            return
        # the largest range, the first one in slot order on a tie
        best, best_size, lower = self.range_size, 0, 0
        for b in self._bounds:
            if b - lower > best_size:
                best, best_size = b, b - lower
            lower = b
        i = self._bounds.index(best)
        lower = self._bounds[i - 1] if i > 0 else 0
        if best - lower <= 1:
            raise ConsumerAssignError(
                f"No more range can assigned to new consumer, assigned consumers {len(self._bounds)}")
        self._put(best - ((best - lower) >> 1), c)

    def remove(self, c: Any) -> None:
        b = self._bound_of.pop(c, None)
        if b is None:
            return
        i = bisect.bisect_left(self._bounds, b)
        if b == self.range_size and len(self._bounds) > 1:
            # the topmost range goes to the consumer right below it
            below = self._bounds[i - 1]
            heir = self._owner.pop(below)
            del self._bounds[i - 1]
            self._owner[b] = heir
            self._bound_of[heir] = b
        else:
            del self._bounds[i]
            del self._owner[b]

    def select(self, h: int) -> Any | None:
        if not self._bounds:
            return None
        slot = h % self.range_size
        return self._owner[self._bounds[bisect.bisect_left(self._bounds, slot)]]

    def ranges(self) -> dict[Any, list[tuple[int, int]]]:
        """Each consumer's inclusive [start, end] slot ranges (Pulsar's getConsumerKeyHashRanges)."""
        out: dict[Any, list[tuple[int, int]]] = {}
        start = 0
        for b in self._bounds:
            out.setdefault(self._owner[b], []).append((start, b))
            start = b + 1
        return out

    def _put(self, bound: int, c: Any) -> None:
        bisect.insort(self._bounds, bound)
        self._owner[bound] = c
        self._bound_of[c] = bound


class StickySelector:
    def __init__(self, range_size: int = KEY_HASH_RANGE):
        self.range_size = range_size
        self._ranges: list[tuple[int, int, Any]] = []     # sorted by start

    def __len__(self) -> int:
        return len({id(c) for _, _, c in self._ranges})

    def add(self, c: Any, ranges: Sequence[tuple[int, int]]) -> None:
        if not ranges:
            raise ConsumerAssignError("Ranges for KeyShared policy must not be empty.")
        for start, end in ranges:
            if start > end:
                raise ConsumerAssignError("Fixed hash range start > end")
            for s, e, other in self._ranges:
                if s <= end and start <= e:
                    raise ConsumerAssignError(f"Range conflict with consumer {other.name}")
        for start, end in ranges:
            bisect.insort(self._ranges, (start, end, c), key=lambda r: (r[0], r[1]))

    def remove(self, c: Any) -> None:
        self._ranges = [r for r in self._ranges if r[2] is not c]

    def select(self, h: int) -> Any | None:
        slot = h % self.range_size
        i = bisect.bisect_right(self._ranges, slot, key=lambda r: r[0]) - 1
        if i >= 0:
            s, e, c = self._ranges[i]
            if s <= slot <= e:
                return c
        return None

    def ranges(self) -> dict[Any, list[tuple[int, int]]]:
        out: dict[Any, list[tuple[int, int]]] = {}
        for s, e, c in self._ranges:
            out.setdefault(c, []).append((s, e))
        return out


def partition_index(topic: str) -> int:
    """The partition number of a `...-partition-N` topic, -1 for a non-partitioned topic (as
    Pulsar's TopicName.getPartitionIndex)."""
    index = topics.partition_index(topic)
    return -1 if index is None else index


def failover_order(consumers: Iterable[Any]) -> list[Any]:
    """Pulsar's Failover order: priority level, then consumer name."""
    return sorted(consumers, key=lambda c: (c.priority, c.name))


def pick_active(consumers: Iterable[Any], topic: str) -> Any | None:
    """The consumer Pulsar makes active in a Failover subscription of `topic`."""
    cs = failover_order(consumers)
    if not cs:
        return None
    n = sum(1 for c in cs if c.priority == cs[0].priority)     # the best priority level only
    p = partition_index(topic)
    if p >= 0:
        return cs[p % n]
    ring: dict[int, int] = {}
    for i in range(n):
        for j in range(CONSUMER_CONSISTENT_HASH_REPLICAS):
            ring[pulsar_hash(f"{cs[i].name}{j}")] = i        # a later consumer wins a collision
    points = sorted(ring)
    h = pulsar_hash(topic)
    k = bisect.bisect_left(points, h)
    return cs[ring[points[k] if k < len(points) else points[0]]]
