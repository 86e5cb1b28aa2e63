"""The repack probe's child: `python -m specdash.engine.repack_child MODE MODEL`.

Loads MODEL with weight repacking MODE and decodes what the engine does: a prompt batch
of 8 tokens, a verify batch of 5, one token. Exits 0 when every decode returned finite
logits, 3 when llama.cpp refused something; a crash shows as the signal that killed it.
"""

from __future__ import annotations

import sys

import numpy as np


def main(argv: list[str]) -> int:
    mode, path = argv
    import llama_cpp as ll

    from specdash.engine.repack import ModelParams, Verdict

    ll.llama_backend_init()
    mparams = ll.llama_model_default_params()
    keep = ModelParams(mparams, path, Verdict(mode, mode, "setting"))
    model = ll.llama_model_load_from_file(path.encode(), mparams)
    del keep
    if not model:
        print(f"llama.cpp could not load {path} with repack {mode}", file=sys.stderr)
        return 3
    cparams = ll.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 256, 64, 64
    cparams.n_threads = cparams.n_threads_batch = 2
    ctx = ll.llama_init_from_model(model, cparams)
    if not ctx:
        print("llama.cpp could not create a context", file=sys.stderr)
        return 3
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    batch = ll.llama_batch_init(64, 0, 1)
    pos = 0
    for n in (8, 5, 1):
        batch.n_tokens = n
        for i in range(n):
            batch.token[i] = (pos * 31 + 7) % n_vocab
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
            pos += 1
        if ll.llama_decode(ctx, batch) != 0:
            print(f"llama_decode failed on a batch of {n}", file=sys.stderr)
            return 3
        logits = np.ctypeslib.as_array(ll.llama_get_logits(ctx), shape=(n, n_vocab))
        if not np.isfinite(logits).all():
            print(f"non-finite logits from a batch of {n}", file=sys.stderr)
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
