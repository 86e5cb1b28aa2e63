"""`specdash attach` in the dashboard, on a real llama-server (SmolLM2-135M drafting for
itself, --metrics): the engine's panels filled by the server's own numbers; the fleet
table with a dead server beside it; and once as a person would, in tmux."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest_remote import SPEC_ARGS, LlamaServer, free_port, need_binary
from pilot_helpers import bounded
from specdash.engine.settings import EngineSettings
from specdash.sources.remote import RemoteSource
from specdash.tui.app import DashboardOptions, SpecdashApp
from specdash.tui.fleet_app import FleetDashboard
from specdash.tui.screens.fleet import FleetScreen
from test_tui_support import sync


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smol_path: Any):
    log = tmp_path_factory.mktemp("attach-server") / "server.log"
    s = LlamaServer(need_binary(), Path(smol_path), free_port(), ["-md", str(smol_path), *SPEC_ARGS, "-np", "1"], log)
    s.start()
    yield s
    s.stop()


def keep_busy(server: LlamaServer, stop: threading.Event) -> threading.Thread:
    """Requests one after another until `stop`: the counters move (they move when a
    request ends) and /slots shows the one in flight."""
    def body() -> None:
        while not stop.is_set():
            try:
                server.complete("Count from 1 to 40, separated by commas:", n_predict=40)
            except Exception:  # noqa: BLE001 - the server may be stopping at the end
                return

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


until = bounded(4000)


@sync
async def test_one_server_fills_the_engines_panels(server: LlamaServer):
    source = RemoteSource(server.url, interval=0.3)
    app = SpecdashApp(DashboardOptions(settings=EngineSettings()),
                      source_factory=lambda s, p: source, local_telemetry=False)
    notes: list[str] = []
    app.notify = lambda message, *a, **k: notes.append(str(message))  # type: ignore[method-assign]
    stop = threading.Event()
    worker = keep_busy(server, stop)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: app.state.settings is not None and app.state.state == "running", "connected")
            assert app.state.settings.source == "remote"
            await until(pilot, lambda: app.state.stats.total.num_draft_tokens > 0, "drafts counted")
            # K: the server's per-position series once a request has ended
            await until(pilot, lambda: app.state.settings.k == 4, "K from the per-position counters")
            app._update_panels()
            await pilot.pause()
            acc = app.query_one("#acceptance").border_title
            assert str(acc).startswith("Acceptance ") and "mean len" in str(acc)
            assert app.query_one("#pos-plot")._datasets, "no per-position bars"
            assert str(app.query_one("#throughput").border_title).startswith("tok/s ")
            assert str(app.query_one("#kpanel").border_title).startswith("K 4 ·")
            await pilot.press("plus")  # llama-server sets K at launch: the key says so
            await pilot.pause()
            assert any("spec-draft-n-max" in n for n in notes), notes
    finally:
        stop.set()
        worker.join(60)


@sync
async def test_fleet_table_with_a_dead_server_then_one_servers_panels(server: LlamaServer):
    dead = f"http://127.0.0.1:{free_port()}"
    app = FleetDashboard([RemoteSource(server.url, interval=0.3), RemoteSource(dead, interval=0.3)])
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: len(app.fleet.servers) == 2 and app.fleet.servers[dead].state == "down"
                    and app.fleet.servers[server.url].state == "up", "both rows")
        assert isinstance(app.screen, FleetScreen)
        row = app.fleet.order.index(server.url)
        app.fleet.table.move_cursor(row=row)
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, FleetScreen), "the server's panels")
        await until(pilot, lambda: app.state.settings is not None and app.state.server is not None, "its settings")
        assert app.state.server.url == server.url and app.state.settings.source == "remote"
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, FleetScreen), "back to the fleet")


@pytest.mark.tmux
def test_attach_in_tmux_as_a_person_would(server: LlamaServer, tmp_path):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed (.ci/run installs it)")
    session = f"attach-{free_port()}"
    stop = threading.Event()
    worker = keep_busy(server, stop)
    cmd = f"{sys.executable} -m specdash attach {server.url} --interval 0.5"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "36", cmd], check=True)
    try:
        screen = ""
        for _ in range(240):
            time.sleep(0.5)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                    capture_output=True, text=True).stdout
            if "Acceptance " in screen and "mean len" in screen and "tok/s" in screen:
                break
        assert "Acceptance " in screen and "mean len" in screen, screen
        assert "K 4" in screen and "running" in screen, screen
        # The footer (the last line) offers what works on a server: a prompt (drive mode),
        # screenshot, help, quit; not a replay's keys, nor K, drafter, sampling or a sweep.
        footer = screen.rstrip().splitlines()[-1]
        assert "new" in footer and "help" in footer and "quit" in footer, footer
        for word in ("slower", "faster", "-10s", "+10s", "sweep", "adapt", "temp", "pause", "draft"):
            assert word not in footer, (word, footer)
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        for _ in range(40):
            time.sleep(0.25)
            alive = subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode == 0
            if not alive:
                break
        assert not alive, "q did not end specdash attach"
    finally:
        stop.set()
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        worker.join(60)


# --- a restart builds a new source (a closed one cannot start again) ---


async def down_then_new_prompt(pilot, app, server: LlamaServer, prompt: str) -> None:
    """Kill the server, wait for the dashboard to say so, type `prompt` with `n` (the
    source is not alive: that restarts it), then start the server again."""
    await until(pilot, lambda: app.state.state == "running", "connected")
    server.stop()
    await until(pilot, lambda: app.state.state == "down", "down")
    await pilot.press("n")
    await pilot.press(*prompt)
    await pilot.press("enter")
    await pilot.pause(0.3)
    server.start()


@sync
async def test_a_new_prompt_while_the_server_is_down_restarts_the_source(server: LlamaServer):
    """It restarted the closed source: RemoteSource.start raised (its poller thread had run)
    and the dashboard died. Now a new source connects and drives the typed prompt."""
    from specdash.cli import build_parser
    from specdash.commands import attach

    args = build_parser().parse_args(["attach", server.url, "--interval", "0.3", "--max-tokens", "8"])
    app = attach.dashboard_app(attach.build_sources(args, with_prompt=True), args)
    first = None
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            first = app.source
            await down_then_new_prompt(pilot, app, server, "Hello")
            assert app.source is not first
            await until(pilot, lambda: app.state.state in ("running", "idle") and app.state.prompt_title == "Hello",
                        "the typed prompt on the restarted server")
    finally:
        if server.proc is None:
            server.start()


@sync
async def test_fleet_a_new_prompt_while_the_server_is_down_restarts_the_fleet(server: LlamaServer):
    """The same for the fleet: its factory returned the closed fleet, whose sources cannot
    start again. Now every row polls again, and the focused server takes the prompt."""
    dead = f"http://127.0.0.1:{free_port()}"
    app = FleetDashboard([RemoteSource(server.url, interval=0.3, max_tokens=8), RemoteSource(dead, interval=0.3)])
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: server.url in app.fleet.servers and app.fleet.servers[server.url].state == "up",
                        "the live row")
            app.fleet.table.move_cursor(row=app.fleet.order.index(server.url))
            await pilot.press("enter")
            first = app.fleet_source
            await down_then_new_prompt(pilot, app, server, "Hello")
            assert app.fleet_source is not first and app.fleet_source.focus == server.url
            await until(pilot, lambda: app.fleet.servers[server.url].state == "up", "the row up again")
            await until(pilot, lambda: app.state.prompt_title == "Hello", "the typed prompt on the focused server")
    finally:
        if server.proc is None:
            server.start()
