"""One poll of everything the dashboard's telemetry panes show."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from specdash.telemetry.cpu import read_core_loads
from specdash.telemetry.numa import NumaNode, read_numa_nodes
from specdash.telemetry.process import ProcessMonitor, ProcessStats


@dataclass(frozen=True, slots=True)
class TelemetrySnapshot:
    timestamp: float  # time.time() when the sample was taken
    core_loads: tuple[float, ...]  # busy percent per logical CPU since the previous sample
    numa_nodes: tuple[NumaNode, ...]
    process: ProcessStats
    sample_seconds: float  # what taking this sample cost (wall time)


class TelemetrySampler:
    """Polled by the UI on a timer. Loads and CPU shares are averages over the time between
    two sample() calls; construction primes them so the first sample is already meaningful
    if some time has passed. `root` moves only the NUMA reads (fake sysfs trees in tests);
    core loads and process stats always come from psutil on this machine."""

    def __init__(self, root: str | Path = "/", pid: int | None = None):
        self._root = Path(root)
        read_core_loads()
        self._process = ProcessMonitor(pid)

    def sample(self) -> TelemetrySnapshot:
        started = time.perf_counter()
        timestamp = time.time()
        core_loads = tuple(read_core_loads())
        numa_nodes = tuple(read_numa_nodes(self._root))
        process = self._process.sample()
        return TelemetrySnapshot(
            timestamp=timestamp,
            core_loads=core_loads,
            numa_nodes=numa_nodes,
            process=process,
            sample_seconds=time.perf_counter() - started,
        )
