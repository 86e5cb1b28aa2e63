"""Commands sent to a running engine (thread-safe queue); applied between steps only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SetK:
    k: int


@dataclass(frozen=True, slots=True)
class SetDrafter:
    spec: str  # registry name, GGUF path, "lookup", "suffix", "chain" or "none"


@dataclass(frozen=True, slots=True)
class SetSampling:
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None


@dataclass(frozen=True, slots=True)
class SetAdaptive:
    on: bool


@dataclass(frozen=True, slots=True)
class SetExperts:
    n: int


@dataclass(frozen=True, slots=True)
class Pause:
    pass


@dataclass(frozen=True, slots=True)
class Resume:
    pass


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = SetK | SetDrafter | SetSampling | SetAdaptive | SetExperts | Pause | Resume | Stop
