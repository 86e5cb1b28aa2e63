#!/usr/bin/env python
"""What rolling back a recurrent state costs, and specdash vs llama-server on hybrid and
recurrent models (issue 19).

    python benchmarks/recurrent_rollback.py --out benchmarks/results/recurrent-rollback.txt
    python benchmarks/recurrent_rollback.py --quick      # smoke: tiny fixtures, 1 round, 32 tokens

Models: the random-weight fixtures of tests/fixtures/recurrent_gguf.py at --size bench (a
few hundred MB, generated on first use into <cache>/fixtures: a decode step takes
milliseconds as a real model's does, so Python's per-step overhead does not decide the
race): lfm2 (hybrid, llama.cpp state snapshots), mamba2 (pure recurrent, checkpoint +
replay), granitehybrid (hybrid, checkpoint + replay), each with its perturbed copy as
draft model. Baseline: the default transformer pair (KV cache, no rollback cost).

Per model x drafter (lookup, the draft model) at --k, in --rounds paired rounds:
- specdash: `specdash run --raw --json`; from its step events the rollback strategy
  (StepEvent.rollback: "" for a KV cache, "snapshots", "checkpoint"), ms per step spent
  on rollback (StepEvent.rollback_ms: save + restore + replay, with any finer
  rollback_*_ms fields the engine adds), bytes per checkpoint (StepEvent.checkpoint_bytes),
  and SettingsEvent.rollback (the human description, e.g. "rollback: snapshots (n_rs_seq 16)");
  snapshot memory is the recurrent state from the header x (1 + n_rs_seq);
- llama-server (same vendored llama.cpp, built by specdash.tuning.llamacpp_tools): the same
  prompt token ids to /completion at temperature 0, -md DRAFT --spec-type draft-simple, or
  --spec-type ngram-simple (n-gram 3, K tokens) for lookup (llama.cpp's n-gram drafter: similar to specdash's
  lookup, not the same matching rule, so acceptance may differ; both are printed). With
  a separate draft model or n-grams llama-server always uses checkpoints, even on lfm2.
- tok/s: decode only on both sides (specdash's summary tokens_per_s; llama-server's
  timings.predicted_per_second). Each round runs both, alternating which goes first; the
  ratio is taken within a round; the report gives the median and min-max of the ratios.

The machine's load moves absolute tok/s; the paired ratios and per-step ms move less.
The script needs the engine's rollback fields (issue 19); if a specdash run fails, that
configuration's line says why and the others go on.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specdash.models.rollback_info import (  # noqa: E402
    ARRAY_KEY_SUFFIXES,
    DEFAULT_N_RS_SEQ,
    expected_strategy,
    human_bytes,
    recurrent_state_bytes,
)

RUN_TIMEOUT_S = 1800
ARCHS = ("lfm2", "mamba2", "granitehybrid")
DEFAULT_PROMPT = "code-generation"


class BenchError(Exception):
    """A run failed or printed something this script cannot read."""


def _fixtures_module() -> Any:
    path = ROOT / "tests" / "fixtures" / "recurrent_gguf.py"
    spec = importlib.util.spec_from_file_location("recurrent_gguf", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["recurrent_gguf"] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Model:
    label: str
    arch: str
    target: Path
    draft: Path


@dataclass
class Side:
    """One run of one side."""

    tokens_per_s: float
    n_generated: int
    drafted: int
    accepted: int
    tokens: list[int] = field(default_factory=list)
    # specdash only
    strategy: str = ""
    description: str = ""
    steps: int = 0
    partial: int = 0
    step_ms: float = 0.0  # mean per step
    rollback_ms: dict[str, float] = field(default_factory=dict)  # field -> mean per step
    checkpoint_bytes: int = 0
    n_prompt: int = 0


# ------------------------------------------------------------------------------ specdash

def specdash_run(model: Model, drafter: str, args: argparse.Namespace, prompt_file: Path) -> Side:
    draft = str(model.draft) if drafter == "draft" else "lookup"
    cmd = [sys.executable, "-m", "specdash", "run", "--raw", "--target", str(model.target), "--draft", draft,
           "--k", str(args.k), "--temp", "0", "--max-tokens", str(args.tokens), "--threads", str(args.threads),
           "--ctx", str(args.ctx), "--prompt-file", str(prompt_file), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=RUN_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, cwd=ROOT)
    if proc.returncode != 0:
        last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise BenchError(f"specdash run failed (exit {proc.returncode}): {last[0]}")
    return parse_specdash_run(proc.stdout)


def parse_specdash_run(stdout: str) -> Side:
    """The step, settings and summary events of `specdash run --json`."""
    events = [json.loads(ln) for ln in stdout.splitlines() if ln.startswith("{")]
    steps = [e for e in events if e.get("event") == "step"]
    summary = next((e for e in reversed(events) if e.get("event") == "summary"), None)
    settings = next((e for e in events if e.get("event") == "settings"), {})
    if summary is None or not steps:
        raise BenchError("specdash run printed no summary or no step")
    if "rollback_ms" not in steps[0]:
        raise BenchError("step events carry no rollback_ms: the engine's rollback (issue 19) is not in this tree")
    ms_fields = sorted(k for k in steps[0] if k.startswith("rollback") and k.endswith("_ms"))
    rollback_ms = {k: statistics.fmean(float(s.get(k) or 0.0) for s in steps) for k in ms_fields}
    ckpt = [int(s.get("checkpoint_bytes") or 0) for s in steps if s.get("checkpoint_bytes")]
    strategies = {s.get("rollback", "") for s in steps if s.get("drafted")}
    return Side(
        tokens_per_s=float(summary["tokens_per_s"]), n_generated=int(summary["n_generated"]),
        drafted=int(summary["num_draft_tokens"]), accepted=int(summary["num_accepted_tokens"]),
        tokens=[t for s in steps for t in s["tokens"]],
        strategy="/".join(sorted(strategies)) or steps[0].get("rollback", ""),
        description=str(settings.get("rollback", "")),
        steps=len(steps), partial=sum(1 for s in steps if 0 < s["drafted"] and s["accepted"] < s["drafted"]),
        step_ms=statistics.fmean(s["draft_ms"] + s["verify_ms"] + s["other_ms"] for s in steps),
        rollback_ms=rollback_ms, checkpoint_bytes=int(statistics.median(ckpt)) if ckpt else 0,
        n_prompt=int(summary.get("n_prompt") or 0),
    )


# --------------------------------------------------------------------------- llama-server

class Server:
    """llama-server serving one model with one drafter, for the whole set of rounds."""

    def __init__(self, model: Model, drafter: str, args: argparse.Namespace, log: Path):
        from specdash.tuning.llamacpp_tools import ensure_built, tool_command

        ensure_built(["llama-server"])
        spec = (["-md", str(model.draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(args.k)]
                if drafter == "draft" else
                ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                 "--spec-ngram-simple-size-m", str(args.k), "--spec-draft-n-max", str(args.k)])
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [*tool_command("llama-server"), "-m", str(model.target), "--host", "127.0.0.1",
                "--port", str(self.port), "-c", str(args.ctx), "-t", str(args.threads), "-ub", "512",
                "-np", "1", *spec]
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self._wait()

    def _wait(self, timeout: float = 600.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"llama-server exited with {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.close()
        raise BenchError(f"llama-server not healthy in {timeout:g} s; see {self.log}")

    def complete(self, prompt: list[int], n: int) -> Side:
        import httpx

        body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "cache_prompt": False,
                "return_tokens": True}
        r = httpx.post(self.url + "/completion", json=body, timeout=RUN_TIMEOUT_S)
        r.raise_for_status()
        d = r.json()
        t = d["timings"]
        return Side(tokens_per_s=float(t["predicted_per_second"]), n_generated=int(t["predicted_n"]),
                    drafted=int(t.get("draft_n", 0)), accepted=int(t.get("draft_n_accepted", 0)),
                    tokens=[int(x) for x in d.get("tokens", [])], n_prompt=int(t.get("prompt_n", 0)))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -------------------------------------------------------------------------------- report

def _med(xs: Sequence[float]) -> str:
    return f"{statistics.median(xs):.2f}" if xs else "-"


def _spread(xs: Sequence[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"


def snapshot_memory(model: Model, description: str) -> str:
    """The header's recurrent state x (1 + n_rs_seq in force, read from SettingsEvent.rollback)."""
    from specdash.models.gguf_header import read_gguf_header

    header = read_gguf_header(model.target, array_suffixes=ARRAY_KEY_SUFFIXES)
    state = recurrent_state_bytes(model.arch, header.metadata)
    if not state:
        return "-"
    n = DEFAULT_N_RS_SEQ
    if "n_rs_seq" in description:
        digits = description.split("n_rs_seq", 1)[1].strip().split(")")[0].strip()
        n = int(digits) if digits.isdigit() else n
    return f"{human_bytes(state * (n + 1))} ({n + 1} x {human_bytes(state)})"


def bench_config(model: Model, drafter: str, args: argparse.Namespace, prompt_text: str,
                 prompt_tokens: list[int], work: Path, say: Callable[[str], None]) -> list[str]:
    prompt_file = work / "prompt.txt"
    prompt_file.write_text(prompt_text, encoding="utf-8")
    ours: list[Side] = []
    peers: list[Side] = []
    ratios: list[float] = []
    error = ""
    server = Server(model, drafter, args, work / f"server-{model.label}-{drafter}.log")
    try:
        for rnd in range(args.rounds):
            order = ("specdash", "server") if rnd % 2 == 0 else ("server", "specdash")
            got: dict[str, Side] = {}
            for side in order:
                if side == "server":
                    got[side] = server.complete(prompt_tokens, args.tokens)
                elif not error:
                    try:
                        got[side] = specdash_run(model, drafter, args, prompt_file)
                    except BenchError as exc:
                        error = str(exc)
            if "server" in got:
                peers.append(got["server"])
            if "specdash" in got:
                ours.append(got["specdash"])
                if got.get("server") and got["server"].tokens_per_s > 0:
                    ratios.append(got["specdash"].tokens_per_s / got["server"].tokens_per_s)
            say(f"  round {rnd + 1}/{args.rounds}: " + ", ".join(
                f"{k} {v.tokens_per_s:.1f} tok/s" for k, v in got.items()) + (f"; {error}" if error else ""))
    finally:
        server.close()

    head = f"{model.label} ({model.arch}), drafter {drafter}, K {args.k}"
    lines = [head, "-" * len(head)]
    expected = expected_strategy(model.arch) if model.arch != "baseline" else "kv"
    if ours:
        s = ours[0]
        ms = {k: [o.rollback_ms.get(k, 0.0) for o in ours] for k in s.rollback_ms}
        lines.append(f"specdash rollback: {s.strategy or 'KV cache'} (expected from the arch table: {expected}); "
                     f"{s.description or '(no SettingsEvent.rollback)'}")
        lines.append("  ms per step: " + ", ".join(f"{k} {_med(v)} [{_spread(v)}]" for k, v in ms.items())
                     + f"; whole step {_med([o.step_ms for o in ours])} ms")
        lines.append(f"  steps {s.steps}, partial rejections {s.partial}; "
                     f"bytes per checkpoint {human_bytes(s.checkpoint_bytes) if s.checkpoint_bytes else '-'}; "
                     f"snapshot memory {snapshot_memory(model, s.description) if s.strategy == 'snapshots' else '-'}")
    else:
        lines.append(f"specdash: no run ({error})")
    for name, runs in (("specdash", ours), ("llama-server", peers)):
        if runs:
            acc = [r.accepted / r.drafted for r in runs if r.drafted]
            lines.append(f"  {name:<12} tok/s median {_med([r.tokens_per_s for r in runs])} "
                         f"[{_spread([r.tokens_per_s for r in runs])}], acceptance {_med(acc)}, "
                         f"tokens {runs[0].n_generated}, prompt {runs[0].n_prompt}")
    if ratios:
        lines.append(f"  specdash / llama-server: median {_med(ratios)} [{_spread(ratios)}] over {len(ratios)} rounds")
    if ours and peers:
        a, b = ours[0].tokens, peers[0].tokens
        same = a == b
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        lines.append(f"  same tokens as llama-server: {'yes' if same else f'no, first difference at {first}'}")
    if error and ours:
        lines.append(f"  (later rounds: {error})")
    return lines


def models(args: argparse.Namespace) -> list[Model]:
    out: list[Model] = []
    if args.baseline:
        from specdash.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
        from specdash.models.resolve import resolve_model

        out.append(Model("default pair", "baseline", Path(resolve_model(DEFAULT_TARGET)),
                         Path(resolve_model(DEFAULT_DRAFT))))
    fx = _fixtures_module()
    for arch in args.arch or ARCHS:
        target, draft = fx.target_and_draft(arch, size=args.size)
        out.append(Model(f"{arch}-{args.size}", arch, Path(target), Path(draft)))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=("tiny", "bench"), default="bench", help="fixture size (default bench)")
    p.add_argument("--arch", action="append", choices=ARCHS, help="fixture architecture (repeatable; default all)")
    p.add_argument("--drafter", action="append", choices=("lookup", "draft"), help="(repeatable; default both)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the default transformer pair")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"a built-in prompt name (default {DEFAULT_PROMPT})")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny fixtures, 1 round, 32 tokens, no baseline")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.rounds, args.tokens, args.baseline = "tiny", 1, 32, False
    for name in ("k", "rounds", "tokens", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] = print) -> int:
    args = parse_args(argv)
    from specdash.tuning.prompts import BUILTIN

    prompts = {p.name: p.text for p in BUILTIN}
    if args.prompt not in prompts:
        print(f"--prompt: no built-in prompt {args.prompt!r}; choose from {', '.join(prompts)}", file=sys.stderr)
        return 2
    text = prompts[args.prompt]
    report = [
        f"recurrent_rollback.py {' '.join(argv if argv is not None else sys.argv[1:])}",
        f"{time.strftime('%Y-%m-%d %H:%M')} · {platform.machine()} · {args.threads} threads · "
        f"prompt {args.prompt} · {args.tokens} tokens · K {args.k} · {args.rounds} paired rounds",
        "",
    ]
    from specdash.engine.llm import LLM

    with tempfile.TemporaryDirectory(prefix="recurrent-rollback-") as tmp:
        work = Path(tmp)
        for model in models(args):
            vocab = LLM(model.target, vocab_only=True)
            prompt_tokens = vocab.tokenize(text)
            vocab.close()
            for drafter in args.drafter or ("lookup", "draft"):
                say(f"{model.label}: {drafter}")
                try:
                    lines = bench_config(model, drafter, args, text, prompt_tokens, work, say)
                except BenchError as exc:
                    lines = [f"{model.label} ({model.arch}), drafter {drafter}: {exc}"]
                report += [*lines, ""]
                for ln in lines:
                    say(ln)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(report) + "\n", encoding="utf-8")
        say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
