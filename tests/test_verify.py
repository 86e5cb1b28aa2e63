"""Acceptance rules: greedy prefix matching, exactness of rejection sampling (checked
statistically against the target distribution), and the logits -> probabilities chain."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specdash.engine.settings import SamplingParams
from specdash.engine.verify import process_logits, sample, verify_greedy, verify_sampling

DRAWS = 100_000


# --- chi-square goodness of fit (scipy is not a dependency) -------------------------------


def chi2_sf(x: float, dof: int) -> float:
    """P(X > x) for X ~ chi-square(dof): the regularized upper incomplete gamma Q(dof/2, x/2),
    by its power series below a+1 and Lentz's continued fraction above (Numerical Recipes
    6.2), where each converges fast."""
    a, x = dof / 2, x / 2
    if x <= 0:
        return 1.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1 / a
        n = 0
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / (a + n)
            total += term
        return max(0.0, 1 - total * math.exp(log_prefix))
    tiny = 1e-300
    b, c, d = x + 1 - a, 1 / tiny, 1 / (x + 1 - a)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_prefix) * h


@pytest.mark.parametrize("x", [0.3, 2.0, 9.0, 40.0])
def test_chi2_sf_matches_closed_forms(x):
    # Closed forms for small dof; x spans both the series and the continued-fraction branch.
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9)
    assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)
    assert chi2_sf(x, 4) == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=1e-9)


def test_chi2_sf_matches_tabulated_critical_values():
    # Table entries chi2(0.05; 10) = 18.307 and chi2(0.001; 63) = 103.442, to more digits.
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(103.44237731987324, 63) == pytest.approx(0.001, rel=1e-9)


def goodness_of_fit(tokens: np.ndarray, expected: np.ndarray) -> float:
    """p-value of the chi-square test that `tokens` were drawn from `expected`. A token
    seen where the expected probability is zero is impossible: p-value 0."""
    counts = np.bincount(tokens, minlength=expected.size)
    support = expected > 0
    if counts[~support].any():
        return 0.0
    e = expected[support] * len(tokens)
    assert e.min() >= 5, "too few expected draws in a cell for the chi-square approximation"
    stat = float(((counts[support] - e) ** 2 / e).sum())
    return chi2_sf(stat, int(support.sum()) - 1)


# --- greedy -------------------------------------------------------------------------------


def test_greedy_accepts_longest_prefix_then_corrects():
    assert verify_greedy(np.array([5, 6, 9, 8]), [5, 6, 7]) == (2, 9)
    assert verify_greedy(np.array([4, 6, 7, 8]), [5, 6, 7]) == (0, 4)


def test_greedy_all_match_gives_bonus_token():
    assert verify_greedy(np.array([5, 6, 7, 42]), [5, 6, 7]) == (3, 42)


def test_greedy_without_draft_is_plain_decoding():
    assert verify_greedy(np.array([17]), []) == (0, 17)


def test_greedy_needs_k_plus_one_positions():
    with pytest.raises(ValueError):
        verify_greedy(np.array([5, 6]), [5, 6])


# --- rejection sampling: exactness --------------------------------------------------------


def committed_first_tokens(rule, p, q, drafted, seed=1) -> np.ndarray:
    """Runs `rule` DRAWS times on fixed target rows p (K+1, V) and draft rows q (K, V) or
    one-hot drafts (q None, fixed `drafted` tokens); returns each run's first committed
    token: the first draft token if accepted, else the token sampled on rejection."""
    rng = np.random.default_rng(seed)
    k, v = q.shape if q is not None else (len(drafted), p.shape[1])
    # The drafter's own sampling is not under test: draw all drafts up front.
    drafts = np.tile(drafted, (DRAWS, 1)) if q is None else np.stack(
        [rng.choice(v, size=DRAWS, p=q[i]) for i in range(k)], axis=1
    )
    out = np.empty(DRAWS, dtype=np.intp)
    for j, draft in enumerate(drafts.tolist()):
        n, nxt = rule(p, draft, q, rng)
        out[j] = draft[0] if n > 0 else nxt
    return out


def _dirichlet(rng, v, rows, zeros=()):
    # Concentration 3 keeps every cell's expected count well above the chi-square minimum.
    x = rng.dirichlet(np.full(v, 3.0), size=rows)
    x[:, list(zeros)] = 0.0
    return x / x.sum(axis=1, keepdims=True)


def _cases():
    rng = np.random.default_rng(1234)
    v = 12
    pq = _dirichlet(rng, v, 2)
    return {
        "p_q_random": (_dirichlet(rng, v, 3), _dirichlet(rng, v, 2), None),
        # The draft puts mass where the target has none: those tokens must never be committed.
        "q_support_outside_p": (_dirichlet(rng, v, 3, zeros=(0, 1, 2)), _dirichlet(rng, v, 2), None),
        # The draft misses part of the target's support: only the residual can reach it.
        "q_misses_p_support": (_dirichlet(rng, v, 3), _dirichlet(rng, v, 2, zeros=(3, 4, 5, 6)), None),
        "q_equals_p": (pq, pq[:1].copy(), None),
        # Lookup/suffix drafters: q is one-hot; token 7 is likely, token 0 impossible.
        "one_hot_likely": (_dirichlet(rng, v, 3), None, [7, 3]),
        "one_hot_impossible": (_dirichlet(rng, v, 3, zeros=(0,)), None, [0, 3]),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_first_committed_token_follows_target(case):
    p, q, drafted = _cases()[case]
    tokens = committed_first_tokens(verify_sampling, p, q, drafted)
    assert goodness_of_fit(tokens, p[0]) > 1e-3


def always_accept(target_probs, draft_tokens, draft_probs, rng):
    return len(draft_tokens), sample(target_probs[len(draft_tokens)], rng)


def resample_from_target(target_probs, draft_tokens, draft_probs, rng):
    """The real accept decision, but p instead of the residual after a rejection."""
    n, nxt = verify_sampling(target_probs, draft_tokens, draft_probs, rng)
    return (n, sample(target_probs[n], rng)) if n < len(draft_tokens) else (n, nxt)


@pytest.mark.parametrize("wrong_rule", [always_accept, resample_from_target])
def test_the_exactness_test_catches_wrong_rules(wrong_rule):
    p, q, _ = _cases()["p_q_random"]
    tokens = committed_first_tokens(wrong_rule, p, q, None)
    assert goodness_of_fit(tokens, p[0]) < 1e-6


def committed_pairs(rule, p0, p1, p2, q0, q1, seed=1) -> np.ndarray:
    """Two committed tokens per run, with conditional rows as a real model gives them:
    p1[t] is the target after token t, q1[t] the draft after t, p2 the (irrelevant) row
    after two tokens. With K=2: when the first draft token is rejected, the second token
    comes from a fresh step (K=1) drafted and verified after the committed correction."""
    rng = np.random.default_rng(seed)
    v = p0.size
    # Drafts drawn up front: the first token, and a draw from q1[t] for every t, used as
    # the second draft after whichever token ends up first.
    first = rng.choice(v, size=DRAWS, p=q0).tolist()
    after = np.stack([rng.choice(v, size=DRAWS, p=q1[t]) for t in range(v)], axis=1).tolist()
    out = np.empty((DRAWS, 2), dtype=np.intp)
    for j in range(DRAWS):
        d0 = first[j]
        d1 = after[j][d0]
        n, nxt = rule(np.stack([p0, p1[d0], p2]), [d0, d1], np.stack([q0, q1[d0]]), rng)
        if n == 0:
            e0 = after[j][nxt]
            m, nxt2 = rule(np.stack([p1[nxt], p2]), [e0], q1[nxt][None], rng)
            out[j] = nxt, (e0 if m else nxt2)
        else:
            out[j] = d0, (d1 if n == 2 else nxt)
    return out


def _pair_case():
    rng = np.random.default_rng(99)
    v = 6
    p0, q0 = _dirichlet(rng, v, 1, zeros=(5,))[0], _dirichlet(rng, v, 1)[0]
    p1, q1 = _dirichlet(rng, v, v), _dirichlet(rng, v, v)
    p1[:, 2] = 0.0  # the target never follows with token 2, the draft does
    p1 /= p1.sum(axis=1, keepdims=True)
    return p0, p1, _dirichlet(rng, v, 1)[0], q0, q1


def _pair_fit(pairs, p0, p1) -> float:
    v = p0.size
    joint = (p0[:, None] * p1).ravel()  # P(t0, t1) = p0(t0) p1(t1 | t0)
    return goodness_of_fit(pairs[:, 0] * v + pairs[:, 1], joint)


def test_two_committed_tokens_follow_target_jointly():
    p0, p1, p2, q0, q1 = _pair_case()
    assert _pair_fit(committed_pairs(verify_sampling, p0, p1, p2, q0, q1), p0, p1) > 1e-3


def test_the_joint_test_catches_a_wrong_rule():
    p0, p1, p2, q0, q1 = _pair_case()
    assert _pair_fit(committed_pairs(resample_from_target, p0, p1, p2, q0, q1), p0, p1) < 1e-6


# --- rejection sampling: edge cases -------------------------------------------------------


def test_zero_draft_probability_is_rejected():
    p = np.array([[0.2, 0.8, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = np.array([[1.0, 0.0, 0.0]])  # claims token 1 was impossible, yet drafted it
    rng = np.random.default_rng(0)
    # The residual max(0, p - q) only has token 1 left.
    assert all(verify_sampling(p, [1], q, rng) == (0, 1) for _ in range(200))


def test_empty_residual_falls_back_to_target():
    pq = np.array([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    rng = np.random.default_rng(0)
    results = {verify_sampling(pq, [2], pq[:1], rng) for _ in range(200)}
    assert results == {(0, 0), (0, 1)}


def test_k0_samples_from_first_row():
    p = np.array([[0.0, 0.25, 0.75]])
    rng = np.random.default_rng(3)
    tokens = np.array([verify_sampling(p, [], None, rng)[1] for _ in range(20_000)])
    assert goodness_of_fit(tokens, p[0]) > 1e-3


def test_certain_draft_with_certain_target_is_all_accepted():
    p = np.eye(4)[[1, 2, 3]]
    assert verify_sampling(p, [1, 2], None, np.random.default_rng(0)) == (2, 3)


def test_mismatched_shapes_raise():
    p = np.full((2, 4), 0.25)
    with pytest.raises(ValueError):
        verify_sampling(p, [1, 2], None, np.random.default_rng(0))
    with pytest.raises(ValueError):
        verify_sampling(p, [1], np.full((2, 4), 0.25), np.random.default_rng(0))


# --- sample -------------------------------------------------------------------------------


def test_sample_follows_unnormalized_row_and_skips_zeros():
    w = np.array([0.0, 3.0, 0.0, 1.0, 0.0, 4.0, 0.0])  # residuals are not normalized
    rng = np.random.default_rng(5)
    tokens = np.array([sample(w, rng) for _ in range(50_000)])
    assert goodness_of_fit(tokens, w / w.sum()) > 1e-3


class _FixedUniform:
    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


@pytest.mark.parametrize("u", [0.0, np.nextafter(1.0, 0.0)])
@pytest.mark.parametrize("row", [[0.0, 0.3, 0.7, 0.0], [0.0, 0.5, 0.5 + 2**-52, 0.0]])
def test_sample_never_picks_zero_probability_at_the_ends(u, row):
    # Generator.random() can return 0.0 and at most 1 - 2**-53: the extremes land on the
    # first and last tokens with mass, never on the zeros around them.
    assert sample(np.array(row), _FixedUniform(u)) == (1 if u == 0.0 else 2)


# --- process_logits -----------------------------------------------------------------------


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def reference_nucleus(probs, top_p):
    """Full-sort reference: the smallest prefix of tokens by falling probability whose
    mass reaches top_p."""
    order = np.argsort(-probs, kind="stable")
    m = int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1
    out = np.zeros_like(probs)
    out[order[:m]] = probs[order[:m]] / probs[order[:m]].sum()
    return out


def reference_probs(z, temperature, top_k, top_p):
    """The whole chain by full sorts, the slow obvious way."""
    z = z.astype(np.float64) / temperature
    keep = np.argsort(-z, kind="stable")[:top_k] if top_k else np.arange(z.size)
    probs = np.zeros(z.size)
    probs[keep] = softmax(z[keep])
    return reference_nucleus(probs, top_p) if top_p < 1 else probs


@pytest.fixture
def logits():
    return np.random.default_rng(7).normal(scale=3.0, size=(3, 1000)).astype(np.float32)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_scales_logits(logits, temperature):
    probs = process_logits(logits, SamplingParams(temperature=temperature))
    assert probs.shape == logits.shape
    np.testing.assert_allclose(probs, softmax(logits.astype(np.float64) / temperature), rtol=1e-9)
    np.testing.assert_allclose(process_logits(logits[1], SamplingParams(temperature=temperature)), probs[1])


def test_callers_logits_are_left_alone():
    z = np.random.default_rng(2).normal(size=(2, 50))  # float64: no conversion copy to hide behind
    before = z.copy()
    process_logits(z, SamplingParams(temperature=0.5, top_k=5, top_p=0.9))
    np.testing.assert_array_equal(z, before)


def test_top_k_keeps_the_k_most_likely(logits):
    probs = process_logits(logits, SamplingParams(temperature=0.7, top_k=40))
    for row, z in zip(probs, logits):
        kept = np.flatnonzero(row)
        assert kept.size == 40
        assert set(kept) == set(np.argsort(-z)[:40])
        np.testing.assert_allclose(row[kept], softmax(z[kept].astype(np.float64) / 0.7), rtol=1e-9)


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99])
def test_top_p_keeps_smallest_set_reaching_p(logits, top_p):
    probs = process_logits(logits, SamplingParams(temperature=1.3, top_p=top_p))
    for row, z in zip(probs, logits):
        full = softmax(z.astype(np.float64) / 1.3)
        np.testing.assert_allclose(row, reference_nucleus(full, top_p), rtol=1e-9, atol=1e-15)
        kept = np.sort(full)[::-1][: np.count_nonzero(row)]
        assert kept.sum() >= top_p > kept[:-1].sum()


def test_top_k_keeps_ties_with_the_kth():
    probs = process_logits(np.array([3.0, 2.0, 2.0, 1.0]), SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(probs, softmax(np.array([3.0, 2.0, 2.0, -np.inf])))


def test_top_k_then_top_p(logits):
    probs = process_logits(logits, SamplingParams(temperature=0.9, top_k=50, top_p=0.8))
    for row, z in zip(probs, logits):
        np.testing.assert_allclose(row, reference_probs(z, 0.9, 50, 0.8), rtol=1e-9, atol=1e-15)


def _vocabulary_rows():
    rng = np.random.default_rng(8)
    # One dominant token over a long tail 12 logits lower: the first candidate set holds
    # only that token, so both the top-k and the top-p search must widen.
    dominant = rng.normal(scale=0.01, size=151_936) - 12.0
    dominant[123] = 0.0
    # Flat: the nucleus holds tens of thousands of tokens.
    return {"flat": rng.normal(size=151_936), "dominant_over_tail": dominant}


@pytest.mark.parametrize("top_k, top_p", [(40, 1.0), (0, 0.9), (1000, 0.5)])
@pytest.mark.parametrize("shape", ["flat", "dominant_over_tail"])
def test_full_vocabulary_matches_full_sort_reference(shape, top_k, top_p):
    z = _vocabulary_rows()[shape]
    probs = process_logits(z, SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p))
    np.testing.assert_allclose(probs, reference_probs(z, 1.0, top_k, top_p), rtol=1e-9, atol=1e-15)


def test_rows_sum_to_one_even_for_extreme_logits():
    z = np.array([[1e4, -1e4, 0.0, 1e4 - 1], [-1e30, -1e30, -1e30, -1e30]])
    for params in (SamplingParams(temperature=0.01), SamplingParams(temperature=1.0, top_k=2, top_p=0.5)):
        probs = process_logits(z, params)
        assert np.isfinite(probs).all()
        np.testing.assert_allclose(probs.sum(axis=1), 1.0)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_greedy_is_not_a_distribution(logits, temperature):
    with pytest.raises(ValueError):
        process_logits(logits, SamplingParams(temperature=temperature))
