"""llama.cpp's tools linked to the wheel's libraries against the static build of the same
source (issue 38): the same greedy text, and llama-bench's speeds within a few percent.

Build both first, each in its own cache (a cache holds one of the two):

    SPECDASH_CACHE=/tmp/static-cache SPECDASH_TOOLS_STATIC=1 python -m specdash.tuning.llamacpp_tools build
    python -m specdash.tuning.llamacpp_tools build            # linked, in the usual cache

then

    python benchmarks/tools_linked_vs_static.py --static /tmp/static-cache/llama.cpp/0.3.36/bin \
        --linked ~/.cache/specdash/llama.cpp/0.3.36/bin --rounds 6

Text: llama-completion, greedy, 64 tokens, on three prompts (two models). Speed:
llama-bench pp128 and tg128, the two builds alternating within each round (ABBA), the
ratio linked/static per round, its median and range. Nothing else may run meanwhile:
llama.cpp's threads spin-wait.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdash.engine.repack import tool_args  # noqa: E402
from specdash.models.resolve import resolve_model  # noqa: E402

PROMPTS = [
    ("qwen2.5-coder-1.5b", "def fibonacci(n):"),
    ("qwen2.5-coder-1.5b", "Write a Python function that checks whether a string is a palindrome."),
    ("smollm2-135m", "The quick brown fox"),
]


def completion(bin_dir: Path, model: Path, prompt: str) -> str:
    cmd = [str(bin_dir / "llama-completion"), *tool_args(), "-m", str(model), "-p", prompt, "-n", "64",
           "--temp", "0", "-no-cnv", "--no-warmup", "-t", "2", "--seed", "1", "--no-display-prompt"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout


def bench(bin_dir: Path, model: Path, test: str) -> float:
    """tok/s of llama-bench's pp128 or tg128, 3 repetitions."""
    n = ["-p", "128", "-n", "0"] if test == "pp128" else ["-p", "0", "-n", "128"]
    cmd = [str(bin_dir / "llama-bench"), *tool_args(), "-m", str(model), *n, "-r", "3", "-t", "2", "-o", "csv"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900).stdout
    row = list(csv.DictReader(io.StringIO(out)))[-1]
    return float(row["avg_ts"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static", type=Path, required=True, help="bin dir of the static build")
    ap.add_argument("--linked", type=Path, required=True, help="bin dir of the linked build")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="llama-bench's model (default the 1.5B target)")
    args = ap.parse_args()

    same = 0
    for name, prompt in PROMPTS:
        model = resolve_model(name)
        a, b = completion(args.static, model, prompt), completion(args.linked, model, prompt)
        same += a == b
        print(f"text {name} {prompt[:30]!r}: {'identical' if a == b else 'DIFFERENT'} ({len(a)} chars)", flush=True)
    print(f"greedy text identical on {same} of {len(PROMPTS)} prompts")

    model = resolve_model(args.model)
    for test in ("pp128", "tg128"):
        ratios, static, linked = [], [], []
        for r in range(args.rounds):
            order = ("static", "linked") if r % 2 == 0 else ("linked", "static")
            got = {side: bench(getattr(args, side), model, test) for side in order}
            static.append(got["static"])
            linked.append(got["linked"])
            ratios.append(got["linked"] / got["static"])
            print(f"  {test} round {r + 1}: static {got['static']:.1f}, linked {got['linked']:.1f} tok/s, "
                  f"{ratios[-1]:.3f}", flush=True)
        print(f"{test}: static median {statistics.median(static):.1f} tok/s, linked {statistics.median(linked):.1f}; "
              f"linked/static median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, "
              f"{args.rounds} ABBA rounds)")
    return 0 if same == len(PROMPTS) else 1


if __name__ == "__main__":
    sys.exit(main())
