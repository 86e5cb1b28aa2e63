"""Several clients at once (issue 41): specdash serve against llama-server -np 4.

Arms, all started once (idle while another runs; llama.cpp's threads sleep when idle):
    llama-plain      llama-server -np 4, no speculation
    llama-ngram      llama-server -np 4 --spec-type ngram-simple (its n-gram lookup: its best
                     drafter on 2-core machines, where its draft model ran at 0.4-0.6x plain,
                     benchmarks/results/serve-vs-llamaserver-kept.txt; --with-draft adds it)
    specdash         specdash serve, its defaults (--parallel auto, adaptive K, auto drafter)
    specdash-fifo    specdash serve --parallel 1: one request at a time (the wave-5 start)

For 1, 2 and 4 clients at once, each client sends one streamed chat completion
(temperature 0, --tokens each), all released together. Two prompt sets: `copy` (edits,
extraction, proofreading: the answer copies from the prompt) and `fresh` (prose, dialogue,
maths: little to copy), each prompt with a first line of its own so nothing is answered
from a cache of the same prompt. Per run: total tok/s (every client's tokens over the run's wall
time) and each request's latency (send to last token). Rounds are paired: every arm runs
every (set, clients) cell in a round, the arms' order rotating round by round; the ratio
specdash / the best llama-server arm is taken within a round, its median over rounds
reported with the spread (min..max).

    python benchmarks/serve_concurrency.py --rounds 3 --out benchmarks/results/serve-concurrency.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from peer_llamacpp import all_prompts  # noqa: E402
from serve_vs_llamaserver import SERVE_PROMPTS, Arm, chat, forget, free_port, med, spread, start_all  # noqa: E402

from specdash.engine.repack import tool_args  # noqa: E402
from specdash.tuning.llamacpp_tools import ensure_built  # noqa: E402
from specdash.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, model_path  # noqa: E402

SETS = {
    "copy": ["code-edit", "json-extraction", "proofread-email", "serve-code-edit"],
    "fresh": ["prose", "dialogue-support", "math-steps", "essay-prose"],
}
CLIENTS = (1, 2, 4)


def make_arms(ctx: int, threads: int, with_draft: bool) -> list[Arm]:
    bin_dir = ensure_built(["llama-server"])
    target = model_path(DEFAULT_TARGET)
    base = [str(bin_dir / "llama-server"), *tool_args(), "-m", str(target), "--host", "127.0.0.1",
            "-c", str(4 * ctx), "-np", "4", "-t", str(threads), "--metrics", "--cache-ram", "0"]
    serve = [sys.executable, "-m", "specdash", "serve", "--headless", "--ctx", str(ctx), "--threads", str(threads)]
    out = [Arm("llama-plain", base, free_port()), Arm("llama-ngram", [*base, "--spec-type", "ngram-simple"], free_port())]
    if with_draft:
        out.append(Arm("llama-draft", [*base, "-md", str(model_path(DEFAULT_DRAFT)), "--spec-type", "draft-simple",
                                       "--spec-draft-n-max", "4"], free_port()))
    out += [Arm("specdash", serve, free_port()), Arm("specdash-fifo", [*serve, "--parallel", "1"], free_port())]
    for arm in out:
        arm.argv = [*arm.argv, "--port", str(arm.port)]
    return out


def run_cell(arm: Arm, texts: list[str], tokens: int) -> tuple[float, list[float], int]:
    """Every text from its own client at once: (total tok/s, latencies, drafted tokens)."""
    if arm.name.startswith("specdash"):
        forget(arm)
    got: list[tuple[float, int, int]] = []
    barrier = threading.Barrier(len(texts))

    def one(text: str) -> None:
        barrier.wait()
        t0 = time.perf_counter()
        _, _, n, _, extra = chat(arm.url, [{"role": "user", "content": text}], tokens)
        got.append((time.perf_counter() - t0, n, extra.get("draft_n", 0)))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = time.perf_counter() - t0
    return sum(n for _, n, _ in got) / span, [lat for lat, _, _ in got], sum(d for _, _, d in got)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96, help="max_tokens per request (default 96)")
    ap.add_argument("--ctx", type=int, default=4096, help="context per request (default 4096)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--with-draft", action="store_true", help="add llama-server with the default draft model")
    ap.add_argument("--out", type=Path, help="write the report here too")
    args = ap.parse_args()

    texts = {p.name: p.text for p in all_prompts()}
    texts |= {f.stem: f.read_text(encoding="utf-8").strip() for f in sorted(SERVE_PROMPTS.glob("*.txt"))}
    arms = make_arms(args.ctx, args.threads, args.with_draft)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "serve-concurrency"
    log_dir.mkdir(exist_ok=True)
    # (set, clients, arm) -> per round: (total tok/s, latencies, drafted)
    cells: dict[tuple[str, int, str], list[tuple[float, list[float], int]]] = {}
    try:
        start_all(arms, log_dir)
        for rnd in range(args.rounds):
            order = arms[rnd % len(arms):] + arms[: rnd % len(arms)]
            for set_name, names in SETS.items():
                for clients in CLIENTS:
                    # Which prompts: rotate through the set so one client is not always the same,
                    # each with a first line of its own: real prompts differ, and a prompt seen
                    # before would be answered from a prompt cache, slot rows or a draft
                    # model's KV (whichever arm kept them), not decoded.
                    chosen = [f"(ticket {rnd}-{set_name}-{clients}-{i})\n" + texts[names[(rnd + i) % len(names)]]
                              for i in range(clients)]
                    for arm in order:
                        cell = run_cell(arm, chosen, args.tokens)
                        cells.setdefault((set_name, clients, arm.name), []).append(cell)
                        print(f"round {rnd + 1} {set_name:5s} {clients} clients {arm.name:13s} "
                              f"{cell[0]:6.1f} tok/s total, latency max {max(cell[1]):5.2f}s, drafted {cell[2]}",
                              file=sys.stderr, flush=True)
    finally:
        for arm in arms:
            arm.stop()

    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    names = [a.name for a in arms]
    llama = [n for n in names if n.startswith("llama")]
    say(f"# specdash serve vs llama-server -np 4, several clients at once: {platform.node()} {platform.machine()}, "
        f"{args.threads} threads, {args.rounds} paired rounds, max_tokens {args.tokens}, temperature 0, streamed chat")
    say(f"# command: python benchmarks/serve_concurrency.py {' '.join(sys.argv[1:])}")
    say(f"# target {DEFAULT_TARGET}; sets: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in SETS.items()))
    say("")
    say("## Total tok/s (median over rounds); specdash / the best llama-server arm, paired by round")
    say(f"{'set':6s} {'clients':>7s} " + " ".join(f"{n:>13s}" for n in names) + "   specdash/best (spread)")
    for set_name in SETS:
        for clients in CLIENTS:
            tps = {n: [c[0] for c in cells[(set_name, clients, n)]] for n in names}
            best = max(llama, key=lambda n: med(tps[n]))
            ratio = [s / b for s, b in zip(tps["specdash"], tps[best]) if b > 0]
            say(f"{set_name:6s} {clients:7d} " + " ".join(f"{med(tps[n]):13.1f}" for n in names)
                + f"   {med(ratio):.2f}x vs {best} ({spread(ratio)})")
    say("")
    say("## Per-request latency, send to last token (seconds): p50 / p90 over every request of every round")
    say(f"{'set':6s} {'clients':>7s} " + " ".join(f"{n:>13s}" for n in names) + "   specdash p90 / best llama p90")
    for set_name in SETS:
        for clients in CLIENTS:
            lat = {n: [x for c in cells[(set_name, clients, n)] for x in c[1]] for n in names}
            best = min(llama, key=lambda n: pct(lat[n], 0.9))
            say(f"{set_name:6s} {clients:7d} " + " ".join(f"{med(lat[n]):6.2f}/{pct(lat[n], 0.9):6.2f}" for n in names)
                + f"   {pct(lat['specdash'], 0.9) / pct(lat[best], 0.9):.2f}x vs {best}")
    say("")
    say("## Drafted tokens per run (median)")
    for set_name in SETS:
        for clients in CLIENTS:
            say(f"{set_name:6s} {clients:7d} " + " ".join(
                f"{med([float(c[2]) for c in cells[(set_name, clients, n)]]):13.0f}" for n in names))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
