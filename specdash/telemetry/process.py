"""This process's footprint: resident memory, CPU share, thread count."""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True, slots=True)
class ProcessStats:
    pid: int
    rss_bytes: int
    cpu_percent_of_core: float  # 100 = one logical CPU fully busy; can exceed 100
    cpu_percent_of_machine: float  # 100 = every logical CPU busy
    threads: int


class ProcessMonitor:
    """Samples one process. CPU shares cover the time since the previous sample (or since
    construction, which primes psutil's per-Process counter)."""

    def __init__(self, pid: int | None = None):
        self._process = psutil.Process(pid)
        self._logical_cpus = psutil.cpu_count(logical=True) or 1
        self._process.cpu_percent(interval=None)

    def sample(self) -> ProcessStats:
        # oneshot: cpu_times, memory_info and num_threads come from one /proc/<pid>/stat read.
        with self._process.oneshot():
            of_core = self._process.cpu_percent(interval=None)
            return ProcessStats(
                pid=self._process.pid,
                rss_bytes=self._process.memory_info().rss,
                cpu_percent_of_core=of_core,
                cpu_percent_of_machine=of_core / self._logical_cpus,
                threads=self._process.num_threads(),
            )
