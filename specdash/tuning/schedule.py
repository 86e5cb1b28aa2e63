"""Scripted hot-swaps: commands applied at given steps (`run --schedule FILE`, `--at`).

A schedule is lines of `STEP: COMMAND [COMMAND ...]` in the command syntax of
specdash/contract/events.py (`k=8`, `draft=lookup`, `temp=0.7`, `adaptive=on`, `experts=2`,
`pause=2s`, ...). `#` starts a comment; commands split like shell words, so a path with
spaces can be quoted. STEP counts engine steps of the run from 1: the commands are sent
after step STEP, through the same command queue the dashboard uses, so the engine applies
them before step STEP + 1 and reports each in a SettingsEvent whose `command` is the
command's text (or a warning notice "COMMAND refused: ...; kept ..."). A bare `pause` is
refused: the engine blocks while paused and nothing in a schedule could resume it.
Commands sent after the run's last step are never applied (`Schedule.unapplied`).
`k=N` fixes K as `--k N` does: under adaptive K (the default) it turns adaptive off (the
engine says so in a notice); `k=N adaptive=on` keeps adaptive, starting from K=N.

Example:

    # warm up at K=4, then sweep
    10: k=8
    20: k=16 adaptive=off
    30: draft=suffix pause=2s
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from specdash.contract import events as E
from specdash.contract.vocabulary import parse_command, schedule_syntax
from specdash.contract.errors import SpecdashError, read_user_file


@dataclass(frozen=True, slots=True)
class Entry:
    step: int
    command: E.Command
    pause_s: float  # > 0: `pause=Ns`, a Resume follows after that many seconds
    where: str  # "FILE:LINE" or "--at SPEC", for messages


def parse_line(text: str, where: str) -> list[Entry]:
    """One `STEP: COMMAND ...` line; [] for blank lines and comments. SpecdashError names
    `where` and the bad token. Commands split like a shell's words, so a model path with
    spaces can be quoted: `10: draft="/models/my draft.gguf"`."""
    body = text.strip()
    if not body or body.startswith("#"):
        return []
    step_text, colon, rest = body.partition(":")
    step_text = step_text.strip()
    if not colon or not step_text or any(c.isspace() for c in step_text):
        raise SpecdashError(f"{where}: {body[:60]!r}: expected STEP: COMMAND, e.g. `10: k=8`")
    if not step_text.isascii() or not step_text.isdigit() or int(step_text) < 1:
        raise SpecdashError(f"{where}: step {step_text!r}: must be a whole number >= 1")
    try:
        tokens = shlex.split(rest, comments=True)
    except ValueError as exc:  # an unclosed quote
        raise SpecdashError(f"{where}: {rest.strip()!r}: {exc}") from None
    if not tokens:
        raise SpecdashError(f"{where}: step {step_text} has no command; use {schedule_syntax()}")
    out = []
    for token in tokens:
        try:
            command, pause_s = parse_command(token)
        except E.ContractError as exc:
            raise SpecdashError(f"{where}: {exc}") from None
        if isinstance(command, E.Pause) and pause_s <= 0:
            # The engine blocks while paused and a schedule only acts after steps: nothing
            # would ever resume it.
            raise SpecdashError(f"{where}: {token!r}: a scheduled pause needs a duration, e.g. pause=2s")
        out.append(Entry(int(step_text), command, pause_s, where))
    return out


def load_schedule(path: str | Path) -> list[Entry]:
    text = read_user_file(path, "--schedule")
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
        self._pending = sorted(entries, key=lambda e: e.step)  # stable: file order within a step
        self._send = send
        self._timer = timer or _thread_timer
        self.sent: list[Entry] = []
        self._last_batch: list[Entry] = []  # sent after the latest step
        # Pauses sent together overlap: the one ending last owns the single Resume. (One
        # Resume per pause let an early one end a later step's pause, and the last Resume
        # could arrive after the run had ended.)
        self._resume_at = 0.0
        self._resume_owner = 0

    def after_step(self, step: int) -> None:
        self._last_batch = []
        while self._pending and self._pending[0].step <= step:
            entry = self._pending.pop(0)
            self._send(entry.command)
            self.sent.append(entry)
            self._last_batch.append(entry)
            if entry.pause_s > 0:
                self._pause_for(entry.pause_s)

    def _pause_for(self, seconds: float) -> None:
        # The engine blocks while paused; the Resume comes from another thread.
        ends = time.monotonic() + seconds
        if ends <= self._resume_at:
            return  # an overlapping pause already resumes later
        self._resume_at = ends
        self._resume_owner += 1
        owner = self._resume_owner

        def resume() -> None:
            if owner == self._resume_owner:
                self._resume_at = 0.0  # the window is closed: a later pause opens its own
                self._send(E.Resume())

        self._timer(seconds, resume)

    @property
    def left(self) -> list[Entry]:
        """Entries whose step the run never reached."""
        return list(self._pending)

    def unapplied(self, stopped: bool = False) -> list[Entry]:
        """Once the run has ended: the entries it never applied. The engine applies
        commands before a step, so those sent after the last step never ran either,
        unless a scheduled `stop` ended the run (`stopped`): then the batch ran up to it."""
        batch = self._last_batch
        if stopped:
            stops = [i for i, e in enumerate(batch) if isinstance(e.command, E.Stop)]
            batch = batch[stops[0] + 1:] if stops else batch
        return batch + self._pending


def _thread_timer(seconds: float, action: Callable[[], None]) -> None:
    t = threading.Timer(seconds, action)
    t.daemon = True
    t.start()
