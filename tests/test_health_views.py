"""The health verdict reaches every place it is shown: the status line (and a marker on the
charts where it changed), the fleet table's column (sortable), `attach --once/--watch
--json` and their exit codes, the metrics exporter (a gauge per rule), and recordings
(replay shows it). The servers are real HTTP servers on 127.0.0.1 whose counters collapse
after a while; the rules run inside the real sources."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

import health_scripts as S
from conftest_remote import Canned, ReplayServer, text
from specdash.contract import events as E
from specdash.monitor.health import HealthMonitor, HealthThresholds
from specdash.sources.remote import RemoteSource
from test_sources_contract import ScriptedSource, app_for, settled

FAST = HealthThresholds(reading_seconds=0.2, min_history=3, recent=2)  # judged within a second or two


def judged(stream: list[E.Event]) -> list[E.Event]:
    """The stream as a source emits it: each event, then what the health rules make of it."""
    monitor = HealthMonitor()
    return [out for ev in stream for out in (ev, *monitor.feed(ev))]


class CollapsingServer:
    """A vLLM-style /metrics whose counters grow each poll: acceptance length 3 for
    `good` polls, then 1.1 (or, for a floor test, 1.1 throughout)."""

    def __init__(self, good: int = 12):
        self.polls = 0
        self.good = good
        self.c = {"tokens": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0}
        self._lock = threading.Lock()

    def metrics(self, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        with self._lock:
            self.polls += 1
            c = self.c
            c["tokens"] += 30
            c["drafts"] += 10
            c["draft_tokens"] += 40
            c["accepted"] += 20 if self.polls <= self.good else 1
            labels = 'engine="0",model_name="m"'
            body = "\n".join([
                f"vllm:num_requests_running{{{labels}}} 1",
                f"vllm:num_requests_waiting{{{labels}}} 0",
                f"vllm:generation_tokens_total{{{labels}}} {c['tokens']}",
                f"vllm:prompt_tokens_total{{{labels}}} 0",
                f"vllm:spec_decode_num_drafts_total{{{labels}}} {c['drafts']}",
                f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {c['draft_tokens']}",
                f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {c['accepted']}",
            ]) + "\n"
        return text(body)


def serve(server: CollapsingServer) -> ReplayServer:
    return ReplayServer(Canned({"/metrics": server.metrics}))


# --- the dashboard ------------------------------------------------------------------------


def test_the_status_line_says_the_word_and_the_charts_mark_the_change() -> None:
    from specdash.tui.status import status_parts
    from test_tui_support import sync

    stream = judged(S.engine_collapse())
    assert any(isinstance(ev, E.HealthEvent) and ev.verdict == "collapse" for ev in stream)

    @sync
    async def body() -> None:
        app = app_for(ScriptedSource("engine", stream, "none"), local_telemetry=False)
        async with app.run_test(size=(160, 40)) as pilot:
            await settled(pilot, len(stream))
            line = app.query_one("#status").line
            assert "⚠ collapse" in line and "[bold $error]⚠ collapse[/]" in line, line
            assert any(label == "health: collapse" for _, label in app.state.stats.markers)
            timeline = app.state.stats.timeline(app.state.window)
            assert "health: collapse" in [label for _, label in timeline.markers]
            # The alarm never gives way: at 50 columns the model names have, it has not.
            parts, _ = status_parts(app.state, ("", ""), 50)
            assert parts[-1] == "⚠ collapse" and "smollm2-135m ← lookup" not in " │ ".join(parts), parts
            # The notice said what it read.
            assert any(re.search(r"health: acceptance collapse: acceptance length 1\.\d\d, median 3\.\d\d over \d+ "
                                 r"readings", n) for n in app.notes), app.notes

    body()


def test_a_steady_run_says_healthy_where_there_is_room() -> None:
    from specdash.tui.status import status_parts

    stream = judged(S.engine_steady())
    from specdash.tui.reducer import DashState

    state = DashState()
    for ev in stream:
        state.feed(ev)
    assert state.health is not None and state.health.verdict == "healthy"
    assert "healthy" in status_parts(state, ("", ""), 160)[0]
    assert "healthy" not in status_parts(state, ("", ""), 60)[0]  # the first to give way
    assert not any(label.startswith("health") for _, label in state.stats.markers)


# --- the fleet --------------------------------------------------------------------------


def test_the_fleet_column_sorts_by_health() -> None:
    from specdash.tui.fleet_app import FleetDashboard

    async def body() -> None:
        bad, good = CollapsingServer(good=8), CollapsingServer(good=10**9)
        with serve(bad) as a, serve(good) as b:
            sources = [RemoteSource(url, interval=0.1, health=FAST) for url in (b.url, a.url)]
            app = FleetDashboard(sources)
            async with app.run_test(size=(160, 24)) as pilot:
                fleet = app.fleet
                for _ in range(300):
                    await pilot.pause(0.05)
                    rows = fleet.servers
                    if rows.get(a.url) and rows[a.url].health == "collapse" and rows.get(b.url) \
                            and rows[b.url].health == "healthy":
                        break
                assert fleet.servers[a.url].health == "collapse", fleet.servers[a.url]
                assert fleet.servers[a.url].alarms[0].startswith("acceptance collapse: acceptance length 1.")
                assert fleet.servers[b.url].health == "healthy"
                fleet.flush()
                await pilot.pause()
                assert str(fleet.table.get_cell(a.url, "health")) == "collapse"
                assert str(fleet.table.get_cell(b.url, "health")) == "healthy"
                fleet.sort_by("health")
                await pilot.pause()
                assert fleet.order == [a.url, b.url]  # the alarm first
                fleet.sort_by("health", reverse=True)
                await pilot.pause()
                assert fleet.order == [b.url, a.url]

    asyncio.run(body())


# --- attach --once / --watch --------------------------------------------------------------


def attach(*args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--config", str(config)] if config else []
    return subprocess.run([sys.executable, "-m", "specdash", "attach", *args, *extra],
                          capture_output=True, text=True, timeout=120)


def test_attach_once_json_and_its_exit_code(tmp_path: Path) -> None:
    """--once reads one interval: only a floor set in the config can fire there. Below it:
    exit 1, the verdict and what the rule read in the JSON; above it: 0."""
    floor = tmp_path / "floor.toml"
    floor.write_text("[health]\ncollapse_floor = 1.5\nreading_seconds = 0.1\nrecent = 1\n")
    with serve(CollapsingServer(good=0)) as low, serve(CollapsingServer(good=10**9)) as fine:
        proc = attach(low.url, "--once", "--json", "--interval", "0.3", config=floor)
        assert proc.returncode == 1, proc.stderr
        row = json.loads(proc.stdout)
        assert row["health"] == "collapse" and row["state"] == "up"
        assert row["alarms"] == ["acceptance collapse: acceptance length 1.10, below the floor 1.5"]
        assert f"specdash: health collapse: {low.url}: acceptance collapse" in proc.stderr
        proc = attach(fine.url, "--once", "--json", "--interval", "0.3", config=floor)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["health"] == "healthy"
        # Text rows say it too.
        proc = attach(low.url, "--once", "--interval", "0.3", config=floor)
        assert proc.returncode == 1 and "health collapse  alarm: acceptance collapse: acceptance length 1.10" in proc.stdout


def test_attach_watch_json_follows_the_verdict(tmp_path: Path) -> None:
    """Healthy, then collapse once the acceptance length drops. (A drop that lasts becomes
    the new median after about as many readings as went before it: the test ends sooner.)"""
    config = tmp_path / "fast.toml"
    config.write_text("[health]\nreading_seconds = 0.2\nmin_history = 3\nrecent = 2\n")
    with serve(CollapsingServer(good=30)) as srv:
        proc = attach(srv.url, "--watch", "--json", "--interval", "0.1", "--count", "45", config=config)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    words = [r["health"] for r in rows]
    assert words[0] in ("", "unknown", "healthy") and "healthy" in words and words[-1] == "collapse", words
    assert words.index("healthy") < words.index("collapse")
    assert proc.returncode == 1, proc.stderr  # the last rows alarm


# --- the exporter -------------------------------------------------------------------------


def test_the_exporter_has_a_gauge_per_rule() -> None:
    from specdash.monitor.metrics_exporter import MetricsExporter

    exporter = MetricsExporter(0)
    try:
        for ev in judged(S.engine_collapse()):
            exporter.feed(ev)
        body = httpx.get(exporter.url + "/metrics", timeout=10).text
    finally:
        exporter.close()
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
             if line.startswith("specdash_health")}
    labels = 'engine="0",model_name="smollm2-135m"'
    assert lines[f"specdash_health_acceptance_collapse{{{labels}}}"] == 1.0
    for rule in ("acceptance_repetition", "decode_stall", "speculation_not_paying"):
        assert lines[f"specdash_health_{rule}{{{labels}}}"] == 0.0
    assert lines[f'specdash_health_verdict{{{labels},verdict="collapse"}}'] == 1.0
    assert lines[f'specdash_health_verdict{{{labels},verdict="healthy"}}'] == 0.0
    # Another specdash attached to it reads it as a healthy scrape (no bad reading).
    from specdash.monitor.remote.metrics import parse

    assert parse(body).bad_reading() is None


# --- recordings -------------------------------------------------------------------------------


def test_a_recording_keeps_the_verdicts_and_replay_shows_them(tmp_path: Path) -> None:
    from specdash.records.recording import Recorder, read_recording
    from specdash.sources.replay import ReplaySource
    from specdash.tui.reducer import DashState

    path = tmp_path / "health.jsonl"
    recorder = Recorder(path, extra={"command": "test"})
    stream = judged(S.engine_collapse())
    for ev in stream:
        recorder(ev)
    recorder.close()
    rec = read_recording(path)
    recorded = [ev for ev in rec.events if isinstance(ev, E.HealthEvent)]
    assert recorded and [E.to_dict(ev) for ev in recorded] == [E.to_dict(ev) for ev in stream
                                                              if isinstance(ev, E.HealthEvent)]
    # Replayed: the replay source sends the recorded verdicts (it judges nothing itself).
    state = DashState()
    seen: list[E.Event] = []
    source = ReplaySource(path, sleep=lambda wake, s: False)
    source.start(lambda ev: (seen.append(ev), state.feed(ev)))
    import time

    deadline = time.monotonic() + 30  # (a replay at its end stays open for seeks)
    while sum(isinstance(ev, E.HealthEvent) for ev in seen) < len(recorded) and time.monotonic() < deadline:
        time.sleep(0.02)
    source.close()
    assert [E.to_dict(ev) for ev in seen if isinstance(ev, E.HealthEvent)] == [E.to_dict(ev) for ev in recorded]
    assert any(label == "health: collapse" for _, label in state.stats.markers)
    assert state.health is not None and state.health.verdict == "collapse"
