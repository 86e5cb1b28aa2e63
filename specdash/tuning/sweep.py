"""The K sweep: plain decoding and each K in a list, on the current prompt, through commands.

The research this product comes from tunes by hand: measure at K=8, try 12, 16, 24,
"plot speed vs K; optimal is where the curve flattens". A Sweep plans those runs and
drives the one engine there is with the commands an operator would send (SetK, a new
prompt with a short token budget), reads each run's Summary off the event stream, and
at the end (or on cancel) puts the settings back as they were and restarts the prompt
that was running. No Textual: the dashboard's sweep screen and `specdash sweep
--headless` both run this.

Rounds interleave the Ks in a rotating order (like `specdash bench`), so drift on a
shared machine hits every K alike; the spread across rounds is drawn as error bars.

Temperature is a second axis: with `temps`, every point is a (K, T) pair and each run
sends SetSampling(temperature=T) before its prompt; the restore puts the operator's
temperature back. The temperature a point shows is the one the engine reported in the
SettingsEvent its run started with, not the one asked for. At T > 0 each run samples its
own text, so a point is the median of `rounds` single samples, not a repeat of one text.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdash.contract import events as E

DEFAULT_KS = (0, 2, 4, 8, 12, 16, 24)


@dataclass
class Point:
    """One (K, temperature)'s runs."""

    k: int
    temperature: float = 0.0  # as planned: the key
    runs: list[E.Summary] = field(default_factory=list)
    # The (K, temperature) the engine reported for each run (its SettingsEvent at the start).
    seen: list[tuple[int | None, float | None]] = field(default_factory=list)

    @property
    def engine_temperature(self) -> float | None:
        """The temperature the engine says these runs had (None before any run, or when
        the runs disagree: the sweep's `problems` says why)."""
        temps = {t for _, t in self.seen}
        return temps.pop() if len(temps) == 1 else None

    @property
    def tokens_per_s(self) -> float | None:
        return statistics.median(s.tokens_per_s for s in self.runs) if self.runs else None

    @property
    def spread(self) -> tuple[float, float] | None:
        """(min, max) tok/s across rounds."""
        if not self.runs:
            return None
        tps = [s.tokens_per_s for s in self.runs]
        return min(tps), max(tps)

    @property
    def acceptance(self) -> float | None:
        drafted = sum(s.num_draft_tokens for s in self.runs)
        return sum(s.num_accepted_tokens for s in self.runs) / drafted if drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        drafts = sum(s.num_drafts for s in self.runs)
        return 1 + sum(s.num_accepted_tokens for s in self.runs) / drafts if drafts else None

    def to_json(self) -> dict[str, object]:
        # temperature: what the engine reported for these runs, not what was asked for
        return {"k": self.k, "temperature": self.engine_temperature, "tokens_per_s": self.tokens_per_s,
                "runs": [s.tokens_per_s for s in self.runs],
                "acceptance_rate": self.acceptance, "mean_accepted_length": self.mean_accepted_length,
                "n_generated": [s.n_generated for s in self.runs]}


class Sweep:
    def __init__(self, prompt: str, before: E.SettingsEvent, *, ks: tuple[int, ...] | list[int] = DEFAULT_KS,
                 rounds: int = 2, max_tokens: int = 96, title: str = "",
                 temps: Sequence[float] | None = None):
        """temps: the temperatures to sweep K at; None = the one running, left untouched."""
        if not ks:
            raise ValueError("a sweep needs at least one K")
        if temps is not None and not temps:
            raise ValueError("a sweep needs at least one temperature")
        self.prompt = prompt
        self.before = before
        self.ks = list(dict.fromkeys(ks))
        operator_t = before.temperature or 0.0
        self.temps = [float(t) for t in dict.fromkeys(temps)] if temps is not None else [operator_t]
        self.sets_temperature = temps is not None  # else no SetSampling is sent, none restored
        # Apply and save change K only: the temperature is the operator's choice about the
        # text, not a speed knob. So "best" is the best K at the operator's temperature
        # (or at the first swept one, when that is not swept).
        self.home_temperature = operator_t if operator_t in self.temps else self.temps[0]
        self.rounds = rounds
        self.max_tokens = max_tokens
        self.title = title  # the prompt's title, to restart it under its own name
        pairs = [(k, t) for t in self.temps for k in self.ks]
        # Round r visits the (K, T) pairs starting at a different one.
        self.plan = [(r, *pairs[(i + r) % len(pairs)]) for r in range(rounds) for i in range(len(pairs))]
        self.points = {(k, t): Point(k, t) for k, t in pairs}
        self.done = 0  # planned runs measured
        self.finished = False
        self.cancelled = False
        self._waiting_for: str | None = None  # title of the run in flight
        self._in_run = False  # its PromptEvent came: the next Summary is its result
        self._run_settings: tuple[int | None, float | None] = (None, None)  # as the engine reported them
        self.problems: list[str] = []  # runs the engine ran at other settings than planned
        # `specdash sweep --whatif`: K -> (tok/s, acceptance) simulated before any run, and
        # where the prediction came from; drawn beside the measured points, marked.
        # whatif simulates greedy decoding only: the predictions belong to the T=0 series.
        self.predicted: dict[int, tuple[float, float | None]] = {}
        self.predicted_from = ""

    @property
    def predicted_t0(self) -> dict[int, tuple[float, float | None]]:
        """The predicted points to draw: only when T=0 is swept, and only for swept Ks."""
        return {k: v for k, v in self.predicted.items() if k in self.ks} if 0.0 in self.temps else {}

    @property
    def total(self) -> int:
        return len(self.plan)

    def why_not(self) -> str:
        """"" when this sweep can run on `before`'s source, else why not."""
        if "sweep" not in self.before.supports:
            return "a sweep needs the embedded engine (a recording or a server cannot rerun a prompt)"
        if self.before.draft == "none":
            return "the draft source is none: every K would be plain decoding; choose one with d"
        return ""

    # --- driving ---------------------------------------------------------------------
    def start(self) -> list[E.Command]:
        first: list[E.Command] = [E.SetAdaptive(False)] if self.before.adaptive else []
        return first + self._run(0)

    def _run(self, i: int) -> list[E.Command]:
        r, k, t = self.plan[i]
        at = f" T={t:g}" if self.sets_temperature else ""
        self._waiting_for = f"sweep K={k}{at} · round {r + 1}/{self.rounds} · run {i + 1}/{self.total}"
        self._in_run = False
        self._run_settings = (None, None)
        temp: list[E.Command] = [E.SetSampling(temperature=t)] if self.sets_temperature else []
        return temp + [E.SetK(k), E.NewPrompt(self.prompt, self._waiting_for, self.max_tokens)]

    def feed(self, ev: E.Event) -> list[E.Command]:
        """Fold one event; the commands to send next (none, the next run, or the restore)."""
        if self.finished:
            return []
        if isinstance(ev, E.PromptEvent):
            self._in_run = ev.title == self._waiting_for
            return []
        if isinstance(ev, E.SettingsEvent) and self._in_run:
            # The engine applies queued commands as a run starts and reports the result:
            # this, not the plan, is what the run ran at.
            self._run_settings = (ev.k, ev.temperature)
            return []
        if isinstance(ev, E.Summary) and self._in_run:
            self._in_run = False
            if ev.stop_reason == "stopped":
                return []
            _, k, t = self.plan[self.done]
            seen_k, seen_t = self._run_settings
            if seen_k != k or (self.sets_temperature and (seen_t is None or abs(seen_t - t) > 1e-9)):
                self.problems.append(f"run {self.done + 1} was planned at K={k} T={t:g} but the engine reported "
                                     f"K={seen_k} T={'?' if seen_t is None else format(seen_t, 'g')}")
            point = self.points[(k, t)]
            point.runs.append(ev)
            point.seen.append(self._run_settings)
            self.done += 1
            if self.done < self.total:
                return self._run(self.done)
            self.finished = True
            return self.restore()
        return []

    def cancel(self) -> list[E.Command]:
        if self.finished:
            return []
        self.finished = self.cancelled = True
        return self.restore()

    def restore(self) -> list[E.Command]:
        """The settings the sweep found, and the prompt that was running."""
        cmds: list[E.Command] = []
        if self.before.k is not None:
            cmds.append(E.SetK(self.before.k))
        if self.before.adaptive:
            cmds.append(E.SetAdaptive(True))
        if self.sets_temperature:
            cmds.append(E.SetSampling(temperature=self.before.temperature or 0.0))
        cmds.append(E.NewPrompt(self.prompt, self.title or "your prompt"))
        return cmds

    # --- results ---------------------------------------------------------------------
    @property
    def measured(self) -> list[Point]:
        """Every point with a run, by temperature, then K."""
        return [self.points[key] for key in sorted(self.points, key=lambda kt: (kt[1], kt[0]))
                if self.points[key].runs]

    def at(self, temperature: float) -> list[Point]:
        """The measured points at one temperature, by K: one series of the plot."""
        return [p for p in self.measured if p.temperature == temperature]

    def plain_at(self, temperature: float) -> float | None:
        point = self.points.get((0, temperature))
        return point.tokens_per_s if point and point.runs else None

    def best_at(self, temperature: float) -> Point | None:
        """The fastest K at one temperature by median tok/s (K=0 included: plain may win)."""
        points = self.at(temperature)
        return max(points, key=lambda p: p.tokens_per_s or 0.0) if points else None

    @property
    def plain(self) -> float | None:
        """K=0's tok/s at the home temperature: the reference line."""
        return self.plain_at(self.home_temperature)

    @property
    def best(self) -> Point | None:
        """The best K at the home temperature (the operator's): what apply and save send."""
        return self.best_at(self.home_temperature)

    @property
    def sampled(self) -> bool:
        """Some point ran at T > 0: its runs are samples of different texts."""
        return any(t > 0 for t in self.temps)

    def sampled_note(self) -> str:
        """What a point at T > 0 is, for every output that shows one ("" when none is)."""
        if not self.sampled:
            return ""
        runs = "a single sample" if self.rounds == 1 else f"the median of {self.rounds} runs, each its own sample"
        return f"at T>0 every run samples a different text: a point there is {runs}"

    def to_json(self) -> dict[str, object]:
        best = self.best
        return {
            "prompt": self.prompt, "drafter": self.before.drafter, "target": self.before.target,
            "rounds": self.rounds, "max_tokens": self.max_tokens, "cancelled": self.cancelled,
            "temperatures": self.temps, "home_temperature": self.home_temperature,
            "plain_tokens_per_s": self.plain, "best_k": best.k if best else None,
            "best_k_by_temperature": [{"temperature": t, "k": b.k, "tokens_per_s": b.tokens_per_s}
                                      for t in self.temps if (b := self.best_at(t)) is not None],
            **({"note": self.sampled_note()} if self.sampled else {}),
            **({"problems": self.problems} if self.problems else {}),
            "points": [p.to_json() for p in self.measured],
            # whatif simulates greedy decoding: its points belong to the T=0 series only
            **({"predicted": {"from": self.predicted_from, "temperature": 0.0,
                              "points": [{"k": k, "tokens_per_s": t, "acceptance_rate": a}
                                         for k, (t, a) in sorted(self.predicted.items())]}}
               if self.predicted else {}),
        }
