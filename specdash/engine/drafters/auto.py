"""`auto`, the default draft source: every source the session has, and each step the one
with the best expected speed drafts (engine/adaptive_draft.py, choose_source).

A chain asks its sources in a fixed order and the first with something to say drafts.
`auto` asks every copy source (lookup, suffix: free to ask) for its longest copy, prices
each copy, the draft model (or the target's MTP head) and plain decoding with adaptive
K's cost model, and takes the fastest: a copy where one matches and pays, the model where
it pays, otherwise no draft.

Its model is prefilled lazily: a prompt where copies win never pays the model's prefill
of the prompt. The model catches up the first time it is chosen, and that catch-up is
part of its price (Drafter.catch_up_ms: measured per token on its first catch-up), so
after the first it is chosen only where it pays for it too.

At a fixed K (adaptive off) there is no price to choose by, and `auto` drafts as the
chain does: the first copy with a match, else the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdash.engine.drafters.base import Drafter
from specdash.engine.drafters.chain import ChainDrafter


class AutoDrafter(ChainDrafter):
    name = "auto"

    def __init__(self, sources: Sequence[Drafter]):
        super().__init__(sources)
        self.label = "auto: " + ", ".join(s.label for s in self.sources)

    def prefill(self, tokens: Sequence[int]) -> None:
        # Copy sources index the prompt (cheap); a model catches up when first chosen.
        for source in self.sources:
            if source.free:
                source.prefill(tokens)
