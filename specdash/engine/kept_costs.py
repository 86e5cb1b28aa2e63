"""What the engine keeps of its target's batch costs between runs, and the store it asks.

The engine knows loaded models, not files: a CostStore (specdash/costs/store.py) maps a
loaded target to its kept profile. load() gives KeptCosts, a one-line reason it threw a
bad file away (the engine shows it and starts cold), or None (nothing kept: a cold start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from specdash.engine.llm import LLM


@dataclass
class KeptCosts:
    verify_ms: dict[int, float]  # ms per target batch of n tokens (measured sizes only)
    samples: dict[int, int]  # timings behind each size
    draft_ms: dict[str, float] = field(default_factory=dict)  # draft model label -> ms per drafted token
    where: str = ""  # the file, for notices
    age_s: float = 0.0  # since it was last saved

    @property
    def timings(self) -> int:
        return sum(self.samples.values())


class CostStore(Protocol):
    def load(self, target: LLM, experts: int | None) -> KeptCosts | str | None:
        """This target's kept costs on this machine; a str says why a file was dropped."""
        ...

    def save(self, target: LLM, experts: int | None, kept: KeptCosts) -> str | None:
        """Keep them (atomically, under a lock); a str says why that failed."""
        ...


def age_text(seconds: float) -> str:
    """A profile's age as people say it: 40 s, 12 min, 3 h, 2 d."""
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f} {unit}"
    return f"{seconds:.0f} s"
