"""Per-core CPU load and per-NUMA-node memory, drawn from a TelemetrySnapshot."""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from specdash.telemetry import CoreGroup, NumaNode, group_cores

_EIGHTHS = " ▁▂▃▄▅▆▇█"
_LEFT_EIGHTHS = " ▏▎▍▌▋▊▉█"


def hbar(fraction: float, width: int) -> str:
    """A horizontal bar `width` cells wide filled to `fraction`, in eighths of a cell."""
    if width <= 0:
        return ""
    eighths = round(max(0.0, min(fraction, 1.0)) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (_LEFT_EIGHTHS[part] if part else "")).ljust(width)


def human_bytes(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"


def human_count(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


class _LoadStyles:
    def __init__(self, widget: Widget, prefix: str):
        self.ok = widget.get_component_rich_style(f"{prefix}--ok")
        self.busy = widget.get_component_rich_style(f"{prefix}--busy")
        self.hot = widget.get_component_rich_style(f"{prefix}--hot")
        self.label = widget.get_component_rich_style(f"{prefix}--label")
        self.track = widget.get_component_rich_style(f"{prefix}--track")

    def for_load(self, percent: float) -> Style:
        return self.hot if percent >= 90 else self.busy if percent >= 60 else self.ok


class CpuView(Widget):
    """One horizontal bar per core while they fit one per row; past that a column per
    core (height = load); past the width, adjacent cores grouped (group_cores) into
    columns of their mean load, coloured by their busiest core."""

    COMPONENT_CLASSES = {"cpu--ok", "cpu--busy", "cpu--hot", "cpu--label", "cpu--track"}

    DEFAULT_CSS = """
    CpuView { height: 1fr; width: 1fr; }
    CpuView > .cpu--ok { color: $success; }
    CpuView > .cpu--busy { color: $warning; }
    CpuView > .cpu--hot { color: $error; }
    CpuView > .cpu--label { color: $text-muted; }
    CpuView > .cpu--track { color: $panel-lighten-2; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.loads: tuple[float, ...] = ()
        self.empty = "sampling…"  # what shows before (or without) any sample

    def update_loads(self, loads: Sequence[float]) -> None:
        if tuple(loads) != self.loads:
            self.loads = tuple(loads)
            self.refresh()

    def show_empty(self, why: str) -> None:
        """What to say while there are no loads (why there will be none)."""
        if why != self.empty:
            self.empty = why
            self.refresh()

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        styles = _LoadStyles(self, "cpu")
        if not self.loads:
            return Text(self.empty, styles.label)  # wrapped: it may be a sentence or two
        text = Text(no_wrap=True, overflow="crop")
        if len(self.loads) <= height:
            self._bars(text, self.loads, width, styles)
        else:
            self._columns(text, self.loads, width, height, styles)
        return text

    @staticmethod
    def _bars(text: Text, loads: Sequence[float], width: int, styles: _LoadStyles) -> None:
        label_w = len(str(len(loads) - 1))
        bar_w = max(width - label_w - 6, 1)
        for i, load in enumerate(loads):
            if i:
                text.append("\n")
            text.append(f"{i:>{label_w}} ", styles.label)
            _append_hbar(text, load / 100, bar_w, styles.for_load(load), styles.track)
            text.append(f" {load:3.0f}%", styles.label)

    @staticmethod
    def _columns(text: Text, loads: Sequence[float], width: int, height: int, styles: _LoadStyles) -> None:
        groups: list[CoreGroup] = group_cores(loads, max(width, 1))
        n = len(groups)
        col_w, gap = (2, 1) if n * 3 <= width else (1, 1) if n * 2 <= width else (1, 0)
        bar_h = max(height - 1, 1)
        cells = [_vertical(g.mean / 100, bar_h) for g in groups]
        for row in range(bar_h):
            for i, g in enumerate(groups):
                if i and gap:
                    text.append(" " * gap)
                text.append(cells[i][row] * col_w, styles.for_load(g.max))
            text.append("\n")
        used = n * col_w + (n - 1) * gap
        first, last = groups[0].label, groups[-1].label
        text.append(first + last.rjust(max(used - len(first), len(last) + 1)), styles.label)


def _vertical(fraction: float, height: int) -> list[str]:
    eighths = round(max(0.0, min(fraction, 1.0)) * height * 8)
    full, part = divmod(eighths, 8)
    cells = []
    for from_bottom in range(height - 1, -1, -1):
        cells.append("█" if from_bottom < full else _EIGHTHS[part] if from_bottom == full and part else " ")
    return cells


def _append_hbar(text: Text, fraction: float, width: int, style: Style, track: Style) -> None:
    bar = hbar(fraction, width).rstrip()
    text.append(bar, style)
    text.append("·" * (width - len(bar)), track)


class NumaView(Widget):
    """Used/total memory per NUMA node, with numa_hit/numa_miss under each node when
    there is a row to spare."""

    COMPONENT_CLASSES = {"numa--ok", "numa--busy", "numa--hot", "numa--label", "numa--track"}

    DEFAULT_CSS = """
    NumaView { height: 1fr; width: 1fr; }
    NumaView > .numa--ok { color: $success; }
    NumaView > .numa--busy { color: $warning; }
    NumaView > .numa--hot { color: $error; }
    NumaView > .numa--label { color: $text-muted; }
    NumaView > .numa--track { color: $panel-lighten-2; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.nodes: tuple[NumaNode, ...] = ()
        self.empty = "no memory information on this system"

    def update_nodes(self, nodes: Sequence[NumaNode]) -> None:
        if tuple(nodes) != self.nodes:
            self.nodes = tuple(nodes)
            self.refresh()

    def show_empty(self, why: str) -> None:
        """What to say while there are no nodes (why there will be none)."""
        if why != self.empty:
            self.empty = why
            self.refresh()

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        styles = _LoadStyles(self, "numa")
        nodes = self.nodes
        if not nodes:
            return Text(self.empty, styles.label)
        text = Text(no_wrap=True, overflow="crop")
        shown = nodes[: max(height, 1)]
        with_stats = len(nodes) * 2 <= height
        label_w = max(len(_node_label(n)) for n in shown)
        amounts = [f"{human_bytes(n.mem_used_bytes)}/{human_bytes(n.mem_total_bytes)}" for n in shown]
        if len(nodes) > len(shown):
            amounts[-1] += f" +{len(nodes) - len(shown)} more"
        amount_w = max(len(a) for a in amounts) + 1
        for i, node in enumerate(shown):
            if i:
                text.append("\n")
            amount = amounts[i].rjust(amount_w)
            bar_w = max(width - label_w - 1 - len(amount), 1)
            text.append(_node_label(node).ljust(label_w) + " ", styles.label)
            _append_hbar(text, node.used_fraction, bar_w, styles.for_load(node.used_fraction * 100), styles.track)
            text.append(amount, styles.label)
            if with_stats and node.numastat:
                st = node.numastat
                hit, miss = st.numa_hit or 0, st.numa_miss or 0
                line = f"{'':{label_w}} hit {human_count(hit)} miss {human_count(miss)}"
                if hit + miss and len(line) + 9 <= width:
                    line += f" ({miss / (hit + miss):.1%})"
                text.append("\n" + line, styles.label)
        return text


def _node_label(node: NumaNode) -> str:
    # The synthetic /proc/meminfo node's long label would eat the bar; the panel title
    # says there is no NUMA information.
    return "mem" if node.source.startswith("proc") else node.label
