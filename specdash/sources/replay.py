"""A recording as a source: its events again, at the pace they were recorded.

A replay shows what the live run showed, because the dashboard only ever saw events:
every panel, telemetry included (the recorded machine's: Source.telemetry "recorded"). Controls: Pause/Resume,
SetSpeed (0.5x..16x) and Seek (to a time, by a number of seconds, or to the end). A
seek sends a ReplayEvent(rewind=True), on which the consumer starts over from an empty
state, then every event up to the new position at once, then plays on from there.

What a recording cannot do (change K, the drafter, ...) is refused with the reason, via
the settings it reports: each recorded SettingsEvent is re-labelled source="replay", with
`supports` the replay's own commands (SUPPORTS) and `unavailable` saying why the rest
are not.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

from specdash.contract import events as E
from specdash.contract.vocabulary import name_of
from specdash.contract.events import SPEEDS, Event
from specdash.records.recording import Recording, read_recording
from specdash.sources.base import Preset, Telemetry

SUPPORTS = ["pause", "seek", "speed", "stop"]  # what a recording can do, by command name
_REFUSED = {
    "k": "a recording cannot change K: run it again with --k",
    "draft": "a recording cannot change the drafter: run it again with --draft",
    "temp": "a recording cannot change the temperature",
    "adaptive": "a recording cannot switch adaptive K",
    "experts": "a recording cannot change the expert count",
    "prompt": "a recording cannot take a new prompt",
    "forget": "a recording cannot forget",
    "sweep": "a sweep reruns the prompt: it needs the embedded engine (specdash sweep)",
}


class ReplaySource:
    kind = "replay"
    telemetry: Telemetry = "recorded"
    supports: frozenset[str] = frozenset(SUPPORTS)

    def __init__(self, path: str | Path, *, speed: float = 1.0, recording: Recording | None = None,
                 sleep: Callable[[threading.Event, float], bool] | None = None, rewind: bool = False):
        """`sleep(stop_event, seconds)` waits and returns True if woken early (tests pass
        an instant one). `rewind`: the first event is a rewind, for a dashboard that
        restarts the replay (`r`) and still holds the state of the one before."""
        self._rewind_first = rewind
        self.recording = recording or read_recording(path)
        self.label = str(self.recording.path)
        self.thread: threading.Thread | None = None
        self._events = self.recording.events
        times = [ev.t for ev in self._events if ev.t]
        self._t0 = min(times) if times else 0.0
        self.duration = (max(times) - self._t0) if times else 0.0
        self._speed = speed
        self._playing = True
        self._index = 0  # next event to emit
        self._position = 0.0  # seconds from the start of the recording
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._seek_to: float | None = None
        self._emit: Callable[[Event], None] = lambda ev: None
        self._sleep = sleep or (lambda wake, seconds: wake.wait(seconds))

    # --- Source ------------------------------------------------------------------------
    def start(self, emit: Callable[[Event], None]) -> None:
        self._emit = emit
        self.thread = threading.Thread(target=self._body, name="specdash-replay", daemon=True)
        self.thread.start()

    def send(self, cmd: E.Command) -> None:
        with self._lock:
            match cmd:
                case E.Pause():
                    self._playing = False
                case E.Resume():
                    self._playing = True
                case E.SetSpeed(speed):
                    if not SPEEDS[0] <= speed <= SPEEDS[-1]:
                        self._emit(E.NoticeEvent("warning", f"speed {speed:g}x refused: use "
                                                 f"{SPEEDS[0]:g}x to {SPEEDS[-1]:g}x", t=E.now(),
                                                 refused=cmd.text()))
                        return
                    self._speed = speed
                case E.Seek(to, by):
                    if to is None and by is None:
                        target = self.duration
                    elif to is not None:
                        target = to
                    else:
                        target = self._position + (by or 0.0)
                    self._seek_to = min(max(target, 0.0), self.duration)
                case E.Stop():
                    self._closed.set()
                case _:
                    name = name_of(cmd)
                    why = _REFUSED.get(name, "a recording only plays, pauses, seeks and changes speed")
                    self._emit(E.NoticeEvent("warning", f"{cmd.text()} refused: {why}", t=E.now(),
                                             refused=cmd.text()))
                    return
        self._emit(self._position_event())
        self._wake.set()

    def close(self) -> None:
        self._closed.set()
        self._wake.set()

    def presets(self) -> list[Preset]:
        return []

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def position(self) -> float:
        return self._position

    # --- playing -----------------------------------------------------------------------
    def _position_event(self, rewind: bool = False) -> E.ReplayEvent:
        return E.ReplayEvent(file=self.label, position=self._position, duration=self.duration,
                             speed=self._speed, playing=self._playing and self._index < len(self._events),
                             rewind=rewind, problem=self.recording.problem, t=E.now())

    def _relabel(self, ev: Event) -> Event:
        if isinstance(ev, E.SettingsEvent):
            unavailable = {name: why for name, why in {**ev.unavailable, **_REFUSED}.items() if name not in SUPPORTS}
            return dataclasses.replace(ev, source="replay", supports=list(SUPPORTS), unavailable=unavailable)
        return ev

    def _offset(self, ev: Event) -> float:
        return ev.t - self._t0 if ev.t else self._position

    def _body(self) -> None:
        self._emit(self._position_event(rewind=self._rewind_first))
        if self.recording.problem:
            self._emit(E.NoticeEvent("warning", f"{self.label}: {self.recording.problem}; "
                                     f"replaying the {len(self._events)} events before it", t=E.now()))
        last_tick = 0.0
        while not self._closed.is_set():
            with self._lock:
                seek, self._seek_to = self._seek_to, None
            if seek is not None:
                self._do_seek(seek)
                continue
            if not self._playing or self._index >= len(self._events):
                if self._index >= len(self._events) and self._playing:
                    self._playing = False
                    self._emit(self._position_event())
                    self._emit(E.StatusEvent("ended", f"end of {Path(self.label).name}"
                                             + (f" ({self.recording.problem})" if self.recording.problem else ""),
                                             t=E.now()))
                self._wake.wait()
                self._wake.clear()
                continue
            ev = self._events[self._index]
            wait = (self._offset(ev) - self._position) / self._speed
            if wait > 0:
                if self._sleep(self._wake, min(wait, 0.25)):
                    self._wake.clear()
                    continue  # a command arrived: re-plan
                self._position += min(wait, 0.25) * self._speed
                if self._position - last_tick >= 1.0:  # the position, about once a second
                    last_tick = self._position
                    self._emit(self._position_event())
                continue
            self._position = max(self._position, self._offset(ev))
            self._index += 1
            self._emit(self._relabel(ev))

    def _do_seek(self, target: float) -> None:
        """Start over: rewind, then everything up to `target` at once."""
        self._index, self._position = 0, target
        self._emit(self._position_event(rewind=True))
        while self._index < len(self._events) and self._offset(self._events[self._index]) <= target:
            self._emit(self._relabel(self._events[self._index]))
            self._index += 1
        self._emit(self._position_event())
