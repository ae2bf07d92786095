"""Pulsar topic-name conventions shared by the broker and by clients (the harness's nemeses)."""
from __future__ import annotations


def normalize_topic(topic: str) -> str:
    """`t`, `tenant/ns/t` or `persistent://tenant/ns/t` -> `persistent://tenant/ns/t`, as clients expand it."""
    if "://" in topic:
        return topic
    parts = topic.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{topic}"
    return f"persistent://{topic}"
