"""Does `specdash whatif` predict what `specdash run` measures on this machine?

For each prompt: whatif's prediction on `--profile here` (the plain greedy text generated
once, this machine's costs measured, lookup and the draft model simulated at each K),
then real runs through the same engine `specdash run` drives (one Session per drafter,
SetK between runs; the Summary's tok/s is what `run` prints), in paired rounds: each
round runs plain decoding and every K in a rotated order, so load drift on a shared
machine hits each alike. Reports per (prompt, drafter, K): predicted and measured tok/s
(median, min-max over rounds), the error, the same as speed-up over the round's plain
run (less sensitive to load, which moves both), and predicted vs measured acceptance
(which should be equal: the simulation's counts are exact up to near-ties).

Targets (issue 21): median |error| <= 10%, no case over 20%.

    python benchmarks/whatif_accuracy.py                              # default pair, K=2,4,8,16, 3 rounds
    python benchmarks/whatif_accuracy.py --target smollm2-135m --draft PATH.gguf --tokens 32 --rounds 1 \
        --ks 2,4 --prompts held-out-poem --out /tmp/x.txt            # a tiny smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from specdash import events as E
from specdash.engine.drafters.base import NoDrafter
from specdash.engine.settings import EngineSettings
from specdash.prompts import BUILTIN
from specdash.session import Session
from specdash.whatif.measure import measure_here
from specdash.whatif.simulate import make_drafter, simulate
from specdash.whatif.transcript import from_prompt

ROOT = Path(__file__).resolve().parent.parent

# Not in the repo's benchmark set (specdash/prompts.py, benchmarks/prompts/): held out.
HELD_OUT = {
    "held-out-sql": "Explain what this SQL query does, clause by clause, then rewrite it with a CTE:\n"
                    "SELECT c.name, COUNT(o.id) AS orders, SUM(o.total) AS spent FROM customers c "
                    "JOIN orders o ON o.customer_id = c.id WHERE o.created_at >= '2024-01-01' "
                    "GROUP BY c.name HAVING COUNT(o.id) > 3 ORDER BY spent DESC LIMIT 10;",
    "held-out-bash": "Write a bash script that finds every .log file under /var/log older than 7 days, "
                     "compresses each with gzip, and prints a summary of how many files and bytes were saved.",
    "held-out-poem": "Write a short poem about a lighthouse keeper who has never seen the sea in daylight.",
    "held-out-rename": "Rename the variable `tmp` to `total` everywhere in this function and return the whole "
                       "function:\ndef f(xs):\n    tmp = 0\n    for x in xs:\n        tmp = tmp + x * x\n"
                       "    if tmp > 100:\n        tmp = tmp - 100\n    return tmp\n",
}
DEFAULT_PROMPTS = ("code-edit", "summarization", "held-out-sql", "held-out-bash", "held-out-poem", "held-out-rename")


class Report:
    """A results table: each line printed as it comes (a long run shows progress), all of
    them written to a file at the end. whatif_controller.py reports the same way."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def write(self, out: str) -> None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("\n".join(self.lines) + "\n", encoding="utf-8")
        print(f"wrote {out}")


def prompt_text(name: str) -> str:
    if name in HELD_OUT:
        return HELD_OUT[name]
    for p in BUILTIN:
        if p.name == name:
            return p.text
    path = ROOT / "benchmarks" / "prompts" / f"{name}.txt"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    known = [p.name for p in BUILTIN] + sorted(HELD_OUT) + sorted(p.stem for p in (ROOT / "benchmarks" / "prompts").glob("*.txt"))
    raise SystemExit(f"--prompts: unknown prompt {name!r}; known: {', '.join(known)}")


def predict(base: EngineSettings, prompt: str, model: str, ks: list[int]) -> tuple[dict, dict]:
    """{(drafter, k): (tok/s, acceptance)} predicted on this machine's profile, and context."""
    tr, (session, draft_llm) = from_prompt(base, prompt, model, lambda s: None)
    try:
        profile = measure_here(session.target, draft_llm, tr.prompt, overhead_ms=tr.plain["overhead_ms"],
                               relative_cost=tr.draft_relative_cost, plain_step_ms=tr.plain["verify_ms_median"])
    finally:
        session.close()
    out = {("none", 0): (simulate(tr, NoDrafter(), profile, base, name="none", k=0).tokens_per_s, None)}
    for kind in ("lookup", model):
        for k in ks:
            r = simulate(tr, make_drafter(kind, tr, profile, base), profile, base, name=kind, k=k)
            out[(kind, k)] = (r.tokens_per_s, r.acceptance)
    ctx = {"plain_measured": tr.plain["tokens_per_s"], "near_ties": {k: len(v) for k, v in tr.near_ties().items()},
           "n_generated": tr.n_generated, "text": b"".join(tr.pieces[: tr.n_generated]).decode("utf-8", "replace")}
    return out, ctx


def measure(base: EngineSettings, prompt: str, drafter: str, ks: list[int], rounds: int) -> dict:
    """{k: [(tok/s, acceptance, tok/s of the round's plain run, the text)]} from real runs."""
    session = Session(base.replace(draft=drafter, k=0, adaptive=False))  # fixed K: SetK below
    out: dict[int, list[tuple[float, float | None, float, str]]] = {k: [] for k in ks}
    try:
        for r in range(rounds):
            order = [0, *ks]
            order = order[r % len(order):] + order[: r % len(order)]
            got: dict[int, E.Summary] = {}
            for k in order:
                session.send(E.SetK(k))
                got[k] = next(ev for ev in session.run(prompt) if isinstance(ev, E.Summary))
            for k in ks:
                out[k].append((got[k].tokens_per_s, got[k].acceptance_rate, got[0].tokens_per_s, got[k].text))
    finally:
        session.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="the draft model (a name or a GGUF path)")
    ap.add_argument("--prompts", default=",".join(DEFAULT_PROMPTS))
    ap.add_argument("--ks", default="2,4,8,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "whatif-accuracy.txt"))
    args = ap.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    texts = {name: prompt_text(name) for name in args.prompts.split(",")}  # a bad name fails before any run
    base = EngineSettings(target=args.target, draft=args.draft, threads=args.threads, ctx=2048,
                          max_tokens=args.tokens)
    say = Report()

    say(f"# whatif accuracy: {args.target} + {args.draft}, {args.tokens} tokens, K={args.ks}, "
        f"{args.rounds} paired rounds, {args.threads} threads, {time.strftime('%Y-%m-%d %H:%M')}")
    say(f"# python {' '.join(sys.argv)}")
    say("| prompt | drafter | K | predicted tok/s | measured tok/s (min-max) | error | predicted x plain "
        "| measured x plain | error (x plain) | acceptance pred / meas | runs with the plain text |")
    say("|---|---|---|---|---|---|---|---|---|---|---|")
    errors: list[float] = []
    ratio_errors: list[float] = []
    for name in args.prompts.split(","):
        prompt = texts[name]
        pred, ctx = predict(base, prompt, args.draft, ks)
        plain_pred = pred[("none", 0)][0]
        for drafter in ("lookup", args.draft):
            real = measure(base, prompt, drafter, ks, args.rounds)
            for k in ks:
                tps = [t for t, _, _, _ in real[k]]
                med = statistics.median(tps)
                ratio = statistics.median(t / p for t, _, p, _ in real[k])
                # A run whose text left the plain one (a near-tie rounded the other way in a
                # verify batch) is not the text the prediction simulated.
                same = sum(text == ctx["text"] for _, _, _, text in real[k])
                acc_meas = real[k][0][1]
                p_tps, p_acc = pred[(drafter, k)]
                err = p_tps / med - 1
                r_err = (p_tps / plain_pred) / ratio - 1
                errors.append(abs(err))
                ratio_errors.append(abs(r_err))
                fmt = lambda a: "-" if a is None else f"{a:.1%}"  # noqa: E731
                label = "lookup" if drafter == "lookup" else "draft"
                say(f"| {name} | {label} | {k} | {p_tps:.2f} | {med:.2f} ({min(tps):.2f}-{max(tps):.2f}) | {err:+.1%} "
                    f"| {p_tps / plain_pred:.2f} | {ratio:.2f} | {r_err:+.1%} | {fmt(p_acc)} / {fmt(acc_meas)} "
                    f"| {same}/{len(real[k])} |")
        say(f"<!-- {name}: {ctx['n_generated']} tokens; plain measured {ctx['plain_measured']:.2f} tok/s, "
            f"predicted {plain_pred:.2f}; near-ties {ctx['near_ties']} -->")
    if errors:
        say("")
        say(f"median |error| {statistics.median(errors):.1%}, max {max(errors):.1%} (tok/s); "
            f"median {statistics.median(ratio_errors):.1%}, max {max(ratio_errors):.1%} (speed-up over plain); "
            f"{len(errors)} cases")
    say.write(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
