"""`d`: choose the draft source. The engine swaps it between steps; an incompatible model
is refused by the engine (a notice names the failed rule) and the old drafter stays."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from specdash.engine.drafters import KINDS



@dataclass(frozen=True, slots=True)
class DraftChoice:
    spec: str  # what SetDrafter takes
    description: str
    available: bool
    reason: str = ""  # why not available


def draft_choices() -> list[DraftChoice]:
    """Model-free sources, then every model the registry knows (cached ones selectable)."""
    from specdash.models.registry import list_models

    choices = [DraftChoice(spec, desc, True) for spec, desc in KINDS.items()]
    for entry in list_models():
        reason = "" if entry.cached else f"not cached: run `specdash models fetch {entry.name}`"
        choices.append(DraftChoice(entry.name, entry.description, entry.cached, reason))
    return choices


class DraftPicker(ModalScreen[str | None]):
    DEFAULT_CSS = """
    DraftPicker { align: center middle; }
    DraftPicker > Vertical {
        width: 90%; max-width: 110; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    DraftPicker OptionList { height: auto; max-height: 16; border: none; }
    DraftPicker .hint { color: $text-muted; }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="picker.cancel")]

    def __init__(self, choices: list[DraftChoice], current: str):
        super().__init__()
        self._choices = choices
        self._current = current

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"Draft source (now: {self._current})"
            options = []
            for c in self._choices:
                line = Text()
                line.append(f"{c.spec:<20}", "bold" if c.spec == self._current else "")
                line.append(c.description if c.available else f"{c.description} ({c.reason})", "dim" if not c.available else "")
                options.append(Option(line, id=c.spec, disabled=not c.available))
            yield OptionList(*options)
            yield Label("or a GGUF file path (Enter to use it):", classes="hint")
            yield Input(placeholder="/path/to/draft.gguf", id="draft-path")

    def on_mount(self) -> None:
        option_list = self.query_one(OptionList)
        ids = [c.spec for c in self._choices]
        if self._current in ids:
            option_list.highlighted = ids.index(self._current)
        option_list.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        path = event.value.strip()
        if not path:
            self.notify("type a GGUF path, or pick a source above", severity="warning")
            return
        self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)
