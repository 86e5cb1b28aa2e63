"""Themes as data: TOML files whose keys are textual.theme.Theme's fields.

Searched in the project's themes/ folder and then in the user's
$XDG_CONFIG_HOME/specdash/themes/ (a user file with the same name wins). A broken theme
file is a user error: one line naming the file, the key and what is valid.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tomllib
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

from specdash.contract.errors import SpecdashError

_COLOR_KEYS = ("primary", "secondary", "warning", "error", "success", "accent",
               "foreground", "background", "surface", "panel", "boost")
_FIELDS = {f.name for f in dataclasses.fields(Theme)}

# Variables the dashboard's CSS uses beyond Textual's own; a theme may override them.
# Defaults keep Textual's built-in themes usable from the palette.
VARIABLE_DEFAULTS = {
    "draft-token": "ansi_bright_green",
    "translated-token": "ansi_bright_cyan",  # accepted from a draft with another vocabulary
    "target-token": "ansi_default",
    "chart-line": "ansi_bright_blue",
    "chart-reference": "ansi_yellow",
    "chart-axis": "ansi_bright_black",
}


def theme_dirs() -> list[Path]:
    project = Path(__file__).resolve().parents[2] / "themes"
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    config = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".config"
    installed = Path(sys.prefix) / "share" / "specdash" / "themes"  # a non-editable install
    return [project, installed, config / "specdash" / "themes"]


def load_theme(path: Path) -> Theme:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecdashError(f"theme {path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecdashError(f"theme {path}: invalid TOML: {exc}") from None
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise SpecdashError(
            f"theme {path}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(_FIELDS))}"
        )
    if not isinstance(doc.get("name"), str) or not doc["name"]:
        raise SpecdashError(f"theme {path}: 'name' must be a non-empty string")
    if not isinstance(doc.get("primary"), str):
        raise SpecdashError(f"theme {path}: 'primary' (a colour such as \"#4C9BE8\") is required")
    for key in _COLOR_KEYS:
        if key in doc:
            _check_color(path, key, doc[key])
    variables = doc.get("variables", {})
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        raise SpecdashError(f"theme {path}: [variables] must be a table of strings")
    for key in ("dark", "ansi"):
        if key in doc and not isinstance(doc[key], bool):
            raise SpecdashError(f"theme {path}: {key} = {doc[key]!r}: must be true or false")
    for key in ("luminosity_spread", "text_alpha"):
        if key in doc and not (isinstance(doc[key], (int, float)) and 0 <= doc[key] <= 1):
            raise SpecdashError(f"theme {path}: {key} = {doc[key]!r}: must be a number 0..1")
    return Theme(**doc)


def _check_color(path: Path, key: str, value: object) -> None:
    try:
        if not isinstance(value, str):
            raise ColorParseError("not a string")
        Color.parse(value)
    except ColorParseError:
        raise SpecdashError(
            f"theme {path}: {key} = {value!r}: not a colour (use \"#RRGGBB\", \"rgb(r,g,b)\" or a name)"
        ) from None


def load_themes(dirs: list[Path] | None = None) -> dict[str, Theme]:
    """Every *.toml theme in `dirs` (later folders override earlier ones by name)."""
    themes: dict[str, Theme] = {}
    for directory in theme_dirs() if dirs is None else dirs:
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                theme = load_theme(path)
                themes[theme.name] = theme
    return themes
