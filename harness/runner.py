"""The runner: one test run from spec to verdict, every step writing into the run folder first.

validate -> run folder + test.toml -> deploy -> workload + nemesis -> heal -> settle -> final reads
-> teardown (node logs into nodes/) -> merge journals -> checkers -> results.json -> report.html.
Whatever happens (an error, Ctrl-C, SIGTERM) the cluster is torn down and the journals gathered so
far are merged, checked and reported; the verdict is then "unknown" and results.json says why.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, TextIO

from core import store
from core.faults import FaultTimeline
from core.history import CheckResult, HistoryError, Journal
from core.spec import SpecError, TestSpec, from_mapping, load
from core.store import EXIT_CRASH
from harness import plugins
from harness.catalog import CATALOG
from harness.progress import Progress

NEMESIS_START_WAIT_S = 15.0        # faults begin with the first client op, or after this long at most
WORKER_GRACE_S = 15.0              # after the deadline, how long workers may finish their ops in flight
STOP_WAIT_S = 5.0                  # SIGTERM -> SIGKILL for worker processes
FINAL_READS_SLACK_S = 30.0         # on top of final_read_timeout for the final-reads process
NEMESIS_JOIN_S = 90.0              # a fault's undo may restart a node (that waits until healthy)

log = logging.getLogger("pulsar_chaos.runner")
_LOGGERS = ("pulsar_chaos", "nemesis", "harness", "clusters")     # into the run's runner.log


# ------------------------------------------------------------------------------------ the spec

def spec_from_args(spec_path: str | Path | None, overrides: dict[str, Any],
                   base: dict[str, Any] | None = None) -> TestSpec:
    """The spec of a run: the TOML file's table (if any; or `base`, e.g. a replay's spec), then the
    flags actually given on top.

    A bad file field is a SpecError naming the file and field; a bad flag names the flag."""
    raw: dict[str, Any] = dict(load(spec_path)) if spec_path else dict(base or {})
    source = str(spec_path) if spec_path else ""
    if spec_path:
        from_mapping(raw, source, catalog=CATALOG)  # the file alone must be valid: errors name the file
        raw = {k.replace("-", "_"): v for k, v in raw.items()}
    flags = {k: v for k, v in overrides.items() if v is not None}
    for table in ("bugs", "options", "lb_settings", "broker_settings", "bookie_settings"):
        if table in flags:
            flags[table] = {**(raw.get(table) or {}), **flags[table]}
    if (spec_path or base) and any(k in flags for k in ("workload", "bugs", "options", "bookie_settings", "ensemble",
                                                        "write_quorum", "ack_quorum")):
        # the file's expectation was for its own configuration: derive it again for the new one
        raw.pop("expected", None)
        raw.pop("expected_reason", None)
    raw.update(flags)
    try:
        return from_mapping(raw, source if not flags else "", catalog=CATALOG)
    except SpecError as e:
        if e.field in flags:
            flag = "--" + e.field.replace("_", "-")
            flag = {"--bugs": "--bug", "--options": "--option", "--lb-settings": "--lb-setting",
                    "--broker-settings": "--broker-setting", "--bookie-settings": "--bookie-setting"}.get(flag, flag)
            raise SpecError(flag, e.problem, e.fix.replace(e.field, flag)) from None
        if source and not e.source:
            raise SpecError(e.field, e.problem, e.fix, source) from None
        raise


def preflight(spec: TestSpec) -> None:
    """Prerequisites of the backend (root, iproute2, iptables, ZooKeeper); ClusterError if missing."""
    from clusters.deploy import backends
    backends.get(spec.backend).preflight()


def run(spec: TestSpec, out: TextIO = sys.stdout) -> int:
    """Run one test; returns the exit code (0 valid, 1 invalid, 2 unknown, 255 the harness crashed).

    Raises SpecError (before anything is created) for a bad spec."""
    spec = spec.validate(catalog=CATALOG).resolved().with_expectation(CATALOG)
    run_dir = store.create_run_dir(spec.results_dir, spec.test_name)
    store.write_test_toml(run_dir, spec)
    return Run(spec, run_dir, out).execute()


# ------------------------------------------------------------------------------------ one run

def _signame(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return "SIGINT"
    num = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGTERM
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class Run:
    def __init__(self, spec: TestSpec, run_dir: Path, out: TextIO = sys.stdout):
        import workloads
        self.spec, self.run_dir, self.out = spec, Path(run_dir), out
        self.workload = workloads.get(spec.workload)
        self.topics = self.workload.keys(spec, self.run_dir.name)
        self.step = "start"
        self.errors: list[str] = []
        self.timings: dict[str, float | None] = {k: None for k in (
            "deploy_s", "first_op_s", "workload_s", "heal_s", "settle_s", "final_reads_s", "teardown_s",
            "merge_s", "check_s", "report_s", "last_op_to_report_s", "run_to_first_op_s", "total_s",
            "nemesis_start_s")}
        self.cluster: Any = None
        self.cluster_name = f"r{uuid.uuid4().hex[:5]}"
        self.service_url = ""
        self.t0_ns: int | None = None
        self.deployed_at: float | None = None
        self.workers: list[subprocess.Popen] = []       # worker processes (and the final reads)
        self._names: dict[int, str] = {}
        self.nemesis: Any = None
        self.nemesis_thread: threading.Thread | None = None
        self.nemesis_stop = threading.Event()
        self.nemesis_journal: Journal | None = None
        self.observers: list[tuple[Any, Journal]] = []   # (running observer, its journal): harness/observers.py
        self.observed = False                            # an observer ran that wants the brokers' lb events
        self.final_reads_done = False
        self.interrupted: str | None = None
        self.check_errors: list[str] = []
        self.detection: dict[str, Any] = {}              # results.json's `detection` once checked
        self.faults: dict[str, Any] = {}                 # results.json's run.faults: the nemesis' tally
        self.torn_down = False
        self.cluster_dir: str | None = None
        self.started_at = store.now_iso()
        self.started_mono = time.monotonic()
        self.progress = Progress(self.run_dir, spec.time_limit, out)
        (self.run_dir / store.LOGS).mkdir(exist_ok=True)
        self._log_handler = logging.FileHandler(self.run_dir / store.RUNNER_LOG)
        self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in _LOGGERS:
            lg = logging.getLogger(name)
            lg.addHandler(self._log_handler)
            lg.setLevel(logging.INFO)

    # -- the lifecycle
    def execute(self) -> int:
        spec = self.spec
        nem = (f"schedule of {len(spec.nemesis_schedule)}" if spec.nemesis_schedule else ",".join(spec.nemesis)) or "none"
        self.progress.line(f"run {self.run_dir}: {spec.workload} workload, nemesis {nem}, "
                           f"{spec.time_limit:g}s, seed {spec.seed}")
        log.info("run %s: spec %s", self.run_dir, dataclasses.asdict(spec))
        try:
            for name, fn in (("deploy", self._deploy), ("workload", self._workload), ("heal", self._heal),
                             ("settle", self._settle), ("final-reads", self._final_reads)):
                self.step = name
                log.info("step %s", name)
                fn()
        except BaseException as e:   # KeyboardInterrupt, the CLI's Terminated (SIGTERM/SIGHUP), failures
            if isinstance(e, KeyboardInterrupt) or type(e).__name__ == "Terminated":
                self.interrupted = _signame(e)
                self._error(f"interrupted by {self.interrupted} during {self.step}")
            else:
                log.error("step %s failed:\n%s", self.step, traceback.format_exc())
                self._error(f"{self.step}: {type(e).__name__}: {e}")
        with self._shielded():
            return self._finish()

    def _error(self, text: str) -> None:
        log.error("%s", text)
        self.errors.append(text)

    def _deploy(self) -> None:
        from clusters.bookie.settings import bookie_config
        from clusters.broker.settings import broker_config
        from clusters.deploy import backends
        from clusters.deploy.spec import ClusterSpec
        from nemesis.registry import deployment_needs
        spec = self.spec
        cspec = ClusterSpec(name=self.cluster_name, brokers=spec.brokers, bookies=spec.bookies,
                            zookeepers=spec.zookeepers, ensemble=spec.ensemble, write_quorum=spec.write_quorum,
                            ack_quorum=spec.ack_quorum, clients=1, bugs=dict(spec.bugs),
                            load_manager=spec.load_manager, lb_settings=dict(spec.lb_settings),
                            broker_config=broker_config(spec.broker_settings),
                            bookie_config=bookie_config(spec.bookie_settings))
        # what the faults declare they need of the deployment (fake clocks, lazy disks, ...)
        faults = [*spec.nemesis, *(e["name"] for e in spec.nemesis_schedule)]
        for field_name, roles in deployment_needs(faults).items():
            setattr(cspec, field_name, roles)
        self.cluster = backends.get(spec.backend).cluster_class().for_run(cspec, self.run_dir.resolve())
        # the name first, so that a runner killed while deploying leaves a way to clean up
        store.write_json(self.run_dir / store.CLUSTER_JSON, {"name": self.cluster_name, "backend": spec.backend,
                                                             "base_dir": str(cspec.base_dir), "nodes": []})
        self.progress.phase("deploy")
        t = time.monotonic()
        self.cluster.up()
        self.deployed_at = time.monotonic()
        self.timings["deploy_s"] = round(self.deployed_at - t, 3)
        self.service_url = self.cluster.service_url
        st = self.cluster.status()
        store.write_json(self.run_dir / store.CLUSTER_JSON, {
            "name": st["name"], "backend": st.get("backend"), "service_url": st["service_url"],
            "zk_connect": st["zk_connect"], "base_dir": st["base_dir"], "subnet": st["subnet"],
            "nodes": [{k: n.get(k) for k in ("name", "role", "host", "ports", "pid")} for n in st["nodes"]]})
        log.info("deployed cluster %s in %.1fs: %s", self.cluster_name, self.timings["deploy_s"], self.service_url)
        if hasattr(self.workload, "prepare"):
            from workloads.base import Context
            cluster = json.loads((self.run_dir / store.CLUSTER_JSON).read_text())
            self.workload.prepare(Context(run_dir=self.run_dir, spec=spec, cluster=cluster, keys=list(self.topics)))

    def _worker_argv(self, *extra: str) -> list[str]:
        loaded = plugins.names()          # a worker registers what the CLI's plugins registered
        return [sys.executable, "-m", "harness.worker", "--run-dir", str(self.run_dir.resolve()),
                "--t0-ns", str(self.t0_ns), *(["--plugins", ",".join(loaded)] if loaded else []), *extra]

    def _launch(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.run_dir / store.LOGS / f"{name}.log", "ab") as logf:
            proc = self.cluster.run_client(argv, stdout=logf, stderr=subprocess.STDOUT, cwd=str(Path.cwd()))
        self._names[proc.pid] = name
        log.info("started %s: pid %d", name, proc.pid)
        return proc

    def _workload(self) -> None:
        spec = self.spec
        self.t0_ns = time.monotonic_ns()
        t0 = self.t0_ns / 1e9
        deadline_ns = self.t0_ns + int(spec.time_limit * 1e9)
        n = self.workload.worker_count(spec)
        self._start_observers()
        self.progress.phase("workload")
        for i in range(n):
            self.workers.append(self._launch(f"worker-{i}", self._worker_argv(
                "--worker", str(i), "--workers", str(n), "--deadline-ns", str(deadline_ns))))
        self.progress.start(t0)
        if spec.nemesis or spec.nemesis_schedule:
            from nemesis.combine import NemesisRunner, Scheduled
            self.nemesis_journal = Journal(store.journal_dir(self.run_dir) / store.NEMESIS_JOURNAL, self.t0_ns)
            schedule = [Scheduled(at=float(e["at"]), name=e["name"], hold=e.get("hold"), grudge=e.get("grudge"),
                                  plan=e.get("plan")) for e in spec.nemesis_schedule]
            self.nemesis = NemesisRunner(self.cluster, list(spec.nemesis), spec.nemesis_interval,
                                         random.Random(f"{spec.seed}:nemesis"), self.nemesis_journal,
                                         list(self.topics), overlap=spec.nemesis_overlap,
                                         schedule=schedule, grudge=spec.grudge)
            self.progress.watch_faults(self.nemesis.active)
            # faults start with the workload's first op (not during the clients' set-up)
            self.progress.first_op.wait(min(NEMESIS_START_WAIT_S, spec.time_limit))
            self.nemesis_thread = threading.Thread(target=self._run_nemesis, name="nemesis", daemon=True)
            # when the faults' clock starts (a schedule's `at` counts from here): a replay's times
            self.timings["nemesis_start_s"] = round((time.monotonic_ns() - self.t0_ns) / 1e9, 3)
            self.nemesis_thread.start()
        while any(p.poll() is None for p in self.workers) and time.monotonic() < t0 + spec.time_limit:
            time.sleep(0.2)
        self._stop_nemesis()            # faults end with the time limit, not with the last op in flight
        self.progress.phase("workload: ops in flight finishing")
        end = t0 + spec.time_limit + WORKER_GRACE_S
        while any(p.poll() is None for p in self.workers) and time.monotonic() < end:
            time.sleep(0.2)
        self._stop_workers(self.workers, "workload")
        self.timings["workload_s"] = round(time.monotonic() - t0, 3)
        self.progress.stop()
        self.progress.line(f"workload done: {self.progress.summary()}")

    def _start_observers(self) -> None:
        """The observers the workload's checkers need (`checkers.Checker.observers`, entries of
        harness/observers.py), journaling into the run's journals/ from the workload's start; stopped in
        `_finish`, before the teardown."""
        import checkers
        from harness import observers
        try:
            wanted = sorted(checkers.observers(self.workload.checkers(self.spec)))
            entries = {name: observers.OBSERVERS[name] for name in wanted}
        except Exception as e:
            self._error(f"observers: {type(e).__name__}: {e}")
            return
        if not entries:
            return
        cluster = json.loads((self.run_dir / store.CLUSTER_JSON).read_text())
        for name, entry in entries.items():
            journal = Journal(store.journal_dir(self.run_dir) / entry.journal, self.t0_ns)
            ctx = observers.ObserverContext(cluster, self.spec.load_manager, journal, self.run_dir)
            try:
                running = entry.start(ctx)
            except observers.ObserverError as e:
                journal.close()
                self._error(f"{name} observer: {e}")
                continue
            self.observers.append((running, journal))
            self.observed = self.observed or entry.imports_lb_events
            log.info("%s observer watching", name)

    def _stop_observers(self) -> None:
        while self.observers:
            rec, journal = self.observers.pop()
            try:
                rec.stop("run ended" if not self.errors else f"run ended during {self.step}")
            finally:
                journal.close()

    def _import_lb_events(self) -> None:
        """The brokers' logged load-balancer decisions into journals/ (when the ownership recorder ran)."""
        if not self.observed or self.t0_ns is None:
            return
        try:
            from harness.lb_events import import_lb_events
            counts = import_lb_events(self.run_dir, self.t0_ns)
            log.info("load-balancer events from the node logs: %s", counts)
        except Exception as e:
            log.error("importing load-balancer events failed:\n%s", traceback.format_exc())
            self._error(f"lb events: {type(e).__name__}: {e}")

    def _run_nemesis(self) -> None:
        try:
            self.nemesis.run(self.nemesis_stop)
        except Exception as e:
            log.error("nemesis crashed:\n%s", traceback.format_exc())
            self.errors.append(f"nemesis: {type(e).__name__}: {e}")

    def _stop_nemesis(self) -> None:
        self.nemesis_stop.set()
        if self.nemesis_thread is not None:
            self.nemesis_thread.join(NEMESIS_JOIN_S)
            if self.nemesis_thread.is_alive():
                self._error(f"nemesis: still undoing a fault after {NEMESIS_JOIN_S:.0f}s")

    def _stop_workers(self, procs: list[subprocess.Popen], what: str) -> None:
        """SIGTERM whatever still runs, SIGKILL after STOP_WAIT_S; a bad exit becomes an error."""
        for p in procs:
            if p.poll() is None:
                log.warning("%s: worker pid %d still running; stopping it", what, p.pid)
                try:
                    p.send_signal(signal.SIGTERM)
                except OSError:
                    pass
        end = time.monotonic() + STOP_WAIT_S
        for p in procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for p in procs:
            if p.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
                name = self._names.get(p.pid, f"pid {p.pid}")
                self._error(f"{what}: {name} exited with code {p.returncode} (see logs/{name}.log)")

    def _heal(self) -> None:
        t = time.monotonic()
        self.progress.phase("heal")
        if self.nemesis is not None:
            self.nemesis.heal()
        else:
            self.cluster.heal()
        bad = [n.name for n in self.cluster.nodes() if n.role != "client" and (not n.alive or n.paused)]
        if bad:
            log.warning("after heal, not running: %s", ", ".join(bad))
        self.timings["heal_s"] = round(time.monotonic() - t, 3)

    def _settle(self) -> None:
        self.progress.phase("settle")
        time.sleep(self.spec.settle)
        self.timings["settle_s"] = self.spec.settle

    def _final_reads(self) -> None:
        t = time.monotonic()
        self.progress.phase("final reads")
        proc = self._launch("final-reads", self._worker_argv("--final-reads"))
        self.workers.append(proc)         # stopped with the others if the run is interrupted
        end = t + self.spec.final_read_timeout + FINAL_READS_SLACK_S
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        self._stop_workers([proc], "final reads")
        self.final_reads_done = True
        self.timings["final_reads_s"] = round(time.monotonic() - t, 3)

    # -- the end, whatever happened
    @contextmanager
    def _shielded(self) -> Iterator[None]:
        """Cleanup runs to the end: further SIGINT/SIGTERM only print a note."""
        noted: list[bool] = []

        def note(signum: int, frame: Any) -> None:
            if not noted:
                noted.append(True)
                try:
                    print("pulsar-chaos: cleaning up (tearing the cluster down, saving the history); please wait",
                          file=sys.stderr, flush=True)
                except OSError:     # stderr is a pipe whose reader died (the parent that signalled us)
                    pass

        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                old[sig] = signal.signal(sig, note)
            except ValueError:       # not the main thread
                pass
        try:
            yield
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)

    def _finish(self) -> int:
        self.progress.stop()
        if self.step == "workload" and self.interrupted:
            self.progress.line(f"stopped: {self.progress.summary()}")
        self._stop_nemesis()
        self._stop_workers([p for p in self.workers if p.poll() is None], "stopping")
        try:
            self._stop_observers()          # before the teardown, which deletes every lock
        except Exception as e:
            log.error("stopping observers failed:\n%s", traceback.format_exc())
            self._error(f"observers: {type(e).__name__}: {e}")
        self._teardown()
        self._import_lb_events()
        if self.nemesis_journal is not None:
            self.nemesis_journal.close()
        history: list[Any] | None = None
        t = time.monotonic()
        try:
            history = store.merge(self.run_dir)
        except Exception as e:
            log.error("merge failed:\n%s", traceback.format_exc())
            self._error(f"merge: {type(e).__name__}: {e}")
        self.timings["merge_s"] = round(time.monotonic() - t, 3)
        if history and self.t0_ns is not None and self.deployed_at is not None:
            first = next((op.time_ns for op in history if op.process >= 0), None)
            if first is not None:
                self.timings["first_op_s"] = round(self.t0_ns / 1e9 + first / 1e9 - self.deployed_at, 3)
                self.timings["run_to_first_op_s"] = round(self.t0_ns / 1e9 + first / 1e9 - self.started_mono, 3)
        t = time.monotonic()
        results: dict[str, CheckResult] = {}
        check_errors: list[str] = []
        if history is not None:
            results = check_history(history, check_errors, self.spec)
        self.timings["check_s"] = round(time.monotonic() - t, 3)
        valid = store.verdict(list(results.values())) if not (self.errors or check_errors) else "unknown"
        code = store.exit_code_for(valid)
        self.check_errors = check_errors
        self.detection = detection_fields(history or [], results, valid)
        self.faults = FaultTimeline.of_history(history or []).tally()
        self._drop_cluster_data(valid)
        try:
            self._write_results(valid, code, results)
        except Exception:
            traceback.print_exc()
            print(f"error: cannot write {self.run_dir / store.RESULTS_JSON}; the run's journals are in "
                  f"{store.journal_dir(self.run_dir)}", file=sys.stderr)
            return EXIT_CRASH
        t = time.monotonic()
        report = None
        try:
            from harness import report as report_mod
            report = report_mod.render(self.run_dir)
        except Exception as e:
            log.error("report failed:\n%s", traceback.format_exc())
            self.progress.line(f"warning: the report could not be written: {type(e).__name__}: {e}")
        self.timings["report_s"] = round(time.monotonic() - t, 3)
        if history and self.t0_ns is not None:
            last = max((op.time_ns for op in history if op.process >= 0), default=None)
            if last is not None:
                self.timings["last_op_to_report_s"] = round(time.monotonic() - (self.t0_ns + last) / 1e9, 3)
        self.timings["total_s"] = round(time.monotonic() - self.started_mono, 3)
        try:
            self._write_results(valid, code, results)
        except Exception:
            pass
        log.info("timings %s", self.timings)
        for name in _LOGGERS:
            logging.getLogger(name).removeHandler(self._log_handler)
        self._log_handler.close()
        if report is not None:
            self.progress.line(f"report: {report}")
        line = faults_line(self.faults)
        if line:
            self.progress.line(line)
        errs = self.errors + self.check_errors
        why = f" ({'; '.join(errs)})" if errs else ""
        self.progress.line(f"verdict: {_verdict_word(valid)}{why}; {expectation_line(self.spec, valid)}; "
                           f"exit code {code}")
        return code

    def _drop_cluster_data(self, valid: Any) -> None:
        """A valid run's cluster folder (data of every node: ~30 MB a minute) goes once its logs are
        copied; any other run keeps it for a post-mortem, its path in results.json (run.cluster_dir)."""
        if self.cluster is None:
            return
        base = Path(self.cluster.base_dir)
        self.cluster_dir = str(base)
        if valid is True and self.torn_down and base.is_dir():
            shutil.rmtree(base, ignore_errors=True)
            self.cluster_dir = None

    def _teardown(self) -> None:
        if self.cluster is None:
            return
        self.progress.phase("teardown")
        t = time.monotonic()
        try:
            self.cluster.down()
            self.torn_down = True
        except Exception as e:
            log.error("teardown failed:\n%s", traceback.format_exc())
            self._error(f"teardown: {type(e).__name__}: {e} (fix: `pulsar-chaos cluster down --force "
                        f"--name {self.cluster_name}`)")
        try:
            collect_node_logs(Path(self.cluster.base_dir), self.run_dir / store.NODES)
        except Exception as e:
            log.error("collecting node logs failed:\n%s", traceback.format_exc())
            self._error(f"collect node logs: {type(e).__name__}: {e}")
        self.timings["teardown_s"] = round(time.monotonic() - t, 3)

    def _write_results(self, valid: Any, code: int, results: dict[str, CheckResult]) -> None:
        store.write_results(
            self.run_dir, valid=valid, exit_code=code, error="; ".join(self.errors + self.check_errors) or None,
            run={"dir": str(self.run_dir), "test_name": self.spec.test_name, "started_at": self.started_at,
                 "ended_at": store.now_iso(), "service_url": self.service_url, "seed": self.spec.seed,
                 "cluster": self.cluster_name, "cluster_dir": self.cluster_dir, "topics": self.topics,
                 "workers": self.workload.worker_count(self.spec), "step": self.step,
                 "final_reads": self.final_reads_done, "interrupted": self.interrupted,
                 "errors": list(self.errors), "timings": dict(self.timings), "faults": self.faults},
            checkers=results, **expectation_fields(self.spec, valid), **self.detection)


def faults_line(tally: dict[str, Any] | None) -> str:
    """A warning naming the faults that failed to start (and so never took effect), with the first
    error of each; "" when none failed. A run whose faults failed is judged on what it did test, but a
    user must not take it for a run under those faults."""
    failed = (tally or {}).get("failed") or {}
    if not failed:
        return ""
    took = (tally or {}).get("took_effect") or {}
    first = (tally or {}).get("first_error") or {}
    parts = [f"{name} {n}x ({first.get(name) or 'no error given'})" for name, n in sorted(failed.items())]
    ran = ", ".join(f"{name} {n}x" for name, n in sorted(took.items())) or "none"
    return (f"warning: {sum(failed.values())} fault(s) failed to start and had no effect: {'; '.join(parts)}; "
            f"took effect: {ran}")


def expectation_fields(spec: TestSpec | None, valid: Any) -> dict[str, Any]:
    """results.json's expectation: `expected` ("valid"/"invalid"), `expected_reason`, `expectation_met`
    (true, false, or null when the verdict is unknown)."""
    from core.expectation import met
    if spec is None:
        return {"expected": None, "expected_reason": "no readable test.toml", "expectation_met": None}
    e = spec.expectation(CATALOG)
    return {"expected": e.expected, "expected_reason": e.reason, "expectation_met": met(e.expected, valid)}


def detection_fields(history: list[Any], results: dict[str, Any], valid: Any) -> dict[str, Any]:
    """results.json's `detection`: the time to first detection of an invalid run (core/detection.py), else
    null; a failure to compute it is logged and left null, never failing the run."""
    from core.detection import detection_of
    try:
        return {"detection": detection_of(history, results, valid)}
    except Exception:
        log.error("time to first detection failed:\n%s", traceback.format_exc())
        return {"detection": None}


def expectation_line(spec: TestSpec | None, valid: Any) -> str:
    """`expected invalid (bug knob ...): met`, for the verdict line."""
    from core.expectation import met_word
    f = expectation_fields(spec, valid)
    if f["expected"] is None:
        return "expectation unknown (no readable test.toml)"
    why = f" ({f['expected_reason']})" if f["expected"] == "invalid" else ""
    return f"expected {f['expected']}{why}: {met_word(f['expectation_met'])}"


def _verdict_word(valid: Any) -> str:
    return "valid" if valid is True else "INVALID" if valid is False else "unknown"


def check_history(history: list[Any], errors: list[str] | None = None,
                  spec: TestSpec | None = None) -> dict[str, CheckResult]:
    """Every checker of the spec's workload (log when unknown) over the history; a checker that raises
    gives "unknown"."""
    import workloads
    out: dict[str, CheckResult] = {}
    try:
        checkers = workloads.get(spec.workload if spec else "log").checkers(spec)
    except Exception as e:
        if errors is not None:
            errors.append(f"check: {type(e).__name__}: {e}")
        return out
    for name, (fn, opts) in checkers.items():
        try:
            out[name] = fn(history, opts)
        except Exception as e:
            log.error("checker %s failed:\n%s", name, traceback.format_exc())
            out[name] = CheckResult("unknown", {}, {"error": f"{type(e).__name__}: {e}"})
            if errors is not None:
                errors.append(f"checker {name}: {type(e).__name__}: {e}")
    return out


def collect_node_logs(cluster_dir: Path, dest: Path) -> None:
    """Each node's log and config, and a listing of its data directory, into dest/<node>/."""
    src = cluster_dir / "nodes"
    if not src.is_dir():
        return
    dest.mkdir(parents=True, exist_ok=True)
    for node in sorted(p for p in src.iterdir() if p.is_dir()):
        out = dest / node.name
        out.mkdir(exist_ok=True)
        for name in ("node.log", "config.json"):
            if (node / name).is_file():
                shutil.copy2(node / name, out / name)
        data = node / "data"
        if data.is_dir():
            lines = []
            for root, dirs, files in os.walk(data):
                dirs.sort()
                for f in sorted(files):
                    p = Path(root) / f
                    try:
                        lines.append(f"{p.stat().st_size:>12}  {p.relative_to(data)}")
                    except OSError:
                        pass
            (out / "data-listing.txt").write_text("\n".join(lines) + "\n")
        if (data / "zoo.cfg").is_file():
            shutil.copy2(data / "zoo.cfg", out / "zoo.cfg")


# ------------------------------------------------------------------------------------ from disk

def recheck(run_dir: Path | str, out: TextIO | None = sys.stdout, require_ops: bool = True) -> int:
    """`pulsar-chaos check`: merge the journals if the run never did, re-run the checkers, rewrite
    results.json (keeping the run's own errors: an interrupted run stays unknown); the exit code.

    Raises HistoryError (naming the file and the fix) for a bad run folder or corrupt history, and,
    with `require_ops`, for a history with no client op (nothing to check: a verdict on it would
    say nothing; results.json is left as it was)."""
    run_dir = store.check_run_dir(run_dir)
    old = store.read_results(run_dir)
    if not (run_dir / store.HISTORY_JSONL).exists() and store.journal_paths(run_dir):
        history = store.merge(run_dir)
    else:
        history = store.load_history(run_dir)
    if require_ops and not any(op.process >= 0 for op in history):      # clients; the nemesis and observers < 0
        why = ""
        if old is not None and (old.get("error") or (old.get("run") or {}).get("errors")):
            why = f" (the run recorded: {old.get('error') or '; '.join((old.get('run') or {}).get('errors'))})"
        raise HistoryError(f"{run_dir / store.HISTORY_JSONL}: no client op in the history{why}; expected the "
                           f"invoke/ok/fail/info ops of the workload's clients; fix: rerun the test, or check the "
                           f"run folder it wrote")
    if old is not None and isinstance(old.get("run"), dict):
        run_info = dict(old["run"])
        if "errors" in run_info:          # the run's own errors (not the checkers')
            run_errors = list(run_info["errors"] or [])
        else:
            run_errors = [old["error"]] if old.get("error") else []
    else:
        run_info = {"dir": str(run_dir), "test_name": run_dir.parent.name, "started_at": None, "ended_at": None,
                    "service_url": "", "seed": None, "timings": {}}
        try:
            spec = store.load_spec(run_dir, catalog=CATALOG)
            run_info.update(test_name=spec.test_name, seed=spec.seed)
        except Exception:
            pass
        run_errors = ["the run did not finish: it left no results.json (was the runner killed?)"]
        run_info["errors"] = run_errors
    try:
        spec: TestSpec | None = store.load_spec(run_dir, catalog=CATALOG)
    except Exception:
        spec = None                        # an old or damaged test.toml: the log workload's checkers
    t = time.monotonic()
    check_errors: list[str] = []
    results = check_history(history, check_errors, spec)
    run_info.setdefault("timings", {})["check_s"] = round(time.monotonic() - t, 3)
    valid = store.verdict(list(results.values())) if not (run_errors or check_errors) else "unknown"
    code = store.exit_code_for(valid)
    errors = run_errors + check_errors
    store.write_results(run_dir, valid=valid, exit_code=code, error="; ".join(errors) or None, run=run_info,
                        checkers=results, checked_at=store.now_iso(), **expectation_fields(spec, valid),
                        **detection_fields(history, results, valid))
    if out is not None:
        why = f" ({'; '.join(errors)})" if errors else ""
        print(f"{run_dir}: {len(history)} ops; verdict: {_verdict_word(valid)}{why}; "
              f"{expectation_line(spec, valid)}; exit code {code}", file=out, flush=True)
    return code


def rereport(run_dir: Path | str) -> Path:
    """`pulsar-chaos report`: re-render report.html (merging and checking first if the run never did)."""
    from harness import report as report_mod
    run_dir = store.check_run_dir(run_dir)
    if store.read_results(run_dir) is None or (
            not (run_dir / store.HISTORY_JSONL).exists() and store.journal_paths(run_dir)):
        recheck(run_dir, out=None, require_ops=False)
    return report_mod.render(run_dir)
