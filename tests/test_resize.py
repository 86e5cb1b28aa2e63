"""Resize storms and tiny terminals: the real dashboard on SmolLM2-135M resized 100 times
between 40x12 and 250x70 while it generates, and the status line's fitting at every
width.

"Room" for the numbers: the status line is one row of the terminal's full width, with
one column of padding each side. It has room when the compact form fits in that:
state icon, K, tok/s and acceptance, `▶ │ K 3 │ 17.3 tok/s │ acc 45%`, at most
status.MIN_COLUMNS (40) columns whatever the values. So at 40 columns and wider the three
numbers are always on screen, with their labels; what gives way first is the content
class, then the experts and the temperature, the model names, and the state's word."""

from __future__ import annotations

import random
import re
import time

import pytest
from rich.cells import cell_len
from test_tui_engine import Recorder, steps, until
from test_tui_support import FixedSampler, load_replay, sync

from specdash.contract import events as E
from specdash.engine.settings import EngineSettings
from specdash.sources.session import Session
from specdash.sources.embedded import WorkItem
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.reducer import DashState
from specdash.tui.status import MIN_COLUMNS, PADDING, SEPARATOR, StatusLine, status_parts

PROMPT = "Write the numbers from 1 to 400, separated by commas."
K = re.compile(r"(?:^|│ )K (\d+|\?)(?: (?:fixed|adaptive|auto))?(?: │|$)")
TPS = re.compile(r"(?:^|│ )(\d+(?:\.\d)?|–) tok/s(?: │|$)")
ACC = re.compile(r"(?:^|│ )acc (\d+%|–)(?: │|$)")


def numbers(line: str) -> tuple[str, str, str] | None:
    k, tps, acc = K.search(line), TPS.search(line), ACC.search(line)
    return (k.group(1), tps.group(1), acc.group(1)) if k and tps and acc else None


# --- the fitting, at every width --------------------------------------------------------


def states() -> dict[str, DashState]:
    """A replayed real run in several situations: running with long names, adaptive,
    a MoE target at temperature, paused, error, a replay's long label, huge figures."""
    events = [E.StatusEvent("ready"), *load_replay()]
    out = {}
    base = DashState()
    for ev in events[:60]:
        base.feed(ev)
    out["running"] = base
    settings = base.settings
    assert settings is not None

    def variant(name: str, *extra: E.Event, state: str | None = None) -> None:
        st = DashState()
        for ev in events[:60]:
            st.feed(ev)
        for ev in extra:
            st.feed(ev)
        if state:
            st.state = state
        out[name] = st

    import dataclasses

    long_names = dataclasses.replace(settings, target="/models/Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf",
                                     drafter="chain: lookup → suffix → qwen2.5-coder-0.5b-instruct-q8_0",
                                     temperature=0.7, experts_active=8, expert_count=128)
    variant("long names, MoE, temperature", long_names)
    variant("adaptive, K=64", dataclasses.replace(settings, adaptive=True, k=64))
    variant("error", state="error")
    variant("paused", dataclasses.replace(settings, paused=True), state="paused")
    variant("replay", E.ReplayEvent("/recordings/a-very-long-recording-name.jsonl", 754.0, 3599.0, 16.0, False))
    return out


@pytest.mark.parametrize("name", list(states()))
def test_the_three_numbers_fit_at_every_width_from_min_columns(name):
    state = states()[name]
    for width in range(MIN_COLUMNS, 251):
        parts, _ = status_parts(state, ("", ""), width)
        line = SEPARATOR.join(parts)
        assert cell_len(line) + PADDING <= width, (width, line)
        assert numbers(line) is not None, (width, line)
        if width >= 120:
            assert len(parts) > 4, (width, line)  # the models and the state's word are back


def test_what_40_columns_keep():
    state = states()["running"]
    line = SEPARATOR.join(status_parts(state, ("", ""), 40)[0])
    assert re.fullmatch(r"▶ │ K \d+( fixed)? │ \d+(\.\d)? tok/s │ acc \d+%", line), line


def test_the_widest_compact_line_fits_min_columns():
    worst = f"✖{SEPARATOR}K 64 auto{SEPARATOR}99999 tok/s{SEPARATOR}acc 100%"
    assert cell_len(worst) + PADDING == MIN_COLUMNS


def test_wide_forms_are_unchanged():
    """The compact forms only come in when nothing else fits: the 80, 100 and 120-column
    lines of the snapshots keep their models and wording."""
    state = states()["running"]
    for width in (80, 100, 120):
        parts, _ = status_parts(state, ("", ""), width)
        assert parts[0] == "▶ running" and " ← " in parts[1] and re.search(r"K \d+ fixed", parts[2]), parts


# --- the real dashboard in a resize storm -------------------------------------------------


def sizes(n: int = 60, seed: int = 13) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    fixed = [(40, 12), (250, 70), (80, 24), (119, 35), (120, 36), (40, 70), (250, 12), (41, 13), (100, 30)]
    return fixed + [(rng.randint(40, 250), rng.randint(12, 70)) for _ in range(n - len(fixed))]


async def resize(pilot, width: int, height: int) -> None:
    """pilot.resize_terminal without its wait for an idle CPU: with the engine generating
    in this process the CPU is never idle and every such wait runs to its 1 s limit.
    Waiting for every widget to have processed its messages is what the checks need."""
    from textual.events import Resize
    from textual.geometry import Size

    size = Size(width, height)
    app = pilot.app
    app._driver._size = size  # what resize_terminal does for the headless driver
    app.post_message(Resize(size, size))
    status = app.query_one(StatusLine)
    for _ in range(3000):  # a liveness bound: the layout for the new size is done
        await pilot.pause(0.01)  # every pending message processed, then a short sleep
        if app.size == size and status.region.width == width and status.region.bottom == height - 1:
            return
    raise AssertionError(f"the layout never reached {width}x{height}: status at {status.region}")


@sync
async def test_resize_storm_during_generation(tmp_path, smol_path):
    recorders: list[Recorder] = []

    def factory(settings, progress):
        recorders.append(Recorder(Session(settings, progress=progress)))
        return recorders[-1]

    settings = EngineSettings(adaptive=False, target=str(smol_path), draft="lookup", k=3, threads=1, ctx=2048, max_tokens=400)
    # A workload cycles for ever: the engine is generating through the whole storm.
    opts = DashboardOptions(settings=settings, workload=[WorkItem("count", PROMPT)],
                            screenshots_dir=str(tmp_path / "shots"), refresh=0.25)
    app = SpecdashApp(opts, session_factory=factory, sampler=FixedSampler(), hints=lambda: [], flush_interval=0.1)
    checked = 0
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: recorders and len(steps(recorders[0])) >= 5
                    and app.stats.tokens_per_s is not None and app.stats.recent_counters().acceptance_rate is not None,
                    "steps with drafts, tok/s and acceptance measured")
        status = app.query_one(StatusLine)
        n_steps = len(steps(recorders[0]))
        t0 = time.perf_counter()
        for width, height in sizes():
            await resize(pilot, width, height)
            assert app.size == (width, height)
            # On screen: one row, inside the terminal, as wide as it.
            region = status.region
            assert region.height == 1 and region.bottom <= height and region.width == width, (width, height, region)
            line = str(status.render())
            assert cell_len(line) + PADDING <= width, (width, height, line)
            assert numbers(line) is not None, (width, height, line)
            if " ← " in line:
                # The model names give way before the state's word and the numbers' full
                # wording: while they show, so do "running" and "K 3 fixed".
                assert "running" in line and "K 3 fixed" in line, (width, height, line)
            else:  # at 80 columns and more they always fit (shortened to 8 and 6 cells)
                assert width < 80, (width, height, line)
            checked += 1
        print(f"\n{checked} resizes in {time.perf_counter() - t0:.1f}s")
        assert app.engine_state == "running" and app.return_code is None
        await until(pilot, lambda: len(steps(recorders[0])) > n_steps + 5, "generation went on through the storm")
    assert checked == len(sizes())
    assert not app._exception  # nothing raised inside the app


def test_under_auto_the_status_line_names_the_source_that_drafted():
    """auto chooses the source each step: the status line says which drafted the last
    one, in full where there is room and the source alone where there is not."""
    state = DashState()
    state.feed(E.StatusEvent("running"))
    state.feed(E.SettingsEvent("engine", "qwen2.5-coder-1.5b", "auto: lookup, suffix, qwen2.5-coder-0.5b",
                               draft="auto", k=4, adaptive=True))

    def line(width: int) -> str:
        return SEPARATOR.join(status_parts(state, ("", ""), width)[0])

    assert line(120).split(" │ ")[1] == "qwen2.5-coder-1.5b ← auto"  # no step yet: nothing drafted
    for drafter, word in (("lookup", "lookup"), ("suffix", "suffix"), ("draft", "model"), ("none", "plain")):
        state.feed(E.StepEvent(1, 4, drafter, 4 if drafter != "none" else 0, 2, [1, 2, 3], ["a", "b", "c"],
                               [True, True, False], 1.0, 2.0, 0.1, 3, 3, 2.0))
        assert f"qwen2.5-coder-1.5b ← auto·{word}" in line(120), line(120)
        narrow = line(80)
        assert cell_len(narrow) + PADDING <= 80 and re.search(rf"← (auto·)?{word}\b", narrow), narrow
