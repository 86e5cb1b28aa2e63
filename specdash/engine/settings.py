"""The engine's settings: one frozen snapshot, validated against one table of limits.

`LIMITS` is the only place a setting's type, range, default and help are written. The
TOML config (specdash/config.py), the CLI's argparse types (commands/common.py), the
dashboard's input checks and the engine's command handling all read it, so a limit can
never disagree with itself. `EngineSettings` is frozen: the engine is its only writer,
and it writes by replacing the whole snapshot (`settings.replace(...)`), which validates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specdash.contract.errors import SpecdashError
# The contract checks events against it too: it lives below both (importable from here).
from specdash.contract.limits import K_CAP


@dataclass(frozen=True, slots=True)
class Limit:
    """One setting: where it lives in the config, its type and range, its default."""

    section: str  # TOML section
    name: str  # field name (EngineSettings or SamplingParams), TOML key
    kind: type  # int | float | bool | str
    default: Any
    help: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself is not allowed
    optional: bool = False  # None is allowed (TOML: key omitted)
    flag: str | None = None  # argparse dest that overrides it; None = config file only
    sampling: bool = False  # a field of SamplingParams, not of EngineSettings
    choices: tuple[str, ...] = ()  # a str setting with a closed set of values

    @property
    def allowed(self) -> str:
        """Completes "must be ..."."""
        if self.kind is bool:
            return "true or false"
        if self.kind is list:
            return "a list of folder paths, e.g. [\"~/models\"]"
        if self.kind is str:
            return f"one of {', '.join(self.choices)}" if self.choices else "a non-empty string"
        if self.kind is int:
            if self.hi is None:
                return f"an integer >= {self.lo:.0f}"
            return f"an integer {self.lo:.0f}..{self.hi:.0f}"
        if self.lo_open:
            return f"a number > {self.lo:g} and <= {self.hi:g}"
        return f"a number {self.lo:g}..{self.hi:g}"

    def coerce(self, value: Any) -> Any:
        """The value as the settings field wants it; ValueError if of the wrong type or
        out of range."""
        if value is None and self.optional:
            return None
        v: Any = value
        if self.kind is list:  # a list of non-empty strings (folders)
            if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
                raise ValueError(self.name)
            return list(v)
        # bool is an int subclass: `k = true` must not pass as k = 1.
        if isinstance(v, bool) != (self.kind is bool):
            raise ValueError(self.name)
        if self.kind is float and isinstance(v, int):
            v = float(v)
        if not isinstance(v, self.kind) or v != v:  # v != v: NaN
            raise ValueError(self.name)
        checked: Any = v  # isinstance against a type held in a field narrows to object
        if self.kind is str and (not checked.strip() or (self.choices and checked not in self.choices)):
            raise ValueError(self.name)
        if self.lo is not None and (checked <= self.lo if self.lo_open else checked < self.lo):
            raise ValueError(self.name)
        if self.hi is not None and checked > self.hi:
            raise ValueError(self.name)
        return checked


LIMITS: tuple[Limit, ...] = (
    Limit("model", "target", str, "qwen2.5-coder-1.5b",
          "target model: a registry name (see `specdash models list`) or a GGUF path", flag="target"),
    # `auto` by default: copies paid 1.4-2.9x on grounded prompts where the default draft
    # model, adaptive, decoded at plain speed (issue 32; benchmarks/results/auto-default.txt).
    Limit("model", "draft", str, "auto",
          "draft source: auto (each step the fastest of the copies, the draft model or the "
          "target's MTP head, and plain decoding), a model name or GGUF path (that model only), "
          "or lookup, edit, suffix, mtp, chain, none",
          flag="draft"),
    Limit("model", "draft_model", str, "default",
          "the draft model auto and chain may use: a model name or GGUF path, none, or default "
          "(the target's own MTP head where one is loaded, else the default pair's draft model "
          "where it shares the target's vocabulary)",
          flag="draft_model"),
    Limit("model", "translate", bool, True,
          "a draft model with another vocabulary drafts through translation (text to its tokens "
          "and back); --no-translate refuses such drafts, as llama.cpp does", flag="translate"),
    Limit("model", "threads", int, None, "CPU threads (default: physical cores)", lo=1,
          optional=True, flag="threads"),
    Limit("model", "ctx", int, 4096, "context size in tokens", lo=256, flag="ctx"),
    # Probed once per machine (engine/repack.py): AMX repacking crashes llama.cpp on some
    # Intel CPUs (llama.cpp #20824). $SPECDASH_REPACK stands in for "auto" when set.
    Limit("model", "repack", str, "auto",
          "weight repacking at model load: auto (probed once per machine: on, or without AMX "
          "where AMX crashes, else off), on, no-amx or off ($SPECDASH_REPACK sets it under auto)",
          flag="repack", choices=("auto", "on", "no-amx", "off")),
    Limit("model", "experts", int, None, "MoE targets: active experts per token (1..expert_count)",
          lo=1, optional=True, flag="experts"),  # the top depends on the model: checked on load
    Limit("speculative", "k", int, 4, "draft tokens per step; 0 = plain decoding", lo=0, hi=K_CAP, flag="k"),
    # On by default: measured never to lose to plain decoding (0.995-1.006x with the draft
    # model on 4 held-out prompts, benchmarks/results/adaptive-never-loses-quiet.txt), while
    # a fixed K=4 with the default draft model ran at 0.73x plain on this kind of machine.
    # A K given without `adaptive` (flag or config key) means that fixed K: see
    # config.explicit_k_fixes_it.
    Limit("speculative", "adaptive", bool, True,
          "let the engine choose K (and K=0) from measured costs and acceptance", flag="adaptive"),
    Limit("speculative", "k_min", int, 0, "adaptive K: the smallest K it may choose", lo=0, hi=K_CAP),
    Limit("speculative", "k_max", int, 16, "adaptive K: the largest K it may choose", lo=0, hi=K_CAP),
    Limit("speculative", "draft_p_min", float, 0.0,
          "draft model: stop drafting when its top token's probability is below this; 0 = off", lo=0, hi=1),
    # On by default: in whatif over 9 texts it never cost a fixed K more than 2% and sped
    # up K=16 by 12-36% (geometric means over the texts, three profiles) and adaptive K by
    # 1-3% on the big-machine profiles; on this 2-core box a real fixed K=16 ran 1.6-2.1x
    # faster on two prose prompts. benchmarks/results/draft-p-joint-*.txt.
    Limit("speculative", "draft_p_joint", float, 0.1,
          "draft model: stop drafting when the product of its top-token probabilities in this "
          "draft falls below this (the first token is always drafted); 0 = off", lo=0, hi=1),
    Limit("speculative", "lookup_min_ngram", int, 2,
          "prompt lookup: shortest n-gram a draft continues from (one shorter may add one last token)", lo=1, hi=16),
    Limit("speculative", "lookup_max_ngram", int, 4, "prompt lookup: longest n-gram to match", lo=1, hi=16),
    Limit("sampling", "temperature", float, 0.0, "sampling temperature; 0 = greedy", lo=0, hi=5,
          flag="temp", sampling=True),
    Limit("sampling", "top_k", int, 0, "top-k; 0 = off", lo=0, flag="top_k", sampling=True),
    Limit("sampling", "top_p", float, 1.0, "top-p; 1 = off", lo=0, hi=1, lo_open=True, flag="top_p",
          sampling=True),
    # llama.cpp seeds are uint32
    Limit("sampling", "seed", int, None, "sampling seed (default: random)", lo=0, hi=2**32 - 1,
          optional=True, flag="seed", sampling=True),
    Limit("generation", "max_tokens", int, 256, "tokens to generate per prompt", lo=1,
          flag="max_tokens"),
    Limit("generation", "raw", bool, False, "send the prompt as is, without the model's chat template",
          flag="raw"),
)
LIMIT: dict[str, Limit] = {lim.name: lim for lim in LIMITS}
# Pairs that must be ordered: (low, high).
ORDERED = (("k_min", "k_max"), ("lookup_min_ngram", "lookup_max_ngram"))


def _default(name: str) -> Any:
    return field(default=LIMIT[name].default)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Applied identically to target and draft distributions (needed for exactness)."""

    temperature: float = _default("temperature")
    top_k: int = _default("top_k")
    top_p: float = _default("top_p")
    seed: int | None = _default("seed")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Everything the engine runs with. Built once (validated), then only replaced."""

    target: str = _default("target")
    draft: str = _default("draft")  # a model, or one of drafters.KINDS
    draft_model: str = _default("draft_model")  # the model auto and chain may draft with
    translate: bool = _default("translate")  # a draft with another vocabulary: translate, or refuse it
    k: int = _default("k")
    sampling: SamplingParams = field(default_factory=SamplingParams)
    threads: int | None = _default("threads")
    ctx: int = _default("ctx")
    max_tokens: int = _default("max_tokens")
    raw: bool = _default("raw")
    adaptive: bool = _default("adaptive")
    k_min: int = _default("k_min")
    k_max: int = _default("k_max")
    draft_p_min: float = _default("draft_p_min")
    draft_p_joint: float = _default("draft_p_joint")
    lookup_min_ngram: int = _default("lookup_min_ngram")
    lookup_max_ngram: int = _default("lookup_max_ngram")
    experts: int | None = _default("experts")
    repack: str = _default("repack")

    def __post_init__(self) -> None:
        check(self)

    def replace(self, **changes: Any) -> EngineSettings:
        """A validated copy with `changes`; sampling fields may be given flat
        (temperature=0.7) or as `sampling=`."""
        flat = {k: changes.pop(k) for k in list(changes) if k in LIMIT and LIMIT[k].sampling}
        if flat:
            base = changes.pop("sampling", self.sampling)
            changes["sampling"] = dataclasses.replace(base, **flat)
        return dataclasses.replace(self, **changes)

    def get(self, name: str) -> Any:
        """A setting by its LIMITS name (sampling fields included)."""
        return getattr(self.sampling if LIMIT[name].sampling else self, name)

    def flat(self) -> dict[str, Any]:
        """Every setting by its LIMITS name, sampling fields flattened."""
        return {lim.name: self.get(lim.name) for lim in LIMITS}


class SettingError(SpecdashError):
    """A setting outside LIMITS/ORDERED: `what` names it with its value, `reason` says
    what would be valid ("must be an integer 0..64")."""

    def __init__(self, what: str, reason: str):
        super().__init__(f"{what}: {reason}")
        self.what, self.reason = what, reason


def check(settings: EngineSettings) -> None:
    """Raise SettingError naming the first setting that breaks LIMITS or ORDERED."""
    for lim in LIMITS:
        value = settings.get(lim.name)
        try:
            lim.coerce(value)
        except ValueError:
            raise SettingError(f"{lim.name} = {value!r}", f"must be {lim.allowed}") from None
    for low, high in ORDERED:
        lo, hi = settings.get(low), settings.get(high)
        if lo > hi:
            raise SettingError(f"{low} = {lo}, {high} = {hi}", f"{low} must be <= {high}")
