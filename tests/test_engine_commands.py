"""Commands sent to a running engine, on a small real model (SmolLM2-135M)."""

from __future__ import annotations

import threading
import time

import pytest

from specdash.contract import events as C
from specdash.sources.session import Session
from specdash.engine.settings import EngineSettings
from specdash.contract.events import NoticeEvent, SettingsEvent, StepEvent, Summary

PROMPT = "List the first twenty prime numbers, one per line, with a short remark on each."
COPY_PROMPT = "Repeat this line four times: the cat sat on the mat, the cat sat on the mat."


@pytest.fixture(scope="module")
def session(smol_path):
    s = Session(EngineSettings(adaptive=False, target="smollm2-135m", draft="lookup", k=3, threads=1, ctx=1024))
    yield s
    s.close()


def collect(events, on_step=None):
    out = {"steps": [], "notices": [], "settings": [], "summary": None}
    for ev in events:
        if isinstance(ev, StepEvent):
            out["steps"].append(ev)
            if on_step:
                on_step(ev)
        elif isinstance(ev, NoticeEvent):
            out["notices"].append(ev)
        elif isinstance(ev, SettingsEvent):
            out["settings"].append(ev)
        elif isinstance(ev, Summary):
            out["summary"] = ev
    return out


def test_stop_queued_before_a_run_is_ignored(session):
    session.send(C.Stop())
    run = collect(session.run(PROMPT, max_tokens=12))
    assert run["summary"].stop_reason in ("max_tokens", "eos")
    assert run["summary"].n_generated > 1


def test_stop_mid_run_ends_it_with_the_text_so_far(session):
    def on_step(ev):
        if ev.step == 3:
            session.send(C.Stop())

    run = collect(session.run(PROMPT, max_tokens=60), on_step)
    assert run["summary"].stop_reason == "stopped"
    assert len(run["steps"]) == 3
    assert run["summary"].text == "".join(s.text for s in run["steps"])


def test_pause_blocks_between_steps_until_resumed_from_another_thread(session):
    resumed_at = {}

    def on_step(ev):
        if ev.step == 2:
            session.send(C.Pause())

            def resume():
                time.sleep(0.5)
                resumed_at["t"] = time.perf_counter()
                session.send(C.Resume())

            threading.Thread(target=resume).start()

    run = collect(session.run(PROMPT, max_tokens=10), on_step)
    step3 = run["steps"][2]
    assert step3.t > resumed_at["t"], "the engine stepped while paused"
    assert [s.paused for s in run["settings"][1:3]] == [True, False]


def test_invalid_k_is_refused_and_the_old_k_stays(session):
    session.send(C.SetK(3))

    def on_step(ev):
        if ev.step == 1:
            session.send(C.SetK(-2))
        if ev.step == 2:
            session.send(C.SetK(65))

    run = collect(session.run(PROMPT, max_tokens=12), on_step)
    warnings = [n.message for n in run["notices"] if n.level == "warning"]
    assert warnings == ["k=-2 refused: must be an integer 0..64; kept k=3",
                        "k=65 refused: must be an integer 0..64; kept k=3"]
    assert session.settings.k == 3 and all(ev.k <= 3 for ev in run["steps"])
    assert run["summary"].n_generated > 2


def test_incompatible_draft_swap_is_refused_and_generation_goes_on(smol_path, gemma_path):
    # translate=False: llama.cpp's strict rules (by default gemma3-270m drafts through translation).
    session = Session(EngineSettings(adaptive=False, target="smollm2-135m", draft="lookup", k=3, threads=1, ctx=1024, translate=False))

    def on_step(ev):
        if ev.step == 2:
            session.send(C.SetDrafter("gemma3-270m"))

    try:
        run = collect(session.run(PROMPT, max_tokens=16), on_step)
    finally:
        session.close()
    warning = next(n for n in run["notices"] if n.level == "warning")
    assert "incompatible" in warning.message and "gemma3-270m" in warning.message
    assert session.settings.draft == "lookup"
    assert {s.drafter for s in run["steps"]} <= {"lookup", "none"}
    assert run["summary"].n_generated >= 3


def test_a_cold_start_times_nothing_up_front_and_explores_each_size_once(smol_path, measured_costs):
    """No kept profile (issue 40): the first token does not wait for a timing pass. The
    first step is plain (it measures s(1)); a batch size beyond the measured ones is never
    taken on a guess but once, explored by a real verify that times it (a step that also
    keeps what it accepts); a new target forgets the curve."""
    s = Session(EngineSettings(target="smollm2-135m", draft="lookup", k=3, threads=1, ctx=1024, adaptive=True))
    costs = s.engine.controller.target_costs()
    explored: list[int] = []
    real_explore = costs.explore
    costs.explore = lambda n: (ok := real_explore(n), ok and explored.append(n))[0]  # type: ignore[method-assign]
    try:
        first = collect(s.run(COPY_PROMPT, max_tokens=48))
        said = [n.message for n in first["notices"]]
        assert any("timed by the first verify that needs it" in m for m in said), said
        assert not any("measured target batch costs" in m for m in said), said
        assert first["steps"][0].drafted == 0  # s(1) first: nothing is priced before it
        # The copies were considered: each size explored once, by a step that verified it.
        assert explored and len(explored) == len(set(explored)), explored
        verified = {st.drafted + 1 for st in first["steps"]}
        assert all(costs.measured(n) for n in verified)
        assert all(n in verified or costs.measured(n) or n > max(verified) for n in explored), (explored, verified)
        second = collect(s.run(COPY_PROMPT, max_tokens=8))
        assert not [n for n in second["notices"] if "kept cost profile" in n.message or "timed" in n.message]
        s.engine.controller.reset(target_changed=True)  # another expert count, another model
        assert s.engine.controller.needs_costs() and costs.step_cost(1) is None
    finally:
        s.close()


def test_draft_model_reports_catch_up_apart_from_drafting(smol_path):
    from specdash.engine.drafters.draft_model import DraftModelDrafter
    from specdash.engine.llm import LLM
    from specdash.engine.settings import SamplingParams

    import numpy as np

    llm = LLM(smol_path, n_ctx=512, n_threads=1)
    d = DraftModelDrafter(llm)
    rng = np.random.default_rng(0)
    try:
        toks = llm.tokenize("one two three four five six seven eight nine ten " * 10)  # 101 tokens
        d.prefill(toks[:20])
        step = d.propose(toks[:21], 2, SamplingParams(), rng)  # two new tokens: the normal rhythm
        assert step.prep_ms == 0.0 and len(step.tokens) == 2
        assert d.catch_up_ms(toks[:60]) == 0.0  # no catch-up measured yet: nothing to price by
        later = d.propose(toks[:60], 2, SamplingParams(), rng)  # sat out ~40 tokens
        assert later.prep_ms > 0.0 and later.cut(1).prep_ms == later.prep_ms
        # Now it knows what a catch-up token costs it, and how far behind it would be: in
        # step (the previous draft accepted) it owes nothing, having sat out it owes more.
        assert d.catch_up_ms([*toks[:60], 7]) == 0.0
        owed = d.catch_up_ms(toks[:80]), d.catch_up_ms(toks[:90])
        assert 0.0 < owed[0] < owed[1]
    finally:
        d.close()
