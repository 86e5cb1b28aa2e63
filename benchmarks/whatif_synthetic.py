"""Does `specdash whatif --acceptance-rates` predict what llama-server does with the same
synthetic acceptance? A check of whatif's cost model against an engine no one here wrote.

llama-server (built from the vendored llama.cpp, started through
specdash.tuning.llamacpp_tools.tool_command) runs the default pair as target and draft model
(draft-simple: every step drafts K tokens, the draft model's cost is paid in full) with
`--spec-synth-rates r_1..r_K`: drafts are accepted at random with those unconditional
per-position rates, whatever the target would have said. So the acceptance is known
before the run, and the only thing left to predict is what the steps cost. The rates
are geometric, r_i = p^i (what `whatif --acceptance-length L --at-k K0` makes of a
length read at K0), so every K runs the same per-token acceptance; each K is its own
server start (llama-server fixes the draft limit and the rates at launch).

Each round: this machine's profile is measured the way `whatif --profile here` measures
it (whatif.measure.measure_profile: the same GGUFs, threads and weight repacking; a
short plain greedy run for the level, target batches 1..33, draft-model tokens), then
llama-server runs plain decoding (no speculation) and every K, in an order rotated
round by round, one request each (after a short warm-up request on the same server),
at temperature 0. Reported per (round, K):

- predicted tok/s on the round's profile (synthetic.predict) against the server's
  `timings.predicted_per_second`: the raw error (the level of two engines);
- the same at the acceptance the draws actually gave (the server's per-position
  counters from /metrics over the request, r_i = accepted at i / drafts), which
  removes the draws' luck from the error;
- paired: predicted speed-up over plain decoding (both from the round's profile)
  against the measured speed-up over the round's plain server run: what is left is
  the cost model's shape, not the level of either engine; and the same at the drawn
  rates (the headline: neither the engines' level nor the draws' luck).

    python benchmarks/whatif_synthetic.py                        # default pair, p=0.8, K=1,2,4,8, 3 rounds, 96 tokens
    python benchmarks/whatif_synthetic.py --target smollm2-135m --draft smollm2-135m --rounds 1 --ks 2 \\
        --tokens 16 --out /tmp/x.txt                             # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from specdash.engine.settings import EngineSettings
from specdash.tuning.llamacpp_tools import tool_command
from specdash.models.resolve import resolve_model
from specdash.tuning.prompts import BUILTIN
from specdash.monitor.remote.backends import snapshot
from specdash.monitor.remote.metrics import parse
from specdash.tuning.whatif.measure import measure_profile
from specdash.costs.profile import Profile
from specdash.tuning.whatif.synthetic import MODEL, geometric, plain_tokens_per_s, predict
from whatif_accuracy import Report  # benchmarks/ is sys.path[0] when this runs

ROOT = Path(__file__).resolve().parent.parent
PROMPT = BUILTIN[0].text  # what is accepted is drawn; the prompt only sets the context length


@dataclass
class Measured:
    tokens_per_s: float
    n: int
    draft_n: int
    accepted_n: int
    rates: list[float]  # realized unconditional per-position rates ([] for plain)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def counters(url: str) -> tuple[int, list[int]]:
    """(drafts, accepted per position) from llama-server's /metrics, through specdash's parser."""
    c = snapshot(parse(httpx.get(url + "/metrics", timeout=10).text), "llamacpp").counters
    return int(c.num_drafts), [int(v) for v in c.per_pos]


def run_server(target: Path, draft: Path, k: int, p: float, threads: int, ctx: int, tokens: int, seed: int,
               log: Path) -> Measured:
    """One llama-server at K (0: no speculation), a warm-up request, then the measured one."""
    port = free_port()
    spec: list[str] = []
    if k > 0:
        rates = ",".join(f"{r:.9g}" for r in geometric(p, k))
        spec = ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                "--spec-draft-n-min", "0", "--spec-synth-rates", rates, "-td", str(threads), "-tbd", str(threads)]
    argv = tool_command("llama-server", "-m", str(target), *spec, "-t", str(threads), "-tb", str(threads),
                        "-c", str(ctx), "-np", "1", "--temp", "0", "--metrics", "--host", "127.0.0.1",
                        "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited with {proc.returncode}; see {log}")
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"llama-server did not start in 180 s; see {log}")
            time.sleep(0.2)

        def complete(n: int, s: int) -> dict[str, Any]:
            body = {"prompt": PROMPT, "n_predict": n, "temperature": 0.0, "cache_prompt": False, "seed": s,
                    "ignore_eos": True}
            r = httpx.post(url + "/completion", json=body, timeout=900.0)
            r.raise_for_status()
            return dict(r.json())

        complete(4, seed + 7919)  # warm-up: the first request allocates
        drafts0, pos0 = counters(url) if k else (0, [])
        t = complete(tokens, seed)["timings"]
        rates: list[float] = []
        if k:
            drafts1, pos1 = counters(url)
            d = drafts1 - drafts0
            rates = [((pos1[i] if i < len(pos1) else 0) - (pos0[i] if i < len(pos0) else 0)) / d if d else 0.0
                     for i in range(k)]
        return Measured(float(t["predicted_per_second"]), int(t["predicted_n"]), int(t.get("draft_n") or 0),
                        int(t.get("draft_n_accepted") or 0), rates)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="the draft model (a name or a GGUF path)")
    ap.add_argument("--per-token", type=float, default=0.8, metavar="P",
                    help="the synthetic per-token acceptance: rates P, P^2, ..., P^K (default 0.8)")
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96, help="tokens per measured request (default 96)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "whatif-synthetic.txt"))
    args = ap.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    if not 0 < args.per_token <= 1 or any(not 1 <= k <= 64 for k in ks):
        raise SystemExit("--per-token must be within (0, 1], --ks within 1..64")
    target, draft = resolve_model(args.target), resolve_model(args.draft)
    settings = EngineSettings(target=args.target, draft=args.draft, threads=args.threads, ctx=args.ctx)
    log = Path(tempfile.gettempdir()) / "whatif-synthetic-server.log"  # llama-server's output, if it fails
    log.unlink(missing_ok=True)
    say = Report()
    say(f"# python benchmarks/whatif_synthetic.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    say(f"# whatif --acceptance-rates (geometric, {args.per_token:g} per token) vs llama-server --spec-synth-rates: "
        f"{args.target} + {args.draft}, {args.tokens} tokens, K={args.ks}, {args.rounds} paired rounds, "
        f"{args.threads} threads, {time.strftime('%Y-%m-%d %H:%M')}")
    say("| round | K | rates | predicted tok/s | measured tok/s | error | acceptance pred / meas "
        "| predicted at the drawn rates | error (drawn) | speed-up pred / meas | error (paired) "
        "| speed-up at the drawn rates pred / meas | error (paired, drawn) |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    raw: list[float] = []
    drawn: list[float] = []
    paired: list[float] = []
    paired_drawn: list[float] = []
    by_k: dict[int, list[float]] = {k: [] for k in ks}
    cases = [0, *ks]
    t_start = time.monotonic()
    for r in range(args.rounds):
        profile: Profile = measure_profile(settings, PROMPT, lambda s: print(f"  {s}", file=sys.stderr, flush=True))
        plain_pred = plain_tokens_per_s(profile)
        order = cases[r % len(cases):] + cases[: r % len(cases)]
        got: dict[int, Measured] = {}
        for k in order:
            got[k] = run_server(target, draft, k, args.per_token, args.threads, args.ctx, args.tokens,
                                seed=1000 * (r + 1) + k, log=log)
            print(f"  round {r + 1} K={k}: {got[k].tokens_per_s:.2f} tok/s", file=sys.stderr, flush=True)
        plain = got[0]
        err = plain_pred / plain.tokens_per_s - 1
        raw.append(abs(err))
        say(f"| {r + 1} | plain | - | {plain_pred:.2f} | {plain.tokens_per_s:.2f} | {err:+.1%} | - | - | - | - | - "
            "| - | - |")
        for k in ks:
            m = got[k]
            want = predict(profile, geometric(args.per_token, k), MODEL)
            at_drawn = predict(profile, m.rates, MODEL)
            e_raw = want.tokens_per_s / m.tokens_per_s - 1
            e_drawn = at_drawn.tokens_per_s / m.tokens_per_s - 1
            sp_pred = want.tokens_per_s / plain_pred
            sp_meas = m.tokens_per_s / plain.tokens_per_s
            e_pair = sp_pred / sp_meas - 1
            sp_drawn = at_drawn.tokens_per_s / plain_pred
            e_pair_drawn = sp_drawn / sp_meas - 1
            raw.append(abs(e_raw))
            drawn.append(abs(e_drawn))
            paired.append(abs(e_pair))
            paired_drawn.append(abs(e_pair_drawn))
            by_k[k].append(e_pair_drawn)
            acc_meas = m.accepted_n / m.draft_n if m.draft_n else 0.0
            say(f"| {r + 1} | {k} | {','.join(f'{x:.3g}' for x in geometric(args.per_token, k))} "
                f"| {want.tokens_per_s:.2f} | {m.tokens_per_s:.2f} | {e_raw:+.1%} "
                f"| {want.acceptance:.1%} / {acc_meas:.1%} | {at_drawn.tokens_per_s:.2f} | {e_drawn:+.1%} "
                f"| {sp_pred:.2f} / {sp_meas:.2f} | {e_pair:+.1%} | {sp_drawn:.2f} / {sp_meas:.2f} | {e_pair_drawn:+.1%} |")
        say(f"<!-- round {r + 1} profile: verify 1/2/5/9 tokens {profile.verify_ms(1):.1f}/{profile.verify_ms(2):.1f}/"
            f"{profile.verify_ms(5):.1f}/{profile.verify_ms(9):.1f} ms, draft {profile.draft_ms:.1f} ms a token, "
            f"2-token sync {profile.feed_ms(2):.1f} ms, overhead {profile.overhead_ms:.2f} ms -->")
    say("")
    say(f"median |error|: {statistics.median(raw):.1%} (tok/s, {len(raw)} cases, plain included; max {max(raw):.1%}); "
        f"{statistics.median(drawn):.1%} at the drawn rates (max {max(drawn):.1%}); "
        f"{statistics.median(paired):.1%} paired, as a speed-up over the round's plain run (max {max(paired):.1%}, "
        f"{len(paired)} cases)")
    say(f"median |error| paired at the drawn rates: {statistics.median(paired_drawn):.1%} "
        f"(max {max(paired_drawn):.1%}, {len(paired_drawn)} cases)")
    say("paired error at the drawn rates by K (median over rounds, signed): "
        + ", ".join(f"K={k} {statistics.median(v):+.1%}" for k, v in by_k.items() if v))
    say(f"wall time {time.monotonic() - t_start:.0f} s")
    say.write(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
