"""The adaptive-K controllers' tuning values: each field's unit, default, and what chose it.

Every number the controllers decide with is here, so a reader can tell a measured value
from a guess. "What chose it" cites the commit or results file that measured it; where
nothing was measured it says so. Most of the cost model's values were written with the
controller's first version (1928b3c) and were never swept one by one: the controller was
then judged as a whole, by paired real runs against plain decoding
(benchmarks/results/adaptive-never-loses*.txt) and by whatif against the hindsight-best
fixed K (benchmarks/results/whatif-controller-vs-oracle*.txt). A change to any of them
is checked the same way: `python benchmarks/whatif_controller.py` re-runs in seconds on
cached texts (--cache).

The K range itself (k_min, k_max) and the K adaptive starts at are the user's settings
(engine/settings.py), not tuning: the controllers take them as constructor arguments.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """CostModelController's tuning (engine/controller.py), grouped by the rule each feeds."""

    # --- acceptance: how fast evidence fades and what stands in for it ------------------
    half_life: float = 32.0
    """Steps. Acceptance counts halve every `half_life` steps: a content label's counts
    on the steps taken under that label, a copy bucket's on every step. Chosen: 1928b3c,
    no measurement recorded."""

    prior_alpha: float = 0.5
    """Per-token acceptance assumed before anything was drafted (all labels' estimate leans
    on it). Chosen: 1928b3c, no measurement recorded."""

    prior_weight: float = 4.0
    """Pseudo-trials: how much a prior weighs against measured trials. A label's estimate
    leans on all labels' with this weight, all labels' on `prior_alpha`, a copy bucket's
    on its match-length prior; it also sets how wide the Beta posterior behind E(K) is
    while evidence is thin. Chosen: 1928b3c, no measurement recorded."""

    copy_prior_doubt: float = 2.0
    """Pseudo-rejections in a model-free copy's prior: a copy after a match of b tokens is
    priced at b / (b + copy_prior_doubt) per-token acceptance (1 -> 0.33, 4 -> 0.67,
    16 -> 0.89). Chosen: 89e04ea raised it from 1 (b / (b + 1)) because on a CPU a wasted
    verify batch costs about what it would have saved, so a copy must be likelier right
    before it is tried; no A/B of the two values was recorded."""

    # --- costs: the target's batch curve and the draft model's price --------------------
    beta: float = 0.25
    """Weight of a new sample in the moving averages of step cost (per batch size) and of
    draft ms per token: about the last four samples count. Chosen: 1928b3c, no
    measurement recorded."""

    ema_clip: float = 3.0
    """Times the running average: a sample above it enters clipped to it, so one step
    preempted by another process does not triple an estimate while a real change is
    still followed within a few steps. Chosen: 1928b3c, no measurement recorded."""

    prior_slope: float = 0.35
    """Extra cost per extra batch token, relative to a one-token step, used to extend the
    cost curve while only one batch size has been measured. Since 89e04ea the engine
    times batches of 1..33 tokens before the first decision (seed_costs), so this only
    prices sizes before calibration or where none runs. Chosen: 1928b3c, no measurement
    recorded; shared/MODELS.md's llama-bench figures on a slower machine of this kind
    (n=5 at 1.8-2.4x a single step, n=9 3.4x) give 0.2-0.35."""

    fit_weight_cap: int = 8
    """Samples: in the least-squares slope that extends the cost curve beyond the measured
    sizes, a size weighs its sample count up to this, so the size decoded most (one
    token, at K=0) does not drown the others. Chosen: 1928b3c, no measurement recorded."""

    extrapolation_floor: float = 0.05
    """Fraction: a cost extrapolated below the smallest measured batch size is never under
    this share of that size's cost (a steep fitted slope would otherwise reach zero or
    below). A guard, not a tuned value: 1928b3c, no measurement recorded."""

    # --- the choice of K ----------------------------------------------------------------
    hysteresis: float = 0.03
    """Relative: a new K replaces the current one only if its predicted tokens per ms
    beat the current K's by more than this, so measurement noise does not flip K.
    Chosen: 1928b3c, no measurement recorded."""

    ceiling_tol: float = 0.05
    """Relative: when K is only a ceiling (the drafter ends the drafts it doubts: the joint
    cut), the biggest K predicted within this of the best is taken. Chosen: afcc773;
    whatif, 9 texts x 3 profiles x 4 drafters with draft_p_joint 0.1, adaptive within 5%
    of the hindsight oracle in 103/108 cases against 95 without the lean
    (whatif-controller-vs-oracle-384-k-ceiling.txt), 102 against 96 on texts where the cut
    follows the draft's own continuation (...-384-off-text.txt). Only 5% was tried."""

    margin: float = 0.08
    """Relative: a model-free copy is verified only when predicted to beat plain decoding
    by this. Chosen: 0dd871a; copies predicted at 1.05-1.10x plain lost the adaptive chain
    its JSON extraction (0.896x plain by CPU in the old rows of adaptive-never-loses.txt;
    0.976x in the new rows, which also carry 29c039d's probe budget and verdict). Only 8%
    was tried."""

    # --- the verdict: costs alone rule the draft model out ------------------------------
    verdict_alpha: float = 0.95
    """Per-token acceptance the verdict assumes (or the best measured for any label, if
    higher): drafting is ruled out only when even this could not beat plain decoding.
    Chosen: 4c3073e, no measurement recorded: meant to be above what a draft model
    manages on real text (the default pair's acceptance at K=2: 49-90% on four built-in
    prompts, but 100% on json-extraction, in bench-default-pair-2threads.txt; hence the
    best measured when higher)."""

    verdict_margin: float = 1.0
    """Times plain decoding's tokens per ms: the verdict rules drafting out when its best
    rate at `verdict_alpha` is below this. 89e04ea set 0.9 (a margin against one noisy
    step); 417edc1 set 1.0, the break-even, since judging at 95%+ acceptance on the
    cheapest draft cost seen already leaves that margin. No A/B of the two recorded."""

    verdict_drafts: int = 1
    """Drafting steps: before this many are measured the verdict judges the draft model's
    price predicted from its size (price_draft), after it the cheapest measured draft
    cost. Chosen: 4c3073e waited for 3; 89e04ea lowered it to 1 once catch-up time was
    kept out of the draft cost, so one step measures it. No measurement recorded."""

    # --- probing from K = 0 -------------------------------------------------------------
    probe_k: int = 4
    """Tokens: the K of a probe from K=0 (held within 1..k_max). Chosen: 1928b3c, no
    measurement recorded."""

    probe_steps: int = 2
    """Steps per probe; also how many drafting steps a content label may have had and
    still get its first look (one probe outside the budget). Chosen: 1928b3c, no
    measurement recorded."""

    probe_every: int = 16
    """K=0 steps before a probe; the interval doubles after each probe that does not turn
    drafting back on, and returns to this when the content label changes. Chosen:
    1928b3c, no measurement recorded."""

    probe_max: int = 256
    """K=0 steps: the longest probe interval the doubling reaches. Chosen: 1928b3c, no
    measurement recorded."""

    probe_budget: float = 0.015
    """Fraction of a plain step: each K=0 step adds this share of its cost to the budget a
    probe's predicted loss is paid from, so probing costs at most this share of the time
    at K=0. Chosen: 29c039d; with unbudgeted probes every 16-64 steps (and a verdict that
    reopened on load noise) adaptive K with the draft model ran 0.84x plain on a code
    edit; with the budget (and 0dd871a's copy margin) every median of adaptive vs plain was
    >= 0.976x by CPU (adaptive-never-loses.txt, 4 held-out prompts, paired rounds). Only
    1.5% was tried."""

    # --- asking copy sources (engine/ask_backoff.py) ------------------------------------
    ask_patience: float = 0.5
    """Plain steps: how much of a plain step's time a copy source's asks may spend finding
    nothing in a row before it is asked less often (so N misses = ask_patience * s(1) /
    its measured ask ms). Chosen with issue 55, no A/B recorded: half a step is a loss
    inside the rounds' noise, and a cheap source (lookup, ~0.1 ms) is then never backed
    off at all."""

    ask_share: float = 0.01
    """Fraction of a plain step: while backed off, a source is asked every M steps, M
    chosen so its asks cost at most this share of plain decoding's time (M = its ask ms
    / (ask_share * s(1)), within 1..ask_every_max). Chosen with issue 55, no A/B recorded."""

    ask_every_max: int = 32
    """Steps: the longest interval between asks of a backed-off source (a new match is
    noticed within this many tokens). Chosen with issue 55, no A/B recorded."""

    # --- exploring: a decision that rests on a prior, not on measurements ---------------
    explore_trials: float = 2.0
    """Trials: a copy bucket with fewer than this many measured trials (decayed) is priced
    mostly by its prior, so verifying it is an exploration, judged by its outcome; one
    that lost against plain decoding is not explored again in the same request until a
    longer match or a new kind of text comes (CostModelController.trim). Chosen with
    issue 55, no A/B recorded."""


@dataclass(frozen=True, slots=True)
class ThresholdSettings:
    """ThresholdController's rule (engine/controller.py): the research's +4/-4 baseline,
    written down with 1928b3c as the rule to compare against, not tuned here."""

    window: int = 128
    """Drafted tokens: the acceptance rate is taken over at most the last `window` drafted
    since K last changed."""

    min_tokens: int = 32
    """Drafted tokens a decision needs (at most `window`): K moves at most once per this
    many."""

    high: float = 0.8
    """Acceptance rate above which K rises by `step`."""

    low: float = 0.6
    """Acceptance rate below which K falls by `step` (never below 1)."""

    step: int = 4
    """Tokens K moves by."""
