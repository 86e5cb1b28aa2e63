"""A chain of draft sources: the first that has something to say drafts this step."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.settings import SamplingParams


class ChainDrafter:
    """Asks its sources in order (typically lookup, suffix, draft model): cheap exact
    copies first, the draft model only when they find nothing. The first non-empty
    draft wins and keeps its source's name.

    Every source still sees every step's tokens: those not asked to draft get a k = 0
    call, which means "look, do not draft" (model-free sources index the new tokens in
    O(new tokens); a draft model returns at once and catches up when next asked). So the
    suffix drafter remembers whole answers even when lookup drafted all of them."""

    name = "chain"
    # Not free as a whole (it may hold a draft model); adaptive mode judges each source
    # on its own (engine/adaptive_draft.py) through `sources`.
    free = False
    relative_cost: float | None = None  # judged per part
    k_ceiling = False  # judged per part

    def __init__(self, sources: Sequence[Drafter]):
        if not sources:
            raise ValueError("ChainDrafter needs at least one source")
        self.sources = list(sources)
        self.label = "chain: " + " → ".join(s.label for s in self.sources)

    def parts(self) -> Sequence[Drafter]:
        return self.sources

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator | None
    ) -> Draft:
        draft = Draft.empty()
        for source in self.sources:
            if draft.tokens or k <= 0:
                source.propose(tokens, 0, sampling, rng)
            else:
                draft = source.propose(tokens, k, sampling, rng)
        return draft if draft.tokens else Draft.empty()

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        """The most the next propose() can spend before a draft: every source's catch-up
        (only a draft model owes any, and pays it only when the sources before it find
        nothing to copy)."""
        return sum(source.catch_up_ms(tokens) for source in self.sources)

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return sum(source.unpriced_catch_up(tokens) for source in self.sources)

    def prefill(self, tokens: Sequence[int]) -> None:
        for source in self.sources:
            source.prefill(tokens)

    def reset(self) -> None:
        for source in self.sources:
            source.reset()

    def forget(self) -> None:
        for source in self.sources:
            source.forget()

    def set_cut(self, p_joint: float) -> None:
        for source in self.sources:
            source.set_cut(p_joint)

    def close(self) -> None:
        for source in self.sources:
            source.close()
