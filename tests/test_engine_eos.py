"""End of generation inside an accepted draft: the engine stops there, and counts as
accepted only the drafted tokens up to and including the end token. The target's argmax
goes on after it, so a draft that runs past it can match further tokens; those are no
text of this run, and counting them inflated acceptance (what the dashboard shows and
adaptive K learns from) and disagreed with whatif, which counts them rejected."""

from __future__ import annotations

from specdash.engine.drafters.base import Draft
from specdash.engine.engine import Engine
from specdash.engine.llm import LLM
from specdash.engine.settings import EngineSettings
from specdash.contract.events import StepEvent, Summary
from test_engine_exact import _WrongDrafter

PROMPT = "Answer with one word: what colour is the sky on a clear day?"
AFTER = 3  # tokens drafted beyond the end token


class Scripted(_WrongDrafter):
    """Proposes a fixed continuation once (what the test computed the target will say)."""

    name = label = "scripted"

    def __init__(self, tokens: list[int]):
        self.tokens = tokens

    def propose(self, tokens, k, sampling, rng):
        out, self.tokens = self.tokens[:k], []
        return Draft(out, None, self.name)


def _argmax_rows(target: LLM, prompt: list[int], draft: list[int]) -> list[int]:
    """The target's argmax after each token of the engine's first verify batch for
    `draft` (same batch, same positions: the numbers the engine will see)."""
    target.clear()
    target.prefill(prompt[:-1])
    return [int(r) for r in target.decode([prompt[-1], *draft], len(prompt) - 1, logits="all").argmax(axis=1)]


def test_a_draft_running_past_the_end_token_counts_accepted_only_up_to_it(smol_path):
    target = LLM(smol_path, n_ctx=512, n_threads=2)
    try:
        prompt = target.tokenize(target.chat_prompt(PROMPT))
        # The target's own answer, its end token, and what its argmax says after that,
        # each read off the same verify batch the engine will decode.
        draft = [0] * 24
        for i in range(len(draft)):
            draft[i] = _argmax_rows(target, prompt, draft)[i]
        end = next(i for i, t in enumerate(draft) if target.is_eog(t))
        assert end + 1 + AFTER <= len(draft), "the answer did not end within 20 tokens"
        draft = draft[: end + 1 + AFTER]
        assert _argmax_rows(target, prompt, draft)[: len(draft)] == draft  # the target would take all of it

        engine = Engine(target, Scripted(draft), EngineSettings(k=len(draft), adaptive=False))
        events = list(engine.generate(prompt, 64))
    finally:
        target.close()
    steps = [e for e in events if isinstance(e, StepEvent)]
    summary = next(e for e in events if isinstance(e, Summary))
    assert len(steps) == 1 and steps[0].drafted == len(draft)
    assert steps[0].tokens == draft[:end]  # the text stops before the end token
    assert steps[0].accepted == end + 1  # the answer and its end token, nothing past it
    assert summary.stop_reason == "eos"
