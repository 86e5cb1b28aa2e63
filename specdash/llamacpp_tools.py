"""llama.cpp's own command-line tools, built once from the source llama-cpp-python ships.

specdash compares itself with llama.cpp (`benchmarks/peer_llamacpp.py`) and attaches to a
real llama-server in tests. Both need llama.cpp's tools at exactly the llama.cpp version
the installed llama-cpp-python wraps, so they are built from that package's sdist:

    python -m pip download --no-binary :all: --no-deps llama-cpp-python==VERSION
    -> llama_cpp_python-VERSION/vendor/llama.cpp -> cmake (static, Release, no web UI)

The binaries are cached in ``<cache>/llama.cpp/<version>/bin`` (``<cache>`` is
``$SPECDASH_CACHE`` or ``~/.cache/specdash``), keyed by the llama-cpp-python version.

- **Idempotent**: a valid cache returns at once. A cache is valid when its marker file
  (``build.json``, written last) names this version and every requested tool exists.
- **Concurrent builders** serialise on ``<version>/.build.lock`` (flock); the second one
  waits, then finds the first one's build.
- **Half-finished builds** never look finished: everything happens in a temporary
  ``.build-*`` directory beside ``bin``, the binaries move into place at the end, and the
  marker is written after that. Leftover temporary directories are removed by the next
  builder.
- **Static**: ``BUILD_SHARED_LIBS=OFF``, so the binaries need no libllama/libggml and the
  cmake build directory is not kept.
- ``GGML_NATIVE`` stays at llama.cpp's default (on), as in llama-cpp-python's own source
  build, so both sides use the same CPU instructions. The marker records a hash of the
  CPU's feature flags; a cache moved to a different CPU is rebuilt.

Textual-free and engine-free: only the standard library and specdash's cache location.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.metadata
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
from pathlib import Path
from typing import IO, Any

from specdash.errors import SpecdashError
from specdash.paths import cache_dir

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

# Options for the vendored llama.cpp. No web UI (it would be fetched from Hugging Face or
# built with npm: llama-server then serves its API only), no OpenSSL/curl (nothing is
# downloaded at run time), no tests, static libraries (self-contained binaries).
CMAKE_OPTIONS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)

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


def missing_tools(targets: Iterable[str], version: str | None = None) -> list[str]:
    """The requested tools that a finished build does not provide (all of them when the
    cache has no marker, or a marker for another version or another CPU)."""
    version = version or llama_cpp_python_version()
    wanted = list(dict.fromkeys(targets))
    marker = read_marker(version)
    if marker is None or marker.get("version") != version or marker.get("host", host_id()) != host_id():
        return wanted
    built = set(marker.get("targets") or [])
    bins = bin_dir(version)
    return [t for t in wanted if t not in built or not os.access(bins / t, os.X_OK)]


def is_built(targets: Iterable[str] = DEFAULT_TARGETS, version: str | None = None) -> bool:
    return not missing_tools(targets, version)


def tool_path(name: str) -> Path:
    """Path of one built tool. Does not build: call ensure_built() first (or run
    ``python -m specdash.llamacpp_tools build``)."""
    _check_target_names([name])
    version = llama_cpp_python_version()
    if missing_tools([name], version):
        marker = read_marker(version)
        why = "is not built yet" if marker is None else "is not part of the cached build"
        raise SpecdashError(
            f"llama.cpp tool {name} {why} ({bin_dir(version)}): run "
            f"`python -m specdash.llamacpp_tools build --targets {name}`"
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


def _dynamic_llama_libs(binary: Path) -> list[str]:
    """libllama/libggml/libmtmd a binary loads at run time (empty for a static build)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    out = subprocess.run([ldd, str(binary)], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if re.search(r"lib(llama|ggml|mtmd)\S*\.so", ln)]


def _build(version: str, targets: list[str], root: Path, progress: Progress, jobs: int) -> dict[str, Any]:
    """Build `targets` into a fresh temp dir under `root` and publish it as root/bin."""
    tools = check_toolchain()
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=root))
    log = _Log(root / LOG)
    try:
        src = _fetch_source(version, work, progress, log)
        build = work / "build"
        progress(f"llama.cpp tools: configuring with cmake {tools['cmake_version']} ({tools['cxx']})")
        _run([tools["cmake"], "-S", str(src), "-B", str(build), *CMAKE_OPTIONS], log, "cmake configure")
        progress(
            f"llama.cpp tools: compiling {', '.join(targets)} with {jobs} job(s) "
            "(about 10 minutes on 2 cores)"
        )
        _run(
            [tools["cmake"], "--build", str(build), "--parallel", str(jobs), "--target", *targets],
            log, "cmake --build", on_line=_BuildProgress(progress),
        )
        stage = work / "bin"
        stage.mkdir()
        for t in targets:
            built = build / "bin" / t
            if not built.is_file():
                raise SpecdashError(f"cmake built no {t} (expected {built}) [full log: {log.path}]", exit_code=1)
            shutil.copy2(built, stage / t)
            dyn = _dynamic_llama_libs(stage / t)
            if dyn:
                raise SpecdashError(
                    f"{t} links {', '.join(dyn)} dynamically, but the build is meant to be static "
                    "(BUILD_SHARED_LIBS=OFF): the cached binary would not run", exit_code=1,
                )
        build_s = time.monotonic() - t0
        # Publish: the old marker goes first, so that nobody trusts a bin dir mid-swap; the
        # new marker goes last.
        (root / MARKER).unlink(missing_ok=True)
        final = root / "bin"
        if final.exists():
            final.rename(work / "old-bin")
        stage.rename(final)
        marker = {
            "version": version,
            "host": host_id(),
            "targets": targets,
            "build_seconds": round(build_s, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cmake_options": list(CMAKE_OPTIONS),
            "cmake": tools["cmake_version"],
            "cxx": tools["cxx"],
            "jobs": jobs,
        }
        tmp_marker = root / (MARKER + ".tmp")
        tmp_marker.write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp_marker, root / MARKER)
        progress(f"llama.cpp tools: built in {_fmt_s(build_s)} -> {final}")
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
) -> Path:
    """Build llama.cpp's `targets` once per llama-cpp-python version; return the bin dir.

    Returns at once when the cache already has them. Otherwise takes the build lock,
    looks again (another process may just have built them), and builds the union of the
    requested tools and those already cached, so asking for one tool never drops another.
    """
    wanted = list(dict.fromkeys(targets))
    if not wanted:
        raise SpecdashError("no llama.cpp targets given")
    _check_target_names(wanted)
    version = llama_cpp_python_version()
    root = tools_root(version)
    if not missing_tools(wanted, version):
        return root / "bin"
    root.mkdir(parents=True, exist_ok=True)
    with _Lock(root, progress):
        missing = missing_tools(wanted, version)
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
        previous = [t for t in (marker or {}).get("targets") or [] if isinstance(t, str) and t not in wanted]
        build_targets = wanted + previous
        progress(
            f"llama.cpp tools: building {', '.join(build_targets)} from llama-cpp-python {version}'s "
            f"vendored llama.cpp into {root / 'bin'} (missing: {', '.join(missing)})"
        )
        _build(version, build_targets, root, progress, jobs or max(1, os.cpu_count() or 1))
    return root / "bin"


# --- command line -------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specdash.llamacpp_tools",
        description=(
            "Build llama.cpp's command-line tools (llama-server, llama-completion, llama-lookup, "
            "llama-speculative-simple, llama-bench) from the llama.cpp source vendored in the "
            "installed llama-cpp-python's sdist, and cache them in "
            "$SPECDASH_CACHE/llama.cpp/<version>/bin (default ~/.cache/specdash). The first build "
            "takes about 10 minutes on 2 cores and needs cmake, make and a C++ compiler; later "
            "calls return at once."
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
            out = ensure_built(args.targets, progress=lambda s: print(s, file=sys.stderr, flush=True), jobs=args.jobs)
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
