"""How partition and process faults name their targets: `NAME:TARGET` selectors, resolved when the
fault starts (nemesis/targets.py does the resolving)."""
from __future__ import annotations

import re
from typing import Any

from nemesis.base import NemesisContext


def draw(ctx: NemesisContext, selector: str) -> dict[str, Any]:
    """The selector's random draws, made when the fault is chosen: {"selector", "node" or "topic"}."""
    from nemesis import targets
    return targets.draw(ctx, selector)


def resolve(ctx: NemesisContext, plan: dict[str, Any] | str, topic: str | None = None) -> dict[str, Any]:
    """The nodes a drawn plan's selector names now: {"selector", "nodes", ...how they were found}.
    (Also `resolve(ctx, selector, topic)`, which draws now.)"""
    from nemesis import targets
    if isinstance(plan, str):
        return targets.resolve(ctx, plan, topic)
    return targets.resolve(ctx, plan["selector"], plan=plan)


def draw_topic(ctx: NemesisContext, selector: str) -> dict[str, Any]:
    """`draw` without the selector key."""
    d = draw(ctx, selector)
    d.pop("selector", None)
    return d


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
