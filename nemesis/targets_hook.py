"""How partition and process faults name their targets: `NAME:TARGET` selectors, resolved when the
fault starts (nemesis/targets.py does the resolving)."""
from __future__ import annotations

import re
from typing import Any

from nemesis.base import NemesisContext, NemesisError, normalize_topic

TOPIC_SELECTORS = ("owner", "ledger-bookies")      # resolved for one topic, drawn when the fault is chosen


def draw_topic(ctx: NemesisContext, selector: str) -> dict[str, Any]:
    """The random draw a selector needs before the fault starts: a topic for the per-topic ones."""
    if selector in TOPIC_SELECTORS:
        if not ctx.topics:
            raise NemesisError(f"target {selector!r} needs topics, and this workload has none; "
                               "use a role (broker, bookie) or a node name")
        return {"topic": normalize_topic(ctx.rng.choice(sorted(ctx.topics)))}
    return {}


def resolve(ctx: NemesisContext, selector: str, topic: str | None = None) -> dict[str, Any]:
    from nemesis import targets
    return targets.resolve(ctx, selector, topic)


SELECTORS = ("random", "owner", "ledger-bookies", "zk-leader", "lb-leader", "broker", "bookie", "zookeeper",
             "all-broker", "all-bookie", "all-zookeeper")
_NODE_NAME = re.compile(r"^(zk|bookie|broker|client)-[1-9][0-9]*$")


def check_selector(selector: str) -> None:
    """ValueError naming the valid selectors if `selector` cannot name a target on any cluster."""
    if selector in SELECTORS or _NODE_NAME.match(selector):
        return
    from nemesis.combine import FaultNameError
    raise FaultNameError(f"unknown target {selector!r}", f"use one of {', '.join(SELECTORS)}, or a node name "
                     "like broker-1")
