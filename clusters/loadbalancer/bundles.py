"""Namespace bundles as Pulsar keeps them: hash ranges of topic names, with their boundaries in ZooKeeper.

A namespace's boundaries are a sorted list `[0x00000000, b1, ..., 0xffffffff]`; bundle i is the
half-open range `[b[i], b[i+1])`, the last one closed `[b[n-1], 0xffffffff]` (Pulsar's
`NamespaceBundles`). A topic belongs to the bundle holding the CRC-32 of its full name
(`NamespaceBundleFactory` with Guava's crc32, `ConsistentHashingTopicBundleAssigner`).

The boundaries live where Pulsar keeps them: the namespace policies `/admin/policies/<t>/<ns>`
(`bundles: {boundaries, numBundles}`, written when the namespace is created) and the per-cluster copy
`/admin/local-policies/<t>/<ns>`, which splits update by compare-and-set on its znode version
(`NamespaceBundleFactory.loadBundles`, `copyToLocalPolicies`, `NamespaceService.splitAndOwnBundle`).
A namespace nobody created (public/default in a fresh cluster) gets `defaultNumberOfNamespaceBundles`
equal ranges, written to both on first use, as Pulsar's cluster set-up does for public/default.
"""
from __future__ import annotations

import bisect
import json
import logging
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from clusters.metadata.codec import decode_json_object
from clusters.metadata.store import BadVersion, NodeExists

log = logging.getLogger(__name__)

FULL_LOWER = 0x00000000
FULL_UPPER = 0xFFFFFFFF
POLICIES_ROOT = "/admin/policies"
LOCAL_POLICIES_ROOT = "/admin/local-policies"
NAMESPACE_ROOT = "/namespace"            # ServiceUnitUtils.OWNER_INFO_ROOT: the ownership locks
MAX_BUNDLES = 1 << 32


class BundleError(ValueError):
    """A malformed bundle name, boundary list or split request (the admin API answers 4xx)."""


@dataclass(frozen=True, order=True)
class Bundle:
    """One hash range of a namespace: `[lower, upper)`, or `[lower, 0xffffffff]` for the last."""
    namespace: str     # tenant/namespace
    lower: int
    upper: int

    @property
    def range_name(self) -> str:
        return f"0x{self.lower:08x}_0x{self.upper:08x}"

    @property
    def path(self) -> str:
        """The ownership lock's znode."""
        return f"{NAMESPACE_ROOT}/{self.namespace}/{self.range_name}"

    @property
    def last(self) -> bool:
        return self.upper == FULL_UPPER

    def contains(self, h: int) -> bool:
        return self.lower <= h < self.upper or (self.last and h == FULL_UPPER)

    def overlaps(self, other: "Bundle") -> bool:
        if self.namespace != other.namespace:
            return False
        hi_a = self.upper + (1 if self.last else 0)
        hi_b = other.upper + (1 if other.last else 0)
        return self.lower < hi_b and other.lower < hi_a

    def splittable(self) -> bool:
        """Pulsar's `canSplitBundle`: at least two hash values inside."""
        return self.upper - self.lower > 1

    def __str__(self) -> str:
        return f"{self.namespace}/{self.range_name}"


def topic_namespace(topic: str) -> tuple[str, str]:
    """`persistent://public/default/t` -> ('public/default', 't')."""
    rest = topic.split("://", 1)[1] if "://" in topic else topic
    parts = rest.split("/")
    if len(parts) < 3 or not all(parts[:3]):
        raise ValueError(f"invalid topic name {topic!r}; expected persistent://tenant/namespace/topic")
    return f"{parts[0]}/{parts[1]}", "/".join(parts[2:])


def topic_hash(topic: str) -> int:
    """The unsigned CRC-32 of the full topic name (`persistent://t/ns/name-partition-3`)."""
    return zlib.crc32(topic.encode()) & 0xFFFFFFFF


def initial_boundaries(num_bundles: int) -> list[int]:
    """Pulsar's `getBundles(n)`: `seg = 2^32 // n`; `[0, seg, 2 seg, ..., (n-1) seg, 0xffffffff]`."""
    if not isinstance(num_bundles, int) or num_bundles <= 0 or num_bundles > MAX_BUNDLES:
        raise BundleError(f"invalid number of bundles {num_bundles!r}; it must be in (0, 2^32]")
    seg = MAX_BUNDLES // num_bundles
    return [i * seg for i in range(num_bundles)] + [FULL_UPPER]


def parse_boundary(text: Any) -> int:
    if not isinstance(text, str) or not text.lower().startswith("0x"):
        raise BundleError(f"malformed boundary {str(text)[:40]!r}; expected 0x followed by 8 hex digits")
    try:
        value = int(text, 16)
    except ValueError:
        raise BundleError(f"malformed boundary {text[:40]!r}; expected 0x followed by 8 hex digits") from None
    if not FULL_LOWER <= value <= FULL_UPPER:
        raise BundleError(f"boundary {text[:40]} is outside 0x00000000..0xffffffff")
    return value


def check_boundaries(bounds: list[int]) -> list[int]:
    """Boundaries that partition the hash space: strictly increasing, from 0 to 0xffffffff."""
    if len(bounds) < 2:
        raise BundleError("a namespace needs at least two boundaries (0x00000000 and 0xffffffff)")
    if bounds[0] != FULL_LOWER or bounds[-1] != FULL_UPPER:
        raise BundleError(f"boundaries do not cover the whole hash range: first 0x{bounds[0]:08x}, "
                          f"last 0x{bounds[-1]:08x}")
    for a, b in zip(bounds, bounds[1:]):
        if b <= a:
            raise BundleError(f"boundaries are not strictly increasing at 0x{a:08x}, 0x{b:08x}")
    return bounds


def bundles_data(bounds: list[int]) -> dict[str, Any]:
    """Pulsar's `BundlesData` JSON."""
    return {"boundaries": [f"0x{b:08x}" for b in bounds], "numBundles": len(bounds) - 1}


def parse_bundles_data(raw: Any) -> list[int]:
    """`{"boundaries": [...], "numBundles": n}` (or `{"numBundles": n}` alone, as `pulsar-admin
    namespaces create --bundles n` sends) -> the boundaries."""
    if not isinstance(raw, dict):
        raise BundleError("bundles must be an object {\"boundaries\": [...]} or {\"numBundles\": n}")
    if raw.get("boundaries"):
        bounds = raw["boundaries"]
        if not isinstance(bounds, list):
            raise BundleError("bundles.boundaries must be a list of 0x........ strings")
        return check_boundaries([parse_boundary(b) for b in bounds])
    n = raw.get("numBundles")
    if isinstance(n, bool) or not isinstance(n, int):
        raise BundleError("bundles needs boundaries or an integer numBundles")
    return initial_boundaries(n)


def parse_range(namespace: str, name: str) -> Bundle:
    """`0xLLLLLLLL_0xUUUUUUUU` -> the Bundle (not checked against the namespace's boundaries)."""
    parts = name.lower().split("_")
    if len(parts) != 2 or not all(len(p) == 10 for p in parts):
        raise BundleError(f"malformed bundle {name[:60]!r}; expected 0xLLLLLLLL_0xUUUUUUUU")
    lower, upper = parse_boundary(parts[0]), parse_boundary(parts[1])
    if upper <= lower:
        raise BundleError(f"bundle {name[:60]} has its upper boundary below its lower one")
    return Bundle(namespace, lower, upper)


class NamespaceBundles:
    """One namespace's bundles at one version of its local policies."""

    def __init__(self, namespace: str, boundaries: list[int], version: int = -1):
        self.namespace = namespace
        self.boundaries = check_boundaries(list(boundaries))
        self.version = version           # znode version of the local policies (-1: not stored)
        self.bundles = [Bundle(namespace, a, b) for a, b in zip(self.boundaries, self.boundaries[1:])]

    def find(self, h: int) -> Bundle:
        """The bundle holding hash h: binary search, the last bundle closed at 0xffffffff."""
        idx = bisect.bisect_right(self.boundaries, h) - 1
        return self.bundles[min(max(idx, 0), len(self.bundles) - 1)]

    def bundle_of(self, topic: str) -> Bundle:
        return self.find(topic_hash(topic))

    def get(self, range_name: str) -> Bundle | None:
        for b in self.bundles:
            if b.range_name == range_name.lower():
                return b
        return None

    def __contains__(self, bundle: Bundle) -> bool:
        return bundle in self.bundles

    def with_split(self, bundle: Bundle, cuts: Iterable[int]) -> list[int]:
        """The boundaries after splitting `bundle` at `cuts` (each strictly inside it)."""
        if bundle not in self.bundles:
            raise BundleError(f"{bundle} is not a bundle of {self.namespace} now")
        cuts = sorted(set(cuts))
        if not cuts:
            raise BundleError(f"no split position inside {bundle}")
        for c in cuts:
            if not bundle.lower < c < bundle.upper:
                raise BundleError(f"split position 0x{c:08x} is not strictly inside {bundle.range_name}")
        return sorted(set(self.boundaries) | set(cuts))

    def to_json(self) -> dict[str, Any]:
        return bundles_data(self.boundaries)

    def __repr__(self) -> str:
        return f"NamespaceBundles({self.namespace}, {len(self.bundles)} bundles, v{self.version})"


def default_bundles(namespace: str, num_bundles: int) -> NamespaceBundles:
    return NamespaceBundles(namespace, initial_boundaries(num_bundles))


def bundle_of(topic: str, num_bundles: int = 4) -> Bundle:
    """The bundle of a topic under the initial layout of `num_bundles` equal ranges (what a namespace
    that never split has)."""
    namespace, _ = topic_namespace(topic)
    return default_bundles(namespace, num_bundles).bundle_of(topic)


def local_policies_path(namespace: str) -> str:
    return f"{LOCAL_POLICIES_ROOT}/{namespace}"


def policies_path(namespace: str) -> str:
    return f"{POLICIES_ROOT}/{namespace}"


class BundleFactory:
    """A broker's view of every namespace's bundles (Pulsar's `NamespaceBundleFactory`): read from the
    local policies once, then kept current by a data watch; `cached()` answers without waiting."""

    def __init__(self, store: Any, default_num_bundles: int = 4):
        self.store = store
        self.default_num_bundles = default_num_bundles
        self._cache: dict[str, NamespaceBundles] = {}
        self._watched: set[str] = set()
        self._listeners: list[Callable[[str, NamespaceBundles, NamespaceBundles | None], Any]] = []

    def on_change(self, fn: Callable[[str, NamespaceBundles, NamespaceBundles | None], Any]) -> None:
        """fn(namespace, new, old) after the boundaries change (a split here or on another broker)."""
        self._listeners.append(fn)

    def cached(self, namespace: str) -> NamespaceBundles | None:
        return self._cache.get(namespace)

    async def get(self, namespace: str) -> NamespaceBundles:
        got = self._cache.get(namespace)
        if got is not None:
            return got
        return await self.load(namespace)

    async def load(self, namespace: str) -> NamespaceBundles:
        """Read the local policies (creating them from the namespace policies, or the default layout,
        when missing) and cache them."""
        path = local_policies_path(namespace)
        for _ in range(5):
            got = await self.store.get_or_none(path)
            if got is not None:
                raw = decode_json_object(got[0]).get("bundles")
                try:
                    nb = NamespaceBundles(namespace, parse_bundles_data(raw), got[1])
                except BundleError as e:
                    log.warning("bad bundles in %s (%s); using the default layout", path, e)
                    nb = NamespaceBundles(namespace, initial_boundaries(self.default_num_bundles), got[1])
                self._set(namespace, nb)
                self._watch(namespace)
                return nb
            bounds = await self._policy_boundaries(namespace)
            body = {"bundles": bundles_data(bounds)}
            try:
                await self.store.ensure_path(path.rsplit("/", 1)[0])
                await self.store.create(path, json.dumps(body, sort_keys=True).encode())
            except NodeExists:
                pass
        raise RuntimeError(f"could not read {path}: it keeps changing")

    async def _policy_boundaries(self, namespace: str) -> list[int]:
        """The namespace policies' bundles (Pulsar's `copyToLocalPolicies`), written there first with
        the default layout when the namespace has none."""
        path = policies_path(namespace)
        for _ in range(5):
            got = await self.store.get_or_none(path)
            pol = decode_json_object(got[0] if got else b"")
            if "bundles" in pol:
                try:
                    return parse_bundles_data(pol["bundles"])
                except BundleError as e:
                    log.warning("bad bundles in %s (%s); using the default layout", path, e)
                    return initial_boundaries(self.default_num_bundles)
            bounds = initial_boundaries(self.default_num_bundles)
            data = json.dumps({**pol, "bundles": bundles_data(bounds)}, sort_keys=True).encode()
            try:
                if got is None:
                    await self.store.ensure_path(path.rsplit("/", 1)[0])
                    await self.store.create(path, data)
                else:
                    await self.store.set(path, data, version=got[1])
                return bounds
            except (NodeExists, BadVersion):
                continue
        raise RuntimeError(f"could not write the bundles of {path}: it keeps changing")

    def _set(self, namespace: str, nb: NamespaceBundles) -> None:
        old = self._cache.get(namespace)
        if old is not None and old.version > nb.version >= 0:
            return                       # a late read of an older version
        self._cache[namespace] = nb
        if old is not None and old.boundaries != nb.boundaries:
            for fn in self._listeners:
                try:
                    fn(namespace, nb, old)
                except Exception:  # noqa: BLE001
                    log.warning("bundle listener failed", exc_info=True)

    def _watch(self, namespace: str) -> None:
        if namespace in self._watched:
            return
        self._watched.add(namespace)

        def on_data(data: bytes | None, version: int = -1) -> None:
            if data is None:
                return
            raw = decode_json_object(data or b"").get("bundles")
            try:
                nb = NamespaceBundles(namespace, parse_bundles_data(raw), version)
            except BundleError:
                return
            self._set(namespace, nb)
        try:
            self.store.watch_data(local_policies_path(namespace), on_data, with_version=True)
        except Exception:  # noqa: BLE001
            log.debug("no data watch on %s", local_policies_path(namespace), exc_info=True)

    def note(self, nb: NamespaceBundles) -> None:
        """Adopt boundaries this broker just wrote (a split), before the watch reports them."""
        self._set(nb.namespace, nb)
