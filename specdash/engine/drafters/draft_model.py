"""A smaller model of the same family drafts K tokens autoregressively."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.llm import LLM
from specdash.engine.rollback import Checkpoint
from specdash.engine.settings import SamplingParams
from specdash.engine.verify import process_logits, sample


class DraftModelDrafter:
    name = "draft"
    free = False

    def parts(self) -> Sequence[Drafter]:
        return [self]

    @property
    def k_ceiling(self) -> bool:
        return self.p_joint > 0  # the joint cut ends drafts before K (JointCut)

    def __init__(self, llm: LLM, p_min: float = 0.0, label: str | None = None,
                 relative_cost: float | None = None, p_joint: float = 0.0):
        self.llm = llm
        self.relative_cost = relative_cost
        self.p_min = p_min  # confidence cut (llama.cpp's --draft-p-min); 0 = off
        self.p_joint = p_joint  # joint confidence cut (JointCut); 0 = off
        self.label = label or llm.path.stem
        self._kv: list[int] = []  # tokens whose KV entries sit in the draft context, in order
        self._committed = 0  # committed length at the last sync: a known common prefix
        self._prep_ms = 0.0
        self._catch_up_ms = 0.0  # ms per token of a catch-up batch, as last measured (EMA)
        # A recurrent or hybrid draft model cannot cut its drafts out of its state: it
        # checkpoints the state before drafting and, when the target rejected some of
        # them, restores it and feeds the committed tokens from there (its replay). Its
        # own drafts are decoded one token per batch, which recurrent-state snapshots
        # cannot take back past, so a checkpoint is the one way back for a draft model.
        self._ckpt = Checkpoint() if llm.strategy.kind != "kv" else None
        self._ckpt_at = -1  # the tokens in the draft context when the checkpoint was saved
        self._rollback_ms = 0.0
        self._rollback_bytes = 0

    def _common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix(self._kv, tokens, self._committed)

    def _sync(self, tokens: Sequence[int]) -> np.ndarray:
        """Bring the draft KV cache in step with the committed tokens; return the logits
        after the last one. Everything past the longest common prefix is stale: drafts
        the target rejected. Committed tokens only grow within a prompt, so the prefix
        is found by walking forward from where the last sync ended."""
        kv = self._kv
        n = self._common_prefix(tokens)
        if n == len(tokens):  # nothing new: re-decode the last token to get its logits
            n -= 1
        replayed = 0  # committed tokens fed again only because the state went back past them
        if n < len(kv):
            t0 = time.perf_counter()
            if self._ckpt is None:
                self.llm.kv_truncate(n)
            else:
                back = self._ckpt_at if 0 <= self._ckpt_at <= n else 0
                if back:
                    self._ckpt.restore(self.llm)
                    self.llm.kv_truncate(back)  # the attention tail; the recurrent part is back
                else:  # no checkpoint at or before n: start over from the first token
                    self.llm.clear()
                replayed, n = n - back, back
                self._ckpt_at = -1
                self._rollback_ms += (time.perf_counter() - t0) * 1e3
            del kv[n:]
        feed = list(tokens[n:])
        t0 = time.perf_counter()
        logits = np.empty((0, 0))
        for i in range(0, len(feed), self.llm.n_batch):
            chunk = feed[i : i + self.llm.n_batch]
            logits = self.llm.decode(chunk, n + i, logits="last")
        kv.extend(feed)
        self._committed = len(tokens)
        # Up to two new tokens per step is the normal rhythm (the target's bonus token,
        # plus the last draft token when all were accepted: it never had its own pass);
        # more means this drafter sat out steps, and the rest was catch-up. A replay is
        # part of drafting with a recurrent model, not catch-up.
        extra = max(len(feed) - 2 - replayed, 0)
        spent = (time.perf_counter() - t0) * 1e3
        per_token = spent / len(feed)
        self._rollback_ms += per_token * replayed
        self._prep_ms = per_token * extra
        if extra:
            old = self._catch_up_ms
            self._catch_up_ms = per_token if old == 0 else old + 0.25 * (per_token - old)
        row: np.ndarray = logits[0]
        return row

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        """What the next propose() would spend catching up on the tokens committed while
        this model sat out (beyond the usual two per step), at its measured cost per
        catch-up token; 0 until one catch-up was measured (the first probe, unbudgeted,
        measures it). Adaptive K prices a draft with
        it: in a chain that drafts from lookup most steps, each return to the model pays it."""
        return self._behind(tokens) * self._catch_up_ms

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0 if self._catch_up_ms > 0 else self._behind(tokens)

    def _behind(self, tokens: Sequence[int]) -> int:
        """Tokens the next propose() would feed beyond the usual two per step."""
        return max(len(tokens) - self._common_prefix(tokens) - 2, 0)

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator | None
    ) -> Draft:
        if k <= 0:
            return Draft.empty(self.name)
        logits = self._sync(tokens)
        if self._ckpt is not None and k > 1:  # its drafts will enter the state: save first
            t0 = time.perf_counter()
            self._ckpt.save(self.llm)
            self._ckpt_at = len(self._kv)
            self._rollback_ms += (time.perf_counter() - t0) * 1e3
            self._rollback_bytes += self._ckpt.nbytes
        out: list[int] = []
        probs: list[np.ndarray] = []
        cut = JointCut(self.p_min, self.p_joint)
        for i in range(k):
            if sampling.greedy:
                tok = int(np.argmax(logits))
                if cut.active and cut.stop(top_prob(logits)):
                    break
            else:
                q = process_logits(logits, sampling)
                if cut.active and cut.stop(float(q.max())):
                    break
                assert rng is not None, "sampling needs the engine's rng"
                tok = sample(q, rng)
                probs.append(q)
            out.append(tok)
            if i + 1 < k:  # the last draft token needs no forward pass of its own
                logits = self.llm.decode([tok], len(self._kv), logits="last")[0]
                self._kv.append(tok)
        return Draft(out, np.stack(probs) if probs else None, self.name, prep_ms=self._prep_ms)

    def take_rollback(self) -> tuple[float, int]:
        """(ms, bytes) spent on checkpoints and replays since the last call."""
        out = (self._rollback_ms, self._rollback_bytes)
        self._rollback_ms, self._rollback_bytes = 0.0, 0
        return out

    def prefill(self, tokens: Sequence[int]) -> None:
        # All but the last token: the first propose() decodes that one for its logits.
        # Not a measure of catch-up cost: the first prefill of a process also faults the
        # weights in (several times slower per token), and a prompt batch is bigger.
        self.llm.prefill_prompt(tokens[:-1])  # the same prompt again reuses its rows
        self._kv[:] = tokens[:-1]
        self._committed = len(self._kv)

    def reset(self) -> None:
        # A KV cache keeps its rows: the next prefill (or sync) reuses what still matches.
        # A recurrent state cannot be cut back to a prefix, so it starts over.
        if self._ckpt is not None:
            self.llm.clear()
        self._kv[:] = self.llm.rows
        self._committed = 0
        self._ckpt_at = -1

    def forget(self) -> None:
        pass  # a draft model keeps nothing across prompts

    def set_cut(self, p_joint: float) -> None:
        self.p_joint = p_joint

    def close(self) -> None:
        self.llm.close()


class JointCut:
    """Where a draft model stops drafting on its own doubt, inside the K it was given.

    p_min (llama.cpp's --draft-p-min): before a token whose top probability is below it.
    p_joint: before the token that takes the product of the draft's top probabilities
    in this draft below it; the first token is always drafted. The product is the
    draft model's own estimate that its whole draft so far survives verification: past
    the point where it expects to be wrong, a longer draft mostly buys rejected tokens
    (draft decodes, and a bigger verify batch on a CPU). A long K still pays where the
    draft is sure: whatif over 9 texts put fixed K=16 12-36% faster with p_joint 0.1
    and never cost a fixed K more than 2% (benchmarks/results/draft-p-joint-*.txt).
    Deciding on token j costs its logits: a cut draft pays one decode it does not use."""

    __slots__ = ("p_min", "p_joint", "joint", "drafted")

    def __init__(self, p_min: float, p_joint: float):
        self.p_min, self.p_joint = p_min, p_joint
        self.joint = 1.0
        self.drafted = 0

    @property
    def active(self) -> bool:
        return self.p_min > 0 or self.p_joint > 0

    def stop(self, p: float) -> bool:
        """Whether to stop before the next token, whose top probability is p."""
        if self.p_min > 0 and p < self.p_min:
            return True
        self.joint *= p
        if self.drafted > 0 and self.p_joint > 0 and self.joint < self.p_joint:
            return True
        self.drafted += 1
        return False


def top_prob(logits: np.ndarray) -> float:
    """Probability of the argmax. exp in the logits' float32 and the sum in float64: 0.3 ms
    over a 152k vocabulary where an all-float64 exp took 1 ms, and the joint cut asks for it
    at every drafted token (a draft decode of the 0.5B costs ~30 ms here)."""
    m = logits.max()
    return 1.0 / float(np.exp(logits - m).sum(dtype=np.float64))


def common_prefix(kv: Sequence[int], tokens: Sequence[int], start: int) -> int:
    """How many leading tokens a draft model's cache `kv` shares with the committed
    `tokens`. Fast path: `start`, the committed length at the last sync, is a known
    common prefix unless the run changed under it (a new prompt)."""
    n, limit = 0, min(len(kv), len(tokens))
    if start <= limit and (start == 0 or kv[start - 1] == tokens[start - 1]):
        n = start
    while n < limit and kv[n] == tokens[n]:
        n += 1
    return n
