"""What masking a verify batch under a JSON schema costs per row, on a target's vocabulary:
llguidance (what specdash uses, engine/grammar.py) against llama.cpp's grammar sampler
through llama-cpp-python (`llama_sampler_init_grammar` on the GBNF of the same schema).

Both walk the same answer token by token. llguidance: the masks of a verify batch of 1+K
rows in one call given the K draft tokens (what a speculative step asks), and one row
alone. llama.cpp: one row is one `llama_sampler_apply` over the whole vocabulary (it has
no draft form: K+1 rows cost K+1 applies, with a clone per row to look ahead).

    python benchmarks/grammar_mask_cost.py [--model qwen2.5-coder-1.5b] [--k 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "tags"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "city": {"enum": ["London", "Paris", "Rome"]},
                         "tags": {"type": "array", "items": {"type": "string"}}}}
ANSWER = '{"name": "Ada Lovelace", "age": 36, "city": "London", "tags": ["mathematics", "engines", "poetry"]}'


def llguidance_costs(vocab, tokens: list[int], k: int) -> tuple[list[float], list[float]]:
    from specdash.engine.grammar import Grammars

    grammars = Grammars(vocab.vocab, vocab.n_vocab)
    compiled = grammars.json_schema(SCHEMA, "schema")
    one, batch = [], []
    g = compiled.start()
    rows = np.zeros((1, vocab.n_vocab), dtype=np.float32)
    wide = np.zeros((k + 1, vocab.n_vocab), dtype=np.float32)
    for i, tok in enumerate(tokens):
        t0 = time.perf_counter()
        g.mask(rows, [])
        one.append((time.perf_counter() - t0) * 1e3)
        draft = tokens[i:i + k]
        t0 = time.perf_counter()
        g.mask(wide[:1 + len(draft)], draft)
        batch.append((time.perf_counter() - t0) * 1e3 / (1 + len(draft)))
        g.accept([tok])
    return one, batch


def llamacpp_costs(vocab, tokens: list[int]) -> list[float]:
    import llama_cpp.llama_cpp as ll
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    gbnf = json_schema_to_gbnf(json.dumps(SCHEMA))
    sampler = ll.llama_sampler_init_grammar(vocab.vocab, gbnf.encode(), b"root")
    n = vocab.n_vocab
    data = (ll.llama_token_data * n)()
    out = []
    for tok in tokens:
        for j in range(n):
            data[j].id, data[j].logit, data[j].p = j, 0.0, 0.0
        arr = ll.llama_token_data_array(data=ctypes.cast(data, ctypes.POINTER(ll.llama_token_data)), size=n,
                                        selected=-1, sorted=False)
        t0 = time.perf_counter()
        ll.llama_sampler_apply(sampler, ctypes.byref(arr))
        out.append((time.perf_counter() - t0) * 1e3)
        ll.llama_sampler_accept(sampler, tok)
    ll.llama_sampler_free(sampler)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--k", type=int, default=8, help="draft tokens per verify batch (default 8)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from specdash.engine.llm import LLM
    from specdash.models.resolve import resolve_model

    vocab = LLM(resolve_model(args.model), vocab_only=True)
    tokens = vocab.tokenize(ANSWER, add_special=False)
    rows: dict[str, list[float]] = {"llguidance, one row": [], f"llguidance, per row of 1+{args.k}": [],
                                    "llama.cpp grammar sampler, one row": []}
    for _ in range(args.rounds):  # alternating, so drift hits both alike
        one, batch = llguidance_costs(vocab, tokens, args.k)
        rows["llguidance, one row"].append(statistics.median(one))
        rows[f"llguidance, per row of 1+{args.k}"].append(statistics.median(batch))
        rows["llama.cpp grammar sampler, one row"].append(statistics.median(llamacpp_costs(vocab, tokens)))
    print(f"{args.model}: {vocab.n_vocab} tokens, a {len(tokens)}-token answer, {args.rounds} rounds "
          "(median ms per masked row; median of rounds, min-max)")
    for name, values in rows.items():
        print(f"  {name:<40} {statistics.median(values):8.3f}  ({min(values):.3f}-{max(values):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
