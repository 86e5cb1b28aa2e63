"""The dashboard follows its terminal's size even where $COLUMNS/$LINES are exported
(GNU readline exports them; Textual would otherwise keep that size through every resize).
End to end: test_dashboard_tmux's first-screen test starts the app with them set."""

from __future__ import annotations

import os
import pty
import sys

from specdash.tui.terminal import follow_the_terminal


def test_a_terminal_says_its_own_size(monkeypatch):
    main, sub = pty.openpty()
    try:
        with os.fdopen(os.dup(sub), "w") as tty:
            monkeypatch.setattr(sys, "__stdout__", tty)
            environ = {"COLUMNS": "80", "LINES": "24", "TERM": "xterm"}
            follow_the_terminal(environ)
            assert environ == {"TERM": "xterm"}
    finally:
        os.close(main)
        os.close(sub)


def test_without_a_terminal_the_variables_are_all_there_is(monkeypatch):
    read, write = os.pipe()
    try:
        with os.fdopen(os.dup(write), "w") as pipe:
            monkeypatch.setattr(sys, "__stdout__", pipe)
            environ = {"COLUMNS": "120", "LINES": "40"}
            follow_the_terminal(environ)
            assert environ == {"COLUMNS": "120", "LINES": "40"}
    finally:
        os.close(read)
        os.close(write)
