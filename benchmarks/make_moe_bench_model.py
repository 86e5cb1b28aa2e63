"""Write a MoE GGUF big enough that expert compute dominates a decode step, for
`specdash bench --experts 1,2,4,8`.

The tests' tiny MoE (tests/moe_fixture.py) spends most of a token on the 49k-row output
projection, so its tok/s barely moves with the expert count. This one has the same
layout and tokenizer (SmolLM2's) but wide experts and more layers: one active expert
costs about as much per token as the output projection, eight cost eight times that.
The weights are random, so the text is noise; only the speed is meaningful.

    python benchmarks/make_moe_bench_model.py OUT.gguf [--experts 8] [--used 2]
        [--embd 512] [--ff 2048] [--layers 8]
    specdash bench --target OUT.gguf --draft none --drafters lookup --experts 1,2,4,8 \\
        --k 0,2 --raw --threads 2
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "moe_fixture.py"


def _load_fixture():
    # The writer lives with the tests; import it by path (tests/ is not a package).
    spec = importlib.util.spec_from_file_location("moe_fixture", FIXTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="GGUF file to write")
    p.add_argument("--experts", type=int, default=8, help="expert_count (default 8)")
    p.add_argument("--used", type=int, default=2, help="expert_used_count in the file (default 2)")
    p.add_argument("--embd", type=int, default=512, help="n_embd, a multiple of 32 (default 512)")
    p.add_argument("--ff", type=int, default=2048, help="expert n_ff, a multiple of 32 (default 2048)")
    p.add_argument("--layers", type=int, default=8, help="n_layer (default 8)")
    args = p.parse_args(argv)
    fixture = _load_fixture()
    try:
        path = fixture.make_tiny_moe(
            args.out, n_expert=args.experts, n_expert_used=args.used,
            n_layer=args.layers, n_embd=args.embd, n_ff=args.ff, n_head=8, n_head_kv=4,
        )
    except ValueError as exc:
        print(f"make_moe_bench_model: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB): {args.experts} experts, "
          f"{args.used} used by default, n_embd {args.embd}, n_ff {args.ff}, {args.layers} layers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
