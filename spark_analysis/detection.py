"""The detection matrix's view of an analysed run (no Spark here): its scenario and the facts
`core.detection.matrix` counts. The analysis's `detection_matrix` table and `pulsar-chaos detection` (which
reads the same run folders through `inputs.discover_local` and `inputs.vet`, without Spark) both build their
rows from these, so their figures are the same.
"""
from __future__ import annotations

from typing import Any

from core import detection
from spark_analysis.inputs import Run


def unsafe_options(r: Run) -> set[str]:
    """The options of the run's workload that make one of its unsafe settings (dropped from its scenario)."""
    try:
        import workloads
        mod = workloads.get(r.workload)
        unsafe, defaults = getattr(mod, "UNSAFE", ()), {k: d for k, (d, _) in mod.OPTIONS.items()}
    except Exception:                     # a workload this checkout lacks
        return set()
    return detection.unsafe_option_keys(r._get("options", {}) or {}, unsafe, defaults)


def _spec(r: Run) -> dict[str, Any]:
    """The run's spec, with its cluster's unsafe settings given back their safe values
    (`clusters.unsafe_settings.scenario_reset`) when they are among its causes: its scenario is then the
    one of the runs without them. Otherwise (a knob's scenario at ack quorum 1, or its runs declared
    valid) the settings stay part of the scenario."""
    from clusters import unsafe_settings
    labels = {label for label, _ in unsafe_settings.causes(r.spec)}
    if not labels & set(r.causes):
        return r.spec
    return {**r.spec, **unsafe_settings.scenario_reset(r.spec)}


def scenario(r: Run) -> tuple[str, str]:
    """(label, key) of the run's scenario (`core.detection.scenario`)."""
    return detection.scenario(_spec(r), unsafe_options(r))


def facts(r: Run) -> dict[str, Any]:
    """`core.detection.run_facts` of an analysed run."""
    return detection.run_facts(_spec(r), r.results, r.causes, r.expected, unsafe_options(r))


def matrix(runs: list[Run]) -> list[dict[str, Any]]:
    """The detection matrix's rows (`core.detection.matrix`) over the runs."""
    return detection.matrix(facts(r) for r in runs)
