"""One request in the batch: its sequence in the target's context, its run, its drafter."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from specdash.engine.ask_backoff import AskBackoff
from specdash.engine.drafters.base import Draft, Drafter, NoDrafter
from specdash.engine.drafters.kinds import KINDS, Parts
from specdash.engine.drafters.suffix import SuffixDrafter, SuffixHistory
from specdash.engine.settings import EngineSettings, SamplingParams

if TYPE_CHECKING:
    from specdash.engine.engine import Run

# What a slot drafts with when the spec names a draft model or the MTP head, which a batch
# cannot run per sequence (engine/batch/__init__.py says why): auto's copy sources.
COPIES_ONLY = "auto"


def copy_drafter(spec: str, settings: EngineSettings, memory: SuffixHistory) -> Drafter:
    """A drafter of its own for one sequence, from model-free sources only (a draft model or
    MTP spec drafts with COPIES_ONLY). Its suffix source follows this sequence alone but
    matches against, and adds its answer to, `memory`: the earlier answers it shares with
    the batch's other sequences and the session's own suffix drafter."""
    if spec not in KINDS or spec == "mtp":
        spec = COPIES_ONLY
    parts = Parts(settings, free=lambda drafter: drafter, suffix=lambda: SuffixDrafter(history=memory),
                  model=lambda: None, head=None)
    return KINDS[spec].build(parts)


@dataclass(eq=False)
class Slot:
    seq: int  # its sequence id in the target's context
    tag: str  # the request it serves: events name it
    prompt: list[int]
    run: Run
    drafter: Drafter
    spec: str  # the drafter spec it was built from ("" for a request's own, kept through swaps)
    prefill_ms: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    # It ran alone from its first step: the engine's own drafter followed it from its
    # prompt, and that drafter's suffix source remembers its answer (not this slot's).
    engine_remembers: bool = False

    def forget_answer(self) -> None:
        """Its suffix source ends this answer unremembered (the engine's remembers it)."""
        for part in self.drafter.parts():
            if isinstance(part, SuffixDrafter):
                part.drop()

    def drafts(self, tokens: Sequence[int], cap: int, sampling: SamplingParams,
               rng: np.random.Generator | None, asks: AskBackoff | None = None) -> list[tuple[Draft, str, float]]:
        """What each source asked offers, up to `cap` tokens: (draft, the source's name, the
        ms its ask took). Every source sees every step, even at cap 0 (the suffix source must):
        one that `asks` backs off is shown it at k = 0, as is every source at cap 0."""
        out: list[tuple[Draft, str, float]] = []
        for part in self.drafter.parts():
            if isinstance(part, NoDrafter):
                continue
            if cap <= 0 or (asks is not None and not asks.ask_now(part.name)):
                part.propose(tokens, 0, sampling, rng)
                continue
            t0 = time.perf_counter()
            out.append((part.propose(tokens, cap, sampling, rng), part.name, (time.perf_counter() - t0) * 1e3))
        return out
