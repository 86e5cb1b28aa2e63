"""Drafts with another vocabulary (engine/drafters/translated.py).

The boundary cases run on vocab-only loads (no weights): the draft model is a scripted
stand-in whose KV is simulated, so every decode and cut-back is checked. Greedy
exactness runs the real engine on the three real pairs of issue 20 and compares with plain
decoding of the target alone (near-ties reported with their logit gap, as in
test_fuzz_exact). The hot-swap fuzz and the sampled KS test with a translated draft are in
test_fuzz_exact.py (test_fuzz_translated_pair, test_sampled_translated_draft).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from specdash.contract import events as E
from specdash.engine.drafters.translated import (
    SOURCE, TranslatedDrafter, Vocabulary, complete_utf8, open_ended,
)
from specdash.engine.llm import LLM
from specdash.engine.settings import EngineSettings, SamplingParams
from specdash.contract.errors import SpecdashError
from specdash.models.resolve import resolve_model

_spec = importlib.util.spec_from_file_location(
    "fuzz_exact", Path(__file__).resolve().parent.parent / "benchmarks" / "fuzz_exact.py")
assert _spec is not None and _spec.loader is not None
F = sys.modules.get("fuzz_exact") or importlib.util.module_from_spec(_spec)
if "fuzz_exact" not in sys.modules:
    sys.modules["fuzz_exact"] = F
    _spec.loader.exec_module(F)

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def vocabs():
    out = {name: LLM(resolve_model(name), vocab_only=True)
           for name in ("qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m")}
    yield out
    for llm in out.values():
        llm.close()


class ScriptedDraft:
    """A draft model without weights: a vocab-only LLM whose decode returns logits that
    pick the next scripted token, and whose KV is a list checked on every call."""

    def __init__(self, name: str, script: list[int] | None = None):
        self.vocab_llm = LLM(resolve_model(name), vocab_only=True)
        self.script = script or []
        self.kv: list[int] = []
        self.decoded = 0

    def install(self) -> LLM:
        llm = self.vocab_llm
        llm.n_ctx, llm.n_batch = 4096, 512  # type: ignore[attr-defined]
        llm.decode = self.decode  # type: ignore[method-assign,assignment]
        llm.kv_truncate = self.kv_truncate  # type: ignore[method-assign]
        llm.clear = self.kv.clear  # type: ignore[method-assign]
        return llm

    def decode(self, tokens, start_pos, logits="all", seq=0):
        assert start_pos == len(self.kv), f"decode at {start_pos} with {len(self.kv)} tokens in the KV"
        self.kv.extend(tokens)
        self.decoded += len(tokens)
        if logits is None:
            return None
        row = np.zeros((1, self.vocab_llm.n_vocab), dtype=np.float32)
        # The scripted token after the drafted ones (the KV past the committed text).
        row[0, self.next_token()] = 10.0
        return row

    def next_token(self) -> int:
        return self.script.pop(0) if self.script else 0

    def kv_truncate(self, n):
        assert 0 <= n <= len(self.kv)
        del self.kv[n:]


def drafter_for(target: LLM, draft_name: str, script: list[int] | None = None):
    fake = ScriptedDraft(draft_name, script)
    return TranslatedDrafter(fake.install(), target), fake


def spelled(v: LLM, tokens) -> bytes:
    return Vocabulary(v).text(tokens)


# --- pure helpers ---------------------------------------------------------------------------


def test_complete_utf8_cuts_before_an_unfinished_character():
    text = "aé日😀".encode()
    assert complete_utf8(text) == len(text)
    for cut in range(1, 4):  # 😀 is 4 bytes: any proper prefix of it is cut off
        assert complete_utf8(text[: len(text) - cut]) == len(text) - 4
    assert complete_utf8("日".encode()[:2]) == 0
    assert complete_utf8(b"") == 0


def test_open_ended():
    assert open_ended(b" wor") and open_ended(b" ") and open_ended("é".encode())
    assert not open_ended(b"):") and not open_ended(b".")


# --- draft -> target --------------------------------------------------------------------------


def test_space_markers_meet_as_bytes(vocabs):
    """Gemma (SentencePiece, '▁') drafts for Qwen (byte-level BPE, 'Ġ'): the same text
    comes out as Qwen's own tokens."""
    gemma, qwen = vocabs["gemma3-270m"], vocabs["qwen2.5-coder-0.5b"]
    g = gemma.tokenize(" hello world, again", add_special=False)
    assert any("▁".encode() in (ll_text(gemma, t) or b"") for t in g)  # the raw texts carry '▁'
    d, _ = drafter_for(qwen, "gemma3-270m")
    d._mirror(qwen.tokenize("Say:", add_special=False))
    out = d._to_target(spelled(gemma, g), cut_by_budget=False)
    assert out == qwen.tokenize(" hello world, again", add_special=False)
    assert any(ll_text(qwen, t).startswith("Ġ".encode()) for t in out)


def ll_text(llm: LLM, token: int) -> bytes:
    import llama_cpp as ll

    return ll.llama_vocab_get_text(llm.vocab, token) or b""


def test_a_word_split_across_the_window_edge(vocabs):
    """The committed target text ends mid-word ("hello_wor"); the draft's text finishes
    it. The proposal starts exactly after the committed tokens (which stay as they are)
    and spells the draft's text."""
    qwen = vocabs["qwen2.5-coder-0.5b"]
    committed = qwen.tokenize("def hello_wor", add_special=False)
    d, _ = drafter_for(qwen, "smollm2-135m")
    d._mirror(committed)
    out = d._to_target(b"ld(x):\n", cut_by_budget=False)
    assert out and spelled(qwen, out) == b"ld(x):\n"
    assert d._t == committed  # committed ids are never re-encoded


def test_a_multibyte_character_split_across_tokens(vocabs):
    """SmolLM2's BPE splits 日 (3 bytes) across two tokens. With the target's committed
    text ending inside the character, the proposal completes it; a draft text ending
    inside a character is cut before it."""
    smol = vocabs["smollm2-135m"]
    toks = smol.tokenize("x 日本", add_special=False)
    pieces = [spelled(smol, [t]) for t in toks]
    split = next(i for i, p in enumerate(pieces) if p and complete_utf8(b"".join(pieces[: i + 1])) < len(b"".join(pieces[: i + 1])))
    committed = toks[: split + 1]  # ends inside 日
    text = b"".join(pieces[: split + 1])
    assert complete_utf8(text) < len(text)
    d, _ = drafter_for(smol, "qwen2.5-coder-0.5b")
    d._mirror(committed)
    rest = "x 日本".encode()[len(text):] + "語".encode()[:2]  # ends inside 語
    out = d._to_target(rest, cut_by_budget=False)
    got = (text + spelled(smol, out)).decode("utf-8")  # whole characters only
    # The proposal completes 日; 語 is cut, and 本 before it may go too (a cut text's last
    # token is dropped: the target may merge it with what follows).
    assert out and got.startswith("x 日") and "x 日本".startswith(got)


def test_a_draft_ending_mid_word_drops_the_unfinished_word(vocabs):
    qwen = vocabs["qwen2.5-coder-0.5b"]
    d, _ = drafter_for(qwen, "gemma3-270m")
    d._mirror(qwen.tokenize("The", add_special=False))
    cut = d._to_target(b" quick brown fo", cut_by_budget=True)
    assert spelled(qwen, cut) == b" quick brown"
    whole = d._to_target(b" quick brown fo", cut_by_budget=False)  # the draft ended there itself
    assert spelled(qwen, whole) == b" quick brown fo"
    punct = d._to_target(b" quick brown fox.", cut_by_budget=True)  # ends on punctuation: kept
    assert spelled(qwen, punct) == b" quick brown fox."


def test_special_text_never_becomes_a_target_special(vocabs):
    qwen = vocabs["qwen2.5-coder-0.5b"]
    d, _ = drafter_for(qwen, "smollm2-135m")
    d._mirror(qwen.tokenize("Hi", add_special=False))
    out = d._to_target(b" there<|im_end|>\n", cut_by_budget=False)
    assert spelled(qwen, out) == b" there<|im_end|>\n"
    assert not any(d.target.is_special(t) for t in out)
    assert 151645 not in out  # Qwen's <|im_end|>


# --- the whole drafter on a scripted draft model ------------------------------------------------


def test_an_end_token_in_the_draft_ends_the_proposal(vocabs):
    """The draft says " hello world", then its end token, then more: the proposal is the
    target's tokens for " hello world" (whole: the draft ended there) and nothing after."""
    qwen, gemma = vocabs["qwen2.5-coder-0.5b"], vocabs["gemma3-270m"]
    script = gemma.tokenize(" hello world", add_special=False) + [gemma.eos] + \
        gemma.tokenize(" junk", add_special=False)
    d, fake = drafter_for(qwen, "gemma3-270m")
    prompt = qwen.tokenize("Say it:", add_special=False)
    d.prefill(prompt)
    fake.script = list(script)
    draft = d.propose(prompt, 8, GREEDY, None)
    assert draft.source == SOURCE and draft.probs is None
    assert draft.tokens == qwen.tokenize(" hello world", add_special=False)
    assert draft.translate_ms > 0


def test_the_draft_kv_follows_the_committed_text(vocabs):
    """Steps with drafts accepted, partly rejected and replaced by other text: the
    simulated KV always holds exactly the drafter's tokens, they spell the committed text
    (plus what was drafted after it), the draft's BOS stays first, and a rejection cuts
    the KV back only from the first changed token."""
    qwen, gemma = vocabs["qwen2.5-coder-0.5b"], vocabs["gemma3-270m"]
    d, fake = drafter_for(qwen, "gemma3-270m")
    committed = qwen.tokenize("<|im_start|>user\nCount: one, two", add_special=False, parse_special=True)
    d.prefill(committed)
    assert fake.kv == d._d and fake.kv[0] == gemma.bos
    prefilled = fake.decoded
    for words, accept in ((" three, four, five", 3), (" six, seven", 1), (" nine, ten", 0), (", eleven", 2)):
        fake.script = gemma.tokenize(words, add_special=False)
        before = fake.decoded
        draft = d.propose(committed, 4, GREEDY, None)
        assert draft.tokens, words
        assert fake.kv == d._d
        assert d.target.text(draft.tokens) == words.encode()[: len(d.target.text(draft.tokens))]
        # The target commits `accept` draft tokens and one of its own ("!" = a rejection).
        committed = committed + draft.tokens[:accept] + qwen.tokenize("!", add_special=False)
        assert fake.decoded - before <= 4 + 2 + 4  # drafted + window re-decode, not the history
    d.propose(committed, 1, GREEDY, None)
    assert fake.kv == d._d and fake.kv[0] == gemma.bos
    assert d.draft.text(d._d[1:]).startswith(d.target.text(committed))
    assert prefilled > 0
    # Sat out steps (a chain drafting from lookup: k=0), then asked again: it catches up.
    longer = committed + qwen.tokenize(" twelve, thirteen, fourteen, fifteen", add_special=False)
    for n in range(len(committed), len(longer)):
        assert d.propose(longer[:n], 0, GREEDY, None).tokens == []
    d.propose(longer, 2, GREEDY, None)
    assert fake.kv == d._d and d.draft.text(d._d[1:]).startswith(d.target.text(longer))
    # A stale drafter swapped back in after other text (committed tokens changed early on):
    # its mirror and its KV are cut back to what still holds, not rebuilt from scratch.
    other = committed[:5] + qwen.tokenize(" something else entirely", add_special=False)
    before = fake.decoded
    d.propose(other, 2, GREEDY, None)
    assert fake.kv == d._d and d.draft.text(d._d[1:]).startswith(d.target.text(other))
    assert fake.decoded - before < len(d._d)


# --- the real pairs: greedy output is plain decoding's ---------------------------------------------

# (name, text, chat template?) Code, prose, non-ASCII, leading whitespace, specials.
PROMPTS = [
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
    ("prose", "The history of the printing press begins", False),
    ("non-ascii", "Café, naïve, 日本語のテキスト, and emoji 😀🎉: translate 'good morning' into French, "
                  "Japanese and Chinese.", True),
    ("leading-space", "\n\n    for i in range(10):\n        ", False),
    ("chat", "Write a Python function that checks whether a string is a palindrome.", True),
]
# Qwen targets are the 0.5B (the 1.5B's vocabulary, about 3x faster): translation is a
# property of the two vocabularies, not of the target's size.
PAIRS = [
    ("qwen2.5-coder-0.5b", "smollm2-135m", 32),
    ("qwen2.5-coder-0.5b", "gemma3-270m", 32),
    ("smollm2-135m", "qwen2.5-coder-0.5b", 48),
]


@pytest.fixture(scope="module")
def pair_runs(greedy_reference):
    """One session per pair, shared by the prompts; the plain reference is the run's
    shared one for the target (conftest's greedy_reference)."""
    made: dict[tuple[str, str], tuple] = {}

    def get(target: str, draft: str):
        if (target, draft) not in made:
            from specdash.sources.session import Session

            s = Session(EngineSettings(adaptive=False, target=target, draft=draft, k=4, threads=2, ctx=1024, raw=True))
            made[(target, draft)] = (s, greedy_reference(resolve_model(target), ctx=1024))
        return made[(target, draft)]

    yield get
    for s, _ in made.values():
        s.close()


ACCEPTED: dict[str, int] = {}


@pytest.mark.parametrize("target,draft,n", PAIRS, ids=[f"{t}+{d}" for t, d, _ in PAIRS])
@pytest.mark.parametrize("name,text,chat", PROMPTS, ids=[p[0] for p in PROMPTS])
def test_greedy_output_is_plain_decoding(pair_runs, near_ties, target, draft, n, name, text, chat):
    session, reference = pair_runs(target, draft)
    assert isinstance(session.engine.drafter.inner, TranslatedDrafter)  # type: ignore[attr-defined]
    tgt = session.engine.target
    prompt = tgt.tokenize(tgt.chat_prompt(text) if chat else text)
    events = list(session.engine.generate(prompt, n))
    steps = [ev for ev in events if isinstance(ev, E.StepEvent)]
    got = [t for ev in steps for t in ev.tokens]
    assert {ev.drafter for ev in steps} <= {SOURCE, "none"}
    ACCEPTED[f"{target}+{draft}"] = ACCEPTED.get(f"{target}+{draft}", 0) + sum(ev.accepted for ev in steps)
    check_plain(reference, tgt, prompt, got, n, f"{name} on {target}+{draft}", near_ties,
                f"translated {target}+{draft} {name}")


def check_plain(reference, tgt, prompt, got, n, what, near_ties, label) -> None:
    """`got` is plain decoding's, or off its path only at near-ties (each token the
    target's argmax given the ones before it, or within F.TIE_GAP of it)."""
    plain = reference.plain(prompt, n, None)
    if got == plain[: len(got)] and (len(got) == n or tgt.is_eog(plain[len(got)])):
        return
    # Off plain decoding's path: each token must be the target's argmax given the ones before.
    full = list(prompt) + got
    positions = list(range(len(prompt), len(full)))
    verdicts = reference.teacher_force(full + [-1], len(prompt), positions, None)
    ties = []
    for pos in positions:
        want, gap = verdicts[pos]
        if full[pos] != want:
            assert gap < F.TIE_GAP, (f"{what}: token {pos - len(prompt)} is {full[pos]}, "
                                     f"the target's argmax is {want} (top-two gap {gap:.3f})")
            ties.append(gap)
    near_ties.append(f"{label}: {len(ties)} near-tie mismatches (gaps {', '.join(f'{g:.3f}' for g in ties)})")


def test_greedy_output_under_auto_with_a_translated_model_is_plain_decoding(pair_runs, near_ties):
    """auto (the default) with a translated draft model beside the copies, adaptive K:
    greedy output is still plain decoding's, whichever source drafts each step."""
    session, reference = pair_runs("qwen2.5-coder-0.5b", "gemma3-270m")
    engine, tgt = session.engine, session.engine.target
    for cmd in (E.SetDrafter("auto"), E.SetAdaptive(True)):
        engine.send(cmd)
    list(engine.apply_pending())
    sources: set[str] = set()
    try:
        assert engine.drafter.name == "auto" and any(  # type: ignore[attr-defined]
            isinstance(getattr(p, "inner", p), TranslatedDrafter) for p in engine.drafter.parts())
        for name, text, chat in (PROMPTS[1], PROMPTS[4]):
            prompt = tgt.tokenize(tgt.chat_prompt(text) if chat else text)
            steps = [ev for ev in engine.generate(prompt, 32) if isinstance(ev, E.StepEvent)]
            sources |= {ev.drafter for ev in steps if ev.drafted}
            check_plain(reference, tgt, prompt, [t for ev in steps for t in ev.tokens], 32,
                        f"auto {name} on qwen2.5-coder-0.5b+gemma3-270m", near_ties,
                        f"auto (translated gemma3-270m) {name}")
    finally:
        for cmd in (E.SetAdaptive(False), E.SetDrafter("gemma3-270m")):
            engine.send(cmd)
        list(engine.apply_pending())
    assert sources, "auto never drafted: the check above had nothing to check"


def test_translated_drafts_were_accepted():
    """Runs after the exactness tests: every pair had drafts accepted (not a no-op)."""
    if len(ACCEPTED) < len(PAIRS):
        pytest.skip("the greedy pair tests did not all run")
    assert all(v > 0 for v in ACCEPTED.values()), ACCEPTED


def test_the_exactness_check_has_teeth(pair_runs, monkeypatch):
    """A translation that proposes one target token too many and an engine that keeps it
    would break the output: the comparison with plain decoding catches it."""
    import specdash.engine.engine as engine_module
    from specdash.engine.verify import verify_greedy

    def keep_one_rejected(argmax, draft):
        n, nxt = verify_greedy(argmax, draft)
        return (n, nxt) if n == len(draft) else (n + 1, int(argmax[n + 1]))

    session, reference = pair_runs("smollm2-135m", "qwen2.5-coder-0.5b")
    tgt = session.engine.target
    prompt = tgt.tokenize(PROMPTS[1][1])
    monkeypatch.setattr(engine_module, "verify_greedy", keep_one_rejected)
    got = [t for ev in session.engine.generate(prompt, 48) if isinstance(ev, E.StepEvent) for t in ev.tokens]
    assert got != reference.plain(prompt, 48, None)[: len(got)]


def test_no_translate_refuses_another_vocabulary():
    from specdash.sources.session import Session

    with pytest.raises(SpecdashError, match="translate = false"):
        Session(EngineSettings(target="smollm2-135m", draft="gemma3-270m", translate=False, threads=1, ctx=512))


# --- a padded vocabulary takes the same-vocabulary path --------------------------------------------


@pytest.fixture(scope="module")
def padded(tmp_path_factory) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from padded_fixture import make_padded

    return make_padded(Path(resolve_model("smollm2-135m")), tmp_path_factory.mktemp("padded") / "smollm2-padded.gguf")


def test_a_padded_vocabulary_is_compatible_and_drafts_untranslated(padded, smol_path):
    """SmolLM2-135M with 128 padding ids (49,280 vs 49,152: the shape of the research's
    152,064 vs 151,936 failure) passes llama.cpp's rules, drafts as a plain draft model
    (no translation), accepts nearly everything (its own weights) and keeps the output."""
    from specdash.engine.drafters.draft_model import DraftModelDrafter
    from specdash.models.compat import check_pair
    from specdash.sources.session import Session

    report = check_pair(smol_path, padded)
    assert report.compatible and not report.translatable
    assert {r.name: r.evidence for r in report.rules}["vocab size"] == (
        "target 49,152, draft 49,280: differ by 128 (max 128)")
    s = Session(EngineSettings(adaptive=False, target=str(smol_path), draft=str(padded), k=4, threads=1, ctx=512, raw=True))
    try:
        assert isinstance(s.engine.drafter.inner, DraftModelDrafter)  # type: ignore[attr-defined]
        prompt = s.engine.target.tokenize(PROMPTS[0][1])
        steps = [ev for ev in s.engine.generate(prompt, 32) if isinstance(ev, E.StepEvent)]
        s.send(E.SetDrafter("none"))
        plain = [ev for ev in s.engine.generate(prompt, 32) if isinstance(ev, E.StepEvent)]
    finally:
        s.close()
    assert [t for ev in steps for t in ev.tokens] == [t for ev in plain for t in ev.tokens]
    assert {ev.drafter for ev in steps} <= {"draft", "none"}
    assert sum(ev.accepted for ev in steps) >= 0.8 * sum(ev.drafted for ev in steps) > 0


# --- where it shows: check and models pairs ---------------------------------------------------------


def test_cli_check_says_translation_applies(capsys):
    from specdash.cli import main

    assert main(["check", "qwen2.5-coder-1.5b", "gemma3-270m"]) == 1  # llama.cpp's verdict stands
    out = capsys.readouterr().out
    assert "FAIL  vocab type  target BPE (2), draft SPM (1)" in out and "NOT compatible: 4 rule(s) failed" in out
    assert "can still speculate through translation" in out and "translate_ms" in out
    assert "--no-translate" in out and "slower than plain decoding" not in out
    assert main(["check", "smollm2-135m", "qwen2.5-coder-0.5b"]) == 1
    out = capsys.readouterr().out
    assert "can still speculate through translation" in out
    assert "the draft is 5.0x the target's size, so it is correct but slower than plain decoding" in out


def test_cli_pairs_ranks_translated_drafts_in_their_own_tier(tmp_path, capsys, monkeypatch):
    import json

    from specdash.cli import main

    paths = {name: resolve_model(name) for name in
             ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m")}
    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "sdcache"))  # a private scan cache
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    for name in ("qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"):
        (shelf / f"{name}.gguf").symlink_to(paths[name])
    target = str(paths["qwen2.5-coder-1.5b"])
    assert main(["models", "pairs", target, str(shelf), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (good,) = data["compatible"]
    assert (good["draft"]["label"], good["rank"], good["tier"]) == ("qwen2.5-coder-0.5b", 1, "same vocabulary")
    tr = {v["draft"]["label"]: v for v in data["translated"]}
    assert set(tr) == {"smollm2-135m", "gemma3-270m"} and sorted(v["rank"] for v in tr.values()) == [2, 3]
    assert (tr["gemma3-270m"]["tier"], tr["gemma3-270m"]["failed_rule"], tr["gemma3-270m"]["translation"]) == (
        "translated", "vocab type", True)
    assert tr["smollm2-135m"]["failed_rule"] == "vocab size"
    assert "through translation" in tr["smollm2-135m"]["translation_note"]
    assert {v["draft"]["label"] for v in data["incompatible"]} == {"smollm2-135m", "gemma3-270m"}
    # A draft bigger than the target: translated, ranked low and said to be slow.
    assert main(["models", "pairs", str(paths["smollm2-135m"]), str(shelf), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    tr = {v["draft"]["label"]: v for v in data["translated"]}
    q = tr["qwen2.5-coder-0.5b"]
    assert q["low_tier"] and "correct but slower than plain decoding" in q["notes"] and "5.0x" in q["translation_note"]
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["models", "pairs", target, str(shelf)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 through translation (another vocabulary), best first" in out
    assert "their own tier (translated)" in out


# --- provenance on screen --------------------------------------------------------------------------


def test_the_generation_panel_colours_translated_draft_tokens_apart():
    """A step drafted through translation ("xvocab") keeps that provenance in the
    dashboard state, and the generation panel draws it in its own colour."""
    import asyncio

    from test_tui_widgets import Host

    from specdash.tui.reducer import DashState
    from specdash.tui.widgets.generation import GenerationView

    state = DashState()
    for drafter, toks in (("xvocab", ["a", "b", "c"]), ("draft", ["d", "e"])):
        state.feed(E.StepEvent(step=1, k=4, drafter=drafter, drafted=3, accepted=len(toks) - 1, tokens=[1] * len(toks),
                               pieces=toks, from_draft=[True] * (len(toks) - 1) + [False], draft_ms=1.0,
                               verify_ms=1.0, other_ms=0.1, n_past=10, n_generated=3, t=1.0, translate_ms=0.4))
    assert state.pieces == [("a", "xvocab"), ("b", "xvocab"), ("c", False), ("d", True), ("e", False)]

    async def run() -> None:
        view = GenerationView()
        async with Host(view).run_test(size=(20, 3)) as pilot:
            view.clear()
            view.append(["xx", "\n", "dd", "\n", "tt"], ["xvocab", False, True, False, False])
            await pilot.pause()
            translated = view.get_component_rich_style("generation--translated").color
            draft = view.get_component_rich_style("generation--draft").color
            assert translated != draft

            def colours(y: int) -> set:
                return {seg.style.color for seg in view.render_line(y) if seg.text.strip() and seg.style}

            assert translated in colours(0) and draft in colours(1) and not {translated, draft} & colours(2)

    asyncio.run(run())


def test_export_leaves_out_a_translated_draft():
    """llama-server refuses a draft with another vocabulary (and then serves with no
    speculation at all): the export says so instead of writing -md."""
    from specdash.records.export import server_args

    st = E.SettingsEvent(source="engine", target="qwen2.5-coder-1.5b", draft="gemma3-270m",
                         drafter="gemma3-270m (translated)", k=4, target_path="/m/qwen.gguf",
                         draft_path="/m/gemma.gguf")
    args, notes = server_args(st)
    assert "-md" not in args and "--spec-type" not in args
    assert any("another vocabulary" in n and "translation" in n for n in notes)
    chain = E.SettingsEvent(source="engine", target="qwen2.5-coder-1.5b", draft="chain", k=4,
                            drafter="chain: lookup → suffix → gemma3-270m (translated)",
                            target_path="/m/qwen.gguf", draft_path="/m/gemma.gguf", lookup_max_ngram=4)
    args, notes = server_args(chain)
    assert "-md" not in args and "--spec-type ngram-simple" in " ".join(args) and notes
