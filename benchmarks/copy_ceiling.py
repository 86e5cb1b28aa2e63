"""How much could ANY model-free drafter gain on this machine? An upper bound.

1. Decode each built-in prompt greedily with the target (plain, one token per step):
   the text every exact speculative run must reproduce.
2. Measure what a target batch of n tokens costs here, relative to one token.
3. At every position, how many of the next tokens could be copied at all: the longest
   run of the coming text that already stands somewhere in the prompt or the output so
   far (the "any copy" column: no copying drafter can draft more), and, for comparison,
   how many of what specdash's prompt lookup proposes would be accepted. Then an oracle
   that knows the future picks, by dynamic programming, the draft length at every step
   (0 included) that minimises total cost. No real controller can beat it.

Earlier versions used lookup's proposals only, so their "ceiling" was the ceiling of
that drafter's matching rule, not of copying; and it ran the built-in prompts only.
`--prompt-file` (repeatable) adds your own: how copyable a prompt's answer is decides
everything here, so judge on the prompts you serve.

    python benchmarks/copy_ceiling.py [--target M] [--tokens 128] [--threads 2] [--prompt-file F ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from specdash.engine.drafters.lookup import PromptLookupDrafter
from specdash.engine.llm import LLM
from specdash.engine.settings import SamplingParams
from specdash.models.resolve import resolve_model
from specdash.tuning.prompts import BUILTIN

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


def longest_copy(seq: list[int], future: list[int], cap: int = 32) -> int:
    """How many tokens of `future` stand, in order, somewhere in `seq`."""
    best = 0
    first = future[0] if future else None
    for start, tok in enumerate(seq):
        if tok != first:
            continue
        n = 0
        while n < cap and n < len(future) and start + n < len(seq) and seq[start + n] == future[n]:
            n += 1
        best = max(best, n)
    return best


def plan(accepted: list[int], cost) -> float:
    """Least total cost of producing the text when step i may verify up to accepted[i]."""
    n = len(accepted)
    best = [0.0] * (n + 1)  # best[i]: least cost to produce gen[i:]
    for i in range(n - 1, -1, -1):
        best[i] = min(cost(j + 1) + best[min(n, i + j + 1)] for j in range(accepted[i] + 1))
    return best[0]


def oracle_speedup(prompt: list[int], gen: list[int], cost) -> tuple[float, float, float]:
    """(best speedup over plain for any copy, for lookup's proposals, share of positions
    where something can be copied)."""
    lookup, seq = PromptLookupDrafter(), list(prompt)
    lookup.prefill(seq)
    any_copy, by_lookup = [], []
    for i in range(len(gen)):
        draft = lookup.propose(seq, 32, SamplingParams(), None).tokens
        a = 0
        while a < len(draft) and i + a < len(gen) and draft[a] == gen[i + a]:
            a += 1
        by_lookup.append(a)
        any_copy.append(max(a, longest_copy(seq, gen[i:])))
        seq.append(gen[i])
    n = len(gen)
    plain = n * cost(1)
    return plain / plan(any_copy, cost), plain / plan(by_lookup, cost), sum(a > 0 for a in any_copy) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-file", action="append", default=[], metavar="FILE", help="also these prompts")
    args = ap.parse_args()
    llm = LLM(resolve_model(args.target), n_ctx=4096, n_threads=args.threads)
    texts = {p.name: p.text for p in BUILTIN}
    texts.update({Path(f).stem: Path(f).read_text(encoding="utf-8") for f in args.prompt_file})
    prompts = {name: llm.tokenize(llm.chat_prompt(text)) for name, text in texts.items()}
    outputs = {name: greedy(llm, toks, args.tokens) for name, toks in prompts.items()}
    costs = batch_costs(llm, prompts["code-edit"])
    unit = costs[1]
    print("target batch cost, relative to one token:")
    print("  " + "  ".join(f"n={n}: {costs[n] / unit:.2f}x" for n in SIZES))

    def cost(n: int) -> float:
        return float(np.interp(n, SIZES, [costs[s] for s in SIZES]))

    print(f"\nceiling for copying drafters ({args.tokens} tokens, future known):")
    print(f"  {'prompt':22s} {'any copy':>9s} {'lookup':>8s}  copyable positions")
    for name, gen in outputs.items():
        ceiling, lookup, copyable = oracle_speedup(prompts[name], gen, cost)
        print(f"  {name:22s} {ceiling:8.2f}x {lookup:7.2f}x  {copyable:.0%}")


if __name__ == "__main__":
    main()
