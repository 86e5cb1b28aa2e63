"""Draft sources behind one interface (see base.Drafter).

The drafter names live here and nowhere else: a drafter spec is one of KINDS, or else
a draft model (a registry name or a GGUF path).
"""

from specdash.engine.drafters.base import Borrowed, Draft, Drafter, NoDrafter

# Model-free drafter kinds, with what each does (for --help and the draft picker).
KINDS: dict[str, str] = {
    "lookup": "prompt lookup: copy what followed the recent n-gram (free)",
    "suffix": "suffix match over the prompt and earlier outputs (free)",
    "chain": "lookup, then suffix, then the draft model: first draft wins",
    "none": "plain decoding (K=0)",
}


def is_model(spec: str) -> bool:
    """Whether a drafter spec names a draft model rather than a model-free kind."""
    return spec not in KINDS


__all__ = ["KINDS", "Borrowed", "Draft", "Drafter", "NoDrafter", "is_model"]
