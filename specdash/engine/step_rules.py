"""The rules of one speculative step that do not depend on how the target is run.

The engine (engine.Engine.step) verifies a draft in a real target batch; whatif
(whatif/simulate.py) compares it with a known greedy text and times it from a cost
profile. Everything else a step decides is here, once, so a simulation cannot drift from
the engine: how long a draft may be (the context, the batch, the token budget, what the
target's rollback can take back, K), which tokens a verified draft commits and counts,
and what adaptive K is told about the step. No model and no clock in here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdash.engine.drafters.base import Draft

if TYPE_CHECKING:
    from specdash.engine.controller import KController


# --- how long a draft may be ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds every draft on one target context."""

    n_ctx: int
    n_batch: int
    n_vocab: int | None = None  # ids from here on are not the target's; None: not checked
    max_draft: int | None = None  # the longest draft its rollback can take back (Strategy.max_draft); None: any


def room(limits: Limits, n_past: int, generated: int, max_tokens: int) -> int:
    """The longest draft this step could keep: the verify batch (the last committed token
    and the draft) fits the context and one decode batch, the accepted tokens and the
    target's own fit the token budget, and the target can take back what it rejects.
    Drafting more would only verify tokens that cannot be kept."""
    n = max(0, min(limits.n_ctx - n_past - 2, max_tokens - generated - 1, limits.n_batch - 1))
    return n if limits.max_draft is None else min(n, limits.max_draft)


# Batch sizes measured before adaptive K's first decision: enough points for the
# controller to interpolate a CPU's cost curve (nearly linear, with steps) or see a GPU's
# flat one. Two passes, the faster kept (rollback.calibrate), once per session. 4, 16 and
# 32 because the curve dips there: llama.cpp's repacked kernels take activation rows four
# at a time, so on a 2-core Xeon a batch of 4 cost 1.57x one token where 3 cost 1.81x and
# 5 2.10x, 16 3.49x (15: 4.24x), 32 5.94x (31: 6.97x) (benchmarks/results/batch-costs.txt).
# Interpolated from 3 and 5 the controller priced K=3 25% too dear and passed over the
# cheapest draft length there is.
COST_SIZES = (1, 2, 3, 4, 5, 9, 16, 17, 32, 33)


def cost_sizes(limits: Limits, n_past: int, k_max: int) -> list[int]:
    """The calibration sizes a step can use: no verify is longer than k_max + 1 tokens
    (or than what the target's rollback takes back, + 1), the batch or the context. Each
    size costs two batches before the first token (the default k_max=16 measures 8 sizes
    in 2.8 s on a 2-core Xeon; all 10 took 4.8 s); a K raised later past them is
    extrapolated, then learnt from its own steps. Never fewer than sizes 1 and 2: with
    one size measured the controller would ask for calibration again every step."""
    top = k_max if limits.max_draft is None else min(k_max, limits.max_draft)
    top = max(top + 1, 2)
    return [n for n in COST_SIZES if n <= top and n <= limits.n_batch and n_past + n < limits.n_ctx]


def k_cap(room: int, *, adaptive: bool, k: int, k_max: int) -> int:
    """The most tokens this step asks for: K, or under adaptive K the controller's
    ceiling k_max (it chooses or trims below it), and never more than the room."""
    return min(room, k_max if adaptive else k)


def fit(draft: Draft, k: int, limits: Limits) -> Draft:
    """The draft the target verifies: no more than K tokens (a drafter may not overrun
    it), ending before an id the target does not have (a padded draft vocabulary:
    llama.cpp's compatibility rule allows up to 128 extra ids)."""
    draft = draft.cut(k)
    if limits.n_vocab is not None:
        beyond = next((i for i, t in enumerate(draft.tokens) if t >= limits.n_vocab), None)
        if beyond is not None:
            draft = draft.cut(beyond)
    return draft


def drafted_by(draft: Draft) -> str:
    """Which source drafted this step (the step event's `drafter`): none for a plain step."""
    return draft.source if draft.tokens else "none"


# --- what a verified draft commits ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Commit:
    kept: list[int]  # appended to the committed sequence: the accepted draft tokens and the target's own
    tokens: list[int]  # the run's new text: `kept` up to an end of generation and within the token budget
    from_draft: list[bool]  # per text token: drafted and accepted, or the target's own
    accepted: int  # drafted tokens accepted, counted up to and including an end of generation
    eos: bool  # an end-of-generation token was committed: the run ends with this step


def commit(draft: Sequence[int], accepted: int, target_token: int | None, is_end: Callable[[int], bool],
           generated: int, max_tokens: int) -> Commit:
    """The step's outcome once the target accepted the first `accepted` draft tokens and
    chose `target_token` after them (None: unknown, only in a simulation whose text ends
    inside the accepted run, which then holds the text's end).

    End of generation can fall inside the accepted run: the text is cut there, and drafted
    tokens the target went on to match after it are no text of this run, so they are not
    counted as accepted either. The token budget cuts the text too (the room leaves one
    token for the target's own, and an accepted draft may still end past the budget)."""
    kept = [*draft[:accepted], *([] if target_token is None else [target_token])]
    tokens, from_draft = kept, [True] * accepted + [False] * (len(kept) - accepted)
    end = next((i for i, tok in enumerate(kept) if is_end(tok)), None)
    if end is not None:
        tokens, from_draft, accepted = kept[:end], from_draft[:end], min(accepted, end + 1)
    budget = max(max_tokens - generated, 0)
    return Commit(kept, tokens[:budget], from_draft[:budget], accepted, end is not None)


# --- what adaptive K is told ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StepCost:
    """Where a step's time went (ms): the step event's three parts and what each holds
    that is not the cost of this step's draft and verify."""

    draft_ms: float  # proposing, a catch-up included
    verify_ms: float  # the target batch, a checkpoint saved before it included
    other_ms: float  # commit and bookkeeping, a rollback after a rejection included
    catch_up_ms: float = 0.0  # of draft_ms: the drafter feeding tokens it sat out (Draft.prep_ms)
    save_ms: float = 0.0  # of verify_ms: the target's checkpoint
    restore_ms: float = 0.0  # of other_ms: the target's restore and replay after a rejection


@dataclass(frozen=True, slots=True)
class Observation:
    """One finished step as adaptive K learns from it (KController.observe's arguments)."""

    k: int
    drafted: int
    accepted: int
    draft_ms: float
    verify_ms: float
    other_ms: float
    content: str
    evidence: int
    source: str

    def tell(self, controller: KController) -> None:
        controller.observe(self.k, self.drafted, self.accepted, self.draft_ms, self.verify_ms, self.other_ms,
                           self.content, evidence=self.evidence, source=self.source)


def observation(k: int, draft: Draft, accepted: int, cost: StepCost, content: str) -> Observation:
    """The step without its catch-up (a cost of having paused, which the controller adds
    to the price of drafting when it chooses: Drafter.catch_up_ms) and without the
    target's rollback (priced apart, from the acceptance: KController.price_rollback)."""
    return Observation(k, len(draft.tokens), accepted, cost.draft_ms - cost.catch_up_ms,
                       cost.verify_ms - cost.save_ms, cost.other_ms - cost.restore_ms, content,
                       draft.evidence, draft.source)
