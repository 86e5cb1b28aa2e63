"""Several requests in one target batch (engine/batch), on SmolLM2-135M, really decoded.

Every request's greedy output is its own plain decoding, token for token or differing
first at a near-tie of the target's top-two logits (tests/test_engine_exact.py's TIE_GAP
rule: a batch of several sequences rounds differently from a batch of one): under each
copy drafter and auto, with requests joining and leaving mid-batch, one cancelled, and the
drafter and K swapped while the batch runs. Sampled output keeps the target's distribution
with two sequences (the fuzz harness's PIT test).
"""

from __future__ import annotations

import numpy as np
import pytest

from specdash.contract import events as E
from specdash.engine.engine import RunOptions
from specdash.engine.settings import EngineSettings
from specdash.engine.verify import process_logits
from specdash.contract.errors import SpecdashError
from specdash.contract.events import PrefillEvent, StepEvent, Summary

pytestmark = pytest.mark.slow

TIE_GAP = 0.5  # logits; tests/test_engine_exact.py's
N = 40
CTX = 2048
# Texts with something to copy (the copy drafters must draft), and one without.
TEXTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n" * 2 + "def mul(a, b):\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Rows: alpha=1, beta=2, gamma=3, delta=4. Again: alpha=1, beta=2,",
    "Once upon a time, in a small village by the sea,",
]


@pytest.fixture(scope="module")
def session(smol_path):
    from specdash.sources.session import Session

    s = Session(EngineSettings(target=str(smol_path), draft="lookup", adaptive=False, k=4, threads=2, ctx=CTX),
                n_seq=4)
    yield s
    s.close()


@pytest.fixture(scope="module")
def reference(greedy_reference, smol_path):
    return greedy_reference(smol_path, ctx=CTX)


def apply(session, *cmds):
    for cmd in cmds:
        session.send(cmd)
    notices = [ev for ev in session.engine.apply_pending() if isinstance(ev, E.NoticeEvent)]
    assert not [n for n in notices if "refused" in n.message], notices


def run_batch(runner, requests, on_step=None):
    """Admit (tag, tokens, max_tokens, options) as slots free up; run to the end. Tokens
    and summary by tag, and the steps."""
    pending = list(requests)
    tokens: dict[str, list[int]] = {tag: [] for tag, *_ in requests}
    summaries: dict[str, Summary] = {}
    steps: list[StepEvent] = []
    while pending or runner.slots:
        while pending and runner.free:
            tag, prompt, max_tokens, options = pending.pop(0)
            events = list(runner.admit(prompt, max_tokens, options, tag))
            assert isinstance(events[-1], PrefillEvent) and events[-1].request == tag
        for ev in runner.step():
            if isinstance(ev, StepEvent):
                tokens[ev.request].extend(ev.tokens)
                steps.append(ev)
                if on_step is not None:
                    on_step(ev)
            elif isinstance(ev, Summary):
                summaries[ev.request] = ev
    return tokens, summaries, steps


def assert_plain(reference, prompt, got, what, near_ties):
    want = reference.plain(prompt, len(got), None)
    if got == want[: len(got)]:
        return
    i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    pos = len(prompt) + i
    top, gap = reference.teacher_force(prompt + got, len(prompt), [pos], None)[pos]
    assert top == got[i] or gap < TIE_GAP, f"{what}: token {i} is {got[i]}, plain decoding's {want[i]} (gap {gap:.3f})"
    near_ties.append(f"batch {what}: token {i} (gap {gap:.3f})")


@pytest.mark.parametrize("drafter", ["lookup", "suffix", "auto"])
def test_four_requests_in_one_batch_each_get_their_plain_decoding(session, reference, near_ties, drafter):
    apply(session, E.SetDrafter(drafter), E.SetK(4))
    prompts = [session.target.tokenize(t) for t in TEXTS]
    runner = session.batch(4)
    tokens, summaries, steps = run_batch(runner, [(str(i), p, N, RunOptions()) for i, p in enumerate(prompts)])
    assert max(ev.batch for ev in steps) == 4  # all four shared a batch
    assert sum(ev.drafted for ev in steps) > 0, f"{drafter} never drafted"
    for i, prompt in enumerate(prompts):
        assert summaries[str(i)].n_generated == len(tokens[str(i)]) > 0
        assert_plain(reference, prompt, tokens[str(i)], f"{drafter} request {i}", near_ties)
    assert not runner.slots and runner.free == 4


def test_requests_join_and_leave_mid_batch_and_a_cancelled_one_ends_alone(session, reference, near_ties):
    apply(session, E.SetDrafter("lookup"), E.SetK(4))
    prompts = [session.target.tokenize(t) for t in TEXTS]
    cancelled = {"flag": False}
    requests = [
        ("short", prompts[0], 6, RunOptions()),  # ends on its budget after a few steps
        ("long", prompts[1], N, RunOptions()),
        ("leaves", prompts[2], N, RunOptions(stop_when=lambda: "cancelled" if cancelled["flag"] else "")),
        ("late", prompts[3], N, RunOptions()),  # waits for a free slot: joins a running batch
    ]
    seen: list[tuple[str, int]] = []

    def on_step(ev: StepEvent) -> None:
        seen.append((ev.request, ev.batch))
        if ev.request == "leaves" and ev.n_generated >= 10:
            cancelled["flag"] = True

    runner = session.batch(3)
    tokens, summaries, steps = run_batch(runner, requests, on_step)
    assert summaries["short"].stop_reason == "max_tokens" and summaries["short"].n_generated == 6
    assert summaries["leaves"].stop_reason == "cancelled" and 10 <= summaries["leaves"].n_generated < N
    assert summaries["long"].stop_reason in ("eos", "max_tokens")
    assert summaries["late"].stop_reason in ("eos", "max_tokens")
    assert any(tag == "late" and batch >= 2 for tag, batch in seen), "the late request joined a running batch"
    assert max(b for _, b in seen) == 3
    for tag, prompt in zip(("short", "long", "leaves", "late"), prompts):
        assert_plain(reference, prompt, tokens[tag], f"join/leave {tag}", near_ties)


def test_hot_swaps_reach_every_request_mid_batch_and_output_stays_plain(session, reference, near_ties):
    apply(session, E.SetDrafter("lookup"), E.SetK(2))
    prompts = [session.target.tokenize(t) for t in TEXTS[:3]]
    swapped: list[int] = []

    def on_step(ev: StepEvent) -> None:
        if ev.request == "0" and ev.n_generated >= 12 and not swapped:
            session.send(E.SetDrafter("suffix"))  # applied between steps, as the dashboard's
            session.send(E.SetK(6))
            swapped.append(ev.step)

    runner = session.batch(3)
    tokens, _, steps = run_batch(runner, [(str(i), p, N, RunOptions()) for i, p in enumerate(prompts)], on_step)
    assert swapped
    after = [ev for ev in steps if ev.request == "0" and ev.step > swapped[0] + 1]
    # K=6 for all (a request alone near its budget asks only for what it can keep).
    assert after and all(ev.k == 6 or ev.n_generated + 7 > N for ev in after), [(ev.k, ev.batch) for ev in after]
    assert all(ev.drafter in ("suffix", "none") for ev in steps if ev.step > swapped[0] + 1)
    assert all(slot.spec == "suffix" for slot in runner.slots.values())
    for i, prompt in enumerate(prompts):
        assert_plain(reference, prompt, tokens[str(i)], f"swap request {i}", near_ties)


def test_an_answer_given_in_a_batch_is_copied_by_the_next_request_alone(session, reference, near_ties):
    """Every sequence's suffix drafter shares the session's memory of earlier answers: an
    answer given in a batch is there for the next request, run alone on the engine's own
    suffix drafter. Measured against the same request after a Forget."""
    story, other = (session.target.tokenize(t) for t in (TEXTS[3], TEXTS[0]))
    runner = session.batch(4)

    def alone() -> tuple[list[int], int]:
        tokens, _, steps = run_batch(runner, [("again", story, N, RunOptions())])
        assert all(ev.batch == 1 for ev in steps)
        return tokens["again"], sum(ev.accepted for ev in steps)

    apply(session, E.Forget(), E.SetDrafter("suffix"), E.SetK(8))
    cold, cold_copied = alone()
    apply(session, E.Forget())
    # "other" runs longer: "story" is answered in the batch from its first step to its last.
    first, _, steps = run_batch(runner, [("story", story, N, RunOptions()), ("other", other, N + 16, RunOptions())])
    assert {ev.batch for ev in steps if ev.request == "story"} == {2}
    assert len(runner.memory.corpora) == 2  # each answer of the batch, once
    warm, warm_copied = alone()
    assert len(runner.memory.corpora) == 3  # alone: the engine's drafter remembers it, not also its slot
    for what, got in (("cold", cold), ("in the batch", first["story"]), ("after the batch", warm)):
        assert_plain(reference, story, got, f"a story {what}", near_ties)
    # Copied as far as the two answers agree: a batch of two may round a near-tie the other
    # way on another CPU (assert_plain's rule), and a copy holds only up to there.
    agree = next((i for i, (a, b) in enumerate(zip(warm, first["story"])) if a != b), min(len(warm), len(first["story"])))
    assert warm_copied >= cold_copied + agree // 2, (cold_copied, warm_copied, agree)

    # Alone from its first step, then joined: remembered once (by the engine's drafter,
    # which followed it from its prompt), not also by its slot.
    before = len(runner.memory.corpora)
    list(runner.admit(story, N, RunOptions(), "first"))
    widths = [ev.batch for _ in range(3) for ev in runner.step() if isinstance(ev, StepEvent)]
    list(runner.admit(other, N, RunOptions(), "joins"))
    while runner.slots:
        widths += [ev.batch for ev in runner.step() if isinstance(ev, StepEvent)]
    assert widths[:3] == [1, 1, 1] and 2 in widths
    assert len(runner.memory.corpora) == before + 2


def test_adaptive_batch_choices_are_shown_per_request(session):
    """Under adaptive K, each step's decision names the batch and why this request's K."""
    apply(session, E.SetDrafter("auto"), E.SetAdaptive(True))
    try:
        list(session.warm_up("Write a Python function that returns the sum of a list of numbers."))
        prompts = [session.target.tokenize(t) for t in TEXTS[:2]]
        runner = session.batch(2)
        _, summaries, steps = run_batch(runner, [(str(i), p, 24, RunOptions()) for i, p in enumerate(prompts)])
        assert len(summaries) == 2
        assert all(ev.adaptive for ev in steps)
        two = [ev for ev in steps if ev.batch == 2]
        assert two and all(ev.decision.startswith("batch of 2:") for ev in two), two[:3]
    finally:
        apply(session, E.SetAdaptive(False), E.SetDrafter("lookup"))


def test_a_full_batch_and_a_bad_prompt_are_refused_and_the_batch_goes_on(session):
    runner = session.batch(1)
    list(runner.admit(session.target.tokenize(TEXTS[0]), 4, RunOptions(), "a"))
    with pytest.raises(SpecdashError, match="full"):
        list(runner.admit(session.target.tokenize(TEXTS[1]), 4, RunOptions(), "b"))
    with pytest.raises(SpecdashError, match="holds 4"):
        session.batch(5)
    while runner.slots:
        list(runner.step())
    with pytest.raises(SpecdashError, match="context holds"):
        list(runner.admit(list(range(5, 5 + CTX)), 4, RunOptions(), "c"))


def test_sampled_output_keeps_the_target_distribution_with_two_sequences(session):
    """Every token committed at temperature 1 (both sequences, drafts and not): its
    randomized PIT value under the verify row's distribution is uniform (the fuzz harness's
    test, its DKW bound at one in a million)."""
    from conftest import fuzz_harness

    F = fuzz_harness()
    apply(session, E.SetDrafter("lookup"), E.SetK(4), E.SetSampling(temperature=1.0))
    target = session.engine.target
    real, real_one = target.decode_seqs, target.decode
    batches: list[tuple[np.ndarray, list[int]]] = []

    def decode_seqs(parts):
        out = real(parts)
        batches.append((np.array(out, copy=True), [len(tokens) for _, tokens, _ in parts]))
        return out

    def decode(tokens, start_pos, logits="all", seq=0):  # a request left alone: the engine's own step
        out = real_one(tokens, start_pos, logits, seq)
        if logits == "all":
            batches.append((np.array(out, copy=True), [len(tokens)]))
        return out

    target.decode_seqs = decode_seqs  # type: ignore[method-assign]
    target.decode = decode  # type: ignore[method-assign]
    values: list[float] = []
    rng = np.random.default_rng(7)
    params = session.settings.sampling
    assert params.temperature == 1.0
    try:
        for seed in range(3):
            runner = session.batch(2)
            prompts = [session.target.tokenize(t) for t in TEXTS[seed % 2 * 2: seed % 2 * 2 + 2]]
            for i, p in enumerate(prompts):
                list(runner.admit(p, 120, RunOptions(seed=100 * seed + i), str(i)))
            while runner.slots:
                batches.clear()
                events = [ev for ev in runner.step() if isinstance(ev, StepEvent)]
                if not events:
                    continue
                logits, sizes = batches[-1]
                row = 0
                for ev, n in zip(events, sizes):  # the step events come in the batch's order
                    probs = process_logits(logits[row:row + len(ev.tokens)], params)
                    values += [F.pit(probs[j], tok, rng.random()) for j, tok in enumerate(ev.tokens)]
                    row += n
    finally:
        del target.decode_seqs, target.decode
        apply(session, E.SetSampling(temperature=0.0))
    d, bound = F.uniformity(values)
    assert len(values) > 400
    assert d < bound, f"PIT values are not uniform: KS distance {d:.3f} > {bound:.3f} over {len(values)}"


def test_a_new_request_on_sequence_0_leaves_the_other_sequences_rows_alone(session, reference, near_ties):
    """Sequence 0 freed and taken by a prompt sharing nothing with its rows: only its own
    rows go (a whole-memory clear would wipe the request still running beside it)."""
    apply(session, E.SetDrafter("lookup"), E.SetK(4))
    first, beside = session.target.tokenize(TEXTS[0]), session.target.tokenize(TEXTS[1])
    fresh = session.target.tokenize("Zebras cross the road at noon, every day,", add_special=False)
    assert fresh[0] != first[0]
    runner = session.batch(2)
    tokens = {"first": [], "beside": [], "fresh": []}
    list(runner.admit(first, 3, RunOptions(), "first"))  # on sequence 0 (the batch was empty)
    list(runner.admit(beside, N, RunOptions(), "beside"))
    admitted = False
    while runner.slots:
        for ev in runner.step():
            if isinstance(ev, StepEvent):
                tokens[ev.request].extend(ev.tokens)
        if not admitted and 0 not in runner.slots:
            list(runner.admit(fresh, 12, RunOptions(), "fresh"))
            assert runner.slots[0].tag == "fresh"
            admitted = True
    assert admitted and len(tokens["beside"]) > 12
    assert_plain(reference, beside, tokens["beside"], "beside a new sequence 0", near_ties)
    assert_plain(reference, fresh, tokens["fresh"], "the new sequence 0", near_ties)


@pytest.mark.parametrize("arch", ["lfm2", "mamba2"])
def test_a_recurrent_target_batches_its_requests_without_speculation(request, arch, near_ties):
    """Hybrid (lfm2) and recurrent (mamba2) targets: a state per sequence, and a batch of
    them decodes plain (their rollback follows one sequence); each request its plain decoding."""
    from specdash.engine.llm import LLM
    from specdash.sources.session import Session
    from test_engine_exact import plain_greedy, teacher_forced_gaps

    path = request.getfixturevalue(f"{arch}_path")
    s = Session(EngineSettings(target=str(path), draft="lookup", adaptive=False, k=4, threads=1, ctx=512, raw=True,
                               lookup_min_ngram=1), n_seq=2)
    ref = LLM(path, n_ctx=512, n_threads=1)
    try:
        assert s.engine.target.strategy.kind != "kv"
        assert s.batch_widths("The quick brown fox") == {}  # auto: one at a time here
        prompts = [s.prompt_tokens("The quick brown fox jumps over the lazy dog. Once upon a time"),
                   s.prompt_tokens("A B C D A B C D A B C")]
        runner = s.batch(2)
        tokens, _, steps = run_batch(runner, [(str(i), p, 24, RunOptions()) for i, p in enumerate(prompts)])
        assert max(ev.batch for ev in steps) == 2
        assert all(ev.drafted == 0 for ev in steps)
        assert all("plain decoding" in ev.decision for ev in steps if ev.batch == 2)
        for i, prompt in enumerate(prompts):
            got, want = tokens[str(i)], plain_greedy(ref, prompt, len(tokens[str(i)]))
            if got == want:
                continue
            j = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
            top, gap = teacher_forced_gaps(ref, prompt, got)[j]
            assert top == got[j] or gap < TIE_GAP, f"{arch} request {i}: token {j} (gap {gap:.3f})"
            near_ties.append(f"batch {arch} request {i}: token {j} (gap {gap:.3f})")
    finally:
        s.close()
        ref.close()
