"""The acceptance rules of speculative decoding, as pure functions on numpy arrays.

Greedy: accept the longest prefix of the draft that matches the target's argmax.
Sampling: the rejection rule of Leviathan et al. / Chen et al. (2023), which commits
tokens distributed exactly as the target alone would sample them, whatever the draft.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specdash.engine.settings import SamplingParams


def process_logits(logits: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    """Logits (n_vocab,) or (n, n_vocab) -> float64 probabilities after temperature, top-k,
    top-p. Target and draft must both go through this one function: the rejection rule
    keeps the target's distribution exact only if both sides are shaped the same way.
    Temperature comes first, as in HF transformers, vLLM and gpt-fast; llama.cpp scales
    last, so there the same top_p cuts the nucleus from the unscaled distribution."""
    if sampling.temperature <= 0:
        raise ValueError(f"temperature must be > 0 here (greedy has its own path), got {sampling.temperature}")
    if sampling.top_k < 0 or not 0 < sampling.top_p <= 1:
        raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1, got {sampling.top_k}, {sampling.top_p}")
    # One float64 copy, then everything in place: at 151,936 tokens, fresh arrays cost
    # more in page faults than the arithmetic done on them (~2 ms vs ~0.3 ms a row).
    probs = np.array(logits, dtype=np.float64)
    probs /= sampling.temperature
    for row in np.atleast_2d(probs):
        _to_probs_in_place(row, sampling.top_k, sampling.top_p)
    return probs


def keep_min_p(probs: np.ndarray, min_p: float) -> np.ndarray:
    """Rows of probabilities with every token below `min_p` times its row's most likely
    one removed, renormalized (in place; 0 does nothing). Applied to the target's rows, as
    the verify rule's distribution, it keeps speculation exact like any other shaping; here
    it comes after temperature, top-k and top-p (llama.cpp cuts on the unscaled logits)."""
    if min_p <= 0:
        return probs
    for row in np.atleast_2d(probs):
        row[row < row.max() * min_p] = 0.0
        row /= row.sum()
    return probs


def _to_probs_in_place(z: np.ndarray, top_k: int, top_p: float) -> None:
    z -= z.max()  # exp of values <= 0 cannot overflow
    np.exp(z, out=z)
    if 0 < top_k < z.size:
        # Cut on the weights, not the logits: exp is monotone, so the same k survive, and
        # exp(-inf) on masked logits runs ~7x slower than exp on finite ones. Tokens tied
        # with the k-th all stay, rather than picking among equals by position.
        z[z < _kth_largest(z, top_k)] = 0.0
    z /= z.sum()
    if top_p < 1:
        _keep_nucleus(z, top_p)


def _kth_largest(w: np.ndarray, k: int) -> float:
    # Partitioning all 151,936 weights costs ~1 ms. The k largest lie among the tokens
    # within a factor `ratio` of the max as soon as there are k of them, and real logits
    # put only tens to hundreds near the top: widen until there are k, partition those.
    ratio = 1e-4
    while (near := w[w >= w.max() * ratio]).size < k:
        ratio *= ratio  # doubles the log-gap; underflows to 0.0 (= every token) at worst
    return float(np.partition(near, near.size - k)[near.size - k])


def _keep_nucleus(w: np.ndarray, top_p: float) -> None:
    """Keeps the smallest set of most likely tokens whose mass reaches top_p, renormalized."""
    # Sorting all 151,936 tokens costs ~15 ms a row, so sort only candidates. Tokens below
    # (1 - top_p) / n of the max hold less than 1 - top_p together, so the rest hold more
    # than top_p; the nucleus is a prefix of the sorted order and therefore lies among them.
    cand = np.flatnonzero(w >= w.max() * (1 - top_p) / w.size)
    cand = cand[np.argsort(-w[cand], kind="stable")]
    mass = np.cumsum(w[cand])
    kept = cand[: min(int(np.searchsorted(mass, top_p)) + 1, cand.size)]
    renormalized = w[kept] / mass[kept.size - 1]
    w[:] = 0.0
    w[kept] = renormalized


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token by inverse CDF. The row need not sum exactly to 1 (residuals don't)."""
    cdf = np.cumsum(probs, dtype=np.float64)
    # side="right" never lands on a zero-probability token (its cdf step has zero width),
    # and u * total < total for every float u < 1, so the search never runs off the end.
    return int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))


def verify_greedy(target_argmax: np.ndarray, draft_tokens: Sequence[int]) -> tuple[int, int]:
    """target_argmax[i] is the target's choice after batch position i (K+1 entries).
    Returns (n_accepted, next_token): the correction, or the bonus token if all matched."""
    if len(target_argmax) < len(draft_tokens) + 1:
        raise ValueError(f"need {len(draft_tokens) + 1} target positions, got {len(target_argmax)}")
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == target_argmax[n]:
        n += 1
    return n, int(target_argmax[n])


def verify_sampling(
    target_probs: np.ndarray,
    draft_tokens: Sequence[int],
    draft_probs: np.ndarray | None,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Rejection sampling over one batch. target_probs: (K+1, n_vocab) processed target
    distributions p_i; draft_probs: (K, n_vocab) draft distributions q_i, or None when the
    drafter has none (lookup, suffix), which means q_i is one-hot on the drafted token.
    Returns (n_accepted, next_token)."""
    k = len(draft_tokens)
    if target_probs.shape[0] < k + 1 or (draft_probs is not None and draft_probs.shape[0] != k):
        raise ValueError(
            f"{k} draft tokens need {k + 1} target rows and {k} draft rows, got "
            f"{target_probs.shape[0]} and {None if draft_probs is None else draft_probs.shape[0]}"
        )
    u = rng.random(k)
    for i, d in enumerate(draft_tokens):
        p, q = target_probs[i, d], 1.0 if draft_probs is None else draft_probs[i, d]
        # u < p/q accepts with probability min(1, p/q); written as u*q < p to skip the
        # division. q == 0 means the drafter misreported its distribution: reject.
        if q > 0 and u[i] * q < p:
            continue
        # The accept step already produced each token t with probability min(p(t), q(t));
        # the residual max(0, p - q) is exactly the missing mass p(t) - min(p(t), q(t)), so
        # accepted-or-resampled tokens together are distributed as p.
        if draft_probs is None:
            residual = target_probs[i].copy()
            residual[d] = 0.0  # max(0, p - onehot) is p with the drafted token removed
        else:
            residual = np.maximum(target_probs[i] - draft_probs[i], 0.0)
        # An all-zero residual means p <= q everywhere, i.e. p == q, where rejection has
        # probability 0; sampling p is the right answer if rounding gets us here anyway.
        return i, sample(residual if residual.sum() > 0 else target_probs[i], rng)
    return k, sample(target_probs[k], rng)  # all accepted: the bonus token comes free
