"""Adaptive K: how many tokens to draft next step.

Two controllers behind one interface (KController):

- ThresholdController, the baseline rule: rolling acceptance rate over the last 128
  drafted tokens; above 0.8 raise K by 4, below 0.6 lower it by 4 (ThresholdSettings).
- CostModelController, the default: measures what drafting and verifying cost on this
  machine and how often drafts are accepted for the current kind of text, and picks
  the K with the most expected tokens per millisecond, K = 0 (plain decoding) included.

Both count acceptance over tokens actually drafted: a drafter that returns fewer than K
tokens (prompt lookup found no match) has not been rejected.

CostModelController only decides. What a step costs and what a draft is worth are priced
apart, one object per thing priced: the target's step costs (engine/target_costs.py), the
draft model's acceptance and cost per token and the model-free copies' acceptance
(engine/draft_pricing.py). Every number it decides with is a field of ControllerSettings
(engine/controller_settings.py), documented there with what chose it.

The draft-model confidence cuts (llama.cpp's --draft-p-min, settings.draft_p_min, and
the joint cut, settings.draft_p_joint) live in the draft-model drafter: they shorten
drafts the draft model itself doubts, inside the K chosen here; the controller sees them
as shorter drafts with higher acceptance. With the joint cut K is only a ceiling
(Drafter.k_ceiling), and CostModelController.choose leans to the biggest K whose
predicted rate is within ceiling_tol (5%) of the best: rates() still costs a K as K
drafted tokens (pricing the cut's lengths instead, learned per position, did worse in
whatif: 40/54 cases within 5% of the oracle against 42/54 with neither).
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from specdash.engine.controller_settings import ControllerSettings, ThresholdSettings
from specdash.engine.draft_pricing import CopyPricing, DraftPricing, expected_tokens
from specdash.engine.exploration import ExplorationBudget
from specdash.engine.settings import LIMIT
from specdash.engine.target_costs import TargetCosts
from specdash.contract.errors import SpecdashError

__all__ = ["ControllerSettings", "CostModelController", "KController", "ThresholdController",
           "ThresholdSettings", "expected_tokens"]

# Without arguments a controller takes the settings' defaults: K range [0, 16], and it
# starts at K=4, where a fixed K would (engine/settings.py's k, k_min, k_max).
K_MIN: int = LIMIT["k_min"].default
K_MAX: int = LIMIT["k_max"].default
K_INIT: int = LIMIT["k"].default


# A catch-up is fed as one batch; its cost per token is estimated from the target's batch of
# this many tokens (calibrated where k_max >= 32, else extrapolated from the calibrated
# curve: step_rules.cost_sizes).
CATCH_UP_BATCH = 33

# A cold start explores the shortest K whose hoped rate is within this share of the best
# hoped (CostModelController._considering). 0.9: not measured against other values.
EXPLORE_SHARE = 0.9


class KController(Protocol):
    def choose(self, content: str, catch_up_ms: float = 0.0) -> tuple[int, str]:
        """(K for the next step, a short reason for the UI). `catch_up_ms`: what the draft
        model would spend first on tokens it sat out, paid only if K > 0."""
        ...

    def trim(self, source: str, evidence: int, available: int, content: str,
             rival: float = 0.0) -> tuple[int, str]:
        """How many of the `available` tokens a model-free source offered (copied after a
        match of `evidence` tokens) to verify; 0 = not this copy (a plain step, or the
        draft model after it in a chain). `rival`: tokens per ms the draft model after it
        is expected to give (model_rate), 0 when there is none."""
        ...

    def model_rate(self, content: str, catch_up_ms: float = 0.0) -> float:
        """Tokens per ms the draft model is expected to give at its best K > 0 now, its
        catch-up (`catch_up_ms`) paid first; 0 when that is not known yet or costs rule
        it out."""
        ...

    def copy_offer(self, source: str, evidence: int, available: int, content: str) -> tuple[int, float, str]:
        """How many of a copy's `available` tokens are worth verifying, the tokens per ms
        that is expected to give, and why; (0, the plain rate, why) when none are."""
        ...

    def plain_rate(self) -> float:
        """Tokens per ms of plain decoding (one token per target step); 0 until measured."""
        ...

    def catch_up_estimate(self, n_tokens: int) -> float:
        """ms a draft model is expected to spend feeding `n_tokens` it never saw, before it
        measured a catch-up of its own; 0 where nothing is known to estimate it from."""
        ...

    def observe(
        self,
        k: int,
        drafted: int,
        accepted: int,
        draft_ms: float,
        verify_ms: float,
        other_ms: float,
        content: str,
        evidence: int = 0,
        source: str = "",
    ) -> None:
        """One finished step: K asked, tokens drafted and accepted, its timings, the
        content label the step was chosen under, and the draft's evidence (> 0 for a
        model-free source's copy, see trim) and source."""
        ...

    def new_prompt(self) -> None:
        """A new prompt, same drafter."""
        ...

    def needs_costs(self) -> bool:
        """Whether target step costs measured up front (seed_costs) would be used."""
        ...

    def seed_costs(self, ms: dict[int, float]) -> None:
        """ms per target batch of n tokens, measured by the engine."""
        ...

    def pin_shape(self, verify_ms: dict[int, float], name: str) -> None:
        """Fix the target's cost curve to the shape of verify_ms (profile `name`), scaled
        by the one-token cost measured here; nothing else is calibrated or learned."""
        ...

    def pinned_shape(self) -> str:
        """The profile pin_shape named, "" while the curve is this machine's."""
        ...

    def target_costs(self) -> TargetCosts | None:
        """The target's batch-cost curve this rule learns (what a kept profile stores and
        a cold start times lazily); None for a rule that knows no costs."""
        ...

    def reset(self, target_changed: bool = False) -> None:
        """A new drafter; target_changed=True: also a new target (another expert count),
        so its measured step costs no longer hold."""
        ...

    def price_draft(self, relative_cost: float | None, k_ceiling: bool = False) -> None:
        """The draft model's predicted cost per token relative to a target step, and
        whether K is only a ceiling for it (it ends drafts it doubts: Drafter.k_ceiling)."""
        ...

    def price_rollback(self, save_ms: float, restore_ms: float, replay_ms: dict[int, float]) -> None:
        """A checkpoint target's rollback, measured by the engine: the save before every
        drafting step, and on a rejection a restore plus a replay of the n kept tokens
        (replay_ms: ms per replayed batch of n tokens)."""
        ...


def _check_range(k_min: int, k_max: int) -> None:
    if not 0 <= k_min <= k_max:
        raise SpecdashError(f"k_min={k_min} k_max={k_max} refused: need 0 <= k_min <= k_max")


def _clamp(k: int, k_min: int, k_max: int) -> int:
    """The controller's starting K: a fixed K outside the adaptive range (K=24 with the
    default k_max=16) is the operator's business, not a reason to refuse anything."""
    return min(max(k, k_min), k_max)


Tuned = TypeVar("Tuned", ControllerSettings, ThresholdSettings)


def _tuned(settings: Tuned, knobs: dict[str, Any]) -> Tuned:
    """`settings` with single fields overridden by keyword (CostModelController(probe_every=4));
    a name that is not a field is a TypeError, as for any keyword."""
    return dataclasses.replace(settings, **knobs) if knobs else settings


class ThresholdController:
    """The baseline rule. The rate is accepted / drafted over at most the last `window`
    drafted tokens since K last changed; a decision needs `min_tokens` of them, so K
    moves at most once per that many drafted tokens. K never goes below 1 (nor
    k_min): at K = 0 nothing is drafted, so this rule could never measure its way back.
    reset() returns to k_init and forgets the window."""

    def __init__(
        self,
        k_init: int = K_INIT,
        k_min: int = K_MIN,
        k_max: int = K_MAX,
        settings: ThresholdSettings | None = None,
        **knobs: Any,
    ):
        """`knobs` override single fields of `settings` (window=64, say)."""
        _check_range(k_min, k_max)
        self.settings = _tuned(settings or ThresholdSettings(), knobs)
        self.k_init = _clamp(k_init, k_min, k_max)
        self.k_min = k_min
        self.k_max = k_max
        self.min_tokens = min(self.settings.min_tokens, self.settings.window)
        self._outcomes: deque[int] = deque(maxlen=self.settings.window)  # 1 = accepted, per drafted token
        self.reset()

    def reset(self, target_changed: bool = False) -> None:
        self.k = self.k_init
        self._outcomes.clear()
        self._reason = f"start at K={self.k}"

    def new_prompt(self) -> None:
        self.reset()  # the baseline rule starts every prompt afresh

    def price_draft(self, relative_cost: float | None, k_ceiling: bool = False) -> None:
        pass  # the baseline rule looks at acceptance only

    def price_rollback(self, save_ms: float, restore_ms: float, replay_ms: dict[int, float]) -> None:
        pass  # the baseline rule looks at acceptance only

    def needs_costs(self) -> bool:
        return False  # the baseline rule looks at acceptance only

    def seed_costs(self, ms: dict[int, float]) -> None:
        pass

    def pin_shape(self, verify_ms: dict[int, float], name: str) -> None:
        pass  # the baseline rule knows no costs

    def pinned_shape(self) -> str:
        return ""

    def target_costs(self) -> TargetCosts | None:
        return None

    def choose(self, content: str, catch_up_ms: float = 0.0) -> tuple[int, str]:
        return self.k, self._reason

    def trim(self, source: str, evidence: int, available: int, content: str,
             rival: float = 0.0) -> tuple[int, str]:
        return min(self.k, available), self._reason

    def model_rate(self, content: str, catch_up_ms: float = 0.0) -> float:
        return 0.0  # the baseline rule takes every copy

    def copy_offer(self, source: str, evidence: int, available: int, content: str) -> tuple[int, float, str]:
        return min(self.k, available), 1.0, self._reason  # every copy, at K

    def plain_rate(self) -> float:
        return 0.0  # the baseline rule knows no costs

    def catch_up_estimate(self, n_tokens: int) -> float:
        return 0.0

    def observe(
        self,
        k: int,
        drafted: int,
        accepted: int,
        draft_ms: float,
        verify_ms: float,
        other_ms: float,
        content: str,
        evidence: int = 0,
        source: str = "",
    ) -> None:
        if drafted <= 0:
            return
        self._outcomes.extend([1] * accepted + [0] * (drafted - accepted))
        if len(self._outcomes) < self.min_tokens:
            return
        rate = sum(self._outcomes) / len(self._outcomes)
        rule = self.settings
        if rate > rule.high:
            new = min(self.k + rule.step, self.k_max)
        elif rate < rule.low:
            new = max(self.k - rule.step, self.k_min, 1)
        else:
            return
        if new != self.k:
            self._reason = f"acc={rate:.2f} over {len(self._outcomes)} tokens: K {self.k}->{new}"
            self.k = new
            self._outcomes.clear()  # judge the new K on its own drafts


class CostModelController:
    """Chooses K maximising E(K) / cost(K), with
        E(K)    = 1 + a + ... + a^K     expected tokens per step at acceptance a
        cost(K) = d * K + s(K + 1) + r(K)   ms per step
    where, all measured online, a and d are the draft model's (DraftPricing: a per content
    label, d per drafted token), s(n) is the target's batch of n tokens and r(K) a
    checkpoint target's rollback (TargetCosts). The fields named below are
    ControllerSettings', which says what chose each value.

    K = 0 is legal. While at 0, every `probe_every` steps (doubling after each probe
    that does not switch speculation back on, up to `probe_max`, and back to the base
    interval when the content label changes) K = `probe_k` may be tried for
    `probe_steps` steps so a change in the text is noticed. A probe is paid for out of a
    budget: each step at K=0 adds `probe_budget` of a plain step to it, and a probe is
    taken only when the budget covers what it is predicted to lose against plain
    decoding (its batches beyond the tokens they are expected to yield, plus the draft
    model's catch-up on every token it sat out), or when the content label had no
    more than `probe_steps` drafting steps (a first look: its acceptance is mostly
    borrowed from other labels or from one warm-up step). So probing costs at most that fraction
    of the time at K=0: on a CPU, where a 5-token batch costs ~3 plain steps and a 0.5B
    draft model catches up at ~1/10 of a target step per token, unbudgeted probes every
    16-64 steps cost adaptive K a tenth or more of plain speed. A new K must beat the
    current one by `hysteresis` (relative) to replace it, so measurement noise does not
    flip K. For a drafter that ends the drafts it doubts (price_draft's k_ceiling: the
    draft model's joint cut), K is a ceiling, and the biggest K predicted within
    `ceiling_tol` of the best is taken instead (see choose).

    Costs alone can rule a draft model out: when even `verdict_alpha` acceptance (or the
    best measured, if higher) would not beat plain decoding at any K, with the cheapest
    draft cost measured after at least `verdict_drafts` drafting steps, probing stops
    (DraftPricing.cannot_pay). The verdict is recomputed each step on the current cost
    curve, so a noisy step cost does not reopen it, while a new curve (seed_costs, a new
    expert count) does.

    Model-free drafts (lookup, suffix) cost nothing to propose, so the engine asks for
    the longest one and trim() decides how much of it to verify, from acceptance learned
    per source and match length (CopyPricing): the length chosen maximises E(n) / s(n + 1),
    n = 0 included; a copy is verified only when predicted to beat plain decoding by
    `margin` (a bet predicted to gain a few percent rests on a prior for its bucket and a
    noisy cost curve, and when lost costs a whole batch: copies predicted at 1.05-1.10x
    made adaptive chain lose to plain on a JSON extraction on this box).

    new_prompt() keeps everything learned (acceptance is per kind of text, costs are the
    machine's) and restarts probing; reset() (a new drafter) forgets acceptance and draft
    cost and keeps the target's step costs; reset(target_changed=True) forgets those
    too (e.g. a new expert count).
    """

    def __init__(
        self,
        k_min: int = K_MIN,
        k_max: int = K_MAX,
        k_init: int | None = None,
        settings: ControllerSettings | None = None,
        **knobs: Any,
    ):
        """`knobs` override single fields of `settings` (probe_every=4, say); k_init None:
        the `k` setting's default."""
        _check_range(k_min, k_max)
        self.settings = _tuned(settings or ControllerSettings(), knobs)
        self.k_min = k_min
        self.k_max = k_max
        self.k_init = _clamp(K_INIT if k_init is None else k_init, k_min, k_max)
        self.probe_k = min(max(self.settings.probe_k, 1), k_max)
        self.costs = TargetCosts(self.settings)  # the target's: kept across drafters
        self._pinned_name = ""
        self.reset()

    def reset(self, target_changed: bool = False) -> None:
        if target_changed:
            self.costs.forget()
        self.model = DraftPricing(self.settings, self.k_min, self.k_max)  # the draft model
        self.copies = CopyPricing(self.settings)  # lookup and suffix copies
        self.new_prompt()

    def new_prompt(self) -> None:
        self._k = self.k_init
        self._zero_steps = 0
        self._probe_left = 0
        self._probe_interval = self.settings.probe_every
        self._probe_credit = 0.0  # ms a probe may lose against plain decoding (probe_budget)
        self._content = ""
        self._budget = ExplorationBudget()  # per request: what explored and lost

    def price_draft(self, relative_cost: float | None, k_ceiling: bool = False) -> None:
        """What a drafted token should cost relative to one target step, before any is
        measured (the draft model's size over the target's: decoding on a CPU is
        memory-bound). None: unknown, a probe will measure it. k_ceiling: the drafter
        ends drafts it doubts before K (see choose)."""
        self.model.price(relative_cost, k_ceiling)

    def price_rollback(self, save_ms: float, restore_ms: float, replay_ms: dict[int, float]) -> None:
        self.costs.price_rollback(save_ms, restore_ms, replay_ms)

    def needs_costs(self) -> bool:
        """No batch bigger than one token measured yet: seed_costs() would help."""
        return self.costs.needs_costs()

    def seed_costs(self, ms: dict[int, float]) -> None:
        """Step costs measured up front (ms per target batch of n tokens): decisions are
        right from the first step instead of extrapolating from one batch size."""
        self.costs.seed_costs(ms)

    def pin_shape(self, verify_ms: dict[int, float], name: str) -> None:
        """See TargetCosts.pin_shape: which machine's curve the choices are made on is then
        the caller's (a test's scripted profile), not this CPU's."""
        self.costs.pin_shape(verify_ms)
        self._pinned_name = name

    def pinned_shape(self) -> str:
        return self._pinned_name if self.costs.pinned else ""

    def target_costs(self) -> TargetCosts | None:
        return self.costs

    # --- estimates (the pricing objects', under the names callers know) -----------------
    def step_cost(self, n: int) -> float | None:
        """Estimated verify + bookkeeping ms for a target batch of n tokens."""
        return self.costs.step_cost(n)

    def rollback_cost(self, a: float, k: int) -> float:
        """Expected ms a checkpoint target spends taking back a K-token draft at per-token
        acceptance a (TargetCosts.rollback_cost); 0 for other targets."""
        return self.costs.rollback_cost(a, k)

    def alpha(self, content: str) -> float:
        """The draft model's per-token acceptance for `content`."""
        return self.model.alpha(content)

    def curve(self, content: str) -> tuple[list[float], list[float]]:
        """(hazard, survival) of the draft model's drafts for `content` (DraftPricing.curve)."""
        return self.model.curve(content)

    def expected(self, content: str, k: int) -> float:
        """Tokens a K-token draft model step is expected to commit for `content`."""
        return self.model.expected(content, k)

    def rates(self, content: str, catch_up_ms: float = 0.0) -> dict[int, float]:
        """The draft model's expected tokens per ms for each K in range (empty until costs
        are known); drafting (K > 0) first pays `catch_up_ms`."""
        return self._considering(lambda: self.model.rates(self.costs, content, catch_up_ms))

    def _considering(self, price: Callable[[], dict[int, float]]) -> dict[int, float]:
        """price()'s rates per K; on a cold start (TargetCosts.lazy) where a K would beat
        them by the copy margin if its untimed batch were as cheap as it could be, the
        rates as hoped (TargetCosts.explore): this step verifies that batch, once, and the
        verify times it."""
        rates = price()
        if self.costs.lazy and rates:
            with self.costs.optimistic():
                hope = price()
            best = max(hope, key=hope.__getitem__)
            # The shortest K within EXPLORE_SHARE of the hoped best: under flat hoped costs
            # a weak copy's rate barely grows past a few tokens, and a long verify that
            # finds batches dear wastes more (a 16-token prose copy, 3 accepted, cost a
            # fresh 128-token essay run 11% of its speed on the 2-core EPYC).
            k = min(kk for kk, r in hope.items() if kk > 0 and r >= EXPLORE_SHARE * hope[best]) if best > 0 else 0
            if k > 0 and hope[k] > max(rates.values()) * (1.0 + self.settings.margin) and self.costs.explore(k + 1):
                return {kk: r for kk, r in hope.items() if kk <= k}
        return rates

    def _cannot_pay(self) -> bool:
        """model.cannot_pay, judged on the cheapest untimed sizes could be on a cold start:
        a verdict rests on measured costs, never on the pessimistic guess."""
        with self.costs.optimistic():
            return self.model.cannot_pay(self.costs)

    bucket = staticmethod(CopyPricing.bucket)

    def free_alpha(self, source: str, evidence: int) -> float:
        """Per-token acceptance of a `source` copy after a match of `evidence` tokens."""
        return self.copies.alpha(source, evidence)

    # --- the interface ------------------------------------------------------------------
    def choose(self, content: str, catch_up_ms: float = 0.0) -> tuple[int, str]:
        tune = self.settings
        if content != self._content:
            self._content = content
            self._probe_interval = tune.probe_every
        self._budget.look(content)
        if self.k_max == 0:
            return 0, "K range is [0, 0]"
        if self.k_min == 0 and not self.costs.measured(1):
            return 0, "measuring a plain step"
        if self._cannot_pay():
            self._k = 0
            return 0, f"drafts cost too much here: plain wins even at {tune.verdict_alpha:.0%} acceptance"
        if self.model.measured_steps == 0:
            return self._hold(self.k_init), f"warm-up at K={self.k_init}: nothing drafted yet"
        if self._probe_left > 0:
            self._probe_left -= 1
            return self.probe_k, f"probe K={self.probe_k}: is drafting worth it again?"

        rates = self.rates(content, catch_up_ms)
        best = max(rates, key=rates.__getitem__)
        top = rates[best]
        if self._k in rates and rates[self._k] >= top * (1.0 - tune.hysteresis):
            best = self._k
        a = self.alpha(content)
        label = content or "text"
        if best > 0:
            self._zero_steps = 0
            self._probe_interval = tune.probe_every
            k = best
            if self.model.k_ceiling:
                # K only caps a drafter that ends the drafts it doubts, and rates() prices a
                # K as K drafted tokens: a bigger K really costs less than priced, and is
                # ready when the text turns predictable. So the biggest K within
                # `ceiling_tol` of the best. whatif, 9 texts x 3 profiles x 4 drafters, joint
                # cut 0.1 (followed on the draft's own continuation): adaptive within 5% of
                # the hindsight oracle in 102 cases of 108, against 96 without this.
                k = max(best, max(kk for kk, r in rates.items() if r >= top * (1.0 - tune.ceiling_tol)))
            gain = f", ~{rates[k] / rates[0]:.2f}x plain" if 0 in rates else ""
            ceiling = f", up to K={k}: the cut ends doubtful drafts" if k > best else ""
            return self._hold(k), f"α={a:.2f} {label}: E/c best at K={best}{ceiling}{gain}"

        self._k = 0
        self._zero_steps += 1
        self._probe_credit += tune.probe_budget * self.costs.known_cost(1)
        if self._zero_steps >= self._probe_interval:
            loss = self.probe_loss(content, catch_up_ms)
            # A kind of text barely drafted on (the warm-up, say, one step that may have
            # been unlucky) gets one probe unbudgeted: its acceptance is mostly borrowed.
            # Its catch-up is not: a look after a long sit-out feeds the model every token
            # it missed (code/prose labels flip on SQL, so looks came every ~50 steps and
            # paid ~0.5 s each on this machine's profile; x-sql under auto 0.87x -> 0.95x
            # the cross-validated fixed choice, benchmarks/results/whatif-auto.txt).
            first_look = (self.model.drafted_steps(content) <= tune.probe_steps
                          and catch_up_ms <= self._probe_credit)
            if loss <= self._probe_credit or first_look:
                self._probe_credit = max(self._probe_credit - loss, 0.0)
                self._zero_steps = 0
                self._probe_interval = min(2 * self._probe_interval, tune.probe_max)  # back off: doubling
                self._probe_left = tune.probe_steps - 1
                return self.probe_k, f"probe K={self.probe_k}: is drafting worth it again?"
        catch_up = f" (catch-up {catch_up_ms:.0f} ms)" if catch_up_ms >= 1 else ""
        return 0, f"α={a:.2f} {label}: plain decoding wins (K=0){catch_up}{self._budget.why()}"

    def probe_loss(self, content: str, catch_up_ms: float = 0.0) -> float:
        """What a probe is predicted to lose against plain decoding, in ms: its
        `probe_steps` steps at K=`probe_k` cost more than the plain steps that would have
        produced their expected tokens, and the first pays the draft model's catch-up."""
        s1 = self.costs.known_cost(1)
        k = self.probe_k
        step = self.model.ms_per_token * k + self.costs.known_cost(k + 1)
        lost = step - self.expected(content, k) * s1
        return catch_up_ms + self.settings.probe_steps * max(lost, 0.0)

    def _hold(self, k: int) -> int:
        self._k = k
        return k

    # --- model-free drafts ---------------------------------------------------------------
    def model_rate(self, content: str, catch_up_ms: float = 0.0) -> float:
        if self.model.measured_steps == 0 or self._cannot_pay():
            return 0.0
        return max((r for k, r in self.rates(content, catch_up_ms).items() if k > 0), default=0.0)

    def plain_rate(self) -> float:
        s1 = self.costs.step_cost(1)
        return 1.0 / s1 if s1 else 0.0

    def catch_up_estimate(self, n_tokens: int) -> float:
        # The model's cost per drafted token (its prior until measured), times how much
        # cheaper a token is in the target's biggest calibration batch than alone: a
        # catch-up is one batch.
        s1, big = self.costs.step_cost(1), self.costs.step_cost(CATCH_UP_BATCH)
        if not s1 or not big:
            return 0.0
        return n_tokens * self.model.token_ms_estimate(s1) * (big / CATCH_UP_BATCH) / s1

    def copy_offer(self, source: str, evidence: int, available: int, content: str) -> tuple[int, float, str]:
        n, why = self.trim(source, evidence, available, content)
        if n == 0:
            return 0, self.plain_rate(), why
        # A batch trim chose to explore is priced as it chose it: as hoped, until measured.
        with self.costs.optimistic() if self.costs.exploring(n + 1) else nullcontext():
            return n, self.copies.rates(self.costs, source, evidence, n, n)[n], why

    def trim(self, source: str, evidence: int, available: int, content: str,
             rival: float = 0.0) -> tuple[int, str]:
        s1 = self.costs.step_cost(1)
        if s1 is None or available <= 0:
            return 0, "measuring a plain step" if s1 is None else "nothing to copy"
        self._budget.look(content)
        a = self.free_alpha(source, evidence)
        lo = min(self.k_min, available)
        hi = min(self.k_max, available)
        rate = self._considering(lambda: self.copies.rates(self.costs, source, evidence, lo, hi))
        best = max(rate, key=rate.__getitem__)
        if best > 0 and lo == 0 and rate[best] < rate[0] * (1.0 + self.settings.margin):
            best = 0
        where = f"{source} match {evidence}: α={a:.2f}"
        if rival > rate[best]:
            # In a chain the draft model comes next: on a machine where a long verify costs
            # little more than one token, a good draft model beats a weak copy, and taking
            # the copy would cost the step the model's longer accepted run.
            return 0, f"{where}, the draft model is expected to do better"
        if best == 0:
            return 0, f"{where}, too weak to pay (K=0)"
        if (self.copies.trials(source, evidence) < self.settings.explore_trials and not CopyPricing.longest(evidence)) \
                or self.costs.exploring(best + 1):
            # Priced by a prior or an untimed batch: an exploration, judged when it is observed.
            # Not a match of the longest bucket: no longer match can come to lift a block
            # there, and a copy after 32 matching tokens is learnt from, not explored.
            if self._budget.lost(source, evidence):
                return 0, f"{where}: explored and lost this request, not again before a longer match{self._budget.why()}"
            self._budget.trying(source, evidence)
        return best, f"{where}: verify {best} of {available}, ~{rate[best] * s1:.2f}x plain"

    def observe(
        self,
        k: int,
        drafted: int,
        accepted: int,
        draft_ms: float,
        verify_ms: float,
        other_ms: float,
        content: str,
        evidence: int = 0,
        source: str = "",
    ) -> None:
        s1 = self.costs.step_cost(1)  # before this step's sample: what its draft is measured against
        self._budget.judge(source, evidence, drafted, accepted, s1, verify_ms + other_ms)
        self.costs.observe(drafted + 1, verify_ms + other_ms)
        self.copies.observe(source, evidence, drafted, accepted)
        if evidence > 0:  # a model-free copy: its bucket learns, the draft model's stats don't
            return
        self.model.observe(drafted, accepted, draft_ms, content, s1)


if TYPE_CHECKING:  # the type checker proves both controllers take every call the engine makes
    _CONTROLLERS: tuple[KController, ...] = (ThresholdController(), CostModelController())
