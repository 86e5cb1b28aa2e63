"""How much could ANY model-free drafter gain on this machine? An upper bound.

1. Decode each built-in prompt greedily with the target (plain, one token per step):
   the text every exact speculative run must reproduce.
2. Measure what a target batch of n tokens costs here, relative to one token.
3. At every position, ask prompt lookup (min n-gram 1, up to 32 tokens) what it would
   copy and how many of those tokens the target would accept. Then an oracle that knows
   the future picks, by dynamic programming, the draft length at every step (0 included)
   that minimises total cost. No real controller can beat it: it is the ceiling for
   copying drafters (lookup, suffix within one prompt) with this target on this CPU.

    python benchmarks/copy_ceiling.py [--target M] [--tokens 128] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from specdash.engine.drafters.lookup import PromptLookupDrafter
from specdash.engine.llm import LLM
from specdash.engine.settings import SamplingParams
from specdash.models.resolve import resolve_model
from specdash.prompts import BUILTIN

SIZES = [1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 33]


def greedy(llm: LLM, prompt: list[int], n: int) -> list[int]:
    llm.clear()
    llm.prefill(prompt[:-1])
    out, cur, pos = [], prompt[-1], len(prompt) - 1
    for _ in range(n):
        cur = int(np.argmax(llm.decode([cur], pos, "last")[0]))
        pos += 1
        if llm.is_eog(cur):
            break
        out.append(cur)
    return out


def batch_costs(llm: LLM, context: list[int], rounds: int = 5) -> dict[int, float]:
    """Median ms of one batch of n tokens after `context`, per n (rolled back each time)."""
    llm.clear()
    llm.prefill(context)
    ms: dict[int, list[float]] = {n: [] for n in SIZES}
    for _ in range(rounds):
        for n in SIZES:  # interleaved, so a noisy moment hits every size alike
            t = time.perf_counter()
            llm.decode(context[-n:], len(context), "all")
            ms[n].append((time.perf_counter() - t) * 1e3)
            llm.kv_truncate(len(context))
    return {n: statistics.median(v) for n, v in ms.items()}


def oracle_speedup(prompt: list[int], gen: list[int], cost) -> tuple[float, float]:
    """(best possible speedup over plain, share of positions where lookup's first token
    is right)."""
    lookup, seq, accepted = PromptLookupDrafter(1, 4), list(prompt), []
    lookup.prefill(seq)
    for i in range(len(gen)):
        draft = lookup.propose(seq, 32, SamplingParams(), None).tokens
        a = 0
        while a < len(draft) and i + a < len(gen) and draft[a] == gen[i + a]:
            a += 1
        accepted.append(a)
        seq.append(gen[i])
    n = len(gen)
    best = [0.0] * (n + 1)  # best[i]: least cost to produce gen[i:]
    for i in range(n - 1, -1, -1):
        best[i] = min(cost(j + 1) + best[min(n, i + j + 1)] for j in range(accepted[i] + 1))
    return n * cost(1) / best[0], sum(a > 0 for a in accepted) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    llm = LLM(resolve_model(args.target), n_ctx=4096, n_threads=args.threads)
    prompts = {p.name: llm.tokenize(llm.chat_prompt(p.text)) for p in BUILTIN}
    outputs = {name: greedy(llm, toks, args.tokens) for name, toks in prompts.items()}
    costs = batch_costs(llm, prompts["code-edit"])
    unit = costs[1]
    print("target batch cost, relative to one token:")
    print("  " + "  ".join(f"n={n}: {costs[n] / unit:.2f}x" for n in SIZES))

    def cost(n: int) -> float:
        return float(np.interp(n, SIZES, [costs[s] for s in SIZES]))

    print(f"\nceiling for copying drafters ({args.tokens} tokens, future known):")
    for name, gen in outputs.items():
        speedup, copyable = oracle_speedup(prompts[name], gen, cost)
        print(f"  {name:16s} {speedup:.2f}x plain   (lookup's first token right at {copyable:.0%} of positions)")


if __name__ == "__main__":
    main()
