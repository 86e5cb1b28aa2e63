"""Self-speculative drafts: the target itself, quantized harder. Same tokenizer by
construction, so always a compatible pair; faster per token because it is smaller,
at the cost of some acceptance.

llama.cpp's quantizer (llama_model_quantize) does the work in-process; it runs in a
thread so the caller can show the output file growing.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from specdash.contract.names import display_name
from specdash.contract.errors import SpecdashError
from specdash.models.fetch import ProgressCallback
from specdash.models.gguf_header import check_gguf
from specdash.models.llamalog import captured_llama_log, last_lines
from specdash.models.registry import (
    BUILTIN,
    UserDraft,
    known_names,
    models_dir,
    register_user_draft,
)
from specdash.models.resolve import resolve_model

# Types that llama.cpp quantizes without an importance matrix (IQ1/IQ2 and Q2_K_S refuse
# or degrade badly without one, and specdash has no imatrix to give).
QUANTS: dict[str, int] = {
    name: getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
    for name in (
        "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M",
        "Q5_0", "Q5_1", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_NL", "IQ4_XS",
    )
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_POLL_S = 0.25

# (bytes written so far, seconds elapsed)
QuantizeProgress = Callable[[int, float], None]


@dataclass(frozen=True, slots=True)
class DraftResult:
    name: str
    path: Path
    quant: str
    input_path: Path
    input_size: int
    size: int
    seconds: float


def quant_ftype(quant: str) -> int:
    ftype = QUANTS.get(quant.upper())
    if ftype is None:
        raise SpecdashError(f"--quant {quant!r}: not a supported type (valid: {', '.join(QUANTS)})")
    return ftype


def default_draft_name(target: str, quant: str) -> str:
    base = display_name(target)
    return f"{base}-{quant.lower()}"


def make_draft(
    target: str,
    quant: str,
    name: str | None = None,
    *,
    nthread: int = 2,
    progress: QuantizeProgress | None = None,
    fetch_progress: ProgressCallback | None = None,
) -> DraftResult:
    """Quantize `target` (registry name or path) to `quant`, store it as
    <cache>/models/<name>.gguf and register it as a draft for `target`."""
    quant = quant.upper()
    ftype = quant_ftype(quant)
    name = name or default_draft_name(target, quant)
    if not _NAME.fullmatch(name):
        raise SpecdashError(f"--name {name!r}: use letters, digits, '.', '_' and '-' only")
    if name in BUILTIN:
        raise SpecdashError(f"--name {name!r} is a built-in model; choose another name")
    input_path = resolve_model(target, progress=fetch_progress)

    out = models_dir() / f"{name}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.resolve() == input_path.resolve():
        raise SpecdashError(f"--name {name!r} would overwrite the input {input_path}; choose another name")
    partial = out.with_name(out.name + ".partial")

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = nthread
    params.allow_requantize = True  # the inputs are already quantized (Q4_K_M etc.)
    result: list[int] = []
    start = time.monotonic()
    try:
        with captured_llama_log() as log:
            worker = threading.Thread(
                target=lambda: result.append(
                    llama_cpp.llama_model_quantize(str(input_path).encode(), str(partial).encode(),
                                                   llama_cpp.byref(params))
                ),
                name=f"quantize-{name}",
                daemon=True,  # Ctrl-C must not wait for the C loop to finish
            )
            worker.start()
            while worker.is_alive():
                worker.join(_POLL_S)
                if progress is not None:
                    progress(_size(partial), time.monotonic() - start)
        seconds = time.monotonic() - start
        if not result or result[0] != 0:
            detail = last_lines(log)
            raise SpecdashError(
                f"quantizing {input_path} to {quant} failed" + (f": {detail}" if detail else "")
            )
        check_gguf(partial)
        os.replace(partial, out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    # A name stays a name (it survives moving the cache); a path is stored absolute.
    target_ref = target if target in known_names() else str(input_path)
    register_user_draft(UserDraft(name=name, path=str(out), target=target_ref, quant=quant))
    return DraftResult(name, out, quant, input_path, input_path.stat().st_size, out.stat().st_size, seconds)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
