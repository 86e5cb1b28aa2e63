"""Drafts with another vocabulary (drafter "xvocab"): what they accept and what they cost.

For each pair (a target and a draft whose vocabulary differs from it), on several prompts,
in paired rounds: plain decoding (K=0), the translated draft, and the same-vocabulary
drafters available for that target, all at the same K, in an order rotated every round so
drift on a shared machine hits them alike. One session per pair: the drafters are swapped
with SetDrafter between runs, the target stays loaded.

Reported per pair and drafter (medians over prompts x rounds, with min..max):
acceptance (accepted / drafted), mean accepted length per draft, translation ms per step
(StepEvent.translate_ms, steps the translated draft drafted), tok/s, and tok/s as a ratio
of plain decoding and of the best same-vocabulary drafter, each ratio taken within a
round (paired) before the median.

    python benchmarks/cross_vocab.py                                  # every pair, 3 rounds
    python benchmarks/cross_vocab.py --pairs smol-qwen --rounds 1 --tokens 32 --prompts 2
    python benchmarks/cross_vocab.py --out benchmarks/results/cross-vocab.txt

Pairs: qwen-smol (Qwen2.5-Coder-1.5B target, SmolLM2-135M draft), qwen-gemma (the same
target, Gemma-3-270M: SPM vs BPE), smol-qwen (SmolLM2-135M target, Qwen2.5-Coder-0.5B: a
draft bigger than its target, correct but slow). Same-vocabulary references: the Qwen
target's own 0.5B, and prompt lookup for every target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specdash.contract import events as E
from specdash.engine.settings import EngineSettings
from specdash.sources.session import Session

PROMPTS = (
    ("code", "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals, "
             "with a docstring."),
    ("prose", "Explain in a short paragraph why the sky is blue."),
    ("non-ascii", "Translate 'good morning, my friend' into French, Spanish, Japanese and Chinese, "
                  "one per line."),
    ("list", "List the days of the week in order, then the months of the year, comma-separated."),
)


@dataclass(frozen=True)
class PairSpec:
    name: str
    target: str
    draft: str  # another vocabulary: drafts through translation
    same: tuple[str, ...]  # same-vocabulary drafters to compare with


PAIRS = {
    "qwen-smol": PairSpec("qwen-smol", "qwen2.5-coder-1.5b", "smollm2-135m", ("qwen2.5-coder-0.5b", "lookup")),
    "qwen-gemma": PairSpec("qwen-gemma", "qwen2.5-coder-1.5b", "gemma3-270m", ("qwen2.5-coder-0.5b", "lookup")),
    "smol-qwen": PairSpec("smol-qwen", "smollm2-135m", "qwen2.5-coder-0.5b", ("lookup",)),
}


@dataclass
class Run:
    tok_s: float
    drafted: int
    accepted: int
    drafts: int  # steps that drafted something
    translate_ms: list[float] = field(default_factory=list)  # per step the translated draft drafted


def run_once(session: Session, drafter: str, prompt: Sequence[int], tokens: int) -> Run:
    session.send(E.SetDrafter(drafter))
    refused = [ev for ev in session.apply_pending() if isinstance(ev, E.NoticeEvent) and ev.level != "info"]
    if refused:
        raise SystemExit(f"{drafter}: {refused[0].message}")
    steps, summary = [], None
    for ev in session.engine.generate(prompt, tokens):
        if isinstance(ev, E.StepEvent):
            steps.append(ev)
        elif isinstance(ev, E.Summary):
            summary = ev
    assert summary is not None
    return Run(summary.tokens_per_s, sum(s.drafted for s in steps), sum(s.accepted for s in steps),
               sum(1 for s in steps if s.drafted), [s.translate_ms for s in steps if s.drafter == "xvocab"])


def _med(xs: Sequence[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}..{max(xs):.2f})"


def bench_pair(spec: PairSpec, k: int, tokens: int, rounds: int, prompts: int, threads: int) -> list[str]:
    settings = EngineSettings(target=spec.target, draft=spec.draft, k=k, adaptive=False, threads=threads, ctx=2048)
    session = Session(settings)
    lines = [f"pair {spec.name}: target {spec.target}, translated draft {spec.draft}, K={k}, {tokens} tokens, "
             f"{rounds} round(s) x {prompts} prompt(s), {threads} thread(s)"]
    try:
        drafters = ["none", spec.draft, *spec.same]
        runs: dict[str, list[Run]] = defaultdict(list)
        ratio_plain: dict[str, list[float]] = defaultdict(list)
        ratio_same: list[float] = []
        for r in range(rounds):
            for name, text in PROMPTS[:prompts]:
                prompt = session.prompt_tokens(text)
                order = drafters[r % len(drafters):] + drafters[: r % len(drafters)]
                got = {d: run_once(session, d, prompt, tokens) for d in order}
                for d, run in got.items():
                    runs[d].append(run)
                    if got["none"].tok_s > 0:
                        ratio_plain[d].append(run.tok_s / got["none"].tok_s)
                best_same = max(got[d].tok_s for d in spec.same)
                if best_same > 0:
                    ratio_same.append(got[spec.draft].tok_s / best_same)
                print(f"  round {r + 1} {name}: " + ", ".join(f"{d} {got[d].tok_s:.2f} tok/s" for d in order),
                      flush=True)
        for d in drafters:
            rs = runs[d]
            kind = "plain" if d == "none" else "translated" if d == spec.draft else "same vocabulary"
            acc = [x.accepted / x.drafted for x in rs if x.drafted]
            mal = [x.accepted / x.drafts for x in rs if x.drafts]
            tr = [t for x in rs for t in x.translate_ms]
            line = (f"  {d:<20} {kind:<16} tok/s {_med([x.tok_s for x in rs])}; vs plain {_med(ratio_plain[d])}")
            if d != "none":
                line += f"; acceptance {_med(acc)}; mean accepted length {_med(mal)}"
            if tr:
                line += f"; translate ms/step {_med(tr)} over {len(tr)} steps"
            lines.append(line)
        lines.append(f"  translated vs best same-vocabulary drafter ({', '.join(spec.same)}), paired: "
                     f"{_med(ratio_same)}")
    finally:
        session.close()
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated: {', '.join(PAIRS)}")
    ap.add_argument("--k", type=int, default=4, help="K for every drafter (default 4)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per run (default 64)")
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (default 3)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"prompts per round (default {len(PROMPTS)})")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads per model (default 1: 2 threads spin-wait on a shared 2-core box)")
    ap.add_argument("--out", type=Path, help="also write the summary here")
    args = ap.parse_args(argv)
    out: list[str] = []
    for name in args.pairs.split(","):
        if name not in PAIRS:
            ap.error(f"--pairs: unknown pair {name!r} (known: {', '.join(PAIRS)})")
        for line in bench_pair(PAIRS[name], args.k, args.tokens, args.rounds, args.prompts, args.threads):
            print(line, flush=True)
            out.append(line)
    if args.out:
        args.out.write_text("\n".join(out) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
