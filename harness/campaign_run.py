"""`pulsar-chaos campaign`: run a campaign's entries one after another (clusters on one machine must not
overlap), each as its own `pulsar-chaos run` process under a wall-clock limit, into a campaign folder:

    <results-dir>/campaigns/<name>/<YYYYmmddTHHMMSS>/
      campaign.toml     the file as given          campaign.json   every entry: run folder, verdict, expectation
      runs/<test>/<time>/   the run folders        logs/<test>.log  each run's terminal output
      specs/<test>.toml     each run's spec        junit.xml  summary.txt  analysis/ (pulsar-chaos analyze)

It goes on past invalid, unknown and crashed runs; `--resume DIR` runs only the entries without a complete
run folder in DIR (one with a results.json that was not interrupted, whose test.toml has the settings the
entry gives now: a run made before the campaign file changed that entry runs again), with the selection
(--only, --shard, --seeds) campaign.json recorded. Exit 0 when every run met its
expectation, 1 when one did not, 2 when none failed but some ended unknown, crashed or were not run.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from core import spec as spec_mod
from core import store
from core.expectation import met
from harness import junit
from harness.campaign import CampaignError, Entry, load, parse_shard, select

CAMPAIGN_JSON = "campaign.json"
CAMPAIGN_TOML = "campaign.toml"
SUMMARY_TXT = "summary.txt"
JUNIT_XML = "junit.xml"
TERM_GRACE_S = 180.0          # after SIGTERM at the time limit, how long a run may take to clean up
# TestSpec fields that are a run's bookkeeping, not its settings: a finished run is reused by a resume when
# every other field of its test.toml equals the entry's spec (test_name and results_dir name the folder,
# expected_reason is text for people, replay_of is only set by `run --replay` and shrink)
BOOKKEEPING_FIELDS = ("test_name", "results_dir", "expected_reason", "replay_of")
SELECTION = (("only", "--only"), ("shard", "--shard"), ("seeds", "--seeds"))


def stop_run(proc: subprocess.Popen, grace_s: float = TERM_GRACE_S) -> bool:
    """SIGTERM a `pulsar-chaos run` started in its own session (it tears its cluster down and writes its
    results), SIGKILL the session after the grace; True when it had to be killed."""
    if proc.poll() is not None:
        return False
    try:
        proc.send_signal(signal.SIGTERM)
    except OSError:
        pass
    try:
        proc.wait(grace_s)
        return False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # its own session: the run and its workers
        except OSError:
            pass
        proc.wait(10)
        return True


@dataclass
class Options:
    file: str
    only: str | None = None
    seeds: int | None = None
    results_dir: str = "results"
    resume: str | None = None
    junit: str | None = None
    max_hours: float | None = None
    shard: str | None = None
    analyze: bool = True
    analyze_master: str | None = None     # `analyze --master`: a Spark cluster instead of local mode


def _now_stamp() -> str:
    return time.strftime(store.RUN_FOLDER_FORMAT)


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _fmt_s(s: float) -> str:
    s = int(round(max(0, s)))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class CampaignRun:
    def __init__(self, opts: Options, out: TextIO = sys.stdout):
        self.opts, self.out = opts, out
        self.started = time.monotonic()
        if opts.resume:
            self.dir = Path(opts.resume)
            state = _read_json(self.dir / CAMPAIGN_JSON)
            if not isinstance(state, dict) or "entries" not in state:
                raise CampaignError("--resume", f"{self.dir} is not a campaign folder (no readable {CAMPAIGN_JSON})",
                                    "give the folder a campaign printed, results/campaigns/<name>/<time>")
            self._selection_from(state)
            self.campaign = load(opts.file, seeds=opts.seeds, seed_base=state.get("seed_base"))
            self.stamp = state.get("started", _now_stamp())
        else:
            self.campaign = load(opts.file, seeds=opts.seeds)
            self.stamp = _now_stamp()
            self.dir = Path(opts.results_dir) / "campaigns" / self.campaign.name / self.stamp
        if opts.max_hours is not None and opts.max_hours <= 0:
            raise CampaignError("--max-hours", f"must be > 0, not {opts.max_hours}", "write e.g. --max-hours 6")
        self.entries = select(self.campaign.entries, opts.only, parse_shard(opts.shard))
        if not self.entries:
            raise CampaignError("--only", f"{opts.only!r} matches no run of the campaign",
                                "match an axis value, e.g. --only queue or --only 'broker.*'")
        self.records: dict[str, dict[str, Any]] = {}
        self.measured: list[float] = []
        self._state = _read_json(self.dir / CAMPAIGN_JSON) if opts.resume else None

    def _selection_from(self, state: dict[str, Any]) -> None:
        """On --resume: --only, --shard and --seeds not given default to what campaign.json recorded; one given
        with another value than the record is a CampaignError (it would mix two selections in one folder)."""
        for name, flag in SELECTION:
            given, recorded = getattr(self.opts, name), state.get(name)
            if given is None:
                setattr(self.opts, name, recorded)
            elif name in state and _norm(name, given) != _norm(name, recorded):
                was = f"{flag} {recorded}" if recorded is not None else f"no {flag}"
                raise CampaignError(flag, f"{self.opts.resume} was started with {was}, not {flag} {given}",
                                    f"leave {flag} out to resume with the folder's own selection, or start a new "
                                    f"campaign (without --resume) for {flag} {given}")

    # -------------------------------------------------------------------- state
    def _prepare_dir(self) -> None:
        try:
            for sub in ("runs", "logs", "specs"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
            if not (self.dir / CAMPAIGN_TOML).exists():
                (self.dir / CAMPAIGN_TOML).write_text(self.campaign.text)
        except OSError as e:
            raise CampaignError("--results-dir", f"cannot create {self.dir} ({e.strerror})",
                                "choose a writable --results-dir") from None

    def _save(self) -> None:
        recs = [self.records.get(e.key) or self._pending(e) for e in self.entries]
        store.write_json(self.dir / CAMPAIGN_JSON, {
            "campaign": self.campaign.name, "file": str(self.campaign.path), "started": self.stamp,
            "seed_base": self.campaign.seed_base, "seeds": self.opts.seeds,
            "only": self.opts.only, "shard": self.opts.shard, "entries": recs})

    def _pending(self, e: Entry) -> dict[str, Any]:
        exp = e.spec(e.label, "x").expectation(_catalog())
        return {"name": e.label, "key": e.key, "workload": e.fields.get("workload", "log"), "axes": e.axes,
                "expected": exp.expected, "expected_reason": exp.reason, "outcome": "pending"}

    def _finished_runs(self, e: Entry) -> list[Path]:
        """The entry's run folders that finished (results.json, not interrupted; or stopped at the run limit,
        as campaign.json recorded), newest first."""
        base = self.dir / "runs" / e.label
        if not base.is_dir():
            return []
        out = []
        timeouts = {r.get("run_dir") for r in (self._state or {}).get("entries", [])
                    if isinstance(r, dict) and r.get("outcome") == "timeout"}
        for d in sorted((p for p in base.iterdir() if p.is_dir()), reverse=True):
            res = _read_json(d / store.RESULTS_JSON)
            if isinstance(res, dict) and not (res.get("run") or {}).get("interrupted") or str(d) in timeouts:
                out.append(d)
        return out

    def _check(self, e: Entry) -> tuple[Path | None, list[tuple[Path, list[str]]], list[tuple[Path, str]]]:
        """(the finished run to reuse or None, the finished runs made with other settings and how they differ,
        the finished runs whose test.toml cannot be read back and why)."""
        differ: list[tuple[Path, list[str]]] = []
        unreadable: list[tuple[Path, str]] = []
        finished = self._finished_runs(e)
        if not finished:
            return None, differ, unreadable
        want = settings(e.spec(e.label, str(self.dir / "runs")).with_expectation(_catalog()))
        for d in finished:
            try:
                have = settings(spec_mod.from_mapping(spec_mod.load(d / store.TEST_TOML), str(d / store.TEST_TOML),
                                                      catalog=_catalog()))
            except spec_mod.SpecError as err:
                path = d / store.TEST_TOML
                unreadable.append((d, err.problem if err.field == "--spec" else f"{path}: {err.field}: {err.problem}"))
                continue
            if not want["seed"]:            # seed 0: each run draws one (recorded in its test.toml)
                have["seed"] = 0
            diff = differences(have, want)
            if not diff:
                return d, differ, unreadable
            differ.append((d, diff))
        return None, differ, unreadable

    def plan(self) -> tuple[dict[str, Path], list[Entry], list[str]]:
        """What a resume does, reading only: ({entry key: finished run reused}, the entries to run, the lines
        saying which finished runs are set aside and why). A new campaign reuses nothing."""
        kept: dict[str, Path] = {}
        todo: list[Entry] = []
        differ: dict[str, list[str]] = {}            # a difference -> labels of the runs it sets aside
        unreadable: list[tuple[Path, str]] = []
        n_differ = 0
        for e in self.entries:
            done, dif, bad = self._check(e) if self.opts.resume else (None, [], [])
            if done is not None:
                kept[e.key] = done
                continue
            todo.append(e)
            if dif:
                n_differ += 1
                for change in dif[0][1]:           # the newest finished run's differences
                    differ.setdefault(change, []).append(e.label)
            if bad and not dif:
                unreadable.append(bad[0])
        lines = []
        if n_differ:
            changes = sorted(differ, key=lambda c: -len(differ[c]))
            shown = "; ".join(changes[:4]) + (f"; and {len(changes) - 4} more" if len(changes) > 4 else "")
            lines.append(f"{_runs(n_differ)} made with other settings than {self.opts.file} gives now "
                         f"({shown}): {'they run' if n_differ > 1 else 'it runs'} again")
        if unreadable:
            n = len(unreadable)
            more = f"; and {n - 1} more" if n > 1 else ""
            lines.append(f"{n} finished run{' has' if n == 1 else 's have'} a test.toml that cannot be read back "
                         f"({unreadable[0][1]}{more}): {'it runs' if n == 1 else 'they run'} again, as "
                         f"{'its' if n == 1 else 'their'} settings cannot be compared with the campaign file's")
        return kept, todo, lines

    def _record(self, e: Entry, run_dir: Path | None, seconds: float, code: int | None, why: str = "",
                outcome: str | None = None) -> dict[str, Any]:
        rec = self._pending(e)
        res = _read_json(run_dir / store.RESULTS_JSON) if run_dir else None
        rec.update(run_dir=str(run_dir) if run_dir else None, seconds=round(seconds, 1), exit_code=code)
        if isinstance(res, dict):
            valid = res.get("valid")
            rec["verdict"] = "valid" if valid is True else "invalid" if valid is False else "unknown"
            rec["anomalies"] = store.anomalies_text(res, invalid_only=True)
            if res.get("expected") in ("valid", "invalid"):      # as the run recorded it
                rec["expected"], rec["expected_reason"] = res["expected"], res.get("expected_reason")
            rec["met"] = met(rec["expected"], valid)
            rec["why"] = why or res.get("error") or ""
            rec["outcome"] = outcome or rec["verdict"]
            if (run_dir / store.REPORT_HTML).exists():
                rec["report"] = str(run_dir / store.REPORT_HTML)
        else:
            rec["outcome"] = outcome or "crashed"
            rec["why"] = why or f"the run left no results.json (exit code {code}); see logs/{e.label}.log"
        return rec

    # -------------------------------------------------------------------- one run
    def _run_one(self, e: Entry) -> dict[str, Any]:
        spec = e.spec(e.label, str(self.dir / "runs"))
        spec_path = self.dir / "specs" / f"{e.label}.toml"
        spec_path.write_text(spec.to_toml())
        before = set((self.dir / "runs" / e.label).glob("*")) if (self.dir / "runs" / e.label).is_dir() else set()
        argv = [sys.executable, "-m", "harness.cli", "run", "--spec", str(spec_path)]
        timeout = self.campaign.timeout_for(e)
        t = time.monotonic()
        outcome, why = None, ""
        with open(self.dir / "logs" / f"{e.label}.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                code = self._wait(proc, timeout)
                if code is None:
                    outcome, why = "timeout", f"stopped after the campaign's run limit of {timeout:.0f} s"
                    code = self._stop(proc)
            except BaseException:
                self._stop(proc)              # Ctrl-C or SIGTERM of the campaign: the run cleans up first
                raise
        after = set((self.dir / "runs" / e.label).glob("*")) - before
        run_dir = max(after) if after else None
        if outcome is None and code == store.EXIT_CRASH:
            outcome, why = "crashed", f"the harness crashed (exit 255); see logs/{e.label}.log"
        elif outcome is None and code not in (0, 1, 2):
            outcome, why = "crashed", f"the run exited with code {code}; see logs/{e.label}.log"
        return self._record(e, run_dir, time.monotonic() - t, code, why, outcome)

    @staticmethod
    def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _stop(self, proc: subprocess.Popen) -> int:
        """stop_run, then, if it had to kill, remove the cluster the run named in cluster.json."""
        if stop_run(proc):
            self._force_down(proc)
        return proc.returncode

    def _force_down(self, proc: subprocess.Popen) -> None:
        for cj in self.dir.glob(f"runs/*/*/{store.CLUSTER_JSON}"):
            c = _read_json(cj) or {}
            if c.get("name") and not (cj.parent / store.RESULTS_JSON).exists():
                subprocess.run([sys.executable, "-m", "harness.cli", "cluster", "down", "--force", "--name",
                                c["name"], "--backend", c.get("backend") or "netns"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)

    # -------------------------------------------------------------------- the campaign
    def _eta(self, remaining: list[Entry]) -> float:
        if self.measured:
            avg = sum(self.measured) / len(self.measured)
            return avg * len(remaining)
        return sum(self.campaign.estimate(e) for e in remaining)

    def _line(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _bar(self, done: int, total: int, width: int = 24) -> str:
        n = round(width * done / total) if total else width
        return "[" + "#" * n + "-" * (width - n) + f"] {done}/{total}"

    def execute(self) -> int:
        from harness import runner
        self._prepare_dir()
        kept_runs, todo, set_aside = self.plan()
        for e in self.entries:
            done = kept_runs.get(e.key)
            if done is not None:
                self.records[e.key] = self._record(e, done, 0.0, None)
                prev = next((r for r in (self._state or {}).get("entries", [])
                             if r.get("run_dir") == str(done)), None)
                if prev:       # what the first attempt measured (a timeout stays a timeout)
                    self.records[e.key].update({k: prev[k] for k in ("seconds", "exit_code", "outcome", "why")
                                                if k in prev and prev[k] is not None})
        for line in set_aside:
            self._line(line)
        self._save()
        total = len(self.entries)
        kept = total - len(todo)
        self._line(f"campaign {self.campaign.name}: {total} run{'s' if total != 1 else ''}"
                   + (f" ({kept} already complete, {len(todo)} to run)" if kept else "")
                   + f" in {self.dir}; estimated {_fmt_s(self._eta(todo))}")
        if todo:
            runner.preflight(todo[0].spec("x", str(self.dir)))
        interrupted: BaseException | None = None
        try:
            for i, e in enumerate(todo):
                elapsed = time.monotonic() - self.started
                if self.opts.max_hours is not None and elapsed + self.campaign.estimate(e) > self.opts.max_hours * 3600:
                    for rest in todo[i:]:
                        rec = self._pending(rest)
                        rec.update(outcome="not-run", why=f"--max-hours {self.opts.max_hours:g} reached")
                        self.records[rest.key] = rec
                    self._line(f"--max-hours {self.opts.max_hours:g} reached: {len(todo) - i} run(s) not started")
                    break
                n = kept + i + 1
                self._line(f"{self._bar(n - 1, total)} run {n}/{total} {e.label}: started; "
                           f"ETA {_fmt_s(self._eta(todo[i:]))}")
                rec = self._run_one(e)
                self.records[e.key] = rec
                self.measured.append(rec["seconds"])
                self._save()
                self._line(f"{self._bar(n, total)} {e.label}: {self._word(rec)} in {_fmt_s(rec['seconds'])}; "
                           f"elapsed {_fmt_s(time.monotonic() - self.started)}, ETA {_fmt_s(self._eta(todo[i + 1:]))}")
        except BaseException as ex:
            if not (isinstance(ex, KeyboardInterrupt) or type(ex).__name__ == "Terminated"):
                raise
            interrupted = ex
        self._save()
        records = [self.records.get(e.key) or self._pending(e) for e in self.entries]
        code = self._finish(records, analyze=interrupted is None)
        if interrupted is not None:
            self._line(f"interrupted: resume with `pulsar-chaos campaign {self.opts.file} --resume {self.dir}`"
                       + self._keeps())
            raise interrupted
        return code

    def _keeps(self) -> str:
        """The selection a resume takes from campaign.json, said in the hint (no flag needs repeating)."""
        flags = [f"{flag} {getattr(self.opts, name)}" for name, flag in SELECTION if getattr(self.opts, name) is not None]
        return f" (it keeps {' '.join(flags)})" if flags else ""

    @staticmethod
    def _word(rec: dict[str, Any]) -> str:
        o = rec.get("outcome")
        if o in ("valid", "invalid"):
            m = "met" if rec.get("met") else "NOT met"
            return f"{o.upper() if o == 'invalid' else o} (expected {rec.get('expected')}: {m})"
        return f"{o} ({rec.get('why') or ''})".replace(" ()", "")

    def _finish(self, records: list[dict[str, Any]], analyze: bool = True) -> int:
        seconds = time.monotonic() - self.started
        xml = junit.xml(self.campaign.name, records, self.stamp, seconds)
        store._write_text_atomic(self.dir / JUNIT_XML, xml.decode())
        if self.opts.junit:
            try:
                Path(self.opts.junit).parent.mkdir(parents=True, exist_ok=True)
                Path(self.opts.junit).write_bytes(xml)
            except OSError as e:
                self._line(f"warning: cannot write --junit {self.opts.junit} ({e.strerror}); "
                           f"it is in {self.dir / JUNIT_XML}")
        kinds = [junit.judge(r)[0] for r in records]
        code = (store.EXIT_INVALID if junit.FAILURE in kinds else
                store.EXIT_UNKNOWN if any(k in (junit.ERROR, junit.SKIPPED) for k in kinds) or
                any(r.get("outcome") == "pending" for r in records) else store.EXIT_VALID)
        summary = self._summary(records, kinds, seconds, code)
        analysis = self._analyze() if analyze and self.opts.analyze and self.campaign.analyze else None
        if analysis:
            summary += f"\nanalysis: {analysis}\n"
        store._write_text_atomic(self.dir / SUMMARY_TXT, summary)
        self._line(summary.rstrip())
        return code

    def _summary(self, records: list[dict[str, Any]], kinds: list[str], seconds: float, code: int) -> str:
        rows = [["run", "expected", "verdict", "met", "seconds", "anomalies"]]
        for r, k in zip(records, kinds):
            m = {junit.PASS: "yes", junit.FAILURE: "NO", junit.ERROR: "error", junit.SKIPPED: "not run"}[k]
            if r.get("outcome") == "pending":
                m = "not run"
            rows.append([r["name"], r.get("expected") or "", r.get("outcome") or "", m,
                         f"{r.get('seconds') or 0:.0f}", (r.get("anomalies") or r.get("why") or "")[:70]])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        n = len(records)
        counts = {k: kinds.count(k) for k in (junit.PASS, junit.FAILURE, junit.ERROR, junit.SKIPPED)}
        lines += ["", f"campaign {self.campaign.name}: {n} runs in {_fmt_s(seconds)}: "
                      f"{counts[junit.PASS]} met their expectation, {counts[junit.FAILURE]} did not, "
                      f"{counts[junit.ERROR]} unknown or crashed, {counts[junit.SKIPPED]} not run; exit code {code}",
                  f"folder: {self.dir}", f"junit: {self.opts.junit or self.dir / JUNIT_XML}"]
        return "\n".join(lines) + "\n"

    def _analyze(self) -> str | None:
        """`pulsar-chaos analyze` over the campaign's runs, when Spark and Java are there; the page's path."""
        import importlib.util
        if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
            self._line("analysis skipped: Spark (pyspark) or Java is not installed (`make setup` installs both)")
            return None
        master = self.opts.analyze_master
        self._line(f"analysing the runs with Spark{f' on {master}' if master else ''} ...")
        cmd = [sys.executable, "-m", "harness.cli", "analyze", str(self.dir / "runs"), "--out", str(self.dir)]
        if master:
            cmd += ["--master", master]
        with open(self.dir / "logs" / "analyze.log", "ab") as log:
            p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
        pages = sorted(self.dir.glob("analysis/*/campaign.html"))
        if p.returncode != 0 or not pages:
            self._line(f"warning: the analysis failed (exit {p.returncode}); see {self.dir / 'logs' / 'analyze.log'}")
            return None
        return str(pages[-1])


def settings(spec: spec_mod.TestSpec) -> dict[str, Any]:
    """A spec's settings: every field but the bookkeeping ones."""
    return {k: v for k, v in asdict(spec).items() if k not in BOOKKEEPING_FIELDS}


def differences(have: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """How a finished run's settings differ from the entry's now, as `field old -> new` (a table's keys one
    by one: `options.rate_limit 1 -> 2`); [] when equal."""
    out = []
    for k in want:
        a, b = have.get(k), want[k]
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{k}.{x} {_show(a.get(x))} -> {_show(b.get(x))}" for x in sorted(set(a) | set(b), key=str)
                    if a.get(x) != b.get(x)]
        else:
            out.append(f"{k} {_show(a)} -> {_show(b)}")
    return out


def _show(v: Any) -> str:
    if v is None:
        return "(unset)"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return json.dumps(v) if not isinstance(v, str) else (v or '""')


def _runs(n: int) -> str:
    return f"{n} finished run{' was' if n == 1 else 's were'}"


def _norm(name: str, v: Any) -> Any:
    if v is None:
        return None
    if name == "shard":
        try:
            return parse_shard(str(v))
        except CampaignError:
            return v
    if name == "only":
        return sorted({p.strip() for p in str(v).split(",") if p.strip()})
    return v


def _catalog():
    from harness.catalog import CATALOG
    return CATALOG


def run(opts: Options, out: TextIO = sys.stdout) -> int:
    return CampaignRun(opts, out).execute()
