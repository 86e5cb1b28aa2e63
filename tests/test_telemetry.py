"""Telemetry readers: grouped core view, NUMA nodes on fake sysfs trees and on this machine,
process stats, the sampler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from specdash.telemetry import TelemetrySampler, group_cores, physical_cores, read_numa_nodes
from specdash.telemetry.cpu import read_core_loads
from specdash.telemetry.numa import parse_cpulist, parse_meminfo_kb
from specdash.telemetry.process import ProcessMonitor

FIXTURES = Path(__file__).parent / "fixtures"
TWO_NODE = FIXTURES / "sysfs_2node"
ONE_NODE = FIXTURES / "sysfs_1node"
CONTAINER = FIXTURES / "proc_container"
KB = 1024


# --- group_cores -------------------------------------------------------------------------


@pytest.mark.parametrize("n_cores", [2, 8, 96, 192])
@pytest.mark.parametrize("max_cells", [1, 3, 8, 16, 20, 40, 96, 200])
def test_groups_cover_every_core_once_in_order(n_cores, max_cells):
    loads = [float(i % 101) for i in range(n_cores)]
    groups = group_cores(loads, max_cells)
    assert 1 <= len(groups) <= max_cells
    covered = [core for g in groups for core in range(g.first, g.last + 1)]
    assert covered == list(range(n_cores))
    widths = {g.last - g.first + 1 for g in groups[:-1]}
    assert len(widths) <= 1  # equal widths; only the last cell may be narrower
    for g in groups:
        chunk = loads[g.first : g.last + 1]
        assert (g.min, g.max) == (min(chunk), max(chunk))
        assert g.mean == pytest.approx(sum(chunk) / len(chunk))


def test_one_cell_per_core_when_they_fit():
    groups = group_cores([10.0, 90.0], max_cells=8)
    assert [g.label for g in groups] == ["0", "1"]
    assert [(g.min, g.mean, g.max) for g in groups] == [(10.0, 10.0, 10.0), (90.0, 90.0, 90.0)]
    assert len(group_cores([1.0] * 8, max_cells=8)) == 8


def test_96_cores_in_12_cells_are_labelled_by_core_range_and_keep_a_hot_core_visible():
    loads = [0.0] * 96
    loads[13] = 100.0
    groups = group_cores(loads, max_cells=12)
    assert [g.label for g in groups] == [f"{i}-{i + 7}" for i in range(0, 96, 8)]
    hot = groups[1]
    assert (hot.label, hot.min, hot.mean, hot.max) == ("8-15", 0.0, 12.5, 100.0)
    assert all(g.max == 0.0 for i, g in enumerate(groups) if i != 1)


def test_192_cores_into_20_cells_leaves_a_narrow_last_cell():
    groups = group_cores([50.0] * 192, max_cells=20)
    assert len(groups) == 20
    assert groups[0].label == "0-9"
    assert groups[-1].label == "190-191"


def test_group_cores_edge_cases():
    assert group_cores([], 4) == []
    with pytest.raises(ValueError, match="max_cells"):
        group_cores([1.0], 0)


# --- parsing helpers -----------------------------------------------------------------------


def test_parse_cpulist():
    assert parse_cpulist("0-3,8-11\n") == (0, 1, 2, 3, 8, 9, 10, 11)
    assert parse_cpulist("5") == (5,)
    assert parse_cpulist("") == ()


def test_parse_meminfo_reads_both_forms_and_skips_page_counts():
    node = parse_meminfo_kb(
        "Node 1 MemTotal:  1234 kB\nNode 1 Active(anon): 7 kB\nNode 1 HugePages_Total: 4\n"
    )
    assert node == {"MemTotal": 1234, "Active(anon)": 7}
    assert parse_meminfo_kb("MemFree:  99 kB\nHugePages_Free:  0\n") == {"MemFree": 99}


# --- NUMA nodes on fake trees --------------------------------------------------------------


def test_two_node_tree():
    nodes = read_numa_nodes(TWO_NODE)
    assert [n.node_id for n in nodes] == [0, 1]
    n0, n1 = nodes
    assert n0.mem_total_bytes == 12189524 * KB and n0.mem_free_bytes == 2871044 * KB
    assert n0.mem_used_bytes == (12189524 - 2871044) * KB
    assert n1.mem_total_bytes == 12582912 * KB and n1.mem_used_bytes == (12582912 - 10236220) * KB
    assert n0.used_fraction > 0.7 > 0.2 > n1.used_fraction
    assert n0.cpulist == "0-3,8-11" and n0.cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert n1.cpus == (4, 5, 6, 7, 12, 13, 14, 15)
    assert n0.numastat is not None and n1.numastat is not None
    assert n0.numastat.numa_hit == 48213377 and n0.numastat.local_node == 48199870
    assert n1.numastat.numa_miss == n0.numastat.numa_foreign == 1822103
    assert n1.numastat.other_node == 1848528 and n1.numastat.interleave_hit == 30874
    assert (n0.source, n0.label) == ("sys/devices/system/node/node0", "node0")


def test_one_node_tree():
    (node,) = read_numa_nodes(ONE_NODE)
    assert node.node_id == 0 and node.cpus == tuple(range(8))
    assert node.mem_total_bytes == 16303472 * KB
    assert node.numastat is not None and node.numastat.numa_miss == 0


def test_container_without_sysfs_nodes_gets_one_node_from_proc_meminfo():
    (node,) = read_numa_nodes(CONTAINER)
    assert node.source == "proc/meminfo"
    assert "proc/meminfo" in node.label
    assert node.mem_total_bytes == 8049540 * KB
    assert node.mem_used_bytes == (8049540 - 5123672) * KB
    assert node.numastat is None
    assert node.cpus == (0, 1)  # from sys/devices/system/cpu/online


def test_no_proc_or_sys_at_all_gives_no_nodes(tmp_path):
    assert read_numa_nodes(tmp_path) == []


def test_nodes_sort_numerically_and_numastat_is_optional(tmp_path):
    node_dir = tmp_path / "sys/devices/system/node"
    for node_id in (10, 2):
        shutil.copytree(TWO_NODE / "sys/devices/system/node/node1", node_dir / f"node{node_id}")
    (node_dir / "node10" / "numastat").unlink()
    (node_dir / "notanode").mkdir()
    nodes = read_numa_nodes(tmp_path)
    assert [n.node_id for n in nodes] == [2, 10]
    assert nodes[0].numastat is not None and nodes[1].numastat is None


# --- physical cores ------------------------------------------------------------------------


def test_physical_cores_from_cpuinfo():
    two_socket = physical_cores(TWO_NODE)  # 2 sockets x 4 cores x 2 threads
    assert two_socket.count == 8
    assert "proc/cpuinfo" in two_socket.evidence and "2 socket(s)" in two_socket.evidence
    assert physical_cores(ONE_NODE).count == 4
    assert physical_cores(CONTAINER).count == 2


def test_physical_cores_falls_back_to_psutil_without_cpuinfo_topology(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(
        "processor\t: 0\nBogoMIPS\t: 50.00\n\nprocessor\t: 1\nBogoMIPS\t: 50.00\n"
    )
    cores = physical_cores(tmp_path)
    assert cores.count == psutil.cpu_count(logical=False)
    assert "psutil" in cores.evidence


# --- this machine --------------------------------------------------------------------------


def test_numa_nodes_on_this_machine():
    nodes = read_numa_nodes("/")
    assert len(nodes) >= 1
    for node in nodes:
        assert node.mem_total_bytes > 0
        assert 0 <= node.mem_free_bytes <= node.mem_total_bytes
        assert 0.0 <= node.used_fraction <= 1.0


def test_core_loads_on_this_machine():
    read_core_loads()
    sum(i * i for i in range(200_000))  # let some CPU time pass between the two readings
    loads = read_core_loads()
    assert len(loads) == psutil.cpu_count()
    assert all(0.0 <= load <= 100.0 for load in loads)


def test_physical_cores_on_this_machine():
    cores = physical_cores("/")
    assert 1 <= cores.count <= psutil.cpu_count()


def test_process_monitor_sees_this_process_burn_cpu():
    monitor = ProcessMonitor()
    sum(i * i for i in range(3_000_000))
    stats = monitor.sample()
    assert stats.pid == os.getpid()
    assert stats.rss_bytes > 10 * 2**20  # a Python interpreter with pytest loaded
    assert stats.threads >= 1
    assert stats.cpu_percent_of_core > 0.0
    assert stats.cpu_percent_of_machine == pytest.approx(
        stats.cpu_percent_of_core / psutil.cpu_count()
    )


def test_sampler_on_this_machine():
    sampler = TelemetrySampler()
    before = time.time()
    snapshot = sampler.sample()
    assert before <= snapshot.timestamp <= time.time()
    assert len(snapshot.core_loads) == psutil.cpu_count()
    assert len(snapshot.numa_nodes) >= 1
    assert snapshot.process.pid == os.getpid()
    assert snapshot.sample_seconds > 0.0


def test_sampler_reads_numa_from_an_injected_root():
    snapshot = TelemetrySampler(root=TWO_NODE).sample()
    assert [n.node_id for n in snapshot.numa_nodes] == [0, 1]
    assert snapshot.numa_nodes == tuple(read_numa_nodes(TWO_NODE))


def test_telemetry_and_doctor_do_not_import_textual():
    code = (
        "import sys, specdash.telemetry, specdash.commands.doctor; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'llama_cpp')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
