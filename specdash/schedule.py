"""Scripted hot-swaps: commands applied at given steps (`run --schedule FILE`, `--at`).

A schedule is lines of `STEP: COMMAND [COMMAND ...]` in the command syntax of
specdash/events.py (`k=8`, `draft=lookup`, `temp=0.7`, `adaptive=on`, `experts=2`,
`pause=2s`, ...). `#` starts a comment. STEP counts engine steps of the run from 1: the
commands are sent after step STEP, through the same command queue the dashboard uses, so
the engine applies them before step STEP + 1 and reports each in a SettingsEvent (or a
notice, when it refuses one).

Example:

    # warm up at K=4, then sweep
    10: k=8
    20: k=16 adaptive=off
    30: draft=suffix pause=2s
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from specdash import events as E
from specdash.errors import SpecdashError


@dataclass(frozen=True, slots=True)
class Entry:
    step: int
    command: E.Command
    pause_s: float  # > 0: `pause=Ns`, a Resume follows after that many seconds
    where: str  # "FILE:LINE" or "--at SPEC", for messages


def parse_line(text: str, where: str) -> list[Entry]:
    """One `STEP: COMMAND ...` line; [] for blank lines and comments. SpecdashError names
    `where` and the bad token."""
    body = text.split("#", 1)[0].strip()
    if not body:
        return []
    m = re.fullmatch(r"(\S+?)\s*:\s*(.*)", body)
    if not m:
        raise SpecdashError(f"{where}: {body!r}: expected STEP: COMMAND, e.g. `10: k=8`")
    step_text, rest = m.groups()
    if not step_text.isdigit() or int(step_text) < 1:
        raise SpecdashError(f"{where}: step {step_text!r}: must be a whole number >= 1")
    tokens = rest.split()
    if not tokens:
        raise SpecdashError(f"{where}: step {step_text} has no command; use {E.SCHEDULE_SYNTAX}")
    out = []
    for token in tokens:
        try:
            command, pause_s = E.parse_command(token)
        except E.ContractError as exc:
            raise SpecdashError(f"{where}: {exc}") from None
        out.append(Entry(int(step_text), command, pause_s, where))
    return out


def load_schedule(path: str | Path) -> list[Entry]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecdashError(f"--schedule {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecdashError(f"--schedule {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        entries += parse_line(line, f"{path}:{n}")
    return entries


def parse_at(specs: Iterable[str]) -> list[Entry]:
    """`--at STEP:COMMAND` flags (repeatable)."""
    entries = []
    for spec in specs:
        entries += parse_line(spec, f"--at {spec}")
    return entries


class Schedule:
    """Sends each entry's command once the run has finished its step. `send` is the
    session's (or engine's) thread-safe command queue."""

    def __init__(self, entries: Iterable[Entry], send: Callable[[E.Command], None],
                 timer: Callable[[float, Callable[[], None]], None] | None = None):
        self._pending = sorted(entries, key=lambda e: e.step)
        self._send = send
        self._timer = timer or _thread_timer
        self.sent: list[Entry] = []

    def after_step(self, step: int) -> None:
        while self._pending and self._pending[0].step <= step:
            entry = self._pending.pop(0)
            self._send(entry.command)
            self.sent.append(entry)
            if entry.pause_s > 0:
                # The engine blocks while paused; the Resume comes from another thread.
                self._timer(entry.pause_s, lambda: self._send(E.Resume()))

    @property
    def left(self) -> list[Entry]:
        """Entries whose step the run never reached."""
        return list(self._pending)


def _thread_timer(seconds: float, action: Callable[[], None]) -> None:
    t = threading.Timer(seconds, action)
    t.daemon = True
    t.start()
