"""What a target batch costs by its shape: tokens and sequences.

A one-sequence batch of n tokens is the adaptive controller's curve (engine/target_costs.py,
kept between runs). A batch of several sequences costs about what one sequence's batch of
as many tokens costs on the machines measured (benchmarks/results/batch-costs-seqs.txt:
2 x 1 = 1.04x, 4 x 1 = 0.99x the one-sequence batch of 2 and 4 tokens at 200 rows), but
attention reads each sequence's own rows, so the ratio is learned per sequence count from
the batches run, and a shape run before is priced by its own moving average.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from specdash.engine.llm import LLM
from specdash.engine.target_costs import Ema

# A batch that cost this many times its estimate is clipped (another process stole the CPU).
_CLIP = 3.0
_BETA = 0.2  # weight of a new sample: a load change is followed within a few steps


class BatchCosts:
    def __init__(self, one_sequence: Callable[[int], float | None]):
        """one_sequence(n): ms of one sequence's batch of n tokens, None until measured."""
        self._one = one_sequence
        self._shape: dict[tuple[int, int], Ema] = {}
        self._ratio: dict[int, Ema] = {}  # sequences -> measured / one-sequence estimate

    def cost(self, tokens: int, seqs: int) -> float | None:
        """Estimated ms of a batch of `tokens` tokens over `seqs` sequences."""
        own = self._shape.get((tokens, seqs))
        if own is not None and own.count:
            # This shape ran before: its own moving average.
            return own.value
        one = self._one(tokens)
        if one is None:
            return None
        ratio = self._ratio.get(seqs)
        return one * (ratio.value if ratio is not None and ratio.count else 1.0)

    def observe(self, tokens: int, seqs: int, ms: float) -> None:
        one = self._one(tokens)
        self._shape.setdefault((tokens, seqs), Ema()).add(ms, _BETA, _CLIP)
        if one and seqs > 1:
            self._ratio.setdefault(seqs, Ema()).add(ms / one, _BETA, _CLIP)


# A width pays when each sequence's token costs at most this share of one sequence's
# alone: under it, batching is within noise of running requests one after another
# (benchmarks/results/batch-costs-seqs.txt: spreads of 10-15% between rounds).
PAYS = 0.9


def measure_widths(target: LLM, tokens: Sequence[int], widths: Sequence[int], rounds: int = 3) -> dict[int, float]:
    """ms of one plain step of N sequences at once (N x 1 token), for each N in `widths`,
    each sequence holding `tokens`' rows (a short warm-up prompt: a server's first turns are
    short); the fastest of `rounds`. The rows decoded are taken back after."""
    top = max(widths)
    for seq in range(top):
        target.prefill_seq(seq, tokens)
    n = len(tokens)
    out: dict[int, float] = {}
    for _ in range(rounds):
        for width in widths:
            t0 = time.perf_counter()
            target.decode_seqs([(seq, [tokens[-1]], n) for seq in range(width)])
            ms = (time.perf_counter() - t0) * 1e3
            out[width] = min(out.get(width, ms), ms)
            for seq in range(width):
                target.kv_truncate(n, seq)
    return out


def paying_width(ms: dict[int, float]) -> int:
    """The widest batch whose per-sequence cost pays (PAYS) against one sequence alone."""
    one = ms.get(1)
    if not one:
        return 1
    return max((w for w, v in ms.items() if v / w <= PAYS * one), default=1)
