"""What a draft source is worth: how often its tokens are accepted and what drafting
costs, priced against the target's step costs (engine/target_costs.py) as expected
tokens per ms.

Two kinds of source, one object per source:

- DraftPricing: a source that spends time per drafted token (a draft model; a
  translated or MTP drafter would be one too). Its acceptance is learned per content
  label, its cost per token measured; rates() gives E(K) / cost(K) for every K, and
  cannot_pay() says when costs alone rule it out.
- CopyPricing: model-free copies (lookup, suffix), free to propose, whose acceptance is
  learned per (source, match-length bucket); rates() prices verifying n of a copy's
  tokens.

Neither chooses anything: the controller (engine/controller.py) compares their rates
with plain decoding's and decides. Nothing here is tied to one drafter, so a controller
choosing among sources keeps one pricing object per source over one TargetCosts.
"""

from __future__ import annotations

from specdash.engine.controller_settings import ControllerSettings
from specdash.engine.target_costs import Ema, TargetCosts

# Match lengths below this are buckets of their own (1, 2, 3 tokens: each more token
# of match changes a copy's odds a lot); from here on buckets double (4-7, 8-15, ...).
_EXACT_BELOW = 4
# Matches this long or longer share one bucket: they are rare, and hold about alike.
_LONGEST_BUCKET = 32
# The Beta posterior's parameters are kept above this so a label whose estimate is
# exactly 0 or 1 still has a proper curve (numerical, not tuned).
_BETA_FLOOR = 1e-6


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens committed per step when each drafted token is accepted with probability
    alpha until the first rejection, plus the target's own token: 1 + a + ... + a^k
    (Leviathan et al. 2023)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _decay(settings: ControllerSettings) -> float:
    """Per-step factor that halves evidence every settings.half_life steps."""
    return float(0.5 ** (1.0 / settings.half_life))  # float(): a float power is typed Any


class DraftPricing:
    """A draft source that spends time per drafted token (the draft model).

      a     per content label: accepted / (accepted + rejections) over recent drafts, the
            estimate of a per-token acceptance that fits E(K) (accepted / drafted would
            count the tokens after a rejection as failures and underrate long drafts).
            Counts decay by half every `half_life` steps of their label, so old evidence
            fades even while nothing is drafted. A label with little evidence leans on
            all labels' estimate, which leans on `prior_alpha`.
      d     draft ms per drafted token (moving average of draft_ms / drafted), and the
            cheapest seen relative to the target's single step when it was measured
            (both are decodes on the same cores: load slows them alike).

    Before any draft is measured, price() gives the cost the source's size predicts,
    and whether K is only a ceiling for it (it ends drafts it doubts)."""

    def __init__(self, settings: ControllerSettings, k_min: int, k_max: int) -> None:
        self.settings = settings
        self.k_min = k_min
        self.k_max = k_max
        self._decay = _decay(settings)
        self._draft_ms = Ema()  # per drafted token
        self._rel_min = float("inf")  # cheapest draft ms per token / s(1) at the time
        self._acc: dict[str, list[float]] = {}  # label -> [accepted, trials], decayed
        self._acc_all = [0.0, 0.0]
        self._curves: dict[str, tuple[list[float], list[float]]] = {}  # label -> (hazard, survival)
        self._drafted_steps: dict[str, int] = {}  # content label -> drafting steps measured
        self._prior: float | None = None  # draft ms per token / target ms per step, predicted
        self.k_ceiling = False  # K only caps the drafts

    def price(self, relative_cost: float | None, k_ceiling: bool = False) -> None:
        """What a drafted token should cost relative to one target step before any is
        measured (the model's size over the target's: decoding on a CPU is memory-bound);
        None: unknown, a probe will measure it. k_ceiling: the source ends drafts it
        doubts before K."""
        self._prior = relative_cost
        self.k_ceiling = k_ceiling

    # --- what was measured --------------------------------------------------------------
    @property
    def measured_steps(self) -> int:
        """Drafting steps whose cost was measured."""
        return self._draft_ms.count

    @property
    def ms_per_token(self) -> float:
        """Measured draft ms per drafted token (0 before any)."""
        return self._draft_ms.value

    def token_ms_estimate(self, s1: float) -> float:
        """Draft ms per drafted token: measured, else what the model's size predicts
        (price) for a target step of `s1` ms, else 0 (unknown)."""
        if self._draft_ms.count:
            return self._draft_ms.value
        return self._prior * s1 if self._prior is not None else 0.0

    def drafted_steps(self, content: str) -> int:
        """Drafting steps measured under this content label."""
        return self._drafted_steps.get(content, 0)

    def observe(self, drafted: int, accepted: int, draft_ms: float, content: str, s1: float | None) -> None:
        """A step that was not a model-free copy (a draft of this source, or a plain step,
        which ages this label's evidence); s1: the target's single-step ms before it."""
        # Evidence ages with the steps of its own label: code seen before a stretch of
        # prose still describes code when it comes back.
        self._curves.clear()
        label_stats = self._acc.setdefault(content, [0.0, 0.0])
        for stats in (label_stats, self._acc_all):
            stats[0] *= self._decay
            stats[1] *= self._decay
            if drafted > 0:
                # Each drafted token is a trial until the first rejection; tokens after
                # it were never judged, and tokens never drafted are no trial at all.
                stats[0] += accepted
                stats[1] += accepted + (1 if accepted < drafted else 0)
        if drafted > 0:
            self._drafted_steps[content] = self._drafted_steps.get(content, 0) + 1
            self._draft_ms.add(draft_ms / drafted, self.settings.beta, self.settings.ema_clip)
            if s1:
                self._rel_min = min(self._rel_min, draft_ms / drafted / s1)

    # --- acceptance ---------------------------------------------------------------------
    def alpha(self, content: str) -> float:
        w = self.settings.prior_weight
        s_all, n_all = self._acc_all
        a_all = (s_all + w * self.settings.prior_alpha) / (n_all + w)
        s, n = self._acc.get(content, (0.0, 0.0))
        return (s + w * a_all) / (n + w)

    def curve(self, content: str) -> tuple[list[float], list[float]]:
        """(hazard, survival) of the drafts for `content`, by position j = 1..k_max:
        survival[j] = P(drafted tokens 1..j all accepted), hazard[j] = P(token j
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
        w = n + self.settings.prior_weight  # the weight alpha() gives this label's estimate
        big_a, big_b = max(a * w, _BETA_FLOOR), max((1.0 - a) * w, _BETA_FLOOR)
        hazard = [0.0] * (self.k_max + 2)
        survival = [1.0] * (self.k_max + 2)
        for j in range(1, self.k_max + 2):
            hazard[j] = big_b / (big_a + big_b + j - 1)
            if j <= self.k_max:
                survival[j] = survival[j - 1] * (1.0 - hazard[j])
        self._curves[content] = (hazard, survival)
        return hazard, survival

    def expected(self, content: str, k: int) -> float:
        """Tokens a K-token draft step is expected to commit for `content`: the target's
        own token plus each drafted position's survival."""
        return 1.0 + sum(self.curve(content)[1][1 : k + 1])

    # --- prices -------------------------------------------------------------------------
    def rates(self, costs: TargetCosts, content: str, catch_up_ms: float = 0.0) -> dict[int, float]:
        """Expected tokens per ms for each K in range, K = 0 (plain decoding) included:
        E(K) / (d K + s(K + 1) + rollback(K)), and drafting (K > 0) first pays
        `catch_up_ms`. Empty until the target's costs are known."""
        hazard, survival = self.curve(content)
        d = self._draft_ms.value
        out: dict[int, float] = {}
        tokens = 1.0
        for k in range(0, self.k_max + 1):
            tokens += survival[k] if k else 0.0
            if k < self.k_min:
                continue
            s = costs.step_cost(k + 1)
            if s is None:
                return {}
            out[k] = tokens / (d * k + s + (catch_up_ms if k else 0.0) + costs.rollback_cost_curve(survival, hazard, k))
        return out

    def cannot_pay(self, costs: TargetCosts) -> bool:
        """Whether the measured costs rule drafting out whatever the acceptance: even at
        settings.verdict_alpha (or the best acceptance measured for any label, if higher)
        no K would beat plain decoding by settings.verdict_margin. Judged on the cheapest
        draft cost seen, relative to the target's single step, so neither a noisy step
        nor load on the machine tips it, while a new cost curve can."""
        s1 = costs.step_cost(1)
        if s1 is None or self.k_min > 0:
            return False
        if self._draft_ms.count < self.settings.verdict_drafts:
            # No drafting step measured yet: judge the probe itself before paying for it,
            # on the draft cost the model's size predicts (price). A probe costs a
            # whole batch plus the draft model's catch-up on every token it sat out.
            if self._draft_ms.count or self._prior is None:
                return False
            d = self._prior * s1
        else:
            d = self._rel_min * s1
        a = max([self.settings.verdict_alpha] + [self.alpha(label) for label in self._acc])
        best = max(expected_tokens(a, k) / (d * k + costs.known_cost(k + 1) + costs.rollback_cost(a, k))
                   for k in range(1, self.k_max + 1))
        return best * s1 < self.settings.verdict_margin


class CopyPricing:
    """Model-free copies (lookup, suffix): free to propose, so the source offers its
    longest copy and the controller decides how much of it to verify. Acceptance is kept
    per source and per match-length bucket (a copy after a 20-token match is far more
    likely right than after a 1-token one), with a prior that grows with the match
    length (settings.copy_prior_doubt). Bucket counts decay every step, so a bucket that
    stopped being drafted drifts back to its prior and is tried again."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self._decay = _decay(settings)
        self._acc: dict[tuple[str, int], list[float]] = {}  # (source, bucket) -> [accepted, trials]

    @staticmethod
    def bucket(evidence: int) -> int:
        """Match lengths 1, 2, 3, then 4-7, 8-15, 16-31, 32+ (labelled by their lower end)."""
        if evidence < _EXACT_BELOW:
            return max(evidence, 1)
        return min(1 << (evidence.bit_length() - 1), _LONGEST_BUCKET)

    @staticmethod
    def longest(evidence: int) -> bool:
        """Whether a match of `evidence` tokens is in the longest bucket (32+)."""
        return evidence >= _LONGEST_BUCKET

    def alpha(self, source: str, evidence: int) -> float:
        b = self.bucket(evidence)
        # 1 -> 0.33, 4 -> 0.67, 16 -> 0.89 at the default doubt: longer copies hold.
        doubt = self.settings.copy_prior_doubt
        prior = 1.0 - doubt / (b + doubt)
        w = self.settings.prior_weight
        s, n = self._acc.get((source, b), (0.0, 0.0))
        return (s + w * prior) / (n + w)

    def trials(self, source: str, evidence: int) -> float:
        """Measured trials (decayed) behind the bucket of a `source` copy after a match of
        `evidence` tokens: below ControllerSettings.explore_trials its price is mostly the prior."""
        return self._acc.get((source, self.bucket(evidence)), (0.0, 0.0))[1]

    def observe(self, source: str, evidence: int, drafted: int, accepted: int) -> None:
        """Any step: every bucket ages; a copy (evidence > 0) that was verified adds its
        trials to its bucket."""
        for stats in self._acc.values():
            stats[0] *= self._decay
            stats[1] *= self._decay
        if evidence > 0 and drafted > 0:
            stats = self._acc.setdefault((source, self.bucket(evidence)), [0.0, 0.0])
            stats[0] += accepted
            stats[1] += accepted + (1 if accepted < drafted else 0)

    def rates(self, costs: TargetCosts, source: str, evidence: int, lo: int, hi: int) -> dict[int, float]:
        """Expected tokens per ms of verifying n = lo..hi tokens of a copy (n = 0: a plain
        step) made after a match of `evidence` tokens. Costs must be known."""
        a = self.alpha(source, evidence)
        return {n: expected_tokens(a, n) / (costs.known_cost(n + 1) + costs.rollback_cost(a, n))
                for n in range(lo, hi + 1)}
