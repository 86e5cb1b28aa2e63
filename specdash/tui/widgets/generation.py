"""The streaming text, coloured by provenance, always showing its newest lines."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from rich.style import Style
from rich.text import Span, Text
from textual.strip import Strip
from textual.widget import Widget

# Text kept per prompt. Older text scrolls off the top anyway; the cap keeps memory and
# the trim cost flat however long a run gets.
MAX_CHARS = 12_000
KEEP_CHARS = 8_000


# Control characters (CR, VT, FF, bell, backspace: every C0 code but tab and newline
# tested) that rich's Text.wrap drops from its line ranges: a span across one makes
# Text.divide index past its last line (IndexError, the view dies). Models do emit them
# (CRLF code, a sampled byte token); shown as a space, one character for one, so the
# provenance runs keep their offsets.
_UNWRAPPABLE = {c: " " for c in (*range(32), 127) if chr(c) not in "\t\n"}

class GenerationView(Widget):
    """Uses the Line API with the wrapped lines of each finished paragraph cached: text
    only grows at its end, so a redraw re-wraps just the paragraph being written.
    (Returning a Text from render() cost ~14 ms per redraw at 160x48, mostly Textual
    converting every styled span; this widget redraws several times a second while the
    engine wants the CPU.)"""

    COMPONENT_CLASSES = {
        "generation--draft",
        "generation--translated",
        "generation--target",
        "generation--note",
        "generation--error",
    }

    DEFAULT_CSS = """
    GenerationView { height: 1fr; width: 1fr; }
    GenerationView > .generation--draft { color: $draft-token; }
    GenerationView > .generation--translated { color: $translated-token; }
    GenerationView > .generation--target { color: $target-token; }
    GenerationView > .generation--note { color: $text-muted; }
    GenerationView > .generation--error { color: $text-error; text-style: bold; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._text = ""
        self._dropped = 0  # characters trimmed from the front: positions below are absolute
        self._run_starts: list[int] = []  # provenance runs (absolute positions), adjacent ones differ
        self._run_ends: list[int] = []
        self._run_draft: list[bool | str] = []  # False target, True draft, "xvocab" translated draft
        self._note: tuple[str, str] | None = ("Starting the engine…", "note")
        self._version = 0
        self._frame_key: tuple | None = None
        self._strips: list[Strip] = []
        self._paragraphs: dict[tuple, list[Strip]] = {}

    @property
    def text(self) -> str:
        return self._text

    def clear(self) -> None:
        self._text = ""
        self._dropped = 0
        self._run_starts, self._run_ends, self._run_draft = [], [], []
        self._paragraphs = {}
        self._note = None
        self._changed()

    def show_note(self, message: str, kind: str = "note") -> None:
        """A line under the text (loading progress, an error); "" removes it."""
        self._note = (message, kind) if message else None
        self._changed()

    def append(self, pieces: Sequence[str], from_draft: Sequence[bool | str]) -> None:
        """from_draft: per piece False (the target's), True (a draft's) or "xvocab" (a
        draft translated from another vocabulary: its own colour)."""
        for piece, drafted in zip(pieces, from_draft, strict=True):
            if not piece:
                continue
            piece = piece.translate(_UNWRAPPABLE)
            start = self._dropped + len(self._text)
            self._text += piece
            end = start + len(piece)
            if self._run_draft and self._run_draft[-1] == drafted:
                self._run_ends[-1] = end
            else:
                self._run_starts.append(start)
                self._run_ends.append(end)
                self._run_draft.append(drafted)
        if len(self._text) > MAX_CHARS:
            self._trim()
        self._changed()

    def _changed(self) -> None:
        self._version += 1
        self.refresh()

    def _trim(self) -> None:
        cut = len(self._text) - KEEP_CHARS
        newline = self._text.find("\n", cut)
        if 0 <= newline < cut + 200:  # start at a line boundary when one is near
            cut = newline + 1
        self._text = self._text[cut:]
        self._dropped += cut
        keep = bisect_right(self._run_ends, self._dropped)
        del self._run_starts[:keep], self._run_ends[:keep], self._run_draft[:keep]

    # --- drawing -----------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        key = (self._version, width, height, self.app.theme)
        if key != self._frame_key:
            self._frame_key = key
            self._strips = self._tail_lines(width, height)
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, self.rich_style)

    def _tail_lines(self, width: int, height: int) -> list[Strip]:
        if width <= 0 or height <= 0:
            return []
        base = self.rich_style
        styles: dict[bool | str, Style] = {
            False: self.get_component_rich_style("generation--target"),
            True: self.get_component_rich_style("generation--draft"),
            "xvocab": self.get_component_rich_style("generation--translated"),
        }
        lines: list[Strip] = []
        if self._note:
            message, kind = self._note
            lines = self._wrap(Text(message, self.get_component_rich_style(f"generation--{kind}")), width, base)
        used: dict[tuple, list[Strip]] = {}
        end = len(self._text)
        while self._text and len(lines) < height:
            start = self._text.rfind("\n", 0, end) + 1
            finished = end < len(self._text)  # a newline follows: it cannot change any more
            key = (self._dropped + start, self._dropped + end, width, self.app.theme)
            para = self._paragraphs.get(key) if finished else None
            if para is None:
                para = self._wrap(self._paragraph(start, end, styles), width, base)
            if finished:
                used[key] = para
            lines = para + lines
            if start == 0:
                break
            end = start - 1
        self._paragraphs = used  # what scrolled away is dropped
        return lines[-height:]

    def _paragraph(self, start: int, end: int, styles: dict[bool | str, Style]) -> Text:
        a, b = self._dropped + start, self._dropped + end
        first = max(bisect_right(self._run_ends, a), 0)
        spans = []
        for i in range(first, len(self._run_starts)):
            if self._run_starts[i] >= b:
                break
            spans.append(Span(max(self._run_starts[i], a) - a, min(self._run_ends[i], b) - a, styles.get(self._run_draft[i], styles[True])))
        return Text(self._text[start:end], spans=spans)

    def _wrap(self, text: Text, width: int, base: Style) -> list[Strip]:
        console = self.app.console
        return [
            Strip(list(line.render(console)), line.cell_len).apply_style(base).extend_cell_length(width, base)
            for line in text.wrap(console, width, overflow="fold")
        ]
