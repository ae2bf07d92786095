"""What a run shows while it goes: a live panel on a terminal (phase, time, op counts, faults), or a
few plain lines otherwise (start, each fault, end). Counts come from tailing the workers' journals.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TextIO


class JournalTail:
    """Reads the complete lines appended to a folder's journals since the last poll."""

    def __init__(self, folder: Path, pattern: str = "*.jsonl", skip: tuple[str, ...] = ()):
        self.folder, self.pattern, self.skip = Path(folder), pattern, skip
        self._offsets: dict[Path, int] = {}
        self.counts: Counter[tuple[str, str]] = Counter()     # (f, type) -> n
        self.first_op_ns: int | None = None
        self.last_op_ns: int | None = None

    def poll(self) -> int:
        """Read new lines; returns how many ops were new."""
        n = 0
        for path in sorted(self.folder.glob(self.pattern)):
            if path.name in self.skip:
                continue
            off = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(off)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                continue
            self._offsets[path] = off + end + 1
            for line in chunk[:end].split(b"\n"):
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                n += 1
                t = d.get("time_ns", 0)
                if self.first_op_ns is None or t < self.first_op_ns:
                    self.first_op_ns = t
                if self.last_op_ns is None or t > self.last_op_ns:
                    self.last_op_ns = t
                self.counts[(d.get("f", "?"), d.get("type", "?"))] += 1
        return n

    def totals(self) -> dict[str, int]:
        out = Counter()
        for (f, typ), n in self.counts.items():
            out[typ] += n
        return {k: out.get(k, 0) for k in ("invoke", "ok", "fail", "info")}


class Progress:
    """Live progress of a run. Call start() when the workload starts, phase() as steps change,
    stop() at the end; faults are read from `active()` (the nemesis runner's)."""

    def __init__(self, run_dir: Path, time_limit: float, out: TextIO = sys.stdout, tty: bool | None = None):
        self.run_dir = Path(run_dir)
        self.time_limit = time_limit
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.tail = JournalTail(self.run_dir / "journals", skip=("nemesis.jsonl",))
        self.first_op = threading.Event()
        self._active: Callable[[], list[str]] | None = None
        self._faults: list[str] = []
        self._events: list[str] = []
        self._phase = "starting"
        self._t0: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live = None
        self._lock = threading.Lock()

    # -- lines
    def line(self, text: str) -> None:
        """A plain line (above the live panel on a terminal)."""
        with self._lock:
            try:
                if self._live is not None:
                    self._live.console.print(text, markup=False, highlight=False)
                else:
                    print(text, file=self.out, flush=True)
            except OSError:     # the reader went away (a closed pipe): the run and its cleanup go on
                pass

    def phase(self, name: str) -> None:
        self._phase = name

    def watch_faults(self, active: Callable[[], list[str]] | None) -> None:
        self._active = active

    # -- lifecycle
    def start(self, t0_monotonic: float) -> None:
        self._t0 = t0_monotonic
        if self.tty:
            try:
                from rich.live import Live
                self._live = Live(self._render(), refresh_per_second=4, transient=True,
                                  redirect_stdout=False, redirect_stderr=False)
                self._live.start()
            except Exception:
                self._live = None
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        self._poll()
        if self._live is not None:
            try:
                self._live.stop()
            except Exception:
                pass
            self._live = None

    def summary(self) -> str:
        tot = self.tail.totals()
        return f"{tot['invoke']} ops: {tot['ok']} ok, {tot['fail']} fail, {tot['info']} info"

    # -- internals
    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._poll()
            if self._live is not None:
                try:
                    self._live.update(self._render())
                except Exception:
                    pass

    def _poll(self) -> None:
        self.tail.poll()
        if self.tail.first_op_ns is not None:
            self.first_op.set()
        if self._active is None:
            return
        try:
            now = list(self._active())
        except Exception:
            return
        elapsed = self._elapsed()
        for f in now:
            if f not in self._faults:
                self._event(f"{elapsed:6.1f}s  fault: {f}")
        for f in self._faults:
            if f not in now:
                self._event(f"{elapsed:6.1f}s  healed: {f}")
        self._faults = now

    def _event(self, text: str) -> None:
        self._events = (self._events + [text])[-6:]
        if self._live is None:
            self.line(text)

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0 if self._t0 is not None else 0.0

    def _render(self):
        from rich.table import Table
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold")
        t.add_column()
        t.add_row("phase", self._phase)
        t.add_row("time", f"{self._elapsed():.0f}s / {self.time_limit:.0f}s")
        by_f: dict[str, Counter] = {}
        for (f, typ), n in self.tail.counts.items():
            by_f.setdefault(f, Counter())[typ] = n
        for f in sorted(by_f):
            c = by_f[f]
            t.add_row(f, f"[green]{c['ok']} ok[/]  [red]{c['fail']} fail[/]  [yellow]{c['info']} info[/]")
        t.add_row("faults", ", ".join(self._faults) or "none")
        for e in self._events[-4:]:
            t.add_row("", e.strip())
        return t
