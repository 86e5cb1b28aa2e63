"""One set of panels for every source: the same dashboard, fed three scripted sources
that speak only the event contract (an engine's recorded run, a remote server's counter
polls, a replay with recorded telemetry), shows each correctly. No widget knows which
source it is drawing.

The scripts are data, not fakes of a feature: the engine script is a real recorded run
(tests/fixtures/replay_smollm2_lookup.jsonl); the remote one is what RemoteSource emits
for a llama-server (its own tests run it against a real server)."""

from __future__ import annotations

import threading

import pytest

from specdash.contract import events as E
from specdash.engine.settings import EngineSettings
from specdash.engine.stats import SpecCounters
from specdash.contract.events import CountersEvent, SettingsEvent, StatusEvent, StepEvent, TelemetryEvent
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.reducer import DashState
from test_tui_support import FixedSampler, load_replay, sync


class ScriptedSource:
    """Emits a fixed list of contract events from its own thread, records commands."""

    def __init__(self, kind: str, events: list[E.Event], telemetry: str):
        self.kind, self.label, self.telemetry = kind, f"scripted {kind}", telemetry
        self.events = events
        self.sent: list[E.Command] = []
        self.thread: threading.Thread | None = None
        self.supports: frozenset[str] = frozenset()  # what it takes: its settings events say

    def presets(self) -> list:
        return []

    def start(self, emit) -> None:
        self.thread = threading.Thread(target=lambda: [emit(ev) for ev in self.events], daemon=True)
        self.thread.start()

    def send(self, cmd: E.Command) -> None:
        self.sent.append(cmd)

    def close(self) -> None:
        pass


def app_for(source: ScriptedSource, *, local_telemetry: bool) -> SpecdashApp:
    opts = DashboardOptions(settings=EngineSettings(target="smollm2-135m", draft="lookup"), refresh=0.1,
                            screenshots_dir="/nonexistent")
    app = SpecdashApp(opts, source_factory=lambda settings, prompts: source,
                      sampler=FixedSampler() if local_telemetry else None, cpu_meter=lambda: 1.0,
                      hints=lambda: [], local_telemetry=local_telemetry)
    app.notes = []  # type: ignore[attr-defined]
    app.notify = lambda message, *a, severity="information", **k: app.notes.append(str(message))  # type: ignore[method-assign]
    return app


async def settled(pilot, n_events: int) -> None:
    app = pilot.app
    for _ in range(500):
        if app.state.events >= n_events and app.panels_current:
            break
        await pilot.pause(0.02)
    assert app.state.events >= n_events, "the script did not reach the screen"
    app._update_panels()
    await pilot.pause()


def titles(app: SpecdashApp, panel: str) -> tuple[str, str]:
    widget = app.query_one(f"#{panel}")
    return str(widget.border_title), str(widget.border_subtitle)


# --- the scripts -------------------------------------------------------------------------------

ENGINE = load_replay()


def remote_script() -> list[E.Event]:
    settings = SettingsEvent(
        source="remote", target="Qwen2.5-Coder-1.5B-Instruct", drafter="ngram-simple", k=8,
        unavailable={"k": "llama-server sets the draft size at launch (--spec-draft-n-max)",
                     "adaptive": "llama-server has no adaptive K", "experts": "set at launch",
                     "pause": "a server cannot be paused from here"})
    polls = [CountersEvent(seconds=1.0, tokens=30 + i, steps=12, num_drafts=10, num_draft_tokens=60,
                           num_accepted_tokens=18 + i, num_accepted_tokens_per_pos=[8, 5, 3, 2, i % 2, 0],
                           prompt_tokens=0, k=8, t=100.0 + i) for i in range(12)]
    server = E.ServerEvent(url="http://127.0.0.1:8080", state="up", backend="llamacpp", model="qwen")
    return [settings, StatusEvent("running", t=99.0), *polls, server]


def replay_script() -> list[E.Event]:
    """The recorded engine run with the recorded machine's telemetry: 4 cores."""
    from specdash.telemetry import ProcessStats

    nodes = FixedSampler().sample().numa_nodes[:1]
    tel = TelemetryEvent(core_loads=[90.0, 10.0, 55.0, 70.0], numa_nodes=list(nodes),
                         process=ProcessStats(7, 500 * 2**20, 150.0, 37.5, 5), t=1.0)
    events = [tel if i == 5 else ev for i, ev in enumerate(ENGINE)]
    return [ev if not isinstance(ev, SettingsEvent) else _as_replay(ev) for ev in events]


def _as_replay(ev: SettingsEvent) -> SettingsEvent:
    import dataclasses

    return dataclasses.replace(ev, source="replay", unavailable={**ev.unavailable, "k": "a recording cannot change"})


# --- the tests -------------------------------------------------------------------------------------

@sync
async def test_an_engines_recorded_run_fills_every_panel():
    source = ScriptedSource("engine", ENGINE, "local")
    app = app_for(source, local_telemetry=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await settled(pilot, len(ENGINE))
        steps = [ev for ev in ENGINE if isinstance(ev, StepEvent)]
        recent = SpecCounters()
        for ev in steps[-128:]:
            recent.add(ev)
        assert titles(app, "acceptance")[0] == (f"Acceptance {recent.acceptance_rate:.0%} · "
                                                f"mean len {recent.mean_accepted_length:.2f}")
        assert titles(app, "kpanel")[0] == "K 2 · lookup"  # the recording ends at K=2
        assert titles(app, "cpu")[0].startswith("CPU · 16 cores")  # this machine's (fixed) sampler
        assert "tok/s" in app.query_one("#status").line


@sync
async def test_acceptance_says_none_lately_not_none_yet_after_a_stretch_at_k0():
    """Adaptive K at 0 for more than the panel's window of steps: the title keeps what this
    prompt's drafts did instead of claiming nothing was ever drafted."""
    import dataclasses

    steps = [ev for ev in ENGINE if isinstance(ev, StepEvent)]
    last = steps[-1]
    plain = [dataclasses.replace(last, step=last.step + i + 1, k=0, drafter="none", drafted=0, accepted=0,
                                 tokens=last.tokens[-1:], pieces=last.pieces[-1:], from_draft=[False],
                                 t=last.t + 0.01 * (i + 1)) for i in range(130)]
    source = ScriptedSource("engine", [*ENGINE, *plain], "local")
    app = app_for(source, local_telemetry=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await settled(pilot, len(ENGINE) + len(plain))
        start = max(i for i, ev in enumerate(ENGINE) if isinstance(ev, E.PrefillEvent))  # the last prompt's
        run = SpecCounters()
        for ev in [*ENGINE[start:], *plain]:
            if isinstance(ev, StepEvent):
                run.add(ev)
        assert titles(app, "acceptance")[0] == f"Acceptance · none lately ({run.acceptance_rate:.0%} this prompt)"


@sync
async def test_a_remote_servers_counter_polls_fill_the_same_panels():
    script = remote_script()
    source = ScriptedSource("remote", script, "none")
    app = app_for(source, local_telemetry=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await settled(pilot, len(script))
        polls = [ev for ev in script if isinstance(ev, CountersEvent)]
        accepted = sum(p.num_accepted_tokens for p in polls)
        drafted = sum(p.num_draft_tokens for p in polls)
        drafts = sum(p.num_drafts for p in polls)
        title = titles(app, "acceptance")[0]
        assert title == f"Acceptance {accepted / drafted:.0%} · mean len {1 + accepted / drafts:.2f}"
        bars = app.query_one("#pos-plot")._datasets[0].y.tolist()
        assert bars[:3] == [8 / 10, 5 / 10, 3 / 10]  # accepted at position i / drafts
        # tok/s over the last 2 s of the server's time: the last two polls
        assert titles(app, "throughput")[0] == f"tok/s {(polls[-2].tokens + polls[-1].tokens) / 2:.1f}"
        assert titles(app, "kpanel")[0] == "K 8 · ngram-simple"
        # No telemetry: said once, in the CPU panel, which takes the memory panel's place.
        assert titles(app, "cpu")[0] == "CPU · memory"
        assert "a remote server does not send it" in str(app.query_one("#cpu-view").render())
        assert not app.query_one("#numa").display
        # A control the source refuses says why, and sends nothing.
        await pilot.press("plus")
        await pilot.pause()
        assert not source.sent
        assert any("--spec-draft-n-max" in note for note in app.notes)  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["remote", "a kind no panel knows"])
@sync
async def test_a_server_down_from_the_start_says_once_that_no_telemetry_will_come(kind):
    """No settings event ever arrives: what the source declares (Source.telemetry) says
    what it provides, whatever its kind. No "sampling…" for loads that will never come,
    no "no memory information on this system"."""
    script = [StatusEvent("loading", "connecting", t=1.0),
              StatusEvent("down", "http://127.0.0.1:9: cannot connect (Connection refused)", t=2.0)]
    source = ScriptedSource(kind, script, "none")
    app = app_for(source, local_telemetry=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settled(pilot, len(script))
        await pilot.pause(0.3)
        view = app.query_one("#cpu-view")
        lines = [view.render_line(y).text for y in range(view.size.height)]
        text = " ".join(" ".join(lines).split())
        assert "No CPU or memory telemetry: a remote server does not send it" in text, lines
        assert "run specdash on the server's host" in text, lines
        assert "sampling" not in text and not app.query_one("#numa").display
        assert titles(app, "cpu") == ("CPU · memory", "")
        assert app.query_one("#cpu").size.width > 40  # the memory panel's columns too


@sync
async def test_after_a_request_ends_the_status_line_and_the_chart_title_agree():
    """A server idles after its request: polls with nothing generated. The status line,
    the tok/s chart's title and its line all keep the last request's speed (one rule,
    stated in the help), and the title says it is the last request's."""
    script = remote_script()
    idle = [CountersEvent(seconds=1.0, tokens=0, steps=0, num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0,
                          num_accepted_tokens_per_pos=[], k=8, t=112.0 + i) for i in range(10)]
    script = script[:-1] + idle + script[-1:]
    source = ScriptedSource("remote", script, "none")
    app = app_for(source, local_telemetry=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await settled(pilot, len(script))
        polls = [ev for ev in script if isinstance(ev, CountersEvent) and ev.tokens]
        last = (polls[-2].tokens + polls[-1].tokens) / 2  # the last 2 s of decoding
        assert titles(app, "throughput")[0] == f"tok/s {last:.1f} (last request)"
        assert f"│ {last:.1f} tok/s │" in app.query_one("#status").line
        # The chart holds too (no zeros drawn for the idle polls): it ends on the last
        # request's bins (smoothed over 4 bins, here 4 polls).
        chart = app.state.stats.timeline(app.state.window)
        assert chart.tokens_per_s[-1] == sum(p.tokens for p in polls[-4:]) / 4
        await pilot.press("question_mark")
        await pilot.pause()
        lines = [w.render_line(y).text for w in app.screen.query("Static") for y in range(w.size.height)]
        help_text = " ".join(" ".join(lines).split())
        assert "After a request ends it holds that request's" in help_text, lines


@sync
async def test_a_replay_shows_the_recorded_machine_not_this_one():
    script = replay_script()
    source = ScriptedSource("replay", script, "recorded")
    app = app_for(source, local_telemetry=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await settled(pilot, len(script))
        assert titles(app, "cpu")[0] == "CPU · 4 cores · 56%"  # (90+10+55+70)/4, as recorded
        assert titles(app, "numa")[1] == "RSS 500.0M"
        assert titles(app, "kpanel")[0] == "K 2 · lookup"


def test_the_reducer_alone_gives_the_same_numbers_as_the_panels():
    """The fold the panels render from, without Textual: counters events and step events
    land in the same counters."""
    state = DashState()
    for ev in remote_script():
        state.feed(ev)
    assert state.source == "remote" and state.state == "running"
    assert state.stats.total.num_drafts == 120 and state.stats.total.steps == 144
    assert state.stats.total.mean_accepted_length == 1 + sum(18 + i for i in range(12)) / 120
    assert state.server is not None and state.server.backend == "llamacpp"
    state = DashState()
    for ev in ENGINE:
        state.feed(ev)
    steps = [ev for ev in ENGINE if isinstance(ev, StepEvent)]
    assert state.stats.total.steps == len(steps)
    assert state.k_in_force() == 2
    # two K changes in the recording (4 -> 6 -> 2): two hot-swap markers on the charts
    assert [label for _, label in state.stats.markers] == ["K=6", "K=2"]
    times = [t for t, _ in state.stats.markers]
    assert 0 < times[0] < times[1] < state.stats.decode_time
