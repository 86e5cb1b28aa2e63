"""Events the engine emits and the counters built from them.

Metric names follow vLLM's spec-decode metrics (num_drafts, num_draft_tokens,
num_accepted_tokens, num_accepted_tokens_per_pos) so numbers line up with what
operators already know. Definitions:
  acceptance rate       = accepted / drafted tokens           (llama.cpp's definition)
  mean accepted length  = 1 + accepted / steps                (vLLM's definition)
  per-position rate[i]  = steps whose draft position i+1 was accepted / steps that drafted it
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class PrefillEvent:
    n_tokens: int
    ms: float
    event: str = "prefill"


@dataclass(slots=True)
class StepEvent:
    step: int
    k: int  # K in force for this step (what was asked of the drafter)
    drafter: str  # the source that produced this step's draft ("none" when nothing drafted)
    drafted: int
    accepted: int
    tokens: list[int]  # committed this step: accepted drafts, then one target token
    pieces: list[str]  # text of each committed token ('' while a UTF-8 char is incomplete)
    from_draft: list[bool]  # provenance per committed token
    draft_ms: float
    verify_ms: float
    other_ms: float  # bookkeeping: verify rules, commit, KV rollback, event building
    n_past: int  # tokens in the target context after this step
    n_generated: int
    t: float  # time.perf_counter() at the end of the step
    content: str = ""  # content detector label (code / json / prose ...), "" when unknown
    adaptive: bool = False
    decision: str = ""  # adaptive controller's reason for this K, "" when fixed
    event: str = "step"

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def step_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.other_ms


@dataclass(slots=True)
class NoticeEvent:
    """Something the operator should see: a command applied or refused, a reload."""

    level: str  # "info" | "warning" | "error"
    message: str
    event: str = "notice"


@dataclass(slots=True)
class SettingsEvent:
    """The live settings, emitted at start and after every command that changed them."""

    target: str
    drafter: str
    k: int
    temperature: float
    top_k: int
    top_p: float
    adaptive: bool
    paused: bool
    experts: int | None
    expert_count: int | None  # None for a dense model
    event: str = "settings"


@dataclass(slots=True)
class Summary:
    text: str
    stop_reason: str  # "eos" | "max_tokens" | "context" | "stopped"
    n_prompt: int
    n_generated: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_accepted_tokens_per_pos: list[int]
    acceptance_rate: float | None  # None when nothing was drafted
    mean_accepted_length: float
    tokens_per_s: float  # decode only
    prefill_tokens_per_s: float
    prefill_ms: float
    decode_s: float
    draft_ms: float
    verify_ms: float
    other_ms: float
    steps: int
    event: str = "summary"


Event = PrefillEvent | StepEvent | NoticeEvent | SettingsEvent | Summary


def to_dict(event: Any) -> dict:
    return asdict(event)


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

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.steps if self.steps else 0.0

    @property
    def per_pos_rate(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.per_pos_accepted, self.per_pos_drafted)]
