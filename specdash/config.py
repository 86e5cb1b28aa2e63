"""The TOML config: where it is found, how it maps onto the settings dataclasses, and
how a wrong value becomes one readable line instead of a traceback.

Layout (config.example.toml documents every key with its default):

    [model]        target, draft, threads, ctx, experts
    [speculative]  k, adaptive, k_min, k_max, draft_p_min, lookup_min_ngram, lookup_max_ngram
    [sampling]     temperature, top_k, top_p, seed
    [generation]   max_tokens, raw, prompt, prompt_file
    [ui]           theme, refresh, screenshots_dir

TOML has no null: a key whose setting is None (threads, experts, seed, prompt,
prompt_file) is simply omitted, and an omitted key means "the default". Paths are kept
as written: `~` is for the consumer to expand, a relative path is relative to the
directory specdash was started from.
"""

from __future__ import annotations

import copy
import datetime
import difflib
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from specdash.engine.settings import EngineSettings
from specdash.errors import SpecdashError

ENV_VAR = "SPECDASH_CONFIG"


@dataclass(slots=True)
class UISettings:
    """What the dashboard and a session need beyond the engine."""

    theme: str = "specdash-dark"
    refresh: float = 1.0  # seconds between telemetry polls / redraws
    # In the home folder rather than a cache or data dir: operators look for their
    # screenshots to paste into a tuning log, so the folder should be easy to find.
    screenshots_dir: str = "~/specdash-screenshots"
    prompt: str | None = None
    prompt_file: str | None = None  # mutually exclusive with prompt


@dataclass(slots=True)
class Config:
    engine: EngineSettings = field(default_factory=EngineSettings)
    ui: UISettings = field(default_factory=UISettings)


@dataclass(frozen=True, slots=True)
class _Key:
    section: str
    name: str
    owner: str  # which settings object holds it: "engine", "sampling" or "ui"
    kind: type
    allowed: str  # completes "must be ..."
    in_range: Callable[[Any], bool]
    flag: str | None  # argparse dest that overrides it, None = file only


def _int(section: str, name: str, owner: str, *, lo: int, hi: int | None = None,
         flag: str | None = None) -> _Key:
    allowed = f"an integer >= {lo}" if hi is None else f"an integer {lo}..{hi}"
    return _Key(section, name, owner, int, allowed,
                lambda v: v >= lo and (hi is None or v <= hi), flag)


def _float(section: str, name: str, owner: str, *, lo: float, hi: float, lo_open: bool = False,
           flag: str | None = None) -> _Key:
    allowed = f"a number > {lo} and <= {hi}" if lo_open else f"a number {lo}..{hi}"
    return _Key(section, name, owner, float, allowed,
                lambda v: (v > lo if lo_open else v >= lo) and v <= hi, flag)


def _str(section: str, name: str, owner: str, *, flag: str | None = None) -> _Key:
    return _Key(section, name, owner, str, "a non-empty string", bool, flag)


def _bool(section: str, name: str, owner: str, *, flag: str | None = None) -> _Key:
    return _Key(section, name, owner, bool, "true or false", lambda v: True, flag)


# Optional settings (threads, experts, seed, prompt, prompt_file) need no marking here:
# TOML cannot say None, so None only ever arrives as "key omitted".
_KEY_LIST = [
    _str("model", "target", "engine", flag="target"),
    _str("model", "draft", "engine", flag="draft"),
    _int("model", "threads", "engine", lo=1, flag="threads"),
    _int("model", "ctx", "engine", lo=256, flag="ctx"),
    _int("model", "experts", "engine", lo=1, flag="experts"),
    _int("speculative", "k", "engine", lo=0, flag="k"),
    _bool("speculative", "adaptive", "engine", flag="adaptive"),
    _int("speculative", "k_min", "engine", lo=0),
    _int("speculative", "k_max", "engine", lo=0),
    _float("speculative", "draft_p_min", "engine", lo=0, hi=1),
    _int("speculative", "lookup_min_ngram", "engine", lo=1, hi=16),
    _int("speculative", "lookup_max_ngram", "engine", lo=1, hi=16),
    _float("sampling", "temperature", "sampling", lo=0, hi=5, flag="temp"),
    _int("sampling", "top_k", "sampling", lo=0, flag="top_k"),
    _float("sampling", "top_p", "sampling", lo=0, hi=1, lo_open=True, flag="top_p"),
    # llama.cpp seeds are uint32
    _int("sampling", "seed", "sampling", lo=0, hi=2**32 - 1, flag="seed"),
    _int("generation", "max_tokens", "engine", lo=1, flag="max_tokens"),
    _bool("generation", "raw", "engine", flag="raw"),
    _str("generation", "prompt", "ui", flag="prompt"),
    _str("generation", "prompt_file", "ui", flag="prompt_file"),
    _str("ui", "theme", "ui", flag="theme"),
    _float("ui", "refresh", "ui", lo=0.1, hi=60, flag="refresh"),
    _str("ui", "screenshots_dir", "ui"),
]
_KEYS: dict[tuple[str, str], _Key] = {(k.section, k.name): k for k in _KEY_LIST}
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(k.section for k in _KEY_LIST))


def _holder(config: Config, owner: str) -> Any:
    return {"engine": config.engine, "sampling": config.engine.sampling, "ui": config.ui}[owner]


def _coerce(key: _Key, value: Any) -> Any:
    """The value as the settings field wants it; ValueError if TOML/argparse gave the
    wrong type or it is out of range."""
    # bool is an int subclass: `k = true` must not pass as k = 1.
    if isinstance(value, bool) != (key.kind is bool):
        raise ValueError
    if key.kind is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, key.kind) or not key.in_range(value):
        raise ValueError
    return value


def _show(value: Any) -> str:
    """A value the way it would be written in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return tomli_w.dumps({"v": value})[4:].rstrip("\n")
    if isinstance(value, dict):
        return "{...} (a table)"
    if isinstance(value, list):
        return "[...] (an array)"
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return repr(value)


def _suggest(section: str, name: str) -> str:
    elsewhere = [k.section for k in _KEY_LIST if k.name == name]
    if elsewhere:
        return f"{name} belongs in [{elsewhere[0]}]"
    here = [k.name for k in _KEY_LIST if k.section == section]
    close = difflib.get_close_matches(name, here, n=1)
    if close:
        return f"did you mean {close[0]}?"
    close = difflib.get_close_matches(name, [k.name for k in _KEY_LIST], n=1)
    if close:
        return f"did you mean [{_owning_section(close[0])}] {close[0]}?"
    return f"valid keys in [{section}]: {', '.join(here)}"


def _owning_section(name: str) -> str:
    return next(k.section for k in _KEY_LIST if k.name == name)


def find_config_path(explicit: str | None, env: Mapping[str, str] = os.environ) -> Path | None:
    """--config PATH, else $SPECDASH_CONFIG, else $XDG_CONFIG_HOME/specdash/config.toml
    (~/.config when XDG_CONFIG_HOME is unset, empty or relative, as the XDG spec says).

    A path the user named (flag or env var) must exist; the default file may be absent
    (None: run on defaults)."""
    home = Path(env.get("HOME") or Path.home())
    from_env = env.get(ENV_VAR)
    for label, given in ((f"--config {explicit}", explicit), (f"${ENV_VAR}={from_env}", from_env)):
        if given:
            # `~` by hand: a $SPECDASH_CONFIG set in a unit file or quoted is not expanded
            # by any shell, and `env` (not os.environ) says where home is.
            path = home / given[2:] if given.startswith("~/") else Path(given).expanduser()
            if not path.exists():
                raise SpecdashError(f"{label}: no such file")
            if not path.is_file():
                raise SpecdashError(f"{label}: not a file")
            return path
    xdg = env.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else home / ".config"
    default = base / "specdash" / "config.toml"
    return default if default.is_file() else None


def load_config(path: Path | str | None) -> Config:
    """The settings in the TOML file at `path` over the defaults (None: the defaults)."""
    config = Config()
    if path is None:
        return config
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecdashError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecdashError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message already ends with "(at line L, column C)".
        raise SpecdashError(f"{path}: invalid TOML: {exc}") from None
    for section, table in doc.items():
        if not isinstance(table, dict):
            if any(k.name == section for k in _KEY_LIST):
                hint = f"put it under [{_owning_section(section)}]"
            else:
                hint = f"keys belong in a section: {', '.join(f'[{s}]' for s in SECTIONS)}"
            raise SpecdashError(f"{path}: top-level key {section} = {_show(table)}: {hint}")
        if section not in SECTIONS:
            close = difflib.get_close_matches(section, SECTIONS, n=1)
            valid = ", ".join(f"[{s}]" for s in SECTIONS)
            hint = f"did you mean [{close[0]}]?" if close else f"valid: {valid}"
            raise SpecdashError(f"{path}: unknown section [{section}]: {hint}")
        for name, value in table.items():
            key = _KEYS.get((section, name))
            if key is None:
                hint = _suggest(section, name)
                raise SpecdashError(f"{path}: unknown key [{section}] {name}: {hint}")
            try:
                value = _coerce(key, value)
            except ValueError:
                raise SpecdashError(
                    f"{path}: [{section}] {name} = {_show(value)}: must be {key.allowed}"
                ) from None
            setattr(_holder(config, key.owner), name, value)
    _check_consistency(config, path)
    return config


def _check_consistency(config: Config, path: Path) -> None:
    engine, ui = config.engine, config.ui
    for low, high in (("k_min", "k_max"), ("lookup_min_ngram", "lookup_max_ngram")):
        lo, hi = getattr(engine, low), getattr(engine, high)
        if lo > hi:
            raise SpecdashError(
                f"{path}: [speculative] {low} = {lo}, {high} = {hi}: {low} must be <= {high}"
            )
    if ui.prompt is not None and ui.prompt_file is not None:
        raise SpecdashError(f"{path}: [generation] prompt and prompt_file are both set: keep one")


def to_toml(config: Config) -> dict[str, dict[str, Any]]:
    """The settings as TOML tables; None-valued settings are left out (TOML has no null)."""
    doc: dict[str, dict[str, Any]] = {}
    for key in _KEY_LIST:
        value = getattr(_holder(config, key.owner), key.name)
        if value is not None:
            doc.setdefault(key.section, {})[key.name] = value
    return doc


_HEADER = "# Written by specdash. Omitted keys take their defaults (see config.example.toml).\n\n"


def save_config(config: Config, path: Path | str) -> Path:
    """Write every setting of `config` to `path` so that load_config reads back an equal Config."""
    path = Path(path).expanduser()
    # Via a temporary file: a crash mid-write must not leave a truncated config behind.
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(_HEADER + tomli_w.dumps(to_toml(config)), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise SpecdashError(f"{path}: cannot write config: {exc.strerror or exc}") from None
    return path


def apply_overrides(config: Config, args: Any) -> Config:
    """A copy of `config` with every CLI flag the user gave (attribute not None) applied.

    Expected argparse dest names (a dest that is absent from `args` counts as not given):
      target, draft, threads, ctx, experts            -> [model]
      k, adaptive                                     -> [speculative]
      temp (-> temperature), top_k, top_p, seed       -> [sampling]
      max_tokens, raw, prompt, prompt_file            -> [generation]
      theme, refresh                                  -> [ui]
    Every flag needs default=None so "not given" is distinguishable from a value; for
    the booleans (raw, adaptive) use action=argparse.BooleanOptionalAction, default=None.
    A given --prompt clears the file's prompt_file and vice versa. Values get the same
    checks as the file; an error names the flag as --dest-with-dashes.
    """
    result = copy.deepcopy(config)
    for key in _KEY_LIST:
        value = None if key.flag is None else getattr(args, key.flag, None)
        if value is None:
            continue
        flag = "--" + key.flag.replace("_", "-")
        try:
            value = _coerce(key, value)
        except ValueError:
            raise SpecdashError(f"{flag} {_show(value)}: must be {key.allowed}") from None
        setattr(_holder(result, key.owner), key.name, value)
    prompt, prompt_file = getattr(args, "prompt", None), getattr(args, "prompt_file", None)
    if prompt is not None and prompt_file is not None:
        raise SpecdashError("--prompt and --prompt-file: give one, not both")
    if prompt is not None:
        result.ui.prompt_file = None
    if prompt_file is not None:
        result.ui.prompt = None
    return result
