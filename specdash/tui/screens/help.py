"""`?`: every control (with why it is unavailable, when it is) and what each number means."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

METRICS = (
    ("acceptance", "accepted / drafted tokens over the last 128 steps (llama.cpp's definition)"),
    ("mean len", "1 + accepted / drafts: tokens a drafting step commits (vLLM's definition)"),
    ("per position", "share of drafts that reached position i whose token i was accepted"),
    ("tok/s", "decode tokens per second over the last 2 s of decoding; prefill excluded. After a "
              "request ends it holds that request's: the whole run's where the source reports its end "
              "(specdash's engine; without each first step's warm-up, as plain is timed), else its "
              "last 2 s (status line and title alike)"),
    ("plain", "tok/s of steps at K=0 with no draft (the engine's calibration steps, or K=0)"),
    ("health", "one word from four rules over the source's recent readings: healthy, collapse (acceptance "
               "length far below its running median, or below [health] collapse_floor), repetitive (acceptance "
               "near 1.0 for a sustained stretch), stalled (decode rate far below its running median while "
               "requests run), losing (slower than plain decoding); thresholds in the config's [health]"),
    ("proc / dash", "CPU of the whole process / of the dashboard's own threads (100% = 1 core)"),
    ("text colours", "draft-accepted tokens vs tokens the target produced itself"),
)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 110; height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    """

    BINDINGS = [
        Binding("escape,question_mark,q", "close", "Close", id="help.close"),
    ]

    def __init__(self, controls: list[tuple[str, str, str]], notes: list[tuple[str, str]] | None = None):
        """controls: (key, description, "" or why it is unavailable now); notes: (name,
        text) about how the source runs, e.g. ("weights", "repack off (AMX crashed in a probe)")."""
        super().__init__()
        self._controls = controls
        self._notes = notes or []

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold")
        keys.add_column()
        for key, description, why_not in self._controls:
            line = Text(description)
            if why_not:
                line.append(f"  (unavailable: {why_not})", "dim")
            keys.add_row(key, line)
        metrics = Table.grid(padding=(0, 2))
        metrics.add_column(style="bold")
        metrics.add_column()
        for name, meaning in METRICS:
            metrics.add_row(name, meaning)
        with VerticalScroll() as box:
            box.border_title = "Help — Esc to close"
            yield Static(Text("Controls", style="bold underline"))
            yield Static(keys)
            yield Static(Text("\nWhat the numbers mean", style="bold underline"))
            yield Static(metrics)
            if self._notes:
                notes = Table.grid(padding=(0, 2))
                notes.add_column(style="bold")
                notes.add_column()
                for name, text in self._notes:
                    notes.add_row(name, text)
                yield Static(Text("\nHow this source runs", style="bold underline"))
                yield Static(notes)
            yield Static(Text("\nCtrl+P opens the command palette (every control, and the theme).", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)
