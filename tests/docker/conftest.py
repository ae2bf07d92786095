"""Helpers of the docker backend's tests: a TCP probe run inside a node's container, HTTP and wait
helpers. The engine and the node image come from tests/conftest.py's `docker_image` fixture."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request


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
