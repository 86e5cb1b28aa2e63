"""Suffix drafting (the idea of SuffixDecoding, arXiv 2411.04975): match the longest
suffix of the current sequence against the current prompt + output AND against this
session's earlier outputs, then follow the most frequent continuation for as long as
its estimated probability stays above a floor.

Structure. Instead of a suffix tree, each token sequence ("corpus") keeps, for a few
anchor lengths n (1, 2, 4, 8, 16), a hash index: hash of the n tokens before position
p -> every such p (in order). The occurrences of the current suffix are found through
the longest anchor that has any; their exact match lengths (up to `max_depth`) are
measured by binary search on slice equality; the occurrences with the longest match
form the "node" of a suffix tree, and walking it forward by majority vote gives the
same counts a suffix tree's children would (count(child) / count(node)).

Cost. Appending a token: one hash + list append per anchor length -> O(1) (about 2 us).
A proposal: one dict lookup per anchor length per corpus, at most `max_candidates`
match measurements of O(log max_depth) slice compares each, then k rounds of a vote
over the surviving occurrences -> O(max_candidates * (log max_depth + k)), independent
of the context length. Memory: O(tokens * anchors) ints, bounded across prompts by
`max_tokens` / `max_sequences`. Only the most recent `max_candidates` occurrences of an
anchor are examined, so with very frequent anchors the match is the longest among the
recent ones (a recency bias SuffixDecoding does not have; it rarely matters since the
longer anchors are rare).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.drafters.lookup import TokenMirror
from specdash.engine.settings import SamplingParams
from specdash.contract.errors import SpecdashError

_ANCHORS = (16, 8, 4, 2, 1)  # longest first: the first that hits bounds the best match


class _Corpus:
    """One token sequence with its anchor indexes (positions are continuation indexes:
    position p is listed under the hash of tokens[p-n:p])."""

    __slots__ = ("_indexed", "index", "tokens")

    def __init__(self, tokens: list[int] | None = None) -> None:
        self.tokens: list[int] = tokens if tokens is not None else []
        self.index: dict[int, dict[int, list[int]]] = {n: {} for n in _ANCHORS}
        self._indexed = 0
        self.index_to(len(self.tokens))

    def index_to(self, end: int) -> None:
        toks = self.tokens
        for p in range(max(self._indexed, 1), end):
            for n in _ANCHORS:
                if n <= p:
                    self.index[n].setdefault(hash(tuple(toks[p - n : p])), []).append(p)
        self._indexed = max(self._indexed, end)


def common_suffix(a: list[int], pa: int, b: list[int], pb: int, lo: int, hi: int) -> int:
    """Length of the common suffix of a[:pa] and b[:pb], known to be >= lo, capped at hi."""
    while lo < hi:  # equality of the last m tokens is monotone in m: binary search
        mid = (lo + hi + 1) // 2
        if a[pa - mid : pa] == b[pb - mid : pb]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class SuffixHistory:
    """Earlier sequences (prompt tail + output), oldest first, bounded by `max_sequences` and
    `max_tokens`. One drafter owns one; a batched server's sequences share the session's,
    so an answer given in a batch is remembered as one given alone (engine/batch/slot.py)."""

    __slots__ = ("corpora", "max_sequences", "max_tokens", "tokens")

    def __init__(self, max_sequences: int = 64, max_tokens: int = 32768) -> None:
        if max_sequences < 0 or max_tokens < 0:
            raise SpecdashError(
                f"suffix drafter max_sequences={max_sequences} max_tokens={max_tokens} "
                "refused: both must be >= 0"
            )
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.corpora: deque[_Corpus] = deque()
        self.tokens = 0

    def add(self, tokens: list[int]) -> None:
        kept = tokens[-self.max_tokens :] if self.max_tokens else []
        if not kept or not self.max_sequences:
            return
        self.corpora.append(_Corpus(kept))
        self.tokens += len(kept)
        while self.corpora and (len(self.corpora) > self.max_sequences or self.tokens > self.max_tokens):
            self.tokens -= len(self.corpora.popleft().tokens)

    def clear(self) -> None:
        self.corpora.clear()
        self.tokens = 0


class SuffixDrafter:
    """Drafts from the longest suffix match over the current sequence and earlier outputs.

    `alpha`: the draft may be at most alpha * match length tokens (a long match is
    evidence of a long copy). `min_prob`: stop when the product of count(child) /
    count(node) along the drafted path drops below it. Earlier sequences are kept across
    reset() (that is the point: repeated work across prompts gets cheaper): each keeps the
    last `max_depth` prompt tokens, so its output can be matched from its very first
    token, plus the whole output; the oldest are dropped beyond `max_sequences` or
    `max_tokens` tokens.
    """

    name = "suffix"
    label = "suffix"
    free = True
    relative_cost: float | None = 0.0
    k_ceiling = False

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def __init__(
        self,
        max_depth: int = 32,
        alpha: float = 1.0,
        min_prob: float = 0.1,
        max_candidates: int = 64,
        max_sequences: int = 64,
        max_tokens: int = 32768,
        history: SuffixHistory | None = None,
    ):
        if max_depth < 1 or alpha <= 0 or not 0 <= min_prob <= 1 or max_candidates < 1:
            raise SpecdashError(
                f"suffix drafter max_depth={max_depth} alpha={alpha} min_prob={min_prob} "
                f"max_candidates={max_candidates} refused: need max_depth >= 1, alpha > 0, "
                "0 <= min_prob <= 1, max_candidates >= 1"
            )
        self.max_depth = max_depth
        self.alpha = alpha
        self.min_prob = min_prob
        self.max_candidates = max_candidates
        # Earlier sequences: its own, or one shared with other drafters (a batch's).
        self.history = history if history is not None else SuffixHistory(max_sequences, max_tokens)
        self._mirror = TokenMirror()
        self._local = _Corpus(self._mirror.tokens)
        # Length of the first sequence seen after reset: where the prompt ended, as long
        # as the caller shows the drafter every step (a k = 0 call on plain steps).
        self._prompt_len: int | None = None
        self._caller_tokens: Sequence[int] | None = None  # the last `tokens` argument

    # --- memory across prompts ----------------------------------------------------------
    def _archive(self) -> None:
        """Move the current sequence (prompt tail + output) into the session history."""
        # The answer's last step was committed after the last call; a caller that passes
        # its own growing list (the engine does) still holds it.
        if self._caller_tokens is not None and self._mirror.extends(self._caller_tokens):
            self._mirror.sync(self._caller_tokens)
        self._caller_tokens = None
        toks = self._mirror.tokens
        start = max(0, (self._prompt_len or 0) - self.max_depth)
        if self._prompt_len is not None and len(toks) > self._prompt_len:
            self.history.add(toks[start:])

    def _start(self) -> None:
        self._mirror.clear()
        self._local = _Corpus(self._mirror.tokens)
        self._prompt_len = None

    # --- drafting ---------------------------------------------------------------------
    def _candidates(self, cur: list[int]) -> tuple[int, list[tuple[list[int], int]]]:
        """(anchor length, occurrences (corpus tokens, continuation position)) for the
        longest anchor of `cur`'s suffix that occurs anywhere; most recent first."""
        end = len(cur)
        corpora = [self._local, *reversed(self.history.corpora)]
        for n in _ANCHORS:
            if n > end or n > self.max_depth:
                continue
            key = hash(tuple(cur[end - n :]))
            found: list[tuple[list[int], int]] = []
            for corpus in corpora:
                positions = corpus.index[n].get(key)
                if positions:
                    room = self.max_candidates - len(found)
                    found.extend((corpus.tokens, p) for p in reversed(positions[-room:]))
                    if len(found) >= self.max_candidates:
                        break
            if found:
                return n, found
        return 0, []

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator | None
    ) -> Draft:
        if not self._mirror.extends(tokens):  # a new sequence without reset()
            self._archive()
            self._start()
        self._caller_tokens = tokens
        self._mirror.sync(tokens)
        if self._prompt_len is None:
            self._prompt_len = len(self._mirror.tokens)
        cur = self._mirror.tokens
        self._local.index_to(len(cur))
        if k <= 0:
            return Draft.empty()

        anchor, found = self._candidates(cur)
        if not found:
            return Draft.empty()
        end = len(cur)
        occurrences: list[tuple[list[int], int]] = []
        best = 0
        for toks, p in found:
            if toks[p - anchor : p] != cur[end - anchor :]:
                continue  # hash collision
            m = common_suffix(toks, p, cur, end, anchor, min(self.max_depth, p, end))
            if m > best:
                best, occurrences = m, [(toks, p)]
            elif m == best:
                occurrences.append((toks, p))
        max_spec = min(k, int(self.alpha * best + 1e-9))

        draft: list[int] = []
        prob = 1.0
        while len(draft) < max_spec:
            counts: dict[int, int] = {}  # insertion order = recency: ties go to the newest
            for toks, p in occurrences:
                if p < len(toks):
                    counts[toks[p]] = counts.get(toks[p], 0) + 1
            if not counts:
                break
            tok, c = max(counts.items(), key=lambda kv: kv[1])
            prob *= c / sum(counts.values())
            if prob < self.min_prob:
                break
            draft.append(tok)
            occurrences = [(t, p + 1) for t, p in occurrences if p < len(t) and t[p] == tok]
        return Draft(draft, None, self.name, best) if draft else Draft.empty()

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        return 0.0  # k = 0 calls index every step as it comes: nothing is ever owed

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0

    def prefill(self, tokens: Sequence[int]) -> None:
        self.propose(tokens, 0, SamplingParams(), None)  # k = 0: index, don't draft

    def reset(self) -> None:
        self._archive()
        self._start()

    def set_cut(self, p_joint: float) -> None:
        pass  # a copy has no confidence of its own to cut by

    def drop(self) -> None:
        """End the current sequence without remembering it: another drafter sharing this
        history remembers it (a batch's request that ran alone, engine/batch/runner.py)."""
        self._caller_tokens = None
        self._start()

    def forget(self) -> None:
        """Drop every earlier sequence: the next prompt starts with no memory."""
        self.history.clear()
        self._caller_tokens = None
        self._start()

    def close(self) -> None:
        """Keeps the session history: the session owns this drafter across engines."""
        self._archive()
        self._start()
