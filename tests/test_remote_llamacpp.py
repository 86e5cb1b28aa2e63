"""`specdash attach` against a REAL llama-server (built from the llama.cpp vendored in the
llama-cpp-python sdist), SmolLM2-135M speculating with itself as draft model at K=4, so
the speculative counters really move. Skipped with the reason when the binary is not built.

The kill/restart test runs last in this module (it restarts the session's server)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest_remote import FIXTURES, LlamaServer, free_port, llama_server, need_binary, router_preset  # noqa: F401
from specdash.contract import events as E
from specdash.monitor.remote.backends import llamacpp_snapshot, parse_slots
from specdash.monitor.remote.metrics import parse
from specdash.sources.remote import RemoteSource

_LINE = re.compile(r'^(llamacpp:[a-z_]+)(?:\{position="(\d+)"\})? (\S+)$')


def raw_metrics(url: str) -> dict[str, Any]:
    """/metrics read with a regex, not with specdash's parser: the reference."""
    out: dict[str, Any] = {"per_pos": {}}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        name, pos, value = m.groups()
        if pos is not None:
            out["per_pos"][int(pos)] = float(value)
        else:
            out[name] = float(value)
    return out


def attach_once(url: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "specdash", "attach", url, "--once", "--json", "--interval", "0.3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def wait_for(events: list[Any], pred: Any, timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in list(events):
            if pred(ev):
                return ev
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; got {[type(e).__name__ for e in events][-20:]}")


def test_snapshot_counters_equal_what_metrics_says(llama_server: LlamaServer) -> None:
    llama_server.complete("def fibonacci(n):\n", 64, temperature=0.0)
    llama_server.complete("Once upon a time, in a small village,", 64, temperature=1.0, seed=7)
    row = attach_once(llama_server.url)
    raw = raw_metrics(llama_server.url)
    assert row["state"] == "up" and row["backend"] == "llamacpp" and row["model"] == "smollm2-135m"
    assert row["num_drafts"] == raw["llamacpp:spec_decode_num_drafts_total"] > 0
    assert row["num_draft_tokens"] == raw["llamacpp:spec_decode_num_draft_tokens_total"]
    assert row["num_accepted_tokens"] == raw["llamacpp:spec_decode_num_accepted_tokens_total"]
    per_pos = row["num_accepted_tokens_per_pos"]
    assert per_pos == [raw["per_pos"][i] for i in range(len(raw["per_pos"]))] and len(per_pos) == 4
    # Non-trivial: the sampled request rejects drafts, the greedy one accepts most.
    assert 0.0 < row["acceptance_rate"] < 1.0
    assert per_pos[0] >= per_pos[1] >= per_pos[2] >= per_pos[3] > 0 and per_pos[0] < row["num_drafts"]
    assert sum(per_pos) == row["num_accepted_tokens"]
    assert row["mean_accepted_length"] == pytest.approx(1 + row["num_accepted_tokens"] / row["num_drafts"])
    assert row["tokens_per_step"] > 1.0  # speculation commits more than a token per decode
    assert row["requests_running"] == 0 and row["errors"] == 0


def test_live_tokens_come_from_slots_while_the_counters_stand_still(llama_server: LlamaServer) -> None:
    done = threading.Event()

    def long_request() -> None:
        try:
            _swallow(llama_server.complete, "Write a long story about a robot who learns to paint.", 300,
                     temperature=0.7, ignore_eos=True)
        finally:
            done.set()

    before = raw_metrics(llama_server.url)["llamacpp:tokens_predicted_total"]
    threading.Thread(target=long_request, daemon=True).start()
    source = RemoteSource(llama_server.url, interval=0.5)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the slot is decoding (a loaded box is slow to start)
            slot = httpx.get(llama_server.url + "/slots", timeout=10).json()[0]
            if slot["is_processing"] and slot.get("next_token", [{}])[0].get("n_decoded", 0) > 0:
                break
            time.sleep(0.05)
        first = source.poll_now()
        assert first.requests_running == 1, first
        row = first
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not done.is_set():  # until tokens were seen in flight
            time.sleep(0.3)
            row = source.poll_now()
            if row.generation_tokens_per_s:
                break
        mid = raw_metrics(llama_server.url)["llamacpp:tokens_predicted_total"]
        assert not done.is_set(), "the request ended before two polls saw it (a very fast box?)"
        assert mid == before  # llama.cpp's counters move only when a request ends...
        assert row.generation_tokens_per_s is not None and row.generation_tokens_per_s > 0, row  # ...but /slots does
        assert row.requests_running == 1
        snap = source.watch.last
        assert snap is not None and getattr(snap, "in_flight_tokens", 0) > 0
    finally:
        source.close()
        done.wait(300)


def test_settings_from_props_and_slots(llama_server: LlamaServer) -> None:
    source = RemoteSource(llama_server.url, interval=0.3)
    events: list[Any] = []
    source.start(events.append)
    try:
        s = wait_for(events, lambda e: isinstance(e, E.SettingsEvent), what="settings")
        assert s.source == "remote" and s.target == "smollm2-135m" and s.drafter == "draft-simple"
        assert s.k == 4 and s.ctx == 512 and s.target_path and s.target_path.endswith("smollm2-135m.gguf")
        assert "--spec-draft-n-max" in s.unavailable["k"] and "draft" in s.unavailable
        source.send(E.SetDrafter("ngram"))
        note = wait_for(events, lambda e: isinstance(e, E.NoticeEvent), what="refusal")
        assert "refused" in note.message and "--models-preset" in note.message
    finally:
        source.close()


def test_drive_mode_streams_steps_and_a_summary_that_adds_up(llama_server: LlamaServer) -> None:
    source = RemoteSource(llama_server.url, interval=0.5, max_tokens=48)
    events: list[Any] = []
    source.start(events.append)
    try:
        source.send(E.NewPrompt("def quicksort(items):\n", "quicksort"))
        summary = wait_for(events, lambda e: isinstance(e, E.Summary), timeout=300, what="summary")
    finally:
        source.close()
    prompt = next(e for e in events if isinstance(e, E.PromptEvent))
    prefill = next(e for e in events if isinstance(e, E.PrefillEvent))
    steps = [e for e in events if isinstance(e, E.StepEvent)]
    assert prompt.title == "quicksort" and prefill.n_tokens > 0 and prefill.ms > 0
    assert events.index(prompt) < events.index(prefill) < events.index(steps[0]) < events.index(summary)
    assert "".join(s.text for s in steps) == summary.text and summary.text.strip()
    # The server samples at its default temperature: the text may end early at EOS, whose
    # token is counted but never streamed.
    streamed = sum(len(s.pieces) for s in steps)
    if summary.stop_reason == "max_tokens":
        assert streamed == summary.n_generated == 48
    else:
        assert summary.stop_reason == "eos" and summary.n_generated - 1 <= streamed <= summary.n_generated
    # The per-step reconstruction adds up to the request's own timings (draft_n, draft_n_accepted)...
    assert sum(s.drafted for s in steps) == summary.num_draft_tokens > 0
    assert sum(s.accepted for s in steps) == summary.num_accepted_tokens
    # ...and to the server's counters for this request (num_drafts and per position).
    assert sum(1 for s in steps if s.drafted) == summary.num_drafts
    assert sum(summary.num_accepted_tokens_per_pos) == summary.num_accepted_tokens
    assert summary.acceptance_rate == pytest.approx(summary.num_accepted_tokens / summary.num_draft_tokens)
    assert summary.mean_accepted_length == pytest.approx(1 + summary.num_accepted_tokens / summary.num_drafts)
    assert summary.tokens_per_s > 0 and summary.prefill_ms == pytest.approx(prefill.ms)
    assert summary.steps == len(steps)
    for s in steps:
        assert s.from_draft == [i < s.accepted for i in range(len(s.pieces))]


def test_prompt_json_on_the_command_line(llama_server: LlamaServer) -> None:
    proc = subprocess.run([sys.executable, "-m", "specdash", "attach", llama_server.url, "--prompt", "Hello, my name is",
                           "--max-tokens", "16", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    kinds = [json.loads(line)["event"] for line in proc.stdout.splitlines()]
    assert kinds[0] == "status" and "settings" in kinds and kinds[-1] == "summary"
    assert "step" in kinds and "server" not in kinds and "counters" not in kinds


def test_recorded_responses_parse(llama_server: LlamaServer) -> None:
    """tests/fixtures/llamacpp holds /metrics, /slots and /props recorded from this build
    while a request ran (the benchmark replays them): still what the server writes?"""
    snap = llamacpp_snapshot(parse((FIXTURES / "llamacpp" / "metrics_2.txt").read_text()),
                             parse_slots(json.loads((FIXTURES / "llamacpp" / "slots_2.json").read_text())),
                             json.loads((FIXTURES / "llamacpp" / "props.json").read_text()))
    assert snap.k == 4 and snap.in_flight_tokens > 0 and snap.slots[0].is_processing
    live = set(parse(httpx.get(llama_server.url + "/metrics").text).names())
    recorded = set(parse((FIXTURES / "llamacpp" / "metrics_2.txt").read_text()).names())
    assert live == recorded


def test_a_server_without_metrics(smol_path: Any, tmp_path: Path) -> None:
    server = LlamaServer(need_binary(), Path(smol_path), free_port(), [], tmp_path / "nometrics.log", metrics=False)
    server.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "specdash", "attach", server.url, "--once"],
                              capture_output=True, text=True, timeout=60)
    finally:
        server.stop()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert f"{server.url}/metrics" in line and "started without --metrics" in line and "restart it with --metrics" in line


def test_router_presets_switch_with_set_drafter(smol_path: Any, tmp_path: Path) -> None:
    ini = tmp_path / "presets.ini"
    ini.write_text(router_preset(Path(smol_path)))
    router = LlamaServer(need_binary(), Path(""), free_port(), ["--models-preset", str(ini)], tmp_path / "router.log")
    router.start()
    source = RemoteSource(router.url, interval=0.3, max_tokens=24)
    events: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the startup preset loads in a child process
            models = httpx.get(router.url + "/models", timeout=5).json()["data"]
            if any(m["status"]["value"] == "loaded" for m in models):
                break
            time.sleep(0.3)
        source.start(events.append)
        first = wait_for(events, lambda e: isinstance(e, E.SettingsEvent), what="settings")
        assert first.target == "smollm2@draft-k4" and first.drafter == "draft-simple" and first.k == 4
        assert "draft" not in first.unavailable and "router presets (d)" in first.unavailable["k"]
        assert [(p.id, p.active) for p in source.presets()] == [("smollm2@draft-k4", True), ("smollm2@ngram", False)]
        source.send(E.SetDrafter("nope"))
        wait_for(events, lambda e: isinstance(e, E.NoticeEvent) and "no preset 'nope'" in e.message, what="refusal")

        source.send(E.SetDrafter("ngram"))
        switched = wait_for(events, lambda e: isinstance(e, E.SettingsEvent) and e.command, timeout=90, what="switch")
        assert switched.command == "draft=ngram" and switched.target == "smollm2@ngram"
        assert switched.drafter == "ngram-simple"
        row = wait_for(events, lambda e: isinstance(e, E.ServerEvent) and e.model == "smollm2@ngram" and e.state == "up",
                       what="row")
        assert row.errors == 0 and row.resets == 0  # a switch is neither an error nor a restart
        statuses = {p.id: p.status for p in source.presets()}
        assert statuses == {"smollm2@draft-k4": "unloaded", "smollm2@ngram": "loaded"}
        # Drive mode goes to the active preset.
        source.send(E.NewPrompt("one two three one two three one two", "ngram"))
        summary = wait_for(events, lambda e: isinstance(e, E.Summary), timeout=300, what="summary")
        assert 0 < summary.n_generated <= 24
    finally:
        source.close()
        router.stop()


def test_kill_mid_run_goes_down_and_a_restart_is_a_reset(llama_server: LlamaServer) -> None:
    llama_server.complete("The capital of France is", 16)
    source = RemoteSource(llama_server.url, interval=0.2)
    events: list[Any] = []
    source.start(events.append)
    busy = threading.Thread(target=lambda: _swallow(llama_server.complete, "Tell me a story.", 200, ignore_eos=True),
                            daemon=True)
    try:
        wait_for(events, lambda e: isinstance(e, E.StatusEvent) and e.state == "running", what="running")
        busy.start()
        time.sleep(1.0)
        llama_server.stop()  # SIGKILL mid-request
        down = wait_for(events, lambda e: isinstance(e, E.ServerEvent) and e.state == "down", what="down row")
        assert down.last_seen is not None and time.time() - down.last_seen < 10
        # The poll in flight at the kill may see the connection drop; the next ones cannot connect.
        assert llama_server.url in down.error
        refused = wait_for(events, lambda e: isinstance(e, E.ServerEvent) and "cannot connect" in e.error,
                           what="connection refused")
        assert refused.state == "down" and refused.last_seen == down.last_seen
        wait_for(events, lambda e: isinstance(e, E.StatusEvent) and e.state == "down", what="down status")
        assert source.poller.alive  # nothing crashed: it keeps polling
        n_down = sum(1 for e in events if isinstance(e, E.ServerEvent) and e.state == "down")
        time.sleep(0.6)
        assert sum(1 for e in events if isinstance(e, E.ServerEvent) and e.state == "down") > n_down

        llama_server.start()
        note = wait_for(events, lambda e: isinstance(e, E.NoticeEvent) and "restarted" in e.message, what="reset notice")
        assert "reset #1" in note.message
        up = wait_for(events, lambda e: isinstance(e, E.ServerEvent) and e.state == "up" and e.resets == 1, what="up row")
        assert up.num_drafts == 0 and up.error == "" and up.errors >= 1
        after_reset = [e for e in events if isinstance(e, E.CountersEvent)]
        assert all(c.tokens >= 0 and c.num_drafts >= 0 and c.prompt_tokens >= 0 for c in after_reset)
        running = [e for e in events if isinstance(e, E.StatusEvent) and e.state == "running"]
        assert len(running) == 2
    finally:
        source.close()
        if llama_server.proc is None:
            llama_server.start()


def _swallow(fn: Any, *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the server is killed under it on purpose
        pass
