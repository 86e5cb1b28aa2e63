#!/usr/bin/env python
"""The draft model's joint confidence cut in whatif: tok/s with draft_p_joint ÷ without,
at fixed K and adaptive, over the texts whatif_controller.py cached, on each profile.

    python benchmarks/whatif_controller.py --tokens 384 --cache /tmp/tr384.pkl   # once: the texts
    python benchmarks/experiments/whatif_joint_cut.py --cache /tmp/tr384.pkl --cuts 0.1,0.2 \
        --out benchmarks/results/draft-p-joint-whatif.txt

Acceptance is exact up to each draft's first wrong token, and the cut there is decided
from the same probabilities the real draft model sees (tests/test_whatif.py); past it, by
the draft model's own continuation when the texts were cached with a cut (--p-joint on
whatif_controller.py: transcript.off_text), else by the text's confidence standing in.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

from specdash.engine.controller import CostModelController
from specdash.engine.settings import EngineSettings
from specdash.contract.errors import SpecdashError
from specdash.costs.profile import BUILTIN as PROFILES
from specdash.costs.profile import load_profile
from specdash.tuning.whatif.simulate import make_drafter, simulate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", required=True, help="the texts: a --cache pickle of whatif_controller.py")
    ap.add_argument("--cuts", default="0.1", help="draft_p_joint values against 0 (default 0.1)")
    ap.add_argument("--ks", default="2,4,8,16,32")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    try:
        cuts = [float(x) for x in args.cuts.split(",")]
        ks = [int(x) for x in args.ks.split(",")]
        with open(args.cache, "rb") as f:
            texts = pickle.load(f)
        profiles = {name: load_profile(name) for name in args.profiles.split(",")}
    except (ValueError, OSError, pickle.UnpicklingError) as exc:
        print(f"whatif_joint_cut: {exc}", file=sys.stderr)
        return 2
    except SpecdashError as exc:  # a profile that does not load: its own one line
        print(exc, file=sys.stderr)
        return 2
    lines = [f"# draft_p_joint in whatif (benchmarks/experiments/whatif_joint_cut.py): {args.target} + {args.draft}, "
             f"{len(texts)} texts ({', '.join(texts)}), {time.strftime('%Y-%m-%d %H:%M')}",
             f"# command: python benchmarks/experiments/whatif_joint_cut.py {' '.join(sys.argv[1:])}",
             "# tok/s with the cut ÷ without, same text, same K: geometric mean over the texts (min-max);",
             "# adaptive: the engine's controller, k_max 32 (whatif_controller.py's)", ""]
    def tok_s(name: str, pn: str, k: int, joint: float) -> float:
        tr, profile = texts[name], profiles[pn]
        s = EngineSettings(target=args.target, draft=args.draft, threads=1, ctx=2048,
                           max_tokens=tr.max_tokens, k_max=32, draft_p_joint=joint)
        kw = {"k": k} if k else {"controller": CostModelController(k_min=0, k_max=32, k_init=4)}
        return simulate(tr, make_drafter(args.draft, tr, profile, s), profile, s, name="model", **kw).tokens_per_s

    uncut: dict[tuple[str, str, int], float] = {}  # the no-cut side, shared by every cut value
    for cut in cuts:
        for pn in profiles:
            cells = []
            for k in [*ks, 0]:
                ratios = []
                for name in texts:
                    if (name, pn, k) not in uncut:
                        uncut[name, pn, k] = tok_s(name, pn, k, 0.0)
                    ratios.append(tok_s(name, pn, k, cut) / uncut[name, pn, k])
                cells.append(f"{'K=' + str(k) if k else 'adaptive'} {statistics.geometric_mean(ratios):.3f} "
                             f"({min(ratios):.3f}-{max(ratios):.3f})")
            lines.append(f"p_joint {cut:g} {pn:<9} " + " | ".join(cells))
            print(lines[-1], file=sys.stderr, flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
