"""A one-line question: temperature, expert count, a new prompt, a file name.

Bad input keeps the dialog open with the text as typed and says what is valid, so
nothing the operator typed is lost.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

# Returns an error message for bad input, None for good.
Check = Callable[[str], str | None]


class AskScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    AskScreen { align: center middle; }
    AskScreen > Vertical {
        width: 80%; max-width: 100; height: auto;
        border: round $primary; background: $surface; padding: 0 1;
    }
    AskScreen Label { width: 1fr; }
    AskScreen .hint { color: $text-muted; }
    AskScreen .error { color: $text-error; }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="ask.cancel")]

    def __init__(self, title: str, value: str, hint: str, check: Check, placeholder: str = ""):
        super().__init__()
        self._title = title
        self._value = value
        self._hint = hint
        self._check = check
        self._placeholder = placeholder

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = self._title
            yield Input(value=self._value, placeholder=self._placeholder, select_on_focus=True)
            yield Label(self._hint, classes="hint")
            yield Label("", id="ask-error", classes="error", markup=False)  # quotes what was typed

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        problem = self._check(event.value)
        if problem:
            self.query_one("#ask-error", Label).update(problem)
            self.notify(problem, severity="error", title="Not applied")
            return
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
