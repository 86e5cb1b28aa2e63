"""MoE expert counts from GGUF metadata, and the check every expert override passes.

Why a check of our own: llama.cpp validates expert_used_count with GGML_ASSERT, which
aborts the whole process (dashboard included) instead of failing the load. So every
path that sets it (--experts, the config file, SetExperts, bench --experts) must be
refused here first.
"""

from __future__ import annotations

from specdash.engine.llm import LLM
from specdash.contract.errors import SpecdashError


def expert_counts(llm: LLM) -> tuple[int, int] | None:
    """(expert_used_count, expert_count) from the GGUF metadata; None for a dense model.
    The metadata is the file's: a kv override does not show here."""
    arch = llm.arch
    count = llm.meta(f"{arch}.expert_count")
    if not count or int(count) <= 1:
        return None
    used = llm.meta(f"{arch}.expert_used_count")
    return (int(used) if used else int(count)), int(count)


def expert_info(llm: LLM, override: int | None) -> tuple[int, int] | None:
    """(active, total) experts per token of `llm` loaded with `override` (None = the file's)."""
    counts = expert_counts(llm)
    if counts is None:
        return None
    used, count = counts
    return (used if override is None else override), count


def expert_key(llm: LLM, n: int) -> str:
    """Validate an expert-count override against the GGUF metadata; return its kv key."""
    counts = expert_counts(llm)
    if counts is None:
        arch = llm.arch
        raise SpecdashError(
            f"{llm.path.name} is a dense model ({arch}, no {arch}.expert_count): "
            "the expert count cannot be changed"
        )
    count = counts[1]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= count:
        raise SpecdashError(f"experts={n} refused: {llm.path.name} has {count} experts; use 1..{count}")
    return f"{llm.arch}.expert_used_count"
