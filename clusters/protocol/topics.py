"""Pulsar topic-name conventions shared by the broker and by clients (the harness's nemeses)."""
from __future__ import annotations

import re

PARTITION_SUFFIX = "-partition-"

_PARTITION_RE = re.compile(r"^(.*)-partition-(\d+)$")


def normalize_topic(topic: str) -> str:
    """`t`, `tenant/ns/t` or `persistent://tenant/ns/t` -> `persistent://tenant/ns/t`, as clients expand it."""
    if "://" in topic:
        return topic
    parts = topic.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{topic}"
    return f"persistent://{topic}"


def partition_name(topic: str, index: int) -> str:
    """`foo`, 3 -> `foo-partition-3`: the name of a partitioned topic's partition."""
    return f"{topic}{PARTITION_SUFFIX}{index}"


def partition_index(topic: str) -> int | None:
    """The partition number of `foo-partition-3` (3); None for a name that is not a partition."""
    m = _PARTITION_RE.match(topic)
    return int(m.group(2)) if m else None


def base_name(topic: str) -> str:
    """`foo-partition-3` -> `foo`; any other name is its own base."""
    m = _PARTITION_RE.match(topic)
    return m.group(1) if m else topic
