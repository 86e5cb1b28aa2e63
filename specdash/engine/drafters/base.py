"""The one small interface every draft source implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from specdash.engine.settings import SamplingParams


@dataclass(slots=True)
class Draft:
    tokens: list[int]
    # Row i is the draft distribution q the i-th token was sampled from (n_vocab floats),
    # or None for sources without probabilities (lookup, suffix): verify then treats q as
    # one-hot on the drafted token, which keeps rejection sampling exact.
    probs: np.ndarray | None
    source: str  # which source produced it ("draft", "lookup", "suffix", ...)

    @staticmethod
    def empty(source: str = "none") -> "Draft":
        return Draft([], None, source)


class Drafter(Protocol):
    name: str

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        """Propose up to k tokens continuing `tokens` (the whole committed sequence,
        prompt + generated so far). A drafter with state (a draft model's KV cache, an
        n-gram index) brings itself in step with `tokens` here, rolling back whatever
        the target rejected since the last call."""
        ...

    def prefill(self, tokens: Sequence[int]) -> None:
        """Called once per prompt, inside the engine's prefill phase: index the prompt or
        fill a draft model's KV cache, so the first step is not charged for it."""
        ...

    def reset(self) -> None:
        """A new prompt starts: forget per-sequence state (keep cross-prompt memory)."""
        ...

    def close(self) -> None:
        """Free native resources (model, context)."""
        ...


class NoDrafter:
    """K=0 everywhere: plain decoding through the same loop."""

    name = "none"

    def propose(self, tokens, k, sampling, rng) -> Draft:
        return Draft.empty()

    def prefill(self, tokens) -> None:
        pass

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


class Borrowed:
    """A drafter lent by its owner (the session): closing the loan leaves it open, so a
    loaded draft model or a suffix drafter's memory survives drafter swaps."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.name = inner.name
        self.label = getattr(inner, "label", inner.name)

    def propose(self, tokens, k, sampling, rng) -> Draft:
        return self.inner.propose(tokens, k, sampling, rng)

    def prefill(self, tokens) -> None:
        self.inner.prefill(tokens)

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        pass
