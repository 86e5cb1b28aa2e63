"""The drawing widgets on their own, at sizes an operator meets: 2 to 192 cores, one or
several NUMA nodes, long text in a small panel."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Static
from textual_hires_canvas import Canvas

from specdash.telemetry import read_numa_nodes
from specdash.tui.themes import VARIABLE_DEFAULTS
from specdash.tui.widgets.plots import Plot, Series, layout_labels
from specdash.tui.widgets.generation import GenerationView
from specdash.tui.widgets.system import CpuView, NumaView
from test_tui_support import TWO_NODE, sync


class Host(App):
    def __init__(self, widget):
        super().__init__()
        self.widget = widget

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(VARIABLE_DEFAULTS)

    def compose(self) -> ComposeResult:
        yield self.widget


async def rendered(widget, size, feed) -> list[str]:
    app = Host(widget)
    async with app.run_test(size=size) as pilot:
        feed(widget)
        await pilot.pause()
        return [widget.render_line(y).text for y in range(widget.size.height)]


@sync
async def test_two_cores_get_a_bar_each_with_their_load():
    lines = await rendered(CpuView(), (30, 3), lambda w: w.update_loads([25.0, 100.0]))
    assert lines[0].startswith("0 ") and lines[0].rstrip().endswith("25%")
    assert lines[1].startswith("1 ") and "█" * 20 in lines[1] and lines[1].rstrip().endswith("100%")


@sync
async def test_192_cores_fold_into_labelled_columns():
    loads = [100.0 if i < 96 else 0.0 for i in range(192)]
    lines = await rendered(CpuView(), (24, 5), lambda w: w.update_loads(loads))
    assert len(lines) == 5
    # 24 columns for 192 cores: groups of 8, busy half full height, idle half empty
    assert lines[0].startswith("█" * 12) and lines[0][12:].strip() == ""
    assert lines[-1].startswith("0") and lines[-1].rstrip().endswith("184-191")


@sync
async def test_numa_nodes_with_their_counters_when_rows_allow():
    nodes = read_numa_nodes(TWO_NODE)
    lines = await rendered(NumaView(), (40, 4), lambda w: w.update_nodes(nodes))
    assert lines[0].startswith("node0 ") and lines[0].rstrip().endswith("8.9G/11.6G")
    assert "hit 48.2M miss 0" in lines[1]
    assert lines[2].startswith("node1 ") and "hit 9.8M miss 1.8M" in lines[3]
    tight = await rendered(NumaView(), (40, 2), lambda w: w.update_nodes(nodes))
    assert tight[0].startswith("node0") and tight[1].startswith("node1")  # no room: counters go


@sync
async def test_a_machine_without_numa_sysfs_shows_its_memory(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 2097152 kB\nMemFree: 1048576 kB\n")
    nodes = read_numa_nodes(tmp_path)
    lines = await rendered(NumaView(), (30, 2), lambda w: w.update_nodes(nodes))
    assert lines[0].startswith("mem ") and lines[0].rstrip().endswith("1.0G/2.0G")


async def plotted(size, feed) -> tuple[Plot, list[str]]:
    """The plot's data canvas, one string per row, after `feed(plot)`."""
    plot = Plot()
    app = Host(plot)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        feed(plot)
        await pilot.pause()
        canvas = plot.query_one("#plot", Canvas)
        return plot, ["".join(row) for row in canvas._buffer]


@sync
async def test_plot_keeps_a_fixed_axis_whatever_the_data():
    """Acceptance lives on 0..1: data at 0.2..0.3 must not be stretched to fill it."""
    plot, rows = await plotted((40, 12), lambda p: p.show(
        [Series((0.0, 10.0, 20.0), (0.2, 0.3, 0.25), "chart-line")], x_limits=(0.0, 20.0), y_limits=(0.0, 1.0)))
    assert (plot._y_min, plot._y_max) == (0.0, 1.0)
    inner = rows[1:-1]
    drawn = [i for i, row in enumerate(inner) if row[1:-1].strip()]
    # 0.2..0.3 of the height, from the bottom: only the lowest third of the rows
    assert drawn and min(drawn) >= len(inner) * 0.6, rows


@sync
async def test_markers_draw_a_labelled_line_where_the_change_happened():
    plot, rows = await plotted((60, 12), lambda p: p.show(
        [Series((0.0, 60.0), (1.0, 1.0), "chart-line")], x_limits=(0.0, 60.0), y_limits=(0.0, 2.0),
        markers=[(30.0, "K=8"), (31.0, "draft=lookup")]))
    x, _ = plot.get_pixel_from_coordinate(30.0, 0)
    assert rows[1][x:x + 4] == "│K=8"
    # the second label would overlap the first: it moves down a row
    x2, _ = plot.get_pixel_from_coordinate(31.0, 0)
    assert rows[2][x2 + 1:x2 + 13] == "draft=lookup"
    assert all(row[x] in "│K" for row in rows[1:-1] if row[x] != " ")


def drawn(lines, placed, columns, rows) -> list[str]:
    """The marker lines and the placed labels on a blank grid, one string per row."""
    grid = {r: [" "] * columns.stop for r in rows}
    for px, _ in lines:
        for r in rows:
            grid[r][px] = "│"
    for label in placed:
        for i, ch in enumerate(label.text):
            grid[label.row][label.col + i] = ch
    return ["".join(grid[r]).rstrip() for r in rows]


def test_labels_of_fast_swaps_stack_instead_of_running_together():
    lines = [(10, "K=12"), (11, "adaptive on"), (12, "T=0.7")]
    placed, dropped = layout_labels(lines, range(1, 40), range(1, 4))
    assert dropped == 0
    assert drawn(lines, placed, range(1, 40), range(1, 4)) == [
        "          │K=12",
        "          ││adaptive on",
        "          │││T=0.7"]
    # every label whole, a blank cell (or a line) between any two on a row
    for a in placed:
        for b in placed:
            if a is not b and a.row == b.row:
                assert a.end + 1 < b.col or b.end + 1 < a.col


def test_labels_that_do_not_fit_are_shortened_then_dropped_with_a_count():
    columns, rows = range(1, 40), range(1, 3)
    lines = [(10, "K=12"), (11, "adaptive on"), (16, "draft suffix"), (17, "T=0.7")]
    placed, dropped = layout_labels(lines, columns, rows)
    # "draft suffix" finds room on the top row after K=12; the line of T=0.7 runs through a
    # label on both rows: the one below is cut short of it, with "…"
    assert drawn(lines, placed, columns, rows) == [
        "          │K=12 │draft suffix",
        "          ││adap…│T=0.7"]
    assert dropped == 0
    # One row, lines a cell apart: no room to cut to. The first label stays whole, the
    # others are dropped and counted at the right end.
    lines = [(10, "K=12"), (11, "adaptive on"), (12, "T=0.7")]
    placed, dropped = layout_labels(lines, columns, range(1, 2))
    assert drawn(lines, placed, columns, range(1, 2)) == ["          │K=12" + " " * 17 + "+2 swaps"]
    assert dropped == 2
    # ... and where even the count has no room, the rightmost label gives way to it.
    placed, dropped = layout_labels(lines, range(1, 16), range(1, 2))
    assert [p.text for p in placed] == ["+3 swaps"] and dropped == 3


def test_a_label_at_the_right_edge_goes_left_of_its_line():
    placed, dropped = layout_labels([(36, "adaptive on")], range(1, 39), range(1, 4))
    assert dropped == 0 and placed[0].text == "adaptive on" and placed[0].end == 35


def test_labels_avoid_the_row_with_data():
    data = {1: 5, 2: 0, 3: 1}  # cells of data each row would cover
    placed, _ = layout_labels([(10, "K=12")], range(1, 40), range(1, 4), lambda r, a, b: data[r])
    assert placed[0].row == 2


@sync
async def test_three_swaps_within_a_second_keep_every_label_readable():
    labels = ["K=12", "adaptive on", "T=0.7"]
    plot, rows = await plotted((60, 12), lambda p: p.show(
        [Series((0.0, 60.0), (1.0, 1.0), "chart-line")], x_limits=(0.0, 60.0), y_limits=(0.0, 2.0),
        markers=[(30.0, labels[0]), (30.4, labels[1]), (30.8, labels[2])]))
    text = "\n".join(rows)
    for label in labels:
        assert label in text, rows
    assert "K=12ad" not in text and "ixtive" not in text


@sync
async def test_plot_redraws_only_when_its_data_changed():
    def feed(plot):
        data = [Series((0.0, 1.0), (0.5, 0.6), "chart-line")]
        plot.show(data, y_limits=(0.0, 1.0))
        first = plot._datasets
        plot.show(data, y_limits=(0.0, 1.0))
        assert plot._datasets is first  # same key: nothing cleared or rebuilt
        plot.show([Series((0.0, 1.0), (0.5, 0.7), "chart-line")], y_limits=(0.0, 1.0))
        assert plot._datasets is not first

    await plotted((30, 8), feed)


@sync
async def test_generation_shows_the_newest_lines_and_keeps_provenance_across_redraws():
    view = GenerationView()
    app = Host(view)
    async with app.run_test(size=(20, 3)) as pilot:
        view.clear()  # drops the "Starting the engine…" note
        for i in range(40):
            view.append([f"line {i}", "\n"], [i % 2 == 0, False])
        await pilot.pause()
        assert [view.render_line(y).text.rstrip() for y in range(3)] == ["line 38", "line 39", ""]
        draft = view.get_component_rich_style("generation--draft").color

        def colours(y):
            return {seg.style.color for seg in view.render_line(y) if seg.text.strip() and seg.style}

        assert draft in colours(0) and draft not in colours(1)  # line 38 came from the draft
        view.append(["more"], [True])  # the finished paragraphs come from the cache
        await pilot.pause()
        assert view.render_line(2).text.rstrip() == "more" and draft in colours(0) and draft in colours(2)


@sync
async def test_generation_draws_carriage_returns_and_form_feeds_in_coloured_text():
    """CRLF code or a sampled byte token: rich's wrap splits on \\r, \\v and \\f but leaves
    them out of its line ranges, and a provenance span across one crashed the view
    (IndexError in Text.divide; found with a recurrent fixture sampling at T=0.7)."""
    view = GenerationView()
    app = Host(view)
    async with app.run_test(size=(20, 4)) as pilot:
        view.clear()
        view.append(["def f():\r", "\n", "    return 1 \x0b\x0c", " # draft words here"], [False, False, True, True])
        await pilot.pause()
        lines = [view.render_line(y).text.rstrip() for y in range(4)]
        assert lines[0] == "def f():" and lines[1].startswith("    return 1"), lines
        assert len(view.text) == len("def f():\r\n    return 1 \x0b\x0c # draft words here")  # one for one


def test_generation_trims_old_text_but_keeps_run_positions():
    view = GenerationView()
    view.refresh = lambda *a, **k: None  # not mounted
    for i in range(3000):
        view.append([f"t{i:04d} "], [i % 3 == 0])
    assert len(view.text) <= 12_000
    assert view.text.endswith("t2999 ")
    # every kept run still covers exactly the tokens of its provenance
    runs = list(zip(view._run_starts, view._run_ends, view._run_draft, strict=True))
    for start, end, drafted in runs[1:]:  # the first may begin mid-token after the cut
        tokens = [int(t[1:]) for t in view.text[start - view._dropped : end - view._dropped].split()]
        assert tokens and all((n % 3 == 0) == drafted for n in tokens)


@sync
async def test_draft_picker_scans_the_configured_folders_and_greys_what_cannot_draft(
        tmp_path, monkeypatch, target_path, draft_path, gemma_path):
    """No stored scan: the picker scans on open (a thread worker), then lists what it
    found for this target: the 0.5B selectable, Gemma greyed with the failed rule."""
    from textual.widgets import Label

    from specdash.tui.screens.draft_picker import DraftPicker

    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no llama.cpp / LM Studio / Ollama caches
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    for p in (draft_path, gemma_path):
        (shelf / p.name).symlink_to(p)
    picker = DraftPicker("lookup", str(target_path), model_dirs=(str(shelf),))
    app = Host(Static())
    async with app.run_test(size=(110, 30)) as pilot:
        await app.push_screen(picker)
        for _ in range(500):
            note = str(picker.query_one("#scan-note", Label).render())
            if "found" in note:
                break
            await pilot.pause(0.02)
        assert note == "2 models found in 1 folder, 2 usable as drafts here (1 through translation)", note
        usable = [c for c in picker.choices if c.available and c.spec.endswith(".gguf")]
        # gemma3-270m fails llama.cpp's rules (vocab type) but drafts through translation, ranked after.
        assert [c.label for c in usable] == ["qwen2.5-coder-0.5b", "gemma3-270m"]
        assert usable[1].description.startswith("#2 translated (vocab type differs)")
