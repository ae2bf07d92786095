"""The exactly-once workload: a checkpointing stream processor, SIGKILLed and restarted while it runs,
must count every input exactly once in its state and write every output at least once.

This is the Flink Pulsar connector's claim: an exactly-once source (the checkpoint holds the state and
the message id it reached; a restart restores it and replays the input by seek) and an at-least-once
sink (outputs are flushed before a checkpoint is taken).

Per *pipeline* (`--topics` of them) there are two topics, A (`...-in<p>`) and B (`...-out<p>`):

- Producer threads (`--concurrency`, batched and unbatched, replaced every `client_lifetime` like the
  log workload's) send unique integers v to the A topics with the partition key `k<v mod keys>`; v
  carries the amount `checkers.exactly_once.amount_of(v)`. Ops: `send`.
- The processor is its own OS process per pipeline, `python -m workloads.exactly_once --processor`,
  started by a controller thread of worker 0 (so "killed" is a real SIGKILL). It consumes A on a
  durable Exclusive subscription and acknowledges each input once processed; it keeps a running sum
  and count per key, and for each input sends the output {"k", "sum", "n", "in" (the input's message
  id), "v", "inc" (incarnation)} to B asynchronously (a batching producer, one producer name per
  incarnation). It skips any input at or before the last one it processed (a redelivery after a
  broker failover, or the checkpoint's own input after a seek). Every `checkpoint_every` inputs it
  *checkpoints*: flush B's producer (every output so far acknowledged; a failed output makes it exit
  so that it restarts from the last checkpoint), then write {seq, incarnation, message_id (the last
  input's, also serialised), count, sums, counts} to `<run>/exactly-once/pipeline-<p>/checkpoint.json`
  durably (a temporary file, fsync, rename, fsync of the folder), journaling the op `checkpoint`
  (invoke with the content, ok once durable). On start it restores that file and seeks the
  subscription to the checkpoint's message id (the client resumes after it; no checkpoint: to the
  earliest message), journaling `restore`. Its ops are in `journals/processor-<p>-<incarnation>.jsonl`
  (process 800000 + 1000 p + incarnation); its log in `logs/processor-<p>.log`.
- The controller (process 700000 + p) is the workload's own fault plan: it kills the processor with
  SIGKILL after a seeded uptime of 0.5-1.5 x `kill_interval` seconds, at a moment when the processor
  is mid-interval (its first input since the last checkpoint was processed at least 0.2 s before; it
  waits up to 5 s for that, then kills anyway), and restarts it after a seeded 0.2-1 s; ops
  `start-processor`, `crash-processor`, `restart-processor`, `processor-exit` (it died on its own),
  `stop-processor`. The processor reports its progress to the controller through a 32-byte status
  file (mmap). At the time limit the controller sends SIGTERM (starting one more incarnation first if
  none is running): the processor drains what A still has (until 1.5 s without input, 8 s after the
  signal at most), checkpoints and exits. A processor starts with SIGTERM blocked until its handler is
  in place, so the signal never kills it half-started. The run's nemesis faults the cluster at the
  same time.
- B topics get broker deduplication (`dedup_output`, a topic policy set in `prepare`): an output
  producer's own resends after a reconnect are then dropped by the broker, so duplicates in B come
  only from restarts, as the claim says. The output producer is created with an explicit
  `initial_sequence_id` (`pin_sequence_ids`): the C++ client (pulsar-client 3.x) resets its
  sequence-id counter to the broker's last id on every reconnect made before its first receipt
  (`ProducerImpl::handleCreateProducer` tests `lastSequenceIdPublished_ == -1`; the Java client was
  fixed by apache/pulsar#2047), so after a reconnect that follows a failed first write (a topic fenced
  by a new owner) its next messages reuse the ids of the ones it resends, and a deduplicating broker
  drops them as duplicates while acknowledging them: `lost-output`. A chaos run with zk-isolate found
  this.
- Final step: a Reader reads every A and B from the earliest message (`read`), and the latest durable
  checkpoint file is recorded as `final-checkpoint`.

Checked by checkers/exactly_once.py: every checkpoint's sums equal the sums over A's messages up to its
message id (`double-counted` / `missed`), every input up to the latest durable checkpoint has an
output in B (`lost-output`), duplicates only for inputs after a restart's resume point
(`duplicate-without-restart`), every output's running sum is the exactly-once one (`wrong-output`).

The unsafe setting `seek=false` restores the state but resumes the input where the subscription left
off instead of at the checkpoint: the inputs processed (and acknowledged) after the checkpoint are
never read again, so the next checkpoint has `missed` them (and later outputs of their keys are
`wrong-output`). The controller's mid-interval kill makes that certain for each kill, not lucky: the
input it waits for was acknowledged at least 0.2 s before the kill and the client sends
acknowledgements within 100 ms, so the broker has skipped it; a kill is spared only if a checkpoint
completes in the <= 20 ms between the controller's look at the status and the kill (the crash op
records `since_checkpoint` as the processor left it). With the default `seek=true` the seek resets the
subscription to the checkpoint, and the acknowledgements only serve the broker's backlog.

`checkpoint_every` inputs should span more than 0.2 s of input (K / (rate / topics) seconds), or
the controller rarely finds the processor mid-interval and kills it after its 5 s wait instead.
"""
from __future__ import annotations

import argparse
import base64
import json
import logging
import mmap
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from checkers.exactly_once import amount_of
from core.expectation import Unsafe
from core.history import FAIL, INFO, INVOKE, OK, Journal, MessageId, Op
from core.spec import TestSpec
from workloads import base
from workloads.base import MAX_WORKERS, Context, Planned

DESCRIPTION = ("a stateful processor, SIGKILLed and restarted, sums keyed inputs of topic A into topic B; "
               "its checkpoints must count every input once, B must hold every output")
OPTIONS: dict[str, tuple[Any, str]] = {
    "checkpoint_every": (50, "K: the processor checkpoints (flush outputs, then write its state) every K inputs"),
    "keys": (8, "distinct partition keys of the inputs (k<value mod keys>)"),
    "kill_interval": (4.0, "mean seconds the processor runs before it is SIGKILLed and restarted (0: never)"),
    "seek": (True, "on restart, seek the input to the checkpoint's message id (false: the unsafe resume "
                   "from the subscription's acknowledged position)"),
    "dedup_output": (True, "broker deduplication on the output topics, so that only restarts duplicate outputs"),
    "pin_sequence_ids": (True, "give the output producer an explicit initial sequence id (false: the C++ "
                               "client's default, which reuses ids after a reconnect before its first receipt "
                               "and so loses outputs on a deduplicated topic, apache/pulsar#2047)"),
}
# deliberately unsafe: the run must be invalid (core/expectation.py)
UNSAFE = (Unsafe({"seek": False}, "resuming from the subscription instead of seeking to the checkpoint "
                                  "skips acknowledged inputs after every mid-interval kill: `missed`"),
          Unsafe({"pin_sequence_ids": False},
                 "with dedup on the outputs, the official C++ client numbers an output like the one it resends "
                 "after a reconnect made before its first receipt; the broker acknowledges it as a duplicate "
                 "and never stores it: `lost-output`",
                 given={"dedup_output": True}),)
SUBSCRIPTION = "exactly-once"
CONTROLLER_PROCESS = 700_000      # + pipeline
PROCESSOR_PROCESS = 800_000       # + 1000 * pipeline + incarnation
VALUE_STRIDE = 10_000_000
DIRTY_S = 0.2                     # a kill waits until the first uncheckpointed input is this old ...
KILL_WAIT_S = 5.0                 # ... for at most this long
RESTART_DELAY_S = (0.2, 1.0)
DRAIN_IDLE_S = 1.5                # after SIGTERM the processor drains until this long without input ...
DRAIN_MAX_S = 8.0                 # ... or this long in all, then checkpoints and exits
STOP_WAIT_S = DRAIN_MAX_S + 4.0   # the controller SIGKILLs a processor that has not exited by then
OUTPUT_SEND_TIMEOUT_MS = 30_000
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_STATUS = struct.Struct("<dddd")  # checkpoint seq, processed count, checkpointed count, first dirty (monotonic)


def _opt(spec: TestSpec, name: str) -> Any:
    return spec.options.get(name, OPTIONS[name][0])


def keys(spec: TestSpec, run_id: str) -> list[str]:
    """[A0, B0, A1, B1, ...]: the input and output topic of each pipeline (`spec.topics` of them)."""
    out = []
    for p in range(spec.topics):
        base_name = f"persistent://public/default/{spec.test_name}-{run_id}"
        out += [f"{base_name}-in{p}", f"{base_name}-out{p}"]
    return out


def pipelines(topics: list[str]) -> list[tuple[str, str]]:
    return [(topics[i], topics[i + 1]) for i in range(0, len(topics) - 1, 2)]


def worker_count(spec: TestSpec) -> int:
    return max(1, min(MAX_WORKERS, spec.concurrency))


def state_dir(run_dir: Path, pipeline: int) -> Path:
    return Path(run_dir) / "exactly-once" / f"pipeline-{pipeline}"


def checkpoint_path(run_dir: Path, pipeline: int) -> Path:
    return state_dir(run_dir, pipeline) / "checkpoint.json"


def message_key(spec: TestSpec, value: int) -> str:
    return f"k{value % max(1, int(_opt(spec, 'keys')))}"


# ------------------------------------------------------------------------------------ the producers

@dataclass(frozen=True)
class Thread:
    index: int
    batched: bool
    worker: int


def threads(spec: TestSpec, workers: int | None = None) -> list[Thread]:
    """Every logical client thread is an input producer, alternating batched and unbatched."""
    w = workers or worker_count(spec)
    return [Thread(i, i % 2 == 0, i % w) for i in range(spec.concurrency)]


def generator(spec: TestSpec, thread: Thread, inputs: list[str]) -> Iterator[Planned]:
    """The thread's sends (`base.send_or_receive`): unique values to seeded input topics."""
    return base.send_or_receive(spec, "exactly-once", thread.index, True, inputs)


def prepare(ctx: Context) -> None:
    if _opt(ctx.spec, "dedup_output"):
        from workloads.pulsar_client import set_topic_policy
        for _, b in pipelines(ctx.keys):
            set_topic_policy(ctx.admin_urls(), b, "deduplication", True)


def start(ctx: Context) -> list[threading.Thread]:
    from workloads.pulsar_client import send, session_for
    session = session_for(ctx)
    inputs = [a for a, _ in pipelines(ctx.keys)]
    mine = [t for t in threads(ctx.spec, ctx.workers) if t.worker == ctx.worker]

    def run(t: Thread) -> None:
        for topic in inputs:
            try:
                session.producer(topic, t.batched)
            except Exception:
                pass

        def perform(p: Planned, process: int) -> tuple[str, dict[str, Any]]:
            return send(session, p.key, t.batched, p.value, message_key(ctx.spec, p.value))
        base.drive(ctx, t.index, ctx.spec.concurrency, generator(ctx.spec, t, inputs), perform)
    targets = [(f"thread-{t.index}", lambda t=t: run(t)) for t in mine]
    if ctx.worker == 0:
        controllers = [Controller(ctx, p, a) for p, (a, _) in enumerate(pipelines(ctx.keys))]
        ctx.cleanups.insert(0, lambda: [c.kill_now() for c in controllers])
        targets += [(f"controller-{c.pipeline}", c.run) for c in controllers]
    return base.start_threads(ctx, targets)


# ------------------------------------------------------------------------------------ the controller

class Controller:
    """Starts the pipeline's processor, SIGKILLs it mid-interval at seeded times and restarts it; at the
    deadline stops it with SIGTERM (drain, checkpoint, exit). Every action is a journaled op."""

    def __init__(self, ctx: Context, pipeline: int, input_topic: str):
        self.ctx, self.pipeline, self.input = ctx, pipeline, input_topic
        self.process = CONTROLLER_PROCESS + pipeline
        self.rng = ctx.rng("processor", pipeline)
        self.kill_interval = float(_opt(ctx.spec, "kill_interval"))
        self.proc: subprocess.Popen | None = None
        self.incarnation = 0
        self._lock = threading.Lock()

    def _op(self, f: str, value: Any, perform: Callable[[], tuple[str, dict[str, Any]]]) -> None:
        assert self.ctx.journal is not None
        inv = base.append(self.ctx.journal, Op(process=self.process, type=INVOKE, f=f, key=self.input, value=value))
        type_, changes = perform()
        base.append(self.ctx.journal, inv.complete(type_, **changes))

    def _status_path(self) -> Path:
        return state_dir(self.ctx.run_dir, self.pipeline) / f"status-{self.incarnation}.bin"

    def status(self) -> tuple[float, float, float, float]:
        try:
            with open(self._status_path(), "rb") as f:
                return _STATUS.unpack(f.read(_STATUS.size))
        except (OSError, struct.error):
            return (0.0, 0.0, 0.0, 0.0)

    def argv(self) -> list[str]:
        """The processor's command line (the worker's pid is added)."""
        assert self.ctx.journal is not None
        return [sys.executable, "-m", "workloads.exactly_once", "--processor", "--run-dir", str(self.ctx.run_dir),
                "--pipeline", str(self.pipeline), "--incarnation", str(self.incarnation),
                "--t0-ns", str(self.ctx.journal.t0_ns), "--status", str(self._status_path())]

    def _spawn(self) -> subprocess.Popen:
        d = state_dir(self.ctx.run_dir, self.pipeline)
        d.mkdir(parents=True, exist_ok=True)
        self._status_path().write_bytes(b"\0" * _STATUS.size)
        argv = self.argv()
        logs = Path(self.ctx.run_dir) / "logs"
        logs.mkdir(exist_ok=True)
        # the child starts with SIGTERM blocked, so that a SIGTERM sent while it is still importing
        # waits for its handler (it then drains and checkpoints) instead of killing it
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            with open(logs / f"processor-{self.pipeline}.log", "ab") as out:
                return subprocess.Popen(argv + ["--parent-pid", str(os.getpid())], stdout=out,
                                        stderr=subprocess.STDOUT)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _start(self, f: str) -> None:
        def go() -> tuple[str, dict[str, Any]]:
            try:
                with self._lock:
                    self.proc = None
                    self.proc = self._spawn()
            except Exception as e:
                return FAIL, {"error": f"{type(e).__name__}: {e}"}
            return OK, {"value": {"incarnation": self.incarnation, "pid": self.proc.pid}}
        self._op(f, {"incarnation": self.incarnation}, go)

    def _wait(self, until: float, cond: Callable[[], bool] | None = None) -> str:
        """Wait until `until`: 'exited', 'stop' (stop or deadline), 'cond' or 'time'."""
        while True:
            if self.proc is None or self.proc.poll() is not None:
                return "exited"
            if self.ctx.stop.is_set() or time.monotonic() >= self.ctx.deadline:
                return "stop"
            if cond is not None and cond():
                return "cond"
            if time.monotonic() >= until:
                return "time"
            time.sleep(0.02)

    def _dirty(self) -> bool:
        _, _, _, first_dirty = self.status()
        return first_dirty > 0 and time.monotonic() - first_dirty >= DIRTY_S

    def run(self) -> None:
        try:
            self._run()
        except base.Retired:
            pass
        finally:
            self.kill_now()

    def _run(self) -> None:
        ctx = self.ctx
        self._start("start-processor")
        while self.proc is not None:
            uptime = self.rng.uniform(0.5, 1.5) * self.kill_interval if self.kill_interval > 0 else float("inf")
            why = self._wait(time.monotonic() + uptime)
            if why == "time":
                why = self._wait(time.monotonic() + KILL_WAIT_S, self._dirty)
            if why == "stop":
                break
            if why == "exited":
                code = self.proc.returncode
                self._op("processor-exit", {"incarnation": self.incarnation},
                         lambda: (OK, {"value": {"incarnation": self.incarnation, "code": code}}))
            else:
                def kill() -> tuple[str, dict[str, Any]]:
                    assert self.proc is not None
                    self.proc.kill()
                    self.proc.wait()
                    seq, processed, ckpt_count, first_dirty = self.status()     # as the processor left it
                    return OK, {"value": {"incarnation": self.incarnation, "pid": self.proc.pid,
                                          "checkpoint": int(seq), "processed": int(processed),
                                          "since_checkpoint": int(processed - ckpt_count),
                                          "dirty_s": round(time.monotonic() - first_dirty, 3) if first_dirty else 0}}
                self._op("crash-processor", {"incarnation": self.incarnation}, kill)
            if ctx.stop.wait(self.rng.uniform(*RESTART_DELAY_S)) or time.monotonic() >= ctx.deadline:
                self.proc = None
                break
            self.incarnation += 1
            self._start("restart-processor")
        if ((self.proc is None or self.proc.poll() is not None) and not ctx.stop.is_set()
                and time.monotonic() >= ctx.deadline):
            # at the deadline with no processor running: one more to drain the input and checkpoint
            self.incarnation += 1
            self._start("restart-processor")
        if self.proc is not None and self.proc.poll() is None:
            def stop() -> tuple[str, dict[str, Any]]:
                assert self.proc is not None
                self.proc.send_signal(signal.SIGTERM)
                try:
                    code = self.proc.wait(STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                    return INFO, {"error": f"the processor did not exit within {STOP_WAIT_S:.0f}s of SIGTERM; "
                                           f"killed", "value": {"incarnation": self.incarnation}}
                return (OK if code == 0 else FAIL), {"value": {"incarnation": self.incarnation, "code": code}}
            self._op("stop-processor", {"incarnation": self.incarnation}, stop)

    def kill_now(self) -> None:
        with self._lock:
            p = self.proc
        if p is not None and p.poll() is None:
            p.kill()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


def _die_with_parent(parent: int | None) -> None:
    """Be SIGKILLed when the worker that started us dies (prctl PR_SET_PDEATHSIG); exit at once if it
    is already gone."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except Exception:
        pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)


# ------------------------------------------------------------------------------------ the processor

def _pos(mid: Any) -> tuple[int, int, int]:
    return (mid.ledger_id(), mid.entry_id(), max(0, mid.batch_index()))


def write_checkpoint(path: Path, content: dict[str, Any]) -> None:
    """Durably replace the checkpoint: a temporary file, fsync, rename over, fsync of the folder."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(content, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


class Processor:
    """One incarnation of a pipeline's processor (see the module docstring)."""

    def __init__(self, run_dir: Path, pipeline: int, incarnation: int, t0_ns: int, status: Path | None):
        from core import store
        self.run_dir = Path(run_dir)
        self.spec = store.load_spec(self.run_dir, catalog=None)
        self.cluster = json.loads((self.run_dir / store.CLUSTER_JSON).read_text())
        self.pipeline, self.incarnation = pipeline, incarnation
        self.input, self.output = pipelines(keys(self.spec, self.run_dir.name))[pipeline]
        self.every = max(1, int(_opt(self.spec, "checkpoint_every")))
        self.seek = bool(_opt(self.spec, "seek"))
        self.n_keys = max(1, int(_opt(self.spec, "keys")))
        self.pin_sequence_ids = bool(_opt(self.spec, "pin_sequence_ids"))
        self.process = PROCESSOR_PROCESS + 1000 * pipeline + incarnation
        self.journal = Journal(self.run_dir / "journals" / f"processor-{pipeline}-{incarnation}.jsonl", t0_ns)
        self.path = checkpoint_path(self.run_dir, pipeline)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.stop = threading.Event()
        self.stop_at = 0.0                 # time.monotonic() of SIGTERM: drain until DRAIN_MAX_S after it
        self.status = None
        if status is not None and status.exists():
            fd = os.open(status, os.O_RDWR)
            self.status = mmap.mmap(fd, _STATUS.size)
            os.close(fd)
        self.seq = 0
        self.count = 0
        self.ckpt_count = 0
        self.first_dirty = 0.0
        self.sums: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.last_pos: tuple[int, int, int] | None = None
        self.last_mid: Any = None
        self.send_errors: list[str] = []
        self._err_lock = threading.Lock()
        self.client: Any = None
        self.consumer: Any = None
        self.producer: Any = None

    def log(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} processor-{self.pipeline}/{self.incarnation}: {text}", flush=True)

    def _status(self) -> None:
        if self.status is not None:
            _STATUS.pack_into(self.status, 0, float(self.seq), float(self.count), float(self.ckpt_count),
                              self.first_dirty)

    def _op(self, f: str, value: Any) -> Op:
        return self.journal.append(Op(process=self.process, type=INVOKE, f=f, key=self.input, value=value))

    # -- start
    def restore(self) -> bool:
        import pulsar
        ckpt = read_checkpoint(self.path)
        if ckpt:
            self.seq = int(ckpt["seq"])
            self.count = self.ckpt_count = int(ckpt["count"])
            self.sums = {k: int(v) for k, v in ckpt["sums"].items()}
            self.counts = {k: int(v) for k, v in ckpt["counts"].items()}
            mid = ckpt.get("message_id")
            self.last_pos = (int(mid["ledger_id"]), int(mid["entry_id"]), max(0, int(mid["batch_index"]))) \
                if mid else None
        target = pulsar.MessageId.deserialize(base64.b64decode(ckpt["mid_b64"])) \
            if ckpt and ckpt.get("mid_b64") else pulsar.MessageId.earliest
        inv = self._op("restore", {"incarnation": self.incarnation, "output": self.output,
                                   "checkpoint": ckpt["seq"] if ckpt else None,
                                   "message_id": ckpt.get("message_id") if ckpt else None,
                                   "count": self.count, "seek": self.seek})
        self._status()
        logger = logging.getLogger(f"processor-{self.pipeline}")
        logger.setLevel(logging.WARNING)
        if not logger.handlers:
            h = logging.StreamHandler(sys.stdout)
            h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s pulsar: %(message)s"))
            logger.addHandler(h)
        self.client = pulsar.Client(self.cluster["service_url"], operation_timeout_seconds=10,
                                    connection_timeout_ms=5000, logger=logger)
        step = "subscribe"
        last_error = ""
        while not (self.stop.is_set() and time.monotonic() >= self.stop_at + DRAIN_MAX_S):
            try:
                if self.consumer is None:
                    step = "subscribe"
                    self.consumer = self.client.subscribe(
                        self.input, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Exclusive,
                        initial_position=pulsar.InitialPosition.Earliest,
                        consumer_name=f"{self.run_dir.name[-6:]}-eo{self.pipeline}-{self.incarnation}")
                    if self.seek:
                        step = "seek"
                        self.consumer.seek(target)
                step = "create_producer"
                from workloads.pulsar_client import INITIAL_SEQUENCE_ID
                kw: dict[str, Any] = {"initial_sequence_id": INITIAL_SEQUENCE_ID} if self.pin_sequence_ids else {}
                self.producer = self.client.create_producer(
                    self.output, producer_name=f"{self.run_dir.name[-6:]}-eo{self.pipeline}-{self.incarnation}",
                    batching_enabled=True, batching_max_publish_delay_ms=10, block_if_queue_full=True,
                    send_timeout_millis=OUTPUT_SEND_TIMEOUT_MS, **kw)
                break
            except Exception as e:
                last_error = f"{step}: {type(e).__name__}: {e}"
                self.log(f"{last_error}; retrying")
                if step == "seek" and self.consumer is not None:
                    try:
                        self.consumer.close()
                    except Exception:
                        pass
                    self.consumer = None
                time.sleep(1.0)
        if self.producer is None:
            self.journal.append(inv.complete(INFO, error=f"stopped before the processor started ({last_error})"))
            return False
        self.journal.append(inv.complete(OK))
        self.log(f"restored checkpoint {self.seq} (count {self.count}, {'seek' if self.seek else 'no seek'} "
                 f"to {self.last_pos})")
        return True

    # -- running
    def _on_sent(self, res: Any, msg_id: Any) -> None:
        import pulsar
        if res != pulsar.Result.Ok:
            with self._err_lock:
                self.send_errors.append(str(res))

    def _ack(self, msg: Any) -> None:
        try:
            self.consumer.acknowledge(msg)
        except Exception as e:          # the position is the checkpoint's, not the subscription's
            self.log(f"acknowledge: {type(e).__name__}: {e}")

    def handle(self, msg: Any) -> None:
        mid = msg.message_id()
        pos = _pos(mid)
        if self.last_pos is not None and pos <= self.last_pos:
            self._ack(msg)                        # seen already: a redelivery, or the seek's target
            return
        data = msg.data()
        try:
            value = int(data.decode())
        except (UnicodeDecodeError, ValueError):
            self.log(f"skipping a message that is not an integer at {pos}: {data[:40]!r}")
            self._ack(msg)
            return
        key = msg.partition_key() or f"k{value % self.n_keys}"
        self.sums[key] = self.sums.get(key, 0) + amount_of(value)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.count += 1
        self.last_pos, self.last_mid = pos, mid
        m = MessageId.from_pulsar(mid)
        out = {"k": key, "sum": self.sums[key], "n": self.counts[key],
               "in": [m.ledger_id, m.entry_id, m.partition, m.batch_index], "v": value, "inc": self.incarnation}
        self.producer.send_async(json.dumps(out, separators=(",", ":")).encode(), self._on_sent)
        self._ack(msg)
        if not self.first_dirty:
            self.first_dirty = time.monotonic()
        self._status()

    def checkpoint(self) -> bool:
        """Flush the outputs, then write the checkpoint durably; False if an output failed (the caller
        exits and the controller restarts it from the last checkpoint)."""
        mid = self.last_mid
        content = {"seq": self.seq + 1, "incarnation": self.incarnation, "input": self.input, "output": self.output,
                   "message_id": asdict(MessageId.from_pulsar(mid)) if mid is not None else None,
                   "mid_b64": base64.b64encode(mid.serialize()).decode() if mid is not None else None,
                   "count": self.count, "sums": dict(self.sums), "counts": dict(self.counts)}
        inv = self._op("checkpoint", content)
        try:
            self.producer.flush()
        except Exception as e:
            with self._err_lock:
                self.send_errors.append(f"flush: {type(e).__name__}: {e}")
        with self._err_lock:
            errors = list(self.send_errors)
        if errors:
            self.journal.append(inv.complete(FAIL, error=f"{len(errors)} output(s) failed, first: {errors[0]}"))
            self.log(f"outputs failed ({errors[0]}); exiting to restart from checkpoint {self.seq}")
            return False
        write_checkpoint(self.path, content)
        self.journal.append(inv.complete(OK))
        self.seq += 1
        self.ckpt_count = self.count
        self.first_dirty = 0.0
        self._status()
        return True

    def run(self) -> int:
        import pulsar
        if not self.restore():
            return 0
        draining_until = idle_since = 0.0
        while True:
            if self.stop.is_set() and not draining_until:
                draining_until = self.stop_at + DRAIN_MAX_S
                idle_since = time.monotonic()
                self.log("SIGTERM: draining the input")
            if draining_until and (time.monotonic() >= draining_until
                                   or time.monotonic() - idle_since >= DRAIN_IDLE_S):
                break
            try:
                msg = self.consumer.receive(200)
            except pulsar.Timeout:
                continue
            except Exception as e:
                self.log(f"receive: {type(e).__name__}: {e}")
                time.sleep(0.2)
                continue
            idle_since = time.monotonic()
            self.handle(msg)
            if self.count - self.ckpt_count >= self.every and not self.checkpoint():
                return 3
        if self.count > self.ckpt_count and not self.checkpoint():
            return 3
        self.log(f"stopped at checkpoint {self.seq} (count {self.count})")
        return 0


def processor_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m workloads.exactly_once --processor")
    p.add_argument("--processor", action="store_true", required=True)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--pipeline", type=int, required=True)
    p.add_argument("--incarnation", type=int, required=True)
    p.add_argument("--t0-ns", type=int, required=True)
    p.add_argument("--status", type=Path, default=None)
    p.add_argument("--parent-pid", type=int, default=None)
    args = p.parse_args(argv)
    _die_with_parent(args.parent_pid)
    proc = Processor(args.run_dir, args.pipeline, args.incarnation, args.t0_ns, args.status)
    def on_stop(*_: Any) -> None:
        proc.stop_at = proc.stop_at or time.monotonic()
        proc.stop.set()
    for sig in _STOP_SIGNALS:
        signal.signal(sig, on_stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)     # blocked by the controller at spawn
    proc.log(f"pid {os.getpid()}, {proc.input} -> {proc.output}")
    code = 1
    try:
        code = proc.run()
    except Exception:
        import traceback
        proc.log(traceback.format_exc())
    finally:
        proc.journal.close()
        sys.stdout.flush()
    os._exit(code)       # skip teardown: the C++ client's destructors can hang on a cut-off broker


# ------------------------------------------------------------------------------------ the end

def final_checkpoint(run_dir: Path, pipeline: int, input_topic: str, output_topic: str
                     ) -> tuple[str, dict[str, Any]]:
    try:
        ckpt = read_checkpoint(checkpoint_path(run_dir, pipeline))
    except (OSError, ValueError) as e:
        return INFO, {"error": f"cannot read the checkpoint: {type(e).__name__}: {e}"}
    return OK, {"value": {"input": input_topic, "output": output_topic, "checkpoint": ckpt}}


def start_final(ctx: Context) -> list[threading.Thread]:
    """Per pipeline: A and B read from the earliest message, then the latest durable checkpoint."""
    from workloads.pulsar_client import read_topic, session_for
    session = session_for(ctx)

    def one(p: int, a: str, b: str) -> None:
        first = base.FINAL_PROCESS + 3 * p
        for i, topic in enumerate((a, b)):
            base.once(ctx, first + i, "read", topic, None,
                      lambda topic=topic: read_topic(session, topic, ctx.spec.final_read_timeout))
        base.once(ctx, first + 2, "final-checkpoint", a, None, lambda: final_checkpoint(ctx.run_dir, p, a, b))
    return base.start_threads(ctx, [(f"final-{p}", lambda p=p, a=a, b=b: one(p, a, b))
                                    for p, (a, b) in enumerate(pipelines(ctx.keys))])


def checkers(spec: TestSpec | None = None) -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    from checkers import select
    dedup = bool(_opt(spec, "dedup_output")) if spec is not None else True
    want = {"exactly-once": {"dedup_output": dedup}, "perf": {"write_fs": ("send",)}}
    return select(want)


if __name__ == "__main__":
    if "--processor" in sys.argv[1:]:
        processor_main(sys.argv[1:])
    print("usage: python -m workloads.exactly_once --processor --run-dir DIR --pipeline N --incarnation N "
          "--t0-ns T [--status FILE] [--parent-pid PID]", file=sys.stderr)
    sys.exit(2)
