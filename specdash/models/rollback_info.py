"""How a model undoes rejected draft tokens, read from its architecture and metadata.

Speculative decoding drops the rejected tail of every verify batch. A KV cache cuts it
off (`llama_memory_seq_rm`). A recurrent state (Mamba/Mamba2 SSM, LFM2 short-conv, RWKV,
gated delta-net) has already absorbed those tokens, and llama.cpp refuses the cut unless
one of two mechanisms is in place (vendored llama.cpp of llama-cpp-python 0.3.36):

- **snapshots**: for the architectures of `llm_arch_supports_rs_rollback`, a context
  created with `n_rs_seq = N` keeps the last N+1 recurrent states of each decode, and a
  tail cut of up to N tokens points the next decode at an older one. Costs memory: the
  recurrent state x (1 + N); no time beyond the copies.
- **checkpoint** (+ replay): everywhere else. Save the recurrent part of the state
  (`llama_state_seq_get_data_ext`, PARTIAL_ONLY) before each verify batch; after a
  partial rejection restore it, cut the attention tail and re-decode the accepted tokens.
  Costs one state copy per step, and a replay batch per partial rejection.

These tables are the explanation shown to the user (check, models scan / pairs, README);
the engine decides at run time by asking llama.cpp (`llama_n_rs_seq` after creating the
context, a tail-removal probe), so a table that falls behind llama.cpp misleads a label,
never the decoding. Kept in this one place; scan.py re-exports them.

Textual-free and llama.cpp-free: the engine, the CLI and the dashboard may all use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

# llama.cpp 0.3.36, src/llama-arch.cpp. llm_arch_is_recurrent: the whole state is a
# recurrent one (no KV cache to cut back).
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# llm_arch_is_hybrid: attention layers beside recurrent (SSM / linear-attention) ones.
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
    "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next",
    "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01",
})
# llm_arch_supports_rs_rollback: llama.cpp can keep recurrent-state snapshots per
# sequence (context param n_rs_seq, experimental) and roll back to one of them.
RS_ROLLBACK_ARCHS = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
    "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3",
})
# An architecture this table does not know is still recurrent if its metadata says so.
RECURRENT_KEY_PARTS = (".ssm.", ".wkv.", ".rwkv.", ".time_mix_", ".shortconv.")

# Snapshots assumed when describing a model before it runs: enough for the default
# largest K (EngineSettings.k_max; tests/test_rollback_info.py checks they agree). The
# engine sizes n_rs_seq from the settings in force; describe() takes that count.
DEFAULT_N_RS_SEQ = 16

# Per-layer metadata arrays the state estimate needs (read in full by the scan).
ARRAY_KEY_SUFFIXES = (".attention.head_count_kv", ".feed_forward_length", ".attention.recurrent_layers")

Strategy = Literal["kv", "snapshots", "checkpoint"]


def state_kind(arch: str | None, meta: Mapping[str, Any] | None = None) -> str | None:
    """"recurrent", "hybrid", or None (a plain KV cache)."""
    if arch in RECURRENT_ARCHS:
        return "recurrent"
    if arch in HYBRID_ARCHS:
        return "hybrid"
    if arch and meta and any(k.startswith(arch) and p in k for k in meta for p in RECURRENT_KEY_PARTS):
        return "recurrent"
    return None


def expected_strategy(arch: str | None, state: str | None = None) -> Strategy:
    """What the engine should end up with for `arch`: "kv" for a KV cache, "snapshots"
    where llama.cpp supports them, "checkpoint" for every other recurrent or hybrid
    state. `state` (state_kind's answer) covers architectures the tables do not know."""
    state = state or state_kind(arch)
    if state is None:
        return "kv"
    return "snapshots" if arch in RS_ROLLBACK_ARCHS else "checkpoint"


# ------------------------------------------------------------------ recurrent state size

def _int(meta: Mapping[str, Any], key: str, default: int = 0) -> int:
    v = meta.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _per_layer(meta: Mapping[str, Any], key: str, n_layer: int) -> list[int] | None:
    """A per-layer value: a list as is, a scalar repeated, None if absent or unread."""
    v = meta.get(key)
    if isinstance(v, list) and len(v) == n_layer:
        return [int(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool):
        return [v] * n_layer
    return None


def _recurrent_layers(arch: str, meta: Mapping[str, Any], n_layer: int) -> int | None:
    """How many layers hold a recurrent state, the way each model's load_arch_hparams
    marks them (src/models/<arch>.cpp); None if the metadata does not say."""
    if arch in RECURRENT_ARCHS or arch == "falcon-h1":  # falcon-h1: SSM beside attention in every layer
        return n_layer
    flags = meta.get(f"{arch}.attention.recurrent_layers")
    if isinstance(flags, list) and len(flags) >= n_layer:
        return sum(1 for f in flags[:n_layer] if f)
    if arch in ("qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"):
        interval = _int(meta, f"{arch}.full_attention_interval", 8 if arch == "minimax-01" else 4) or 1
        return sum(1 for i in range(n_layer) if (i + 1) % interval != 0)
    kv = _per_layer(meta, f"{arch}.attention.head_count_kv", n_layer)
    if kv is None:
        return n_layer if state_kind(arch, meta) == "recurrent" else None
    if arch in ("nemotron_h", "nemotron_h_moe"):  # recurrent: no attention and no FFN
        ff = _per_layer(meta, f"{arch}.feed_forward_length", n_layer)
        if ff is None:
            return None
        return sum(1 for h, f in zip(kv, ff) if h == 0 and f == 0)
    return sum(1 for h in kv if h == 0)


def recurrent_state_bytes(arch: str | None, meta: Mapping[str, Any]) -> int | None:
    """Bytes of one sequence's recurrent state (F32 conv + SSM/WKV rows of every recurrent
    layer: llama_hparams::n_embd_r / n_embd_s, src/llama-hparams.cpp), i.e. one
    checkpoint or one snapshot. None for a KV-cache model or when the metadata is not
    enough to tell (the engine then reports the real size at run time)."""
    if not arch or state_kind(arch, meta) is None:
        return None
    n_layer = _int(meta, f"{arch}.block_count")
    n_embd = _int(meta, f"{arch}.embedding_length")
    layers = _recurrent_layers(arch, meta, n_layer) if n_layer else None
    if not layers or not n_embd:
        return None
    wkv = _int(meta, f"{arch}.wkv.head_size")
    l_cache = _int(meta, f"{arch}.shortconv.l_cache")
    kda = _int(meta, f"{arch}.kda.head_dim")
    d_conv = _int(meta, f"{arch}.ssm.conv_kernel")
    if wkv:  # RWKV: token shift rows + the WKV matrix
        r, s = _int(meta, f"{arch}.token_shift_count", 2) * n_embd, n_embd * wkv
    elif l_cache:  # LFM2 short convolution: the last l_cache - 1 inputs
        r, s = n_embd * (l_cache - 1), 0
    elif kda:  # Kimi delta attention: q/k/v conv rows + one head_dim^2 matrix per head
        n_head = _int(meta, f"{arch}.attention.head_count")
        r, s = 3 * ((d_conv or 4) - 1) * n_head * kda, kda * kda * n_head
    elif arch == "minimax-01":  # lightning attention: head_dim^2 per head, not in the metadata simply
        return None
    else:  # Mamba-style: conv rows over x, B, C + the SSM state
        d_inner = _int(meta, f"{arch}.ssm.inner_size")
        d_state = _int(meta, f"{arch}.ssm.state_size")
        n_group = _int(meta, f"{arch}.ssm.group_count", 1) or 1
        if not d_inner or not d_state:
            return None
        if arch == "mamba":  # Mamba 1 has no groups: conv over x only
            n_group = 0
        r, s = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state), d_state * d_inner
    return 4 * layers * (r + s)


# --------------------------------------------------------------------------------- words

def human_bytes(n: int) -> str:
    """1.6 KB, 137 KB, 24 MB: short and decimal, as the dashboard shows them."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            v = n / size
            return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"
    return f"{n} B"


def describe(strategy: str, *, n_rs_seq: int | None = None, checkpoint_bytes: int | None = None) -> str:
    """The status-line words: "rollback: snapshots (n_rs_seq 16)", "rollback: checkpoint
    1.6 KB + replay", "rollback: KV cache". `strategy` "" means a KV cache (as on step
    events)."""
    if strategy == "snapshots":
        return f"rollback: snapshots (n_rs_seq {n_rs_seq if n_rs_seq is not None else DEFAULT_N_RS_SEQ})"
    if strategy == "checkpoint":
        size = f" {human_bytes(checkpoint_bytes)}" if checkpoint_bytes else ""
        return f"rollback: checkpoint{size} + replay"
    if strategy in ("", "kv"):
        return "rollback: KV cache"
    raise ValueError(f"unknown rollback strategy {strategy!r} (kv, snapshots, checkpoint)")


def short(strategy: str, state_bytes: int | None, *, n_rs_seq: int = DEFAULT_N_RS_SEQ) -> str:
    """A table cell: "snapshots 35 KB (n_rs_seq 16)" (all the snapshots' memory),
    "checkpoint 30 KB + replay" (one checkpoint), "KV cache"."""
    if strategy == "snapshots":
        size = f" {human_bytes(state_bytes * (n_rs_seq + 1))}" if state_bytes else ""
        return f"snapshots{size} (n_rs_seq {n_rs_seq})"
    if strategy == "checkpoint":
        size = f" {human_bytes(state_bytes)}" if state_bytes else ""
        return f"checkpoint{size} + replay"
    return "KV cache"


def explain(arch: str | None, state: str | None, state_bytes: int | None, *,
            n_rs_seq: int = DEFAULT_N_RS_SEQ) -> str:
    """One line for check / models scan / pairs: the strategy, why, and its memory cost."""
    strategy = expected_strategy(arch, state)
    if strategy == "kv":
        return "rollback: KV cache (rejected positions are cut off; no extra memory)"
    what = f"{state} ({arch})"
    if strategy == "snapshots":
        cost = (f"{n_rs_seq + 1} x {human_bytes(state_bytes)} recurrent state = "
                f"{human_bytes(state_bytes * (n_rs_seq + 1))}, {human_bytes(state_bytes * n_rs_seq)} more than plain"
                if state_bytes else "the recurrent state x (1 + n_rs_seq)")
        return (f"rollback: snapshots (n_rs_seq {n_rs_seq}): {what} is in llama.cpp's snapshot list; "
                f"memory {cost}; no replay")
    size = human_bytes(state_bytes) if state_bytes else "a copy of the recurrent state"
    return (f"rollback: checkpoint + replay: {what} has no llama.cpp snapshots; {size} saved before "
            f"each verify batch, restored and the accepted tokens re-decoded after a partial rejection")
