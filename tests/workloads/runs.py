"""One `pulsar-chaos run` of a workload from a test: a short spec, the runner in process, the run's
results.json, and the node data an invalid run keeps removed (the run folder with its logs stays)."""
from __future__ import annotations

import io
import json
import shutil
import uuid
from pathlib import Path

from harness import runner
from core.spec import TestSpec as Spec
from harness.catalog import CATALOG


def run(tmp_path: Path, prefix: str = "wl", **kw) -> tuple[int, dict, str, Path]:
    """(exit code, results.json, the runner's output, the run folder); `kw` are TestSpec fields."""
    kw = {"settle": 2.0, "final_read_timeout": 30.0, **kw}
    spec = Spec(test_name=f"{prefix}-{uuid.uuid4().hex[:6]}", results_dir=str(tmp_path), **kw).validate(catalog=CATALOG).resolved()
    out = io.StringIO()
    code = runner.run(spec, out)
    run_dir = next((Path(tmp_path) / spec.test_name).glob("2*"))
    res = json.loads((run_dir / "results.json").read_text())
    if res["run"].get("cluster_dir"):         # kept by the runner for a run that was not valid
        shutil.rmtree(res["run"]["cluster_dir"], ignore_errors=True)
    return code, res, out.getvalue(), run_dir
