"""Running a Textual app in the user's terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from typing import Any


def follow_the_terminal(environ: MutableMapping[str, str] = os.environ) -> None:
    """Forget $COLUMNS and $LINES where the terminal itself can say its size.

    Textual reads the size with shutil.get_terminal_size, which prefers those variables
    to the terminal: a dashboard started with them exported keeps that size through
    every resize. GNU readline exports them (pytest imports it, so a dashboard a test
    harness starts inherits 80x24), and so do some shells' startup files. Where stdout
    is not a terminal they are all there is, so they stay."""
    stdout = sys.__stdout__
    if stdout is None:
        return
    try:
        os.get_terminal_size(stdout.fileno())
    except (ValueError, OSError):  # a pipe, a file, a closed stdout
        return
    environ.pop("COLUMNS", None)
    environ.pop("LINES", None)


def run_app(app: Any, keymap: dict[str, str] | None = None, mouse: bool = True) -> int:
    """Run a dashboard app in this terminal; its return code (0 where it set none).
    keymap: the config's [keys] (tui/keymap.check_keymap); mouse=False leaves the mouse
    to the terminal ([ui] mouse = false: its own text selection works)."""
    from specdash.tui.gc_pacing import GcPacer

    follow_the_terminal()
    if keymap:
        app.set_keymap(keymap)
    with GcPacer(lambda: getattr(app, "last_key_at", 0.0)):
        app.run(mouse=mouse)
    return app.return_code or 0
