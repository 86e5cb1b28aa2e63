"""A tiny mixture-of-experts GGUF that llama.cpp loads, for tests of expert-count control.

No MoE model small enough to ship exists on the package index, so this writes one:
architecture `llama` with `llama.expert_count` / `llama.expert_used_count`, per-layer
router (`ffn_gate_inp`) and stacked expert tensors (`ffn_{gate,up,down}_exps`) beside
the usual attention tensors, seeded random weights, and the tokenizer metadata copied
from a real GGUF so text goes in and out. The output is noise, but it is
deterministic noise whose logits really depend on how many experts are routed to.
"""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np

def _smollm2() -> Path:
    # Through the registry, so a fresh machine fetches it (and $SPECDASH_CACHE is honoured).
    from specdash.models.resolve import resolve_model

    return resolve_model("smollm2-135m")
ARCH = "llama"

_QTYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "F16": gguf.GGMLQuantizationType.F16,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
}


@functools.cache
def _tokenizer_fields(source: Path) -> tuple[tuple[str, object, tuple[gguf.GGUFValueType, ...]], ...]:
    """Every tokenizer.* key of `source` with its exact GGUF types. Cached: GGUFReader
    takes seconds to parse SmolLM2's 49k tokens and 49k merges, once is enough."""
    reader = gguf.GGUFReader(source)
    return tuple(
        (name, field.contents(), tuple(field.types))
        for name, field in reader.fields.items()
        if name.startswith("tokenizer.")
    )


def _copy_tokenizer(source: Path, writer: gguf.GGUFWriter) -> int:
    """Copy the tokenizer keys into `writer`; return the vocabulary size."""
    n_vocab = 0
    for name, value, types in _tokenizer_fields(source):
        sub_type = types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, types[0], sub_type=sub_type)
        if name == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    return n_vocab


def make_tiny_moe(
    path: Path | str,
    n_expert: int = 4,
    n_expert_used: int = 2,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_ff: int = 128,
    n_head: int = 4,
    n_head_kv: int = 2,
    qtype: str = "Q8_0",
    seed: int = 0,
    tokenizer_from: Path | str | None = None,
) -> Path:
    """Write the model to `path` and return it.

    `qtype` (F32, F16, Q8_0) applies to the matrices; norms stay F32. Q8_0 needs n_embd
    and n_ff to be multiples of 32. The output projection is tied to the token
    embedding (llama.cpp falls back to token_embd when `output.weight` is absent), which
    at SmolLM2's 49,152-token vocabulary is most of the file: ~3.3 MB at n_embd=64, Q8_0.
    """
    if not 1 <= n_expert_used <= n_expert:
        raise ValueError(f"n_expert_used must be 1..{n_expert}, got {n_expert_used}")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    path = Path(path)
    kind = _QTYPES[qtype]
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head

    def matrix(*shape: int, fan_in: int, gain: float = 1.0) -> np.ndarray:
        return rng.normal(0.0, gain / np.sqrt(fan_in), size=shape).astype(np.float32)

    writer = gguf.GGUFWriter(path, ARCH)
    n_vocab = _copy_tokenizer(Path(tokenizer_from or _smollm2()).resolve(), writer)
    writer.add_name(f"tiny-moe-{n_expert}x{n_ff}-l{n_layer}-e{n_embd}")
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(2048)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_block_count(n_layer)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_expert_count(n_expert)
    writer.add_expert_used_count(n_expert_used)

    def add(name: str, data: np.ndarray) -> None:
        # numpy shapes are GGUF's ne reversed: ne [n_embd, n_vocab] is (n_vocab, n_embd).
        if data.ndim == 1:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)

    ones = np.ones(n_embd, dtype=np.float32)
    # gain 3: logits = embedding . rms-normed state, so they spread over a few units.
    add("token_embd.weight", matrix(n_vocab, n_embd, fan_in=n_embd, gain=3.0))
    add("output_norm.weight", ones)
    kv_dim = head_dim * n_head_kv
    for i in range(n_layer):
        add(f"blk.{i}.attn_norm.weight", ones)
        add(f"blk.{i}.attn_q.weight", matrix(n_embd, n_embd, fan_in=n_embd))
        add(f"blk.{i}.attn_k.weight", matrix(kv_dim, n_embd, fan_in=n_embd))
        add(f"blk.{i}.attn_v.weight", matrix(kv_dim, n_embd, fan_in=n_embd))
        add(f"blk.{i}.attn_output.weight", matrix(n_embd, n_embd, fan_in=n_embd))
        add(f"blk.{i}.ffn_norm.weight", ones)
        add(f"blk.{i}.ffn_gate_inp.weight", matrix(n_expert, n_embd, fan_in=n_embd))
        add(f"blk.{i}.ffn_gate_exps.weight", matrix(n_expert, n_ff, n_embd, fan_in=n_embd))
        add(f"blk.{i}.ffn_up_exps.weight", matrix(n_expert, n_ff, n_embd, fan_in=n_embd))
        add(f"blk.{i}.ffn_down_exps.weight", matrix(n_expert, n_embd, n_ff, fan_in=n_ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Bump when make_tiny_moe writes other bytes for the same parameters (invalidates the cache).
BUILDER_VERSION = 1


def cached_tiny_moe(**params) -> Path:
    """make_tiny_moe's file for these parameters, written once into
    $SPECDASH_CACHE/fixtures (named by a hash of the parameters and the tokenizer's file)
    and reused by every test and run after: tests that only read a MoE need not write one."""
    import hashlib
    import json
    import os

    from specdash.contract.paths import cache_dir

    tokenizer = Path(params.get("tokenizer_from") or _smollm2()).resolve()
    st = tokenizer.stat()
    key = {"v": BUILDER_VERSION, "tokenizer": [tokenizer.name, st.st_size],
           **{k: str(v) if isinstance(v, Path) else v for k, v in params.items() if k != "tokenizer_from"}}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / "fixtures" / f"moe-{digest}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            make_tiny_moe(tmp, **{**params, "tokenizer_from": tokenizer})
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path
