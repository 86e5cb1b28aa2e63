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
    # How many tokens of context matched where a model-free source copied from (its
    # evidence: a 20-token match predicts a copy better than a 1-token one). 0 for a
    # draft model, whose evidence is its own probabilities.
    evidence: int = 0
    # Time spent catching up on tokens the source sat out (a draft model after a stretch
    # of plain steps): a cost of having paused, not of drafting these tokens.
    prep_ms: float = 0.0
    # Time spent translating between vocabularies (a draft model with another vocabulary:
    # text to its tokens and back), part of this draft's cost; 0 for every other source.
    translate_ms: float = 0.0

    @staticmethod
    def empty(source: str = "none") -> Draft:
        return Draft([], None, source)

    def cut(self, n: int) -> Draft:
        """The first n tokens (a controller verifies only what it expects to pay)."""
        if n >= len(self.tokens):
            return self
        probs = None if self.probs is None else self.probs[:n]
        return Draft(self.tokens[:n], probs, self.source, self.evidence, self.prep_ms, self.translate_ms)


class Drafter(Protocol):
    """llama.cpp's common_speculative in Python: the kind of source is hidden behind
    these few calls, so the engine and the adaptive controller never ask what it is."""

    name: str  # the kind: "draft" (a model), "lookup", "suffix", "chain", "none"
    label: str  # what the operator sees: the model's name, "lookup", "chain: lookup → suffix → X"
    # True when proposing costs next to nothing (lookup, suffix): the adaptive engine then
    # asks for the longest draft and lets the controller cut it, instead of choosing K first.
    free: bool
    # A drafted token's predicted cost relative to one target step (a draft model: its
    # size over the target's), for pricing a probe before paying it; None = unknown.
    relative_cost: float | None

    @property
    def k_ceiling(self) -> bool:
        """True when K is only a ceiling: the drafter ends drafts it doubts on its own (a
        draft model with the joint confidence cut), so a bigger K costs less than K
        drafted tokens. Adaptive K then leans to the bigger K (controller.price_draft)."""
        ...

    def parts(self) -> Sequence[Drafter]:
        """The sources adaptive mode judges one by one: a chain's members, else [self]."""
        ...

    def propose(
        self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator | None
    ) -> Draft:
        """Propose up to k tokens continuing `tokens` (the whole committed sequence,
        prompt + generated so far). A drafter with state (a draft model's KV cache, an
        n-gram index) brings itself in step with `tokens` here, rolling back whatever
        the target rejected since the last call. k = 0 means "look, do not draft"."""
        ...

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        """Predicted ms the next propose(tokens, k > 0) spends before it drafts anything:
        a draft model's catch-up on tokens committed while it sat out. Adaptive K adds it
        to the price of drafting now (controller.choose). 0 for stateless sources (lookup,
        suffix, none), whose k = 0 calls keep them in step at no cost."""
        ...

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        """Tokens the next propose(tokens, k > 0) would feed that catch_up_ms cannot price
        yet: a model's backlog before it measured a catch-up of its own (auto prefills its
        model lazily, so its first catch-up is the whole prompt). Adaptive K estimates
        those (controller.catch_up_estimate). 0 once measured, and for copy sources."""
        ...

    def prefill(self, tokens: Sequence[int]) -> None:
        """Called once per prompt, inside the engine's prefill phase: index the prompt or
        fill a draft model's KV cache, so the first step is not charged for it."""
        ...

    def reset(self) -> None:
        """A new prompt starts: forget per-sequence state (keep cross-prompt memory)."""
        ...

    def forget(self) -> None:
        """Forget cross-prompt memory too (the suffix drafter's earlier outputs): a cold start."""
        ...

    def set_cut(self, p_joint: float) -> None:
        """The joint confidence cut (settings.draft_p_joint) from the next draft on: a draft
        model's, each of a chain's draft models'; model-free sources have none to set."""
        ...

    def close(self) -> None:
        """Free native resources (model, context)."""
        ...


def model_price(drafter: Drafter) -> tuple[float | None, bool]:
    """What adaptive K is told about a drafter's model parts (controller.price_draft): a
    drafted token's cost relative to a target step, the dearest part's, None unless every
    model part knows its own; and whether K is only a ceiling for all of them."""
    models = [p for p in drafter.parts() if not p.free]
    costs = [p.relative_cost for p in models]
    known = [c for c in costs if c is not None]
    price = max(known) if known and len(known) == len(costs) else None
    return price, bool(models) and all(p.k_ceiling for p in models)


class NoDrafter:
    """K=0 everywhere: plain decoding through the same loop."""

    name = "none"
    label = "none"
    free = True
    relative_cost: float | None = 0.0
    k_ceiling = False

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        return Draft.empty()

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        return 0.0

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0

    def prefill(self, tokens: Sequence[int]) -> None:
        pass

    def reset(self) -> None:
        pass

    def forget(self) -> None:
        pass

    def set_cut(self, p_joint: float) -> None:
        pass

    def close(self) -> None:
        pass


class Borrowed:
    """A drafter lent by its owner (the session): closing the loan leaves it open, so a
    loaded draft model or a suffix drafter's memory survives drafter swaps."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.name = inner.name
        self.label = inner.label
        self.free = inner.free
        self.relative_cost = inner.relative_cost

    @property
    def k_ceiling(self) -> bool:
        return self.inner.k_ceiling

    def parts(self) -> Sequence[Drafter]:
        inner = self.inner.parts()
        # A lent chain is still a chain; a lent single source is this loan.
        return [self] if len(inner) == 1 and inner[0] is self.inner else inner

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        return self.inner.propose(tokens, k, sampling, rng)

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        return self.inner.catch_up_ms(tokens)

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return self.inner.unpriced_catch_up(tokens)

    def prefill(self, tokens: Sequence[int]) -> None:
        self.inner.prefill(tokens)

    def reset(self) -> None:
        self.inner.reset()

    def forget(self) -> None:
        self.inner.forget()

    def set_cut(self, p_joint: float) -> None:
        self.inner.set_cut(p_joint)

    def close(self) -> None:
        pass
