"""`specdash run` through the real CLI, as a user or a script would call it."""

from __future__ import annotations

import json

import pytest
from cli_helpers import assert_ok, assert_usage_error, specdash


SMALL = ["--target", "smollm2-135m", "--threads", "2"]


def test_json_lines_contract(smol_path):
    proc = specdash("run", *SMALL, "--draft", "lookup", "--k", "3", "--max-tokens", "24",
                    "--prompt", "Count from 1 to 30, separated by commas.", "--json")
    assert_ok(proc)
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    steps = [e for e in events if e["event"] == "step"]
    summary = events[-1]
    assert summary["event"] == "summary"
    for key in ("text", "tokens_per_s", "acceptance_rate", "num_draft_tokens",
                "num_accepted_tokens", "stop_reason", "num_drafts", "num_accepted_tokens_per_pos"):
        assert key in summary
    assert steps and all(e["k"] <= 3 for e in steps)
    assert summary["text"] == "".join("".join(e["pieces"]) for e in steps)
    # Exactly the event contract: every line is a schema-1 event that reads back unchanged.
    from specdash.contract.events import SCHEMA, from_dict, to_dict

    assert all(e["schema"] == SCHEMA and to_dict(from_dict(e)) == e for e in events)
    assert events[0]["event"] == "settings" and events[0]["source"] == "engine"
    # The prompt's text follows, so two runs' files can be checked to have run the same one.
    assert (events[1]["event"], events[1]["title"], events[1]["text"]) == \
        ("prompt", "prompt", "Count from 1 to 30, separated by commas.")
    assert summary["num_draft_tokens"] == sum(e["drafted"] for e in steps)
    assert summary["num_accepted_tokens"] == sum(e["accepted"] for e in steps)
    assert summary["stop_reason"] in ("eos", "max_tokens")
    assert summary["tokens_per_s"] > 0


def test_text_mode_streams_text_and_summarizes_on_stderr(smol_path):
    proc = specdash("run", *SMALL, "--draft", "none", "--max-tokens", "12", "--prompt", "Say hello.")
    assert_ok(proc)
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


def test_incompatible_draft_names_the_rule(gemma_path, smol_path):
    # --no-translate: llama.cpp's strict rules (by default the draft runs through translation).
    # SmolLM2 (BPE) and Gemma (SPM) break the same rule the default target and Gemma do.
    proc = specdash("run", "--target", "smollm2-135m", "--draft", "gemma3-270m", "--threads", "2",
                    "--prompt", "x", "--no-translate")
    assert_usage_error(proc, "incompatible", "gemma3-270m", "vocab type", "--no-translate")


def test_negative_k():
    assert_usage_error(specdash("run", "--k", "-1", "--prompt", "x"), "--k -1", "0..64")


def test_k_above_the_adaptive_range_is_a_valid_fixed_k(smol_path):
    """K=24 is the research's headline setting: a fixed K is not bound by the adaptive
    controller's k_max (16 by default). Before the settings table, this run ended with
    `starting K=24 refused: must lie in [k_min=0, k_max=16]`."""
    proc = specdash("run", *SMALL, "--draft", "lookup", "--k", "24", "--max-tokens", "40",
                    "--prompt", "Count from 1 to 30, separated by commas.", "--json")
    assert_ok(proc)
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert events[0]["k"] == 24 and events[0]["k_max"] == 16
    assert any(e["event"] == "step" and e["k"] > 16 for e in events)


def test_prompt_longer_than_context(tmp_path, smol_path):
    big = tmp_path / "big.txt"
    big.write_text("the quick brown fox jumps over the lazy dog " * 200)
    proc = specdash("run", *SMALL, "--draft", "none", "--ctx", "256", "--prompt-file", str(big))
    assert_usage_error(proc, "prompt is", "256", "--ctx")


def test_unreadable_prompt_file(tmp_path):
    assert_usage_error(specdash("run", "--prompt-file", str(tmp_path / "nope.txt")), "nope.txt", "no such file")
