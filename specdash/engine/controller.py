"""Adaptive K: how many tokens to draft next step.

Two controllers behind one interface (KController):

- ThresholdController, the baseline rule: rolling acceptance rate over the last 128
  drafted tokens; above 0.8 raise K by 4, below 0.6 lower it by 4.
- CostModelController, the default: measures what drafting and verifying cost on this
  machine and how often drafts are accepted for the current kind of text, and picks
  the K with the most expected tokens per millisecond, K = 0 (plain decoding) included.

Both count acceptance over tokens actually drafted: a drafter that returns fewer than K
tokens (prompt lookup found no match) has not been rejected.

The draft-model confidence cuts (llama.cpp's --draft-p-min, settings.draft_p_min, and
the joint cut, settings.draft_p_joint) live in the draft-model drafter: they shorten
drafts the draft model itself doubts, inside the K chosen here; the controller sees them
as shorter drafts with higher acceptance. With the joint cut K is only a ceiling
(Drafter.k_ceiling), and CostModelController.choose leans to the biggest K whose
predicted rate is within 5% of the best: rates() still costs a K as K drafted tokens
(pricing the cut's lengths instead, learned per position, did worse in whatif: 40/54
cases within 5% of the oracle against 42/54 with neither).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Protocol

from specdash.errors import SpecdashError


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

    def model_rate(self, content: str) -> float:
        """Tokens per ms the draft model is expected to give at its best K > 0 now; 0 when
        that is not known yet or costs rule it out."""
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


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens committed per step when each drafted token is accepted with probability
    alpha until the first rejection, plus the target's own token: 1 + a + ... + a^k
    (Leviathan et al. 2023)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class ThresholdController:
    """The baseline rule. The rate is accepted / drafted over at most the last `window`
    drafted tokens since K last changed; a decision needs `min_tokens` of them, so K
    moves at most once per that many drafted tokens. K never goes below 1 (nor
    k_min): at K = 0 nothing is drafted, so this rule could never measure its way back.
    reset() returns to k_init and forgets the window."""

    def __init__(
        self,
        k_init: int = 4,
        k_min: int = 0,
        k_max: int = 16,
        window: int = 128,
        high: float = 0.8,
        low: float = 0.6,
        step: int = 4,
        min_tokens: int = 32,
    ):
        _check_range(k_min, k_max)
        self.k_init = _clamp(k_init, k_min, k_max)
        self.k_min = k_min
        self.k_max = k_max
        self.high = high
        self.low = low
        self.step = step
        self.min_tokens = min(min_tokens, window)
        self._outcomes: deque[int] = deque(maxlen=window)  # 1 = accepted, per drafted token
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

    def choose(self, content: str, catch_up_ms: float = 0.0) -> tuple[int, str]:
        return self.k, self._reason

    def trim(self, source: str, evidence: int, available: int, content: str,
             rival: float = 0.0) -> tuple[int, str]:
        return min(self.k, available), self._reason

    def model_rate(self, content: str) -> float:
        return 0.0  # the baseline rule takes every copy

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
        if rate > self.high:
            new = min(self.k + self.step, self.k_max)
        elif rate < self.low:
            new = max(self.k - self.step, self.k_min, 1)
        else:
            return
        if new != self.k:
            self._reason = f"acc={rate:.2f} over {len(self._outcomes)} tokens: K {self.k}->{new}"
            self.k = new
            self._outcomes.clear()  # judge the new K on its own drafts


class _Ema:
    """Exponential moving average that starts at its first sample; a sample more than
    `clip` times the average is clipped (another process stealing the CPU for one step
    should not triple the estimate), so a real change is followed within a few steps."""

    __slots__ = ("count", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.count = 0

    def add(self, x: float, beta: float, clip: float = 3.0) -> None:
        if self.count == 0:
            self.value = x
        else:
            self.value += beta * (min(x, clip * self.value) - self.value)
        self.count += 1


class CostModelController:
    """Chooses K maximising E(K) / cost(K), with
        E(K)    = 1 + a + ... + a^K     expected tokens per step at acceptance a
        cost(K) = d * K + s(K + 1) + r(K)   ms per step
    where, all measured online:
      a     per content label: accepted / (accepted + rejections) over recent drafts, the
            estimate of a per-token acceptance that fits E(K) (accepted / drafted would
            count the tokens after a rejection as failures and underrate long drafts).
            Counts decay by half every `half_life` steps of their label, so old evidence
            fades even while nothing is drafted. A label with little evidence leans on
            all labels' estimate, which leans on `prior_alpha`.
      d     draft ms per drafted token (EMA of draft_ms / drafted): ~0 for lookup and
            suffix, real for a draft model.
      s(n)  verify + bookkeeping ms of a target batch of n tokens, as an EMA per size
            actually decoded (n = drafted + 1, not K + 1). Between measured sizes it is
            interpolated, beyond them extended by the slope of a weighted least-squares
            line c(n) = a + b (n - 1) over the measured sizes, or, with one size
            measured, by `prior_slope` (extra cost per extra token relative to one).
      r(K)  a checkpoint target's rollback (0 elsewhere, and at K = 0): the checkpoint
            saved before the batch, plus, when the draft is cut at position j (probability
            a^j (1 - a)), a restore and a replay of the j + 1 kept tokens. Measured once
            by the engine's calibration (price_rollback); a rejection there costs a whole
            extra batch, so long drafts pay only at high acceptance.
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

    Costs alone can rule a draft model out: when even 95% acceptance (or the best
    measured, if higher) would not beat plain decoding at any K, with the cheapest draft
    cost measured after at least `verdict_drafts` drafting steps, probing stops. The
    draft cost is kept relative to the target's single step when it was measured (both
    are decodes on the same cores: load on the machine slows them alike), and the
    verdict is recomputed each step on the current cost curve, so a noisy step cost does
    not reopen it, while a new curve (seed_costs, a new expert count) does.

    Model-free drafts (lookup, suffix) cost nothing to propose, so the engine asks for
    the longest one and trim() decides how much of it to verify: acceptance is kept per
    source and per match-length bucket (a copy after a 20-token match is far more likely
    right than after a 1-token one), with a prior that grows with the match length, and
    the length chosen maximises E(n) / s(n + 1), n = 0 included; a copy is verified only
    when predicted to beat plain decoding by `margin` (a bet predicted to gain a few
    percent rests on a prior for its bucket and a noisy cost curve, and when lost costs
    a whole batch: copies predicted at 1.05-1.10x made adaptive chain lose to plain on a
    JSON extraction on this box). Bucket counts decay
    every step, so a bucket that stopped being drafted drifts back to its prior and is
    tried again: the model-free counterpart of probing.

    new_prompt() keeps everything learned (acceptance is per kind of text, costs are the
    machine's) and restarts probing; reset() (a new drafter) forgets acceptance and draft
    cost and keeps the target's step costs; reset(target_changed=True) forgets those
    too (e.g. a new expert count).
    """

    def __init__(
        self,
        k_min: int = 0,
        k_max: int = 16,
        k_init: int | None = None,
        half_life: float = 32.0,
        prior_alpha: float = 0.5,
        prior_weight: float = 4.0,
        beta: float = 0.25,
        prior_slope: float = 0.35,
        probe_k: int = 4,
        probe_steps: int = 2,
        probe_every: int = 16,
        probe_max: int = 256,
        hysteresis: float = 0.03,
        margin: float = 0.08,
        verdict_drafts: int = 1,
        verdict_margin: float = 1.0,
        probe_budget: float = 0.015,
        ceiling_tol: float = 0.05,
    ):
        _check_range(k_min, k_max)
        self.k_min = k_min
        self.k_max = k_max
        self.k_init = _clamp(4 if k_init is None else k_init, k_min, k_max)
        self.decay = 0.5 ** (1.0 / half_life)
        self.prior_alpha = prior_alpha
        self.prior_weight = prior_weight
        self.beta = beta
        self.prior_slope = prior_slope
        self.probe_k = min(max(probe_k, 1), k_max)
        self.probe_steps = probe_steps
        self.probe_every = probe_every
        self.probe_max = probe_max
        self.hysteresis = hysteresis
        self.margin = margin
        self.verdict_drafts = verdict_drafts
        self.verdict_margin = verdict_margin
        self.probe_budget = probe_budget
        self.ceiling_tol = ceiling_tol
        self._step_cost: dict[int, _Ema] = {}
        # (save ms, restore ms, replay ms per n tokens) of a checkpoint target, else None
        self._rollback: tuple[float, float, dict[int, float]] | None = None
        # s(1) when each batch size was last measured: at K = 0 only s(1) is measured, and
        # a load change moves every size alike, so the others are scaled along with it
        # (unscaled, a slower machine made stale big batches look cheap and drafting pay).
        self._s1_at: dict[int, float] = {}
        self._cost_cache: dict[int, float] = {}  # step_cost(n) until the next measurement
        self.reset()

    def reset(self, target_changed: bool = False) -> None:
        if target_changed:
            self._step_cost.clear()
            self._rollback = None
            self._s1_at.clear()
            self._cost_cache.clear()
        self._draft_ms = _Ema()  # per drafted token, model drafts only
        self._draft_rel_min = float("inf")  # cheapest draft ms per token / s(1) at the time
        self._acc: dict[str, list[float]] = {}  # label -> [accepted, trials], decayed
        self._acc_all = [0.0, 0.0]
        self._curves: dict[str, tuple[list[float], list[float]]] = {}  # label -> (hazard, survival)
        self._drafted_steps: dict[str, int] = {}  # content label -> drafting steps measured
        self._free_acc: dict[tuple[str, int], list[float]] = {}  # (source, bucket) -> same
        self._draft_prior: float | None = None  # draft ms per token / target ms per step, predicted
        self._k_ceiling = False  # price_draft: K only caps the drafts
        self.new_prompt()

    def new_prompt(self) -> None:
        self._k = self.k_init
        self._zero_steps = 0
        self._probe_left = 0
        self._probe_interval = self.probe_every
        self._probe_credit = 0.0  # ms a probe may lose against plain decoding (probe_budget)
        self._content = ""

    def price_draft(self, relative_cost: float | None, k_ceiling: bool = False) -> None:
        """What a drafted token should cost relative to one target step, before any is
        measured (the draft model's size over the target's: decoding on a CPU is
        memory-bound). None: unknown, a probe will measure it. k_ceiling: the drafter
        ends drafts it doubts before K (see choose)."""
        self._draft_prior = relative_cost
        self._k_ceiling = k_ceiling

    def price_rollback(self, save_ms: float, restore_ms: float, replay_ms: dict[int, float]) -> None:
        self._rollback = (save_ms, restore_ms, dict(replay_ms))

    # --- estimates ----------------------------------------------------------------------
    def rollback_cost(self, a: float, k: int) -> float:
        """Expected ms a checkpoint target spends taking back a K-token draft at per-token
        acceptance a: the save, and for each first rejection at j < K (probability
        a^j (1 - a)) a restore and a replay of j + 1 tokens. 0 for other targets."""
        return self._rollback_cost([a ** j for j in range(k + 1)], [1.0 - a] * (k + 2), k)

    def _rollback_cost(self, survival: list[float], hazard: list[float], k: int) -> float:
        """rollback_cost with the first rejection at j + 1 having probability
        survival[j] * hazard[j + 1]."""
        if self._rollback is None or k <= 0:
            return 0.0
        save, restore, replay = self._rollback
        return save + sum(survival[j] * hazard[j + 1] * (restore + _interpolate(replay, j + 1)) for j in range(k))

    def curve(self, content: str) -> tuple[list[float], list[float]]:
        """(hazard, survival) of the draft model's drafts for `content`, by position j =
        1..k_max: survival[j] = P(drafted tokens 1..j all accepted), hazard[j] = P(token j
        rejected | tokens before it accepted); index 0: survival 1, hazard unused.

        The per-token acceptance a is known only as well as the evidence behind it: with
        A accepted and B rejections (prior included), a ~ Beta(A, B), and the chance of j
        accepted in a row is E[a^j] = prod_{i<j} (A + i) / (A + B + i), not (A/(A+B))^j.
        The plug-in a^j underrates long runs while evidence is thin, and a long draft is
        cheap where verify cost is flat in n: at 128 tokens on a 32B target the plug-in
        was still choosing K=2-4 when K=12 ran 1.2x faster. As evidence grows the two agree."""
        cached = self._curves.get(content)
        if cached is not None:
            return cached
        a = self.alpha(content)
        n = self._acc.get(content, (0.0, 0.0))[1]
        w = n + self.prior_weight  # the weight alpha() gives this label's estimate
        big_a, big_b = max(a * w, 1e-6), max((1.0 - a) * w, 1e-6)
        hazard = [0.0] * (self.k_max + 2)
        survival = [1.0] * (self.k_max + 2)
        for j in range(1, self.k_max + 2):
            hazard[j] = big_b / (big_a + big_b + j - 1)
            if j <= self.k_max:
                survival[j] = survival[j - 1] * (1.0 - hazard[j])
        self._curves[content] = (hazard, survival)
        return hazard, survival

    def expected(self, content: str, k: int) -> float:
        """Tokens a K-token draft model step is expected to commit for `content`: the
        target's own token plus each drafted position's survival."""
        return 1.0 + sum(self.curve(content)[1][1 : k + 1])

    def alpha(self, content: str) -> float:
        s_all, n_all = self._acc_all
        a_all = (s_all + self.prior_weight * self.prior_alpha) / (n_all + self.prior_weight)
        s, n = self._acc.get(content, (0.0, 0.0))
        return (s + self.prior_weight * a_all) / (n + self.prior_weight)

    def needs_costs(self) -> bool:
        """No batch bigger than one token measured yet: seed_costs() would help."""
        return not any(n > 1 and e.count for n, e in self._step_cost.items())

    def seed_costs(self, ms: dict[int, float]) -> None:
        """Step costs measured up front (ms per target batch of n tokens): decisions are
        right from the first step instead of extrapolating from one batch size."""
        self._cost_cache.clear()
        for n, v in ms.items():
            self._step_cost.setdefault(n, _Ema()).add(v, 1.0)
        if 1 in ms:
            self._s1_at.update(dict.fromkeys(ms, ms[1]))

    def step_cost(self, n: int) -> float | None:
        """Estimated verify + bookkeeping ms for a target batch of n tokens."""
        # One choose() asks for ~40 sizes; the curve only changes when a step is observed.
        cost = self._cost_cache.get(n)
        if cost is None:
            cost = self._estimate_cost(n)
            if cost is not None:
                self._cost_cache[n] = cost
        return cost

    def _estimate_cost(self, n: int) -> float | None:
        sizes = sorted(m for m, e in self._step_cost.items() if e.count)
        if not sizes:
            return None
        e1 = self._step_cost.get(1)
        s1 = e1.value if e1 is not None and e1.count else 0.0
        cost = {m: self._step_cost[m].value * (s1 / self._s1_at[m] if m > 1 and s1 and self._s1_at.get(m) else 1.0)
                for m in sizes}
        if n in cost:
            return cost[n]
        if sizes[0] < n < sizes[-1]:
            hi = next(m for m in sizes if m > n)
            lo = max(m for m in sizes if m < n)
            return cost[lo] + (cost[hi] - cost[lo]) * (n - lo) / (hi - lo)
        slope = self._slope(sizes, cost)
        edge = sizes[-1] if n > sizes[-1] else sizes[0]
        return max(cost[edge] + slope * (n - edge), 0.05 * cost[edge])

    def _known_cost(self, n: int) -> float:
        """step_cost(n) where costs are known to have been measured."""
        cost = self.step_cost(n)
        assert cost is not None, "no step cost measured yet"
        return cost

    def _slope(self, sizes: list[int], cost: dict[int, float]) -> float:
        if len(sizes) == 1:
            (m,) = sizes
            unit = cost[m] / (1.0 + self.prior_slope * (m - 1))
            return self.prior_slope * unit
        w = {m: min(self._step_cost[m].count, 8) for m in sizes}
        sw = sum(w.values())
        mx = sum(w[m] * m for m in sizes) / sw
        my = sum(w[m] * cost[m] for m in sizes) / sw
        var = sum(w[m] * (m - mx) ** 2 for m in sizes)
        cov = sum(w[m] * (m - mx) * (cost[m] - my) for m in sizes)
        return max(cov / var, 0.0)  # a bigger batch never costs less; noise can say so

    def rates(self, content: str, catch_up_ms: float = 0.0) -> dict[int, float]:
        """Expected tokens per ms for each K in range (empty until costs are known);
        drafting (K > 0) first pays `catch_up_ms`."""
        hazard, survival = self.curve(content)
        d = self._draft_ms.value
        out: dict[int, float] = {}
        tokens = 1.0
        for k in range(0, self.k_max + 1):
            tokens += survival[k] if k else 0.0
            if k < self.k_min:
                continue
            s = self.step_cost(k + 1)
            if s is None:
                return {}
            out[k] = tokens / (d * k + s + (catch_up_ms if k else 0.0) + self._rollback_cost(survival, hazard, k))
        return out

    # --- the interface ------------------------------------------------------------------
    def choose(self, content: str, catch_up_ms: float = 0.0) -> tuple[int, str]:
        if content != self._content:
            self._content = content
            self._probe_interval = self.probe_every
        if self.k_max == 0:
            return 0, "K range is [0, 0]"
        if self.k_min == 0 and 1 not in self._step_cost:
            return 0, "measuring a plain step"
        if self._cannot_pay():
            self._k = 0
            return 0, "drafts cost too much here: plain wins even at 95% acceptance"
        if self._draft_ms.count == 0:
            return self._hold(self.k_init), f"warm-up at K={self.k_init}: nothing drafted yet"
        if self._probe_left > 0:
            self._probe_left -= 1
            return self.probe_k, f"probe K={self.probe_k}: is drafting worth it again?"

        rates = self.rates(content, catch_up_ms)
        best = max(rates, key=rates.__getitem__)
        top = rates[best]
        if self._k in rates and rates[self._k] >= top * (1.0 - self.hysteresis):
            best = self._k
        a = self.alpha(content)
        label = content or "text"
        if best > 0:
            self._zero_steps = 0
            self._probe_interval = self.probe_every
            k = best
            if self._k_ceiling:
                # K only caps a drafter that ends the drafts it doubts, and rates() prices a
                # K as K drafted tokens: a bigger K really costs less than priced, and is
                # ready when the text turns predictable. So the biggest K within
                # `ceiling_tol` of the best. whatif, 9 texts x 3 profiles x 4 drafters, joint
                # cut 0.1 (followed on the draft's own continuation): adaptive within 5% of
                # the hindsight oracle in 102 cases of 108, against 96 without this.
                k = max(best, max(kk for kk, r in rates.items() if r >= top * (1.0 - self.ceiling_tol)))
            gain = f", ~{rates[k] / rates[0]:.2f}x plain" if 0 in rates else ""
            ceiling = f", up to K={k}: the cut ends doubtful drafts" if k > best else ""
            return self._hold(k), f"α={a:.2f} {label}: E/c best at K={best}{ceiling}{gain}"

        self._k = 0
        self._zero_steps += 1
        self._probe_credit += self.probe_budget * self._known_cost(1)
        if self._zero_steps >= self._probe_interval:
            loss = self.probe_loss(content, catch_up_ms)
            # A kind of text barely drafted on (the warm-up, say, one step that may have
            # been unlucky) gets one probe unbudgeted: its acceptance is mostly borrowed.
            first_look = self._drafted_steps.get(content, 0) <= self.probe_steps
            if loss <= self._probe_credit or first_look:
                self._probe_credit = max(self._probe_credit - loss, 0.0)
                self._zero_steps = 0
                self._probe_interval = min(2 * self._probe_interval, self.probe_max)
                self._probe_left = self.probe_steps - 1
                return self.probe_k, f"probe K={self.probe_k}: is drafting worth it again?"
        catch_up = f" (catch-up {catch_up_ms:.0f} ms)" if catch_up_ms >= 1 else ""
        return 0, f"α={a:.2f} {label}: plain decoding wins (K=0){catch_up}"

    def probe_loss(self, content: str, catch_up_ms: float = 0.0) -> float:
        """What a probe is predicted to lose against plain decoding, in ms: its
        `probe_steps` steps at K=`probe_k` cost more than the plain steps that would have
        produced their expected tokens, and the first pays the draft model's catch-up."""
        s1 = self._known_cost(1)
        k = self.probe_k
        step = self._draft_ms.value * k + self._known_cost(k + 1)
        lost = step - self.expected(content, k) * s1
        return catch_up_ms + self.probe_steps * max(lost, 0.0)

    def _hold(self, k: int) -> int:
        self._k = k
        return k

    def _cannot_pay(self) -> bool:
        """Whether the measured costs rule drafting out whatever the acceptance."""
        s1 = self.step_cost(1)
        if s1 is None or self.k_min > 0:
            return False
        if self._draft_ms.count < self.verdict_drafts:
            # No drafting step measured yet: judge the probe itself before paying for it,
            # on the draft cost the model's size predicts (draft_price). A probe costs a
            # whole batch plus the draft model's catch-up on every token it sat out.
            if self._draft_ms.count or self._draft_prior is None:
                return False
            d = self._draft_prior * s1
        else:
            d = self._draft_rel_min * s1
        # The best acceptance seen for any kind of text, and no less than 0.95: better
        # than draft models manage on real text, so "cannot pay" means cannot.
        a = max([0.95] + [self.alpha(label) for label in self._acc])
        best = max(expected_tokens(a, k) / (d * k + self._known_cost(k + 1) + self.rollback_cost(a, k))
                   for k in range(1, self.k_max + 1))
        # Judged at 95%+ acceptance, on the cheapest draft seen: a noisy step cannot tip it.
        return best * s1 < self.verdict_margin

    # --- model-free drafts ---------------------------------------------------------------
    @staticmethod
    def bucket(evidence: int) -> int:
        """Match lengths 1, 2, 3, then 4-7, 8-15, 16-31, 32+ (labelled by their lower end)."""
        if evidence < 4:
            return max(evidence, 1)
        return min(1 << (evidence.bit_length() - 1), 32)

    def free_alpha(self, source: str, evidence: int) -> float:
        b = self.bucket(evidence)
        # 1 -> 0.33, 4 -> 0.67, 16 -> 0.89: longer copies hold. Cautious on purpose: on a
        # CPU a wasted batch costs nearly as much as the tokens it would have saved.
        prior = 1.0 - 2.0 / (b + 2.0)
        s, n = self._free_acc.get((source, b), (0.0, 0.0))
        return (s + self.prior_weight * prior) / (n + self.prior_weight)

    def model_rate(self, content: str) -> float:
        if self._draft_ms.count == 0 or self._cannot_pay():
            return 0.0
        return max((r for k, r in self.rates(content).items() if k > 0), default=0.0)

    def trim(self, source: str, evidence: int, available: int, content: str,
             rival: float = 0.0) -> tuple[int, str]:
        s1 = self.step_cost(1)
        if s1 is None or available <= 0:
            return 0, "measuring a plain step" if s1 is None else "nothing to copy"
        a = self.free_alpha(source, evidence)
        lo = min(self.k_min, available)
        hi = min(self.k_max, available)
        rate = {n: expected_tokens(a, n) / (self._known_cost(n + 1) + self.rollback_cost(a, n))
                for n in range(lo, hi + 1)}
        best = max(rate, key=rate.__getitem__)
        if best > 0 and lo == 0 and rate[best] < rate[0] * (1.0 + self.margin):
            best = 0
        where = f"{source} match {evidence}: α={a:.2f}"
        if rival > rate[best]:
            # In a chain the draft model comes next: on a machine where a long verify costs
            # little more than one token, a good draft model beats a weak copy, and taking
            # the copy would cost the step the model's longer accepted run.
            return 0, f"{where}, the draft model is expected to do better"
        if best == 0:
            return 0, f"{where}, too weak to pay (K=0)"
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
        s1 = self.step_cost(1)  # before this step's sample: what its draft is measured against
        n = drafted + 1
        self._cost_cache.clear()
        if n > 1 and s1 and n in self._step_cost and self._s1_at.get(n):
            # Bring the old estimate to today's load before averaging the new sample in.
            self._step_cost[n].value *= s1 / self._s1_at[n]
        self._step_cost.setdefault(n, _Ema()).add(verify_ms + other_ms, self.beta)
        if s1:
            self._s1_at[n] = s1
        for stats in self._free_acc.values():
            stats[0] *= self.decay
            stats[1] *= self.decay
        if evidence > 0:  # a model-free copy: its bucket learns, the draft model's stats don't
            if drafted > 0:
                stats = self._free_acc.setdefault((source, self.bucket(evidence)), [0.0, 0.0])
                stats[0] += accepted
                stats[1] += accepted + (1 if accepted < drafted else 0)
            return
        # Evidence ages with the steps of its own label: code seen before a stretch of
        # prose still describes code when it comes back.
        self._curves.clear()
        label_stats = self._acc.setdefault(content, [0.0, 0.0])
        for stats in (label_stats, self._acc_all):
            stats[0] *= self.decay
            stats[1] *= self.decay
            if drafted > 0:
                # Each drafted token is a trial until the first rejection; tokens after
                # it were never judged, and tokens never drafted are no trial at all.
                stats[0] += accepted
                stats[1] += accepted + (1 if accepted < drafted else 0)
        if drafted > 0:
            self._drafted_steps[content] = self._drafted_steps.get(content, 0) + 1
            self._draft_ms.add(draft_ms / drafted, self.beta)
            if s1:
                self._draft_rel_min = min(self._draft_rel_min, draft_ms / drafted / s1)


def _interpolate(points: dict[int, float], n: int) -> float:
    """points[n], linear between measured sizes, extended by the last segment's slope
    beyond them (a replay's cost grows about linearly with its tokens)."""
    if n in points:
        return points[n]
    sizes = sorted(points)
    if len(sizes) == 1:
        return points[sizes[0]] * n / sizes[0]
    lo, hi = (sizes[-2], sizes[-1]) if n > sizes[-1] else (sizes[0], sizes[1]) if n < sizes[0] else (
        max(m for m in sizes if m < n), min(m for m in sizes if m > n))
    return max(points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo), 0.0)


if TYPE_CHECKING:  # the type checker proves both controllers take every call the engine makes
    _CONTROLLERS: tuple[KController, ...] = (ThresholdController(), CostModelController())
