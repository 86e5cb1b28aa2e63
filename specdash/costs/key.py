"""What a target's batch costs depend on, as a key a kept profile must match.

The costs change with the CPU (model and instruction flags), the model file, the threads,
the batch shape (n_batch = n_ubatch here), the active expert count, the weight-repacking
verdict and llama.cpp's build (llama-cpp-python's version). The file is identified by its
size and a hash of its first MiB (the GGUF header and metadata: another quantisation or
another model differs there), never by hashing gigabytes of weights.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from specdash.engine.repack import cpu_identity

if TYPE_CHECKING:
    from specdash.engine.llm import LLM

HEAD_BYTES = 1 << 20


def file_identity(path: Path) -> str:
    """size:sha1-of-the-first-MiB of a model file."""
    with open(path, "rb") as f:
        head = hashlib.sha1(f.read(HEAD_BYTES)).hexdigest()[:16]
    return f"{path.stat().st_size}:{head}"


def profile_key(target: LLM, experts: int | None) -> dict[str, str | int]:
    """The key of a loaded target (what the engine saves and loads under)."""
    return key_for(Path(target.path), int(target.n_threads), int(target.n_batch), experts, target.repack.mode)


def key_for(path: Path, threads: int, n_batch: int, experts: int | None, repack: str) -> dict[str, str | int]:
    """The same key from settings, without loading the model (check, doctor)."""
    import llama_cpp

    cpu, flags = cpu_identity()
    return {
        "cpu": cpu,
        "cpu_flags": flags,
        "target": path.name,
        "target_id": file_identity(path),
        "threads": threads,
        "n_batch": n_batch,
        "n_ubatch": n_batch,  # specdash's contexts use n_ubatch = n_batch (engine/llm.py)
        "experts": experts or 0,  # 0: the file's own count
        "repack": repack,
        "llama_cpp_python": llama_cpp.__version__,
    }


def key_digest(key: dict[str, str | int]) -> str:
    raw = "|".join(f"{k}={key[k]}" for k in sorted(key))
    return hashlib.sha1(raw.encode()).hexdigest()[:12]
