"""The dashboard's own CPU share, apart from the engine it shares a process with.

Process CPU (telemetry's ProcessMonitor) mixes the two. The engine is one Python thread
plus llama.cpp's native threads; everything else that is a Python thread (the event loop
that draws, Textual's input and output threads) is the dashboard. So: sum the CPU time of
the Python threads minus the engine's, per interval of wall time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psutil


class DashboardCpuMeter:
    def __init__(self, engine_thread: Callable[[], int | None], clock: Callable[[], float] = time.monotonic):
        self._engine_thread = engine_thread
        self._clock = clock
        self._process = psutil.Process()
        self._prev: dict[int, float] = {}
        self._prev_t: float | None = None

    def sample(self) -> float | None:
        """Percent of one CPU used by the dashboard's threads since the previous call
        (None on the first call, which only primes the counters)."""
        ours = {t.native_id for t in threading.enumerate()} - {self._engine_thread()}
        now = self._clock()
        times = {t.id: t.user_time + t.system_time for t in self._process.threads() if t.id in ours}
        # A thread born since the last sample spent all its CPU time inside the interval.
        used = sum(max(cpu - self._prev.get(tid, 0.0), 0.0) for tid, cpu in times.items())
        prev_t, self._prev, self._prev_t = self._prev_t, times, now
        if prev_t is None or now <= prev_t:
            return None
        return used / (now - prev_t) * 100
