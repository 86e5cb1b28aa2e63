"""The tiny MoE GGUF from tests/moe_fixture.py is a real model to llama.cpp, and its
expert_used_count override really changes what it computes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import numpy as np
import pytest

from moe_fixture import ARCH, _smollm2, make_tiny_moe

from specdash.engine.llm import LLM


PROMPT = "def fibonacci(n):\n    return"
N_EXPERT = 4


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "tiny-moe.gguf"
    return make_tiny_moe(path, n_expert=N_EXPERT, n_expert_used=2)


def load(path: Path, **kwargs) -> LLM:
    """Through the engine's loader, which applies the machine's weight-repacking verdict
    (AMX crashes some CPUs on a multi-token batch: engine/repack.py)."""
    return LLM(path, n_ctx=256, n_threads=2, n_batch=64, **kwargs)


def last_logits(path: Path, experts: int | None) -> np.ndarray:
    overrides = None if experts is None else {f"{ARCH}.expert_used_count": experts}
    llm = load(path, kv_overrides=overrides)
    try:
        return llm.decode(llm.tokenize(PROMPT), 0, "last")[0].copy()
    finally:
        llm.close()


def test_metadata_describes_a_moe_llama(tiny_moe):
    reader = gguf.GGUFReader(tiny_moe)
    assert reader.fields["general.architecture"].contents() == ARCH == "llama"
    assert reader.fields[f"{ARCH}.expert_count"].contents() == N_EXPERT
    assert reader.fields[f"{ARCH}.expert_used_count"].contents() == 2
    names = {t.name for t in reader.tensors}
    for i in range(2):
        for part in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "attn_q"):
            assert f"blk.{i}.{part}.weight" in names
    assert "blk.0.ffn_up.weight" not in names  # experts replace the dense FFN
    assert tiny_moe.stat().st_size < 8_000_000


def test_same_seed_same_bytes(tmp_path, tiny_moe):
    again = make_tiny_moe(tmp_path / "again.gguf", n_expert=N_EXPERT, n_expert_used=2)
    assert again.read_bytes() == tiny_moe.read_bytes()
    other = make_tiny_moe(tmp_path / "other.gguf", n_expert=N_EXPERT, n_expert_used=2, seed=1)
    assert other.read_bytes() != tiny_moe.read_bytes()


def test_tokenizer_is_smollm2s(tiny_moe):
    moe = LLM(tiny_moe, vocab_only=True)
    smol = LLM(_smollm2(), vocab_only=True)
    try:
        assert moe.n_vocab == smol.n_vocab == 49152
        tokens = smol.tokenize(PROMPT)
        assert moe.tokenize(PROMPT) == tokens
        assert moe.detokenize(tokens) == smol.detokenize(tokens)
        assert (moe.bos, moe.eos) == (smol.bos, smol.eos)
    finally:
        moe.close()
        smol.close()


def test_expert_used_count_override_changes_the_logits(tiny_moe):
    logits = {n: last_logits(tiny_moe, n) for n in (1, 2, 4)}
    for n, row in logits.items():
        assert row.shape == (49152,) and np.isfinite(row).all(), n
    # Same N twice is bit-identical, so any difference below is the expert count's doing.
    np.testing.assert_array_equal(last_logits(tiny_moe, 2), logits[2])
    # No override = the file's expert_used_count (2).
    np.testing.assert_array_equal(last_logits(tiny_moe, None), logits[2])
    for a, b in ((1, 2), (2, 4), (1, 4)):
        assert np.abs(logits[a] - logits[b]).max() > 1e-2, (a, b)


@pytest.mark.parametrize("experts", [0, N_EXPERT + 1])
def test_expert_used_count_outside_1_to_expert_count_kills_the_process(tiny_moe, experts):
    """llama.cpp checks 0 < expert_used_count <= expert_count with GGML_ASSERT, which
    aborts the whole process rather than raising: the engine must validate N itself
    before loading. Run in a child so the abort does not take pytest down."""
    code = textwrap.dedent(f"""
        import llama_cpp
        llama_cpp.Llama({str(tiny_moe)!r}, n_ctx=256, n_threads=2, verbose=True,
                        kv_overrides={{"{ARCH}.expert_used_count": {experts}}})
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGABRT
    assert "GGML_ASSERT(n_expert_used_max" in child.stderr
