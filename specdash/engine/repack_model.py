"""The repack probe's model: a tiny random-weight llama whose weights have the types the
bundled models use, written once into $SPECDASH_CACHE/repack.

The crash it looks for (engine/repack.py) happens in the AMX matmul of a quantized weight
on a batch of more than one token, so what matters is that every weight type a user's
model may route to AMX or CPU_REPACK is here, at shapes those kernels take (rows a
multiple of 32, rows of 256 values for the K-quants): Q4_K and Q6_K (Qwen2.5's Q4_K_M),
Q8_0, Q4_1 (SmolLM2) and Q4_0. No tokenizer: llama.cpp's "none" vocabulary with
`vocab_size` dummy tokens, since the probe decodes token ids.

Quantized with llama.cpp's own ggml_quantize_chunk (the `gguf` package quantizes only
the legacy types), written with the `gguf` package's GGUFWriter.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

from specdash.contract.paths import cache_dir

# Bump when the bytes change; the file name carries it.
MODEL_VERSION = 1
N_EMBD, N_FF, N_VOCAB, N_HEAD = 256, 512, 512, 4
# (layer, weight) -> ggml type name; layer 0 as Q4_K_M writes it, layer 1 the legacy types.
_TYPES = {
    (0, "attn_q"): "Q4_K", (0, "attn_k"): "Q4_K", (0, "attn_v"): "Q6_K", (0, "attn_output"): "Q4_K",
    (0, "ffn_gate"): "Q4_K", (0, "ffn_up"): "Q4_K", (0, "ffn_down"): "Q6_K",
    (1, "attn_q"): "Q8_0", (1, "attn_k"): "Q4_1", (1, "attn_v"): "Q4_0", (1, "attn_output"): "Q8_0",
    (1, "ffn_gate"): "Q4_0", (1, "ffn_up"): "Q4_1", (1, "ffn_down"): "Q8_0",
}


def probe_model() -> Path:
    """The probe model's path, written first if it is not there yet."""
    path = cache_dir() / "repack" / f"probe-model-v{MODEL_VERSION}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        _write(tmp)
        os.replace(tmp, path)  # another process writing the same bytes may win: same file
    return path


def _quantize(x: np.ndarray, type_name: str) -> tuple[np.ndarray, Any]:
    """x (rows, n_per_row) float32 -> (raw bytes shaped (rows, row_bytes), its gguf type)."""
    import gguf
    from llama_cpp._ggml import libggml

    qtype = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, n = x.shape
    out = np.empty((rows, n // block * size), dtype=np.uint8)
    fn = libggml.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p]
    src = np.ascontiguousarray(x, dtype=np.float32)
    written = fn(int(qtype), src.ctypes.data, out.ctypes.data, 0, rows, n, None)
    if written != out.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes of {type_name}, expected {out.nbytes}")
    return out, qtype


def _write(path: Path) -> None:
    import gguf

    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(2)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_vocab_size(N_VOCAB)
    w.add_tokenizer_model("none")

    def add(name: str, rows: int, cols: int, type_name: str) -> None:
        raw, qtype = _quantize(rng.standard_normal((rows, cols), dtype=np.float32) * 0.05, type_name)
        w.add_tensor(name, raw, raw_dtype=qtype)

    add("token_embd.weight", N_VOCAB, N_EMBD, "Q8_0")
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    add("output.weight", N_VOCAB, N_EMBD, "Q8_0")
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name, rows, cols in (("attn_q", N_EMBD, N_EMBD), ("attn_k", N_EMBD, N_EMBD),
                                 ("attn_v", N_EMBD, N_EMBD), ("attn_output", N_EMBD, N_EMBD),
                                 ("ffn_gate", N_FF, N_EMBD), ("ffn_up", N_FF, N_EMBD),
                                 ("ffn_down", N_EMBD, N_FF)):
            add(f"blk.{i}.{name}.weight", rows, cols, _TYPES[(i, name)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
