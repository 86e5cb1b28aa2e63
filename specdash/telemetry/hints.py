"""System hints for CPU inference: settings outside specdash that change its speed.

Each check reads /proc and /sys under an injectable root and returns one Hint naming what
it read. Hints are advice, never errors: a machine that is set up differently on purpose
is not broken.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specdash.contract.errors import SpecdashError
from specdash.telemetry.cpu import PhysicalCores, physical_cores
from specdash.telemetry.numa import NODE_DIR, PROC_MEMINFO, parse_cpulist, read_numa_nodes

Level = Literal["warn", "info", "ok"]
LEVEL_ORDER: dict[str, int] = {"warn": 0, "info": 1, "ok": 2}

THP_ENABLED = "sys/kernel/mm/transparent_hugepage/enabled"
CPU_DIR = "sys/devices/system/cpu"
SELF_NUMA_MAPS = "proc/self/numa_maps"
SELF_STATUS = "proc/self/status"

# cpufreq drivers whose "powersave" governor is the driver's own load-following algorithm
# (kernel docs: intel_pstate.rst, amd-pstate.rst, active mode), not the generic governor
# that pins the lowest frequency.
_SELF_SCALING_DRIVERS = {"intel_pstate", "amd-pstate-epp"}


@dataclass(frozen=True, slots=True)
class Hint:
    level: Level
    key: str
    message: str
    evidence: str  # the file(s) or call read, and the value found


def collect_hints(
    threads: int | None = None, root: str | Path = "/", env: Mapping[str, str] | None = None
) -> list[Hint]:
    """Every hint, warnings first. `threads` is the engine thread count to check (None =
    the engine's default, physical cores); `env` defaults to this process's environment."""
    if threads is not None and threads < 1:
        raise SpecdashError(f"--threads {threads}: must be a positive integer")
    root = Path(root)
    if not root.is_dir():
        raise SpecdashError(
            f"--root {root}: not a directory (expected a tree holding proc/ and sys/)"
        )
    cores = physical_cores(root)
    hints = [
        threads_hint(threads, cores),
        omp_hint(os.environ if env is None else env, threads, cores),
        numa_hint(root),
        thp_hint(root),
        governor_hint(root),
    ]
    return sorted(hints, key=lambda hint: LEVEL_ORDER[hint.level])


def threads_hint(threads: int | None, cores: PhysicalCores) -> Hint:
    if threads is None:
        return Hint(
            "info",
            "threads",
            f"the engine defaults to one thread per physical core ({cores.count}); "
            "pass --threads N to check a planned value",
            cores.evidence,
        )
    if threads > cores.count:
        # ggml's CPU threads meet at a barrier after every graph op, so the step runs at
        # the pace of the slowest thread: one sharing a core with another is that thread.
        return Hint(
            "warn",
            "threads",
            f"threads={threads} exceeds the {cores.count} physical cores: threads share cores "
            f"(SMT siblings or time slices) and every op waits for the slowest; "
            f"use at most {cores.count}",
            cores.evidence,
        )
    return Hint(
        "ok", "threads", f"threads={threads} fits the {cores.count} physical cores", cores.evidence
    )


def omp_hint(env: Mapping[str, str], threads: int | None, cores: PhysicalCores) -> Hint:
    # ggml passes num_threads(n_threads) to its own OpenMP region, so llama.cpp itself is
    # not resized by OMP_NUM_THREADS; other OpenMP/OpenBLAS pools in the process (numpy's
    # BLAS among them) are, and without it they start one thread per logical CPU.
    suggested = min(threads or cores.count, cores.count)
    value = env.get("OMP_NUM_THREADS")
    if value is None:
        return Hint(
            "warn",
            "omp",
            "OMP_NUM_THREADS is unset: OpenMP and OpenBLAS thread pools in this process start "
            "one thread per logical CPU beside the engine's threads; "
            f"set OMP_NUM_THREADS={suggested}",
            "environment: OMP_NUM_THREADS not set",
        )
    # The variable may list one count per nesting level ("8,2"); the first is the outer pool.
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        return Hint(
            "warn",
            "omp",
            f"OMP_NUM_THREADS={value!r} is not a positive integer; OpenMP runtimes ignore it "
            f"and use every logical CPU; set OMP_NUM_THREADS={suggested}",
            f"environment: OMP_NUM_THREADS={value!r}",
        )
    if int(first) > cores.count:
        return Hint(
            "warn",
            "omp",
            f"OMP_NUM_THREADS={first} exceeds the {cores.count} physical cores",
            f"environment: OMP_NUM_THREADS={value!r}; {cores.evidence}",
        )
    return Hint("ok", "omp", f"OMP_NUM_THREADS={first}", f"environment: OMP_NUM_THREADS={value!r}")


def numa_hint(root: Path) -> Hint:
    nodes = [n for n in read_numa_nodes(root) if n.source != PROC_MEMINFO and n.mem_total_bytes > 0]
    node_dir = root / NODE_DIR
    evidence = [
        f"{node_dir}: {len(nodes)} node(s) with memory"
        if node_dir.is_dir()
        else f"{node_dir}: missing"
    ]
    status = root / SELF_STATUS
    allowed = _status_field(status, "Mems_allowed_list")
    if allowed is not None:
        evidence.append(f"{status}: Mems_allowed_list={allowed}")
        permitted = set(parse_cpulist(allowed))
        nodes = [n for n in nodes if n.node_id in permitted]
    if len(nodes) <= 1:
        return Hint(
            "ok",
            "numa",
            "one NUMA node usable by this process: memory placement does not apply",
            "; ".join(evidence),
        )
    numa_maps = root / SELF_NUMA_MAPS
    if not numa_maps.is_file():
        return Hint(
            "info",
            "numa",
            f"{len(nodes)} NUMA nodes, but this process's memory policy is unreadable",
            "; ".join([*evidence, f"{numa_maps}: missing"]),
        )
    # The second field of each numa_maps line is the policy in force for that mapping
    # (the task policy where the mapping has none of its own): "default", "bind:0",
    # "interleave:0-1", "weighted-interleave:0-1", "prefer:1", ...
    rows = [line.split() for line in numa_maps.read_text().splitlines()]
    policies = Counter(fields[1] for fields in rows if len(fields) > 1)
    evidence.append(f"{numa_maps}: " + ", ".join(f"{p} x{c}" for p, c in sorted(policies.items())))
    names = ", ".join(f"node{n.node_id}" for n in nodes)
    if any("interleave" in policy for policy in policies):
        return Hint(
            "ok", "numa", f"memory is interleaved across NUMA nodes ({names})", "; ".join(evidence)
        )
    binds = sorted(policy for policy in policies if policy.startswith("bind:"))
    if binds:
        return Hint(
            "info",
            "numa",
            f"memory is bound ({', '.join(binds)}): keep the engine's threads on the same "
            "node(s) (numactl --cpunodebind)",
            "; ".join(evidence),
        )
    return Hint(
        "warn",
        "numa",
        f"{len(nodes)} NUMA nodes ({names}) and no interleave policy: each page lands on the "
        "node of the thread that first touches it, so the weights can sit on one node while "
        "threads on the others read them across the interconnect; start specdash under "
        "`numactl --interleave=all`",
        "; ".join(evidence),
    )


def thp_hint(root: Path) -> Hint:
    # Why [always] is ok and [madvise]/[never] only info, not warn:
    # - THP covers anonymous memory (kernel doc admin-guide/mm/transhuge.rst). llama.cpp
    #   maps the GGUF file itself (MAP_SHARED, page cache), so with the default use_mmap the
    #   weights are outside this setting; its anonymous buffers (KV cache, compute buffers,
    #   weights loaded with use_mmap=False) come from posix_memalign with no
    #   madvise(MADV_HUGEPAGE) (read in the vendored llama.cpp of llama-cpp-python 0.3.36).
    #   So [madvise] and [never] give llama.cpp the same 4 KiB pages; only [always] differs.
    # - Measured effects are mixed: ik_llama.cpp PR #278 reports faster CPU inference of a
    #   ~377 GiB DeepSeek-R1 quant with huge pages; llama.cpp PR #22022 (MADV_HUGEPAGE on the
    #   weight map) measured no change for an 8B model on an unloaded machine. Not enough to
    #   call a setting wrong for the default 1.5B/0.5B pair.
    path = root / THP_ENABLED
    if not path.is_file():
        return Hint("info", "thp", "transparent huge pages are not available", f"{path}: missing")
    text = path.read_text().strip()
    match = re.search(r"\[(\w+)\]", text)
    evidence = f"{path}: {text}"
    setting = match.group(1) if match else text
    if setting == "always":
        return Hint(
            "ok",
            "thp",
            "transparent huge pages [always]: anonymous buffers (KV cache, weights loaded "
            "with use_mmap=False) can get 2 MiB pages",
            evidence,
        )
    return Hint(
        "info",
        "thp",
        f"transparent huge pages [{setting}]: llama.cpp does not request huge pages, so its "
        "KV cache (and weights loaded with use_mmap=False) use 4 KiB pages; reported gains "
        "are for very large models (hundreds of GB)",
        evidence,
    )


def governor_hint(root: Path) -> Hint:
    cpu_dir = root / CPU_DIR
    paths = sorted(
        cpu_dir.glob("cpu[0-9]*/cpufreq/scaling_governor"),
        key=lambda p: int(p.parent.parent.name[3:]),
    )
    pattern = f"{cpu_dir}/cpu*/cpufreq/scaling_governor"
    if not paths:
        return Hint(
            "info",
            "governor",
            "no CPU frequency governor exposed (usual in VMs and containers): the host sets clocks",
            f"{pattern}: none",
        )
    governors = Counter(p.read_text().strip() for p in paths)
    driver_path = paths[0].parent / "scaling_driver"
    driver = driver_path.read_text().strip() if driver_path.is_file() else "unknown"
    evidence = (
        f"{pattern}: "
        + ", ".join(f"{g} x{c}" for g, c in sorted(governors.items()))
        + f"; scaling_driver={driver}"
    )
    slow = governors.get("powersave", 0)
    if not slow:
        return Hint("ok", "governor", "no CPU uses the powersave governor", evidence)
    if driver in _SELF_SCALING_DRIVERS:
        return Hint(
            "info",
            "governor",
            f"{slow} of {len(paths)} CPUs use powersave under {driver}, which still raises "
            "clocks with load (energy_performance_preference sets the bias)",
            evidence,
        )
    return Hint(
        "warn",
        "governor",
        f"{slow} of {len(paths)} CPUs use the powersave governor, which holds them at their "
        "lowest frequency; switch to performance or schedutil "
        "(cpupower frequency-set -g performance)",
        evidence,
    )


def _status_field(path: Path, name: str) -> str | None:
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep and key == name:
            return value.strip()
    return None
