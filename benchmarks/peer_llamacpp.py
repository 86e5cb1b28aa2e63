#!/usr/bin/env python
"""specdash against llama.cpp's own tools, on the same prompts, paired round by round.

    python benchmarks/peer_llamacpp.py --out benchmarks/results/peer-llamacpp.txt
    python benchmarks/peer_llamacpp.py --quick          # a smoke run: one prompt, one round

The llama.cpp side is built from the source vendored in the installed llama-cpp-python's
sdist (the same llama.cpp version specdash runs on) by `specdash.tuning.llamacpp_tools`, once;
the binaries are cached in $SPECDASH_CACHE/llama.cpp/<version>/bin.

What is compared, per prompt (specdash ÷ peer, tokens/s, decode only):
- plain decoding: `specdash run --k 0 --draft none` vs `llama-completion`;
- prompt lookup at each K: `--draft lookup --k K` vs `llama-lookup --spec-draft-n-max K`;
- the draft model at each K: `--draft DRAFT --k K` vs `llama-speculative-simple -md DRAFT
  --spec-type draft-simple --spec-draft-n-max K`;
- specdash `--adaptive` with lookup, chain and the draft model vs the peer's best
  speculative run of the same round (llama-lookup or llama-speculative-simple, any K), vs
  llama-completion, and vs specdash's own plain run.

Fairness:
- Same text: the script applies the target's chat template itself (llama.cpp's
  llama_chat_apply_template through specdash's LLM), and both sides get the result raw
  (`specdash --raw`; llama.cpp `-f` with `--no-escape`, the file carrying one extra final
  newline because `-f` strips one). Prompt token counts and generated texts are checked.
- Same settings: greedy (temperature 0), --threads for both models, the same context
  size, micro-batch 512 (specdash's n_batch = n_ubatch; llama.cpp's logical batch stays at
  its default 2048 because llama-lookup and llama-speculative-simple decode the whole
  prompt as one batch), the same token budget, no --ignore-eos
  (specdash has none), so a side that meets EOS stops and tok/s uses actual counts.
- Decode only, both sides: specdash's summary `tokens_per_s` (generated / decode wall
  time, prefill and the adaptive cost calibration excluded); llama-lookup and
  llama-speculative-simple's own "decoded N tokens in T seconds" line (their decode loop
  after the prompt); llama-completion's per-token eval time plus its sampling time (its
  decode loop without prompt processing).
- Pairs alternate A/B order from round to round and pair to pair; each ratio is taken
  within one round, and the report gives the median of the per-round ratios with their
  min–max. Machine load moves absolute tok/s; the per-step columns (verify and draft ms
  per step from specdash's summary; accepted/drafted for the peers) move much less.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specdash.config import load_config  # noqa: E402
from specdash.contract.errors import SpecdashError  # noqa: E402
from specdash.engine.repack import resolve as repack_resolve  # noqa: E402
from specdash.engine.repack import tool_args as repack_tool_args  # noqa: E402
from specdash.tuning.llamacpp_tools import ensure_built, llama_cpp_python_version  # noqa: E402
from specdash.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402
from specdash.tuning.prompts import BUILTIN  # noqa: E402

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
PEER_TOOLS = ("llama-completion", "llama-lookup", "llama-speculative-simple")
SUMMARY_FIELDS = (
    "tokens_per_s", "n_generated", "num_draft_tokens", "num_accepted_tokens",
    "steps", "decode_s", "draft_ms", "verify_ms", "prefill_ms",
)
QUICK_PROMPT = "summarize-postmortem"
UBATCH = 512  # specdash's n_batch = n_ubatch; the peers' micro-batch (what is computed at once)
PEER_BATCH = 2048  # llama.cpp's default logical batch: llama-lookup and -speculative-simple
# decode the whole prompt in one batch, so it must hold the prompt
RUN_TIMEOUT_S = 900

# Issue 12's targets: (label, threshold). Medians of paired ratios.
TARGETS = {
    "plain": 0.97,       # K=0 through the engine vs llama-completion
    "lookup": 1.0,       # fixed-K lookup vs llama-lookup at the same K
    "draft": 1.3,        # draft model vs llama-speculative-simple at the same K
    "adaptive_best": 1.15,  # best adaptive vs the peer's best (where speculation pays)
    "adaptive_plain": 0.97,  # every adaptive drafter vs plain decoding
}


class BenchError(Exception):
    """A run failed or printed something this script cannot read: exit 1 with the message."""


class UsageError(BenchError):
    """A flag or file the user gave is wrong: exit 2 with the message."""


# --- prompts ------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchPrompt:
    name: str
    source: str  # "built-in" | "benchmarks/prompts"
    text: str


def all_prompts() -> list[BenchPrompt]:
    out = [BenchPrompt(p.name, "built-in", p.text) for p in BUILTIN]
    for f in sorted(PROMPTS_DIR.glob("*.txt")):
        out.append(BenchPrompt(f.stem, "benchmarks/prompts", f.read_text(encoding="utf-8").strip()))
    names = [p.name for p in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise BenchError(f"prompt names used twice (built-in and benchmarks/prompts): {', '.join(sorted(dupes))}")
    return out


def choose_prompts(spec: str | None, quick: bool) -> list[BenchPrompt]:
    prompts = all_prompts()
    if not spec:
        return [p for p in prompts if p.name == QUICK_PROMPT] if quick else prompts
    by_name = {p.name: p for p in prompts}
    chosen = []
    for name in (n.strip() for n in spec.split(",") if n.strip()):
        if name == "all":
            return prompts
        if name not in by_name:
            raise UsageError(f"--prompts: no prompt named {name!r}; choose from: {', '.join(by_name)}, all")
        chosen.append(by_name[name])
    return chosen


# --- runs ---------------------------------------------------------------------------
@dataclass
class RunResult:
    side: str  # "specdash" or the llama.cpp tool
    config: str  # e.g. "lookup K=4", "adaptive chain"
    prompt: str
    round: int
    tokens_per_s: float
    n_generated: int
    n_prompt: int | None
    n_drafted: int
    n_accepted: int
    steps: int | None  # target verification steps (estimated for the peers)
    decode_s: float
    draft_ms: float | None  # totals over the run, where the tool reports them
    verify_ms: float | None
    prefill_ms: float | None
    wall_s: float
    text: str = field(repr=False, default="")
    cmd: list[str] = field(default_factory=list)

    @property
    def acceptance(self) -> float | None:
        return self.n_accepted / self.n_drafted if self.n_drafted else None


@dataclass(frozen=True)
class Job:
    """One run: specdash (args after `specdash run`) or a llama.cpp tool (its argv)."""

    side: str
    config: str
    argv: tuple[str, ...]


def _tail(text: str, n: int = 8) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n    ".join(lines[-n:]) if lines else "(no output)"


def _execute(cmd: Sequence[str], what: str, cwd: Path) -> tuple[str, str, float]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL,
            timeout=RUN_TIMEOUT_S, cwd=cwd,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise BenchError(f"{what} timed out after {RUN_TIMEOUT_S} s; last stderr lines:\n    {_tail(err)}") from None
    except OSError as exc:
        raise BenchError(f"{what}: cannot run {cmd[0]}: {exc}") from None
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise BenchError(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n  last stderr lines:\n    {_tail(proc.stderr)}"
        )
    return proc.stdout, proc.stderr, wall


def parse_specdash_summary(stdout: str, what: str) -> dict[str, Any]:
    """The last `{"event": "summary"}` line of `specdash run --json`, with every field
    this script reads; BenchError naming what is missing otherwise."""
    summary: dict[str, Any] | None = None
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("event") == "summary":
            summary = obj
    if summary is None:
        raise BenchError(f"{what}: no summary event in its --json output; last lines:\n    {_tail(stdout, 4)}")
    missing = [k for k in SUMMARY_FIELDS if not isinstance(summary.get(k), (int, float))]
    if missing:
        raise BenchError(
            f"{what}: the summary event lacks numeric field(s) {', '.join(missing)} "
            f"(has: {', '.join(sorted(summary))}); has the event schema changed?"
        )
    return summary


def _num(pattern: str, text: str, what: str, tool: str) -> re.Match[str]:
    m = re.search(pattern, text)
    if m is None:
        raise BenchError(f"{tool}: cannot find {what} in its output (pattern {pattern!r}); last stderr lines:\n"
                         f"    {_tail(text)}")
    return m


def parse_speculative_tool(stderr: str, tool: str) -> dict[str, Any]:
    """llama-lookup / llama-speculative-simple: their "encoded/decoded ... tokens in ...
    seconds" lines and the n_drafted / n_accept counters."""
    enc = _num(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", stderr, "the 'encoded' line", tool)
    dec = _num(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", stderr, "the 'decoded' line", tool)
    drafted = _num(r"n_drafted\s*=\s*(\d+)", stderr, "n_drafted", tool)
    accepted = _num(r"n_accept\s*=\s*(\d+)", stderr, "n_accept", tool)
    t_draft = re.search(r"t_draft\s*=\s*([\d.]+) ms", stderr)  # llama-lookup only
    n_pred, dec_s = int(dec.group(1)), float(dec.group(2))
    n_acc = int(accepted.group(1))
    return {
        "n_prompt": int(enc.group(1)),
        "prefill_ms": float(enc.group(2)) * 1e3,
        "n_generated": n_pred,
        "decode_s": dec_s,
        "tokens_per_s": n_pred / dec_s if dec_s > 0 else 0.0,
        "n_drafted": int(drafted.group(1)),
        "n_accepted": n_acc,
        # every decode step commits its accepted tokens plus one from the target
        "steps": max(0, n_pred - n_acc),
        "draft_ms": float(t_draft.group(1)) if t_draft else None,
    }


def parse_completion(stderr: str) -> dict[str, Any]:
    """llama-completion: llama.cpp's perf lines. Decode = the single-token evals plus the
    sampling time (its decode loop, prompt processing excluded)."""
    tool = "llama-completion"
    ev = _num(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs", stderr, "the 'eval time' line", tool)
    pe = _num(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", stderr, "the 'prompt eval time' line", tool)
    samp = re.search(r"sampling time =\s*([\d.]+) ms", stderr)
    t_eval_ms, n_eval = float(ev.group(1)), int(ev.group(2))
    # n_eval single-token decodes for n_eval + 1 generated tokens: the first comes from the
    # prompt's logits, the last is never decoded. Sampling time covers every generated token
    # (and a negligible accept of the prompt's): charge the decoded ones' share.
    n_gen = n_eval + 1
    t_sample_ms = float(samp.group(1)) if samp else 0.0
    decode_ms = t_eval_ms + t_sample_ms * n_eval / n_gen
    return {
        "n_prompt": int(pe.group(2)),
        "prefill_ms": float(pe.group(1)),
        "n_generated": n_gen,
        "decode_s": decode_ms / 1e3,
        "tokens_per_s": n_eval / (decode_ms / 1e3) if decode_ms > 0 else 0.0,
        "n_drafted": 0,
        "n_accepted": 0,
        "steps": n_eval,
        "draft_ms": None,
        "eval_ms": t_eval_ms,
        "sampling_ms": t_sample_ms,
    }


def peer_generated_text(stdout: str, prompt_text: str) -> str:
    """What a llama.cpp tool generated: its stdout after the echoed prompt (if echoed)."""
    i = stdout.find(prompt_text)
    text = stdout[i + len(prompt_text):] if i >= 0 else stdout
    return text.replace(" [end of text]", "")


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


# --- the benchmark ------------------------------------------------------------------
@dataclass
class Setup:
    target: Path
    draft: Path
    bin_dir: Path
    threads: int
    ctx: int
    tokens: int
    specdash_config: Path
    workdir: Path
    specdash_cmd: tuple[str, ...]
    peer_cpu: set[str] = field(default_factory=set)  # llama.cpp's "CPU : ..." system info
    # Weight repacking on both sides: the tools take only --no-repack or llama.cpp's
    # default, so where the repack verdict is not "on" both sides run "off".
    repack: str = "on"


def specdash_argv(setup: Setup, prompt_file: Path, draft: str, k: int | None, adaptive: bool) -> tuple[str, ...]:
    argv = [
        *setup.specdash_cmd, "run", "--json", "--raw", "--config", str(setup.specdash_config),
        "--prompt-file", str(prompt_file), "--target", str(setup.target),
        "--threads", str(setup.threads), "--ctx", str(setup.ctx), "--max-tokens", str(setup.tokens),
        "--temp", "0", "--draft", draft, "--repack", setup.repack,
    ]
    if k is not None:
        argv += ["--k", str(k)]
    argv += ["--adaptive"] if adaptive else ["--no-adaptive"]
    return tuple(argv)


def peer_argv(setup: Setup, tool: str, prompt_file: Path, k: int | None) -> tuple[str, ...]:
    argv = [
        str(setup.bin_dir / tool), "-m", str(setup.target), "-f", str(prompt_file), "--no-escape",
        "-n", str(setup.tokens), "-t", str(setup.threads), "-tb", str(setup.threads), "-c", str(setup.ctx),
        "-b", str(PEER_BATCH), "-ub", str(UBATCH), "--temp", "0", "--seed", "1",
        *(["--no-repack"] if setup.repack == "off" else []),
    ]
    if tool == "llama-completion":
        argv += ["-no-cnv", "--no-display-prompt"]
    elif tool == "llama-lookup":
        argv += ["--spec-draft-n-max", str(k)]
    elif tool == "llama-speculative-simple":
        argv += ["-md", str(setup.draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                 "--spec-draft-n-min", "0"]
    return tuple(argv)


def make_jobs(setup: Setup, sd_file: Path, peer_file: Path, ks: Sequence[int], modes: Sequence[str]) -> tuple[
        list[tuple[Job, Job]], list[Job]]:
    """The (specdash, peer) pairs and the adaptive runs for one prompt."""
    pairs: list[tuple[Job, Job]] = []
    if "plain" in modes:
        pairs.append((Job("specdash", "plain", specdash_argv(setup, sd_file, "none", 0, False)),
                      Job("llama-completion", "plain", peer_argv(setup, "llama-completion", peer_file, None))))
    for k in ks:
        if "lookup" in modes:
            pairs.append((Job("specdash", f"lookup K={k}", specdash_argv(setup, sd_file, "lookup", k, False)),
                          Job("llama-lookup", f"lookup K={k}", peer_argv(setup, "llama-lookup", peer_file, k))))
    for k in ks:
        if "draft" in modes:
            pairs.append((Job("specdash", f"draft K={k}", specdash_argv(setup, sd_file, str(setup.draft), k, False)),
                          Job("llama-speculative-simple", f"draft K={k}",
                              peer_argv(setup, "llama-speculative-simple", peer_file, k))))
    adaptive: list[Job] = []
    if "adaptive" in modes:
        for name, drafter in (("lookup", "lookup"), ("chain", "chain"), ("draft", str(setup.draft))):
            adaptive.append(Job("specdash", f"adaptive {name}", specdash_argv(setup, sd_file, drafter, None, True)))
    return pairs, adaptive


def round_order(pairs: list[tuple[Job, Job]], adaptive: list[Job], rnd: int) -> list[Job]:
    """Pairs back to back, A/B order flipped by round and by pair; adaptive runs spread
    evenly between the pairs."""
    after: dict[int, list[Job]] = {}
    for j, job in enumerate(adaptive):  # after pair ~ (j+1)/(n+1) of the way through
        at = max(1, round((j + 1) * len(pairs) / (len(adaptive) + 1))) - 1
        after.setdefault(at, []).append(job)
    seq: list[Job] = []
    for i, (a, b) in enumerate(pairs):
        seq += [a, b] if (rnd + i) % 2 == 0 else [b, a]
        seq += after.pop(i, [])
    for rest in after.values():  # fewer pairs than slots
        seq += rest
    return seq


def run_job(job: Job, setup: Setup, prompt: BenchPrompt, rnd: int, prompt_text: str) -> RunResult:
    what = f"{job.side} ({job.config}, prompt {prompt.name}, round {rnd})"
    stdout, stderr, wall = _execute(job.argv, what, setup.workdir)
    if job.side == "specdash":
        s = parse_specdash_summary(stdout, what)
        return RunResult(
            side=job.side, config=job.config, prompt=prompt.name, round=rnd,
            tokens_per_s=float(s["tokens_per_s"]), n_generated=int(s["n_generated"]),
            n_prompt=int(s["n_prompt"]) if isinstance(s.get("n_prompt"), int) else None,
            n_drafted=int(s["num_draft_tokens"]), n_accepted=int(s["num_accepted_tokens"]),
            steps=int(s["steps"]), decode_s=float(s["decode_s"]), draft_ms=float(s["draft_ms"]),
            verify_ms=float(s["verify_ms"]), prefill_ms=float(s["prefill_ms"]), wall_s=wall,
            text=str(s.get("text", "")), cmd=list(job.argv),
        )
    cpu = re.search(r"CPU : ([^\n]*)", stderr)
    if cpu:
        setup.peer_cpu.add(cpu.group(1).strip(" |"))
    p = parse_completion(stderr) if job.side == "llama-completion" else parse_speculative_tool(stderr, job.side)
    return RunResult(
        side=job.side, config=job.config, prompt=prompt.name, round=rnd,
        tokens_per_s=p["tokens_per_s"], n_generated=p["n_generated"], n_prompt=p["n_prompt"],
        n_drafted=p["n_drafted"], n_accepted=p["n_accepted"], steps=p["steps"], decode_s=p["decode_s"],
        draft_ms=p["draft_ms"], verify_ms=None, prefill_ms=p["prefill_ms"], wall_s=wall,
        text=peer_generated_text(stdout, prompt_text), cmd=list(job.argv),
    )


def describe(r: RunResult) -> str:
    acc = f", acc {r.n_accepted}/{r.n_drafted}" if r.n_drafted else ""
    return f"{r.tokens_per_s:6.1f} tok/s ({r.n_generated} tok{acc})"


# --- aggregation --------------------------------------------------------------------
@dataclass
class Ratio:
    label: str
    kind: str  # plain | lookup | draft | adaptive_best | adaptive_plain | adaptive_sdplain
    ratios: list[float]
    specdash_tps: list[float]
    peer_tps: list[float]
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    def spread(self) -> str:
        return f"{min(self.ratios):.2f}-{max(self.ratios):.2f}"


def _med(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _per_step(runs: list[RunResult], attr: str) -> float | None:
    vals = [getattr(r, attr) / r.steps for r in runs if r.steps and getattr(r, attr) is not None]
    return _med(vals)


# (generated text, K, tokens generated) -> (steps, drafted, accepted) of specdash's
# lookup rule replayed over it
LookupReplay = Callable[[str, int, int], tuple[int, int, int]]


def lookup_replay(vocab: Any, templated: str, settings: Any, budget: int) -> LookupReplay:
    """whatif's replay of specdash's lookup drafter at a fixed K over a known text (the
    same code `specdash whatif` runs): how many steps it would take there. Over the
    peer's text it answers whether a gap is in what is drafted or in what a step costs,
    with the text held equal. The text is retokenized, so a count may be off by one
    where a tokenization differs from the generated tokens. `budget`: the runs' token
    budget; a run that generated fewer met end-of-generation."""
    from specdash.costs.profile import load_profile
    from specdash.tuning.whatif.simulate import make_drafter, simulate
    from specdash.tuning.whatif.transcript import Transcript

    prompt = vocab.tokenize(templated)
    profile = load_profile("ci-box")  # only counts are used: any profile will do
    # A run that met end-of-generation is replayed with the token that ended it, since
    # lookup may draft it: the template's end of turn (the last end-of-generation token
    # in the prompt, where the user's turn ended), else the vocabulary's eos.
    ends = [t for t in prompt if vocab.is_eog(t)]
    end = ends[-1] if ends else vocab.eos

    def replay(text: str, k: int, n_generated: int) -> tuple[int, int, int]:
        gen = vocab.tokenize(text, add_special=False, parse_special=True)
        # llama.cpp's tools print the end-of-turn token and what follows it: cut there
        cut = next((i for i, t in enumerate(gen) if vocab.is_eog(t)), None)
        eos = cut is not None or n_generated < budget
        gen = gen[:cut]
        seq = gen + [end] if eos else gen
        tr = Transcript(prompt, seq, len(gen), eos, budget, len(prompt) + budget + k + 2, UBATCH,
                        [vocab.piece(t) for t in seq], templated, "target")
        res = simulate(tr, make_drafter("lookup", tr, profile, settings), profile, settings, name="lookup", k=k)
        return res.steps, res.drafted, res.accepted

    return replay


def decompose(ok: list[tuple[RunResult, RunResult]]) -> dict[str, list[float]]:
    """Each round's ratio as tokens per step (what was drafted and accepted, on each
    side's own text) times the step cost (peer ms per step ÷ specdash's): their product
    is the tok/s ratio exactly."""
    per_step, cost = [], []
    for a, b in ok:
        if a.steps and b.steps and a.decode_s > 0 and b.decode_s > 0:
            per_step.append((a.n_generated / a.steps) / (b.n_generated / b.steps))
            cost.append((b.decode_s / b.steps) / (a.decode_s / a.steps))
    return {"tokens_per_step_ratio": per_step, "step_cost_ratio": cost}


def _spread(xs: Sequence[float]) -> str:
    return f"x{statistics.median(xs):.3f} ({min(xs):.2f}-{max(xs):.2f})"


def aggregate(prompt: str, runs: list[RunResult], rounds: int,
              replay: LookupReplay | None = None) -> tuple[list[Ratio], list[dict[str, Any]]]:
    mine = [r for r in runs if r.prompt == prompt]

    def get(side: str, config: str, rnd: int) -> RunResult | None:
        for r in mine:
            if r.side == side and r.config == config and r.round == rnd:
                return r
        return None

    ratios: list[Ratio] = []
    rows: list[dict[str, Any]] = []
    configs = list(dict.fromkeys(r.config for r in mine if r.side != "specdash"))
    for config in configs:
        peer_side = next(r.side for r in mine if r.config == config and r.side != "specdash")
        pairs = [(get("specdash", config, i), get(peer_side, config, i)) for i in range(1, rounds + 1)]
        ok = [(a, b) for a, b in pairs if a is not None and b is not None and b.tokens_per_s > 0]
        if not ok:
            continue
        kind = config.split()[0]
        ratio = Ratio(
            f"{config} vs {peer_side}", kind, [a.tokens_per_s / b.tokens_per_s for a, b in ok],
            [a.tokens_per_s for a, _ in ok], [b.tokens_per_s for _, b in ok],
        )
        sd_runs, peer_runs = [a for a, _ in ok], [b for _, b in ok]
        prefix = [common_prefix(a.text, b.text) for a, b in ok]
        shorter = [min(len(a.text), len(b.text)) for a, b in ok]
        same = all(p >= s for p, s in zip(prefix, shorter))
        if not same:
            ratio.notes.append(f"texts diverge at char {min(prefix)}")
        sd_prompt = {a.n_prompt for a in sd_runs if a.n_prompt is not None}
        peer_prompt = {b.n_prompt for b in peer_runs if b.n_prompt is not None}
        if sd_prompt and peer_prompt and sd_prompt != peer_prompt:
            ratio.notes.append(f"prompt tokens differ: specdash {sorted(sd_prompt)} vs peer {sorted(peer_prompt)}")
        parts = decompose(ok)
        if parts["step_cost_ratio"]:
            ratio.notes.append(f"why: tokens/step {_spread(parts['tokens_per_step_ratio'])} × step cost "
                               f"{_spread(parts['step_cost_ratio'])} (specdash ÷ peer, >1 = specdash ahead)")
        same_text: dict[str, Any] = {}
        if replay is not None and kind == "lookup":
            k = int(config.split("K=")[-1])
            own = [replay(t, k, n) for t, n in dict.fromkeys((a.text, a.n_generated) for a in sd_runs)]
            theirs = [replay(t, k, n) for t, n in dict.fromkeys((b.text, b.n_generated) for b in peer_runs)]
            same_text = {"replay_own_text": own, "replay_peer_text": theirs}
            ratio.notes.append(
                f"same text: specdash's rule over the peer's text takes {_tokens([t[0] for t in theirs])} steps, "
                f"accepting {_tokens([t[2] for t in theirs])}/{_tokens([t[1] for t in theirs])} (peer there: "
                f"{_tokens([b.steps or 0 for b in peer_runs])} steps, {_tokens([b.n_accepted for b in peer_runs])}"
                f"/{_tokens([b.n_drafted for b in peer_runs])}); over its own text {_tokens([t[0] for t in own])}"
            )
        ratios.append(ratio)
        rows.append({
            **parts, **same_text,
            "comparison": ratio.label, "kind": kind, "median_ratio": ratio.median,
            "min_ratio": min(ratio.ratios), "max_ratio": max(ratio.ratios), "ratios": ratio.ratios,
            "specdash_tps": ratio.specdash_tps, "peer_tps": ratio.peer_tps,
            "specdash_tokens": [a.n_generated for a in sd_runs], "peer_tokens": [b.n_generated for b in peer_runs],
            "specdash_acceptance": _med([a.acceptance for a in sd_runs if a.acceptance is not None]),
            "peer_acceptance": _med([b.acceptance for b in peer_runs if b.acceptance is not None]),
            "specdash_drafted_accepted": [[a.n_drafted, a.n_accepted] for a in sd_runs],
            "peer_drafted_accepted": [[b.n_drafted, b.n_accepted] for b in peer_runs],
            "specdash_verify_ms_per_step": _per_step(sd_runs, "verify_ms"),
            "specdash_draft_ms_per_step": _per_step(sd_runs, "draft_ms"),
            "specdash_steps": [a.steps for a in sd_runs],
            "peer_steps": [b.steps for b in peer_runs],
            "peer_draft_ms_per_step": _per_step(peer_runs, "draft_ms"),
            "same_text": same, "text_common_prefix_chars": prefix,
            "notes": ratio.notes,
        })

    # adaptive: vs the peer's best speculative run of the same round, vs llama-completion,
    # and vs specdash's own plain run
    adaptive_configs = list(dict.fromkeys(r.config for r in mine if r.config.startswith("adaptive")))
    for config in adaptive_configs:
        best: list[float] = []
        best_names: list[str] = []
        vs_best: list[float] = []
        vs_plain: list[float] = []
        vs_sdplain: list[float] = []
        ad_tps: list[float] = []
        plain_tps: list[float] = []
        ad_runs: list[RunResult] = []
        for i in range(1, rounds + 1):
            ad = get("specdash", config, i)
            if ad is None:
                continue
            ad_runs.append(ad)
            ad_tps.append(ad.tokens_per_s)
            spec = [r for r in mine if r.round == i and r.side in ("llama-lookup", "llama-speculative-simple")]
            if spec:
                top = max(spec, key=lambda r: r.tokens_per_s)
                best.append(top.tokens_per_s)
                best_names.append(f"{top.side} {top.config.split()[-1]}")
                vs_best.append(ad.tokens_per_s / top.tokens_per_s)
            plain = get("llama-completion", "plain", i)
            if plain is not None:
                plain_tps.append(plain.tokens_per_s)
                vs_plain.append(ad.tokens_per_s / plain.tokens_per_s)
            sdplain = get("specdash", "plain", i)
            if sdplain is not None:
                vs_sdplain.append(ad.tokens_per_s / sdplain.tokens_per_s)
        if vs_best:
            counts = {n: best_names.count(n) for n in best_names}
            names = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(counts.items(), key=lambda x: -x[1]))
            ratios.append(Ratio(f"{config} vs peer best", "adaptive_best", vs_best, ad_tps, best,
                                notes=[f"peer best: {names}"]))
        if vs_plain:
            ratios.append(Ratio(f"{config} vs llama-completion", "adaptive_plain", vs_plain, ad_tps, plain_tps))
        if vs_sdplain:
            ratios.append(Ratio(f"{config} vs specdash plain", "adaptive_sdplain", vs_sdplain, ad_tps, []))
        rows.append({
            "comparison": config, "kind": "adaptive",
            "vs_peer_best": vs_best, "peer_best": best_names, "vs_llama_completion": vs_plain,
            "vs_specdash_plain": vs_sdplain, "specdash_tps": ad_tps,
            "specdash_tokens": [a.n_generated for a in ad_runs],
            "specdash_acceptance": _med([a.acceptance for a in ad_runs if a.acceptance is not None]),
            "specdash_drafted_accepted": [[a.n_drafted, a.n_accepted] for a in ad_runs],
            "specdash_verify_ms_per_step": _per_step(ad_runs, "verify_ms"),
            "specdash_draft_ms_per_step": _per_step(ad_runs, "draft_ms"),
            "specdash_steps": [a.steps for a in ad_runs],
        })
    return ratios, rows


def _fmt(x: float | None, spec: str = ".1f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def _acc(r: dict[str, Any], side: str) -> str:
    pairs = r.get(f"{side}_drafted_accepted") or []
    if not pairs or not any(d for d, _ in pairs):
        return "-"
    d = statistics.median(p[0] for p in pairs)
    a = statistics.median(p[1] for p in pairs)
    return f"{a:.0f}/{d:.0f}={a / d:.0%}" if d else "-"


def _tokens(xs: Sequence[int]) -> str:
    s = sorted(set(xs))
    return str(s[0]) if len(s) == 1 else f"{s[0]}-{s[-1]}"


def report_prompt(prompt: BenchPrompt, n_prompt: int, ratios: list[Ratio], rows: list[dict[str, Any]]) -> list[str]:
    out = [f"## {prompt.name} ({prompt.source}, {n_prompt} prompt tokens)", ""]
    out.append(
        f"{'comparison':<40} {'ratio':>6} {'min-max':>10}  {'specdash':>8} {'peer':>7}  {'tokens s/p':>10}"
        f"  {'accepted/drafted specdash':>26} {'peer':>15}  {'verify':>6} {'draft':>6} {'steps s/p':>9}"
    )
    row_by_label = {r["comparison"]: r for r in rows}
    for ratio in ratios:
        if ratio.kind not in ("plain", "lookup", "draft"):
            continue
        r = row_by_label[ratio.label]
        mark = "" if ratio.median >= TARGETS[ratio.kind] else f"  < target {TARGETS[ratio.kind]:.2f}"
        steps = f"{_tokens(r['specdash_steps'])}/{_tokens(r['peer_steps'])}"
        out.append(
            f"{ratio.label:<40} {ratio.median:5.2f}x {ratio.spread():>10}  {_fmt(_med(ratio.specdash_tps)):>8} "
            f"{_fmt(_med(ratio.peer_tps)):>7}  {_tokens(r['specdash_tokens']) + '/' + _tokens(r['peer_tokens']):>10}"
            f"  {_acc(r, 'specdash'):>26} {_acc(r, 'peer'):>15}  {_fmt(r['specdash_verify_ms_per_step']):>6} "
            f"{_fmt(r['specdash_draft_ms_per_step'], '.2f'):>6} {steps:>9}{mark}"
        )
        for note in ratio.notes:
            out.append(f"{'':<42}note: {note}")
    adaptive = [r for r in ratios if r.kind.startswith("adaptive")]
    if adaptive:
        out.append("")
        for ratio in adaptive:
            target = TARGETS.get(ratio.kind)
            mark = "" if target is None or ratio.median >= target else f"  < target {target:.2f}"
            out.append(
                f"{ratio.label:<40} {ratio.median:5.2f}x {ratio.spread():>10}  {_fmt(_med(ratio.specdash_tps)):>8} "
                + (f"{_fmt(_med(ratio.peer_tps)):>7}" if ratio.peer_tps else f"{'':>7}")
                + "".join(f"  ({n})" for n in ratio.notes) + mark
            )
        for r in rows:
            if r["kind"] == "adaptive":
                out.append(
                    f"  {r['comparison']:<20} tokens {_tokens(r['specdash_tokens'])}, accepted/drafted "
                    f"{_acc(r, 'specdash')}, verify {_fmt(r['specdash_verify_ms_per_step'])} ms/step, draft "
                    f"{_fmt(r['specdash_draft_ms_per_step'], '.2f')} ms/step, steps {_tokens(r['specdash_steps'])}"
                )
    out.append("")
    return out


def report_targets(per_prompt: dict[str, list[Ratio]]) -> list[str]:
    out = ["## Issue 12 targets (median paired ratio per prompt)", ""]
    for name, ratios in per_prompt.items():
        bits = []
        for kind, label in (("plain", "K=0/completion"), ("lookup", "lookup/llama-lookup"),
                            ("draft", "draft/spec-simple")):
            rs = [r for r in ratios if r.kind == kind]
            if rs:
                worst = min(rs, key=lambda r: r.median)
                ok = "ok" if worst.median >= TARGETS[kind] else "MISS"
                bits.append(f"{label} worst {worst.median:.2f}x (>= {TARGETS[kind]}) {ok}")
        best = [r for r in ratios if r.kind == "adaptive_best"]
        if best:
            top = max(best, key=lambda r: r.median)
            plain = [r for r in ratios if r.kind == "adaptive_plain"]
            peer_beats_plain = False
            if plain:
                # does any speculation beat plain here? (peer best vs llama-completion)
                pb = [statistics.median(r.peer_tps) for r in best]
                pp = statistics.median(plain[0].peer_tps)
                ad = max(statistics.median(r.specdash_tps) for r in best)
                peer_beats_plain = max(pb) > pp or ad > pp
            if peer_beats_plain:
                ok = "ok" if top.median >= TARGETS["adaptive_best"] else "MISS"
                bits.append(f"best adaptive {top.median:.2f}x peer best (>= {TARGETS['adaptive_best']}) {ok}")
            else:
                bits.append("no speculation beats plain here: adaptive should match plain")
        sdplain = [r for r in ratios if r.kind == "adaptive_sdplain"]
        if sdplain:
            worst = min(sdplain, key=lambda r: r.median)
            ok = "ok" if worst.median >= TARGETS["adaptive_plain"] else "MISS"
            bits.append(f"worst adaptive {worst.median:.2f}x specdash plain (>= {TARGETS['adaptive_plain']}) {ok}")
        out.append(f"{name}:")
        out += [f"  {b}" for b in bits]
    out.append("")
    return out


def report_again(src: Path, out: Path | None, argv: Sequence[str] | None, say: Callable[[str], None]) -> int:
    """--from-json: the report of saved runs, recomputed (the same-text replay included)."""
    from specdash.engine.llm import LLM

    try:
        saved = json.loads(src.read_text(encoding="utf-8"))
        runs = [RunResult(**r) for r in saved["runs"]]
        old = saved["args"]
        vocab = LLM(saved["target"], vocab_only=True)
    except KeyError as exc:
        raise UsageError(f"--from-json {src}: not a saved peer benchmark (no {exc} in it)") from None
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"--from-json {src}: not a saved peer benchmark ({exc})") from None
    cfg = old.get("specdash_config")
    settings = load_config(Path(cfg) if cfg else None).engine
    by_name = {p.name: p for p in all_prompts()}
    lines = [
        "# specdash vs llama.cpp's own tools (benchmarks/peer_llamacpp.py), reported again",
        "",
        f"command: python benchmarks/peer_llamacpp.py {' '.join(argv if argv is not None else sys.argv[1:])}",
        f"runs from {src.name}: specdash {saved.get('specdash_git', '?')}, llama-cpp-python "
        f"{saved.get('llama_cpp_python', '?')}; {old.get('rounds')} round(s), {old.get('tokens')} tokens, "
        f"{old.get('threads')} threads; reported by specdash {_git_rev()}",
        "",
    ]
    per_prompt: dict[str, list[Ratio]] = {}
    for name, info in saved["prompts"].items():
        if name not in by_name:
            raise UsageError(f"--from-json {src}: prompt {name!r} is no longer in the benchmark's prompts")
        templated = vocab.chat_prompt(by_name[name].text)
        ratios, rows = aggregate(name, runs, old["rounds"],
                                 lookup_replay(vocab, templated, settings, old["tokens"]))
        per_prompt[name] = ratios
        lines += report_prompt(by_name[name], info["n_prompt"], ratios, rows)
    text = "\n".join(lines + report_targets(per_prompt)) + "\n"
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        say(f"wrote {out}")
    return 0


# --- main ---------------------------------------------------------------------------
def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"{flag}: expected positive integers, got {text!r}")
    return vals


def _resolve(name: str) -> Path:
    from specdash.models.resolve import resolve_model

    return Path(resolve_model(name))


def _system_info_cpu() -> str:
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    text = info.decode() if isinstance(info, bytes) else str(info)
    m = re.search(r"CPU : ([^\n]*)", text)
    return m.group(1).strip(" |") if m else text.strip()


def _git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("+dirty" if dirty else "") if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    names = ", ".join(p.name for p in all_prompts())
    p = argparse.ArgumentParser(
        prog="benchmarks/peer_llamacpp.py",
        description="specdash vs llama.cpp's own tools (llama-completion, llama-lookup, "
                    "llama-speculative-simple) on the same chat-templated prompts: paired A/B "
                    "rounds, median ratio specdash ÷ peer per prompt, decode tok/s only.",
        epilog="Full run (commit its output): python benchmarks/peer_llamacpp.py "
               "--out benchmarks/results/peer-llamacpp.txt\nSmoke run: python benchmarks/peer_llamacpp.py --quick\n"
               f"Prompts: {names}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prompts", help="comma-separated prompt names, or 'all' (default: all; --quick: "
                                     f"{QUICK_PROMPT})")
    p.add_argument("--ks", help="K values for lookup and the draft model (default 2,4,8; --quick: 4)")
    p.add_argument("--rounds", type=int, help="paired A/B rounds per comparison (default 3; --quick: 1)")
    p.add_argument("--tokens", type=int, help="tokens to generate per run (default 128; --quick: 32)")
    p.add_argument("--threads", type=int, default=2, help="threads for every run, both sides (default 2)")
    p.add_argument("--ctx", type=int, default=4096, help="context size, both sides (default 4096)")
    p.add_argument("--modes", default="plain,lookup,draft,adaptive",
                   help="which comparisons: plain, lookup, draft, adaptive (default: all four)")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"target model name or GGUF (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"draft model name or GGUF (default {DEFAULT_DRAFT})")
    p.add_argument("--specdash-config", type=Path,
                   help="TOML settings for the specdash runs (default: an empty file, i.e. specdash's defaults, "
                        "whatever ~/.config/specdash/config.toml says)")
    p.add_argument("--quick", action="store_true", help="smoke run: one prompt, one round, 32 tokens, K=4")
    p.add_argument("--out", type=Path, help="write the text report here and the JSON (all runs) beside it")
    p.add_argument("--from-json", type=Path, metavar="FILE",
                   help="run nothing: report again the runs a previous --out saved in FILE (.json), with "
                        "this version's columns, to stdout or --out (text only)")
    args = p.parse_args(argv)
    q = args.quick
    args.ks = _ints(args.ks or ("4" if q else "2,4,8"), "--ks")
    args.rounds = args.rounds if args.rounds is not None else (1 if q else 3)
    args.tokens = args.tokens if args.tokens is not None else (32 if q else 128)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in ("plain", "lookup", "draft", "adaptive")]
    if bad or not args.modes:
        raise UsageError(f"--modes: unknown {', '.join(bad) or '(none)'}; choose from plain, lookup, draft, adaptive")
    if args.rounds < 1 or args.tokens < 1 or args.threads < 1 or args.ctx < 64:
        raise UsageError("--rounds, --tokens and --threads must be >= 1, --ctx >= 64")
    return args


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] | None = None) -> int:
    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    say = say or log
    try:
        args = parse_args(argv)
        if args.from_json:
            return report_again(args.from_json, args.out, argv, say)
        prompts = choose_prompts(args.prompts, args.quick)
        t_start = time.time()
        say(f"peer benchmark: {len(prompts)} prompt(s), {args.rounds} round(s), {args.tokens} tokens, "
            f"K in {args.ks}, {args.threads} threads, ctx {args.ctx}, modes {','.join(args.modes)}")
        bin_dir = ensure_built(progress=say)
        missing = [t for t in PEER_TOOLS if not (bin_dir / t).is_file()]
        if missing:
            raise BenchError(f"{bin_dir} lacks {', '.join(missing)}")
        target, draft = _resolve(args.target), _resolve(args.draft)

        from specdash.engine.llm import LLM

        vocab = LLM(target, vocab_only=True)
        with tempfile.TemporaryDirectory(prefix="specdash-peer-") as tmp:
            work = Path(tmp)
            cfg = args.specdash_config or (work / "defaults.toml")
            if args.specdash_config is None:
                cfg.write_text("# empty: specdash's defaults\n", encoding="utf-8")
            setup = Setup(
                target=target, draft=draft, bin_dir=bin_dir, threads=args.threads, ctx=args.ctx,
                tokens=args.tokens, specdash_config=cfg, workdir=work,
                specdash_cmd=(sys.executable, "-m", "specdash"),
                repack="on" if not repack_tool_args() else "off",
            )
            runs: list[RunResult] = []
            texts: dict[str, tuple[str, int]] = {}
            per_prompt: dict[str, list[Ratio]] = {}
            report: list[str] = []
            rows_all: dict[str, list[dict[str, Any]]] = {}
            for pi, prompt in enumerate(prompts, 1):
                templated = vocab.chat_prompt(prompt.text)
                n_prompt = len(vocab.tokenize(templated))
                need = n_prompt + args.tokens + max(args.ks) + 16
                if need > args.ctx:
                    raise BenchError(f"prompt {prompt.name}: {n_prompt} tokens + {args.tokens} to generate do not "
                                     f"fit --ctx {args.ctx}; use a larger --ctx")
                if n_prompt > PEER_BATCH:
                    raise BenchError(f"prompt {prompt.name}: {n_prompt} tokens; llama-lookup and "
                                     f"llama-speculative-simple take at most {PEER_BATCH} (one batch)")
                sd_file = work / f"{prompt.name}.specdash.txt"
                sd_file.write_text(templated, encoding="utf-8", newline="")
                peer_file = work / f"{prompt.name}.llamacpp.txt"
                # llama.cpp's -f drops one final newline; the chat template ends with one
                peer_file.write_text(templated + "\n", encoding="utf-8", newline="")
                texts[prompt.name] = (templated, n_prompt)
                pairs, adaptive = make_jobs(setup, sd_file, peer_file, args.ks, args.modes)
                total = (2 * len(pairs) + len(adaptive)) * args.rounds
                done = 0
                for rnd in range(1, args.rounds + 1):
                    for job in round_order(pairs, adaptive, rnd):
                        done += 1
                        r = run_job(job, setup, prompt, rnd, templated)
                        runs.append(r)
                        say(f"[{pi}/{len(prompts)} {prompt.name} r{rnd} {done}/{total}] {job.config:<16} "
                            f"{job.side:<24} {describe(r)}  ({r.wall_s:.1f}s wall)")
                ratios, rows = aggregate(prompt.name, runs, args.rounds,
                                         lookup_replay(vocab, templated, load_config(cfg).engine, args.tokens))
                per_prompt[prompt.name] = ratios
                rows_all[prompt.name] = rows
                section = report_prompt(prompt, n_prompt, ratios, rows)
                report += section
                for line in section:
                    say(line)

        sd_cpu = _system_info_cpu()
        header = [
            "# specdash vs llama.cpp's own tools (benchmarks/peer_llamacpp.py)",
            "",
            f"command: python benchmarks/peer_llamacpp.py {' '.join(argv if argv is not None else sys.argv[1:])}",
            f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}, took {(time.time() - t_start) / 60:.1f} min; specdash "
            f"{_git_rev()}; llama.cpp from llama-cpp-python {llama_cpp_python_version()} ({bin_dir})",
            f"machine: {platform.machine()}, {os.cpu_count()} logical CPUs, load average at end "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
            f"llama-cpp-python CPU features: {sd_cpu}",
            f"weight repacking: {setup.repack} on both sides (this machine's verdict: {repack_resolve().label()})",
            f"llama.cpp tools CPU features:  {' / '.join(sorted(setup.peer_cpu)) or '(not printed)'}"
            + ("" if not setup.peer_cpu or setup.peer_cpu == {sd_cpu} else "  <- DIFFERENT: not a like-for-like build"),
            f"target {target.name}, draft {draft.name}; greedy; {args.threads} threads; ctx {args.ctx}; micro-batch {UBATCH}; "
            f"{args.tokens} tokens; {args.rounds} round(s); K in {args.ks}",
            "",
            "ratio = median over rounds of specdash tok/s ÷ peer tok/s in the same round (decode only); min-max = "
            "spread of the per-round ratios.",
            "tokens s/p = generated tokens specdash/peer (no --ignore-eos: a side meeting EOS stops; the "
            "speculative peers may overshoot the budget by their last accepted run).",
            "verify, draft = specdash ms per step from its summary (load-independent-ish); steps s/p = target "
            "verification steps (peers: n_predict - n_accept).",
            "peer best = the fastest llama-lookup or llama-speculative-simple run (any K) of the same round.",
            "",
        ]
        text = "\n".join(header + report + report_targets(per_prompt)) + "\n"
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text, encoding="utf-8")
            js = args.out.with_suffix(".json")
            js.write_text(json.dumps({
                "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "llama_cpp_python": llama_cpp_python_version(), "bin_dir": str(bin_dir),
                "target": str(target), "draft": str(draft), "specdash_git": _git_rev(),
                "cpu_features": sd_cpu, "repack": setup.repack, "peer_cpu_features": sorted(setup.peer_cpu), "prompts": {k: {"n_prompt": v[1]} for k, v in texts.items()},
                "results": rows_all, "runs": [asdict(r) for r in runs],
            }, indent=1) + "\n", encoding="utf-8")
            say(f"wrote {args.out} and {js}")
        return 0
    except (BenchError, SpecdashError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
