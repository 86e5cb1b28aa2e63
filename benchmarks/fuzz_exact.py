"""Fuzzing exactness: random, seeded hot-swap schedules on the real engine.

Each schedule starts from random settings and sends random commands at random steps,
in `run --schedule` syntax, through specdash.tuning.schedule (the code `specdash run` uses):
K changes (0 and above 16 included), drafter swaps (lookup, suffix, chain, none, the
draft model, the target's MTP head), adaptive on/off, short pauses, temperature segments, expert-count changes
on a MoE target, and now and then a command the engine must refuse (K out of range,
experts on a dense model or beyond the model's count). Then it checks:

- commands: every command sent appears in the event stream, in order, as a
  SettingsEvent whose `command` is its text, or as a refusal exactly when it is invalid;
  every `pause=` is followed by a resume;
- steps: each step ran with what was in force (K, capped by the room left; adaptive;
  a draft source the drafter in force may produce), counts add up, the text is the
  pieces;
- greedy exactness: every token committed while the temperature was 0 is the target's
  own greedy choice given the tokens before it (plain decoding, one token per forward
  pass, with the expert count in force), except where the target's top-two logit gap is
  below TIE_GAP (batch rounding: a batch of K+1 can round differently from a batch of
  1). Such positions are counted and reported.

Sampled segments get their own test, `pit_run`: every token committed at temperature
> 0 is turned into a randomized probability-integral-transform value under the target
distribution of the verify batch row it was committed from. Rejection sampling keeps
the target's distribution exactly, so these values are i.i.d. uniform on [0, 1] whatever
the drafters did; `uniformity` compares them with the DKW bound for the sample size.

    python benchmarks/fuzz_exact.py                        # 200 schedules on each pair
    python benchmarks/fuzz_exact.py --pairs small,moe --schedules 50 --tokens 48
    python benchmarks/fuzz_exact.py --pairs default --seed-base 1000 --out results.txt

The tests (tests/test_fuzz_exact.py) run the same harness on fewer schedules.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specdash.contract import events as E
from specdash.engine import step_rules as rules
from specdash.engine.drafters import KINDS, MODEL_SOURCES
from specdash.engine.grammar import CompiledGrammar
from specdash.engine.llm import LLM
from specdash.engine.settings import K_CAP, SamplingParams
from specdash.engine.verify import process_logits
from specdash.tuning.schedule import Schedule, parse_line
from specdash.sources.session import Session

# Logits; the value tests/test_engine_exact.py uses (measured with
# benchmarks/batch_rounding.py: on the Q4_K_M Qwen target a batch of 5 moves the top-two
# gap by at most 0.35 vs a batch of 1; on SmolLM2-135M at most 0.41, batches of 5 and 17).
TIE_GAP = 0.5
K_CHOICES = (0, 1, 2, 3, 4, 5, 6, 8, 12, 16, 17, 20, 24, 32)
ROOT = Path(__file__).resolve().parent.parent

# Prompts that keep a model writing for a while and give the copy drafters something.
CHAT_PROMPTS = (
    "Write the numbers from 1 to 400, separated by commas.",
    "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals, with a docstring "
    "and three doctest examples.",
    "Repeat this list three times, one item per line: apple, banana, cherry, date, elderberry, fig, grape.",
    "Convert this to JSON with keys name, age, city: Alice 31 Paris; Bob 45 Berlin; Carol 27 Madrid; "
    "Dave 52 Rome; Erin 38 Oslo.",
)
RAW_PROMPTS = ("def fibonacci(n):\n    return", "The quick brown fox jumps over the lazy dog. " * 3)


# --- pairs ---------------------------------------------------------------------------


@dataclass
class Pair:
    """A target and what may draft for it."""

    name: str
    target: str  # GGUF path
    draft_model: str | None  # GGUF path or registry name used for `draft=MODEL`
    expert_count: int | None = None  # a MoE target's experts; None: dense
    raw: bool = False  # prompts without the chat template (the MoE fixture has none)
    prompts: tuple[str, ...] = CHAT_PROMPTS
    threads: int = 2
    ctx: int = 1024
    extra_drafters: tuple[str, ...] = ()  # more draft models to swap to (the xvocab pair's same-vocabulary one)

    @property
    def drafters(self) -> tuple[str, ...]:
        """Every drafter kind (engine/drafters/kinds.py: a kind added there is fuzzed with
        no change here) the target can run, then the draft models. `mtp` drafts with the
        target's own head: only a pair whose target has one swaps to it (mtp_pair); on the
        others it is refused, which tests/test_mtp.py checks."""
        kinds = tuple(k for k in KINDS if k != "mtp" or "mtp" in self.extra_drafters)
        return kinds + ((self.draft_model,) if self.draft_model else ()) + \
            tuple(d for d in self.extra_drafters if d not in kinds)

    def session(self, max_tokens: int) -> Session:
        """A session for fuzzing. Its adaptive controller keeps probing (no verdict that
        a source does not pay): on a 2-core CPU the real one rightly settles on K=0, and
        K=0 steps have nothing to check."""
        from specdash.engine.controller import CostModelController

        s = self.settings(max_tokens)
        return Session(s, controller=CostModelController(k_min=s.k_min, k_max=s.k_max, k_init=s.k,
                                                         verdict_margin=0.0, probe_every=4))

    def settings(self, max_tokens: int) -> Any:
        from specdash.engine.settings import EngineSettings

        # Starting with the draft model makes it the chain's model from the first chain on.
        # No joint confidence cut: the tiny fixtures' drafts are unsure of every token, so
        # it would stop each after one, and no draft would be taken back part-way.
        return EngineSettings(target=self.target, draft=self.draft_model or "lookup", k=4, adaptive=False, threads=self.threads, ctx=self.ctx,
                              max_tokens=max_tokens, raw=self.raw, draft_p_joint=0.0)


def make_small_draft(folder: Path | None = None) -> Path:
    """SmolLM2-135M quantized harder (Q4_0 from its Q4_1) with `specdash models
    make-draft`'s code, into a private cache under `folder`: the small self-speculative pair.
    With no folder, once into $SPECDASH_CACHE/fixtures/small-draft, reused after."""
    from specdash.models.quantize import make_draft
    from specdash.models.resolve import resolve_model
    from specdash.contract.paths import cache_dir

    if folder is None:
        folder = cache_dir() / "fixtures" / "small-draft"

    out = folder / "cache" / "models" / "smollm2-135m-q4_0.gguf"
    if out.is_file():
        return out
    real = resolve_model("smollm2-135m")
    (folder / "cache" / "models").mkdir(parents=True, exist_ok=True)
    link = folder / "cache" / "models" / "smollm2-135m.gguf"
    if not link.exists():
        link.symlink_to(real)
    with _env("SPECDASH_CACHE", str(folder / "cache")):
        return make_draft("smollm2-135m", "Q4_0").path


def make_moe(folder: Path | None = None, n_expert: int = 4, n_used: int = 2) -> Path:
    """The tiny MoE fixture: written into `folder`, or with no folder the copy cached in
    $SPECDASH_CACHE/fixtures (tests/moe_fixture.cached_tiny_moe)."""
    spec = importlib.util.spec_from_file_location("moe_fixture", ROOT / "tests" / "moe_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if folder is None:
        cached: Path = module.cached_tiny_moe(n_expert=n_expert, n_expert_used=n_used)
        return cached
    path: Path = module.make_tiny_moe(folder / "moe.gguf", n_expert=n_expert, n_expert_used=n_used)
    return path


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def small_pair(draft: Path) -> Pair:
    from specdash.models.resolve import resolve_model

    return Pair("small", str(resolve_model("smollm2-135m")), str(draft))


def default_pair() -> Pair:
    from specdash.models.resolve import resolve_model

    return Pair("default", str(resolve_model("qwen2.5-coder-1.5b")), "qwen2.5-coder-0.5b", ctx=2048)


def translated_pair(draft: Path) -> Pair:
    """SmolLM2-135M drafted for by Gemma-3-270M, another vocabulary (SPM vs BPE), so its
    drafts go through translation (drafter "xvocab"); the same-vocabulary Q4_0 draft is
    the other model swapped to and from."""
    from specdash.models.resolve import resolve_model

    return Pair("xvocab", str(resolve_model("smollm2-135m")), "gemma3-270m", extra_drafters=(str(draft),))


def mtp_pair(target: Path) -> Pair:
    """The tiny qwen35 with an MTP head (tests/fixtures/mtp_gguf.py): the target drafts
    with its own head (`mtp`, swapped to and from like any drafter; the chain ends with
    it), no draft model. A hybrid: rejected drafts are taken back with snapshots."""
    return Pair("mtp", str(target), None, raw=True, prompts=RAW_PROMPTS, ctx=512, extra_drafters=("mtp",))


def make_mtp(folder: Path) -> Path:
    spec = importlib.util.spec_from_file_location("mtp_gguf", ROOT / "tests" / "fixtures" / "mtp_gguf.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path: Path = module.fixture_path()
    return path


def moe_pair(moe: Path, draft: Path | None = None) -> Pair:
    # The fixture copies SmolLM2's tokenizer, so SmolLM2 (or its Q4_0) can draft for it.
    return Pair("moe", str(moe), str(draft) if draft else None, expert_count=4, raw=True, prompts=RAW_PROMPTS,
                ctx=512)


# --- schedules -------------------------------------------------------------------------


@dataclass
class Start:
    k: int
    draft: str
    adaptive: bool
    temperature: float = 0.0
    experts: int | None = None

    def commands(self, pair: Pair) -> list[E.Command]:
        cmds: list[E.Command] = [E.Resume(), E.SetK(self.k), E.SetDrafter(self.draft), E.SetAdaptive(self.adaptive),
                                 E.SetSampling(temperature=self.temperature), E.Forget()]
        if pair.expert_count:
            cmds.append(E.SetExperts(self.experts or pair.expert_count))
        return cmds

    def text(self) -> str:
        experts = f" --experts {self.experts}" if self.experts else ""
        return (f"--k {self.k} --draft {self.draft}{' --adaptive' if self.adaptive else ''}"
                f" --temperature {self.temperature:g}{experts}")


@dataclass
class FuzzSchedule:
    seed: int
    pair: str
    prompt: str
    start: Start
    lines: list[str]

    def text(self) -> str:
        return "\n".join(self.lines)

    def describe(self) -> str:
        """Enough to replay it with `specdash run` (the seed also fixes the sampling rng)."""
        lines = "\n".join(f"    {line}" for line in self.lines)
        return f"schedule {self.pair}/{self.seed}: start {self.start.text()}, prompt {self.prompt[:40]!r}\n{lines}"


def make_schedule(seed: int, pair: Pair, max_tokens: int, *, sampled: bool | None = None) -> FuzzSchedule:
    """A random schedule, the same for the same seed. sampled: include a temperature
    segment (None: in about a third of the schedules)."""
    rng = random.Random(f"{pair.name}/{seed}")
    drafters = pair.drafters
    # A kind that drafts 2, plain decoding 1, a draft model 3.
    draft_weights = [(2 if KINDS[d].drafts else 1) if d in KINDS else 3 for d in drafters]

    def drafter() -> str:
        return rng.choices(drafters, weights=draft_weights)[0]

    start = Start(
        k=rng.choice(K_CHOICES),
        draft=drafter(),
        adaptive=rng.random() < 0.1,
        experts=rng.randint(1, pair.expert_count) if pair.expert_count else None,
    )
    last = max(6, max_tokens * 3 // 4)  # runs take max_tokens steps or fewer
    lines: dict[int, list[str]] = {}

    def add(step: int, token: str) -> None:
        lines.setdefault(step, []).append(token)

    # Early steps more often: a well-drafted run takes only a handful of steps.
    for step in sorted(1 + int(rng.random() ** 2 * last) for _ in range(rng.randint(4, 10))):
        for _ in range(rng.choices((1, 2, 3), weights=(6, 3, 1))[0]):
            kind = rng.choices(("k", "draft", "adaptive", "pause", "experts", "forget"),
                               weights=(5, 5, 1.5, 1, 3 if pair.expert_count else 0, 0.5))[0]
            if kind == "k":
                add(step, f"k={rng.choice(K_CHOICES)}")
            elif kind == "draft":
                add(step, f"draft={drafter()}")
            elif kind == "adaptive":
                add(step, "adaptive=on")
                if rng.random() < 0.7:  # adaptive segments, not adaptive to the end
                    add(step + rng.randint(2, 10), "adaptive=off")
            elif kind == "pause":
                add(step, f"pause={rng.randint(10, 60)}ms")
            elif kind == "experts":
                assert pair.expert_count
                add(step, f"experts={rng.randint(1, pair.expert_count)}")
            else:
                add(step, "forget")
    if sampled if sampled is not None else rng.random() < 1 / 3:
        on = rng.randint(1, last)
        add(on, f"temp={rng.choice((0.6, 0.9, 1.2))}")
        add(rng.randint(on + 1, on + 12), "temp=0")
    if rng.random() < 0.25:  # a command the engine must refuse, and keep going
        bad = [f"k={K_CAP + 1}", "k=-1", f"experts={(pair.expert_count or 1) + 1}"]
        add(rng.randint(1, last), rng.choice(bad))
    text = [f"{step}: {' '.join(tokens)}" for step, tokens in sorted(lines.items())]
    prompt = pair.prompts[seed % len(pair.prompts)]
    return FuzzSchedule(seed, pair.name, prompt, start, text)


def must_refuse(cmd: E.Command, pair: Pair) -> bool:
    match cmd:
        case E.SetK(k):
            return not 0 <= k <= K_CAP
        case E.SetExperts(n):
            return not pair.expert_count or not 1 <= n <= pair.expert_count
        case _:
            return False


# --- the reference: the target alone, one token per forward pass ---------------------------


class Reference:
    """Plain greedy decoding of the target, one token per forward pass (one LLM per expert
    count, loaded on demand).

    It is asked the same questions over and over (the plain continuation of a prompt; the
    argmax after a run's tokens, which mostly follow that continuation), so it keeps what
    it computed: its memory holds the prompt (prefilled as the engine does) and then rows
    decoded one token per pass, and every prediction made along that path is recorded.
    A question whose tokens share a prefix with that path reuses its rows and answers,
    and only the rest is decoded: rows decoded one per pass at the same positions after
    the same tokens are the same bits, so a reused answer is the one a fresh pass gives."""

    def __init__(self, pair: Pair):
        self.pair = pair
        self._llms: dict[int | None, LLM] = {}
        # Per expert count: (n_prompt, the tokens in memory, {position: (argmax, top-two gap)}).
        self._path: dict[int | None, tuple[int, list[int], dict[int, tuple[int, float]]]] = {}
        self._plain: dict[tuple[tuple[int, ...], int | None], list[int]] = {}

    def llm(self, experts: int | None) -> LLM:
        key = experts if self.pair.expert_count else None
        if key not in self._llms:
            overrides: dict[str, int | float | bool] = {}
            if key is not None:
                probe = LLM(self.pair.target, vocab_only=True)
                try:
                    overrides = {f"{probe.arch}.expert_used_count": key}
                finally:
                    probe.close()
            self._llms[key] = LLM(self.pair.target, n_ctx=self.pair.ctx, n_threads=self.pair.threads,
                                  kv_overrides=overrides)
        return self._llms[key]

    def _walk(self, tokens: Sequence[int], n_prompt: int, experts: int | None, upto: int) -> dict[int, tuple[int, float]]:
        """Predictions for positions n_prompt..upto given tokens[:position], each from one
        forward pass of the token before it; tokens past len(tokens) follow the argmax."""
        key = experts if self.pair.expert_count else None
        llm = self.llm(experts)
        have_prompt, seq, seen = self._path.get(key, (0, [], {}))
        prompt = list(tokens[:n_prompt])
        # Another user of this model (a test sharing it) moved its memory: start over.
        if have_prompt != n_prompt or seq[: n_prompt - 1] != prompt[:-1] or llm.rows != seq:
            llm.prefill_prompt(prompt[:-1])  # reused when it is the prompt prefilled last
            seq, seen = prompt[:-1], {}
        else:
            common = n_prompt - 1
            while common < min(len(seq), len(tokens)) and seq[common] == tokens[common]:
                common += 1
            if common < len(seq):
                seen = {p: v for p, v in seen.items() if p <= common}
                if llm.strategy.kind == "kv":
                    llm.kv_truncate(common)
                    del seq[common:]
                else:  # a recurrent state cannot be cut back: from the prompt again
                    llm.prefill_prompt(prompt[:-1])
                    seq = prompt[:-1]
        self._path[key] = (n_prompt, seq, seen)
        while len(seq) < upto:
            pos = len(seq)
            tok = tokens[pos] if pos < len(tokens) else seen[pos][0]
            row = llm.decode([tok], pos, logits="last")[0]
            seq.append(tok)
            top2 = np.partition(row, -2)[-2:]
            seen[pos + 1] = (int(row.argmax()), float(top2[1] - top2[0]))
        return seen

    def plain(self, prompt: Sequence[int], n: int, experts: int | None) -> list[int]:
        """Greedy continuation of `prompt`, up to n tokens or the end of generation
        (then the end token is the last element)."""
        key = (tuple(prompt), experts)
        have = self._plain.get(key, [])
        if len(have) >= n or (have and self.llm(experts).is_eog(have[-1])):
            return have[:n]
        llm = self.llm(experts)
        out: list[int] = []
        tokens = list(prompt)
        for _ in range(n):
            seen = self._walk(tokens, len(prompt), experts, len(tokens))
            tok = seen[len(tokens)][0]
            out.append(tok)
            if llm.is_eog(tok):
                break
            tokens.append(tok)
        self._plain[key] = out
        return out

    def teacher_force(self, tokens: Sequence[int], n_prompt: int, positions: Sequence[int],
                      experts: int | None) -> dict[int, tuple[int, float]]:
        """For each index in `positions` (>= n_prompt, into `tokens`): the target's argmax
        given tokens[:index] and the gap between its top two logits."""
        seen = self._walk(tokens, n_prompt, experts, max(positions))
        return {p: seen[p] for p in positions}

    def close(self) -> None:
        for llm in self._llms.values():
            llm.close()
        self._llms.clear()
        self._path.clear()


# --- one schedule ------------------------------------------------------------------------


@dataclass
class Result:
    schedule: FuzzSchedule
    problems: list[str] = field(default_factory=list)
    steps: int = 0
    tokens: int = 0
    greedy_tokens: int = 0
    forced: int = 0  # tokens checked by teacher forcing (the run left plain decoding's path)
    ties: list[tuple[int, float]] = field(default_factory=list)  # (token index, top-two gap)
    applied: int = 0
    refused: int = 0
    pauses: int = 0
    reloads: int = 0
    ks: Counter[int] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    stop_reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def report(self) -> str:
        return self.schedule.describe() + "\n" + "\n".join(f"  - {p}" for p in self.problems)


def may_draft(draft: str) -> frozenset[str]:
    """The sources that may draft under `draft=`: a kind's, from the registry; a model's
    ("draft", or "xvocab" through translation when its vocabulary differs from the target's)."""
    return KINDS[draft].sources if draft in KINDS else MODEL_SOURCES


def run_schedule(session: Session, reference: Reference, pair: Pair, schedule: FuzzSchedule, max_tokens: int,
                 tie_gap: float = TIE_GAP) -> Result:
    """Run one schedule on `session` (its settings are reset first) and check it."""
    t0 = time.perf_counter()
    result = Result(schedule)
    problems = result.problems
    engine = session.engine
    prompt = session.prompt_tokens(schedule.prompt)
    for cmd in schedule.start.commands(pair):
        session.send(cmd)
    engine.rng = np.random.default_rng(schedule.seed)
    entries = [e for n, line in enumerate(schedule.lines, 1) for e in parse_line(line, f"schedule:{n}")]
    timers: list[threading.Timer] = []

    def timer(seconds: float, action: Callable[[], None]) -> None:
        t = threading.Timer(seconds, action)
        t.daemon = True
        timers.append(t)
        t.start()

    sched = Schedule(entries, session.send, timer=timer)
    events: list[E.Event] = []
    for ev in engine.generate(prompt, max_tokens):
        events.append(ev)
        if isinstance(ev, E.StepEvent):
            sched.after_step(ev.step)
    for t in timers:
        t.join()
    list(engine.apply_pending())  # commands sent after the last step: not this run's
    summary = events[-1]
    assert isinstance(summary, E.Summary)
    result.stop_reason = summary.stop_reason

    # 1. Commands: in order, applied or refused as they deserve.
    start_at = next(i for i, ev in enumerate(events) if isinstance(ev, E.SettingsEvent) and not ev.command)
    said: list[str] = []
    for ev in events[start_at + 1:]:
        if isinstance(ev, E.SettingsEvent):
            said.append(ev.command)
        elif isinstance(ev, E.NoticeEvent) and ev.level != "info":
            said.append(f"{ev.refused} refused" if ev.refused else f"unexpected {ev.level}: {ev.message}")
    resumes = said.count("resume")
    said = [s for s in said if s != "resume"]
    # Sent after the last step (the tail of `sent`) or never sent: not applied in this run.
    not_run = len(sched.unapplied(summary.stop_reason == "stopped")) - len(sched.left)
    applied = sched.sent[: len(sched.sent) - not_run]
    want = [e.command.text() + (" refused" if must_refuse(e.command, pair) else "") for e in applied]
    if said != want:
        problems.append(f"commands: the engine reported {said}, expected {want}")
    # Pauses sent after the same step overlap and share one Resume (the longest).
    pauses = len({e.step for e in applied if isinstance(e.command, E.Pause)})
    if resumes != pauses:
        problems.append(f"pauses applied after {pauses} steps but {resumes} resumes reported")
    result.applied = sum(1 for w in want if not w.endswith(" refused"))
    result.refused = len(want) - result.applied
    result.pauses = pauses
    result.reloads = sum(1 for e in applied if isinstance(e.command, E.SetExperts) and not must_refuse(e.command, pair))

    # 2. Steps ran with what was in force.
    target = engine.target
    limits = rules.Limits(target.n_ctx, target.n_batch, target.n_vocab, target.strategy.max_draft)
    settings = next(ev for ev in events if isinstance(ev, E.SettingsEvent) and not ev.command)
    n_past, generated = len(prompt) - 1, 0
    committed: list[tuple[int, bool, int | None]] = []  # (token, greedy, experts) per generated token
    steps = [ev for ev in events if isinstance(ev, E.StepEvent)]
    for ev in events:
        if isinstance(ev, E.SettingsEvent):
            settings = ev
            continue
        if not isinstance(ev, E.StepEvent):
            continue
        s = settings
        assert s.k is not None and s.k_max is not None and s.draft is not None
        room = rules.room(limits, n_past, generated, max_tokens)
        where = f"step {ev.step}"
        if ev.adaptive != s.adaptive:
            problems.append(f"{where}: adaptive={ev.adaptive}, settings say {s.adaptive}")
        elif not s.adaptive and ev.k != min(s.k, room):
            problems.append(f"{where}: K={ev.k}, settings K={s.k}, room {room}")
        elif s.adaptive and ev.k > min(s.k_max, room):
            problems.append(f"{where}: adaptive K={ev.k} > min(k_max {s.k_max}, room {room})")
        if not (0 <= ev.accepted <= ev.drafted <= ev.k):
            problems.append(f"{where}: accepted {ev.accepted}, drafted {ev.drafted}, K {ev.k}")
        allowed = may_draft(s.draft)
        if (ev.drafter == "none") != (ev.drafted == 0) or (ev.drafted and ev.drafter not in allowed):
            problems.append(f"{where}: drafted {ev.drafted} by {ev.drafter!r} with draft={s.draft}")
        last = ev is steps[-1]
        if len(ev.tokens) != ev.accepted + 1 and not last:
            problems.append(f"{where}: {len(ev.tokens)} tokens committed for {ev.accepted} accepted")
        if ev.from_draft != [True] * min(ev.accepted, len(ev.tokens)) + [False] * (len(ev.tokens) - ev.accepted):
            problems.append(f"{where}: provenance {ev.from_draft} for {ev.accepted} accepted")
        greedy = (s.temperature or 0.0) <= 0.0
        committed += [(tok, greedy, s.experts_active) for tok in ev.tokens]
        n_past, generated = ev.n_past, ev.n_generated
        if generated != len(committed):
            problems.append(f"{where}: n_generated {generated}, {len(committed)} tokens seen")
        result.ks[ev.k] += 1
        result.sources[ev.drafter] += 1
    result.steps, result.tokens = len(steps), len(committed)
    if summary.text != "".join(p for ev in steps for p in ev.pieces) or summary.steps != len(steps):
        problems.append("the summary's text or step count is not the steps'")
    if summary.num_draft_tokens != sum(ev.drafted for ev in steps) or \
            summary.num_accepted_tokens != sum(ev.accepted for ev in steps):
        problems.append("the summary's counters are not the steps' sums")
    if summary.stop_reason not in ("eos", "max_tokens"):
        problems.append(f"the run ended with {summary.stop_reason!r}")

    # 3. Greedy exactness.
    tokens = [t for t, _, _ in committed]
    greedy_at = [i for i, (_, g, _) in enumerate(committed) if g]
    result.greedy_tokens = len(greedy_at)
    end_greedy = summary.stop_reason == "eos" and (settings.temperature or 0.0) <= 0.0
    experts_seen = {e for _, _, e in committed}
    if len(greedy_at) == len(committed) and len(experts_seen) <= 1:
        experts = next(iter(experts_seen)) if experts_seen else settings.experts_active
        plain = reference.plain(prompt, len(tokens) + 1, experts)
        expect_end = end_greedy and len(plain) == len(tokens) + 1 and reference.llm(experts).is_eog(plain[-1])
        if plain[: len(tokens)] == tokens and (summary.stop_reason != "eos" or expect_end):
            result.seconds = time.perf_counter() - t0
            return result
    # Off plain decoding's path (a near-tie, a sampled segment, a reload): every greedy
    # token must be the target's argmax given the tokens before it.
    full = list(prompt) + tokens
    by_experts: dict[int | None, list[int]] = {}
    for i in greedy_at:
        by_experts.setdefault(committed[i][2], []).append(len(prompt) + i)
    if end_greedy:  # the run stopped at an end token the target chose greedily
        by_experts.setdefault(settings.experts_active, []).append(len(full))
    for experts, positions in by_experts.items():
        verdicts = reference.teacher_force(full + [-1], len(prompt), positions, experts)
        for pos in positions:
            want_tok, gap = verdicts[pos]
            if pos == len(full):
                ok = reference.llm(experts).is_eog(want_tok)
                got_text = "the end of generation"
            else:
                ok = full[pos] == want_tok
                got_text = str(full[pos])
                result.forced += 1
            if ok:
                continue
            if gap < tie_gap:
                result.ties.append((pos - len(prompt), gap))
            else:
                problems.append(f"token {pos - len(prompt)}: committed {got_text}, the target's argmax is {want_tok} "
                                f"(top-two gap {gap:.3f} >= {tie_gap}, experts {experts})")
    result.seconds = time.perf_counter() - t0
    return result


# --- sampled segments: the statistical test ------------------------------------------------


def sampled_schedule(pair: Pair) -> list[str]:
    """Temperature throughout, the drafter swapped every few steps (the draft model with
    its own probabilities, the copy drafters one-hot), K and the temperature changed."""
    own = pair.draft_model or (pair.extra_drafters[0] if pair.extra_drafters else None)
    model = f"draft={own}" if own else "draft=chain"
    return [
        "6: k=6 draft=suffix", f"12: {model} k=3", "18: draft=chain k=8", "24: draft=none",
        "28: draft=lookup k=5 temp=0.7", f"34: {model} k=2", "40: draft=suffix k=12 temp=1.3",
        "46: draft=lookup k=3", f"52: {model} k=5 temp=1", "58: draft=chain k=4", "64: draft=lookup k=17",
    ]


@dataclass
class SampledStats:
    """What a sampled run leaves for the statistical tests."""

    pit: list[float] = field(default_factory=list)  # one per token committed at temperature > 0
    # Per drafted position the target reached: (was the draft token committed, its
    # acceptance probability min(1, p(d) / q(d)) under the rule; q one-hot for copy drafts).
    accepted: list[tuple[bool, float]] = field(default_factory=list)
    sources: Counter[str] = field(default_factory=Counter)  # drafted tokens per source
    events: list[E.Event] = field(default_factory=list)

    def add(self, other: SampledStats) -> None:
        self.pit += other.pit
        self.accepted += other.accepted
        self.sources += other.sources
        self.events += other.events


def pit_run(session: Session, prompt_text: str, lines: Sequence[str], max_tokens: int, seed: int,
            start: Sequence[E.Command] = (), grammar: CompiledGrammar | None = None) -> SampledStats:
    """Run a sampled schedule. For every token committed at temperature > 0: its
    randomized PIT value under the target distribution of the verify-batch row it was
    committed from (the raw logits the target returned, processed here with the sampling
    settings in force, and masked by `grammar`'s state on the committed path, a state of its
    own kept here beside the engine's). For every drafted position the target reached:
    whether the draft token was committed, and the probability the rejection rule should
    accept it with, from the p and q rows the engine handed the rule."""
    import specdash.engine.engine as engine_module
    from specdash.engine.engine import RunOptions

    engine = session.engine
    target = engine.target
    prompt = session.prompt_tokens(prompt_text)
    for cmd in start:
        session.send(cmd)
    engine.rng = np.random.default_rng(seed)
    v_rng = np.random.default_rng(10_000 + seed)
    logits_seen: list[np.ndarray] = []
    verified: list[tuple[np.ndarray, list[int], np.ndarray | None]] = []
    real_decode, real_rule = target.decode, engine_module.verify_sampling

    def decode(tokens: Sequence[int], start_pos: int, logits: Any = "all", seq: int = 0) -> Any:
        out = real_decode(tokens, start_pos, logits, seq)
        if logits == "all":
            logits_seen.append(np.array(out, copy=True))
        return out

    def rule(p: np.ndarray, draft: Sequence[int], q: np.ndarray | None, rng: Any) -> tuple[int, int]:
        verified.append((p, list(draft), q))
        n, nxt = real_rule(p, draft, q, rng)
        return n, nxt

    target.decode = decode  # type: ignore[method-assign]
    engine_module.verify_sampling = rule  # type: ignore[assignment]
    entries = [e for n, line in enumerate(lines, 1) for e in parse_line(line, f"sampled:{n}")]
    sched = Schedule(entries, session.send)
    out = SampledStats()
    settings: E.SettingsEvent | None = None
    shadow = grammar.start() if grammar is not None else None
    options = RunOptions(grammar=grammar.start()) if grammar is not None else None
    try:
        for ev in engine.generate(prompt, max_tokens, options):
            out.events.append(ev)
            if isinstance(ev, E.SettingsEvent):
                settings = ev
            elif isinstance(ev, E.StepEvent):
                assert settings is not None and logits_seen
                rows = logits_seen[-1]  # the verify batch: [last committed, drafts...]
                logits_seen.clear()
                if settings.temperature and settings.temperature > 0:
                    params = SamplingParams(settings.temperature, settings.top_k or 0,
                                            settings.top_p if settings.top_p is not None else 1.0)
                    shown = rows[: len(ev.tokens)]
                    if shadow is not None:  # row j after the j tokens committed before it
                        shown = shadow.mask(shown, ev.tokens[:-1])
                    probs = process_logits(shown, params)
                    for j, tok in enumerate(ev.tokens):
                        out.pit.append(pit(probs[j], tok, v_rng.random()))
                    p, draft, q = verified.pop()
                    out.sources[ev.drafter] += len(draft)
                    # Position j was reached when the j drafts before it were accepted.
                    for j in range(min(len(draft), ev.accepted + 1)):
                        if j >= len(ev.tokens):  # cut at the end of generation or the budget
                            break
                        qd = 1.0 if q is None else float(q[j][draft[j]])
                        a = min(1.0, float(p[j][draft[j]]) / qd) if qd > 0 else 0.0
                        out.accepted.append((ev.tokens[j] == draft[j], a))
                verified.clear()
                if shadow is not None:
                    shadow.accept(ev.tokens)
                sched.after_step(ev.step)
    finally:
        del target.decode
        engine_module.verify_sampling = real_rule  # type: ignore[assignment]
    list(engine.apply_pending())
    return out


SAMPLED_START = (E.Resume(), E.SetK(4), E.SetDrafter("lookup"), E.SetAdaptive(False),
                 E.SetSampling(temperature=1.0), E.Forget())
Z_MAX = 5.0  # standard deviations: about 6e-7 two-sided under the normal approximation


def sampled_stats(session: Session, pair: Pair, runs: int, max_tokens: int = 120,
                  until: Callable[[SampledStats], bool] | None = None,
                  grammar: CompiledGrammar | None = None) -> SampledStats:
    """`runs` seeded runs of the drafter-swapping sampled schedule, pooled; with `until`,
    fewer when it is satisfied first (a planted bug shown with as many samples as it
    takes on this CPU's rounding, never more than `runs`); with `grammar`, every run under it."""
    stats = SampledStats()
    for seed in range(runs):
        stats.add(pit_run(session, pair.prompts[seed % len(pair.prompts)], sampled_schedule(pair), max_tokens,
                          seed, SAMPLED_START, grammar))
        if until is not None and until(stats):
            break
    return stats


def acceptance_z(accepted: Sequence[tuple[bool, float]]) -> float:
    """How far the drafts committed are from what the rule promises, in standard
    deviations: (sum of (X - a)) / sqrt(sum of a (1 - a)), X the indicator that the draft
    token was committed and a its acceptance probability given the draft. Under the rule
    the sum is a martingale with that variance (a draft rejected is never resampled: the
    residual max(0, p - q) is 0 where p < q)."""
    s = sum(float(x) - a for x, a in accepted)
    v = sum(a * (1 - a) for _, a in accepted)
    return s / math.sqrt(v) if v > 0 else (0.0 if s == 0 else math.inf)


def pit(p: np.ndarray, token: int, v: float) -> float:
    """Randomized probability integral transform of `token` under `p`, tokens ordered
    by falling probability (ties by id): the mass of the tokens before it plus v times
    its own. Uniform on [0, 1] when token ~ p and v ~ U(0, 1). This order puts the
    usual faults at one end: too many likely tokens (a draft accepted too easily) near
    0, unlikely ones (a bad draft kept) near 1."""
    pt = p[token]
    before = float(p[p > pt].sum()) + float(p[:token][p[:token] == pt].sum())
    return before + v * float(pt)


def uniformity(values: Sequence[float], alpha: float = 1e-6) -> tuple[float, float]:
    """(D, bound): the Kolmogorov-Smirnov distance of `values` from Uniform(0, 1) and the
    Dvoretzky-Kiefer-Wolfowitz bound it exceeds with probability at most `alpha` when the
    values are i.i.d. uniform: P(D > eps) <= 2 exp(-2 n eps^2), for every n (no
    asymptotics). A failure is a real bias, or a one-in-a-million draw; the seeds are
    fixed, so it is the same draw on every run."""
    u = np.sort(np.asarray(values, dtype=np.float64))
    n = len(u)
    i = np.arange(1, n + 1)
    d = float(max((i / n - u).max(), (u - (i - 1) / n).max()))
    return d, math.sqrt(math.log(2 / alpha) / (2 * n))


# --- the command line --------------------------------------------------------------------


@dataclass
class Totals:
    pair: str
    results: list[Result] = field(default_factory=list)

    def lines(self) -> list[str]:
        r = self.results
        ties = [gap for x in r for _, gap in x.ties]
        ks: Counter[int] = sum((x.ks for x in r), Counter())
        sources: Counter[str] = sum((x.sources for x in r), Counter())
        failed = [x for x in r if not x.ok]
        out = [
            f"pair {self.pair}: {len(r)} schedules, {len(r) - len(failed)} passed, {len(failed)} failed, "
            f"{sum(x.seconds for x in r):.0f} s",
            f"  steps {sum(x.steps for x in r)}, tokens {sum(x.tokens for x in r)} "
            f"(greedy {sum(x.greedy_tokens for x in r)}, checked by teacher forcing {sum(x.forced for x in r)})",
            f"  commands applied {sum(x.applied for x in r)}, refused {sum(x.refused for x in r)}, "
            f"pauses {sum(x.pauses for x in r)}, expert reloads {sum(x.reloads for x in r)}",
            f"  K used: {dict(sorted(ks.items()))}",
            f"  draft sources per step: {dict(sources.most_common())}",
            f"  near-tie mismatches (top-two gap < {TIE_GAP}): {len(ties)}"
            + (f", gaps {', '.join(f'{g:.3f}' for g in sorted(ties))}" if ties else ""),
        ]
        out += [f"  FAILED {x.report()}" for x in failed]
        return out


def _say(line: str, out: list[str]) -> None:
    print(line, flush=True)
    out.append(line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default="small,default,moe,xvocab,mtp",
                    help="comma-separated: small, default, moe, xvocab (a draft with another vocabulary), "
                         "mtp (a qwen35 drafting with its own MTP head)")
    ap.add_argument("--schedules", type=int, default=200, help="schedules per pair (default 200)")
    ap.add_argument("--tokens", type=int, default=48, help="tokens per schedule (default 48)")
    ap.add_argument("--seed-base", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--sampled-runs", type=int, default=4,
                    help="runs of the sampled drafter-swap schedule per pair for the statistical test (default 4)")
    ap.add_argument("--out", type=Path, help="also write the summary to this file")
    args = ap.parse_args(argv)
    out: list[str] = []
    failures = 0
    with tempfile.TemporaryDirectory(prefix="specdash-fuzz-") as tmp:
        folder = Path(tmp)
        pairs: list[Pair] = []
        for name in args.pairs.split(","):
            if name == "small":
                pairs.append(small_pair(make_small_draft(folder)))
            elif name == "default":
                pairs.append(default_pair())
            elif name == "moe":
                pairs.append(moe_pair(make_moe(folder), make_small_draft(folder)))
            elif name == "xvocab":
                pairs.append(translated_pair(make_small_draft(folder)))
            elif name == "mtp":
                pairs.append(mtp_pair(make_mtp(folder)))
            else:
                ap.error(f"--pairs: unknown pair {name!r}")
        _say(f"fuzz_exact: {args.schedules} schedules x {args.tokens} tokens per pair, seeds from {args.seed_base}; "
             f"near-tie threshold {TIE_GAP} logits", out)
        for pair in pairs:
            session = pair.session(args.tokens)
            reference = Reference(pair)
            totals = Totals(pair.name)
            try:
                for seed in range(args.seed_base, args.seed_base + args.schedules):
                    schedule = make_schedule(seed, pair, args.tokens)
                    result = run_schedule(session, reference, pair, schedule, args.tokens)
                    totals.results.append(result)
                    mark = "ok " if result.ok else "FAIL"
                    print(f"  {mark} {pair.name}/{seed}: {result.steps} steps, {result.tokens} tokens, "
                          f"{len(result.ties)} ties, {result.applied}+{result.refused} commands, "
                          f"{result.seconds:.1f}s", flush=True)
                    if not result.ok:
                        print(result.report(), flush=True)
                for line in totals.lines():
                    _say(line, out)
                failures += sum(1 for r in totals.results if not r.ok)
                if args.sampled_runs and pair.expert_count is None:
                    stats = sampled_stats(session, pair, args.sampled_runs)
                    d, bound = uniformity(stats.pit)
                    z = acceptance_z(stats.accepted)
                    bad = d > bound or abs(z) > Z_MAX
                    failures += bad
                    _say(f"  sampled, drafters swapped mid-stream ({args.sampled_runs} runs): {len(stats.pit)} tokens, "
                         f"KS distance {d:.4f} vs DKW bound {bound:.4f} (alpha 1e-6); {len(stats.accepted)} drafted "
                         f"positions {dict(stats.sources)}, acceptance z {z:+.2f} (|z| <= {Z_MAX:g}): "
                         f"{'FAIL' if bad else 'ok'}", out)
            finally:
                reference.close()
                session.close()
    if args.out:
        args.out.write_text("\n".join(out) + "\n", encoding="utf-8")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
