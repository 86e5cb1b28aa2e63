"""System hints on fake /proc + /sys trees (and once on this machine)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specdash.contract.errors import SpecdashError
from specdash.telemetry.hints import LEVEL_ORDER, Hint, collect_hints

FIXTURES = Path(__file__).parent / "fixtures"
TWO_NODE = FIXTURES / "sysfs_2node"
ONE_NODE = FIXTURES / "sysfs_1node"
CONTAINER = FIXTURES / "proc_container"
OMP_SET = {"OMP_NUM_THREADS": "4"}


def hint(
    key: str, threads: int | None = None, root: Path = TWO_NODE, env: dict | None = None
) -> Hint:
    hints = collect_hints(threads=threads, root=root, env=OMP_SET if env is None else env)
    (found,) = [h for h in hints if h.key == key]
    return found


@pytest.fixture
def two_node_copy(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(TWO_NODE, root)
    return root


def test_every_check_reports_once_warnings_first():
    hints = collect_hints(threads=12, root=TWO_NODE, env={})
    assert sorted(h.key for h in hints) == ["governor", "numa", "omp", "thp", "threads"]
    assert [LEVEL_ORDER[h.level] for h in hints] == sorted(LEVEL_ORDER[h.level] for h in hints)
    assert hints[0].level == "warn"
    assert all(h.evidence for h in hints)


# --- threads vs physical cores (2 sockets x 4 cores x 2 threads = 8 physical) --------------


def test_threads_above_physical_cores_warn():
    found = hint("threads", threads=12)
    assert found.level == "warn"
    assert "threads=12" in found.message and "8 physical cores" in found.message
    assert str(TWO_NODE / "proc/cpuinfo") in found.evidence


def test_threads_within_physical_cores_are_ok():
    assert hint("threads", threads=8).level == "ok"
    assert hint("threads", threads=4, root=ONE_NODE).level == "ok"
    assert hint("threads", threads=5, root=ONE_NODE).level == "warn"


def test_threads_not_given_reports_the_core_count():
    found = hint("threads")
    assert found.level == "info" and "(8)" in found.message


def test_bad_threads_and_root_are_user_errors(tmp_path):
    with pytest.raises(SpecdashError, match="--threads 0"):
        collect_hints(threads=0, root=TWO_NODE, env={})
    with pytest.raises(SpecdashError, match="--root"):
        collect_hints(root=tmp_path / "missing", env={})


# --- OMP_NUM_THREADS ------------------------------------------------------------------------


def test_omp_unset_warns_and_suggests_a_value():
    found = hint("omp", threads=6, env={})
    assert found.level == "warn"
    assert "OMP_NUM_THREADS=6" in found.message
    assert "not set" in found.evidence
    assert (
        "OMP_NUM_THREADS=8" in hint("omp", threads=12, env={}).message
    )  # capped at physical cores


@pytest.mark.parametrize(
    ("value", "level"),
    [("4", "ok"), ("8,2", "ok"), ("32", "warn"), ("abc", "warn"), ("0", "warn"), ("", "warn")],
)
def test_omp_values(value, level):
    found = hint("omp", env={"OMP_NUM_THREADS": value})
    assert found.level == level
    assert repr(value) in found.evidence


# --- NUMA -----------------------------------------------------------------------------------


def test_two_nodes_with_default_policy_warn():
    found = hint("numa")
    assert found.level == "warn"
    assert "node0, node1" in found.message and "numactl --interleave=all" in found.message
    assert str(TWO_NODE / "proc/self/numa_maps") in found.evidence
    assert "default x5" in found.evidence
    assert "Mems_allowed_list=0-1" in found.evidence


def test_two_nodes_interleaved_are_ok(two_node_copy):
    maps = two_node_copy / "proc/self/numa_maps"
    maps.write_text(maps.read_text().replace(" default ", " interleave:0-1 "))
    found = hint("numa", root=two_node_copy)
    assert found.level == "ok" and "interleave" in found.message
    assert "interleave:0-1 x5" in found.evidence


def test_two_nodes_bound_to_one_are_info(two_node_copy):
    maps = two_node_copy / "proc/self/numa_maps"
    maps.write_text(maps.read_text().replace(" default ", " bind:0 "))
    found = hint("numa", root=two_node_copy)
    assert found.level == "info" and "bind:0" in found.message


def test_cpuset_restricted_to_one_node_is_ok(two_node_copy):
    status = two_node_copy / "proc/self/status"
    status.write_text(
        status.read_text().replace("Mems_allowed_list:\t0-1", "Mems_allowed_list:\t1")
    )
    found = hint("numa", root=two_node_copy)
    assert found.level == "ok" and "Mems_allowed_list=1" in found.evidence


def test_two_nodes_without_numa_maps_are_info(two_node_copy):
    (two_node_copy / "proc/self/numa_maps").unlink()
    found = hint("numa", root=two_node_copy)
    assert found.level == "info" and "missing" in found.evidence


@pytest.mark.parametrize("root", [ONE_NODE, CONTAINER])
def test_single_node_and_container_are_not_applicable(root):
    found = hint("numa", root=root)
    assert found.level == "ok" and "does not apply" in found.message


# --- transparent huge pages -----------------------------------------------------------------


def test_thp_settings(two_node_copy):
    never = hint("thp")
    assert never.level == "info" and "[never]" in never.message
    assert never.evidence.endswith("transparent_hugepage/enabled: always madvise [never]")
    assert hint("thp", root=ONE_NODE).level == "ok"
    (two_node_copy / "sys/kernel/mm/transparent_hugepage/enabled").write_text(
        "always [madvise] never\n"
    )
    madvise = hint("thp", root=two_node_copy)
    assert madvise.level == "info" and "[madvise]" in madvise.message
    missing = hint("thp", root=CONTAINER)
    assert missing.level == "info" and "missing" in missing.evidence


# --- CPU frequency governor -----------------------------------------------------------------


def test_powersave_governor_warns():
    found = hint("governor")
    assert found.level == "warn" and "16 of 16" in found.message
    assert "powersave x16" in found.evidence and "acpi-cpufreq" in found.evidence


def test_some_cpus_on_powersave(two_node_copy):
    for cpu in range(4, 16):
        (two_node_copy / f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor").write_text(
            "performance\n"
        )
    found = hint("governor", root=two_node_copy)
    assert found.level == "warn" and "4 of 16" in found.message
    assert "performance x12, powersave x4" in found.evidence


def test_powersave_under_intel_pstate_is_info(two_node_copy):
    for driver in two_node_copy.glob("sys/devices/system/cpu/cpu*/cpufreq/scaling_driver"):
        driver.write_text("intel_pstate\n")
    found = hint("governor", root=two_node_copy)
    assert found.level == "info" and "intel_pstate" in found.message


def test_governor_ok_and_absent():
    assert hint("governor", root=ONE_NODE).level == "ok"
    absent = hint("governor", root=CONTAINER)
    assert absent.level == "info" and "none" in absent.evidence


# --- this machine ---------------------------------------------------------------------------


def test_hints_on_this_machine():
    hints = collect_hints(threads=2)
    assert sorted(h.key for h in hints) == ["governor", "numa", "omp", "thp", "threads"]
    assert all(h.level in LEVEL_ORDER and h.message and h.evidence for h in hints)
