"""Snapshots of the dashboard driven by a recorded engine run (tests/fixtures/replay_*.jsonl)
and a fake 2-node sysfs tree. Nothing on screen depends on the clock or the machine: the
charts are functions of the recorded events, telemetry is fixed, the refresh timer fires
once. Update with `pytest --snapshot-update` after checking the new pictures."""

from __future__ import annotations

import pytest

from test_tui_support import FailingSession, ReplaySession, load_replay, replay_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def themed_host(screen):
    """A bare app in the dashboard's theme showing one screen (a dialog on its own)."""
    from textual.app import App

    from specdash.tui.themes import VARIABLE_DEFAULTS, load_themes

    class Host(App):
        def get_theme_variable_defaults(self):
            return dict(VARIABLE_DEFAULTS)

        def on_mount(self):
            for theme in load_themes().values():
                self.register_theme(theme)
            self.theme = "specdash-dark"
            self.push_screen(screen)

    return Host()

N_STEPS = sum(1 for ev in load_replay() if type(ev).__name__ == "StepEvent")


async def replayed(pilot) -> None:
    app = pilot.app
    for _ in range(600):
        if app.stats.total.steps == N_STEPS and app.engine_state == "running" and app.panels_current:
            break
        await pilot.pause(0.02)
    assert app.stats.total.steps == N_STEPS, "the replay did not reach the screen"
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_dashboard(snap_compare, size):
    assert snap_compare(replay_app(), terminal_size=size, run_before=replayed)


def test_dashboard_light_theme_100x30(snap_compare):
    assert snap_compare(replay_app(theme="specdash-light"), terminal_size=(100, 30), run_before=replayed)


def test_help_screen(snap_compare):
    assert snap_compare(replay_app(), terminal_size=(100, 30), run_before=replayed, press=["question_mark"])


def test_draft_picker(snap_compare, tmp_path, monkeypatch, target_path, draft_path, gemma_path, smol_path):
    """The picker on real models found on disk: the default pair's 0.5B ranked usable, the
    other tokenizers greyed with the rule they fail."""
    from specdash.models.scan import scan
    from specdash.tui.screens.draft_picker import DraftPicker

    monkeypatch.setenv("SPECDASH_CACHE", str(tmp_path / "cache"))  # nothing cached: the same list anywhere
    monkeypatch.setenv("HOME", str(tmp_path))  # the shelf shows as ~/models on any machine
    shelf = tmp_path / "models"
    shelf.mkdir()
    for p in (draft_path, gemma_path, smol_path):
        (shelf / p.name).symlink_to(p)
    result = scan([shelf], use_cache=False)

    picker = DraftPicker("lookup", str(target_path), scan_result=result, scan_on_open=False)
    assert snap_compare(themed_host(picker), terminal_size=(110, 30))


def test_engine_error_is_shown(snap_compare):
    async def failed(pilot) -> None:
        for _ in range(300):
            if pilot.app.engine_state == "error" and pilot.app.panels_current:
                break
            await pilot.pause(0.02)
        assert pilot.app.engine_state == "error"

    app = replay_app(session_factory=lambda s, p: FailingSession(s, p))
    assert snap_compare(app, terminal_size=(80, 24), run_before=failed)


def test_sweep_view(snap_compare):
    """The K sweep view with a finished sweep: points with error bars across rounds, the
    plain reference line, the best K marked, the table."""
    from specdash.tuning.sweep import Sweep
    from specdash.tui.screens.sweep import SweepScreen
    from test_sweep import BEFORE, run_through

    sweep = Sweep("p", BEFORE, ks=[0, 2, 4, 8, 12, 16, 24], rounds=2, max_tokens=96)
    run_through(sweep, {0: [20.0, 22.0], 2: [24.0, 27.0], 4: [29.0, 31.0], 8: [33.0, 36.0],
                        12: [34.0, 37.5], 16: [33.0, 35.0], 24: [28.0, 31.0]})

    assert snap_compare(themed_host(SweepScreen(sweep)), terminal_size=(120, 36))


def test_sweep_view_two_temperatures(snap_compare):
    """The sweep at T=0 and T=0.7 with whatif's predictions: a series per temperature
    (colour and marker, in a legend), the predicted points by the T=0 one only, a T
    column, best K per temperature, and the note that T>0 points are samples."""
    import dataclasses

    from specdash.tuning.sweep import Sweep
    from specdash.tui.screens.sweep import SweepScreen
    from test_sweep import BEFORE, run_through

    before = dataclasses.replace(BEFORE, temperature=0.0)
    sweep = Sweep("p", before, ks=[0, 4, 8, 16], temps=[0.0, 0.7], rounds=2, max_tokens=96)
    sweep.predicted, sweep.predicted_from = {0: (24.0, None), 4: (38.0, 0.7), 8: (44.0, 0.65),
                                             16: (41.0, 0.6)}, "whatif on profile here"
    speeds = {(0, 0.0): [20.0, 22.0], (4, 0.0): [29.0, 31.0], (8, 0.0): [33.0, 36.0], (16, 0.0): [33.0, 35.0],
              (0, 0.7): [19.0, 20.0], (4, 0.7): [24.0, 27.0], (8, 0.7): [25.0, 26.0], (16, 0.7): [20.0, 23.0]}
    accepted = {(4, 0.0): 6, (8, 0.0): 6, (16, 0.0): 5, (4, 0.7): 4, (8, 0.7): 3, (16, 0.7): 2}
    run_through(sweep, speeds, accepted)

    assert snap_compare(themed_host(SweepScreen(sweep)), terminal_size=(120, 36))


def test_markers_at_the_hot_swaps(snap_compare):
    """Every hot-swap of the recording (K 4 -> 6 -> 2) as a labelled vertical line on the
    three time charts."""
    async def replayed_then_settled(pilot) -> None:
        await replayed(pilot)
        await pilot.pause(0.3)
        pilot.app._update_panels()
        await pilot.pause(0.3)

    assert snap_compare(replay_app(), terminal_size=(140, 40), run_before=replayed_then_settled)


def three_fast_swaps() -> list:
    """The recording with three hot-swaps inserted within one second of decode time
    (K=12, adaptive on, T=0.7: keys pressed in quick succession), 40 steps after its last
    K change; the steps after them run at K=12, adaptively."""
    import dataclasses

    from specdash.contract.events import SettingsEvent, StepEvent

    events = load_replay()
    last_swap = max(i for i, ev in enumerate(events) if isinstance(ev, SettingsEvent))
    at = last_swap + 40
    settings = events[last_swap]
    swaps = [dataclasses.replace(settings, k=12, command="k=12")]
    swaps.append(dataclasses.replace(swaps[-1], adaptive=True, command="adaptive=on"))
    swaps.append(dataclasses.replace(swaps[-1], temperature=0.7, command="temperature=0.7"))
    out = events[:at]
    for i, swap in enumerate(swaps):  # two steps (about 50 ms of decode time) apart
        out.append(swap)
        out += [dataclasses.replace(ev, k=12, adaptive=True) for ev in events[at + 2 * i: at + 2 * i + 2]]
    out += [dataclasses.replace(ev, k=12, adaptive=True) if isinstance(ev, StepEvent) else ev
            for ev in events[at + 2 * len(swaps):]]
    return out


async def until_replayed(pilot, app, steps: int) -> None:
    """Every step of a canned replay on screen (a liveness bound of ~12 s)."""
    for _ in range(600):
        if app.stats.total.steps == steps and app.engine_state == "running" and app.panels_current:
            break
        await pilot.pause(0.02)
    assert app.stats.total.steps == steps, "the replay did not reach the screen"


@pytest.mark.parametrize("size", [(80, 24), (140, 40)], ids=["80x24", "140x40"])
def test_labels_of_three_swaps_within_a_second(snap_compare, size):
    """Three hot-swaps within a second put their lines a cell apart: the labels stack, or
    are cut with "…", or are counted, and never run into each other."""
    events = three_fast_swaps()
    steps = sum(1 for ev in events if type(ev).__name__ == "StepEvent")
    app = replay_app(session_factory=lambda s, p: ReplaySession(s, p, events=events))

    async def settled(pilot) -> None:
        await until_replayed(pilot, app, steps)
        assert [label for _, label in app.stats.markers][-3:] == ["K=12", "adaptive on", "T=0.7"]
        await pilot.pause(0.3)
        app._update_panels()
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=settled)


def test_requests_screen(snap_compare):
    """`l` on the recorded engine run: a row per finished prompt, the last one selected and
    its acceptance-length histogram (built from its steps) under the table."""
    async def replayed_then_requests(pilot) -> None:
        await replayed(pilot)
        await pilot.press("l")
        await pilot.pause(0.8)

    assert snap_compare(replay_app(), terminal_size=(100, 30), run_before=replayed_then_requests)


@pytest.mark.parametrize("size", [(80, 24), (140, 40)], ids=["80x24", "140x40"])
def test_a_health_alarm_in_the_status_line_and_on_the_charts(snap_compare, size):
    """A scripted run whose acceptance collapses, judged by the embedded source's own health
    rules: `⚠ collapse` in the status line, a `health: collapse` marker on the charts."""
    import health_scripts as S

    events = S.engine_collapse()
    steps = sum(1 for ev in events if type(ev).__name__ == "StepEvent")
    app = replay_app(session_factory=lambda s, p: ReplaySession(s, p, events=events))

    async def settled(pilot) -> None:
        for _ in range(600):
            if app.stats.total.steps == steps and app.panels_current:
                break
            await pilot.pause(0.02)
        assert app.state.health is not None and app.state.health.verdict == "collapse"
        await pilot.pause(0.3)
        app._update_panels()
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=settled)


def near_plain_run() -> list:
    """The recording's first steps as a script at steady speeds: 40 plain steps of 40 ms
    (25 tok/s), then lookup drafting 3 tokens a step at 2 tokens per 82 ms (24.4 tok/s,
    0.98x plain): the live line runs on the plain reference for most of the chart."""
    import dataclasses

    from specdash.contract.events import StepEvent

    events = load_replay()
    head = [ev for ev in events[: next(i for i, ev in enumerate(events) if isinstance(ev, StepEvent))]]
    template = next(ev for ev in events if isinstance(ev, StepEvent))
    t0 = template.t - template.step_ms / 1e3
    out, t, n = list(head), t0, 0
    for i in range(200):
        plain = i < 40
        dt = 0.040 if plain else 0.082
        t += dt
        tokens = [template.tokens[0]] * (1 if plain else 2)
        n += len(tokens)
        out.append(dataclasses.replace(
            template, step=i + 1, k=0 if plain else 3, drafter="none" if plain else "lookup",
            drafted=0 if plain else 3, accepted=0 if plain else 1, tokens=tokens,
            pieces=[template.pieces[0]] * len(tokens), from_draft=[False] * len(tokens) if plain else [True, False],
            draft_ms=0.02, verify_ms=dt * 1e3 - 0.5, other_ms=0.48, n_past=60 + n, n_generated=n, t=t))
    return out


def test_the_live_speed_is_drawn_over_the_plain_reference(snap_compare):
    """Where the run decodes at about plain speed its own line is drawn on top of the plain
    reference, not hidden under it (the reference used to be drawn last)."""
    events = near_plain_run()
    steps = sum(1 for ev in events if type(ev).__name__ == "StepEvent")
    app = replay_app(session_factory=lambda s, p: ReplaySession(s, p, events=events))

    async def settled(pilot) -> None:
        await until_replayed(pilot, app, steps)
        plain, live = app.stats.plain_tokens_per_s, app.stats.tokens_per_s
        assert plain is not None and live is not None and abs(live / plain - 1) < 0.1, (live, plain)
        await pilot.pause(0.3)
        app._update_panels()
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(140, 42), run_before=settled)
