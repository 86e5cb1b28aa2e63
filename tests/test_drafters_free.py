"""Model-free draft sources: prompt lookup, suffix, and the chain that tries them in turn."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

from specdash.engine.drafters.base import Draft
from specdash.engine.drafters.chain import ChainDrafter
from specdash.engine.drafters.lookup import PromptLookupDrafter
from specdash.engine.drafters.suffix import SuffixDrafter
from specdash.engine.settings import SamplingParams
from specdash.contract.errors import SpecdashError

SP = SamplingParams()
RNG = np.random.default_rng(0)


def propose(drafter, tokens, k=8):
    return drafter.propose(tokens, k, SP, RNG)


def decode_along(drafter, seq, start, k=8):
    """Call propose once per step as the engine does, the sequence growing by one token."""
    return [propose(drafter, seq[:n], k) for n in range(start, len(seq) + 1)]


# --- prompt lookup ------------------------------------------------------------------------
def test_lookup_prefers_the_longest_ngram():
    # The last token 3 follows "1 2" at 0..2 (then 50) and "9" at 6..7 (then 60, more
    # recent); the 3-gram "1 2 3" wins over the more recent 1-gram.
    seq = [1, 2, 3, 50, 51, 9, 3, 60, 61, 1, 2, 3]
    d = propose(PromptLookupDrafter(1, 4), seq, k=2)
    assert d.tokens == [50, 51] and d.probs is None and d.source == "lookup"


def test_lookup_drafts_the_continuation_seen_most_often():
    # "7 8 9" was followed by 20 twice and by 10 once: 20 is drafted, then the rule runs
    # again on the extended text ("8 9 20" -> 21 twice, 0 once).
    seq = [7, 8, 9, 20, 21, 5, 7, 8, 9, 10, 11, 7, 8, 9, 20, 21, 0, 7, 8, 9]
    assert propose(PromptLookupDrafter(), seq, k=2).tokens == [20, 21]


def test_lookup_needs_support_for_short_ngrams():
    """llama.cpp's thresholds: a 3- or 4-gram seen once is enough, a 2-gram must have been
    seen twice with one continuation in at least half of them, a 1-gram twice and 66%."""
    once = [1, 2, 3, 4, 5, 6, 1, 2]  # "1 2" seen once: not enough support
    assert propose(PromptLookupDrafter(), once).tokens == []
    thrice = [1, 2, 3, 4, 5, 6, 1, 2, 3]  # "1 2 3" seen once: enough
    assert propose(PromptLookupDrafter(), thrice, k=3).tokens == [4, 5, 6]
    twice = [1, 2, 9, 5, 1, 2, 9, 6, 1, 2]  # "1 2" -> 9 twice
    assert propose(PromptLookupDrafter(), twice, k=1).tokens == [9]
    split = [1, 2, 9, 5, 1, 2, 8, 6, 1, 2, 7, 0, 1, 2]  # "1 2" -> 9, 8, 7: no majority
    assert propose(PromptLookupDrafter(), split).tokens == []
    unigram = [6, 3, 6, 3, 6, 4, 6]  # "6" -> 3, 3, 4: 66% for 3
    assert propose(PromptLookupDrafter(1, 4), unigram, k=1).tokens == [3]
    assert propose(PromptLookupDrafter(1, 4), [6, 3, 6, 4, 6], k=1).tokens == []  # 50% < 66%


def test_lookup_respects_k_and_sequence_end():
    seq = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    lookup = PromptLookupDrafter()
    assert propose(lookup, seq, k=2).tokens == [4, 5]
    # past the present it goes on voting on its own draft: a repeating text repeats
    assert propose(lookup, seq, k=12).tokens == [4, 5, 6, 1, 2, 3] * 2
    assert propose(lookup, seq, k=0) == Draft.empty()


def test_lookup_returns_empty_without_a_match_or_below_min_ngram():
    assert propose(PromptLookupDrafter(), [1, 2, 3, 4, 5]).tokens == []
    seq = [9, 3, 9, 3, 1, 9]  # only the 1-gram "9" repeats (-> 3 twice)
    assert propose(PromptLookupDrafter(1, 4), seq, k=1).tokens == [3]
    assert propose(PromptLookupDrafter(3, 4), seq).tokens == []  # 1-grams are two sizes below 3
    assert propose(PromptLookupDrafter(), [5]).tokens == []


def test_lookup_one_size_below_min_ngram_only_guesses_one_last_token():
    """llama.cpp chains 1-grams like any n-gram; below min_ngram a vote adds one token
    and ends the draft (the guess keeps most of what 1-grams accept, not their waste)."""
    seq = [9, 3, 9, 3, 1, 9]  # "9" -> 3 twice; then "9 3" -> 9, 1
    assert propose(PromptLookupDrafter(1, 4), seq, k=4).tokens == [3, 9, 3, 1]  # chained
    assert propose(PromptLookupDrafter(2, 4), seq, k=4).tokens == [3]  # a guess ends it
    copy = [5, 6, 7, 8, 2, 8, 2, 8, 0, 5, 6, 7]  # "5 6 7" -> 8 once, then the copy goes on
    assert propose(PromptLookupDrafter(3, 4), copy, k=8).tokens == [8, 2, 8, 2, 8, 0, 5, 6]
    assert propose(PromptLookupDrafter(4, 4), copy, k=8).tokens == [8]  # a 3-gram guess, then stop


def test_lookup_rejects_bad_ngram_sizes():
    with pytest.raises(SpecdashError, match="lookup_min_ngram"):
        PromptLookupDrafter(0, 4)
    with pytest.raises(SpecdashError, match="min=5 max=3"):
        PromptLookupDrafter(5, 3)


def _random_text(rng, n, vocab=12):
    """Tokens with plenty of repeats: phrases copied from earlier, plus noise."""
    seq = list(rng.integers(0, vocab, 8))
    while len(seq) < n:
        if rng.random() < 0.5 and len(seq) > 10:
            start = int(rng.integers(0, len(seq) - 6))
            seq.extend(seq[start : start + int(rng.integers(2, 7))])
        else:
            seq.append(int(rng.integers(0, vocab)))
    return seq[:n]


@pytest.mark.parametrize("make", [PromptLookupDrafter, SuffixDrafter])
def test_incremental_index_matches_a_fresh_build(make):
    """Step-by-step (incremental) proposals equal those of a drafter built from scratch on
    the same tokens, including after a sequence that does not extend the indexed one."""
    rng = np.random.default_rng(3)
    seq = _random_text(rng, 300)
    incremental = make()
    got = decode_along(incremental, seq, 40)
    want = [propose(make(), seq[:n]) for n in range(40, len(seq) + 1)]
    assert [d.tokens for d in got] == [d.tokens for d in want]
    assert sum(bool(d.tokens) for d in got) > 120
    # A different sequence without reset(): the drafter notices and rebuilds.
    other = _random_text(np.random.default_rng(4), 120)
    if make is SuffixDrafter:  # it would also remember `seq`: compare against that state
        fresh = make()
        propose(fresh, seq)
        fresh.reset()
    else:
        fresh = make()
    assert propose(incremental, other).tokens == propose(fresh, other).tokens
    assert (
        propose(incremental, np.array(other, dtype=np.int32)).tokens == propose(fresh, other).tokens
    )


# --- suffix ---------------------------------------------------------------------------------
TAIL = [900, 901, 902]  # a chat template's "assistant" header: every prompt ends with it


def generate(drafter, prompt, output, k=8):
    """Feed prompt + output step by step; returns the drafts proposed along the way."""
    drafter.reset()
    return decode_along(drafter, prompt + output, len(prompt), k)


def test_suffix_drafts_an_earlier_output_after_reset():
    suffix = SuffixDrafter()
    answer = list(range(100, 140))
    generate(suffix, [1, 2, 3] + TAIL, answer)
    suffix.reset()
    new_prompt = [7, 8, 9, 10] + TAIL  # a different prompt, same template tail
    d = propose(suffix, new_prompt + answer[:5], k=8)
    assert d.tokens == answer[5:13] and d.source == "suffix" and d.probs is None
    # Lookup has only the current sequence: nothing to copy from.
    assert propose(PromptLookupDrafter(), new_prompt + answer[:5]).tokens == []


def test_suffix_keeps_the_answer_tail_committed_after_its_last_call():
    """The engine passes its own list and extends it after each step; the final step's
    tokens are never shown in a call, yet belong to the answer."""
    suffix = SuffixDrafter()
    live = [1, 2] + TAIL
    answer = list(range(400, 420))
    for i in range(0, len(answer), 4):
        propose(suffix, live, k=4)
        live.extend(answer[i : i + 4])  # committed after the call
    suffix.reset()
    assert propose(suffix, [3] + TAIL + answer[:16], k=8).tokens == answer[16:]


def test_suffix_draft_length_grows_with_match_length():
    suffix = SuffixDrafter(alpha=1.0)
    answer = list(range(200, 260))
    generate(suffix, [1] + TAIL, answer)
    suffix.reset()
    lengths = []
    for n in range(1, 7):  # the new prompt shares nothing but the answer's first n tokens
        suffix.reset()
        lengths.append(len(propose(suffix, [5, 6] + answer[:n], k=16).tokens))
    assert lengths == [1, 2, 3, 4, 5, 6]
    half = SuffixDrafter(alpha=0.5)
    generate(half, [1] + TAIL, answer)
    half.reset()
    assert len(propose(half, [5, 6] + answer[:6], k=16).tokens) == 3


def test_suffix_stops_at_the_probability_floor():
    """Four earlier answers continue the same 5-token context with c, c, d, e; after c
    they continue with f then g. P(c) = 1/2, P(f | c) = 1/2."""

    def drafter(min_prob):
        s = SuffixDrafter(min_prob=min_prob)
        for nxt, after in [(30, 40), (30, 41), (31, 42), (32, 43)]:
            generate(s, [1, 2], [10, 11, 12, nxt, after])
        s.reset()
        return s

    ctx = [1, 2, 10, 11, 12]
    assert propose(drafter(0.6), ctx).tokens == []  # 0.5 < 0.6 already
    assert propose(drafter(0.4), ctx).tokens == [30]  # then 0.5 * 0.5 = 0.25 < 0.4
    assert propose(drafter(0.2), ctx).tokens == [30, 41]  # the newest wins the tie
    assert propose(drafter(0.0), ctx, k=3).tokens == [30, 41]  # nothing after the answer


def test_suffix_prefers_the_longest_match_over_frequency():
    s = SuffixDrafter(min_prob=0.0)
    for _ in range(5):
        generate(s, [3], [4, 5, 6, 70])  # "5 6" -> 70 five times, after a short match
    generate(s, [3], [9, 8, 5, 6, 71])  # "9 8 5 6" -> 71 once
    s.reset()
    assert propose(s, [1, 9, 8, 5, 6], k=1).tokens == [71]
    assert propose(s, [1, 2, 2, 5, 6], k=1).tokens == [70]


def test_suffix_memory_is_bounded():
    s = SuffixDrafter(max_sequences=2)
    for i in range(3):
        generate(s, [1], [500 + i, 600 + i, 700 + i])
    s.reset()
    assert propose(s, [1, 500], k=2).tokens == []  # the oldest answer was dropped
    s.reset()
    assert propose(s, [1, 502], k=2).tokens == [602, 702]
    s = SuffixDrafter(max_tokens=10)
    generate(s, [1], list(range(100, 108)))
    generate(s, [1], list(range(200, 208)))
    s.reset()
    assert propose(s, [2, 100, 101], k=2).tokens == []  # 9 + 9 tokens > 10: oldest gone
    assert propose(s, [2, 200, 201], k=2).tokens == [202, 203]


def test_suffix_rejects_bad_parameters():
    with pytest.raises(SpecdashError, match="min_prob=2"):
        SuffixDrafter(min_prob=2)
    with pytest.raises(SpecdashError, match="alpha=0"):
        SuffixDrafter(alpha=0)


# --- chain ----------------------------------------------------------------------------------
class Recorder:
    """A draft source that records its calls and answers from a script."""

    free = False

    def __init__(self, name, tokens, probs=None):
        self.name, self.tokens, self.probs = name, tokens, probs
        self.label = name
        self.calls: list[tuple[int, int]] = []  # (len(tokens), k) per call
        self.resets = self.closes = 0
        self.prefilled: list[int] = []

    def propose(self, tokens, k, sampling, rng):
        self.calls.append((len(tokens), k))
        return Draft(self.tokens[:k], self.probs if k else None, self.name)

    def catch_up_ms(self, tokens):
        return 0.0

    def unpriced_catch_up(self, tokens):
        return 0

    def prefill(self, tokens):
        self.prefilled.append(len(tokens))

    def reset(self):
        self.resets += 1

    def parts(self):
        return [self]

    def forget(self):
        pass

    def close(self):
        self.closes += 1


def test_chain_prefill_reaches_every_source_and_indexes_the_prompt():
    model = Recorder("draft", [7, 7, 7])
    lookup = PromptLookupDrafter()
    chain = ChainDrafter([lookup, SuffixDrafter(), model])
    prompt = [5, 6, 7, 8, 9, 5, 6, 7]
    chain.prefill(prompt)
    assert model.prefilled == [8] and model.calls == []
    assert lookup._indexed == len(prompt)  # the prompt is indexed before the first step
    d = propose(chain, prompt, k=2)
    assert (d.tokens, d.source) == ([8, 9], "lookup")


def test_chain_takes_the_first_non_empty_source_and_reports_it():
    model = Recorder("draft", [7, 7, 7], probs=np.full((3, 4), 0.25))
    chain = ChainDrafter([PromptLookupDrafter(), SuffixDrafter(), model])
    assert chain.name == "chain"
    repeat = [1, 2, 3, 4, 5, 1, 2, 3]
    d = propose(chain, repeat, k=2)
    assert (d.tokens, d.source) == ([4, 5], "lookup")
    assert model.calls == [(8, 0)]  # shown the tokens, not asked to draft
    d = propose(chain, repeat + [4, 5, 1, 99, 98], k=2)  # nothing repeats: the model drafts
    assert (d.tokens, d.source) == ([7, 7], "draft") and d.probs is not None
    assert model.calls == [(8, 0), (13, 2)]


def test_chain_lets_suffix_see_the_prompt_even_when_lookup_answers():
    """The suffix drafter remembers answers; it must know where the prompt ended even if
    lookup drafted every step and it was never asked."""
    suffix = SuffixDrafter()
    chain = ChainDrafter([PromptLookupDrafter(), suffix])
    prompt = list(range(1000, 1100)) + TAIL
    answer = list(range(1000, 1040))  # copies the prompt: lookup answers every step
    chain.reset()
    drafts = [d for d in decode_along(chain, prompt + answer, len(prompt)) if d.tokens]
    # lookup answers once a 3-gram of the copy has appeared (the answer's first two
    # tokens have too little support for it); suffix is asked only then
    assert sum(d.source == "lookup" for d in drafts) >= len(answer) - 4
    chain.reset()
    d = propose(suffix, [5] + TAIL + answer[:3], k=4)
    assert d.tokens == answer[3:7]  # the answer (and its context) was archived from the start


def test_chain_falls_through_to_suffix_memory():
    suffix = SuffixDrafter()
    generate(suffix, [1] + TAIL, list(range(300, 320)))
    chain = ChainDrafter([PromptLookupDrafter(), suffix])
    chain.reset()
    d = propose(chain, [2] + TAIL + [300, 301], k=3)
    assert (d.tokens, d.source) == ([302, 303, 304], "suffix")


def test_chain_empty_look_only_reset_close():
    a, b = Recorder("a", []), Recorder("b", [])
    chain = ChainDrafter([a, b])
    assert propose(chain, [1, 2, 3]) == Draft.empty()
    assert a.calls == b.calls == [(3, 8)]
    assert propose(chain, [1, 2, 3, 4], k=0) == Draft.empty()  # look only: all see it
    assert a.calls[-1] == b.calls[-1] == (4, 0)
    chain.reset()
    chain.close()
    assert (a.resets, a.closes, b.resets, b.closes) == (1, 1, 1, 1)
    with pytest.raises(ValueError):
        ChainDrafter([])


# --- cost per step ----------------------------------------------------------------------------
def _project_tokens(n: int) -> list[int]:
    """Word-level token ids of this project's own source: real code, real repetition."""
    root = Path(__file__).resolve().parents[1] / "specdash"
    text = "".join(p.read_text() for p in sorted(root.rglob("*.py")))
    vocab: dict[str, int] = {}
    ids = [vocab.setdefault(t, len(vocab)) for t in re.findall(r"\w+|[^\w\s]|\s+", text)]
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


@pytest.mark.parametrize("make", [PromptLookupDrafter, SuffixDrafter])
def test_propose_cost_at_4k_context(make, capsys):
    """Reports µs per propose() at ~4k tokens (the engine calls it once per ~30 ms step);
    asserts only behaviour, never time."""
    seq = _project_tokens(4600)
    drafter = make()
    propose(drafter, seq[:4000])  # the prompt: indexed once
    per_call = []
    n, drafted = 4000, 0
    while n < len(seq) - 8:
        tokens = seq[:n]  # the engine passes its own list: copying it is not the drafter's cost
        t0 = time.perf_counter()
        d = propose(drafter, tokens, k=8)
        per_call.append(time.perf_counter() - t0)
        # Commit what the target would: the matching draft prefix, then one token.
        acc = 0
        while acc < len(d.tokens) and d.tokens[acc] == seq[n + acc]:
            acc += 1
        drafted += bool(d.tokens)
        n += acc + 1
    with capsys.disabled():
        print(
            f"\n{make.__name__}: {len(per_call)} steps at ~4k context: "
            f"median {np.median(per_call) * 1e6:.0f} us, p99 {np.percentile(per_call, 99) * 1e6:.0f} us"
            " per propose()"
        )
    assert drafted > 0.3 * len(per_call)


# --- evidence: how long the match behind a copy is ---------------------------------------
def test_lookup_evidence_is_the_whole_match_not_just_the_ngram():
    copied = list(range(100, 120))  # 20 tokens that recur verbatim
    seq = [1, 2, *copied, 7, 8, 9, 1, 2, *copied[:12]]
    d = propose(PromptLookupDrafter(1, 4), seq, k=4)
    assert d.tokens == copied[12:16]
    assert d.evidence == 14  # "1 2" + 12 copied tokens, though the n-gram was 4 long
    short = propose(PromptLookupDrafter(1, 4), [5, 6, 7, 9, 6, 7, 1, 6], k=4)
    assert short.tokens[:1] == [7] and short.evidence == 1


def test_suffix_evidence_is_its_match_length():
    seq = [3, 1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3, 4]
    d = propose(SuffixDrafter(), seq, k=4)
    assert d.tokens[:2] == [5, 6] and d.evidence == 4


def test_cut_keeps_source_and_evidence():
    d = Draft([1, 2, 3], np.ones((3, 4)), "draft", 7)
    c = d.cut(2)
    assert c.tokens == [1, 2] and c.probs.shape == (2, 4) and (c.source, c.evidence) == ("draft", 7)
    assert d.cut(5) is d and d.cut(0).tokens == []
