"""Edit-following copy: draft the source the answer is copying, with the edits the answer
has made to it so far applied to the rest.

A code edit's answer is mostly its input, changed in a few places, and a rename changes
it at every occurrence. A plain copy (lookup, suffix) breaks at each one: at `tmp` the
source says `tmp`, the answer says `accumulator`, and the copy is rejected there and
again after every later `tmp`. This drafter follows the answer through the source with a
pointer, and when the answer leaves the source and comes back to it a little later, it
reads what was replaced (the source's tokens between the two points) and by what (the
answer's), and applies the same replacement to the rest of the source. The draft then
continues through the next `tmp` as `accumulator`.

    source  ... total = tmp + x ... return tmp ...
    answer  ... total = accumulator + x ... return |          <- the pointer is here
    draft                                          accumulator ...

How it reads an edit. The pointer moves with each committed token the source predicted.
At the first token it did not, the break point is kept (answer position, source position).
Once the answer's last `min_match` tokens occur again in the source at or after the break,
the two spans between the break and the match are the edit: source[s0:s1] was replaced by
answer[a0:a1] (trimmed of a shared tail). A replacement of up to `max_span` tokens on either
side is applied to the rest of the source; an insertion (nothing replaced: a new argument)
or a deletion (nothing put in its place) is applied with the `context` tokens before it,
so it is repeated only after the same tokens (`fetch_page(` -> `fetch_page(session, `).
Replacing token sequences catches every later occurrence the tokenizer writes the same way
(` tmp` after a space, most of them in code); one written otherwise is still broken at.

Exact as every drafter: it only proposes, the target verifies. It drafts only once an edit
is known; until then lookup and suffix copy the same text. State is per prompt (reset).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.drafters.lookup import TokenMirror
from specdash.engine.drafters.suffix import common_suffix
from specdash.engine.settings import SamplingParams
from specdash.contract.errors import SpecdashError

# How far back a match is counted as evidence (adaptive K buckets copies by it).
_EVIDENCE_CAP = 32


def replace_all(tokens: list[int], old: Sequence[int], new: Sequence[int], start: int = 0) -> list[int]:
    """`tokens` with every occurrence of `old` at or after `start` replaced by `new`."""
    old, new = list(old), list(new)
    n = len(old)
    if not n:
        return list(tokens)
    out = list(tokens[:start])
    i, first = start, old[0]
    while i < len(tokens):
        if tokens[i] == first and tokens[i:i + n] == old:
            out.extend(new)
            i += n
        else:
            out.append(tokens[i])
            i += 1
    return out


class EditCopyDrafter:
    name = "edit"
    label = "edit"
    free = True
    relative_cost: float | None = 0.0
    k_ceiling = False

    def __init__(self, min_match: int = 3, max_span: int = 16, context: int = 2):
        if min_match < 1 or max_span < 1 or context < 1:
            raise SpecdashError(f"edit copy min_match={min_match} max_span={max_span} context={context} refused: "
                                "all must be >= 1")
        self.min_match = min_match
        self.max_span = max_span
        self.context = context
        self._mirror = TokenMirror()
        self._start()

    def _start(self) -> None:
        self._prompt_len: int | None = None
        self._source: list[int] = []  # the prompt, the edits learned applied past where each was read
        self._index: dict[tuple[int, ...], list[int]] = {}  # min_match-gram -> source positions after it
        self._at: int | None = None  # source position the answer's end is aligned with
        self._run = 0  # answer tokens that followed the source since it was last aligned
        self._seen = 0  # committed tokens examined
        self._break: tuple[int, int] | None = None  # (answer, source) positions where it left the source
        self.edits: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (replaced, by), in order

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def _reindex(self) -> None:
        m, src = self.min_match, self._source
        index: dict[tuple[int, ...], list[int]] = {}
        for end in range(m, len(src) + 1):
            index.setdefault(tuple(src[end - m:end]), []).append(end)
        self._index = index

    def _follow(self, toks: list[int]) -> None:
        """Move the pointer over the tokens committed since the last call."""
        src = self._source
        for i in range(self._seen, len(toks)):
            if self._at is None:
                break
            if self._at < len(src) and src[self._at] == toks[i]:
                self._at += 1
                self._run += 1
            else:
                self._break = (i, self._at)
                self._at, self._run = None, 0
        self._seen = len(toks)

    def _realign(self, toks: list[int]) -> None:
        """Find the answer's end in the source again, and read the edit that parted them."""
        m = self.min_match
        if len(toks) - (self._prompt_len or 0) < m:
            return
        ends = self._index.get(tuple(toks[-m:]))
        if not ends:
            return
        if self._break is not None:
            a0, s0 = self._break
            near = [e for e in ends if 0 <= e - m - s0 <= self.max_span]
            if near:  # back after an edit: the nearest place past where it left
                end = near[0]
                self._learn(toks, end)
            elif len(toks) - a0 <= 2 * self.max_span:
                # Still inside what may be an edit: a match elsewhere (`(session, url` also
                # in another def) would lose where it left. Wait for the source near it.
                return
            else:  # not an edit: the answer went elsewhere
                self._break = None
        if self._break is None:  # a first alignment, or a new place: the longest match (the latest of equals)
            end = max(ends[-16:], key=lambda e: (self._reach(toks, e), e))
        self._at, self._run, self._break = end, self._reach(toks, end), None

    def _reach(self, toks: list[int], end: int) -> int:
        """How far back the answer's end matches the source before `end` (the evidence
        behind a copy from there), from min_match up to _EVIDENCE_CAP."""
        return common_suffix(self._source, end, toks, len(toks), self.min_match,
                             max(self.min_match, min(_EVIDENCE_CAP, end, len(toks))))

    def _learn(self, toks: list[int], end: int) -> None:
        assert self._break is not None
        a0, s0 = self._break
        a1, s1 = len(toks) - self.min_match, end - self.min_match
        src = self._source
        while a1 > a0 and s1 > s0 and toks[a1 - 1] == src[s1 - 1]:  # a shared tail is no part of the edit
            a1, s1 = a1 - 1, s1 - 1
        if s0 == s1 or a0 == a1:
            # An insertion (a new argument) or a deletion: repeated only where the same
            # tokens come before it (`fetch_page(` -> `fetch_page(session, `), so the
            # edit carries the left context it was made in.
            c = self.context
            if s0 < c or a0 < c or src[s0 - c:s0] != toks[a0 - c:a0]:
                return
            s0, a0 = s0 - c, a0 - c
        old, new = tuple(src[s0:s1]), tuple(toks[a0:a1])
        if old == new or len(old) > self.max_span or len(new) > self.max_span:
            return  # a rewrite: followed, not repeated
        self.edits.append((old, new))
        self._source = replace_all(src, old, new, start=end)
        self._reindex()

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator | None
    ) -> Draft:
        if self._mirror.sync(tokens) or self._prompt_len is None:
            self._start()
            self._prompt_len = len(self._mirror.tokens)
            self._source = list(self._mirror.tokens)
            self._seen = self._prompt_len
            self._reindex()
        toks = self._mirror.tokens
        self._follow(toks)
        if self._at is None:
            self._realign(toks)
        if k <= 0 or self._at is None or not self.edits:
            return Draft.empty()
        draft = self._source[self._at:self._at + k]
        return Draft(draft, None, self.name, min(self._run, _EVIDENCE_CAP)) if draft else Draft.empty()

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        return 0.0  # k = 0 calls follow every step as it comes

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0

    def prefill(self, tokens: Sequence[int]) -> None:
        self.propose(tokens, 0, SamplingParams(), None)

    def reset(self) -> None:
        self._mirror.clear()
        self._start()

    def forget(self) -> None:
        self.reset()

    def set_cut(self, p_joint: float) -> None:
        pass

    def close(self) -> None:
        self.reset()
