"""Registry, GGUF header checks and model resolution, on the real cached models."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from specdash.contract.errors import SpecdashError
from specdash.models import registry
from specdash.models.gguf_header import GGUFArray, GGUFError, check_gguf, gguf_metadata, read_gguf_header
from specdash.models.resolve import resolve_model


@pytest.fixture(scope="module")
def smol() -> Path:
    return resolve_model("smollm2-135m")  # fetches into the real cache if missing


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECDASH_CACHE", str(cache))
    return cache


def test_registry_names_roles_and_default_pair():
    assert registry.DEFAULT_TARGET == "qwen2.5-coder-1.5b"
    assert registry.DEFAULT_DRAFT == "qwen2.5-coder-0.5b"
    roles = {name: spec.role for name, spec in registry.BUILTIN.items()}
    assert roles == {
        "qwen2.5-coder-1.5b": "target",
        "qwen2.5-coder-0.5b": "draft",
        "smollm2-135m": "test",
        "gemma3-270m": "test",
    }
    for spec in registry.BUILTIN.values():
        assert len(spec.sha256) == 64 and spec.size > 0
        assert all("==" in p for p in spec.packages)
    assert len(registry.BUILTIN["qwen2.5-coder-1.5b"].packages) == 22


def test_cache_dir_follows_env(empty_cache):
    assert registry.model_path("smollm2-135m") == empty_cache / "models" / "smollm2-135m.gguf"


def test_cache_dir_default_is_home(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDASH_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert registry.models_dir() == tmp_path / ".cache" / "specdash" / "models"


def test_header_of_real_model(smol):
    header = check_gguf(smol)
    assert header.version == 3
    assert header.expected_size == smol.stat().st_size  # no trailing bytes in this file
    assert len(header.tensors) > 100
    assert header.metadata["general.architecture"] == "llama"
    tokens = header.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, GGUFArray) and len(tokens) == 49152
    emb = next(t for t in header.tensors if t.name == "token_embd.weight")
    assert emb.shape == (576, 49152)
    assert header.data_offset % 32 == 0


def test_metadata_scalars_and_requested_arrays(smol):
    meta = gguf_metadata(smol)
    assert meta["tokenizer.ggml.tokens"] == 49152  # arrays as their length
    assert meta["general.file_type"] == 3  # Q4_1
    full = gguf_metadata(smol, arrays={"tokenizer.ggml.tokens"})
    assert len(full["tokenizer.ggml.tokens"]) == 49152
    assert full["tokenizer.ggml.tokens"][full["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"


def test_large_vocab_header_parses():
    header = read_gguf_header(resolve_model("qwen2.5-coder-0.5b"))
    assert len(header.metadata["tokenizer.ggml.tokens"]) == 151936


def test_truncated_tensor_data_is_reported(smol, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(smol, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(8 << 20))
    with pytest.raises(GGUFError, match=r"truncated GGUF: 8,388,608 bytes but its tensors end at 98,362,432"):
        resolve_model(str(cut))


def test_truncated_header_is_reported(smol, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(smol, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(100_000))  # inside the token list
    with pytest.raises(GGUFError, match="header runs past the end of the file"):
        resolve_model(str(cut))


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello, this is not a model\n")
    with pytest.raises(GGUFError, match=r"notes.txt: not a GGUF file \(starts with b'hell'"):
        resolve_model(str(bad))


def test_unsupported_version(tmp_path):
    bad = tmp_path / "v1.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(GGUFError, match="GGUF version 1 is not supported"):
        resolve_model(str(bad))


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(GGUFError, match="is a directory"):
        resolve_model(str(tmp_path))


def test_unknown_name_lists_known(empty_cache):
    with pytest.raises(SpecdashError) as exc:
        resolve_model("llama-9000")
    msg = str(exc.value)
    assert "model 'llama-9000': not a known model" in msg and "no such file" in msg
    assert "qwen2.5-coder-1.5b" in msg and "gemma3-270m" in msg


def test_uncached_without_fetch_suggests_fetch(empty_cache):
    with pytest.raises(SpecdashError, match=r"not cached .*specdash models fetch smollm2-135m"):
        resolve_model("smollm2-135m", fetch=False)


def test_name_and_path_resolve_to_the_same_file(smol):
    assert resolve_model(str(smol)) == smol.resolve()
    assert resolve_model("smollm2-135m", fetch=False) == smol


def test_corrupt_cached_model_suggests_refetch(smol, empty_cache):
    models = empty_cache / "models"
    models.mkdir(parents=True)
    with open(smol, "rb") as src, open(models / "smollm2-135m.gguf", "wb") as dst:
        dst.write(src.read(4 << 20))
    with pytest.raises(GGUFError, match=r"truncated.*models fetch --force smollm2-135m"):
        resolve_model("smollm2-135m")


def test_malformed_user_registry_names_the_file(empty_cache):
    (empty_cache / "models").mkdir(parents=True)
    (empty_cache / "models" / "registry.json").write_text("{not json")
    with pytest.raises(SpecdashError, match=r"registry.json: cannot read the user model registry"):
        registry.list_models()


def test_list_marks_cached(smol, empty_cache):
    (empty_cache / "models").mkdir(parents=True)
    (empty_cache / "models" / "smollm2-135m.gguf").symlink_to(smol)
    cached = {e.name: e.cached for e in registry.list_models()}
    assert cached == {
        "qwen2.5-coder-1.5b": False,
        "qwen2.5-coder-0.5b": False,
        "smollm2-135m": True,
        "gemma3-270m": False,
    }


def _gguf_bytes(kv: dict[str, str | int], tensors: list[tuple[str, int, tuple[int, ...], int]]) -> bytes:
    """A hand-built GGUF v3 header: string or uint32 metadata, then tensor infos."""

    def s(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, value in kv.items():
        out += s(key) + (struct.pack("<I", 8) + s(value) if isinstance(value, str)
                         else struct.pack("<II", 4, value))
    for name, ggml_type, shape, offset in tensors:
        out += s(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        out += struct.pack("<IQ", ggml_type, offset)
    return out


def test_alignment_and_type_sizes_set_the_expected_end(tmp_path):
    # Q4_K: 256-element blocks of 144 bytes; F32: 4 bytes each.
    tensors = [("a", 12, (512, 2), 0), ("b", 0, (3,), 1024)]
    header = _gguf_bytes({"general.architecture": "x", "general.alignment": 64}, tensors)
    data_offset = -(-len(header) // 64) * 64
    end = data_offset + 1024 + 3 * 4
    path = tmp_path / "tiny.gguf"
    path.write_bytes(header.ljust(end, b"\0"))
    parsed = check_gguf(path)
    assert parsed.data_offset == data_offset
    assert parsed.expected_size == end
    assert [(t.name, t.type_name, t.nbytes()) for t in parsed.tensors] == [("a", "Q4_K", 4 * 144), ("b", "F32", 12)]
    path.write_bytes(header.ljust(end - 1, b"\0"))
    with pytest.raises(GGUFError, match="truncated"):
        check_gguf(path)


def test_unknown_tensor_type_skips_the_size_check(tmp_path):
    path = tmp_path / "future.gguf"
    path.write_bytes(_gguf_bytes({"general.architecture": "x"}, [("a", 250, (32,), 0)]))
    header = check_gguf(path)  # no data at all, but the size is unknowable, so no error
    assert header.expected_size is None and header.tensors[0].type_name == "type 250"


def test_tensorless_gguf_needs_no_data_padding(tmp_path):
    path = tmp_path / "vocab-only.gguf"
    path.write_bytes(_gguf_bytes({"general.architecture": "x"}, []))
    assert check_gguf(path).expected_size == path.stat().st_size
