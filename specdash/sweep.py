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
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from specdash import events as E

DEFAULT_KS = (0, 2, 4, 8, 12, 16, 24)


@dataclass
class Point:
    """One K's runs."""

    k: int
    runs: list[E.Summary] = field(default_factory=list)

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
        return {"k": self.k, "tokens_per_s": self.tokens_per_s, "runs": [s.tokens_per_s for s in self.runs],
                "acceptance_rate": self.acceptance, "mean_accepted_length": self.mean_accepted_length,
                "n_generated": [s.n_generated for s in self.runs]}


class Sweep:
    def __init__(self, prompt: str, before: E.SettingsEvent, *, ks: tuple[int, ...] | list[int] = DEFAULT_KS,
                 rounds: int = 2, max_tokens: int = 96, title: str = ""):
        if not ks:
            raise ValueError("a sweep needs at least one K")
        self.prompt = prompt
        self.before = before
        self.ks = list(dict.fromkeys(ks))
        self.rounds = rounds
        self.max_tokens = max_tokens
        self.title = title  # the prompt's title, to restart it under its own name
        # Round r visits the Ks starting at a different one.
        self.plan = [(r, self.ks[(i + r) % len(self.ks)]) for r in range(rounds) for i in range(len(self.ks))]
        self.points = {k: Point(k) for k in self.ks}
        self.done = 0  # planned runs measured
        self.finished = False
        self.cancelled = False
        self._waiting_for: str | None = None  # title of the run in flight
        self._in_run = False  # its PromptEvent came: the next Summary is its result
        # `specdash sweep --whatif`: K -> (tok/s, acceptance) simulated before any run, and
        # where the prediction came from; drawn beside the measured points, marked.
        self.predicted: dict[int, tuple[float, float | None]] = {}
        self.predicted_from = ""

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
        r, k = self.plan[i]
        self._waiting_for = f"sweep K={k} · round {r + 1}/{self.rounds} · run {i + 1}/{self.total}"
        self._in_run = False
        return [E.SetK(k), E.NewPrompt(self.prompt, self._waiting_for, self.max_tokens)]

    def feed(self, ev: E.Event) -> list[E.Command]:
        """Fold one event; the commands to send next (none, the next run, or the restore)."""
        if self.finished:
            return []
        if isinstance(ev, E.PromptEvent):
            self._in_run = ev.title == self._waiting_for
            return []
        if isinstance(ev, E.Summary) and self._in_run:
            self._in_run = False
            if ev.stop_reason == "stopped":
                return []
            _, k = self.plan[self.done]
            self.points[k].runs.append(ev)
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
        cmds.append(E.NewPrompt(self.prompt, self.title or "your prompt"))
        return cmds

    # --- results ---------------------------------------------------------------------
    @property
    def measured(self) -> list[Point]:
        return [self.points[k] for k in sorted(self.points) if self.points[k].runs]

    @property
    def plain(self) -> float | None:
        """K=0's tok/s: the reference line."""
        point = self.points.get(0)
        return point.tokens_per_s if point and point.runs else None

    @property
    def best(self) -> Point | None:
        """The fastest K by median tok/s (K=0 included: plain may win)."""
        points = self.measured
        return max(points, key=lambda p: p.tokens_per_s or 0.0) if points else None

    def to_json(self) -> dict[str, object]:
        best = self.best
        return {
            "prompt": self.prompt, "drafter": self.before.drafter, "target": self.before.target,
            "rounds": self.rounds, "max_tokens": self.max_tokens, "cancelled": self.cancelled,
            "plain_tokens_per_s": self.plain, "best_k": best.k if best else None,
            "points": [p.to_json() for p in self.measured],
            **({"predicted": {"from": self.predicted_from,
                              "points": [{"k": k, "tokens_per_s": t, "acceptance_rate": a}
                                         for k, (t, a) in sorted(self.predicted.items())]}}
               if self.predicted else {}),
        }
