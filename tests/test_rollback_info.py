"""specdash.models.rollback_info: the rollback strategy and state size a recurrent or hybrid
model gets, from its metadata, checked against what llama.cpp really does and allocates."""

from __future__ import annotations

import inspect
import subprocess
from pathlib import Path

import llama_cpp as ll
import pytest

from specdash.models import rollback_info as ri
from specdash.models import scan as scan_mod
from specdash.models.gguf_header import read_gguf_header


@pytest.mark.parametrize("arch, state, strategy", [
    ("llama", None, "kv"), ("qwen2", None, "kv"),
    ("lfm2", "hybrid", "snapshots"), ("qwen35", "hybrid", "snapshots"), ("nemotron_h", "hybrid", "snapshots"),
    ("mamba2", "recurrent", "checkpoint"), ("rwkv7", "recurrent", "checkpoint"),
    ("granitehybrid", "hybrid", "checkpoint"), ("jamba", "hybrid", "checkpoint"),
    ("falcon-h1", "hybrid", "checkpoint"), ("qwen3next", "hybrid", "checkpoint"),
])
def test_expected_strategy(arch, state, strategy):
    assert ri.state_kind(arch) == state
    assert ri.expected_strategy(arch) == strategy


def test_unknown_architecture_with_recurrent_keys_gets_a_checkpoint():
    meta = {"futuressm.ssm.state_size": 16, "futuressm.block_count": 2}
    assert ri.state_kind("futuressm", meta) == "recurrent"
    assert ri.expected_strategy("futuressm", "recurrent") == "checkpoint"
    assert ri.expected_strategy("futuressm") == "kv"  # without the metadata nothing says otherwise


def test_describe_is_the_status_line_wording():
    assert ri.describe("snapshots", n_rs_seq=16) == "rollback: snapshots (n_rs_seq 16)"
    assert ri.describe("snapshots") == f"rollback: snapshots (n_rs_seq {ri.DEFAULT_N_RS_SEQ})"
    assert ri.describe("checkpoint", checkpoint_bytes=1636) == "rollback: checkpoint 1.6 KB + replay"
    assert ri.describe("checkpoint", checkpoint_bytes=140_364) == "rollback: checkpoint 140 KB + replay"
    assert ri.describe("checkpoint") == "rollback: checkpoint + replay"
    assert ri.describe("") == ri.describe("kv") == "rollback: KV cache"
    with pytest.raises(ValueError, match="unknown rollback strategy 'undo'"):
        ri.describe("undo")


def test_human_bytes():
    assert [ri.human_bytes(n) for n in (0, 999, 1000, 1636, 40_448, 2_500_000, 3_000_000_000)] == [
        "0 B", "999 B", "1.0 KB", "1.6 KB", "40 KB", "2.5 MB", "3.0 GB"]


def test_default_snapshot_count_covers_the_default_largest_k():
    from specdash.engine.controller import ThresholdController
    from specdash.engine.settings import EngineSettings

    assert ri.DEFAULT_N_RS_SEQ == EngineSettings().k_max
    assert ri.DEFAULT_N_RS_SEQ == inspect.signature(ThresholdController.__init__).parameters["k_max"].default


def test_one_table_re_exported_by_scan():
    for name in ("RECURRENT_ARCHS", "HYBRID_ARCHS", "RS_ROLLBACK_ARCHS"):
        assert getattr(scan_mod, name) is getattr(ri, name)
    assert ri.RS_ROLLBACK_ARCHS <= ri.HYBRID_ARCHS | ri.RECURRENT_ARCHS


def test_state_size_of_layouts_that_are_not_fixtures():
    # qwen3.5: every 4th layer is full attention (full_attention_interval), the rest gated delta-net
    qwen = {"qwen35.block_count": 8, "qwen35.embedding_length": 64, "qwen35.ssm.conv_kernel": 4,
            "qwen35.ssm.inner_size": 128, "qwen35.ssm.state_size": 16, "qwen35.ssm.group_count": 2}
    assert ri.recurrent_state_bytes("qwen35", qwen) == 4 * 6 * (3 * (128 + 2 * 2 * 16) + 16 * 128)
    # nemotron-h: a recurrent layer has neither attention heads nor an FFN
    nem = {"nemotron_h.block_count": 3, "nemotron_h.embedding_length": 64, "nemotron_h.ssm.conv_kernel": 4,
           "nemotron_h.ssm.inner_size": 128, "nemotron_h.ssm.state_size": 16, "nemotron_h.ssm.group_count": 1,
           "nemotron_h.attention.head_count_kv": [0, 2, 0], "nemotron_h.feed_forward_length": [0, 0, 256]}
    assert ri.recurrent_state_bytes("nemotron_h", nem) == 4 * 1 * (3 * (128 + 32) + 16 * 128)
    # rwkv7: two token-shift rows + an n_embd x head_size WKV matrix per layer
    rwkv = {"rwkv7.block_count": 2, "rwkv7.embedding_length": 64, "rwkv7.wkv.head_size": 16}
    assert ri.recurrent_state_bytes("rwkv7", rwkv) == 4 * 2 * (2 * 64 + 64 * 16)
    assert ri.recurrent_state_bytes("llama", {"llama.block_count": 2}) is None
    assert ri.recurrent_state_bytes("mamba2", {"mamba2.block_count": 2}) is None  # not enough metadata


FIXTURES = {"lfm2": "lfm2_path", "mamba2": "mamba2_path", "granitehybrid": "hybrid_ckpt_path"}


@pytest.mark.parametrize("arch", list(FIXTURES))
def test_state_size_matches_llama_cpps_checkpoint(arch, request):
    """The estimate from the header equals the recurrent state llama.cpp serializes with
    PARTIAL_ONLY, up to the per-sequence framing (cell count, positions, layer headers)."""
    from specdash.engine.llm import LLM

    path = request.getfixturevalue(FIXTURES[arch])
    header = read_gguf_header(path, array_suffixes=ri.ARRAY_KEY_SUFFIXES)
    estimate = ri.recurrent_state_bytes(arch, header.metadata)
    llm = LLM(path, n_ctx=256, n_threads=2)
    try:
        llm.decode(llm.tokenize("one two three"), 0, None)
        real = ll.llama_state_seq_get_size_ext(llm.ctx, 0, ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
    finally:
        llm.close()
    assert estimate is not None and 0 <= real - estimate < 256, (arch, estimate, real)


def test_no_takes_none_warning_is_left():
    """Issue 19: the old "specdash's engine takes none yet" wording is gone everywhere."""
    root = Path(__file__).resolve().parents[1]
    found = subprocess.run(["grep", "-rniI", "takes none", "specdash", "README.md", "docs"], cwd=root,
                           capture_output=True, text=True)
    assert found.stdout == ""


def test_the_readmes_example_sizes():
    """docs/hybrid-recurrent.md (the README's guide) quotes these two."""
    lfm2 = {"lfm2.block_count": 16, "lfm2.embedding_length": 2048, "lfm2.shortconv.l_cache": 3,
            "lfm2.attention.head_count_kv": [0, 0, 8, 0, 0, 8, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0]}
    state = ri.recurrent_state_bytes("lfm2", lfm2)
    assert state is not None
    assert (ri.human_bytes(state), ri.human_bytes(state * 17)) == ("164 KB", "2.8 MB")
    mamba2 = {"mamba2.block_count": 64, "mamba2.embedding_length": 2560, "mamba2.ssm.conv_kernel": 4,
              "mamba2.ssm.inner_size": 5120, "mamba2.ssm.state_size": 128, "mamba2.ssm.group_count": 1}
    state = ri.recurrent_state_bytes("mamba2", mamba2)
    assert state is not None and ri.human_bytes(state) == "172 MB"
    readme = (Path(__file__).resolve().parents[1] / "docs" / "hybrid-recurrent.md").read_text()
    assert "holds 164 KB (2.8 MB as 17 snapshots)" in readme and "holds 172 MB" in readme
