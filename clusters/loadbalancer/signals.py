"""A broker's load signals, measured on its own process, against limits configured per broker.

Pulsar's `LinuxBrokerHostUsageImpl` reads the host's CPU, memory and NIC counters; our brokers share a
host (each in its namespace or container), so each measures itself instead:
- cpu: the process's CPU time over wall time, in percent of one core (Pulsar's unit), against
  `100 * cpu_cores` (Pulsar: availableProcessors or the cgroup quota);
- memory: the process's resident set, in MB, against `memory_limit_mb` (Pulsar: the JVM heap limit);
- bandwidthIn / bandwidthOut: the bytes the broker read and wrote on its client connections, in Kbit/s
  (Pulsar's unit), against `nic_speed_gbps` (Pulsar's `loadBalancerOverrideBrokerNicSpeedGbps`).
Limits are per broker, so a test can build unequal brokers.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class IoCounters:
    """Bytes a broker read from and wrote to its clients since it started (connection.py adds)."""
    bytes_in: int = 0
    bytes_out: int = 0


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class Usage:
    usage: float
    limit: float

    def percent(self) -> float:
        return 100.0 * self.usage / self.limit if self.limit > 0 else 0.0


class HostUsage:
    """Samples the signals; each `sample()` reports the rates since the previous one."""

    def __init__(self, io: IoCounters, *, cpu_cores: float, memory_limit_mb: float, nic_speed_gbps: float,
                 clock: Callable[[], float] = time.monotonic, cpu_time: Callable[[], float] = time.process_time,
                 memory: Callable[[], float] = rss_mb):
        self.io = io
        self.cpu_cores = cpu_cores
        self.memory_limit_mb = memory_limit_mb
        self.nic_kbps = nic_speed_gbps * 1024 * 1024
        self._clock, self._cpu_time, self._memory = clock, cpu_time, memory
        self._last = (clock(), cpu_time(), io.bytes_in, io.bytes_out)
        self.latest: dict[str, Usage] = self._usage(0.0, 0.0, 0.0)

    def _usage(self, cpu_pct: float, in_kbps: float, out_kbps: float) -> dict[str, Usage]:
        return {"cpu": Usage(cpu_pct, 100.0 * self.cpu_cores),
                "memory": Usage(self._memory(), self.memory_limit_mb),
                "directMemory": Usage(0.0, self.memory_limit_mb),
                "bandwidthIn": Usage(in_kbps, self.nic_kbps),
                "bandwidthOut": Usage(out_kbps, self.nic_kbps)}

    def sample(self) -> dict[str, Usage]:
        now, cpu, bin_, bout = self._clock(), self._cpu_time(), self.io.bytes_in, self.io.bytes_out
        t0, cpu0, bin0, bout0 = self._last
        dt = now - t0
        if dt <= 0:
            return self.latest
        self._last = (now, cpu, bin_, bout)
        self.latest = self._usage(100.0 * max(0.0, cpu - cpu0) / dt,
                                  max(0, bin_ - bin0) * 8 / 1024 / dt,
                                  max(0, bout - bout0) * 8 / 1024 / dt)
        return self.latest
