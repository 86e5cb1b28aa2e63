#!/usr/bin/env python
"""Would prefilling several requests' prompts in one batch (as llama-server does) beat
prefilling them one after another? Per-token prefill cost by chunk size, and four prompts
both ways, on one context with four sequences.

    python benchmarks/experiments/prefill_one_batch.py [--target qwen2.5-coder-1.5b] [--rounds 2]

Issue 41's second stop: on a 2-core AMD EPYC (Zen 4, AVX-512) the default target's prefill
cost 9.0-12.4 ms per token from 32 to 512 tokens, and 65/120/250/400-token prompts took the
same in one batch as one after another (8675/8479/8495 ms against 8426/8491/8832): not built.
"""

from __future__ import annotations

import argparse
import time

from specdash.engine.llm import LLM
from specdash.models.registry import model_path

SIZES = (65, 120, 250, 400)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    llm = LLM(model_path(args.target), n_ctx=4096, n_threads=args.threads, n_seq=len(SIZES), n_batch=1024)
    toks = llm.tokenize("def f(x):\n    return x * 2\n" * 200)
    for n in (32, 64, 128, 256, 512):
        best = float("inf")
        for _ in range(3):
            llm.kv_truncate(0, 0)
            t0 = time.perf_counter()
            llm.prefill(toks[:n], 0, 0)
            best = min(best, (time.perf_counter() - t0) * 1e3)
        print(f"prefill {n:4d} tokens: {best / n:.2f} ms per token (fastest of 3)")
    for rnd in range(args.rounds):
        for seq in range(len(SIZES)):
            llm.kv_truncate(0, seq)
        t0 = time.perf_counter()
        for seq, n in enumerate(SIZES):
            llm.prefill(toks[:n], 0, seq)
        apart = (time.perf_counter() - t0) * 1e3
        for seq in range(len(SIZES)):
            llm.kv_truncate(0, seq)
        t0 = time.perf_counter()
        # No logits: a prefill asks for none (all rows would add the output layer over 835 rows).
        llm._decode([(seq, toks[:n], 0) for seq, n in enumerate(SIZES)], False, False)
        together = (time.perf_counter() - t0) * 1e3
        print(f"round {rnd + 1}: prompts of {'/'.join(map(str, SIZES))} tokens one after another {apart:.0f} ms, "
              f"in one batch {together:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
