"""Partitioned topics and namespace topic listings, kept in ZooKeeper as Pulsar keeps them.

A partitioned topic `persistent://t/ns/foo` with N partitions is the znode
`/admin/partitioned-topics/t/ns/persistent/foo` holding `{"partitions": N}` (Pulsar's
PartitionedTopicMetadata); its partitions are ordinary topics `foo-partition-0` .. `foo-partition-<N-1>`,
each with its own managed ledger, bundle and owner. Clients ask PARTITIONED_METADATA first and then
produce to / consume from every partition. A name that is itself a partition has 0 partitions.

The topics of a namespace (GET_TOPICS_OF_NAMESPACE, `/admin/v2/namespaces/{t}/{ns}/topics`) are the
persistent topics that have a managed ledger plus every partition of its partitioned topics.
"""
from __future__ import annotations

import json
from typing import Any

from clusters.broker.managed_ledger import ML_ROOT, ml_name, ml_path
from clusters.loadbalancer.bundles import topic_namespace
from clusters.metadata.store import BadVersion, NodeExists, NoNode
from clusters.protocol.topics import base_name, partition_index, partition_name

PARTITIONED_ROOT = "/admin/partitioned-topics"
MAX_PARTITIONS = 1024                  # Pulsar's maxNumPartitionsPerPartitionedTopic is 0 (no cap); ours


class PartitionError(ValueError):
    """A request about partitions that cannot be honoured; `status` is the HTTP answer."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def _ml_name(topic: str) -> str:
    """`persistent://t/ns/local` -> `t/ns/persistent/local` (ValueError for a malformed name)."""
    topic_namespace(topic)
    return ml_name(topic)


def partitioned_path(topic: str) -> str:
    return f"{PARTITIONED_ROOT}/{_ml_name(topic)}"


def _decode(data: bytes) -> int:
    try:
        n = json.loads(data or b"{}").get("partitions", 0)
    except (ValueError, AttributeError):
        return 0
    return n if isinstance(n, int) and n > 0 else 0


async def get_partitions(store: Any, topic: str) -> int:
    """N for a partitioned topic, 0 for anything else (a partition, a plain or unknown topic)."""
    if partition_index(topic) is not None:
        return 0                      # as Pulsar: a partition name is never itself partitioned
    got = await store.get_or_none(partitioned_path(topic))
    return _decode(got[0]) if got else 0


def validate_count(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise PartitionError(400, f"the number of partitions must be an integer, got {json.dumps(n)[:40]}")
    if n <= 0:
        raise PartitionError(400, f"the number of partitions must be more than 0, got {n}")
    if n > MAX_PARTITIONS:
        raise PartitionError(400, f"the number of partitions must be at most {MAX_PARTITIONS}, got {n}")
    return n


async def create_partitioned(store: Any, topic: str, n: Any) -> int:
    """Create the partitioned-topic metadata (Pulsar: PUT .../partitions). 409 if the name is taken
    by a partitioned topic or by a non-partitioned topic with a managed ledger."""
    n = validate_count(n)
    if partition_index(topic) is not None:
        raise PartitionError(400, f"{topic} is a partition name; a partitioned topic cannot end in "
                                  f"'-partition-<n>'")
    if await store.exists(ml_path(_ml_name(topic))):
        raise PartitionError(409, f"This topic already exists: {topic} is a non-partitioned topic")
    try:
        await store.create(partitioned_path(topic), json.dumps({"partitions": n}).encode(), makepath=True)
    except NodeExists:
        raise PartitionError(409, f"Partitioned topic already exists: {topic}") from None
    return n


async def update_partitions(store: Any, topic: str, n: Any) -> int:
    """Raise the partition count (Pulsar: POST .../partitions); it can only grow."""
    n = validate_count(n)
    path = partitioned_path(topic)
    for _ in range(10):
        got = await store.get_or_none(path)
        if got is None:
            raise PartitionError(404, f"Partitioned topic does not exist: {topic}")
        current = _decode(got[0])
        if n <= current:
            raise PartitionError(409, f"Number of partitions can only be increased: {topic} has "
                                      f"{current}, asked {n}")
        try:
            await store.set(path, json.dumps({"partitions": n}).encode(), version=got[1])
            return n
        except BadVersion:
            continue
    raise PartitionError(409, f"{topic}: too many concurrent updates of its partitions")


async def delete_partitioned(store: Any, topic: str) -> None:
    try:
        await store.delete(partitioned_path(topic))
    except NoNode:
        raise PartitionError(404, f"Partitioned topic does not exist: {topic}") from None


async def partitioned_topics(store: Any, namespace: str) -> dict[str, int]:
    """`tenant/ns` -> {partitioned topic name: partitions} (persistent only)."""
    out: dict[str, int] = {}
    root = f"{PARTITIONED_ROOT}/{namespace}/persistent"
    for local in await store.children(root):
        got = await store.get_or_none(f"{root}/{local}")
        n = _decode(got[0]) if got else 0
        if n:
            out[f"persistent://{namespace}/{local}"] = n
    return dict(sorted(out.items()))


async def topics_of_namespace(store: Any, namespace: str) -> list[str]:
    """Every persistent topic of `tenant/ns`: those with a managed ledger, plus each partition of
    its partitioned topics (Pulsar's getListOfPersistentTopics + partitions); sorted."""
    names = {f"persistent://{namespace}/{local}"
             for local in await store.children(f"{ML_ROOT}/{namespace}/persistent")}
    for topic, n in (await partitioned_topics(store, namespace)).items():
        names.update(partition_name(topic, i) for i in range(n))
    return sorted(names)


async def topic_exists(store: Any, topic: str) -> bool:
    """A topic exists when it has a managed ledger, or is a partition of a partitioned topic."""
    if await store.exists(ml_path(_ml_name(topic))):
        return True
    idx = partition_index(topic)
    if idx is not None:
        return idx < await get_partitions(store, base_name(topic))
    return False
