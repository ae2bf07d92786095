"""The `pulsar-chaos` command line: doctor, one-line user errors, and a ZooKeeper-only cluster by hand."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from harness import cli

EXE = os.path.join(os.path.dirname(sys.executable), "pulsar-chaos")


def run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def test_doctor_lists_every_prerequisite():
    out = run("doctor")
    for name in ("root", "iproute2", "iptables", "java", "zookeeper", "pulsar-client", "docker engine",
                 "network namespaces"):
        assert name in out.stdout
    missing = [ln for ln in out.stdout.splitlines() if ln.startswith("missing")]
    assert out.returncode == (1 if missing else 0), out.stdout
    assert all("fix:" in ln for ln in missing)
    docker = next(ln for ln in out.stdout.splitlines() if "docker engine" in ln)
    assert docker.split()[0] in ("ok", "warning")                # docker never fails the doctor
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args, words", [
    (["cluster", "up", "--ack-quorum", "3", "--write-quorum", "2"], "E >= Qw >= Qa"),
    (["cluster", "up", "--zookeepers", "2"], "odd"),
    (["cluster", "up", "--bug", "no.such_knob"], "unknown bug knob"),
    (["cluster", "up", "--bookies", "many"], "invalid int value"),
    (["cluster", "partition", "zk-1"], "at least two groups"),
    (["nonsense"], "invalid choice"),
])
def test_user_errors_are_one_line_exit_254(args, words):
    out = run(*args)
    assert out.returncode == 254
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], out.stderr
    assert "(fix: " in lines[0]
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_subcommands_can_be_registered():
    @cli.command("hello-test", "say hello", lambda p: p.add_argument("--who", default="world"))
    def hello(args):
        print(f"hello {args.who}")
        return 0
    try:
        assert cli.main(["hello-test", "--who", "you"]) == 0
    finally:
        del cli.COMMANDS["hello-test"]


@pytest.mark.integration
def test_cluster_by_hand():
    name = "c" + uuid.uuid4().hex[:5]
    try:
        up = run("cluster", "up", "--name", name, "--brokers", "0", "--bookies", "0")
        assert up.returncode == 0, up.stderr
        again = run("cluster", "up", "--name", name, "--brokers", "0", "--bookies", "0")
        assert again.returncode == 254 and "already up" in again.stderr
        st = json.loads(run("cluster", "status", "--name", name).stdout)
        assert st["status"] == "up" and st["zk_connect"] in up.stdout
        zk = next(n for n in st["nodes"] if n["name"] == "zk-1")
        assert zk["alive"] and zk["pid"]
        part = run("cluster", "partition", "--name", name, "zk-1", "client-1,host")
        assert part.returncode == 0, part.stderr
        assert ["zk-1", "host"] in json.loads(part.stdout)["partitions"]
        assert run("cluster", "heal", "--name", name).returncode == 0
        assert "zk-1: dead" in run("cluster", "kill", "--name", name, "zk-1").stdout
        assert "zk-1: running" in run("cluster", "start", "--name", name, "zk-1").stdout
        bad = run("cluster", "kill", "--name", name, "zk-9")
        assert bad.returncode == 254 and "no node named" in bad.stderr
        assert run("cluster", "down", "--name", name).returncode == 0
        gone = run("cluster", "down", "--name", name)
        assert gone.returncode == 254 and "not up" in gone.stderr
    finally:
        run("cluster", "down", "--force", "--name", name)
        shutil.rmtree(f"/tmp/pulsar-chaos/clusters/{name}", ignore_errors=True)
