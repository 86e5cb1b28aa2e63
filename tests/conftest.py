"""Shared fixtures: the real models (fetched on first use into $SPECDASH_CACHE)."""

from __future__ import annotations

import pytest


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
    from specdash.session import Session
    from specdash.engine.settings import EngineSettings

    s = Session(EngineSettings(threads=2, ctx=2048))
    yield s
    s.close()


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
