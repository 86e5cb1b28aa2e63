"""`specdash compare A B`: exit 0 within the limits, 1 when B is worse than allowed (the
prompt and the figure named), 2 for different prompts and bad files; on files made by
really running specdash (SmolLM2-135M, short greedy runs: `run --json` and `run --record`)
and by `attach --prompt --headless --record` against a real llama-server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_helpers import assert_ok, assert_usage_error, specdash
from conftest_remote import LlamaServer, free_port, need_binary

TOKENS = "32"
# A grounded edit: a draft model of the target's own weights predicts it nearly always;
# prompt lookup copies only where the answer repeats the given code.
EDIT = ("Rename the variable `tmp` to `total` everywhere in this function and return the whole function:\n"
        "def f(xs):\n    tmp = 0\n    for x in xs:\n        tmp = tmp + x * x\n    return tmp\n")
POEM = "Write a short poem about a lighthouse."


def run_json(smol: Path, draft: str, prompt: str, out: Path, *extra: str) -> None:
    """`specdash run --json` appended to `out` (several runs in one file: one per prompt)."""
    proc = specdash("run", "--target", str(smol), "--draft", draft, "--k", "4", "--threads", "1", "--ctx", "512",
                    "--max-tokens", TOKENS, "--prompt", prompt, "--json", *extra)
    assert_ok(proc)
    with out.open("a", encoding="utf-8") as f:
        f.write(proc.stdout)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, smol_path: Any) -> dict[str, Path]:
    """Files from real runs: the target drafting for itself (`self`), and prompt lookup."""
    d = tmp_path_factory.mktemp("compare")
    smol = Path(smol_path)
    files = {name: d / f"{name}.jsonl" for name in ("self", "lookup", "poem")}
    run_json(smol, str(smol), EDIT, files["self"])
    run_json(smol, str(smol), POEM, files["poem"])
    with files["self"].open("a", encoding="utf-8") as f:  # two prompts in one file: the poem's run again
        f.write(files["poem"].read_text(encoding="utf-8"))
    run_json(smol, "lookup", EDIT, files["lookup"])
    run_json(smol, "lookup", POEM, files["lookup"])
    files["recorded"] = d / "recorded.jsonl"
    proc = specdash("run", "--target", str(smol), "--draft", str(smol), "--k", "4", "--threads", "1", "--ctx", "512",
                    "--max-tokens", TOKENS, "--prompt", EDIT, "--record", str(files["recorded"]))
    assert_ok(proc)
    return files


def summaries(path: Path) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("event") == "summary"]


def compare_json(*args: str) -> tuple[int, dict[str, Any], str]:
    proc = specdash("compare", *args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_same_runs_are_within_limits_and_figures_are_the_runs_own(made: dict[str, Path], smol_path: Any) -> None:
    """A recording and `run --json` output of the same greedy run: exit 0 with limits, and
    the figures are those of the runs' summaries."""
    subset = made["self"].parent / "self-edit.jsonl"
    lines = made["self"].read_text().splitlines(keepends=True)
    first_summary = next(i for i, line in enumerate(lines) if json.loads(line)["event"] == "summary")
    subset.write_text("".join(lines[: first_summary + 1]))  # the first run only: the EDIT prompt
    code, report, err = compare_json(str(made["recorded"]), str(subset), "--fail-if-acceptance-drops", "0",
                                     "--fail-if-slower", "100")
    assert code == 0 and report["passed"] and not report["failures"], err
    (row,) = report["prompts"]
    assert row["prompt"] == EDIT
    for side, path in (("a", made["recorded"]), ("b", subset)):
        (s,) = summaries(path)
        fig = row[side]
        assert fig["num_draft_tokens"] == s["num_draft_tokens"] > 0
        assert fig["num_accepted_tokens"] == s["num_accepted_tokens"]
        assert fig["acceptance_rate"] == pytest.approx(s["acceptance_rate"])
        assert fig["mean_accepted_length"] == pytest.approx(s["mean_accepted_length"])
        assert fig["tokens_per_s"] == pytest.approx(s["tokens_per_s"])
        assert fig["num_accepted_tokens_per_pos"] == s["num_accepted_tokens_per_pos"]
    # Greedy, same pair, same K: the same acceptance, position by position.
    assert row["a"]["acceptance_per_pos"] == row["b"]["acceptance_per_pos"]
    assert row["delta"]["acceptance_points"] == 0
    # The recording's header hashed the model; `run --json` has no header: names only.
    target = next(s for s in report["settings"] if s["name"] == "target file")
    assert target["a"] == target["b"] == Path(smol_path).name
    assert not any(s["differs"] for s in report["settings"] if s["name"] in ("drafter", "K", "temperature"))
    text = specdash("compare", str(made["recorded"]), str(subset))
    assert_ok(text)
    assert "acceptance length" in text.stdout and "per position" in text.stdout and "no limits given" in text.stdout


def test_an_acceptance_drop_fails_naming_the_prompt_and_the_figure(made: dict[str, Path]) -> None:
    code, report, err = compare_json(str(made["self"]), str(made["lookup"]), "--fail-if-acceptance-drops", "5")
    assert code == 1, err
    assert [r["prompt"] for r in report["prompts"]] == [EDIT, POEM]
    drafter = next(s for s in report["settings"] if s["name"] == "drafter")
    assert drafter["differs"] and drafter["b"] == "lookup"  # shown side by side, not refused
    for f in report["failures"]:
        row = next(r for r in report["prompts"] if r["name"] == f["prompt"])
        assert f["figure"] == "acceptance" and f["a"] == row["a"]["acceptance_rate"]
        b = row["b"]["acceptance_rate"]
        assert b is None or (f["a"] - b) * 100 > 5
    failed = {f["prompt"] for f in report["failures"]}
    assert failed, report
    worse = [line for line in err.splitlines() if line.startswith("specdash: compare: worse:")]
    assert len(worse) == len(report["failures"]) and all("acceptance" in line for line in worse)
    # A limit above every drop passes, unless B drafted nothing where A did (that always fails).
    rows = report["prompts"]
    if all(r["b"]["acceptance_rate"] is not None for r in rows):
        top = max((r["a"]["acceptance_rate"] - r["b"]["acceptance_rate"]) * 100 for r in rows)
        assert compare_json(str(made["self"]), str(made["lookup"]), "--fail-if-acceptance-drops",
                            f"{min(top + 0.5, 100):.2f}")[0] == 0
    else:
        assert any("drafted nothing" in f["message"] for f in report["failures"])


def test_slower_is_relative_to_as_tokens_per_second(made: dict[str, Path], tmp_path: Path) -> None:
    """B is the recorded run with its decode time tripled (speed is not measured in tests):
    a third of A's tok/s, 66.7% slower. A limit of 50% fails, 80% passes."""
    slow = tmp_path / "slow.jsonl"
    out = []
    for line in made["recorded"].read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "summary":
            ev["decode_s"] *= 3
            ev["tokens_per_s"] /= 3
        out.append(json.dumps(ev))
    slow.write_text("\n".join(out) + "\n")
    code, report, err = compare_json(str(made["recorded"]), str(slow), "--fail-if-slower", "50")
    assert code == 1
    (f,) = report["failures"]
    assert f["figure"] == "tok/s" and f["b"] == pytest.approx(f["a"] / 3)
    assert "66.7% slower (limit 50%)" in err
    assert report["prompts"][0]["delta"]["tokens_per_s_percent"] == pytest.approx(-66.67, abs=0.01)
    assert compare_json(str(made["recorded"]), str(slow), "--fail-if-slower", "80")[0] == 0


def test_different_prompts_are_one_line_exit_2(made: dict[str, Path]) -> None:
    assert_usage_error(specdash("compare", str(made["self"]), str(made["poem"])),
                       "the prompts differ", str(made["poem"]), "Rename the variable")
    assert_usage_error(specdash("compare", str(made["poem"]), str(made["self"])),
                       "the prompts differ", str(made["poem"]), "has no run of")


def test_bad_files_and_flags_are_one_line_exit_2(made: dict[str, Path], tmp_path: Path) -> None:
    good = str(made["recorded"])
    lines = made["recorded"].read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    assert_usage_error(specdash("compare", good, str(cut)), str(cut), f"line {len(lines)}", "cut off")
    bad = tmp_path / "bad.jsonl"
    step = next(i for i, line in enumerate(lines) if json.loads(line)["event"] == "step")
    ev = json.loads(lines[step])
    ev["accepted"] = ev["drafted"] + 1
    bad.write_text("".join(lines[:step]) + json.dumps(ev) + "\n" + "".join(lines[step + 1:]))
    assert_usage_error(specdash("compare", str(bad), good), str(bad), f"line {step + 1}")
    text = tmp_path / "text.txt"
    text.write_text("def f(xs):\n    return xs\n")
    assert_usage_error(specdash("compare", good, str(text)), str(text), "line 1", "run --json")
    header_only = tmp_path / "header.jsonl"
    header_only.write_text(lines[0])
    assert_usage_error(specdash("compare", good, str(header_only)), str(header_only), "no finished run")
    assert_usage_error(specdash("compare", good, str(tmp_path / "missing.jsonl")), "missing.jsonl", "no such file")
    for flag, value in (("--fail-if-acceptance-drops", "-1"), ("--fail-if-slower", "abc"),
                        ("--fail-if-slower", "101"), ("--fail-if-acceptance-drops", "nan")):
        assert_usage_error(specdash("compare", good, good, flag, value), flag, value)


def test_a_llama_server_in_drive_mode_recorded_and_compared(smol_path: Any, tmp_path: Path) -> None:
    """The README's rollout recipe on a real llama-server: the same prompts recorded in
    drive mode against two servers (a draft model at K=4, then n-gram lookup), greedy.
    The recordings hold the server's own counts, and compare judges them."""
    smol = Path(smol_path)
    # /completion takes the text as it is (no chat template): openings a base model goes on with.
    texts = ["def fibonacci(n):\n", "Once upon a time, in a small village,"]
    prompts = ["--prompt", texts[0], "--prompt", texts[1]]
    records = {}
    for name, spec in (("draft", ["-md", str(smol), "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]),
                       ("ngram", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                                  "--spec-ngram-simple-size-m", "4"])):
        server = LlamaServer(need_binary(), smol, free_port(), [*spec, "-np", "1", "--temp", "0"],
                             tmp_path / f"{name}.log")
        server.start()
        try:
            records[name] = tmp_path / f"{name}.jsonl"
            proc = subprocess.run([sys.executable, "-m", "specdash", "attach", server.url, *prompts, "--headless",
                                   "--max-tokens", "32", "--record", str(records[name])],
                                  capture_output=True, text=True, timeout=300)
            assert_ok(proc)
            # One summary line per prompt (as `specdash run`), then where it recorded.
            ends = [line for line in proc.stderr.splitlines() if line.startswith(("[max_tokens]", "[eos]"))]
            assert len(ends) == 2 and f"to {records[name]}" in proc.stderr
        finally:
            server.stop()
    header = json.loads(records["draft"].read_text().splitlines()[0])
    assert header["command"] == "attach" and header["server"]["build_info"]
    assert header["server"]["model_path"] == str(smol)
    assert [m["role"] for m in header["models"]] == ["target"] and header["models"][0]["sha256"]
    code, report, err = compare_json(str(records["draft"]), str(records["draft"]), "--fail-if-acceptance-drops", "0")
    assert code == 0, err
    assert [r["prompt"] for r in report["prompts"]] == texts
    for row, s in zip(report["prompts"], summaries(records["draft"])):
        # The server's own counts (timings and /metrics deltas), not a re-count.
        assert row["a"]["num_draft_tokens"] == s["num_draft_tokens"] > 0
        assert row["a"]["num_accepted_tokens"] == s["num_accepted_tokens"]
        assert row["a"]["tokens_per_s"] == pytest.approx(s["tokens_per_s"])
        # Per position from the steps drive mode rebuilt: they add up to the server's count.
        assert sum(row["a"]["num_accepted_tokens_per_pos"]) == s["num_accepted_tokens"]
        assert 1 <= len(row["a"]["acceptance_per_pos"]) and row["a"]["num_drafts_per_pos"][0] == s["num_drafts"]
    setting = {s["name"]: s for s in report["settings"]}
    assert setting["temperature"]["a"] == "0"  # the server's own default, from /props
    # K as the server tells it (its per-position series), known for both runs.
    assert setting["K"]["a"] == "4"
    code, report, err = compare_json(str(records["draft"]), str(records["ngram"]), "--fail-if-acceptance-drops", "10")
    # llama-server does not say which kind drafts (its slots report "none"): both "speculative".
    assert code == 1 and report["failures"], report
    assert all(f["figure"] == "acceptance" for f in report["failures"])
