"""Draft sources behind one interface (see base.Drafter)."""

from specdash.engine.drafters.base import Draft, Drafter, NoDrafter

__all__ = ["Draft", "Drafter", "NoDrafter"]
