"""Keep llama.cpp's log off the terminal while we load vocabularies or quantize, but
keep its warnings and errors so a failure can say why (llama.cpp reports most causes
only through its log, returning a bare NULL or non-zero)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import llama_cpp

# ggml_log_level in this llama.cpp: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
# (llama-cpp-python's _logger.py still documents the older numbering).
_WARN, _ERROR, _CONT = 3, 4, 5
_lock = threading.Lock()
_lines: list[str] | None = None
_last_level = 0


def _on_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
    global _last_level
    if level != _CONT:
        _last_level = level
    buf = _lines
    if buf is not None and text and _last_level in (_WARN, _ERROR):
        buf.append(text.decode("utf-8", errors="replace"))


# Module level on purpose: llama.cpp keeps the raw function pointer, and it would dangle
# if the ctypes wrapper were garbage collected.
_CALLBACK = llama_cpp.llama_log_callback(_on_log)


@contextmanager
def captured_llama_log() -> Iterator[list[str]]:
    """Silence llama.cpp's log within the block; yields the warning/error lines logged.
    The previous callback (llama-cpp-python's own, or the engine's) is restored after."""
    global _lines
    with _lock:  # one capture at a time: the callback is process-global
        prev_cb = llama_cpp.llama_log_callback()
        prev_ud = ctypes.c_void_p()
        llama_cpp.llama_log_get(ctypes.byref(prev_cb), ctypes.byref(prev_ud))
        _lines = []
        llama_cpp.llama_log_set(_CALLBACK, ctypes.c_void_p(0))
        try:
            yield _lines
        finally:
            llama_cpp.llama_log_set(prev_cb, prev_ud)
            _lines = None


def last_lines(lines: list[str], limit: int = 2) -> str:
    """The last few logged lines on one line, for an error message."""
    tail = [s.strip() for s in "".join(lines).splitlines() if s.strip()][-limit:]
    return " | ".join(tail)
