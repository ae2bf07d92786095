"""A whole chaos run on the docker backend through the CLI: `pulsar-chaos run --backend docker` with
partitions and kills for 30 s ends valid, its workers having run in the client container."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clusters.deploy.docker import _labelled

pytestmark = [pytest.mark.integration, pytest.mark.docker]

EXE = os.path.join(os.path.dirname(sys.executable), "pulsar-chaos")


def test_a_30s_run_with_partitions_and_kills_is_valid(docker_image, tmp_path):
    env = {**os.environ, "PULSAR_CHAOS_IMAGE": docker_image}
    cp = subprocess.run([EXE, "run", "--backend", "docker", "--nemesis", "partition,kill", "--time-limit", "30",
                         "--nemesis-interval", "5", "--seed", "6", "--results-dir", str(tmp_path)],
                        env=env, capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, f"exit {cp.returncode}\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
    run_dir = next(Path(tmp_path).glob("log-chaos/2*"))
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and not results["run"]["errors"]
    cluster = json.loads((run_dir / "cluster.json").read_text())
    assert cluster["backend"] == "docker" and cluster["base_dir"].startswith("/tmp/pulsar-chaos/docker/")
    # the worker ran in the client container: the pid it reports (its own, in the container's pid
    # namespace) is not the pid of the process the runner started (the `docker exec` client)
    started = re.search(r"started worker-0: pid (\d+)", (run_dir / "runner.log").read_text())
    reported = re.search(r"worker-0: pid (\d+),", (run_dir / "logs" / "worker-0.log").read_text())
    assert started and reported and started.group(1) != reported.group(1)
    ops = [json.loads(line) for line in (run_dir / "journals" / "nemesis.jsonl").read_text().splitlines()]
    faults = {op["f"] for op in ops if op["type"] == "ok" and op["f"].startswith("start-")}
    assert faults & {"start-partition", "start-kill"}, ops
    assert (run_dir / "nodes" / "broker-1" / "node.log").is_file()       # node logs collected
    assert not _labelled("container", [cluster["name"]]) and not _labelled("network", [cluster["name"]])
