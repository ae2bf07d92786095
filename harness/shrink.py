"""`pulsar-chaos shrink RUN`: from a failing run, the smallest run that still fails the same way.

The failure to keep is the run's *signature*: the (checker, anomaly type) pairs of its invalid checkers
(`log: lost`). A candidate is a spec made of the run's own (seed, workload, bug knobs, cluster) and of
the parts the search reduces: the faults (as the run really had them, `harness/replay.py`), the time
limit, the rate, the concurrency and the topics. Each candidate is run up to `tries` times (bugs under
faults are flaky) and *still fails* when one try shows a pair of the signature (the tries stop there).

The search, in order, each step keeping a change only when the candidate still fails:

1. the replay of the run itself (if it does not reproduce, there is nothing to shrink from);
2. no fault at all (a bug knob alone may do), then delta debugging over the faults (chunks removed,
   halves first, down to single faults: the complement steps of Zeller's ddmin);
3. the faults moved to the start, the time limit down to the end of the last fault (early, so that
   every later candidate is a short run), the gaps between the faults halved;
4. each fault's resolved target as its symbolic target (`kill:owner` resolved again, not broker-2);
5. each hold halved (and the time limit again), the rate, concurrency and topics halved.

`Search` is the pure part: it calls `run_candidate(candidate, tries) -> Outcome` and knows nothing of
processes, so tests drive it with a fake runner. `ShrinkRun` is the command: a shrink folder
(`<results>/shrinks/<test>/<time>/`) with every candidate's run folders (`runs/c007/<time>/`), its spec
(`specs/c007.toml`), the state (`shrink.json`: every candidate and its outcome, so `--resume DIR`
reruns no finished candidate: the search replays its own decisions from them, as a campaign's resume
skips complete runs), the minimal spec (`minimal.toml`, rerun with `pulsar-chaos run --spec`) and
`shrink.html`.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from core import store
from core.spec import TestSpec
from harness.campaign_run import stop_run
from harness.replay import RecordedFault, ReplayError, load_run, recorded_faults, spec_with_faults, symbolic

from harness.shrink_page import MINIMAL_TOML, SHRINK_HTML, SHRINK_JSON, signature_text  # noqa: F401
DEFAULT_TRIES = 3
MIN_HOLD_S = 1.0            # holds are not halved below this
MIN_GAP_S = 0.5             # nor the gaps between fault starts
FIRST_FAULT_AT_S = 1.0      # the faults moved to the start begin here
END_MARGIN_S = 2.0          # the time limit's margin after the last fault ends
HALVINGS = 4                # at most this many halvings per number
RUN_SLACK_S = 240.0         # on top of a candidate's time limit, settle and final reads: its wall limit


class ShrinkError(ValueError):
    """A run that cannot be shrunk, or a bad option: one line naming the problem and the fix."""


# ---------------------------------------------------------------------------- what is searched

Signature = frozenset  # of (checker, anomaly type)


def signature_of(results: dict[str, Any] | None) -> frozenset[tuple[str, str]]:
    """The (checker, anomaly type) pairs of a run's invalid checkers (results.json)."""
    out = set()
    for name, c in ((results or {}).get("checkers") or {}).items():
        if isinstance(c, dict) and c.get("valid") is False:
            counts = store.anomaly_counts(c)
            kinds = [k for k, n in counts.items() if n] or ["invalid"]
            out.update((name, k) for k in kinds)
    return frozenset(out)


@dataclass
class Candidate:
    """The parts of a run the search reduces."""
    faults: list[RecordedFault]
    time_limit: float
    rate: float
    concurrency: int
    topics: int

    def key(self) -> str:
        """A stable text of the candidate: the same key is the same run (for the cache and resume)."""
        return json.dumps({"faults": [f.entry() for f in self.faults], "time_limit": self.time_limit,
                           "rate": self.rate, "concurrency": self.concurrency, "topics": self.topics},
                          sort_keys=True)

    def describe(self) -> str:
        faults = "; ".join(f.label() for f in self.faults) or "no fault"
        return (f"{len(self.faults)} fault{'s' if len(self.faults) != 1 else ''} [{faults}], "
                f"{self.time_limit:g}s, rate {self.rate:g}, concurrency {self.concurrency}, topics {self.topics}")

    def size(self) -> tuple:
        """Smaller is better: fewer faults, shorter holds and run, less load."""
        return (len(self.faults), self.time_limit, sum(f.hold or self.time_limit for f in self.faults),
                self.rate, self.concurrency, self.topics)

    def replace(self, **changes: Any) -> "Candidate":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {"faults": [f.to_json() for f in self.faults], "time_limit": self.time_limit, "rate": self.rate,
                "concurrency": self.concurrency, "topics": self.topics}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Candidate":
        return cls([RecordedFault.from_json(f) for f in d["faults"]], d["time_limit"], d["rate"],
                   d["concurrency"], d["topics"])

    def spec(self, base: TestSpec, **changes: Any) -> TestSpec:
        return spec_with_faults(base, self.faults, time_limit=float(self.time_limit), rate=float(self.rate),
                                concurrency=self.concurrency, topics=self.topics, **changes)


@dataclass
class Outcome:
    """A candidate's tries: how many showed the signature, and their run folders and signatures."""
    fails: bool
    reproduced: int = 0
    tries: int = 0
    runs: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)      # each try's signature text (or why it had none)
    seconds: float = 0.0
    error: str = ""                                      # a candidate that could not be run (a bad spec)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Outcome":
        return cls(**{k: d[k] for k in ("fails", "reproduced", "tries", "runs", "found", "seconds", "error")
                      if k in d})


@dataclass
class Step:
    """One candidate the search tried: what step, what changed, the outcome, kept or not."""
    n: int
    step: str
    change: str
    candidate: Candidate
    outcome: Outcome
    kept: bool
    known: bool = False         # the outcome of an identical candidate tried before: not run again

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "step": self.step, "change": self.change, "candidate": self.candidate.to_json(),
                "key": self.candidate.key(), "outcome": self.outcome.to_json(), "kept": self.kept,
                "known": self.known}


REDUCTIONS = ("faults", "times", "time limit", "targets", "holds", "load")


class OutOfTime(Exception):
    """--max-hours reached: the search ends with the best candidate so far."""


# ---------------------------------------------------------------------------- the search

class Search:
    """The reductions over a `Candidate`, through `run_candidate(candidate, tries) -> Outcome`.

    `cache` maps candidate keys to outcomes already known (a resumed shrink): such a candidate is not
    run again. `on_step(step, best)` is called after every candidate; `deadline` (monotonic seconds)
    stops the search with the best so far."""

    def __init__(self, start: Candidate, run_candidate: Callable[[Candidate, int], Outcome], tries: int = DEFAULT_TRIES,
                 cache: dict[str, Outcome] | None = None,
                 on_step: Callable[[Step, Candidate], None] | None = None,
                 deadline: float | None = None, estimate_s: Callable[[], float] | None = None,
                 reductions: tuple[str, ...] | None = None):
        self.best = start
        self.reductions = reductions        # None: all (REDUCTIONS); else only these
        self.run_candidate = run_candidate
        self.tries = tries
        self.cache = dict(cache or {})
        self.on_step = on_step
        self.deadline = deadline
        self.estimate_s = estimate_s
        self.steps: list[Step] = []
        self.stopped = ""                   # why the search stopped early ("" if it finished)

    # -- one candidate
    def _try(self, step: str, change: str, cand: Candidate) -> bool:
        key = cand.key()
        known = key in self.cache
        if known:
            out = self.cache[key]
        else:
            if self.deadline is not None and self.estimate_s is not None \
                    and time.monotonic() + self.estimate_s() > self.deadline:
                raise OutOfTime()
            out = self.run_candidate(cand, self.tries)
            self.cache[key] = out
        kept = out.fails and cand.size() <= self.best.size()
        if kept:
            self.best = cand
        s = Step(len(self.steps) + 1, step, change, cand, out, kept, known)
        self.steps.append(s)
        if self.on_step is not None:
            self.on_step(s, self.best)
        return out.fails

    def run(self) -> Candidate:
        """The whole search; the smallest candidate that still failed (`self.best`)."""
        try:
            if not self._try("replay", "the run's own faults and load", self.best):
                self.stopped = "the replay of the run did not fail the same way"
                return self.best
            for name, step in (("faults", self.reduce_faults), ("times", self.shift_to_start),
                               ("time limit", self.shorter_run),   # early: every later candidate is shorter
                               ("times", self.close_gaps),
                               ("targets", self.symbolic_targets), ("holds", self.shorter_holds),
                               ("time limit", self.shorter_run), ("load", self.lower_load)):
                if self.reductions is None or name in self.reductions:
                    step()
        except OutOfTime:
            self.stopped = "the time limit (--max-hours) was reached"
        return self.best

    # -- 2. fewer faults
    def _with(self, faults: list[RecordedFault]) -> Candidate:
        return self.best.replace(faults=list(faults))

    def reduce_faults(self) -> None:
        faults = self.best.faults
        if not faults:
            return
        if self._try("faults", "no fault at all", self._with([])):
            return
        self.ddmin()

    def ddmin(self) -> None:
        """Delta debugging over the faults: remove chunks of them, halves first, then smaller chunks
        down to single faults, keeping each removal after which the run still fails (the complement
        steps of Zeller's ddmin; the faults keep their order and times)."""
        k = max(1, len(self.best.faults) // 2)
        while True:
            i = 0
            while i < len(self.best.faults):
                items = self.best.faults
                chunk, rest = items[i:i + k], items[:i] + items[i + k:]
                if rest and self._try("faults", f"drop {_names(chunk)}", self._with(rest)):
                    continue                   # the same place again: the faults after it moved up
                i += k
            if k == 1:
                break
            k = max(1, k // 2)

    # -- 3. symbolic targets
    def symbolic_targets(self) -> None:
        for i, f in enumerate(self.best.faults):
            if f.pinned and symbolic(f.plan) and f.nodes:
                faults = list(self.best.faults)
                faults[i] = dataclasses.replace(f, pinned=False)
                self._try("targets", f"{f.name} on its target resolved again, not {','.join(f.nodes)}",
                          self._with(faults))

    # -- 4. times and holds
    def shift_to_start(self) -> None:
        """Every fault earlier, the first at FIRST_FAULT_AT_S."""
        faults = self.best.faults
        if not faults:
            return
        first = min(f.at for f in faults)
        if first > FIRST_FAULT_AT_S + 0.01:
            shift = first - FIRST_FAULT_AT_S
            self._try("times", f"every fault {shift:.1f}s earlier",
                      self._with([dataclasses.replace(f, at=round(f.at - shift, 3)) for f in faults]))

    def close_gaps(self) -> None:
        """The gap before each fault halved (the faults after it moved up with it), while it fails."""
        for i in range(1, len(self.best.faults)):
            for _ in range(HALVINGS):
                faults = sorted(self.best.faults, key=lambda f: f.at)
                gap = faults[i].at - faults[i - 1].at
                if gap <= MIN_GAP_S:
                    break
                cut = round(gap - max(MIN_GAP_S, gap / 2), 3)
                moved = faults[:i] + [dataclasses.replace(f, at=round(f.at - cut, 3)) for f in faults[i:]]
                if not self._try("times", f"{faults[i].name} and what follows {cut:.1f}s earlier",
                                 self._with(moved)):
                    break

    def shorter_holds(self) -> None:
        for i in range(len(self.best.faults)):
            f = self.best.faults[i]
            if f.hold is None:      # held to the end: try a hold reaching as far as the run's end
                faults = list(self.best.faults)
                faults[i] = dataclasses.replace(f, hold=round(max(MIN_HOLD_S, self.best.time_limit - f.at), 3))
                if not self._try("holds", f"{f.name} held {faults[i].hold:.1f}s, not to the end", self._with(faults)):
                    continue
            for _ in range(HALVINGS):
                f = self.best.faults[i]
                if f.hold is None or f.hold <= MIN_HOLD_S:
                    break
                faults = list(self.best.faults)
                faults[i] = dataclasses.replace(f, hold=round(max(MIN_HOLD_S, f.hold / 2), 3))
                if not self._try("holds", f"{f.name} held {faults[i].hold:.1f}s, not {f.hold:.1f}s",
                                 self._with(faults)):
                    break

    # -- 5. the run and its load
    def _end_of_faults(self) -> float:
        return max((f.at + (f.hold if f.hold is not None else 1.0) for f in self.best.faults), default=0.0)

    def shorter_run(self) -> None:
        """The time limit down to the end of the last fault (and a margin), else bisected towards it."""
        low = max(1.0, round(self._end_of_faults() + END_MARGIN_S, 1))
        high = self.best.time_limit                 # known to fail
        if high <= low + 0.5:
            return
        if self._try("time limit", f"{low:g}s, not {high:g}s", self.best.replace(time_limit=low)):
            return
        for _ in range(HALVINGS):
            mid = round((low + high) / 2, 1)
            if high - mid < 1.0:
                break
            if self._try("time limit", f"{mid:g}s, not {high:g}s", self.best.replace(time_limit=mid)):
                high = mid
            else:
                low = mid

    def lower_load(self) -> None:
        for attr, lo, cast in (("rate", 1.0, float), ("concurrency", 1, int), ("topics", 1, int)):
            for _ in range(HALVINGS):
                v = getattr(self.best, attr)
                new = cast(max(lo, v / 2)) if cast is float else max(lo, v // 2)
                if new >= v:
                    break
                if not self._try("load", f"{attr} {new:g}, not {v:g}", self.best.replace(**{attr: new})):
                    break


def _names(faults: list[RecordedFault]) -> str:
    return ", ".join(f"{f.name}@{f.at:.1f}s" for f in faults) or "none"


# ---------------------------------------------------------------------------- the command

def _fmt_s(s: float) -> str:
    s = int(round(max(0, s)))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclass
class Options:
    run: str
    tries: int = DEFAULT_TRIES
    max_hours: float | None = None
    results_dir: str = "results"
    resume: str | None = None
    verify: bool = True              # rerun the minimal spec to say how often it fails
    verify_tries: int | None = None  # how many times (None: `tries`)
    reductions: tuple[str, ...] | None = None    # only these of REDUCTIONS (None: all)


def check_shrinkable(run_dir: Path | str) -> tuple[Path, TestSpec, dict[str, Any], frozenset, list[RecordedFault]]:
    """(folder, spec, results, signature, faults) of a run that can be shrunk; ShrinkError otherwise."""
    try:
        run_dir, spec, results = load_run(run_dir)
    except ReplayError as e:
        raise ShrinkError(str(e)) from None
    if results is None:
        raise ShrinkError(f"{run_dir}: the run has no {store.RESULTS_JSON} (it did not finish); fix: "
                          f"`pulsar-chaos check {run_dir}`, then shrink it")
    sig = signature_of(results)
    if results.get("valid") is True or not sig:
        verdict = {True: "valid", False: "invalid"}.get(results.get("valid"), "unknown")
        raise ShrinkError(f"{run_dir}: the run is {verdict}: there is no anomaly to reproduce, so nothing to "
                          f"shrink; fix: shrink a run whose verdict is invalid")
    try:
        faults = recorded_faults(run_dir)
    except Exception as e:    # noqa: BLE001 - a damaged history: one line
        raise ShrinkError(f"{run_dir}: cannot read its faults ({type(e).__name__}: {e}); fix: "
                          f"`pulsar-chaos check {run_dir}` to merge its journals") from None
    if not faults:
        raise ShrinkError(f"{run_dir}: the run had no fault, so there is no fault timeline to shrink; fix: rerun "
                          f"it with fewer clients by hand (`pulsar-chaos run --spec {run_dir / store.TEST_TOML} "
                          f"--rate N`), or shrink a run with faults")
    return run_dir, spec, results, sig, faults


class ShrinkRun:
    def __init__(self, opts: Options, out: TextIO = sys.stdout):
        if not isinstance(opts.tries, int) or opts.tries < 1:
            raise ShrinkError(f"--tries must be a whole number >= 1, not {opts.tries!r}; fix: e.g. --tries 3")
        if opts.verify_tries is not None and (not isinstance(opts.verify_tries, int) or opts.verify_tries < 1):
            raise ShrinkError(f"--verify must be a whole number >= 1, not {opts.verify_tries!r}; fix: e.g. --verify 5")
        if opts.max_hours is not None and opts.max_hours <= 0:
            raise ShrinkError(f"--max-hours must be > 0, not {opts.max_hours}; fix: e.g. --max-hours 2")
        self.opts, self.out = opts, out
        self.started = time.monotonic()
        self.run_dir, self.spec, self.results, self.sig, faults = check_shrinkable(opts.run)
        self.start = Candidate(faults, self.spec.time_limit, self.spec.rate, self.spec.concurrency, self.spec.topics)
        cache: dict[str, Outcome] = {}
        self.prior: list[dict[str, Any]] = []
        if opts.resume:
            self.dir = Path(opts.resume)
            state = _read_json(self.dir / SHRINK_JSON)
            if not isinstance(state, dict) or "candidates" not in state:
                raise ShrinkError(f"--resume {self.dir}: not a shrink folder (no readable {SHRINK_JSON}); fix: give "
                                  f"the folder a shrink printed, results/shrinks/<test>/<time>")
            if Path(state.get("original", "")).resolve() != self.run_dir.resolve():
                raise ShrinkError(f"--resume {self.dir}: it shrinks {state.get('original')}, not {self.run_dir}; "
                                  f"fix: give that run, or drop --resume")
            for c in state["candidates"]:
                o = Outcome.from_json(c["outcome"])
                if not o.error:
                    cache[c["key"]] = o
            self.prior = state["candidates"]
            self.stamp = state.get("started") or time.strftime(store.RUN_FOLDER_FORMAT)
        else:
            self.stamp = time.strftime(store.RUN_FOLDER_FORMAT)
            self.dir = Path(opts.results_dir) / "shrinks" / self.spec.test_name / self.stamp
        self.cache = cache
        self.measured: list[float] = []
        self.n = max([int(c.get("n", 0)) for c in self.prior] + [0])
        self.search = Search(self.start, self._run_candidate, opts.tries, cache, self._on_step,
                             deadline=(self.started + opts.max_hours * 3600) if opts.max_hours else None,
                             estimate_s=self._estimate, reductions=opts.reductions)
        self.verification: Outcome | None = None

    # -- running candidates
    def _estimate(self) -> float:
        if self.measured:
            return sum(self.measured) / len(self.measured)
        return self.spec.time_limit + self.spec.settle + 60.0

    def _run_candidate(self, cand: Candidate, tries: int, *, stop_at_first: bool = True,
                       label: str | None = None) -> Outcome:
        self.n += 1
        label = label or f"c{self.n:03d}"
        t = time.monotonic()
        runs_dir = self.dir / "runs"
        spec = cand.spec(self.spec, test_name=label, results_dir=str(runs_dir), replay_of=str(self.run_dir))
        from harness.catalog import CATALOG
        from core.spec import SpecError
        try:
            spec = spec.validate(catalog=CATALOG)
        except SpecError as e:
            return Outcome(False, error=f"not a valid spec: {e}")
        spec_path = self.dir / "specs" / f"{label}.toml"
        spec_path.write_text(spec.to_toml())
        out = Outcome(False)
        for k in range(tries):
            run_dir, code, why = self._one_run(spec_path, label)
            out.tries += 1
            if run_dir is not None:
                out.runs.append(str(run_dir))
            res = _read_json(run_dir / store.RESULTS_JSON) if run_dir else None
            sig = signature_of(res)
            out.found.append(signature_text(sig) if sig else (why or _verdict_word(res)))
            if sig & self.sig:
                out.reproduced += 1
                out.fails = True
                if stop_at_first:
                    break
        out.seconds = round(time.monotonic() - t, 1)
        self.measured.append(out.seconds / max(1, out.tries) * (1 if out.fails else tries))
        return out

    def _one_run(self, spec_path: Path, label: str) -> tuple[Path | None, int | None, str]:
        base = self.dir / "runs" / label
        before = set(base.glob("*")) if base.is_dir() else set()
        spec = self.spec
        limit = spec.time_limit + spec.settle + spec.final_read_timeout + RUN_SLACK_S
        argv = [sys.executable, "-m", "harness.cli", "run", "--spec", str(spec_path)]
        why = ""
        (self.dir / "logs").mkdir(exist_ok=True)
        with open(self.dir / "logs" / f"{label}.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                code = proc.wait(limit)
            except subprocess.TimeoutExpired:
                why = f"stopped after {limit:.0f} s"
                code = _stop(proc)
            except BaseException:
                _stop(proc)               # Ctrl-C or SIGTERM of the shrink: the run cleans up first
                raise
        after = set(base.glob("*")) - before if base.is_dir() else set()
        run_dir = max(after) if after else None
        if code not in (0, 1, 2) and not why:
            why = f"the run exited with code {code}; see logs/{label}.log"
        return run_dir, code, why

    # -- progress and state
    def _line(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _on_step(self, step: Step, best: Candidate) -> None:
        o = step.outcome
        if o.error:
            result = f"skipped ({o.error})"
        elif o.fails:
            result = f"FAILS the same way ({o.reproduced}/{o.tries} tries)"
        else:
            result = f"does not fail the same way (0/{o.tries}: {'; '.join(o.found) or 'no run'})"
        eta = self._estimate() * _remaining_guess(best)
        known = " (known: not run again)" if step.known else ""
        self._line(f"[{step.n:3d}] {step.step}: {step.change}: {result}{known}{' (kept)' if step.kept else ''}")
        self._line(f"      best: {best.describe()}; elapsed {_fmt_s(time.monotonic() - self.started)}, "
                   f"ETA ~{_fmt_s(eta)}")
        self._save()

    def _save(self, final: dict[str, Any] | None = None) -> None:
        steps = [s.to_json() for s in self.search.steps]
        keys = {s["key"] for s in steps}
        kept_prior = [c for c in self.prior if c.get("key") not in keys]   # from an earlier attempt, unused now
        state = {"original": str(self.run_dir), "started": self.stamp, "tries": self.opts.tries,
                 "signature": sorted(list(p) for p in self.sig), "start": self.start.to_json(),
                 "best": self.search.best.to_json(), "candidates": kept_prior + steps,
                 "steps": steps, "seconds": round(time.monotonic() - self.started, 1),
                 "stopped": self.search.stopped}
        if self.verification is not None:
            state["verification"] = self.verification.to_json()
        if final:
            state.update(final)
        store.write_json(self.dir / SHRINK_JSON, state)

    # -- the whole command
    def execute(self) -> int:
        from harness import runner
        try:
            for sub in ("runs", "specs", "logs"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ShrinkError(f"cannot create {self.dir} ({e.strerror}); fix: choose a writable --results-dir") from None
        runner.preflight(self.spec)
        self._line(f"shrink {self.run_dir}: {signature_text(self.sig)}; from {self.start.describe()}; "
                   f"{self.opts.tries} tr{'ies' if self.opts.tries != 1 else 'y'} a candidate; folder {self.dir}"
                   + (f" ({len(self.cache)} candidates already run)" if self.cache else ""))
        interrupted: BaseException | None = None
        try:
            best = self.search.run()
            if self.opts.verify and not self.search.stopped.startswith("the replay"):
                n = self.opts.verify_tries or self.opts.tries
                self._line(f"verifying the minimal run: {n} tries")
                self.verification = self._run_candidate(best, n, stop_at_first=False, label="minimal")
        except BaseException as ex:
            if not (isinstance(ex, KeyboardInterrupt) or type(ex).__name__ == "Terminated"):
                raise
            interrupted = ex
        best = self.search.best
        minimal = self._write_minimal(best)
        self._save({"minimal": str(minimal), "finished": interrupted is None})
        page = None
        try:
            from harness import shrink_page
            page = shrink_page.render(self.dir)
        except Exception as e:    # noqa: BLE001 - the search's results stand without the page
            self._line(f"warning: {SHRINK_HTML} could not be written: {type(e).__name__}: {e}")
        if interrupted is not None:
            self._line(f"interrupted: resume with `pulsar-chaos shrink {self.run_dir} --resume {self.dir}`")
            raise interrupted
        v = self.verification
        rate = f"; reproduced {v.reproduced}/{v.tries} times" if v is not None else ""
        self._line(f"minimal: {best.describe()}{rate}")
        self._line(f"spec: {minimal} (rerun: pulsar-chaos run --spec {minimal})")
        if page:
            self._line(f"page: {page}")
        self._line(f"{len(self.search.steps)} candidates in {_fmt_s(time.monotonic() - self.started)}"
                   + (f"; stopped early: {self.search.stopped}" if self.search.stopped else ""))
        if self.search.stopped.startswith("the replay"):
            return store.EXIT_UNKNOWN
        return store.EXIT_VALID

    def _write_minimal(self, best: Candidate) -> Path:
        spec = best.spec(self.spec, replay_of=str(self.run_dir), results_dir=self.spec.results_dir)
        v = self.verification
        head = [f"# the minimal run shrunk from {self.run_dir}: {signature_text(self.sig)}",
                f"# {best.describe()}"]
        if v is not None:
            head.append(f"# reproduced the failure in {v.reproduced} of {v.tries} tries")
        path = self.dir / MINIMAL_TOML
        store._write_text_atomic(path, "\n".join(head) + "\n" + spec.to_toml())
        return path


def _remaining_guess(best: Candidate) -> int:
    """A rough count of the candidates left (the ETA): ddmin's and each reduction's."""
    n = len(best.faults)
    return max(1, 2 * n + 3 + 3 * HALVINGS)


def _verdict_word(res: dict[str, Any] | None) -> str:
    if not res:
        return "no results"
    return {True: "valid", False: "invalid (another anomaly)"}.get(res.get("valid"), "unknown")


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _stop(proc: subprocess.Popen) -> int:
    """The run stopped as a campaign stops one (SIGTERM, then SIGKILL of its session after the grace)."""
    stop_run(proc)
    return proc.returncode


def run(opts: Options, out: TextIO = sys.stdout) -> int:
    return ShrinkRun(opts, out).execute()
