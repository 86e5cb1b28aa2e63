"""Draft sources behind one interface (see base.Drafter).

The drafter names live in kinds.py and nowhere else: a drafter spec is one of KINDS, or
else a draft model (a registry name or a GGUF path).
"""

from specdash.engine.drafters.base import Borrowed, Draft, Drafter, NoDrafter
from specdash.engine.drafters.kinds import KINDS, MODEL_SOURCES, DrafterKind, Parts, is_model

__all__ = ["KINDS", "MODEL_SOURCES", "Borrowed", "Draft", "Drafter", "DrafterKind", "NoDrafter", "Parts", "is_model"]
