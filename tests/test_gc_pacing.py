"""Full garbage collections paced by the keyboard (tui/gc_pacing): on a scripted clock,
when they come; for real, what the pacer does to the collector and undoes."""

from __future__ import annotations

import gc

from specdash.tui import gc_pacing
from specdash.tui.gc_pacing import EVERY, LONGEST, QUIET, GcPacer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_full_collection_waits_for_a_quiet_moment_and_never_longer_than_the_ceiling() -> None:
    clock, keys, runs = Clock(), {"last": 0.0}, []
    pacer = GcPacer(lambda: keys["last"], clock=clock, collect=runs.append)
    assert not pacer.step()  # just started
    clock.now += EVERY - 1
    assert not pacer.step()  # too soon
    clock.now += 1
    keys["last"] = clock.now - QUIET / 2  # a key a moment ago
    assert not pacer.step()
    clock.now += QUIET  # quiet since
    assert pacer.step() and runs == [2]
    # Keys all the time: at the latest LONGEST after the last one.
    clock.now += EVERY
    keys["last"] = clock.now
    assert not pacer.step()
    clock.now += LONGEST - EVERY
    keys["last"] = clock.now
    assert pacer.step() and runs == [2, 2] and pacer.collections == 2


def test_the_pacer_holds_back_full_collections_and_gives_the_collector_back(monkeypatch) -> None:
    monkeypatch.setattr(gc_pacing, "EVERY", 0.2)
    monkeypatch.setattr(gc_pacing, "QUIET", 0.0)
    before = gc.get_threshold()
    with GcPacer(lambda: 0.0, tick=0.05) as pacer:
        young, middle, full = gc.get_threshold()
        assert (young, middle) == before[:2] and full == gc_pacing.NEVER
        assert gc.get_freeze_count() > 0  # what was alive at the start is not walked again
        deadline = pacer.last_full + 5
        while pacer.collections == 0 and gc_pacing.time.monotonic() < deadline:
            gc_pacing.time.sleep(0.05)
        assert pacer.collections >= 1  # its thread ran one when due
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
