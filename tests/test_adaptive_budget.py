"""Adaptive K never pays twice for what did not work (issue 55), on scripted cost curves:
- the exploration budget: a copy priced by its prior that lost is not verified again in
  the request until a longer match or new text comes;
- the back-off: a copy source that keeps finding nothing is asked less often, at a rate
  set by its measured ask time, and every step again after a find or new text;
- a source's propose time is what the back-off prices: a slow source is backed off, a
  fast one never.
No test asserts what this machine's curve decides: every curve and time here is scripted."""

from __future__ import annotations

import time

import numpy as np
import pytest

from specdash.engine.adaptive_draft import propose_adaptive
from specdash.engine.ask_backoff import AskBackoff
from specdash.engine.controller import CostModelController
from specdash.engine.controller_settings import ControllerSettings
from specdash.engine.drafters.base import Draft
from specdash.engine.settings import SamplingParams

# A GPU-like flat curve: a copy pays even at low acceptance, so only the budget stops it.
FLAT = {1: 20.0, 2: 20.2, 3: 20.4, 4: 20.6, 5: 20.8, 9: 21.6, 17: 23.2}


def flat_controller() -> CostModelController:
    ctl = CostModelController(k_min=0, k_max=16)
    ctl.seed_costs(FLAT)
    return ctl


def lose(ctl: CostModelController, evidence: int, n: int, content: str = "prose") -> None:
    """The copy trim chose is verified and none of it is accepted, at a step dearer than plain."""
    ctl.observe(n, n, 0, 0.05, 40.0, 0.1, content, evidence=evidence, source="lookup")


def test_a_copy_explored_on_its_prior_and_lost_is_not_verified_again_until_a_longer_match():
    ctl = flat_controller()
    n, why = ctl.trim("lookup", 5, 8, "prose")
    assert n > 0, why  # the 4-7 bucket has no trials: priced by its prior, an exploration
    lose(ctl, 5, n)
    n, why = ctl.trim("lookup", 5, 8, "prose")
    assert n == 0 and "explored and lost" in why and "explored 1, 1 lost" in why
    assert ctl.trim("lookup", 4, 8, "prose")[0] == 0  # a shorter match of the bucket: no better evidence
    assert ctl.trim("lookup", 6, 8, "prose")[0] > 0  # a longer match is new evidence
    assert ctl.trim("lookup", 2, 8, "prose")[0] > 0  # another bucket was never explored
    assert ctl.trim("suffix", 5, 8, "prose")[0] > 0  # nor another source


def test_a_lost_exploration_is_tried_again_on_new_text_and_in_the_next_request():
    ctl = flat_controller()
    lose(ctl, 5, ctl.trim("lookup", 5, 8, "prose")[0])
    assert ctl.trim("lookup", 5, 8, "prose")[0] == 0
    assert ctl.trim("lookup", 5, 8, "code")[0] > 0  # the content label changed
    lose(ctl, 5, 8, "code")
    assert ctl.trim("lookup", 5, 8, "code")[0] == 0
    ctl.new_prompt()  # the budget is per request
    assert ctl.trim("lookup", 5, 8, "code")[0] > 0


def test_a_copy_that_paid_or_was_measured_is_no_exploration():
    ctl = flat_controller()
    n = ctl.trim("lookup", 5, 8, "prose")[0]
    ctl.observe(n, n, n, 0.05, 21.0, 0.1, "prose", evidence=5, source="lookup")  # all accepted: it paid
    assert ctl.trim("lookup", 5, 8, "prose")[0] > 0
    measured = flat_controller()
    for _ in range(4):  # enough trials that the bucket's price is measured, not the prior's
        n = measured.trim("lookup", 20, 8, "prose")[0]
        measured.observe(n, n, n, 0.05, 21.0, 0.1, "prose", evidence=20, source="lookup")
    assert measured.copies.trials("lookup", 20) >= ControllerSettings().explore_trials
    n = measured.trim("lookup", 20, 8, "prose")[0]
    lose(measured, 20, n)  # a miss on measured evidence is learning, not a lost exploration
    assert measured.trim("lookup", 20, 8, "prose")[1].find("explored and lost") < 0


def backoff(ask_ms: float, plain_ms: float = 36.0) -> AskBackoff:
    asks = AskBackoff()
    asks.step("prose", plain_ms)
    asks.asked("suffix", ask_ms, found=False)
    return asks


def test_a_source_that_keeps_finding_nothing_is_asked_every_m_steps_after_n_misses():
    asks = backoff(2.0)  # 2 ms of a 36 ms plain step
    s = ControllerSettings()
    n = int(s.ask_patience * 36.0 / 2.0)
    m = int(np.ceil(2.0 / (s.ask_share * 36.0)))
    assert (asks.patience("suffix"), asks.every("suffix")) == (n, m) == (9, 6)
    for _ in range(n - 1):
        assert asks.due("suffix")
        asks.asked("suffix", 2.0, found=False)
    assert not asks.due("suffix") and "suffix asked every 6 steps (9 found nothing)" in asks.why()
    pattern = []
    for _ in range(3 * m):
        if asks.due("suffix"):
            pattern.append(1)
            asks.asked("suffix", 2.0, found=False)
        else:
            pattern.append(0)
            asks.skipped("suffix")
    assert pattern == ([0] * (m - 1) + [1]) * 3


def test_a_backed_off_source_is_asked_every_step_again_after_a_find_or_new_text():
    asks = backoff(2.0)
    for _ in range(20):
        asks.asked("suffix", 2.0, found=False)
    assert not asks.due("suffix")
    asks.asked("suffix", 2.0, found=True)  # the periodic ask found a copy worth verifying
    assert asks.due("suffix") and asks.why() == ""
    for _ in range(20):
        asks.asked("suffix", 2.0, found=False)
    assert not asks.due("suffix")
    asks.step("code", 36.0)
    assert asks.due("suffix")


def test_a_cheap_source_is_never_backed_off_and_nothing_is_before_plain_is_measured():
    cheap = backoff(0.05)
    for _ in range(300):
        assert cheap.due("lookup")
        cheap.asked("lookup", 0.05, found=False)
    unknown = AskBackoff()
    unknown.step("prose", 0.0)  # plain decoding not measured yet
    for _ in range(300):
        unknown.asked("suffix", 5.0, found=False)
    assert unknown.due("suffix")


class TimedCopy:
    """A copy source that spends `ms` in Python per ask and finds nothing; it records
    the k it was called with (0: shown the step, not asked)."""

    free = True
    label = "timed"

    def __init__(self, name: str, ms: float):
        self.name, self.ms, self.calls = name, ms, []

    def propose(self, tokens, k, sampling, rng):
        self.calls.append(k)
        if k:
            end = time.perf_counter() + self.ms / 1e3
            while time.perf_counter() < end:
                pass
        return Draft.empty()

    def parts(self):
        return [self]


class Chain:
    name, label, free = "chain", "chain", True

    def __init__(self, *parts):
        self._parts = parts

    def parts(self):
        return self._parts


@pytest.mark.parametrize("kind", ["chain", "auto"])
def test_the_time_a_source_spends_proposing_decides_how_often_it_is_asked(kind):
    """Through the adaptive step itself: the slow source (3 ms of a 20 ms plain step) is
    left out of most steps once it found nothing for a while; the fast one (no work) is
    asked at every step. Both still see every step (k = 0)."""
    slow, fast = TimedCopy("suffix", 3.0), TimedCopy("lookup", 0.0)
    drafter = Chain(fast, slow)
    drafter.name = kind
    ctl = flat_controller()
    asks = AskBackoff()
    for _ in range(60):
        asks.step("prose", 1.0 / ctl.plain_rate())
        draft, k, why = propose_adaptive(drafter, [1, 2, 3], ctl, "prose", 8, SamplingParams(), None, asks=asks)
        assert not draft.tokens
    assert len(slow.calls) == len(fast.calls) == 60
    assert all(fast.calls)
    asked = sum(1 for k in slow.calls if k)
    assert asked < 20, slow.calls  # N = 0.5 * 20 / 3 = 3 misses, then every 15 steps
    assert "suffix asked every" in why


def test_a_copy_after_the_longest_match_is_learnt_from_not_blocked():
    """No longer match can come after 32 matching tokens (the longest bucket), so a loss
    there would block copying for the rest of the request (a code edit copies there)."""
    ctl = flat_controller()
    n = ctl.trim("lookup", 32, 8, "code")[0]
    assert n > 0
    lose(ctl, 32, n, "code")
    n, why = ctl.trim("lookup", 40, 8, "code")
    assert n > 0 and "explored and lost" not in why
