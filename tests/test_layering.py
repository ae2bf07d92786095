"""The house's layering, read from the code's imports (every `import`, at module level or in a
function): the rooms import the ground (`core/`), never the harness; the ground imports none of the
rooms; and within one package no two modules import each other, directly or round a longer circle."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "harness", "checkers", "nemesis", "workloads", "spark_analysis", "clusters")
ROOMS = ("checkers", "nemesis", "workloads", "spark_analysis")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            parts = f.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import names (the longest prefix that is one), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(filter(None, (_resolve(a.name) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for a in node.names:
                full = f"{src}.{a.name}"
                out.add(_resolve(full) if full in MODULES else _resolve(src))
    out.discard(None)
    out.discard(module)
    return out


EDGES = {m: _imports(m, p) for m, p in MODULES.items()}


def _room(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("room", ROOMS)
def test_no_room_imports_the_harness(room):
    bad = sorted(f"{m} -> {o}" for m, outs in EDGES.items() if _room(m) == room
                 for o in outs if _room(o) == "harness")
    assert bad == []


def test_the_ground_imports_none_of_the_project():
    bad = sorted(f"{m} -> {o}" for m, outs in EDGES.items() if _room(m) == "core"
                 for o in outs if _room(o) != "core")
    assert bad == []


def test_no_circle_of_imports():
    g = nx.DiGraph([(m, o) for m, outs in EDGES.items() for o in outs])
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == []


def test_the_reader_sees_function_level_imports():
    # the rules would hold vacuously if the reader missed imports inside functions (the runner's are)
    assert {"nemesis.combine", "nemesis.registry", "workloads"} <= EDGES["harness.runner"]
    assert "core.history" in EDGES["checkers.log"]


def test_the_broker_uses_the_load_balancer_never_the_reverse():
    # the load manager owns ownership and reaches its broker only through manager.BrokerServices; what
    # both need (bundles, the broker registry, decoding) lies below both (clusters/metadata, bundles.py)
    bad = sorted(f"{m} -> {o}" for m, outs in EDGES.items() if m.startswith("clusters.loadbalancer")
                 for o in outs if o.startswith("clusters.broker"))
    assert bad == []
    assert {"clusters.loadbalancer.manager", "clusters.loadbalancer.api"} <= EDGES["clusters.broker.service"]
