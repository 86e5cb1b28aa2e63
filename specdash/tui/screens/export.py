"""`x`: the running settings as a llama-server command line and a router preset."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class ExportScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > VerticalScroll {
        width: 90%; max-width: 120; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    ExportScreen .head { text-style: bold underline; }
    ExportScreen .hint { color: $text-muted; }
    """

    BINDINGS = [
        Binding("escape,x,q", "close", "close"),
        Binding("c", "copy", "copy command"),
        Binding("w", "write", "write files"),
    ]

    def __init__(self, command: str, preset: str, folder: Path, stem: str):
        super().__init__()
        self.command, self.preset = command, preset
        self._folder, self._stem = folder, stem

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "Export to llama-server — c copy · w write files · Esc close"
            yield Static("Command line", classes="head")
            yield Static(Text(self.command))
            yield Static("\nRouter preset (llama-server --models-preset FILE)", classes="head")
            yield Static(Text(self.preset))
            yield Static(f"\nw writes {self._stem}.sh and {self._stem}.ini into {self._folder}", classes="hint",
                         markup=False)

    def action_copy(self) -> None:
        # OSC 52: reaches the clipboard of the terminal the operator sits at, over SSH too.
        self.app.copy_to_clipboard(self.command.splitlines()[-1])
        self.app.notify("command line copied (OSC 52; some terminals need it enabled)", timeout=4)

    def action_write(self) -> None:
        try:
            self._folder.mkdir(parents=True, exist_ok=True)
            sh = self._folder / f"{self._stem}.sh"
            ini = self._folder / f"{self._stem}.ini"
            sh.write_text("#!/bin/sh\n" + self.command + "\n", encoding="utf-8")
            ini.write_text("version = 1\n\n" + self.preset + "\n", encoding="utf-8")
        except OSError as exc:
            self.app.notify(f"cannot write to {self._folder}: {exc.strerror or exc}", severity="error")
            return
        self.app.notify(f"{sh}\n{ini}", title="Written", timeout=6)

    def action_close(self) -> None:
        self.dismiss(None)
