"""Self-speculative drafts made with llama.cpp's quantizer, on smollm2 (seconds)."""

from __future__ import annotations

import json

import llama_cpp
import pytest

from specdash.contract.errors import SpecdashError
from specdash.models import registry
from specdash.models.compat import check_pair
from specdash.models.gguf_header import check_gguf, gguf_metadata
from specdash.models.quantize import QUANTS, make_draft
from specdash.models.resolve import resolve_model


@pytest.fixture
def smol_cache(tmp_path, monkeypatch):
    """A private cache holding (a link to) the real smollm2, so drafts and registry.json
    land in tmp_path."""
    real = resolve_model("smollm2-135m")
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "smollm2-135m.gguf").symlink_to(real)
    monkeypatch.setenv("SPECDASH_CACHE", str(cache))
    return cache


def _loads(path) -> bool:
    """Weights and all, through the engine's loader (the machine's repack verdict)."""
    from specdash.engine.llm import LLM
    from specdash.contract.errors import SpecdashError

    try:
        LLM(path, n_ctx=256, n_threads=1).close()
    except SpecdashError:
        return False
    return True


def test_make_draft_quantizes_registers_and_pairs(smol_cache):
    seen: list[int] = []
    result = make_draft("smollm2-135m", "q4_0", progress=lambda written, _s: seen.append(written))

    assert result.name == "smollm2-135m-q4_0"
    assert result.path == smol_cache / "models" / "smollm2-135m-q4_0.gguf"
    assert not result.path.with_name(result.path.name + ".partial").exists()
    check_gguf(result.path)
    assert gguf_metadata(result.input_path)["general.file_type"] == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1
    assert gguf_metadata(result.path)["general.file_type"] == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    assert result.size == result.path.stat().st_size < result.input_size
    assert _loads(result.path)
    assert seen  # progress was reported while the thread ran

    entries = json.loads((smol_cache / "models" / "registry.json").read_text())["models"]
    assert entries == [{"name": "smollm2-135m-q4_0", "path": str(result.path), "quant": "Q4_0",
                        "role": "draft", "for": "smollm2-135m"}]
    listed = {e.name: e for e in registry.list_models()}
    assert listed["smollm2-135m-q4_0"].role == "draft" and listed["smollm2-135m-q4_0"].cached
    assert resolve_model("smollm2-135m-q4_0") == result.path
    # Same tokenizer by construction: the self-speculative pair passes every rule.
    assert check_pair(result.input_path, result.path).compatible


def test_unknown_quant_lists_valid_ones(smol_cache):
    with pytest.raises(SpecdashError) as exc:
        make_draft("smollm2-135m", "Q9_X")
    msg = str(exc.value)
    assert "--quant 'Q9_X': not a supported type" in msg
    assert all(q in msg for q in QUANTS)


def test_draft_cannot_take_a_builtin_name(smol_cache):
    with pytest.raises(SpecdashError, match="is a built-in model"):
        make_draft("smollm2-135m", "Q4_0", name="gemma3-270m")


def test_bad_draft_name(smol_cache):
    with pytest.raises(SpecdashError, match="letters, digits"):
        make_draft("smollm2-135m", "Q4_0", name="../escape")


def test_missing_draft_file_says_how_to_remake(smol_cache):
    registry.register_user_draft(
        registry.UserDraft(name="gone", path=str(smol_cache / "models" / "gone.gguf"),
                           target="smollm2-135m", quant="Q4_0")
    )
    with pytest.raises(SpecdashError, match=r"make-draft smollm2-135m --quant Q4_0 --name gone"):
        resolve_model("gone")


def test_quantizer_failure_carries_llama_cpp_reason(smol_cache, tmp_path):
    from test_models import _gguf_bytes

    bad = tmp_path / "alien.gguf"
    bad.write_bytes(_gguf_bytes({"general.architecture": "alien"}, []))
    with pytest.raises(SpecdashError, match=r"to Q4_0 failed: .*unknown model architecture: 'alien'"):
        make_draft(str(bad), "Q4_0", name="alien-q4")
    assert sorted(p.name for p in (smol_cache / "models").iterdir()) == ["smollm2-135m.gguf"]
