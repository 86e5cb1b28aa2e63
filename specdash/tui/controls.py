"""Which controls exist, and whether each can run now: one table, one rule. No Textual.

The footer (dim or hide), the help screen and the command palette (why not) and the
key handlers (refuse with a notification) all ask `why_unavailable`, so they cannot
disagree. The controls that issue commands come from the command registry
(specdash/contract/vocabulary.py), in its order; the dashboard's own (export, screenshot,
...) follow.

The capability rule: a command's control is available only when the source lists the
command in SettingsEvent.supports (before its first settings event: what the source
declares it can take at most, `Source.supports`). A source that does not list it
refuses it, so the key leaves the footer, and the help shows the source's reason from
SettingsEvent.unavailable. The rules here add only what follows from the state.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from specdash.contract.vocabulary import COMMANDS
from specdash.tui.reducer import DashState


@dataclass(frozen=True, slots=True)
class Control:
    action: str  # the app's action_<name>
    key: str  # as shown
    description: str
    command: str | None = None  # the registry name a source must support
    needs_source: bool = True  # only while the source takes commands


# The dashboard's own controls: no command, any source.
APP_CONTROLS: tuple[Control, ...] = (
    Control("export", "x", "the settings as a llama-server command line and router preset", needs_source=False),
    Control("screenshot", "s", "save an SVG screenshot and a JSON file of settings and stats", needs_source=False),
    Control("write_config", "w", "write the live settings to a TOML config (load it with --config)",
            needs_source=False),
    Control("requests", "l", "the requests table: one row per finished request, with its acceptance-length "
            "histogram", needs_source=False),
    Control("restart", "r", "restart the engine after an error", needs_source=False),
    Control("help", "?", "this help", needs_source=False),
    Control("quit", "q", "quit", needs_source=False),
)

_cache: tuple[tuple[str, ...], tuple[Control, ...], dict[str, Control]] | None = None


def _table() -> tuple[tuple[Control, ...], dict[str, Control]]:
    global _cache
    names = tuple(COMMANDS)
    if _cache is None or _cache[0] != names:  # the registry changed (a test added a command)
        table = tuple(Control(key.action, key.spelled or key.display, key.help, spec.name, key.needs_source)
                      for spec in COMMANDS.values() for key in spec.keys) + APP_CONTROLS
        _cache = (names, table, {c.action: c for c in table})
    return _cache[1], _cache[2]


def controls() -> tuple[Control, ...]:
    """Every control: the registry's keys in its order, then the dashboard's own."""
    return _table()[0]


def control(action: str) -> Control | None:
    return _table()[1].get(action)


def supported(state: DashState, declared: Collection[str]) -> Collection[str]:
    """The commands the source takes now: its settings say; before any, what it declared."""
    return state.settings.supports if state.settings is not None else declared


def why_unavailable(action: str, state: DashState, declared: Collection[str] = ()) -> str:
    """"" when `action` can run now, else the reason. `declared`: Source.supports."""
    c = control(action)
    if c is None:
        return ""
    st = state.settings
    if action == "restart":
        return "" if state.state == "error" else "the engine is running"
    if action in ("write_config", "export") and st is None:
        return "no settings reported yet"
    if action == "export" and st is not None and not st.target_path:
        return "this source does not report its model files"
    if c.command is not None and c.command not in supported(state, declared):
        why = st.unavailable.get(c.command, "") if st is not None else ""
        return why or COMMANDS[c.command].unsupported or f"this source does not take {c.command!r} commands"
    if c.needs_source and not state.alive:
        return {"loading": "the engine is loading", "down": "the server is down"}.get(
            state.state, "the engine is not running")
    if c.command == "sweep" and state.queue is not None and state.queue.waiting:
        # A sweep reruns the prompt at each K: on a server it would hold the clients up.
        n = len(state.queue.waiting)
        return f"{n} request{'s' if n != 1 else ''} waiting: a sweep would hold them up; sweep when the queue is empty"
    return ""


def footer_state(action: str, state: DashState, declared: Collection[str] = ()) -> bool | None:
    """For Textual's check_action: True shows the key, None dims it, False hides it.
    What the source does not support leaves the footer (the help screen says why); so
    does everything but restart after an error. Dimmed: what waits for the source."""
    c = control(action)
    if c is None:
        return True
    if action == "restart":
        return state.state == "error"
    if c.needs_source and state.state == "error":
        return False
    if c.command is not None and c.command not in supported(state, declared):
        return False
    if c.needs_source and not state.alive:
        return None  # dimmed while loading
    return True
