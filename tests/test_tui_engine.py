"""The dashboard driving the real engine on a small real model (SmolLM2-135M, prompt
lookup drafts): controls reach the engine and what the engine reports reaches the screen.
Slow-ish (the model decodes on 2 shared cores); no assertion depends on timing."""

from __future__ import annotations

import json


from pilot_helpers import bounded
from specdash.sources.session import Session
from specdash.engine.settings import EngineSettings
from specdash.contract.events import NoticeEvent, PromptEvent, SetDrafter, SettingsEvent, StepEvent
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.screens.ask import AskScreen
from specdash.tui.screens.draft_picker import DraftPicker
from specdash.tui.widgets.plots import Plot
from specdash.tui.widgets.generation import GenerationView
from test_tui_support import FixedSampler, sync

# smollm2-135m keeps counting for hundreds of tokens without an end-of-sequence, and
# prompt lookup finds drafts in its own output.
PROMPT = "Write the numbers from 1 to 400, separated by commas."


class Recorder:
    """A real Session that keeps every event it yields, for checking what the engine did."""

    def __init__(self, session: Session):
        self.inner = session
        self.events: list = []
        self.closed = False

    @property
    def settings(self) -> EngineSettings:
        return self.inner.settings

    def send(self, cmd) -> None:
        self.inner.send(cmd)

    def apply_pending(self):
        for ev in self.inner.apply_pending():
            self.events.append(ev)
            yield ev

    def run(self, prompt, max_tokens=None):
        events = self.inner.run(prompt, max_tokens)
        try:
            for ev in events:
                self.events.append(ev)
                yield ev
        finally:
            events.close()

    def close(self) -> None:
        self.inner.close()
        self.closed = True


def real_app(tmp_path, smol_path, *, draft="lookup", translate=True, **options):
    recorders: list[Recorder] = []

    def factory(settings, progress):
        recorders.append(Recorder(Session(settings, progress=progress)))
        return recorders[-1]

    settings = EngineSettings(adaptive=False, target=str(smol_path), draft=draft, k=2, threads=2, ctx=2048, max_tokens=1500,
                              translate=translate)
    opts = DashboardOptions(settings=settings, prompt=PROMPT, screenshots_dir=str(tmp_path / "shots"), **options)
    app = SpecdashApp(opts, session_factory=factory, sampler=FixedSampler(), hints=lambda: [], flush_interval=0.1)
    notes: list[tuple[str, str]] = []
    app.notify = lambda message, *a, severity="information", **k: notes.append((severity, str(message)))
    return app, recorders, notes


until = bounded(3000)


def steps(recorder: Recorder) -> list[StepEvent]:
    return [ev for ev in recorder.events if isinstance(ev, StepEvent)]


@sync
async def test_plus_raises_k_in_the_following_steps_and_the_k_chart(tmp_path, smol_path):
    app, recs, _ = real_app(tmp_path, smol_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 3, "three steps at K=2")
        assert {ev.k for ev in steps(recs[0])} == {2}
        await pilot.press("plus")
        await until(
            pilot, lambda: any(isinstance(e, SettingsEvent) and e.k == 3 for e in recs[0].events), "K=3 applied"
        )
        applied = next(i for i, e in enumerate(recs[0].events) if isinstance(e, SettingsEvent) and e.k == 3)
        await until(pilot, lambda: len([e for e in recs[0].events[applied:] if isinstance(e, StepEvent)]) >= 3,
                    "three steps after the change")
        after = [e for e in recs[0].events[applied:] if isinstance(e, StepEvent)]
        assert {ev.k for ev in after} == {3}
        await until(pilot, lambda: app.state.stats.timeline(60).k[-1:] == [3.0], "K=3 in the chart's data")
        await until(pilot, lambda: app.query_one("#k-chart", Plot)._datasets
                    and app.query_one("#k-chart", Plot)._datasets[0].y[-1] == 3.0, "K=3 drawn")
        assert any(label == "K=3" for _, label in app.state.stats.markers)  # the hot-swap marker
        assert app.stats.settings.k == 3
        assert "K 3 fixed" in str(app.query_one("#status").render())


@sync
async def test_keys_between_prompts_change_the_settings_at_once(tmp_path, smol_path):
    # CI once pressed `a` in the sweep view just after the prompt ended: the SetK waited
    # for a next prompt that never came, and the status kept the old K.
    app, recs, notes = real_app(tmp_path, smol_path)
    app.options.settings = app.options.settings.replace(max_tokens=8)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine_state == "idle", "the short prompt done")
        await pilot.press("plus")
        await until(pilot, lambda: app.stats.settings.k == 3, "K=3 between prompts")
        # It applied at once, so nothing may say it waits for the next prompt.
        assert not any("next prompt" in message for _, message in notes), notes
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DraftPicker), "the picker")
        option_list = app.screen.query_one("OptionList")
        option_list.highlighted = [c.spec for c in app.screen.choices].index("suffix")
        await pilot.press("enter")
        await until(pilot, lambda: app.stats.settings.drafter == "suffix", "the suffix drafter between prompts")
        assert app.engine_state == "idle" and "K 3 fixed" in str(app.query_one("#status").render())
        # The next prompt runs on them.
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, AskScreen), "the prompt dialog")
        await pilot.press(*"Count from 1 to 20.", "enter")
        await until(pilot, lambda: len(recs[0].events) and any(isinstance(e, StepEvent) and e.drafter == "suffix"
                                                               for e in recs[0].events), "a step by suffix")
        assert {e.k for e in steps(recs[0]) if e.drafter == "suffix"} <= {3}
        assert not any(sev == "error" for sev, _ in notes)
        assert not any("next prompt" in message for _, message in notes), notes


@sync
async def test_draft_picker_swaps_the_drafter_and_keeps_the_text(tmp_path, smol_path):
    app, recs, notes = real_app(tmp_path, smol_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 4, "steps with prompt lookup")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DraftPicker), "the picker")
        option_list = app.screen.query_one("OptionList")
        option_list.highlighted = [c.spec for c in app.screen.choices].index("suffix")
        await pilot.press("enter")
        await until(pilot, lambda: app.stats.settings.drafter == "suffix", "the suffix drafter in use")
        # A model by path (the target's own file: the one compatible model these tests have)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DraftPicker), "the picker again")
        app.screen.query_one("#draft-path").value = str(smol_path)
        app.screen.query_one("#draft-path").focus()
        text_before = app.query_one(GenerationView).text
        await pilot.press("enter")
        await until(pilot, lambda: app.stats.settings.drafter == smol_path.stem, "the draft model in use")
        swapped = next(i for i, e in enumerate(recs[0].events)
                       if isinstance(e, SettingsEvent) and e.drafter == smol_path.stem)
        await until(pilot, lambda: any(isinstance(e, StepEvent) and e.drafter == "draft"
                                       for e in recs[0].events[swapped:]), "a step drafted by the model")
        await pilot.pause(0.3)
        text_after = app.query_one(GenerationView).text
        assert text_after.startswith(text_before) and len(text_after) > len(text_before)
        assert app.engine_state == "running" and app.prompt_title == "your prompt"
        assert not any(sev == "warning" for sev, _ in notes)


@sync
async def test_an_incompatible_draft_is_refused_and_the_old_one_keeps_running(tmp_path, smol_path, gemma_path):
    app, recs, notes = real_app(tmp_path, smol_path, translate=False)  # strict llama.cpp rules
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 2, "steps with prompt lookup")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DraftPicker), "the picker")
        app.screen.query_one("#draft-path").value = str(gemma_path)
        app.screen.query_one("#draft-path").focus()
        await pilot.press("enter")
        await until(pilot, lambda: any(isinstance(e, NoticeEvent) for e in recs[0].events), "the refusal")
        refusal = next(e for e in recs[0].events if isinstance(e, NoticeEvent))
        assert "incompatible" in refusal.message
        await until(pilot, lambda: any(sev == "warning" and "incompatible" in msg for sev, msg in notes),
                    "the refusal on screen")
        n = len(steps(recs[0]))
        await until(pilot, lambda: len(steps(recs[0])) >= n + 2, "steps after the refusal")
        assert app.stats.settings.drafter == "lookup"
        assert app.engine_state == "running"


@sync
async def test_s_writes_the_svg_and_the_json(tmp_path, smol_path):
    app, recs, notes = real_app(tmp_path, smol_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.stats.total.steps >= 3, "steps on screen")
        await pilot.press("s")
        await until(pilot, lambda: list((tmp_path / "shots").glob("*.json")), "the screenshot files")
    (svg,) = (tmp_path / "shots").glob("*.svg")
    state = json.loads(svg.with_suffix(".json").read_text())
    assert "<svg" in svg.read_text()[:200]
    assert state["settings"]["target"] == str(smol_path) and state["settings"]["k"] == 2
    assert state["stats"]["session"]["steps"] >= 3 and state["stats"]["tokens_per_s"] > 0
    assert any(str(svg) in msg for _, msg in notes)


@sync
async def test_q_quits_while_generating(tmp_path, smol_path):
    app, recs, _ = real_app(tmp_path, smol_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 2, "generation under way")
        await pilot.press("q")
    assert app.return_code == 0
    app.engine_thread.join(120)  # liveness bound: one engine step on a loaded machine
    assert not app.engine_thread.is_alive() and recs[0].closed
    # the run did not reach its token budget: it was cut short by the quit
    assert sum(len(e.tokens) for e in steps(recs[0])) < 1500


@sync
async def test_w_writes_what_the_engine_reports_after_commands(tmp_path, smol_path):
    """The live settings reach the config file only through the engine: a key sends a
    command, the engine applies it and reports a SettingsEvent, `w` writes that."""
    from specdash.config import load_config
    from specdash.tui.screens.ask import AskScreen

    app, recs, _ = real_app(tmp_path, smol_path)
    target = tmp_path / "live.toml"
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 2, "steps")
        await pilot.press("plus", "plus", "a")
        await until(pilot, lambda: app.state.settings.k == 4 and app.state.settings.adaptive, "K=4 adaptive applied")
        await pilot.press("w")
        await until(pilot, lambda: isinstance(app.screen, AskScreen), "the path dialog")
        app.screen.query_one("Input").value = str(target)
        await pilot.press("enter")
        await until(pilot, target.exists, "the config file")
        assert recs[0].settings.k == 4  # the engine's own snapshot agrees
    engine = load_config(target).engine
    assert (engine.k, engine.adaptive, engine.draft, engine.ctx) == (4, True, "lookup", 2048)


@sync
async def test_e_sets_the_expert_count_of_a_moe_target_and_keeps_the_text(tmp_path):
    from moe_fixture import cached_tiny_moe

    from specdash.tui.screens.ask import AskScreen

    moe = cached_tiny_moe(n_expert=4, n_expert_used=2)
    app, recs, notes = real_app(tmp_path, moe, draft="none")
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.stats.total.steps >= 3, "steps on the MoE target")
        # Paused, the tiny model cannot finish its prompt while the test types.
        await pilot.press("space")
        await until(pilot, lambda: app.engine_state == "paused", "paused")
        assert app.stats.settings.expert_count == 4 and app.check_action("set_experts", ()) is True
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, AskScreen), "the experts dialog")
        app.screen.query_one("Input").value = "9"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, AskScreen)  # out of range: refused before the engine
        assert any("use a whole number 1..4" in msg for _, msg in notes)
        text_paused = app.query_one(GenerationView).text
        last_before = steps(recs[0])[-1]
        app.screen.query_one("Input").value = "1"
        await pilot.press("enter")
        await until(pilot, lambda: app.stats.settings.experts == 1, "the target reloaded with 1 expert")
        assert any("reloading target" in msg for _, msg in notes)
        assert text_paused and app.query_one(GenerationView).text == text_paused  # the reload kept every character
        reloaded = len(recs[0].events)
        await pilot.press("space")
        await until(pilot, lambda: any(isinstance(e, StepEvent) for e in recs[0].events[reloaded:]), "steps after it")
        # The same prompt goes on where it was (not restarted): compared on the engine's
        # events, since this tiny model can fill and trim the view, or finish, in a moment.
        after = recs[0].events[reloaded:]
        first = next(i for i, e in enumerate(after) if isinstance(e, StepEvent))
        assert not any(isinstance(e, PromptEvent) for e in after[:first])
        assert after[first].n_generated > last_before.n_generated
        assert "experts 1/4" in str(app.query_one("#status").render())


@sync
async def test_a_refusal_quoting_markup_is_shown_as_text_and_the_engine_keeps_running(tmp_path, smol_path):
    """`draft=[/]` (a client's steer, or typed in the picker) is refused with a notice that
    quotes it: as markup, `[/]` raised MarkupError and ended the app (and serve with it)."""
    app, recs, _notes = real_app(tmp_path, smol_path)
    del app.notify  # the real notifications: the toast renders the message
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 2, "steps with prompt lookup")
        app._send(SetDrafter("[/]"))
        await until(pilot, lambda: any(isinstance(e, NoticeEvent) and "[/]" in e.message for e in recs[0].events),
                    "the refusal")
        await until(pilot, lambda: any("[/]" in n.message for n in app._notifications), "the refusal notified")
        n = len(steps(recs[0]))
        await until(pilot, lambda: len(steps(recs[0])) >= n + 2, "steps after the refusal")
        assert app.engine_state == "running" and app.stats.settings.drafter == "lookup"
        shown = [n for n in app._notifications if "[/]" in n.message]
        # A toast parses its message as markup when the notification says so (Toast.render).
        assert shown and not any(n.markup for n in shown)
        assert app.return_code is None  # the app did not end
