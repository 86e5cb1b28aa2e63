"""`auto`, the default draft source (issue 32): each step the source with the best expected
speed drafts. The choice runs on the real cost model (CostModelController) fed a scripted
cost profile; the sources are stand-ins whose offers the test sets, so each case is exact.
Then the real engine: greedy output equals plain decoding under auto, the model is not
prefilled up front, and `--draft X` still pins X."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_ok, assert_usage_error, specdash

from specdash.contract import events as E
from specdash.engine.adaptive_draft import choose_source, propose_adaptive
from specdash.engine.controller import CostModelController
from specdash.engine.drafters.auto import AutoDrafter
from specdash.engine.drafters.base import Draft
from specdash.engine.settings import EngineSettings, SamplingParams

SP = SamplingParams()
RNG = np.random.default_rng(0)
# A CPU like this one: a batch of n tokens costs 1 + 0.3 (n - 1) single steps of 60 ms.
COSTS = {n: 60.0 * (1 + 0.3 * (n - 1)) for n in (1, 2, 3, 5, 9, 17)}


class Copy:
    """A copy source whose next offer the test sets (tokens after a match of `evidence`)."""

    free = True
    relative_cost = 0.0
    k_ceiling = False

    def __init__(self, name: str):
        self.name = self.label = name
        self.offer: Draft = Draft.empty(name)
        self.asked: list[int] = []

    def parts(self):
        return [self]

    def propose(self, tokens, k, sampling, rng):
        self.asked.append(k)
        return self.offer.cut(k) if k else Draft.empty(self.name)

    def catch_up_ms(self, tokens):
        return 0.0

    def unpriced_catch_up(self, tokens):
        return 0

    def prefill(self, tokens):
        self.prefilled = list(tokens)

    def reset(self): ...
    def forget(self): ...
    def set_cut(self, p_joint): ...
    def close(self): ...


class Model(Copy):
    """A draft model: drafts `k` tokens when asked, owes `catch_up` ms first."""

    free = False
    relative_cost = 0.25

    def __init__(self):
        super().__init__("draft")
        self.label = "the-model"
        self.catch_up = 0.0

    def propose(self, tokens, k, sampling, rng):
        self.asked.append(k)
        return Draft([5] * k, None, "draft") if k else Draft.empty("draft")

    def catch_up_ms(self, tokens):
        return self.catch_up

    def unpriced_catch_up(self, tokens):
        return 0


def controller(model_alpha: float | None = None, model_ms: float = 15.0) -> CostModelController:
    """The real cost model on COSTS; with `model_alpha`, a model already measured drafting
    at that acceptance for "code" (ten 4-token drafts at `model_ms` a token)."""
    c = CostModelController(k_min=0, k_max=16)
    c.seed_costs(COSTS)
    c.observe(0, 0, 0, 0.0, COSTS[1], 0.0, "code")
    if model_alpha is not None:
        for _ in range(10):
            acc = 4 if np.random.default_rng(1).random() < model_alpha else int(model_alpha * 4)
            c.observe(4, 4, acc, 4 * model_ms, COSTS[5], 0.0, "code")
    return c


def sources():
    lookup, suffix, model = Copy("lookup"), Copy("suffix"), Model()
    return lookup, suffix, model, AutoDrafter([lookup, suffix, model])


def test_a_copy_that_matches_and_pays_drafts_and_the_model_only_looks():
    lookup, suffix, model, auto = sources()
    lookup.offer = Draft(list(range(16)), None, "lookup", evidence=20)  # a long match: a strong copy
    draft, k, why = choose_source(auto.parts(), [1, 2, 3], controller(), "code", 16, SP, RNG)
    assert draft.source == "lookup" and k == len(draft.tokens) > 0
    assert why.startswith("lookup match 20") and "x plain" in why
    assert model.asked == [0]  # looked, did not draft


def test_the_better_of_two_copies_drafts():
    lookup, suffix, model, auto = sources()
    lookup.offer = Draft(list(range(16)), None, "lookup", evidence=2)  # weak: a 2-token match
    suffix.offer = Draft(list(range(16)), None, "suffix", evidence=24)  # strong
    draft, k, why = choose_source(auto.parts(), [1, 2, 3], controller(), "code", 16, SP, RNG)
    assert draft.source == "suffix" and why.startswith("suffix match 24")


def test_the_model_drafts_where_it_pays_better_than_the_copy():
    lookup, suffix, model, auto = sources()
    lookup.offer = Draft(list(range(16)), None, "lookup", evidence=2)  # a weak copy
    draft, k, why = choose_source(auto.parts(), [1, 2, 3], controller(model_alpha=0.95, model_ms=5.0),
                                  "code", 16, SP, RNG)
    assert draft.source == "draft" and k > 0 and why.startswith("the-model: ")


def test_its_catch_up_can_cost_the_model_the_step_and_the_reason_says_so():
    lookup, suffix, model, auto = sources()
    lookup.offer = Draft(list(range(16)), None, "lookup", evidence=2)
    model.catch_up = 5000.0  # a whole prompt to catch up on
    draft, k, why = choose_source(auto.parts(), [1, 2, 3], controller(model_alpha=0.95, model_ms=5.0),
                                  "code", 16, SP, RNG)
    assert draft.source == "lookup"
    assert "the-model skipped for its catch-up (5000 ms)" in why


def test_nothing_drafts_where_neither_pays():
    lookup, suffix, model, auto = sources()
    lookup.offer = Draft([1, 2], None, "lookup", evidence=1)  # a 1-token match: too weak to pay
    ctl = controller(model_alpha=0.05, model_ms=40.0)  # a model that is wrong and dear
    draft, k, why = choose_source(auto.parts(), [1, 2, 3], ctl, "code", 16, SP, RNG)
    assert (draft.tokens, k) == ([], 0) and "plain wins" in why, why


def test_it_switches_back_when_the_content_changes():
    """Copies while the text repeats its input; when the copies stop matching (new text),
    the model, which pays on that content; back to copies when they match again."""
    lookup, suffix, model, auto = sources()
    ctl = controller(model_alpha=0.7, model_ms=15.0)  # pays on new text, less than a long copy
    chosen = []
    for evidence in (24, 24, 0, 0, 24):
        lookup.offer = Draft(list(range(16)), None, "lookup", evidence=evidence) if evidence else Draft.empty("lookup")
        draft, _, _ = choose_source(auto.parts(), [1, 2, 3], ctl, "code", 16, SP, RNG)
        chosen.append(draft.source if draft.tokens else "none")
    assert chosen == ["lookup", "lookup", "draft", "draft", "lookup"]


def test_auto_is_judged_by_choose_source_and_a_chain_by_its_order():
    lookup, suffix, model, auto = sources()
    lookup.offer = Draft(list(range(16)), None, "lookup", evidence=2)
    suffix.offer = Draft(list(range(16)), None, "suffix", evidence=24)
    ctl = controller()
    assert propose_adaptive(auto, [1, 2, 3], ctl, "code", 16, SP, RNG)[0].source == "suffix"
    from specdash.engine.drafters.chain import ChainDrafter

    chain = ChainDrafter([lookup, suffix, model])
    # The chain takes the first copy source with a match that pays at all: lookup's.
    assert propose_adaptive(chain, [1, 2, 3], ctl, "code", 16, SP, RNG)[0].source in ("lookup", "none")


def test_the_model_is_not_prefilled_up_front():
    lookup, suffix, model, auto = sources()
    auto.prefill([1, 2, 3, 4])
    assert lookup.prefilled == [1, 2, 3, 4] and suffix.prefilled == [1, 2, 3, 4]
    assert not hasattr(model, "prefilled")


# --- the real engine ------------------------------------------------------------------------

PROMPT = ("Repeat this list exactly, then add one more line in the same style:\n"
          "- apples: 3 crates, delivered Monday\n- pears: 5 crates, delivered Tuesday\n"
          "- plums: 2 crates, delivered Wednesday\n- figs: 4 crates, delivered Thursday\n")


def test_auto_is_greedy_exact_and_drafts_copies_on_the_real_engine(smol_path, small_draft, greedy_reference,
                                                                   cost_curve):
    """SmolLM2-135M with its own Q4_0 as the draft model (the fuzz's small pair), on the
    defaults (auto, adaptive K), under each machine kind's cost curve: the committed text is
    the target's own greedy continuation and the draft model was not fed the prompt up
    front. Where batches are cheap (the Intel curve) the copies pay and are drafted; on the
    AVX2 AMD curve whether they do is that curve's call, so only the bookkeeping is held."""
    from specdash.sources.session import Session

    s = EngineSettings(target=str(smol_path), draft_model=str(small_draft), threads=2, ctx=1024,
                       max_tokens=64)
    assert s.draft == "auto" and s.adaptive  # the defaults
    session = Session(s)
    try:
        prompt = session.prompt_tokens(PROMPT)
        model = next(p for p in session.engine.drafter.parts() if not p.free)
        assert not session._draft_models, "the draft model was loaded before it was needed"
        fed: list[int] = []
        real_prefill = model.prefill
        model.prefill = lambda tokens: (fed.append(len(tokens)), real_prefill(tokens))  # type: ignore[method-assign]
        events = list(session.engine.generate(prompt, 64))
        model_drafted = any(e.drafter == "draft" for e in events if isinstance(e, E.StepEvent))
        assert bool(session._draft_models) == model_drafted  # loaded if (and only if) it was chosen
    finally:
        session.close()
    assert fed == [], "auto prefilled its draft model up front"
    settings_ev = next(e for e in events if isinstance(e, E.SettingsEvent))
    assert settings_ev.draft == "auto" and settings_ev.drafter.startswith("auto: lookup, edit, suffix, ")
    steps = [e for e in events if isinstance(e, E.StepEvent)]
    notices = [e.message for e in events if isinstance(e, E.NoticeEvent)]
    assert any(f"profile {cost_curve}'s curve" in m for m in notices), notices  # pinned, not timed here
    assert not any("measured target batch costs" in m for m in notices), notices
    assert all(e.adaptive and e.decision and e.drafted <= e.k for e in steps)
    assert {e.drafter for e in steps} <= {"lookup", "suffix", "none", Path(small_draft).stem}, steps
    if cost_curve == "intel-amx":
        assert {e.drafter for e in steps if e.drafted} & {"lookup", "suffix"}
    assert_greedy(greedy_reference(smol_path), prompt, [t for e in steps for t in e.tokens])


def assert_greedy(ref, prompt: list[int], got: list[int]) -> None:
    """got is the target's plain greedy continuation of prompt, or leaves it only at a near-tie."""
    import fuzz_exact as F

    plain = ref.plain(prompt, len(got) + 1, None)
    if got != plain[: len(got)]:  # off plain decoding's path: only at near-ties
        full = list(prompt) + got
        verdicts = ref.teacher_force(full, len(prompt), list(range(len(prompt), len(full))), None)
        for pos, (want, gap) in verdicts.items():
            assert full[pos] == want or gap < F.TIE_GAP, (pos, full[pos], want, gap)


def test_auto_loads_its_draft_model_when_it_first_drafts_and_stays_exact(smol_path, small_draft, greedy_reference):
    """drafters/lazy.py: nothing loaded at start; at a fixed K auto drafts as the chain does
    (a copy with a match, else the model), so the first step without a copy loads the model
    and drafts from it; every token stays the target's greedy choice."""
    from specdash.sources.session import Session

    session = Session(EngineSettings(target=str(smol_path), draft_model=str(small_draft), threads=2, ctx=1024,
                                     adaptive=False, k=3))
    try:
        assert not session._draft_models
        lazy = next(p for p in session.engine.drafter.parts() if not p.free)
        assert not lazy.loaded and lazy.label == Path(small_draft).stem and lazy.relative_cost is not None
        prompt = session.prompt_tokens("Write a short poem about rain.")
        events = list(session.engine.generate(prompt, 24))
        assert lazy.loaded and list(session._draft_models) == [str(small_draft)]
    finally:
        session.close()
    steps = [e for e in events if isinstance(e, E.StepEvent)]
    assert any(e.drafter == "draft" and e.drafted for e in steps), steps  # a model draft (Draft.source)
    assert_greedy(greedy_reference(smol_path), prompt, [t for e in steps for t in e.tokens])


def test_draft_x_still_pins_x_and_bad_values_are_one_line(smol_path):
    proc = specdash("run", "--json", "--target", str(smol_path), "--draft", "lookup", "--max-tokens", "24",
                    "--threads", "2", "--prompt", PROMPT)
    assert_ok(proc)
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert next(e for e in events if e["event"] == "settings")["drafter"] == "lookup"
    assert {e["drafter"] for e in events if e["event"] == "step"} <= {"lookup", "none"}
    assert_usage_error(specdash("run", "--draft", "", "--prompt", "x"), "--draft")
    assert_usage_error(specdash("run", "--draft-model", "", "--prompt", "x"), "--draft-model")


class LazyModel(Model):
    """A model auto never prefilled: `behind` tokens to feed, no catch-up measured yet."""

    def __init__(self, behind: int):
        super().__init__()
        self.behind = behind

    def unpriced_catch_up(self, tokens):
        return self.behind


@pytest.mark.parametrize("behind,horizon,drafts", [(600, 128, False), (600, 100_000, True), (20, 128, True)])
def test_a_model_never_fed_sits_out_where_its_first_catch_up_cannot_be_earned_back(behind, horizon, drafts):
    """Its first catch-up (the whole prompt) is estimated from its predicted draft cost and
    the target's batch costs; more than CATCH_UP_SHARE of the plain time left: it sits out
    and the reason says so. A short backlog, or a long run ahead, and it warms up."""
    from specdash.engine.adaptive_draft import CATCH_UP_SHARE

    lookup, suffix, _, _ = sources()
    model = LazyModel(behind)
    auto = AutoDrafter([lookup, suffix, model])
    ctl = controller()
    ctl.price_draft(0.3)  # a draft token predicted at 0.3 target steps, as the default pair's sizes say
    estimate = ctl.catch_up_estimate(behind)
    # a draft token's predicted cost, at the per-token discount of the target's 33-token batch
    assert estimate == pytest.approx(behind * 0.3 * ctl.costs.step_cost(33) / 33)
    draft, k, why = choose_source(auto.parts(), [1, 2, 3], ctl, "code", 16, SP, RNG, horizon)
    over = estimate > CATCH_UP_SHARE * horizon * COSTS[1]
    assert over == (not drafts)
    if drafts:
        assert draft.source == "draft" and k > 0 and model.asked[-1] == k
    else:
        assert (draft.tokens, k) == ([], 0) and model.asked == [0]
        assert f"the-model skipped for its catch-up (~{estimate:.0f} ms" in why and f"{horizon} tokens" in why
