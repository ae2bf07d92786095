"""The exactly-once workload: its plan and options (pure), the controller's kill / restart / stop cycle
on a stand-in processor process (real processes and signals, no cluster), the checkpoint file, and two
runs under `pulsar-chaos run` on a real cluster: valid on the default protocol under broker and bookie
kills and partitions, and invalid (`missed`) with the unsafe `seek=false`."""
from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import workloads
from core.history import INVOKE, OK, Journal, read_jsonl
from core.spec import SpecError
from core.spec import TestSpec as Spec
from workloads import exactly_once as eo
from workloads.base import Context
from tests.workloads import runs
from harness.catalog import CATALOG


def spec(**kw) -> Spec:
    kw.setdefault("workload", "exactly-once")
    return Spec(**kw).validate(catalog=CATALOG)


# ------------------------------------------------------------------------------------ the plan

def test_registered_with_its_options_and_checkers():
    assert workloads.get("exactly-once") is eo
    s = spec(options={"seek": False, "checkpoint_every": 20})
    assert workloads.options("exactly-once", s.options)["seek"] is False
    ch = eo.checkers(s)
    assert ch["exactly-once"][1] == {"dedup_output": True}
    assert ch["perf"][1] == {"write_fs": ("send",)}
    assert eo.checkers(spec(options={"dedup_output": False}))["exactly-once"][1] == {"dedup_output": False}
    with pytest.raises(SpecError, match="seek must be true or false"):
        spec(options={"seek": "no"})
    with pytest.raises(SpecError, match="no option 'flush'"):
        spec(options={"flush": False})
    # argparse %-formats the run --help text that lists every workload's options
    assert "%" not in eo.DESCRIPTION + "".join(h for _, h in eo.OPTIONS.values())


def test_keys_are_input_and_output_topic_per_pipeline():
    ks = eo.keys(spec(test_name="t", topics=2), "RUN")
    assert ks == ["persistent://public/default/t-RUN-in0", "persistent://public/default/t-RUN-out0",
                  "persistent://public/default/t-RUN-in1", "persistent://public/default/t-RUN-out1"]
    assert eo.pipelines(ks) == [(ks[0], ks[1]), (ks[2], ks[3])]


def test_threads_and_generator_are_seeded_and_values_unique():
    s = spec(seed=7, concurrency=5, rate=100.0, topics=2)
    ths = eo.threads(s, 2)
    assert [t.worker for t in ths] == [0, 1, 0, 1, 0] and [t.batched for t in ths] == [True, False] * 2 + [True]
    inputs = ["a", "b"]

    def take(t, n=200):
        g = eo.generator(s, t, inputs)
        return [next(g) for _ in range(n)]
    assert take(ths[0]) == take(ths[0])
    ops = [p for t in ths for p in take(t)]
    assert all(p.f == "send" and p.key in inputs for p in ops)
    assert len({p.value for p in ops}) == len(ops)
    assert {p.key for p in ops} == set(inputs)
    # delays average 1 / per-thread rate (20/s here)
    mean = sum(p.delay for p in take(ths[1], 2000)) / 2000
    assert 0.04 < mean < 0.06
    assert eo.message_key(s, 123) == "k3" and eo.message_key(spec(options={"keys": 4}), 123) == "k3"


def test_checkpoint_file_is_replaced_durably(tmp_path):
    p = tmp_path / "checkpoint.json"
    assert eo.read_checkpoint(p) is None
    eo.write_checkpoint(p, {"seq": 1, "sums": {"k0": 3}})
    eo.write_checkpoint(p, {"seq": 2, "sums": {"k0": 5}})
    assert eo.read_checkpoint(p) == {"seq": 2, "sums": {"k0": 5}}
    assert [x.name for x in tmp_path.iterdir()] == ["checkpoint.json"]


def test_final_checkpoint_op(tmp_path):
    assert eo.final_checkpoint(tmp_path, 0, "A", "B") == (OK, {"value": {"input": "A", "output": "B",
                                                                         "checkpoint": None}})
    eo.checkpoint_path(tmp_path, 0).parent.mkdir(parents=True)
    eo.write_checkpoint(eo.checkpoint_path(tmp_path, 0), {"seq": 4})
    assert eo.final_checkpoint(tmp_path, 0, "A", "B")[1]["value"]["checkpoint"] == {"seq": 4}
    eo.checkpoint_path(tmp_path, 0).write_text("{torn")
    assert eo.final_checkpoint(tmp_path, 0, "A", "B")[0] == "info"


# ------------------------------------------------------------------------------------ the controller

# A stand-in for the processor: it installs its SIGTERM handler only after 0.3 s (as the real one does
# after its imports), then marks itself mid-interval in the status file and waits; SIGTERM -> exit 0.
FAKE = textwrap.dedent("""
    import mmap, os, signal, struct, sys, time
    args = sys.argv[1:]
    status = args[args.index("--status") + 1]
    time.sleep(0.3)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    fd = os.open(status, os.O_RDWR)
    m = mmap.mmap(fd, 32)
    struct.pack_into("<dddd", m, 0, 1.0, 5.0, 2.0, time.monotonic())
    while not stop:
        time.sleep(0.01)
    print("drained", flush=True)
    sys.exit(0)
""")


class FakeController(eo.Controller):
    script: Path

    def argv(self) -> list[str]:
        return [sys.executable, str(self.script), "--status", str(self._status_path())]


def _controller(tmp_path: Path, time_limit: float, kill_interval: float) -> tuple[FakeController, Path]:
    s = spec(options={"kill_interval": kill_interval}, seed=3)
    jpath = tmp_path / "journals" / "worker-0.jsonl"
    ctx = Context(run_dir=tmp_path, spec=s, cluster={}, keys=eo.keys(s, "r"),
                  journal=Journal(jpath, time.monotonic_ns()), deadline=time.monotonic() + time_limit)
    c = FakeController(ctx, 0, ctx.keys[0])
    c.script = tmp_path / "fake.py"
    c.script.write_text(FAKE)
    return c, jpath


def _ops(jpath: Path) -> list:
    return [o for o in read_jsonl(jpath) if o.type != INVOKE]


def test_controller_kills_mid_interval_restarts_and_stops_with_sigterm(tmp_path):
    c, jpath = _controller(tmp_path, time_limit=4.0, kill_interval=0.8)
    t = threading.Thread(target=c.run)
    t.start()
    t.join(30)
    assert not t.is_alive()
    c.ctx.journal.close()
    ops = _ops(jpath)
    fs = [o.f for o in ops]
    assert fs[0] == "start-processor" and fs[-1] == "stop-processor", fs
    crashes = [o for o in ops if o.f == "crash-processor"]
    assert len(crashes) >= 2, fs
    assert fs.count("restart-processor") >= len(crashes)
    for o in crashes:        # killed mid-interval: the stand-in's first dirty input is >= DIRTY_S old
        assert o.type == OK and o.value["dirty_s"] >= eo.DIRTY_S and o.value["since_checkpoint"] == 3
    incs = [o.value["incarnation"] for o in ops if o.f.endswith("start-processor")]
    assert incs == list(range(len(incs)))
    stop = ops[-1]
    assert stop.type == OK and stop.value["code"] == 0, stop     # drained, not killed by the early SIGTERM
    assert all(o.process == eo.CONTROLLER_PROCESS for o in ops)
    assert (tmp_path / "logs" / "processor-0.log").read_text().count("drained") == 1


def test_a_sigterm_before_the_processor_is_ready_waits_for_its_handler(tmp_path):
    # the deadline comes 0.1 s after the start: SIGTERM reaches a processor still "importing"
    c, jpath = _controller(tmp_path, time_limit=0.1, kill_interval=0.0)
    c.run()
    c.ctx.journal.close()
    ops = _ops(jpath)
    assert [o.f for o in ops] == ["start-processor", "stop-processor"]
    assert ops[-1].value["code"] == 0


def test_a_processor_that_dies_is_recorded_and_restarted(tmp_path):
    c, jpath = _controller(tmp_path, time_limit=2.5, kill_interval=0.0)
    c.script.write_text("import sys; sys.exit(3)\n")
    c.run()
    c.ctx.journal.close()
    ops = _ops(jpath)
    exits = [o for o in ops if o.f == "processor-exit"]
    assert exits and all(o.value["code"] == 3 for o in exits)
    assert sum(o.f == "restart-processor" for o in ops) >= len(exits)
    assert not any(o.f == "crash-processor" for o in ops)


def test_the_processor_refuses_to_start_without_its_arguments():
    import subprocess
    out = subprocess.run([sys.executable, "-m", "workloads.exactly_once"], capture_output=True, text=True,
                         cwd=Path(eo.__file__).parent.parent, timeout=60)
    assert out.returncode == 2 and "usage: python -m workloads.exactly_once --processor" in out.stderr


# ------------------------------------------------------------------------------------ on a cluster

def run(tmp_path, **kw) -> tuple[int, dict, str, Path]:
    return runs.run(tmp_path, "eo", workload="exactly-once", topics=1, concurrency=4, rate=100.0, **kw)


def _no_processor_left(run_dir: Path) -> bool:
    mark = str(run_dir.resolve()).encode()
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if mark in (p / "cmdline").read_bytes() and b"--processor" in (p / "cmdline").read_bytes():
                    return False
            except OSError:
                pass
    return True


@pytest.mark.integration
def test_checkpointed_processor_under_kills_and_partitions_is_valid(tmp_path):
    """The default protocol (seek to the checkpoint, flush before checkpointing) while the controller
    kills the processor every ~3 s and the nemesis kills brokers/bookies and partitions them."""
    code, res, out, run_dir = run(tmp_path, time_limit=15.0, nemesis=["kill", "partition"], nemesis_interval=4.0,
                                  options={"checkpoint_every": 50, "kill_interval": 3.0})
    c = res["checkers"]["exactly-once"]
    assert code == 0 and res["valid"] is True and c["valid"] is True, (out, c["anomalies"], c["stats"])
    (st,) = c["stats"]["pipelines"].values()
    assert st["crashes"] >= 2 and st["restarts"] >= 2 and st["checkpoints_ok"] >= 5, st
    assert st["inputs"] > 300 and st["inputs_covered"] > 0.5 * st["inputs"], st
    assert st["inputs_with_output"] >= st["inputs_covered"]
    assert _no_processor_left(run_dir)


# The must-fail run of this workload is made once in tests/spark_analysis/test_real_runs.py, which
# asserts what this file did and uses the same run for the campaign analysis's expectations.
