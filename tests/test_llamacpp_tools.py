"""llama.cpp's tools built from llama-cpp-python's vendored source (specdash.llamacpp_tools).

The real build takes about 10 minutes on 2 cores; `.ci/run` does it before pytest, so here
`ensure_built()` normally finds the cache. The cache-logic tests run against a temporary
$SPECDASH_CACHE with the compile step replaced by a fake, so they are fast and test the
marker, the lock and the partial-build handling, not cmake.
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

from specdash import llamacpp_tools as lt
from specdash.engine.repack import tool_args
from specdash.errors import SpecdashError
from specdash.models.registry import cache_dir

VERSION = lt.llama_cpp_python_version()


# --- the real build -------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_bin() -> Path:
    return lt.ensure_built()


def test_every_default_tool_is_built_static_and_runs(real_bin: Path) -> None:
    assert real_bin == cache_dir() / "llama.cpp" / VERSION / "bin"
    assert lt.read_marker() is not None
    for name in lt.DEFAULT_TARGETS:
        path = lt.tool_path(name)
        assert path == real_bin / name
        assert path.is_file() and os.access(path, os.X_OK), name
        # Static build: nothing from the (deleted) build directory is loaded at run time.
        assert lt._dynamic_llama_libs(path) == [], name
        flag = "--help" if name == "llama-bench" else "--version"
        proc = subprocess.run([str(path), flag], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{name} {flag}: {proc.stderr[-500:]}"
        if flag == "--version":
            assert "version:" in proc.stderr + proc.stdout, name
    # Only binaries are kept: no cmake build tree, no sources, no temp dirs.
    root = real_bin.parent
    assert sorted(p.name for p in real_bin.iterdir()) == sorted(lt.DEFAULT_TARGETS)
    assert not list(root.glob(".build-*"))


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
        [sys.executable, "-m", "specdash.llamacpp_tools", "path", "llama-server"],
        capture_output=True, text=True, timeout=60,
    )
    assert_ok(proc)
    assert proc.stdout.strip() == str(real_bin / "llama-server")


# --- cache logic on a temporary cache, with a fake compile step --------------------------
@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path))
    return tmp_path / "llama.cpp" / VERSION


def _fake_tool(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(0o755)


class FakeBuild:
    """Stands in for lt._build: publishes fake binaries the way the real one does."""

    def __init__(self, delay: float = 0.0):
        self.calls: list[list[str]] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, version: str, targets: list[str], root: Path, progress: Any, jobs: int) -> dict[str, Any]:
        with self.lock:
            self.calls.append(list(targets))
        time.sleep(self.delay)
        shutil.rmtree(root / "bin", ignore_errors=True)
        for t in targets:
            _fake_tool(root / "bin" / t)
        marker = {"version": version, "targets": targets}
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
    marker = {"version": VERSION, "targets": list(lt.DEFAULT_TARGETS), "host": lt.host_id()}
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
        [sys.executable, "-m", "specdash.llamacpp_tools", "path", "llama-server"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "not built yet" in proc.stderr and "llamacpp_tools build" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


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
