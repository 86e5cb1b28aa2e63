"""`specdash` (the dashboard) rejects bad flags with one line and exit 2, before any
terminal takeover or model load."""

from __future__ import annotations

import pytest

from specdash.cli import build_parser, main


@pytest.mark.parametrize(
    "argv, complaint",
    [
        (["--theme", "no-such-theme"], "--theme no-such-theme: unknown theme; available: "),
        (["--refresh", "0"], "--refresh 0.0: must be a number 0.1..60"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "--prompt-file /nonexistent/prompt.txt: no such file"),
        (["--prompt", "  "], "--prompt: the prompt is empty"),
    ],
)
def test_bad_dashboard_flags_exit_2_with_one_line(argv, complaint, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdash: error: ") and complaint in err and err.count("\n") == 1


def test_theme_list_names_the_bundled_themes(capsys):
    main(["--theme", "x"])
    err = capsys.readouterr().err
    assert "specdash-dark" in err and "specdash-light" in err and "textual-dark" in err


def test_refresh_needs_a_number():
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--refresh", "soon"])
    assert exit_.value.code == 2


def test_dashboard_flags_sit_beside_the_engine_flags():
    args = build_parser().parse_args(["--target", "t.gguf", "--draft", "lookup", "--k", "3", "--theme",
                                      "specdash-light", "--refresh", "0.5", "--screenshots", "/tmp/x"])
    assert (args.target, args.draft, args.k, args.theme, args.refresh, args.screenshots) == (
        "t.gguf", "lookup", 3, "specdash-light", 0.5, "/tmp/x")
    assert args.func.__module__ == "specdash.commands.dashboard"
