#!/usr/bin/env python
"""The target's verify cost per batch size, every size from 1 to --max: is the curve
smooth between the sizes adaptive K calibrates (step_rules.COST_SIZES), or does it dip?

llama.cpp's repacked CPU kernels (CPU_REPACK: Q4_0 as 4x4/4x8/8x8 blocks) multiply four or
eight activation rows at a time and leave the rest to a row-by-row path, so a batch of 4
can cost less than a batch of 3. Rounds alternate the sizes' order; each size's figure is
the median of its rounds, as a ratio to one token in the same round.

    python benchmarks/batch_costs.py --model qwen2.5-coder-1.5b --threads 2 --rounds 5 --max 33
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from specdash.engine.llm import LLM
from specdash.models.resolve import resolve_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max", type=int, default=33)
    ap.add_argument("--n-past", type=int, default=200, help="tokens in the cache before each batch")
    args = ap.parse_args(argv)
    llm = LLM(resolve_model(args.model), n_ctx=1024, n_threads=args.threads)
    prompt = llm.tokenize("def fibonacci(n):\n    " * 40)[: args.n_past + 1]
    llm.prefill_prompt(prompt[:-1])
    n_past = len(prompt) - 1
    sizes = list(range(1, args.max + 1))
    ratios: dict[int, list[float]] = {n: [] for n in sizes}
    ms: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(args.rounds):
        order = sizes if r % 2 == 0 else sizes[::-1]
        got = {}
        for n in order:
            junk = (prompt * n)[-n:]
            t = time.perf_counter()
            llm.decode(junk, n_past, logits="all")
            got[n] = (time.perf_counter() - t) * 1e3
            llm.kv_truncate(n_past)
        for n in sizes:
            ratios[n].append(got[n] / got[1])
            ms[n].append(got[n])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"$ python benchmarks/batch_costs.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"# {args.model}, {args.threads} threads, {args.rounds} rounds, n_past {n_past}, repack {llm.repack.mode}")
    print("| batch | ms (median) | vs 1 token (median, min-max) | ms per token |")
    print("|---|---|---|---|")
    for n in sizes:
        rs = ratios[n]
        print(f"| {n} | {statistics.median(ms[n]):.1f} | {statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f}) "
              f"| {statistics.median(ms[n]) / n:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
