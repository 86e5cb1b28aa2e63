"""The batch's K choice (engine/batch/plan.py) on scripted cost curves: which request
drafts, and how much, is a property of the code here, not of the CPU the suite runs on."""

from __future__ import annotations

from specdash.engine.batch.costs import BatchCosts, paying_width
from specdash.engine.batch.plan import Offer, plan, rate


def cheap(tokens: int, seqs: int) -> float:
    """A machine where a batch of n tokens costs 10 + 2n ms: verifying is cheap."""
    return 10.0 + 2.0 * tokens


def dear(tokens: int, seqs: int) -> float:
    """A machine where every token costs nearly a whole step (AVX2 EPYC-like)."""
    return 12.0 * tokens


def test_nothing_drafts_where_nothing_is_offered_or_nothing_pays():
    choices = plan([Offer(0, 0.0), Offer(0, 0.0)], cheap)
    assert [c.k for c in choices] == [0, 0]
    assert all("nothing to copy" in c.reason for c in choices)
    # A weak copy (alpha 0.1) on a machine where verifying costs a whole step: plain.
    weak = plan([Offer(8, 0.1, "lookup match 1"), Offer(0, 0.0)], dear)
    assert [c.k for c in weak] == [0, 0]
    assert "would cost the batch more" in weak[0].reason


def test_only_the_request_with_a_good_copy_drafts_and_it_may_draft_long():
    offers = [Offer(16, 0.95, "lookup match 20"), Offer(0, 0.0), Offer(3, 0.2, "suffix match 1")]
    choices = plan(offers, cheap)
    assert choices[0].k >= 8, choices
    assert choices[1].k == 0 and choices[2].k == 0, choices
    assert "verify" in choices[0].reason and "batch of 3" in choices[0].reason
    # What it chose beats plain for the whole batch, and any other K for that request.
    ks = [c.k for c in choices]
    best = rate(offers, ks, cheap)
    assert best is not None and best > rate(offers, [0, 0, 0], cheap)
    for k in range(0, 17):
        other = rate(offers, [k, 0, 0], cheap)
        assert other is not None and other <= best + 1e-12


def test_no_speculation_at_a_width_where_verify_cost_dominates():
    # Per token, a batch of 4 sequences costs 3 ms here until 4 tokens, then each extra
    # token a whole 12 ms step: at width 4 a copy that pays alone no longer pays.
    def stepped(tokens: int, seqs: int) -> float:
        return 12.0 + 3.0 * (min(tokens, 4) - 1) + 12.0 * max(tokens - 4, 0)

    good = Offer(4, 0.7, "lookup match 5")
    alone = plan([good], stepped)
    assert alone[0].k > 0, alone
    crowded = plan([good, Offer(0, 0.0), Offer(0, 0.0), Offer(0, 0.0)], stepped)
    assert [c.k for c in crowded] == [0, 0, 0, 0], crowded


def test_unknown_costs_mean_plain_decoding_until_measured():
    choices = plan([Offer(8, 0.9, "lookup match 9")], lambda tokens, seqs: None)
    assert choices[0].k == 0 and "measuring" in choices[0].reason


def test_batch_costs_learn_per_shape_and_the_width_that_pays():
    one = {n: 10.0 + 5.0 * n for n in range(1, 40)}
    costs = BatchCosts(one.get)
    assert costs.cost(4, 2) == one[4]  # no batch of 2 sequences seen: the one-sequence curve
    costs.observe(2, 2, 30.0)  # 2 sequences x 1 token cost 30 ms where one sequence's 2 cost 20
    assert costs.cost(2, 2) == 30.0
    assert costs.cost(6, 2) == one[6] * 1.5  # the ratio learned for 2 sequences, on other sizes
    assert costs.cost(6, 4) == one[6]
    assert paying_width({1: 10.0, 2: 17.0, 4: 27.0}) == 4
    assert paying_width({1: 10.0, 2: 19.0, 4: 40.0}) == 1  # 0.95 and 1.0 per sequence: no gain
    assert paying_width({}) == 1
