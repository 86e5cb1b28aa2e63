"""Settings the engine runs with. The TOML config (specdash/config.py) and the CLI flags
both end up here; the engine never reads files or flags itself."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    """Applied identically to target and draft distributions (needed for exactness)."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(slots=True)
class EngineSettings:
    target: str = "qwen2.5-coder-1.5b"
    # A registry name, a GGUF path, or one of the model-free sources: "lookup", "suffix",
    # "chain", "none".
    draft: str = "qwen2.5-coder-0.5b"
    k: int = 4
    sampling: SamplingParams = field(default_factory=SamplingParams)
    threads: int | None = None  # None = physical cores
    ctx: int = 4096
    max_tokens: int = 256
    raw: bool = False  # True = no chat template
    adaptive: bool = False
    k_min: int = 0
    k_max: int = 16
    draft_p_min: float = 0.0  # draft-model confidence cut; 0 = off
    lookup_min_ngram: int = 1
    lookup_max_ngram: int = 4
    experts: int | None = None  # MoE expert_used_count override; None = model default
