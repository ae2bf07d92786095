"""Partition shapes as graph functions: who drops whom, built with networkx.

A grudge here is an undirected graph whose edges are cut links (our backend drops both directions of
an edge); `grudge_json` turns it into the {node: [nodes it drops]} map the history records.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

import networkx as nx


class GrudgeError(ValueError):
    """A shape that cannot be built from these nodes (too few of them)."""


def complete_grudge(components: Iterable[Iterable[str]]) -> nx.Graph:
    """Every node drops every node of every other component (Jepsen's `complete-grudge`)."""
    comps = [list(c) for c in components]
    seen: set[str] = set()
    for c in comps:
        dup = seen.intersection(c)
        if dup:
            raise GrudgeError(f"node {sorted(dup)[0]!r} is in two components")
        seen.update(c)
    comps = [c for c in comps if c]
    if not comps:
        return nx.Graph()
    # complete_multipartite_graph takes node lists as its parts: an edge between every pair of parts
    return nx.Graph(nx.complete_multipartite_graph(*comps))


def bisect(nodes: Sequence[str], rng: random.Random) -> tuple[list[str], list[str]]:
    """Shuffle (a copy of the sorted nodes) and cut in two non-empty halves; the second is never smaller."""
    pool = sorted(nodes)
    if len(pool) < 2:
        raise GrudgeError(f"cannot cut {len(pool)} node(s) into two non-empty halves")
    rng.shuffle(pool)
    k = len(pool) // 2
    return pool[:k], pool[k:]


def halves(nodes: Sequence[str], rng: random.Random,
           majority_extra: Iterable[str] = ()) -> tuple[list[list[str]], nx.Graph]:
    """Random halves of `nodes`; `majority_extra` (ZooKeeper) joins the bigger half.

    Returns ([minority, majority] each sorted, grudge)."""
    small, big = bisect(nodes, rng)
    extra = sorted(set(majority_extra) - set(nodes))
    sides = [sorted(small), sorted(big + extra)]
    return sides, complete_grudge(sides)


def isolate(node: str, others: Iterable[str]) -> nx.Graph:
    """`node` is cut from each of `others` (and only from them); the others still reach each other."""
    rest = sorted(set(others) - {node})
    if not rest:
        raise GrudgeError(f"nothing to isolate {node!r} from")
    return nx.star_graph([node, *rest])          # the first node of the iterable is the centre


def one(nodes: Sequence[str], rng: random.Random) -> tuple[str, nx.Graph]:
    """A random node cut from all the others (Jepsen's `split-one`)."""
    pool = sorted(nodes)
    if len(pool) < 2:
        raise GrudgeError("isolating a node needs at least two nodes")
    node = rng.choice(pool)
    return node, isolate(node, pool)


def bridge(nodes: Sequence[str], rng: random.Random) -> tuple[list[list[str]], str, nx.Graph]:
    """Two halves that cannot reach each other, and one node of the second reaching both (Jepsen's `bridge`).

    Returns ([half without the bridge, other half without the bridge], bridge node, grudge)."""
    if len(nodes) < 3:
        raise GrudgeError("a bridge needs at least three nodes")
    small, big = bisect(nodes, rng)
    node, rest = big[0], big[1:]
    sides = [sorted(small), sorted(rest)]
    return sides, node, complete_grudge(sides)


def majorities_ring(nodes: Sequence[str], rng: random.Random) -> tuple[list[str], nx.Graph]:
    """Every node sees a majority (itself included), and neighbours see different majorities.

    The nodes form a random ring; each keeps its links to the nodes within distance d, the smallest d
    with 2d+1 >= a majority, and drops the rest. Drops are symmetric here (unlike Jepsen's one-way
    grudge), so with three nodes the best we can do is cut one link. Returns (ring order, grudge)."""
    pool = sorted(nodes)
    n = len(pool)
    if n < 3:
        raise GrudgeError("a majorities ring needs at least three nodes")
    rng.shuffle(pool)
    return pool, ring_grudge(pool)


def ring_grudge(ring: Sequence[str]) -> nx.Graph:
    """The majorities-ring grudge of nodes in this ring order (no randomness)."""
    n = len(ring)
    if n < 3:
        raise GrudgeError("a majorities ring needs at least three nodes")
    majority = n // 2 + 1
    d = math.ceil((majority - 1) / 2)
    sees = nx.relabel_nodes(nx.circulant_graph(n, list(range(1, d + 1))), dict(enumerate(ring)))
    grudge = nx.complement(sees)
    if grudge.number_of_edges() == 0:           # n == 3: everyone sees everyone at distance 1
        grudge.add_edge(ring[0], ring[1])
    grudge.remove_nodes_from([v for v in list(grudge) if grudge.degree(v) == 0])
    return grudge


def grudge_json(grudge: nx.Graph) -> dict[str, list[str]]:
    """{node: sorted nodes it drops} for every node with a cut link (both ends of every edge)."""
    g = grudge.to_undirected() if grudge.is_directed() else grudge
    return {str(v): sorted(str(u) for u in g.neighbors(v)) for v in sorted(g.nodes, key=str) if g.degree(v)}


def visible(grudge: nx.Graph | dict[str, list[str]], nodes: Iterable[str]) -> dict[str, set[str]]:
    """What each node still reaches (itself included) under a grudge: for checks and tests."""
    cut: set[tuple[str, str]] = set()
    if isinstance(grudge, dict):
        for a, bs in grudge.items():
            cut.update((a, b) for b in bs)
    else:
        cut.update((str(a), str(b)) for a, b in grudge.edges())
    cut |= {(b, a) for a, b in cut}
    pool = list(nodes)
    return {a: {b for b in pool if (a, b) not in cut} for a in pool}
