"""`specdash run` through the real CLI, as a user or a script would call it."""

from __future__ import annotations

import json

import pytest
from cli_helpers import assert_usage_error, specdash


SMALL = ["--target", "smollm2-135m", "--threads", "2"]


def test_json_lines_contract(smol_path):
    proc = specdash("run", *SMALL, "--draft", "lookup", "--k", "3", "--max-tokens", "24",
                    "--prompt", "Count from 1 to 30, separated by commas.", "--json")
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    steps = [e for e in events if e["event"] == "step"]
    summary = events[-1]
    assert summary["event"] == "summary"
    for key in ("text", "tokens_per_s", "acceptance_rate", "num_draft_tokens",
                "num_accepted_tokens", "stop_reason", "num_drafts", "num_accepted_tokens_per_pos"):
        assert key in summary
    assert steps and all(e["k"] <= 3 for e in steps)
    assert summary["text"] == "".join(e["text"] for e in steps)
    assert summary["num_draft_tokens"] == sum(e["drafted"] for e in steps)
    assert summary["num_accepted_tokens"] == sum(e["accepted"] for e in steps)
    assert summary["stop_reason"] in ("eos", "max_tokens")
    assert summary["tokens_per_s"] > 0


def test_text_mode_streams_text_and_summarizes_on_stderr(smol_path):
    proc = specdash("run", *SMALL, "--draft", "none", "--max-tokens", "12", "--prompt", "Say hello.")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "tok/s" in proc.stderr and "acceptance" in proc.stderr


def test_missing_model():
    assert_usage_error(specdash("run", "--target", "/nonexistent/model.gguf", "--prompt", "x"),
                       "/nonexistent/model.gguf", "no such file")


def test_not_a_gguf(tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("these are notes, not weights\n" * 100)
    assert_usage_error(specdash("run", "--target", str(bogus), "--prompt", "x"), "notes.gguf", "GGUF")


def test_truncated_gguf(tmp_path, smol_path):
    cut = tmp_path / "cut.gguf"
    with open(smol_path, "rb") as src:
        cut.write_bytes(src.read(20_000_000))
    assert_usage_error(specdash("run", "--target", str(cut), "--prompt", "x"), "cut.gguf", "truncated")


def test_incompatible_draft_names_the_rule(gemma_path, target_path):
    proc = specdash("run", "--target", "qwen2.5-coder-1.5b", "--draft", "gemma3-270m", "--threads", "2",
                    "--prompt", "x")
    assert_usage_error(proc, "incompatible", "gemma3-270m", "vocab type")


def test_negative_k():
    assert_usage_error(specdash("run", "--k", "-1", "--prompt", "x"), "K", "-1")


def test_prompt_longer_than_context(tmp_path, smol_path):
    big = tmp_path / "big.txt"
    big.write_text("the quick brown fox jumps over the lazy dog " * 200)
    proc = specdash("run", *SMALL, "--draft", "none", "--ctx", "256", "--prompt-file", str(big))
    assert_usage_error(proc, "prompt is", "256", "--ctx")


def test_unreadable_prompt_file(tmp_path):
    assert_usage_error(specdash("run", "--prompt-file", str(tmp_path / "nope.txt")), "nope.txt", "no such file")
