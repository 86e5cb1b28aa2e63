"""Python's full garbage collections, paced by the keyboard: at moments without keys.

Why: a dashboard process holds many long-lived objects (at 100 fleet servers ~240,000:
Rich segments and styles in render caches, each server's folded state), and a full
(generation-2) collection walks them all holding the GIL: 90-190 ms on a 2-core EPYC. The
allocations of a sort set one off right after the key, so every key-to-screen time above
120 ms in a traced run of benchmarks/fleet_scale.py had a full collection in it. Young
collections (generations 0 and 1) stay automatic: they free the short-lived cycles (an
exception and its traceback) as before. Full ones run here, on a thread of their own: when
no key came for QUIET seconds and the last was EVERY seconds ago, and at the latest LONGEST
seconds after the last, keys or not (memory stays bounded). The objects alive once the
modules are imported are frozen (`gc.freeze`): they live as long as the process, and no full
collection walks them again. Textual pauses collections during smooth scrolling for the
same reason (App.PAUSE_GC_ON_SCROLL).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from types import TracebackType

QUIET = 2.0
EVERY = 30.0
LONGEST = 120.0
# The third threshold counts young collections between full ones: this many never come.
NEVER = 1 << 30


class GcPacer:
    def __init__(self, last_key: Callable[[], float], *, clock: Callable[[], float] = time.monotonic,
                 collect: Callable[[int], object] = gc.collect, tick: float = 0.5):
        """last_key(): the clock's time of the last key (0 before any)."""
        self._last_key = last_key
        self._clock = clock
        self._collect = collect
        self._tick = tick
        self.last_full = clock()
        self.collections = 0
        self._saved: tuple[int, int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def due(self, now: float) -> bool:
        since = now - self.last_full
        return since >= LONGEST or (since >= EVERY and now - self._last_key() >= QUIET)

    def step(self) -> bool:
        """One check: a full collection if it is due. True when it ran."""
        if not self.due(self._clock()):
            return False
        self._collect(2)
        self.last_full = self._clock()
        self.collections += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            self.step()

    def __enter__(self) -> GcPacer:
        self._saved = gc.get_threshold()
        gc.freeze()
        young, middle, _ = self._saved
        gc.set_threshold(young, middle, NEVER)
        self.last_full = self._clock()
        self._thread = threading.Thread(target=self._run, name="gc pacing", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * self._tick + 1)
        if self._saved is not None:
            gc.set_threshold(*self._saved)
        gc.unfreeze()
