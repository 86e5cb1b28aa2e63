"""Temperature as a sweep axis beside K: each point is (K, T); the plan sets T before each
run and restores the operator's at the end or on cancel; a point's T is the one the
engine reported; whatif's greedy predictions stay on the T=0 series."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_ok, assert_usage_error, specdash
from specdash.contract import events as E
from specdash.commands.sweep import table
from specdash.tuning.sweep import Sweep
from specdash.tui.screens.ask import AskScreen
from specdash.tui.screens.sweep import SweepScreen
from specdash.tui.widgets.plots import Plot
from test_sweep import real_sweep_app, run_through, running, summary
from test_tui_support import sync

# The operator runs at T=0.3, K=3 fixed.
BEFORE = E.SettingsEvent(source="engine", target="smollm2-135m", drafter="lookup", draft="lookup", k=3,
                         temperature=0.3, max_tokens=256)
PROMPT = "Write the numbers from 1 to 60, separated by commas."
# A list that repeats, sent raw (no chat template): the model goes on with it and prompt
# lookup drafts from the first tokens (greedy, K=2: 7 drafted in 12 tokens).
REPEATING = "alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa, lambda, mu. alpha, beta, gamma,"


def test_plan_sets_each_points_temperature_before_its_prompt_and_restores_the_operators():
    sweep = Sweep("p", BEFORE, ks=[0, 4], temps=[0.0, 0.7], rounds=1, max_tokens=16, title="mine")
    assert sweep.plan == [(0, 0, 0.0), (0, 4, 0.0), (0, 0, 0.7), (0, 4, 0.7)]
    first = sweep.start()
    assert first[:2] == [E.SetSampling(temperature=0.0), E.SetK(0)] and isinstance(first[2], E.NewPrompt)
    restore = run_through(sweep, {(0, 0.0): [10.0], (4, 0.0): [14.0], (0, 0.7): [9.0], (4, 0.7): [15.0]},
                          accepted={(4, 0.0): 5, (4, 0.7): 8})
    assert [(p.k, p.temperature) for p in sweep.measured] == [(0, 0.0), (4, 0.0), (0, 0.7), (4, 0.7)]
    assert sweep.at(0.7)[1].acceptance == 0.8 and sweep.at(0.0)[1].acceptance == 0.5
    assert sweep.plain_at(0.7) == 9.0 and sweep.best_at(0.7).k == 4
    # 0.3 is not swept: "best" (what a and w apply) is at the first swept temperature
    assert sweep.home_temperature == 0.0 and sweep.best.k == 4 and sweep.best.temperature == 0.0
    assert restore == [E.SetK(3), E.SetSampling(temperature=0.3), E.NewPrompt("p", "mine")]
    data = sweep.to_json()
    assert [(p["k"], p["temperature"]) for p in data["points"]] == [(0, 0.0), (4, 0.0), (0, 0.7), (4, 0.7)]
    assert data["best_k_by_temperature"] == [{"temperature": 0.0, "k": 4, "tokens_per_s": 14.0},
                                             {"temperature": 0.7, "k": 4, "tokens_per_s": 15.0}]
    assert "single sample" in data["note"] and "problems" not in data


def test_cancel_restores_the_temperature_and_a_plain_sweep_leaves_it_alone():
    sweep = Sweep("p", BEFORE, ks=[2], temps=[0.7], rounds=2)
    assert sweep.start()[0] == E.SetSampling(temperature=0.7)
    assert sweep.cancel()[:2] == [E.SetK(3), E.SetSampling(temperature=0.3)]
    plain = Sweep("p", BEFORE, ks=[2], rounds=1)  # no temps: at the operator's T, none sent
    assert plain.temps == [0.3] and not any(isinstance(c, E.SetSampling) for c in plain.start() + plain.cancel())


def test_a_points_temperature_is_the_engines_not_the_plans():
    sweep = Sweep("p", BEFORE, ks=[2], temps=[0.7], rounds=1)
    sent = sweep.start()
    title = next(c.title for c in sent if isinstance(c, E.NewPrompt))
    sweep.feed(E.PromptEvent(title, "p"))
    # an engine that kept T=0.3 (say the SetSampling was refused)
    sweep.feed(E.SettingsEvent(source="engine", target="t", drafter="lookup", k=2, temperature=0.3))
    sweep.feed(summary(12.0))
    (point,) = sweep.measured
    assert point.engine_temperature == 0.3 and sweep.to_json()["points"][0]["temperature"] == 0.3
    assert sweep.problems == ["run 1 was planned at K=2 T=0.7 but the engine reported K=2 T=0.3"]
    assert table(sweep).splitlines()[1].split()[:2] == ["2", "0.3"]  # the CLI row: the engine's T


def test_predictions_belong_to_the_t0_series_only():
    sweep = Sweep("p", BEFORE, ks=[0, 2], temps=[0.0, 0.7], rounds=1)
    sweep.predicted = {0: (10.0, None), 2: (12.0, 0.5), 8: (20.0, 0.4)}
    assert sweep.predicted_t0 == {0: (10.0, None), 2: (12.0, 0.5)}  # swept Ks only
    assert Sweep("p", BEFORE, ks=[0, 2], temps=[0.7], rounds=1).predicted_t0 == {}


def test_headless_sweep_at_two_temperatures_on_the_real_model(tmp_path, smol_path):
    out = tmp_path / "sweep.json"
    proc = specdash("sweep", "--headless", "--target", "smollm2-135m", "--draft", "lookup", "--threads", "2",
                    "--ks", "1,2", "--temps", "0,0.7", "--temp", "0.2", "--rounds", "1", "--sweep-tokens", "16",
                    "--json", str(out), "--prompt", PROMPT)
    assert_ok(proc)
    data = json.loads(out.read_text())
    # a row per (K, T); T as the engine's SettingsEvent reported it at each run's start
    assert [(p["k"], p["temperature"]) for p in data["points"]] == [(1, 0.0), (2, 0.0), (1, 0.7), (2, 0.7)]
    # (T=0.7 may sample an end of text before 16 tokens, or a text lookup finds nothing in)
    assert all(1 <= p["n_generated"][0] <= 16 for p in data["points"])
    assert all(p["acceptance_rate"] is not None for p in data["points"][:2])  # greedy: this text drafts
    assert data["temperatures"] == [0.0, 0.7] and "problems" not in data
    assert {b["temperature"] for b in data["best_k_by_temperature"]} == {0.0, 0.7}
    # the progress lines print the engine's live K and T after each run
    live = [(line.split("K=")[1].split()[0], line.split("T=")[1].split()[0])
            for line in proc.stderr.splitlines() if "tok/s" in line and "K=" in line]
    assert sorted(live) == [("1", "0"), ("1", "0.7"), ("2", "0"), ("2", "0.7")]
    rows = [line.split() for line in proc.stdout.splitlines()[1:5]]
    assert proc.stdout.splitlines()[0].split()[:2] == ["K", "T"]
    assert [(r[0], r[1]) for r in rows] == [("1", "0"), ("2", "0"), ("1", "0.7"), ("2", "0.7")]
    assert "a point there is a single sample" in proc.stdout
    assert proc.stdout.count("<- best") == 2  # one per temperature


@pytest.mark.parametrize("temps", ["-0.5", "0,abc", "0,9", ",", "nan"])
def test_bad_temps_is_a_one_line_usage_error(temps):
    proc = specdash("sweep", "--headless", "--draft", "lookup", "--temps", temps)
    assert_usage_error(proc, "--temps", repr(temps), "a number 0..5")


def test_whatif_with_temps_needs_t0(tmp_path):
    proc = specdash("sweep", "--headless", "--target", "smollm2-135m", "--draft", "lookup", "--temps", "0.7,1",
                    "--whatif", "epyc-32b", "--prompt", "x")
    assert_usage_error(proc, "--whatif", "--temps 0.7,1", "temperature 0 only")


@sync
async def test_the_sweep_view_sweeps_two_temperatures_on_the_real_engine(tmp_path, smol_path):
    """k opens the sweep, t asks for temperatures and restarts it at 0 and 0.7: two series
    (legend entries T=0 and T=0.7, distinct markers), a T column, and at the end the
    operator's T=0.2 and K=5 are back."""
    from specdash.engine.settings import EngineSettings, SamplingParams

    settings = EngineSettings(target=str(smol_path), draft="lookup", k=5, threads=2, ctx=1024, max_tokens=400,
                              raw=True, sampling=SamplingParams(temperature=0.2, seed=1))
    app = real_sweep_app(tmp_path, settings, REPEATING, (0, 2))
    async with app.run_test(size=(120, 40)) as pilot:
        await running(pilot)
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, SweepScreen) and app.sweep.temps == [0.2]
        await pilot.press("t")
        await pilot.pause()
        assert isinstance(app.screen, AskScreen)
        await pilot.press("ctrl+a", *"0,9", "enter")  # over the limit: the dialog stays
        await pilot.pause()
        assert isinstance(app.screen, AskScreen)
        app.screen.query_one("Input").value = "0,0.7"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SweepScreen) and app.sweep.temps == [0.0, 0.7]
        for _ in range(6000):
            if app.sweep.finished:
                break
            await pilot.pause(0.05)
        sweep = app.sweep
        assert sweep.finished and not sweep.cancelled and not sweep.problems
        assert [(p.k, p.engine_temperature) for p in sweep.measured] == [(0, 0.0), (2, 0.0), (0, 0.7), (2, 0.7)]
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        screen.refresh_view()
        await pilot.pause()
        series = screen.query_one("#sweep-tps", Plot)._key[0]
        legend = {s.label: s for s in series if s.label and s.label.startswith("T=")}
        assert set(legend) == {"T=0", "T=0.7"}
        assert legend["T=0"].xs == legend["T=0.7"].xs == (0.0, 2.0)
        assert legend["T=0"].colour != legend["T=0.7"].colour and legend["T=0"].marker != legend["T=0.7"].marker
        assert screen.query_one("#sweep-tps", Plot)._key[6] is True  # the legend is shown
        # acceptance: a series per temperature where something was drafted (a sampled text
        # may give lookup nothing to draft from in 12 tokens), marked as on the tok/s chart
        acc_labels = {s.label for s in screen.query_one("#sweep-acc", Plot)._key[0] if s.label and s.kind == "points"}
        drafted = {f"T={p.temperature:g}" for p in sweep.measured if p.acceptance is not None}
        assert acc_labels == drafted and "T=0" in drafted
        head = str(screen.query_one("#sweep-head").render())
        assert "2 Ks × T=0, 0.7 × 1 rounds" in head and "single sample" in head
        # the restore came back as settings: K=5 and the operator's T=0.2
        for _ in range(3000):
            if app.state.settings.k == 5 and app.state.settings.temperature == 0.2:
                break
            await pilot.pause(0.05)
        assert app.state.settings.k == 5 and app.state.settings.temperature == 0.2
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SweepScreen)
