"""The discrete-event core: simulated time in integer milliseconds, a heap of (time, sequence,
callback), and a seeded random generator. Events at the same millisecond run in the order they were
scheduled (the sequence number breaks ties), so a run is a function of the scenario and the seed.

    sim = Sim(seed=1)
    sim.at(1000, fn, arg)          # absolute time
    sim.after(50, fn, arg)         # relative to now
    sim.every(5000, fn)            # periodic, first at now + period (fn returns False to stop)
    sim.run(until_ms=60_000)       # bounded in simulated time and in the number of events

No wall clock anywhere: `now_ms` only moves when an event is taken from the heap.
"""
from __future__ import annotations

import heapq
import random
from typing import Any, Callable


class Cancelled(Exception):
    pass


class Handle:
    """A scheduled event; `cancel()` makes it a no-op when its time comes."""
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Sim:
    def __init__(self, seed: int = 1, max_events: int = 50_000_000):
        self.now_ms = 0
        self.rng = random.Random(seed)
        self._heap: list[tuple[int, int, Handle | None, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.events_run = 0
        self.max_events = max_events

    def at(self, t_ms: float, fn: Callable[..., Any], *args: Any, handle: bool = False) -> Handle | None:
        """Run `fn(*args)` at simulated time `t_ms` (not before now)."""
        t = max(self.now_ms, int(t_ms))
        h = Handle() if handle else None
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, h, fn, args))
        return h

    def after(self, delay_ms: float, fn: Callable[..., Any], *args: Any, handle: bool = False) -> Handle | None:
        if delay_ms < 0:
            raise ValueError(f"a delay cannot be negative: {delay_ms}")
        return self.at(self.now_ms + delay_ms, fn, *args, handle=handle)

    def every(self, period_ms: float, fn: Callable[[], Any], *, first_ms: float | None = None) -> Handle:
        """Call `fn()` every `period_ms` (first at `first_ms`, default now + period) until it returns
        False or the handle is cancelled."""
        if period_ms <= 0:
            raise ValueError(f"a period must be positive: {period_ms}")
        h = Handle()

        def tick() -> None:
            if h.cancelled:
                return
            if fn() is False:
                return
            self.at(self.now_ms + period_ms, tick)
        self.at(self.now_ms + period_ms if first_ms is None else first_ms, tick)
        return h

    def pending(self) -> int:
        return len(self._heap)

    def next_time(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def run(self, until_ms: float, *, on_step: Callable[[], Any] | None = None, step_every: int = 100_000) -> int:
        """Run the events up to and including `until_ms`; `now_ms` ends at `until_ms`. `on_step()` is
        called every `step_every` events (progress). Returns the number of events run."""
        n = 0
        heap = self._heap
        until = int(until_ms)
        while heap and heap[0][0] <= until:
            t, _, h, fn, args = heapq.heappop(heap)
            if h is not None and h.cancelled:
                continue
            self.now_ms = t
            fn(*args)
            n += 1
            self.events_run += 1
            if self.events_run > self.max_events:
                raise RuntimeError(f"more than {self.max_events} events: a loop in the model?")
            if on_step is not None and n % step_every == 0:
                on_step()
        self.now_ms = max(self.now_ms, until)
        return n


class Server:
    """A single queue served one request at a time with a fixed service time (the leader's assignment
    thread, a metadata store's writes): `submit(fn, *args)` runs fn when the request is served. The
    queue's length and the busy time are kept for the report."""

    def __init__(self, sim: Sim, service_ms: float):
        self.sim = sim
        self.service_ms = service_ms
        self.free_at = 0.0
        self.served = 0
        self.max_wait_ms = 0.0

    def submit(self, fn: Callable[..., Any], *args: Any) -> float:
        start = max(float(self.sim.now_ms), self.free_at)
        self.free_at = start + self.service_ms
        self.max_wait_ms = max(self.max_wait_ms, start - self.sim.now_ms)
        self.served += 1
        self.sim.at(self.free_at, fn, *args)
        return self.free_at
