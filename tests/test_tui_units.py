"""The dashboard's non-drawing parts: stats folded from events, the engine thread's
driver, theme files, chart geometry."""

from __future__ import annotations

import statistics
import threading

import pytest

from specdash.contract import events as C
from specdash.engine.settings import EngineSettings
from specdash.contract.events import PrefillEvent, PromptEvent, SettingsEvent, StatusEvent, StepEvent, Summary
from specdash.contract.errors import SpecdashError
from specdash.sources.base import Outbox
from specdash.sources.embedded import EmbeddedSource, PromptQueue, ShutdownRequested, WorkItem
from specdash.tui.live_stats import LiveStats
from specdash.tui.themes import load_theme, load_themes, theme_dirs
from specdash.tui.widgets.plots import nice_ceiling
from specdash.tui.widgets.system import hbar


def step(n: int, t: float, *, k: int = 4, drafted: int = 4, accepted: int = 2, ms: float = 100.0) -> StepEvent:
    tokens = list(range(accepted + 1))
    return StepEvent(
        step=n, k=k, drafter="lookup" if drafted else "none", drafted=drafted, accepted=accepted,
        tokens=tokens, pieces=["x"] * len(tokens), from_draft=[True] * accepted + [False],
        draft_ms=ms / 4, verify_ms=ms / 2, other_ms=ms / 4, n_past=10 + n, n_generated=n, t=t,
    )


def settings_event(k: int = 4, paused: bool = False) -> SettingsEvent:
    return SettingsEvent(source="engine", target="t", drafter="lookup", k=k, temperature=0.0, top_k=0,
                         top_p=1.0, adaptive=False, paused=paused)


# --- LiveStats -----------------------------------------------------------------------

def test_tokens_per_s_uses_wall_time_between_steps_not_step_cost():
    st = LiveStats(rate_window_s=10.0)
    st.feed(PrefillEvent(10, 50.0))
    st.feed(step(1, t=100.0, ms=100.0))  # first of a stretch: its own cost (0.1 s) stands in
    st.feed(step(2, t=100.5, ms=100.0))  # 0.5 s of wall time, although the step cost 0.1 s
    st.feed(step(3, t=101.0, ms=100.0))
    # 3 tokens per step; 0.1 + 0.5 + 0.5 s
    assert st.tokens_per_s == pytest.approx(9 / 1.1)


def test_prefill_pause_and_settings_gaps_are_not_decode_time():
    st = LiveStats(rate_window_s=100.0)
    st.feed(step(1, t=10.0, ms=200.0))
    st.feed(settings_event(paused=True))
    st.feed(settings_event(paused=False))
    st.feed(step(2, t=70.0, ms=200.0))  # a minute later: paused, not slow
    assert st.tokens_per_s == pytest.approx(6 / 0.4)


def poll(tokens: int, t: float, *, drafted: int = 0, accepted: int = 0) -> C.CountersEvent:
    return C.CountersEvent(seconds=1.0, tokens=tokens, steps=tokens - accepted, num_drafts=drafted // 4,
                           num_draft_tokens=drafted, num_accepted_tokens=accepted,
                           num_accepted_tokens_per_pos=[], t=t)


def test_after_a_request_ends_the_rates_hold_the_last_requests():
    """The one tok/s rule: a server's polls that generated nothing (it idles between
    requests) are not decode time. tok/s, acceptance and the charts keep the last
    request's numbers, and `idle` says so."""
    st = LiveStats(rate_window_s=2.0)
    for i in range(6):
        st.feed(poll(40 + 2 * i, t=float(i), drafted=40, accepted=20))
    busy = st.tokens_per_s
    assert busy == pytest.approx((48 + 50) / 2) and not st.idle
    acceptance, chart = st.recent_counters().acceptance_rate, st.timeline(60.0)
    for i in range(6, 300):  # five minutes of an idle server, polled each second
        st.feed(poll(0, t=float(i)))
    assert st.idle and st.tokens_per_s == busy
    assert st.recent_counters().acceptance_rate == acceptance
    idle_chart = st.timeline(60.0)
    assert idle_chart.tokens_per_s == chart.tokens_per_s and idle_chart.xs == chart.xs  # no zeros drawn
    # Draft counters that move in a poll with no new tokens (llama-server's come in when a
    # request ends) still count for acceptance, and add no time.
    st.feed(poll(0, t=301.0, drafted=8, accepted=8))
    assert st.tokens_per_s == busy and st.recent_counters().num_draft_tokens == 6 * 40 + 8
    # The next request: live numbers again.
    st.feed(poll(30, t=302.0))
    assert not st.idle and st.tokens_per_s == pytest.approx((50 + 30) / 2)


def test_an_engines_prompt_ends_and_its_rate_holds():
    st = LiveStats(rate_window_s=10.0)
    st.feed(step(1, t=100.0, ms=100.0))
    st.feed(step(2, t=100.5, ms=100.0))
    st.feed(Summary(text="xxxxxx", stop_reason="eos", n_prompt=10, n_generated=6, num_drafts=2,
                    num_draft_tokens=8, num_accepted_tokens=4, num_accepted_tokens_per_pos=[2, 1, 1, 0],
                    acceptance_rate=0.5, mean_accepted_length=3.0, tokens_per_s=10.0,
                    prefill_tokens_per_s=100.0, prefill_ms=100.0, decode_s=0.6, draft_ms=1.0,
                    verify_ms=1.0, other_ms=1.0, steps=2))
    assert st.idle and st.tokens_per_s == pytest.approx(3 / 0.5)  # the run without its first step


def test_after_an_engines_run_the_rate_is_the_whole_runs():
    """A short run's last seconds can hold its one probe of a draft: the window would
    show a loss the run did not have. Once the run's Summary is in, tok/s is the run's,
    without its first step (warm-up), as the plain reference is timed."""
    st = LiveStats(rate_window_s=1.0)
    st.feed(step(1, t=100.0, accepted=0, ms=100.0))
    for i in range(2, 11):
        st.feed(step(i, t=100.0 + 0.1 * (i - 1), accepted=0))  # 1 token per 0.1 s
    st.feed(step(11, t=101.8, accepted=0))  # a probe: 0.9 s for its one token
    assert st.tokens_per_s == pytest.approx(2 / 1.0)  # the window: 0.1 s + the probe's 0.9 s
    st.feed(Summary(text="x" * 11, stop_reason="max_tokens", n_prompt=10, n_generated=11, num_drafts=1,
                    num_draft_tokens=4, num_accepted_tokens=0, num_accepted_tokens_per_pos=[0, 0, 0, 0],
                    acceptance_rate=0.0, mean_accepted_length=1.0, tokens_per_s=11 / 1.9,
                    prefill_tokens_per_s=100.0, prefill_ms=100.0, decode_s=1.9, draft_ms=1.0,
                    verify_ms=1.0, other_ms=1.0, steps=11))
    assert st.idle and st.tokens_per_s == pytest.approx(10 / 1.8)  # steps 2..11
    st.feed(PrefillEvent(10, 50.0))
    assert st.idle and st.tokens_per_s == pytest.approx(10 / 1.8)  # the next prompt prefills
    st.feed(step(1, t=200.0, accepted=0, ms=100.0))  # the next run: the window again
    assert not st.idle and st.tokens_per_s == pytest.approx(3 / 1.1)  # its step, the probe, one before


def test_rate_window_drops_old_steps():
    st = LiveStats(rate_window_s=1.0)
    st.feed(step(1, t=0.0, accepted=0, ms=500.0))  # 1 token in 0.5 s
    for i in range(2, 6):
        st.feed(step(i, t=(i - 1) * 0.5, accepted=3))  # 4 tokens per 0.5 s
    assert st.tokens_per_s == pytest.approx(8.0)


def test_a_plain_run_reads_plain_speed():
    """Step times skew slow on a busy host: with the median as the reference a plain run
    (whose tok/s is tokens over time) read 0.90-0.98x plain in tmux."""
    st = LiveStats(rate_window_s=2.0)
    st.feed(PrefillEvent(10, 50.0))
    t, dts = 0.0, [0.1, 0.08, 0.08, 0.08, 0.13, 0.08, 0.09, 0.08, 0.15, 0.08, 0.08, 0.11]
    for i, dt in enumerate(dts, 1):
        t += dt
        st.feed(step(i, t=t, k=0, drafted=0, accepted=0, ms=dt * 1e3))
    st.feed(Summary(text="x" * 12, stop_reason="max_tokens", n_prompt=10, n_generated=12, num_drafts=0,
                    num_draft_tokens=0, num_accepted_tokens=0, num_accepted_tokens_per_pos=[],
                    acceptance_rate=None, mean_accepted_length=1.0, tokens_per_s=12 / sum(dts),
                    prefill_tokens_per_s=100.0, prefill_ms=100.0, decode_s=sum(dts), draft_ms=0.0,
                    verify_ms=1.0, other_ms=1.0, steps=12))
    assert st.tokens_per_s is not None and st.plain_tokens_per_s is not None
    assert st.tokens_per_s / st.plain_tokens_per_s == pytest.approx(1.0)
    assert 1 / statistics.median(dts[1:]) / st.plain_tokens_per_s > 1.05  # what the median said


def test_plain_reference_skips_warmup_and_outliers():
    st = LiveStats()
    assert st.plain_tokens_per_s is None
    st.feed(PrefillEvent(10, 50.0))
    st.feed(step(1, t=0.0, k=0, drafted=0, accepted=0, ms=3000.0))  # first step: warm-up
    st.feed(step(2, t=2.0, k=0, drafted=0, accepted=0))  # a 2 s outlier
    for i in range(3, 8):
        st.feed(step(i, t=2.0 + (i - 2) * 0.05, k=0, drafted=0, accepted=0))
    st.feed(step(8, t=2.4, k=4, drafted=4, accepted=4))  # speculative: not plain
    assert st.plain_tokens_per_s == pytest.approx(20.0)


def test_series_bins_by_decode_time_and_smooths_over_the_window():
    st = LiveStats(bin_seconds=0.5, rate_window_s=1.0)
    st.feed(PrefillEvent(10, 50.0))
    t = 0.0
    for i in range(1, 21):  # 0.25 s per step: two steps per bin
        t += 0.25
        st.feed(step(i, t=t, accepted=4 if i <= 10 else 0, ms=250.0))
    bins = st.series(100)
    assert len(bins) == 10
    assert all(b.steps == 2 for b in bins)
    assert [b.acceptance for b in bins] == [1.0] * 5 + [0.0] * 5
    smoothed = st.smoothed(6)
    # each value covers two bins (1 s): the one over bins 5 and 6 mixes 1.0 and 0.0
    assert [a for a, _ in smoothed] == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert smoothed[-1][1] == pytest.approx(4.0)  # 1 token per 0.25 s


def test_recent_counters_use_spec_counters_definitions():
    st = LiveStats(recent_steps=2)
    st.feed(step(1, t=0.0, drafted=4, accepted=4))
    st.feed(step(2, t=0.1, drafted=4, accepted=1))
    st.feed(step(3, t=0.2, drafted=2, accepted=0))
    recent = st.recent_counters()
    assert recent.steps == 2
    assert recent.acceptance_rate == pytest.approx(1 / 6)
    assert recent.per_pos_rate == [0.5, 0.0, 0.0, 0.0]
    assert st.total.steps == 3


# --- EmbeddedSource ---------------------------------------------------------------------

class ScriptSession:
    """Yields `per_run` steps per prompt, each after a command check, like the engine."""

    def __init__(self, settings, progress, *, per_run=5, gate: threading.Event | None = None):
        progress("loading target", None)
        self.settings = settings
        self.sent: list = []
        self.per_run = per_run
        self.gate = gate
        self.closed = False
        self.stop = threading.Event()

    def send(self, cmd):
        self.sent.append(cmd)
        if isinstance(cmd, C.Stop):
            self.stop.set()

    def apply_pending(self):
        return []  # commands wait for the next run, as before

    def run(self, prompt, max_tokens=None):
        self.stop.clear()
        yield settings_event()
        yield PrefillEvent(3, 1.0)
        for i in range(1, self.per_run + 1):
            if self.gate is not None:
                self.gate.wait()
            if self.stop.is_set():
                break
            yield step(i, t=float(i))
        yield Summary("", "stopped" if self.stop.is_set() else "max_tokens", 3, 0, 0, 0, 0, [], None,
                      0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)

    def close(self):
        self.closed = True


def make_source(prompts, *, clock=None, **session_kw):
    pings = []
    sessions = []

    def factory(settings, progress):
        sessions.append(ScriptSession(settings, progress, **session_kw))
        return sessions[-1]

    source = EmbeddedSource(factory, EngineSettings(), prompts)
    outbox = Outbox(lambda: pings.append(1), flush_interval=1.0, clock=clock or (lambda: 0.0))
    return source, outbox, pings, sessions


def wait_for(source, outbox, predicate):
    while not any(predicate(x) for x in list(outbox.items)):
        source.thread.join(0.01)
        assert source.thread.is_alive() or any(predicate(x) for x in list(outbox.items)), "source ended"


def is_status(state):
    return lambda x: isinstance(x, StatusEvent) and x.state == state


def test_source_runs_prompts_in_order_then_idles_and_closes():
    prompts = PromptQueue()
    prompts.push(WorkItem("one", "first prompt"))
    prompts.push(WorkItem("two", "second prompt"))
    source, outbox, pings, sessions = make_source(prompts)
    source.start(outbox.emit)
    wait_for(source, outbox, is_status("idle"))
    source.close()
    source.thread.join(10)
    assert not source.thread.is_alive()
    items = list(outbox.items)
    assert [x.state for x in items if isinstance(x, StatusEvent)][:3] == ["loading", "loading", "ready"]
    started = [x.title for x in items if isinstance(x, PromptEvent)]
    assert started == ["one", "two"]
    kinds = [type(x).__name__ for x in items]
    assert kinds.count("StepEvent") == 10 and kinds.count("Summary") == 2
    assert sessions[0].closed


def test_outbox_pings_are_rate_limited_while_steps_stream():
    prompts = PromptQueue()
    prompts.push(WorkItem("one", "p"))
    source, outbox, pings, _ = make_source(prompts, per_run=50)
    # The clock never advances: steps alone never trigger a ping; rare events do.
    source.start(outbox.emit)
    wait_for(source, outbox, is_status("idle"))
    source.close()
    source.thread.join(10)
    steps = sum(isinstance(x, StepEvent) for x in outbox.items)
    assert steps == 50
    # loading x2, ready, prompt, settings, prefill, summary, idle: steps add no pings
    assert len(pings) == 8


def test_source_holds_commands_until_the_session_exists():
    prompts = PromptQueue()
    source, outbox, _, sessions = make_source(prompts)
    source.send(C.SetK(7))
    source.start(outbox.emit)
    wait_for(source, outbox, is_status("idle"))
    assert sessions[0].sent == [C.SetK(7)]
    source.send(C.SetK(8))
    assert sessions[0].sent == [C.SetK(7), C.SetK(8)]
    source.close()
    source.thread.join(10)


def test_new_prompt_abandons_the_running_one():
    gate = threading.Event()
    prompts = PromptQueue([WorkItem("w", "workload")])
    source, outbox, _, sessions = make_source(prompts, per_run=1000, gate=gate)
    source.start(outbox.emit)
    wait_for(source, outbox, lambda x: isinstance(x, PromptEvent))
    source.send(C.NewPrompt("my prompt", "typed"))
    gate.set()
    wait_for(source, outbox, is_status("idle"))
    source.close()
    source.thread.join(10)
    items = list(outbox.items)
    started = [x.title for x in items if isinstance(x, PromptEvent)]
    assert started == ["w", "typed"]  # the workload stops cycling after a typed prompt
    # the first run was cut after one step; no Stop was needed for a running engine
    first_run = []
    for x in items:
        if isinstance(x, PromptEvent) and x.title == "typed":
            break
        first_run.append(x)
    assert sum(isinstance(x, StepEvent) for x in first_run) == 1
    assert sessions[0].sent == [C.Stop()]  # only the one close() sent


def test_close_during_loading_abandons_the_load():
    prompts = PromptQueue()
    reached = threading.Event()

    def factory(settings, progress):
        reached.set()
        source.close()
        progress("downloading", 0.5)  # the next report after close raises
        raise AssertionError("not reached")

    source = EmbeddedSource(factory, EngineSettings(), prompts)
    got: list = []
    source.start(got.append)
    source.thread.join(10)
    assert reached.is_set()
    assert not any(isinstance(x, StatusEvent) and x.state in ("ready", "error") for x in got)


def test_a_failing_session_becomes_an_error_status_not_an_exception():
    def factory(settings, progress):
        raise SpecdashError("model 'nope': not a known model and no such file")

    source = EmbeddedSource(factory, EngineSettings(), PromptQueue())
    got: list = []
    source.start(got.append)
    source.thread.join(10)
    errors = [x for x in got if isinstance(x, StatusEvent) and x.state == "error"]
    assert [e.message for e in errors] == ["model 'nope': not a known model and no such file"]


def test_progress_reports_are_throttled_but_the_final_one_passes():
    now = [0.0]
    got: list = []
    source = EmbeddedSource(lambda s, p: None, EngineSettings(), PromptQueue(), clock=lambda: now[0])
    source._emit = got.append
    for i in range(100):
        now[0] = i * 0.01
        source._progress("downloading", i / 100)
    source._progress("downloading", 1.0)
    loading = [x for x in got if isinstance(x, StatusEvent) and x.state == "loading"]
    assert 9 <= len(loading) <= 12
    assert loading[-1].fraction == 1.0
    with pytest.raises(ShutdownRequested):
        source.close()
        source._progress("x", None)


# --- themes ------------------------------------------------------------------------------

def test_bundled_themes_load():
    themes = load_themes(theme_dirs()[:1])
    assert {"specdash-dark", "specdash-light"} <= set(themes)
    assert themes["specdash-light"].dark is False
    assert themes["specdash-dark"].variables["draft-token"]


@pytest.mark.parametrize(
    "body, complaint",
    [
        ('name = "x"\nprimary = "#123456"\ncolour = "red"\n', "unknown key 'colour'"),
        ('name = "x"\nprimary = "not-a-colour"\n', "primary = 'not-a-colour': not a colour"),
        ('primary = "#123456"\n', "'name' must be a non-empty string"),
        ('name = "x"\n', "'primary'"),
        ('name = "x"\nprimary = "#123456"\ndark = "yes"\n', "dark = 'yes': must be true or false"),
        ('name = "x"\nprimary = [\n', "invalid TOML"),
    ],
)
def test_bad_theme_files_name_the_file_and_key(tmp_path, body, complaint):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(SpecdashError) as err:
        load_theme(path)
    assert str(path) in str(err.value) and complaint in str(err.value)


def test_user_theme_overrides_a_bundled_one(tmp_path):
    (tmp_path / "mine.toml").write_text('name = "specdash-dark"\nprimary = "#FF0000"\n')
    themes = load_themes([theme_dirs()[0], tmp_path])
    assert themes["specdash-dark"].primary == "#FF0000"


# --- chart geometry ------------------------------------------------------------------------

def test_nice_ceiling_and_hbar():
    assert [nice_ceiling(v) for v in (0.7, 1.0, 3.1, 19.0, 41.0, 260.0)] == [1.0, 1.0, 5.0, 20.0, 50.0, 500.0]
    assert hbar(0.5, 4) == "██  "
    assert hbar(1 / 16, 2) == "▏ "
    assert hbar(2.0, 3) == "███"
