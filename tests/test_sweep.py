"""The K sweep: planned runs driven through commands on the one engine, results folded
from the event stream, settings put back at the end or on cancel."""

from __future__ import annotations

import json

from cli_helpers import assert_ok, specdash
from specdash.contract import events as E
from specdash.tuning.sweep import Sweep
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.screens.sweep import SweepScreen
from test_tui_support import FixedSampler, sync

BEFORE = E.SettingsEvent(source="engine", target="smollm2-135m", drafter="lookup", draft="lookup", k=3,
                         adaptive=True, max_tokens=256)


def summary(tps: float, drafted: int = 10, accepted: int = 6, drafts: int = 4) -> E.Summary:
    return E.Summary("", "max_tokens", 10, 32, drafts, drafted, accepted, [], accepted / drafted if drafted else None,
                     0.0, tps, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 20)


def run_through(sweep: Sweep, speeds: dict, accepted: dict | None = None) -> list[E.Command]:
    """Answer each planned run like an engine would: its PromptEvent, the SettingsEvent
    with the commands applied, then a Summary. `speeds` by K, or by (K, T) when the sweep
    sets temperatures; `accepted` (same keys) the accepted tokens of 10 drafted."""
    sent = sweep.start()
    rounds: dict = {}
    temperature = sweep.before.temperature
    while not sweep.finished:
        k = next(c.k for c in sent if isinstance(c, E.SetK))
        temperature = next((c.temperature for c in sent if isinstance(c, E.SetSampling)), temperature)
        title = next(c.title for c in sent if isinstance(c, E.NewPrompt))
        assert sweep.feed(E.PromptEvent(title, sweep.prompt)) == []
        assert sweep.feed(E.SettingsEvent(source="engine", target="t", drafter="lookup", k=k,
                                          temperature=temperature)) == []
        key = (k, temperature) if sweep.sets_temperature else k
        i = rounds.get(key, 0)
        rounds[key] = i + 1
        sent = sweep.feed(summary(speeds[key][i], accepted=(accepted or {}).get(key, 6)))
    return sent


def test_plan_interleaves_rounds_and_picks_the_fastest_k():
    sweep = Sweep("p", BEFORE, ks=[0, 2, 4], rounds=2, max_tokens=32, title="my prompt")
    # (round, K, T): round 2 starts elsewhere; T is the one running, left alone
    assert sweep.plan == [(0, 0, 0.0), (0, 2, 0.0), (0, 4, 0.0), (1, 2, 0.0), (1, 4, 0.0), (1, 0, 0.0)]
    first = sweep.start()
    assert first[0] == E.SetAdaptive(False)  # K is fixed while sweeping
    assert first[1] == E.SetK(0) and isinstance(first[2], E.NewPrompt) and first[2].max_tokens == 32
    restore = run_through(sweep, {0: [10.0, 12.0], 2: [15.0, 17.0], 4: [13.0, 9.0]})
    assert [p.k for p in sweep.measured] == [0, 2, 4]
    assert sweep.best.k == 2 and sweep.best.tokens_per_s == 16.0 and sweep.best.spread == (15.0, 17.0)
    assert sweep.plain == 11.0
    # back to K=3 adaptive, then the prompt that was running, under its own title
    assert restore == [E.SetK(3), E.SetAdaptive(True), E.NewPrompt("p", "my prompt")]


def test_a_summary_of_another_run_is_not_a_result_and_cancel_restores():
    sweep = Sweep("p", BEFORE, ks=[0, 8], rounds=1)
    sweep.start()
    assert sweep.feed(E.PromptEvent("the workload's next prompt", "x")) == []
    assert sweep.feed(summary(99.0)) == []  # not the sweep's run
    assert sweep.done == 0
    assert sweep.cancel()[:2] == [E.SetK(3), E.SetAdaptive(True)]
    assert sweep.cancelled and sweep.cancel() == []


def test_headless_sweep_on_the_real_model_drives_k_through_commands(tmp_path, smol_path):
    out = tmp_path / "sweep.json"
    proc = specdash("sweep", "--headless", "--target", "smollm2-135m", "--draft", "lookup", "--threads", "2",
                    "--ks", "0,3,24", "--rounds", "1", "--sweep-tokens", "16", "--json", str(out),
                    "--prompt", "Write the numbers from 1 to 60, separated by commas.")
    assert_ok(proc)
    data = json.loads(out.read_text())
    assert [p["k"] for p in data["points"]] == [0, 3, 24]
    assert all(len(p["runs"]) == 1 and p["n_generated"] == [16] for p in data["points"])
    assert data["points"][0]["acceptance_rate"] is None  # K=0 drafts nothing
    assert data["best_k"] in (0, 3, 24) and "<- best" in proc.stdout
    # every run really ran at its K: the progress lines echo the engine's own setting
    assert [line.split("K=")[1].split()[0] for line in proc.stderr.splitlines() if "K=" in line] == ["0", "3", "24"]


def real_sweep_app(tmp_path, settings, prompt: str, ks: tuple[int, ...]) -> SpecdashApp:
    """The dashboard on a real Session, set to sweep `ks` for one 12-token round each."""
    from specdash.sources.session import Session

    opts = DashboardOptions(settings=settings, prompt=prompt, sweep_ks=ks, sweep_rounds=1, sweep_tokens=12,
                            screenshots_dir=str(tmp_path))
    return SpecdashApp(opts, session_factory=lambda s, p: Session(s, p), sampler=FixedSampler(), hints=lambda: [])


async def running(pilot) -> None:
    """Until the engine has taken a couple of steps of its prompt (a liveness bound)."""
    app = pilot.app
    for _ in range(3000):
        if app.state.prompt_text and app.state.stats.total.steps >= 2:
            return
        await pilot.pause(0.05)


@sync
async def test_the_sweep_view_on_the_real_engine_ends_on_the_settings_it_started_from(tmp_path, smol_path):
    from specdash.engine.settings import EngineSettings

    settings = EngineSettings(adaptive=False, target=str(smol_path), draft="lookup", k=5, threads=2, ctx=1024, max_tokens=400)
    app = real_sweep_app(tmp_path, settings, "Write the numbers from 1 to 300, separated by commas.", (0, 2, 6))
    async with app.run_test(size=(120, 40)) as pilot:
        await running(pilot)
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, SweepScreen)
        await pilot.press("plus")  # the engine belongs to the sweep now: refused
        for _ in range(6000):
            if app.sweep is not None and app.sweep.finished:
                break
            await pilot.pause(0.05)
        assert app.sweep is not None and app.sweep.finished and not app.sweep.cancelled
        assert [len(p.runs) for p in app.sweep.measured] == [1, 1, 1]
        # the restore commands came back as settings: K=5 again, the prompt running again
        for _ in range(3000):
            if app.state.settings.k == 5 and app.state.prompt_title == "your prompt":
                break
            await pilot.pause(0.05)
        assert app.state.settings.k == 5 and app.state.prompt_title == "your prompt"
        await pilot.press("a")  # apply the best K
        best = app.sweep.best.k
        for _ in range(3000):
            if app.state.settings.k == best:
                break
            await pilot.pause(0.05)
        assert app.state.settings.k == best
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SweepScreen)
