"""Which of the scanned models can draft for a target, and which are worth trying.

Compatibility is `specdash check`'s: the same four rules (compat.evaluate_rules), run on
vocabularies read from the GGUF headers by the scan, so a whole disk is checked without
loading anything through llama.cpp. Compatible drafts are then ranked by RANKING_RULE.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdash.contract.errors import SpecdashError
from specdash.models.compat import TRANSLATION_TIER, Rule, evaluate_rules, translation_applies, translation_note
from specdash.models.rollback_info import short
from specdash.models.scan import ModelInfo, ScanProblem, ScanResult, inspect_model

# Full size points at this size ratio (target bytes / draft bytes) or more: the research
# behind specdash found a 0.5B draft best for 32B-72B targets on CPU, i.e. 64-144x.
FULL_MARKS_RATIO = 64
# A draft above this share of the target's bytes ranks after every smaller one: each
# drafted token then costs so much of a target step that speculation rarely pays.
MAX_USEFUL_SHARE = 0.5

SIZE_POINTS, FAMILY_POINTS, ARCH_POINTS, QUANT_POINTS = 50, 30, 20, 20

# Draft quantization preference: Q8_0 was the best draft quant in the research (cheap to
# dequantize on CPU, near-lossless, so it agrees with the target most), then the K
# quants by precision. Keys are general.file_type names and, for files without one,
# ggml tensor type names.
QUANT_WEIGHTS: dict[str, float] = {
    "Q8_0": 1.0,
    "Q6_K": 0.9,
    "Q5_K_M": 0.85, "Q5_K": 0.85, "Q5_K_S": 0.8, "Q5_0": 0.75, "Q5_1": 0.75,
    "Q4_K_M": 0.7, "Q4_K": 0.7, "Q4_K_S": 0.65, "Q4_0": 0.6, "Q4_1": 0.6,
    "IQ4_NL": 0.6, "IQ4_XS": 0.6,
    "F16": 0.5, "BF16": 0.5,
    "Q3_K_L": 0.45, "Q3_K_M": 0.45, "Q3_K": 0.45, "Q3_K_S": 0.4,
    "Q2_K": 0.35, "Q2_K_S": 0.3, "F32": 0.3,
}
OTHER_QUANT_WEIGHT = 0.3  # IQ3/IQ2/IQ1, TQ, MXFP4 and anything newer

RANKING_RULE = (
    f"Ranking: compatible drafts by score (0-100). Size, {SIZE_POINTS} points: "
    f"{SIZE_POINTS} x log2(target/draft)/log2({FULL_MARKS_RATIO}), full marks at "
    f"{FULL_MARKS_RATIO}x smaller (a 0.5B draft for a 32B target), in bytes read per token "
    f"(MoE: experts scaled by used/count). Family: {FAMILY_POINTS} for the target's own "
    f"family (general.basename) or its own weights, {ARCH_POINTS} for the same "
    f"architecture only. Quant, {QUANT_POINTS} x weight: Q8_0 1, Q6_K .9, Q5_K_M .85, "
    f"Q4_K_M .7, Q4_0 .6, F16 .5, Q3_K .45, Q2_K .35, others .3. Drafts over "
    f"{MAX_USEFUL_SHARE:g} of the target's size, and recurrent/hybrid drafts without "
    f"llama.cpp state snapshots (they roll back by checkpoint + replay), rank after all "
    f"others. Drafts with another vocabulary, which speculate through translation, rank in "
    f"their own tier ({TRANSLATION_TIER}) after every same-vocabulary draft, by the same score. "
    f"SELF: the target's own weights at a lower quant (self-speculation)."
)


@dataclass(frozen=True, slots=True)
class PairVerdict:
    """One scanned model judged as a draft for the target."""

    draft: ModelInfo
    compatible: bool
    rules: tuple[Rule, ...]  # every compat rule with its evidence (empty if not checkable)
    failed_rule: str | None  # the first failed rule's name; None when compatible
    evidence: str  # that rule's evidence; for a compatible draft, how it scored
    family: str  # "its own weights", "same family", "same architecture", "other family" or ""
    score: float  # 0-100 for compatible drafts, 0 otherwise
    rank: int | None  # 1 = best; None when incompatible
    self_speculative: bool  # the target's own weights, quantized harder
    size_ratio: float | None  # draft bytes / target bytes, per token
    low_tier: bool  # ranked after every other compatible draft (too big, or checkpoint rollback)
    notes: tuple[str, ...]
    # Fails llama.cpp's rules but can speculate through translation: ranked (`rank`) in
    # the translated tier, after every compatible draft.
    translation: bool = False

    @property
    def tier(self) -> str | None:
        """"same vocabulary" (compatible), "translated", or None (cannot draft)."""
        return "same vocabulary" if self.compatible else TRANSLATION_TIER if self.translation else None

    @property
    def reason(self) -> str:
        """One line: why it ranks where it does, or why it cannot draft."""
        if not self.compatible:
            return f"{self.failed_rule}: {self.evidence}"
        return "; ".join((self.evidence, *self.notes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "draft": self.draft.to_dict(),
            "compatible": self.compatible,
            "rank": self.rank,
            "score": round(self.score, 1),
            "self_speculative": self.self_speculative,
            "size_ratio": None if self.size_ratio is None else round(self.size_ratio, 4),
            "low_tier": self.low_tier,
            "failed_rule": self.failed_rule,
            "evidence": self.evidence,
            "family": self.family,
            "reason": self.reason,
            "notes": list(self.notes),
            "rules": [{"name": r.name, "passed": r.passed, "evidence": r.evidence} for r in self.rules],
            "tier": self.tier,
            "translation": self.translation,
            "translation_note": translation_note(self.size_ratio) if self.translation else None,
        }


@dataclass(frozen=True, slots=True)
class PairsReport:
    target: ModelInfo
    verdicts: tuple[PairVerdict, ...]  # compatible in rank order, then the others by name
    warnings: tuple[str, ...]  # about the target itself
    # Files the scan could not read (truncated, not GGUF...), with why: a draft may be
    # among them, and the operator should not think the directory held nothing more.
    unreadable: tuple[ScanProblem, ...] = ()

    @property
    def rollback(self) -> str:
        """How the target undoes rejected drafts and what that costs (rollback_info)."""
        return self.target.rollback_text()

    def compatible(self) -> list[PairVerdict]:
        return [v for v in self.verdicts if v.compatible]

    def incompatible(self) -> list[PairVerdict]:
        """Every draft that fails llama.cpp's rules (the translated tier first, ranked)."""
        return [v for v in self.verdicts if not v.compatible]

    def translated(self) -> list[PairVerdict]:
        return [v for v in self.verdicts if v.translation]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target.to_dict(),
            "warnings": list(self.warnings),
            "rollback": {"strategy": self.target.rollback, "state_bytes": self.target.state_bytes,
                         "text": self.rollback},
            "ranking_rule": RANKING_RULE,
            "compatible": [v.to_dict() for v in self.compatible()],
            "translated": [v.to_dict() for v in self.translated()],
            "incompatible": [v.to_dict() for v in self.incompatible()],
            "unreadable": [p.to_dict() for p in self.unreadable],
        }


def target_warnings(target: ModelInfo) -> list[str]:
    """What the operator must know about the target before speculating at all. (How a
    recurrent or hybrid target rolls back is not a warning: PairsReport.rollback.)"""
    out = []
    if target.vocab_only:
        out.append("target is a vocab-only file (no weights): it can be checked, not run")
    return out


def _ratio(draft: ModelInfo, target: ModelInfo) -> float | None:
    t = target.active_bytes or target.size
    d = draft.active_bytes or draft.size
    return d / t if t > 0 and d > 0 else None


def _same_family(a: ModelInfo, b: ModelInfo) -> bool:
    return bool(a.basename and b.basename and a.basename.casefold() == b.basename.casefold())


def _is_self_speculative(draft: ModelInfo, target: ModelInfo) -> bool:
    """The target's own weights at a lower quant: same architecture, same parameter
    count, same vocabulary, smaller file."""
    dv, tv = draft.vocab, target.vocab
    return (
        draft.architecture is not None
        and draft.architecture == target.architecture
        and draft.n_params is not None
        and draft.n_params == target.n_params
        and dv is not None and tv is not None
        and dv.n_tokens == tv.n_tokens
        and dv.digest is not None and dv.digest == tv.digest
        and draft.size < target.size
    )


def _score(draft: ModelInfo, target: ModelInfo, self_spec: bool) -> tuple[float, bool, str, str, list[str]]:
    """(score, low tier, how it scored, family, notes)."""
    notes: list[str] = []
    ratio = _ratio(draft, target)
    if ratio is None:
        size_points = 0.0
        size_text = "size unknown"
    else:
        size_points = SIZE_POINTS * min(1.0, max(0.0, math.log2(1 / ratio) / math.log2(FULL_MARKS_RATIO)))
        size_text = f"1/{1 / ratio:.1f} of the target" if ratio < 1 else f"{ratio:.2f}x the target"
    if self_spec:
        family_points, family_text = float(FAMILY_POINTS), "its own weights"
    elif _same_family(draft, target):
        family_points, family_text = float(FAMILY_POINTS), "same family"
    elif draft.architecture and draft.architecture == target.architecture:
        family_points, family_text = float(ARCH_POINTS), "same architecture"
    else:
        family_points, family_text = 0.0, "other family"
    weight = QUANT_WEIGHTS.get(draft.quant, OTHER_QUANT_WEIGHT)
    quant_points = QUANT_POINTS * weight
    low_tier = False
    if ratio is not None and ratio > MAX_USEFUL_SHARE:
        low_tier = True
        if ratio > 1.001:
            notes.append("larger than the target")
        elif ratio >= 0.999:
            notes.append("as large as the target")
        else:
            notes.append(f"over {MAX_USEFUL_SHARE:g} of the target's size: unlikely to pay")
    if draft.state:
        # A recurrent draft rolls back its own state after each rejection too: with
        # snapshots that costs memory only; with a checkpoint, a state copy every step
        # and a replay of the accepted tokens after each rejection, on the draft's side.
        how = f"{draft.state} draft, rollback: {short(draft.rollback, draft.state_bytes)}"
        if draft.rollback == "snapshots":
            notes.append(how)
        else:
            low_tier = True
            notes.append(f"{how}: slower drafting")
    if self_spec:
        notes.insert(0, f"SELF: the target at {draft.quant} (self-speculation)")
    how = f"{size_text}, {family_text}, {draft.quant}"
    return size_points + family_points + quant_points, low_tier, how, family_text, notes


def _judge(draft: ModelInfo, target: ModelInfo) -> PairVerdict:
    def refuse(rule: str, evidence: str, rules: Sequence[Rule] = ()) -> PairVerdict:
        return PairVerdict(draft, False, tuple(rules), rule, evidence, "", 0.0, None, False,
                           _ratio(draft, target), False, ())

    if draft.vocab is None:
        return refuse("vocabulary", draft.vocab_error or "no vocabulary")
    assert target.vocab is not None
    try:
        rules = evaluate_rules(target.vocab, draft.vocab)
    except SpecdashError as exc:  # the file changed or went away since the scan
        return refuse("readable", str(exc))
    failed = [r for r in rules if not r.passed]
    if failed and not draft.vocab_only and translation_applies(target.vocab, draft.vocab):
        score, low_tier, how, family, notes = _score(draft, target, False)
        ratio = _ratio(draft, target)
        if ratio is not None and ratio >= 1:
            notes.append("correct but slower than plain decoding")
        return PairVerdict(draft, False, tuple(rules), failed[0].name, failed[0].evidence, family, score, None,
                           False, _ratio(draft, target), low_tier, (f"{TRANSLATION_TIER}: {how}", *notes), True)
    if failed:
        return refuse(failed[0].name, failed[0].evidence, rules)
    if draft.vocab_only:
        return refuse("weights", "a vocab-only file: no weights to draft with", rules)
    self_spec = _is_self_speculative(draft, target)
    score, low_tier, how, family, notes = _score(draft, target, self_spec)
    return PairVerdict(draft, True, tuple(rules), None, how, family, score, None, self_spec,
                       _ratio(draft, target), low_tier, tuple(notes))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def rank_drafts(target: str | Path | ModelInfo, scan_result: ScanResult) -> list[PairVerdict]:
    """Every model of `scan_result` but the target itself, judged as a draft for it:
    compatible ones first, best first (rank 1, 2, ...), then those that can only draft
    through translation (ranked on), then the others by name, each with the rule that failed. `target` is a GGUF path or a ModelInfo."""
    return list(pairs_report(target, scan_result).verdicts)


def pairs_report(target: str | Path | ModelInfo, scan_result: ScanResult) -> PairsReport:
    """rank_drafts, with the target's ModelInfo and its warnings (recurrent/hybrid...).
    Raises SpecdashError if the target is not a usable GGUF or has no vocabulary."""
    info = _target_info(target, scan_result)
    if info.vocab is None:
        raise SpecdashError(f"{info.path}: cannot check drafts against it: {info.vocab_error}")
    verdicts = [_judge(m, info) for m in scan_result.models if not _same_file(m.path, info.path)]
    good = sorted(
        (v for v in verdicts if v.compatible),
        key=lambda v: (v.low_tier, -v.score, v.size_ratio or 0.0, v.draft.label),
    )
    ranked = [_with_rank(v, i) for i, v in enumerate(good, 1)]
    # Their own tier, after every same-vocabulary draft: translation costs time each step
    # and acceptance is usually lower.
    translated = sorted(
        (v for v in verdicts if v.translation),
        key=lambda v: (v.low_tier, -v.score, v.size_ratio or 0.0, v.draft.label),
    )
    ranked += [_with_rank(v, i) for i, v in enumerate(translated, len(ranked) + 1)]
    bad = sorted((v for v in verdicts if not v.compatible and not v.translation),
                 key=lambda v: (v.draft.label, str(v.draft.path)))
    return PairsReport(info, tuple(ranked + bad), tuple(target_warnings(info)), tuple(scan_result.problems))


def _with_rank(v: PairVerdict, rank: int) -> PairVerdict:
    return PairVerdict(v.draft, v.compatible, v.rules, v.failed_rule, v.evidence, v.family, v.score,
                       rank, v.self_speculative, v.size_ratio, v.low_tier, v.notes, v.translation)


def _target_info(target: str | Path | ModelInfo, scan_result: ScanResult) -> ModelInfo:
    if isinstance(target, ModelInfo):
        return target
    path = Path(target)
    for m in scan_result.models:
        if _same_file(m.path, path):
            return m
    return inspect_model(path)
