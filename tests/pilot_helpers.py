"""Waiting inside a Textual Pilot test: poll a condition, letting the app run between
looks. `tries` x `pause` is a liveness bound (minutes on a loaded 2-core machine), not a
timing assertion; each test file picks the bound its sources need."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any


async def until(pilot: Any, condition: Callable[[], object], what: str, tries: int = 500,
                pause: float = 0.05) -> None:
    for _ in range(tries):
        if condition():
            return
        await pilot.pause(pause)
    raise AssertionError(f"never happened: {what}")


def bounded(tries: int, pause: float = 0.05) -> Callable[..., Any]:
    """`until` with a file's own bound: `until = bounded(3000)`."""
    return partial(until, tries=tries, pause=pause)
