"""Can this draft model speculate for this target? llama.cpp's rules, from
common/speculative.cpp (common_speculative_are_compatible, as vendored by
llama-cpp-python 0.3.36): the draft's token ids must
mean the same text as the target's, or every accepted draft token would be a different
token to the target.

The rules run on a `Vocab`, which comes from one of two places:
- `vocab_from_llama`: llama.cpp itself (a vocab_only load: no weights, well under a
  second even for a 151k-token vocab), so the check sees exactly what the engine's
  models will see. `check_pair` (`specdash check`, the engine) uses this.
- `vocab_from_metadata`: the GGUF header alone, read by gguf_header, with llama.cpp's
  loader defaults (llama-vocab.cpp) applied. No llama.cpp, so a whole disk of models
  can be checked in seconds (`specdash models pairs`); tests hold the two to the same
  answers on real models.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdash.contract.errors import SpecdashError
from specdash.models.gguf_header import GGUFArray, read_string_array
from specdash.contract.paths import cache_dir

# Same constants as llama.cpp's speculative.cpp.
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5
_SHOW_DIFFS = 3

# The rules, in the order they are reported, with what each one requires.
RULES: tuple[tuple[str, str], ...] = (
    ("vocab type", "same vocabulary type (SPM, BPE, WPM, UGM, RWKV...)"),
    ("BOS/EOS", "same add-BOS/add-EOS behaviour, and the same BOS/EOS ids where added"),
    ("vocab size", f"vocabulary sizes within {SPEC_VOCAB_MAX_SIZE_DIFFERENCE}"),
    ("token text", f"identical token text for every id from {SPEC_VOCAB_CHECK_START_TOKEN_ID} up"),
)

# llama_vocab_type (include/llama.h).
VOCAB_TYPE_NAMES: dict[int, str] = {
    0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo2", 7: "test",
}
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL

TOKENS_KEY = "tokenizer.ggml.tokens"
# read_gguf_header(digests=...) for the token text rule's fast path.
TOKEN_DIGESTS: dict[str, int] = {TOKENS_KEY: SPEC_VOCAB_CHECK_START_TOKEN_ID}


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    passed: bool
    evidence: str


# Drafting through translation (engine/drafters/translated.py): a draft whose vocabulary
# fails the rules drafts text, re-encoded into the target's own token ids. The target
# verifies every token as usual, so the output stays exact; what it costs is below.
TRANSLATION_TIER = "translated"
TRANSLATION_COST = (
    "each step re-encodes a few tokens each way between the vocabularies (about 1-3 ms on a "
    "CPU, reported per step as translate_ms) and usually fewer drafts are accepted than from a "
    "same-vocabulary draft"
)


def translation_applies(tgt: Vocab | None, dft: Vocab | None) -> bool:
    """Whether the pair can speculate through translation: both models turn text into
    tokens and back (any vocabulary type but "none")."""
    return tgt is not None and dft is not None and tgt.vocab_type != 0 and dft.vocab_type != 0


def translation_note(size_ratio: float | None) -> str:
    """What `check` and `models pairs` say about a pair that can only translate."""
    note = ("can still speculate through translation (the draft's text is re-encoded into the "
            f"target's tokens and the target verifies every one, so output stays exact): {TRANSLATION_COST}")
    if size_ratio is not None and size_ratio >= 1:
        note += (f"; the draft is {size_ratio:.1f}x the target's size, so it is correct but slower "
                 "than plain decoding")
    return note


@dataclass(frozen=True, slots=True)
class CompatReport:
    target: Path
    draft: Path
    rules: list[Rule]
    translatable: bool = False  # incompatible, but can speculate through translation

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
class Vocab:
    """What the rules compare. `texts` may be left unread (None) when `digest` (sha1 of
    the raw token texts from id SPEC_VOCAB_CHECK_START_TOKEN_ID on) and `path` are set:
    equal sizes and digests settle the token text rule, and anything else reads the
    texts from `path` only then."""

    vocab_type: int
    n_tokens: int
    add_bos: bool
    add_eos: bool
    bos: int
    eos: int
    texts: Sequence[bytes] | None = field(default=None, repr=False, compare=False)
    digest: str | None = None
    path: Path | None = None

    def token_texts(self) -> Sequence[bytes]:
        if self.texts is not None:
            return self.texts
        if self.path is None:
            raise ValueError("Vocab has neither texts nor a path to read them from")
        return _texts_from_file(self.path)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": VOCAB_TYPE_NAMES.get(self.vocab_type, str(self.vocab_type)),
            "type_id": self.vocab_type,
            "n_tokens": self.n_tokens,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
            "bos": self.bos,
            "eos": self.eos,
            "digest": self.digest,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: Path | None = None) -> Vocab:
        return cls(
            vocab_type=int(d["type_id"]),
            n_tokens=int(d["n_tokens"]),
            add_bos=bool(d["add_bos"]),
            add_eos=bool(d["add_eos"]),
            bos=int(d["bos"]),
            eos=int(d["eos"]),
            digest=d.get("digest"),
            path=path,
        )


@functools.lru_cache(maxsize=4)  # a target's texts serve every draft checked against it
def _texts_from_file(path: Path) -> list[bytes]:
    raw = read_string_array(path, TOKENS_KEY)
    # llama.cpp's loader renames empty tokens (llama-vocab.cpp: "[EMPTY_<id>]").
    return [t if t else f"[EMPTY_{i}]".encode() for i, t in enumerate(raw)]


_backend_ready = False


def vocab_from_llama(path: str | Path) -> Vocab:
    """The vocabulary as llama.cpp loads it (vocab_only: no weights)."""
    import llama_cpp  # here: the metadata path must not pay for loading llama.cpp

    from specdash.models.llamalog import captured_llama_log, last_lines

    global _backend_ready
    path = Path(path)
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True
    params = llama_cpp.llama_model_default_params()
    # Vocabulary only: no weight is placed, so weight repacking (engine/repack.py) has
    # nothing to decide here.
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
        return Vocab(
            vocab_type=llama_cpp.llama_vocab_type(vocab),
            n_tokens=n,
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
            bos=llama_cpp.llama_vocab_bos(vocab),
            eos=llama_cpp.llama_vocab_eos(vocab),
            texts=[llama_cpp.llama_vocab_get_text(vocab, i) or b"" for i in range(n)],
            path=path,
        )
    finally:
        llama_cpp.llama_model_free(model)


# llama-vocab.cpp (llama_vocab::impl::load): tokenizer.ggml.model -> (type, default BOS,
# default EOS, default add-BOS, default add-EOS), before the file's own keys override.
_N = TOKEN_NULL
_TOKENIZER_MODELS: dict[str, tuple[int, int, int, bool, bool]] = {
    "llama": (1, 1, 2, True, False),
    "bert": (3, 101, _N, True, False),
    "gpt2": (2, 11, 11, False, False),
    "hybriddna": (2, 11, 11, False, False),
    "whitespace": (2, 11, 11, False, False),
    "gemma4": (2, _N, _N, True, False),  # add-BOS forced on after the keys (Gemma 4 workaround)
    "t5": (4, _N, 1, False, True),
    "rwkv": (5, _N, _N, False, False),
    "plamo2": (6, 1, 2, False, False),
    "test": (7, _N, _N, False, False),
}
# BPE pre-tokenizers that turn add-BOS on, or drop the default BOS id.
_PRE_ADDS_BOS = frozenset({
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
    "jina-v5-nano", "tekken", "chameleon",
})
_PRE_NO_BOS = frozenset({"chatglm-bpe", "glm4", "glm5"})


def vocab_from_metadata(metadata: Mapping[str, Any], path: Path | None = None) -> Vocab:
    """The vocabulary llama.cpp would load, from a header read with
    read_gguf_header(path, digests=TOKEN_DIGESTS). Raises SpecdashError when llama.cpp
    would refuse it (no token list, unknown tokenizer)."""
    where = f"{path}: " if path else ""
    model = metadata.get("tokenizer.ggml.model")
    if not isinstance(model, str):
        raise SpecdashError(f"{where}no tokenizer in its metadata (tokenizer.ggml.model missing)")
    if model in ("no_vocab", "none"):
        raise SpecdashError(f"{where}has no vocabulary (tokenizer.ggml.model = {model!r})")
    if model not in _TOKENIZER_MODELS:
        raise SpecdashError(
            f"{where}unknown tokenizer {model!r} (known: {', '.join(_TOKENIZER_MODELS)})"
        )
    tokens = metadata.get(TOKENS_KEY)
    if not isinstance(tokens, (GGUFArray, list)):
        raise SpecdashError(f"{where}no token list in its metadata ({TOKENS_KEY} missing)")
    n_tokens = len(tokens)
    vocab_type, bos, eos, add_bos, add_eos = _TOKENIZER_MODELS[model]
    pre = metadata.get("tokenizer.ggml.pre")
    if vocab_type == 2 and model != "gemma4":
        if pre in _PRE_ADDS_BOS:
            add_bos = True
        if pre in _PRE_NO_BOS:
            bos = TOKEN_NULL

    def special(key: str, default: int) -> int:
        if default >= n_tokens:  # "default special token ... out of vocab range, disabling"
            default = TOKEN_NULL
        value = metadata.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n_tokens:
            return value
        return default  # absent, or "bad special token ... using default id"

    bos = special("tokenizer.ggml.bos_token_id", bos)
    eos = special("tokenizer.ggml.eos_token_id", eos)
    for key, current in (("tokenizer.ggml.add_bos_token", "bos"), ("tokenizer.ggml.add_eos_token", "eos")):
        value = metadata.get(key)
        if isinstance(value, bool):
            if current == "bos":
                add_bos = value
            else:
                add_eos = value
    if model == "gemma4":
        add_bos = True
    texts = None
    digest = None
    if isinstance(tokens, list):
        texts = [t.encode() if t else f"[EMPTY_{i}]".encode() for i, t in enumerate(tokens)]
    else:
        digest = tokens.digest
    return Vocab(vocab_type, n_tokens, add_bos, add_eos, bos, eos, texts=texts, digest=digest, path=path)


def _type_name(t: int) -> str:
    return f"{VOCAB_TYPE_NAMES.get(t, 'type')} ({t})"


def _special_tokens_rule(tgt: Vocab, dft: Vocab) -> Rule:
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


def _token_text_rule(tgt: Vocab, dft: Vocab) -> Rule:
    start, end = SPEC_VOCAB_CHECK_START_TOKEN_ID, min(tgt.n_tokens, dft.n_tokens)
    checked = max(0, end - start)
    if tgt.n_tokens == dft.n_tokens and tgt.digest is not None and tgt.digest == dft.digest:
        # Same raw bytes for every id from `start` on: no need to read the texts.
        return Rule("token text", True, f"ids {start}..{end - 1}: all {checked:,} identical")
    t_texts, d_texts = tgt.token_texts(), dft.token_texts()
    diffs = [i for i in range(start, end) if t_texts[i] != d_texts[i]]
    if not diffs:
        return Rule("token text", True, f"ids {start}..{end - 1}: all {checked:,} identical")
    shown = ", ".join(
        f"{i}: {t_texts[i].decode('utf-8', 'replace')!r} vs {d_texts[i].decode('utf-8', 'replace')!r}"
        for i in diffs[:_SHOW_DIFFS]
    )
    return Rule(
        "token text",
        False,
        f"{len(diffs):,} of {checked:,} ids {start}..{end - 1} differ; first: {shown} (target vs draft)",
    )


def evaluate_rules(tgt: Vocab, dft: Vocab) -> list[Rule]:
    """Every rule, each with evidence, in RULES order. Unlike llama.cpp, no rule is
    skipped because an earlier one failed, so a report shows everything that is wrong."""
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
    return [vocab_type, _special_tokens_rule(tgt, dft), vocab_size, _token_text_rule(tgt, dft)]


def check_pair(target_path: str | Path, draft_path: str | Path) -> CompatReport:
    """All four rules on the vocabularies as llama.cpp loads them. Reading two vocabularies
    costs ~0.6 s for the default pair, paid before the first token of every default run:
    so a verdict is kept per pair of files (path, size, mtime) in $SPECDASH_CACHE/compat."""
    target_path, draft_path = Path(target_path), Path(draft_path)
    kept = _kept_verdict(target_path, draft_path)
    if kept is not None:
        return kept
    tgt, dft = vocab_from_llama(target_path), vocab_from_llama(draft_path)
    rules = evaluate_rules(tgt, dft)
    translatable = not all(r.passed for r in rules) and translation_applies(tgt, dft)
    report = CompatReport(target_path, draft_path, rules, translatable)
    _keep_verdict(report)
    return report


def _verdict_file(target: Path, draft: Path) -> Path | None:
    import llama_cpp

    try:
        ids = [f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in (target, draft)]
    except OSError:
        return None
    raw = "|".join([*ids, llama_cpp.__version__, str(SPEC_VOCAB_MAX_SIZE_DIFFERENCE)])
    return cache_dir() / "compat" / f"{hashlib.sha1(raw.encode()).hexdigest()[:20]}.json"


def _kept_verdict(target: Path, draft: Path) -> CompatReport | None:
    path = _verdict_file(target, draft)
    try:
        doc = json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else None
        if doc is None:
            return None
        rules = [Rule(str(r["name"]), bool(r["passed"]), str(r["evidence"])) for r in doc["rules"]]
        return CompatReport(target, draft, rules, bool(doc["translatable"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable: checked again, and kept anew


def _keep_verdict(report: CompatReport) -> None:
    path = _verdict_file(report.target, report.draft)
    if path is None:
        return
    doc = {"rules": [{"name": r.name, "passed": r.passed, "evidence": r.evidence} for r in report.rules],
           "translatable": report.translatable}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: checked again next time
