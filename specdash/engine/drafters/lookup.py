"""Prompt lookup: draft what followed the current n-gram earlier in the sequence, when
the n-gram's history supports it (llama.cpp's `lookup` and its n-gram cache rule).

Also holds `TokenMirror`, the incremental copy of the committed sequence that every
model-free drafter keeps so a step costs O(new tokens) instead of O(context).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.settings import SamplingParams
from specdash.contract.errors import SpecdashError

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


# llama.cpp's n-gram cache thresholds (common/ngram-cache.cpp, the "lax" set it uses for
# the context cache): a continuation is drafted from an n-gram of size n only when the
# n-gram was seen at least MIN_SAMPLES[n] times and that continuation followed it at
# least MIN_SHARE[n] of them. Short n-grams need more support: after one token almost
# anything can follow, after four the text is usually being copied. Sizes past 4 use
# the 4-gram's thresholds.
MIN_SAMPLES = {1: 2, 2: 2, 3: 1, 4: 1}
MIN_SHARE = {1: 0.66, 2: 0.50, 3: 0.50, 4: 0.50}


class PromptLookupDrafter:
    """Drafts token by token from n-gram statistics of the sequence so far (prompt and
    output), llama.cpp's `lookup` rule: for the next token, the longest n-gram
    (max_ngram down to min_ngram) whose continuations have enough support (MIN_SAMPLES,
    MIN_SHARE) gives its most frequent continuation; the draft grows by that token and
    the rule runs again on the extended sequence; it stops at the first token nothing
    supports. So on prose, where a short n-gram is followed by many things, it drafts
    nothing instead of a wasted batch; on a copy it drafts the whole copy.

    One size shorter than min_ngram (a 1-gram by default) may add one last token and
    end the draft: a guess, not a copy. llama.cpp chains 1-grams like any n-gram; that
    accepts more (llama-lookup, json-extraction: 42 tokens to our 35) but drafts long
    runs that are rejected; as one last token it keeps most of the gain for little
    verify (benchmarks/results/lookup-one-gram-guess.txt).

    Index: n-gram tuple -> {next token: count}, plus the start of its latest occurrence
    (for `evidence`: how long the match behind the draft is, which adaptive K judges
    copies by). Appending a token updates (max_ngram - min_ngram + 2) entries: O(new
    tokens) per step.
    """

    name = "lookup"
    label = "lookup"
    free = True
    relative_cost: float | None = 0.0
    k_ceiling = False

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def __init__(self, min_ngram: int = 2, max_ngram: int = 4):
        if not 1 <= min_ngram <= max_ngram:
            raise SpecdashError(
                f"lookup n-gram sizes min={min_ngram} max={max_ngram} refused: "
                "need 1 <= lookup_min_ngram <= lookup_max_ngram"
            )
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._guess_ngram = max(1, min_ngram - 1)  # the shortest size indexed: it may only guess
        self._mirror = TokenMirror()
        self._last_start: dict[tuple[int, ...], int] = {}
        self._counts: dict[tuple[int, ...], dict[int, int]] = {}
        self._indexed = 0  # n-grams ending before this position have been indexed

    def _index_to(self, end: int) -> None:
        # An n-gram [s, s+n) is indexed once its continuation token s+n exists, so the
        # n-gram at the very end of the sequence never matches itself.
        toks, last, counts = self._mirror.tokens, self._last_start, self._counts
        for j in range(max(self._indexed, 1), end):
            nxt = toks[j]
            for n in range(self._guess_ngram, min(self.max_ngram, j) + 1):
                key = tuple(toks[j - n : j])
                last[key] = j - n
                follow = counts.get(key)
                if follow is None:
                    counts[key] = {nxt: 1}
                else:
                    follow[nxt] = follow.get(nxt, 0) + 1
        self._indexed = max(self._indexed, end)

    def _vote(self, context: list[int]) -> tuple[int, int] | None:
        """(token, n-gram size) the statistics support after `context`, or None."""
        for n in range(min(self.max_ngram, len(context)), self._guess_ngram - 1, -1):
            follow = self._counts.get(tuple(context[-n:]))
            if not follow:
                continue
            total = sum(follow.values())
            token, count = max(follow.items(), key=lambda kv: kv[1])
            size = min(n, 4)
            if total >= MIN_SAMPLES[size] and count >= MIN_SHARE[size] * total:
                return token, n
        return None

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator | None
    ) -> Draft:
        if self._mirror.sync(tokens):
            self._last_start.clear()
            self._counts.clear()
            self._indexed = 0
        toks = self._mirror.tokens
        self._index_to(len(toks))
        if k <= 0:
            return Draft.empty()
        context = toks[-self.max_ngram:]
        draft: list[int] = []
        first_n = 0
        while len(draft) < k:
            vote = self._vote(context)
            if vote is None:
                break
            token, n = vote
            first_n = first_n or n
            draft.append(token)
            if n < self.min_ngram:
                break  # a guess ends the draft
            context = context[1:] + [token] if len(context) >= self.max_ngram else context + [token]
        if not draft:
            return Draft.empty()
        return Draft(draft, None, self.name, self._evidence(first_n))

    def _evidence(self, n: int) -> int:
        """How long the match behind the draft is: the matched n-gram, extended backwards
        over its latest earlier occurrence (up to _EVIDENCE_CAP)."""
        toks = self._mirror.tokens
        end = len(toks)
        start = self._last_start.get(tuple(toks[end - n :]))
        if start is None:
            return n
        return _match_length(toks, start + n, end, n)

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        return 0.0  # k = 0 calls index every step as it comes: nothing is ever owed

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0

    def prefill(self, tokens: Sequence[int]) -> None:
        self.propose(tokens, 0, SamplingParams(), None)  # k = 0: index, don't draft

    def reset(self) -> None:
        self._mirror.clear()
        self._last_start.clear()
        self._counts.clear()
        self._indexed = 0

    def forget(self) -> None:
        self.reset()  # all its memory is the current sequence

    def set_cut(self, p_joint: float) -> None:
        pass  # a copy has no confidence of its own to cut by

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
