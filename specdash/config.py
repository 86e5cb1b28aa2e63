"""The TOML config: where it is found, how it maps onto the settings dataclasses, and
how a wrong value becomes one readable line instead of a traceback.

Layout (config.example.toml documents every key with its default):

    [model]        target, draft, translate, threads, ctx, experts, repack
    [speculative]  k, adaptive, k_min, k_max, draft_p_min, draft_p_joint, lookup_min_ngram, lookup_max_ngram
    [sampling]     temperature, top_k, top_p, seed
    [generation]   max_tokens, raw, prompt, prompt_file
    [ui]           theme, refresh, screenshots_dir
    [health]       the speculation health rules' thresholds (specdash/monitor/health.py)

Adaptive K is the default; a `k` written without an `adaptive` key is that K, fixed
(explicit_k_fixes_it), as `--k N` alone is on the command line.

TOML has no null: a key whose setting is None (threads, experts, seed, prompt,
prompt_file) is simply omitted, and an omitted key means "the default". Paths are kept
as written: `~` is for the consumer to expand, a relative path is relative to the
directory specdash was started from.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from specdash.engine.settings import LIMIT, LIMITS, EngineSettings, Limit, SamplingParams, SettingError
from specdash.contract.errors import SpecdashError
from specdash.contract.events import SettingsEvent
from specdash.monitor.health import HealthThresholds
from specdash.monitor.plain_rate import PLAIN_KEEP

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
    record_dir: str | None = None  # set: every dashboard session and run is recorded here
    model_dirs: list[str] = field(default_factory=list)  # where `models scan` and `d` look for GGUFs
    # False: the dashboards leave the mouse to the terminal, so its own text selection works
    # (k9s made mouse support opt-in after it broke selection).
    mouse: bool = True


@dataclass(slots=True)
class Config:
    engine: EngineSettings = field(default_factory=EngineSettings)
    ui: UISettings = field(default_factory=UISettings)
    health: HealthThresholds = field(default_factory=HealthThresholds)
    # [keys]: binding id -> key names (tui/keymap.py checks both before a dashboard starts).
    keys: dict[str, str] = field(default_factory=dict)


# The dashboard's own keys. The engine's come from engine.settings.LIMITS: one table, so
# a limit here can never disagree with the CLI or the engine.
UI_LIMITS: tuple[Limit, ...] = (
    Limit("generation", "prompt", str, None, "the prompt text", optional=True, flag="prompt"),
    Limit("generation", "prompt_file", str, None, "read the prompt from this file", optional=True,
          flag="prompt_file"),
    Limit("ui", "theme", str, "specdash-dark", "dashboard theme", flag="theme"),
    Limit("ui", "refresh", float, 1.0, "seconds between telemetry polls / redraws", lo=0.1, hi=60,
          flag="refresh"),
    Limit("ui", "screenshots_dir", str, "~/specdash-screenshots", "where `s` saves screenshots"),
    Limit("ui", "record_dir", str, None, "record every session here (JSON lines)", optional=True),
    Limit("models", "model_dirs", list, [], "folders of GGUF files to scan for drafts"),
    Limit("ui", "mouse", bool, True, "let the dashboards use the mouse (false: the terminal's own text "
          "selection works)"),
)
UI_LIMIT: dict[str, Limit] = {k.name: k for k in UI_LIMITS}
# [health]: the speculation health rules' thresholds (specdash/monitor/health.py HealthThresholds).
HEALTH_LIMITS: tuple[Limit, ...] = (
    Limit("health", "reading_seconds", float, 2.0, "seconds of decode time per reading the rules judge",
          lo=0.1, hi=600),
    Limit("health", "history", int, 60, "readings in each running median", lo=2, hi=10_000),
    Limit("health", "min_history", int, 10, "earlier readings a median needs before a rule judges by it",
          lo=1, hi=10_000),
    Limit("health", "recent", int, 3, "readings that make 'recent' (compared with the median)", lo=1, hi=1000),
    Limit("health", "collapse_ratio", float, 0.5,
          "acceptance collapse: recent acceptance length below this fraction of its running median", lo=0, hi=1),
    Limit("health", "collapse_floor", float, 0.0,
          "acceptance collapse: or below this acceptance length (1 + accepted/drafts); 0 = no floor", lo=0, hi=65),
    Limit("health", "repeat_acceptance", float, 0.98,
          "possible repetition: acceptance rate at or above this...", lo=0, hi=1),
    Limit("health", "repeat_seconds", float, 30.0, "...for this many seconds of decoding", lo=0.1, hi=86400),
    Limit("health", "stall_ratio", float, 0.25,
          "decode stall: decode rate below this fraction of its running median while requests run", lo=0, hi=1),
    Limit("health", "not_paying_ratio", float, 0.9,
          "speculation not paying: tok/s while drafting below this fraction of plain decoding "
          "(the embedded engine)", lo=0, hi=10),
    Limit("health", "plain_steps", int, 8, "K=0 steps needed before the plain rate counts", lo=1, hi=PLAIN_KEEP),
)
assert [lim.name for lim in HEALTH_LIMITS] == [f.name for f in dataclasses.fields(HealthThresholds)]
assert all(lim.default == getattr(HealthThresholds(), lim.name) for lim in HEALTH_LIMITS)

_KEY_LIST: tuple[Limit, ...] = LIMITS + UI_LIMITS + HEALTH_LIMITS
_KEYS: dict[tuple[str, str], Limit] = {(k.section, k.name): k for k in _KEY_LIST}
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(k.section for k in _KEY_LIST))
_UI_NAMES = frozenset(k.name for k in UI_LIMITS)


def explicit_k_fixes_it(k_given: bool, adaptive_given: bool, flat: dict[str, Any]) -> None:
    """Adaptive K is the default, but a K the user wrote down without also saying
    `adaptive` means that K, fixed: `--k 3` runs K=3 on every step (as llama.cpp's
    --draft-max would), and so does `k = 3` alone in a config file. With `adaptive` given
    too (`--k 3 --adaptive`, or both keys), K is where adaptive K starts. The flag layer
    decides over the file's: `--k 3` over a file's `adaptive = true` is fixed K=3."""
    if k_given and not adaptive_given:
        flat["adaptive"] = False


def _engine_settings(flat: dict[str, Any], where: str) -> EngineSettings:
    """EngineSettings from flat LIMITS names; an ordering conflict names `where`."""
    sampling = {k: flat.pop(k) for k in list(flat) if LIMIT[k].sampling}
    try:
        return EngineSettings(**flat, sampling=SamplingParams(**sampling))
    except SettingError as exc:
        raise SpecdashError(f"{where} {exc}") from None


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
    flat = config.engine.flat()
    health: dict[str, Any] = {}
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
        if section == "keys":  # binding ids are the dashboards' to check (tui/keymap.py)
            for name, value in table.items():
                if not isinstance(value, str):
                    raise SpecdashError(f"{path}: [keys] {name} = {_show(value)}: must be key names in a string, "
                                        'comma-separated (e.g. "f1" or "u,plus")')
            config.keys = dict(table)
            continue
        if section not in SECTIONS:
            close = difflib.get_close_matches(section, SECTIONS, n=1)
            valid = ", ".join(f"[{s}]" for s in (*SECTIONS, "keys"))
            hint = f"did you mean [{close[0]}]?" if close else f"valid: {valid}"
            raise SpecdashError(f"{path}: unknown section [{section}]: {hint}")
        for name, value in table.items():
            key = _KEYS.get((section, name))
            if key is None:
                hint = _suggest(section, name)
                raise SpecdashError(f"{path}: unknown key [{section}] {name}: {hint}")
            try:
                value = key.coerce(value)
            except ValueError:
                raise SpecdashError(
                    f"{path}: [{section}] {name} = {_show(value)}: must be {key.allowed}"
                ) from None
            if name in _UI_NAMES:
                setattr(config.ui, name, value)
            elif section == "health":
                health[name] = value
            else:
                flat[name] = value
    config.health = dataclasses.replace(config.health, **health)
    spec = doc.get("speculative", {})
    explicit_k_fixes_it("k" in spec, "adaptive" in spec, flat)
    config.engine = _engine_settings(flat, f"{path}: [speculative]")  # only ORDERED pairs can fail here
    if config.ui.prompt is not None and config.ui.prompt_file is not None:
        raise SpecdashError(f"{path}: [generation] prompt and prompt_file are both set: keep one")
    return config


def to_toml(config: Config) -> dict[str, dict[str, Any]]:
    """The settings as TOML tables; None-valued settings are left out (TOML has no null)."""
    doc: dict[str, dict[str, Any]] = {}
    flat = config.engine.flat()
    for key in _KEY_LIST:
        if key.section == "health":
            value = getattr(config.health, key.name)
        else:
            value = getattr(config.ui, key.name) if key.name in _UI_NAMES else flat[key.name]
        if value is not None:
            doc.setdefault(key.section, {})[key.name] = value
    if config.keys:
        doc["keys"] = dict(config.keys)
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
      target, draft, threads, ctx, experts, repack    -> [model]
      k, adaptive                                     -> [speculative]
      temp (-> temperature), top_k, top_p, seed       -> [sampling]
      max_tokens, raw, prompt, prompt_file            -> [generation]
      theme, refresh                                  -> [ui]
    A flag that was not given must be absent (argparse.SUPPRESS) or None.
    A --k without --adaptive/--no-adaptive fixes K (explicit_k_fixes_it).
    A given --prompt clears the file's prompt_file and vice versa. Values get the same
    checks as the file; an error names the flag as --dest-with-dashes.
    """
    result = copy.deepcopy(config)
    flat = result.engine.flat()
    given = []
    for key in _KEY_LIST:
        if key.flag is None:
            continue
        value = getattr(args, key.flag, None)
        if value is None:
            continue
        flag = "--" + key.flag.replace("_", "-")
        given.append(flag)
        try:
            value = key.coerce(value)
        except ValueError:
            raise SpecdashError(f"{flag} {_show(value)}: must be {key.allowed}") from None
        if key.name in _UI_NAMES:
            setattr(result.ui, key.name, value)
        else:
            flat[key.name] = value
    explicit_k_fixes_it(getattr(args, "k", None) is not None, getattr(args, "adaptive", None) is not None, flat)
    result.engine = _engine_settings(flat, (" ".join(given) or "settings") + ":")
    prompt, prompt_file = getattr(args, "prompt", None), getattr(args, "prompt_file", None)
    if prompt is not None and prompt_file is not None:
        raise SpecdashError("--prompt and --prompt-file: give one, not both")
    if prompt is not None:
        result.ui.prompt_file = None
    if prompt_file is not None:
        result.ui.prompt = None
    return result


def settings_from_event(event: SettingsEvent, base: EngineSettings) -> EngineSettings:
    """The engine settings a SettingsEvent reports (what `w` writes and `r` restarts
    with). An engine's event holds every setting; a field another source left unknown
    (None where the setting cannot be None) keeps `base`'s value."""
    flat = base.flat()
    for lim in LIMITS:
        value = getattr(event, lim.name)
        if value is not None or lim.optional:
            flat[lim.name] = value
    return _engine_settings(flat, "settings:")
