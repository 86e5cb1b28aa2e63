"""The target's MTP head in a what-if: its proposals over the known text, and a drafter
that replays them (`mtp`, engine/drafters/mtp.py).

One teacher-forced pass of the target over the text gives its hidden row at every
position, the head's input. A draft model's proposal at each position is its argmax there
(simulate.SimDraftModel), because it drafts on the true prefix until its first wrong
token. The head is not: from its second token on it is fed its own hidden row, not the
target's, so what it drafts depends on where the draft started. So the real head drafts
once from every position of the text, over those rows, as far as its confidence cut
lets any draft run (or the largest K simulated): a draft of K from position j is the
first K tokens of chain j, exactly, rejected tokens included (the chain goes on from its
own wrong token as the drafter does). The rows come from batches of another size than a
real run's, so a near-tie can round the other way, as for the draft model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specdash.engine.drafters.base import Draft, Drafter
from specdash.engine.drafters.draft_model import JointCut
from specdash.engine.llm import LLM
from specdash.engine.settings import SamplingParams
from specdash.costs.profile import Profile


@dataclass
class HeadChains:
    """Chain j: what the head drafts once prompt + seq[:j] is committed (tokens, and each
    one's confidence, llama.cpp's top-10 share), as far as `depth` tokens or its cuts."""

    tokens: list[list[int]]
    confidences: list[list[float]]
    depth: int
    relative_cost: float | None  # what the session prices a drafted token at (the head's bytes)
    p_min: float = 0.0  # the cuts the chains were drafted under
    p_joint: float = 0.0


def head_chains(head: Drafter, target: LLM, prompt: Sequence[int], seq: Sequence[int], depth: int,
                relative_cost: float | None, say: Callable[[str], None] = lambda s: None) -> HeadChains:
    """Decode the text on the target (the head observes the rows), then let the head draft
    from every position. `head`: the session's MTP drafter (engine/drafters/mtp.py)."""
    inner: Any = getattr(head, "inner", head)  # the session lends it (Borrowed): an MtpDrafter
    full = [*prompt, *seq]
    say(f"drafting with the target's MTP head from each of {len(seq) + 1} positions (up to {depth} tokens)")
    target.clear()
    inner.reset()
    target.prefill(full[:-1])  # every row a chain needs: the last one is at position len(full) - 2
    tokens, conf = [], []
    for j in range(len(seq) + 1):
        t, c = inner.chain(full[: len(prompt) + j], depth)
        tokens.append(t)
        conf.append(c)
    target.clear()
    inner.reset()
    return HeadChains(tokens, conf, depth, relative_cost, inner.p_min, inner.p_joint)


class SimMtpHead:
    """engine.drafters.mtp.MtpDrafter replayed from HeadChains, timed on a profile: the
    same drafts at every K (no draft from the prompt's own last token, as the drafter),
    the same cuts, and its costs (the entries it feeds, one head decode per drafted token,
    and one more for a draft its cut ended)."""

    name = "mtp"
    free = False
    label = "mtp"

    def __init__(self, chains: HeadChains, n_prompt: int, profile: Profile, p_min: float, p_joint: float):
        self.chains, self.n_prompt, self.profile = chains, n_prompt, profile
        self.p_min, self.p_joint = p_min, p_joint
        self.relative_cost = chains.relative_cost
        self._fed = 0  # committed entries the head holds
        # As the drafter's own bookkeeping: entries committed by the step after one it
        # drafted are part of drafting; the rest is catch-up on steps it sat out.
        self._normal_upto = -1
        self._after_draft = False
        self.spent = 0.0
        self.prep = 0.0

    @property
    def k_ceiling(self) -> bool:
        return self.p_joint > 0

    def parts(self) -> Sequence[Drafter]:
        return [self]

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator | None) -> Draft:
        if self._after_draft:
            self._normal_upto, self._after_draft = len(tokens) - 1, False
        j = len(tokens) - self.n_prompt
        if k <= 0 or j <= 0 or j >= len(self.chains.tokens):
            return Draft.empty(self.name)
        n_past = len(tokens) - 1
        feed = max(n_past - self._fed, 0)
        extra = max(0, n_past - max(self._fed, self._normal_upto))
        self._fed = n_past
        chain, conf = self.chains.tokens[j], self.chains.confidences[j]
        cut = JointCut(self.p_min, self.p_joint)
        out: list[int] = []
        stopped = False
        for i, tok in enumerate(chain[:k]):
            if cut.active and cut.stop(conf[i]):
                stopped = True
                break
            out.append(tok)
        # The chain ended before K (a cut when it was drafted): that decode was paid too.
        stopped = stopped or (len(out) < k and len(chain) < k)
        decodes = len(out) + (1 if stopped and len(out) < k else 0)
        head_ms, batch_ms = self.profile.mtp_costs(self.relative_cost)
        prep = min(extra, feed) * batch_ms
        self.spent += feed * batch_ms + decodes * head_ms
        self.prep += prep
        self._after_draft = True
        return Draft(out, None, self.name, prep_ms=prep)

    def catch_up_ms(self, tokens: Sequence[int]) -> float:
        behind = len(tokens) - 1 - max(self._fed, self._normal_upto)
        return behind * self.profile.mtp_costs(self.relative_cost)[1] if behind > 0 else 0.0

    def unpriced_catch_up(self, tokens: Sequence[int]) -> int:
        return 0  # priced from the profile from the first step (the real head: once measured)

    def prefill(self, tokens: Sequence[int]) -> None:
        self._fed = self._normal_upto = len(tokens) - 1

    def reset(self) -> None:
        self._fed, self._normal_upto, self._after_draft = 0, -1, False

    def forget(self) -> None:
        pass

    def set_cut(self, p_joint: float) -> None:
        self.p_joint = p_joint

    def close(self) -> None:
        pass
