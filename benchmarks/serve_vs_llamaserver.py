"""specdash serve against llama-server, through the same HTTP client, on the same model.

Arms (all started once, idle while another runs; llama.cpp's threads sleep when idle):
    llama-plain      llama-server, no speculation
    llama-draft      llama-server -md DRAFT --spec-type draft-simple --spec-draft-n-max N (4)
    llama-ngram      llama-server --spec-type ngram-simple (its n-gram lookup)
    specdash         specdash serve --headless, its defaults (adaptive K, auto drafter)

Each request is a streamed chat completion (temperature 0) through httpx, as an assistant
sends it. Measured per request: time to first token (TTFT: from sending to the first
content chunk) and the whole request's wall time; tok/s = completion tokens / wall time
from first token to the end (decode), and end to end.

Fair to both: llama-server runs with --cache-ram 0 (its host-memory prompt cache would
answer a prompt repeated round after round in 0.1 s; real prompts differ), and specdash is
restarted before each request (its suffix drafter would recall the answer to a repeated
prompt; `forget` is not steerable over HTTP since issue 56). Each keeps what it reuses in a growing chat: the slot's / the previous
request's KV rows.

Rounds are paired: each round runs every prompt on every arm, the arms' order rotating
round by round, so drift hits every arm alike; ratios are taken within a round, then
their median over rounds (with the spread, min..max) is reported.

    python benchmarks/serve_vs_llamaserver.py                       # everything (~30 min on 2 cores)
    python benchmarks/serve_vs_llamaserver.py --rounds 1 --prompts code-edit --tokens 32   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from peer_llamacpp import all_prompts  # noqa: E402  (the project's prompts: built-in and benchmarks/prompts)

from specdash.engine.repack import tool_args  # noqa: E402
from specdash.tuning.llamacpp_tools import ensure_built  # noqa: E402
from specdash.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, model_path  # noqa: E402

SERVE_PROMPTS = ROOT / "benchmarks" / "prompts" / "serve"
CHAT = [  # a three-turn chat that grows: each turn resends the conversation
    "Write a Python function `parse_duration(text)` that turns strings like '1h30m', '45s' or '2m5s' "
    "into a number of seconds.",
    "Now add type hints and a docstring, and make it raise ValueError with a clear message on bad input.",
    "Finally, write pytest tests for it covering the normal cases and two bad inputs.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Arm:
    name: str
    argv: list[str]
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log_dir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        log = open(log_dir / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}; see {log_dir / self.name}.log")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"{self.name} never became healthy")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def arms(ctx: int, n_max: int, threads: int) -> list[Arm]:
    bin_dir = ensure_built(["llama-server"])
    target, draft = model_path(DEFAULT_TARGET), model_path(DEFAULT_DRAFT)
    base = [str(bin_dir / "llama-server"), *tool_args(), "-m", str(target), "--host", "127.0.0.1",
            "-c", str(2 * ctx), "-np", "2", "-t", str(threads), "--metrics", "--cache-ram", "0"]
    out = [
        Arm("llama-plain", base, free_port()),
        Arm("llama-draft", [*base, "-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max",
                            str(n_max)], free_port()),
        Arm("llama-ngram", [*base, "--spec-type", "ngram-simple"], free_port()),
        Arm("specdash", [sys.executable, "-m", "specdash", "serve", "--headless", "--ctx", str(ctx),
                         "--threads", str(threads)], free_port()),
    ]
    for arm in out:
        arm.argv = [*arm.argv, "--port", str(arm.port)]
    return out


@dataclass
class Result:
    arm: str
    prompt: str
    rnd: int
    ttft: float
    wall: float
    tokens: int
    text: str
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def decode_tps(self) -> float:
        span = self.wall - self.ttft
        return (self.tokens - 1) / span if span > 0 and self.tokens > 1 else 0.0

    @property
    def e2e_tps(self) -> float:
        return self.tokens / self.wall if self.wall > 0 else 0.0


def chat(url: str, messages: list[dict[str, str]], tokens: int) -> tuple[float, float, int, str, dict[str, int]]:
    """One streamed chat completion: (ttft, wall, completion tokens, text, timings' draft counts)."""
    body = {"messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, text, usage, timings = 0.0, [], {}, {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if not ttft:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    wall = time.perf_counter() - t0
    n = int(usage.get("completion_tokens") or len(text))
    return ttft, wall, n, "".join(text), {k: int(timings.get(k) or 0) for k in ("draft_n", "draft_n_accepted")}


def start_all(arms: list[Arm], log_dir: Path) -> None:
    """Start every arm, then send each a warm-up request: first-request costs are no arm's speed."""
    for arm in arms:
        print(f"starting {arm.name} ...", file=sys.stderr, flush=True)
        arm.start(log_dir)
    for arm in arms:
        chat(arm.url, [{"role": "user", "content": "Hello"}], 8)


def forget(arm: Arm) -> None:
    """specdash: start the request cold, as a new prompt would (its suffix drafter would
    otherwise recall this very answer from the round before: the same prompt again). The
    server is restarted: `forget` is not steerable over HTTP (issue 56), and a restart is
    what a fresh memory is; its kept cost profile makes the restart no cold start for
    adaptive K. A warm-up request follows, as at the first start."""
    if arm.name.startswith("specdash"):  # every specdash arm (serve_concurrency's -fifo too)
        assert arm.log_dir is not None, "start it first"
        arm.stop()
        arm.start(arm.log_dir)
        chat(arm.url, [{"role": "user", "content": "Hello"}], 8)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f}..{max(xs):.2f}" if xs else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96, help="max_tokens per request (default 96)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--n-max", type=int, default=4, help="llama-server's --spec-draft-n-max (default 4; 8 ran "
                    "at a third of plain decoding on a 2-core EPYC)")
    ap.add_argument("--prompts", help="comma-separated prompt names (default: all)")
    ap.add_argument("--no-concurrent", action="store_true", help="skip the two-client rounds")
    ap.add_argument("--out", type=Path, help="write the report here too")
    args = ap.parse_args()

    prompts = [(p.name, p.text) for p in all_prompts()]
    prompts += [(f.stem, f.read_text(encoding="utf-8").strip()) for f in sorted(SERVE_PROMPTS.glob("*.txt"))]
    if args.prompts:
        wanted = args.prompts.split(",")
        prompts = [p for p in prompts if p[0] in wanted]
    servers = arms(args.ctx, args.n_max, args.threads)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "serve-bench"
    log_dir.mkdir(exist_ok=True)
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    results: list[Result] = []
    pairs: list[Result] = []  # two clients at once: one row per request
    chats: list[Result] = []
    try:
        start_all(servers, log_dir)
        for rnd in range(args.rounds):
            order = servers[rnd % len(servers):] + servers[: rnd % len(servers)]
            for name, text in prompts:
                for arm in order:
                    forget(arm)
                    ttft, wall, n, out, extra = chat(arm.url, [{"role": "user", "content": text}], args.tokens)
                    results.append(Result(arm.name, name, rnd, ttft, wall, n, out, extra))
                    print(f"round {rnd + 1} {name:24s} {arm.name:12s} ttft {ttft:5.2f}s  {n:4d} tok  "
                          f"{results[-1].decode_tps:6.1f} tok/s decode  drafted {extra.get('draft_n', 0)}",
                          file=sys.stderr, flush=True)
            for arm in order:  # the chat: three turns, each resending the conversation
                forget(arm)
                messages: list[dict[str, str]] = []
                for turn, ask in enumerate(CHAT):
                    messages.append({"role": "user", "content": ask})
                    ttft, wall, n, out, extra = chat(arm.url, messages, args.tokens)
                    messages.append({"role": "assistant", "content": out})
                    chats.append(Result(arm.name, f"turn {turn + 1}", rnd, ttft, wall, n, out, extra))
            if not args.no_concurrent:
                for i in range(0, len(prompts) - 1, 2):
                    a, b = prompts[i], prompts[i + 1]
                    for arm in order:
                        forget(arm)
                        got: list[Result] = []
                        t0 = time.perf_counter()

                        def one(p: tuple[str, str], arm: Arm = arm) -> None:
                            ttft, wall, n, out, extra = chat(arm.url, [{"role": "user", "content": p[1]}], args.tokens)
                            got.append(Result(arm.name, p[0], rnd, ttft, wall, n, out, extra))

                        threads = [threading.Thread(target=one, args=(p,)) for p in (a, b)]
                        for t in threads:
                            t.start()
                        for t in threads:
                            t.join()
                        span = time.perf_counter() - t0
                        for r in got:
                            r.extra["pair_span_ms"] = int(span * 1000)
                        pairs += got
    finally:
        for arm in servers:
            arm.stop()

    names = [a.name for a in servers]
    say(f"# specdash serve vs llama-server: {platform.node()} {platform.machine()}, {args.threads} threads, "
        f"{args.rounds} paired rounds, max_tokens {args.tokens}, temperature 0, chat completions streamed")
    say(f"# command: python benchmarks/serve_vs_llamaserver.py {' '.join(sys.argv[1:])}")
    say(f"# target {DEFAULT_TARGET}, draft {DEFAULT_DRAFT} (llama-draft: --spec-draft-n-max {args.n_max})")
    say("")
    say("## One client: decode tok/s (median over rounds) and the ratio specdash / the best llama-server arm")
    say(f"{'prompt':24s} " + " ".join(f"{n:>12s}" for n in names) + "   specdash/best (spread)   ttft ratio")
    all_ratios: dict[str, list[float]] = {}
    for name, _ in prompts:
        per = {n: [r for r in results if r.arm == n and r.prompt == name] for n in names}
        tps = {n: med([r.decode_tps for r in per[n]]) for n in names}
        best = max(("llama-plain", "llama-draft", "llama-ngram"), key=lambda n: tps[n])
        ratios = [s.decode_tps / b.decode_tps for s in per["specdash"] for b in per[best]
                  if s.rnd == b.rnd and b.decode_tps > 0]
        e2e = [s.e2e_tps / b.e2e_tps for s in per["specdash"] for b in per[best] if s.rnd == b.rnd and b.e2e_tps > 0]
        ttft = [s.ttft / b.ttft for s in per["specdash"] for b in per["llama-plain"] if s.rnd == b.rnd and b.ttft > 0]
        all_ratios[name] = ratios
        say(f"{name:24s} " + " ".join(f"{tps[n]:12.1f}" for n in names)
            + f"   {med(ratios):.2f}x vs {best} ({spread(ratios)}; e2e {med(e2e):.2f}x)   {med(ttft):.2f}x")
    say("")
    say("## Time to first token, one client (median seconds)")
    say(f"{'prompt':24s} " + " ".join(f"{n:>12s}" for n in names))
    for name, _ in prompts:
        say(f"{name:24s} " + " ".join(
            f"{med([r.ttft for r in results if r.arm == n and r.prompt == name]):12.3f}" for n in names))
    say("")
    say("## The three-turn chat: TTFT per turn (median seconds) and specdash / llama-plain")
    say(f"{'turn':8s} " + " ".join(f"{n:>12s}" for n in names) + "   specdash/llama-plain")
    for turn in range(1, len(CHAT) + 1):
        t = {n: [r for r in chats if r.arm == n and r.prompt == f"turn {turn}"] for n in names}
        ratio = [s.ttft / b.ttft for s in t["specdash"] for b in t["llama-plain"] if s.rnd == b.rnd and b.ttft > 0]
        say(f"turn {turn:<3d} " + " ".join(f"{med([r.ttft for r in t[n]]):12.3f}" for n in names)
            + f"   {med(ratio):.2f}x ({spread(ratio)})")
    if pairs:
        say("")
        say("## Two clients at once: total tok/s (both requests' tokens over the pair's wall time, median), "
            "and TTFT p50/p90 over every request")
        say(f"{'arm':12s} {'total tok/s':>12s} {'ttft p50':>9s} {'ttft p90':>9s}")
        for n in names:
            rs = [r for r in pairs if r.arm == n]
            by_pair: dict[tuple[int, int], list[Result]] = {}
            for r in rs:
                by_pair.setdefault((r.rnd, r.extra["pair_span_ms"]), []).append(r)
            totals = [sum(r.tokens for r in g) / (g[0].extra["pair_span_ms"] / 1000) for g in by_pair.values()]
            ttfts = sorted(r.ttft for r in rs)
            p90 = ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))] if ttfts else float("nan")
            say(f"{n:12s} {med(totals):12.1f} {med(ttfts):9.3f} {p90:9.3f}")
    say("")
    say("## Same text? (specdash's greedy output vs llama-plain's, per prompt, round 1)")
    for name, _ in prompts:
        s = next((r for r in results if r.arm == "specdash" and r.prompt == name and r.rnd == 0), None)
        b = next((r for r in results if r.arm == "llama-plain" and r.prompt == name and r.rnd == 0), None)
        if s and b:
            common = next((i for i, (x, y) in enumerate(zip(s.text, b.text)) if x != y), min(len(s.text), len(b.text)))
            say(f"{name:24s} {'identical' if s.text == b.text else f'first {common} chars equal'}")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
