"""Counters built from step events (the events themselves: specdash/contract/events.py).

Metric names follow vLLM's spec-decode metrics (num_drafts, num_draft_tokens,
num_accepted_tokens, num_accepted_tokens_per_pos) so numbers line up with what
operators already know. Definitions:
  acceptance rate       = accepted / drafted tokens           (llama.cpp's definition)
  mean accepted length  = 1 + accepted / drafts               (vLLM's definition)
  tokens per step       = generated / steps (drafting or not; what a decode step yields)
  per-position rate[i]  = steps whose draft position i+1 was accepted / steps that drafted it
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdash.contract.events import CountersEvent, StepEvent


@dataclass(slots=True)
class SpecCounters:
    """Running totals over step events; the engine, bench and dashboard share it."""

    steps: int = 0
    num_drafts: int = 0  # steps that drafted at least one token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_generated: int = 0
    per_pos_drafted: list[int] = field(default_factory=list)
    per_pos_accepted: list[int] = field(default_factory=list)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    other_ms: float = 0.0

    def add(self, ev: StepEvent) -> None:
        self.steps += 1
        self.num_generated += len(ev.tokens)
        self.draft_ms += ev.draft_ms
        self.verify_ms += ev.verify_ms
        self.other_ms += ev.other_ms
        if ev.drafted:
            self.num_drafts += 1
            self.num_draft_tokens += ev.drafted
            self.num_accepted_tokens += ev.accepted
            grow = ev.drafted - len(self.per_pos_drafted)
            if grow > 0:
                self.per_pos_drafted.extend([0] * grow)
                self.per_pos_accepted.extend([0] * grow)
            for i in range(ev.drafted):
                self.per_pos_drafted[i] += 1
            for i in range(ev.accepted):
                self.per_pos_accepted[i] += 1

    def add_counters(self, ev: CountersEvent) -> None:
        """A remote source's deltas. Per-position drafts are not reported there, so every
        draft counts as reaching every position (vLLM's definition: the share of drafts
        whose position i was accepted)."""
        self.steps += ev.steps
        self.num_generated += ev.tokens
        self.num_drafts += ev.num_drafts
        self.num_draft_tokens += ev.num_draft_tokens
        self.num_accepted_tokens += ev.num_accepted_tokens
        grow = len(ev.num_accepted_tokens_per_pos) - len(self.per_pos_drafted)
        if grow > 0:
            self.per_pos_drafted.extend([0] * grow)
            self.per_pos_accepted.extend([0] * grow)
        for i, accepted in enumerate(ev.num_accepted_tokens_per_pos):
            self.per_pos_drafted[i] += ev.num_drafts
            self.per_pos_accepted[i] += accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.num_generated / self.steps if self.steps else 0.0

    @property
    def per_pos_rate(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.per_pos_accepted, self.per_pos_drafted)]
