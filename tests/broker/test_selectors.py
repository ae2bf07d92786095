"""Murmur3 and the consumer selectors (clusters/broker/murmur3.py, selectors.py) against their specs."""
from __future__ import annotations

import itertools

import pytest

from clusters.broker.murmur3 import murmur3_32, pulsar_hash, sticky_key_hash
from clusters.broker.selectors import (AutoSplitSelector, ConsumerAssignError, StickySelector,
                                       partition_index, pick_active)


# MurmurHash3_x86_32 reference vectors (SMHasher / the published test set)
@pytest.mark.parametrize("data,seed,expected", [
    (b"", 0, 0),
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\xff\xff\xff\xff", 0, 0x76293B50),
    (b"\x21\x43\x65\x87", 0, 0xF55B516B),
    (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
    (b"\x21\x43\x65", 0, 0x7E4A8634),
    (b"\x21\x43", 0, 0xA0F7B07A),
    (b"\x21", 0, 0x72661CF4),
    (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
    (b"hello", 0, 0x248BFA47),
    (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    (b"The quick brown fox jumps over the lazy dog", 0, 0x2E4FF723),
])
def test_murmur3_reference_vectors(data, seed, expected):
    assert murmur3_32(data, seed) == expected


def test_pulsar_hash_clears_the_sign_bit_and_key_slots_fit_the_range():
    assert murmur3_32(b"\xff\xff\xff\xff") >> 31 == 0 and pulsar_hash(b"\xff\xff\xff\xff") == 0x76293B50
    # a hash with the top bit set (0xF55B516B) loses it, as Murmur3_32Hash.makeHash does
    assert pulsar_hash(b"\x21\x43\x65\x87") == 0x755B516B
    assert pulsar_hash("hello") == pulsar_hash(b"hello")
    assert sticky_key_hash(b"\x21\x43\x65\x87") == 0x755B516B % 65536
    assert all(0 <= sticky_key_hash(f"k{i}".encode()) < 65536 for i in range(1000))


class C:
    def __init__(self, name: str, priority: int = 0):
        self.name, self.priority = name, priority

    def __repr__(self) -> str:
        return self.name


def test_auto_split_halves_the_largest_range_and_merges_on_removal():
    s = AutoSplitSelector()
    a, b, c, d = C("a"), C("b"), C("c"), C("d")
    s.add(a)
    assert s.ranges() == {a: [(0, 65536)]}
    s.add(b)                                   # the newcomer takes the lower half
    assert s.ranges() == {b: [(0, 32768)], a: [(32769, 65536)]}
    s.add(c)                                   # a tie: the first largest range in slot order
    assert s.ranges() == {c: [(0, 16384)], b: [(16385, 32768)], a: [(32769, 65536)]}
    s.add(d)
    assert s.ranges()[d] == [(32769, 49152)] and s.ranges()[a] == [(49153, 65536)]
    assert [s.select(h) for h in (0, 16384, 16385, 32768, 32769, 49152, 49153, 65535)] == \
        [c, c, b, b, d, d, a, a]
    assert s.select(65536 + 5) is c            # slot = hash % 65536
    s.remove(a)                                # the topmost range goes to the consumer below
    assert s.ranges() == {c: [(0, 16384)], b: [(16385, 32768)], d: [(32769, 65536)]}
    s.remove(c)                                # any other range to the consumer above
    assert s.ranges() == {b: [(0, 32768)], d: [(32769, 65536)]}
    s.remove(b)
    s.remove(d)
    assert s.select(7) is None and len(s) == 0


def test_auto_split_refuses_a_consumer_when_no_range_can_be_split():
    s = AutoSplitSelector(range_size=4)
    s.add(C("a"))
    s.add(C("b"))
    s.add(C("c"))
    s.add(C("d"))
    with pytest.raises(ConsumerAssignError, match="No more range"):
        s.add(C("e"))


def test_sticky_ranges_are_exclusive_and_uncovered_hashes_have_no_consumer():
    s = StickySelector()
    a, b = C("a"), C("b")
    s.add(a, [(0, 99), (200, 299)])
    with pytest.raises(ConsumerAssignError, match="Range conflict with consumer a"):
        s.add(b, [(50, 150)])
    with pytest.raises(ConsumerAssignError, match="start > end"):
        s.add(b, [(10, 5)])
    with pytest.raises(ConsumerAssignError, match="must not be empty"):
        s.add(b, [])
    s.add(b, [(100, 199)])
    assert [s.select(h) for h in (0, 99, 100, 199, 200, 299, 300)] == [a, a, b, b, a, a, None]
    s.remove(a)
    assert s.select(0) is None and s.select(150) is b


def test_failover_active_consumer_is_deterministic():
    names = ["c-3", "a-1", "b-2", "d-4"]
    topic = "persistent://public/default/fo"
    first = pick_active([C(n) for n in names], topic)
    for perm in itertools.permutations(names):         # join order does not matter
        assert pick_active([C(n) for n in perm], topic).name == first.name
    # a partition of a partitioned topic: index partition % n over (priority, name)
    for p in range(8):
        t = f"persistent://public/default/fo-partition-{p}"
        assert partition_index(t) == p
        assert pick_active([C(n) for n in names], t).name == sorted(names)[p % 4]
    # only the best (lowest) priority level competes
    cs = [C("a", 1), C("b", 0), C("c", 1)]
    assert pick_active(cs, topic).name == "b"
    assert pick_active(cs, "persistent://public/default/x-partition-5").name == "b"
    assert partition_index(topic) == -1 and pick_active([], topic) is None
    # the hash ring spreads topics over the consumers
    chosen = {pick_active([C(n) for n in names], f"persistent://public/default/t{i}").name
              for i in range(200)}
    assert chosen == set(names)


def test_consistent_hashing_selector_ring():
    """ConsistentHashingStickyKeyConsumerSelector: 100 points per consumer at the sticky-key hash of
    name NUL index NUL i; a hash goes to the first point at or after it (wrapping); removing a
    consumer gives its hashes to the others and leaves the rest where they were."""
    from clusters.broker.murmur3 import sticky_key_hash
    from clusters.broker.selectors import ConsistentHashSelector

    class C:
        def __init__(self, name):
            self.name = name

    a, b, c = C("a"), C("b"), C("c")
    s = ConsistentHashSelector()
    s.add(a)
    assert {s.select(h) for h in range(0, 65536, 97)} == {a}
    s.add(b)
    s.add(c)
    points: dict = {}
    for x in (a, b, c):                 # a point two consumers share stays with the first
        for i in range(100):
            points.setdefault(sticky_key_hash(f"{x.name}\0{0}\0{i}".encode()), x)
    ring = sorted(points)
    for h in range(0, 65536, 331):
        want = next((p for p in ring if p >= h), ring[0])
        assert s.select(h) is points[want]
    before = {h: s.select(h) for h in range(0, 65536, 331)}
    s.remove(b)
    for h, owner in before.items():
        assert s.select(h) is (owner if owner is not b else s.select(h)) and s.select(h) is not b
    same = C("a")                       # a second consumer named "a" gets name index 1
    s.add(same)
    assert len(s) == 3
    assert any(s.select(h) is same for h in range(0, 65536, 7))
