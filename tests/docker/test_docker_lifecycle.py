"""The docker backend's set-up errors and cleanup: a missing image is a one-line error naming the fix,
and the leftovers of a killed run (containers and network labelled with its name) are removed by
cleanup_all, which never touches anything not labelled ours."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from clusters.deploy.backend import ClusterError
from clusters.deploy.docker import DOCKER_ROOT, LABEL, DockerCluster, _labelled
from clusters.deploy.spec import ClusterSpec

pytestmark = [pytest.mark.integration, pytest.mark.docker]


def small_spec(name: str) -> ClusterSpec:
    return ClusterSpec(name=name, zookeepers=1, bookies=0, brokers=0, clients=1,
                       ensemble=1, write_quorum=1, ack_quorum=1)


def _points_to(fd: Path, target: str) -> bool:
    try:
        return os.readlink(fd) == target
    except OSError:
        return False


def test_the_set_up_lock_is_free_once_the_set_up_returned(docker_image):
    """Every test worker runs scripts/docker-setup.sh under one host lock; the dockerd it starts on a
    fresh machine must not inherit the lock (it outlives the script, and the other workers would wait
    for it for ever). The other worker may be in its own set-up right now and hold the lock for its
    few seconds (a CI run once caught it so): the lock must come free within minutes, which an engine
    that inherited it never lets happen."""
    lock = "/run/lock/pulsar-chaos-docker-setup.lock"
    free = subprocess.run(["flock", "-w", "300", lock, "true"], capture_output=True)
    holders = {fd.parts[2]: _cmdline(fd.parts[2]) for fd in Path("/proc").glob("[0-9]*/fd/*")
               if _points_to(fd, lock)}
    assert free.returncode == 0, f"{lock} is still held 300 s after the set-up returned, by {holders}"


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def test_missing_image_is_a_one_line_error_naming_the_fix(docker_image):
    name = f"dm{uuid.uuid4().hex[:4]}"
    c = DockerCluster(small_spec(name), image="pulsar-chaos-node:000000000000")
    with pytest.raises(ClusterError) as e:
        c.up()
    assert "pulsar-chaos-node:000000000000 is not built" in str(e.value)
    assert "make setup BACKEND=docker" in str(e.value) and "\n" not in str(e.value)
    assert not _labelled("container", [name]) and not _labelled("network", [name])
    assert not (DOCKER_ROOT / name / "state.json").exists()


def test_cleanup_removes_a_killed_runs_leftovers_and_nothing_unlabelled(docker_image):
    name = f"dc{uuid.uuid4().hex[:4]}"
    code = textwrap.dedent(f"""
        import os, signal
        from clusters.deploy.docker import DockerCluster
        from clusters.deploy.spec import ClusterSpec
        c = DockerCluster(ClusterSpec(name={name!r}, zookeepers=1, bookies=0, brokers=0, clients=1,
                                      ensemble=1, write_quorum=1, ack_quorum=1), image={docker_image!r})
        c.up()
        print("up", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)       # no down(), no atexit
    """)
    decoys = {"network": f"pcd-{name}-decoy", "container": f"pcd-{name}-decoy"}
    try:
        cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
        assert cp.returncode == -9 and "up" in cp.stdout, cp.stderr
        assert len(_labelled("container", [name])) == 2 and len(_labelled("network", [name])) == 1
        state = json.loads((DOCKER_ROOT / name / "state.json").read_text())
        assert state["status"] == "up"
        # look-alikes without our label
        subprocess.run(["docker", "network", "create", "--internal", decoys["network"]], check=True,
                       capture_output=True)
        subprocess.run(["docker", "create", "--name", decoys["container"], "--network", "none",
                        docker_image, "true"], check=True, capture_output=True)
        report = DockerCluster.cleanup_all(names=[name])
        assert report["clusters"] == [name]
        assert not _labelled("container", [name]) and not _labelled("network", [name])
        assert json.loads((DOCKER_ROOT / name / "state.json").read_text())["status"] == "down"
        for kind, decoy in decoys.items():
            args = ["network", "inspect", decoy] if kind == "network" else ["inspect", decoy]
            cp = subprocess.run(["docker", *args], capture_output=True, text=True)
            assert cp.returncode == 0, f"cleanup removed an unlabelled {kind} {decoy}"
            assert LABEL not in (json.loads(cp.stdout)[0].get("Labels") or
                                 json.loads(cp.stdout)[0].get("Config", {}).get("Labels") or {})
        # idempotent: nothing more to remove
        assert DockerCluster.cleanup_all(names=[name]) == {"clusters": [], "containers": [], "networks": []}
    finally:
        subprocess.run(["docker", "rm", "-f", decoys["container"]], capture_output=True)
        subprocess.run(["docker", "network", "rm", decoys["network"]], capture_output=True)
        DockerCluster.cleanup_all(names=[name])
        shutil.rmtree(DOCKER_ROOT / name, ignore_errors=True)
