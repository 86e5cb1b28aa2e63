"""`--profile here`: this machine's costs, measured the way the engine calibrates
(engine.Engine._measure_costs: a junk batch of n tokens decoded after the prompt, then
rolled back), plus what the engine's verify_ms also contains (the argmax over the rows),
in alternating rounds with the median kept: the machine is shared."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from specdash.engine.llm import LLM
from specdash.engine.settings import EngineSettings
from specdash.costs.profile import Profile

# Every size to 33 would take ~600 tokens of batch work per round; these keep the steps
# of a CPU's curve (batch rounding at 8/16/32) and interpolate the rest.
SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 16, 17, 20, 24, 25, 28, 32, 33)


def verify_curve(target: LLM, tokens: Sequence[int], n_past: int, sizes: Sequence[int] = SIZES,
                 rounds: int = 2) -> dict[int, float]:
    """ms per target batch of n tokens at position n_past (the KV must hold n_past tokens)."""
    target.kv_truncate(n_past)
    sizes = [n for n in sizes if n <= target.n_batch and n_past + n < target.n_ctx]
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(rounds):
        for n in (sizes if r % 2 == 0 else list(reversed(sizes))):
            junk = (list(tokens) * n)[-n:]
            # One token is cheap and anchors the rest (measure_here scales to it): more samples.
            for _ in range(4 if n == 1 else 1):
                t = time.perf_counter()
                logits = target.decode(junk, n_past, logits="all")
                logits.argmax(axis=1)  # the engine's verify_ms includes it
                samples[n].append((time.perf_counter() - t) * 1e3)
                target.kv_truncate(n_past)
    return {n: statistics.median(v) for n, v in samples.items()}


def draft_costs(draft: LLM, tokens: Sequence[int], n_past: int, singles: int = 8,
                batch: int = 16) -> tuple[float, float, float]:
    """(ms of one single-token draft decode, ms per token of a `batch`-token catch-up,
    ms of a 2-token batch: the drafter's sync before each draft when the last one was
    accepted whole, timed as the drafter makes it, last logits only)."""
    draft.kv_truncate(n_past)
    single: list[float] = []
    toks = list(tokens)
    for i in range(singles):
        t = time.perf_counter()
        draft.decode([toks[-1 - i % len(toks)]], n_past + i, logits="last")
        single.append((time.perf_counter() - t) * 1e3)
    draft.kv_truncate(n_past)
    pairs: list[float] = []
    for i in range(singles):
        t = time.perf_counter()
        draft.decode(toks[-2:], n_past, logits="last")
        pairs.append((time.perf_counter() - t) * 1e3)
        draft.kv_truncate(n_past)
    junk = (toks * batch)[-batch:]
    t = time.perf_counter()
    draft.decode(junk, n_past, logits="last")
    per = (time.perf_counter() - t) * 1e3 / batch
    draft.kv_truncate(n_past)
    return statistics.median(single), per, statistics.median(pairs)


def head_costs(head: Any, target: LLM, prompt: Sequence[int], singles: int = 8) -> tuple[float, float]:
    """(ms of one MTP head decode, ms per committed token fed to it in a batch), timed as
    the drafter spends them (engine/drafters/mtp.py): the prompt's entries fed in one
    batch, then single head decodes from its last position."""
    inner = getattr(head, "inner", head)  # the session lends it (Borrowed)
    target.clear()
    inner.reset()
    target.prefill(list(prompt[:-1]))
    t = time.perf_counter()
    inner.chain(prompt, 1)  # feeds len(prompt) - 1 entries, then one decode
    first = (time.perf_counter() - t) * 1e3
    single: list[float] = []
    for _ in range(singles):
        t = time.perf_counter()
        inner.chain(prompt, 1)  # fed already: one decode
        single.append((time.perf_counter() - t) * 1e3)
    one = statistics.median(single)
    target.clear()
    inner.reset()
    return one, max(first - one, 0.0) / max(len(prompt) - 1, 1)


def measure_here(target: LLM, draft: LLM | None, prompt: Sequence[int], *, overhead_ms: float,
                 relative_cost: float | None, note: str = "", plain_step_ms: float | None = None,
                 head: Any = None) -> Profile:
    """`plain_step_ms`: the median target step of the plain run just made. The curve's
    shape comes from the calibration batches, its level from that median over every
    step of the run: a few calibration samples on a shared machine can land in another
    process's burst (2x off, seen here), a median over the whole run rarely does."""
    n_past = len(prompt) - 1
    target.clear()
    target.prefill(list(prompt[:-1]))  # measured where the engine calibrates: after the prompt
    curve = verify_curve(target, prompt, n_past)
    extra = {"calibrated_verify_1_ms": curve[1]}
    if plain_step_ms and curve.get(1):
        scale = plain_step_ms / curve[1]
        curve = {n: v * scale for n, v in curve.items()}
    target.clear()
    d_ms, b_ms, pair_ms = 0.0, None, None
    if draft is not None:
        draft.clear()
        draft.prefill(list(prompt[:-1]))
        d_ms, b_ms, pair_ms = draft_costs(draft, prompt, n_past)
        draft.clear()
    mtp_ms = mtp_batch = None
    if head is not None:  # the target's MTP head (`head`: the session's drafter)
        mtp_ms, mtp_batch = head_costs(head, target, prompt)
    return Profile(name="here", verify=curve, draft_ms=d_ms, batch_ms=b_ms, pair_ms=pair_ms,
                   relative_cost=relative_cost, overhead_ms=overhead_ms, note=note, source="here", extra=extra,
                   mtp_ms=mtp_ms, mtp_batch_ms=mtp_batch)


def measure_profile(settings: EngineSettings, prompt: str, say: Callable[[str], None] = lambda s: None,
                    progress: Callable[[str, float | None], None] | None = None, plain_tokens: int = 48) -> Profile:
    """`--profile here` with no text to simulate (a synthetic acceptance): the target, and
    the draft model (transcript.model_spec), loaded as for a run; a short plain greedy
    run on `prompt` gives the step level and overhead (as a what-if's plain run does);
    then measure_here."""
    from specdash.contract.events import StepEvent, Summary
    from specdash.sources.session import Session
    from specdash.tuning.whatif.transcript import model_spec, plain_stats, session_draft_model

    model = model_spec(settings)
    say(f"loading {settings.target}")
    session = Session(settings.replace(draft="none", k=0, adaptive=False), progress=progress)
    try:
        model, draft_llm, rel = session_draft_model(session, model, say)
        tokens = session.prompt_tokens(prompt)
        say(f"a plain greedy run of {plain_tokens} tokens for the step level, then target batches 1..33"
            + (" and draft tokens" if draft_llm is not None else ""))
        steps: list[StepEvent] = []
        summary: Summary | None = None
        for ev in session.engine.generate(tokens, plain_tokens):
            if isinstance(ev, StepEvent):
                steps.append(ev)
            elif isinstance(ev, Summary):
                summary = ev
        assert summary is not None
        plain = plain_stats(steps, summary)
        return measure_here(session.target, draft_llm, tokens, overhead_ms=plain["overhead_ms"], relative_cost=rel,
                            plain_step_ms=plain["verify_ms_median"],
                            note=f"measured by specdash whatif on this machine: {settings.target}"
                            + (f" + {model}" if model else ""))
    finally:
        session.close()
