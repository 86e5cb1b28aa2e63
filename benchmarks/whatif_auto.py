"""auto, the default draft source, against the best fixed (drafter, K) chosen without
hindsight and against the oracle, in whatif's simulation (issue 32).

For each prompt the plain greedy text is generated once and the draft model teacher-forced
over it (whatif_controller.transcripts; --cache keeps them). Then, per profile: every fixed
(drafter, K) of lookup, suffix, chain and the draft model, K = 1..32 and plain (K = 0);
auto with adaptive K (the engine's own choose_source and controller); the fixed
(drafter, K) cross-validated (specdash/tuning/whatif/crossval.py: picked on one half of the text,
scored on the other, both ways) and the oracle (the best on the whole text). Target:
auto >= 1.0x the cross-validated pick on most (prompt, profile). Every run is timed with its
draft model's prompt feed (whatif's tokens_per_s_with_feed): a fixed draft model is fed the
prompt in the prefill, auto inside decoding and only when it uses the model; the column
"decoding only" leaves the fixed drafters' feed out, as decoding's tok/s does. For each one below, the
line under the table says where auto's steps went (steps by source, and the tok/s the
picked fixed drafter made on the same text) to read the why from.

    python benchmarks/whatif_auto.py --threads 2 --cache /tmp/wa128.pkl --profiles here,epyc-32b
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

from specdash.engine.controller import CostModelController
from specdash.engine.settings import EngineSettings
from specdash.tuning.prompts import BUILTIN
from specdash.tuning.whatif.crossval import pick, split
from specdash.tuning.whatif.measure import measure_profile
from specdash.costs.profile import load_profile, save_profile
from specdash.tuning.whatif.report import Report as WhatifReport
from specdash.tuning.whatif.report import sources
from specdash.tuning.whatif.simulate import sweep
from whatif_accuracy import Report  # benchmarks/ is sys.path[0] when this runs
from whatif_controller import texts, transcripts

ROOT = Path(__file__).resolve().parent.parent
PROMPT_FILES = sorted((ROOT / "benchmarks" / "prompts").glob("*.txt"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    prompts = texts()
    prompts.update({p.stem: p.read_text(encoding="utf-8") for p in PROMPT_FILES})
    ap.add_argument("--prompts", default=",".join(prompts))
    ap.add_argument("--profiles", default="here,epyc-32b",
                    help="here (this machine, measured once and kept beside --cache), shipped names or TOML files")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k-max", type=int, help="auto's k_max (default: the engine's)")
    ap.add_argument("--cache", help="a pickle of the generated texts (whatif_controller.py's format)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "whatif-auto.txt"))
    args = ap.parse_args(argv)
    base = EngineSettings(target=args.target, draft=args.draft, threads=args.threads, ctx=2048,
                          max_tokens=args.tokens)
    if args.k_max is not None:
        base = dataclasses.replace(base, k_max=args.k_max)
    names = args.prompts.split(",")
    profiles = []
    for spec in args.profiles.split(","):
        if spec != "here":
            profiles.append(load_profile(spec))
            continue
        kept = Path(args.cache + f".here-{args.threads}t.toml") if args.cache else None
        if kept is not None and kept.exists():
            profiles.append(load_profile(str(kept)))
        else:
            here = measure_profile(base, BUILTIN[0].text, print)
            if kept is not None:
                save_profile(here, str(kept))
            profiles.append(here)
    trs = transcripts(names, prompts, base, args.draft, args.cache)
    say = Report()
    say("$ PYTHONPATH=. python benchmarks/whatif_auto.py " + " ".join(sys.argv[1:] if argv is None else argv))
    say(f"# auto vs fixed (drafter, K) in whatif: {args.target} + {args.draft}, {args.tokens} tokens, "
        f"{args.threads} threads, fixed K=1..32 and plain, auto adaptive k_max={base.k_max}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}")
    say("| prompt | profile | auto tok/s | auto x plain | best fixed without hindsight (cross-validated) "
        "| its tok/s | auto / it | oracle | auto / oracle | auto's steps by source "
        "| auto's model prompt feed, ms | auto / it, decoding only |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in names:
        tr = trs[name]
        for profile in profiles:
            plain, fixed, adaptive = sweep(tr, ["auto", "lookup", "suffix", "chain", args.draft], list(range(1, 33)),
                                           profile, base,
                                           lambda: CostModelController(k_min=base.k_min, k_max=base.k_max,
                                                                       k_init=base.k))
            halves = split(tr, profile, base, [plain, *fixed])
            report = WhatifReport(tr, profile, plain, fixed, adaptive, pick(halves))
            auto, cv, best = report.auto, report.crossval, report.best_with_feed
            assert auto is not None and cv is not None
            ratios = report.auto_ratios() or {}
            oracle = "plain" if best is plain else f"{best.drafter} K={best.k}"
            by = ", ".join(f"{s} {n}" for s, n in sources(auto).items())
            # auto feeds its model the prompt the first step it drafts, inside decoding.
            feed = profile.feed_ms(len(tr.prompt) - 1) if "draft" in sources(auto) else 0.0
            # The old measure: decoding's tok/s on both sides (the fixed drafters' prompt
            # feed left out, auto's in). The cross-validated pick re-scored that way.
            decoding = auto.tokens_per_s / pick(halves, feed=False).tokens_per_s
            say(f"| {name} | {profile.name} | {auto.tokens_per_s_with_feed:.2f} "
                f"| {auto.tokens_per_s_with_feed / plain.tokens_per_s:.2f} "
                f"| {cv.describe()} | {cv.tokens_per_s:.2f} | {ratios['vs_cross_validated']:.3f} | {oracle} "
                f"| {ratios['vs_oracle']:.3f} | {by} | {feed:.0f} | {decoding:.3f} |")
            rows.append((name, profile.name, ratios["vs_cross_validated"], ratios["vs_oracle"], report, decoding))
    say("")
    cvs = [r[2] for r in rows]
    say(f"auto / cross-validated fixed (drafter, K): {sum(r >= 1.0 for r in cvs)}/{len(cvs)} at >= 1.0x, "
        f"median {statistics.median(cvs):.3f}, min {min(cvs):.3f}")
    fair = [r[5] for r in rows]
    say(f"the same by decoding's tok/s only (the fixed drafters' prompt feed left out): {sum(r >= 1.0 for r in fair)}/"
        f"{len(fair)} at >= 1.0x, median {statistics.median(fair):.3f}, min {min(fair):.3f}")
    say(f"auto / oracle: median {statistics.median(r[3] for r in rows):.3f}, min {min(r[3] for r in rows):.3f}")
    say("")
    say("Below 1.0x: where auto's steps went, and the fixed drafters' best on the same text")
    for name, pname, ratio, _, rep, _ in rows:
        if ratio >= 1.0:
            continue
        run = rep.auto
        assert run is not None
        per = {d: max((r for r in rep.fixed if r.drafter == d), key=lambda r: r.tokens_per_s_with_feed)
               for d in rep.drafters()}
        tops = ", ".join(f"{d} K={r.k} {r.tokens_per_s_with_feed:.2f}" for d, r in per.items())
        singles = ", ".join(f"{r.drafter} {r.tokens_per_s_with_feed:.2f}" for r in rep.adaptive if r.drafter != "auto")
        say(f"- {name} on {pname} ({ratio:.3f}): auto drafted {run.drafted} accepted {run.accepted} in "
            f"{run.steps} steps ({', '.join(f'{s} {n}' for s, n in sources(run).items())}); "
            f"best fixed per drafter: {tops}; adaptive single drafters: {singles}")
    say.write(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
