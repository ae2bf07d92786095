"""`pulsar-chaos detection CAMPAIGN_DIR...`: the detection matrix of a campaign (or of the folders of its
shards) as a markdown table, without Spark: one row per bug knob or unsafe setting and scenario, with
detected / runs (target 4 of 5: a row short of it is kept and marked), the anomaly types, the mean time to
first detection, and the false alarms of the same scenario without it; then the scenarios run only
without any (their false alarms).

It reads each run folder's test.toml and results.json, found and vetted as `pulsar-chaos analyze` finds
and vets them (spark_analysis.inputs, which needs no Spark), and counts them with the same functions as the
analysis's `detection_matrix` table (core/detection.py), so the figures are the analysis's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from core import detection


class DetectionInputError(ValueError):
    """A folder that is not a campaign folder, or no run in any: one line naming it and the fix."""


FIX = ("give a campaign folder (results/campaigns/<name>/<time>, as `pulsar-chaos campaign` prints) or the "
       "folders of its shards")


def runs_of(dirs: list[str]):
    """(runs, skipped) of the run folders under the given folders (spark_analysis.inputs.Run, Skipped)."""
    from spark_analysis import inputs
    if not dirs:
        raise DetectionInputError(f"no campaign folder given (fix: {FIX})")
    found: list[tuple[str, list[str]]] = []
    for d in dirs:
        p = Path(d)
        if not p.exists():
            raise DetectionInputError(f"{d}: no such folder (fix: {FIX})")
        if not p.is_dir():
            raise DetectionInputError(f"{d}: not a folder (fix: {FIX})")
        paths = inputs.discover_local(d, skip=set())
        if not paths:
            raise DetectionInputError(f"{d}: not a campaign folder: no run folder (test.toml) under it (fix: {FIX})")
        found.append((d, paths))
    ids = inputs.run_ids(found)
    runs, skipped = inputs.vet([p for _, ps in found for p in ps], ids)
    if not runs:
        why = f"; e.g. {skipped[0].path}: {skipped[0].reason}" if skipped else ""
        raise DetectionInputError(f"{', '.join(dirs)}: no run that can be read ({len(skipped)} skipped{why}) "
                                  f"(fix: {FIX}, with finished runs)")
    return runs, skipped


def rows(dirs: list[str]) -> tuple[list[dict], list]:
    """(the matrix rows, the skipped runs)."""
    from spark_analysis import detection as facts
    runs, skipped = runs_of(dirs)
    return facts.matrix(runs), skipped


def main(dirs: list[str], as_json: bool = False, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout                  # looked up now, not when the module was imported
    err = err or sys.stderr
    table, skipped = rows(dirs)
    if as_json:
        print(json.dumps(table, indent=1), file=out)
    else:
        print(detection.markdown(table), end="", file=out)
    for s in skipped:
        print(f"skipped {s.path}: {s.reason}", file=err)
    return 0
