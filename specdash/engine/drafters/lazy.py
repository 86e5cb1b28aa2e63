"""A draft model loaded when it is first needed, not when the session starts.

`auto` (and a chain) hold the draft model as one of their sources. Loading it (and
checking its vocabulary) cost the default pair ~0.4-1.7 s before the first token of
every run, including the runs where copies or plain decoding win and the model never
drafts (issue 40). Until then this stands in for it: what pricing needs (label, relative
cost, whether K is a ceiling) is known from the files; `propose(k=0)` ("look, do not
draft") does nothing, because auto's model catches up on every token it missed when it
is first chosen anyway; and its first catch-up is priced with the load in it
(`catch_up_ms` says the load estimate, `unpriced_catch_up` every token), so auto loads
it only where that estimate says it still pays. Any other use loads it at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.settings import SamplingParams


class LazyModel:
    free = False
    name = "draft"

    def __init__(self, load: Callable[[], Drafter], label: str, relative_cost: float | None,
                 k_ceiling: bool, load_ms: float):
        self._load = load
        self._inner: Drafter | None = None
        self.label = label
        self.relative_cost = relative_cost
        self._k_ceiling = k_ceiling
        self.load_ms = load_ms  # the load's estimate (the session's: the target's load, scaled by size)
        self._cut: float | None = None

    @property
    def loaded(self) -> bool:
        return self._inner is not None

    @property
    def inner(self) -> Drafter | None:
        """The model itself once loaded (unwrapped from the session's loan), else None."""
        return getattr(self._inner, "inner", self._inner)

    def model(self) -> Drafter:
        """The real model, loaded now if it was not."""
        if self._inner is None:
            self._inner = self._load()
            if self._cut is not None:
                self._inner.set_cut(self._cut)
        return self._inner

    @property
    def k_ceiling(self) -> bool:
        return self._inner.k_ceiling if self._inner is not None else self._k_ceiling

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        if k <= 0 and self._inner is None:
            return Draft.empty("draft")
        return self.model().propose(tokens, k, sampling, rng)

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        return self._inner.catch_up_ms(tokens) if self._inner is not None else self.load_ms

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return self._inner.unpriced_catch_up(tokens) if self._inner is not None else len(tokens)

    def prefill(self, tokens: Sequence[int]) -> None:
        self.model().prefill(tokens)  # a chain prefills its model: it drafts from the first step

    def reset(self) -> None:
        if self._inner is not None:
            self._inner.reset()

    def forget(self) -> None:
        if self._inner is not None:
            self._inner.forget()

    def set_cut(self, p_joint: float) -> None:
        self._cut = p_joint
        if self._inner is not None:
            self._inner.set_cut(p_joint)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
