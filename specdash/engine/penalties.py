"""Repetition penalties as llama.cpp's penalties sampler applies them (`llama_sampler_init_
penalties`, src/llama-sampling.cpp): over the last `last_n` tokens of the context, a token
seen there has its logit divided by `repeat` when positive and multiplied by it when
negative, then lowered by `frequency` times its count and by `presence` once.

Under speculation each verify row is penalized by its own context: the committed tokens and
the draft tokens before that row, so the verify rule keeps the penalized distribution exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Penalties:
    repeat: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    last_n: int = 64  # llama.cpp's penalty_last_n default

    @property
    def active(self) -> bool:
        return self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0


def penalized(rows: np.ndarray, context: Sequence[int], draft: Sequence[int], p: Penalties | None) -> np.ndarray:
    """`rows` (1 + len(draft), n_vocab) penalized: row i by the window ending at `context`
    followed by the draft's first i tokens. A copy; the same rows when `p` does nothing."""
    if p is None or not p.active:
        return rows
    out = np.array(rows, dtype=np.float32)
    full = [*context, *draft]
    for i in range(out.shape[0]):
        end = len(context) + i
        window = full[max(0, end - p.last_n):end]
        if not window:
            continue
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        row = out[i]
        seen = row[ids]
        seen = np.where(seen > 0, seen / p.repeat, seen * p.repeat)
        row[ids] = seen - counts * p.frequency - p.presence
    return out
