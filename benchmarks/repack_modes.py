"""Weight repacking modes on this machine (issue 30): the default pair, plain decoding and
a fixed K=4 with the draft model, under each repack mode that works here, in paired
rounds (modes alternate inside a round, in a rotating order, so the host's drift hits
them alike). Which modes work is the probe's business (engine/repack.py): a mode that
crashed in the probe is listed, not run.

    python benchmarks/repack_modes.py [--rounds 3] [--tokens 128] [--out benchmarks/results/repack.txt]

Each run is a `specdash run --json --repack MODE` subprocess (models load their own way
per mode); tok/s is the engine's decode-only figure from its summary. Ratios are taken
per round against "off" (no repacking) on the same prompt and configuration, then the
median and spread over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specdash.engine import repack
from specdash.tuning.prompts import by_name

CONFIGS = {"plain": ["--draft", "none", "--k", "0"], "K=4": ["--draft", "qwen2.5-coder-0.5b", "--k", "4", "--no-adaptive"]}
# Two built-in prompts and one written for this benchmark, so the ratio is not one text's.
PROMPTS = {
    "code-generation": by_name("code-generation").text,
    "summarization": by_name("summarization").text,
    "held-out-sql": ("Write a SQL query over tables orders(id, customer_id, total, created_at) and "
                     "customers(id, name, country) that returns, per country, the number of customers "
                     "who placed more than three orders in 2025 and their average order total, "
                     "sorted by that average, highest first. Explain each clause briefly."),
}


def cpu_model() -> str:
    return repack._cpu_identity()[0]


def run_one(mode: str, config: str, prompt_file: Path, tokens: int, threads: int) -> dict:
    argv = [sys.executable, "-m", "specdash", "run", "--json", "--repack", mode, "--threads", str(threads),
            "--max-tokens", str(tokens), "--temp", "0", "--prompt-file", str(prompt_file), *CONFIGS[config]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"error": repack.describe_exit(proc.returncode, proc.stderr)}
    summary = next(json.loads(line) for line in reversed(proc.stdout.splitlines()) if '"summary"' in line)
    return {"tps": summary["tokens_per_s"], "n": summary["n_generated"], "text": summary["text"],
            "verify_ms_per_step": summary["verify_ms"] / max(summary["steps"], 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="on,no-amx,off", help="modes to measure where they work (comma-separated)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    verdict = repack.resolve()
    crashed = {m for m, outcome in verdict.tried if outcome != "ok"}
    wanted = [m for m in args.modes.split(",") if m in repack.MODES]
    modes = [m for m in wanted if m not in crashed and (m != "no-amx" or "AMX" in verdict.extra_bufts)]
    skipped = {m: dict(verdict.tried).get(m, "no AMX buffer type here: same placement as on")
               for m in wanted if m not in modes}
    t0 = time.time()
    results: dict[tuple[str, str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, text in PROMPTS.items():
            files[name] = Path(tmp) / f"{name}.txt"
            files[name].write_text(text)
        for rnd in range(args.rounds):
            for name in PROMPTS:
                for config in CONFIGS:
                    order = modes[rnd % len(modes):] + modes[: rnd % len(modes)]
                    for mode in order:
                        r = run_one(mode, config, files[name], args.tokens, args.threads)
                        results.setdefault((name, config, mode), []).append(r)
                        shown = r.get("error") or f"{r['tps']:.1f} tok/s"
                        print(f"[r{rnd + 1}] {name:<16} {config:<5} {mode:<7} {shown}", file=sys.stderr, flush=True)
    lines = [
        "# Weight repacking modes: the default pair (benchmarks/repack_modes.py)",
        "",
        f"command: python benchmarks/repack_modes.py {' '.join(sys.argv[1:])}",
        f"date: {time.strftime('%Y-%m-%d %H:%M')}, took {(time.time() - t0) / 60:.1f} min; "
        f"{platform.machine()}, {os.cpu_count()} logical CPUs; CPU: {cpu_model()}",
        f"probe verdict: {verdict.describe()}",
        f"{args.tokens} tokens, greedy, {args.threads} threads, {args.rounds} paired rounds; target "
        "qwen2.5-coder-1.5b (Q4_K_M), draft qwen2.5-coder-0.5b",
        "",
    ]
    for mode, why in skipped.items():
        lines.append(f"{mode}: not measured ({why})")
    if skipped:
        lines.append("")
    base = "off" if "off" in modes else modes[-1]
    lines.append(f"{'prompt':<16} {'config':<6} {'mode':<7} {'tok/s median':>12} {'x ' + base + ' (median, min-max)':>28}"
                 f" {'verify ms/step':>15}  same text")
    for name in PROMPTS:
        for config in CONFIGS:
            ref = results[(name, config, base)]
            for mode in modes:
                runs = results[(name, config, mode)]
                ok = [r for r in runs if "tps" in r]
                if not ok:
                    lines.append(f"{name:<16} {config:<6} {mode:<7} failed: {runs[0]['error']}")
                    continue
                ratios = [r["tps"] / b["tps"] for r, b in zip(runs, ref) if "tps" in r and "tps" in b]
                same = all(r["text"] == b["text"] for r, b in zip(runs, ref) if "tps" in r and "tps" in b)
                lines.append(
                    f"{name:<16} {config:<6} {mode:<7} {statistics.median(r['tps'] for r in ok):>12.1f} "
                    f"{statistics.median(ratios):>12.3f} ({min(ratios):.3f}-{max(ratios):.3f})      "
                    f"{statistics.median(r['verify_ms_per_step'] for r in ok):>15.1f}  {'yes' if same else 'NO'}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
