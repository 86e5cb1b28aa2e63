"""`specdash models scan`: finding GGUFs on disk and describing them from their headers,
on real files: the registry models, the MoE fixture, a self-made quant, models written
with the gguf package (multi-part sets, recurrent architectures), broken files."""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

import moe_fixture
from specdash.cli import main
from specdash.contract.errors import SpecdashError
from specdash.models import scan as scan_mod
from specdash.models.gguf_header import FILE_TYPES, read_gguf_header, read_string_array
from specdash.models.scan import (
    ModelInfo,
    ScanProgress,
    ScanResult,
    cached_scan,
    default_scan_dirs,
    inspect_model,
    scan,
)

TOKENS = "tokenizer.ggml.tokens"


# ---------------------------------------------------------------------------- helpers


def write_model(
    path: Path,
    tokenizer_from: Path,
    *,
    arch: str = "llama",
    edit_tokens: dict[int, str] | None = None,
    extra_tokens: int = 0,
    set_kv: dict[str, tuple[Any, gguf.GGUFValueType]] | None = None,
    n_layer: int = 1,
    n_embd: int = 32,
    split_max_tensors: int = 0,
    basename: str | None = None,
) -> Path:
    """A small dense model with the tokenizer of `tokenizer_from` (modified as asked),
    that llama.cpp loads. With split_max_tensors, gguf writes a multi-part set
    (path's stem + -0000N-of-0000M.gguf) and part 1 is returned."""
    set_kv = dict(set_kv or {})
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    n_vocab = 0
    for name, value, types in moe_fixture._tokenizer_fields(Path(tokenizer_from).resolve()):
        if name in set_kv:
            continue
        if name == TOKENS:
            value = list(value)
            for i, text in (edit_tokens or {}).items():
                value[i] = text
            value += [f"<extra_{i}>" for i in range(extra_tokens)]
            n_vocab = len(value)
        elif name == "tokenizer.ggml.token_type":
            value = list(value) + [1] * extra_tokens
        sub_type = types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, types[0], sub_type=sub_type)
    for name, (value, vtype) in set_kv.items():
        writer.add_key_value(name, value, vtype)
    writer.add_name(path.stem)
    if basename:
        writer.add_basename(basename)
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(512)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(2 * n_embd)
    writer.add_block_count(n_layer)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(n_embd // 4)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    rng = np.random.default_rng(0)

    def add(name: str, *shape: int) -> None:
        data = rng.normal(0, 0.02, size=shape).astype(np.float16 if len(shape) > 1 else np.float32)
        writer.add_tensor(name, data)

    kv = n_embd // 2
    add("token_embd.weight", n_vocab, n_embd)
    add("output_norm.weight", n_embd)
    for i in range(n_layer):
        add(f"blk.{i}.attn_norm.weight", n_embd)
        add(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        add(f"blk.{i}.attn_k.weight", kv, n_embd)
        add(f"blk.{i}.attn_v.weight", kv, n_embd)
        add(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        add(f"blk.{i}.ffn_norm.weight", n_embd)
        add(f"blk.{i}.ffn_gate.weight", 2 * n_embd, n_embd)
        add(f"blk.{i}.ffn_up.weight", 2 * n_embd, n_embd)
        add(f"blk.{i}.ffn_down.weight", n_embd, 2 * n_embd)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors:
        return writer.format_shard_names(path)[0]
    return path


def expected_params(n_vocab: int, n_embd: int = 32, n_layer: int = 1) -> int:
    kv = n_embd // 2
    per_layer = 2 * n_embd + n_embd * n_embd * 2 + 2 * kv * n_embd + 3 * 2 * n_embd * n_embd
    return n_vocab * n_embd + n_embd + n_layer * per_layer


def link(directory: Path, *files: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for f in files:
        (directory / f.name).symlink_to(f)
    return directory


@pytest.fixture
def private_cache(tmp_path, monkeypatch, smol_path, gemma_path, draft_path, target_path) -> Path:
    """SPECDASH_CACHE in tmp_path, so scan caches and drafts stay out of the real one."""
    cache = tmp_path / "sdcache"
    (cache / "models").mkdir(parents=True)
    monkeypatch.setenv("SPECDASH_CACHE", str(cache))
    return cache


@pytest.fixture(scope="module")
def registry_dir(tmp_path_factory, smol_path, gemma_path, draft_path, target_path) -> Path:
    return link(tmp_path_factory.mktemp("registry"), smol_path, gemma_path, draft_path, target_path)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory, smol_path) -> Path:
    path = tmp_path_factory.mktemp("moe") / "tiny-moe.gguf"  # the scan labels it by this name
    path.symlink_to(moe_fixture.cached_tiny_moe(n_expert=4, n_expert_used=2, tokenizer_from=smol_path))
    return path


def by_label(result: ScanResult) -> dict[str, ModelInfo]:
    return {m.label: m for m in result.models}


# ---------------------------------------------------------------------------- the header reader


def _raw_gguf(arrays: dict[str, list[bytes]], after: dict[str, int]) -> bytes:
    """A GGUF header of string arrays (raw bytes, so any content) then uint32 keys."""

    def s(raw: bytes) -> bytes:
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(arrays) + len(after))
    for key, items in arrays.items():
        out += s(key.encode()) + struct.pack("<IIQ", 9, 8, len(items)) + b"".join(s(x) for x in items)
    for key, value in after.items():
        out += s(key.encode()) + struct.pack("<II", 4, value)
    return out


def test_vectorised_string_skip_is_exact_on_hostile_strings(tmp_path):
    """The fast skip proves each string start from the length prefixes; strings that
    defeat its pattern (empty, over 255 bytes, NULs that look like a length prefix)
    must come out exactly as a plain walk reads them, and the keys after them too."""
    rng = np.random.default_rng(7)
    items: list[bytes] = []
    for i in range(20_000):
        kind = i % 97
        if kind == 0:
            items.append(b"")
        elif kind == 1:
            items.append(bytes(rng.integers(1, 255, size=int(rng.integers(256, 700)), dtype=np.uint8)))
        elif kind == 2:
            items.append(b"\x05" + b"\0" * 7 + b"abcde")  # a fake length prefix inside a text
        elif kind == 3:
            items.append(b"\0" * 9)
        else:
            items.append(bytes(rng.integers(1, 255, size=int(rng.integers(1, 24)), dtype=np.uint8)))
    path = tmp_path / "hostile.gguf"
    path.write_bytes(_raw_gguf({"a.strings": items, "b.strings": items[::-1]}, {"z.after": 1234}))
    header = read_gguf_header(path)
    assert header.metadata["z.after"] == 1234
    assert len(header.metadata["a.strings"]) == 20_000
    assert read_string_array(path, "a.strings") == items
    assert read_string_array(path, "b.strings") == items[::-1]


def test_string_array_cut_short_is_a_truncated_header(tmp_path):
    items = [b"token%d" % i for i in range(5000)]
    whole = _raw_gguf({"t": items}, {"z": 1})
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SpecdashError, match=r"truncated GGUF: the header runs past the end"):
        read_gguf_header(path)


def test_token_digest_covers_ids_from_5(tmp_path, smol_path):
    a = write_model(tmp_path / "a.gguf", smol_path)
    b = write_model(tmp_path / "b.gguf", smol_path, edit_tokens={3: "<low_id_changed>"})
    c = write_model(tmp_path / "c.gguf", smol_path, edit_tokens={5: "<id5_changed>"})
    digest = {p: read_gguf_header(p, digests={TOKENS: 5}).metadata[TOKENS].digest for p in (a, b, c)}
    assert digest[a] == digest[b] != digest[c]
    assert read_gguf_header(a).metadata[TOKENS].digest is None  # only when asked


def test_file_type_names_match_llama_cpp():
    import llama_cpp

    for ftype, name in FILE_TYPES.items():
        attr = "LLAMA_FTYPE_ALL_F32" if name == "F32" else f"LLAMA_FTYPE_MOSTLY_{name}"
        if name in ("NVFP4", "Q1_0", "Q2_0") and not hasattr(llama_cpp, attr):
            continue  # newer than the Python bindings' constants (they are in llama.h)
        assert getattr(llama_cpp, attr) == ftype, name


# ---------------------------------------------------------------------------- what a scan lists


def test_registry_models_described_from_headers(registry_dir, private_cache):
    result = scan([registry_dir])
    assert result.problems == ()
    models = by_label(result)
    assert set(models) == {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    rows = {
        label: (m.architecture, m.n_params, m.size_label, m.quant, m.quant_from, m.size,
                m.vocab.vocab_type, m.vocab.n_tokens, m.vocab.bos, m.vocab.eos, m.vocab.add_bos,
                m.is_moe, m.state)
        for label, m in models.items()
    }
    assert rows == {
        "smollm2-135m": ("llama", 134_515_008, "135M", "Q4_1", "file_type", 98_362_432,
                         2, 49_152, 1, 2, False, False, None),
        "gemma3-270m": ("gemma3", 268_098_176, "270M", "Q4_K_M", "file_type", 253_113_024,
                        1, 262_144, 2, 1, True, False, None),
        "qwen2.5-coder-0.5b": ("qwen2", 630_167_424, "0.5B", "Q4_K_M", "file_type", 491_400_064,
                               2, 151_936, 151_643, 151_645, False, False, None),
        "qwen2.5-coder-1.5b": ("qwen2", 1_777_088_000, "1.5B", "Q4_K_M", "file_type", 1_117_320_768,
                               2, 151_936, 151_643, 151_645, False, False, None),
    }
    assert models["qwen2.5-coder-0.5b"].basename == "Qwen2.5-Coder"
    assert models["qwen2.5-coder-0.5b"].vocab.digest == models["qwen2.5-coder-1.5b"].vocab.digest
    assert models["smollm2-135m"].vocab.digest != models["qwen2.5-coder-1.5b"].vocab.digest


def test_parameter_counts_agree_with_llama_cpp(smol_path, tiny_moe, tmp_path, private_cache):
    import llama_cpp

    from specdash.engine.llm import LLM

    result = scan([link(tmp_path / "d", smol_path, tiny_moe)])
    for m in result.models:
        llm = LLM(m.path, n_ctx=256, n_threads=1)  # the engine's loader: the machine's repack verdict
        try:
            assert m.n_params == llama_cpp.llama_model_n_params(llm.model), m.label
            assert m.tensor_bytes <= llama_cpp.llama_model_size(llm.model) <= m.size
        finally:
            llm.close()


def test_moe_fixture_experts_and_active_bytes(tiny_moe, tmp_path, private_cache):
    (m,) = scan([link(tmp_path / "d", tiny_moe)]).models
    assert (m.is_moe, m.expert_count, m.expert_used_count) == (True, 4, 2)
    assert (m.quant, m.quant_from) == ("Q8_0", "tensors")  # no general.file_type: the dominant tensor type
    header = read_gguf_header(tiny_moe)
    experts = sum(t.nbytes() for t in header.tensors if "_exps" in t.name)
    assert experts > 0
    assert m.active_bytes == m.tensor_bytes - experts // 2  # 2 of 4 experts per token
    assert "MoE 4 experts, 2 used" in m.notes()


def test_quantized_draft_made_with_make_draft(smol_path, private_cache, tmp_path):
    from specdash.models.quantize import make_draft

    (private_cache / "models" / "smollm2-135m.gguf").symlink_to(smol_path)
    made = make_draft("smollm2-135m", "Q4_0", nthread=2)
    models = by_label(scan([private_cache / "models"]))
    draft, base = models["smollm2-135m-q4_0"], models["smollm2-135m"]
    assert (draft.quant, draft.quant_from, base.quant) == ("Q4_0", "file_type", "Q4_1")
    assert draft.n_params == base.n_params and draft.size == made.size < base.size
    assert draft.vocab == replace(base.vocab, path=draft.path)  # the same vocabulary, digest and all


def test_broken_files_are_listed_apart_and_the_scan_goes_on(smol_path, tmp_path, private_cache):
    d = link(tmp_path / "d", smol_path)
    with open(smol_path, "rb") as src:
        head = src.read(8 << 20)
    (d / "cut-header.gguf").write_bytes(head[:100_000])
    (d / "cut-data.gguf").write_bytes(head)
    (d / "notes.gguf").write_text("hello, this is not a model\n")
    (d / "empty.gguf").write_bytes(b"")
    (d / "gone.gguf").symlink_to(tmp_path / "nowhere.gguf")
    (d / "v1.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    (d / "readme.md").write_text("not a candidate")
    (d / "sha256-0123").write_bytes(b"{\"not\": \"gguf\"}")  # suffix-less, no magic: ignored
    result = scan([d])
    assert [m.label for m in result.models] == ["smollm2-135m"]
    reasons = {p.path.name: p.reason for p in result.problems}
    assert reasons == {
        "cut-data.gguf": "truncated GGUF: 8,388,608 bytes but its tensors end at 98,362,432 bytes",
        "cut-header.gguf": "truncated GGUF: the header runs past the end of the file (100,000 bytes)",
        "empty.gguf": "not a GGUF file (only 0 bytes)",
        "gone.gguf": "cannot read: No such file or directory",
        "notes.gguf": "not a GGUF file (starts with b'hell', expected b'GGUF')",
        "v1.gguf": "GGUF version 1 is not supported (supported: 2, 3)",
    }
    assert all("\n" not in r for r in reasons.values())


def test_adapters_projectors_and_archless_files_are_not_models(tmp_path, private_cache):
    from test_models import _gguf_bytes

    d = tmp_path / "d"
    d.mkdir()
    (d / "lora.gguf").write_bytes(_gguf_bytes(
        {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora"}, []))
    (d / "mmproj.gguf").write_bytes(_gguf_bytes({"general.architecture": "clip"}, []))
    (d / "nothing.gguf").write_bytes(_gguf_bytes({"general.name": "x"}, []))
    result = scan([d])
    assert result.models == ()
    assert {p.path.name: p.reason for p in result.problems} == {
        "lora.gguf": "lora adapter for llama, not a model (general.type = adapter)",
        "mmproj.gguf": "a multimodal projector (clip), not a language model",
        "nothing.gguf": "no model metadata (general.architecture missing)",
    }


def test_a_model_without_a_tokenizer_is_listed_with_the_reason(tmp_path, private_cache):
    from test_models import _gguf_bytes

    d = tmp_path / "d"
    d.mkdir()
    (d / "bare.gguf").write_bytes(_gguf_bytes({"general.architecture": "llama"}, []))
    (m,) = scan([d]).models
    assert m.vocab is None and m.vocab_error == "no tokenizer in its metadata (tokenizer.ggml.model missing)"
    assert m.vocab_only and "vocab only, no weights" in m.notes() and "no usable vocab" in m.notes()


def test_multi_part_set_counts_as_one_model(smol_path, tmp_path, private_cache):
    d = tmp_path / "d"
    d.mkdir()
    first = write_model(d / "split.gguf", smol_path, n_layer=2, split_max_tensors=8)
    parts = sorted(d.glob("split-*-of-*.gguf"))
    assert first.name == "split-00001-of-00003.gguf" and len(parts) == 3
    whole = write_model(tmp_path / "whole.gguf", smol_path, n_layer=2)
    result = scan([d])
    assert result.problems == ()
    (m,) = result.models
    assert m.label == "split" and m.path == first and m.parts == tuple(parts)
    assert m.size == sum(p.stat().st_size for p in parts)
    assert m.n_params == expected_params(49_152, n_layer=2) == scan([whole]).models[0].n_params
    assert m.vocab is not None and m.vocab.n_tokens == 49_152
    assert "3 parts" in m.notes()
    # One model from its part 1 alone (a pairs target given by path): the same answer.
    assert inspect_model(first) == replace(m, source="", root=d)
    with pytest.raises(SpecdashError, match=r"part 2 of a multi-part GGUF; give part 00001"):
        inspect_model(parts[1])


def test_multi_part_set_with_a_missing_or_broken_part_is_a_problem(smol_path, tmp_path, private_cache):
    d = tmp_path / "d"
    d.mkdir()
    write_model(d / "split.gguf", smol_path, n_layer=2, split_max_tensors=8)
    third = d / "split-00003-of-00003.gguf"
    third.write_bytes(third.read_bytes()[:-100])
    (p,) = scan([d]).problems
    assert p.path == d / "split-*-of-00003.gguf"
    assert p.reason.startswith("part 00003 of 3: truncated GGUF: ")
    (d / "split-00002-of-00003.gguf").unlink()
    result = scan([d])
    assert result.models == ()
    assert [p.reason for p in result.problems] == [
        "multi-part GGUF incomplete: 2 of 3 parts found, missing 00002"
    ]


@pytest.mark.parametrize(
    "arch, state, rollback",
    [("mamba", "recurrent", False), ("rwkv7", "recurrent", False), ("jamba", "hybrid", False),
     ("lfm2", "hybrid", True), ("qwen3next", "hybrid", False), ("llama", None, False)],
)
def test_recurrent_and_hybrid_architectures_are_flagged(arch, state, rollback, smol_path, tmp_path, private_cache):
    (m,) = scan([write_model(tmp_path / f"{arch}.gguf", smol_path, arch=arch)]).models
    assert (m.architecture, m.state, m.rs_rollback) == (arch, state, rollback)
    strategy = "kv" if state is None else "snapshots" if rollback else "checkpoint"
    assert m.rollback == strategy and m.to_dict()["rollback"] == strategy
    if state:
        # No size: these stand-ins carry no ssm/shortconv metadata.
        note = "rollback: snapshots (n_rs_seq 16)" if rollback else "rollback: checkpoint + replay"
        assert f"{state}, {note}" in m.notes()


def test_fixture_state_sizes_in_the_scan(lfm2_path, mamba2_path, hybrid_ckpt_path, tmp_path, private_cache):
    """From the metadata: lfm2 4 short-conv layers x 64 x (3 - 1) floats; mamba2 4 layers x
    (conv 3 x 160 + ssm 16 x 128) floats; granitehybrid 3 Mamba2 layers of the same."""
    d = link(tmp_path / "d", lfm2_path, mamba2_path, hybrid_ckpt_path)
    by_arch = {m.architecture: m for m in scan([d]).models}
    assert {a: m.state_bytes for a, m in by_arch.items()} == {
        "lfm2": 4 * 4 * 64 * 2, "mamba2": 4 * 4 * (3 * 160 + 16 * 128), "granitehybrid": 3 * 4 * (3 * 160 + 16 * 128)}
    assert "hybrid, rollback: snapshots 35 KB (n_rs_seq 16)" in by_arch["lfm2"].notes()
    assert "recurrent, rollback: checkpoint 40 KB + replay" in by_arch["mamba2"].notes()
    assert "hybrid, rollback: checkpoint 30 KB + replay" in by_arch["granitehybrid"].notes()
    # The cache round-trips the new field.
    again = {m.architecture: m for m in scan([d]).models}
    assert again["mamba2"].state_bytes == by_arch["mamba2"].state_bytes


def test_unknown_architecture_with_ssm_keys_is_recurrent(smol_path, tmp_path, private_cache):
    path = write_model(tmp_path / "future.gguf", smol_path, arch="futuressm",
                       set_kv={"futuressm.ssm.state_size": (16, gguf.GGUFValueType.UINT32)})
    (m,) = scan([path]).models
    assert m.state == "recurrent"


def vendored_llama_arch_cpp(work: Path) -> str:
    """llama-arch.cpp from the sdist of the installed llama-cpp-python, fetched the way
    `specdash.tuning.llamacpp_tools` fetches it (pip's cache, or the package index)."""
    import subprocess
    import tarfile

    from specdash.tuning.llamacpp_tools import llama_cpp_python_version, sdist_download_command, vendored_prefix

    version = llama_cpp_python_version()
    subprocess.run(sdist_download_command(version, work), check=True, capture_output=True)
    (archive,) = work.glob("llama_cpp_python-*.tar.gz")
    with tarfile.open(archive) as tar:
        member = tar.extractfile(vendored_prefix(version) + "src/llama-arch.cpp")
        assert member is not None
        return member.read().decode()


def test_recurrent_arch_table_matches_vendored_llama_cpp(tmp_path):
    """The tables are copied from llama-arch.cpp; a newer vendored llama.cpp must update them."""
    text = vendored_llama_arch_cpp(tmp_path)
    names = dict(
        (enum, name) for enum, name in
        __import__("re").findall(r"\{\s*(LLM_ARCH_\w+),\s*\"([^\"]+)\"\s*\}", text)
    )

    def archs(function: str) -> set[str]:
        body = text.split(f"bool {function}(const llm_arch & arch) {{", 1)[1].split("default:", 1)[0]
        return {names[e] for e in __import__("re").findall(r"case (LLM_ARCH_\w+):", body)}

    assert archs("llm_arch_is_recurrent") == scan_mod.RECURRENT_ARCHS
    assert archs("llm_arch_is_hybrid") == scan_mod.HYBRID_ARCHS
    assert archs("llm_arch_supports_rs_rollback") == scan_mod.RS_ROLLBACK_ARCHS


def test_symlinks_to_one_file_are_listed_once(smol_path, tmp_path, private_cache):
    d = link(tmp_path / "d", smol_path)
    (d / "again.gguf").symlink_to(smol_path)
    (d / "sub").mkdir()
    (d / "sub" / "loop").symlink_to(d)  # a directory loop must not hang the walk
    assert len(scan([d]).models) == 1


# ---------------------------------------------------------------------------- where it looks


def test_default_dirs_are_the_usual_caches_that_exist(tmp_path, monkeypatch):
    home = tmp_path / "home"
    for sub in (".cache/llama.cpp", ".lmstudio/models", ".ollama/models/blobs", "lc", "extra", "sd/models"):
        (home / sub).mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SPECDASH_CACHE", str(home / "sd"))
    monkeypatch.setenv("LLAMA_CACHE", str(home / "lc"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    dirs = default_scan_dirs([home / "extra", home / "missing", home / "lc"])
    assert [d for d in dirs if str(d).startswith(str(home))] == [
        home / "sd" / "models", home / "extra", home / "lc", home / ".cache" / "llama.cpp",
        home / ".lmstudio" / "models", home / ".ollama" / "models" / "blobs",
    ]


def test_ollama_blobs_found_by_magic_and_named_from_manifests(smol_path, tmp_path, monkeypatch):
    home = tmp_path / "home"
    models = home / ".ollama" / "models"
    blob = "sha256-" + "ab" * 32
    link(models / "blobs", smol_path)
    (models / "blobs" / smol_path.name).rename(models / "blobs" / blob)
    (models / "blobs" / ("sha256-" + "cd" * 32)).write_text('{"temperature": 0.7}')
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": blob.replace("-", ":")},
        {"mediaType": "application/vnd.ollama.image.params", "digest": "sha256:" + "cd" * 32},
    ]}))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("LLAMA_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    result = scan()
    ours = [m for m in result.models if str(m.path).startswith(str(home))]
    assert [(m.label, m.source, m.architecture) for m in ours] == [("smollm2:135m", "Ollama", "llama")]
    assert not [p for p in result.problems if str(p.path).startswith(str(home))]


def test_missing_directory_is_a_usage_error(tmp_path, private_cache):
    with pytest.raises(SpecdashError, match=r"nope: no such directory or file") as exc:
        scan([tmp_path / "nope"])
    assert exc.value.exit_code == 2


# ---------------------------------------------------------------------------- cache, progress


def test_scan_cache_reuses_headers_until_the_file_changes(smol_path, tmp_path, private_cache):
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(smol_path, d / "smol.gguf")
    (d / "bad.gguf").write_text("nope")
    first = scan([d])
    assert (first.files, first.from_cache) == (2, 0)
    # Plant a marker in the cached summary: a scan that trusts the cache shows it.
    cache_file = private_cache / "scan-cache.json"
    cache = json.loads(cache_file.read_text())
    key = str((d / "smol.gguf").resolve())
    cache["files"][key]["info"]["model"]["architecture"] = "from-the-cache"
    cache_file.write_text(json.dumps(cache))
    second = scan([d])
    assert second.from_cache == 2 and by_label(second)["smol"].architecture == "from-the-cache"
    assert [p.reason for p in second.problems] == [p.reason for p in first.problems]
    # The last result is stored whole, for a picker that must not touch the disk.
    assert cached_scan() == second
    st = (d / "smol.gguf").stat()
    os.utime(d / "smol.gguf", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    third = scan([d])
    assert third.from_cache == 1 and by_label(third)["smol"].architecture == "llama"
    assert scan([d], rescan=True).from_cache == 0
    assert scan([d], use_cache=False).from_cache == 0


def test_cached_scan_without_a_cache_is_none(private_cache):
    assert cached_scan() is None
    (private_cache / "scan-cache.json").write_text("{broken")
    assert cached_scan() is None


def test_progress_reports_every_file(registry_dir, private_cache):
    events: list[ScanProgress] = []
    result = scan([registry_dir], progress=events.append)
    assert events[0] == ScanProgress(0, 4, None, False)
    assert [e.done for e in events[1:]] == [1, 2, 3, 4] and all(e.total == 4 for e in events)
    assert sorted(e.path.name for e in events[1:]) == sorted(p.name for p in registry_dir.iterdir())
    assert not any(e.cached for e in events)
    events.clear()
    scan([registry_dir], progress=events.append)
    assert all(e.cached for e in events[1:]) and result.files == 4


def test_scan_result_round_trips_through_json(registry_dir, tiny_moe, private_cache):
    result = scan([registry_dir, tiny_moe])
    assert ScanResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


# ---------------------------------------------------------------------------- the CLI


def test_cli_scan_json(registry_dir, private_cache, capsys):
    assert main(["models", "scan", str(registry_dir), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    qwen = next(m for m in data["models"] if m["label"] == "qwen2.5-coder-1.5b")
    assert qwen["vocab"]["type"] == "BPE" and qwen["vocab"]["n_tokens"] == 151_936
    assert (qwen["quant"], qwen["n_params"], qwen["moe"], qwen["state"]) == ("Q4_K_M", 1_777_088_000, False, None)
    assert data["problems"] == [] and data["files"] == 4
    assert "reading GGUF headers: 4/4 files" in captured.err
    assert "scanned 4 file(s) in 1 location(s)" in captured.err


def test_cli_scan_table_fits_80_columns(registry_dir, tiny_moe, tmp_path, private_cache, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    d = link(tmp_path / "d", tiny_moe)
    (d / "junk.gguf").write_text("junk, not a model")
    assert main(["models", "scan", str(registry_dir), str(d)]) == 0
    out = capsys.readouterr().out
    problem_lines = [line for line in out.splitlines() if line.startswith("  /")]
    assert problem_lines == [f"  {d / 'junk.gguf'}: not a GGUF file (starts with b'junk', expected b'GGUF')"]
    table_lines = [line for line in out.splitlines() if line not in problem_lines]
    assert all(len(line) <= 80 for line in table_lines), [line for line in table_lines if len(line) > 80]
    row = next(line for line in table_lines if line.startswith("qwen2.5-coder-1.5b"))
    assert row.split() == ["qwen2.5-coder-1.5b", "qwen2", "1.78B", "Q4_K_M", "1.12G", "BPE", "151936",
                           "151643/151645"]
    assert "MoE 4 experts, 2 used" in out
    assert "5 model(s), 1 not usable" in out


def test_cli_scan_bad_dir_exits_2(tmp_path, private_cache, capsys):
    assert main(["models", "scan", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err == f"specdash: error: {tmp_path / 'nope'}: no such directory or file (give directories to scan, or GGUF files)\n"
