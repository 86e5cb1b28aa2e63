"""llama.cpp's tools built from llama-cpp-python's vendored source (specdash.tuning.llamacpp_tools).

The real build takes minutes on 2 cores; `.ci/run` does it before pytest, so here
`ensure_built()` normally finds the cache. The cache-logic tests run against a temporary
$SPECDASH_CACHE with the compile step replaced by a fake, so they are fast and test the
marker, the lock, the partial-build handling, the wheel id and the static fallback, not
cmake. The wheel checks read the installed llama-cpp-python's real RECORD and libraries.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import assert_ok

from specdash.tuning import llamacpp_tools as lt
from specdash.engine.repack import tool_args
from specdash.contract.errors import SpecdashError
from specdash.models.registry import cache_dir

VERSION = lt.llama_cpp_python_version()


# --- the real build -------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_bin() -> Path:
    return lt.ensure_built()


def test_every_default_tool_is_built_and_runs(real_bin: Path) -> None:
    assert real_bin == cache_dir() / "llama.cpp" / VERSION / "bin"
    marker = lt.read_marker()
    assert marker is not None and marker.get("link", "static") in ("wheel", "static")
    linked = marker.get("link") == "wheel"
    venv_lib_dirs = sorted({p.parent for p, _ in lt._wheel_record().values() if p.name.startswith("libllama")})
    for name in lt.DEFAULT_TARGETS:
        path = lt.tool_path(name)
        assert path == real_bin / name
        assert path.is_file() and os.access(path, os.X_OK), name
        # LD_LIBRARY_PATH naming the venv's copies of the libraries changes nothing
        libs = lt._llama_libs(path, venv_lib_dirs)
        if linked:
            # Every llama.cpp library it loads is the copy beside it (RPATH $ORIGIN): nothing
            # from the venv it was built from, nor from the (deleted) build directory.
            assert {"libllama.so.0", "libggml-base.so.0", "libggml-cpu.so.0"} <= set(libs), (name, libs)
            for lib, where in libs.items():
                assert where != "not found" and Path(where).resolve().parent == real_bin.resolve(), (name, lib, where)
        else:
            assert libs == {}, name  # static: nothing is loaded at run time
        flag = "--help" if name == "llama-bench" else "--version"
        proc = subprocess.run([str(path), flag], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{name} {flag}: {proc.stderr[-500:]}"
        if flag == "--version":
            assert "version:" in proc.stderr + proc.stdout, name
    # Only binaries (and, linked, the wheel's libraries) are kept: no cmake build tree, no
    # sources, no temp dirs.
    root = real_bin.parent
    copied = sorted(marker.get("wheel_libs") or {}) if linked else []
    assert sorted(p.name for p in real_bin.iterdir()) == sorted([*lt.DEFAULT_TARGETS, *copied])
    assert not list(root.glob(".build-*"))
    if linked:
        assert marker["wheel_id"] == lt.wheel_id()
        assert sorted(copied) == sorted(Path(rel).name for rel in lt.wheel_libs().values())
        for lib, sha in marker["wheel_libs"].items():  # the very bytes the wheel installed
            assert lt._record_hash(real_bin / lib) == sha, lib
    elif "link" in marker:  # (not an older specdash's, kept with SPECDASH_TOOLS_STATIC=1)
        assert marker.get("static_why"), "a static build says why it is static"


def test_the_linked_check_refuses_libraries_from_elsewhere(real_bin: Path, tmp_path: Path) -> None:
    """What _build checks on each linked tool before publishing it (else: static fallback)."""
    marker = lt.read_marker()
    assert marker is not None
    if marker.get("link") != "wheel":
        pytest.skip("the cached tools are static")
    lt._check_linked(real_bin / "llama-lookup", real_bin)
    with pytest.raises(SpecdashError, match="does not load its libraries from"):
        lt._check_linked(real_bin / "llama-lookup", tmp_path)
    # the same binary moved away from its libraries: the loader does not find them
    shutil.copy2(real_bin / "llama-lookup", tmp_path / "llama-lookup")
    with pytest.raises(SpecdashError, match="libllama-common.so.0 => not found"):
        lt._check_linked(tmp_path / "llama-lookup", tmp_path)


# Straight to 127.0.0.1, whatever http_proxy says.
_open = urllib.request.build_opener(urllib.request.ProxyHandler({})).open


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_llama_server_serves_without_a_web_ui(real_bin: Path, smol_path: Path, tmp_path: Path) -> None:
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [str(real_bin / "llama-server"), *tool_args(), "-m", str(smol_path), "--host", "127.0.0.1", "--port", str(port),
         "-t", "2", "-c", "512", "--metrics"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (
                f"llama-server exited {proc.returncode}: {(tmp_path / 'server.log').read_text()[-1500:]}"
            )
            try:
                with _open(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server did not become healthy in 60 s"
            time.sleep(0.3)
        body = json.dumps({"prompt": "The capital of France is", "n_predict": 4, "temperature": 0}).encode()
        req = urllib.request.Request(base + "/completion", body, {"Content-Type": "application/json"})
        with _open(req, timeout=60) as r:
            out = json.loads(r.read())
        assert out["tokens_predicted"] == 4 and out["content"]
        with _open(base + "/metrics", timeout=10) as r:
            assert "llamacpp:tokens_predicted_total" in r.read().decode()
        # Built without the web UI (LLAMA_BUILD_UI=OFF, no prebuilt download): "/" is not
        # served at all, while the API above works.
        with pytest.raises(urllib.error.HTTPError) as notfound:
            _open(base + "/", timeout=10)
        assert notfound.value.code == 404
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        log.close()


def test_second_ensure_built_is_a_no_op(real_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker_before = (real_bin.parent / lt.MARKER).read_text()
    mtimes = {p.name: p.stat().st_mtime_ns for p in real_bin.iterdir()}

    def no_build(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("ensure_built rebuilt a valid cache")

    monkeypatch.setattr(lt, "_build", no_build)
    said: list[str] = []
    t0 = time.perf_counter()
    assert lt.ensure_built(progress=said.append) == real_bin
    assert time.perf_counter() - t0 < 0.5
    assert said == []
    assert (real_bin.parent / lt.MARKER).read_text() == marker_before
    assert {p.name: p.stat().st_mtime_ns for p in real_bin.iterdir()} == mtimes


def test_cli_path_prints_the_tool(real_bin: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "specdash.tuning.llamacpp_tools", "path", "llama-server"],
        capture_output=True, text=True, timeout=60,
    )
    assert_ok(proc)
    assert proc.stdout.strip() == str(real_bin / "llama-server")


# --- cache logic on a temporary cache, with a fake compile step --------------------------
@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path))
    monkeypatch.delenv(lt.STATIC_ENV, raising=False)
    return tmp_path / "llama.cpp" / VERSION


def _fake_tool(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(0o755)


class FakeBuild:
    """Stands in for lt._build: publishes fake binaries the way the real one does."""

    def __init__(self, delay: float = 0.0):
        self.calls: list[list[str]] = []
        self.static: list[bool] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, version: str, targets: list[str], root: Path, progress: Any, jobs: int, *,
                 static: bool = False) -> dict[str, Any]:
        with self.lock:
            self.calls.append(list(targets))
            self.static.append(static)
        time.sleep(self.delay)
        shutil.rmtree(root / "bin", ignore_errors=True)
        for t in targets:
            _fake_tool(root / "bin" / t)
        marker = {"version": version, "host": lt.host_id(), "targets": targets, "link": "static" if static else "wheel",
                  "wheel_id": lt.wheel_id(), "static_requested": static}
        (root / lt.MARKER).write_text(json.dumps(marker))
        return marker


def test_partial_cache_without_marker_is_rebuilt(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for t in lt.DEFAULT_TARGETS:  # every binary there, but the marker was never written
        _fake_tool(tmp_cache / "bin" / t)
    (tmp_cache / ".build-dead").mkdir()  # a crashed builder's temp dir
    assert lt.missing_tools(lt.DEFAULT_TARGETS) == list(lt.DEFAULT_TARGETS)
    assert not lt.is_built()
    with pytest.raises(SpecdashError, match="not built yet"):
        lt.tool_path("llama-server")

    fake = FakeBuild()
    monkeypatch.setattr(lt, "_build", fake)
    said: list[str] = []
    assert lt.ensure_built(progress=said.append) == tmp_cache / "bin"
    assert fake.calls == [list(lt.DEFAULT_TARGETS)]
    assert any("unfinished build" in s for s in said)
    assert not (tmp_cache / ".build-dead").exists()
    assert lt.is_built() and lt.tool_path("llama-lookup") == tmp_cache / "bin" / "llama-lookup"


def test_marker_for_another_version_or_a_missing_binary_is_not_a_build(tmp_cache: Path) -> None:
    for t in lt.DEFAULT_TARGETS:
        _fake_tool(tmp_cache / "bin" / t)
    (tmp_cache / lt.MARKER).write_text(json.dumps({"version": "0.0.1", "targets": list(lt.DEFAULT_TARGETS)}))
    assert not lt.is_built()
    marker = {"version": VERSION, "targets": list(lt.DEFAULT_TARGETS), "host": lt.host_id(), "link": "wheel",
              "wheel_id": lt.wheel_id()}
    (tmp_cache / lt.MARKER).write_text(json.dumps(marker))
    assert lt.is_built()
    # built with -march=native on another CPU: would die with SIGILL here
    (tmp_cache / lt.MARKER).write_text(json.dumps(dict(marker, host="x86_64-0000000000000000")))
    assert not lt.is_built()
    (tmp_cache / lt.MARKER).write_text(json.dumps(marker))
    (tmp_cache / "bin" / "llama-lookup").unlink()
    assert lt.missing_tools(lt.DEFAULT_TARGETS) == ["llama-lookup"]
    (tmp_cache / lt.MARKER).write_text("{truncated")
    assert not lt.is_built(["llama-server"])


def test_asking_for_a_new_tool_keeps_the_cached_ones(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBuild()
    monkeypatch.setattr(lt, "_build", fake)
    lt.ensure_built(["llama-server"], progress=lambda s: None)
    lt.ensure_built(["llama-bench"], progress=lambda s: None)
    assert fake.calls == [["llama-server"], ["llama-bench", "llama-server"]]
    assert lt.is_built(["llama-server", "llama-bench"])
    lt.ensure_built(["llama-server", "llama-bench"], progress=lambda s: None)
    assert len(fake.calls) == 2


def test_two_concurrent_builders_build_once(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBuild(delay=1.0)
    monkeypatch.setattr(lt, "_build", fake)
    said: list[str] = []
    results: list[Path] = []
    errors: list[BaseException] = []

    def builder() -> None:
        try:
            results.append(lt.ensure_built(progress=said.append))
        except BaseException as exc:  # surfaced by the asserts below
            errors.append(exc)

    threads = [threading.Thread(target=builder) for _ in range(2)]
    for th in threads:
        th.start()
        time.sleep(0.2)  # the second one arrives while the first holds the lock
    for th in threads:
        th.join(30)
    assert errors == []
    assert results == [tmp_cache / "bin"] * 2
    assert len(fake.calls) == 1
    assert any("waiting for it" in s for s in said)


def test_bad_target_names_are_refused(tmp_cache: Path) -> None:
    with pytest.raises(SpecdashError, match="not a llama.cpp target"):
        lt.ensure_built(["../evil"])
    with pytest.raises(SpecdashError, match="no llama.cpp targets"):
        lt.ensure_built([])


def test_cli_path_of_an_unbuilt_tool_exits_2(tmp_cache: Path) -> None:
    env = dict(os.environ, SPECDASH_CACHE=str(tmp_cache.parent.parent))
    proc = subprocess.run(
        [sys.executable, "-m", "specdash.tuning.llamacpp_tools", "path", "llama-server"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "not built yet" in proc.stderr and "llamacpp_tools build" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --- linked to the wheel's own libraries, or static ----------------------------------------
needs_wheel = pytest.mark.skipif(lt.wheel_id() is None, reason="the installed llama-cpp-python has no linkable libraries")


def _write_marker(root: Path, **fields: Any) -> None:
    marker = {"version": VERSION, "host": lt.host_id(), "targets": list(lt.DEFAULT_TARGETS), **fields}
    (root / lt.MARKER).write_text(json.dumps(marker))


@needs_wheel
def test_wheel_id_is_the_libraries_content_not_their_place(monkeypatch: pytest.MonkeyPatch) -> None:
    record = lt._wheel_record()
    wid = lt.wheel_id(record)
    assert wid is not None and len(wid) == 16
    libs = lt.wheel_libs(record)
    assert sorted(libs) == sorted(lt.WHEEL_LIBS)
    for name, rel in libs.items():  # the SONAME files: what the tools will ask the loader for
        assert rel == f"lib/lib{name}.so.0" or rel.startswith(f"lib/lib{name}.so."), rel
        path, sha = record[rel]
        assert lt._record_hash(path) == sha, rel  # RECORD tells the truth about the bytes
    # .ci/run recreates its venv: same wheel, other paths -> same id
    moved = {rel: (Path("/elsewhere") / rel, sha) for rel, (_, sha) in record.items()}
    assert lt.wheel_id(moved) == wid
    # llama-cpp-python rebuilt (other flags, other commit): one library differs -> other id
    rebuilt = dict(record)
    path, sha = rebuilt[libs["ggml-cpu"]]
    rebuilt[libs["ggml-cpu"]] = (path, sha[::-1])
    assert lt.wheel_id(rebuilt) not in (None, wid)
    # a library missing from RECORD: nothing to link
    del rebuilt[libs["mtmd"]]
    assert lt.wheel_id(rebuilt) is None
    monkeypatch.setattr(lt.sys, "platform", "darwin")
    assert lt.wheel_id(record) is None


@needs_wheel
def test_a_changed_wheel_means_not_built(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for t in lt.DEFAULT_TARGETS:
        _fake_tool(tmp_cache / "bin" / t)
    _write_marker(tmp_cache, link="wheel", wheel_id=lt.wheel_id())
    assert lt.is_built()
    _write_marker(tmp_cache, link="wheel", wheel_id="0000000000000000")
    assert not lt.is_built()
    with pytest.raises(SpecdashError, match="needs a rebuild .llama-cpp-python's libraries changed"):
        lt.tool_path("llama-server")
    fake = FakeBuild()
    monkeypatch.setattr(lt, "_build", fake)
    said: list[str] = []
    lt.ensure_built(progress=said.append)
    assert fake.calls == [list(lt.DEFAULT_TARGETS)] and fake.static == [False]
    assert any("libraries changed" in line and "rebuilding" in line for line in said)
    assert lt.is_built()


@needs_wheel
def test_static_builds_serve_when_asked_for_or_as_this_wheels_fallback(tmp_cache: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for t in lt.DEFAULT_TARGETS:
        _fake_tool(tmp_cache / "bin" / t)
    wid = lt.wheel_id()
    # asked for: serves only while it is asked for
    _write_marker(tmp_cache, link="static", wheel_id=wid, static_requested=True)
    assert not lt.is_built()
    monkeypatch.setenv(lt.STATIC_ENV, "1")
    assert lt.is_built()
    _write_marker(tmp_cache, link="wheel", wheel_id=wid)
    assert not lt.is_built()  # linked, but static asked for
    monkeypatch.setenv(lt.STATIC_ENV, "0")
    assert lt.is_built()
    monkeypatch.delenv(lt.STATIC_ENV)
    # the fallback for this very wheel: serves; for another wheel, or from before the
    # linked build existed (no wheel id), it does not: the libraries may be linkable now
    _write_marker(tmp_cache, link="static", wheel_id=wid, static_requested=False, static_why="x")
    assert lt.is_built()
    _write_marker(tmp_cache, link="static", wheel_id="0000000000000000", static_requested=False)
    assert not lt.is_built()
    _write_marker(tmp_cache)  # an older specdash's static marker
    assert not lt.is_built()
    assert lt.missing_tools(["llama-bench"], static=True) == []


def test_static_is_passed_down_to_the_build(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBuild()
    monkeypatch.setattr(lt, "_build", fake)
    lt.ensure_built(["llama-server"], progress=lambda s: None, static=True)
    assert fake.static == [True]
    assert lt.missing_tools(["llama-server"], static=True) == []
    monkeypatch.setenv(lt.STATIC_ENV, "yes")
    lt.ensure_built(["llama-server"], progress=lambda s: None)
    assert fake.static == [True]  # the env var asks for what is cached: no rebuild
    seen: list[Any] = []
    monkeypatch.setattr(lt, "ensure_built", lambda targets, **kw: seen.append(kw.get("static")) or tmp_cache / "bin")
    assert lt.main(["build", "--static"]) == 0 and lt.main(["build"]) == 0
    assert seen == [True, None]  # None: the env var decides


@needs_wheel
def test_the_installed_wheel_is_linkable_and_refusals_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = lt._wheel_for_linking(lt.DEFAULT_TARGETS)
    assert wheel.id == lt.wheel_id()
    with pytest.raises(SpecdashError, match="llama-cli not among the linked build's tools"):
        lt._wheel_for_linking(["llama-server", "llama-cli"])
    record = lt._wheel_record()
    config = record[lt._GGML_CONFIG][0].read_text()
    assert lt._ggml_config(config)["GGML_NATIVE"] == "ON"
    for before, after, says in [('set(GGML_NATIVE "ON")', 'set(GGML_NATIVE "OFF")', "GGML_NATIVE=OFF, not ON"),
                                ('set(GGML_BACKEND_DL "OFF")', 'set(GGML_BACKEND_DL "ON")', "GGML_BACKEND_DL=ON"),
                                ('set(GGML_AVAILABLE_BACKENDS "ggml-cpu")',
                                 'set(GGML_AVAILABLE_BACKENDS "ggml-cpu;ggml-cuda")', "ggml-cuda, not ggml-cpu")]:
        assert before in config
        fake = tmp_path / "ggml-config.cmake"
        fake.write_text(config.replace(before, after))
        monkeypatch.setattr(lt, "_wheel_record", lambda fake=fake: {**record, lt._GGML_CONFIG: (fake, "x")})
        with pytest.raises(SpecdashError, match=says):
            lt._wheel_for_linking(lt.DEFAULT_TARGETS)
    libllama = lt.wheel_libs(record)["llama"]
    monkeypatch.setattr(lt, "_wheel_record", lambda: {k: v for k, v in record.items() if k != libllama})
    with pytest.raises(SpecdashError, match=r"RECORD lists no single lib/libllama\.so\.N"):
        lt._wheel_for_linking(lt.DEFAULT_TARGETS)
    monkeypatch.setattr(lt.sys, "platform", "darwin")
    with pytest.raises(SpecdashError, match="only done on Linux"):
        lt._wheel_for_linking(lt.DEFAULT_TARGETS)


@needs_wheel
def test_staged_libraries_are_the_wheels_bytes_under_their_soname(tmp_path: Path) -> None:
    wheel = lt._wheel_for_linking(lt.DEFAULT_TARGETS)
    stage = tmp_path / "bin"
    stage.mkdir()
    log = lt._Log(tmp_path / "log")
    try:
        info = lt._stage_wheel_libs(wheel, stage, log)
    finally:
        log.close()
    assert sorted(p.name for p in stage.iterdir()) == sorted(info["sonames"].values())
    assert info["sonames"]["llama"] == Path(wheel.libs["llama"]).name
    # what cpp-httplib and subproc must match: read from libllama-common's own ELF
    needed = subprocess.run(["readelf", "-d", str(stage / info["sonames"]["llama-common"])], capture_output=True,
                            text=True).stdout
    assert info["openssl"] == ("libssl.so" in needed)
    assert isinstance(info["subprocess"], bool)
    # a library that is not what RECORD says (changed after install) is refused
    rel = wheel.libs["ggml"]
    bad = lt._Wheel(wheel.id, {**wheel.record, rel: (wheel.record[rel][0], "A" * 43)}, wheel.libs)
    stage2 = tmp_path / "bin2"
    stage2.mkdir()
    log = lt._Log(tmp_path / "log2")
    try:
        with pytest.raises(SpecdashError, match="differs from llama-cpp-python's RECORD"):
            lt._stage_wheel_libs(bad, stage2, log)
    finally:
        log.close()


@needs_wheel
def test_sdist_headers_must_be_the_wheels(tmp_path: Path) -> None:
    wheel = lt._wheel_for_linking(lt.DEFAULT_TARGETS)
    src = tmp_path / "llama.cpp"
    for in_sdist, in_wheel in lt._SAME_SOURCE.items():
        (src / in_sdist).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel.record[in_wheel][0], src / in_sdist)
    lt._check_same_source(src, wheel)
    with (src / "include" / "llama.h").open("a") as f:
        f.write("// another llama.cpp\n")
    with pytest.raises(SpecdashError, match="include/llama.h differs from the wheel's"):
        lt._check_same_source(src, wheel)
    (src / "include" / "llama.h").unlink()
    with pytest.raises(SpecdashError, match="one is missing"):
        lt._check_same_source(src, wheel)


def test_the_shim_cmakelists_ships_as_package_data() -> None:
    import specdash

    text = (lt.importlib.resources.files("specdash.tuning") / lt.SHIM_CMAKELISTS).read_text(encoding="utf-8")
    assert "add_custom_target(specdash-tools)" in text and "SPECDASH_WHEEL_LIBS" in text
    # every tool of the linked build has its subdirectory there
    for t, subdir in {"llama-server": "tools/server", "llama-completion": "tools/completion",
                      "llama-lookup": "examples/lookup", "llama-speculative-simple": "examples/speculative-simple",
                      "llama-bench": "tools/llama-bench"}.items():
        assert t in lt.LINKED_TARGETS and f"add_subdirectory({subdir})" in text
    # pyproject's package-data globs (setuptools globs them from the package dir) take it
    # into a wheel, not only into an editable install
    import tomllib

    pkg = Path(specdash.__file__).parent
    pyproject = tomllib.loads((pkg.parent / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["specdash"]
    assert any(pkg / "tuning" / lt.SHIM_CMAKELISTS in pkg.glob(g) for g in globs)


class _FakeSteps:
    """_build's toolchain, sdist and compile steps faked; its choice of link, fallback,
    publishing and marker are real."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, linked_fails: str | None = None):
        self.linked_calls = 0
        self.static_calls = 0
        self.linked_fails = linked_fails
        monkeypatch.setattr(lt, "check_toolchain", lambda: {"cmake": "cmake", "cmake_version": "3.25",
                                                           "cxx": "c++", "make": "make"})
        monkeypatch.setattr(lt, "_fetch_source", self.fetch)
        monkeypatch.setattr(lt, "_build_linked", self.linked)
        monkeypatch.setattr(lt, "_build_static", self.static)

    def fetch(self, version: str, work: Path, progress: Any, log: Any) -> Path:
        src = work / "src"
        src.mkdir()
        (src / "CMakeLists.txt").write_text("upstream")
        return src

    def linked(self, tools: Any, src: Path, build: Path, stage: Path, targets: list[str], *rest: Any) -> Any:
        self.linked_calls += 1
        (stage / "libllama.so.0").write_text("lib")
        (src / "CMakeLists.txt").rename(src / lt._UPSTREAM_CMAKELISTS)
        (src / "CMakeLists.txt").write_text("shim")
        if self.linked_fails:
            raise SpecdashError(self.linked_fails)
        for t in targets:
            _fake_tool(stage / t)
        return ["-DSPECDASH_WHEEL_LIBS=<bin>"], {"wheel_libs": {"libllama.so.0": "sha"}}

    def static(self, tools: Any, src: Path, build: Path, stage: Path, targets: list[str], *rest: Any) -> Any:
        self.static_calls += 1
        assert (src / "CMakeLists.txt").read_text() == "upstream"  # the shim was taken back
        assert list(stage.iterdir()) == []  # no copied library left from the linked attempt
        for t in targets:
            _fake_tool(stage / t)
        return list(lt.CMAKE_OPTIONS)


@needs_wheel
def test_build_links_the_wheel_when_it_can(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _FakeSteps(monkeypatch)
    said: list[str] = []
    lt.ensure_built(progress=said.append)
    assert (steps.linked_calls, steps.static_calls) == (1, 0)
    marker = lt.read_marker()
    assert marker is not None
    assert marker["link"] == "wheel" and marker["wheel_id"] == lt.wheel_id() and "static_why" not in marker
    assert sorted(p.name for p in (tmp_cache / "bin").iterdir()) == sorted([*lt.DEFAULT_TARGETS, "libllama.so.0"])
    assert any("linked to llama-cpp-python's libraries" in line for line in said)
    assert lt.is_built()


@needs_wheel
def test_a_failed_linked_build_falls_back_to_static(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _FakeSteps(monkeypatch, linked_fails="cmake configure (linked) failed (exit 1): boom")
    said: list[str] = []
    lt.ensure_built(progress=said.append)
    assert (steps.linked_calls, steps.static_calls) == (1, 1)
    marker = lt.read_marker()
    assert marker is not None and marker["link"] == "static" and marker["static_requested"] is False
    assert "boom" in marker["static_why"] and marker["wheel_id"] == lt.wheel_id()
    assert sorted(p.name for p in (tmp_cache / "bin").iterdir()) == sorted(lt.DEFAULT_TARGETS)
    assert any(line.startswith("llama.cpp tools: building static instead") and "boom" in line for line in said)
    assert lt.is_built()  # the fallback for this wheel: not retried on every call


def test_an_ineligible_wheel_or_static_asked_for_builds_static(tmp_cache: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _FakeSteps(monkeypatch)

    def not_linkable(targets: Any) -> Any:
        raise SpecdashError("its ggml has GGML_NATIVE=OFF, not ON")

    monkeypatch.setattr(lt, "_wheel_for_linking", not_linkable)
    said: list[str] = []
    lt.ensure_built(["llama-server"], progress=said.append)
    assert (steps.linked_calls, steps.static_calls) == (0, 1)
    marker = lt.read_marker()
    assert marker is not None and marker["link"] == "static" and "GGML_NATIVE=OFF" in marker["static_why"]
    assert any("building static instead" in line and "GGML_NATIVE=OFF" in line for line in said)

    assert lt.missing_tools(["llama-server"], static=True) == []  # static, whatever the reason
    (tmp_cache / lt.MARKER).unlink()
    steps = _FakeSteps(monkeypatch)
    lt.ensure_built(["llama-server"], progress=said.append, static=True)
    assert (steps.linked_calls, steps.static_calls) == (0, 1)
    marker = lt.read_marker()
    assert marker is not None and marker["static_requested"] is True and "--static" in marker["static_why"]


# --- a missing toolchain gives one line naming what to install ---------------------------
def _path_with(tmp_path: Path, *tools: str) -> str:
    d = tmp_path / "pathbin"
    d.mkdir(exist_ok=True)
    for t in tools:
        real = shutil.which(t)
        assert real, f"{t} is needed on this machine for the test"
        (d / t).symlink_to(real)
    return str(d)


def test_missing_cmake_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path))
    with pytest.raises(SpecdashError) as exc:
        lt.check_toolchain()
    msg = str(exc.value)
    assert "cmake not found" in msg and "apt-get install cmake" in msg and "\n" not in msg


def test_missing_compiler_names_build_essential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, "cmake", "make"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(SpecdashError) as exc:
        lt.check_toolchain()
    msg = str(exc.value)
    assert "C++ compiler" in msg and "build-essential" in msg and "\n" not in msg


def test_complete_toolchain_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, "cmake", "make", "cc", "c++"))
    monkeypatch.delenv("CMAKE_GENERATOR", raising=False)
    found = lt.check_toolchain()
    assert Path(found["cmake"]).parent == tmp_path / "pathbin"
    assert found["cmake_version"]


def test_build_progress_is_thinned(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    prog = lt._BuildProgress(said.append, step=5, every_s=1e9)
    for pct in range(0, 101):
        prog(f"[{pct:3d}%] Building CXX object foo{pct}.o")
        prog("some compiler chatter")
    assert 15 <= len(said) <= 22
    assert said[0].lstrip().startswith("[  0%]") and "[100%]" in said[-1]
    said.clear()
    prog = lt._BuildProgress(said.append, step=5, every_s=1e9)
    for i in range(1, 201):
        prog(f"[{i}/200] Building CXX object bar.o")
    assert 15 <= len(said) <= 22


# --- the peer benchmark reads what these binaries print ----------------------------------
def _peer_module() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "peer_llamacpp.py"
    spec = importlib.util.spec_from_file_location("peer_llamacpp", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["peer_llamacpp"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_peer_benchmark_parses_the_tools_output(real_bin: Path, smol_path: Path, tmp_path: Path) -> None:
    peer = _peer_module()
    prompt = tmp_path / "p.txt"
    text = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick"
    prompt.write_text(text + "\n")
    common = ["-m", str(smol_path), "-f", str(prompt), "--no-escape", "-n", "8", "-t", "2", "-tb", "2",
              "-c", "512", "--temp", "0"]
    runs = {
        "llama-completion": ["-no-cnv", "--no-display-prompt"],
        "llama-lookup": ["--spec-draft-n-max", "4"],
        "llama-speculative-simple": ["-md", str(smol_path), "--spec-type", "draft-simple",
                                     "--spec-draft-n-max", "4"],
    }
    for tool, extra in runs.items():
        proc = subprocess.run([str(real_bin / tool), *tool_args(), *common, *extra], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"{tool}: {proc.stderr[-800:]}"
        if tool == "llama-completion":
            got = peer.parse_completion(proc.stderr)
            assert got["n_generated"] == 8 and got["n_drafted"] == 0
        else:
            got = peer.parse_speculative_tool(proc.stderr, tool)
            assert 8 <= got["n_generated"] <= 8 + 4 + 1
            assert 0 <= got["n_accepted"] <= got["n_drafted"]
            assert got["steps"] == got["n_generated"] - got["n_accepted"]
            # the echoed prompt is cut off; what is left is the generation
            assert text not in peer.peer_generated_text(proc.stdout, text)
        if tool == "llama-speculative-simple":
            assert got["n_drafted"] > 0  # a model drafting itself always drafts
        assert got["n_prompt"] > 10 and got["decode_s"] > 0 and got["tokens_per_s"] > 0
    assert not list(tmp_path.glob("*.bin"))  # llama-lookup wrote no n-gram cache file


def test_peer_benchmark_replays_specdashs_lookup_over_a_generated_text(smol_path: Path, tmp_path: Path) -> None:
    """The same-text column: specdash's lookup rule replayed over a generated text counts
    what a real `specdash run --raw` at that K drafted, accepted and stepped over it,
    for a run cut by the budget and for one that met end-of-turn."""
    from cli_helpers import specdash
    from specdash.engine.llm import LLM
    from specdash.engine.settings import EngineSettings

    peer = _peer_module()
    vocab = LLM(smol_path, vocab_only=True)
    templated = vocab.chat_prompt("Repeat this line four times: the cat sat on the mat, the dog sat on the log.")
    prompt = tmp_path / "p.txt"
    prompt.write_text(templated, encoding="utf-8", newline="")
    for budget in (12, 48):
        proc = specdash("run", "--json", "--raw", "--prompt-file", str(prompt), "--target", str(smol_path),
                        "--draft", "lookup", "--k", "4", "--no-adaptive", "--threads", "1", "--ctx", "1024",
                        "--max-tokens", str(budget))
        assert_ok(proc)
        real = peer.parse_specdash_summary(proc.stdout, "specdash run")
        replay = peer.lookup_replay(vocab, templated, EngineSettings(), budget)
        steps, drafted, accepted = replay(real["text"], 4, real["n_generated"])
        assert accepted > 0  # the repeated line was copied
        assert (steps, drafted) == (real["steps"], real["num_draft_tokens"])
        if real["n_generated"] == budget:
            assert accepted == real["num_accepted_tokens"]
        else:
            # the engine also counts draft tokens that matched past the end of turn
            assert real["num_accepted_tokens"] - 3 <= accepted <= real["num_accepted_tokens"]
            # llama.cpp's tools print the end-of-turn token and what follows: not text
            assert "<|im_end|>" in templated
            printed = real["text"] + "<|im_end|>\n\n"
            assert replay(printed, 4, real["n_generated"]) == (steps, drafted, accepted)
        # K bounds the draft: at K=1 no step drafts more than one token, so more steps
        s1, d1, _ = replay(real["text"], 1, real["n_generated"])
        assert d1 <= s1 and s1 > steps
    assert real["n_generated"] < 48  # so the second run did meet end of turn


def test_peer_benchmark_splits_each_ratio_into_tokens_per_step_and_step_cost() -> None:
    peer = _peer_module()

    def run(side: str, rnd: int, n: int, steps: int, decode_s: float) -> Any:
        return peer.RunResult(side, "lookup K=4", "p", rnd, n / decode_s, n, 10, 40, 20, steps, decode_s,
                              None, None, None, decode_s, text="same")

    runs = [run("specdash", 1, 100, 50, 5.0), run("llama-lookup", 1, 100, 40, 5.5),
            run("specdash", 2, 100, 50, 4.0), run("llama-lookup", 2, 100, 40, 4.0)]
    ratios, rows = peer.aggregate("p", runs, 2)
    row = rows[0]
    for i, r in enumerate(ratios[0].ratios):
        assert row["tokens_per_step_ratio"][i] * row["step_cost_ratio"][i] == pytest.approx(r)
    assert row["tokens_per_step_ratio"] == pytest.approx([0.8, 0.8])
    assert row["step_cost_ratio"] == pytest.approx([(5.5 / 40) / (5.0 / 50), 1.25])
    assert any(n.startswith("why: tokens/step x0.800") for n in ratios[0].notes)


def test_peer_benchmark_refuses_a_file_it_did_not_write(tmp_path: Path) -> None:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "peer_llamacpp.py"
    bad = tmp_path / "other.json"
    bad.write_text('{"runs": []}')
    for arg in (str(bad), str(tmp_path / "missing.json")):
        proc = subprocess.run([sys.executable, str(path), "--from-json", arg], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: --from-json {arg}: not a saved peer benchmark")
