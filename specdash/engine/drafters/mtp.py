"""The target's own multi-token-prediction (MTP, "NextN") head drafts, as llama.cpp's
`--spec-type draft-mtp` does (common/speculative.cpp, common_speculative_impl_draft_mtp).

Qwen3.5, Qwen3-Next, GLM-4.5 and DeepSeek-V3-class models carry a head trained with the
model: one extra block that predicts the token after next from the target's hidden state
at a position and the embedding of the token that follows it. llama.cpp decodes it in a
context of its own (`ctx_type` LLAMA_CONTEXT_TYPE_MTP, `ctx_other` = the target's context)
on the target's model, whose memory is a plain KV cache of the head's layer (on the hybrid
qwen35 the recurrent state stays in the target's context alone).

How the hidden state passes (llama.cpp's driver, step for step):
- The target context outputs its hidden rows (`llama_set_embeddings_nextn(ctx, true,
  masked=false)`: one row per token of every batch, logits or not). `MtpDrafter`
  observes every target decode (`LLM.observers`) and copies the rows by position.
- The head's KV holds entry p = (token p, target hidden at p - 1), for the committed
  positions; the first position is paired with zeros (llama.cpp's first request).
- A draft starts from (the last committed token, the target's hidden at the position
  before it) and goes on from (its own token, its own hidden row) for K tokens. The
  draft's entries leave the head's KV afterwards (llama-server's seq_rm after drafting).
- After the verify the committed tokens grow by the accepted drafts and the target's
  token; the next propose() feeds their pairs, so the hidden taken for the next draft is
  the one at the accepted position; entries past the committed tokens (a rejected tail,
  a new prompt) are cut from the head's KV first (`llama_memory_seq_rm`).

The engine only decodes the target on top of committed tokens, so for every position
q < n_past the last decode that covered q had the true prefix and token: its row is the
hidden state at q. Rows of rejected drafts and of adaptive K's calibration batches sit at
positions >= n_past and are overwritten before they are read. Snapshots and checkpoint
replays of a hybrid target decode committed tokens again: their rows are the same.

What differs from llama-server: it decodes the whole prompt before its first draft, which
continues the token sampled after it; specdash prefills all but the last prompt token, so
the head could draft in the first step already, and does not (the prompt rule in
propose): its first step is plain, and from the second on both are in the same state
(same drafts, same counts: tests/test_mtp.py's peer check). llama-server also feeds the
head every verify row, the rejected ones too, and cuts them afterwards; this feeds only
committed rows (the same entries, fewer decoded). Only a single head drafts here: a model
with chained heads (step35) is refused with the reason (llama.cpp chains them).

The hand-off of hidden rows lives in llama.cpp's staging header (src/llama-ext.h: "should
be considered WIP"); llama-cpp-python binds it in `llama_cpp.llama_cpp_ext`, which says
not to depend on it. So it is looked up when the drafter is first built, and anything
missing makes `mtp` unavailable with a one-line reason (`MtpUnavailable`).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import llama_cpp as ll
import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.drafters.draft_model import JointCut, common_prefix
from specdash.models.llamalog import last_log_error
from specdash.engine.llm import LLM
from specdash.engine.settings import SamplingParams
from specdash.contract.errors import SpecdashError

# llama.cpp's staging functions the driver needs (llama-ext.h), as llama_cpp_ext binds them.
STAGING = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith",
           "llama_set_nextn_layer_offset", "llama_get_ctx_other")
# Public llama.h names it needs beyond what the engine already uses.
PUBLIC = ("LLAMA_CONTEXT_TYPE_MTP", "llama_model_n_layer_nextn", "llama_model_n_embd_out")
# Test hook: comma-separated names treated as missing from the bindings, so the fail-soft
# path runs against a real build (`SPECDASH_MTP_HIDE=llama_get_embeddings_nextn_ith`).
HIDE_ENV = "SPECDASH_MTP_HIDE"
# llama.cpp's draft-mtp sampler is top_k(10) then dist: the draft token is the argmax and
# its confidence (compared with --spec-draft-p-min) is its softmax share among the 10 best.
TOP_K = 10


class MtpUnavailable(SpecdashError):
    """`mtp` cannot draft for this target; the message is the one-line reason."""


def _hidden() -> set[str]:
    return {n.strip() for n in os.environ.get(HIDE_ENV, "").split(",") if n.strip()}


def staging_api() -> ModuleType:
    """llama-cpp-python's bindings of llama.cpp's MTP staging API, or MtpUnavailable
    naming what is missing (its module binds every symbol at import and raises then)."""
    hidden = _hidden()
    try:
        import llama_cpp.llama_cpp_ext as ext
    except (ImportError, AttributeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MtpUnavailable(f"this llama-cpp-python has no binding of llama.cpp's MTP staging API "
                             f"(llama_cpp.llama_cpp_ext: {first})") from None
    missing = [n for n in STAGING if n in hidden or not callable(getattr(ext, n, None))]
    missing += [n for n in PUBLIC if n in hidden or not hasattr(ll, n)]
    if missing:
        raise MtpUnavailable(f"this llama-cpp-python lacks llama.cpp's {', '.join(missing)} "
                             f"(the MTP hand-off is a staging API that may change between builds)")
    return ext


def unavailable_reason(target: LLM) -> str | None:
    """Why `mtp` cannot draft for this loaded target, in one line; None if it can (as far
    as can be told without building it: the staging symbols are looked up then)."""
    name = target.path.name
    if target.n_mtp_layers <= 0:
        return (f"{name} has no MTP head ({target.arch}.nextn_predict_layers is absent or 0; "
                "many published GGUFs drop the head)")
    if not target.mtp_loaded:
        return f"{name}'s MTP head ({target.n_mtp_layers} layer(s)) was not loaded with the target"
    if target.n_mtp_layers > 1:
        # llama.cpp's driver chains them (one head per draft step, each re-decoding the
        # draft so far under its own layer: llama_set_nextn_layer_offset); not built here,
        # and no model with chained heads was at hand to check it against.
        return (f"{name} has {target.n_mtp_layers} chained MTP heads ({target.arch}); only a single head "
                "drafts here (llama-server --spec-type draft-mtp chains them)")
    return None


class MtpDrafter:
    """Drafts K tokens with the target's MTP head. One per target (the session owns it and
    lends it): its context reads the target's. `rebind(target)` follows a target reload."""

    name = "mtp"
    free = False

    def __init__(self, target: LLM, p_min: float = 0.0, p_joint: float = 0.0,
                 relative_cost: float | None = None):
        why = unavailable_reason(target)
        if why:
            raise MtpUnavailable(why)
        self._api = staging_api()
        self.p_min = p_min  # llama.cpp's --spec-draft-p-min, on its top-10 confidence; 0 = off
        self.p_joint = p_joint  # the joint confidence cut (JointCut); 0 = off
        self.relative_cost = relative_cost
        self.target: LLM | None = None
        self.ctx: Any = None
        self._batch: Any = None
        self._tok_buf: Any = None
        self._open(target)
        self.label = "mtp"
        self._kv: list[int] = []  # tokens whose head entries sit in the MTP context, from position 0
        self._committed = 0  # committed length at the last sync (a known common prefix)
        self._start = 0  # first position with an entry (> 0 when built mid-run: no rows before it)
        self._normal_upto = -1  # positions below this were committed by a step after one this drafted
        self._after_draft = False
        self._prompt_len = 0  # the prompt's length (prefill): no draft before a token past it
        self._prep_ms = 0.0
        self._catch_up_ms = 0.0  # ms per catch-up entry, as last measured (EMA)

    # --- the context ------------------------------------------------------------------
    def _open(self, target: LLM) -> None:
        api = self._api
        self.n_heads = max(1, int(ll.llama_model_n_layer_nextn(target.model)))
        self.n_embd = int(ll.llama_model_n_embd_out(target.model))
        self.n_vocab = target.n_vocab
        cp = ll.llama_context_default_params()
        cp.n_ctx = target.n_ctx
        cp.n_batch = cp.n_ubatch = target.n_batch
        cp.n_threads = cp.n_threads_batch = target.n_threads
        cp.n_rs_seq = 0
        cp.ctx_type = ll.LLAMA_CONTEXT_TYPE_MTP
        cp.ctx_other = target.ctx
        ctx = ll.llama_init_from_model(target.model, cp)
        if not ctx:
            why = last_log_error() or "llama.cpp refused an MTP context"
            raise MtpUnavailable(f"{target.path.name}: llama.cpp could not create its MTP context: {why}")
        self.ctx = ctx
        self.mem = ll.llama_get_memory(ctx)
        # The head's context outputs its own hidden rows for output tokens only (they feed
        # its next draft step); the target's for every token.
        api.llama_set_embeddings_nextn(ctx, True, True)
        api.llama_set_embeddings_nextn(target.ctx, True, False)
        n = target.n_batch
        # A classic llama_batch carrying a token AND a hidden row per entry (llama.cpp's
        # llama_batch_compat takes both): embd is allocated by llama_batch_init, the token
        # array is ours (and detached again before llama_batch_free).
        self._batch = ll.llama_batch_init(n, self.n_embd, 1)
        self._tok_buf = (ll.llama_token * n)()
        self._batch.token = self._tok_buf
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(n, self.n_embd))
        self._h = np.zeros((target.n_ctx, self.n_embd), dtype=np.float32)  # target hidden by position
        self._have = np.zeros(target.n_ctx, dtype=bool)
        self._zeros = np.zeros(self.n_embd, dtype=np.float32)
        self.target = target
        target.observers.append(self)

    def _close_ctx(self) -> None:
        target = self.target
        if target is not None:
            if self in target.observers:
                target.observers.remove(self)
            if target.ctx:
                self._api.llama_set_embeddings_nextn(target.ctx, False, False)
            self.target = None
        if self._batch is not None:
            self._batch.token = ctypes.POINTER(ll.llama_token)()
            ll.llama_batch_free(self._batch)
            self._batch = None
        if self.ctx:
            ll.llama_free(self.ctx)
            self.ctx = None

    def rebind(self, target: LLM) -> None:
        """The target was reloaded (another expert count): a new context on the new model;
        the head's memory starts over (the engine feeds the transcript again)."""
        self._close_ctx()
        self._open(target)
        self.reset()

    # --- the target's decodes (DecodeObserver) ----------------------------------------------
    def decoded(self, tokens: Sequence[int], start_pos: int) -> None:
        target = self.target
        if target is None:
            return
        ptr = self._api.llama_get_embeddings_nextn(target.ctx)
        if not ptr:
            return
        n = len(tokens)
        self._h[start_pos:start_pos + n] = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))
        self._have[start_pos:start_pos + n] = True

    def cleared(self) -> None:
        self._have[:] = False

    # --- the head's memory --------------------------------------------------------------
    def _decode(self, entries: int, start_pos: int, output_last: bool) -> None:
        b = self._batch
        b.n_tokens = entries
        for i in range(entries):
            b.pos[i] = start_pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = False
        if output_last:
            b.logits[entries - 1] = True
        rc = ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"MTP head: llama_decode failed with code {rc}: {last_log_error()}")

    def _cut(self, n: int) -> None:
        """Drop the head's entries at positions >= n."""
        if not ll.llama_memory_seq_rm(self.mem, 0, n, -1):
            raise RuntimeError(f"MTP head: llama_memory_seq_rm failed at position {n}")

    def _sync(self, tokens: Sequence[int]) -> int:
        """Bring the head's entries in step with the committed tokens: entry p = (token p,
        the target's hidden at p - 1) for every committed position; return how many were
        fed. Entries past the longest common prefix (a rejected tail, another prompt)
        are cut first."""
        kv = self._kv
        n_past = len(tokens) - 1
        n = min(common_prefix(kv, tokens, self._committed), n_past)
        if n < len(kv):
            self._cut(n)
            del kv[n:]
            self._start = min(self._start, n)
        first = len(kv)
        if first < n_past:
            # Rows the pairs need that the observer never saw (the drafter was built mid-run):
            # the entries start after the last one, from zeros, as llama.cpp's first position.
            need = self._have[max(first - 1, 0):n_past - 1]
            missing = np.flatnonzero(~need)
            if missing.size:
                start = max(first - 1, 0) + int(missing[-1]) + 1
                self._cut(0)  # a KV cache wants consecutive positions: no entries before a gap
                kv[:] = [int(t) for t in tokens[:start]]
                self._start = first = start
        fed = 0
        while first < n_past:
            m = min(n_past - first, self._batch_cap())
            for i in range(m):
                p = first + i
                self._tok_buf[i] = tokens[p]
                self._embd[i] = self._h[p - 1] if p > self._start else self._zeros
            self._decode(m, first, output_last=False)
            kv.extend(int(t) for t in tokens[first:first + m])
            first += m
            fed += m
        self._committed = len(tokens)
        return fed

    def _batch_cap(self) -> int:
        return self.target.n_batch if self.target is not None else 1

    # --- the Drafter API ------------------------------------------------------------------
    @property
    def k_ceiling(self) -> bool:
        return self.p_joint > 0  # the joint cut ends drafts before K

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        if self._after_draft:  # the step after a draft committed its normal share
            self._normal_upto, self._after_draft = len(tokens) - 1, False
        if k <= 0 or self.target is None:
            return Draft.empty(self.name)  # catches up when next asked (catch_up_ms)
        n_past = len(tokens) - 1
        t0 = time.perf_counter()
        before = len(self._kv)
        fed = self._sync(tokens)
        # Feeding what the last step committed is part of drafting; more is catch-up on
        # steps this drafter sat out.
        extra = max(0, n_past - max(before, self._normal_upto))
        if fed:
            per = (time.perf_counter() - t0) * 1e3 / fed
            self._prep_ms = per * min(extra, fed)
            if extra:
                old = self._catch_up_ms
                self._catch_up_ms = per if old == 0 else old + 0.25 * (per - old)
        else:
            self._prep_ms = 0.0
        if n_past <= 0 or not self._have[n_past - 1] or len(self._kv) < n_past:
            return Draft.empty(self.name)  # the target's hidden at the last position is not known yet
        if len(tokens) <= self._prompt_len:
            # llama-server drafts first from the token it samples after the prompt: the head
            # is never asked to continue the prompt's own last token. The same here, so the
            # same steps draft the same tokens (its peer check counts them).
            return Draft.empty(self.name)
        out = self._draft(int(tokens[-1]), n_past, self._h[n_past - 1], k)
        self._after_draft = True
        return Draft(out, None, self.name, prep_ms=self._prep_ms)

    def _draft(self, last: int, pos0: int, h: np.ndarray, k: int,
               confidences: list[float] | None = None) -> list[int]:
        """llama.cpp's draft(): from (last token, hidden before it) at pos0, K head steps,
        each fed the head's own hidden row; its entries are cut afterwards. `confidences`:
        filled with each drafted token's confidence (top-10 share) when given."""
        cut = JointCut(self.p_min, self.p_joint)
        out: list[int] = []
        tok, row = last, h
        try:
            for i in range(k):
                self._tok_buf[0] = tok
                self._embd[0] = row
                self._decode(1, pos0 + i, output_last=True)
                logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, 0), shape=(self.n_vocab,))
                tok = self._pick(logits)
                if cut.active or confidences is not None:
                    p = top_k_share(logits, TOP_K)
                    if cut.active and cut.stop(p):
                        break
                    if confidences is not None:
                        confidences.append(p)
                out.append(tok)
                if len(out) == k:
                    break
                ptr = self._api.llama_get_embeddings_nextn_ith(self.ctx, 0)
                if not ptr:
                    break
                row = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()
        finally:
            self._cut(pos0)  # the draft's own entries leave (llama-server does it after drafting)
        return out

    def chain(self, tokens: Sequence[int], depth: int) -> tuple[list[int], list[float]]:
        """What the head drafts from the committed `tokens` at K = `depth` under its cuts,
        and each token's confidence, wherever the prompt ends (whatif's table of the
        head's proposals: a draft of K is the first K of it). The target must have
        decoded tokens[:-1] (its rows are the head's input)."""
        self._sync(tokens)
        n_past = len(tokens) - 1
        if n_past <= 0 or not self._have[n_past - 1]:
            return [], []
        conf: list[float] = []
        return self._draft(int(tokens[-1]), n_past, self._h[n_past - 1], depth, conf), conf

    def _pick(self, logits: np.ndarray) -> int:
        """The drafted token: the head's argmax (llama.cpp's draft-mtp drafts greedily at
        any temperature; verification then treats the draft as one-hot, which is exact)."""
        return int(np.argmax(logits))

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        """What the next propose() would spend feeding the head entries committed while it
        sat out (beyond the last step's), at its measured cost per entry."""
        return self._behind(tokens) * self._catch_up_ms

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0 if self._catch_up_ms > 0 else self._behind(tokens)

    def _behind(self, tokens: Sequence[int]) -> int:
        return max(len(tokens) - 1 - max(len(self._kv), self._normal_upto), 0)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Feed the prompt's entries now (the target prefilled all but its last token), so
        the first drafting step is not charged for them."""
        self._prompt_len = len(tokens)
        if self.target is not None and len(tokens) > 1:
            self._sync(tokens)
            self._normal_upto = len(tokens) - 1

    def reset(self) -> None:
        if self.ctx:
            ll.llama_memory_clear(self.mem, True)
        self._kv.clear()
        self._committed = 0
        self._start = 0
        self._normal_upto = -1
        self._after_draft = False
        self._prompt_len = 0

    def forget(self) -> None:
        pass  # the head keeps nothing across prompts

    def set_cut(self, p_joint: float) -> None:
        self.p_joint = p_joint

    def close(self) -> None:
        self._close_ctx()


def top_k_share(logits: np.ndarray, k: int) -> float:
    """The argmax's softmax probability among the k largest logits: llama.cpp's draft
    confidence under its top_k(10) + dist sampler chain (what --spec-draft-p-min cuts)."""
    top = np.partition(logits, -k)[-k:] if logits.size > k else logits
    m = float(top.max())
    return 1.0 / float(np.exp((top - m).astype(np.float64)).sum())
