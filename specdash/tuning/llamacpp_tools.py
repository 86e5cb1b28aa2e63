"""llama.cpp's own command-line tools, built once from the source llama-cpp-python ships.

specdash compares itself with llama.cpp (`benchmarks/peer_llamacpp.py`) and attaches to a
real llama-server in tests. Both need llama.cpp's tools at exactly the llama.cpp version
the installed llama-cpp-python wraps, so they are built from that package's sdist:

    python -m pip download --no-binary :all: --no-deps llama-cpp-python==VERSION
    -> llama_cpp_python-VERSION/vendor/llama.cpp -> cmake (Release, no web UI)

**Linked to the wheel's own libraries** when it can: ggml, libllama, libllama-common and
libmtmd are not compiled again; the tools link the shared libraries of the installed
llama-cpp-python wheel (same commit, same flags as the engine specdash runs, and a quarter
of the build time). A replacement root CMakeLists (``llamacpp_tools.CMakeLists.txt``,
package data) declares those libraries as imported targets and builds only the tools'
own sources. The libraries are copied beside the binaries, which find them with RPATH
``$ORIGIN``: the cache does not depend on the venv it was built from (``.ci/run``
recreates its venv every run). The wheel must be eligible: Linux, its six libraries in
its RECORD with their sha256, ggml configured native with the CPU backend built in, its
headers identical to the sdist's. Otherwise, or when the linked build fails, or when
asked (``build --static``, ``SPECDASH_TOOLS_STATIC=1``), the tools are built **static**
from the whole vendored source as before (``BUILD_SHARED_LIBS=OFF``), and a progress line
says why.

The binaries are cached in ``<cache>/llama.cpp/<version>/bin`` (``<cache>`` is
``$SPECDASH_CACHE`` or ``~/.cache/specdash``), keyed by the llama-cpp-python version.

- **Idempotent**: a valid cache returns at once. A cache is valid when its marker file
  (``build.json``, written last) names this version and every requested tool exists, and
  fits the requested link: a linked build carries the wheel id (a hash of the libraries'
  RECORD sha256s: the same after a venv is recreated from the same wheel, another one
  after llama-cpp-python is rebuilt or upgraded, which means a rebuild); a static build
  fits when it was asked for, or when it was the fallback for this same wheel id.
- **Concurrent builders** serialise on ``<version>/.build.lock`` (flock); the second one
  waits, then finds the first one's build.
- **Half-finished builds** never look finished: everything happens in a temporary
  ``.build-*`` directory beside ``bin``, the binaries (and copied libraries) move into
  place at the end, and the marker is written after that. Leftover temporary directories
  are removed by the next builder.
- The cmake build directory is not kept: the static binaries need no library, the linked
  ones only the copies beside them.
- ``GGML_NATIVE`` stays at llama.cpp's default (on), as in llama-cpp-python's own source
  build, so both sides use the same CPU instructions (a linked build requires the wheel's
  ggml to say so). The marker records a hash of the CPU's feature flags; a cache moved to
  a different CPU is rebuilt.

Textual-free and engine-free: only the standard library and specdash's cache location.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from specdash.contract.errors import SpecdashError
from specdash.contract.paths import cache_dir

DEFAULT_TARGETS: tuple[str, ...] = (
    "llama-server",
    "llama-completion",
    "llama-lookup",
    "llama-speculative-simple",
    "llama-bench",
)
MARKER = "build.json"
LOCK = ".build.lock"
LOG = "build.log"
_TMP_PREFIX = ".build-"
_MIN_CMAKE = (3, 14)  # llama.cpp's cmake_minimum_required
_TARGET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# Options for the static build of the vendored llama.cpp. No web UI (it would be fetched
# from Hugging Face or built with npm: llama-server then serves its API only), no
# OpenSSL/curl (nothing is downloaded at run time), no tests, static libraries
# (self-contained binaries).
CMAKE_OPTIONS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)

# The linked build: the installed wheel's shared libraries (by their upstream target
# names), the root CMakeLists that links them (package data, written over the sdist's),
# the tools it knows, and the variable that forces the static build.
WHEEL_LIBS: tuple[str, ...] = ("ggml-base", "ggml-cpu", "ggml", "llama", "llama-common", "mtmd")
SHIM_CMAKELISTS = "llamacpp_tools.CMakeLists.txt"
LINKED_TARGETS: tuple[str, ...] = DEFAULT_TARGETS
STATIC_ENV = "SPECDASH_TOOLS_STATIC"
_UPSTREAM_CMAKELISTS = "CMakeLists.upstream.txt"
# RECORD paths of the SONAME files: lib/libllama.so.0 (the wheel also has lib/libllama.so and
# lib/libllama.so.0.5.0, identical copies of its build tree's symlinks).
_WHEEL_LIB_RE = re.compile(r"^lib/lib(ggml-base|ggml-cpu|ggml|llama-common|llama|mtmd)\.so\.\d+$")
_GGML_CONFIG = "lib/cmake/ggml/ggml-config.cmake"
# sdist file -> the wheel's copy: the tools compile against the sdist's headers and link the
# wheel's libraries, so these must be the same source.
_SAME_SOURCE: dict[str, str] = {
    "include/llama.h": "include/llama.h",
    "ggml/include/ggml.h": "include/ggml.h",
    "ggml/include/ggml-backend.h": "include/ggml-backend.h",
    "ggml/include/ggml-cpu.h": "include/ggml-cpu.h",
    "ggml/include/gguf.h": "include/gguf.h",
    "tools/mtmd/mtmd.h": "include/mtmd.h",
    "tools/mtmd/mtmd-helper.h": "include/mtmd-helper.h",
}

Progress = Callable[[str], None]


# --- where things are ---------------------------------------------------------------
def llama_cpp_python_version() -> str:
    """The installed llama-cpp-python version: the llama.cpp source the tools come from."""
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        raise SpecdashError(
            "llama-cpp-python is not installed, so there is no llama.cpp version to build: "
            'install specdash first (pip install -e ".[test]")'
        ) from None


def tools_root(version: str | None = None) -> Path:
    """``<cache>/llama.cpp/<version>``: the bin dir, the marker, the lock and the last log."""
    return cache_dir() / "llama.cpp" / (version or llama_cpp_python_version())


def bin_dir(version: str | None = None) -> Path:
    return tools_root(version) / "bin"


def read_marker(version: str | None = None) -> dict[str, Any] | None:
    """The marker of a finished build, or None (no build, a partial one, or garbage)."""
    try:
        data = json.loads((tools_root(version) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def host_id() -> str:
    """This machine's architecture and CPU feature flags, hashed. The tools are built with
    -march=native (GGML_NATIVE), so a cache copied to a machine with other CPU features
    is rebuilt there rather than dying with SIGILL."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
                    break
    except OSError:
        pass
    return f"{platform.machine()}-{hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def static_requested() -> bool:
    """$SPECDASH_TOOLS_STATIC set to something true: build (and accept) only the static tools."""
    return os.environ.get(STATIC_ENV, "").strip().lower() not in ("", "0", "no", "false", "off")


def _wheel_record() -> dict[str, tuple[Path, str]]:
    """The installed llama-cpp-python's files that its RECORD gives a sha256 for:
    RECORD path -> (file on disk, sha256 as RECORD writes it: urlsafe base64, no padding)."""
    try:
        files = importlib.metadata.files("llama-cpp-python") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    return {f.as_posix(): (Path(str(f.locate())), f.hash.value)
            for f in files if f.hash is not None and f.hash.mode == "sha256"}


def _record_hash(path: Path) -> str:
    """A file's sha256 the way a wheel's RECORD writes it."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def wheel_libs(record: dict[str, tuple[Path, str]] | None = None) -> dict[str, str]:
    """The wheel's shared libraries its RECORD lists once each under their SONAME file name:
    target name -> RECORD path (``llama`` -> ``lib/libllama.so.0``)."""
    record = _wheel_record() if record is None else record
    found: dict[str, list[str]] = {}
    for rel in record:
        m = _WHEEL_LIB_RE.match(rel)
        if m:
            found.setdefault(m.group(1), []).append(rel)
    return {name: rels[0] for name, rels in found.items() if len(rels) == 1}


def wheel_id(record: dict[str, tuple[Path, str]] | None = None) -> str | None:
    """What a linked build is keyed by: a hash of the wheel's six libraries' RECORD sha256s
    (None when it lacks one, or off Linux). Content, not paths: a venv recreated from the
    same wheel gives the same id, another build of llama-cpp-python another one. Reads
    RECORD only (no library), so checking a cache stays cheap."""
    if not sys.platform.startswith("linux"):
        return None
    record = _wheel_record() if record is None else record
    libs = wheel_libs(record)
    if any(name not in libs for name in WHEEL_LIBS):
        return None
    text = "".join(f"{libs[n].rsplit('/', 1)[1]}={record[libs[n]][1]}\n" for n in WHEEL_LIBS)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stale_reason(marker: dict[str, Any], version: str, static: bool | None = None) -> str | None:
    """Why a finished build does not serve what is asked now (None when it does): another
    version or CPU, or another link than asked for, or another wheel than it linked or fell
    back from. `static` None: $SPECDASH_TOOLS_STATIC decides."""
    static = static_requested() if static is None else static
    if marker.get("version") != version:
        return f"it is llama-cpp-python {marker.get('version')}'s"
    if marker.get("host", host_id()) != host_id():
        return "it was made on a CPU with other features"
    link = marker.get("link", "static")
    if static:
        return None if link == "static" else f"it links llama-cpp-python's libraries and {STATIC_ENV}=1 asks for static"
    if link == "wheel":
        if marker.get("wheel_id") != wheel_id():
            return "llama-cpp-python's libraries changed since it was linked to them"
        return None
    if marker.get("static_requested"):
        return f"it is the static build asked for with --static / {STATIC_ENV}=1"
    if "wheel_id" not in marker:
        return "it is static, from before specdash linked llama-cpp-python's libraries"
    if marker.get("wheel_id") != wheel_id():
        return "it is the static fallback for other llama-cpp-python libraries than the installed ones"
    return None


def missing_tools(targets: Iterable[str], version: str | None = None, *, static: bool | None = None) -> list[str]:
    """The requested tools that a finished build does not provide (all of them when the
    cache has no marker, or a marker that does not serve this request: stale_reason())."""
    version = version or llama_cpp_python_version()
    wanted = list(dict.fromkeys(targets))
    marker = read_marker(version)
    if marker is None or stale_reason(marker, version, static) is not None:
        return wanted
    built = set(marker.get("targets") or [])
    bins = bin_dir(version)
    return [t for t in wanted if t not in built or not os.access(bins / t, os.X_OK)]


def is_built(targets: Iterable[str] = DEFAULT_TARGETS, version: str | None = None) -> bool:
    return not missing_tools(targets, version)


def tool_path(name: str) -> Path:
    """Path of one built tool. Does not build: call ensure_built() first (or run
    ``python -m specdash.tuning.llamacpp_tools build``)."""
    _check_target_names([name])
    version = llama_cpp_python_version()
    if missing_tools([name], version):
        marker = read_marker(version)
        stale = None if marker is None else stale_reason(marker, version)
        why = ("is not built yet" if marker is None else f"needs a rebuild ({stale})" if stale
               else "is not part of the cached build")
        raise SpecdashError(
            f"llama.cpp tool {name} {why} ({bin_dir(version)}): run "
            f"`python -m specdash.tuning.llamacpp_tools build --targets {name}`"
        )
    return bin_dir(version) / name


def tool_command(name: str, *args: str) -> list[str]:
    """The argv that starts one built tool: its path, then the weight-repacking flag that
    makes it load weights as this process does (`--no-repack` where the repack verdict is
    not "on": AMX crashes it too, engine/repack.py), then `args`. Every llama.cpp tool
    specdash or its tests start goes through here, so peers compare like for like."""
    from specdash.engine.repack import tool_args

    return [str(tool_path(name)), *tool_args(), *args]


# --- the toolchain ------------------------------------------------------------------
def _cmake_version(cmake: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([cmake, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    m = re.search(r"version (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else ()


def _find_compiler(env: str, names: Sequence[str]) -> str | None:
    given = os.environ.get(env)
    if given:
        return shutil.which(given.split()[0])
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def check_toolchain() -> dict[str, str]:
    """cmake, a C and a C++ compiler and a build tool, or a one-line SpecdashError naming
    what to install."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SpecdashError(
            "cmake not found on PATH; building llama.cpp's tools needs it: install cmake "
            "(Debian/Ubuntu: apt-get install cmake)"
        )
    version = _cmake_version(cmake)
    if not version:
        raise SpecdashError(f"{cmake} --version failed; reinstall cmake (Debian/Ubuntu: apt-get install cmake)")
    if version < _MIN_CMAKE:
        need = ".".join(map(str, _MIN_CMAKE))
        raise SpecdashError(
            f"cmake {'.'.join(map(str, version))} is too old for llama.cpp (needs >= {need}): "
            "install a newer cmake (pip install cmake, or your distribution's package)"
        )
    cxx = _find_compiler("CXX", ("c++", "g++", "clang++"))
    cc = _find_compiler("CC", ("cc", "gcc", "clang"))
    if cxx is None or cc is None:
        what = "C++" if cxx is None else "C"
        raise SpecdashError(
            f"no {what} compiler found (tried ${'CXX' if cxx is None else 'CC'}, "
            f"{'c++, g++, clang++' if cxx is None else 'cc, gcc, clang'}); building llama.cpp's "
            "tools needs one: install build-essential (Debian/Ubuntu: apt-get install build-essential)"
        )
    generator = os.environ.get("CMAKE_GENERATOR", "")
    builder = shutil.which("ninja") if "Ninja" in generator else shutil.which("make")
    if builder is None:
        tool = "ninja" if "Ninja" in generator else "make"
        raise SpecdashError(
            f"{tool} not found on PATH; cmake needs it to build llama.cpp: install "
            f"{'ninja-build' if tool == 'ninja' else 'build-essential'} "
            f"(Debian/Ubuntu: apt-get install {'ninja-build' if tool == 'ninja' else 'build-essential'})"
        )
    return {"cmake": cmake, "cmake_version": ".".join(map(str, version)), "cc": cc, "cxx": cxx, "make": builder}


# --- building -----------------------------------------------------------------------
class _Log:
    """Tees a build's output into the log file and keeps the last lines for errors."""

    def __init__(self, path: Path):
        self.path = path
        self.file: IO[str] = path.open("w", encoding="utf-8")
        self.tail: deque[str] = deque(maxlen=60)

    def write(self, line: str) -> None:
        self.file.write(line if line.endswith("\n") else line + "\n")
        self.tail.append(line.rstrip("\n"))

    def close(self) -> None:
        self.file.close()

    def error_line(self) -> str:
        """The most telling line of the tail: the first error, or else the last line."""
        lines = [ln.strip() for ln in self.tail if ln.strip()]
        for ln in lines:
            if re.search(r"\berror\b|not found|No such file", ln, re.IGNORECASE):
                return ln[:300]
        return lines[-1][:300] if lines else "no output"


def _run(cmd: Sequence[str], log: _Log, what: str, *, cwd: Path | None = None,
         on_line: Callable[[str], None] | None = None) -> None:
    """Run `cmd`, streaming its merged output into the log (and `on_line`)."""
    log.write(f"$ {' '.join(cmd)}")
    log.file.flush()
    try:
        proc = subprocess.Popen(
            list(cmd), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, errors="replace", bufsize=1,
        )
    except OSError as exc:
        raise SpecdashError(f"{what}: cannot run {cmd[0]} ({exc})") from None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            log.write(line)
            if on_line is not None:
                on_line(line.rstrip("\n"))
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc != 0:
        raise SpecdashError(f"{what} failed (exit {rc}): {log.error_line()} [full log: {log.path}]", exit_code=1)


class _BuildProgress:
    """Thins cmake's progress out: a line every 5% or every 30 s, whichever comes first.
    Understands make's ``[ 42%] ...`` and ninja's ``[123/456] ...``."""

    def __init__(self, progress: Progress, step: int = 5, every_s: float = 30.0):
        self.progress = progress
        self.step = step
        self.every_s = every_s
        self.last_pct = -100
        self.last_t = time.monotonic()
        self.t0 = self.last_t

    def __call__(self, line: str) -> None:
        m = re.match(r"^\[\s*(\d+)%\]\s*(.*)", line)
        if m:
            pct, text = int(m.group(1)), m.group(2)
        else:
            m = re.match(r"^\[(\d+)/(\d+)\]\s*(.*)", line)
            if not m:
                return
            pct, text = int(m.group(1)) * 100 // max(1, int(m.group(2))), m.group(3)
        now = time.monotonic()
        if pct >= self.last_pct + self.step or now - self.last_t >= self.every_s or pct == 100 and self.last_pct < 100:
            self.last_pct, self.last_t = pct, now
            elapsed = _fmt_s(now - self.t0)
            self.progress(f"  [{pct:3d}%] {elapsed:>6}  {_shorten(text)}")


def _shorten(text: str, width: int = 90) -> str:
    text = re.sub(r"\S*/(vendor/llama\.cpp|src)/", "", text)  # drop long absolute paths
    return text if len(text) <= width else text[: width - 1] + "…"


def _fmt_s(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _check_target_names(targets: Iterable[str]) -> None:
    for t in targets:
        if not _TARGET_RE.match(t):
            raise SpecdashError(f"not a llama.cpp target name: {t!r} (e.g. {', '.join(DEFAULT_TARGETS)})")


def sdist_download_command(version: str, dest: Path) -> list[str]:
    """pip downloading llama-cpp-python==version's sdist (pip's cache, or the index) into dest."""
    return [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
            "--disable-pip-version-check", f"llama-cpp-python=={version}", "-d", str(dest)]


def vendored_prefix(version: str) -> str:
    """Where llama.cpp sits inside that sdist."""
    return f"llama_cpp_python-{version}/vendor/llama.cpp/"


def _fetch_source(version: str, work: Path, progress: Progress, log: _Log) -> Path:
    """Download llama-cpp-python's sdist with pip and extract its vendored llama.cpp."""
    dl = work / "sdist"
    dl.mkdir()
    progress(f"llama.cpp tools: fetching the llama-cpp-python=={version} sdist from the package index (pip download)")
    _run(sdist_download_command(version, dl), log, f"pip download llama-cpp-python=={version}")
    archives = sorted(dl.glob("llama_cpp_python-*.tar.gz")) or sorted(dl.glob("*.tar.gz"))
    if not archives:
        raise SpecdashError(f"pip download llama-cpp-python=={version} produced no sdist in {dl}", exit_code=1)
    progress(f"llama.cpp tools: extracting vendor/llama.cpp from {archives[0].name}")
    src = work / "src"
    with tarfile.open(archives[0]) as tar:
        top = vendored_prefix(version)
        members = [m for m in tar.getmembers() if m.name.startswith(top)]
        if not members:
            raise SpecdashError(f"{archives[0].name} has no {top} (is this llama-cpp-python's sdist?)", exit_code=1)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(src, members=members, filter="data")
        else:  # Python < 3.11.4
            tar.extractall(src, members=members)
    shutil.rmtree(dl)  # 77 MB we no longer need
    root = src / top.rstrip("/")
    if not (root / "CMakeLists.txt").is_file():
        raise SpecdashError(f"{root}: no CMakeLists.txt after extraction", exit_code=1)
    return root


def _llama_libs(binary: Path, library_path: Sequence[Path] = ()) -> dict[str, str]:
    """libllama/libggml/libmtmd a binary loads at run time, as ldd resolves them (with
    `library_path` as LD_LIBRARY_PATH): file name -> path (or "not found"). Empty for a
    static build, or without ldd."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return {}
    env = dict(os.environ)
    if library_path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(map(str, library_path))
    else:
        env.pop("LD_LIBRARY_PATH", None)
    out = subprocess.run([ldd, str(binary)], capture_output=True, text=True, env=env).stdout
    found: dict[str, str] = {}
    for ln in out.splitlines():
        m = re.match(r"^\s*(lib(?:llama|ggml|mtmd)\S*\.so\S*)\s+=>\s+(.*?)(?:\s+\(0x[0-9a-f]+\))?\s*$", ln)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def _fresh_stage(work: Path) -> Path:
    stage = work / "bin"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    return stage


def _copy_tools(build: Path, stage: Path, targets: list[str], log: _Log) -> None:
    for t in targets:
        built = build / "bin" / t
        if not built.is_file():
            raise SpecdashError(f"cmake built no {t} (expected {built}) [full log: {log.path}]", exit_code=1)
        shutil.copy2(built, stage / t)


def _build_static(tools: dict[str, str], src: Path, build: Path, stage: Path, targets: list[str], jobs: int,
                  progress: Progress, log: _Log) -> list[str]:
    """The whole vendored llama.cpp, static: ggml, libllama, common, mtmd and the tools."""
    progress(f"llama.cpp tools: configuring the static build with cmake {tools['cmake_version']} ({tools['cxx']})")
    _run([tools["cmake"], "-S", str(src), "-B", str(build), *CMAKE_OPTIONS], log, "cmake configure")
    progress(
        f"llama.cpp tools: compiling {', '.join(targets)} and all of llama.cpp with {jobs} job(s) "
        "(about 6 minutes on 2 cores)"
    )
    _run(
        [tools["cmake"], "--build", str(build), "--parallel", str(jobs), "--target", *targets],
        log, "cmake --build", on_line=_BuildProgress(progress),
    )
    _copy_tools(build, stage, targets, log)
    for t in targets:
        dyn = list(_llama_libs(stage / t))  # none for a static build
        if dyn:
            raise SpecdashError(
                f"{t} links {', '.join(dyn)} dynamically, but the build is meant to be static "
                "(BUILD_SHARED_LIBS=OFF): the cached binary would not run", exit_code=1,
            )
    return list(CMAKE_OPTIONS)


# --- the linked build ---------------------------------------------------------------
@dataclass(frozen=True)
class _Wheel:
    """The installed wheel's libraries, checked as far as can be done before the sdist."""

    id: str
    record: dict[str, tuple[Path, str]]  # RECORD path -> (file, sha256)
    libs: dict[str, str]  # target name -> RECORD path of its SONAME file


def _ggml_config(text: str) -> dict[str, str]:
    """The GGML_* options a ggml-config.cmake records: ``set(GGML_NATIVE "ON")``."""
    return dict(re.findall(r'^\s*set\((GGML_\w+)\s+"([^"]*)"\)', text, re.MULTILINE))


def _wheel_for_linking(targets: Sequence[str]) -> _Wheel:
    """The installed wheel if the tools can link its libraries, else a one-line
    SpecdashError saying why not (the caller builds static instead)."""
    if not sys.platform.startswith("linux"):
        raise SpecdashError(f"only done on Linux, this is {sys.platform}")
    unknown = [t for t in targets if t not in LINKED_TARGETS]
    if unknown:
        raise SpecdashError(f"{', '.join(unknown)} not among the linked build's tools ({', '.join(LINKED_TARGETS)})")
    record = _wheel_record()
    libs = wheel_libs(record)
    lacking = [f"lib{n}.so.N" for n in WHEEL_LIBS if n not in libs]
    if lacking:
        raise SpecdashError(f"llama-cpp-python's RECORD lists no single lib/{', lib/'.join(lacking)} with a sha256")
    absent = [str(record[rel][0]) for rel in libs.values() if not record[rel][0].is_file()]
    if absent:
        raise SpecdashError(f"llama-cpp-python's {absent[0]} is missing")
    if _GGML_CONFIG not in record or not record[_GGML_CONFIG][0].is_file():
        raise SpecdashError(f"llama-cpp-python has no {_GGML_CONFIG} to tell how its ggml was built")
    cfg = _ggml_config(record[_GGML_CONFIG][0].read_text(encoding="utf-8", errors="replace"))
    wanted = {"GGML_NATIVE": "ON", "GGML_BACKEND_DL": "OFF", "GGML_AVAILABLE_BACKENDS": "ggml-cpu"}
    for key, value in wanted.items():
        if cfg.get(key) != value:
            raise SpecdashError(f"its ggml has {key}={cfg.get(key, '(unset)')}, not {value}")
    wid = wheel_id(record)
    assert wid is not None  # the six libraries are there
    return _Wheel(wid, record, libs)


def _readelf(path: Path, *args: str) -> str:
    readelf = shutil.which("readelf")
    if readelf is None:
        raise SpecdashError("readelf not found (binutils) to read the libraries' SONAME")
    proc = subprocess.run([readelf, "-W", *args, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SpecdashError(f"readelf {' '.join(args)} {path.name} failed: {proc.stderr.strip()[:200]}")
    return proc.stdout


def _stage_wheel_libs(wheel: _Wheel, stage: Path, log: _Log) -> dict[str, Any]:
    """Copy the wheel's libraries into the stage dir (the future bin dir), check that the
    copies are what RECORD says and carry the SONAME the tools will ask for, and read how
    libllama-common was built (the tools' own cpp-httplib and subproc must match it)."""
    sonames: dict[str, str] = {}
    for name in WHEEL_LIBS:
        rel = wheel.libs[name]
        installed, sha = wheel.record[rel]
        copy = stage / installed.name
        shutil.copy2(installed, copy)
        if _record_hash(copy) != sha:
            raise SpecdashError(f"{installed} differs from llama-cpp-python's RECORD (changed after install?)")
        m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", _readelf(copy, "-d"))
        if m is None or m.group(1) != copy.name:
            raise SpecdashError(f"{installed} has SONAME {m.group(1) if m else '(none)'}, not {copy.name}")
        sonames[name] = copy.name
    common = stage / sonames["llama-common"]
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf(common, "-d"))
    openssl = any(n.startswith("libssl.") for n in needed)
    # sheredom's subprocess.h functions are weak and exported when LLAMA_SUBPROCESS was on
    subproc = re.search(r"\s(?:FUNC)\s+(?:GLOBAL|WEAK)\s+\S+\s+\d+\s+subprocess_create\b", _readelf(common, "--dyn-syms"))
    info = {"sonames": sonames, "openssl": openssl, "subprocess": subproc is not None}
    log.write(f"# wheel libraries {wheel.id}: {json.dumps(info)}")
    return info


def _check_same_source(src: Path, wheel: _Wheel) -> None:
    """The sdist's public headers are byte for byte the wheel's: the same llama.cpp."""
    for in_sdist, in_wheel in _SAME_SOURCE.items():
        if in_wheel not in wheel.record or not (src / in_sdist).is_file():
            raise SpecdashError(f"cannot compare {in_sdist} with the wheel's {in_wheel}: one is missing")
        if _record_hash(src / in_sdist) != wheel.record[in_wheel][1]:
            raise SpecdashError(f"the sdist's {in_sdist} differs from the wheel's {in_wheel}: not the same llama.cpp")


def _check_linked(binary: Path, stage: Path, decoys: Sequence[Path] = ()) -> None:
    """A linked tool loads llama.cpp's libraries from its own directory, even with
    LD_LIBRARY_PATH naming other copies of them (`decoys`: the venv's), and starts."""
    libs = _llama_libs(binary, decoys)
    if shutil.which("ldd") is not None and not libs:
        raise SpecdashError(f"{binary.name} loads no libllama/libggml: not the linked build")
    elsewhere = [f"{n} => {p}" for n, p in libs.items() if p == "not found" or Path(p).resolve().parent != stage.resolve()]
    if elsewhere:
        raise SpecdashError(f"{binary.name} does not load its libraries from {stage}: {', '.join(elsewhere)}")
    flag = "--help" if binary.name == "llama-bench" else "--version"
    try:
        proc = subprocess.run([str(binary), flag], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SpecdashError(f"{binary.name} {flag} did not run ({exc})") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise SpecdashError(f"{binary.name} {flag} exited {proc.returncode}: {last}")


def _build_linked(tools: dict[str, str], src: Path, build: Path, stage: Path, targets: list[str], jobs: int,
                  progress: Progress, log: _Log, wheel: _Wheel) -> tuple[list[str], dict[str, Any]]:
    """Only the tools' sources, linked to the wheel's libraries copied into `stage`."""
    _check_same_source(src, wheel)
    info = _stage_wheel_libs(wheel, stage, log)
    shim = importlib.resources.files("specdash.tuning").joinpath(SHIM_CMAKELISTS).read_text(encoding="utf-8")
    (src / "CMakeLists.txt").rename(src / _UPSTREAM_CMAKELISTS)
    (src / "CMakeLists.txt").write_text(shim, encoding="utf-8")
    options = [
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DSPECDASH_WHEEL_OPENSSL={'ON' if info['openssl'] else 'OFF'}",
        f"-DSPECDASH_WHEEL_SUBPROCESS={'ON' if info['subprocess'] else 'OFF'}",
        *[f"-DSPECDASH_SONAME_{n.upper().replace('-', '_')}={so}" for n, so in info["sonames"].items()],
        f"-DSPECDASH_TARGETS={';'.join(targets)}",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
    ]
    progress(
        f"llama.cpp tools: configuring against llama-cpp-python's libraries (wheel {wheel.id}) with "
        f"cmake {tools['cmake_version']} ({tools['cxx']})"
    )
    _run([tools["cmake"], "-S", str(src), "-B", str(build), f"-DSPECDASH_WHEEL_LIBS={stage}", *options],
         log, "cmake configure (linked)")
    progress(f"llama.cpp tools: compiling {', '.join(targets)} with {jobs} job(s) (about 1.5 minutes on 2 cores)")
    _run([tools["cmake"], "--build", str(build), "--parallel", str(jobs), "--target", "specdash-tools"],
         log, "cmake --build (linked)", on_line=_BuildProgress(progress))
    _copy_tools(build, stage, targets, log)
    # the wheel's own lib dirs (lib/ and llama_cpp/lib/) as LD_LIBRARY_PATH: still not used
    venv_libs = sorted({p.parent for p, _ in wheel.record.values() if p.name.startswith(("libllama", "libggml"))})
    for t in targets:
        _check_linked(stage / t, stage, venv_libs)
    libs = {info["sonames"][n]: wheel.record[wheel.libs[n]][1] for n in WHEEL_LIBS}
    return ["-DSPECDASH_WHEEL_LIBS=<bin>", *options], {
        "wheel_libs": libs, "wheel_openssl": info["openssl"], "wheel_subprocess": info["subprocess"],
    }


def _back_to_upstream(src: Path, build: Path) -> None:
    """Undo a linked attempt: upstream's root CMakeLists and no build tree."""
    upstream = src / _UPSTREAM_CMAKELISTS
    if upstream.is_file():
        os.replace(upstream, src / "CMakeLists.txt")
    shutil.rmtree(build, ignore_errors=True)


def _build(version: str, targets: list[str], root: Path, progress: Progress, jobs: int, *,
           static: bool = False) -> dict[str, Any]:
    """Build `targets` into a fresh temp dir under `root` and publish it as root/bin:
    linked to the wheel's libraries when it is eligible and `static` is false, else (or
    when that fails) static."""
    tools = check_toolchain()
    t0 = time.monotonic()
    wheel: _Wheel | None = None
    why_static = f"asked for with --static / {STATIC_ENV}=1" if static else ""
    if not static:
        try:
            wheel = _wheel_for_linking(targets)
        except SpecdashError as exc:
            why_static = f"llama-cpp-python's libraries cannot be linked: {exc}"
    current_wheel = wheel.id if wheel is not None else wheel_id()  # RECORD read once when linkable
    work = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=root))
    log = _Log(root / LOG)
    try:
        src = _fetch_source(version, work, progress, log)
        build = work / "build"
        stage = _fresh_stage(work)
        extra: dict[str, Any] = {}
        if wheel is not None:
            try:
                options, extra = _build_linked(tools, src, build, stage, targets, jobs, progress, log, wheel)
            except SpecdashError as exc:
                why_static = f"the build linked to llama-cpp-python's libraries failed: {exc}"
                _back_to_upstream(src, build)
                stage = _fresh_stage(work)
        if why_static:
            progress(f"llama.cpp tools: building static instead ({why_static})")
            log.write(f"# static build: {why_static}")
            options = _build_static(tools, src, build, stage, targets, jobs, progress, log)
        build_s = time.monotonic() - t0
        # Publish: the old marker goes first, so that nobody trusts a bin dir mid-swap; the
        # new marker goes last.
        (root / MARKER).unlink(missing_ok=True)
        final = root / "bin"
        if final.exists():
            final.rename(work / "old-bin")
        stage.rename(final)
        marker: dict[str, Any] = {
            "version": version,
            "host": host_id(),
            "targets": targets,
            "link": "static" if why_static else "wheel",
            "wheel_id": current_wheel,  # linked against, or fell back from
        }
        if why_static:
            marker.update(static_requested=static, static_why=why_static)
        marker.update(extra)
        marker.update({
            "build_seconds": round(build_s, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cmake_options": options,
            "cmake": tools["cmake_version"],
            "cxx": tools["cxx"],
            "jobs": jobs,
        })
        tmp_marker = root / (MARKER + ".tmp")
        tmp_marker.write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp_marker, root / MARKER)
        how = "static" if why_static else "linked to llama-cpp-python's libraries"
        progress(f"llama.cpp tools: built ({how}) in {_fmt_s(build_s)} -> {final}")
        return marker
    finally:
        log.close()
        shutil.rmtree(work, ignore_errors=True)


class _Lock:
    """An exclusive flock on ``root/.build.lock``, telling the user when it has to wait."""

    def __init__(self, root: Path, progress: Progress):
        self.path = root / LOCK
        self.progress = progress
        self.fd = -1

    def __enter__(self) -> _Lock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "?"
            self.progress(f"llama.cpp tools: another process (pid {holder}) is building them; waiting for it")
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def ensure_built(
    targets: Sequence[str] = DEFAULT_TARGETS,
    progress: Progress = print,
    *,
    jobs: int | None = None,
    static: bool | None = None,
) -> Path:
    """Build llama.cpp's `targets` once per llama-cpp-python version; return the bin dir.

    Returns at once when the cache already has them. Otherwise takes the build lock,
    looks again (another process may just have built them), and builds the union of the
    requested tools and those already cached, so asking for one tool never drops another.
    `static`: build (and accept) only the static tools; None: $SPECDASH_TOOLS_STATIC decides.
    """
    wanted = list(dict.fromkeys(targets))
    if not wanted:
        raise SpecdashError("no llama.cpp targets given")
    _check_target_names(wanted)
    static = static_requested() if static is None else static
    version = llama_cpp_python_version()
    root = tools_root(version)
    if not missing_tools(wanted, version, static=static):
        return root / "bin"
    root.mkdir(parents=True, exist_ok=True)
    with _Lock(root, progress):
        missing = missing_tools(wanted, version, static=static)
        if not missing:
            return root / "bin"
        for stale in root.glob(_TMP_PREFIX + "*"):  # left by a builder that died
            shutil.rmtree(stale, ignore_errors=True)
        marker = read_marker(version)
        if marker is None and (root / "bin").exists():
            progress(f"llama.cpp tools: {root / 'bin'} has no {MARKER} (an unfinished build); rebuilding")
        elif marker is not None and marker.get("host", host_id()) != host_id():
            progress("llama.cpp tools: the cached build was made on a CPU with other features; rebuilding")
            marker = None
        elif marker is not None and marker.get("version") == version:
            why = stale_reason(marker, version, static)
            if why is not None:
                progress(f"llama.cpp tools: not using the cached build ({why}); rebuilding")
        previous = [t for t in (marker or {}).get("targets") or [] if isinstance(t, str) and t not in wanted]
        build_targets = wanted + previous
        progress(
            f"llama.cpp tools: building {', '.join(build_targets)} from llama-cpp-python {version}'s "
            f"vendored llama.cpp into {root / 'bin'} (missing: {', '.join(missing)})"
        )
        _build(version, build_targets, root, progress, jobs or max(1, os.cpu_count() or 1), static=static)
    return root / "bin"


# --- command line -------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specdash.tuning.llamacpp_tools",
        description=(
            "Build llama.cpp's command-line tools (llama-server, llama-completion, llama-lookup, "
            "llama-speculative-simple, llama-bench) from the llama.cpp source vendored in the "
            "installed llama-cpp-python's sdist, linked to that wheel's own shared libraries (or "
            "static, when they cannot be used), and cache them in "
            "$SPECDASH_CACHE/llama.cpp/<version>/bin (default ~/.cache/specdash). The first build "
            "takes about 1.5 minutes on 2 cores (6 static) and needs cmake, make and a C++ compiler; "
            "later calls return at once."
        ),
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    b = sub.add_parser(
        "build",
        help="build the tools unless cached; print the bin dir",
        description="Build the tools unless they are cached, then print the bin directory.",
    )
    b.add_argument(
        "--targets", nargs="+", default=list(DEFAULT_TARGETS), metavar="TARGET",
        help=f"cmake targets to build (default: {' '.join(DEFAULT_TARGETS)})",
    )
    b.add_argument("--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: CPU count)")
    b.add_argument(
        "--static", action="store_true",
        help="build the whole of llama.cpp static instead of linking llama-cpp-python's libraries "
             f"(as {STATIC_ENV}=1, which later callers need too, or they rebuild linked)",
    )
    pa = sub.add_parser(
        "path",
        help="print the path of one built tool (exit 2 if it is not built)",
        description="Print the path of one built tool; exit 2 with a hint if it is not built.",
    )
    pa.add_argument("name", help="tool name, e.g. llama-server")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            if args.jobs is not None and args.jobs < 1:
                raise SpecdashError("--jobs must be >= 1")
            out = ensure_built(args.targets, progress=lambda s: print(s, file=sys.stderr, flush=True), jobs=args.jobs,
                               static=True if args.static else None)
        else:
            out = tool_path(args.name)
    except SpecdashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
