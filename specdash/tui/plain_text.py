"""Text from outside goes to the screen as text, never as markup.

A notification's message is parsed as Textual markup by default, and a message here is
nearly always built from something outside the app: a refusal quoting a client's
command (`draft=[/]`), a server's error body, a file name, a model's output. `[/]` in it
raises MarkupError and ends the app (and `serve` with it); `[@click=app.quit]` in it would
be a live action. So every app here notifies in plain text, whatever a caller asks."""

from __future__ import annotations

from textual.app import App
from textual.notifications import SeverityLevel


class PlainNotify(App[int]):
    """An App whose notifications are never markup (a base for every app here)."""

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        # `markup` is ignored on purpose: Widget.notify passes True explicitly.
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)
