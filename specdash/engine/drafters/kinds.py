"""The drafter kinds: every drafter spec that is not a draft model, what it does, how it
is built, and which sources its drafts may name. One registry, and everything that
builds or checks drafters reads it: a session runs a kind (session.Session.make_drafter),
whatif simulates it (whatif.simulate.make_drafter) and the exactness fuzzer swaps to it
and checks its steps (benchmarks/fuzz_exact.py), with no change in any of them.

A kind is built from `Parts` its builder supplies. A session's are its own (the suffix
drafter's memory and the draft models it lends); whatif's are simulated (proposals timed
on a cost profile, the draft model replaced by its teacher-forced argmax). So a kind has
one structure in both, and whatif cannot build a different chain than the engine runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdash.engine.drafters.auto import AutoDrafter
from specdash.engine.drafters.base import Drafter, NoDrafter
from specdash.engine.drafters.chain import ChainDrafter
from specdash.engine.drafters.edits import EditCopyDrafter
from specdash.engine.drafters.lookup import PromptLookupDrafter
from specdash.engine.settings import EngineSettings
from specdash.contract.errors import SpecdashError

# The sources a draft model's drafts name: "draft", or "xvocab" through translation (a
# draft model with another vocabulary, engine/drafters/translated.py).
MODEL_SOURCES = frozenset({"draft", "xvocab"})


@dataclass(frozen=True, slots=True)
class Parts:
    """What a kind is built from, supplied by whoever builds it."""

    settings: EngineSettings  # the n-gram lengths and cuts drafters are made with
    # A model-free drafter as the builder runs it: as is (a session), timed on a cost
    # profile (whatif). A new model-free kind wraps its drafter in this.
    free: Callable[[Drafter], Drafter]
    suffix: Callable[[], Drafter]  # the suffix drafter: a session lends its one memory of earlier outputs
    # The model source auto and a chain use; None: there is none. Where no model is named and
    # the target has an MTP head, the head (a session's auto and chain use its own head).
    model: Callable[[], Drafter | None]
    # The target's MTP head (engine/drafters/mtp.py); raises a SpecdashError with the one-line
    # reason where it cannot draft. None: the builder has no head to offer.
    head: Callable[[], Drafter] | None = None

    def lookup(self) -> Drafter:
        s = self.settings
        return self.free(PromptLookupDrafter(s.lookup_min_ngram, s.lookup_max_ngram))

    def edit(self) -> Drafter:
        return self.free(EditCopyDrafter())


@dataclass(frozen=True, slots=True)
class DrafterKind:
    name: str  # the spec: --draft, draft=, SetDrafter
    help: str  # for --help and the dashboard's draft picker
    build: Callable[[Parts], Drafter]
    # The sources its drafts may name (Draft.source, StepEvent.drafter); empty for a kind
    # that never drafts (plain decoding: whatif's baseline rather than a drafter to simulate).
    sources: frozenset[str]

    @property
    def drafts(self) -> bool:
        return bool(self.sources)

    @property
    def uses_model(self) -> bool:
        """Whether it may draft with the draft model (whatif then loads it)."""
        return bool(self.sources & MODEL_SOURCES)


KINDS: dict[str, DrafterKind] = {}  # by name, in registration order (the draft picker's)


def register(kind: DrafterKind) -> DrafterKind:
    """Add a kind (the built-ins below; tests add their own)."""
    if kind.name in KINDS:
        raise ValueError(f"drafter kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    del KINDS[name]


def is_model(spec: str) -> bool:
    """Whether a drafter spec names a draft model rather than a kind."""
    return spec not in KINDS


def _head(parts: Parts) -> Drafter:
    if parts.head is None:
        raise SpecdashError("mtp unavailable: no MTP head here")
    return parts.head()


def _chain(parts: Parts) -> Drafter:
    model = parts.model()
    # The edit copy first: it drafts only once the answer has made an edit, and then its copy
    # has the edit where lookup's still has the text replaced.
    return ChainDrafter([parts.edit(), parts.lookup(), parts.suffix(), *([model] if model is not None else [])])


def _auto(parts: Parts) -> Drafter:
    model = parts.model()
    return AutoDrafter([parts.lookup(), parts.edit(), parts.suffix(), *([model] if model is not None else [])])


register(DrafterKind("auto", "each step the fastest: a copy, the draft model or MTP head, or none",
                     _auto, frozenset({"lookup", "edit", "suffix", "mtp"}) | MODEL_SOURCES))
register(DrafterKind("lookup", "prompt lookup: copy what followed the recent n-gram (free)",
                     Parts.lookup, frozenset({"lookup"})))
register(DrafterKind("edit", "copy the source with the answer's edits so far applied (free)",
                     Parts.edit, frozenset({"edit"})))
register(DrafterKind("suffix", "suffix match over the prompt and earlier outputs (free)",
                     lambda parts: parts.suffix(), frozenset({"suffix"})))
register(DrafterKind("mtp", "the target's own multi-token-prediction head (Qwen3.5, GLM-4.5, DeepSeek-V3 GGUFs "
                     "that keep it)", _head, frozenset({"mtp"})))
register(DrafterKind("chain", "edit copy, lookup, suffix, then the draft model: first draft wins",
                     _chain, frozenset({"lookup", "edit", "suffix", "mtp"}) | MODEL_SOURCES))
register(DrafterKind("none", "plain decoding (K=0)", lambda parts: NoDrafter(), frozenset()))
