"""The guides stay true (issue 42): every `specdash` command line in README.md and docs/*.md
code blocks parses against the real argument parser. Nothing loads a model: argparse
only (a subcommand's own checks, file reads and model loads happen in its run)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from specdash.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Words the guides write for "put yours here": given as a value they parse as any string.
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def command_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, command) for each `specdash ...` line in the page's code blocks,
    continuation lines joined, comments and prompts dropped."""
    text = page.read_text(encoding="utf-8")
    out = []
    for block in _FENCE.finditer(text):
        start = text[: block.start(1)].count("\n") + 1
        joined, first = "", 0
        for i, line in enumerate(block.group(1).splitlines()):
            if not joined:
                first = start + i
            joined += line.rstrip("\\").rstrip() + " "
            if line.rstrip().endswith("\\"):
                continue
            cmd, joined = joined.strip().removeprefix("$ "), ""
            if cmd.startswith("specdash ") or cmd == "specdash":
                out.append((first, cmd))
    return out


CASES = [(f"{p.relative_to(ROOT)}:{n}", cmd) for p in PAGES for n, cmd in command_lines(p)]


def test_the_guides_have_commands_to_check():
    assert len(CASES) >= 30 and len({where.split(":")[0] for where, _ in CASES}) >= 6


@pytest.mark.parametrize("where, cmd", CASES, ids=[w for w, _ in CASES])
def test_every_command_in_the_guides_parses(where, cmd, capsys):
    # `a | b | c` in a guide is alternatives (or a shell pipe): the first is the command.
    words = shlex.split(cmd.split(" | ")[0].split(" && ")[0], comments=True)
    parser = build_parser()
    try:
        parser.parse_args(words[1:])
    except SystemExit as exc:
        if exc.code != 0:  # --help exits 0
            pytest.fail(f"{where}: `{cmd}` does not parse: {capsys.readouterr().err.strip()}")
