"""Prompt lookup: draft by copying what followed the last earlier occurrence of the
current n-gram (llama.cpp's `lookup`, vLLM's `ngram` proposer).

Also holds `TokenMirror`, the incremental copy of the committed sequence that every
model-free drafter keeps so a step costs O(new tokens) instead of O(context).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.settings import SamplingParams
from specdash.errors import SpecdashError

# How many tokens at each end of the mirrored sequence are compared to decide that a
# new `tokens` argument extends it. A full comparison would cost O(context) per step;
# the engine calls reset() on every new prompt, so this only has to catch rollbacks and
# a new prompt that arrives without reset().
_PROBE = 8


class TokenMirror:
    """The drafter's own copy of the committed sequence, grown step by step."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def extends(self, tokens: Sequence[int]) -> bool:
        """Whether `tokens` is the copy plus zero or more new tokens, judged by the first
        and last _PROBE tokens of the copy."""
        seen = self.tokens
        n = len(seen)
        return len(tokens) >= n and (
            n == 0
            or (
                [int(t) for t in tokens[: min(_PROBE, n)]] == seen[:_PROBE]
                and [int(t) for t in tokens[max(0, n - _PROBE) : n]] == seen[-_PROBE:]
            )
        )

    def sync(self, tokens: Sequence[int]) -> bool:
        """Bring the copy in step with `tokens`. Returns True when `tokens` did not extend
        the copy: the copy is then a new list and the caller must rebuild its index."""
        if self.extends(tokens):
            self.tokens.extend(int(t) for t in tokens[len(self.tokens) :])
            return False
        self.tokens = [int(t) for t in tokens]
        return True

    def clear(self) -> None:
        self.tokens = []


class PromptLookupDrafter:
    """Longest n-gram first (max_ngram down to min_ngram); the most recent earlier
    occurrence wins; its continuation (up to k tokens) is the draft.

    Index: one dict, n-gram tuple -> start of its latest occurrence that already has a
    following token. Appending a token adds (max_ngram - min_ngram + 1) entries, and a
    proposal is that many dict lookups plus a k-token slice: O(new tokens) per step.
    """

    name = "lookup"
    label = "lookup"
    free = True

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4):
        if not 1 <= min_ngram <= max_ngram:
            raise SpecdashError(
                f"lookup n-gram sizes min={min_ngram} max={max_ngram} refused: "
                "need 1 <= lookup_min_ngram <= lookup_max_ngram"
            )
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._mirror = TokenMirror()
        self._last_start: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position have been indexed

    def _index_to(self, end: int) -> None:
        # An n-gram [s, s+n) is indexed once its continuation token s+n exists, so the
        # n-gram at the very end of the sequence never matches itself.
        toks, last = self._mirror.tokens, self._last_start
        for j in range(max(self._indexed, 1), end):
            for n in range(self.min_ngram, min(self.max_ngram, j) + 1):
                last[tuple(toks[j - n : j])] = j - n
        self._indexed = max(self._indexed, end)

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator | None
    ) -> Draft:
        if self._mirror.sync(tokens):
            self._last_start.clear()
            self._indexed = 0
        toks = self._mirror.tokens
        self._index_to(len(toks))
        if k <= 0:
            return Draft.empty()
        end = len(toks)
        for n in range(min(self.max_ngram, end - 1), self.min_ngram - 1, -1):
            start = self._last_start.get(tuple(toks[end - n :]))
            if start is not None:
                return Draft(toks[start + n : start + n + k], None, self.name, _match_length(toks, start + n, end, n))
        return Draft.empty()

    def prefill(self, tokens: Sequence[int]) -> None:
        self.propose(tokens, 0, SamplingParams(), None)  # k = 0: index, don't draft

    def reset(self) -> None:
        self._mirror.clear()
        self._last_start.clear()
        self._indexed = 0

    def forget(self) -> None:
        self.reset()  # all its memory is the current sequence

    def close(self) -> None:
        self.reset()


# How far back a lookup match is measured: past this, a longer match says little more.
_EVIDENCE_CAP = 32


def _match_length(toks: list[int], a: int, b: int, known: int) -> int:
    """How many tokens before position a equal those before position b (a < b), given
    that the last `known` do: the n-gram matched, extended backwards up to _EVIDENCE_CAP.
    O(_EVIDENCE_CAP) per proposal."""
    n = known
    while n < _EVIDENCE_CAP and n < a and toks[a - n - 1] == toks[b - n - 1]:
        n += 1
    return n
