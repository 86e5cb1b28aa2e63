"""Shared fixtures: the real models (fetched on first use into $SPECDASH_CACHE)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config):
    """Resolve weight repacking once for the run (engine/repack.py: a real probe in a child
    on a new machine, seconds; then the cached verdict) and hand the mode to every child
    this run starts (`specdash` subprocesses, llama.cpp tools): tests that point
    $SPECDASH_CACHE at a private folder would otherwise probe again in each child."""
    from specdash.engine import repack

    config._repack_verdict = repack.resolve()
    os.environ.setdefault(repack.ENV, config._repack_verdict.mode)
    # Adaptive K chooses on a scripted batch-cost shape in every test and every child a test
    # starts, never on this CPU's (which differs by machine kind, issue 38): the Intel
    # machine's by default; tests of a choice run under both curves (`cost_curve`), tests of
    # calibration itself drop it (`measured_costs`).
    from specdash.sources.session import COST_SHAPE_ENV

    os.environ.setdefault(COST_SHAPE_ENV, str(COST_PROFILES["intel-amx"]))


# tests/fixtures/profiles: the two machine kinds' batch-cost curves (what a 4-token batch
# costs: 1.57x one token on the Intel machine, 3.3x on the AVX2-only AMD one).
COST_PROFILES = {name: Path(__file__).parent / "fixtures" / "profiles" / f"{name}.toml"
                 for name in ("intel-amx", "epyc-avx2")}


@pytest.fixture(params=sorted(COST_PROFILES))
def cost_curve(request, monkeypatch) -> str:
    """Run the test under each machine kind's cost curve (pinned, SPECDASH_COST_SHAPE): what
    adaptive K or auto chooses must be right on both. Returns the profile's name."""
    from specdash.sources.session import COST_SHAPE_ENV

    monkeypatch.setenv(COST_SHAPE_ENV, str(COST_PROFILES[request.param]))
    return request.param


@pytest.fixture(autouse=True)
def private_profiles(tmp_path_factory, monkeypatch) -> Path:
    """Kept cost profiles (specdash/costs) go to a folder of this test's own, for it and
    the children it starts: no test depends on what an earlier one kept."""
    from specdash.costs.store import PROFILE_DIR_ENV

    folder = tmp_path_factory.mktemp("profiles")
    monkeypatch.setenv(PROFILE_DIR_ENV, str(folder))
    return folder


@pytest.fixture
def measured_costs(monkeypatch) -> None:
    """The test is about measuring this machine's costs: no pinned shape."""
    from specdash.sources.session import COST_SHAPE_ENV

    monkeypatch.delenv(COST_SHAPE_ENV, raising=False)


def _ui_thread_idle() -> None:
    """Textual's test pilot waits after every key (twice) and pause() until the *process*
    spends less than 1 ms of CPU per 20 ms, for at most a second. With a real engine
    decoding in a thread of the same process the process is never idle, so every key cost
    two whole seconds (the recurrent dashboard test: 46 s, of which under 1 s waiting on
    its conditions). What the pilot means is "the UI has handled the input": the UI thread
    idle, which time.thread_time() measures. Without a decoding thread the two agree."""
    import time

    import textual._wait as wait
    import textual.app
    import textual.pilot

    async def wait_for_idle(min_sleep: float = wait.SLEEP_GRANULARITY, max_sleep: float = 1) -> None:
        start = time.monotonic()
        while True:
            cpu = time.thread_time()
            await wait.sleep(wait.SLEEP_GRANULARITY)
            elapsed = time.monotonic() - start
            if elapsed >= max_sleep or (elapsed > min_sleep and time.thread_time() - cpu < wait.SLEEP_IDLE):
                break

    textual.app.wait_for_idle = textual.pilot.wait_for_idle = wait_for_idle  # type: ignore[attr-defined]


_ui_thread_idle()


def pytest_report_header(config):
    """CI logs say what this machine loads weights with and why (an AMX crash shows here)."""
    return f"specdash: {config._repack_verdict.describe()}"


def model_path(name: str):
    from specdash.models.resolve import resolve_model

    return resolve_model(name)


@pytest.fixture(scope="session")
def target_path():
    return model_path("qwen2.5-coder-1.5b")


@pytest.fixture(scope="session")
def draft_path():
    return model_path("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def smol_path():
    return model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path():
    return model_path("gemma3-270m")


@pytest.fixture(scope="session")
def qwen_session():
    """One loaded default pair for the whole test run (loading costs seconds)."""
    from specdash.sources.session import Session
    from specdash.engine.settings import EngineSettings

    # The draft model named: tests of the model's drafting (auto, the default, would
    # choose copies where they pay, and its suffix memory carries over between runs).
    s = Session(EngineSettings(adaptive=False, draft="qwen2.5-coder-0.5b", threads=2, ctx=2048))
    yield s
    s.close()


@pytest.fixture(scope="session")
def small_draft(smol_path):
    """SmolLM2-135M at Q4_0 (benchmarks/fuzz_exact.make_small_draft, made once and cached in
    $SPECDASH_CACHE/fixtures): the small pair's draft model, a real quantization of the
    target that disagrees with it now and then."""
    return fuzz_harness().make_small_draft()


@pytest.fixture(scope="session")
def smol_session(smol_path, small_draft):
    """One loaded small pair (SmolLM2-135M, its Q4_0 as the draft model) for the run: what
    holds on any model (exactness, rollback, commands) is proven here, 5-10x faster than on
    the default pair, which keeps the tests whose point it is."""
    from specdash.engine.settings import EngineSettings
    from specdash.sources.session import Session

    s = Session(EngineSettings(target=str(smol_path), adaptive=False, draft=str(small_draft), threads=2,
                               ctx=2048))
    yield s
    s.close()


def fuzz_harness():
    """benchmarks/fuzz_exact.py as the module `fuzz_exact` (loaded once, by path: the
    exactness tests share its Pair and Reference)."""
    import importlib.util
    import sys
    from pathlib import Path

    if "fuzz_exact" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "fuzz_exact", Path(__file__).resolve().parent.parent / "benchmarks" / "fuzz_exact.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["fuzz_exact"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["fuzz_exact"]


@pytest.fixture(scope="session")
def greedy_reference():
    """Plain greedy decoding of a target, one token per forward pass, shared by every test
    of the run that asks for the same (target, ctx, threads): its model is loaded once and
    its answers (plain continuations, argmaxes along a run) are kept
    (fuzz_exact.Reference). get(target_path, ctx=1024, threads=2, expert_count=None)."""
    F = fuzz_harness()
    made: dict[tuple, object] = {}

    def get(target, ctx: int = 1024, threads: int = 2, expert_count: int | None = None):
        key = (str(target), ctx, threads, expert_count)
        if key not in made:
            made[key] = F.Reference(F.Pair("reference", str(target), None, expert_count=expert_count,
                                           threads=threads, ctx=ctx))
        return made[key]

    yield get
    for ref in made.values():
        ref.close()


_NEAR_TIES: list[str] = []


@pytest.fixture
def near_ties() -> list[str]:
    """Greedy-exactness tests report where batch rounding flipped a near-tie."""
    return _NEAR_TIES


def pytest_terminal_summary(terminalreporter):
    if _NEAR_TIES:
        terminalreporter.section("greedy exactness: near-tie mismatches")
        for line in _NEAR_TIES:
            terminalreporter.write_line(line)


# ------------------------------------------------ recurrent / hybrid fixtures (issue 19)
# Random-weight GGUFs written on first use into <cache>/fixtures by
# tests/fixtures/recurrent_gguf.py (keyed by a hash of the builder's parameters).

def _fixture_module(name: str):
    """tests/fixtures/<name>.py, loaded by path once: tests/fixtures also holds data
    directories (vllm/, llamacpp/) that must not become importable packages."""
    import importlib.util
    import sys
    from pathlib import Path

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "fixtures" / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _recurrent_gguf():
    return _fixture_module("recurrent_gguf")


@pytest.fixture(scope="session")
def recurrent_gguf():
    """The fixture builder module (fixture_path, target_and_draft, write_fixture...)."""
    return _recurrent_gguf()


@pytest.fixture(scope="session")
def lfm2_path():
    """Hybrid (short-conv + attention) that supports recurrent-state snapshots (n_rs_seq)."""
    return _recurrent_gguf().fixture_path("lfm2")


@pytest.fixture(scope="session")
def lfm2_draft_path():
    m = _recurrent_gguf()
    return m.fixture_path("lfm2", perturb=m.DRAFT_PERTURB)


@pytest.fixture(scope="session")
def mamba2_path():
    """Pure recurrent, no snapshots: rollback is checkpoint + replay."""
    return _recurrent_gguf().fixture_path("mamba2")


@pytest.fixture(scope="session")
def mamba2_draft_path():
    m = _recurrent_gguf()
    return m.fixture_path("mamba2", perturb=m.DRAFT_PERTURB)


@pytest.fixture(scope="session")
def hybrid_ckpt_path():
    """Hybrid (Mamba2 + attention, granitehybrid) without snapshots: checkpoint + replay
    with an attention KV to cut back as well."""
    return _recurrent_gguf().fixture_path("granitehybrid")


@pytest.fixture(scope="session")
def hybrid_ckpt_draft_path():
    m = _recurrent_gguf()
    return m.fixture_path("granitehybrid", perturb=m.DRAFT_PERTURB)


# ------------------------------------------------------- MTP-head fixtures (issue 33)
# A random-weight qwen35 with a multi-token-prediction head, written on first use into
# <cache>/fixtures by tests/fixtures/mtp_gguf.py (keyed by a hash of its parameters).

def _mtp_gguf():
    return _fixture_module("mtp_gguf")


@pytest.fixture(scope="session")
def mtp_gguf():
    """The MTP fixture builder module (fixture_path, write_fixture, shape_of...)."""
    return _mtp_gguf()


@pytest.fixture(scope="session")
def qwen35_mtp_path():
    """Hybrid qwen35 (gated delta net + attention, recurrent-state snapshots) with one MTP head."""
    return _mtp_gguf().fixture_path()


@pytest.fixture(scope="session")
def qwen35_nohead_path():
    """The same trunk without its head (a GGUF converted with --no-mtp)."""
    return _mtp_gguf().fixture_path(head=False)
