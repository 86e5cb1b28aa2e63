"""`specdash whatif`: the simulation is exact where it claims to be, profiles refuse bad
input in one line, and the controller decides in the simulation as it does in the engine.

Real models: SmolLM2-135M as the target (lookup, suffix), and with its own Q4_0 as the
draft model (the small same-vocab pair of tests/test_fuzz_exact.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_helpers import assert_ok, assert_usage_error, specdash
from specdash.contract import events as E
from specdash.engine.ask_backoff import AskBackoff
from specdash.engine.controller import CostModelController
from specdash.engine.settings import EngineSettings, SamplingParams
from specdash.tuning.whatif.crossval import Halves, cross_validated, pick, split
from specdash.costs.profile import BUILTIN, Profile, load_profile, parse_profile
from specdash.tuning.whatif.simulate import Replay, SimResult, make_drafter, simulate
from specdash.tuning.whatif.transcript import Transcript, from_prompt

_spec = importlib.util.spec_from_file_location(
    "fuzz_exact", Path(__file__).resolve().parent.parent / "benchmarks" / "fuzz_exact.py")
assert _spec is not None and _spec.loader is not None
F = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("fuzz_exact", F)
_spec.loader.exec_module(F)

TOKENS = 64
PROMPTS = (
    "Write the numbers from 1 to 400, separated by commas.",
    "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals, with a docstring "
    "and three doctest examples.",
)
# Costs do not matter for acceptance; a fixed profile keeps these tests off the clock.
FLAT = Profile(name="test", verify={1: 10.0, 9: 14.0, 33: 26.0}, draft_ms=1.0, batch_ms=0.3, free_ms=0.05,
               overhead_ms=0.2)


def settings(smol: Path, draft: str, k: int = 0, **kw) -> EngineSettings:
    """Without the joint confidence cut unless asked: what the draft model drafts after its
    first wrong token is then known exactly (all K), so drafted counts compare too."""
    return EngineSettings(target=str(smol), draft=draft, k=k, threads=2, ctx=1024, max_tokens=TOKENS,
                          **{"adaptive": False, "draft_p_joint": 0.0, **kw})


@pytest.fixture(scope="module")
def transcripts(smol_path, small_draft) -> list[Transcript]:
    """Each prompt's plain greedy text (the real engine at K=0) with the draft model's
    teacher-forced pass."""
    out = []
    for prompt in PROMPTS:
        tr, (session, _) = from_prompt(settings(smol_path, str(small_draft)), prompt, str(small_draft),
                                       lambda s: None)
        session.close()
        out.append(tr)
    return out


def real_run(s: EngineSettings, prompt: str, controller=None, model: Path | None = None
             ) -> tuple[list[E.StepEvent], E.Summary]:
    """A real greedy run; `model`: the draft model a chain ends with (loaded first, as the
    session's chain model, then swapped to the chain)."""
    from specdash.sources.session import Session

    session = Session(s.replace(draft=str(model)) if model else s, controller=controller)
    if model:
        session.send(E.SetDrafter(s.draft))
    try:
        events = list(session.run(prompt))
    finally:
        session.close()
    steps = [ev for ev in events if isinstance(ev, E.StepEvent)]
    summary = next(ev for ev in events if isinstance(ev, E.Summary))
    return steps, summary


def agreeing_steps(tr: Transcript, steps: list[E.StepEvent], near_ties: list[str], what: str) -> int:
    """How many leading real steps committed the same text as the plain run; a divergence
    must sit at a near-tie of the target (batch rounding), and is reported."""
    real = [t for s in steps for t in s.tokens]
    d = next((i for i, (a, b) in enumerate(zip(real, tr.seq)) if a != b), min(len(real), tr.n_generated))
    if d < min(len(real), tr.n_generated):
        ties = tr.near_ties()["target"]
        assert d in ties, f"{what}: the text diverged from the plain run at token {d}, not at a near-tie ({ties})"
        near_ties.append(f"whatif {what}: text diverged at a target near-tie, token {d}")
    n, end = 0, 0
    for s in steps:
        end += len(s.tokens)
        if end > d:
            break
        n += 1
    return n


def assert_same_steps(tr: Transcript, sim: SimResult, steps: list[E.StepEvent], near_ties: list[str],
                      what: str, decisions: bool = False) -> None:
    n = agreeing_steps(tr, steps, near_ties, what)
    assert n > 0
    draft_ties = set(tr.near_ties().get("draft", []))
    p = past_eos = 0
    for i, (ev, (k, drafted, acc, decision, source)) in enumerate(zip(steps[:n], sim.trace)):
        real = (ev.k, ev.drafted, ev.accepted) + ((ev.decision,) if decisions else ())
        mine = (k, drafted, acc) + ((decision,) if decisions else ())
        if real != mine and tr.eos and p + acc == len(tr.seq) and ev.accepted > acc and real[:2] == mine[:2]:
            # Drafts accepted past the end-of-generation token: the text after it is
            # unknown to the simulation (documented), the run stops here either way.
            near_ties.append(f"whatif {what}: last step accepted {ev.accepted - acc} draft tokens past EOS")
            past_eos = ev.accepted - acc
            p += acc + 1
            continue
        if real != mine:
            # Only the draft model's proposals can differ (batched vs one-token rounding).
            window = set(range(p, p + max(drafted, ev.drafted) + 1)) if "draft" in (source, ev.drafter) else set()
            assert window & draft_ties, f"{what} step {i + 1} at token {p}: real {real}, simulated {mine}"
            near_ties.append(f"whatif {what}: step {i + 1} differs at a draft near-tie")
            if tr.draft is not None and not decisions and sim.drafter == "model":
                check_each_model_step(tr, steps[i:n], p, draft_ties, near_ties, what)
            return  # the simulated path parts from the real one here
        p += acc + 1
    if n == len(steps):
        assert sim.steps == len(steps)
        assert (sim.drafted, sim.accepted + past_eos) == (sum(s.drafted for s in steps), sum(s.accepted for s in steps))


def check_each_model_step(tr: Transcript, steps: list[E.StepEvent], p: int, ties: set[int],
                          near_ties: list[str], what: str) -> None:
    """After the paths part: each remaining real step on its own. The draft model drafts
    its teacher-forced argmax from the true prefix, so a step at p with K drafted accepts
    the run of positions from p where that argmax equals the text."""
    checked = skipped = 0
    for ev in steps:
        acc = 0
        while acc < ev.drafted and p + acc < len(tr.seq) and tr.draft.argmax[p + acc] == tr.seq[p + acc]:
            acc += 1
        if ev.accepted != acc:
            assert set(range(p, p + max(acc, ev.accepted) + 1)) & ties, \
                f"{what} at token {p}: real accepted {ev.accepted}, teacher-forced {acc}"
            skipped += 1
        checked += 1
        p += len(ev.tokens)
    near_ties.append(f"whatif {what}: {checked} later steps checked one by one, {skipped} at draft near-ties")


@pytest.mark.parametrize("kind,k", [("lookup", 2), ("lookup", 8), ("suffix", 4), ("chain", 4), ("model", 3), ("model", 8)])
def test_simulated_acceptance_equals_a_real_greedy_run(kind, k, smol_path, small_draft, transcripts, near_ties):
    spec = str(small_draft) if kind == "model" else kind
    s = settings(smol_path, spec, k)
    for prompt, tr in zip(PROMPTS, transcripts):
        steps, _ = real_run(s, prompt, model=small_draft if kind == "chain" else None)
        sim = simulate(tr, make_drafter(spec, tr, FLAT, s), FLAT, s, name=kind, k=k)
        assert_same_steps(tr, sim, steps, near_ties, f"{kind} K={k} on {prompt[:20]!r}")


def with_off_text(tr: Transcript, draft: Path, p_joint: float) -> Transcript:
    """The transcript with the draft model's own continuation after each wrong token
    (transcript.off_text), as whatif builds it when a cut is set."""
    from specdash.engine.llm import LLM
    from specdash.tuning.whatif.transcript import off_text

    assert tr.draft is not None
    llm = LLM(draft, n_ctx=1024, n_threads=1)
    try:
        off = off_text(llm, tr.prompt, tr.seq, tr.draft, 0.0, p_joint, 7)
    finally:
        llm.close()
    return dataclasses.replace(tr, draft=dataclasses.replace(tr.draft, off_text=off))


def sim_confidences(tr: Transcript, p: int, n: int) -> list[float]:
    """The confidences the simulation cuts a draft starting at text position p by: the
    teacher-forced ones up to its first wrong token, its own continuation after it."""
    assert tr.draft is not None and tr.draft.off_text is not None
    out, left = [], -1
    for j in range(p, p + n):
        if left < 0:
            out.append(float(tr.draft.top_p[j]) if j < len(tr.draft.top_p) else 1.0)
            if j >= len(tr.seq) or int(tr.draft.argmax[j]) != tr.seq[j]:
                left = j
        else:
            own = tr.draft.off_text.get(left)
            out.append(float(own[j - left - 1]) if own is not None and j - left - 1 < len(own) else 1.0)
    return out


@pytest.mark.parametrize("p_joint", [0.1, 0.5])
def test_joint_confidence_cut_is_simulated_on_and_off_the_text(p_joint, smol_path, small_draft,
                                                             transcripts, near_ties):
    """With draft_p_joint the draft model stops where the product of its top probabilities
    falls below the cut. Up to its first wrong token its context is the true prefix, so
    the simulation cuts at the same place from the teacher-forced probabilities; after
    it, from the draft model's own continuation of its wrong token (off_text), which is
    what the drafter decodes. So every step drafts the same count in both, near-ties and
    products within rounding of the threshold aside, and accepts the same."""
    s = settings(smol_path, str(small_draft), 8, draft_p_joint=p_joint)
    cut_on_text = cut_off_text = 0
    for prompt, tr0 in zip(PROMPTS, transcripts):
        tr = with_off_text(tr0, small_draft, p_joint)
        steps, _ = real_run(s, prompt)
        sim = simulate(tr, make_drafter(str(small_draft), tr, FLAT, s), FLAT, s, name="model", k=8)
        n = agreeing_steps(tr, steps, near_ties, f"p_joint {p_joint} on {prompt[:20]!r}")
        ties = set(tr.near_ties().get("draft", []))
        p = 0
        for i, (ev, (k, drafted, acc, _, _)) in enumerate(zip(steps[:n], sim.trace)):
            what = f"p_joint {p_joint} on {prompt[:20]!r} step {i + 1} at token {p}"
            m = min(drafted, ev.drafted)
            # The product at the token one side drafted and the other did not: near the
            # threshold, rounding tips the cut (the teacher-forced pass decodes in one
            # batch, the drafter one token at a time: ~1% per probability on this Q4_0).
            at_cut = math.prod(sim_confidences(tr, p, m + 1))
            tie = bool(set(range(p, p + max(drafted, ev.drafted) + 1)) & ties) or (
                drafted != ev.drafted and abs(math.log(at_cut / p_joint)) < 0.015 * (m + 1))
            if ev.accepted != acc:
                assert tie, f"{what}: real accepted {ev.accepted}/{ev.drafted}, simulated {acc}/{drafted}"
                near_ties.append(f"whatif {what}: acceptance differs at a near-tie")
                break  # the paths part here
            if drafted != ev.drafted:
                assert tie, f"{what}: real drafted {ev.drafted}, simulated {drafted} (accepted {acc})"
                near_ties.append(f"whatif {what}: the cut differs at a near-tie")
            elif drafted < k:  # the cut ended this draft, at the same token in both
                cut_on_text += acc == drafted
                cut_off_text += acc < drafted  # decided after its wrong token: by off_text
            p += acc + 1
    assert cut_on_text > 0, "no draft was cut on the text: the test compared nothing"
    assert cut_off_text > 0, "no draft was cut after its first wrong token: off_text was not tested"


def test_a_recurrent_draft_is_not_followed_off_the_text(mamba2_path, mamba2_draft_path):
    """A recurrent draft model's state cannot be cut back to branch at each wrong token,
    so whatif keeps the text's confidence as the stand-in there, and does not say it
    follows the draft's own continuation."""
    from specdash.engine.llm import LLM
    from specdash.tuning.whatif.transcript import over_text

    target, draft = LLM(mamba2_path, n_ctx=512, n_threads=2), LLM(mamba2_draft_path, n_ctx=512, n_threads=2)
    try:
        assert draft.strategy.kind != "kv"
        prompt = target.tokenize("The quick brown fox")
        text = target.tokenize(" jumps over the lazy dog and runs away", add_special=False)
        said: list[str] = []
        s = EngineSettings(target=str(mamba2_path), draft=str(mamba2_draft_path), max_tokens=len(text),
                           draft_p_joint=0.1)
        tr = over_text(target, prompt, text, "max_tokens", s, said.append, draft, "draft")
        assert tr.draft is not None and tr.draft.off_text is None
        assert said and not any("own continuation" in m for m in said), said
    finally:
        target.close()
        draft.close()


# The recurrent fixtures' prompt (tests/test_recurrent_exact.py): their text is cyclic, so
# prompt lookup from 1-token matches drafts long copies.
RECURRENT_PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"


@pytest.mark.parametrize("case", ["mamba2, no checkpoint", "lfm2, snapshots only"])
def test_whatif_never_drafts_more_than_the_targets_rollback_takes_back(case, request, monkeypatch, near_ties):
    """A recurrent target takes back only so much of a rejected draft, and the engine
    drafts no more than that (Strategy.max_draft): nothing on a memory llama.cpp can take
    nothing back from (here the mamba2 checkpoint fixture with its checkpoint refused),
    n_rs_seq tokens on one with snapshots and no checkpoint (the lfm2 fixture's real
    snapshots, created for k_max = 3, with its checkpoint refused, run at K = 8). whatif
    at K = 8 must draft under the same cap, step for step as the real run."""
    import specdash.engine.llm as llm_module
    from specdash.sources.session import Session

    arch, cap = ("mamba2", 0) if case.startswith("mamba2") else ("lfm2", 3)
    path = request.getfixturevalue(f"{arch}_path")
    real_probe = llm_module.probe_rollback

    def no_checkpoint(llm, requested):
        st = real_probe(llm, requested)
        if st.kind == "snapshots":
            return dataclasses.replace(st, checkpoint_bytes=0)
        return dataclasses.replace(st, kind="none", checkpoint_bytes=0, why="test: no checkpoint")

    monkeypatch.setattr(llm_module, "probe_rollback", no_checkpoint)
    s = EngineSettings(target=str(path), draft="lookup", k=cap, k_max=cap, adaptive=False, threads=1, ctx=1024,
                       max_tokens=48, raw=True, lookup_min_ngram=1, lookup_max_ngram=3)
    session = Session(s)
    try:
        st = session.engine.target.strategy
        assert st.checkpoint_bytes == 0 and (st.kind, st.n_rs_seq) == (("none", 0) if cap == 0 else ("snapshots", cap))
        session.send(E.SetK(8))  # above what the context was created for
        steps = [ev for ev in session.run(RECURRENT_PROMPT) if isinstance(ev, E.StepEvent)]
    finally:
        session.close()
    assert all(ev.k <= cap and ev.drafted <= cap for ev in steps)
    assert cap == 0 or any(ev.drafted == cap for ev in steps), "the cap never bound: the test shows nothing"

    tr, (whatif_session, _) = from_prompt(s, RECURRENT_PROMPT, None, lambda m: None)
    whatif_session.close()
    sim = simulate(tr, make_drafter("lookup", tr, FLAT, s), FLAT, s, name="lookup", k=8)
    over = [(i + 1, drafted) for i, (_, drafted, *_) in enumerate(sim.trace) if drafted > cap]
    assert not over, f"{case}: whatif drafted more than the target's cap {cap}: (step, drafted) {over[:5]}"
    assert all(k <= cap for k, *_ in sim.trace)  # and reports the K the engine's step reports
    assert_same_steps(tr, sim, steps, near_ties, f"{case}, K=8 capped at {cap}")
    # The cap is what held it: without it, the same simulation drafts longer copies.
    free = simulate(dataclasses.replace(tr, max_draft=None), make_drafter("lookup", tr, FLAT, s), FLAT, s,
                    name="lookup", k=8)
    assert max(drafted for _, drafted, *_ in free.trace) > cap


# Prompts where the default pair's draft model is wrong at real disagreements. The test
# takes them in order until it has its case: where the target's text parts from the plain
# run at a near-tie early (this CPU's rounding), the next prompt is tried.
CUT_PROMPTS = (
    "Explain what this SQL query does, clause by clause, then rewrite it with a CTE:\n"
    "SELECT c.name, COUNT(o.id) AS orders, SUM(o.total) AS spent FROM customers c "
    "JOIN orders o ON o.customer_id = c.id WHERE o.created_at >= '2024-01-01' "
    "GROUP BY c.name HAVING COUNT(o.id) > 3 ORDER BY spent DESC LIMIT 10;",
    "Write a short Python function that parses a date like 2024-03-05 into a tuple of ints, "
    "then explain two ways it could fail.",
    "Describe, in five numbered steps, how a hash map handles a collision, and name one "
    "language whose standard library uses open addressing.",
)


@pytest.mark.slow
def test_the_cut_after_a_wrong_token_follows_the_draft_models_own_continuation(target_path, draft_path,
                                                                              near_ties):
    """The default pair, where the draft is wrong at real disagreements, not only at
    near-ties: after a wrong token the real draft model drafts on from its own context,
    and the joint cut stops it by its own confidence there. whatif follows that
    continuation (transcript.off_text), so each step drafts as many tokens as the real
    run. With the text's confidence standing in (before off_text) 5 of the first 11 steps
    on the first prompt drafted another count than the real run; following the
    continuation, none. The real run is the transcript's own session, switched to K=8.
    (SmolLM2 with its own Q2_K as the draft was tried in its place: its draft-side
    near-ties, which the transcript does not mark, made steps differ by a token.)"""
    s = EngineSettings(target=str(target_path), draft=str(draft_path), k=8, threads=2, ctx=1024, max_tokens=64,
                       adaptive=False, draft_p_joint=0.1)
    followed = 0
    for prompt in CUT_PROMPTS:
        tr, (session, _) = from_prompt(s, prompt, str(draft_path), lambda m: None)
        try:
            assert tr.draft is not None and tr.draft.off_text, "no wrong draft token to follow"
            for cmd in (E.SetDrafter(str(draft_path)), E.SetK(8), E.SetAdaptive(False)):
                session.send(cmd)
            steps = [ev for ev in session.run(prompt) if isinstance(ev, E.StepEvent)]
        finally:
            session.close()
        assert max(ev.k for ev in steps) == 8 and any(ev.drafted for ev in steps), "the real run did not draft at K=8"
        sim = simulate(tr, make_drafter(str(draft_path), tr, FLAT, s), FLAT, s, name="model", k=8)
        n = agreeing_steps(tr, steps, near_ties, f"default pair p_joint 0.1 on {prompt[:20]!r}")
        ties = set(tr.near_ties().get("draft", []))
        p = 0
        for i, (ev, (k, drafted, acc, _, _)) in enumerate(zip(steps[:n], sim.trace)):
            what = f"default pair, step {i + 1} at token {p}"
            window = set(range(p, p + max(drafted, ev.drafted) + 1))
            at_cut = math.prod(sim_confidences(tr, p, min(drafted, ev.drafted) + 1))
            tie = bool(window & ties) or abs(math.log(at_cut / 0.1)) < 0.015 * (min(drafted, ev.drafted) + 1)
            assert ev.accepted == acc or tie, f"{what}: real accepted {ev.accepted}, simulated {acc}"
            if ev.accepted != acc:
                near_ties.append(f"whatif {what}: acceptance differs at a near-tie")
                break
            if drafted != ev.drafted:
                assert tie, f"{what}: real drafted {ev.drafted}, simulated {drafted} (accepted {acc})"
                near_ties.append(f"whatif {what}: the cut differs at a near-tie")
            elif acc < drafted < k:
                followed += 1  # stopped after its wrong token, by its own continuation
            p += acc + 1
        if followed:
            break
    assert followed > 0, "no draft was cut after its first wrong token: off_text was not tested"


def test_joint_confidence_cut_stops_where_the_product_falls_below_it():
    from specdash.engine.drafters.draft_model import JointCut

    probs = [0.9, 0.8, 0.5, 0.99, 0.2]
    def drafted(p_min: float, p_joint: float) -> int:
        cut = JointCut(p_min, p_joint)
        return next((i for i, q in enumerate(probs) if cut.stop(q)), len(probs))
    assert drafted(0.0, 0.0) == 5 and not JointCut(0.0, 0.0).active
    assert drafted(0.0, 0.5) == 2  # 0.9, 0.72, then 0.36 < 0.5
    assert drafted(0.0, 0.3) == 4  # 0.36, 0.356, then 0.071 < 0.3
    assert drafted(0.0, 1.0) == 1  # the first token is always drafted
    assert drafted(0.6, 0.0) == 2  # llama.cpp's per-token cut: stops before 0.5
    assert drafted(0.95, 0.0) == 0  # ... and may cut the first token too
    assert drafted(0.6, 0.8) == 1  # both: whichever stops first


class Recorder(CostModelController):
    """The engine's controller, noting what the engine told it (and, inside
    `noting_asks()`, the time of every copy-source ask the back-off was told)."""

    def __init__(self, **kw):
        self.asked: list[float] = []
        self.seed: dict[int, float] | None = None
        self.prices: list[float | None] = []
        self.catch_up: list[float] = []
        self.observed: list[tuple[float, float, float]] = []
        super().__init__(**kw)

    def seed_costs(self, ms):
        self.seed = dict(ms)
        super().seed_costs(ms)

    @contextlib.contextmanager
    def noting_asks(self):
        real = AskBackoff.asked

        def noting(backoff, source, ms, found):
            self.asked.append(ms)
            real(backoff, source, ms, found)

        AskBackoff.asked = noting  # type: ignore[method-assign]
        try:
            yield
        finally:
            AskBackoff.asked = real  # type: ignore[method-assign]

    def price_draft(self, relative_cost, k_ceiling=False):
        self.prices.append(relative_cost)
        super().price_draft(relative_cost, k_ceiling)

    def choose(self, content, catch_up_ms=0.0):
        self.catch_up.append(catch_up_ms)
        return super().choose(content, catch_up_ms)

    def observe(self, k, drafted, accepted, draft_ms, verify_ms, other_ms, content, evidence=0, source=""):
        self.observed.append((draft_ms, verify_ms, other_ms))
        super().observe(k, drafted, accepted, draft_ms, verify_ms, other_ms, content, evidence, source)


def pinned(ctl: CostModelController) -> CostModelController:
    """The simulation's controller on the cost shape the engine's was pinned to (the suite's
    SPECDASH_COST_SHAPE, conftest): both learn s(1) from the same steps, nothing else."""
    from specdash.sources.session import pin_cost_shape

    pin_cost_shape(ctl)
    return ctl


@pytest.mark.parametrize("kind", ["lookup", "model", "chain"])
def test_simulated_controller_decides_as_the_engine_did(kind, smol_path, small_draft, transcripts, near_ties,
                                                        cost_curve):
    """Fed the costs the engine measured, step by step, the simulation's adaptive run
    makes the engine's choices: same K, same draft, same reason, every step, on each
    machine kind's cost curve."""
    spec = str(small_draft) if kind == "model" else kind
    s = settings(smol_path, spec, 4, adaptive=True)
    # Keeps probing (no verdict that the draft model cannot pay), like the fuzz tests: on
    # this CPU the real verdict would leave nothing to compare but K=0.
    params = dict(k_min=s.k_min, k_max=s.k_max, k_init=s.k, verdict_margin=0.0, probe_every=4)
    for prompt, tr in zip(PROMPTS, transcripts):
        ctl = Recorder(**params)
        with ctl.noting_asks():
            steps, _ = real_run(s, prompt, controller=ctl, model=small_draft if kind == "chain" else None)
        replay = Replay(steps=ctl.observed, catch_up=ctl.catch_up, seed=ctl.seed, price=ctl.prices[-1],
                        asks=ctl.asked)
        sim = simulate(tr, make_drafter(spec, tr, FLAT, s, replay), FLAT, s, name=kind,
                       controller=pinned(CostModelController(**params)), replay=replay)
        # The controller did decide (where batches are cheap enough for K to move).
        assert len({t[0] for t in sim.trace}) > 1 or kind == "lookup" or cost_curve != "intel-amx"
        assert_same_steps(tr, sim, steps, near_ties, f"adaptive {kind} on {prompt[:20]!r}", decisions=True)


def test_simulated_auto_chooses_as_the_engine_did(smol_path, small_draft, transcripts, near_ties, cost_curve):
    """auto, the default, in whatif and in the real engine (its draft model the session's
    --draft-model): fed the costs and catch-ups the engine measured, the simulation takes
    the same source, K and reason every step. Simulated as the chain, it would not."""
    from specdash.sources.session import Session

    s = settings(smol_path, "auto", 4, adaptive=True, draft_model=str(small_draft))
    params = dict(k_min=s.k_min, k_max=s.k_max, k_init=s.k, verdict_margin=0.0, probe_every=4)
    drafted_by: set[str] = set()
    for prompt, tr in zip(PROMPTS, transcripts):
        ctl = Recorder(**params)
        session = Session(s, controller=ctl)
        # auto's model part: until loaded (drafters/lazy.py) its catch-up is its load estimate.
        model: Any = next(p for p in session.engine.drafter.parts() if not p.free)
        asked: list[float] = []  # what auto was told the model's catch-up would cost, each step
        measured = model.catch_up_ms
        model.catch_up_ms = lambda tokens: asked.append(measured(tokens)) or asked[-1]
        try:
            with ctl.noting_asks():
                events = list(session.run(prompt))
        finally:
            session.close()
        steps = [ev for ev in events if isinstance(ev, E.StepEvent)]
        replay = Replay(steps=ctl.observed, catch_up=asked, seed=ctl.seed, price=ctl.prices[-1], asks=ctl.asked)
        sim = simulate(tr, make_drafter("auto", tr, FLAT, s, replay), FLAT, s, name="auto",
                       controller=pinned(CostModelController(**params)), replay=replay)
        assert_same_steps(tr, sim, steps, near_ties, f"auto on {prompt[:20]!r}", decisions=True)
        drafted_by |= {t[4] for t in sim.trace}
        chain = simulate(tr, make_drafter("chain", tr, FLAT, s, replay), FLAT, s,
                         name="chain", controller=pinned(CostModelController(**params)), replay=replay)
        n = agreeing_steps(tr, steps, [], "auto")
        assert [t[:4] for t in chain.trace[:n]] != [t[:4] for t in sim.trace[:n]], "auto simulated as the chain"
    if cost_curve == "intel-amx":  # cheap batches: every source has its turn
        assert {"draft", "none"} <= drafted_by and drafted_by & {"lookup", "suffix"}, drafted_by


def test_whatif_feeds_autos_model_the_prompt_only_when_it_first_drafts(transcripts, smol_path, small_draft):
    """As in the engine (drafters/auto.py): auto's model is not prefilled with the prompt;
    the first step it drafts pays for feeding it (and counts that as catch-up), a chain's
    model was prefilled and pays for one or two tokens."""
    tr = transcripts[1]
    s = settings(smol_path, "auto", 4)
    prompt = list(tr.prompt)
    feeds = {}
    for kind in ("auto", "chain"):
        drafter = make_drafter(kind, tr, FLAT, s)
        drafter.reset()
        drafter.prefill(prompt)
        model: Any = next(p for p in drafter.parts() if not p.free).inner
        assert model.catch_up_ms(prompt) == 0.0  # nothing measured yet: as the engine's
        model.propose(prompt, 3, SamplingParams(temperature=0.0), None)
        feeds[kind] = (model.spent, model.prep)
    assert feeds["auto"] == (pytest.approx(FLAT.feed_ms(len(prompt)) + 2 * FLAT.draft_ms),
                             pytest.approx(FLAT.feed_ms(len(prompt)) / len(prompt) * (len(prompt) - 2)))
    assert feeds["chain"] == (pytest.approx(FLAT.feed_ms(1) + 2 * FLAT.draft_ms), 0.0)


def test_a_draft_models_prompt_feed_is_counted_where_it_is_paid(transcripts, smol_path, small_draft):
    """A fixed draft model (alone or in the chain) is fed the prompt in the prefill: the
    run's prompt_feed_ms, out of decoding's tok/s but in the tok/s auto is judged by, and
    in the first half of a cross-validation. auto feeds its model lazily, inside decoding:
    its prompt_feed_ms is 0 and what it paid is in its ms."""
    tr = transcripts[1]
    s = settings(smol_path, "auto", 4)
    feed = FLAT.feed_ms(len(tr.prompt) - 1)
    for kind in ("chain", str(small_draft)):
        run = simulate(tr, make_drafter(kind, tr, FLAT, s), FLAT, s, name=kind, k=3)
        assert run.prompt_feed_ms == pytest.approx(feed)
        assert run.tokens_per_s_with_feed == pytest.approx(run.generated / (run.ms + feed) * 1e3)
        (half,) = split(tr, FLAT, s, [run])
        first = simulate(dataclasses.replace(tr, max_tokens=tr.n_generated // 2),
                         make_drafter(kind, tr, FLAT, s), FLAT, s, name=kind, k=3)
        assert half.first[1] == pytest.approx(first.ms) and half.prompt_feed_ms == pytest.approx(feed)
        assert half.second[1] == pytest.approx(run.ms - first.ms)
        # Cross-validated, the pick of the second half is scored on the first with the feed.
        cv, decoding = pick([half]), pick([half], feed=False)
        assert cv.tokens_per_s == pytest.approx(run.generated / (run.ms + feed) * 1e3)
        assert decoding.tokens_per_s == pytest.approx(run.tokens_per_s)
        if kind == str(small_draft):
            # And each step pays the model's drafting (at least one fed token and K - 1
            # decodes at the profile's cost) besides the verify: a loan (Borrowed) around
            # the simulated model once hid its costs, pricing it at nothing.
            verify = sum(FLAT.verify_ms(t[1] + 1) + FLAT.overhead_ms for t in run.trace)
            drafting = sum(t[1] * FLAT.draft_ms for t in run.trace if t[1])
            assert run.drafts and run.ms >= verify + drafting - 1e-6
    lookup = simulate(tr, make_drafter("lookup", tr, FLAT, s), FLAT, s, name="lookup", k=3)
    assert lookup.prompt_feed_ms == 0.0 and lookup.tokens_per_s_with_feed == lookup.tokens_per_s
    auto = simulate(tr, make_drafter("auto", tr, FLAT, s), FLAT, s, name="auto",
                    controller=CostModelController(k_min=s.k_min, k_max=s.k_max, k_init=s.k))
    assert auto.prompt_feed_ms == 0.0


def test_cross_validation_scores_each_pick_on_the_other_half_only():
    """A drafter that is fast on the first half and slow on the second is the oracle's
    pick, and the first half's; cross-validated, it is scored on the second half only,
    and the steady one (the second half's pick) on the first."""
    steady = Halves("lookup", 4, (50, 1000.0), (50, 1000.0))  # 50 tok/s on both halves
    lucky = Halves("chain", 8, (60, 500.0), (40, 1000.0))  # 120, then 40 tok/s: 66.7 over the text
    plain = Halves("none", 0, (50, 2000.0), (50, 2000.0))
    hindsight = max((h.first[0] + h.second[0]) / (h.first[1] + h.second[1]) * 1e3 for h in (plain, steady, lucky))
    assert hindsight == pytest.approx(100 / 1.5)  # the oracle: chain K=8
    cv = pick([plain, steady, lucky])
    assert cv.on_first == ("chain", 8) and cv.on_second == ("lookup", 4)
    # chain on the second half (40 tokens in 1000 ms) + lookup on the first (50 in 1000 ms);
    # each scored on the half it was picked on would be (60 + 50) / 1.5 s.
    assert cv.tokens_per_s == pytest.approx(90 / 2.0)
    assert cv.describe() == "chain K=8 picked on the first half, lookup K=4 on the second"
    assert pick([plain, steady]).describe() == "lookup K=4"
    assert pick([plain]).describe() == "plain"


def test_cross_validation_on_a_real_text_splits_it_in_two(transcripts, smol_path):
    """Each fixed run's first half is a run over the text's first half only, the second
    the rest of the run; the pick is made among the runs given."""
    tr = transcripts[0]
    s = settings(smol_path, "lookup")
    runs = [simulate(tr, make_drafter(kind, tr, FLAT, s), FLAT, s, name=kind, k=k)
            for kind, k in (("none", 0), ("lookup", 2), ("lookup", 8), ("suffix", 4))]
    halves = split(tr, FLAT, s, runs)
    for run, h in zip(runs, halves):
        assert (h.drafter, h.k) == (run.drafter, run.k)
        assert h.first[0] == tr.n_generated // 2 and 0 < h.first[1] < run.ms
    assert pick(halves).on_first in {(r.drafter, r.k) for r in runs}
    assert cross_validated(tr, FLAT, s, runs) == pick(halves)


def test_a_checkpoint_targets_rollback_is_priced_apart_as_the_engine_does():
    """On a profile with a [checkpoint] table, whatif tells adaptive K what the engine
    tells it on a checkpoint target (Engine._measure_costs, Engine.step): the rollback's
    price once, up front, and each step's costs without the restore and replay, which the
    simulated run's time still pays. No model: a text lookup copies from, with every
    other repeat changed in one place so that some copies are rejected part-way."""
    unit = list(range(10, 22))
    seq = [t for i in range(10) for t in (unit if i % 2 else [*unit[:7], 99, *unit[8:]])]
    tr = Transcript(prompt=[1, *unit], seq=seq, n_generated=len(seq), eos=False, max_tokens=len(seq), n_ctx=1024,
                    n_batch=512, pieces=[b"a "] * len(seq), prompt_text="a", target="test")
    profile = dataclasses.replace(FLAT, restore_ms=3.0, replay_ms=2.0)
    s = EngineSettings(draft="lookup", k=4, adaptive=True, lookup_min_ngram=1, lookup_max_ngram=3)

    class Told(Recorder):
        def price_rollback(self, save_ms, restore_ms, replay_ms):
            self.rollback_price = (save_ms, restore_ms, dict(replay_ms))
            super().price_rollback(save_ms, restore_ms, replay_ms)

    ctl = Told(k_min=s.k_min, k_max=s.k_max, k_init=s.k)
    sim = simulate(tr, make_drafter("lookup", tr, profile, s), profile, s, name="lookup", controller=ctl)
    assert ctl.rollback_price[:2] == (0.0, 3.0) and ctl.rollback_price[2][5] == 10.0
    rejected = [acc for _, drafted, acc, _, _ in sim.trace if acc < drafted]
    assert rejected, "no draft was rejected: no rollback to price"
    assert len(ctl.observed) == sim.steps
    for (_, drafted, _, _, _), (_, verify_ms, other_ms) in zip(sim.trace, ctl.observed):
        assert (verify_ms, other_ms) == pytest.approx((profile.verify_ms(drafted + 1), profile.overhead_ms))
    told = sum(d + v + o for d, v, o in ctl.observed)
    assert sim.ms == pytest.approx(told + sum(3.0 + 2.0 * (acc + 1) for acc in rejected))


# --- profiles -----------------------------------------------------------------------------
def test_shipped_profiles_parse_and_interpolate():
    for name in BUILTIN:
        p = load_profile(name)
        assert p.name == name and p.note and p.verify_ms(1) > 0
        assert p.verify_ms(33) >= p.verify_ms(1)
    epyc = load_profile("epyc-32b")
    assert epyc.verify_ms(1) == pytest.approx(1000 / 2.89, rel=0.01)
    assert epyc.verify_ms(25) == pytest.approx(1.3 * epyc.verify_ms(1), rel=0.01)
    assert epyc.verify_ms(13) == pytest.approx((346 + 450) / 2)
    assert epyc.draft_ms == 12.0
    gpu = load_profile("gpu-like")
    assert gpu.verify_ms(33) < 1.2 * gpu.verify_ms(1)


def test_profile_round_trips_through_toml():
    for prof in (FLAT, dataclasses.replace(FLAT, pair_ms=1.7)):
        back = parse_profile(prof.to_toml(), "x.toml")
        assert back.verify == prof.verify and back.draft_ms == prof.draft_ms and back.batch_ms == prof.batch_ms
        assert back.pair_ms == prof.pair_ms
        assert back.free_ms == prof.free_ms and back.overhead_ms == pytest.approx(prof.overhead_ms)


def test_a_draft_models_sync_is_priced_from_its_measured_pair():
    """The drafter's usual sync (2 tokens) costs what the profile measured for a pair, a
    catch-up adds the batch price per further token; without a pair, single + batch."""
    assert FLAT.feed_ms(1) == 1.0 and FLAT.feed_ms(2) == pytest.approx(1.3) and FLAT.feed_ms(5) == pytest.approx(2.2)
    paired = dataclasses.replace(FLAT, pair_ms=1.9)
    assert paired.feed_ms(1) == 1.0 and paired.feed_ms(2) == 1.9 and paired.feed_ms(5) == pytest.approx(2.8)
    assert paired.feed_ms(0) == 0.0


BAD = [
    ("name = \n", "invalid TOML"),
    ('name = "x"\n[verify_ms]\n1 = 5\nspeed = 3\n', "[verify_ms] key 'speed'"),
    ('name = "x"\n[verify_ms]\n1 = -5\n', "[verify_ms] 1"),
    ('name = "x"\n', "[verify_ms] missing"),
    ('[verify_ms]\n1 = 5\n', "name"),
    ('name = "x"\nverify = 3\n[verify_ms]\n1 = 5\n', "unknown key 'verify'"),
    ('name = "x"\n[verify_ms]\n1 = 5\n[draft]\nms_per_tok = 3\n', "unknown key [draft] 'ms_per_tok'"),
    ('name = "x"\n[verify_ms]\n1 = 5\n[draft]\nms_per_token = "fast"\n', "[draft] ms_per_token"),
    ('name = "x"\n[verify_ms]\n1 = 5\n[checkpoint]\nrestore_ms = true\n', "[checkpoint] restore_ms"),
    ('name = "x"\n[verify_ms]\n1 = 5\n[draft]\npair_ms = -2\n', "[draft] pair_ms"),
]


@pytest.mark.parametrize("text,needle", BAD)
def test_bad_profile_is_one_line_exit_2(text, needle, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    proc = specdash("whatif", "--prompt", "hi", "--profile", str(path))
    assert_usage_error(proc, str(path), needle)


def test_missing_profile_and_bad_flags_are_one_line(tmp_path):
    assert_usage_error(specdash("whatif", "--prompt", "hi", "--profile", str(tmp_path / "no.toml")),
                       "no.toml", "epyc-32b")
    assert_usage_error(specdash("whatif", "--prompt", "hi", "--temp", "0.7"), "greedy")
    assert_usage_error(specdash("whatif", "--ks", "0,4"), "--ks")
    assert_usage_error(specdash("whatif", "--drafters", "lookup,magic"), "--drafters")
    assert_usage_error(specdash("whatif"), "--prompt", "--recording")


# --- the command, end to end ---------------------------------------------------------------
def test_whatif_from_a_recording(smol_path, tmp_path):
    """A temperature-0 recording is simulated on a shipped profile; a sampled one is refused."""
    rec = tmp_path / "run.jsonl"
    base = ["--target", str(smol_path), "--threads", "1", "--ctx", "1024", "--max-tokens", "24"]
    made = specdash("run", *base, "--draft", "lookup", "--k", "4", "--prompt", PROMPTS[0], "--record", str(rec))
    assert made.returncode == 0, made.stderr
    out = tmp_path / "report.json"
    proc = specdash("whatif", "--recording", str(rec), "--target", str(smol_path), "--threads", "1",
                    "--draft", "lookup", "--profile", "epyc-32b", "--ks", "1-4,16", "--json", str(out))
    assert_ok(proc)
    assert "oracle best" in proc.stdout and "<- oracle best" in proc.stdout
    assert "adaptive / best fixed" in proc.stdout
    report = json.loads(out.read_text())
    assert report["profile"]["name"] == "epyc-32b"
    assert report["transcript"]["n_generated"] == 24
    assert {r["drafter"] for r in report["fixed"]} == {"lookup", "edit", "suffix", "chain"}
    assert sorted({r["k"] for r in report["fixed"]}) == [1, 2, 3, 4, 16]
    best = max([*report["fixed"], report["plain"]], key=lambda r: r["tokens_per_s"])
    assert (report["oracle"]["drafter"], report["oracle"]["k"]) == (best["drafter"], best["k"])
    assert [(r["drafter"], r["k"]) for r in report["adaptive"]] == [
        (d, "adaptive") for d in ("auto", "lookup", "edit", "suffix", "chain")]
    # auto, the default, beside them: adaptive only (at a fixed K it is the chain), and
    # judged against the fixed (drafter, K) chosen without hindsight and the oracle.
    auto, cv = report["auto"], report["cross_validated"]
    assert auto["drafter"] == "auto" and auto["k"] == "adaptive" and auto["generated"] == 24
    assert sum(auto["drafted_by"].values()) == auto["steps"]
    fixed = {(r["drafter"], r["k"]) for r in report["fixed"]} | {("none", 0)}
    for half in ("picked_on_first_half", "picked_on_second_half"):
        assert (cv[half]["drafter"], cv[half]["k"]) in fixed
    assert cv["tokens_per_s"] > 0
    # Judged with each run's draft-model prompt feed counted (none here: copies only).
    assert auto["prompt_feed_ms"] == 0.0
    assert auto["vs_cross_validated"] == pytest.approx(auto["tokens_per_s_with_feed"] / cv["tokens_per_s"])
    assert auto["vs_oracle"] == pytest.approx(auto["tokens_per_s_with_feed"] / report["oracle"]["tokens_per_s"])
    assert "auto / best fixed (drafter, K) chosen without hindsight" in proc.stdout
    assert f"auto / oracle ({report['oracle']['drafter']} K={report['oracle']['k']}" in proc.stdout \
        or "auto / oracle (plain" in proc.stdout
    # The recorded run drafted with lookup at K=4: the simulation counts the same.
    steps = [ev for ev in map(json.loads, rec.read_text().splitlines()) if ev.get("event") == "step"]
    sim = next(r for r in report["fixed"] if r["drafter"] == "lookup" and r["k"] == 4)
    real = (sum(s["drafted"] for s in steps), sum(s["accepted"] for s in steps), len(steps))
    assert (sim["drafted"], sim["accepted"], sim["steps"]) == real

    hot = tmp_path / "hot.jsonl"
    made = specdash("run", *base, "--draft", "lookup", "--temp", "0.8", "--prompt", "Say hi.",
                    "--record", str(hot))
    assert made.returncode == 0, made.stderr
    assert_usage_error(specdash("whatif", "--recording", str(hot), "--profile", "epyc-32b"), "temperature 0.8",
                       str(hot))


def test_a_text_ending_on_eos_is_simulated_to_the_same_end(smol_path, small_draft, near_ties):
    """The run stops on an end-of-generation token inside a step: the simulation knows
    the token (the target's teacher-forced argmax after the text) and stops there too."""
    prompt = "Say hello in one short sentence."
    tr, (session, _) = from_prompt(settings(smol_path, str(small_draft)), prompt, str(small_draft), lambda s: None)
    session.close()
    assert tr.eos and tr.n_generated < TOKENS and len(tr.seq) == tr.n_generated + 1
    for spec in ("lookup", str(small_draft)):
        s = settings(smol_path, spec, 4)
        steps, summary = real_run(s, prompt)
        assert summary.stop_reason == "eos"
        sim = simulate(tr, make_drafter(spec, tr, FLAT, s), FLAT, s, name="model" if spec != "lookup" else spec, k=4)
        assert sim.generated == summary.n_generated or tr.near_ties()["target"]
        assert_same_steps(tr, sim, steps, near_ties, f"eos {spec[-12:]}")


def test_save_profile_writes_what_profile_reads(smol_path, small_draft, tmp_path):
    """`--profile here --save-profile F` measures this machine (batches to 33, the draft
    model's single, pair and batch decodes) and writes a profile `--profile F` reads back."""
    saved = tmp_path / "here.toml"
    base = ["whatif", "--prompt", "Count from 1 to 20.", "--target", str(smol_path),
            "--threads", "1", "--max-tokens", "12", "--ks", "1-2"]
    # The default draft source (auto) with --draft-model: whatif loads and simulates that
    # model, for itself and in auto and the chain, and measures its costs.
    proc = specdash(*base, "--draft-model", str(small_draft), "--save-profile", str(saved))
    assert_ok(proc)
    assert "profile here" in proc.stdout
    assert f"\n{small_draft}:" in proc.stdout and "\nauto (the default" in proc.stdout
    prof = load_profile(str(saved))
    assert prof.name == "here" and min(prof.verify) == 1 and max(prof.verify) == 33
    assert prof.draft_ms > 0 and prof.pair_ms and prof.batch_ms  # what a draft model's step is priced from
    again = specdash(*base, "--draft", str(small_draft), "--profile", str(saved))
    assert again.returncode == 0, again.stderr
    assert "profile here (measured by specdash whatif" in again.stdout


# --- the sweep, with predicted points beside the measured ones ------------------------------
def test_headless_sweep_with_whatif_predictions(smol_path, tmp_path):
    out = tmp_path / "sweep.json"
    proc = specdash("sweep", "--headless", "--target", str(smol_path), "--draft", "lookup", "--threads", "1",
                    "--ks", "0,4", "--rounds", "1", "--sweep-tokens", "16", "--json", str(out),
                    "--whatif", "epyc-32b", "--prompt", "Write the numbers from 1 to 60, separated by commas.")
    assert_ok(proc)
    data = json.loads(out.read_text())
    pred = {p["k"]: p for p in data["predicted"]["points"]}
    assert data["predicted"]["from"] == "whatif on profile epyc-32b" and set(pred) == {0, 4}
    assert pred[0]["tokens_per_s"] == pytest.approx(1000 / 346.0, rel=0.01)  # the profile's plain speed
    # acceptance is the simulation's, which is exact: the measured run at K=4 drafted the same
    k4 = next(p for p in data["points"] if p["k"] == 4)
    assert pred[4]["acceptance_rate"] == pytest.approx(k4["acceptance_rate"])
    assert "predicted" in proc.stdout.splitlines()[0] and "whatif on profile epyc-32b" in proc.stdout


def test_sweep_view_draws_predicted_points_before_any_run():
    from textual.app import App

    from specdash.tuning.sweep import Sweep
    from specdash.tui.screens.sweep import SweepScreen

    before = E.SettingsEvent(source="engine", target="t", drafter="lookup", draft="lookup", k=3)
    sweep = Sweep("p", before, ks=[0, 2, 4], rounds=1)
    sweep.predicted, sweep.predicted_from = {0: (10.0, None), 2: (14.0, 0.8), 4: (17.0, 0.7)}, "whatif on profile x"

    from specdash.tui.themes import load_themes

    class Host(App[None]):
        def on_mount(self) -> None:
            for theme in load_themes().values():
                self.register_theme(theme)
            self.theme = "specdash-dark"  # the charts' colour variables
            self.push_screen(SweepScreen(sweep))

    async def go() -> None:
        app = Host()
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, SweepScreen)
            head = str(screen.query_one("#sweep-head").render())
            assert "predicted (whatif on profile x)" in head
            from specdash.tui.widgets.plots import Plot
            key = screen.query_one("#sweep-tps", Plot)._key
            series = key[0]
            pts = [s for s in series if s.label == "predicted"]
            assert pts and pts[0].kind == "points" and pts[0].ys == (10.0, 14.0, 17.0)

    import asyncio
    asyncio.run(go())
