"""Sweeps over the engine: plain decoding vs every drafter x K (and, for a MoE target, every
active-expert count), interleaved and repeated.

Why interleaved: this machine is shared and its speed drifts; running all configurations
of a prompt back to back, in a rotating order, and repeating, lets the ratio to plain
decoding measured in the same round cancel most of that drift.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from collections.abc import Callable, Iterable

from specdash.contract import events as E
from specdash.contract.errors import SpecdashError
from specdash.contract.events import Summary
from specdash.tuning.prompts import Prompt
from specdash.sources.session import Session


@dataclass(frozen=True)
class Config:
    drafter: str  # "plain", or a drafter name from the session ("draft", "lookup", ...)
    k: int
    adaptive: bool = False

    @property
    def label(self) -> str:
        return row_label(self.drafter, self.k, self.adaptive)


def row_label(drafter: str, k: int | None, adaptive: bool) -> str:
    if drafter == "plain":
        return "plain"
    return f"{drafter} adaptive" if adaptive else f"{drafter} K={k}"


@dataclass
class Result:
    prompt: str
    drafter: str
    k: int | None  # None for adaptive
    adaptive: bool
    tokens_per_s: float
    speedup: float
    acceptance_rate: float | None
    mean_accepted_length: float
    n_generated: int
    same_text_as_plain: bool
    runs: list[float] = field(default_factory=list)  # tok/s of each repeat
    experts: int | None = None  # MoE active experts the target ran with; None = not swept
    # Per-step costs, less at the mercy of machine load than tok/s: what one target
    # verify batch and one drafting call cost on average in these runs.
    verify_ms_per_step: float = 0.0
    draft_ms_per_step: float = 0.0
    tokens_per_step: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def configs_for(drafters: list[str], ks: list[int], adaptive: bool) -> list[Config]:
    out = [Config("plain", 0)]
    for d in drafters:
        out += [Config(d, k) for k in ks if k > 0]
        if adaptive:
            out.append(Config(d, 0, adaptive=True))
    return out


Runs = dict[tuple[str, Config], list[Summary]]


def run_bench(
    session: Session,
    prompts: list[Prompt],
    drafters: dict[str, str],
    configs: list[Config],
    *,
    max_tokens: int,
    repeat: int,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Result]:
    """`drafters` maps a config's drafter name ("draft", "lookup", ...) to the drafter
    spec the engine is sent (SetDrafter), e.g. "draft" -> "qwen2.5-coder-0.5b"."""
    tokens = {p.name: session.prompt_tokens(p.text) for p in prompts}
    _warm_up(session, tokens[prompts[0].name])
    runs: Runs = {}
    report = _Progress(repeat * len(prompts) * len(configs), progress)
    for r in range(repeat):
        _round(session, r, prompts, tokens, drafters, configs, max_tokens, runs, report)
    return _results(prompts, configs, runs)


def run_expert_sweep(
    session: Session,
    expert_counts: list[int],
    prompts: list[Prompt],
    drafters: dict[str, str],
    configs: list[Config],
    *,
    max_tokens: int,
    repeat: int,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Result]:
    """The bench at each expert count, the target reloaded with each override.

    Rounds outside, expert counts inside in a rotating order: drift on a shared machine
    then hits every count alike, at the price of a reload per count per round.
    Speedups are relative to plain decoding at the same expert count.
    """
    tokens = {p.name: session.prompt_tokens(p.text) for p in prompts}
    runs: dict[int, Runs] = {n: {} for n in expert_counts}
    report = _Progress(repeat * len(expert_counts) * len(prompts) * len(configs), progress)
    for r in range(repeat):
        for n in expert_counts[r % len(expert_counts):] + expert_counts[: r % len(expert_counts)]:
            if session.settings.experts != n:
                progress(f"experts={n}: reloading the target")
                _apply(session, [E.SetExperts(n)])
            _warm_up(session, tokens[prompts[0].name])
            report.tag = f"experts={n} "
            _round(session, r, prompts, tokens, drafters, configs, max_tokens, runs[n], report)
    results = []
    for n in expert_counts:
        for res in _results(prompts, configs, runs[n]):
            res.experts = n
            results.append(res)
    return results


class _Progress:
    def __init__(self, total: int, sink: Callable[[str], None]):
        self.total, self.done, self.sink, self.tag = total, 0, sink, ""

    def __call__(self, prompt: str, cfg: Config, summary: Summary) -> None:
        self.done += 1
        self.sink(
            f"[{self.done}/{self.total}] {self.tag}{prompt:<16} {cfg.label:<18} {summary.tokens_per_s:6.1f} tok/s"
            + ("" if summary.acceptance_rate is None else f"  acc {summary.acceptance_rate:.0%}")
        )


def _apply(session: Session, commands: list[E.Command]) -> None:
    """Send `commands` and apply them now (between runs), as a user's keys would be.
    A refusal is an error here: the bench would otherwise measure the wrong thing."""
    for cmd in commands:
        session.send(cmd)
    for ev in session.engine.apply_pending():
        if isinstance(ev, E.NoticeEvent) and ev.level != "info":
            raise SpecdashError(f"bench: {ev.message}")


def _warm_up(session: Session, tokens: list[int]) -> None:
    # The first decodes after a load pay page faults on the weights.
    _consume(session.engine.generate(tokens, 16))


def _round(session: Session, r: int, prompts: list[Prompt], tokens: dict[str, list[int]],
           drafters: dict[str, str], configs: list[Config], max_tokens: int,
           runs: Runs, report: _Progress) -> None:
    """Every configuration once per prompt, starting at a different one each round."""
    for p in prompts:
        order = configs[r % len(configs):] + configs[: r % len(configs)]
        for cfg in order:
            spec = "none" if cfg.drafter == "plain" else drafters[cfg.drafter]
            # Forget: every run starts cold, as a user's first prompt would. The same
            # prompt repeats, and a suffix drafter that remembered the last run's answer,
            # or adaptive K that learned on another drafter, would measure memory.
            _apply(session, [E.SetDrafter(spec), E.SetK(cfg.k), E.SetAdaptive(cfg.adaptive), E.Forget()])
            summary = _consume(session.engine.generate(tokens[p.name], max_tokens))
            runs.setdefault((p.name, cfg), []).append(summary)
            report(p.name, cfg, summary)


def _results(prompts: list[Prompt], configs: list[Config], runs: Runs) -> list[Result]:
    results = []
    for p in prompts:
        base = runs[(p.name, configs[0])]
        base_tps = statistics.median(s.tokens_per_s for s in base)
        for cfg in configs:
            ss = runs[(p.name, cfg)]
            tps = statistics.median(s.tokens_per_s for s in ss)
            drafted = sum(s.num_draft_tokens for s in ss)
            accepted = sum(s.num_accepted_tokens for s in ss)
            drafts = sum(s.num_drafts for s in ss)
            steps = sum(s.steps for s in ss)
            results.append(
                Result(
                    prompt=p.name,
                    drafter=cfg.drafter,
                    k=None if cfg.adaptive else cfg.k,
                    adaptive=cfg.adaptive,
                    tokens_per_s=tps,
                    speedup=tps / base_tps if base_tps else 0.0,
                    acceptance_rate=accepted / drafted if drafted else None,
                    mean_accepted_length=1 + accepted / drafts if drafts else 0.0,
                    n_generated=ss[0].n_generated,
                    same_text_as_plain=all(s.text == base[0].text for s in ss),
                    runs=[s.tokens_per_s for s in ss],
                    verify_ms_per_step=sum(s.verify_ms for s in ss) / steps if steps else 0.0,
                    draft_ms_per_step=sum(s.draft_ms for s in ss) / steps if steps else 0.0,
                    tokens_per_step=sum(s.n_generated for s in ss) / steps if steps else 0.0,
                )
            )
    return results


def _consume(events: Iterable[E.Event]) -> Summary:
    summary = None
    for ev in events:
        if isinstance(ev, Summary):
            summary = ev
    assert summary is not None
    return summary


def format_table(results: list[Result]) -> str:
    swept = any(r.experts is not None for r in results)
    ex_head = f"{'experts':>7} " if swept else ""
    head = (f"{'prompt':<16} {ex_head}{'drafter':<18} {'tok/s':>7} {'speedup':>8} {'accept':>7} "
            f"{'mean len':>8} {'tok/step':>8} {'verify ms':>9} {'draft ms':>8}  same text")
    lines = [head, "-" * len(head)]
    prev = None
    for r in results:
        if prev is not None and (r.prompt, r.experts) != prev:
            lines.append("")
        prev = (r.prompt, r.experts)
        label = row_label(r.drafter, r.k, r.adaptive)
        acc = "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.0%}"
        ex = f"{r.experts:>7} " if swept else ""
        lines.append(
            f"{r.prompt:<16} {ex}{label:<18} {r.tokens_per_s:7.1f} {r.speedup:7.2f}x {acc:>7} "
            f"{r.mean_accepted_length:8.2f} {r.tokens_per_step:8.2f} {r.verify_ms_per_step:9.1f} "
            f"{r.draft_ms_per_step:8.1f}  {'yes' if r.same_text_as_plain else 'NO'}"
        )
    lines.append(
        "\nmean len = 1 + accepted / drafts (vLLM); tok/step = tokens per target step; verify ms and "
        "draft ms are per step: costs that move less with machine load than tok/s."
    )
    if not all(r.same_text_as_plain for r in results):
        lines.append(
            "\nsame text NO: the output left plain decoding's text at some token. Under greedy this "
            "is batch rounding at a near-tie (a batch of K+1 rounds differently from 1 token; "
            "benchmarks/batch_rounding.py measures it); tests/test_engine_exact.py checks every "
            "token against the target's own argmax."
        )
    return "\n".join(lines)


def experts_report(results: list[Result], reference: int) -> str:
    """Per prompt: plain tok/s at each expert count, as a ratio to `reference` experts."""
    lines = []
    for prompt in dict.fromkeys(r.prompt for r in results):
        plain = {r.experts: r.tokens_per_s for r in results if r.prompt == prompt and r.drafter == "plain"}
        ref = plain.get(reference)
        parts = [f"{n}: {tps:.1f} tok/s" + (f" ({tps / ref:.2f}x)" if ref else "") for n, tps in plain.items()]
        lines.append(f"{prompt:<16} plain by experts (ratio to {reference}): " + ", ".join(parts))
    return "\n".join(lines)


def adaptive_report(results: list[Result]) -> str:
    """Per prompt (and expert count): adaptive tok/s over the best fixed K and over plain decoding."""
    lines = []
    for prompt, experts in dict.fromkeys((r.prompt, r.experts) for r in results):
        rows = [r for r in results if (r.prompt, r.experts) == (prompt, experts)]
        plain = next(r for r in rows if r.drafter == "plain")
        for ad in (r for r in rows if r.adaptive):
            fixed = [r for r in rows if r.drafter in ("plain", ad.drafter) and not r.adaptive]
            best = max(fixed, key=lambda r: r.tokens_per_s)
            best_label = "plain" if best.drafter == "plain" else f"K={best.k}"
            where = prompt if experts is None else f"{prompt} experts={experts}"
            lines.append(
                f"{where:<16} {ad.drafter:<8} adaptive {ad.tokens_per_s:6.1f} tok/s = "
                f"{ad.tokens_per_s / best.tokens_per_s:.2f}x best fixed ({best_label}, {best.tokens_per_s:.1f}), "
                f"{ad.tokens_per_s / plain.tokens_per_s:.2f}x plain"
            )
    return "\n".join(lines)
