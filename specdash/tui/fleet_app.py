"""`specdash attach URL URL ...`: the fleet table, and any server's full dashboard.

The fleet is one Source made of one RemoteSource per server (each polling on its own
timer). Every server's rows reach the fleet table; only the server in focus feeds the
dashboard's reducer. Each server's events are also folded, as they come, into that
server's own DashState (the reducer is pure, and bounded: its charts keep a window, its
lists a fixed length), so memory stays flat however long a fleet is watched. Enter on a
row focuses that server: the dashboard takes a copy of its state, so its panels show its
recent history at once, and the table gives way to them. Esc goes back to the table.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from textual.binding import Binding

from specdash.contract import events as E
from specdash.contract.events import Event
from specdash.sources.base import Preset, Telemetry
from specdash.sources.embedded import PromptQueue, WorkItem
from specdash.sources.remote import RemoteSource
from specdash.tui.app import SpecdashApp
from specdash.tui.app_base import first_then_new
from specdash.tui.controls import control
from specdash.tui.reducer import DashState
from specdash.tui.screens.fleet import FleetScreen

class FleetSource:
    """Several RemoteSources as one: rows from all, everything else from the focused one."""

    kind = "remote"
    telemetry: Telemetry = "none"

    def __init__(self, sources: Sequence[RemoteSource], *, window: float = 60.0):
        self.sources = {s.url: s for s in sources}
        self.label = f"{len(self.sources)} servers"
        self.focus: str | None = None
        self.window = window
        # Each server's events folded as they come (on its poller's thread, under its lock).
        self._states = {url: DashState(window=window, source=self.kind, telemetry_from=self.telemetry)
                        for url in self.sources}
        self._locks = {url: threading.Lock() for url in self.sources}
        self._emit: Callable[[Event], None] = lambda ev: None

    def start(self, emit: Callable[[Event], None]) -> None:
        self._emit = emit
        for url, source in self.sources.items():
            source.start(partial(self._route, url))

    def _route(self, url: str, ev: Event) -> None:
        # Under the lock: `focus_on` switches and copies between two events, never during one.
        with self._locks[url]:
            self._states[url].feed(ev)
            if isinstance(ev, E.ServerEvent) or url == self.focus:
                self._emit(ev)

    def focus_on(self, url: str) -> DashState:
        """Make `url` the server in focus; a copy of everything it said so far, folded. Its
        later events reach the consumer from here on, none twice and none lost."""
        with self._locks[url]:
            self.focus = url
            return copy.deepcopy(self._states[url])

    @property
    def supports(self) -> frozenset[str]:
        """The server in focus's; on the fleet table, nothing (no one server to steer)."""
        return self.sources[self.focus].supports if self.focus is not None else frozenset()

    @property
    def thread(self) -> None:
        return None

    def presets(self) -> list[Preset]:
        return self.sources[self.focus].presets() if self.focus is not None else []

    def send(self, cmd: E.Command) -> None:
        if self.focus is not None:
            self.sources[self.focus].send(cmd)

    def close(self) -> None:
        for source in self.sources.values():
            source.close()

    def again(self, prompt: WorkItem | None = None) -> FleetSource:
        """The same servers in new sources, not started (closed ones cannot start again),
        the same one in focus, with what they said so far; `prompt` goes to the one in focus."""
        fleet = FleetSource([
            s.again(prompt if url == self.focus else None)
            for url, s in self.sources.items()], window=self.window)
        fleet.focus, fleet._states = self.focus, self._states
        return fleet


class FleetDashboard(SpecdashApp):
    BINDINGS = [Binding("escape", "fleet", "fleet", id="fleet.back")]

    def __init__(self, sources: Sequence[RemoteSource], **kwargs: object):
        from specdash.tui.app import DashboardOptions

        options = DashboardOptions(**kwargs)  # type: ignore[arg-type]
        self.fleet_source = FleetSource(sources, window=options.window)
        self.fleet = FleetScreen()
        super().__init__(options,
                         source_factory=first_then_new(self.fleet_source, self._new_fleet), local_telemetry=False)

    def _new_fleet(self, prompts: PromptQueue) -> FleetSource:
        """A restart (`n` while the server in focus is down) closed the fleet: a new one."""
        self.fleet_source = self.fleet_source.again(prompts.pop_nowait())
        return self.fleet_source

    # On the fleet table no one server is in focus: its keys are the table's (sort, Enter,
    # q), a server's keys wait until Enter opens one, and pressing one says so.
    def _on_table(self) -> bool:
        return isinstance(self.screen, FleetScreen)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        c = control(action)
        if self._on_table() and c is not None and c.command is not None:
            return False
        return super().check_action(action, parameters)

    def why_unavailable(self, action: str) -> str:
        c = control(action)
        if self._on_table() and c is not None and c.command is not None:
            return "the fleet table steers no server: Enter opens the highlighted one, then its keys work"
        return super().why_unavailable(action)

    def on_mount(self) -> None:
        # (Textual runs the base class's on_mount too: the source starts there.)
        # Installed: popping it to show a server's panels keeps it mounted, its rows live.
        self.install_screen(self.fleet, name="fleet")
        self.push_screen("fleet")

    def _ingest(self, events: Iterable[Event]) -> None:
        mine = []
        for ev in events:
            if isinstance(ev, E.ServerEvent):
                self.fleet.update_server(ev)
                if ev.url != self.fleet_source.focus:
                    continue
            mine.append(ev)
        super()._ingest(mine)

    def on_fleet_screen_open(self, message: FleetScreen.Open) -> None:
        """Enter on a row: that server's panels, from what it said so far."""
        self.state = self.fleet_source.focus_on(message.url)
        self._gen.show_text(self.state)
        self._update_panels()
        self._refresh_bindings_if_changed()
        self.pop_screen()
        self.sub_title = message.url

    def action_fleet(self) -> None:
        if not isinstance(self.screen, FleetScreen):
            self.push_screen("fleet")
