"""Shared fixtures: a real ZooKeeper on loopback (one per test session), chroots per test; for every
test marked `docker`, the docker engine and the node image of the sources as they are."""
from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from clusters import zookeeper
from clusters.deploy.lifecycle import OWNER_TAG_ENV


def pytest_configure(config):
    """Label every cluster this session creates (in this process, xdist's workers and the CLI runs they
    start, which inherit the environment), so that the session can remove the folders they leave."""
    if not hasattr(config, "workerinput"):
        os.environ.setdefault(OWNER_TAG_ENV, f"pytest-{uuid.uuid4().hex[:12]}")


def pytest_sessionfinish(session, exitstatus):
    """The folders of this session's clusters that are down: the runner keeps an invalid run's cluster
    folder for a post-mortem (many tests make invalid runs on purpose) and a test that fails may leave one.
    A cluster still up is named, not removed: its processes are a leak the test must fix."""
    if hasattr(session.config, "workerinput"):
        return
    import json
    import shutil
    from clusters.deploy.spec import ROOT
    tag = os.environ.get(OWNER_TAG_ENV)
    for state in sorted(ROOT.glob("*/state.json")) if tag else []:
        try:
            st = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        if st.get("owner_tag") != tag:
            continue
        if st.get("status") == "down":
            shutil.rmtree(state.parent, ignore_errors=True)
        else:
            print(f"\nleft by this session and not down: cluster {state.parent.name} ({st.get('status')}); "
                  f"`pulsar-chaos cluster down --force --name {state.parent.name}`")


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="integration tests need root (network namespaces, iptables)")
        for item in items:
            if "integration" in item.keywords:
                item.add_marker(skip)


REPO = Path(__file__).resolve().parents[1]


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


@pytest.fixture(autouse=True)
def _docker_image_for_docker_tests(request):
    """scripts/docker-setup.sh (idempotent: it installs docker.io and debootstrap, starts dockerd and
    builds the image only when missing or stale) before any test marked `docker`, wherever it is, so
    that `make test` on a clean machine builds what they need instead of skipping them."""
    if request.node.get_closest_marker("docker") is not None:
        request.getfixturevalue("docker_image")


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """A real Apache ZooKeeper (Debian's package), standalone on 127.0.0.1."""
    if not zookeeper.installed():
        pytest.fail("ZooKeeper is not installed; run `make setup`")
    zk = zookeeper.LocalZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    zk.start()
    try:
        yield zk
    finally:
        zk.stop()


def fresh_chroot(zk_server, prefix: str = "test") -> str:
    """A connect string `127.0.0.1:PORT/<prefix>-XXXX` rooted in a new, empty chroot."""
    from kazoo.client import KazooClient
    chroot = f"/{prefix}-{uuid.uuid4().hex[:12]}"
    client = KazooClient(hosts=zk_server.connect_string)
    client.start(30)
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()
        client.close()
    return zk_server.connect_string + chroot


@pytest.fixture
def zk(zk_server):
    """A fresh chroot per test, so tests never share metadata."""
    return fresh_chroot(zk_server)
