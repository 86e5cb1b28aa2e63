"""The `[keys]` table: remap any dashboard key by its binding id (issue 42).

Every binding the dashboards define has an id: the command registry's are
`<command>.<action>` (`k.k_up`, `draft.draft`), the dashboard's own `app.help`,
`app.quit`, `config.export` and so on (`binding_ids()` lists them all). A config's

    [keys]
    "app.help" = "f1"
    "k.k_up" = "u,plus"

becomes Textual's keymap (`App.set_keymap`), so the footer, the help screen and the
palette show the keys in force. A key is a Textual key name: a printable character
(`u`, `+`), a name (`plus`, `question_mark`, `f1`, `escape`, `space`), with modifiers
(`ctrl+u`); several are comma-separated. An unknown id or key is a one-line
SpecdashError naming both (exit 2), before the dashboard starts.
"""

from __future__ import annotations

from collections.abc import Mapping

from textual.binding import Binding
from textual.keys import Keys, _character_to_key

from specdash.contract.errors import SpecdashError

MODIFIERS = ("ctrl", "shift", "alt", "meta", "super", "hyper")
# Key names without modifiers: Textual's named keys and the names of printable characters.
_NAMES = frozenset({k.value for k in Keys if "+" not in k.value and not k.value.startswith("<")}
                   | {_character_to_key(chr(c)) for c in range(33, 127)} | {"space"})


def binding_ids() -> dict[str, str]:
    """Every remappable binding: id -> the keys it has by default."""
    from specdash.tui.app_base import DashboardBase, command_bindings
    from specdash.tui.app_requests import RequestsView
    from specdash.tui.fleet_app import FleetDashboard
    from specdash.tui.screens.help import HelpScreen
    from specdash.tui.screens.requests import RequestsScreen

    out: dict[str, str] = {}
    for holder in (command_bindings(), DashboardBase.BINDINGS, RequestsView.BINDINGS, FleetDashboard.BINDINGS,
                   HelpScreen.BINDINGS, RequestsScreen.BINDINGS):
        for b in holder:
            if isinstance(b, Binding) and b.id:
                out[b.id] = b.key
    return out


def valid_key(name: str) -> bool:
    if len(name) == 1:  # a character, "+" included (Textual names it "plus")
        return name.isprintable() and name != ","
    *mods, base = name.split("+")
    if not base or any(m not in MODIFIERS for m in mods):
        return False
    return (len(base) == 1 and base.isprintable()) or base in _NAMES


def check_keymap(keys: Mapping[str, str], where: str = "[keys]") -> dict[str, str]:
    """The config's [keys] table as a Textual keymap, or a SpecdashError naming the id or
    key that is wrong and what would be valid."""
    ids = binding_ids()
    out: dict[str, str] = {}
    for binding_id, value in keys.items():
        if binding_id not in ids:
            raise SpecdashError(f"{where} {binding_id!r}: no such binding; valid ids: {', '.join(sorted(ids))}")
        if not isinstance(value, str) or not value.strip():
            raise SpecdashError(f"{where} {binding_id} = {value!r}: give key names, comma-separated (e.g. \"f1\")")
        names = [k.strip() for k in value.split(",")]
        bad = next((k for k in names if not valid_key(k)), None)
        if bad is not None:
            raise SpecdashError(f"{where} {binding_id} = {value!r}: {bad!r} is not a key name; use a character "
                                "(u, +), a name (plus, question_mark, f1, escape, space), optionally with "
                                "modifiers (ctrl+u)")
        # A character by Textual's name for it ("+" -> plus, "?" -> question_mark).
        out[binding_id] = ",".join(_character_to_key(k) if len(k) == 1 else k for k in names)
    return out
