"""Each request's K for one batched step, chosen for the whole batch's throughput.

SmartSpec (arXiv 2406.14066) picks speculation lengths to maximise a batch's goodput:
accepted tokens per second of the whole batch. Here each request offers the longest copy
its drafter found, with the per-token acceptance expected of it; the plan starts every
request at K = 0 (one plain token each) and keeps taking the one change of one request's
K that raises expected tokens per ms of the batch most, while it raises it by more than
`margin`. Gains are geometric in K (expected_tokens), costs step with the batch's size, so
a longer K for one request can beat a short one for each, and at a width where verifying
costs nearly a full step per token nothing drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specdash.engine.draft_pricing import expected_tokens

# The least gain over the plan without a change for it to be taken: estimates are noisy,
# and a draft verified for a hair's gain is a rollback risked for nothing. As the
# single-request controller's margin (ControllerSettings.margin).
MARGIN = 0.02


@dataclass(frozen=True, slots=True)
class Offer:
    """What one request could verify this step."""

    available: int  # tokens its drafter offered (0: nothing to copy)
    alpha: float  # per-token acceptance expected of them
    label: str = ""  # where they came from, for the reason ("lookup match 5")


@dataclass(frozen=True, slots=True)
class Choice:
    k: int
    reason: str


Cost = Callable[[int, int], "float | None"]  # (tokens, sequences) -> ms, None when unknown


def rate(offers: Sequence[Offer], ks: Sequence[int], cost: Cost) -> float | None:
    """Expected committed tokens per ms of the batch with these Ks."""
    ms = cost(sum(1 + k for k in ks), len(ks))
    if not ms:
        return None
    return sum(expected_tokens(o.alpha, k) for o, k in zip(offers, ks)) / ms


def plan(offers: Sequence[Offer], cost: Cost, margin: float = MARGIN) -> list[Choice]:
    n = len(offers)
    ks = [0] * n
    plain = rate(offers, ks, cost)
    if plain is None:
        return [Choice(0, f"batch of {n}: measuring its cost") for _ in offers]
    best = plain
    for _ in range(4 * n):  # each pass takes one change; a few per request is plenty
        move: tuple[float, int, int] | None = None
        for i, offer in enumerate(offers):
            for k in range(1, offer.available + 1):
                if k == ks[i]:
                    continue
                trial = ks[:i] + [k] + ks[i + 1:]
                r = rate(offers, trial, cost)
                if r is not None and r > best * (1.0 + margin) and (move is None or r > move[0]):
                    move = (r, i, k)
        if move is None:
            break
        best, i, k = move
        ks[i] = k
    gain = best / plain
    out = []
    for offer, k in zip(offers, ks):
        where = f"{offer.label}: α={offer.alpha:.2f}" if offer.label else ""
        if k:
            out.append(Choice(k, f"batch of {n}: {where}, verify {k} of {offer.available}; batch ~{gain:.2f}x plain"))
        elif offer.available:
            out.append(Choice(0, f"batch of {n}: {where}, would cost the batch more than it brings (K=0)"))
        else:
            out.append(Choice(0, f"batch of {n}: nothing to copy (K=0)"))
    return out
