"""One step's draft: which source drafts, and how much of it is verified.

Under `auto` (drafters/auto.py) every source is priced and the fastest drafts
(choose_source); the rest of this text is the chain's order.

At a fixed K the drafter is asked for K tokens. Under adaptive K a draft model costs
real time per token, so its K is chosen before it drafts (controller.choose). A
model-free source (lookup, suffix) costs nothing to ask, so it is asked for the longest
draft it has and the controller cuts it to what is worth verifying (controller.trim),
from how long the match behind the copy was. In a chain each source is judged this way
on its own: a weak copy no longer blocks the draft model, and a costly draft model no
longer drags down the free sources' K.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from specdash.engine.ask_backoff import AskBackoff
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
    horizon: int | None = None,
    asks: AskBackoff | None = None,
) -> tuple[Draft, int, str]:
    """(draft, K it was cut or chosen to, the controller's reason). Every source sees
    every step: those not asked to draft get k = 0 ("look, do not draft"), and so do
    copy sources `asks` backs off this step."""
    parts = list(drafter.parts())
    if drafter.name == "auto":
        return choose_source(parts, tokens, controller, content, k_cap, sampling, rng, horizon, asks)
    draft, k, why = Draft.empty(), 0, "nothing to copy"
    for i, source in enumerate(parts):
        if draft.tokens or k_cap <= 0 or not _due(asks, source):
            source.propose(tokens, 0, sampling, rng)
        elif source.free:
            t0 = time.perf_counter()
            offer = source.propose(tokens, k_cap, sampling, rng)
            if offer.tokens:
                # A copy competes with the draft model after it, if any, not only with plain.
                rival = controller.model_rate(content) if any(not p.free for p in parts[i + 1:]) else 0.0
                k, why = controller.trim(offer.source, offer.evidence, len(offer.tokens), content, rival)
                draft = offer.cut(k)
            if asks is not None:
                asks.asked(source.name, (time.perf_counter() - t0) * 1e3, bool(draft.tokens))
        else:
            # Only a draft model falls behind while others draft; its catch-up is part
            # of what drafting from it now would cost.
            k, why = controller.choose(content, source.catch_up_ms(tokens))
            # The controller knows nothing of the room left (context, token budget): the
            # step reports the K it could use, not the K the controller wished for.
            k = min(k, k_cap)
            draft = source.propose(tokens, k, sampling, rng)
    return draft, k, why + (asks.why() if asks is not None and not draft.tokens else "")


def _due(asks: AskBackoff | None, source: Drafter) -> bool:
    """Whether a copy source is asked this step (a draft model always is: its K is chosen
    before it drafts); one that is not counts the step it waited."""
    return asks is None or not source.free or asks.ask_now(source.name)


# The most of plain decoding's time for the rest of a run that auto lets its model's first
# catch-up take: the model can only earn it back by what it saves, and the adaptive draft
# model saved 0-12% of the time on 2-core CPUs (0.96-1.14x plain, median 0.99x, on six
# prompts: benchmarks/results/auto-default.txt). At a tenth, a 128-token run on a short
# prompt still paid a 0.7 s warm-up the model never earned back (0.89x plain).
CATCH_UP_SHARE = 0.05


def choose_source(
    parts: Sequence[Drafter],
    tokens: Sequence[int],
    controller: KController,
    content: str,
    k_cap: int,
    sampling: SamplingParams,
    rng: np.random.Generator | None,
    horizon: int | None = None,
    asks: AskBackoff | None = None,
) -> tuple[Draft, int, str]:
    """`auto`'s step: every copy source offers its longest copy (free to ask), each copy
    is priced (how much of it to verify, and at what expected tokens per ms), and the
    best copy drafts if it beats the model's expected rate with its catch-up paid;
    otherwise the model's K is chosen as always (controller.choose: plain decoding, a
    probe, or K > 0). Sources not drafting this step look (k = 0).

    Before the model measured a catch-up of its own, its first one (the whole prompt:
    auto prefills it lazily) is estimated (controller.catch_up_estimate), and the model
    sits out while that exceeds CATCH_UP_SHARE of plain decoding's time for the `horizon`
    tokens left: it could not earn it back."""
    copies = [p for p in parts if p.free]
    models = [p for p in parts if not p.free]
    best: tuple[float, Draft, int, str] | None = None
    for source in copies:
        if k_cap <= 0 or not _due(asks, source):
            source.propose(tokens, 0, sampling, rng)
            continue
        t0 = time.perf_counter()
        offer = source.propose(tokens, k_cap, sampling, rng)
        n = 0
        if offer.tokens:
            n, rate, why = controller.copy_offer(offer.source, offer.evidence, len(offer.tokens), content)
            if n > 0 and (best is None or rate > best[0]):
                best = (rate, offer.cut(n), n, why)
        if asks is not None:
            asks.asked(source.name, (time.perf_counter() - t0) * 1e3, n > 0)
    model = models[0] if models and k_cap > 0 else None
    catch_up = model.catch_up_ms(tokens) if model is not None else 0.0
    unpriced = model.unpriced_catch_up(tokens) if model is not None else 0
    if model is not None and unpriced:
        catch_up += controller.catch_up_estimate(unpriced)
        plain = controller.plain_rate()
        if horizon is not None and plain > 0 and catch_up > CATCH_UP_SHARE * horizon / plain:
            why = (f"{model.label} skipped for its catch-up (~{catch_up:.0f} ms, more than "
                   f"{CATCH_UP_SHARE:.0%} of {horizon} tokens' plain time)")
            for other in parts:
                if not other.free:
                    other.propose(tokens, 0, sampling, rng)
            if best is None:
                return Draft.empty(), 0, why
            rate, draft, n, copy_why = best
            return draft, n, f"{copy_why}; {why}"
    if best is not None:
        rate, draft, n, why = best
        if model is None or rate >= controller.model_rate(content, catch_up):
            if model is not None and controller.model_rate(content) > rate:
                why += f"; {model.label} skipped for its catch-up ({catch_up:.0f} ms)"
            for other in models:
                other.propose(tokens, 0, sampling, rng)
            return draft, n, why
    if model is None:
        for other in models:
            other.propose(tokens, 0, sampling, rng)
        return Draft.empty(), 0, ("nothing to copy" + (asks.why() if asks is not None else "")) if k_cap > 0 \
            else "no room for a draft"
    k, why = controller.choose(content, catch_up)
    k = min(k, k_cap)
    if k == 0 and best is not None:
        # The model's rate beat the copy's, but its K stayed at 0 (hysteresis, a probe
        # schedule): the copy still beats plain decoding.
        rate, draft, n, copy_why = best
        model.propose(tokens, 0, sampling, rng)
        return draft, n, copy_why
    draft = model.propose(tokens, k, sampling, rng)
    for other in models[1:]:
        other.propose(tokens, 0, sampling, rng)
    return draft, k, f"{model.label}: {why}" if k > 0 and draft.tokens else why


def propose(
    drafter: Drafter,
    tokens: Sequence[int],
    cap: int,
    controller: KController | None,
    content: str,
    sampling: SamplingParams,
    rng: np.random.Generator | None,
    horizon: int | None = None,
    asks: AskBackoff | None = None,
) -> tuple[Draft, int, str]:
    """This step's draft, of at most `cap` tokens (step_rules.k_cap): (draft, K, the
    controller's reason). Without a controller K is fixed at `cap`; the drafter is asked
    even at K=0, since history-keeping drafters (suffix) must see every step. The engine
    and whatif both draft through here, so a change in who drafts reaches both.
    `horizon`: tokens left in the run's budget (auto weighs a model's catch-up on it).
    `asks`: the request's back-off of copy sources that keep finding nothing (adaptive only),
    told here the step's content and plain decoding's ms per token."""
    if controller is not None:
        if asks is not None:
            plain = controller.plain_rate()
            asks.step(content, 1.0 / plain if plain > 0 else 0.0)
        return propose_adaptive(drafter, tokens, controller, content, cap, sampling, rng, horizon, asks)
    return drafter.propose(tokens, cap, sampling, rng), cap, ""
