#!/usr/bin/env python
"""Prompt lookup with and without its one-token guess, paired round by round.

    python benchmarks/experiments/lookup_guess_ab.py --ks 4,16 --rounds 3 --tokens 96 \
        --out benchmarks/results/lookup-one-gram-guess.txt

The lookup drafter drafts from n-grams of lookup_min_ngram (2) up; one size shorter (a
1-gram) may add one last token and end the draft (engine/drafters/lookup.py). The "no
guess" arm is the same drafter with that size switched off, the rule before it. One
Session per K (lookup, fixed K, greedy) holds the target; the arms swap drafters in it and
alternate order from round to round and prompt to prompt.

Per run and report: benchmarks/experiments/ab_arms.py.
"""

from __future__ import annotations

import sys

from ab_arms import parser, run  # benchmarks/experiments/ is sys.path[0]

from specdash.engine.drafters.lookup import PromptLookupDrafter
from specdash.engine.settings import EngineSettings
from specdash.sources.session import Session

DEFAULT_PROMPTS = "code-generation,code-edit,summarization,json-extraction,edit-js-module,summarize-postmortem," \
                  "dialogue-support"


class NoGuess(PromptLookupDrafter):
    """The lookup rule without the one-token guess: nothing shorter than min_ngram votes."""

    def __init__(self, min_ngram: int, max_ngram: int):
        super().__init__(min_ngram, max_ngram)
        self._guess_ngram = min_ngram


def arm(cls: type[PromptLookupDrafter]):
    def put(session: Session) -> None:
        s = session.settings
        session.engine.drafter = cls(s.lookup_min_ngram, s.lookup_max_ngram)
    return put


def main() -> int:
    args = parser(__doc__, DEFAULT_PROMPTS, "4,16").parse_args()
    return run(args, {"guess": arm(PromptLookupDrafter), "no-guess": arm(NoGuess)},
               lambda k: EngineSettings(target=args.target, draft="lookup", k=k, adaptive=False,
                                        threads=args.threads, ctx=4096, max_tokens=args.tokens),
               "lookup with and without the one-token guess", "lookup_guess_ab.py")


if __name__ == "__main__":
    sys.exit(main())
