"""Prometheus metrics of a node, rendered in the text exposition format (version 0.0.4) on `/metrics`.

One `Registry` per node process (`REGISTRY`). Counters, gauges and histograms carry optional label
values; a gauge may be a callback evaluated at scrape time (backlogs, pending adds). Names follow
Prometheus conventions: `pulsar_*` on brokers, `bookie_*` / `bookkeeper_*` on bookies and clients,
`_total` on counters, base units (seconds, bytes).
"""
from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if float(x).is_integer():
        return str(int(x))
    return repr(float(x))


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labels: Iterable[str] = ()):
        self.name = name
        self.help = help
        self.label_names = tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: tuple) -> tuple[str, ...]:
        if len(labels) != len(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {labels}")
        return tuple(str(v) for v in labels)

    def samples(self) -> list[str]:
        raise NotImplementedError

    def render(self) -> str:
        head = f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(s + "\n" for s in self.samples())


class _Valued(_Metric):
    """One number per label set (counters and gauges). Either kept here (`inc`, `set`) or, with
    `fn`, computed at scrape time from state the code keeps anyway: a number, or
    {label values: number}. A callback costs nothing on the hot path."""

    def __init__(self, name: str, help: str, labels: Iterable[str] = (),
                 fn: Callable[[], float | dict[tuple, float]] | None = None):
        super().__init__(name, help, labels)
        self._values: dict[tuple[str, ...], float] = {}
        self.fn = fn

    def inc(self, amount: float = 1.0, *labels: Any) -> None:
        k = self._key(labels)
        with self._lock:
            self._values[k] = self._values.get(k, 0.0) + amount

    def _items(self) -> list[tuple[tuple[str, ...], float]]:
        if self.fn is None:
            with self._lock:
                return sorted(self._values.items()) or ([((), 0.0)] if not self.label_names else [])
        got = self.fn()
        if isinstance(got, dict):
            return sorted((self._key(tuple(k) if isinstance(k, tuple) else (k,)), float(v))
                          for k, v in got.items())
        return [((), float(got))]

    def value(self, *labels: Any) -> float:
        return dict(self._items()).get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        try:
            items = self._items()
        except Exception:
            return []
        return [f"{self.name}{_labels(self.label_names, k)} {_num(v)}" for k, v in items]


class Counter(_Valued):
    kind = "counter"


class Gauge(_Valued):
    kind = "gauge"

    def set(self, value: float, *labels: Any) -> None:
        k = self._key(labels)
        with self._lock:
            self._values[k] = float(value)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help: str, labels: Iterable[str] = (),
                 buckets: Iterable[float] = LATENCY_BUCKETS):
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(buckets))
        self._data: dict[tuple[str, ...], list[float]] = {}   # counts per bucket (+Inf last), sum

    def observe(self, value: float, *labels: Any) -> None:
        k = self._key(labels)
        with self._lock:
            d = self._data.get(k)
            if d is None:
                d = self._data[k] = [0.0] * (len(self.buckets) + 2)
            d[bisect.bisect_left(self.buckets, value)] += 1
            d[-1] += value

    def count(self, *labels: Any) -> int:
        d = self._data.get(self._key(labels))
        return int(sum(d[:-1])) if d else 0

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(d)) for k, d in self._data.items())
        if not items and not self.label_names:
            items = [((), [0.0] * (len(self.buckets) + 2))]
        out = []
        for k, d in items:
            acc = 0.0
            for le, c in zip(self.buckets + (math.inf,), d[:-1]):
                acc += c
                le_label = 'le="' + _num(le) + '"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, k, le_label)} {_num(acc)}")
            out.append(f"{self.name}_sum{_labels(self.label_names, k)} {_num(d[-1])}")
            out.append(f"{self.name}_count{_labels(self.label_names, k)} {_num(acc)}")
        return out


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    def _add(self, m: _Metric) -> Any:
        with self._lock:
            old = self._metrics.get(m.name)
            if old is not None:
                if type(old) is not type(m) or old.label_names != m.label_names:
                    raise ValueError(f"metric {m.name} registered twice with different shapes")
                if isinstance(m, _Valued) and m.fn is not None:
                    old.fn = m.fn          # a re-created service rebinds its callback
                return old
            self._metrics[m.name] = m
            return m

    def counter(self, name: str, help: str, labels: Iterable[str] = (),
                fn: Callable[[], Any] | None = None) -> Counter:
        return self._add(Counter(name, help, labels, fn))

    def gauge(self, name: str, help: str, labels: Iterable[str] = (),
              fn: Callable[[], Any] | None = None) -> Gauge:
        return self._add(Gauge(name, help, labels, fn))

    def histogram(self, name: str, help: str, labels: Iterable[str] = (),
                  buckets: Iterable[float] = LATENCY_BUCKETS) -> Histogram:
        return self._add(Histogram(name, help, labels, buckets))

    def render(self) -> str:
        with self._lock:
            metrics = sorted(self._metrics.values(), key=lambda m: m.name)
        return "".join(m.render() for m in metrics)


REGISTRY = Registry()


def parse(text: str) -> dict[str, float]:
    """Sample name with labels -> value, from the text format (for tests and the harness)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def scrape(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """GET `{base_url}/metrics` of a node and parse it (for tests, benchmarks and the harness)."""
    import urllib.request
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
        return parse(r.read().decode())
