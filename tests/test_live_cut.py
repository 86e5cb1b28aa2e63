"""The draft model's joint confidence cut changed while it runs (SetCut, `cut=P`, the
dashboard's `c`): the next drafts are cut by the new value, adaptive K is told whether K
is now a ceiling, a draft model lent again keeps the live value, and a bad value is
refused with the old one kept. Real engine, SmolLM2-135M drafting for itself (it agrees
with itself, so the cut alone decides how long a draft is); no assertion depends on timing."""

from __future__ import annotations

from specdash.contract import events as E
from specdash.engine.drafters.base import model_price
from specdash.engine.settings import EngineSettings
from specdash.contract.events import NoticeEvent, SettingsEvent, StepEvent
from specdash.sources.session import Session
from specdash.tui.screens.ask import AskScreen
from test_tui_engine import real_app, steps, until
from test_tui_support import sync

PROMPT = "Write the numbers from 1 to 400, separated by commas."


def self_draft(smol_path, p_joint: float, **changes) -> Session:
    settings = EngineSettings(target=str(smol_path), draft=str(smol_path), adaptive=False, k=8, threads=2,
                              ctx=1024, max_tokens=60, draft_p_joint=p_joint, raw=True).replace(**changes)
    return Session(settings)


def run_sending(session: Session, sends: dict[int, E.Command]) -> list:
    """One run; after step n, send sends[n]."""
    events, n = [], 0
    for ev in session.run(PROMPT):
        events.append(ev)
        if isinstance(ev, StepEvent):
            n += 1
            if n in sends:
                session.send(sends[n])
    return events


def split_at(events: list, command: str) -> tuple[list[StepEvent], list[StepEvent], SettingsEvent]:
    i = next(i for i, e in enumerate(events) if isinstance(e, SettingsEvent) and e.command == command)
    before = [e for e in events[:i] if isinstance(e, StepEvent)]
    after = [e for e in events[i:] if isinstance(e, StepEvent)]
    return before, after, events[i]


def test_a_cut_set_mid_run_cuts_the_next_drafts_and_keeps_the_text(smol_path):
    plain = self_draft(smol_path, 0.0, draft="none", k=0)
    try:
        want = "".join(e.text for e in plain.run(PROMPT) if isinstance(e, StepEvent))
    finally:
        plain.close()
    session = self_draft(smol_path, 0.0)
    try:
        assert model_price(session.engine.drafter)[1] is False  # no cut: K is K
        events = run_sending(session, {3: E.SetCut(0.999)})
        before, after, applied = split_at(events, "cut=0.999")
        assert applied.draft_p_joint == 0.999 and session.settings.draft_p_joint == 0.999
        # Without the cut every draft is K long (the model agrees with itself on counting);
        # with a product of top probabilities that must stay above 0.999, drafts end early.
        assert {e.drafted for e in before} == {8}
        assert after and max(e.drafted for e in after) < 8, [e.drafted for e in after]
        assert sum(e.drafted for e in after) / len(after) < 4
        # The controller is told the cut makes K a ceiling now.
        assert model_price(session.engine.drafter)[1] is True
        # Exact all along: the same text as plain decoding.
        assert "".join(e.text for e in events if isinstance(e, StepEvent)) == want

        # And off again: full drafts from the next step.
        events = run_sending(session, {2: E.SetCut(0.0)})
        _, after, applied = split_at(events, "cut=0")
        assert applied.draft_p_joint == 0.0 and {e.drafted for e in after[:-1]} == {8}
        assert model_price(session.engine.drafter)[1] is False
    finally:
        session.close()


def test_a_bad_cut_is_refused_and_the_old_one_drafts_on(smol_path):
    session = self_draft(smol_path, 0.0)
    try:
        events = run_sending(session, {2: E.SetCut(1.5)})
        notices = [e for e in events if isinstance(e, NoticeEvent)]
        assert [n.message for n in notices] == ["cut=1.5 refused: must be a number 0..1; kept cut=0"]
        assert not any(isinstance(e, SettingsEvent) and e.command for e in events)
        # Still uncut (the last step drafts only what the token budget leaves).
        assert {e.drafted for e in [e for e in events if isinstance(e, StepEvent)][:-1]} == {8}
        assert session.settings.draft_p_joint == 0.0
    finally:
        session.close()


def test_a_draft_model_lent_again_keeps_the_live_cut(smol_path):
    """The session builds its draft models with the settings it started with; a swap away
    and back must not bring that old cut back."""
    session = self_draft(smol_path, 0.1, draft="lookup")
    try:
        for cmd in (E.SetCut(0.0), E.SetDrafter(str(smol_path))):
            session.send(cmd)
        list(session.apply_pending())
        assert session.settings.draft_p_joint == 0.0
        assert model_price(session.engine.drafter)[1] is False
        steps_ = [e for e in session.run(PROMPT) if isinstance(e, StepEvent)]
        assert {e.drafted for e in steps_[:-1]} == {8}
        for cmd in (E.SetCut(0.999), E.SetDrafter("chain")):
            session.send(cmd)
        list(session.apply_pending())
        assert model_price(session.engine.drafter)[1] is True  # the chain's model part too
    finally:
        session.close()


@sync
async def test_c_asks_for_the_cut_and_the_k_title_shows_it(tmp_path, smol_path):
    app, recs, notes = real_app(tmp_path, smol_path, draft=str(smol_path))
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: recs and len(steps(recs[0])) >= 2, "two steps")
        await until(pilot, lambda: "cut 0.1" in str(app.query_one("#kpanel").border_title), "the default cut in the K title")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, AskScreen), "the cut dialog")
        app.screen.query_one("Input").value = "2"
        await pilot.press("enter")
        assert isinstance(app.screen, AskScreen)  # refused in the dialog: out of range
        assert notes == [("error", "cut 2 is out of range; use 0 (off) to 1")]
        app.screen.query_one("Input").value = "0.5"
        await pilot.press("enter")
        await until(pilot, lambda: app.stats.settings.draft_p_joint == 0.5, "cut 0.5 applied")
        assert recs[0].settings.draft_p_joint == 0.5
        await until(pilot, lambda: "cut 0.5" in str(app.query_one("#kpanel").border_title), "cut 0.5 in the K title")
        assert any(label == "cut=0.5" for _, label in app.state.stats.markers)  # the hot-swap marker
        assert len(notes) == 1, notes  # nothing else went wrong
