"""Can this draft model speculate for this target? llama.cpp's rules, from
common/speculative.cpp (common_speculative_are_compatible, as vendored by
llama-cpp-python 0.3.36): the draft's token ids must
mean the same text as the target's, or every accepted draft token would be a different
token to the target.

The vocabularies are read through llama.cpp itself (a vocab_only load: no weights, well
under a second even for a 151k-token vocab), so the check sees exactly what the engine's
models will see, including token texts normalised by the loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from specdash.errors import SpecdashError
from specdash.models.llamalog import captured_llama_log, last_lines

# Same constants as llama.cpp's speculative.cpp.
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5
_SHOW_DIFFS = 3

_VOCAB_TYPES = {
    llama_cpp.LLAMA_VOCAB_TYPE_NONE: "none",
    llama_cpp.LLAMA_VOCAB_TYPE_SPM: "SPM",
    llama_cpp.LLAMA_VOCAB_TYPE_BPE: "BPE",
    llama_cpp.LLAMA_VOCAB_TYPE_WPM: "WPM",
    llama_cpp.LLAMA_VOCAB_TYPE_UGM: "UGM",
    llama_cpp.LLAMA_VOCAB_TYPE_RWKV: "RWKV",
}


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    passed: bool
    evidence: str


@dataclass(frozen=True, slots=True)
class CompatReport:
    target: Path
    draft: Path
    rules: list[Rule]

    @property
    def compatible(self) -> bool:
        return all(r.passed for r in self.rules)

    def failed(self) -> list[Rule]:
        return [r for r in self.rules if not r.passed]

    def summary(self) -> str:
        """One line, for an error message when the engine refuses a draft."""
        if self.compatible:
            return f"draft {self.draft.name} is compatible with target {self.target.name}"
        reasons = "; ".join(f"{r.name}: {r.evidence}" for r in self.failed())
        return f"draft {self.draft.name} cannot speculate for target {self.target.name} ({reasons})"


@dataclass(frozen=True, slots=True)
class _Vocab:
    vocab_type: int
    n_tokens: int
    add_bos: bool
    add_eos: bool
    bos: int
    eos: int
    texts: list[bytes]


_backend_ready = False


def _load_vocab(path: Path) -> _Vocab:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    with captured_llama_log() as log:
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        detail = last_lines(log)
        raise SpecdashError(
            f"{path}: llama.cpp could not load its vocabulary" + (f": {detail}" if detail else "")
        )
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        return _Vocab(
            vocab_type=llama_cpp.llama_vocab_type(vocab),
            n_tokens=n,
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
            bos=llama_cpp.llama_vocab_bos(vocab),
            eos=llama_cpp.llama_vocab_eos(vocab),
            texts=[llama_cpp.llama_vocab_get_text(vocab, i) or b"" for i in range(n)],
        )
    finally:
        llama_cpp.llama_model_free(model)


def _type_name(t: int) -> str:
    return f"{_VOCAB_TYPES.get(t, 'type')} ({t})"


def _special_tokens_rule(tgt: _Vocab, dft: _Vocab) -> Rule:
    problems = []
    if tgt.add_bos != dft.add_bos:
        problems.append(f"add-BOS target {tgt.add_bos} vs draft {dft.add_bos}")
    elif tgt.add_bos and tgt.bos != dft.bos:
        problems.append(f"BOS id target {tgt.bos} vs draft {dft.bos}")
    if tgt.add_eos != dft.add_eos:
        problems.append(f"add-EOS target {tgt.add_eos} vs draft {dft.add_eos}")
    elif tgt.add_eos and tgt.eos != dft.eos:
        problems.append(f"EOS id target {tgt.eos} vs draft {dft.eos}")
    if problems:
        return Rule("BOS/EOS", False, "; ".join(problems))
    def describe(kind: str, added: bool, t: int, d: int) -> str:
        if added:
            return f"both add {kind} id {t}"
        return f"neither adds {kind} (ids {t}/{d} not compared)"

    return Rule(
        "BOS/EOS",
        True,
        f"{describe('BOS', tgt.add_bos, tgt.bos, dft.bos)}; {describe('EOS', tgt.add_eos, tgt.eos, dft.eos)}",
    )


def _token_text_rule(tgt: _Vocab, dft: _Vocab) -> Rule:
    start, end = SPEC_VOCAB_CHECK_START_TOKEN_ID, min(tgt.n_tokens, dft.n_tokens)
    diffs = [i for i in range(start, end) if tgt.texts[i] != dft.texts[i]]
    checked = max(0, end - start)
    if not diffs:
        return Rule("token text", True, f"ids {start}..{end - 1}: all {checked:,} identical")
    shown = ", ".join(
        f"{i}: {tgt.texts[i].decode('utf-8', 'replace')!r} vs {dft.texts[i].decode('utf-8', 'replace')!r}"
        for i in diffs[:_SHOW_DIFFS]
    )
    return Rule(
        "token text",
        False,
        f"{len(diffs):,} of {checked:,} ids {start}..{end - 1} differ; first: {shown} (target vs draft)",
    )


def check_pair(target_path: str | Path, draft_path: str | Path) -> CompatReport:
    """All four rules, each with evidence. Unlike llama.cpp, every rule is evaluated
    (no short-circuit) so a report shows everything that is wrong at once."""
    target_path, draft_path = Path(target_path), Path(draft_path)
    tgt, dft = _load_vocab(target_path), _load_vocab(draft_path)
    vocab_type = Rule(
        "vocab type",
        tgt.vocab_type == dft.vocab_type,
        f"target {_type_name(tgt.vocab_type)}, draft {_type_name(dft.vocab_type)}",
    )
    diff = abs(tgt.n_tokens - dft.n_tokens)
    vocab_size = Rule(
        "vocab size",
        diff <= SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
        f"target {tgt.n_tokens:,}, draft {dft.n_tokens:,}: differ by {diff:,} "
        f"(max {SPEC_VOCAB_MAX_SIZE_DIFFERENCE})",
    )
    return CompatReport(
        target_path,
        draft_path,
        [vocab_type, _special_tokens_rule(tgt, dft), vocab_size, _token_text_rule(tgt, dft)],
    )
