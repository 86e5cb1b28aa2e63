"""The random-weight recurrent/hybrid GGUFs of tests/fixtures/recurrent_gguf.py are real
models to llama.cpp, with the properties the rollback tests rely on:

- they load with specdash's LLM and decode readable, varied text (not one repeated token);
- prompt lookup on their greedy output drafts, gets some drafts fully accepted and
  others partly rejected (so a rollback really runs);
- the perturbed copy agrees with its target often, not always (a useful draft model);
- lfm2 takes recurrent-state snapshots (n_rs_seq), mamba2 and granitehybrid are clamped
  to 0; without snapshots a tail `llama_memory_seq_rm` fails, and a PARTIAL_ONLY state
  checkpoint restores the state exactly (the two mechanisms of issue 19).
"""

from __future__ import annotations

import ctypes
import hashlib

import llama_cpp as ll
import numpy as np
import pytest

from specdash.engine.llm import LLM

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"

ARCH_FIXTURES = {"lfm2": "lfm2_path", "mamba2": "mamba2_path", "granitehybrid": "hybrid_ckpt_path"}
DRAFT_FIXTURES = {"lfm2": "lfm2_draft_path", "mamba2": "mamba2_draft_path",
                  "granitehybrid": "hybrid_ckpt_draft_path"}


def greedy(llm: LLM, n: int, prompt: str = PROMPT) -> tuple[list[int], list[int]]:
    """Plain one-token-at-a-time greedy decoding: (prompt tokens, generated tokens)."""
    toks = llm.tokenize(prompt)
    logits = llm.decode(toks, 0, "last")
    out: list[int] = []
    for _ in range(n):
        t = int(np.argmax(logits[-1]))
        out.append(t)
        logits = llm.decode([t], len(toks) + len(out) - 1, "last")
    return toks, out


def simulate_lookup(context: list[int], out: list[int], k: int = 4) -> dict[str, int]:
    """Prompt-lookup drafting (longest n-gram 3..1, latest match, K tokens) replayed on a
    known greedy output: how many drafts, accepted tokens, full and partial acceptances."""
    drafted = accepted = full = partial = 0
    i = 0
    while i < len(out):
        hist = context + out[:i]
        draft: list[int] = []
        for n in (3, 2, 1):
            tail = hist[-n:]
            for j in range(len(hist) - n - 1, -1, -1):
                if hist[j:j + n] == tail:
                    draft = hist[j + n:j + n + k]
                    break
            if draft:
                break
        if not draft:
            i += 1
            continue
        a = 0
        while a < len(draft) and i + a < len(out) and out[i + a] == draft[a]:
            a += 1
        drafted += len(draft)
        accepted += a
        full += a == len(draft)
        partial += a < len(draft)
        i += a + 1
    return {"drafted": drafted, "accepted": accepted, "full": full, "partial": partial}


def llm_text(tokens: list[int], path) -> str:
    vocab = LLM(path, vocab_only=True)
    try:
        return vocab.detokenize(tokens)
    finally:
        vocab.close()


@pytest.fixture(params=list(ARCH_FIXTURES))
def arch_and_path(request):
    return request.param, request.getfixturevalue(ARCH_FIXTURES[request.param])


def test_fixture_loads_and_decodes_varied_readable_text(arch_and_path):
    arch, path = arch_and_path
    llm = LLM(path, n_ctx=512, n_threads=2)
    try:
        assert llm.arch == arch
        assert llm.n_vocab == 49152  # SmolLM2's vocabulary
        ctx, out = greedy(llm, 96)
        text = llm.detokenize(out)
    finally:
        llm.close()
    assert len(set(out)) >= 12, f"{arch}: greedy output collapsed: {text!r}"
    # SmolLM2's real BPE tokenizer: the prompt round-trips, the output reads as words.
    assert llm_text(ctx, path) == PROMPT
    assert text.strip() and "\ufffd" not in text[:40]
    stats = simulate_lookup(ctx, out)
    # Lookup must draft, see some drafts through and reject others part-way: otherwise
    # the rollback tests built on these fixtures would prove nothing.
    assert stats["partial"] >= 3, (arch, stats, text)
    assert stats["accepted"] >= 10, (arch, stats, text)


def test_fixtures_are_deterministic_and_cached(recurrent_gguf, lfm2_path, tmp_path):
    again = recurrent_gguf.fixture_path("lfm2")
    assert again == lfm2_path  # same parameters, same cached file
    fresh = recurrent_gguf.write_fixture(tmp_path / "x.gguf", "lfm2")
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(fresh) == digest(lfm2_path)
    assert recurrent_gguf.fixture_path("lfm2", seed=1, directory=tmp_path).name != lfm2_path.name


def test_cli_writes_target_and_draft(recurrent_gguf, tmp_path):
    lines: list[str] = []
    assert recurrent_gguf.main([str(tmp_path), "--arch", "mamba2"], out=lines.append) == 0
    assert len(lines) == 2 and all(p.endswith(".gguf") for p in lines)
    assert "-p0.05-" in lines[1]
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == sorted(p.rsplit("/", 1)[1] for p in lines)


@pytest.mark.parametrize("arch", list(ARCH_FIXTURES))
def test_perturbed_draft_agrees_often_not_always(arch, request):
    target = LLM(request.getfixturevalue(ARCH_FIXTURES[arch]), n_ctx=512, n_threads=2)
    try:
        ctx, out = greedy(target, 96)
    finally:
        target.close()
    draft = LLM(request.getfixturevalue(DRAFT_FIXTURES[arch]), n_ctx=512, n_threads=2)
    try:
        # Teacher-forced: the draft's greedy choice after each prefix of the target's text.
        logits = draft.decode(ctx + out[:-1], 0, "all")
        predicted = logits[len(ctx) - 1:].argmax(-1)
    finally:
        draft.close()
    agreement = float(np.mean(predicted == np.asarray(out)))
    assert 0.6 <= agreement < 1.0, (arch, agreement)


# ------------------------------------------------------------- llama.cpp's two mechanisms

class _Ctx:
    """A second context on a loaded model, made with the low-level API so n_rs_seq can be
    set (the high-level path never sets it)."""

    def __init__(self, llm: LLM, n_rs_seq: int, n_ctx: int = 256):
        p = ll.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = p.n_ubatch = 64  # n_ubatch must exceed n_rs_seq + 1
        p.n_threads = p.n_threads_batch = 2
        p.n_rs_seq = n_rs_seq
        self.ctx = ll.llama_init_from_model(llm.model, p)
        assert self.ctx
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(64, 0, 1)
        self.n_vocab = llm.n_vocab

    def decode(self, tokens: list[int], pos: int) -> np.ndarray:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(tokens) - 1
        assert ll.llama_decode(self.ctx, b) == 0
        return np.ctypeslib.as_array(ll.llama_get_logits(self.ctx), shape=(1, self.n_vocab))[0].copy()

    def pos_max(self) -> int:
        return ll.llama_memory_seq_pos_max(self.mem, 0)

    def close(self) -> None:
        ll.llama_batch_free(self.batch)
        ll.llama_free(self.ctx)


@pytest.fixture
def loaded(arch_and_path):
    arch, path = arch_and_path
    llm = LLM(path, n_ctx=256, n_threads=2)
    yield arch, llm
    llm.close()


def test_snapshot_support_is_what_llama_cpp_says(loaded):
    """lfm2 is in llm_arch_supports_rs_rollback; mamba2 and granitehybrid are not, and
    llama.cpp clamps their n_rs_seq to 0."""
    arch, llm = loaded
    c = _Ctx(llm, n_rs_seq=8)
    try:
        assert ll.llama_n_rs_seq(c.ctx) == (8 if arch == "lfm2" else 0)
        toks = llm.tokenize(PROMPT)[:10]
        c.decode(toks, 0)
        assert c.pos_max() == 9
        # A tail of 3: snapshots make it succeed on lfm2; elsewhere it fails and changes nothing.
        ok = ll.llama_memory_seq_rm(c.mem, 0, 7, -1)
        assert ok == (arch == "lfm2")
        assert c.pos_max() == (6 if arch == "lfm2" else 9)
    finally:
        c.close()


def test_tail_seq_rm_fails_on_a_plain_context(loaded):
    arch, llm = loaded
    assert ll.llama_n_rs_seq(llm.ctx) == 0
    llm.decode(llm.tokenize(PROMPT)[:10], 0, None)
    assert not ll.llama_memory_seq_rm(llm.mem, 0, 7, -1)
    with pytest.raises(RuntimeError, match="llama_memory_seq_rm failed"):
        llm.kv_truncate(7)


def test_partial_checkpoint_restore_and_replay_is_exact(loaded):
    """Mechanism 2 on each fixture: checkpoint the recurrent part, decode a 'draft', restore,
    cut the attention tail, replay one accepted token: the logits equal plain decoding's."""
    arch, llm = loaded
    toks = llm.tokenize(PROMPT)
    n = len(toks)
    flags = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

    plain = _Ctx(llm, n_rs_seq=0)
    try:
        plain.decode(toks, 0)
        want = plain.decode([toks[1]], n)  # the "accepted" token after the prompt
    finally:
        plain.close()

    c = _Ctx(llm, n_rs_seq=0)
    try:
        c.decode(toks, 0)
        size = ll.llama_state_seq_get_size_ext(c.ctx, 0, flags)
        assert size > 0
        buf = (ctypes.c_uint8 * size)()
        assert ll.llama_state_seq_get_data_ext(c.ctx, buf, size, 0, flags) == size
        c.decode([toks[1], toks[2], toks[3]], n)  # a draft of 3, all but the first rejected
        assert ll.llama_state_seq_set_data_ext(c.ctx, buf, size, 0, flags) == size
        # The recurrent side is back at n-1, so cutting the attention tail now succeeds.
        assert ll.llama_memory_seq_rm(c.mem, 0, n, -1)
        assert c.pos_max() == n - 1
        got = c.decode([toks[1]], n)
    finally:
        c.close()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert int(got.argmax()) == int(want.argmax())
