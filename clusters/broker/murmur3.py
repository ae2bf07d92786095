"""MurmurHash3 (x86, 32-bit), the hash Pulsar's brokers route sticky keys and failover consumers with.

`murmur3_32(data, seed)` is Austin Appleby's public-domain MurmurHash3_x86_32 (unsigned result).
`pulsar_hash(data)` is what Pulsar's `Murmur3_32Hash.getInstance().makeHash(bytes)` returns: the
seed-0 hash with the sign bit cleared, so always in [0, 2**31). `sticky_key_hash(key)` is the
Key_Shared slot of a key, `pulsar_hash(key) % 65536` (StickyKeyConsumerSelector.DEFAULT_RANGE_SIZE).
"""
from __future__ import annotations

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_M32 = 0xFFFFFFFF

KEY_HASH_RANGE = 65536          # 2 << 15, Pulsar's DEFAULT_RANGE_SIZE


def _mix_k1(k: int) -> int:
    k = (k * _C1) & _M32
    k = ((k << 15) | (k >> 17)) & _M32
    return (k * _C2) & _M32


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 of `data` (little-endian 4-byte blocks), as an unsigned 32-bit int."""
    h = seed & _M32
    n = len(data)
    end = n - (n & 3)
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        h ^= _mix_k1(k)
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    k = 0
    for j, b in enumerate(data[end:]):
        k |= b << (8 * j)            # unsigned bytes, as Pulsar's UnsignedBytes.toInt
    if n & 3:
        h ^= _mix_k1(k)
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h


def pulsar_hash(data: bytes | str) -> int:
    """Pulsar's Murmur3_32Hash.makeHash (and Murmur3Hash32.makeHash for strings, UTF-8)."""
    if isinstance(data, str):
        data = data.encode()
    return murmur3_32(data, 0) & 0x7FFFFFFF


def sticky_key_hash(key: bytes) -> int:
    """The Key_Shared hash slot of a sticky key, in [0, 65535]."""
    return pulsar_hash(key) % KEY_HASH_RANGE
