"""One step's draft: which source drafts, and how much of it is verified.

At a fixed K the drafter is asked for K tokens. Under adaptive K a draft model costs
real time per token, so its K is chosen before it drafts (controller.choose). A
model-free source (lookup, suffix) costs nothing to ask, so it is asked for the longest
draft it has and the controller cuts it to what is worth verifying (controller.trim),
from how long the match behind the copy was. In a chain each source is judged this way
on its own: a weak copy no longer blocks the draft model, and a costly draft model no
longer drags down the free sources' K.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdash.engine.controller import KController
from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.settings import SamplingParams


def propose_adaptive(
    drafter: Drafter,
    tokens: Sequence[int],
    controller: KController,
    content: str,
    k_cap: int,
    sampling: SamplingParams,
    rng: np.random.Generator | None,
) -> tuple[Draft, int, str]:
    """(draft, K it was cut or chosen to, the controller's reason). Every source sees
    every step: those not asked to draft get k = 0 ("look, do not draft")."""
    draft, k, why = Draft.empty(), 0, "nothing to copy"
    parts = list(drafter.parts())
    for i, source in enumerate(parts):
        if draft.tokens or k_cap <= 0:
            source.propose(tokens, 0, sampling, rng)
        elif source.free:
            offer = source.propose(tokens, k_cap, sampling, rng)
            if offer.tokens:
                # A copy competes with the draft model after it, if any, not only with plain.
                rival = controller.model_rate(content) if any(not p.free for p in parts[i + 1:]) else 0.0
                k, why = controller.trim(offer.source, offer.evidence, len(offer.tokens), content, rival)
                draft = offer.cut(k)
        else:
            # Only a draft model falls behind while others draft; its catch-up is part
            # of what drafting from it now would cost.
            k, why = controller.choose(content, source.catch_up_ms(tokens))
            # The controller knows nothing of the room left (context, token budget): the
            # step reports the K it could use, not the K the controller wished for.
            k = min(k, k_cap)
            draft = source.propose(tokens, k, sampling, rng)
    return draft, k, why


def propose(
    drafter: Drafter,
    tokens: Sequence[int],
    cap: int,
    controller: KController | None,
    content: str,
    sampling: SamplingParams,
    rng: np.random.Generator | None,
) -> tuple[Draft, int, str]:
    """This step's draft, of at most `cap` tokens (step_rules.k_cap): (draft, K, the
    controller's reason). Without a controller K is fixed at `cap`; the drafter is asked
    even at K=0, since history-keeping drafters (suffix) must see every step. The engine
    and whatif both draft through here, so a change in who drafts reaches both."""
    if controller is not None:
        return propose_adaptive(drafter, tokens, controller, content, cap, sampling, rng)
    return drafter.propose(tokens, cap, sampling, rng), cap, ""
