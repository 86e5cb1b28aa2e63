"""The footer shows only keys that work for the source, read from the footer itself, for
every kind of source: the embedded engine (SmolLM2-135M, really decoding), a recording
played back, one server, and a fleet of servers. The server is an HTTP server answering
what a real llama-server answered (tests/fixtures/llamacpp, recorded from llama-server
with -md and --metrics); the fleet adds one that is down from the start.

Also: a server down from the start is not labelled with models it does not run, and a
single-server key pressed on the fleet table says why it does nothing."""

from __future__ import annotations

import json
from pathlib import Path

from textual.widgets._footer import FooterKey

from conftest_remote import Canned, ReplayServer, as_json, free_port, text
from pilot_helpers import bounded
from specdash.engine.settings import EngineSettings
from specdash.records.recording import Recorder
from specdash.sources.session import Session
from specdash.sources.remote import RemoteSource
from specdash.sources.replay import ReplaySource
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.fleet_app import FleetDashboard
from specdash.tui.screens.fleet import FleetScreen
from specdash.tui.status import StatusLine
from test_tui_support import FixedSampler, load_replay, sync

LLAMACPP = Path(__file__).parent / "fixtures" / "llamacpp"

# Footer actions by kind of key.
STEER = {"k_up", "k_down", "pick_draft", "set_temperature", "toggle_adaptive", "set_experts", "sweep"}
REPLAY_KEYS = {"slower", "faster", "seek_back", "seek_forward"}
ALWAYS = {"screenshot", "help", "quit"}


def footer(app: SpecdashApp) -> dict[str, bool]:
    """The footer as drawn now: action -> enabled (False: dimmed)."""
    return {key.action: not key.disabled for key in app.screen.query(FooterKey)}


def status_text(app: SpecdashApp) -> str:
    return str(app.query_one(StatusLine).render())


until = bounded(2400)


def llama_server() -> ReplayServer:
    """Answers as the recorded llama-server (-md draft, --metrics) did."""
    return ReplayServer(Canned({
        "/metrics": text((LLAMACPP / "metrics_2.txt").read_text()),
        "/slots": as_json(json.loads((LLAMACPP / "slots_2.json").read_text())),
        "/props": as_json(json.loads((LLAMACPP / "props.json").read_text())),
    }))


def attach_app(source) -> SpecdashApp:
    """As `specdash attach URL` and `specdash replay FILE` build it: no settings of its own."""
    app = SpecdashApp(DashboardOptions(screenshots_dir="/nonexistent"),
                      source_factory=lambda settings, prompts: source, local_telemetry=False, hints=list)
    app.notes = []  # type: ignore[attr-defined]
    app.notify = lambda message, *a, **k: app.notes.append(str(message))  # type: ignore[method-assign]
    return app


@sync
async def test_embedded_engine_footer(smol_path):
    settings = EngineSettings(adaptive=False, target=str(smol_path), draft="lookup", k=3, threads=2, ctx=1024, max_tokens=400)
    opts = DashboardOptions(settings=settings, prompt="Write the numbers from 1 to 300, separated by commas.",
                            screenshots_dir="/nonexistent")
    app = SpecdashApp(opts, session_factory=lambda s, p: Session(s, progress=p), sampler=FixedSampler(),
                      hints=list)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.settings is not None and app.state.state == "running", "running")
        await pilot.pause(0.2)
        keys = footer(app)
        assert STEER - {"set_experts"} <= set(keys) and all(keys[a] for a in STEER - {"set_experts"}), keys
        assert {"toggle_pause", "new_prompt"} | ALWAYS <= set(keys), keys
        assert "set_experts" not in keys, "a dense target has no experts"
        assert not REPLAY_KEYS & set(keys), "replay keys on a live engine"


@sync
async def test_replay_footer(tmp_path):
    path = tmp_path / "run.jsonl"
    rec = Recorder(path)
    for ev in load_replay():  # a recorded engine run
        rec(ev)
    rec.close()
    app = attach_app(ReplaySource(path))
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.settings is not None and app.state.replay is not None, "playing")
        await pilot.pause(0.2)
        keys = footer(app)
        assert REPLAY_KEYS | {"toggle_pause"} | ALWAYS <= set(keys), keys
        assert not (STEER | {"new_prompt"}) & set(keys), keys
        await pilot.press("plus")  # hidden: pressing it says why
        await until(pilot, lambda: any("a recording cannot change K" in n for n in app.notes), "why not K")


@sync
async def test_one_server_footer():
    with llama_server() as srv:
        source = RemoteSource(srv.url, interval=0.2)
        app = attach_app(source)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.state.settings is not None and app.state.state == "running", "attached")
            await pilot.pause(0.2)
            keys = footer(app)
            # llama-server fixes K, the drafter (not a router), sampling and experts at launch;
            # a prompt can be sent to it (drive mode).
            assert keys.get("new_prompt") is True and ALWAYS <= set(keys), keys
            assert not (STEER | REPLAY_KEYS | {"toggle_pause"}) & set(keys), keys
            await pilot.press("k")
            await until(pilot, lambda: any("sweep" in n for n in app.notes), "why no sweep")


@sync
async def test_a_server_down_from_the_start_shows_no_models():
    # Nothing listens there: the source never reports settings, and the status line must
    # not name models (it used to show the built-in Qwen pair of a placeholder).
    source = RemoteSource(f"http://127.0.0.1:{free_port()}", interval=0.2)
    app = attach_app(source)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.state.state == "down", "down")
        app._update_panels()
        await pilot.pause()
        line = status_text(app)
        assert "down" in line and "←" not in line and "qwen" not in line.lower(), line
        keys = footer(app)
        assert not (STEER | REPLAY_KEYS | {"toggle_pause"}) & set(keys), keys


@sync
async def test_fleet_footer_and_a_single_server_key_on_the_table():
    with llama_server() as srv:
        dead = f"http://127.0.0.1:{free_port()}"
        app = FleetDashboard([RemoteSource(srv.url, interval=0.2), RemoteSource(dead, interval=0.2)])
        notes: list[str] = []
        app.notify = lambda message, *a, **k: notes.append(str(message))  # type: ignore[method-assign]
        async with app.run_test(size=(140, 36)) as pilot:
            await until(pilot, lambda: len(app.fleet.servers) == 2 and app.fleet.servers[srv.url].state == "up",
                        "both rows")
            assert isinstance(app.screen, FleetScreen)
            keys = footer(app)
            assert not (STEER | REPLAY_KEYS | {"toggle_pause", "new_prompt"}) & set(keys), keys
            await pilot.press("plus")
            await until(pilot, lambda: any("fleet table steers no server" in n for n in notes), "why not K")

            app.fleet.table.move_cursor(row=app.fleet.order.index(srv.url))
            await pilot.press("enter")
            await until(pilot, lambda: not isinstance(app.screen, FleetScreen)
                        and app.state.settings is not None, "the server's panels")
            await pilot.pause(0.2)
            keys = footer(app)
            assert keys.get("new_prompt") is True and not STEER & set(keys), keys

            await pilot.press("escape")  # back on the table: its settings stay, its keys go
            await until(pilot, lambda: isinstance(app.screen, FleetScreen), "the table")
            await pilot.pause(0.2)
            assert "new_prompt" not in footer(app), footer(app)
