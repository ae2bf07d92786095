"""Decoding znode values: one rule for every reader of JSON metadata (policies, registrations, locks)."""
from __future__ import annotations

import json
from typing import Any


def decode_json_object(data: bytes) -> dict[str, Any]:
    """A znode's JSON object; {} when it is empty, not JSON or not an object."""
    if not data:
        return {}
    try:
        raw = json.loads(data)
    except ValueError:
        return {}
    return raw if isinstance(raw, dict) else {}
