"""Two arms of one engine setting, paired round by round in one Session per K.

The harness behind benchmarks/experiments/lookup_guess_ab.py and draft_joint_cut_ab.py.
An arm is a function that puts the Session's engine in its state before a run (a
drafter swapped in, a drafter's knob set): the target stays loaded, the arms alternate
order from round to round and prompt to prompt.

Per run: wall tok/s (the summary's decode tok/s) and CPU tok/s (tokens / CPU seconds of
the decode loop's thread: with --threads 1 llama.cpp computes in that thread, so this is
the work itself, immune to the time slices other processes take), steps, drafted and
accepted. Ratios first arm ÷ second are taken within a round; the table gives their
median and min-max per prompt and K, and the geometric mean over prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent  # benchmarks/: peer_llamacpp's prompts and K parsing
ROOT = BENCHMARKS.parent
for _path in (ROOT, BENCHMARKS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from specdash.engine.settings import EngineSettings  # noqa: E402
from specdash.contract.events import PrefillEvent, StepEvent, Summary  # noqa: E402
from specdash.sources.session import Session  # noqa: E402
from peer_llamacpp import BenchError, _ints, choose_prompts  # noqa: E402  (benchmarks/, put on sys.path above)

Arm = Callable[[Session], None]


def one(session: Session, prompt: str, tokens: int) -> dict[str, Any]:
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


def report(rows: list[dict[str, Any]], a: str, b: str) -> list[str]:
    out = [f"{'prompt':<22} {'K':>3}  {'CPU tok/s ratio':>18}  {'wall tok/s ratio':>18}  "
           f"{'steps a/b':>9}  {'accepted/drafted ' + a:>22}  {b:>9}  text"]
    by: dict[tuple[str, int], dict[int, dict[str, dict[str, Any]]]] = {}
    for r in rows:
        by.setdefault((r["prompt"], r["k"]), {}).setdefault(r["round"], {})[r["arm"]] = r
    geo: dict[int, list[float]] = {}
    geo_wall: dict[int, list[float]] = {}
    for (prompt, k), rounds in by.items():
        pairs = [(v[a], v[b]) for v in rounds.values() if len(v) == 2]
        cpu = [x["cpu_tok_s"] / y["cpu_tok_s"] for x, y in pairs]
        wall = [x["tok_s"] / y["tok_s"] for x, y in pairs]
        geo.setdefault(k, []).append(statistics.median(cpu))
        geo_wall.setdefault(k, []).append(statistics.median(wall))
        x, y = pairs[0]
        same = "same" if all(p["text"] == q["text"] for p, q in pairs) else "DIFFERS"
        out.append(f"{prompt:<22} {k:>3}  {_med(cpu):>18}  {_med(wall):>18}  {x['steps']:>4}/{y['steps']:<4}  "
                   f"{x['accepted']:>10}/{x['drafted']:<11}  {y['accepted']:>4}/{y['drafted']:<4}  {same}")
    out.append("")
    for k, xs in sorted(geo.items()):
        w = geo_wall[k]
        out.append(f"K={k}: geometric mean over {len(xs)} prompts of the median CPU ratio {statistics.geometric_mean(xs):.3f}"
                   f" (min {min(xs):.3f}, max {max(xs):.3f}); wall {statistics.geometric_mean(w):.3f}"
                   f" (min {min(w):.3f}, max {max(w):.3f})")
    return out


def parser(doc: str, prompts: str, ks: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--prompts", default=prompts, help="comma-separated built-in or benchmarks/prompts names")
    ap.add_argument("--ks", default=ks, help=f"fixed Ks, comma-separated (default {ks})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--out", type=Path, help="the report (text) and its runs (.jsonl beside it)")
    return ap


def run(args: argparse.Namespace, arms: dict[str, Arm], settings: Callable[[int], EngineSettings],
        title: str, script: str) -> int:
    """Every K, round, prompt and arm; the report to stdout and --out. 2 on bad usage."""
    try:  # the peer benchmark's prompts (the built-ins and benchmarks/prompts/*.txt) and K parsing
        chosen = [(p.name, p.text) for p in choose_prompts(args.prompts, quick=False)]
        ks = _ints(args.ks, "--ks")
    except BenchError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.rounds < 1 or args.tokens < 1:
        print(f"--rounds {args.rounds}, --tokens {args.tokens}: both must be >= 1", file=sys.stderr)
        return 2
    names = list(arms)
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    for k in ks:
        session = Session(settings(k))
        try:
            arms[names[0]](session)
            one(session, chosen[0][1], 8)  # warm-up: the first run of a session is slower
            for rnd in range(args.rounds):
                for i, (name, text) in enumerate(chosen):
                    for arm in names if (rnd + i) % 2 == 0 else names[::-1]:
                        arms[arm](session)
                        res = one(session, text, args.tokens)
                        res.update(prompt=name, k=k, round=rnd, arm=arm)
                        rows.append(res)
                        print(f"K={k} r{rnd} {name:<22} {arm:<9} cpu {res['cpu_tok_s']:6.2f} wall "
                              f"{res['tok_s']:6.2f} tok/s steps {res['steps']} acc {res['accepted']}/{res['drafted']}",
                              file=sys.stderr, flush=True)
        finally:
            session.close()
    lines = [
        f"# {title} (benchmarks/experiments/{script})",
        "",
        f"command: python benchmarks/experiments/{script} {' '.join(sys.argv[1:])}",
        f"date: {time.strftime('%Y-%m-%d %H:%M')}, took {(time.time() - t0) / 60:.1f} min; {os.cpu_count()} CPUs, "
        f"load at end {os.getloadavg()[0]:.2f}; target {args.target}, greedy, {args.threads} thread(s), "
        f"{args.tokens} tokens, {args.rounds} rounds",
        f"ratio = {names[0]} ÷ {names[1]} within a round: median (min-max). steps, accepted/drafted: round 1.",
        "",
        *report(rows, names[0], names[1]),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        args.out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return 0
