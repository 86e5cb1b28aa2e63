"""`specdash bench` as a user runs it, on the small real model."""

from __future__ import annotations

import json

from cli_helpers import assert_ok, assert_usage_error, specdash

SMALL = ["--target", "smollm2-135m", "--draft", "none", "--threads", "2", "--raw"]


def test_bench_takes_the_users_own_prompt_files(tmp_path, smol_path):
    """Before the fix every --prompt-file failed with `--prompt-file [...] (an array):
    must be a non-empty string`: the list reached the config's one-string prompt_file key."""
    first, second = tmp_path / "numbers.txt", tmp_path / "letters.txt"
    first.write_text("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,")
    second.write_text("a b c d e f g h i j k l m n o p")
    out = tmp_path / "bench.json"
    proc = specdash("bench", *SMALL, "--drafters", "lookup", "--k", "2,24", "--repeat", "1",
                    "--max-tokens", "8", "--prompt-file", str(first), "--prompt-file", str(second),
                    "--json", str(out))
    assert_ok(proc)
    rows = json.loads(out.read_text())["results"]
    # plain, lookup K=2 and K=24 (a fixed K above the adaptive k_max), and lookup with
    # adaptive K (the default setting, so the bench shows it too) for each file
    assert len(rows) == 8 and {(r["prompt"], r["drafter"], r["k"], r["adaptive"]) for r in rows} == {
        ("letters", "lookup", None, True), ("letters", "lookup", 2, False), ("letters", "lookup", 24, False),
        ("letters", "plain", 0, False),
        ("numbers", "lookup", None, True), ("numbers", "lookup", 2, False), ("numbers", "lookup", 24, False),
        ("numbers", "plain", 0, False),
    }
    assert "adaptive" in proc.stdout
    assert all(r["n_generated"] == 8 and r["verify_ms_per_step"] > 0 for r in rows)
    assert "numbers" in proc.stdout and "letters" in proc.stdout


def test_bench_no_adaptive_runs_the_fixed_k_list_only(tmp_path, smol_path):
    out = tmp_path / "bench.json"
    proc = specdash("bench", *SMALL, "--drafters", "lookup", "--k", "3", "--repeat", "1", "--max-tokens", "8",
                    "--prompts", "code-edit", "--no-adaptive", "--json", str(out))
    assert_ok(proc)
    rows = json.loads(out.read_text())["results"]
    assert sorted((r["drafter"], r["k"], r["adaptive"]) for r in rows) == [("lookup", 3, False), ("plain", 0, False)]


def test_bench_bad_prompt_file_is_one_line(tmp_path):
    proc = specdash("bench", *SMALL, "--prompt-file", str(tmp_path / "missing.txt"))
    assert_usage_error(proc, "--prompt-file", "missing.txt", "no such file")


def test_bench_k_over_the_cap_is_refused(tmp_path):
    proc = specdash("bench", *SMALL, "--k", "2,65")
    assert_usage_error(proc, "--k", "65", "0..64")
