"""`specdash models list|fetch|path|make-draft` through the real CLI entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdash.cli import main
from specdash.models.resolve import resolve_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache where only smollm2 is present (linked to the real file)."""
    real = resolve_model("smollm2-135m")
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "smollm2-135m.gguf").symlink_to(real)
    monkeypatch.setenv("SPECDASH_CACHE", str(cache))
    return cache


def test_list_shows_every_model_with_cached_state(cache, capsys):
    assert main(["models", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:] if line.strip()}
    assert set(rows) == {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m"}
    assert rows["smollm2-135m"].split()[1:5] == ["test", "98.4", "MB", "yes"]
    assert str(cache / "models" / "smollm2-135m.gguf") in rows["smollm2-135m"]
    assert rows["qwen2.5-coder-1.5b"].split()[1:5] == ["target", "1.12", "GB", "no"]


def test_path_prints_the_cached_file(cache, capsys):
    assert main(["models", "path", "smollm2-135m"]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "models" / "smollm2-135m.gguf")


def test_path_of_uncached_model_exits_2_suggesting_fetch(cache, capsys):
    assert main(["models", "path", "gemma3-270m"]) == 2
    err = capsys.readouterr().err
    assert "model 'gemma3-270m' is not cached" in err
    assert "specdash models fetch gemma3-270m" in err


def test_path_of_unknown_model_exits_2(cache, capsys):
    assert main(["models", "path", "nope"]) == 2
    assert "model 'nope': not a known model (known: qwen2.5-coder-1.5b" in capsys.readouterr().err


def test_fetch_of_cached_model_does_nothing(cache, capsys):
    assert main(["models", "fetch", "smollm2-135m"]) == 0
    assert "smollm2-135m: already cached at" in capsys.readouterr().out


def test_fetch_rejects_unknown_names_before_downloading(cache, capsys):
    assert main(["models", "fetch", "smollm2-135m", "nope"]) == 2
    assert "cannot fetch 'nope': not built-in" in capsys.readouterr().err


def test_make_draft_with_bad_quant_exits_2(cache, capsys):
    assert main(["models", "make-draft", "smollm2-135m", "--quant", "Q7"]) == 2
    err = capsys.readouterr().err
    assert "--quant 'Q7': not a supported type (valid: Q2_K, Q3_K_S" in err


def test_make_draft_then_list_and_path(cache, capsys):
    assert main(["models", "make-draft", "smollm2-135m", "--quant", "Q4_0", "--name", "smol-q4"]) == 0
    captured = capsys.readouterr()
    assert "made draft 'smol-q4' (Q4_0)" in captured.out
    assert "quantizing" in captured.err
    assert main(["models", "list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("smol-q4 "))
    assert row.split()[1] == "draft" and "Q4_0 of smollm2-135m" in row
    assert main(["models", "path", "smol-q4"]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "models" / "smol-q4.gguf")


def test_models_needs_an_action(cache):
    with pytest.raises(SystemExit) as exc:
        main(["models"])
    assert exc.value.code == 2


def test_module_entry_point_in_a_subprocess(cache):
    proc = subprocess.run([sys.executable, "-m", "specdash", "models", "path", "gemma3-270m"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("specdash: error: model 'gemma3-270m' is not cached")


def test_make_draft_help_lists_exactly_the_supported_quants(capsys):
    from specdash.models.quantize import QUANTS

    with pytest.raises(SystemExit):
        main(["models", "make-draft", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"--quant TYPE {', '.join(QUANTS)} " in help_text
