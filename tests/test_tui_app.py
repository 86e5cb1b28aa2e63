"""The dashboard's controls and failure handling, driven by the replayed recording (fast,
deterministic). The same controls against the real engine: test_tui_engine.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pilot_helpers import bounded
from specdash.config import load_config
from specdash.contract import events as C
from specdash.engine.stats import SpecCounters
from specdash.contract.events import StepEvent
from specdash.tui.screens.ask import AskScreen
from test_tui_support import FailingSession, ReplaySession, load_replay, replay_app, sync

STEPS = [ev for ev in load_replay() if isinstance(ev, StepEvent)]


def recording_app(tmp_path, **kwargs):
    sessions: list[ReplaySession] = []

    def factory(settings, progress):
        sessions.append(ReplaySession(settings, progress))
        return sessions[-1]

    app = replay_app(tmp_path, session_factory=factory, **kwargs)
    notes: list[tuple[str, str]] = []
    app.notify = lambda message, *a, severity="information", **k: notes.append((severity, str(message)))
    return app, sessions, notes


until = bounded(500, pause=0.02)


async def replayed(pilot) -> None:
    await until(pilot, lambda: pilot.app.stats.total.steps == len(STEPS), "the replay reached the screen")


@sync
async def test_k_keys_send_set_k_from_the_live_value_and_refuse_below_zero(tmp_path):
    app, sessions, notes = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        assert app.stats.settings.k == 2  # the recording ends at K=2
        await pilot.press("plus", "minus", "minus", "minus", "minus")
        await pilot.pause()
        assert [c for c in sessions[0].sent if isinstance(c, C.SetK)] == [C.SetK(3), C.SetK(2), C.SetK(1), C.SetK(0)]
        await pilot.press("minus")
        await pilot.pause()
        assert [c for c in sessions[0].sent if isinstance(c, C.SetK)][-1] == C.SetK(0)
        assert any(sev == "warning" and "cannot go lower" in msg for sev, msg in notes)


@sync
async def test_bad_temperature_keeps_the_dialog_and_the_text(tmp_path):
    app, sessions, notes = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, AskScreen), "the temperature dialog")
        await pilot.press("a", "b", "c", "enter")
        await pilot.pause()
        assert isinstance(app.screen, AskScreen), "a bad value must not close the dialog"
        assert app.screen.query_one("Input").value == "abc"
        assert any(sev == "error" and "'abc' is not a number" in msg for sev, msg in notes)
        await pilot.press("backspace", "backspace", "backspace", "9", "enter")
        await pilot.pause()
        assert isinstance(app.screen, AskScreen)
        assert any("9 is out of range" in msg for _, msg in notes)
        assert not any(isinstance(c, C.SetSampling) for c in sessions[0].sent)
        await pilot.press("backspace", "0", ".", "7", "enter")
        await until(pilot, lambda: not isinstance(app.screen, AskScreen), "the dialog closes")
        assert C.SetSampling(temperature=0.7) in sessions[0].sent


@sync
async def test_space_pauses_and_a_toggles_adaptive(tmp_path):
    app, sessions, _ = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        await pilot.press("space", "a")
        await pilot.pause()
        assert sessions[0].sent[:2] == [C.Pause(), C.SetAdaptive(True)]


@sync
async def test_screenshot_writes_svg_and_json_with_live_settings_and_stats(tmp_path):
    app, sessions, notes = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        await pilot.press("s")
        await pilot.pause()
    shots = tmp_path / "shots"
    svgs = list(shots.glob("*.svg"))
    assert len(svgs) == 1 and svgs[0].read_text().lstrip().startswith("<svg")
    state = json.loads(svgs[0].with_suffix(".json").read_text())
    assert state["svg"] == str(svgs[0])
    assert state["settings"]["target"] == "smollm2-135m" and state["settings"]["draft"] == "lookup"
    assert state["settings"]["k"] == 2 and state["settings"]["event"] == "settings"
    expected = SpecCounters()
    for ev in STEPS[-128:]:
        expected.add(ev)
    assert state["stats"]["recent_steps"]["acceptance_rate"] == pytest.approx(expected.acceptance_rate)
    assert state["stats"]["session"]["num_draft_tokens"] == sum(ev.drafted for ev in STEPS)
    assert [n["node_id"] for n in state["telemetry"]["numa_nodes"]] == [0, 1]
    assert any(str(svgs[0]) in msg for _, msg in notes)


@sync
async def test_screenshot_into_an_unwritable_folder_is_a_notification(tmp_path):
    (tmp_path / "shots").write_text("a file where the folder should be")
    app, _, notes = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        await pilot.press("s")
        await pilot.pause()
        assert app.engine_state == "running"
    assert any(sev == "error" and "cannot write a screenshot" in msg for sev, msg in notes)


@sync
async def test_write_config_round_trips_the_live_settings(tmp_path):
    app, sessions, notes = recording_app(tmp_path)
    target = tmp_path / "saved.toml"
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        # Through commands only: + + + sends SetK(3), SetK(4), SetK(5); the source answers
        # with SettingsEvents, and `w` writes what the source last reported.
        await pilot.press("plus", "plus", "plus")
        await until(pilot, lambda: app.state.settings.k == 5, "the source reports K=5")
        await pilot.press("w")
        await until(pilot, lambda: isinstance(app.screen, AskScreen), "the path dialog")
        app.screen.query_one("Input").value = str(target)
        await pilot.press("enter")
        await until(pilot, target.exists, "the config file")
    config = load_config(target)
    assert config.engine.k == 5 and config.engine.target == "smollm2-135m" and config.engine.draft == "lookup"
    assert config.ui.theme == "specdash-dark"


@sync
async def test_engine_error_is_shown_and_r_restarts(tmp_path):
    attempts: list[str] = []

    def flaky(settings, progress):
        attempts.append("x")
        if len(attempts) == 1:
            return FailingSession(settings, progress)
        return ReplaySession(settings, progress)

    app = replay_app(tmp_path, session_factory=flaky)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine_state == "error", "the error state")
        assert "not a known model" in app.engine_error
        assert app.check_action("restart", ()) is True
        assert app.check_action("k_up", ()) is False
        await pilot.press("r")
        await until(pilot, lambda: app.stats.total.steps == len(STEPS), "steps after the restart")
        assert app.engine_state == "running" and len(attempts) == 2


@sync
async def test_new_prompt_after_an_error_starts_the_engine_with_it(tmp_path):
    sessions: list = []

    def factory(settings, progress):
        if not sessions:
            sessions.append(None)
            return FailingSession(settings, progress)
        sessions.append(ReplaySession(settings, progress))
        return sessions[-1]

    app = replay_app(tmp_path, session_factory=factory)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine_state == "error", "the error state")
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, AskScreen), "the prompt dialog")
        await pilot.press(*"hello there", "enter")
        await until(pilot, lambda: len(sessions) == 2 and sessions[1].runs, "a run of the new prompt")
        assert sessions[1].runs == ["hello there"]
        assert app.prompt_title == "hello there"


@sync
async def test_quit_stops_the_engine_thread(tmp_path):
    app, sessions, _ = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        await pilot.press("q")
    app.engine_thread.join(30)  # a liveness bound, not a timing assertion
    assert not app.engine_thread.is_alive()
    assert C.Stop() in sessions[0].sent and sessions[0].closed
    assert app.return_code == 0


@sync
async def test_palette_offers_the_controls(tmp_path):
    app, _, _ = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
    assert any(t.startswith("K up") for t in titles)
    assert any(t.startswith("Choose the draft source") for t in titles)
    assert "Theme" in titles and "Screenshot" not in titles


@sync
async def test_panels_keep_updating_while_a_dialog_is_open(tmp_path):
    app, _, _ = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        await pilot.press("question_mark")
        polls = app._sampler.calls
        await until(pilot, lambda: app._sampler.calls >= polls + 3, "three telemetry polls under the help screen")
        assert type(app.screen).__name__ == "HelpScreen" and app.is_running


@sync
async def test_loading_progress_is_shown_and_q_abandons_the_load(tmp_path):
    import threading

    release = threading.Event()

    def slow_fetch(settings, progress):
        part = 0
        while not release.is_set():  # a fetch reporting progress until quit raises
            part = part % 22 + 1
            progress(f"fetching qwen2.5-coder-1.5b: assembling part {part}/22", part / 22)
            release.wait(0.02)
        raise AssertionError("the load should have been abandoned")

    app = replay_app(tmp_path, session_factory=slow_fetch)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: "assembling part" in app.query_one("GenerationView").render_line(0).text,
                    "fetch progress on screen")
        assert app.engine_state == "loading" and "loading" in str(app.query_one("#status").render())
        assert app.check_action("k_up", ()) is None  # shown, dimmed: nothing to send it to yet
        await pilot.press("q")
    app.engine_thread.join(30)
    assert not app.engine_thread.is_alive()


@sync
async def test_telemetry_polls_never_overlap(tmp_path):
    import time

    class SlowSampler:
        def __init__(self, inner):
            self.inner, self.in_flight, self.most, self.calls = inner, 0, 0, 0

        def sample(self):
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            time.sleep(0.15)  # slower than the 0.1 s refresh
            self.in_flight -= 1
            self.calls += 1
            return self.inner.sample()

    app, _, _ = recording_app(tmp_path)
    app._sampler = slow = SlowSampler(app._sampler)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: slow.calls >= 5, "five polls")
    assert slow.most == 1


@sync
async def test_bundled_themes_are_registered_and_switchable(tmp_path):
    app, _, _ = recording_app(tmp_path, theme="specdash-light")
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        assert {"specdash-dark", "specdash-light"} <= set(app.available_themes)
        assert app.theme == "specdash-light"
        app.theme = "specdash-dark"
        await pilot.pause()
        assert app.get_css_variables()["draft-token"].lower() == "#6dd18e"


@sync
async def test_k_keys_under_adaptive_fix_k_one_from_the_k_on_screen(tmp_path):
    """Under adaptive K the K on screen is the controller's last choice: + asks for one
    more than that (the engine then fixes K, tests/test_adaptive_default.py), not one more
    than the starting K, and nothing refuses the key."""
    app, sessions, notes = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        app.stats.feed(dataclasses.replace(app.stats.settings, adaptive=True, k=9))
        shown = app.state.k_in_force()
        assert shown is not None and shown != 9
        await pilot.press("plus")
        await pilot.pause()
        assert [c for c in sessions[0].sent if isinstance(c, C.SetK)] == [C.SetK(shown + 1)]
        assert not any("adaptive" in msg for _, msg in notes), notes


@sync
async def test_status_line_shows_the_k_in_force_and_keeps_the_numbers_at_80_columns(tmp_path):
    app, _, _ = recording_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await replayed(pilot)
        status = lambda: str(app.query_one("#status").render())  # noqa: E731
        line = status()
        assert "tok/s" in line and f"acc {app.stats.recent_counters().acceptance_rate:.0%}" in line, line
        assert len(line) <= 80, line
        # Adaptive: the K the controller chose for the last step, not the starting K.
        app.stats.feed(dataclasses.replace(app.stats.settings, adaptive=True, k=4))
        app.stats.feed(dataclasses.replace(STEPS[-1], k=7, step=STEPS[-1].step + 1, adaptive=True))
        app._update_panels()
        await pilot.pause()
        line = status()
        assert "K 7 adaptive" in line and "acc " in line and len(line) <= 80, line
        assert app.query_one("#kpanel").border_title.startswith("K 7 (adaptive)")


@sync
async def test_the_footer_keeps_no_removed_keys_however_often_it_rebuilds(tmp_path):
    # Every dialog opened and closed rebuilds the footer; Textual's own Footer kept each
    # removed key alive through its watcher list (textual#6666): ~4 widgets a second in
    # the soak, most of its memory growth.
    from specdash.tui.widgets.footer import KeyFooter

    app, sessions, notes = recording_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await replayed(pilot)
        footer = app.query_one(KeyFooter)
        await pilot.pause(0.2)
        keys_shown = len(footer.children)
        assert keys_shown >= 8
        for _ in range(15):
            await pilot.press("t")
            await until(pilot, lambda: isinstance(app.screen, AskScreen), "the temperature dialog")
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, AskScreen), "the dialog closes")
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        assert footer.watcher_count() <= 2 * keys_shown, footer.watcher_count()
