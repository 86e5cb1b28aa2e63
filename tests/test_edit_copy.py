"""The edit-following copy (issue 53): on a scripted source and answer it drafts through a
renamed identifier that a plain copy breaks at, follows an insertion without repeating it,
and proposes nothing where the answer departs from the source; on the default pair it is
exact (greedy: the target's own output) and drafts through the edits of a real rename.
The sampled side is the fuzz harness's: it swaps to every drafter kind, this one too."""

from __future__ import annotations

import pytest

from specdash.contract import events as C
from specdash.engine.drafters.edits import EditCopyDrafter, replace_all
from specdash.engine.drafters.lookup import PromptLookupDrafter
from specdash.engine.settings import SamplingParams

SP = SamplingParams()
SOURCE = ("def total ( xs ) : tmp = 0 ; for x in xs : tmp = tmp + x ; "
          "log ( tmp ) ; check ( tmp , xs ) ; return tmp").split()
WORDS = list(dict.fromkeys(SOURCE + "acc rename please note : here it is".split()))
ID = {w: i for i, w in enumerate(WORDS)}


def ids(text: str) -> list[int]:
    return [ID[w] for w in text.split()]


PROMPT = ids("rename please :") + [ID[w] for w in SOURCE]


def replay(drafter, answer: list[int], k: int = 8) -> list[tuple[list[int], int]]:
    """Greedy verification against a known answer: per step (draft, tokens accepted)."""
    drafter.prefill(PROMPT)
    toks, i, steps = list(PROMPT), 0, []
    while i < len(answer):
        d = drafter.propose(toks, k, SP, None)
        acc = 0
        while acc < len(d.tokens) and i + acc < len(answer) and d.tokens[acc] == answer[i + acc]:
            acc += 1
        steps.append((d.tokens, acc))
        take = answer[i:i + acc + 1]
        toks += take
        i += len(take)
    return steps


def test_replace_all_replaces_every_occurrence_from_start():
    assert replace_all([1, 2, 3, 1, 2, 1, 2], [1, 2], [9], start=2) == [1, 2, 3, 9, 9]
    assert replace_all([1, 2], [], [9]) == [1, 2]


def test_it_drafts_through_a_renamed_identifier_where_a_plain_copy_breaks():
    answer = ids(" ".join(SOURCE).replace("tmp", "acc"))
    edit = EditCopyDrafter()
    steps = replay(edit, answer)
    assert edit.edits == [((ID["tmp"],), (ID["acc"],))]
    # Once learnt (after `acc = 0 ;`), every later draft has `acc` where the source has `tmp`.
    drafted = [t for d, _ in steps for t in d]
    assert ID["acc"] in drafted and ID["tmp"] not in drafted
    lookup_steps = replay(PromptLookupDrafter(), answer)
    assert ID["tmp"] in [t for d, _ in lookup_steps for t in d]  # lookup's copies still say tmp
    accepted, plain_copy = sum(a for _, a in steps), sum(a for _, a in lookup_steps)
    assert accepted > plain_copy + 4, (accepted, plain_copy)
    assert len(steps) < len(lookup_steps)


def test_an_insertion_is_repeated_only_after_the_tokens_it_was_made_after():
    """A new first argument (`get ( k )` -> `get ( db , k )`): the edit carries its left
    context, so the next `get (` is drafted with `db ,` and nothing else is."""
    source = "a = get ( k1 ) ; b = get ( k2 ) ; c = put ( k3 ) ; d = get ( k4 ) ; e = put ( k5 ) ;".split()
    answer = " ".join(source).replace("get (", "get ( db ,").split()
    words = list(dict.fromkeys(source + ["db", ","]))
    wid = {w: i for i, w in enumerate(words)}
    prompt = [wid[w] for w in source]
    edit = EditCopyDrafter()
    edit.prefill(prompt)
    toks, i, drafted = list(prompt), 0, []
    target = [wid[w] for w in answer]
    while i < len(target):
        d = edit.propose(toks, 8, SP, None)
        acc = 0
        while acc < len(d.tokens) and i + acc < len(target) and d.tokens[acc] == target[i + acc]:
            acc += 1
        drafted.append((d.tokens, acc))
        toks += target[i:i + acc + 1]
        i += acc + 1
    assert edit.edits == [((wid["get"], wid["("]), (wid["get"], wid["("], wid["db"], wid[","]))]
    assert sum(acc for _, acc in drafted) >= 12  # the later get( calls drafted with db,
    put_after = [d for d, _ in drafted if d and d[0] == wid["put"]]
    assert all(wid["db"] not in d[:3] for d in put_after)  # put ( is not get (


def test_it_proposes_nothing_where_the_answer_departs_from_the_source():
    answer = ids(" ".join(SOURCE).replace("tmp", "acc"))[:12] + ids("here it is here it is note : here")
    edit = EditCopyDrafter()
    steps = replay(edit, answer)
    # After the answer leaves the source for good, no draft is offered at all.
    left = len(ids(" ".join(SOURCE).replace("tmp", "acc"))[:12])
    done = 0
    for d, acc in steps:
        if done >= left + 3:
            assert not d
        done += acc + 1


RENAME = """Rename the variable `tmp` to `running_total` everywhere in this function and return only the code.

```python
def summarize(values):
    tmp = 0
    count = 0
    for v in values:
        if v is None:
            continue
        tmp = tmp + v
        count += 1
    if count == 0:
        return {"total": tmp, "mean": None}
    mean = tmp / count
    print("total", tmp, "mean", mean)
    return {"total": tmp, "mean": mean, "count": count}
```
"""


@pytest.mark.slow
@pytest.mark.parametrize("drafter,adaptive", [("edit", False), ("auto", True)])
def test_greedy_output_with_the_edit_copy_is_the_targets_own(qwen_session, greedy_reference, target_path,
                                                             near_ties, drafter, adaptive):
    """`edit` at a fixed K (every copy it has is verified, whatever this CPU's curve says),
    `auto` adaptive: both commit the target's own greedy output."""
    from test_engine_exact import TIE_GAP, Pair, apply, generated_tokens, run_engine

    pair = Pair(qwen_session, "qwen2.5-coder-0.5b", greedy_reference(target_path, ctx=2048))
    session = qwen_session
    prompt = session.prompt_tokens(RENAME)
    n = 120
    plain = pair.greedy(prompt, n)
    saved = session.settings
    apply(session, C.SetDrafter(drafter), C.SetK(8), C.SetAdaptive(adaptive))
    try:
        steps, summary = run_engine(session, prompt, max_tokens=n)
    finally:
        apply(session, C.SetDrafter(saved.draft), C.SetK(saved.k), C.SetAdaptive(saved.adaptive))
    got = generated_tokens(steps)
    ties = 0
    if got != plain:
        for i, (tok, (want, gap)) in enumerate(zip(got, pair.teacher_force(prompt, got))):
            if tok != want:
                assert gap < TIE_GAP, f"{drafter}: token {i} is {tok}, the target's argmax is {want} (gap {gap:.3f})"
                ties += 1
        assert ties > 0, f"{drafter}: differs from plain decoding without a near-tie"
    by_edit = [s for s in steps if s.drafter == "edit"]
    near_ties.append(f"rename / edit copy, {drafter}: {ties} near-tie mismatches, {len(by_edit)} steps drafted "
                     f"by the edit copy ({sum(s.accepted for s in by_edit)}/{sum(s.drafted for s in by_edit)} accepted)")
    if drafter == "edit":
        # The answer renames tmp on every line: the copy reads the edit at the first and
        # drafts the rest of the function with it.
        assert by_edit and sum(s.accepted for s in by_edit) > 0, [(s.drafter, s.drafted, s.accepted) for s in steps]
