"""Faults on purpose: the engine's failure path, reached without a broken machine.

`SPECDASH_FAULT_FILE=PATH`: whenever PATH exists, the next llama_decode is reported as
failed (the path llama.cpp's own failure takes: the batch's rows cut back, RuntimeError)
and PATH is removed, so one touch is one fault. The fault tests and the serve soak
(benchmarks/serve_soak.py) touch it mid-request; unset, nothing is checked.
"""

from __future__ import annotations

import os

ENV = "SPECDASH_FAULT_FILE"
_path = os.environ.get(ENV) or None


def decode_fails() -> bool:
    """True once per touch of the fault file (never when the variable is unset)."""
    if _path is None:
        return False
    try:
        os.remove(_path)
    except FileNotFoundError:
        return False
    return True
