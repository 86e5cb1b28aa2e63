"""Per-core CPU load, a grouped view of it for screens narrower than the core count, and the
physical core count (what the engine's `threads = None` means)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

PROC_CPUINFO = "proc/cpuinfo"


def read_core_loads() -> list[float]:
    """Busy percent (0..100) per logical CPU since the previous call.

    psutil keeps the previous reading in module state, so the first call only primes it
    (returns zeros) and any other caller of psutil.cpu_percent(percpu=True) in this process
    shortens the interval: only the telemetry sampler should call it.
    """
    return psutil.cpu_percent(interval=None, percpu=True)


@dataclass(frozen=True, slots=True)
class CoreGroup:
    """Adjacent logical CPUs first..last shown as one cell."""

    first: int
    last: int
    min: float
    mean: float
    max: float

    @property
    def label(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


def group_cores(loads: Sequence[float], max_cells: int) -> list[CoreGroup]:
    """Fold per-core loads into at most `max_cells` cells of equal width (the last may be
    narrower), one core per cell when they all fit. Equal widths keep labels regular
    ("0-7", "8-15", ...) so an operator can find a core without counting."""
    if max_cells < 1:
        raise ValueError(f"max_cells must be >= 1, got {max_cells}")
    if not loads:
        return []
    width = -(-len(loads) // max_cells)  # ceil division; 1 when every core fits
    groups = []
    for first in range(0, len(loads), width):
        chunk = loads[first : first + width]
        groups.append(
            CoreGroup(
                first=first,
                last=first + len(chunk) - 1,
                min=min(chunk),
                mean=sum(chunk) / len(chunk),
                max=max(chunk),
            )
        )
    return groups


@dataclass(frozen=True, slots=True)
class PhysicalCores:
    count: int
    evidence: str  # what the count was read from


def physical_cores(root: str | Path = "/") -> PhysicalCores:
    """Distinct (physical id, core id) pairs in <root>/proc/cpuinfo; where cpuinfo has no
    topology (many ARM kernels), psutil's physical count, then the logical count."""
    cpuinfo = Path(root) / PROC_CPUINFO
    if cpuinfo.is_file():
        pairs = _core_pairs(cpuinfo.read_text())
        if pairs:
            sockets = len({socket for socket, _ in pairs})
            return PhysicalCores(
                len(pairs),
                f"{cpuinfo}: {len(pairs)} distinct (physical id, core id) on {sockets} socket(s)",
            )
    counted = psutil.cpu_count(logical=False)
    if counted:
        return PhysicalCores(counted, f"psutil.cpu_count(logical=False) = {counted}")
    logical = psutil.cpu_count(logical=True) or 1
    return PhysicalCores(logical, f"no core topology found; logical CPUs = {logical}")


def _core_pairs(text: str) -> set[tuple[str, str]]:
    pairs = set()
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "physical id" in fields and "core id" in fields:
            pairs.add((fields["physical id"], fields["core id"]))
    return pairs
