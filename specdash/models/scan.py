"""Find the GGUF models on this machine and describe each from its header alone.

`scan()` walks directories (by default the specdash cache, configured model dirs and the
usual caches of llama.cpp, LM Studio and Ollama), reads every GGUF's header and metadata
through gguf_header (never the weights) and returns one `ModelInfo` per model: a file, or
a multi-part set (`name-00001-of-00003.gguf` ...) counted once. Files that cannot be
used are returned apart, each with a one-line reason; the scan goes on past them.

Headers are cached in <cache>/scan-cache.json, keyed by (path, size, mtime), so a second
scan reads only what changed, and `cached_scan()` returns the last result without
touching the disk at all (for a picker that must open instantly).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdash.contract.errors import SpecdashError
from specdash.models.compat import TOKEN_DIGESTS, Vocab, vocab_from_metadata
from specdash.models.gguf_header import (
    GGUFError,
    GGUFHeader,
    check_gguf,
    file_type_name,
    has_gguf_magic,
)
from specdash.models.registry import cache_dir, models_dir

# The recurrent/hybrid architecture tables live in rollback_info (one place); re-exported
# here for the callers and tests that know them as scan's.
from specdash.models.rollback_info import (
    ARRAY_KEY_SUFFIXES,
    HYBRID_ARCHS,
    RECURRENT_ARCHS,
    RS_ROLLBACK_ARCHS,
    expected_strategy,
    explain,
    recurrent_state_bytes,
    short,
    state_kind,
)

_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
CACHE_VERSION = 4  # 3: state_bytes (recurrent state size); 4: mtp_layers
_WORKERS = 2
_MAX_REASON = 300


@dataclass(frozen=True, slots=True)
class ScanProgress:
    """One file done (or, with done == 0, the walk finished and `total` files were found)."""

    done: int
    total: int
    path: Path | None
    cached: bool


ScanProgressCallback = Callable[[ScanProgress], None]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model as found on disk: a single GGUF, or a multi-part set counted once
    (sizes summed over the parts, metadata from part 1)."""

    path: Path  # the file, or part 1 of a multi-part set (what llama.cpp is given)
    parts: tuple[Path, ...]
    size: int  # bytes on disk, all parts
    source: str  # where it was found: "specdash", "config", "llama.cpp", "LM Studio", "Ollama" or ""
    root: Path  # the scanned directory it was found under
    label: str  # display name: the Ollama name:tag, else the file name (without -00001-of-N)
    architecture: str | None
    name: str | None  # general.name
    basename: str | None  # general.basename: the model family, when the converter wrote it
    size_label: str | None  # general.size_label ("0.5B")
    n_params: int | None  # from the tensor shapes; None for a file without tensors
    quant: str  # Q4_K_M...: general.file_type, else the dominant tensor type
    quant_from: str  # "file_type", "tensors" or "" (no tensors)
    tensor_bytes: int
    active_bytes: int  # bytes of weights read per token: expert tensors scaled by used/count
    tokenizer: str | None  # tokenizer.ggml.model
    vocab: Vocab | None  # as llama.cpp would load it; None when it could not (vocab_error)
    vocab_error: str | None
    expert_count: int | None
    expert_used_count: int | None
    state: str | None  # "recurrent" or "hybrid": cannot drop rejected tokens by cutting a KV cache
    rs_rollback: bool  # llama.cpp can snapshot and roll back this architecture's state
    context_length: int | None
    # One sequence's recurrent state in bytes (one checkpoint, or one snapshot), from the
    # metadata; None for a KV-cache model or when the metadata cannot tell.
    state_bytes: int | None = None
    # Multi-token-prediction heads the file keeps (models/mtp_info.py): the target drafts
    # with its own head (`--draft mtp`), no draft model needed. 0: none.
    mtp_layers: int = 0

    @property
    def rollback(self) -> str:
        """"kv", "snapshots" or "checkpoint": how speculation undoes rejected tokens."""
        return expected_strategy(self.architecture, self.state)

    def rollback_text(self) -> str:
        """The strategy, why, and what it costs in memory (rollback_info.explain)."""
        return explain(self.architecture, self.state, self.state_bytes)

    @property
    def is_moe(self) -> bool:
        return (self.expert_count or 0) > 1

    @property
    def vocab_only(self) -> bool:
        return self.n_params is None

    def notes(self) -> list[str]:
        """Short flags for a table."""
        out = []
        if self.is_moe:
            out.append(f"MoE {self.expert_count} experts, {self.expert_used_count or '?'} used")
        if self.state:
            out.append(f"{self.state}, rollback: {short(self.rollback, self.state_bytes)}")
        if self.mtp_layers:
            out.append(f"MTP head: {self.mtp_layers} layer{'s' * (self.mtp_layers != 1)}")
        if len(self.parts) > 1:
            out.append(f"{len(self.parts)} parts")
        if self.vocab_only:
            out.append("vocab only, no weights")
        if self.vocab_error:
            out.append("no usable vocab")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "parts": [str(p) for p in self.parts],
            "size": self.size,
            "source": self.source,
            "root": str(self.root),
            "label": self.label,
            "architecture": self.architecture,
            "name": self.name,
            "basename": self.basename,
            "size_label": self.size_label,
            "n_params": self.n_params,
            "quant": self.quant,
            "quant_from": self.quant_from,
            "tensor_bytes": self.tensor_bytes,
            "active_bytes": self.active_bytes,
            "tokenizer": self.tokenizer,
            "vocab": self.vocab.to_dict() if self.vocab else None,
            "vocab_error": self.vocab_error,
            "moe": self.is_moe,
            "expert_count": self.expert_count,
            "expert_used_count": self.expert_used_count,
            "state": self.state,
            "rs_rollback": self.rs_rollback,
            "rollback": self.rollback,
            "state_bytes": self.state_bytes,
            "context_length": self.context_length,
            "mtp_layers": self.mtp_layers,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelInfo:
        path = Path(d["path"])
        return cls(
            path=path,
            parts=tuple(Path(p) for p in d["parts"]),
            size=d["size"],
            source=d["source"],
            root=Path(d["root"]),
            label=d["label"],
            architecture=d["architecture"],
            name=d["name"],
            basename=d["basename"],
            size_label=d["size_label"],
            n_params=d["n_params"],
            quant=d["quant"],
            quant_from=d["quant_from"],
            tensor_bytes=d["tensor_bytes"],
            active_bytes=d["active_bytes"],
            tokenizer=d["tokenizer"],
            vocab=Vocab.from_dict(d["vocab"], path) if d["vocab"] else None,
            vocab_error=d["vocab_error"],
            expert_count=d["expert_count"],
            expert_used_count=d["expert_used_count"],
            state=d["state"],
            rs_rollback=d["rs_rollback"],
            context_length=d["context_length"],
            state_bytes=d.get("state_bytes"),
            mtp_layers=d.get("mtp_layers", 0),
        )


@dataclass(frozen=True, slots=True)
class ScanProblem:
    """A file (or multi-part set) that is not a usable GGUF, and why, in one line."""

    path: Path
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": str(self.path), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ScanResult:
    dirs: tuple[Path, ...]
    models: tuple[ModelInfo, ...]
    problems: tuple[ScanProblem, ...]
    files: int  # GGUF files examined
    from_cache: int  # of which the header came from the scan cache
    seconds: float
    scanned_at: float  # time.time() when the scan finished

    def to_dict(self) -> dict[str, Any]:
        return {
            "dirs": [str(d) for d in self.dirs],
            "models": [m.to_dict() for m in self.models],
            "problems": [p.to_dict() for p in self.problems],
            "files": self.files,
            "from_cache": self.from_cache,
            "seconds": self.seconds,
            "scanned_at": self.scanned_at,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScanResult:
        return cls(
            dirs=tuple(Path(p) for p in d["dirs"]),
            models=tuple(ModelInfo.from_dict(m) for m in d["models"]),
            problems=tuple(ScanProblem(Path(p["path"]), p["reason"]) for p in d["problems"]),
            files=d["files"],
            from_cache=d["from_cache"],
            seconds=d["seconds"],
            scanned_at=d["scanned_at"],
        )


# ---------------------------------------------------------------------------- where to look


def _known_dirs() -> list[tuple[Path, str]]:
    """The usual model caches of other tools, whether or not they exist."""
    home = Path.home()
    xdg = os.environ.get("XDG_CACHE_HOME")
    out: list[tuple[Path, str]] = []
    if env := os.environ.get("LLAMA_CACHE"):
        out.append((Path(env).expanduser(), "llama.cpp"))
    out += [
        ((Path(xdg) if xdg else home / ".cache") / "llama.cpp", "llama.cpp"),
        (home / ".lmstudio" / "models", "LM Studio"),
        (home / ".cache" / "lm-studio" / "models", "LM Studio"),
        (home / ".ollama" / "models" / "blobs", "Ollama"),
        (Path("/usr/share/ollama/.ollama/models/blobs"), "Ollama"),
    ]
    return out


def _default_dirs_labelled(extra: Sequence[str | Path]) -> list[tuple[Path, str]]:
    candidates = [(models_dir(), "specdash")]
    candidates += [(Path(d).expanduser(), "config") for d in extra]
    candidates += _known_dirs()
    out: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for path, label in candidates:
        if not path.is_dir():
            continue
        real = path.resolve()
        if real not in seen:
            seen.add(real)
            out.append((path, label))
    return out


def default_scan_dirs(extra: Sequence[str | Path] = ()) -> list[Path]:
    """Where `specdash models scan` looks when given no directory, in this order, keeping
    only those that exist: the specdash cache's models, `extra` (the config's
    model_dirs), $LLAMA_CACHE, the llama.cpp cache (~/.cache/llama.cpp), LM Studio
    (~/.lmstudio/models, ~/.cache/lm-studio/models) and Ollama's blobs
    (~/.ollama/models/blobs, /usr/share/ollama/.ollama/models/blobs)."""
    return [p for p, _ in _default_dirs_labelled(extra)]


def _is_candidate(entry: os.DirEntry[str]) -> bool:
    """*.gguf (a broken symlink too: it is reported), or a regular file without any
    suffix that starts with the GGUF magic (Ollama's blobs are named sha256-<hex>).
    *.partial, *.json and the like are never models. Never a FIFO or a device."""
    name = entry.name
    if name.lower().endswith(".gguf"):
        return entry.is_file() or entry.is_symlink()
    return "." not in name and entry.is_file() and has_gguf_magic(entry.path)


def _walk(root: Path) -> Iterable[Path]:
    """GGUF candidates under `root`, following symlinks, skipping hidden directories,
    never visiting a directory twice."""
    seen: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            st = directory.stat()
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            try:
                if entry.is_dir():
                    if not entry.name.startswith("."):
                        subdirs.append(Path(entry.path))
                elif _is_candidate(entry):
                    yield Path(entry.path)
            except OSError:
                continue
        stack.extend(reversed(subdirs))


def _ollama_names(blobs: Path) -> dict[str, str]:
    """Ollama blob file name -> "model:tag", from the manifests beside `blobs`."""
    manifests = blobs.parent / "manifests"
    names: dict[str, str] = {}
    if blobs.name != "blobs" or not manifests.is_dir():
        return names
    for path in sorted(manifests.rglob("*")):
        try:
            if not path.is_file():
                continue
            layers = json.loads(path.read_text(encoding="utf-8")).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue
        parts = path.relative_to(manifests).parts  # host/namespace/model/tag
        model = parts[-2] if len(parts) >= 2 else parts[-1]
        if len(parts) >= 3 and parts[-3] not in ("library",):
            model = f"{parts[-3]}/{model}"
        for layer in layers if isinstance(layers, list) else []:
            if isinstance(layer, dict) and layer.get("mediaType") == "application/vnd.ollama.image.model":
                digest = str(layer.get("digest", ""))
                names.setdefault(digest.replace(":", "-"), f"{model}:{parts[-1]}")
    return names


# ---------------------------------------------------------------------------- one file


def _metadata_int(meta: Mapping[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _metadata_str(meta: Mapping[str, Any], key: str) -> str | None:
    value = meta.get(key)
    return value if isinstance(value, str) else None


def _summarize(path: Path, header: GGUFHeader) -> dict[str, Any]:
    """What the scan keeps of one file's header: JSON-ready, so it can be cached."""
    meta = header.metadata
    n_params = 0
    type_bytes: dict[str, int] = {}
    tensor_bytes = 0
    expert_bytes = 0
    for t in header.tensors:
        n = 1
        for d in t.shape:
            n *= d
        n_params += n
        size = t.nbytes() or 0
        tensor_bytes += size
        if "_exps" in t.name:  # ffn_{gate,up,down}_exps: stacked routed experts
            expert_bytes += size
        if len(t.shape) >= 2:
            type_bytes[t.type_name] = type_bytes.get(t.type_name, 0) + size
    out: dict[str, Any] = {
        "split_no": _metadata_int(meta, "split.no"),
        "split_count": _metadata_int(meta, "split.count"),
        "split_tensors": _metadata_int(meta, "split.tensors.count"),
        "n_tensors": len(header.tensors),
        "n_params": n_params,
        "tensor_bytes": tensor_bytes,
        "expert_bytes": expert_bytes,
        "type_bytes": type_bytes,
        # blocks holding a head's eh_proj (a split GGUF may hold the head in a later part)
        "nextn_blocks": sorted(int(t.name.split(".")[1]) for t in header.tensors
                               if t.name.startswith("blk.") and t.name.endswith(".nextn.eh_proj.weight")),
        "model": None,
    }
    arch = _metadata_str(meta, "general.architecture")
    if arch is None:
        return out  # a later part of a split (tensors only), or not a model at all
    if _metadata_str(meta, "general.type") == "adapter":
        kind = _metadata_str(meta, "adapter.type") or "an"
        out["not_model"] = f"{kind} adapter for {arch}, not a model (general.type = adapter)"
    elif arch == "clip":
        out["not_model"] = "a multimodal projector (clip), not a language model"
    vocab: Vocab | None = None
    vocab_error = None
    try:
        vocab = vocab_from_metadata(meta)
    except SpecdashError as exc:
        vocab_error = str(exc)
    state = state_kind(arch, meta)
    file_type = _metadata_int(meta, "general.file_type")
    out["model"] = {
        "architecture": arch,
        "name": _metadata_str(meta, "general.name"),
        "basename": _metadata_str(meta, "general.basename"),
        "size_label": _metadata_str(meta, "general.size_label"),
        "file_type": file_type,
        "tokenizer": _metadata_str(meta, "tokenizer.ggml.model"),
        "vocab": vocab.to_dict() if vocab else None,
        "vocab_error": vocab_error,
        "expert_count": _metadata_int(meta, f"{arch}.expert_count"),
        "expert_used_count": _metadata_int(meta, f"{arch}.expert_used_count"),
        "state": state,
        "rs_rollback": arch in RS_ROLLBACK_ARCHS,
        "state_bytes": recurrent_state_bytes(arch, meta),
        "context_length": _metadata_int(meta, f"{arch}.context_length"),
        "nextn_declared": _metadata_int(meta, f"{arch}.nextn_predict_layers"),
        "block_count": _metadata_int(meta, f"{arch}.block_count"),
    }
    return out


def _read_file(path: Path) -> dict[str, Any]:
    """Header summary of one file; raises GGUFError with a one-line reason."""
    header = check_gguf(path, digests=TOKEN_DIGESTS, array_suffixes=ARRAY_KEY_SUFFIXES)
    return _summarize(path, header)


def _read_or_reason(path: Path) -> dict[str, Any] | str:
    try:
        return _read_file(path)
    except GGUFError as exc:
        return _reason(exc, path)
    except Exception as exc:  # noqa: BLE001 - one odd file must not stop a disk scan
        return f"could not parse its header ({type(exc).__name__}: {_reason(exc, path)})"


def _cache_key(path: Path) -> str:
    try:
        return str(path.resolve())
    except OSError:
        return str(path)


def _reason(exc: Exception, path: Path) -> str:
    text = str(exc)
    prefix = f"{path}: "
    if text.startswith(prefix):
        text = text[len(prefix):]
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


# ---------------------------------------------------------------------------- one model


def _model_info(
    parts: Sequence[tuple[Path, dict[str, Any]]], sizes: Sequence[int], found: _Found, label: str
) -> ModelInfo:
    first_path, first = parts[0]
    model = first["model"]
    assert model is not None
    n_tensors = sum(p["n_tensors"] for _, p in parts)
    tensor_bytes = sum(p["tensor_bytes"] for _, p in parts)
    expert_bytes = sum(p["expert_bytes"] for _, p in parts)
    type_bytes: dict[str, int] = {}
    for _, p in parts:
        for k, v in p["type_bytes"].items():
            type_bytes[k] = type_bytes.get(k, 0) + v
    if model["file_type"] is not None:
        quant, quant_from = file_type_name(model["file_type"]), "file_type"
    elif type_bytes:
        quant, quant_from = max(type_bytes.items(), key=lambda kv: kv[1])[0], "tensors"
    else:
        quant, quant_from = "-", ""
    count, used = model["expert_count"], model["expert_used_count"]
    active = tensor_bytes
    if count and used and count > 0 and expert_bytes:
        active = tensor_bytes - expert_bytes + math.ceil(expert_bytes * min(used, count) / count)
    vocab = Vocab.from_dict(model["vocab"], first_path) if model["vocab"] else None
    # As llama.cpp decides it: the last block's nextn.eh_proj is there (mtp_info.py).
    declared, blocks = model.get("nextn_declared") or 0, model.get("block_count")
    nextn = {b for _, p in parts for b in p.get("nextn_blocks", ())}
    mtp_layers = declared if declared > 0 and blocks is not None and blocks - 1 in nextn else 0
    return ModelInfo(
        path=first_path,
        parts=tuple(p for p, _ in parts),
        size=sum(sizes),
        source=found.source,
        root=found.root,
        label=label,
        architecture=model["architecture"],
        name=model["name"],
        basename=model["basename"],
        size_label=model["size_label"],
        n_params=sum(p["n_params"] for _, p in parts) if n_tensors else None,
        quant=quant,
        quant_from=quant_from,
        tensor_bytes=tensor_bytes,
        active_bytes=active,
        tokenizer=model["tokenizer"],
        vocab=vocab,
        vocab_error=model["vocab_error"],
        expert_count=count,
        expert_used_count=used,
        state=model["state"],
        rs_rollback=model["rs_rollback"],
        context_length=model["context_length"],
        state_bytes=model["state_bytes"],
        mtp_layers=mtp_layers,
    )


def _display_label(path: Path, ollama: Mapping[str, str]) -> str:
    """The Ollama name:tag, else the file name without .gguf (and without -00001-of-N)."""
    if path.name in ollama:
        return ollama[path.name]
    m = _SPLIT_NAME.match(path.name)
    if m:
        return m["prefix"]
    return path.name[:-5] if path.name.lower().endswith(".gguf") else path.name


def inspect_model(path: str | Path) -> ModelInfo:
    """One model from its file (part 1 of a multi-part set brings in its siblings).
    Raises GGUFError (a SpecdashError) naming the file when it is not usable."""
    path = Path(path)
    m = _SPLIT_NAME.match(path.name)
    files = [path]
    if m and int(m["count"]) > 1:
        if int(m["no"]) != 1:
            raise GGUFError(f"{path}: part {int(m['no'])} of a multi-part GGUF; give part 00001")
        files = [path.with_name(f"{m['prefix']}-{i:05d}-of-{m['count']}{path.suffix}")
                 for i in range(1, int(m["count"]) + 1)]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise GGUFError(f"{path}: multi-part GGUF incomplete: missing {', '.join(missing)}")
    summaries = [(f, _read_file(f)) for f in files]
    if summaries[0][1]["model"] is None:
        raise GGUFError(f"{path}: no model metadata (general.architecture missing)")
    if summaries[0][1].get("not_model"):
        raise GGUFError(f"{path}: {summaries[0][1]['not_model']}")
    found = _Found(path, "", path.parent)
    return _model_info(summaries, [f.stat().st_size for f in files], found, _display_label(path, {}))


# ---------------------------------------------------------------------------- the scan cache


def scan_cache_path() -> Path:
    return cache_dir() / "scan-cache.json"


def _load_cache() -> dict[str, Any]:
    try:
        raw = json.loads(scan_cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"version": CACHE_VERSION, "files": {}, "last": None}
    if not isinstance(raw, dict) or raw.get("version") != CACHE_VERSION:
        return {"version": CACHE_VERSION, "files": {}, "last": None}  # stale format: start over
    raw.setdefault("files", {})
    raw.setdefault("last", None)
    return raw


def _save_cache(cache: dict[str, Any]) -> None:
    path = scan_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A unique name per writer (two scans may run at once, even in one process).
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=path.name,
                                         suffix=".partial", delete=False) as tmp:
            json.dump(cache, tmp, separators=(",", ":"))
        os.replace(tmp.name, path)  # readers never see half a file
    except OSError:
        pass  # a read-only cache only costs the next scan its speed


def cached_scan() -> ScanResult | None:
    """The last scan's result as stored, without looking at the disk; None if there is
    none (or it is unreadable). Call scan() to refresh it."""
    last = _load_cache().get("last")
    if not last:
        return None
    try:
        return ScanResult.from_dict(last)
    except (KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------- the scan


@dataclass
class _Found:
    path: Path
    source: str
    root: Path
    ollama: Mapping[str, str] = field(default_factory=dict)


def _discover(roots: Sequence[tuple[Path, str]]) -> list[_Found]:
    found: list[_Found] = []
    seen: set[Path] = set()
    for root, source in roots:
        if root.is_file():
            paths: Iterable[Path] = [root]
            ollama: Mapping[str, str] = {}
            base = root.parent
        else:
            paths = _walk(root)
            ollama = _ollama_names(root)
            base = root
        for path in paths:
            try:
                real = path.resolve()
            except OSError:
                real = path
            if real in seen:  # the same file through a symlink: list it once
                continue
            seen.add(real)
            found.append(_Found(path, source, base, ollama))
    return found


def scan(
    dirs: Sequence[str | Path] | None = None,
    *,
    extra_dirs: Sequence[str | Path] = (),
    progress: ScanProgressCallback | None = None,
    use_cache: bool = True,
    rescan: bool = False,
) -> ScanResult:
    """Scan `dirs` (directories or GGUF files; default: default_scan_dirs(extra_dirs)).

    With `use_cache`, headers whose file has the same size and mtime as last time come
    from the scan cache, and the result is stored for cached_scan(); `rescan` reads
    every header again (and refreshes the cache). Raises SpecdashError for a directory
    that does not exist."""
    start = time.monotonic()
    if dirs is None:
        roots = _default_dirs_labelled(extra_dirs)
    else:
        roots = []
        for d in dirs:
            p = Path(d).expanduser()
            if not p.exists():
                raise SpecdashError(f"{d}: no such directory or file (give directories to scan, or GGUF files)")
            roots.append((p, ""))
    found = _discover(roots)
    total = len(found)
    if progress is not None:
        progress(ScanProgress(0, total, None, False))

    cache = _load_cache() if use_cache else {"version": CACHE_VERSION, "files": {}, "last": None}
    files: dict[str, Any] = cache["files"]
    summaries: dict[Path, dict[str, Any] | str] = {}  # a summary, or the reason it failed
    sizes: dict[Path, int] = {}
    stats: dict[Path, os.stat_result] = {}
    to_read: list[_Found] = []
    done = 0
    for f in found:
        try:
            st = f.path.stat()
        except OSError as exc:
            summaries[f.path] = f"cannot read: {exc.strerror or exc}"
        else:
            sizes[f.path] = st.st_size
            entry = files.get(_cache_key(f.path))
            if (rescan or not isinstance(entry, dict) or entry.get("size") != st.st_size
                    or entry.get("mtime_ns") != st.st_mtime_ns):
                stats[f.path] = st
                to_read.append(f)
                continue
            summaries[f.path] = entry["info"] if "info" in entry else str(entry.get("error"))
        done += 1
        if progress is not None:
            progress(ScanProgress(done, total, f.path, True))
    from_cache = done

    # Headers are read on a small thread pool: numpy and sha1 release the GIL, so two
    # threads overlap on two cores.
    with ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="gguf-scan") as pool:
        for f, info in zip(to_read, pool.map(_read_or_reason, [f.path for f in to_read])):
            summaries[f.path] = info
            st = stats[f.path]
            files[_cache_key(f.path)] = {
                "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                **({"info": info} if isinstance(info, dict) else {"error": info}),
            }
            done += 1
            if progress is not None:
                progress(ScanProgress(done, total, f.path, False))

    models, problems = _assemble(found, summaries, sizes)
    result = ScanResult(
        dirs=tuple(p for p, _ in roots),
        models=tuple(models),
        problems=tuple(problems),
        files=total,
        from_cache=from_cache,
        seconds=round(time.monotonic() - start, 3),
        scanned_at=time.time(),
    )
    if use_cache:
        # Forget files that are gone; keep entries of other directories for their scans.
        for key in [k for k in files if not os.path.exists(k)]:
            del files[key]
        cache["last"] = result.to_dict()
        _save_cache(cache)
    return result


def _assemble(
    found: Sequence[_Found], summaries: Mapping[Path, dict[str, Any] | str], sizes: Mapping[Path, int]
) -> tuple[list[ModelInfo], list[ScanProblem]]:
    models: list[ModelInfo] = []
    problems: list[ScanProblem] = []
    groups: dict[tuple[Path, str, int], dict[int, _Found]] = {}
    order: list[tuple[str, Any]] = []  # keep the walk's order for the output
    for f in found:
        m = _SPLIT_NAME.match(f.path.name)
        if m and int(m["count"]) > 1:
            key = (f.path.parent, m["prefix"], int(m["count"]))
            if key not in groups:
                groups[key] = {}
                order.append(("set", key))
            groups[key][int(m["no"])] = f
        else:
            order.append(("file", f))

    for kind, item in order:
        if kind == "file":
            f = item
            s = summaries[f.path]
            if isinstance(s, str):
                problems.append(ScanProblem(f.path, s))
            elif s["model"] is None:
                problems.append(ScanProblem(f.path, "no model metadata (general.architecture missing)"))
            elif s.get("not_model"):
                problems.append(ScanProblem(f.path, s["not_model"]))
            else:
                models.append(_model_info([(f.path, s)], [sizes.get(f.path, 0)], f,
                                          _display_label(f.path, f.ollama)))
            continue
        (parent, prefix, count), members = item, groups[item]
        first = members.get(1) or next(iter(members.values()))
        where = parent / f"{prefix}-*-of-{count:05d}.gguf"
        missing = [n for n in range(1, count + 1) if n not in members]
        if missing:
            shown = ", ".join(f"{n:05d}" for n in missing[:8]) + (" ..." if len(missing) > 8 else "")
            problems.append(ScanProblem(
                where, f"multi-part GGUF incomplete: {len(members)} of {count} parts found, missing {shown}"))
            continue
        parts: list[tuple[Path, dict[str, Any]]] = []
        for n in range(1, count + 1):
            s = summaries[members[n].path]
            if isinstance(s, str):
                problems.append(ScanProblem(where, f"part {n:05d} of {count}: {s}"))
                break
            parts.append((members[n].path, s))
        if len(parts) < count:
            continue
        checked = _check_split(parts, count)
        if checked:
            problems.append(ScanProblem(where, checked))
            continue
        models.append(_model_info(parts, [sizes.get(p, 0) for p, _ in parts], first,
                                  _display_label(members[1].path, first.ollama)))
    return models, problems


def _check_split(parts: Sequence[tuple[Path, dict[str, Any]]], count: int) -> str | None:
    """The parts' own split.* keys must agree with their names."""
    for n, (_, s) in enumerate(parts, 1):
        if s["split_count"] is not None and (s["split_count"] != count or s["split_no"] != n - 1):
            return (f"part {n:05d} of {count}: its metadata says part {s['split_no'] + 1} of "
                    f"{s['split_count']}")
    if parts[0][1]["model"] is None:
        return "part 00001 has no model metadata (general.architecture missing)"
    if parts[0][1].get("not_model"):
        return str(parts[0][1]["not_model"])
    expected = parts[0][1]["split_tensors"]
    total = sum(s["n_tensors"] for _, s in parts)
    if expected is not None and expected != total:
        return f"the parts hold {total} tensors, part 00001 says {expected}"
    return None
