#!/usr/bin/env python
"""Adaptive K against plain decoding, paired round by round: does adaptive ever lose?

    python benchmarks/adaptive_vs_plain.py --prompt-file a.txt --prompt-file b.txt \
        --rounds 3 --tokens 128 --threads 1 --out results.jsonl

Per round and prompt, in alternating order, each arm runs in a fresh Session (a fresh
controller, as a new `specdash run` process has): plain (`--k 0 --draft none`), adaptive
with the draft model, adaptive with the chain (lookup, suffix, draft model). Each run
reports:
- wall tok/s: the summary's decode tok/s (prefill and the adaptive cost calibration
  excluded), what `specdash run` prints;
- CPU tok/s: generated tokens / CPU seconds of the decode loop's thread, calibration
  excluded. With --threads 1 llama.cpp computes in the calling thread, so this is the
  decode work itself, immune to the time slices other processes take on a shared machine
  (which move wall tok/s ±50% between identical runs on a 2-core box at load 12);
- end-to-end tok/s: generated tokens / the wall time from the prompt in to the last
  token (the target's prefill, a draft model's prompt feed wherever it is paid, the
  calibration, decoding): what the user waits for;
- the per-step sums of the step events (draft, verify, other ms), the steps at K > 0.

Ratios are taken within a round (adaptive ÷ plain of the same round); the summary line per
prompt and arm gives their median and min-max. Run it with PYTHONPATH pointing at another
checkout to measure an older controller the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specdash.engine.settings import EngineSettings  # noqa: E402
from specdash.contract.events import NoticeEvent, PrefillEvent, StepEvent, Summary  # noqa: E402
from specdash.sources.session import Session  # noqa: E402

ARMS = {
    "plain": dict(draft="none", k=0, adaptive=False),
    "adaptive-draft": dict(adaptive=True),  # the draft model alone (--draft): the default before auto
    "adaptive-chain": dict(draft="chain", adaptive=True),
    "adaptive-lookup": dict(draft="lookup", adaptive=True),
    "adaptive-suffix": dict(draft="suffix", adaptive=True),
    "adaptive-edit": dict(draft="edit", adaptive=True),  # the edit-following copy alone (issue 53)
    "auto": dict(draft="auto", adaptive=True),  # the default (issue 32): --draft-model is --draft below
    "auto-k32": dict(draft="auto", adaptive=True, k_max=32),  # auto with adaptive K up to 32
}


def one(settings: EngineSettings, prompt: str) -> dict[str, object]:
    session = Session(settings)
    try:
        cpu0 = cpu_cal = 0.0
        steps: list[StepEvent] = []
        summary: Summary | None = None
        t0 = time.perf_counter()
        for ev in session.run(prompt):
            if isinstance(ev, PrefillEvent):
                cpu0 = time.thread_time()
            elif isinstance(ev, NoticeEvent) and ev.message.startswith("adaptive K: measured"):
                cpu_cal = time.thread_time() - cpu0  # the calibration ran before this notice
            elif isinstance(ev, StepEvent):
                steps.append(ev)
            elif isinstance(ev, Summary):
                summary = ev
        wall = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0 - cpu_cal
    finally:
        session.close()
    assert summary is not None
    return {
        "tok_s": summary.tokens_per_s,
        "cpu_tok_s": summary.n_generated / cpu if cpu > 0 else 0.0,
        # What the user waits for: prompt in to last token out (the target's prefill, a
        # draft model's prompt feed wherever it is paid, the calibration, decoding).
        "e2e_tok_s": summary.n_generated / wall if wall > 0 else 0.0,
        "n": summary.n_generated,
        "steps": len(steps),
        "k_pos_steps": sum(1 for s in steps if s.k > 0),
        "drafted": sum(s.drafted for s in steps),
        "accepted": sum(s.accepted for s in steps),
        "draft_ms": sum(s.draft_ms for s in steps),
        "verify_ms": sum(s.verify_ms for s in steps),
        "other_ms": sum(s.other_ms for s in steps),
        # Which sources drafted (auto chooses per step): steps with a draft, by source.
        "sources": {src: sum(1 for s in steps if s.drafted and s.drafter == src)
                    for src in sorted({s.drafter for s in steps if s.drafted})},
        "text": summary.text,
        "load1": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt-file", action="append", default=[])
    ap.add_argument("--builtin", default="", help="built-in prompts too, by name, comma-separated "
                    "(specdash/tuning/prompts.py: code-edit, json-extraction, ...)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--first-round", type=int, default=0, help="number rounds from here (runs split over processes)")
    ap.add_argument("--label", default="", help="a name for this checkout in the output")
    ap.add_argument("--out", required=True, help="JSON lines, appended")
    args = ap.parse_args()
    arms = args.arms.split(",")
    from specdash.tuning.prompts import by_name

    prompts = [(Path(path).stem, Path(path).read_text()) for path in args.prompt_file]
    prompts += [(name, by_name(name).text) for name in args.builtin.split(",") if name]
    if not prompts:
        ap.error("no prompts: give --prompt-file and/or --builtin")
    with open(args.out, "a") as f:
        for r in range(args.first_round, args.first_round + args.rounds):
            for i, (name, prompt) in enumerate(prompts):
                order = arms if (r + i) % 2 == 0 else arms[::-1]
                for arm in order:
                    base = dict(target=args.target, draft=args.draft, draft_model=args.draft, k=4,
                                threads=args.threads, ctx=4096, max_tokens=args.tokens)
                    res = one(EngineSettings(**{**base, **ARMS[arm]}), prompt)
                    res.update(prompt=name, round=r, arm=arm, label=args.label, t=time.time())
                    f.write(json.dumps(res) + "\n")
                    f.flush()
                    print(f"r{r} {name:10s} {args.label}{arm:15s} wall {res['tok_s']:6.2f} "
                          f"cpu {res['cpu_tok_s']:6.2f} tok/s  K>0 steps {res['k_pos_steps']}", flush=True)


def report(path: str) -> None:
    """Medians of the within-round ratios to plain, per prompt and arm."""
    rows = [json.loads(line) for line in open(path)]
    by: dict[tuple[str, str, int], dict[str, dict[str, float]]] = {}
    for row in rows:
        by.setdefault((row["label"], row["prompt"], row["round"]), {})[row["arm"]] = row
    keys = sorted({(lab, p, a) for (lab, p, _), v in by.items() for a in v if a != "plain"})
    for lab, p, a in keys:
        rounds = [v for (lab2, p2, _), v in by.items() if (lab2, p2) == (lab, p) and a in v and "plain" in v]
        line = f"{lab}{p:10s} {a:15s}"
        for metric in ("tok_s", "cpu_tok_s", "e2e_tok_s"):
            if not all(metric in v[a] for v in rounds):
                continue  # rows written before the metric existed
            ratios = [v[a][metric] / v["plain"][metric] for v in rounds]
            line += (f"  {metric} {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
        line += f"  [{len(rounds)} rounds] K>0 steps {[v[a]['k_pos_steps'] for v in rounds]}"
        line += f" plain cpu {statistics.median(v['plain']['cpu_tok_s'] for v in rounds):.1f} tok/s"
        if any(v[a].get("sources") for v in rounds):
            line += f" sources {[v[a].get('sources') for v in rounds]}"
        same = all(v[a]["text"] == v["plain"]["text"] for v in rounds)
        print(line + ("" if same else "  TEXT DIFFERS"))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--report":
        report(sys.argv[2])
    else:
        main()
