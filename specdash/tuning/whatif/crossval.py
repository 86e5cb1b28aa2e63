"""The best fixed (drafter, K) chosen without hindsight: picked on one half of the text and
scored on the other, both ways.

The oracle (report.Report.best) picks the fastest of every fixed (drafter, K) on the very
text it is scored on, so part of its lead is luck: where rejections happen to fall
against one K, which drafter's copies happen to match. No setting chosen before the text
is known can have that. Cross-validation asks what a fixed choice made on other text of
the same kind gives: the pick of the first half runs the second, the pick of the second
runs the first, and their tokens and time add up to one tok/s over the whole text.

Time is counted as auto is judged (SimResult.tokens_per_s_with_feed): a draft model's
feed of the prompt in the prefill belongs to the first half.

A half's figures come from a simulation of the first half (the text cut at half its
tokens) and the whole run less that: the simulation is sequential, so the whole run's
steps over the first half are the half run's, up to the one step that crosses the cut.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdash.engine.settings import EngineSettings
from specdash.costs.profile import Profile
from specdash.tuning.whatif.simulate import SimResult, make_drafter, simulate
from specdash.tuning.whatif.transcript import Transcript


@dataclass(frozen=True)
class Halves:
    """A fixed run's (tokens, ms) over each half of the text, decoding only, and its
    draft model's prompt feed (in the prefill, so before the first half)."""

    drafter: str
    k: int
    first: tuple[int, float]
    second: tuple[int, float]
    prompt_feed_ms: float = 0.0


@dataclass(frozen=True)
class CrossVal:
    """The cross-validated fixed choice: its tok/s over the whole text, and the picks,
    (drafter, K) chosen on the first half (run on the second) and on the second (run on
    the first). K = 0 is plain decoding."""

    tokens_per_s: float
    on_first: tuple[str, int]
    on_second: tuple[str, int]

    def describe(self) -> str:
        a, b = (f"{d} K={k}" if k else "plain" for d, k in (self.on_first, self.on_second))
        return a if a == b else f"{a} picked on the first half, {b} on the second"

    def to_json(self) -> dict[str, Any]:
        return {"tokens_per_s": self.tokens_per_s,
                "picked_on_first_half": {"drafter": self.on_first[0], "k": self.on_first[1]},
                "picked_on_second_half": {"drafter": self.on_second[0], "k": self.on_second[1]}}


def split(tr: Transcript, profile: Profile, settings: EngineSettings, runs: Sequence[SimResult]) -> list[Halves]:
    """Each fixed run (plain decoding among them: drafter "none", K = 0) over the two
    halves of the text. A run's drafter is its kind, or the draft model's name, as
    simulate.sweep labels them."""
    half = dataclasses.replace(tr, max_tokens=max(tr.n_generated // 2, 1))
    out = []
    for run in runs:
        assert run.k is not None, "cross-validation picks among fixed K"
        first = simulate(half, make_drafter(run.drafter, half, profile, settings), profile, settings,
                         name=run.drafter, k=run.k)
        out.append(Halves(run.drafter, run.k, (first.generated, first.ms),
                          (run.generated - first.generated, run.ms - first.ms), run.prompt_feed_ms))
    return out


def pick(halves: Sequence[Halves], feed: bool = True) -> CrossVal:
    """Each half's fastest (drafter, K), scored on the other half only; with `feed`, the
    prompt feed counted in the first half (False: decoding's time only)."""

    def first(h: Halves) -> tuple[int, float]:
        return (h.first[0], h.first[1] + (h.prompt_feed_ms if feed else 0.0))

    def rate(part: tuple[int, float]) -> float:
        return part[0] / part[1] if part[1] > 0 else 0.0

    on_first = max(halves, key=lambda h: rate(first(h)))
    on_second = max(halves, key=lambda h: rate(h.second))
    tokens = on_first.second[0] + first(on_second)[0]
    ms = on_first.second[1] + first(on_second)[1]
    return CrossVal(tokens / ms * 1e3 if ms > 0 else 0.0,
                    (on_first.drafter, on_first.k), (on_second.drafter, on_second.k))


def cross_validated(tr: Transcript, profile: Profile, settings: EngineSettings,
                    runs: Sequence[SimResult]) -> CrossVal:
    """The best of `runs` (fixed (drafter, K) over the whole text) chosen without
    hindsight, its tok/s counting a draft model's prompt feed."""
    return pick(split(tr, profile, settings, runs))
