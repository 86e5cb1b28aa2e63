"""The one llama.cpp log hook in the process.

llama.cpp logs everything to stderr by default, which would tear through the TUI and the
JSON-lines stream, and it reports most failures only through its log (a bare NULL or a
non-zero code). So one callback, installed at import, keeps the log off the terminal and
keeps: the last lines of everything (`last_log_error` explains a failed load), and, inside
`captured_llama_log()`, the warnings and errors of that block (a failed quantization or
vocabulary load quotes them).
"""

from __future__ import annotations

import collections
import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import llama_cpp as ll

# ggml_log_level in this llama.cpp: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
# (llama-cpp-python's _logger.py still documents the older numbering).
_WARN, _ERROR, _CONT = 3, 4, 5
_TAIL: collections.deque[str] = collections.deque(maxlen=50)
_lock = threading.Lock()
_captures: list[list[str]] = []
_last_level = 0


def _on_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
    global _last_level
    if level != _CONT:
        _last_level = level
    if not text:
        return
    line = text.decode("utf-8", "replace")
    _TAIL.append(line.rstrip("\n"))
    if _last_level in (_WARN, _ERROR) and _captures:
        with _lock:
            for buf in _captures:
                buf.append(line)


# Module level on purpose: llama.cpp keeps the raw function pointer, and it would dangle
# if the ctypes wrapper were garbage collected.
_CALLBACK = ll.llama_log_callback(_on_log)
ll.llama_log_set(_CALLBACK, ctypes.c_void_p(0))


def clear_tail() -> None:
    _TAIL.clear()


def last_log_error() -> str:
    """The most telling recent llama.cpp log line (for one-line error messages)."""
    for line in reversed(_TAIL):
        low = line.lower()
        if any(w in low for w in ("error", "failed", "invalid", "not within", "corrupt")):
            return line.strip()
    return _TAIL[-1].strip() if _TAIL else ""


@contextmanager
def captured_llama_log() -> Iterator[list[str]]:
    """Yields the warning/error lines llama.cpp logs within the block."""
    buf: list[str] = []
    with _lock:
        _captures.append(buf)
    try:
        yield buf
    finally:
        with _lock:
            _captures.remove(buf)


def last_lines(lines: list[str], limit: int = 2) -> str:
    """The last few logged lines on one line, for an error message."""
    tail = [s.strip() for s in "".join(lines).splitlines() if s.strip()][-limit:]
    return " | ".join(tail)
