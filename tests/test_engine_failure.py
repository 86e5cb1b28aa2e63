"""An engine thread that fails mid-step: the dashboard shows the error, stays alive, and
`r` restarts the engine with the last good settings (what the operator set by commands,
not what the dashboard was launched with). Real Sessions on SmolLM2-135M; the failure is
injected through the session factory: a drafter that raises in propose(), a target
whose decode raises, or a drafter swap whose model load raises something other than a
refusal."""

from __future__ import annotations

import threading

import pytest
from test_tui_engine import Recorder, steps, until
from test_tui_support import FixedSampler, sync

from specdash.contract import events as E
from specdash.engine.settings import EngineSettings
from specdash.sources.session import Session
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.widgets.generation import GenerationView

PROMPT = "Write the numbers from 1 to 400, separated by commas."


class Failing:
    """Wraps a drafter: propose() raises once `armed` is set."""

    def __init__(self, inner, armed: threading.Event):
        self.inner, self.armed = inner, armed
        self.name, self.label = inner.name, inner.label
        self.free, self.relative_cost = inner.free, inner.relative_cost

    def propose(self, tokens, k, sampling, rng):
        if self.armed.is_set():
            raise RuntimeError("drafter blew up mid-step (injected)")
        return self.inner.propose(tokens, k, sampling, rng)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Factory:
    """Builds real Sessions. The first one fails, once armed, in the part `where` names."""

    def __init__(self, where: str):
        self.where = where
        self.armed = threading.Event()
        self.recorders: list[Recorder] = []
        self.settings: list[EngineSettings] = []  # what each session was built with

    def __call__(self, settings: EngineSettings, progress) -> Recorder:
        self.settings.append(settings)
        session = Session(settings, progress=progress)
        if not self.recorders:  # only the first session fails
            self._inject(session)
        self.recorders.append(Recorder(session))
        return self.recorders[-1]

    def _inject(self, session: Session) -> None:
        armed = self.armed
        if self.where == "drafter":
            make = session.make_drafter
            session.make_drafter = lambda spec: Failing(make(spec), armed)  # type: ignore[method-assign]
            session.engine._make_drafter = session.make_drafter
            session.engine.drafter = Failing(session.engine.drafter, armed)
        elif self.where == "target":
            target = session.target
            decode = target.decode

            def failing_decode(tokens, start_pos, logits="all", seq=0):
                if armed.is_set() and logits == "all":  # a verify batch, mid-step
                    raise RuntimeError("llama_decode failed with code -3 (injected)")
                return decode(tokens, start_pos, logits, seq)

            target.decode = failing_decode  # type: ignore[method-assign]
        elif self.where == "swap":
            make = session.make_drafter

            def make_or_fail(spec):
                if armed.is_set():
                    raise MemoryError(f"cannot allocate the draft context for {spec} (injected)")
                return make(spec)

            session.make_drafter = make_or_fail  # type: ignore[method-assign]
            session.engine._make_drafter = make_or_fail


def failing_app(tmp_path, smol_path, where: str):
    factory = Factory(where)
    launch = EngineSettings(adaptive=False, target=str(smol_path), draft="lookup", k=2, threads=1, ctx=2048, max_tokens=2000)
    opts = DashboardOptions(settings=launch, prompt=PROMPT, screenshots_dir=str(tmp_path / "shots"))
    app = SpecdashApp(opts, session_factory=factory, sampler=FixedSampler(), hints=lambda: [], flush_interval=0.1)
    notes: list[tuple[str, str, str]] = []
    app.notify = lambda message, *a, severity="information", title="", **k: notes.append(  # type: ignore[method-assign]
        (severity, str(title), str(message)))
    return app, factory, notes


@pytest.mark.parametrize("where", ["drafter", "target", "swap"])
@sync
async def test_engine_failure_shows_stays_alive_and_r_restarts_with_the_last_good_settings(tmp_path, smol_path, where):
    app, factory, notes = failing_app(tmp_path, smol_path, where)
    async with app.run_test(size=(120, 36)) as pilot:
        recs = factory.recorders
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 2, "steps at launch settings")
        # The operator changes K and the drafter by commands: these are the good settings.
        await pilot.press("plus", "plus", "plus")
        app._send(E.SetDrafter("suffix"))
        await until(pilot, lambda: app.state.settings.k == 5 and app.state.settings.draft == "suffix",
                    "K=5 and suffix applied")
        await until(pilot, lambda: any(ev.k == 5 for ev in steps(recs[0])), "a step at K=5")
        factory.armed.set()
        if where == "swap":
            app._send(E.SetDrafter("lookup"))  # the swap the engine dies in
        await until(pilot, lambda: app.engine_state == "error", "the error")

        # Shown: the status line, the generation panel's note, a notification.
        message = {"drafter": "RuntimeError: drafter blew up mid-step (injected)",
                   "target": "RuntimeError: llama_decode failed with code -3 (injected)",
                   "swap": "MemoryError: cannot allocate the draft context for lookup (injected)"}[where]
        assert app.engine_error == message
        await pilot.pause(0.2)
        assert "✖ error" in str(app.query_one("#status").render())
        note = app.query_one(GenerationView)._note
        assert note is not None and note[1] == "error" and message in note[0] and "Press r to restart" in note[0]
        assert ("error", "Engine stopped", message) in notes
        assert recs[0].closed  # the failed session freed its models
        # The thread still emits a notice with the traceback after the error status: on a
        # loaded machine it can take longer than the pause above to return, but it must end.
        await until(pilot, lambda: not app.engine_thread.is_alive(), "the engine thread ended")

        # Alive: keys still work (help opens and closes), the footer offers restart.
        assert app.check_action("restart", ()) is True and app.check_action("k_up", ()) is False
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen", "the help screen")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.__class__.__name__ != "HelpScreen", "back")

        factory.armed.clear()
        await pilot.press("r")
        await until(pilot, lambda: len(recs) == 2 and len(steps(recs[1])) >= 3, "steps after the restart")
        restarted = factory.settings[1]
        assert (restarted.k, restarted.draft) == (5, "suffix"), "restarted with the launch settings"
        first = next(ev for ev in recs[1].events if isinstance(ev, E.SettingsEvent))
        assert (first.k, first.draft, first.drafter) == (5, "suffix", "suffix")
        assert {ev.k for ev in steps(recs[1])} == {5} and {ev.drafter for ev in steps(recs[1])} <= {"suffix", "none"}
        assert app.engine_state == "running" and app.engine_error == ""
        await until(pilot, lambda: "✖ error" not in str(app.query_one("#status").render()), "the error line cleared")
        assert "K 5 fixed" in str(app.query_one("#status").render())
