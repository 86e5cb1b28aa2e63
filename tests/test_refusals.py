"""Refusals keep the engine going: an incompatible drafter (gemma3-270m's tokenizer, with
translation refused: translate = false), a
missing file, an out-of-range K (65, -1) and an expert count on a dense model are
refused with a notice, in a schedule and in the dashboard; the settings stay as they
were and generation goes on.

The strongest check is the final text: a refused command changes nothing in the engine,
so the run takes exactly the steps (the same batches) a run without the commands takes,
and on the same machine and thread count llama.cpp's output is bit for bit the same."""

from __future__ import annotations

import json

import pytest
from cli_helpers import specdash
from test_tui_engine import Recorder, steps, until
from test_tui_support import FixedSampler, sync

from specdash.contract import events as E
from specdash.engine.settings import EngineSettings
from specdash.tuning.schedule import Schedule, parse_at
from specdash.sources.session import Session
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.screens.draft_picker import DraftPicker
from specdash.tui.widgets.generation import GenerationView

PROMPT = "Write the numbers from 1 to 400, separated by commas."  # SmolLM2 counts for hundreds of tokens


def refusals(tmp_path) -> list[tuple[str, str]]:
    """(command as scheduled, what the refusal must say)."""
    missing = tmp_path / "no-such-draft.gguf"
    return [
        ("k=65", "must be an integer 0..64; kept k=3"),
        ("k=-1", "must be an integer 0..64; kept k=3"),
        ("draft=gemma3-270m", "is incompatible with target"),
        (f"draft={missing}", "no such file"),
        ("experts=2", "dense model"),
    ]


def settings(smol_path, **changes) -> EngineSettings:
    # translate=False: gemma3-270m's vocabulary would otherwise draft through translation.
    base = dict(target=str(smol_path), draft="lookup", k=3, threads=1, ctx=1024, max_tokens=90, translate=False,
                adaptive=False)
    return EngineSettings(**{**base, **changes})  # type: ignore[arg-type]


def final_text(events) -> str:
    summary = events[-1]
    assert isinstance(summary, E.Summary)
    return summary.text


@pytest.fixture(scope="module")
def plain_text(smol_path) -> str:
    """The same run without any command."""
    session = Session(settings(smol_path))
    try:
        return final_text(list(session.run(PROMPT)))
    finally:
        session.close()


def test_refused_in_a_schedule_and_the_run_is_unchanged(smol_path, gemma_path, tmp_path, plain_text):
    cases = refusals(tmp_path)
    session = Session(settings(smol_path))
    # One refusal after each of steps 2, 4, 6, ...: every one with steps after it.
    schedule = Schedule(parse_at(f"{2 * i + 2}:{cmd}" for i, (cmd, _) in enumerate(cases)), session.send)
    events: list[E.Event] = []
    try:
        for ev in session.run(PROMPT):
            events.append(ev)
            if isinstance(ev, E.StepEvent):
                schedule.after_step(ev.step)
        kept = session.settings
    finally:
        session.close()
    notices = [(i, ev) for i, ev in enumerate(events) if isinstance(ev, E.NoticeEvent)]
    assert [ev.level for _, ev in notices] == ["warning"] * len(cases)
    for (cmd, why), (i, ev) in zip(cases, notices):
        assert ev.message.startswith(f"{cmd} refused: ") and why in ev.message, ev.message
        assert ev.refused == cmd  # the refusal as data: what the dashboard and fuzz read
        assert any(isinstance(later, E.StepEvent) for later in events[i + 1:]), f"no step after {cmd}"
    # No settings changed: the only snapshot is the one at the start.
    assert [ev.command for ev in events if isinstance(ev, E.SettingsEvent)] == [""]
    assert (kept.k, kept.draft, kept.experts) == (3, "lookup", None)
    step_events = [ev for ev in events if isinstance(ev, E.StepEvent)]
    assert {ev.k for ev in step_events[:-1]} == {3} and {ev.drafter for ev in step_events} <= {"lookup", "none"}
    assert events[-1].n_generated == 90 and final_text(events) == plain_text


def test_refused_by_specdash_run_and_the_text_is_unchanged(smol_path, gemma_path, tmp_path):
    plan = tmp_path / "plan.txt"
    plan.write_text("".join(f"{2 * i + 2}: {cmd}\n" for i, (cmd, _) in enumerate(refusals(tmp_path))))
    args = ["run", "--target", str(smol_path), "--draft", "lookup", "--k", "3", "--threads", "1", "--ctx", "1024",
            "--max-tokens", "60", "--prompt", PROMPT, "--json", "--no-translate"]
    plain, scheduled = specdash(*args), specdash(*args, "--schedule", str(plan))
    assert plain.returncode == 0 and scheduled.returncode == 0, scheduled.stderr
    events = [json.loads(line) for line in scheduled.stdout.splitlines()]
    warnings = [e["message"] for e in events if e["event"] == "notice" and e["level"] == "warning"]
    assert len(warnings) == 5 and all(" refused: " in w for w in warnings)
    assert json.loads(plain.stdout.splitlines()[-1])["text"] == events[-1]["text"]
    assert events[-1]["n_generated"] == 60


# --- in the dashboard ---------------------------------------------------------------------


def refusing_app(tmp_path, smol_path):
    recorders: list[Recorder] = []

    def factory(engine_settings, progress):
        recorders.append(Recorder(Session(engine_settings, progress=progress)))
        return recorders[-1]

    opts = DashboardOptions(settings=settings(smol_path, k=64, max_tokens=120), prompt=PROMPT,
                            screenshots_dir=str(tmp_path / "shots"))
    app = SpecdashApp(opts, session_factory=factory, sampler=FixedSampler(), hints=lambda: [], flush_interval=0.1)
    notes: list[tuple[str, str]] = []
    app.notify = lambda message, *a, severity="information", **k: notes.append((severity, str(message)))  # type: ignore[method-assign]
    return app, recorders, notes


@sync
async def test_refused_in_the_dashboard_and_generation_goes_on(tmp_path, smol_path, gemma_path):
    """Keys first (refused by the dashboard before the engine: K above 64, experts on a
    dense model), then the same commands and the two bad drafters through the source, as
    a script or the draft picker sends them (refused by the engine with a notice). The
    engine keeps K=64 and prompt lookup throughout, and the prompt's final text is what a
    run with no command writes."""
    session = Session(settings(smol_path, k=64, max_tokens=120))
    try:
        plain = final_text(list(session.run(PROMPT)))
    finally:
        session.close()
    missing = tmp_path / "no-such-draft.gguf"
    app, recs, notes = refusing_app(tmp_path, smol_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 2, "steps at K=64")
        await pilot.press("space")  # paused: the prompt cannot end while the test types
        await until(pilot, lambda: app.engine_state == "paused", "paused")

        await pilot.press("plus")
        assert ("warning", "K is already 64, the most the engine takes") in notes
        await pilot.press("e")  # hidden for a dense model; the key says why
        assert any(sev == "warning" and "dense model" in msg for sev, msg in notes)
        assert not any(isinstance(ev, E.NoticeEvent) for ev in recs[0].events)  # nothing reached the engine

        for cmd in (E.SetK(65), E.SetK(-1), E.SetExperts(2)):
            app.source.send(cmd)
        for path in (str(gemma_path), str(missing)):  # the picker's path field, Enter
            await pilot.press("d")
            await until(pilot, lambda: isinstance(app.screen, DraftPicker), "the picker")
            app.screen.query_one("#draft-path").value = path
            app.screen.query_one("#draft-path").focus()
            await pilot.press("enter")
            await until(pilot, lambda: not isinstance(app.screen, DraftPicker), "the picker closed")
        await until(pilot, lambda: len([e for e in recs[0].events if isinstance(e, E.NoticeEvent)]) == 5,
                    "five refusals from the paused engine")
        messages = [e.message for e in recs[0].events if isinstance(e, E.NoticeEvent)]
        assert [m.split(" refused")[0] for m in messages] == [
            "k=65", "k=-1", "experts=2", f"draft={gemma_path}", f"draft={missing}"]
        await until(pilot, lambda: all(any(sev == "warning" and m in msg for sev, msg in notes) for m in messages),
                    "every refusal on screen")
        assert (app.state.settings.k, app.state.settings.drafter) == (64, "lookup")
        status = str(app.query_one("#status").render())
        assert "K 64 fixed" in status and "lookup" in status

        text_before = app.query_one(GenerationView).text
        n = len(steps(recs[0]))
        await pilot.press("space")
        await until(pilot, lambda: app.engine_state == "idle", "the prompt finished", tries=6000)
        assert len(steps(recs[0])) > n and {ev.k for ev in steps(recs[0])[n:-1]} == {64}
        text_after = app.query_one(GenerationView).text
        assert text_after.startswith(text_before) and len(text_after) > len(text_before)
    summary = recs[0].events[-1]
    assert isinstance(summary, E.Summary) and summary.n_generated == 120
    assert summary.text == plain
