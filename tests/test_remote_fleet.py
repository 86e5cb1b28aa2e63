"""The fleet screen, driven through Textual's Pilot in a tiny host app: rows from
ServerEvents only, sorting by key and by clicking a header, Enter posts Open(url), and a
down server's row."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from typing import Any

from textual.app import App

from specdash.events import ServerEvent
from specdash.tui.screens.fleet import COLUMN_KEYS, FleetScreen, fmt_duration, status_text


def row(url: str, **kw: Any) -> ServerEvent:
    base: dict[str, Any] = dict(state="up", backend="llamacpp", model="smol", requests_running=0,
                                requests_waiting=0, generation_tokens_per_s=10.0, prompt_tokens_per_s=50.0,
                                acceptance_rate=0.5, mean_accepted_length=2.0, tokens_per_step=1.8,
                                uptime_s=120.0, last_seen=time.time())
    base.update(kw)
    return ServerEvent(url=url, **base)


class Host(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.fleet = FleetScreen()
        self.opened: list[str] = []

    def on_mount(self) -> None:
        self.push_screen(self.fleet)

    def on_fleet_screen_open(self, message: FleetScreen.Open) -> None:
        self.opened.append(message.url)


A, B, C = "http://a:8080", "http://b:8080", "http://c:8000"


def sync(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test under asyncio.run (no pytest async plugin here)."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return wrapper


@sync
async def test_rows_sorting_enter_and_a_down_row() -> None:
    app = Host()
    async with app.run_test(size=(200, 20)) as pilot:
        fleet = app.fleet
        fleet.update_server(row(B, generation_tokens_per_s=30.0, acceptance_rate=0.9))
        fleet.update_server(row(A, generation_tokens_per_s=5.0, acceptance_rate=0.2))
        fleet.update_server(row(C, backend="vllm", model="qwen", generation_tokens_per_s=80.0,
                                acceptance_rate=None, requests_running=3, requests_waiting=2))
        await pilot.pause()
        assert fleet.order == [A, B, C]  # by server URL
        table = fleet.table
        assert str(table.get_cell(C, "busy")) == "3/2"
        assert str(table.get_cell(C, "acceptance")) == "–"
        assert str(table.get_cell(B, "acceptance")) == "90%"
        assert str(table.get_cell(A, "uptime")) == "2m00s"

        fleet.sort_by("gen", reverse=True)
        await pilot.pause()
        assert fleet.order == [C, B, A]

        # `s` moves to the next column (acceptance after prompt tok/s...), `r` reverses.
        fleet.sort_by("prompt")
        await pilot.press("s")
        assert fleet.sort_key == "acceptance" and fleet.order == [A, B, C]  # unknown last
        await pilot.press("r")
        assert fleet.reverse and fleet.order == [B, A, C]  # unknown stays last

        # Click the "gen tok/s" header: sorted by it; click again: reversed.
        x = 1 + sum(col.get_render_width(table) for col in table.ordered_columns[:COLUMN_KEYS.index("gen")])
        await pilot.click("#fleet", offset=(x, 0))
        await pilot.pause()
        assert fleet.sort_key == "gen" and not fleet.reverse and fleet.order == [A, B, C]
        await pilot.click("#fleet", offset=(x, 0))
        await pilot.pause()
        assert fleet.reverse and fleet.order == [C, B, A]

        # Enter on the highlighted row posts Open(url).
        table.move_cursor(row=1)
        await pilot.press("enter")
        await pilot.pause()
        assert app.opened == [B]

        # B goes down: its row says so, with when it was last seen and the error.
        seen = time.time() - 42
        fleet.update_server(row(B, state="down", last_seen=seen, errors=3,
                                error="http://b:8080: cannot connect (Connection refused)"))
        await pilot.pause()
        assert str(table.get_cell(B, "errors")) == "0", "changes to a known row wait for the flush"
        await pilot.pause(fleet.FLUSH_S + 0.3)  # the flush timer
        status = str(table.get_cell(B, "status"))
        assert status.startswith("down · last seen 4") and "s ago · http://b:8080: cannot connect" in status
        assert str(table.get_cell(B, "errors")) == "3"
        # Sorting by status puts the down row last.
        fleet.sort_by("status", reverse=False)
        await pilot.pause()
        assert fleet.order[-1] == B
        # Back up: the row recovers in place.
        fleet.update_server(row(B, resets=1))
        fleet.flush()
        await pilot.pause()
        assert str(table.get_cell(B, "status")) == "up · 1 reset"
        assert table.row_count == 3


def test_status_and_duration_text() -> None:
    now = 1000.0
    assert status_text(row(A, state="down", last_seen=None, error="boom"), now) == "down · never seen · boom"
    assert status_text(row(A, state="down", last_seen=now - 75, error="x"), now) == "down · last seen 1m15s ago · x"
    assert status_text(row(A, state="starting", error="HTTP 503"), now) == "starting · HTTP 503"
    assert fmt_duration(3 * 3600 + 61) == "3h01m" and fmt_duration(None) == "–"
