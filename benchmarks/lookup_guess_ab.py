#!/usr/bin/env python
"""Prompt lookup with and without its one-token guess, paired round by round.

    python benchmarks/lookup_guess_ab.py --ks 4,16 --rounds 3 --tokens 96 \
        --out benchmarks/results/lookup-one-gram-guess.txt

The lookup drafter drafts from n-grams of lookup_min_ngram (2) up; one size shorter (a
1-gram) may add one last token and end the draft (engine/drafters/lookup.py). The "no
guess" arm is the same drafter with that size switched off, the rule before it. One
Session per K (lookup, fixed K, greedy) holds the target; the arms swap drafters in it and
alternate order from round to round and prompt to prompt.

Per run: wall tok/s (the summary's decode tok/s) and CPU tok/s (tokens / CPU seconds of
the decode loop's thread: with --threads 1 llama.cpp computes in that thread, so this is
the work itself, immune to the time slices other processes take), steps, drafted and
accepted. Ratios guess ÷ no guess are taken within a round; the table gives their median
and min-max per prompt and K, and the geometric mean over prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specdash.engine.drafters.lookup import PromptLookupDrafter  # noqa: E402
from specdash.engine.settings import EngineSettings  # noqa: E402
from specdash.events import PrefillEvent, StepEvent, Summary  # noqa: E402
from specdash.session import Session  # noqa: E402
from peer_llamacpp import BenchError, _ints, choose_prompts  # noqa: E402  (benchmarks/ is sys.path[0])

DEFAULT_PROMPTS = "code-generation,code-edit,summarization,json-extraction,edit-js-module,summarize-postmortem," \
                  "dialogue-support"


class NoGuess(PromptLookupDrafter):
    """The lookup rule without the one-token guess: nothing shorter than min_ngram votes."""

    def __init__(self, min_ngram: int, max_ngram: int):
        super().__init__(min_ngram, max_ngram)
        self._guess_ngram = min_ngram


ARMS = {"guess": PromptLookupDrafter, "no-guess": NoGuess}


def one(session: Session, arm: str, prompt: str, tokens: int) -> dict[str, Any]:
    s = session.settings
    session.engine.drafter = ARMS[arm](s.lookup_min_ngram, s.lookup_max_ngram)
    cpu0 = 0.0
    steps: list[StepEvent] = []
    summary: Summary | None = None
    for ev in session.run(prompt, max_tokens=tokens):
        if isinstance(ev, PrefillEvent):
            cpu0 = time.thread_time()
        elif isinstance(ev, StepEvent):
            steps.append(ev)
        elif isinstance(ev, Summary):
            summary = ev
    cpu = time.thread_time() - cpu0
    assert summary is not None
    return {
        "tok_s": summary.tokens_per_s, "cpu_tok_s": summary.n_generated / cpu if cpu > 0 else 0.0,
        "n": summary.n_generated, "steps": len(steps), "drafted": sum(x.drafted for x in steps),
        "accepted": sum(x.accepted for x in steps), "verify_ms": sum(x.verify_ms for x in steps),
        "text": summary.text,
    }


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.2f}-{max(xs):.2f})"


def report(rows: list[dict[str, Any]]) -> list[str]:
    out = [f"{'prompt':<22} {'K':>3}  {'CPU tok/s ratio':>18}  {'wall tok/s ratio':>18}  "
           f"{'steps g/n':>9}  {'accepted/drafted guess':>22}  {'no guess':>9}  text"]
    by: dict[tuple[str, int], dict[int, dict[str, dict[str, Any]]]] = {}
    for r in rows:
        by.setdefault((r["prompt"], r["k"]), {}).setdefault(r["round"], {})[r["arm"]] = r
    geo: dict[int, list[float]] = {}
    for (prompt, k), rounds in by.items():
        pairs = [(v["guess"], v["no-guess"]) for v in rounds.values() if len(v) == 2]
        cpu = [g["cpu_tok_s"] / n["cpu_tok_s"] for g, n in pairs]
        wall = [g["tok_s"] / n["tok_s"] for g, n in pairs]
        geo.setdefault(k, []).append(statistics.median(cpu))
        g, n = pairs[0]
        same = "same" if all(a["text"] == b["text"] for a, b in pairs) else "DIFFERS"
        out.append(f"{prompt:<22} {k:>3}  {_med(cpu):>18}  {_med(wall):>18}  {g['steps']:>4}/{n['steps']:<4}  "
                   f"{g['accepted']:>10}/{g['drafted']:<11}  {n['accepted']:>4}/{n['drafted']:<4}  {same}")
    out.append("")
    for k, xs in sorted(geo.items()):
        out.append(f"K={k}: geometric mean over {len(xs)} prompts of the median CPU ratio {statistics.geometric_mean(xs):.3f}"
                   f" (min {min(xs):.3f}, max {max(xs):.3f})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS, help="comma-separated built-in or benchmarks/prompts names")
    ap.add_argument("--ks", default="4,16", help="fixed Ks, comma-separated (default 4,16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--out", type=Path, help="the report (text) and its runs (.jsonl beside it)")
    args = ap.parse_args()
    try:  # the peer benchmark's prompts (the built-ins and benchmarks/prompts/*.txt) and K parsing
        chosen = [(p.name, p.text) for p in choose_prompts(args.prompts, quick=False)]
        ks = _ints(args.ks, "--ks")
    except BenchError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.rounds < 1 or args.tokens < 1:
        print(f"--rounds {args.rounds}, --tokens {args.tokens}: both must be >= 1", file=sys.stderr)
        return 2
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    for k in ks:
        session = Session(EngineSettings(target=args.target, draft="lookup", k=k, adaptive=False,
                                         threads=args.threads, ctx=4096, max_tokens=args.tokens))
        try:
            one(session, "guess", chosen[0][1], 8)  # warm-up: the first run of a session is slower
            for rnd in range(args.rounds):
                for i, (name, text) in enumerate(chosen):
                    order = list(ARMS) if (rnd + i) % 2 == 0 else list(ARMS)[::-1]
                    for arm in order:
                        res = one(session, arm, text, args.tokens)
                        res.update(prompt=name, k=k, round=rnd, arm=arm)
                        rows.append(res)
                        print(f"K={k} r{rnd} {name:<22} {arm:<9} cpu {res['cpu_tok_s']:6.2f} wall "
                              f"{res['tok_s']:6.2f} tok/s steps {res['steps']} acc {res['accepted']}/{res['drafted']}",
                              file=sys.stderr, flush=True)
        finally:
            session.close()
    lines = [
        "# lookup with and without the one-token guess (benchmarks/lookup_guess_ab.py)",
        "",
        f"command: python benchmarks/lookup_guess_ab.py {' '.join(sys.argv[1:])}",
        f"date: {time.strftime('%Y-%m-%d %H:%M')}, took {(time.time() - t0) / 60:.1f} min; {os.cpu_count()} CPUs, "
        f"load at end {os.getloadavg()[0]:.2f}; target {args.target}, greedy, {args.threads} thread(s), "
        f"{args.tokens} tokens, {args.rounds} rounds",
        "ratio = guess ÷ no guess within a round: median (min-max). steps, accepted/drafted: round 1.",
        "",
        *report(rows),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        args.out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
