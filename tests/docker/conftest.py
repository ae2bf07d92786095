"""Fixtures of the docker backend's tests: the engine and the node image, made by
scripts/docker-setup.sh (idempotent: it installs docker.io and debootstrap, starts dockerd and builds
the image only when missing, so `make test` on a clean machine builds what these tests need instead
of skipping them), and a TCP probe run inside a node's container."""
from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICE_PORT = {"zookeeper": "client", "bookie": "bookie", "broker": "pulsar"}

PROBE = r"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
targets, timeout = json.loads(sys.argv[1]), float(sys.argv[2])
def probe(target):
    try:
        socket.create_connection(tuple(target), timeout=timeout).close()
        return "ok"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return type(e).__name__
with ThreadPoolExecutor(max(1, len(targets))) as ex:
    print(json.dumps(list(ex.map(probe, targets))))
"""


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The node image for the sources as they are now (built if needed); its tag pins every cluster
    of the session to it, even if the sources change meanwhile."""
    cp = subprocess.run([str(REPO / "scripts" / "docker-setup.sh")], capture_output=True, text=True,
                        timeout=1800)
    if cp.returncode != 0:
        pytest.fail(f"scripts/docker-setup.sh failed with {cp.returncode}:\n{cp.stdout[-2000:]}\n{cp.stderr[-3000:]}")
    tags = re.findall(r"pulsar-chaos-node:[0-9a-f]{12}", cp.stdout)
    if not tags:
        pytest.fail(f"scripts/docker-setup.sh named no image:\n{cp.stdout[-2000:]}")
    return tags[-1]


def probe_from(cluster, node: str, targets: list[tuple[str, int]], timeout: float = 1.5) -> list[str]:
    """TCP connects from inside `node`'s container to each (host, port), in parallel: 'ok', 'timeout'
    (packets dropped) or the error's name."""
    cp = cluster.exec(node, ["python", "-c", PROBE, json.dumps(targets), str(timeout)], timeout=60)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def wait_for(pred, timeout: float = 30.0, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def docker_json(*args: str) -> list:
    cp = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)
