"""A request's own rules on the target's rows (RunOptions: its logit_bias, penalties,
grammar, min_p, and who is told the rows), in one place for the engine's step and the
batch's: each applies them at the same four points of a speculative step."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from specdash.engine.penalties import penalized
from specdash.engine.verify import keep_min_p, process_logits

if TYPE_CHECKING:
    from specdash.engine.drafters.base import Draft
    from specdash.engine.engine import RunOptions
    from specdash.engine.settings import SamplingParams


def biased(rows: np.ndarray, bias: Mapping[int, float]) -> np.ndarray:
    """`rows` with a request's logit_bias added (a copy; the same rows when it has none)."""
    if not bias:
        return rows
    out = np.array(rows, dtype=np.float32)
    ids = np.fromiter(bias.keys(), dtype=np.int64)
    out[:, ids] += np.fromiter(bias.values(), dtype=np.float32)
    return out


def allowed_draft(options: RunOptions, draft: Draft) -> Draft:
    """The draft cut at its first token the request's grammar forbids (engine/grammar.py)."""
    grammar = options.grammar
    return draft if grammar is None else draft.cut(grammar.cut(draft.tokens))


GRAMMAR = "grammar"  # the source of a draft that is the grammar's forced text
# Its evidence, for adaptive K's copy pricing (draft_pricing.CopyStats buckets): a bucket of
# its own, priced as a long copy until measured (the text is fixed; what can miss is only how
# the model tokenizes it), then by the acceptance its steps show.
GRAMMAR_EVIDENCE = 32


def with_forced(options: RunOptions, draft: Draft, most: int) -> Draft:
    """The step's draft under a grammar: the text the grammar fixes next (its tokens, up to
    `most`) where the drafter's own allowed draft is shorter, else the drafter's (a copy or
    a model writes the fixed text as the model does, and may go past it). The forced text
    depends on the committed tokens alone, so verifying it keeps sampling exact, as a copy."""
    grammar = options.grammar
    if grammar is None or not options.grammar_drafts or most <= len(draft.tokens):
        return draft
    forced = grammar.forced(most)
    if len(forced) <= len(draft.tokens):
        return draft
    from specdash.engine.drafters.base import Draft

    return Draft(forced, None, GRAMMAR, evidence=GRAMMAR_EVIDENCE)


def shaped_rows(options: RunOptions, rows: np.ndarray, context: Sequence[int], draft: Sequence[int]) -> np.ndarray:
    """The verify rows as this request samples from them: its logit_bias, its penalties (by
    each row's context), then its grammar's mask (by the draft before each row)."""
    rows = penalized(biased(rows, options.logit_bias), context, draft, options.penalties)
    return rows if options.grammar is None else options.grammar.mask(rows, draft)


def sampling_probs(options: RunOptions, rows: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    """The target's distributions the rejection rule samples: temperature, top-k, top-p, min_p."""
    return keep_min_p(process_logits(rows, sampling), options.min_p)


def committed(options: RunOptions, tokens: list[int], raw: np.ndarray, piece: Callable[[int], bytes]) -> None:
    """After the commit: the grammar moves past the tokens, and whoever asked is told the
    unshaped rows that predicted them (a client's logprobs)."""
    if options.grammar is not None:
        options.grammar.accept(tokens)
    if options.observe_rows is not None and tokens:
        options.observe_rows(tokens, raw[:len(tokens)], piece)
