"""Machine telemetry for the dashboard and `specdash doctor`: per-core load (psutil), NUMA
node memory (sysfs), this process's footprint, and system hints. No textual import: the
UI polls TelemetrySampler on a timer and draws what it returns."""

from specdash.telemetry.cpu import CoreGroup, group_cores, physical_cores
from specdash.telemetry.hints import Hint, collect_hints
from specdash.telemetry.numa import NumaNode, NumaStat, read_numa_nodes
from specdash.telemetry.process import ProcessStats
from specdash.telemetry.sampler import TelemetrySampler, TelemetrySnapshot

__all__ = [
    "CoreGroup",
    "Hint",
    "NumaNode",
    "NumaStat",
    "ProcessStats",
    "TelemetrySampler",
    "TelemetrySnapshot",
    "collect_hints",
    "group_cores",
    "physical_cores",
    "read_numa_nodes",
]
