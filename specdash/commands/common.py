"""Flags shared by `specdash` (dashboard), `run` and `bench`, and how they become settings.

Every engine flag defaults to None so that a config file's value wins unless the flag
was given; specdash.config.apply_overrides merges them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdash.engine.settings import LIMIT, Limit
from specdash.contract.errors import SpecdashError, read_user_file


def limit_type(lim: Limit) -> Callable[[str], Any]:
    """An argparse type for one setting: the type only. The range is checked with the
    config file's values (config.apply_overrides), against the same limits table, so a
    flag and a key get the same message: `--k 99: must be an integer 0..64`."""

    def parse(text: str) -> Any:
        try:
            return int(text) if lim.kind is int else float(text) if lim.kind is float else text
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {lim.allowed}") from None

    return parse


# How K and adaptive combine (config.explicit_k_fixes_it), said where a user looks for it.
_MORE_HELP = {
    "k": "; given alone it is a fixed K (adaptive off); with --adaptive, the K adaptive starts at",
    "adaptive": "; --no-adaptive, or --k N alone, runs a fixed K",
}


def _flag(group: argparse._ArgumentGroup, name: str, metavar: str | None = None, more: bool = True) -> None:
    lim = LIMIT[name]
    assert lim.flag is not None
    flag = "--" + lim.flag.replace("_", "-")
    default = "" if lim.default is None else f" (default {str(lim.default).lower() if lim.kind is bool else lim.default})"
    text = lim.help + (_MORE_HELP.get(name, "") if more else "") + default
    if lim.kind is bool:
        group.add_argument(flag, dest=lim.flag, action=argparse.BooleanOptionalAction, help=text)
    else:
        group.add_argument(flag, dest=lim.flag, type=limit_type(lim), metavar=metavar or "N", help=text)


def add_engine_arguments(parser: argparse.ArgumentParser, *, with_k: bool = True) -> None:
    """with_k=False lets a command define its own --k (bench takes a list).

    Flags not given are absent from the namespace (SUPPRESS), not None: a subcommand's
    parser would otherwise overwrite `specdash --draft lookup run ...` with its own None.
    Types, ranges, defaults and help all come from engine.settings.LIMITS."""
    g = parser.add_argument_group("models and speculation", argument_default=argparse.SUPPRESS)
    g.add_argument("--config", metavar="PATH", help="TOML settings file (default: $SPECDASH_CONFIG, "
                   "then ~/.config/specdash/config.toml); flags override it")
    _flag(g, "target", "M")
    _flag(g, "draft", "M")
    _flag(g, "draft_model", "M")
    _flag(g, "translate")
    if with_k:
        _flag(g, "k")
    _flag(g, "adaptive", more=with_k)  # without --k (bench, sweep, whatif) the command says what it does
    _flag(g, "experts")
    s = parser.add_argument_group("sampling", argument_default=argparse.SUPPRESS)
    _flag(s, "temperature", "T")
    _flag(s, "top_k")
    _flag(s, "top_p", "P")
    _flag(s, "seed", "S")
    r = parser.add_argument_group("runtime", argument_default=argparse.SUPPRESS)
    _flag(r, "max_tokens")
    _flag(r, "threads")
    _flag(r, "ctx")
    _flag(r, "raw")
    _flag(r, "repack", "MODE")


def load_settings(args: argparse.Namespace):
    """Config file (if any) overridden by the flags that were given -> Config."""
    from specdash.config import apply_overrides

    return apply_overrides(config_file(args), args)


def config_file(args: argparse.Namespace) -> Any:
    """The config file's settings (--config, else the default file), no flags applied."""
    from specdash.config import Config, find_config_path, load_config

    path = find_config_path(getattr(args, "config", None))
    return load_config(path) if path else Config()


def read_prompt_file(name: str) -> str:
    """The text of a --prompt-file ('-' = stdin), or a one-line error naming the file."""
    if name == "-":
        text = sys.stdin.read()
        if not text.strip():
            raise SpecdashError("--prompt-file -: standard input was empty")
        return text
    text = read_user_file(name, "--prompt-file")
    if not text.strip():
        raise SpecdashError(f"--prompt-file {Path(name)}: the file is empty")
    return text


def read_prompt(args: argparse.Namespace) -> str | None:
    """--prompt TEXT or --prompt-file FILE ('-' = stdin); None when neither was given."""
    if getattr(args, "prompt_file", None):
        return read_prompt_file(args.prompt_file)
    if getattr(args, "prompt", None) is not None:
        if not args.prompt.strip():
            raise SpecdashError("--prompt: the prompt is empty")
        return args.prompt
    return None


def add_prompt_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    g = parser.add_mutually_exclusive_group(required=required)
    g.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    g.add_argument("--prompt-file", metavar="FILE", help="read the prompt from FILE ('-' = stdin)")


def say(line: str) -> None:
    """A line for the person at the terminal, on stderr, as `specdash: ...`."""
    print(f"specdash: {line}", file=sys.stderr, flush=True)


def stderr_progress() -> Callable[[str, float | None], None]:
    """A progress callback for model fetch/load that draws on stderr: a bar on a terminal,
    a line per phase and per 10% when piped (CI logs stay short)."""
    interactive = sys.stderr.isatty()
    last: dict[str, object] = {"phase": None, "decile": -1}

    def progress(message: str, fraction: float | None) -> None:
        if fraction is None or not message.startswith("fetching"):
            return  # loading is quick; only a fetch is worth drawing
        if interactive:
            bar = "#" * int(fraction * 30)
            print(f"\r\033[K{message} [{bar:<30}] {fraction:4.0%}", end="", file=sys.stderr, flush=True)
            if fraction >= 1.0:
                print(file=sys.stderr)
            return
        phase, decile = message.split(":")[0] + message.split(":")[1].split()[0], int(fraction * 10)
        if phase != last["phase"] or decile != last["decile"]:
            print(f"{message} ({fraction:.0%})", file=sys.stderr, flush=True)
        last["phase"], last["decile"] = phase, decile

    return progress


def add_metrics_names(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--metrics-names: the exporter's naming (metrics_exporter.NAMINGS)."""
    parser.add_argument("--metrics-names", choices=("specdash", "vllm"), default="specdash",
                        help="Prometheus series names: specdash (specdash_..., Prometheus' rules; the default) or "
                        "vllm (vLLM's own vllm:... names for the series vLLM has, so vLLM's Grafana boards "
                        "read them; specdash's own series stay specdash_...)")


def ui_prefs(args: argparse.Namespace, config: Any = None) -> tuple[dict[str, str], bool]:
    """(keymap, mouse) for a dashboard: the config's [keys], checked against the bindings
    (a bad id or key is a one-line error, exit 2), and [ui] mouse. `config`: already loaded."""
    from specdash.tui.keymap import check_keymap

    if config is None:
        config = config_file(args)  # keys and mouse have no flags
    return check_keymap(config.keys), config.ui.mouse
