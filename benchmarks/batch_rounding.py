"""How much does a batch of 5 round differently from a batch of 1 on this CPU?

Decodes greedy continuations of the built-in prompts one token per pass, then re-decodes
the same tokens in batches of 5, and prints how far the top logit and the top-two gap
move. This sets the tests' near-tie threshold (tests/test_engine_exact.py TIE_GAP).

    python benchmarks/batch_rounding.py [--model qwen2.5-coder-1.5b] [--tokens 40]
"""

from __future__ import annotations

import argparse

import numpy as np

from specdash.engine.llm import LLM
from specdash.models.resolve import resolve_model
from specdash.tuning.prompts import BUILTIN


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--batch", type=int, default=5)
    args = ap.parse_args()
    m = LLM(resolve_model(args.model), n_ctx=2048, n_threads=2)
    d_top, d_gap = [], []
    for p in BUILTIN:
        toks = m.tokenize(m.chat_prompt(p.text))
        m.clear()
        m.prefill(toks[:-1])
        last, pos, gen, single = toks[-1], len(toks) - 1, [], []
        for _ in range(args.tokens):
            row = m.decode([last], pos, logits="last")[0].copy()
            single.append(row)
            last = int(row.argmax())
            gen.append(last)
            pos += 1
        m.clear()
        m.prefill(toks[:-1])
        seq, pos, batched = [toks[-1], *gen], len(toks) - 1, []
        for i in range(0, args.tokens, args.batch):
            batched.extend(m.decode(seq[i : i + args.batch], pos + i, logits="all").copy())
        for a, b in zip(single, batched):
            i = int(a.argmax())
            sa, sb = np.sort(a)[-2], np.sort(b)[-2]
            d_top.append(abs(a[i] - b[i]))
            d_gap.append(abs((a[i] - sa) - (b[i] - sb)))
    for name, d in (("top logit", d_top), ("top-two gap", d_gap)):
        d = np.array(d)
        print(f"{name} moved by: median {np.median(d):.4f}, p95 {np.percentile(d, 95):.4f}, "
              f"max {d.max():.4f} over {len(d)} positions (batch {args.batch} vs 1)")


if __name__ == "__main__":
    main()
