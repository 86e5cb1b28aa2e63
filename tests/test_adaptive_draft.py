"""How an adaptive step asks its sources: free ones offer and get cut, a draft model is
asked for K first; in a chain each source is judged on its own."""

from __future__ import annotations

import numpy as np

from specdash.engine.adaptive_draft import propose_adaptive
from specdash.engine.drafters.base import Borrowed, Draft, NoDrafter
from specdash.engine.drafters.chain import ChainDrafter
from specdash.engine.drafters.lookup import PromptLookupDrafter
from specdash.engine.drafters.suffix import SuffixDrafter
from specdash.engine.settings import SamplingParams

SP = SamplingParams()
RNG = np.random.default_rng(0)


class CostlySource:
    """Stands in for a draft model: records the K it is asked for."""

    name = "draft"
    label = "costly"
    free = False

    def __init__(self):
        self.asked: list[int] = []

    def propose(self, tokens, k, sampling, rng):
        self.asked.append(k)
        return Draft([7] * k, None, self.name) if k else Draft.empty(self.name)

    def parts(self):
        return [self]

    def catch_up_ms(self, tokens):
        return 0.0

    def unpriced_catch_up(self, tokens):
        return 0

    def prefill(self, tokens): ...
    def reset(self): ...
    def forget(self): ...
    def close(self): ...


class ScriptedController:
    def __init__(self, trim_to: int, k: int):
        self.trim_to, self.k = trim_to, k
        self.trims: list[tuple[str, int, int]] = []
        self.rivals: list[float] = []

    def trim(self, source, evidence, available, content, rival=0.0):
        self.trims.append((source, evidence, available))
        self.rivals.append(rival)
        return min(self.trim_to, available), f"trim {source}"

    def model_rate(self, content):
        return 0.25

    def choose(self, content, catch_up_ms=0.0):
        return self.k, "choose"


COPY = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]  # "1 2 3" recurs: lookup offers 4 5 6 ...


def test_a_free_copy_is_offered_whole_then_cut_and_the_draft_model_only_looks():
    costly = CostlySource()
    chain = ChainDrafter([PromptLookupDrafter(1, 4), costly])
    ctl = ScriptedController(trim_to=2, k=4)
    draft, k, why = propose_adaptive(chain, COPY, ctl, "code", 8, SP, RNG)
    assert draft.tokens == [4, 5] and k == 2 and why == "trim lookup"
    assert ctl.trims == [("lookup", 3, 8)]  # offered up to k_cap, evidence = 3-token match
    assert costly.asked == [0]  # told to look, not to draft
    assert ctl.rivals == [0.25]  # the copy is judged against the draft model after it


def test_a_copy_with_no_draft_model_after_it_competes_with_plain_only():
    ctl = ScriptedController(trim_to=2, k=4)
    propose_adaptive(ChainDrafter([PromptLookupDrafter(1, 4), SuffixDrafter()]), COPY, ctl, "code", 8, SP, RNG)
    assert ctl.rivals == [0.0]


def test_a_copy_cut_to_nothing_does_not_block_the_draft_model():
    costly = CostlySource()
    chain = Borrowed(ChainDrafter([PromptLookupDrafter(1, 4), costly]))
    draft, k, why = propose_adaptive(chain, COPY, ScriptedController(trim_to=0, k=3), "code", 8, SP, RNG)
    assert draft.tokens == [7, 7, 7] and draft.source == "draft" and (k, why) == (3, "choose")
    assert costly.asked == [3]


def test_k_cap_bounds_every_source_and_zero_cap_only_looks():
    costly = CostlySource()
    draft, k, _ = propose_adaptive(costly, COPY, ScriptedController(trim_to=0, k=9), "", 5, SP, RNG)
    # The step reports the K it used: a controller wishing for 9 with room for 5 says 5
    # (the fuzzed schedules caught "K=4 > room 3" near the token budget).
    assert costly.asked == [5] and len(draft.tokens) == 5 and k == 5
    lookup = PromptLookupDrafter(1, 4)
    draft, k, _ = propose_adaptive(lookup, COPY, ScriptedController(trim_to=9, k=9), "", 0, SP, RNG)
    assert draft.tokens == [] and k == 0
    assert [type(s) for s in Borrowed(lookup).parts()] == [Borrowed]
    chain = ChainDrafter([lookup, costly])
    assert Borrowed(chain).parts() == [lookup, costly]  # a lent chain is still a chain


# --- through the session: the drafter as the engine really holds it ------------------------
def test_the_session_lent_draft_model_prices_its_catch_up(smol_path):
    """Session lends every draft model wrapped in Borrowed, and the catch-up price has to
    get through that wrapper: adaptive K looked it up with getattr on the source, found
    nothing on Borrowed, and priced every catch-up at 0 ms. The drafter here is built by
    the session from settings, and the controller is the real one, scripted: K=0 for
    three steps, a draft (its catch-up is measured), K=0 again. What choose() is told must
    then grow with the steps the draft model sat out, and be 0 right after it drafted."""
    from specdash.engine.controller import CostModelController
    from specdash.engine.settings import EngineSettings
    from specdash.contract.events import StepEvent
    from specdash.sources.session import Session

    class Scripted(CostModelController):
        def __init__(self):
            super().__init__(k_min=0, k_max=4)
            self.seen: list[float] = []

        def choose(self, content, catch_up_ms=0.0):
            self.seen.append(catch_up_ms)
            return (2, "scripted draft") if len(self.seen) in (4, 14) else (0, "scripted plain")

    ctl = Scripted()
    settings = EngineSettings(target=str(smol_path), draft=str(smol_path), adaptive=True, k=2,
                              threads=2, ctx=512, max_tokens=24)
    session = Session(settings, controller=ctl)
    try:
        assert isinstance(session.engine.drafter, Borrowed)  # as every session lends it
        prompt = "List the planets of the solar system in order, one per line, with their moons."
        steps = [e for e in session.run(prompt) if isinstance(e, StepEvent)]
    finally:
        session.close()
    assert [s.k for s in steps[:14]] == [0, 0, 0, 2] + [0] * 9 + [2]
    assert ctl.seen[:4] == [0.0] * 4  # no catch-up measured yet: nothing to price it by
    assert ctl.seen[4] == 0.0  # in step right after drafting: nothing to catch up on
    behind = ctl.seen[6:14]  # then 1..8 steps sat out beyond the usual rhythm
    assert all(b > 0 for b in behind) and behind == sorted(behind), ctl.seen
    assert behind[-1] > 3 * behind[0], ctl.seen


def test_catch_up_is_part_of_every_drafter_and_a_chain_owes_what_its_model_owes():
    class Behind(CostlySource):
        def catch_up_ms(self, tokens):
            return 2.0 * len(tokens)

    lookup = PromptLookupDrafter(1, 4)
    assert lookup.catch_up_ms(COPY) == 0.0 and NoDrafter().catch_up_ms(COPY) == 0.0
    chain = ChainDrafter([lookup, Behind()])
    assert chain.catch_up_ms(COPY) == Borrowed(chain).catch_up_ms(COPY) == 2.0 * len(COPY)
    # Inside a lent chain the adaptive step asks the model itself, and prices its catch-up.
    seen = []

    class Recording(ScriptedController):
        def choose(self, content, catch_up_ms=0.0):
            seen.append(catch_up_ms)
            return 0, "plain"

    propose_adaptive(Borrowed(chain), COPY[:5], Recording(trim_to=0, k=0), "", 8, SP, RNG)
    assert seen == [10.0]


def test_the_session_tells_adaptive_k_that_the_joint_cut_makes_k_a_ceiling(smol_path):
    """The joint cut (draft_p_joint) lives in the draft model, behind the session's loan
    and inside chains; the controller leans to bigger K only if it is told. Built by the
    session from settings and run, the engine must tell it: yes for the draft model and
    for a chain holding it, no for lookup alone or with the cut off."""
    from specdash.engine.controller import CostModelController
    from specdash.engine.drafters.base import model_price
    from specdash.engine.settings import EngineSettings
    from specdash.sources.session import Session

    class Told(CostModelController):
        def __init__(self):
            super().__init__(k_min=0, k_max=8)
            self.told: list[bool] = []

        def price_draft(self, relative_cost, k_ceiling=False):
            self.told.append(k_ceiling)
            super().price_draft(relative_cost, k_ceiling)

    for p_joint in (0.1, 0.0):
        ctl = Told()
        settings = EngineSettings(target=str(smol_path), draft=str(smol_path), adaptive=True, k=2,
                                  threads=2, ctx=512, max_tokens=4, draft_p_joint=p_joint)
        session = Session(settings, controller=ctl)
        try:
            list(session.run("Count to five."))
            assert ctl.told and ctl.told[-1] is (p_joint > 0)
            assert isinstance(session.engine.drafter, Borrowed)
            assert model_price(session.make_drafter("chain"))[1] is (p_joint > 0)
            assert model_price(session.make_drafter("lookup")) == (None, False)  # no model part
        finally:
            session.close()
