"""Memory per NUMA node, read from sysfs (or /proc/meminfo where sysfs has no nodes).

Everything is read under an injectable root so tests can point at a fake tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

NODE_DIR = "sys/devices/system/node"
CPU_ONLINE = "sys/devices/system/cpu/online"
PROC_MEMINFO = "proc/meminfo"

# "Node 0 MemTotal:  1234 kB" in sysfs, "MemTotal:  1234 kB" in /proc/meminfo.
# HugePages_* lines carry no unit: they count pages, and are skipped.
_MEMINFO_LINE = re.compile(r"^(?:Node\s+\d+\s+)?([^:\s]+):\s+(\d+)\s+kB\s*$")
_NODE_NAME = re.compile(r"^node(\d+)$")


@dataclass(frozen=True, slots=True)
class NumaStat:
    """Page allocation counters since boot, from node*/numastat (kernel doc: numastat.rst).

    numa_miss on a node counts pages put there although another node was preferred; the
    preferred node counts the same pages as numa_foreign.
    """

    numa_hit: int | None
    numa_miss: int | None
    numa_foreign: int | None
    interleave_hit: int | None
    local_node: int | None
    other_node: int | None


@dataclass(frozen=True, slots=True)
class NumaNode:
    node_id: int
    mem_total_bytes: int
    mem_free_bytes: int
    mem_used_bytes: int
    cpulist: str  # as the kernel writes it, e.g. "0-3,8-11"; "" when unknown
    cpus: tuple[int, ...]
    numastat: NumaStat | None  # None when the node has no numastat file
    source: str  # what was read: "sys/devices/system/node/node0" or "proc/meminfo"

    @property
    def used_fraction(self) -> float:
        return self.mem_used_bytes / self.mem_total_bytes if self.mem_total_bytes else 0.0

    @property
    def label(self) -> str:
        if self.source == PROC_MEMINFO:
            return "mem (proc/meminfo, no NUMA info)"
        return f"node{self.node_id}"


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Expand the kernel's list format ("0-3,8-11", "5", "") into CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return tuple(cpus)


def parse_meminfo_kb(text: str) -> dict[str, int]:
    """The kB-valued keys of a meminfo file (sysfs node form or /proc form), in kB."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = _MEMINFO_LINE.match(line)
        if match:
            values[match.group(1)] = int(match.group(2))
    return values


def _read_numastat(path: Path) -> NumaStat | None:
    if not path.is_file():
        return None
    counters: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            counters[name] = int(value)
    return NumaStat(
        numa_hit=counters.get("numa_hit"),
        numa_miss=counters.get("numa_miss"),
        numa_foreign=counters.get("numa_foreign"),
        interleave_hit=counters.get("interleave_hit"),
        local_node=counters.get("local_node"),
        other_node=counters.get("other_node"),
    )


def _node_from_meminfo(
    node_id: int, meminfo: dict[str, int], cpulist: str, numastat: NumaStat | None, source: str
) -> NumaNode:
    total = meminfo.get("MemTotal", 0)
    free = meminfo.get("MemFree", 0)
    # sysfs defines MemUsed as MemTotal - MemFree (page cache counts as used);
    # /proc/meminfo has no MemUsed, so the synthetic node uses the same definition.
    used = meminfo.get("MemUsed", total - free)
    return NumaNode(
        node_id=node_id,
        mem_total_bytes=total * 1024,
        mem_free_bytes=free * 1024,
        mem_used_bytes=used * 1024,
        cpulist=cpulist,
        cpus=parse_cpulist(cpulist),
        numastat=numastat,
        source=source,
    )


def _node_dirs(root: str | Path = "/") -> list[tuple[int, Path]]:
    """(node id, directory) for every node*/ under sysfs, in numeric order (node10 after node2)."""
    base = Path(root) / NODE_DIR
    if not base.is_dir():
        return []
    found = []
    for entry in base.iterdir():
        match = _NODE_NAME.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def read_numa_nodes(root: str | Path = "/") -> list[NumaNode]:
    """One NumaNode per sysfs node; one synthetic node from /proc/meminfo where sysfs has none
    (many containers); [] where neither exists (not Linux)."""
    root = Path(root)
    nodes = []
    for node_id, directory in _node_dirs(root):
        cpulist_path = directory / "cpulist"
        nodes.append(
            _node_from_meminfo(
                node_id,
                parse_meminfo_kb((directory / "meminfo").read_text()),
                cpulist_path.read_text().strip() if cpulist_path.is_file() else "",
                _read_numastat(directory / "numastat"),
                source=f"{NODE_DIR}/{directory.name}",
            )
        )
    if nodes:
        return nodes
    meminfo = root / PROC_MEMINFO
    if not meminfo.is_file():
        return []
    online = root / CPU_ONLINE
    return [
        _node_from_meminfo(
            0,
            parse_meminfo_kb(meminfo.read_text()),
            online.read_text().strip() if online.is_file() else "",
            None,
            source=PROC_MEMINFO,
        )
    ]
