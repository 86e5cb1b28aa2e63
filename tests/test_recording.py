"""Recordings: written as the run goes, read back exactly, replayed into the same state
the live dashboard had; broken files replay up to the bad line and say where."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from cli_helpers import assert_ok, assert_usage_error, specdash
from pilot_helpers import bounded
from specdash.contract import events as E
from specdash.engine.settings import EngineSettings
from specdash.contract.errors import SpecdashError
from specdash.records.recording import Recorder, read_recording
from specdash.sources.session import Session
from specdash.sources.replay import ReplaySource
from specdash.tui.reducer import DashState

until = bounded(500, pause=0.02)  # a liveness bound for the replay dashboards below

PROMPT = "Write the numbers from 1 to 60, separated by commas."


@pytest.fixture(scope="module")
def live(smol_path, tmp_path_factory):
    """A real run of the small model with two hot-swaps, recorded; and the events as the
    dashboard would have seen them live."""
    path = tmp_path_factory.mktemp("rec") / "live.jsonl"
    recorder = Recorder(path, extra={"command": "test"})
    session = Session(EngineSettings(adaptive=False, target=str(smol_path), draft="lookup", k=4, threads=2, ctx=1024, max_tokens=80))
    events: list[E.Event] = []
    try:
        for ev in session.run(PROMPT):
            events.append(ev)
            recorder(ev)
            if isinstance(ev, E.StepEvent) and ev.step == 10:
                session.send(E.SetK(9))
            if isinstance(ev, E.StepEvent) and ev.step == 20:
                session.send(E.SetDrafter("suffix"))
    finally:
        session.close()
        recorder.close()
    return path, events


def fold(events) -> DashState:
    state = DashState()
    for ev in events:
        state.feed(ev)
    return state


class _Close(float):
    """A float equal to any other within 1e-4 relative: recordings keep 6 decimals."""

    def __eq__(self, other):
        return isinstance(other, float) and abs(self - other) <= 1e-4 * max(abs(self), abs(other), 1e-3)

    __hash__ = float.__hash__


def _approx(value):
    if isinstance(value, float):
        return _Close(value)
    if isinstance(value, dict):
        return {k: _approx(v) for k, v in value.items() if k != "schema"}
    if isinstance(value, (list, tuple)):
        return [_approx(v) for v in value]
    return value


def essentials(state: DashState) -> dict:
    st = state.stats
    return _approx({
        "total": dataclasses.asdict(st.total),
        "bins": [dataclasses.asdict(b) for b in st.bins],
        "markers": list(st.markers),
        "settings": E.to_dict(state.settings) if state.settings else None,
        "text": "".join(p for p, _ in state.pieces),
        "tokens_per_s": st.tokens_per_s,
        "summary": E.to_dict(st.last_summary) if st.last_summary else None,
    })


def test_the_file_has_a_header_then_every_event(live, smol_path):
    path, events = live
    rec = read_recording(path)
    assert rec.problem == "" and len(rec.events) == len(events)
    h = rec.header
    assert h["schema"] == E.SCHEMA and h["specdash"] and h["command"] == "test"
    target = next(m for m in h["models"] if m["role"] == "target")
    assert target["path"] == str(smol_path)
    assert target["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert h["machine"]["physical_cores"] >= 1 and h["machine"]["cpu_model"]
    # each line is one event, written as it came: JSON lines, nothing else
    lines = path.read_text().splitlines()
    assert len(lines) == len(events) + 1 and all(json.loads(line) for line in lines)


def test_replayed_state_equals_the_live_state_at_every_step(live):
    """The reducer fed the recording (through the replay source, at any speed) ends
    where the live dashboard was, and agrees with it step by step."""
    path, events = live
    rec = read_recording(path)
    assert essentials(fold(rec.events)) == essentials(fold(events))
    for cut in (5, 15, 25, len(events)):
        assert essentials(fold(rec.events[:cut])) == essentials(fold(events[:cut]))
    assert [label for _, label in fold(rec.events).stats.markers] == ["K=9", "suffix"]

    got: list[E.Event] = []
    done = threading.Event()

    def emit(ev):
        got.append(ev)
        if isinstance(ev, E.StatusEvent) and ev.state == "ended":
            done.set()

    source = ReplaySource(path, sleep=lambda wake, s: False)  # no waiting: as fast as it goes
    source.start(emit)
    assert done.wait(60)
    source.close()
    replayed = fold(got)
    assert essentials(replayed)["total"] == essentials(fold(events))["total"]
    assert replayed.source == "replay" and replayed.settings.source == "replay"
    assert "a recording cannot change K" in replayed.settings.unavailable["k"]


def test_seek_rewinds_and_rebuilds_the_state(live):
    path, events = live
    rec = read_recording(path)
    source = ReplaySource(path, sleep=lambda wake, s: wake.wait(0.001) and False, recording=rec)
    got: list[E.Event] = []
    source.start(got.append)
    source.send(E.Pause())
    middle = rec.duration / 2
    source.send(E.Seek(to=middle))
    for _ in range(500):
        if any(isinstance(ev, E.ReplayEvent) and ev.rewind for ev in got) and \
                isinstance(got[-1], E.ReplayEvent) and not got[-1].rewind and got[-1].position == middle:
            break
        threading.Event().wait(0.01)
    source.close()
    rewind = max(i for i, ev in enumerate(got) if isinstance(ev, E.ReplayEvent) and ev.rewind)
    state = fold(got)  # the reducer starts over at the rewind
    t0 = min(ev.t for ev in rec.events if ev.t)
    expected = [ev for ev in rec.events if not ev.t or ev.t - t0 <= middle]
    assert essentials(state)["total"] == essentials(fold(expected))["total"]
    assert state.replay is not None and state.replay.position == middle and rewind > 0


def test_a_corrupt_line_stops_the_replay_there_and_says_where(live, tmp_path):
    path, events = live
    lines = path.read_text().splitlines(keepends=True)
    broken = tmp_path / "corrupt.jsonl"
    broken.write_text("".join(lines[:20]) + '{"event": "step", "step": oops}\n' + "".join(lines[21:]))
    rec = read_recording(broken)
    assert rec.problem == "stopped at line 21: not valid JSON"
    assert len(rec.events) == 19  # lines 2..20
    bad_field = tmp_path / "field.jsonl"
    bad_field.write_text("".join(lines[:20]) + json.dumps({**json.loads(lines[20]), "accepted": "two"}) + "\n")
    rec = read_recording(bad_field)
    assert rec.problem.startswith("stopped at line 21: ") and "accepted" in rec.problem
    proc = specdash("replay", "--summary", str(broken))
    assert proc.returncode == 0 and "stopped at line 21: not valid JSON" in proc.stdout


def test_a_truncated_file_replays_up_to_the_cut(live, tmp_path):
    path, events = live
    data = path.read_bytes()
    cut = tmp_path / "truncated.jsonl"
    cut.write_bytes(data[: len(data) - 40])  # the crash case: the last line half written
    rec = read_recording(cut)
    assert rec.problem.endswith("the line is cut off (truncated file)")
    assert len(rec.events) == len(events) - 1


def test_files_that_are_not_recordings_are_one_line_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n')
    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps({"event": "header", "schema": E.SCHEMA + 1}) + "\n")
    for path, says in ((empty, "empty file"), (other, "not a specdash recording header"),
                       (newer, "upgrade specdash"), (tmp_path / "missing.jsonl", "no such file")):
        with pytest.raises(SpecdashError, match=says):
            read_recording(path)
        assert_usage_error(specdash("replay", str(path)), str(path.name), says)


def test_run_record_writes_telemetry_too(tmp_path, smol_path):
    out = tmp_path / "run.jsonl"
    proc = specdash("run", "--target", "smollm2-135m", "--draft", "lookup", "--threads", "2", "--max-tokens", "12",
                    "--prompt", PROMPT, "--record", str(out), "--at", "4:k=7")
    assert_ok(proc)
    rec = read_recording(out)
    settings = [ev for ev in rec.events if isinstance(ev, E.SettingsEvent)]
    assert [s.command for s in settings] == ["", "k=7"]
    assert rec.header["command"] == "run" and rec.header["prompt"] == PROMPT
    assert f"recorded {len(rec.events) + 1} lines to {out}" in proc.stderr


def _fixture_recording(tmp_path, name: str, k: int):
    """The recorded fixture run as a recording file, its settings at fixed K=k."""
    from test_tui_support import load_replay

    path = tmp_path / name
    rec = Recorder(path, extra={"command": "test"})
    for ev in load_replay():
        if isinstance(ev, E.SettingsEvent):
            ev = dataclasses.replace(ev, k=k, target_path=None)
        rec(ev)
    rec.close()
    return path


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_compare_two_recordings_in_one_screen(tmp_path, snap_compare):
    from specdash.tui.compare import CompareApp

    a = read_recording(_fixture_recording(tmp_path, "k4.jsonl", 4))
    events = [ev for ev in read_recording(_fixture_recording(tmp_path, "k8.jsonl", 8)).events]
    # B: the same run with every second step's acceptance halved, as a K=8 run might do
    b_events = [dataclasses.replace(ev, accepted=ev.accepted // 2) if isinstance(ev, E.StepEvent) and ev.step % 2
                else ev for ev in events]
    b = dataclasses.replace(a, path=tmp_path / "k8.jsonl", events=b_events)
    app = CompareApp(a, b)
    assert app.label(0) == "A: lookup K=4" and app.label(1) == "B: lookup K=8"
    assert snap_compare(app, terminal_size=(140, 40))


def test_replay_keys_play_pause_speed_and_seek(tmp_path):
    import asyncio

    from specdash.engine.settings import EngineSettings
    from specdash.tui.app import DashboardOptions, SpecdashApp

    path = tmp_path / "r.jsonl"
    t = 100.0
    rec = Recorder(path)
    rec(E.SettingsEvent(source="engine", target="t", drafter="lookup", draft="lookup", k=4, target_path="/m/t.gguf"))
    for i in range(1, 121):  # two minutes of recorded time, a step a second
        t += 1.0
        rec(E.StepEvent(i, 4, "lookup", 4, 2, [1, 2, 3], ["a", "b", "c"], [True, True, False], 1.0, 2.0, 0.1,
                        i * 3, i * 3, t))
    rec.close()

    async def drive() -> None:
        source = ReplaySource(path)
        app = SpecdashApp(DashboardOptions(settings=EngineSettings(), screenshots_dir=str(tmp_path / "shots")),
                          source_factory=lambda s, p: source, local_telemetry=False, hints=lambda: [])
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.state.replay is not None, "the replay's position")
            await pilot.press("right_square_bracket", "right_square_bracket")  # 1x -> 2x -> 4x
            await until(pilot, lambda: source.speed == 4.0, "speed 4x")
            await pilot.press("space")
            await until(pilot, lambda: app.state.replay is not None and not app.state.replay.playing, "paused")
            await pilot.press("end")
            await until(pilot, lambda: app.state.stats.total.steps == 120, "120 steps")
            # step i was recorded i-1 s after the first: the end is at 119 s
            await pilot.press("left")  # back 10 s, to 109 s: steps 111.. are gone again
            await until(pilot, lambda: app.state.stats.total.steps == 110, "110 steps")
            await pilot.press("home")
            await until(pilot, lambda: app.state.stats.total.steps == 1 and app.state.replay.position == 0, "back at the start")
            await pilot.press("right")
            await until(pilot, lambda: app.state.stats.total.steps == 11, "11 steps")
            await pilot.press("plus")  # a recording cannot change K: it says why
            await pilot.press("s")
            await pilot.pause(0.2)
            assert "▶" not in app.query_one("#status").line and "replay 4x 0:10/" in app.query_one("#status").line
        shots = list((tmp_path / "shots").glob("*.json"))
        assert len(shots) == 1
        data = json.loads(shots[0].read_text())
        assert data["replay"]["file"] == str(path) and data["replay"]["offset_s"] == 10.0

    asyncio.run(drive())


# --- impossible numbers (issue 22) ---

def _synthetic(path, steps: int = 30) -> list[str]:
    """A small valid recording (settings, then a step a second); its lines."""
    rec = Recorder(path)
    rec(E.SettingsEvent(source="engine", target="t", drafter="lookup", draft="lookup", k=4, target_path="/m/t.gguf"))
    for i in range(1, steps + 1):
        rec(E.StepEvent(i, 4, "lookup", 3, 2, [1, 2, 3], ["a", "b", "c"], [True, True, False], 1.0, 2.0, 0.1,
                        i * 3, i * 3, 100.0 + i))
    rec.close()
    return path.read_text().splitlines(keepends=True)


IMPOSSIBLE = [  # a step's fields as a broken writer (or a hand edit) might leave them, and the refusal
    ({"verify_ms": "Infinity", "accepted": -7}, "StepEvent.accepted: -7 is negative"),  # fields in order
    ({"verify_ms": "Infinity"}, "StepEvent.verify_ms: inf is not a finite number"),
    ({"accepted": 5}, "StepEvent.accepted: 5 is more than drafted (3)"),
    ({"drafted": 9}, "StepEvent.drafted: 9 is more than k (4)"),
    ({"k": 1000, "drafted": 3}, "StepEvent.k: 1000 drafts; valid: 0..64"),
    ({"t": "NaN"}, "StepEvent.t: nan is not a finite number"),
    ({"draft_ms": "-Infinity"}, "StepEvent.draft_ms: -inf is not a finite number"),
    ({"n_past": 10**40}, "StepEvent.n_past: 100000000000... (41 digits) is beyond 2^53"),
    ({"from_draft": [True]}, "StepEvent.from_draft: 1 entries for 3 pieces"),
    ({"from_draft": [True, True, True], "accepted": 2}, "StepEvent.from_draft: 3 tokens from the draft, but 2 accepted"),
]


def _with_bad_line(tmp_path, patch: dict, at: int = 12):
    lines = _synthetic(tmp_path / "good.jsonl")
    step = json.loads(lines[at - 1])
    text = json.dumps({**step, **patch})
    for word in ("Infinity", "-Infinity", "NaN"):  # json writes these bare, as Python's json reads them
        text = text.replace(f'"{word}"', word)
    bad = tmp_path / "impossible.jsonl"
    bad.write_text("".join(lines[: at - 1]) + text + "\n" + "".join(lines[at:]))
    return bad


@pytest.mark.parametrize("patch, says", IMPOSSIBLE)
def test_impossible_numbers_stop_the_recording_at_their_line(tmp_path, patch, says):
    rec = read_recording(_with_bad_line(tmp_path, patch))
    assert rec.problem.startswith(f"stopped at line 12: {says}"), rec.problem
    assert len(rec.events) == 10  # lines 2..11


def test_replay_summary_says_where_an_impossible_recording_stops(tmp_path):
    bad = _with_bad_line(tmp_path, {"verify_ms": "Infinity", "accepted": -7})
    proc = specdash("replay", "--summary", str(bad))
    assert_ok(proc)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "stopped at line 12: StepEvent.accepted: -7 is negative" in proc.stdout


def _replay_dashboard(source, tmp_path) -> None:
    """The replay dashboard on `source`, played to its end at 16x; fails on any exception."""
    import asyncio

    from specdash.engine.settings import EngineSettings
    from specdash.tui.app import DashboardOptions, SpecdashApp

    async def drive() -> None:
        app = SpecdashApp(DashboardOptions(settings=EngineSettings(), screenshots_dir=str(tmp_path / "shots")),
                          source_factory=lambda s, p: source, local_telemetry=False, hints=lambda: [])
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(500):
                if app.state.replay is not None:
                    break
                await pilot.pause(0.02)
            await pilot.press("end")
            for _ in range(500):
                if app.state.state == "ended" and app.panels_current:
                    break
                await pilot.pause(0.02)
            await pilot.pause(0.3)  # a refresh tick: the charts draw what they were given
            assert app.state.state == "ended"
            app.save_screenshot(str(tmp_path / "end.svg"))
        assert app.return_code in (None, 0)

    asyncio.run(drive())


def test_the_replay_dashboard_stops_at_an_impossible_line(tmp_path):
    """It died in textual-plot's axis formatter (ValueError: cannot convert float NaN to integer)."""
    source = ReplaySource(_with_bad_line(tmp_path, {"verify_ms": "Infinity", "accepted": -7}))
    assert source.recording.problem.startswith("stopped at line 12: StepEvent.accepted: -7")
    _replay_dashboard(source, tmp_path)


def test_the_charts_never_receive_a_non_finite_value(tmp_path):
    """Whatever the contract lets through (here: events built in memory, which no reader
    checked), no NaN or infinity reaches a chart."""
    from specdash.records.recording import Recording

    path = tmp_path / "mem.jsonl"
    good = read_recording(path) if _synthetic(path) else None
    assert good is not None and not good.problem
    events = list(good.events)
    events[5] = dataclasses.replace(events[5], verify_ms=float("inf"))
    events[8] = dataclasses.replace(events[8], t=float("nan"))
    events.insert(10, E.CountersEvent(seconds=5e-324, tokens=9, steps=3, num_drafts=3, num_draft_tokens=9,
                                      num_accepted_tokens=4, num_accepted_tokens_per_pos=[3, 1], k=3, t=120.0))
    rec = Recording(path, good.header, events)
    _replay_dashboard(ReplaySource(path, recording=rec), tmp_path)


def test_r_after_a_recorded_error_plays_the_recording_again(tmp_path):
    """A recorded engine error is "error" on screen until the next position tick, and `r`
    is offered. It restarted the closed source: nothing played again, and seeks did
    nothing. Now a new source plays it from the start, counting nothing twice."""
    import asyncio

    from specdash.commands.replay import replay_factory
    from specdash.tui.app import DashboardOptions, SpecdashApp

    path = tmp_path / "crashed.jsonl"
    rec = Recorder(path)
    rec(E.SettingsEvent(source="engine", target="t", drafter="lookup", draft="lookup", k=4, target_path="/m/t.gguf",
                        t=100.0))
    for i in range(1, 4):
        rec(E.StepEvent(i, 4, "lookup", 4, 2, [1, 2, 3], ["a", "b", "c"], [True, True, False], 1.0, 2.0, 0.1,
                        i * 3, i * 3, 100.0 + i * 0.1))
    rec(E.StatusEvent("error", "engine thread died", t=100.5))
    rec(E.NoticeEvent("info", "the dashboard stayed open", t=160.0))  # the replay waits here
    rec.close()

    async def drive() -> None:
        # 0.5x: the error stays on screen for 2 s, until the next position tick
        app = SpecdashApp(DashboardOptions(), source_factory=replay_factory(read_recording(path), 0.5),
                          local_telemetry=False, hints=lambda: [])
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.state.state == "error", "the recorded error")
            first = app.source
            await pilot.press("r")
            await until(pilot, lambda: app.source is not first and app.state.replay is not None
                        and app.state.replay.position == 0.0, "a rewind to the start")
            await until(pilot, lambda: app.state.state == "error", "the recording played again")
            assert app.state.stats.total.steps == 3

    asyncio.run(drive())


def test_a_recording_is_the_owners_only_and_never_written_through_a_symlink(tmp_path):
    import stat

    from specdash.contract.errors import SpecdashError
    from specdash.records.recording import Recorder

    rec = Recorder(tmp_path / "mine.jsonl")
    rec.close()
    assert stat.S_IMODE((tmp_path / "mine.jsonl").stat().st_mode) == 0o600
    target = tmp_path / "someone-elses.txt"
    target.write_text("keep me")
    (tmp_path / "planted.jsonl").symlink_to(target)
    with pytest.raises(SpecdashError, match="planted.jsonl"):
        Recorder(tmp_path / "planted.jsonl")
    assert target.read_text() == "keep me"
