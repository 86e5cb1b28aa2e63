#!/usr/bin/env python
"""The target's verify cost per batch size, every size from 1 to --max: is the curve
smooth between the sizes adaptive K calibrates (step_rules.COST_SIZES), or does it dip?

llama.cpp's repacked CPU kernels (CPU_REPACK: Q4_0 as 4x4/4x8/8x8 blocks) multiply four or
eight activation rows at a time and leave the rest to a row-by-row path, so a batch of 4
can cost less than a batch of 3. Rounds alternate the sizes' order; each size's figure is
the median of its rounds, as a ratio to one token in the same round.

    python benchmarks/batch_costs.py --model qwen2.5-coder-1.5b --threads 2 --rounds 5 --max 33

--seqs 1,2,4 measures batches of several sequences instead (issue 41: does one target batch
for several clients pay on this machine?): S sequences, each with its own --n-past rows in
the KV cache (a context of its own text), decoding T tokens each in one batch (--tokens,
e.g. 1 for plain decoding, 5 for a K=4 verify), and mixed batches (one sequence verifying
K+1 beside others decoding one). Each figure is a ratio to one sequence decoding one token
in the same round, and to running the same sequences one after another.

    python benchmarks/batch_costs.py --seqs 1,2,4 --tokens 1,2,5 --n-past 200,1500 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from specdash.engine.llm import LLM
from specdash.models.resolve import resolve_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max", type=int, default=33)
    ap.add_argument("--n-past", default="200", help="tokens in the cache before each batch (with --seqs, "
                    "comma-separated: each length in turn)")
    ap.add_argument("--seqs", help="comma-separated sequence counts: measure multi-sequence batches")
    ap.add_argument("--tokens", default="1,2,5", help="with --seqs: tokens per sequence in a batch")
    args = ap.parse_args(argv)
    if args.seqs:
        return several_sequences(args, argv)
    llm = LLM(resolve_model(args.model), n_ctx=1024, n_threads=args.threads)
    prompt = llm.tokenize("def fibonacci(n):\n    " * 40)[: int(args.n_past) + 1]
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


def several_sequences(args: argparse.Namespace, argv: list[str] | None) -> int:
    """S sequences x T tokens in one llama_decode, each sequence at its own KV length."""
    import llama_cpp as ll

    seqs = sorted({int(x) for x in args.seqs.split(",")})
    per_seq = sorted({int(x) for x in args.tokens.split(",")})
    n_pasts = [int(x) for x in str(args.n_past).split(",")]
    s_max = max(seqs)
    llm = LLM(resolve_model(args.model), n_ctx=256, n_threads=args.threads)  # the weights (repacked once)
    per_seq_ctx = -(-(max(n_pasts) + max(per_seq) * 2 + 64) // 256) * 256
    cp = ll.llama_context_default_params()
    cp.n_ctx = s_max * per_seq_ctx
    cp.n_batch = cp.n_ubatch = 512
    cp.n_seq_max = s_max
    cp.n_threads = cp.n_threads_batch = args.threads
    ctx = ll.llama_init_from_model(llm.model, cp)
    if not ctx:
        raise SystemExit("could not create a context with n_seq_max sequences")
    mem = ll.llama_get_memory(ctx)
    batch: Any = ll.llama_batch_init(512, 0, 1)
    texts = ["def fibonacci(n):\n    ", "The quarterly report shows ", "SELECT name, total FROM orders ",
             "Once upon a time, in a valley ", "import numpy as np\nx = ", "Dear team, following the outage "]

    def decode(items: list[tuple[int, int, int]], logits: bool = True) -> None:
        batch.n_tokens = len(items)
        for i, (seq, pos, tok) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, logits
            batch.seq_id[i][0] = seq
        if ll.llama_decode(ctx, batch) != 0:
            raise SystemExit(f"llama_decode failed on a batch of {len(items)}")

    # Batches: S x T (every sequence T tokens), and mixed: one verifying 5 beside S-1 decoding 1.
    shapes: list[tuple[str, list[int]]] = [(f"{s} x {t}", [t] * s) for s in seqs for t in per_seq]
    shapes += [(f"5 + {s - 1} x 1", [5] + [1] * (s - 1)) for s in seqs if s > 1]
    rows: list[str] = []
    for n_past in n_pasts:
        for seq in range(s_max):  # each sequence its own context, n_past rows long
            ll.llama_memory_seq_rm(mem, seq, 0, -1)
            toks = (llm.tokenize(texts[seq % len(texts)] * 400))[:n_past]
            for i in range(0, n_past, 512):
                decode([(seq, i + j, t) for j, t in enumerate(toks[i:i + 512])], logits=False)
        names = ["1 x 1"] + [name for name, _ in shapes if name != "1 x 1"]
        layout = dict(shapes)
        layout["1 x 1"] = [1]
        ms: dict[str, list[float]] = {n: [] for n in names}
        ratio: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            got: dict[str, float] = {}
            for name in order:
                items = [(seq, n_past + j, 100 + 7 * seq + j) for seq, t in enumerate(layout[name]) for j in range(t)]
                t0 = time.perf_counter()
                decode(items)
                got[name] = (time.perf_counter() - t0) * 1e3
                for seq in range(len(layout[name])):
                    ll.llama_memory_seq_rm(mem, seq, n_past, -1)
            for name in names:
                ms[name].append(got[name])
                ratio[name].append(got[name] / got["1 x 1"])
            print(f"n_past {n_past}: round {r + 1}/{args.rounds} done", file=sys.stderr)
        one = {t: statistics.median(ms[f"1 x {t}"]) for t in per_seq if f"1 x {t}" in ms}
        for name in names:
            parts = layout[name]
            alone = sum(one.get(t, float("nan")) for t in parts)  # the same sequences one after another
            m = statistics.median(ms[name])
            rs = ratio[name]
            rows.append(f"| {n_past} | {name} | {sum(parts)} | {m:.1f} | {statistics.median(rs):.2f} "
                        f"({min(rs):.2f}-{max(rs):.2f}) | {m / alone:.2f} |")
    print(f"$ python benchmarks/batch_costs.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"# {args.model}, {args.threads} threads, {args.rounds} rounds, repack {llm.repack.mode}; "
          "S x T = S sequences, T tokens each, in one batch")
    print("| n_past | batch | tokens | ms (median) | vs 1 token (median, min-max) | vs the sequences one after another |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    ll.llama_batch_free(batch)
    ll.llama_free(ctx)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
