"""MoE expert count: read from the GGUF, set at start (flag, config) or mid-run
(SetExperts), swept by the bench; always validated before llama.cpp sees it, because an
out-of-range expert_used_count aborts the process instead of raising."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import assert_ok, assert_usage_error, specdash
from moe_fixture import ARCH, cached_tiny_moe

from specdash.contract import events as C
from specdash.engine.llm import LLM
from specdash.engine.experts import expert_counts
from specdash.sources.session import Session
from specdash.engine.settings import EngineSettings
from specdash.contract.events import NoticeEvent, SettingsEvent, StepEvent, Summary
from specdash.contract.errors import SpecdashError

N_EXPERT = 4
N_USED = 2  # the file's own expert_used_count
PROMPT = "def fibonacci(n):\n    return"


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory) -> Path:
    return cached_tiny_moe(n_expert=N_EXPERT, n_expert_used=N_USED)


def moe_session(path: Path, experts: int | None = None, max_tokens: int = 20) -> Session:
    return Session(EngineSettings(target=str(path), draft="none", raw=True, threads=2, ctx=256,
                                  max_tokens=max_tokens, experts=experts))


def greedy_continuation(path: Path, experts: int, transcript: list[int], n: int) -> list[int]:
    """A fresh load with the override, fed `transcript` the way the engine re-feeds it
    (prefill all but the last token, then one token per decode), greedy for n tokens."""
    llm = LLM(path, n_ctx=256, n_threads=2, kv_overrides={f"{ARCH}.expert_used_count": experts})
    try:
        llm.prefill(transcript[:-1])
        pos, tok, out = len(transcript) - 1, transcript[-1], []
        for _ in range(n):
            tok = int(np.argmax(llm.decode([tok], pos, logits="last")[0]))
            out.append(tok)
            pos += 1
        return out
    finally:
        llm.close()


def test_expert_counts_come_from_the_gguf(tiny_moe, smol_path):
    for path, want in ((tiny_moe, (N_USED, N_EXPERT)), (smol_path, None)):
        llm = LLM(path, vocab_only=True)
        try:
            assert expert_counts(llm) == want
        finally:
            llm.close()


def test_session_expert_info_and_settings_event(tiny_moe, smol_path):
    s = moe_session(tiny_moe)
    try:
        assert s.expert_info() == (N_USED, N_EXPERT)
        ev = s.engine.settings_event()  # the file's own count, not "unknown", when not overridden
        assert (ev.experts, ev.experts_active, ev.expert_count) == (None, N_USED, N_EXPERT)
    finally:
        s.close()
    s = moe_session(tiny_moe, experts=1)
    try:
        assert s.expert_info() == (1, N_EXPERT)
        ev = s.engine.settings_event()
        assert (ev.experts, ev.experts_active, ev.expert_count) == (1, 1, N_EXPERT)
    finally:
        s.close()
    s = Session(EngineSettings(target=str(smol_path), draft="none", threads=2, ctx=256))
    try:
        assert s.expert_info() is None
        ev = s.engine.settings_event()
        assert (ev.experts, ev.experts_active, ev.expert_count) == (None, None, None)
        assert "dense model" in ev.unavailable["experts"]
    finally:
        s.close()


@pytest.mark.parametrize("bad, says", [
    (0, "experts = 0: must be an integer >= 1"),  # the settings table, before any file is read
    (-1, "experts = -1: must be an integer >= 1"),
    (N_EXPERT + 1, f"experts={N_EXPERT + 1} refused: {{file}} has {N_EXPERT} experts; use 1..{N_EXPERT}"),
])
def test_session_refuses_an_out_of_range_count_before_loading(tiny_moe, bad, says):
    with pytest.raises(SpecdashError) as info:
        moe_session(tiny_moe, experts=bad)
    assert str(info.value) == says.format(file=tiny_moe.name)


# --- 2. the CLI -------------------------------------------------------------------------

def cli_run(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return specdash("run", "--target", str(path), "--draft", "none", "--raw", "--threads", "2",
                    "--max-tokens", "8", "--prompt", PROMPT, *extra)


def test_cli_experts_in_range_run_and_change_the_output(tiny_moe):
    texts = {}
    for n in (1, N_EXPERT):
        proc = cli_run(tiny_moe, "--experts", str(n), "--json")
        assert_ok(proc)
        events = [json.loads(line) for line in proc.stdout.splitlines()]
        settings = next(e for e in events if e["event"] == "settings")
        assert (settings["experts"], settings["expert_count"]) == (n, N_EXPERT)
        assert events[-1]["event"] == "summary" and events[-1]["n_generated"] == 8
        texts[n] = events[-1]["text"]
    assert texts[1] != texts[N_EXPERT]


def test_cli_refuses_zero_and_too_many_without_aborting(tiny_moe):
    assert_usage_error(cli_run(tiny_moe, "--experts", "0"), "--experts 0", ">= 1")
    proc = cli_run(tiny_moe, "--experts", str(N_EXPERT + 1))
    assert proc.returncode != -signal.SIGABRT
    assert_usage_error(proc, f"experts={N_EXPERT + 1}", f"1..{N_EXPERT}", tiny_moe.name)


def test_cli_refuses_experts_on_a_dense_model(smol_path):
    assert_usage_error(cli_run(smol_path, "--experts", "2"), "dense model", "cannot be changed")


def test_config_file_experts_goes_through_the_same_check(tiny_moe, tmp_path):
    cfg = tmp_path / "specdash.toml"
    cfg.write_text(f"[model]\nexperts = {N_EXPERT + 3}\n")
    assert_usage_error(cli_run(tiny_moe, "--config", str(cfg)), f"experts={N_EXPERT + 3}", f"1..{N_EXPERT}")
    cfg.write_text("[model]\nexperts = 1\n")
    proc = cli_run(tiny_moe, "--config", str(cfg), "--json")
    assert_ok(proc)
    assert json.loads(proc.stdout.splitlines()[0])["experts"] == 1


# --- 3. mid-run SetExperts ------------------------------------------------------------

def run_with_command(session: Session, after_steps: int, cmd: C.Command) -> list:
    events, steps = [], 0
    for ev in session.run(PROMPT):
        events.append(ev)
        if isinstance(ev, StepEvent):
            steps += 1
            if steps == after_steps:
                session.send(cmd)
    return events


def test_set_experts_mid_run_with_the_baseline_controller(tiny_moe):
    """The baseline ThresholdController as the engine's controller, adaptive on, the expert
    count changed mid-run. Before the fix the engine called reset(target_changed=True) on
    a controller that took no such argument and the run died with a TypeError."""
    from specdash.engine.controller import ThresholdController

    s = Session(EngineSettings(target=str(tiny_moe), draft="lookup", raw=True, threads=2, ctx=256,
                               max_tokens=20, adaptive=True),
                controller=ThresholdController(k_init=4))
    try:
        events = run_with_command(s, 5, C.SetExperts(1))
        assert s.expert_info() == (1, N_EXPERT)
    finally:
        s.close()
    assert events[-1].n_generated == 20 and events[-1].stop_reason == "max_tokens"
    assert any(isinstance(e, SettingsEvent) and e.command == "experts=1" for e in events)


def test_set_experts_mid_run_reloads_and_continues_with_the_new_count(tiny_moe):
    switch_at, max_tokens = 5, 20
    s = moe_session(tiny_moe, max_tokens=max_tokens)
    try:
        prompt = s.prompt_tokens(PROMPT)
        events = run_with_command(s, switch_at, C.SetExperts(1))
        assert s.expert_info() == (1, N_EXPERT)
    finally:
        s.close()

    i_notice = next(i for i, e in enumerate(events) if isinstance(e, NoticeEvent))
    notices = [e for e in events if isinstance(e, NoticeEvent)]
    assert [e.level for e in notices] == ["info", "info"]
    assert "reloading target with 1 active expert" in notices[0].message
    assert "reloaded with 1 active expert" in notices[1].message
    after = events[i_notice:]
    settings = next(e for e in after if isinstance(e, SettingsEvent))
    assert (settings.experts, settings.expert_count) == (1, N_EXPERT)

    steps = [e for e in events if isinstance(e, StepEvent)]
    before_steps = [e for e in events[:i_notice] if isinstance(e, StepEvent)]
    after_steps = [e for e in after if isinstance(e, StepEvent)]
    assert len(before_steps) == switch_at and after_steps
    summary = events[-1]
    assert isinstance(summary, Summary) and summary.n_generated == max_tokens
    before_text = "".join(e.text for e in before_steps)
    assert summary.text.startswith(before_text)  # nothing committed before the switch is lost

    # llama.cpp really runs with one expert now: the tokens after the switch are what a
    # fresh load with expert_used_count=1 continues the same transcript with...
    transcript = prompt + [t for e in before_steps for t in e.tokens]
    got = [t for e in after_steps for t in e.tokens]
    assert got == greedy_continuation(tiny_moe, 1, transcript, len(got))
    # ...and not what the file's own count would have produced (else the test proves nothing).
    assert got != greedy_continuation(tiny_moe, N_USED, transcript, len(got))
    assert [t for e in steps for t in e.tokens][: switch_at] == greedy_continuation(tiny_moe, N_USED, prompt, switch_at)


def test_out_of_range_set_experts_is_refused_and_generation_goes_on(tiny_moe):
    s = moe_session(tiny_moe, max_tokens=12)
    try:
        plain = next(e for e in s.run(PROMPT) if isinstance(e, Summary)).text
        target = s.target
        events = run_with_command(s, 3, C.SetExperts(N_EXPERT + 1))
        assert s.target is target and s.engine.target is target  # the loaded model was kept
        assert s.expert_info() == (N_USED, N_EXPERT) and s.settings.experts is None
    finally:
        s.close()
    notices = [e for e in events if isinstance(e, NoticeEvent)]
    warnings = [e for e in notices if e.level == "warning"]
    assert len(warnings) == len(notices) == 1  # no "reloading..." announced for a refusal
    assert f"experts={N_EXPERT + 1}" in warnings[0].message and f"1..{N_EXPERT}" in warnings[0].message
    summary = events[-1]
    assert summary.n_generated == 12 and summary.text == plain


def test_set_experts_on_a_dense_model_is_refused_mid_run(smol_path):
    s = Session(EngineSettings(target=str(smol_path), draft="none", raw=True, threads=2, ctx=256, max_tokens=6))
    try:
        events = run_with_command(s, 2, C.SetExperts(2))
    finally:
        s.close()
    warnings = [e.message for e in events if isinstance(e, NoticeEvent) and e.level == "warning"]
    assert len(warnings) == 1 and "dense model" in warnings[0]
    assert events[-1].n_generated == 6


def test_set_experts_between_runs_equals_a_fresh_load(tiny_moe):
    s = moe_session(tiny_moe, max_tokens=10)
    try:
        default = next(e for e in s.run(PROMPT) if isinstance(e, Summary)).text
        s.send(C.SetExperts(1))  # between runs: the bench's way, through the command queue
        applied = list(s.engine.apply_pending())
        assert applied[-1].experts == 1 and s.settings.experts == 1
        switched = next(e for e in s.run(PROMPT) if isinstance(e, Summary)).text
    finally:
        s.close()
    fresh = moe_session(tiny_moe, experts=1, max_tokens=10)
    try:
        assert next(e for e in fresh.run(PROMPT) if isinstance(e, Summary)).text == switched
    finally:
        fresh.close()
    assert switched != default


# --- 4. the bench -----------------------------------------------------------------------

BENCH = ["bench", "--draft", "none", "--drafters", "lookup", "--k", "2", "--raw", "--threads", "2",
         "--prompts", "code-edit", "--repeat", "1", "--max-tokens", "8", "--no-adaptive"]


def test_bench_sweeps_expert_counts(tiny_moe, tmp_path):
    out = tmp_path / "bench.json"
    proc = specdash(*BENCH, "--target", str(tiny_moe), "--experts", f"1,{N_EXPERT}", "--json", str(out))
    assert_ok(proc)
    head = proc.stdout.splitlines()[0]
    assert "experts" in head and "tok/s" in head
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("code-edit ")]
    assert {(r[1], r[2]) for r in rows if r[2] in ("plain", "lookup")} == {
        ("1", "plain"), ("1", "lookup"), (str(N_EXPERT), "plain"), (str(N_EXPERT), "lookup")}
    assert "plain by experts" in proc.stdout
    payload = json.loads(out.read_text())
    results = payload["results"]
    assert sorted((r["experts"], r["drafter"]) for r in results) == [
        (1, "lookup"), (1, "plain"), (N_EXPERT, "lookup"), (N_EXPERT, "plain")]
    assert all(r["same_text_as_plain"] and r["tokens_per_s"] > 0 for r in results)
    assert payload["settings"]["experts"] == [1, N_EXPERT]


def test_bench_without_experts_keeps_its_table(tiny_moe, tmp_path):
    out = tmp_path / "bench.json"
    proc = specdash(*BENCH, "--target", str(tiny_moe), "--json", str(out))
    assert_ok(proc)
    assert "experts" not in proc.stdout
    assert all(r["experts"] is None for r in json.loads(out.read_text())["results"])


@pytest.mark.parametrize("counts, says", [("1,0", "must be an integer >= 1"),  # the settings table
                                          (f"2,{N_EXPERT + 1}", f"1..{N_EXPERT}")])  # the model's own count
def test_bench_refuses_a_bad_count_before_benchmarking(tiny_moe, counts, says):
    proc = specdash(*BENCH, "--target", str(tiny_moe), "--experts", counts)
    assert_usage_error(proc, says)
    assert "tok/s" not in proc.stderr


def test_bench_refuses_experts_on_a_dense_model(smol_path):
    assert_usage_error(specdash(*BENCH, "--target", str(smol_path), "--experts", "1,2"), "dense model")
