"""What-if from an acceptance figure instead of a text: llama.cpp's synthetic acceptance
(`--spec-synth-len L`, `--spec-synth-rates P1,P2,...` in the vendored build's
common/arg.cpp; llama.cpp #27711 calls them the synthetic acceptance length and rates)
priced on a cost profile, for every K.

Their meaning, from common/speculative.cpp (common_speculative_synth_rates_resolve) and
tools/server/server-context.cpp (server_sample_and_accept_synth):
- rates r_1..r_n are unconditional: r_i = P(the first i drafted tokens are all accepted).
  Each in [0, 1], non-increasing, exactly n = the draft limit (--spec-draft-n-max) of
  them. The server accepts draft position i with probability r_i / r_(i-1) once the i-1
  before it were accepted, and stops at the first refusal.
- a length L is the mean acceptance length with the target's own token: 1 + r_1 + ...
  + r_n, within [1, n + 1]. llama.cpp turns it into rates p, p^2, ..., p^n with p found by
  32 halvings so that p + p^2 + ... + p^n = L - 1: the same L at another draft limit is
  another p. L means the mean length at that K.

Here: `--acceptance-rates r_1..r_n` predicts K = 1..n (K < n takes the first K rates:
a shorter draft of the same drafter has the same chance that its first i tokens are
accepted, and llama.cpp given those K rates means the same). `--acceptance-length L`
predicts every K where K + 1 >= L, in llama.cpp's meaning (L at each K). With
`--at-k K0` the length was read at K0 (off a server running K0): its p is solved there,
as llama.cpp would at K0, and the rates p, p^2, ... carry to every K.

The prediction is the expectation of simulate.py's step accounting under that
acceptance. Steps are independent, so over a long run tok/s = E[tokens per step] /
E[ms per step]:
  tokens per step  1 + r_1 + ... + r_K
  ms per step      drafting + verify_ms(K + 1) + the step overhead (+ restore and replay
                   of the accepted tokens after a partial acceptance, on a checkpointing target)
  drafting         a draft model: K single decodes, the first being its sync with the last
                   committed tokens, a 2-token batch after a step that accepted its whole draft
                   (probability r_K; feed_ms(2)) and 1 token otherwise: SimDraftModel's own
                   bookkeeping. A model-free drafter: one proposal (the profile's free_ms, else 0).
`simulate_steps` runs the same acceptance through simulate() itself, with random draws
as llama-server makes them; tests hold the closed form to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specdash.engine.drafters.base import Draft, NoDrafter
from specdash.engine.settings import EngineSettings, SamplingParams
from specdash.contract.errors import SpecdashError
from specdash.contract.limits import K_CAP
from specdash.costs.profile import Profile
from specdash.tuning.whatif.simulate import SimDraftModel, SimResult, TimedFree, simulate
from specdash.tuning.whatif.transcript import Forced, Transcript

MODEL, FREE = "draft model", "model-free"


# --- llama.cpp's parameters -----------------------------------------------------------

def parse_rates(text: str) -> tuple[float, ...]:
    """`--acceptance-rates` as llama.cpp checks `--spec-synth-rates`; SpecdashError (one line)."""
    parts = [p.strip() for p in text.split(",")]
    flag = f"--acceptance-rates {text}"
    if not text.strip() or any(not p for p in parts):
        raise SpecdashError(f"{flag}: give comma-separated probabilities, e.g. 0.8,0.6,0.4 (r_i = the chance "
                            "that the first i drafted tokens are all accepted)")
    rates: list[float] = []
    for i, part in enumerate(parts, 1):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise SpecdashError(f"{flag}: position {i}'s {part!r} must be a probability within [0, 1]")
        if rates and value > rates[-1]:
            raise SpecdashError(f"{flag}: position {i}'s {value:g} is above position {i - 1}'s {rates[-1]:g}: the rates "
                                "are unconditional (the first i tokens all accepted), so they never increase")
        rates.append(value)
    if len(rates) > K_CAP:
        raise SpecdashError(f"{flag}: {len(rates)} rates; at most {K_CAP} (one per draft position, K <= {K_CAP})")
    return tuple(rates)


def check_length(length: float) -> float:
    if not math.isfinite(length) or not 1.0 <= length <= K_CAP + 1:
        raise SpecdashError(f"--acceptance-length {length:g}: must be a number within [1, {K_CAP + 1}] (the mean "
                            "acceptance length, the target's own token included: 1 = nothing accepted, K + 1 = "
                            "every draft accepted whole)")
    return length


def length_rates(length: float, n_max: int) -> list[float]:
    """llama.cpp's rates for a mean acceptance length at draft limit n_max, bisection and
    all (common_speculative_synth_rates_resolve), so a K means here what it means there."""
    length_max = n_max + 1.0
    if not 1.0 <= length <= length_max:
        raise SpecdashError(f"--acceptance-length {length:g} at K={n_max}: must be within [1, {length_max:g}] "
                            "(llama.cpp refuses a mean length above K + 1)")
    p = 0.0
    if length == length_max:
        p = 1.0
    elif length > 1.0:
        lo, hi = 0.0, 1.0
        for _ in range(32):
            mid = 0.5 * (lo + hi)
            total, term = 0.0, mid
            for _ in range(n_max):
                total += term
                term *= mid
            if total < length - 1.0:
                lo = mid
            else:
                hi = mid
        p = 0.5 * (lo + hi)
    return geometric(p, n_max)


def geometric(p: float, n: int) -> list[float]:
    """p, p^2, ..., p^n, multiplied out as llama.cpp does (the same doubles)."""
    rates, rate = [], p
    for _ in range(n):
        rates.append(rate)
        rate *= p
    return rates


@dataclass(frozen=True)
class Synthetic:
    """A synthetic acceptance, as given on the command line."""

    length: float | None = None
    rates: tuple[float, ...] = ()
    at_k: int | None = None  # the K the length was read at (its p carries to every K)

    def __post_init__(self) -> None:
        if (self.length is None) == (not self.rates):
            raise SpecdashError("give one of --acceptance-length and --acceptance-rates")
        if self.length is not None:
            check_length(self.length)
        if self.at_k is not None:
            if self.length is None:
                raise SpecdashError("--at-k: says at which K an --acceptance-length was read; not with "
                                    "--acceptance-rates (rates are per position already)")
            if not 1 <= self.at_k <= K_CAP:
                raise SpecdashError(f"--at-k {self.at_k}: must be a K within 1..{K_CAP}")
            length_rates(self.length, self.at_k)  # L must fit K0: one line if not

    @property
    def per_token(self) -> float | None:
        """--at-k: the per-token acceptance p solved at K0."""
        if self.length is None or self.at_k is None:
            return None
        rates = length_rates(self.length, self.at_k)
        return rates[0] if rates else None

    def why_not(self, k: int) -> str | None:
        """Why K cannot be predicted from this acceptance (None: it can)."""
        if self.rates and k > len(self.rates):
            return f"--acceptance-rates gives {len(self.rates)} positions; K={k} needs {k} (as llama.cpp does)"
        if self.length is not None and self.at_k is None and k + 1 < self.length:
            return (f"--acceptance-length {self.length:g} is above K+1 = {k + 1} (llama.cpp refuses it: "
                    "a K-token draft keeps at most K + 1 tokens a step)")
        return None

    def rates_at(self, k: int) -> list[float]:
        """r_1..r_K at draft limit K."""
        why = self.why_not(k)
        if why is not None:
            raise SpecdashError(f"--ks {k}: {why}")
        if self.rates:
            return list(self.rates[:k])
        assert self.length is not None
        p = self.per_token
        if p is not None:
            return geometric(p, k)
        return length_rates(self.length, k)

    def default_ks(self) -> list[int]:
        top = len(self.rates) if self.rates else 32
        return [k for k in range(1, top + 1) if self.why_not(k) is None]

    def describe(self) -> str:
        if self.rates:
            return (f"rates {','.join(f'{r:g}' for r in self.rates)} (llama.cpp --spec-synth-rates: the chance "
                    "that the first i drafted tokens are all accepted)")
        if self.at_k is not None:
            return (f"mean acceptance length {self.length:g} read at K={self.at_k}: {self.per_token:.4f} per token "
                    "(llama.cpp's geometric rates at that K), carried to every K")
        return (f"mean acceptance length {self.length:g} at every K (llama.cpp --spec-synth-len: geometric rates "
                "solved per K)")

    def to_json(self) -> dict[str, Any]:
        return {"acceptance_length": self.length, "acceptance_rates": list(self.rates) or None, "at_k": self.at_k,
                "per_token": self.per_token}


# --- the prediction -------------------------------------------------------------------

@dataclass
class SynthRow:
    drafter: str  # MODEL | FREE
    k: int
    rates: list[float]
    tokens_per_step: float
    step_ms: float

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 * self.tokens_per_step / self.step_ms if self.step_ms > 0 else 0.0

    @property
    def acceptance(self) -> float:
        """Expected accepted / drafted tokens (every step drafts K)."""
        return sum(self.rates) / self.k

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + sum(self.rates)

    def to_json(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "k": self.k, "tokens_per_s": self.tokens_per_s,
                "acceptance_rate": self.acceptance, "mean_accepted_length": self.mean_accepted_length,
                "tokens_per_step": self.tokens_per_step, "step_ms": self.step_ms, "rates": self.rates}


def plain_tokens_per_s(profile: Profile) -> float:
    """simulate()'s plain decoding: one target token a step, plus the step overhead."""
    return 1000.0 / (profile.verify_ms(1) + profile.overhead_ms)


def predict(profile: Profile, rates: Sequence[float], drafter: str) -> SynthRow:
    """The expected step at K = len(rates) (see the module's docstring)."""
    k = len(rates)
    if k < 1:
        raise ValueError("a synthetic step drafts at least one token")
    # P(exactly a accepted): r_a - r_(a+1), with r_0 = 1 and nothing beyond r_K.
    full = [1.0, *rates]
    exactly = [full[a] - (full[a + 1] if a < k else 0.0) for a in range(k + 1)]
    verify = profile.verify_ms(k + 1)
    if profile.restore_ms or profile.replay_ms:
        verify += sum(exactly[a] * (profile.restore_ms + profile.replay_ms * (a + 1)) for a in range(k))
    if drafter == MODEL:
        whole = rates[-1]  # the last step accepted its whole draft: a 2-token sync
        draft = (1 - whole) * profile.feed_ms(1) + whole * profile.feed_ms(2) + (k - 1) * profile.draft_ms
    else:
        draft = profile.free_ms or 0.0
    return SynthRow(drafter, k, list(rates), 1.0 + sum(rates), draft + verify + profile.overhead_ms)


def drafters_of(profile: Profile) -> list[str]:
    """A draft model's rows need its costs in the profile; model-free rows always fit."""
    return [MODEL, FREE] if profile.draft_ms > 0 else [FREE]


@dataclass
class SynthReport:
    synthetic: Synthetic
    profile: Profile
    ks: list[int]
    rows: list[SynthRow] = field(default_factory=list)
    left_out: dict[int, str] = field(default_factory=dict)  # K -> why it was not predicted

    @property
    def plain(self) -> float:
        return plain_tokens_per_s(self.profile)

    def best(self, drafter: str) -> SynthRow | None:
        """The fastest K for this drafter, or None when none beats plain decoding."""
        rows = [r for r in self.rows if r.drafter == drafter]
        top = max(rows, key=lambda r: r.tokens_per_s, default=None)
        return top if top is not None and top.tokens_per_s > self.plain else None

    def to_json(self) -> dict[str, Any]:
        best = {d: (None if (b := self.best(d)) is None else b.k) for d in dict.fromkeys(r.drafter for r in self.rows)}
        return {"synthetic": self.synthetic.to_json(), "profile": self.profile.to_json(),
                "plain": {"tokens_per_s": self.plain}, "fixed": [r.to_json() for r in self.rows],
                "best_k": best, "left_out": {str(k): why for k, why in self.left_out.items()}}

    def text(self) -> str:
        prof = self.profile
        out = [f"what-if from a synthetic acceptance: {self.synthetic.describe()}",
               f"profile {prof.name}" + (f" ({prof.note})" if prof.note else ""),
               f"plain decoding: {self.plain:.2f} tok/s predicted"]
        for drafter in dict.fromkeys(r.drafter for r in self.rows):
            rows = [r for r in self.rows if r.drafter == drafter]
            cost = (f"{prof.draft_ms:.2f} ms a drafted token, {prof.feed_ms(2):.2f} ms a 2-token sync"
                    if drafter == MODEL else f"{prof.free_ms or 0.0:.2f} ms a proposal")
            best = self.best(drafter)
            out += ["", f"{drafter} ({cost}):",
                    f"  {'K':>3} {'tok/s':>8} {'vs plain':>8} {'accept':>7} {'mean len':>8}"]
            for r in rows:
                mark = "  <- best" if r is best else ""
                out.append(f"  {r.k:>3} {r.tokens_per_s:8.2f} {r.tokens_per_s / self.plain:7.2f}x "
                           f"{r.acceptance:7.1%} {r.mean_accepted_length:8.2f}{mark}")
            if best is None:
                out.append(f"  no K beats plain decoding ({self.plain:.2f} tok/s) at this acceptance: run K=0")
            else:
                out.append(f"  best K={best.k}: {best.tokens_per_s:.2f} tok/s, {best.tokens_per_s / self.plain:.2f}x plain")
        if self.left_out:
            ks = sorted(self.left_out)
            out += ["", f"not predicted: K={_ranges(ks)}: {self.left_out[ks[0]]}"]
        return "\n".join(out)


def report(synthetic: Synthetic, profile: Profile, ks: Sequence[int] | None = None) -> SynthReport:
    """Every K (given, or every K the acceptance can say something about) for every
    drafter the profile prices. Given Ks the acceptance cannot take are a SpecdashError."""
    chosen = list(ks) if ks is not None else synthetic.default_ks()
    if ks is not None:
        for k in chosen:
            synthetic.rates_at(k)  # one line naming the K if it cannot be predicted
    out = SynthReport(synthetic, profile, chosen)
    if not chosen:
        raise SpecdashError(f"no K can be predicted from {synthetic.describe()}")
    for drafter in drafters_of(profile):
        for k in chosen:
            out.rows.append(predict(profile, synthetic.rates_at(k), drafter))
    if ks is None:
        top = len(synthetic.rates) if synthetic.rates else 32
        out.left_out = {k: why for k in range(1, top + 1) if (why := synthetic.why_not(k)) is not None}
    return out


def _ranges(ks: list[int]) -> str:
    return f"{ks[0]}" if len(ks) == 1 else f"{ks[0]}..{ks[-1]}" if ks == list(range(ks[0], ks[-1] + 1)) \
        else ",".join(map(str, ks))


# --- the same acceptance through simulate() -------------------------------------------

WRONG = -2  # a token id no synthetic text holds (they are 1..n)


def draw_accepted(rng: np.random.Generator, rates: Sequence[float]) -> int:
    """How many of a K-token draft the server accepts: position i with probability
    r_i / r_(i-1), stopping at the first refusal (server_sample_and_accept_synth)."""
    prev = 1.0
    for i, rate in enumerate(rates):
        if not rng.random() < (rate / prev if prev > 0 else 0.0):
            return i
        prev = rate
    return len(rates)


class _SynthDraftModel(SimDraftModel):
    """SimDraftModel (its KV bookkeeping and costs) whose teacher-forced argmax is written
    just before each draft: right for the first a positions (a drawn), wrong at a."""

    def __init__(self, tr: Transcript, forced: Forced, profile: Profile, rates: Sequence[float],
                 rng: np.random.Generator):
        super().__init__(tr, forced, profile, MODEL)
        self._rates, self._rng = list(rates), rng

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        if k > 0:
            j0 = len(tokens) - self.n_prompt
            a = draw_accepted(self._rng, self._rates[:k])
            for i in range(min(a + 1, k)):
                j = j0 + i
                if j < len(self.forced.argmax) - 1:
                    self.forced.argmax[j] = self.seq[j] if i < a else WRONG
        return super().propose(tokens, k, sampling, rng)


class _SynthCopy(NoDrafter):
    """A model-free drafter whose copy is right for the first a positions (a drawn); the
    rest of its protocol is plain decoding's (nothing to catch up, prefill or forget)."""

    name = label = "synthetic"
    relative_cost: float | None = None

    def __init__(self, seq: Sequence[int], n_prompt: int, rates: Sequence[float], rng: np.random.Generator):
        self.seq, self.n_prompt, self._rates, self._rng = seq, n_prompt, list(rates), rng

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        if k <= 0:
            return Draft.empty(self.name)
        j0 = len(tokens) - self.n_prompt
        a = draw_accepted(self._rng, self._rates[:k])
        return Draft([*self.seq[j0 : j0 + a], *[WRONG] * (k - a)], None, self.name)


def synthetic_transcript(n_tokens: int) -> Transcript:
    """A text of n distinct token ids (1..n) after a one-token prompt: what is accepted is
    decided by the draws, never by the text."""
    seq = list(range(1, n_tokens + 1))
    rows = n_tokens + 1
    forced = Forced(np.zeros(rows, dtype=np.int64), np.ones(rows), np.ones(rows))
    return Transcript(prompt=[0], seq=seq, n_generated=n_tokens, eos=False, max_tokens=n_tokens,
                      n_ctx=n_tokens + 2 * K_CAP + 8, n_batch=512, pieces=[b""] * n_tokens, prompt_text="",
                      target="synthetic", draft=forced)


def simulate_steps(profile: Profile, rates: Sequence[float], drafter: str, n_tokens: int = 4000,
                   seed: int = 0) -> SimResult:
    """The synthetic acceptance at K = len(rates) through simulate()'s own step loop,
    with random draws: a check on predict(), which is its expectation."""
    tr = synthetic_transcript(n_tokens)
    rng = np.random.default_rng(seed)
    assert tr.draft is not None
    inner: Any
    if drafter == MODEL:
        inner = _SynthDraftModel(tr, tr.draft, profile, rates, rng)
    else:
        inner = TimedFree(_SynthCopy(tr.seq, len(tr.prompt), rates, rng), profile.free_ms or 0.0)
    settings = EngineSettings(draft="none", k=len(rates), adaptive=False, max_tokens=n_tokens)
    return simulate(tr, inner, profile, settings, name=drafter, k=len(rates))
