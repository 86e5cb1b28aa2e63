"""`specdash whatif --acceptance-length / --acceptance-rates`: llama.cpp's synthetic
acceptance, read as llama.cpp reads it, priced on a cost profile for every K.

The closed form (synthetic.predict) is held to simulate()'s own step loop fed the same
random acceptance, and to the one property a cost model must have here: more acceptance
never predicts slower at the same K."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_helpers import assert_ok, assert_usage_error, specdash
from specdash.contract.errors import SpecdashError
from specdash.costs.profile import BUILTIN, Profile, load_profile
from specdash.tuning.whatif.synthetic import (FREE, MODEL, Synthetic, length_rates, parse_rates, predict, report,
                                       simulate_steps)

PROFILES = [load_profile(name) for name in BUILTIN] + [
    # A checkpointing target: restore and replay after a partial acceptance.
    Profile(name="ckpt", verify={1: 20.0, 9: 60.0, 33: 170.0}, draft_ms=3.0, pair_ms=9.0, overhead_ms=0.5,
            restore_ms=2.0, replay_ms=1.5, free_ms=0.1),
]


def test_length_means_what_llama_cpp_makes_of_it():
    """common/speculative.cpp's own test values (tests/test-arg-parser.cpp), to its digits."""
    rates = length_rates(3.4, 4)
    assert rates == pytest.approx([0.80581, 0.64933, 0.52323, 0.42163], abs=1e-5)
    assert abs(1 + sum(rates) - 3.4) < 1e-8
    assert length_rates(1.0, 4) == [0.0] * 4 and length_rates(5.0, 4) == [1.0] * 4
    with pytest.raises(SpecdashError, match=r"--acceptance-length 5.1 at K=4: must be within \[1, 5\]"):
        length_rates(5.1, 4)
    assert parse_rates("0.8, 0.6,0.4,0.2") == (0.8, 0.6, 0.4, 0.2)


def test_each_k_gets_the_acceptance_llama_cpp_would_run_it_with():
    same_l = Synthetic(length=2.5)
    assert same_l.rates_at(4) == length_rates(2.5, 4) and same_l.rates_at(8) == length_rates(2.5, 8)
    assert same_l.why_not(1) is not None and same_l.default_ks()[0] == 2  # L = 2.5 > K + 1 at K = 1
    read_at_4 = Synthetic(length=2.5, at_k=4)
    p = length_rates(2.5, 4)[0]
    assert read_at_4.rates_at(4) == length_rates(2.5, 4)
    assert read_at_4.rates_at(8) == pytest.approx([p ** i for i in range(1, 9)])
    rates = Synthetic(rates=(0.9, 0.7, 0.5))
    assert rates.rates_at(2) == [0.9, 0.7] and rates.default_ks() == [1, 2, 3]
    with pytest.raises(SpecdashError, match="K=4 needs 4"):
        rates.rates_at(4)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_more_acceptance_never_predicts_slower(profile: Profile):
    """At every K, for both drafters: a longer acceptance length, a higher per-token rate,
    and any one position's rate raised (the rest kept non-increasing) never lose tok/s."""
    for drafter in (MODEL, FREE):
        for k in (1, 2, 3, 4, 8, 16, 32):
            lengths = [1 + k * i / 20 for i in range(21)]
            speeds = [predict(profile, length_rates(length, k), drafter).tokens_per_s for length in lengths]
            assert speeds == sorted(speeds), (drafter, k, speeds)
            for p in (0.3, 0.6, 0.9):
                base = [p ** (i + 1) for i in range(k)]
                slow = predict(profile, base, drafter).tokens_per_s
                for i in range(k):
                    raised = list(base)
                    raised[i] = base[i - 1] if i else 1.0
                    assert predict(profile, raised, drafter).tokens_per_s >= slow - 1e-9, (drafter, k, p, i)


@pytest.mark.parametrize("drafter", [MODEL, FREE])
@pytest.mark.parametrize("profile", [load_profile("ci-box"), PROFILES[-1]], ids=lambda p: p.name)
def test_closed_form_is_the_step_loops_expectation(profile: Profile, drafter: str):
    """simulate()'s own loop over a synthetic text, drafts accepted by random draws as
    llama-server draws them: its tok/s, acceptance and tokens per step agree with the
    closed form within the sampling noise of 20000 tokens."""
    for rates in ([0.8, 0.64, 0.512, 0.41], [0.5, 0.2], length_rates(3.0, 8)):
        want = predict(profile, rates, drafter)
        got = simulate_steps(profile, rates, drafter, n_tokens=20000, seed=7)
        # Every step drafts K, but the last few, where the token budget leaves less room.
        short = [i for i, step in enumerate(got.trace) if step[1] != len(rates)]
        assert got.k == len(rates) and all(i >= len(got.trace) - len(rates) for i in short)
        assert got.generated / got.steps == pytest.approx(want.tokens_per_step, rel=0.03)
        assert got.acceptance == pytest.approx(want.acceptance, rel=0.05)
        assert got.tokens_per_s == pytest.approx(want.tokens_per_s, rel=0.03)
        # The step's price is tighter: its only noise is which sync and replay each step paid.
        assert got.ms / got.steps == pytest.approx(want.step_ms, rel=0.005)


def test_the_command_on_a_shipped_profile(tmp_path: Path):
    out = tmp_path / "synth.json"
    proc = specdash("whatif", "--acceptance-length", "2.9", "--at-k", "4", "--profile", "epyc-32b", "--json", str(out))
    assert_ok(proc)
    assert "read at K=4" in proc.stdout and "best K=" in proc.stdout
    data: dict[str, Any] = json.loads(out.read_text())
    rows = [r for r in data["fixed"] if r["drafter"] == MODEL]
    assert [r["k"] for r in rows] == list(range(1, 33))
    at4 = next(r for r in rows if r["k"] == 4)
    assert at4["mean_accepted_length"] == pytest.approx(2.9)
    best = max(rows, key=lambda r: r["tokens_per_s"])
    assert data["best_k"][MODEL] == best["k"]
    # llama.cpp's meaning: the same length at every K, so K below L - 1 is left out.
    proc = specdash("whatif", "--acceptance-length", "3.5", "--profile", "gpu-like", "--json", str(out))
    assert_ok(proc)
    data = json.loads(out.read_text())
    assert min(r["k"] for r in data["fixed"]) == 3 and set(data["left_out"]) == {"1", "2"}
    assert "not predicted: K=1..2" in proc.stdout
    assert all(r["mean_accepted_length"] == pytest.approx(3.5) for r in data["fixed"])
    proc = specdash("whatif", "--acceptance-rates", "0.9,0.8,0.6", "--profile", "ci-box", "--ks", "1,3")
    assert_ok(proc)
    assert "model-free" in proc.stdout and "draft model" in proc.stdout


def test_the_command_measures_this_machine(smol_path: Any, tmp_path: Path):
    saved = tmp_path / "here.toml"
    proc = specdash("whatif", "--acceptance-rates", "0.8,0.6", "--target", str(smol_path), "--draft", str(smol_path),
                    "--threads", "1", "--ctx", "512", "--save-profile", str(saved))
    assert_ok(proc)
    assert "profile here" in proc.stdout and "draft model" in proc.stdout
    profile = load_profile(str(saved))
    assert profile.draft_ms > 0 and profile.verify_ms(3) > 0


BAD = [
    (["--acceptance-length", "0.5"], "--acceptance-length 0.5", "within [1, 65]"),
    (["--acceptance-length", "nan"], "--acceptance-length nan", "within [1, 65]"),
    (["--acceptance-length", "abc"], "--acceptance-length", "abc"),
    (["--acceptance-length", "4", "--ks", "2"], "--ks 2", "above K+1 = 3"),
    (["--acceptance-length", "6", "--at-k", "4"], "--acceptance-length 6 at K=4", "[1, 5]"),
    (["--acceptance-rates", "0.8,0.9"], "position 2's 0.9 is above position 1's 0.8", "never increase"),
    (["--acceptance-rates", "0.8,1.5"], "position 2's '1.5'", "[0, 1]"),
    (["--acceptance-rates", "0.8,,0.4"], "--acceptance-rates 0.8,,0.4", "comma-separated"),
    (["--acceptance-rates", "0.8,x"], "position 2's 'x'", "probability"),
    (["--acceptance-rates", "0.8,0.6", "--ks", "3"], "--ks 3", "gives 2 positions"),
    (["--acceptance-rates", "0.8", "--at-k", "4"], "--at-k", "give --acceptance-length"),
    (["--acceptance-rates", "0.8", "--acceptance-length", "2"], "--acceptance-length", "not allowed with"),
    (["--at-k", "4"], "--at-k", "--acceptance-length"),
    (["--acceptance-length", "2", "--recording", "x.jsonl"], "--recording", "synthetic"),
    (["--acceptance-length", "2", "--prompt", "hi"], "--prompt", "needs no text"),
]


@pytest.mark.parametrize("args,needle,more", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_values_are_one_line_exit_2(args: list[str], needle: str, more: str):
    assert_usage_error(specdash("whatif", *args, "--profile", "ci-box"), needle, more)
