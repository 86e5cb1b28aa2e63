#!/usr/bin/env python
"""specdash's `mtp` drafter against llama-server's `--spec-type draft-mtp`, engine against
engine on the same drafts (issue 33).

    python benchmarks/mtp.py --out benchmarks/results/mtp.txt
    python benchmarks/mtp.py --quick      # smoke: the tiny fixture, K=1,2, 1 round, 24 tokens

Model: the bench-size random-weight qwen35 with one MTP head of tests/fixtures/mtp_gguf.py
(430 MB, Q8_0: 24 hybrid gated-delta-net + attention layers, n_embd 1024, SmolLM2's
49k vocabulary), written on first use into <cache>/fixtures. Random weights make its
acceptance meaningless as a figure about MTP heads: what is compared is the two engines
on the SAME drafts, so the drafted and accepted counts must be equal on both sides (the
script says MISMATCH otherwise).

Per K (--ks, default 1,2,3,4), in --rounds paired rounds (the order alternates each round):
- specdash: a Session in this process (`--draft mtp --k K`, no joint cut, --threads),
  greedy, the prompt's token ids; tok/s is the run's decode tok/s (Summary.tokens_per_s);
  the head's ms per drafted token is the drafting steps' draft_ms over their drafted
  tokens (its feed of the committed entries included); the target step is the median
  verify_ms of the plain (K=0) run of the round;
- llama-server (same vendored llama.cpp, specdash.tuning.llamacpp_tools), started afresh for each
  run (its head pairs position 0 with the last request's hidden row: a fresh server
  drafts as specdash does), `--spec-type draft-mtp --spec-draft-n-max K -lv 4`, the same
  token ids to /completion at temperature 0; tok/s is timings.predicted_per_second; its
  head's ms per drafted token is its draft time over its drafted tokens from the trace
  log's `statistics draft-mtp ... dur(b,g,a)` (drafting only: its feed of each verify
  batch runs inside the decode and is not in that figure).
The ratio specdash / llama-server is taken within a round; the report gives medians and
the min-max across rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
STATS = re.compile(r"statistics\s+draft-mtp:.*#gen tokens =\s*(\d+).*dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")


def _fixture(size: str) -> Path:
    spec = importlib.util.spec_from_file_location("mtp_gguf", ROOT / "tests" / "fixtures" / "mtp_gguf.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["mtp_gguf"] = module
    spec.loader.exec_module(module)
    return Path(module.fixture_path(size=size))


@dataclass
class Run:
    tok_s: float
    drafted: int
    accepted: int
    head_ms: float | None  # per drafted token
    step_ms: float | None = None  # the target's plain step (specdash's K=0 run)
    tokens: list[int] = field(default_factory=list)


def specdash_run(session: Any, prompt: list[int], k: int, n: int) -> Run:
    from specdash.contract import events as E

    for cmd in (E.SetK(k), E.SetAdaptive(False)):
        session.send(cmd)
    list(session.apply_pending())
    events = list(session.engine.generate(prompt, n))
    steps = [ev for ev in events if isinstance(ev, E.StepEvent)]
    summary = next(ev for ev in events if isinstance(ev, E.Summary))
    drafting = [s for s in steps if s.drafted]
    drafted = sum(s.drafted for s in steps)
    head = sum(s.draft_ms for s in drafting) / drafted if drafted else None
    plain = [s.verify_ms for s in steps if not s.drafted]
    return Run(summary.tokens_per_s, summary.num_draft_tokens, summary.num_accepted_tokens, head,
               statistics.median(plain) if plain else None, [t for s in steps for t in s.tokens])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_run(model: Path, prompt: list[int], k: int, n: int, threads: int, log: Path) -> Run:
    import httpx

    from specdash.tuning.llamacpp_tools import tool_command

    port = _port()
    argv = tool_command("llama-server", "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "1024",
                        "-t", str(threads), "-np", "1", "-lv", "4", "--spec-type", "draft-mtp",
                        "--spec-draft-n-max", str(k), "--spec-draft-p-min", "0")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {proc.returncode}; see {log}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server did not start; see {log}")
                time.sleep(0.2)
            reply = httpx.post(f"http://127.0.0.1:{port}/completion", timeout=600, json={
                "prompt": prompt, "n_predict": n, "temperature": 0.0, "cache_prompt": False,
                "return_tokens": True}).json()
        finally:
            proc.terminate()  # a clean exit prints the speculative statistics
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    timings = reply["timings"]
    head = None
    for m in STATS.finditer(log.read_text(errors="replace")):
        gen, draft_ms = int(m.group(1)), float(m.group(3))
        head = draft_ms / gen if gen else None
    return Run(float(timings["predicted_per_second"]), int(timings.get("draft_n", 0)),
               int(timings.get("draft_n_accepted", 0)), head, tokens=[int(t) for t in reply["tokens"]])


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mid(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="1,2,3,4", help="Ks (default 1,2,3,4)")
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (default 3)")
    ap.add_argument("--tokens", type=int, default=96, help="tokens per run (default 96)")
    ap.add_argument("--threads", type=int, default=2, help="threads on both sides (default 2)")
    ap.add_argument("--quick", action="store_true", help="the tiny fixture, K=1,2, one round, 24 tokens")
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    ks = [1, 2] if args.quick else [int(k) for k in args.ks.split(",")]
    rounds, n = (1, 24) if args.quick else (args.rounds, args.tokens)
    model = _fixture("tiny" if args.quick else "bench")

    from specdash.engine.settings import EngineSettings
    from specdash.sources.session import Session

    lines = [f"$ {shlex.join(['python', 'benchmarks/mtp.py', *(argv if argv is not None else sys.argv[1:])])}",
             f"machine: {_cpu()}, {args.threads} threads both sides; "
             f"model {model.name} ({model.stat().st_size / 1e6:.0f} MB, random weights: the acceptance "
             "itself means nothing, only that both engines draft and accept the same)",
             f"prompt {PROMPT!r}, {n} greedy tokens, {rounds} paired rounds per K, a fresh llama-server per run"]
    print("\n".join(lines), flush=True)
    s = EngineSettings(target=str(model), draft="mtp", k=1, adaptive=False, threads=args.threads, ctx=1024,
                       max_tokens=n, raw=True, draft_p_joint=0.0, draft_p_min=0.0)
    session = Session(s)
    ours: dict[int, list[Run]] = {k: [] for k in ks}
    theirs: dict[int, list[Run]] = {k: [] for k in ks}
    plain: list[Run] = []
    mismatches: list[str] = []
    try:
        prompt = session.prompt_tokens(PROMPT)
        with tempfile.TemporaryDirectory(prefix="specdash-mtp-bench-") as tmp:
            for r in range(rounds):
                plain.append(specdash_run(session, prompt, 0, n))
                for k in ks:
                    pair: list[tuple[str, Run]] = []
                    for side in (("specdash", "server") if (r + k) % 2 == 0 else ("server", "specdash")):
                        if side == "specdash":
                            pair.append((side, specdash_run(session, prompt, k, n)))
                        else:
                            pair.append((side, server_run(model, prompt, k, n, args.threads,
                                                          Path(tmp) / f"server-{r}-{k}.log")))
                    a = next(run for side, run in pair if side == "specdash")
                    b = next(run for side, run in pair if side == "server")
                    ours[k].append(a)
                    theirs[k].append(b)
                    same = (a.drafted, a.accepted) == (b.drafted, b.accepted) and a.tokens == b.tokens
                    if not same:
                        mismatches.append(f"round {r + 1} K={k}: specdash {a.drafted}/{a.accepted}, llama-server "
                                          f"{b.drafted}/{b.accepted}, same text {a.tokens == b.tokens}")
                    print(f"  round {r + 1} K={k}: specdash {a.tok_s:.1f} tok/s, llama-server {b.tok_s:.1f} tok/s; "
                          f"drafted/accepted {a.drafted}/{a.accepted} vs {b.drafted}/{b.accepted}"
                          + ("" if same else "  MISMATCH"), flush=True)
    finally:
        session.close()
    step = [p.step_ms for p in plain if p.step_ms]
    lines += ["", f"plain decoding (specdash K=0): {_mid([p.tok_s for p in plain])} tok/s, target step "
              f"{_mid(step)} ms", "",
              f"{'K':>2}  {'specdash tok/s':>22}  {'llama-server tok/s':>22}  {'ratio':>18}  "
              f"{'head ms/token (spd)':>20}  {'head ms/token (srv)':>20}  {'drafted/accepted':>16}"]
    for k in ks:
        a, b = ours[k], theirs[k]
        ratio = [x.tok_s / y.tok_s for x, y in zip(a, b) if y.tok_s]
        counts = sorted({(x.drafted, x.accepted) for x in a})
        lines.append(f"{k:>2}  {_mid([x.tok_s for x in a]):>22}  {_mid([y.tok_s for y in b]):>22}  "
                     f"{_mid(ratio):>18}  {_mid([x.head_ms for x in a if x.head_ms]):>20}  "
                     f"{_mid([y.head_ms for y in b if y.head_ms]):>20}  "
                     f"{', '.join(f'{d}/{acc}' for d, acc in counts):>16}")
    if step:
        rel = [x.head_ms / statistics.median(step) for k in ks for x in ours[k] if x.head_ms]
        lines += ["", f"a head token costs {_mid(rel)} of a target step here (specdash; the session priced it at "
                  f"{session.mtp_relative_cost:.2f} from the head's share of the weights)"]
    lines += ["", "head ms/token: specdash's includes feeding the head the committed tokens' entries; "
              "llama-server's is its draft time only (its head is fed inside each verify decode)."]
    lines.append("")
    lines.append("drafted and accepted counts: " + ("equal on both sides in every run" if not mismatches else
                                                     "MISMATCH\n  " + "\n  ".join(mismatches)))
    report = "\n".join(lines)
    print("\n" + report)
    if args.out:
        args.out.write_text(report + "\n", encoding="utf-8")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
